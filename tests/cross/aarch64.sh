#!/usr/bin/env bash
# The compute engine's numerics tests on AArch64: cross-built with Debian's
# gcc-aarch64-linux-gnu (KVF_COMPUTE_ONLY, cmake/aarch64-linux-gnu.cmake)
# and run under qemu-aarch64. They check the NEON kernels against the
# scalar ones bit for bit, the golden data, and the logit bits recorded on
# x86 (tests/data/numerics_bits.json). deploy/install-deps.sh installs the
# toolchain, qemu-user and the :arm64 libraries (cJSON, cmocka).
#
#   tests/cross/aarch64.sh [BUILD_DIR]     (default build-aarch64/)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-aarch64}
jobs=$(nproc 2> /dev/null || echo 2)
for tool in aarch64-linux-gnu-gcc qemu-aarch64; do
    command -v "$tool" > /dev/null || { echo "aarch64.sh: $tool not found (deploy/install-deps.sh installs it)" >&2; exit 1; }
done
cmake -S "$root" -B "$build" -DKVF_COMPUTE_ONLY=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_TOOLCHAIN_FILE="$root/cmake/aarch64-linux-gnu.cmake"
cmake --build "$build" -j "$jobs"
# The target's loader and libraries are the :arm64 multiarch packages
# (libc6:arm64 comes with libcjson1:arm64), in the host's /lib and
# /usr/lib/aarch64-linux-gnu. (Not QEMU_LD_PREFIX=/usr/aarch64-linux-gnu:
# that mixes the cross toolchain's libc with the multiarch libraries, and
# threads then hang.)
if [[ ! -e /lib/ld-linux-aarch64.so.1 ]]; then
    echo "aarch64.sh: no /lib/ld-linux-aarch64.so.1 (libc6:arm64; deploy/install-deps.sh installs it)" >&2
    exit 1
fi
export LD_LIBRARY_PATH=/usr/lib/aarch64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The tests are the compute-only build's (KVF_COMPUTE_TESTS in
# cmake/kvf_sources.cmake); ctest runs each under qemu-aarch64 (the
# toolchain file's CMAKE_CROSSCOMPILING_EMULATOR).
ctest --test-dir "$build" --output-on-failure

#!/usr/bin/env bash
# Installs dependencies, builds kvferry and runs every test; builds the
# Release configuration too (-O3 finds warnings, all errors here, that -O2
# does not; built only, not tested again); cross-builds the engine's
# numerics tests for AArch64 and runs them under qemu; then builds it again with
# AddressSanitizer + UndefinedBehaviorSanitizer and runs the unit tests
# there. Exits non-zero on any failure. CI runs exactly this.
#
#   ./deploy/test.sh              everything
#   KVF_TEST_SKIP_ASAN=1 ./deploy/test.sh   skip the sanitizer pass (local use)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc 2>/dev/null || echo 2)

step() { printf '\n==> %s\n' "$*"; }

step "dependencies"
./deploy/install-deps.sh

step "build (RelWithDebInfo, build/)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVF_SANITIZE=OFF
cmake --build build -j "$jobs"

# The README's Release build, with CUDA where nvcc is (as the first build):
# compiled only, so a warning that -O3 alone raises (-Werror) fails CI.
step "build (Release, build-rel/: compiled only)"
cmake -S . -B build-rel -DCMAKE_BUILD_TYPE=Release -DKVF_SANITIZE=OFF
cmake --build build-rel -j "$jobs"

step "tests (build/)"
ctest --test-dir build --output-on-failure --timeout 900

# The numerics on another architecture: the engine's tests cross-built for
# AArch64 and run under qemu (NEON = scalar bit for bit, golden data, the
# logit bits recorded on x86).
step "numerics tests on AArch64 (cross-built, qemu-aarch64; build-aarch64/)"
tests/cross/aarch64.sh "$root/build-aarch64"

if [[ "${KVF_TEST_SKIP_ASAN:-0}" != 1 ]]; then
    # CUDA code is compiled and checked by the first build; the sanitizers
    # instrument host code only, so this pass builds without it.
    step "build (AddressSanitizer + UndefinedBehaviorSanitizer, build-asan/)"
    cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVF_SANITIZE=ON -DKVF_CUDA=OFF
    cmake --build build-asan -j "$jobs"

    step "unit tests under sanitizers (build-asan/)"
    export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
    ctest --test-dir build-asan --output-on-failure --timeout 900 -L unit

    # The whole cluster under the sanitizers, for the 1 prefill + 1 decode
    # case: router, nodes and transport exercised by real processes, each
    # of which must exit 0 (no leak, no UB report) when it is stopped.
    step "cluster end to end under sanitizers (build-asan/, 1 prefill + 1 decode)"
    KVF_TEST_FILTER=test_1_prefill_1_decode_shm \
        ctest --test-dir build-asan --output-on-failure --timeout 900 -R '^test_cluster$'
fi

step "all tests passed"

#!/usr/bin/env bash
# Builds the CUDA binaries on this (dependency-complete) machine and packs
# them for a bare GPU machine into .gpurun/ at the repository root:
#
#   .gpurun/bin/: kvf, test_cuda_backend, kvf-router, kvf-prefill, kvf-decode,
#   test_cluster
#   .gpurun/lib/            every shared library they need except glibc,
#                           libstdc++, libgcc and CUDA's own (the GPU machine
#                           has those), each under its SONAME; or
#   .gpurun/lib.tar.xz      the same directory compressed, when the plain
#                           bundle would pass the size limit
#   .gpurun/MANIFEST        commit, build settings, files and checksums
#
# bench/gpu_check.sh runs the bundle there. The bundle must travel in a
# 64 MiB allowance with the working tree, so it fails above 56 MiB.
#
# Usage: bash bench/gpu_bundle.sh
# Environment: KVF_GPU_BUILD_DIR (default build-gpu), KVF_CUDA_ARCHS
# (default "90-real;90-virtual": sm_90 SASS plus compute_90 PTX), JOBS,
# KVF_GPU_BUNDLE_COMPRESS=1 (compress lib/ even under the limit).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${KVF_GPU_BUILD_DIR:-$ROOT/build-gpu}
BUNDLE=$ROOT/.gpurun
ARCHS=${KVF_CUDA_ARCHS:-"90-real;90-virtual"}
JOBS=${JOBS:-$(nproc)}
LIMIT_BYTES=$((56 * 1024 * 1024))

# Libraries the GPU machine has itself: glibc, the C++ and GCC runtimes, the
# CUDA driver and toolkit libraries (matched on the name before ".so").
SYSTEM_LIBS='^(linux-vdso|linux-gate|ld-linux.*|libc|libm|libmvec|libpthread|libdl|librt|libutil|libresolv|libanl|libnsl|libBrokenLocale|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnvrtc.*|libnvJitLink|libnvidia-.*|libcufft|libcurand|libcusparse|libcusolver|libnccl)$'

die() {
    echo "gpu_bundle: error: $*" >&2
    exit 1
}
say() {
    echo "gpu_bundle: $*"
}

# Bytes of everything under a directory.
tree_bytes() {
    du -sb "$1" | cut -f1
}

mib() {
    awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'
}

# ---- build -----------------------------------------------------------------

command -v cmake >/dev/null || die "cmake not found"
command -v ldd >/dev/null || die "ldd not found"
nvcc_bin=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$nvcc_bin" ] || die "nvcc not found (PATH or /usr/local/cuda/bin): the bundle needs the CUDA build"

# kvf (bench, mkmodel, generate), the GPU test, and a cluster's binaries
# with its test (split == colocated on the GPU).
targets=(kvf test_cuda_backend kvf-router kvf-prefill kvf-decode test_cluster)

say "configuring $BUILD (Release, CUDA on, NCCL off, archs $ARCHS)"
mkdir -p "$BUILD"
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKVF_CUDA=ON -DKVF_NCCL=OFF \
    "-DCMAKE_CUDA_ARCHITECTURES=$ARCHS" >"$BUILD/kvf-configure.log" 2>&1 ||
    {
        tail -n 30 "$BUILD/kvf-configure.log" >&2
        die "cmake configure failed (full log: $BUILD/kvf-configure.log)"
    }
grep -q '^KVF_CUDA:BOOL=ON' "$BUILD/CMakeCache.txt" || die "$BUILD is not configured with KVF_CUDA=ON"
say "building ${targets[*]} with $JOBS jobs"
cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}" || die "build failed"

# ---- pack ------------------------------------------------------------------

rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin" "$BUNDLE/lib"
bins=()
for t in "${targets[@]}"; do
    [ -x "$BUILD/bin/$t" ] || die "$BUILD/bin/$t was not built"
    cp "$BUILD/bin/$t" "$BUNDLE/bin/$t"
    bins+=("$BUNDLE/bin/$t")
done

# Every library ldd resolves for the binaries (ldd lists indirect ones too),
# copied from its real file under its SONAME.
declare -A copied=()
for b in "${bins[@]}"; do
    missing=$(ldd "$b" | awk '$2 == "=>" && $3 == "not" { print $1 }')
    [ -z "$missing" ] || die "$(basename "$b") needs libraries this machine lacks: $missing"
    while read -r name path; do
        base=${name%%.so*}
        if [[ $base =~ $SYSTEM_LIBS ]] || [ -n "${copied[$name]:-}" ]; then
            continue
        fi
        real=$(readlink -f "$path")
        soname=$(readelf -d "$real" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
        soname=${soname:-$name}
        cp "$real" "$BUNDLE/lib/$soname"
        copied[$name]=$soname
    done < <(ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }')
done

# The bundle must resolve on its own: with only .gpurun/lib added, every
# library that is not the GPU machine's own comes from it.
for b in "${bins[@]}"; do
    while read -r name path; do
        base=${name%%.so*}
        [[ $base =~ $SYSTEM_LIBS ]] && continue
        case $path in
        "$BUNDLE"/lib/*) ;;
        *) die "$(basename "$b"): $name resolves to $path, not into the bundle" ;;
        esac
    done < <(LD_LIBRARY_PATH="$BUNDLE/lib" ldd "$b" | awk '$2 == "=>" { print $1, $3 }')
done

bytes=$(tree_bytes "$BUNDLE")
if [ "$bytes" -gt "$LIMIT_BYTES" ] || [ "${KVF_GPU_BUNDLE_COMPRESS:-0}" = 1 ]; then
    say "$(mib "$bytes") unpacked: compressing lib/ into lib.tar.xz"
    tar -C "$BUNDLE" -cJf "$BUNDLE/lib.tar.xz" lib
    rm -rf "${BUNDLE:?}/lib"
fi

{
    echo "kvferry GPU bundle"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
    echo "commit: $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)"
    echo "cuda archs: $ARCHS"
    echo "nvcc: $("$nvcc_bin" --version | grep -m1 release)"
    echo "glibc here: $(ldd --version | head -n 1)"
    echo "libraries expected on the GPU machine: glibc, libstdc++, libgcc_s, CUDA (cudart, cublas, cublasLt)"
    echo "files:"
    (cd "$BUNDLE" && find . -type f ! -name MANIFEST -printf '%P\n' | sort | while read -r f; do
        printf '  %10d  %s  %s\n' "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -c1-16)" "$f"
    done)
} >"$BUNDLE/MANIFEST"

bytes=$(tree_bytes "$BUNDLE")
[ "$bytes" -le "$LIMIT_BYTES" ] ||
    die "bundle is $(mib "$bytes"), over the $(mib "$LIMIT_BYTES") limit even compressed"
say "libraries: ${copied[*]:-none}"
say "wrote $BUNDLE: $(mib "$bytes") ($bytes bytes)"
say "run there, from the repository root: bash bench/gpu_check.sh (carry .gpurun)"

#!/usr/bin/env bash
# The GPU check, run on a GPU machine from the repository root:
#
#   bash bench/gpu_check.sh
#
#  1. binaries: .gpurun/ from bench/gpu_bundle.sh when present (libraries
#     from .gpurun/lib or .gpurun/lib.tar.xz, unpacked to /tmp; cuBLAS and
#     the CUDA runtime from this machine's toolkit or pip wheels), otherwise
#     a CUDA build with cmake here (a machine with the dependencies);
#  2. nvidia-smi -L;
#  3. test_cuda_backend with KVF_TEST_DATA=tests/data (golden tests and the
#     CPU-vs-CUDA comparison);
#  4. a random-weight 1B-class model (16 layers, hidden 2048, GQA 32/8,
#     inter 8192, vocab 128256, bf16) in /tmp/kvf-1b, kept for reruns;
#  5. kvf bench engine --backend cuda --greedy (JSON in $OUT/gpu_bench.json):
#     decode steps as the decode node runs greedy requests (the token found on
#     the device);
#  6. a 1 prefill + 1 decode cluster on the GPU (test_cluster's shared-memory
#     case with KVF_BACKEND=cuda, f32 weights): every output equal to the
#     colocated kvf generate on the same backend;
#  7. when the time budget allows: the bench with logits rows copied to the
#     host every step (sampled requests), then with CUDA graphs off.
#
# Everything is also written to $OUT/gpu_check.log ($OUT defaults to
# /tmp/kvf-gpu-out). The bench table comes last. Exits non-zero when any
# step failed. KVF_GPU_CHECK_BUDGET_S (default 360) bounds the whole run:
# optional steps are left out when they would not fit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-/tmp/kvf-gpu-out}
BUDGET_S=${KVF_GPU_CHECK_BUDGET_S:-360}
MODEL=${KVF_GPU_CHECK_MODEL:-/tmp/kvf-1b}
MODEL_ARGS=(--layers 16 --hidden 2048 --heads 32 --kv-heads 8 --inter 8192 --vocab 128256
    --dtype bf16 --max-pos 16384)
ARCHS=${KVF_CUDA_ARCHS:-"90-real;90-virtual"}

FAILED=()
BIN=""

say() {
    echo "gpu_check: $*"
}

# step NAME TIMEOUT_S COMMAND...: runs one step under a timeout (at most
# what is left of the budget, but at least 60 s), records a failure and
# carries on (the caller decides what depends on it). With STEP_TEE=FILE
# the step's output is also written to FILE.
step() {
    local name=$1 limit=$2
    shift 2
    if [ "$limit" -gt "$(left)" ]; then
        limit=$(left)
        [ "$limit" -ge 60 ] || limit=60
    fi
    local t0=$SECONDS rc=0
    say "== $name: $*"
    if [ -n "${STEP_TEE:-}" ]; then
        {
            timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$STEP_TEE"
            rc=${PIPESTATUS[0]}
        } || true
    else
        timeout --kill-after=10 "$limit" "$@" || rc=$?
    fi
    if [ "$rc" -eq 0 ]; then
        say "== $name: ok ($((SECONDS - t0)) s)"
        return 0
    fi
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        say "== $name: FAILED: timed out after ${limit} s"
    elif [ "$rc" -eq 77 ]; then
        say "== $name: FAILED: it skipped itself (exit 77), which a GPU machine must not"
    else
        say "== $name: FAILED (exit $rc, $((SECONDS - t0)) s)"
    fi
    FAILED+=("$name")
    return 1
}

# Seconds left of the budget.
left() {
    echo $((BUDGET_S - SECONDS))
}

# Directories holding the CUDA runtime and cuBLAS on this machine: the
# toolkit's and pip wheels' (nvidia/<pkg>/lib or nvidia/cu13/lib).
cuda_lib_dirs() {
    local roots=() d
    for d in /usr/local/cuda*/lib64 /usr/local/cuda*/lib /usr/local/cuda*/targets/x86_64-linux/lib; do
        [ -d "$d" ] && roots+=("$d")
    done
    if command -v python3 >/dev/null; then
        while read -r d; do
            [ -d "$d/nvidia" ] && roots+=("$d/nvidia")
        done < <(python3 -c 'import site, sys
paths = list(sys.path)
try:
    paths += site.getsitepackages() + [site.getusersitepackages()]
except Exception:
    pass
print("\n".join(p for p in dict.fromkeys(paths) if p))' 2>/dev/null || true)
    fi
    [ "${#roots[@]}" -gt 0 ] || return 0
    # One entry per real directory (/usr/local/cuda is usually a link).
    find "${roots[@]}" -maxdepth 3 \( -name 'libcublas.so.13*' -o -name 'libcublasLt.so.13*' \
        -o -name 'libcudart.so.13*' \) -printf '%h\n' 2>/dev/null | xargs -r readlink -f | sort -u
}

find_cmake() {
    local c
    for c in cmake "$HOME/.local/bin/cmake" /usr/local/bin/cmake; do
        if command -v "$c" >/dev/null 2>&1; then
            echo "$c"
            return 0
        fi
    done
    if python3 -c 'import cmake' 2>/dev/null; then
        c=$(python3 -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))')
        [ -x "$c" ] && echo "$c" && return 0
    fi
    return 1
}

# Sets BIN and LD_LIBRARY_PATH; returns non-zero when there is nothing to run.
setup_binaries() {
    local libdir=""
    if [ -x "$ROOT/.gpurun/bin/kvf" ]; then
        BIN=$ROOT/.gpurun/bin
        say "using the bundle in .gpurun"
        [ -f "$ROOT/.gpurun/MANIFEST" ] && sed -n '1,5p' "$ROOT/.gpurun/MANIFEST" | sed 's/^/  /'
        if [ -f "$ROOT/.gpurun/lib.tar.xz" ]; then
            local unpack=/tmp/kvf-gpurun
            rm -rf "$unpack"
            mkdir -p "$unpack"
            tar -C "$unpack" -xJf "$ROOT/.gpurun/lib.tar.xz" || {
                say "cannot unpack .gpurun/lib.tar.xz"
                return 1
            }
            libdir=$unpack/lib
        elif [ -d "$ROOT/.gpurun/lib" ]; then
            libdir=$ROOT/.gpurun/lib
        fi
    else
        say "no .gpurun bundle: building with cmake here (needs the project's dependencies)"
        local cm
        cm=$(find_cmake) || {
            say "cmake not found (PATH, ~/.local/bin, pip's cmake package)"
            return 1
        }
        local targets=(kvf test_cuda_backend kvf-router kvf-prefill kvf-decode test_cluster)
        "$cm" -S "$ROOT" -B "$ROOT/build-gpu" -DCMAKE_BUILD_TYPE=Release -DKVF_CUDA=ON \
            -DKVF_NCCL=OFF "-DCMAKE_CUDA_ARCHITECTURES=$ARCHS" || return 1
        "$cm" --build "$ROOT/build-gpu" -j "$(nproc)" --target "${targets[@]}" || return 1
        BIN=$ROOT/build-gpu/bin
    fi
    local dirs=() d
    [ -n "$libdir" ] && dirs+=("$libdir")
    while read -r d; do
        [ -n "$d" ] && dirs+=("$d")
    done < <(cuda_lib_dirs)
    local joined
    joined=$(IFS=:; echo "${dirs[*]}")
    export LD_LIBRARY_PATH="$joined${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    say "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    local b missing rc=0
    for b in "$BIN"/kvf "$BIN"/test_cuda_backend "$BIN"/test_cluster "$BIN"/kvf-decode; do
        [ -x "$b" ] || continue
        missing=$(ldd "$b" | awk '$2 == "=>" && $3 == "not" { print $1 }' | tr '\n' ' ')
        if [ -n "$missing" ]; then
            say "$(basename "$b") cannot find: $missing"
            rc=1
        fi
    done
    return "$rc"
}

# The part of a bench's output from the ceilings line on: the table.
bench_table() {
    if grep -q '^ceilings (best of the run)' "$1"; then
        sed -n '/^ceilings (best of the run)/,$p' "$1"
    else
        echo "(no table: the bench failed; its last lines follow)"
        tail -n 15 "$1"
    fi
}

main() {
    mkdir -p "$OUT"
    cd "$ROOT"
    say "repository $ROOT, output in $OUT, budget ${BUDGET_S} s"
    local bench_on=$OUT/gpu_bench.txt bench_off=$OUT/gpu_bench_graphs_off.txt
    local bench_logits=$OUT/gpu_bench_logits.txt
    rm -f "$bench_on" "$bench_off" "$bench_logits"

    # In this shell, not under step: it sets BIN and LD_LIBRARY_PATH.
    say "== binaries"
    if ! setup_binaries; then
        say "== binaries: FAILED: nothing to run"
        return 1
    fi

    if command -v nvidia-smi >/dev/null; then
        step nvidia-smi 30 nvidia-smi -L || true
    else
        say "nvidia-smi not found"
        FAILED+=(nvidia-smi)
    fi

    if [ -x "$BIN/test_cuda_backend" ]; then
        step test_cuda_backend 200 env "KVF_TEST_DATA=$ROOT/tests/data" \
            "$BIN/test_cuda_backend" || true
    else
        say "== test_cuda_backend: FAILED: $BIN/test_cuda_backend does not exist"
        FAILED+=(test_cuda_backend)
    fi

    # A model made by an earlier run with the same arguments is reused.
    local want="${MODEL_ARGS[*]}" have_model=0
    if [ -f "$MODEL/.gpu_check" ] && [ "$(cat "$MODEL/.gpu_check")" = "$want" ]; then
        say "== mkmodel: $MODEL is already there ($want)"
        have_model=1
    else
        rm -rf "${MODEL:?}"
        if step mkmodel 180 "$BIN/kvf" mkmodel "$MODEL" "${MODEL_ARGS[@]}"; then
            echo "$want" >"$MODEL/.gpu_check"
            have_model=1
        fi
    fi

    local bench_ok=0
    if [ "$have_model" -eq 1 ]; then
        # The bench's output also goes to a file, for the table at the end.
        STEP_TEE=$bench_on step bench 240 "$BIN/kvf" bench engine --model "$MODEL" \
            --backend cuda --greedy --json "$OUT/gpu_bench.json" && bench_ok=1
    else
        FAILED+=(bench)
    fi

    if [ -x "$BIN/test_cluster" ] && [ -x "$BIN/kvf-decode" ]; then
        step cluster-cuda 120 env "KVF_BIN_DIR=$BIN" "KVF_TEST_DATA=$ROOT/tests/data" \
            KVF_BACKEND=cuda KVF_GPU_DTYPE=f32 KVF_TEST_FILTER=test_1_prefill_1_decode_shm \
            "$BIN/test_cluster" || true
    else
        say "== cluster-cuda: FAILED: the bundle has no test_cluster / node binaries"
        FAILED+=(cluster-cuda)
    fi

    if [ "$bench_ok" -eq 1 ]; then
        if [ "$(left)" -gt 90 ]; then
            STEP_TEE=$bench_logits step bench-logits "$(($(left) - 15))" "$BIN/kvf" bench \
                engine --model "$MODEL" --backend cuda --json "$OUT/gpu_bench_logits.json" || true
        else
            say "== bench-logits: left out ($(left) s of the budget left)"
        fi
        if [ "$(left)" -gt 90 ]; then
            STEP_TEE=$bench_off step bench-graphs-off "$(($(left) - 15))" "$BIN/kvf" bench \
                engine --model "$MODEL" --backend cuda --greedy --graphs off \
                --json "$OUT/gpu_bench_graphs_off.json" || true
        else
            say "== bench-graphs-off: left out ($(left) s of the budget left)"
        fi
    fi

    echo
    say "done in ${SECONDS} s; log in $OUT/gpu_check.log"
    if [ "${#FAILED[@]}" -gt 0 ]; then
        say "FAILED steps: ${FAILED[*]}"
    else
        say "all steps passed"
    fi
    if [ -f "$bench_off" ]; then
        echo
        echo "---- bench table: greedy, CUDA graphs off ----"
        bench_table "$bench_off"
    fi
    if [ -f "$bench_logits" ]; then
        echo
        echo "---- bench table: logits rows to the host, CUDA graphs on ----"
        bench_table "$bench_logits"
    fi
    if [ -f "$bench_on" ]; then
        echo
        echo "---- bench table: greedy, CUDA graphs on ----"
        bench_table "$bench_on"
    fi
    [ "${#FAILED[@]}" -eq 0 ]
}

mkdir -p "$OUT"
main 2>&1 | tee "$OUT/gpu_check.log"
exit "${PIPESTATUS[0]}"

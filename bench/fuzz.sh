#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz with clang (KVF_FUZZ=ON,
# AddressSanitizer and UndefinedBehaviorSanitizer) in build-fuzz-clang and
# runs each for RUNS executions on a copy of its seed corpus. Prints, per
# harness, the executions done and the crashes found (inputs kept under
# build-fuzz-clang/fuzz-work/<name>/artifacts/); exits non-zero when any
# harness crashed.
#
# Usage: bash bench/fuzz.sh [RUNS]   (default 1000000)
# Environment: KVF_FUZZ_BUILD_DIR (default build-fuzz-clang), JOBS (2),
# KVF_FUZZ_MAX_LEN (libFuzzer -max_len, default 65536).
set -euo pipefail

runs=${1:-1000000}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVF_FUZZ_BUILD_DIR:-$root/build-fuzz-clang}
max_len=${KVF_FUZZ_MAX_LEN:-65536}
# One harness per seed corpus (tests/fuzz/corpus/<name>/, fuzz_<name>.c).
mapfile -t harnesses < <(cd "$root/tests/fuzz/corpus" && ls -d -- */ | sed 's:/$::')

configure_and_build() {
    CC=clang cmake -S "$root" -B "$build" -DKVF_FUZZ=ON -DKVF_CUDA=OFF >/dev/null
    local targets=()
    for h in "${harnesses[@]}"; do targets+=(--target "fuzz_$h"); done
    cmake --build "$build" -j"${JOBS:-2}" "${targets[@]}" >/dev/null
}

# run_one NAME: fuzzes one harness; prints "NAME: N executions, C crashes".
run_one() {
    local name=$1 work=$build/fuzz-work/$1
    rm -rf "$work"
    mkdir -p "$work/corpus" "$work/artifacts"
    cp "$root/tests/fuzz/corpus/$name/"* "$work/corpus/"
    local rc=0
    (cd "$work" && "$build/bin/fuzz_$name" -runs="$runs" -max_len="$max_len" \
        -artifact_prefix="$work/artifacts/" corpus >"$work/log" 2>&1) || rc=$?
    local done_runs
    done_runs=$(grep -oE '^Done [0-9]+ runs' "$work/log" | grep -oE '[0-9]+' || true)
    if [ -z "$done_runs" ]; then
        done_runs=$(grep -oE '^#[0-9]+' "$work/log" | tail -1 | tr -d '#' || true)
    fi
    local crashes
    crashes=$(find "$work/artifacts" -type f | wc -l)
    if [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ]; then
        crashes=1 # it died without writing an input (see the log)
    fi
    echo "$name: ${done_runs:-0} executions, $crashes crashes (log: $work/log)"
    [ "$crashes" -eq 0 ]
}

configure_and_build
failed=0
for h in "${harnesses[@]}"; do
    run_one "$h" || failed=1
done
exit $failed

#!/usr/bin/env bash
# Soak test: a router, 2 prefill and 2 decode nodes on 127.0.0.1 (a random
# model of 4 layers, hidden 256, vocab 512) for DURATION_S seconds under a
# steady mixed load (native and HTTP /v1/completions, streamed and whole,
# prompts as ids and as text, greedy with ignore_eos), with client aborts
# mid-stream (1000 per 600 s), a SIGKILL to a random node every 4-8 s (it
# restarts under the same name) and one SIGTERM drain with a replacement.
# Prints, as tables: the requests by outcome (equal to the colocated
# reference, different, failed with their messages, aborted, lost), the
# kills and the drain, the router's counters, the KV blocks in use at the
# end, the memory of the long-lived processes from the warm point (10% of
# the run) to the end, and the checks; exits non-zero when one failed.
#
# Usage: bash bench/soak.sh [DURATION_S]   (default 600; 60 is a quick smoke)
# The cluster runs with a fresh cluster key (kvf keygen; KVF_SOAK_NO_KEY=1:
# without one).
# Environment: KVF_SOAK_BUILD_DIR (default build), JOBS (2), KVF_SOAK_SEED
# (1), KVF_SOAK_ARGS (more kvf_soak flags, see kvf_soak --help),
# KVF_SOAK_KEEP_LOGS=1 (keep the processes' logs even when it passes).
#
# Bounded: the driver ends the load at DURATION_S, gives the requests in
# flight at most 100 s more and stops every process it started; a timeout
# of DURATION_S + 600 s around it ends its whole process group (the driver
# and the cluster) if it does not.
set -euo pipefail

duration=${1:-600}
[[ $duration =~ ^[0-9]+$ && $duration -ge 10 ]] || {
    echo "usage: bash bench/soak.sh [DURATION_S >= 10]" >&2
    exit 2
}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVF_SOAK_BUILD_DIR:-$root/build}

if [[ ! -f $build/CMakeCache.txt ]]; then
    cmake -S "$root" -B "$build" > /dev/null
fi
cmake --build "$build" -j"${JOBS:-2}" --target kvf kvf-router kvf-prefill kvf-decode kvf_soak \
    > /dev/null

# timeout runs the driver in a process group of its own and signals the
# whole group when the limit passes; the trap does the same if this
# script is interrupted.
pid=
stop_group() {
    [[ -n $pid ]] && kill -KILL -- "-$pid" 2> /dev/null || true
}
trap stop_group EXIT
# The cluster runs keyed (a fresh cluster key) unless KVF_SOAK_NO_KEY=1.
key_args=()
if [[ "${KVF_SOAK_NO_KEY:-0}" != 1 ]]; then
    keydir=$(mktemp -d /tmp/kvf-soak-key-XXXXXX)
    trap 'stop_group; rm -rf "$keydir"' EXIT
    "$build/bin/kvf" keygen "$keydir/cluster.key" > /dev/null
    key_args=(--cluster-key-file "$keydir/cluster.key")
fi
# shellcheck disable=SC2086
timeout --kill-after=20 $((duration + 600)) "$build/bin/kvf_soak" --duration "$duration" \
    --seed "${KVF_SOAK_SEED:-1}" "${key_args[@]}" ${KVF_SOAK_ARGS:-} &
pid=$!
rc=0
wait "$pid" || rc=$?
pid=
if [[ $rc == 124 || $rc == 137 ]]; then
    echo "soak: the driver did not end within $((duration + 600)) s: stopped" >&2
fi
exit "$rc"

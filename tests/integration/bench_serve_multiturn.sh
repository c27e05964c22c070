#!/usr/bin/env bash
# kvf bench serve --workload multiturn on a tiny model: 2 conversations x
# 2 turns, each route on a freshly started 2 prefill + 2 decode cluster.
# Checks the structure, never the latencies: a row per route and the five
# targets in the report; in --json every turn finished, the prompt tokens
# and the ideal hit are what this trace makes them (368 prompt tokens, 176
# an infinite cache would reuse), and every run sent the same prompts and
# got the same answers (one digest: greedy answers do not depend on the
# route). Bad flags are refused. Needs KVF_BIN_DIR (ctest sets it).
set -euo pipefail

bin=${KVF_BIN_DIR:?KVF_BIN_DIR must name the bin directory of a build}
here=$(cd "$(dirname "$0")" && pwd)
data=${KVF_TEST_DATA:-$here/../data}
dir=$(mktemp -d /tmp/kvf-test-bench-multiturn-XXXXXX)
trap 'rc=$?; [[ $rc != 0 ]] && for f in "$dir"/run/*.log; do [[ -f $f ]] && { echo "---- $f"; tail -n 15 "$f"; } >&2; done; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

routes=load,kv

"$bin/kvf" bench serve --workload multiturn --model "$data/golden/tiny-llama-f32" \
    --conversations 2 --turns 2 --system-tokens 64 --user-tokens 16 --output-tokens 8 \
    --rate 20 --think-ms 5 --routes "$routes" --no-local --kv-mem 64M --timeout 120 \
    --run-dir "$dir/run" --json "$dir/r.json" > "$dir/out.txt" 2> "$dir/err.txt" ||
    { cat "$dir/out.txt" "$dir/err.txt" >&2; fail "bench serve --workload multiturn failed"; }

for r in ${routes//,/ }; do
    grep -qE "^$r +4 +0 \|" "$dir/out.txt" || { cat "$dir/out.txt" >&2; fail "no row for $r"; }
done
[[ $(grep -cE '^  .* (PASS|MISS|n/a)$' "$dir/out.txt") == 5 ]] ||
    { cat "$dir/out.txt" >&2; fail "the report lacks its five targets"; }

python3 - "$dir/r.json" "$routes" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
routes = sys.argv[2].split(",")
runs = r["runs"]
assert [x["route"] for x in runs] == routes, runs
for x in runs:
    assert x["requests"] == 4 and x["requests_ok"] == 4 and x["requests_failed"] == 0, x
    # conversation 0 and 1, turn 1: 64 + 16 = 80 tokens; turn 2: 80 + 8 + 16 = 104.
    assert x["prompt_tokens"] == 368, x
    # turn 1 of the second conversation reuses the system prompt (3 blocks,
    # 32 left), each turn 2 its turn 1 (4 blocks, 32 left): 48 + 2 * 64.
    assert x["ideal_cached_tokens"] == 176, x
    assert 0 < x["ideal_hit_rate"] < 1 and 0 <= x["hit_rate"] <= 1, x
    assert x["ttft_p50_ms"] > 0 and x["ttft_p99_ms"] >= x["ttft_p50_ms"], x
    assert x["short_requests"] == 2, x
    assert x["prefill_tokens_computed"] > 0 and x["kv_bytes_shipped"] > 0, x
assert len({x["digest"] for x in runs}) == 1, [x["digest"] for x in runs]
assert len(r["targets"]) == 5, r["targets"]
PY

model=$data/golden/tiny-llama-f32
for bad in "--routes bogus" "--routes kv --local-prefill-max-tokens x" "--turns 0" \
    "--user-tokens 0"; do
    # shellcheck disable=SC2086
    if "$bin/kvf" bench serve --workload multiturn --model "$model" $bad > /dev/null 2>&1; then
        fail "accepted $bad"
    fi
done
if "$bin/kvf" bench serve --workload nope --model "$model" > /dev/null 2>&1; then
    fail "accepted --workload nope"
fi
echo "bench serve multiturn: ok"

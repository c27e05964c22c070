#!/usr/bin/env bash
# kvf simulate and kvf plan from the command line: a run prints its table
# and writes JSON and an SVG, twice the same; bad input gets a clear
# message and exit 2 (an unknown hardware profile, a malformed trace, a
# model that does not fit); an SLO no cluster meets exits 1 naming the
# closest cluster and its shortfall; a reachable one writes the replica
# files. Needs KVF_BIN_DIR and KVF_TEST_DATA (ctest sets them).
set -euo pipefail

bin=${KVF_BIN_DIR:?KVF_BIN_DIR must name the bin directory of a build}
data=${KVF_TEST_DATA:?KVF_TEST_DATA must name tests/data}/sim
dir=$(mktemp -d /tmp/kvf-test-sim-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

run=(--model "$data/llama3-8b" --requests 300 --rate 10 --slo-ttft-ms 500 --slo-tpot-ms 10)
"$bin/kvf" simulate "${run[@]}" --prefill 1 --decode 2 --json "$dir/a.json" \
    --plot "$dir/a.svg" > "$dir/a.txt"
"$bin/kvf" simulate "${run[@]}" --prefill 1 --decode 2 --json "$dir/b.json" > "$dir/b.txt"
cmp -s "$dir/a.json" "$dir/b.json" || fail "two runs of one seed differ"
grep -q '^TTFT ' "$dir/a.txt" && grep -q '^goodput ' "$dir/a.txt" || fail "no table: $(cat "$dir/a.txt")"
grep -q '<polyline' "$dir/a.svg" || fail "the plot has no curve"
python3 - "$dir/a.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["requests"] == 300 and r["done"] == 300, r
assert r["cluster"]["prefill"] == 1 and r["cluster"]["decode"] == 2, r
assert 0 < r["ttft_ms"]["p50"] <= r["ttft_ms"]["p90"] <= r["ttft_ms"]["p99"], r
assert r["transfers"] == 300 and 0 < r["util_decode"] <= 1, r
PY

# expects exit code $1 and stderr matching $2 from kvf ${@:3}
expect() {
    local want=$1 pattern=$2 rc=0
    shift 2
    "$bin/kvf" "$@" > "$dir/out.txt" 2> "$dir/err.txt" || rc=$?
    [[ $rc == "$want" ]] || fail "kvf $* exited $rc, not $want: $(cat "$dir/err.txt")"
    grep -q -- "$pattern" "$dir/err.txt" || fail "kvf $*: '$(cat "$dir/err.txt")' lacks '$pattern'"
}
expect 2 "unknown hardware profile 'h300' (built in: h100" simulate "${run[@]}" --profile h300 \
    --colocated 2
expect 2 "bad trace: .*bad-number.csv:3: prompt_tokens must be" simulate "${run[@]}" \
    --colocated 2 --trace "$data/traces/bad-number.csv"
expect 2 "do not fit in 1 x 141 GB of h200-sxm with room for KV: raise --tp" simulate \
    --model "$data/llama3-70b" --tp 1 --colocated 1
expect 1 "no cluster of at most 3 nodes meets TTFT p99 <= 500 ms and TPOT p99 <= 3 ms .* the closest" \
    plan --model "$data/llama3-8b" --requests 200 --rate 10 --slo-ttft-ms 500 --slo-tpot-ms 3 \
    --max-nodes 3

"$bin/kvf" plan --model "$data/llama3-8b" --requests 200 --rate 10 --slo-ttft-ms 500 \
    --slo-tpot-ms 10 --max-nodes 6 --write-cluster "$dir/cluster.env" --write-k8s "$dir/k8s.yaml" \
    > "$dir/plan.txt"
grep -q '^recommended: ' "$dir/plan.txt" || fail "no recommendation: $(cat "$dir/plan.txt")"
grep -q '^PREFILL=[0-9]' "$dir/cluster.env" && grep -q '^DECODE=[1-9]' "$dir/cluster.env" ||
    fail "cluster file: $(cat "$dir/cluster.env")"
grep -q 'name: kvf-decode' "$dir/k8s.yaml" || fail "k8s file: $(cat "$dir/k8s.yaml")"
echo "sim cli: ok"

#!/usr/bin/env bash
# kvf simulate --profile measure and kvf bench sim-check on a tiny model:
# the measured profile is used (and refused with --tp), and sim-check
# prints predicted against measured for every percentile of every
# configuration at a rate set from the split cluster's measured capacity
# (--load), with the measured runs' spread, a winner line per rate and a
# verdict that matches its exit status (whether it passes depends on the
# machine: not asserted).
# Needs KVF_BIN_DIR (ctest sets it); starts small clusters (kvf bench serve).
set -euo pipefail

bin=${KVF_BIN_DIR:?KVF_BIN_DIR must name the bin directory of a build}
dir=$(mktemp -d /tmp/kvf-test-sim-measure-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
"$bin/kvf" mkmodel "$dir/model" --layers 2 --hidden 64 --heads 4 --kv-heads 2 --inter 128 \
    --vocab 512 --max-pos 512 --seed 2 > /dev/null

"$bin/kvf" simulate --model "$dir/model" --profile measure --kv-dtype f32 --colocated 1 \
    --requests 20 --rate 5 --prompt-len 32:64 --output-len 8 --json "$dir/m.json" > "$dir/m.txt"
grep -q '^cluster      1 colocated on measured-1t' "$dir/m.txt" || fail "$(cat "$dir/m.txt")"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["done"] == 20, r' "$dir/m.json"
if "$bin/kvf" simulate --model "$dir/model" --profile measure --tp 2 --colocated 1 \
    > /dev/null 2> "$dir/err.txt"; then
    fail "--profile measure with --tp 2 accepted"
fi
grep -q 'one CPU node' "$dir/err.txt" || fail "$(cat "$dir/err.txt")"

rc=0
if "$bin/kvf" bench sim-check --model "$dir/model" --repeats 0 > /dev/null 2> "$dir/err.txt"; then
    fail "sim-check --repeats 0 accepted"
fi
grep -q -- '--repeats 1..9' "$dir/err.txt" || fail "$(cat "$dir/err.txt")"
if "$bin/kvf" bench sim-check --model "$dir/model" --profile-rounds 10 > /dev/null \
    2> "$dir/err.txt"; then
    fail "sim-check --profile-rounds 10 accepted"
fi
grep -q -- '--profile-rounds 1..9' "$dir/err.txt" || fail "$(cat "$dir/err.txt")"
if "$bin/kvf" bench sim-check --model "$dir/model" --load 0.5 --rate 4 > /dev/null \
    2> "$dir/err.txt"; then
    fail "sim-check --load with --rate accepted"
fi
grep -q 'give one' "$dir/err.txt" || fail "$(cat "$dir/err.txt")"
"$bin/kvf" bench sim-check --model "$dir/model" --load 0.5 --requests 6 --prompt-len 32:64 \
    --output-len 8 --repeats 2 > "$dir/check.txt" 2>&1 || rc=$?
# the rate is half the split cluster's capacity, measured first
line=$(grep -E '^split capacity [0-9.]+ req/s .*; rates: [0-9.]+ req/s \(load 0.50\)$' \
    "$dir/check.txt") || fail "no capacity line: $(cat "$dir/check.txt")"
read -r cap rate < <(sed -E 's/^split capacity ([0-9.]+) .*rates: ([0-9.]+) req.*/\1 \2/' \
    <<< "$line")
python3 -c 'import sys; c, r = map(float, sys.argv[1:]); assert abs(r - round(c / 2, 2)) < 0.011, (c, r)' \
    "$cap" "$rate" || fail "rate $rate is not half of $cap"
[[ $(grep -c "^bench serve: split, rate $rate req/s" "$dir/check.txt") == 2 ]] ||
    fail "not 2 serving runs at $rate: $(cat "$dir/check.txt")"
# each run predicted from the profiles measured right before it
[[ $(grep -c "^rate $rate, run [12] of 2:" "$dir/check.txt") == 2 &&
    $(grep -c '^  split node profile: ' "$dir/check.txt") == 2 &&
    $(grep -c '^  colocated node profile: ' "$dir/check.txt") == 2 ]] ||
    fail "not a profile pair before each run: $(cat "$dir/check.txt")"
r2=$(printf '%.2f' "$rate")
for config in split colocated; do
    for m in TTFT TPOT e2e; do
        for p in p50 p90 p99; do
            # predicted, measured, error, and the measured runs' spread
            grep -Eq "^$config +$r2 $m +$p +[0-9.]+ +[0-9.]+ +[-+][0-9.]+% .*[-+][0-9]+%\.\.[-+][0-9]+%$" \
                "$dir/check.txt" || fail "no $config $m $p row: $(cat "$dir/check.txt")"
        done
    done
done
grep -Eq "^rate $r2 \(load 0.50 of the split capacity\): winner predicted " "$dir/check.txt" ||
    fail "no winner line"
if [[ $rc == 0 ]]; then
    grep -q '^sim-check: pass' "$dir/check.txt" || fail "exit 0 without a pass"
elif [[ $rc == 1 ]]; then
    grep -q '^sim-check: FAIL' "$dir/check.txt" || fail "exit 1 without a FAIL"
else
    fail "sim-check exited $rc: $(tail -20 "$dir/check.txt")"
fi
echo "sim measure: ok"

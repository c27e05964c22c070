#!/usr/bin/env bash
# kvf bench tokenizer-load: times N loads of a model's tokenizer.json and
# reports their median, minimum and maximum and the vocabulary size, on
# stdout and in --json; a directory without a tokenizer fails.
# Needs KVF_BIN_DIR (ctest sets it).
set -euo pipefail

bin=${KVF_BIN_DIR:?KVF_BIN_DIR must name the bin directory of a build}
dir=$(mktemp -d /tmp/kvf-test-bench-tokenizer-XXXXXX)
trap 'rm -rf "$dir"' EXIT
"$bin/kvf" mkmodel "$dir/model" --layers 1 --hidden 32 --heads 2 --kv-heads 1 --inter 64 \
    --vocab 512 --max-pos 256 --seed 3 > /dev/null

"$bin/kvf" bench tokenizer-load --model "$dir/model" --runs 5 --json "$dir/out.json" \
    > "$dir/out.txt"
grep -q "^tokenizer-load $dir/model: 512 tokens, median .* ms (min .*, max .*) over 5 loads$" \
    "$dir/out.txt" || { echo "FAIL: printed $(cat "$dir/out.txt")" >&2; exit 1; }
python3 - "$dir/out.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["vocab"] == 512 and r["runs"] == 5, r
assert 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"], r
PY

mkdir "$dir/empty"
if "$bin/kvf" bench tokenizer-load --model "$dir/empty" > /dev/null 2>&1; then
    echo "FAIL: a directory without tokenizer.json was timed" >&2
    exit 1
fi
if "$bin/kvf" bench tokenizer-load --model "$dir/model" --runs 0 > /dev/null 2>&1; then
    echo "FAIL: --runs 0 accepted" >&2
    exit 1
fi
echo "bench tokenizer-load: ok"

#!/usr/bin/env bash
# kvf bench kv-accuracy: on golden models and a --trained-like one, the f32 cache measured against
# itself is exact (zero logit error, every greedy step agrees, no perplexity
# change); every format is reported, either measured over the same steps
# with finite numbers and a small perplexity change, or as not accepted by
# the engine; bad flags are refused. Needs KVF_BIN_DIR (ctest sets it).
set -euo pipefail

bin=${KVF_BIN_DIR:?KVF_BIN_DIR must name the bin directory of a build}
here=$(cd "$(dirname "$0")" && pwd)
data=${KVF_TEST_DATA:-$here/../data}
dir=$(mktemp -d /tmp/kvf-test-bench-kvacc-XXXXXX)
trap 'rm -rf "$dir"' EXIT

# a --trained-like model beside two golden ones (the flag through the CLI)
"$bin/kvf" mkmodel "$dir/trained-like" --trained-like --layers 1 --hidden 64 --heads 2 \
    --kv-heads 1 --head-dim 32 --inter 96 --vocab 512 --max-pos 128 --seed 4 > /dev/null
ln -s "$data/golden/tiny-llama-f32" "$dir/tiny-llama-f32"
ln -s "$data/golden/tiny-qwen2-bf16" "$dir/tiny-qwen2-bf16"
for model in tiny-llama-f32 tiny-qwen2-bf16 trained-like; do
    "$bin/kvf" bench kv-accuracy --model "$dir/$model" --prompts 3 --steps 5 \
        --threads 1 --json "$dir/$model.json" > "$dir/$model.txt" 2> "$dir/$model.err"
    grep -q "^kv-accuracy .*$model: .* 3 prompts of 5 greedy steps" "$dir/$model.txt" ||
        { echo "FAIL: printed $(cat "$dir/$model.txt")" >&2; exit 1; }
    python3 - "$dir/$model.json" <<'PY'
import json, math, sys
r = json.load(open(sys.argv[1]))
assert r["prompts"] == 3 and r["steps"] == 5, r
f = r["formats"]
assert sorted(f) == ["bf16", "f16", "f32", "fp8", "int8"], f
ref = f["f32"]
assert ref is not None, "the f32 cache must run"
for k in ("prefill_max_abs", "prefill_mean_abs", "steps_max_abs", "steps_mean_abs",
          "text_ppl_change", "self_ppl_change"):
    assert ref[k] == 0, (k, ref)
assert ref["greedy_agree"] == ref["greedy_total"] == 15, ref
assert ref["text_nll"] > 0 and ref["self_nll"] > 0, ref
for name, m in f.items():
    if m is None:
        continue
    assert m["greedy_total"] == 15 and 0 <= m["greedy_agree"] <= 15, (name, m)
    for k, v in m.items():
        assert math.isfinite(v) and (v >= 0 or k.endswith("_change")), (name, k, v)
    assert m["prefill_mean_abs"] <= m["prefill_max_abs"], (name, m)
    assert abs(m["text_ppl_change"]) < 0.2 and abs(m["self_ppl_change"]) < 0.2, (name, m)
PY
done

if "$bin/kvf" bench kv-accuracy --model "$data/golden/tiny-llama-f32" --steps 0 \
    > /dev/null 2>&1; then
    echo "FAIL: --steps 0 accepted" >&2
    exit 1
fi
if "$bin/kvf" bench kv-accuracy --model "$dir/none" > /dev/null 2>&1; then
    echo "FAIL: a missing model directory was measured" >&2
    exit 1
fi
echo "bench kv-accuracy: ok"

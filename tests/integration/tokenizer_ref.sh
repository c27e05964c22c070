#!/usr/bin/env bash
# kvferry's tokenizer against Hugging Face's on real tokenizer.json files:
# for each family, kvf tokenize --jsonl on tests/data/tokenizers/corpus.jsonl
# without special tokens (--no-bos) and with them, and kvf tokenize --decode
# --jsonl on the reference's ids, line by line against
# tests/data/tokenizers/<family>.ref.jsonl.xz (tools/tokref/reference.mjs).
# Prints "family: encode N/M, encode+special N/M, decode N/M" for each and
# fails on any mismatch in a family of EXPECT_IDENTICAL.
#
# Tokenizer files: tests/data/tokenizers/<family>/tokenizer.json.xz where
# the license lets the repository carry them (decompressed into the build
# directory); otherwise $KVF_TOKREF_DIR/<family>/ when KVF_TOKREF_DIR is set
# (tools/tokref/fetch.sh lays it out); otherwise the family is skipped.
# Needs KVF_BIN_DIR (ctest sets it), python3 and xz.
set -euo pipefail

# Every family is expected to give exactly Hugging Face's ids and text. A
# family that is known to differ comes out of this list with the reason,
# and then only has its counts printed.
EXPECT_IDENTICAL=(gpt2 llama2 llama3 qwen2_5 qwen3 gemma gemma2)
FAMILIES=(gpt2 llama2 llama3 qwen2_5 qwen3 gemma gemma2)

bin=${KVF_BIN_DIR:?KVF_BIN_DIR must name the bin directory of a build}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
data=${KVF_TEST_DATA:-$repo/tests/data}/tokenizers
compare=$repo/tools/tokref/compare.py
for need in "$bin/kvf" "$data/corpus.jsonl" "$compare"; do
    [[ -e $need ]] || { echo "FAIL: $need is missing" >&2; exit 1; }
done
for tool in python3 xz; do
    command -v "$tool" > /dev/null || { echo "FAIL: $tool is not installed" >&2; exit 1; }
done
work=$(cd "$bin/.." && pwd)/tokenizer_ref
mkdir -p "$work"

# The directory holding <family>'s tokenizer files; empty when there is none.
tokenizer_dir() {
    local family=$1
    if [[ -f $data/$family/tokenizer.json.xz ]]; then
        mkdir -p "$work/$family"
        xz -dc "$data/$family/tokenizer.json.xz" > "$work/$family/tokenizer.json"
        cp "$data/$family/tokenizer_config.json" "$work/$family/"
        echo "$work/$family"
    elif [[ -n ${KVF_TOKREF_DIR:-} && -f $KVF_TOKREF_DIR/$family/tokenizer.json ]]; then
        echo "$KVF_TOKREF_DIR/$family"
    fi
}

# kvf tokenize ARGS... < IN > OUT; on failure, says so with the end of its
# stderr (the output stays short and the comparison counts the rest).
run_kvf() {
    local family=$1 what=$2 in=$3 out=$4
    shift 4
    if ! "$bin/kvf" tokenize "$@" < "$in" > "$out" 2> "$work/$family.$what.err"; then
        echo "  $family $what: kvf tokenize failed: $(tail -n 2 "$work/$family.$what.err" | tr '\n' ' ')"
    fi
}

failed=()
ran=0
for family in "${FAMILIES[@]}"; do
    ref=$data/$family.ref.jsonl.xz
    [[ -f $ref ]] || { echo "FAIL: $ref is missing" >&2; exit 1; }
    dir=$(tokenizer_dir "$family")
    if [[ -z $dir ]]; then
        echo "SKIP $family: tokenizer.json not available (tools/tokref/fetch.sh)"
        continue
    fi
    ran=$((ran + 1))
    out=$work/$family
    mkdir -p "$out"
    run_kvf "$family" encode "$data/corpus.jsonl" "$out/encode.jsonl" \
        --model "$dir" --no-bos --jsonl
    run_kvf "$family" encode+special "$data/corpus.jsonl" "$out/encode_special.jsonl" \
        --model "$dir" --jsonl
    python3 "$compare" --ids-special "$ref" > "$out/ref_ids_special.jsonl"
    run_kvf "$family" decode "$out/ref_ids_special.jsonl" "$out/decode.jsonl" \
        --model "$dir" --decode --jsonl
    if ! python3 "$compare" "$family" "$data/corpus.jsonl" "$ref" "$out/encode.jsonl" \
        "$out/encode_special.jsonl" "$out/decode.jsonl"; then
        if [[ " ${EXPECT_IDENTICAL[*]} " == *" $family "* ]]; then
            failed+=("$family")
        else
            echo "  ($family is not in EXPECT_IDENTICAL: counts only)"
        fi
    fi
done

if ((ran == 0)); then
    echo "FAIL: no family ran (the committed tokenizer files are missing)" >&2
    exit 1
fi
if ((${#failed[@]})); then
    echo "FAIL: differs from Hugging Face: ${failed[*]}" >&2
    exit 1
fi
echo "tokenizer_ref: ok ($ran families)"

#!/usr/bin/env bash
# kvf tokenize --jsonl: one JSON string a line in, one JSON id list a line
# out. Each line's ids must equal those of kvf tokenize --text on the same
# text (JSON escapes, surrogate pairs and \u0000 decoded first), with and
# without BOS, and a line that is not a JSON string must fail with a
# message naming its line. --decode --jsonl turns the id lists back into
# the texts, as JSON strings, and refuses a line that is not a list.
# Needs KVF_BIN_DIR (ctest sets it).
set -euo pipefail

bin=${KVF_BIN_DIR:?KVF_BIN_DIR must name the bin directory of a build}
dir=$(mktemp -d /tmp/kvf-test-tokenize-jsonl-XXXXXX)
trap 'rm -rf "$dir"' EXIT
"$bin/kvf" mkmodel "$dir/model" --layers 1 --hidden 32 --heads 2 --kv-heads 1 --inter 64 \
    --vocab 512 --max-pos 256 --seed 3 > /dev/null

# The texts, and the same texts as JSON lines (escapes where JSON has them).
texts=("Hello world" "  runs of   spaces" $'tab\there' "é and \"quotes\" and \\ back" "🎉 emoji" "")
jsonl=('"Hello world"' '"  runs of   spaces"' '"tab\there"' \
    '"\u00e9 and \"quotes\" and \\ back"' '"\ud83c\udf89 emoji"' '""')
printf '%s\n' "${jsonl[@]}" > "$dir/in.jsonl"

for bos in "" "--no-bos"; do
    # shellcheck disable=SC2086
    "$bin/kvf" tokenize --model "$dir/model" $bos --jsonl < "$dir/in.jsonl" > "$dir/out.jsonl"
    [[ $(wc -l < "$dir/out.jsonl") == "${#texts[@]}" ]] || {
        echo "FAIL: ${#texts[@]} lines in, $(wc -l < "$dir/out.jsonl") out" >&2
        exit 1
    }
    for i in "${!texts[@]}"; do
        # shellcheck disable=SC2086
        want="[$("$bin/kvf" tokenize --model "$dir/model" $bos --text "${texts[$i]}")]"
        got=$(sed -n "$((i + 1))p" "$dir/out.jsonl")
        [[ $got == "$want" ]] || {
            echo "FAIL: line $((i + 1)) (${jsonl[$i]}) ${bos:-with BOS}: $got, --text gives $want" >&2
            exit 1
        }
    done
done

# U+0000 reaches the tokenizer: "a\u0000b" is not "ab".
nul=$(printf '"a\\u0000b"\n' | "$bin/kvf" tokenize --model "$dir/model" --no-bos --jsonl)
ab="[$("$bin/kvf" tokenize --model "$dir/model" --no-bos --text ab)]"
[[ $nul != "$ab" && $nul == \[*,*,*\] ]] || {
    echo "FAIL: \"a\\u0000b\" gives $nul (\"ab\" gives $ab)" >&2
    exit 1
}

# Not JSON strings: refused, naming the line.
for bad in 'plain text' '"unterminated' '"bad \x escape"' '"lone \udc00"' '"a" trailing'; do
    if printf '"ok"\n%s\n' "$bad" | "$bin/kvf" tokenize --model "$dir/model" --jsonl \
        > /dev/null 2> "$dir/err"; then
        echo "FAIL: accepted $bad" >&2
        exit 1
    fi
    grep -q "line 2 is not a JSON string" "$dir/err" || {
        echo "FAIL: for $bad: $(cat "$dir/err")" >&2
        exit 1
    }
done
# --decode --jsonl: the id lists back to the texts, as JSON strings with
# control characters as \uXXXX and the rest of UTF-8 kept.
decoded=('"Hello world"' '"  runs of   spaces"' '"tab\u0009here"' \
    '"é and \"quotes\" and \\ back"' '"🎉 emoji"' '""')
"$bin/kvf" tokenize --model "$dir/model" --no-bos --jsonl < "$dir/in.jsonl" > "$dir/ids.jsonl"
printf '%s\n' '[]' "$nul" >> "$dir/ids.jsonl"
decoded+=('""' '"a\u0000b"')
"$bin/kvf" tokenize --model "$dir/model" --decode --jsonl < "$dir/ids.jsonl" > "$dir/text.jsonl"
[[ $(wc -l < "$dir/text.jsonl") == "${#decoded[@]}" ]] || {
    echo "FAIL: --decode --jsonl: ${#decoded[@]} lines in, $(wc -l < "$dir/text.jsonl") out" >&2
    exit 1
}
for i in "${!decoded[@]}"; do
    got=$(sed -n "$((i + 1))p" "$dir/text.jsonl")
    [[ $got == "${decoded[$i]}" ]] || {
        echo "FAIL: --decode --jsonl line $((i + 1)): $got, want ${decoded[$i]}" >&2
        exit 1
    }
done
# The same with the flags the other way round, and on the text of --decode IDS.
"$bin/kvf" tokenize --model "$dir/model" --jsonl --decode < "$dir/ids.jsonl" | cmp - "$dir/text.jsonl"
ids=$(sed -n 1p "$dir/ids.jsonl" | tr -d '[]')
[[ $("$bin/kvf" tokenize --model "$dir/model" --decode "$ids") == "Hello world" ]] || {
    echo "FAIL: --decode $ids is not Hello world" >&2
    exit 1
}
# Not JSON id lists: refused, naming the line.
for bad in '1,2' '[1,' '[1,,2]' '[-1]' '[01]' '[1.5]' '[4294967296]' '"text"' '[1] x'; do
    if printf '[1]\n%s\n' "$bad" | "$bin/kvf" tokenize --model "$dir/model" --decode --jsonl \
        > /dev/null 2> "$dir/err"; then
        echo "FAIL: --decode --jsonl accepted $bad" >&2
        exit 1
    fi
    grep -q "line 2 is not a JSON list of ids" "$dir/err" || {
        echo "FAIL: for $bad: $(cat "$dir/err")" >&2
        exit 1
    }
done
# --decode with no ids needs --jsonl.
if "$bin/kvf" tokenize --model "$dir/model" --decode < /dev/null 2> /dev/null; then
    echo "FAIL: --decode without ids or --jsonl accepted" >&2
    exit 1
fi
echo "tokenize --jsonl: ok"

#!/usr/bin/env python3
"""Compares kvf tokenize's output with a family's reference, line by line.

    compare.py FAMILY CORPUS REF ENCODE ENCODE_SPECIAL DECODE
    compare.py --ids-special REF    (prints REF's "ids_special", a line each)

CORPUS: one JSON string a line; REF: the family's .ref.jsonl (plain or .xz);
ENCODE, ENCODE_SPECIAL: kvf tokenize --jsonl with --no-bos and without (one
JSON id list a line); DECODE: kvf tokenize --decode --jsonl of the
reference's "ids_special" (one JSON string a line). Prints
"FAMILY: encode N/M, encode+special N/M, decode N/M" (decode against
"decoded_raw", the decoder chain without clean_up_tokenization_spaces,
saying how many lines the clean-up would change) and the first
mismatches; exits 1 on any mismatch (a missing or unreadable line is one).
Used by tests/integration/tokenizer_ref.sh.
"""
import json
import lzma
import sys

SHOW = 5  # mismatches shown per kind


def read_lines(path):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt", encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def parse(line):
    try:
        return json.loads(line)
    except ValueError:
        return ("unparsable", line)


def show(value, limit=160):
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "..."


def compare(name, corpus, want, path):
    """Counts the lines of path equal to want; prints the first mismatches."""
    got = read_lines(path)
    if not got and want:
        print(f"  {name}: kvf gave no output")
        return 0
    same = 0
    shown = 0
    for i, w in enumerate(want):
        g = parse(got[i]) if i < len(got) else ("missing",)
        if g == w:
            same += 1
        elif shown < SHOW:
            shown += 1
            print(f"  {name} line {i + 1} {show(corpus[i], 80)}:\n"
                  f"    kvf {show(g)}\n    ref {show(w)}")
    if len(got) > len(want):
        print(f"  {name}: {len(got) - len(want)} lines more than the corpus")
        same = min(same, len(want) - 1)
    return same


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--ids-special":
        for r in read_lines(sys.argv[2]):
            print(json.dumps(json.loads(r)["ids_special"]))
        return 0
    if len(sys.argv) != 7:
        print(__doc__, file=sys.stderr)
        return 2
    family, corpus_path, ref_path, enc, enc_special, dec = sys.argv[1:]
    corpus = [json.loads(s) for s in read_lines(corpus_path)]
    ref = [json.loads(s) for s in read_lines(ref_path)]
    if len(ref) != len(corpus):
        print(f"{family}: {ref_path} has {len(ref)} lines, the corpus {len(corpus)}")
        return 1
    counts = [
        compare("encode", corpus, [r["ids"] for r in ref], enc),
        compare("encode+special", corpus, [r["ids_special"] for r in ref], enc_special),
        compare("decode", corpus, [r["decoded_raw"] for r in ref], dec),
    ]
    m = len(corpus)
    # kvferry decodes with the decoder chain alone: the lines the config's
    # clean_up_tokenization_spaces would change are reported, not required.
    cleanup = sum(1 for r in ref if r["decoded"] != r["decoded_raw"])
    note = f" ({cleanup} that clean_up_tokenization_spaces would change)" if cleanup else ""
    print(f"{family}: encode {counts[0]}/{m}, encode+special {counts[1]}/{m}, "
          f"decode {counts[2]}/{m}{note}")
    return 0 if all(c == m for c in counts) else 1


if __name__ == "__main__":
    sys.exit(main())

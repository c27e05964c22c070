#!/usr/bin/env bash
# kvf bench tiers on a small file: 8 blocks of 64 KiB written through a
# disk-only KV tier and read back, every one good; the report has its
# rates and the tier's read against the sequential read. Structure only,
# never the rates. Needs KVF_BIN_DIR (ctest sets it).
set -euo pipefail
bin=${KVF_BIN_DIR:?KVF_BIN_DIR must name the bin directory of a build}
dir=$(mktemp -d /tmp/kvf-test-bench-tiers-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$bin/kvf" bench tiers --dir "$dir" --blocks 8 --block-bytes 64K --inflight 4) ||
    { echo "$out" >&2; fail "kvf bench tiers failed"; }
for want in "write (through the tier)" "sequential O_DIRECT read" "dd iflag=direct" \
    "(8 of 8 good)" "tier_read_vs_sequential"; do
    grep -qF -- "$want" <<<"$out" || { echo "$out" >&2; fail "no '$want' in the report"; }
done
[[ -z $(ls -A "$dir") ]] || fail "the tier file was left behind"
"$bin/kvf" bench tiers --blocks 8 >/dev/null 2>&1 && fail "no --dir accepted"
"$bin/kvf" bench tiers --dir /dev/null/x --blocks 8 >/dev/null 2>&1 && fail "a bad --dir accepted"
echo "bench tiers: ok"

#!/usr/bin/env bash
# The cluster end to end on published tokenizers and chat templates: for
# each family, a tiny random model made by `kvf mkmodel --tokenizer` (the
# family's tokenizer.json and tokenizer_config.json copied in), served by a
# split cluster (router + one prefill + one decode node) on 127.0.0.1, and
# checked through the router's HTTP API with curl:
#
#   - completions and chat completions, greedy, streamed and not, on prompts
#     of multilingual text, emoji and U+0000: the streamed text (the deltas
#     joined) equals the whole one, and both equal the colocated engine's
#     (`kvf generate --prompt-ids` on the ids `kvf tokenize --jsonl` gives
#     for the prompt; for chat, for the prompt the family's template
#     renders, written out below), usage.prompt_tokens equals the number of
#     those ids, and the streamed text equals the generated ids decoded whole
#     (`kvf tokenize --decode`);
#   - a stop string: the text cut before it, finish_reason stop, streamed too;
#   - afterwards, 0 KV blocks in use on both nodes (/metrics).
#
# Families: qwen3 (--arch qwen3; its chat template recognised from the
# copied tokenizer_config.json, no --chat-template) and gpt2 (llama
# weights, router --chat-template chatml: GPT-2 has no template), whose
# tokenizer files are in tests/data/tokenizers/; llama2 (byte fallback,
# Metaspace) and gemma only when $KVF_TOKREF_DIR/<family>/tokenizer.json
# exists (tools/tokref/fetch.sh; their licenses keep them out of the
# repository), SKIP otherwise.
#
# Needs KVF_BIN_DIR (ctest sets it), curl, python3 and xz. Models and
# tokenizer copies live in a temporary directory, removed on exit; every
# process started here is stopped by pid.
set -euo pipefail

bin=${KVF_BIN_DIR:?KVF_BIN_DIR must name the bin directory of a build}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
data=${KVF_TEST_DATA:-$here/../data}/tokenizers
work=$(mktemp -d /tmp/kvf-test-realtok.XXXXXX)
export UCX_NET_DEVICES=lo
export KVF_LOG=${KVF_LOG:-info}
key=test-key-$$
source "$here/cluster.bash"
trap cleanup EXIT
for tool in curl python3 xz; do
    command -v "$tool" > /dev/null || fail "$tool is not installed"
done

MAX_TOKENS=${KVF_REALTOK_MAX_TOKENS:-12} # tokens generated per request

# The requests of one family, as files under DIR: for each case NAME a line
# "NAME KIND" in DIR/cases (KIND text or chat), NAME.json (the request
# body, not streamed), NAME.stream.json (streamed), NAME.prompt (the prompt
# the model sees, as one JSON string: the chat template rendered by hand
# from the published template, without the leading BOS that the tokenizer
# adds itself).
write_cases() { # FAMILY DIR
    python3 - "$1" "$2" "$MAX_TOKENS" <<'EOF'
import json, sys
family, out, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
texts = {
    "ascii": "The quick brown fox jumps over the lazy dog",
    "multilingual": "Grüße aus Köln — 東京は晴れ、Привет мир, مرحبا بالعالم, नमस्ते 🙂🚀👩‍💻",
    "nul": "before\u0000after: caf\u00e9 \U0001F600 end",
}
chats = {
    "chat_multilingual": "Bonjour ! 你好，世界 🌍 Как дела? 👍🏽",
    "chat_nul": "zero\u0000byte 😀 ok",
}
def render(content):
    if family in ("qwen3", "gpt2"):  # ChatML: qwen3's own, chatml for gpt2
        return "<|im_start|>user\n" + content + "<|im_end|>\n<|im_start|>assistant\n"
    if family == "llama2":
        return "[INST] " + content + " [/INST]"
    if family == "gemma":
        return "<start_of_turn>user\n" + content + "<end_of_turn>\n<start_of_turn>model\n"
    raise SystemExit("no chat rendering for " + family)
cases = []
common = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
for name, text in texts.items():
    cases.append((name, "text", dict(common, prompt=text), text))
for name, content in chats.items():
    cases.append((name, "chat", dict(common, messages=[{"role": "user", "content": content}]),
                  render(content)))
with open(out + "/cases", "w") as f:
    for name, kind, body, prompt in cases:
        f.write("%s %s\n" % (name, kind))
        json.dump(body, open("%s/%s.json" % (out, name), "w"))
        json.dump(dict(body, stream=True), open("%s/%s.stream.json" % (out, name), "w"))
        open("%s/%s.prompt" % (out, name), "w").write(json.dumps(prompt) + "\n")
EOF
}

# reference_ids NAME: the ids of DIR/NAME.prompt (BOS as the tokenizer adds
# it), comma-separated, in DIR/NAME.ids.
reference_ids() {
    "$bin/kvf" tokenize --model "$model" --jsonl < "$cases/$1.prompt" > "$cases/$1.ids.json"
    python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1])))))' \
        "$cases/$1.ids.json" > "$cases/$1.ids"
}

# check_case NAME KIND: the whole and the streamed answer against the
# colocated reference.
check_case() {
    local name=$1 kind=$2 code
    reference_ids "$name"
    "$bin/kvf" generate --model "$model" --prompt-ids "$(cat "$cases/$name.ids")" \
        --max-tokens "$MAX_TOKENS" --ignore-eos --threads 1 > "$cases/$name.ref" ||
        fail "$family $name: kvf generate failed"
    # the same tokens decoded whole (the decoder tokenizer_ref.sh holds to
    # Hugging Face's), against which the streaming detokenizer is checked
    "$bin/kvf" generate --model "$model" --prompt-ids "$(cat "$cases/$name.ids")" \
        --max-tokens "$MAX_TOKENS" --ignore-eos --threads 1 --ids > "$cases/$name.gen.ids"
    echo "[$(cat "$cases/$name.gen.ids")]" |
        "$bin/kvf" tokenize --model "$model" --decode --jsonl > "$cases/$name.decoded"
    local path=/v1/completions
    [[ $kind == chat ]] && path=/v1/chat/completions
    code=$(curl -s -o "$cases/$name.out.json" -w '%{http_code}' --max-time 60 "${auth[@]}" \
        -H 'Content-Type: application/json' --data-binary "@$cases/$name.json" "$http$path")
    [[ $code == 200 ]] || fail "$family $name: HTTP $code: $(cat "$cases/$name.out.json")"
    curl -sN --max-time 60 "${auth[@]}" -H 'Content-Type: application/json' \
        --data-binary "@$cases/$name.stream.json" "$http$path" > "$cases/$name.sse"
    sse_text "$cases/$name.sse" "$kind" > "$cases/$name.streamed" ||
        fail "$family $name: stream: $(tail -c 400 "$cases/$name.sse")"
    python3 - "$cases" "$name" "$kind" "$MAX_TOKENS" <<'EOF' || fail "$family $name differs"
import json, sys
d, name, kind, max_tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def read(suffix):
    return open("%s/%s.%s" % (d, name, suffix), encoding="utf-8", newline="").read()
ref = read("ref")
ref = ref[:-1] if ref.endswith("\n") else ref  # kvf generate ends with a newline
out = json.loads(read("out.json"))
choice = out["choices"][0]
whole = choice["message"]["content"] if kind == "chat" else choice["text"]
streamed = read("streamed")
n_ids = len(json.loads(read("ids.json")))
decoded = json.loads(read("decoded"))
assert ref == decoded, "kvf generate: %r\n its ids decoded whole: %r" % (ref, decoded)
assert whole == ref, "whole: %r\n kvf generate: %r" % (whole, ref)
assert streamed == ref, "streamed: %r\n kvf generate: %r" % (streamed, ref)
assert choice["finish_reason"] == "length", choice
u = out["usage"]
assert u["prompt_tokens"] == n_ids, "usage.prompt_tokens %d, kvf tokenize gives %d ids" % (
    u["prompt_tokens"], n_ids)
assert u["completion_tokens"] == max_tokens, u
EOF
}

# check_stop: a stop string from the middle of the ascii case's text (its
# reference already made by check_case): cut before it, finish_reason stop,
# whole and streamed.
check_stop() {
    local code
    python3 - "$cases" <<'EOF' || fail "$family: no stop string"
import json, sys
d = sys.argv[1]
ref = open(d + "/ascii.ref", encoding="utf-8", newline="").read()[:-1]
assert len(ref) >= 4, "reference too short for a stop string: %r" % ref
stop = ref[len(ref) // 2:len(ref) // 2 + 2]
body = json.load(open(d + "/ascii.json"))
body["stop"] = [stop, "never-seen"]
json.dump(body, open(d + "/stop.json", "w"))
json.dump(dict(body, stream=True), open(d + "/stop.stream.json", "w"))
json.dump(ref[:ref.index(stop)], open(d + "/stop.want", "w"))
EOF
    code=$(curl -s -o "$cases/stop.out.json" -w '%{http_code}' --max-time 60 "${auth[@]}" \
        --data-binary "@$cases/stop.json" "$http/v1/completions")
    [[ $code == 200 ]] || fail "$family stop: HTTP $code: $(cat "$cases/stop.out.json")"
    curl -sN --max-time 60 "${auth[@]}" --data-binary "@$cases/stop.stream.json" \
        "$http/v1/completions" > "$cases/stop.sse"
    sse_text "$cases/stop.sse" text > "$cases/stop.streamed" ||
        fail "$family stop: stream: $(tail -c 400 "$cases/stop.sse")"
    python3 - "$cases" <<'EOF' || fail "$family: stop string"
import json, sys
d = sys.argv[1]
want = json.load(open(d + "/stop.want"))
out = json.load(open(d + "/stop.out.json"))["choices"][0]
streamed = open(d + "/stop.streamed", encoding="utf-8", newline="").read()
assert out["text"] == want and out["finish_reason"] == "stop", "%r, want %r" % (out, want)
assert streamed == want, "streamed %r, want %r" % (streamed, want)
EOF
}

# blocks_freed: no KV block in use on either node.
blocks_freed() {
    [[ $(metric 'kvf_kv_blocks_used{node="prefill-0",role="prefill"}') == 0 &&
        $(metric 'kvf_kv_blocks_used{node="decode-0",role="decode"}') == 0 ]]
}

# The directory of FAMILY's tokenizer files (the committed ones
# decompressed into $work); empty when there is none.
tokenizer_dir() {
    local family=$1
    if [[ -f $data/$family/tokenizer.json.xz ]]; then
        mkdir -p "$work/tok-$family"
        xz -dc "$data/$family/tokenizer.json.xz" > "$work/tok-$family/tokenizer.json"
        cp "$data/$family/tokenizer_config.json" "$work/tok-$family/"
        echo "$work/tok-$family"
    elif [[ -n ${KVF_TOKREF_DIR:-} && -f $KVF_TOKREF_DIR/$family/tokenizer.json ]]; then
        echo "$KVF_TOKREF_DIR/$family"
    fi
}

auth=(-H "Authorization: Bearer $key")
# family, its model's architecture, and the router's --chat-template ("-":
# recognised from tokenizer_config.json)
families=("qwen3 qwen3 -" "gpt2 llama chatml" "llama2 llama llama2" "gemma llama gemma")
ran=0
for spec in "${families[@]}"; do
    read -r family arch template <<< "$spec"
    tok=$(tokenizer_dir "$family")
    if [[ -z $tok ]]; then
        echo "SKIP $family: no tokenizer.json (set KVF_TOKREF_DIR, see tools/tokref/fetch.sh)"
        continue
    fi
    echo "== $family"
    model=$work/tiny-$family
    "$bin/kvf" mkmodel "$model" --arch "$arch" --layers 2 --hidden 64 --heads 4 --kv-heads 2 \
        --inter 128 --tie --seed 5 --tokenizer "$tok" > "$work/mkmodel-$family.log" ||
        fail "$family: kvf mkmodel --tokenizer failed: $(cat "$work/mkmodel-$family.log")"
    cases=$work/cases-$family
    mkdir -p "$cases"
    write_cases "$family" "$cases"
    router_flags=(--model "$model" --api-key "$key")
    [[ $template == - ]] || router_flags+=(--chat-template "$template")
    start_router "router-$family" "${router_flags[@]}"
    start_node prefill prefill-0
    start_node decode decode-0 --kv-mem 32M
    wait_healthy
    while read -r name kind; do
        check_case "$name" "$kind"
        pass "$family $name: whole = streamed = kvf generate, usage.prompt_tokens = kvf tokenize"
    done < "$cases/cases"
    check_stop
    pass "$family: stop string, whole and streamed"
    poll 60 blocks_freed || fail "$family: KV blocks still in use: $(curl -s "$http/metrics" | grep blocks_used)"
    pass "$family: 0 KV blocks in use on both nodes"
    stop_all || fail "$family: the router did not stop cleanly"
    rm -rf "$model"
    ran=$((ran + 1))
done
((ran >= 2)) || fail "only $ran families ran"
echo "all real-tokenizer cluster tests passed ($ran families)"

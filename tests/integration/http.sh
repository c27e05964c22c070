#!/usr/bin/env bash
# The router's OpenAI-compatible HTTP API end to end, with curl and the
# official `openai` Node.js client, against real clusters on 127.0.0.1:
#
#   1. router alone: /health 503, /v1/models, /metrics, 404, 405, 401, 413,
#      malformed and ill-typed JSON, unknown model, n > 1, 503 + Retry-After;
#   2. for each topology in KVF_HTTP_TOPOLOGIES (default "disagg local":
#      one prefill + one decode node, and one decode node with
#      --prefill-local): /health 200; completions and chat, streaming and
#      not, greedy text identical to the colocated `kvf generate`; every
#      field (usage, finish_reason stop/length, stop strings, token-id
#      prompts, seed, stream_options.include_usage, id/object/created/model);
#      text holding U+0000 (\u0000, whole and streamed); the chat template
#      recognised from tokenizer_config.json; a client that disconnects
#      mid-stream (cancelled, blocks freed); 64 concurrent
#      streams, then 0 KV blocks in use on every node; metrics: after N
#      requests the counters and histogram counts grew by exactly N;
#      the `openai` Node.js client (skipped with a message when npm cannot
#      reach its registry);
#   3. overload: with the only slot held and no queue, a request is
#      answered 429 with Retry-After.
#
# Needs KVF_BIN_DIR (ctest sets it), curl and python3.
# Every process started here is stopped by pid on exit.
set -euo pipefail

bin=${KVF_BIN_DIR:?KVF_BIN_DIR must name the bin directory of a build}
topologies=${KVF_HTTP_TOPOLOGIES:-disagg local}
work=$(mktemp -d /tmp/kvf-test-http.XXXXXX)
export UCX_NET_DEVICES=lo
export KVF_LOG=${KVF_LOG:-info}

source "$(dirname "${BASH_SOURCE[0]}")/cluster.bash"
trap cleanup EXIT

# A small random model (context 4096, so a stream can run long enough to
# hang up in the middle of it) whose tokenizer_config.json carries a ChatML
# chat template, which the router must recognise; the served model name
# defaults to this directory's name.
model=$work/tiny-chat
"$bin/kvf" mkmodel "$model" --layers 2 --hidden 64 --heads 4 --kv-heads 2 --inter 128 --vocab 512 \
    --max-pos 4096 --seed 11 > "$work/mkmodel.log"
python3 - "$model/tokenizer_config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["chat_template"] = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
                      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
json.dump(c, open(sys.argv[1], "w"))
EOF

key=test-key-$$
auth=(-H "Authorization: Bearer $key")
# post PATH BODY OUT: POST with the key; prints the status code.
post() {
    curl -s -o "$3" -w '%{http_code}' --max-time 60 "${auth[@]}" \
        -H 'Content-Type: application/json' -d "$2" "$http$1"
}
# expect_error CODE PATH BODY [TYPE]
expect_error() {
    local code
    code=$(post "$2" "$3" "$work/err.json")
    [[ $code == "$1" ]] || fail "POST $2 $3: HTTP $code, expected $1: $(cat "$work/err.json")"
    [[ $(json "$work/err.json" 'sorted(d["error"].keys())') == "['code', 'message', 'param', 'type']" ]] ||
        fail "POST $2 $3: not an OpenAI error object: $(cat "$work/err.json")"
    if [[ -n ${4:-} ]]; then
        [[ $(json "$work/err.json" 'd["error"]["type"]') == "$4" ]] ||
            fail "POST $2 $3: error type is not $4: $(cat "$work/err.json")"
    fi
}
# The colocated reference: kvf generate's text (its trailing newline dropped).
reference() { # PROMPT MAX_TOKENS
    "$bin/kvf" generate --model "$model" --prompt "$1" --max-tokens "$2" --ignore-eos --threads 1 \
        > "$work/ref.txt"
    python3 -c 'import sys; t=open(sys.argv[1], encoding="utf-8", newline="").read(); print(t[:-1] if t.endswith("\n") else t, end="")' "$work/ref.txt"
}
# ---- 1. router alone ----------------------------------------------------------------
start_router router0 --model "$model" --api-key "$key" --max-body 2048 --max-queue 0
[[ $(curl -s -o "$work/h.json" -w '%{http_code}' "$http/health") == 503 ]] || fail "/health without nodes is not 503"
[[ $(json "$work/h.json" 'd["status"]') == unavailable ]] || fail "/health: $(cat "$work/h.json")"
grep -q 'no live decode node' "$work/h.json" || fail "/health gives no reason: $(cat "$work/h.json")"
pass "/health 503 with a reason without nodes"
curl -s --max-time 5 "${auth[@]}" "$http/v1/models" > "$work/models.json"
[[ $(json "$work/models.json" 'd["object"] + " " + d["data"][0]["id"] + " " + d["data"][0]["object"]') == "list tiny-chat model" ]] ||
    fail "/v1/models: $(cat "$work/models.json")"
pass "/v1/models names the model directory"
[[ $(metric 'kvf_nodes{role="decode",state="live"}') == 0 ]] || fail "/metrics: no node gauge"
pass "/metrics answers"
[[ $(curl -s -o /dev/null -w '%{http_code}' "$http/v1/models") == 401 ]] || fail "no key: not 401"
[[ $(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer nope' "$http/v1/models") == 401 ]] ||
    fail "wrong key: not 401"
pass "401 without or with a wrong key"
[[ $(curl -s -o "$work/e.json" -w '%{http_code}' "${auth[@]}" "$http/v1/nothing") == 404 ]] || fail "not 404"
[[ $(curl -s -o /dev/null -w '%{http_code}' "${auth[@]}" "$http/v1/chat/completions") == 405 ]] || fail "GET chat: not 405"
[[ $(curl -s -o /dev/null -w '%{http_code}' -X POST "$http/metrics") == 405 ]] || fail "POST /metrics: not 405"
pass "404, 405"
# The request head's limits: OpenAI error objects, not libmicrohttpd's HTML.
long_query=$(python3 -c 'print("a" * 9000)')
[[ $(curl -s -o "$work/e.json" -w '%{http_code}' "${auth[@]}" "$http/v1/models?pad=$long_query") == 414 ]] ||
    fail "a 9000-byte target: not 414"
[[ $(json "$work/e.json" 'd["error"]["code"] + " " + d["error"]["type"]') == "uri_too_long invalid_request_error" ]] ||
    fail "414: not an OpenAI error object: $(head -c 300 "$work/e.json")"
big_header=$(python3 -c 'print("X-Pad: " + "b" * 20000)')
[[ $(curl -s -o "$work/e.json" -w '%{http_code}' "${auth[@]}" -H "$big_header" "$http/v1/models") == 431 ]] ||
    fail "20000 bytes of header fields: not 431"
[[ $(json "$work/e.json" 'd["error"]["code"] + " " + d["error"]["type"]') == "header_fields_too_large invalid_request_error" ]] ||
    fail "431: not an OpenAI error object: $(head -c 300 "$work/e.json")"
pass "414 above 8 KiB of target, 431 above 16 KiB of header fields, as OpenAI error objects"
big=$(python3 -c 'print("{\"prompt\": \"" + "x" * 4000 + "\"}")')
expect_error 413 /v1/completions "$big"
pass "413 above --max-body"
expect_error 400 /v1/completions '{"prompt": "hi", ' invalid_request_error
expect_error 400 /v1/completions '{"prompt": 3}'
# JSON is UTF-8: a body that is not (here Latin-1 inside a string) is a 400.
expect_error 400 /v1/completions $'{"prompt": "caf\xe9"}' invalid_request_error
grep -q 'not valid UTF-8' "$work/err.json" || fail "invalid UTF-8: $(cat "$work/err.json")"
expect_error 400 /v1/completions '{"prompt": "hi", "max_tokens": "8"}'
expect_error 400 /v1/completions '{"prompt": "hi", "temperature": -1}'
expect_error 400 /v1/completions '{"prompt": "hi", "n": 2}'
expect_error 400 /v1/completions '{"prompt": "hi", "stop": [1]}'
expect_error 400 /v1/completions '{"prompt": "hi", "model": "gpt-4"}'
[[ $(json "$work/err.json" 'd["error"]["code"]') == model_not_found ]] || fail "unknown model: $(cat "$work/err.json")"
expect_error 400 /v1/chat/completions '{"messages": "hi"}'
expect_error 400 /v1/chat/completions '{"messages": [{"role": "wizard", "content": "x"}]}'
expect_error 400 /v1/completions '{"prompt": [1, 2, 99999]}'
pass "400 for malformed JSON, wrong types, n > 1, unknown model, bad messages, ids outside the vocabulary"
code=$(curl -s -D "$work/hdr" -o "$work/err.json" -w '%{http_code}' --max-time 10 "${auth[@]}" \
    -d '{"prompt": "hi", "stream": true}' "$http/v1/completions")
[[ $code == 503 ]] || fail "no nodes, no queue: $code $(cat "$work/err.json")"
grep -qi '^Retry-After: ' "$work/hdr" || fail "503 without Retry-After"
pass "503 + Retry-After when the cluster cannot serve"
stop_all || fail "a router did not stop cleanly"

# ---- 2. clusters ---------------------------------------------------------------------
npm_dir=$work/npm
node_client_ready=unknown
node_client() { # runs tests/integration/http_openai.mjs against $http
    if [[ $node_client_ready == unknown ]]; then
        node_client_ready=no
        if ! command -v node > /dev/null || ! command -v npm > /dev/null; then
            echo "skip: the openai Node.js client test (node or npm missing)"
        elif mkdir -p "$npm_dir" && (cd "$npm_dir" && timeout 180 npm install --silent --no-audit \
            --no-fund openai > "$work/npm.log" 2>&1); then
            node_client_ready=yes
        else
            echo "skip: the openai Node.js client test (npm install openai failed: $(tail -n 2 "$work/npm.log" | tr '\n' ' '))"
        fi
    fi
    [[ $node_client_ready == yes ]] || return 0
    cp "$(dirname "$0")/http_openai.mjs" "$npm_dir/"
    local ref_text ref_chat
    ref_text=$(reference "The quick brown fox" 12)
    ref_chat=$(reference $'<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n' 10)
    KVF_BASE_URL=$http/v1 KVF_API_KEY=$key KVF_MODEL=tiny-chat KVF_REF_TEXT=$ref_text \
        KVF_REF_CHAT=$ref_chat timeout 120 node "$npm_dir/http_openai.mjs" ||
        fail "the openai Node.js client test failed"
    pass "openai Node.js client: completions and chat, streaming and not, equal to kvf generate"
}

for topology in $topologies; do
    echo "== topology: $topology"
    start_router "router-$topology" --model "$model" --api-key "$key" --max-queue 256
    case $topology in
    disagg)
        start_node prefill "prefill-0"
        start_node decode "decode-0" --kv-mem 32M --max-running 128
        ;;
    local) start_node decode "decode-0" --kv-mem 32M --max-running 128 --prefill-local ;;
    *) fail "unknown topology $topology" ;;
    esac
    wait_healthy
    curl -s "$http/health" > "$work/h.json"
    [[ $(json "$work/h.json" 'd["status"]') == ok ]] || fail "/health: $(cat "$work/h.json")"
    pass "/health 200 with live nodes"

    m_req0=$(metric 'kvf_requests_total{finished_reason="length"}')
    m_ttft0=$(metric kvf_time_to_first_token_seconds_count)
    m_e2e0=$(metric kvf_e2e_request_latency_seconds_count)
    m_itl0=$(metric kvf_inter_token_latency_seconds_count)
    m_gen0=$(metric kvf_generation_tokens_total)
    m_prompt0=$(metric kvf_prompt_tokens_total)
    m_kv0=$(metric kvf_kv_transfer_seconds_count)

    # Completions, not streamed: greedy text equals the colocated engine's.
    prompt="The KV cache turns quadratic recomputation into linear decode"
    ref=$(reference "$prompt" 16)
    body=$(python3 -c 'import json,sys; print(json.dumps({"model": "tiny-chat", "prompt": sys.argv[1], "max_tokens": 16, "temperature": 0, "ignore_eos": True}))' "$prompt")
    [[ $(post /v1/completions "$body" "$work/c.json") == 200 ]] || fail "completion: $(cat "$work/c.json")"
    [[ $(json "$work/c.json" 'd["choices"][0]["text"]') == "$ref" ]] ||
        fail "completion text differs from kvf generate: $(cat "$work/c.json") vs '$ref'"
    [[ $(json "$work/c.json" 'd["object"]') == text_completion ]] || fail "object: $(cat "$work/c.json")"
    [[ $(json "$work/c.json" 'd["model"]') == tiny-chat ]] || fail "model: $(cat "$work/c.json")"
    [[ $(json "$work/c.json" 'd["id"].startswith("cmpl-") and isinstance(d["created"], int) and d["created"] > 1600000000') == True ]] ||
        fail "id/created: $(cat "$work/c.json")"
    [[ $(json "$work/c.json" 'd["choices"][0]["finish_reason"]') == length ]] || fail "finish_reason: $(cat "$work/c.json")"
    [[ $(json "$work/c.json" 'd["usage"]["completion_tokens"] == 16 and d["usage"]["total_tokens"] == d["usage"]["prompt_tokens"] + 16 and d["usage"]["prompt_tokens"] > 1') == True ]] ||
        fail "usage: $(cat "$work/c.json")"
    prompt_tokens=$(json "$work/c.json" 'd["usage"]["prompt_tokens"]')
    pass "completion: text = kvf generate, usage, finish_reason length, id/object/created/model"

    # Streamed: the same text, with the usage chunk when asked for.
    body=$(python3 -c 'import json,sys; print(json.dumps({"prompt": sys.argv[1], "max_tokens": 16, "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}))' "$prompt")
    curl -sN --max-time 60 "${auth[@]}" -d "$body" "$http/v1/completions" > "$work/s.txt"
    [[ $(sse_text "$work/s.txt" text) == "$ref" ]] || fail "streamed text differs: $(cat "$work/s.txt")"
    python3 - "$work/s.txt" <<'EOF' || fail "include_usage: $(tail -c 400 "$work/s.txt")"
import json, sys
ev = [json.loads(e[6:]) for e in open(sys.argv[1]).read().split("\n\n") if e.startswith("data: {")]
assert ev[-1]["choices"] == [] and ev[-1]["usage"]["completion_tokens"] == 16, ev[-1]
assert all(e["usage"] is None for e in ev[:-1]), ev
assert ev[-2]["choices"][0]["finish_reason"] == "length", ev[-2]
EOF
    pass "streamed completion: same text, SSE shape, include_usage"

    # A prompt of token ids, used exactly (the usage counts them).
    ids=$("$bin/kvf" tokenize --model "$model" --text "$prompt")
    [[ $(python3 -c 'import sys; print(len(sys.argv[1].split(",")))' "$ids") == "$prompt_tokens" ]] ||
        fail "usage.prompt_tokens $prompt_tokens, kvf tokenize: $ids"
    ids=$ids,17,42
    body="{\"prompt\": [$ids], \"max_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true}"
    [[ $(post /v1/completions "$body" "$work/c.json") == 200 ]] || fail "id prompt: $(cat "$work/c.json")"
    "$bin/kvf" generate --model "$model" --prompt-ids "$ids" --max-tokens 8 --ignore-eos \
        --threads 1 > "$work/ref.txt"
    want=$(python3 -c 'import sys; t=open(sys.argv[1], encoding="utf-8", newline="").read(); print(t[:-1] if t.endswith("\n") else t, end="")' "$work/ref.txt")
    [[ $(json "$work/c.json" 'd["choices"][0]["text"]') == "$want" ]] || fail "id prompt: $(cat "$work/c.json") vs '$want'"
    [[ $(json "$work/c.json" 'd["usage"]["prompt_tokens"]') == $((prompt_tokens + 2)) ]] ||
        fail "id prompt usage: $(cat "$work/c.json")"
    pass "prompt as token ids, used exactly"

    # A prompt holding U+0000 is carried whole, never cut at it: the usage
    # counts the tokens of all of "he\0llo" (not of "he"), and the text
    # equals that of its token ids; one that starts with it is no empty one.
    nul_ids=$(printf '"he\\u0000llo"\n' | "$bin/kvf" tokenize --model "$model" --jsonl | tr -d '[]')
    he_ids=$("$bin/kvf" tokenize --model "$model" --text he)
    n_nul=$(python3 -c 'import sys; print(len(sys.argv[1].split(",")))' "$nul_ids")
    (( n_nul > $(python3 -c 'import sys; print(len(sys.argv[1].split(",")))' "$he_ids") )) ||
        fail "\"he\\u0000llo\" tokenizes as \"he\": $nul_ids"
    body='{"prompt": "he\u0000llo", "max_tokens": 8, "temperature": 0, "ignore_eos": true}'
    [[ $(post /v1/completions "$body" "$work/nul-in.json") == 200 ]] || fail "U+0000 prompt: $(cat "$work/nul-in.json")"
    [[ $(json "$work/nul-in.json" 'd["usage"]["prompt_tokens"]') == "$n_nul" ]] ||
        fail "U+0000 prompt: usage $(cat "$work/nul-in.json"), kvf tokenize: $nul_ids"
    body="{\"prompt\": [$nul_ids], \"max_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true}"
    [[ $(post /v1/completions "$body" "$work/nul-ids.json") == 200 ]] || fail "U+0000 ids: $(cat "$work/nul-ids.json")"
    [[ $(json "$work/nul-in.json" 'd["choices"][0]["text"]') == $(json "$work/nul-ids.json" 'd["choices"][0]["text"]') ]] ||
        fail "U+0000 prompt: $(cat "$work/nul-in.json") vs its ids: $(cat "$work/nul-ids.json")"
    body='{"prompt": "\u0000hello", "max_tokens": 2, "temperature": 0, "ignore_eos": true}'
    [[ $(post /v1/completions "$body" "$work/nul-in.json") == 200 ]] || fail "U+0000 first: $(cat "$work/nul-in.json")"
    pass "a prompt holding U+0000 is served whole (usage $n_nul tokens, = its token ids)"

    # A stop string: the text ends before it, finish_reason stop.
    stop=$(python3 -c 'import sys; t=sys.argv[1]; print(t[len(t)//2:len(t)//2+2])' "$ref")
    body=$(python3 -c 'import json,sys; print(json.dumps({"prompt": sys.argv[1], "max_tokens": 16, "temperature": 0, "ignore_eos": True, "stop": [sys.argv[2], "never-seen"]}))' "$prompt" "$stop")
    [[ $(post /v1/completions "$body" "$work/c.json") == 200 ]] || fail "stop: $(cat "$work/c.json")"
    want=$(python3 -c 'import sys; t=sys.argv[1]; print(t[:t.index(sys.argv[2])], end="")' "$ref" "$stop")
    [[ $(json "$work/c.json" 'd["choices"][0]["text"]') == "$want" && $(json "$work/c.json" 'd["choices"][0]["finish_reason"]') == stop ]] ||
        fail "stop '$stop': $(cat "$work/c.json"), want '$want'"
    pass "stop strings: finish_reason stop, text cut before the stop string"

    # Sampling with a seed is reproducible; top_p, top_k accepted.
    body='{"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0.9, "top_p": 0.9, "top_k": 40, "seed": 1234, "ignore_eos": true}'
    post /v1/completions "$body" "$work/a.json" > /dev/null
    post /v1/completions "$body" "$work/b.json" > /dev/null
    [[ $(json "$work/a.json" 'd["choices"][0]["text"]') == "$(json "$work/b.json" 'd["choices"][0]["text"]')" ]] ||
        fail "seeded sampling differs: $(cat "$work/a.json") $(cat "$work/b.json")"
    pass "seed, temperature, top_p, top_k"

    # Chat: the ChatML template recognised from tokenizer_config.json.
    chat_prompt=$'<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n'
    ref_chat=$(reference "$chat_prompt" 12)
    body='{"model": "tiny-chat", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}], "max_completion_tokens": 12, "temperature": 0, "ignore_eos": true}'
    [[ $(post /v1/chat/completions "$body" "$work/c.json") == 200 ]] || fail "chat: $(cat "$work/c.json")"
    [[ $(json "$work/c.json" 'd["choices"][0]["message"]["content"]') == "$ref_chat" ]] ||
        fail "chat text differs from kvf generate on the rendered prompt: $(cat "$work/c.json") vs '$ref_chat'"
    [[ $(json "$work/c.json" 'd["object"] + " " + d["choices"][0]["message"]["role"] + " " + d["id"][:9]') == "chat.completion assistant chatcmpl-" ]] ||
        fail "chat fields: $(cat "$work/c.json")"
    body='{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]}], "max_tokens": 12, "temperature": 0, "ignore_eos": true, "stream": true}'
    curl -sN --max-time 60 "${auth[@]}" -d "$body" "$http/v1/chat/completions" > "$work/s.txt"
    [[ $(sse_text "$work/s.txt" chat) == "$ref_chat" ]] || fail "streamed chat differs: $(cat "$work/s.txt")"
    python3 - "$work/s.txt" <<'EOF' || fail "chat stream's first delta: $(head -c 400 "$work/s.txt")"
import json, sys
ev = [json.loads(e[6:]) for e in open(sys.argv[1]).read().split("\n\n") if e.startswith("data: {")]
assert ev[0]["choices"][0]["delta"]["role"] == "assistant", ev[0]
assert ev[-1]["choices"][0]["delta"] == {} and ev[-1]["choices"][0]["finish_reason"] == "length", ev[-1]
EOF
    pass "chat (template from tokenizer_config.json), streaming and not, = kvf generate"

    # Text holding U+0000 (this model's byte-fallback token 188 comes 19th
    # for this prompt, 14th for this chat): written \u0000 in the JSON, whole
    # and streamed, and equal to kvf generate byte for byte (compared in
    # Python: the shell drops NUL bytes).
    "$bin/kvf" generate --model "$model" --prompt "Request number 1 says" --max-tokens 24 \
        --ignore-eos --threads 1 > "$work/nul-ref.txt"
    "$bin/kvf" generate --model "$model" --prompt $'<|im_start|>user\ni<|im_end|>\n<|im_start|>assistant\n' \
        --max-tokens 16 --ignore-eos --threads 1 > "$work/nul-ref-chat.txt"
    body='{"prompt": "Request number 1 says", "max_tokens": 24, "temperature": 0, "ignore_eos": true'
    [[ $(post /v1/completions "$body}" "$work/nul-c.json") == 200 ]] || fail "U+0000 completion: $(cat "$work/nul-c.json")"
    curl -sN --max-time 60 "${auth[@]}" -d "$body, \"stream\": true}" "$http/v1/completions" > "$work/nul-s.txt"
    body='{"messages": [{"role": "user", "content": "i"}], "max_tokens": 16, "temperature": 0, "ignore_eos": true'
    [[ $(post /v1/chat/completions "$body}" "$work/nul-cc.json") == 200 ]] || fail "U+0000 chat: $(cat "$work/nul-cc.json")"
    curl -sN --max-time 60 "${auth[@]}" -d "$body, \"stream\": true}" "$http/v1/chat/completions" > "$work/nul-cs.txt"
    sse_text "$work/nul-s.txt" text > "$work/nul-s.out"
    sse_text "$work/nul-cs.txt" chat > "$work/nul-cs.out"
    python3 - "$work" <<'EOF' || fail "text holding U+0000 differs from kvf generate"
import json, sys
w = sys.argv[1]
def read(name):
    return open(w + "/" + name, encoding="utf-8", newline="").read()
def ref(name):
    t = read(name)
    t = t[:-1] if t.endswith("\n") else t
    assert "\0" in t, name + ": the reference holds no U+0000 (another model?)"
    return t
text, chat = ref("nul-ref.txt"), ref("nul-ref-chat.txt")
got = {
    "completion": (json.loads(read("nul-c.json"))["choices"][0]["text"], text),
    "streamed": (read("nul-s.out"), text),
    "chat": (json.loads(read("nul-cc.json"))["choices"][0]["message"]["content"], chat),
    "streamed chat": (read("nul-cs.out"), chat),
}
for what, (have, want) in got.items():
    assert have == want, "%s: %r, kvf generate %r" % (what, have, want)
for name in ("nul-c.json", "nul-s.txt", "nul-cc.json", "nul-cs.txt"):
    assert "\\u0000" in read(name), name + ": no \\u0000"
EOF
    pass "text holding U+0000: \\u0000 in completions and chat, whole and streamed, = kvf generate"

    # A client that disconnects mid-stream: cancelled, blocks freed.
    m_cancel0=$(metric 'kvf_requests_total{finished_reason="cancelled"}')
    python3 - "$http" "$key" <<'EOF' || fail "disconnect client"
import http.client, json, sys, time
host = sys.argv[1].split("//")[1]
c = http.client.HTTPConnection(host, timeout=30)
c.request("POST", "/v1/completions", json.dumps({"prompt": "A long story", "max_tokens": 3000, "ignore_eos": True, "stream": True}),
          {"Authorization": "Bearer " + sys.argv[2], "Content-Type": "application/json"})
r = c.getresponse()
assert r.status == 200, r.status
line = r.readline()
assert line.startswith(b"data: "), line
c.sock.close()  # hang up mid-stream
EOF
    cancelled_one() {
        [[ $(metric 'kvf_requests_total{finished_reason="cancelled"}') == $((m_cancel0 + 1)) ]]
    }
    poll 60 cancelled_one || fail "the disconnected client's request was not cancelled"
    pass "a client that hangs up mid-stream cancels its request"

    # 64 concurrent streams, then no KV block in use anywhere.
    for i in $(seq 64); do
        curl -sN --max-time 120 "${auth[@]}" \
            -d "{\"prompt\": \"Request number $i says\", \"max_tokens\": $((4 + i % 13)), \"ignore_eos\": true, \"temperature\": 0, \"stream\": true}" \
            "$http/v1/completions" > "$work/par-$i.txt" &
        cpids[$i]=$!
    done
    for i in $(seq 64); do wait "${cpids[$i]}" || fail "stream $i: curl failed"; done
    for i in $(seq 64); do
        sse_text "$work/par-$i.txt" text > /dev/null || fail "stream $i: $(tail -c 300 "$work/par-$i.txt")"
    done
    all_freed() {
        "$bin/kvf" stats --router "$client" --json > "$work/stats.json" 2>/dev/null &&
            [[ $(json "$work/stats.json" 'len(d["nodes"]) > 0 and all(n["blocks_used"] == 0 and n["state"] == "live" for n in d["nodes"])') == True ]]
    }
    poll 60 all_freed || fail "KV blocks still in use after 64 streams: $(cat "$work/stats.json")"
    pass "64 concurrent streams complete; every node reports 0 KV blocks in use"

    # Metrics: N more requests move every counter and histogram by N.
    n=5
    m_req1=$(metric 'kvf_requests_total{finished_reason="length"}')
    m_ttft1=$(metric kvf_time_to_first_token_seconds_count)
    m_e2e1=$(metric kvf_e2e_request_latency_seconds_count)
    m_itl1=$(metric kvf_inter_token_latency_seconds_count)
    m_gen1=$(metric kvf_generation_tokens_total)
    m_prompt1=$(metric kvf_prompt_tokens_total)
    m_kv1=$(metric kvf_kv_transfer_seconds_count)
    for i in $(seq $n); do
        body=$(python3 -c 'import json,sys; print(json.dumps({"prompt": sys.argv[1], "max_tokens": 16, "temperature": 0, "ignore_eos": True}))' "$prompt")
        [[ $(post /v1/completions "$body" "$work/c.json") == 200 ]] || fail "metrics request $i"
    done
    check_delta() { # NAME BEFORE WANT_DELTA
        local now
        now=$(metric "$1")
        [[ $now != missing ]] || fail "metric $1 missing"
        python3 -c 'import sys; sys.exit(0 if float(sys.argv[2]) - float(sys.argv[1]) == float(sys.argv[3]) else 1)' "$2" "$now" "$3" ||
            fail "metric $1: $2 -> $now, expected +$3"
    }
    check_delta 'kvf_requests_total{finished_reason="length"}' "$m_req1" $n
    check_delta kvf_time_to_first_token_seconds_count "$m_ttft1" $n
    check_delta kvf_e2e_request_latency_seconds_count "$m_e2e1" $n
    check_delta kvf_inter_token_latency_seconds_count "$m_itl1" $((n * 15))
    check_delta kvf_generation_tokens_total "$m_gen1" $((n * 16))
    check_delta kvf_prompt_tokens_total "$m_prompt1" $((n * prompt_tokens))
    check_delta kvf_kv_transfer_seconds_count "$m_kv1" $n
    [[ $(metric kvf_num_requests_running) == 0 && $(metric kvf_num_requests_waiting) == 0 ]] ||
        fail "requests still running or waiting"
    [[ $(metric 'kvf_kv_blocks_total{node="decode-0",role="decode"}') -gt 0 ]] || fail "no kv_blocks_total gauge"
    if [[ $topology == disagg ]]; then
        [[ $(metric kvf_kv_transfer_bytes_total) -gt 0 ]] || fail "no KV bytes shipped"
        [[ $(metric 'kvf_nodes{role="prefill",state="live"}') == 1 ]] || fail "no live prefill gauge"
    fi
    [[ $(metric 'kvf_nodes{role="decode",state="live"}') == 1 ]] || fail "no live decode gauge"
    [[ $m_req0 != missing && $m_ttft0 != missing && $m_e2e0 != missing && $m_itl0 != missing &&
        $m_gen0 != missing && $m_prompt0 != missing && $m_kv0 != missing ]] || fail "metrics missing at start"
    pass "metrics: after $n requests, counters and histogram counts grew by $n"

    node_client
    stop_all || fail "a router did not stop cleanly"
done

# ---- 3. overload: 429 with Retry-After --------------------------------------------------
start_router router-busy --model "$model" --api-key "$key" --max-queue 0
start_node decode "decode-busy" --kv-mem 32M --max-running 1 --prefill-local
wait_healthy
# One request holds the node's only slot: a stream of as many tokens as the
# context takes, whose first token has arrived (so it runs, not queues) and
# which is still going while the others are sent (they follow at once; the
# long one is ended by its client afterwards). The others find no room.
curl -s -N -o "$work/busy-long.sse" --max-time 120 "${auth[@]}" \
    -d '{"prompt": "busy", "max_tokens": 4000, "ignore_eos": true, "stream": true}' \
    "$http/v1/completions" &
long_pid=$!
first_token() { grep -q '"text"' "$work/busy-long.sse" 2>/dev/null; }
poll 60 first_token || fail "overload: the long request never streamed a token"
for i in 1 2 3; do
    curl -s -D "$work/busy-$i.hdr" -o "$work/busy-$i.json" -w '%{http_code}' --max-time 60 "${auth[@]}" \
        -d '{"prompt": "busy", "max_tokens": 48, "ignore_eos": true}' "$http/v1/completions" \
        > "$work/busy-$i.code" &
    bpids[$i]=$!
done
for i in 1 2 3; do wait "${bpids[$i]}" || true; done
grep -q '\[DONE\]' "$work/busy-long.sse" &&
    fail "overload: the long request ended before the others were answered (not a held slot)"
kill "$long_pid" 2>/dev/null || true
wait "$long_pid" 2>/dev/null || true
n200=1 n429=0 # the long request, answered
for i in 1 2 3; do
    case $(cat "$work/busy-$i.code") in
    200) n200=$((n200 + 1)) ;;
    429)
        n429=$((n429 + 1))
        grep -qi '^Retry-After: ' "$work/busy-$i.hdr" || fail "429 without Retry-After"
        [[ $(json "$work/busy-$i.json" 'd["error"]["type"]') == rate_limit_error ]] ||
            fail "429 body: $(cat "$work/busy-$i.json")"
        ;;
    *) fail "busy request $i: $(cat "$work/busy-$i.code") $(cat "$work/busy-$i.json")" ;;
    esac
done
# with the slot held and no queue, every one of the others is refused
[[ $n429 == 3 ]] || fail "overload: $n429 of 3 refused while the slot was held ($n200 answered)"
pass "overload: 429 with Retry-After while another request runs"
stop_all || fail "a router did not stop cleanly"
echo "all HTTP tests passed"

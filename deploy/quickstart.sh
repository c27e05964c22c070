#!/usr/bin/env bash
# From a fresh Debian machine to a running kvferry cluster: installs the
# dependencies, builds, writes a small random-weight demo model (once),
# starts a router, one prefill and one decode node on 127.0.0.1, streams one
# prompt through them and prints the time to first token, the time per
# output token and the KV bytes shipped, then streams the same prompt through
# the OpenAI-compatible HTTP API with curl (port 8000, or KVF_HTTP_PORT, or a
# free one). Then it stops the cluster, unless --keep is given.
#
#   ./deploy/quickstart.sh [--keep] [--prompt TEXT] [--max-tokens N]
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
keep=0
prompt="The KV cache turns quadratic recomputation into linear decode"
max_tokens=32
while (($#)); do
    case "$1" in
    --keep) keep=1 ;;
    --prompt) prompt=$2; shift ;;
    --max-tokens) max_tokens=$2; shift ;;
    -h | --help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "quickstart: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
jobs=$(nproc 2>/dev/null || echo 2)

./deploy/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
cmake --build build -j "$jobs"
bin=$root/build/bin
"$bin/kvf" --version

model=${KVF_DEMO_MODEL:-$root/demo-model}
if [[ ! -f "$model/config.json" ]]; then
    echo "quickstart: writing a random-weight demo model to $model"
    mkdir -p "$model"
    "$bin/kvf" mkmodel "$model" --layers 4 --hidden 256 --heads 4 --kv-heads 2 --inter 688 \
        --vocab 512 --max-pos 4096 --seed 1
fi

run=$root/run/quickstart
mkdir -p "$run"
free_port() { "$root/deploy/free-port"; }
router_url=tcp://127.0.0.1:$(free_port)
client_url=tcp://127.0.0.1:$(free_port)
http_port=${KVF_HTTP_PORT:-8000}
if ! python3 -c 'import socket, sys; socket.socket().bind(("127.0.0.1", int(sys.argv[1])))' \
    "$http_port" 2> /dev/null; then
    http_port=$(free_port)
fi
http_url=http://127.0.0.1:$http_port
pids=()
stop_cluster() {
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    done
}
trap 'stop_cluster' EXIT

export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
"$bin/kvf-router" --listen "$router_url" --client "$client_url" --model "$model" \
    --http "127.0.0.1:$http_port" > "$run/router.log" 2>&1 &
pids+=($!)
"$bin/kvf-decode" --router "$router_url" --listen tcp://127.0.0.1:$(free_port) --model "$model" \
    --node-id decode-0 > "$run/decode-0.log" 2>&1 &
pids+=($!)
"$bin/kvf-prefill" --router "$router_url" --listen tcp://127.0.0.1:$(free_port) --model "$model" \
    --node-id prefill-0 > "$run/prefill-0.log" 2>&1 &
pids+=($!)
printf '%s\n' "${pids[@]}" > "$run/pids"

echo "quickstart: waiting for the cluster (logs in $run)"
ready=0
for _ in $(seq 150); do
    live=$("$bin/kvf" stats --router "$client_url" --json 2>/dev/null | grep -o '"state": "live"' | wc -l || true)
    if [[ "$live" -ge 2 ]]; then ready=1; break; fi
    sleep 0.2
done
if [[ $ready != 1 ]]; then
    echo "quickstart: the cluster did not come up; logs:" >&2
    tail -n 20 "$run"/*.log >&2
    exit 1
fi
"$bin/kvf" stats --router "$client_url"

echo
echo "prompt: $prompt"
echo "completion (random weights, so the text is noise):"
"$bin/kvf" generate --router "$client_url" --prompt "$prompt" --max-tokens "$max_tokens" \
    --ignore-eos --verbose
echo

echo "the same prompt through the OpenAI HTTP API (greedy, so the same text; streaming;" \
    "$http_url/health:" \
    "$(curl -s --max-time 5 "$http_url/health"))"
body=$(python3 -c 'import json, sys; print(json.dumps({"model": sys.argv[1], "prompt": sys.argv[2],
    "max_tokens": int(sys.argv[3]), "temperature": 0, "ignore_eos": True, "stream": True,
    "stream_options": {"include_usage": True}}))' "$(basename "$model")" "$prompt" "$max_tokens")
echo "curl -N $http_url/v1/completions -H 'Content-Type: application/json' -d '$body'"
curl -sSN --max-time 120 "$http_url/v1/completions" -H 'Content-Type: application/json' -d "$body" |
    python3 -u -c '
import json, sys
for line in sys.stdin:
    if not line.startswith("data: {"):
        continue
    event = json.loads(line[len("data: "):])
    if "error" in event:
        sys.exit("quickstart: HTTP stream failed: " + event["error"]["message"])
    if event["choices"]:
        print(event["choices"][0]["text"], end="", flush=True)
    if event.get("usage"):
        print("\n[%d prompt + %d completion tokens]" % (event["usage"]["prompt_tokens"],
                                                       event["usage"]["completion_tokens"]))
'
echo

if [[ $keep == 1 ]]; then
    trap - EXIT
    echo "quickstart: cluster left running (router client socket $client_url)."
    echo "  try:  $bin/kvf generate --router $client_url --prompt 'hello' --verbose"
    echo "        curl -N $http_url/v1/completions -H 'Content-Type: application/json' \\"
    echo "          -d '{\"prompt\": \"hello\", \"max_tokens\": 16, \"stream\": true}'"
    echo "  stop: kill \$(cat $run/pids)"
else
    echo "quickstart: stopping the cluster"
fi

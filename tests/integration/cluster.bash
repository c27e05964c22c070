# Shared by the integration scripts that run a cluster on 127.0.0.1 and
# talk to its router over HTTP (http.sh, real_tokenizers.sh): sourced, not
# run (ctest registers only *.sh). The sourcing script sets, before it
# calls these:
#
#   bin    the bin directory of a build (kvf, kvf-router, kvf-prefill, kvf-decode)
#   work   its temporary directory (logs land there; removed on exit)
#   key    the cluster's API key
#   model  the model directory the nodes serve
#
# and gets pids / routers (every process started, stopped by pid on exit),
# and from start_router: http (base URL), inbox and client (its ZeroMQ URLs).

pids=()
routers=()

# poll SECONDS CMD...: runs CMD every 0.1 s until it succeeds (status 0) or
# SECONDS have passed (status 1). The limits are generous: they cost nothing
# when things work and leave room for a slow machine or a sanitizer build.
poll() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@"; do
        ((SECONDS < deadline)) || return 1
        sleep 0.1
    done
}
gone() { ! kill -0 "$1" 2>/dev/null; }

# Stops every process; fails (status 1) when a router did not exit 0 within
# 30 s of SIGTERM (a crash, a sanitizer report, a hang in shutdown).
stop_all() {
    local pid rc bad=0
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do
        poll 30 gone "$pid" || true
        kill -KILL "$pid" 2>/dev/null || true
        rc=0
        wait "$pid" 2>/dev/null || rc=$?
        if [[ $rc != 0 && " ${routers[*]} " == *" $pid "* ]]; then
            echo "router (pid $pid) exited with status $rc" >&2
            bad=1
        fi
    done
    pids=()
    routers=()
    return $bad
}
# The EXIT trap: every process stopped, the logs' ends shown on failure,
# $work removed.
cleanup() {
    local rc=$?
    stop_all || true
    if [[ $rc != 0 ]]; then
        for log in "$work"/*.log; do
            [[ -f $log ]] && { echo "---- $log"; tail -n 30 "$log"; } >&2
        done
    fi
    rm -rf "$work"
}

fail() { echo "FAIL: $*" >&2; exit 1; }
pass() { echo "ok: $*"; }
free_port() { "$(dirname "${BASH_SOURCE[0]}")/../../deploy/free-port"; }
# json FILE EXPR: evaluates a Python expression over the parsed file (d).
json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }

# start_router NAME FLAGS...: sets http (base URL) and client, inbox URLs.
start_router() {
    local name=$1
    shift
    local port
    port=$(free_port)
    inbox=tcp://127.0.0.1:$(free_port)
    client=tcp://127.0.0.1:$(free_port)
    http=http://127.0.0.1:$port
    "$bin/kvf-router" --listen "$inbox" --client "$client" --http "127.0.0.1:$port" "$@" \
        > "$work/$name.log" 2>&1 &
    pids+=($!)
    routers+=($!)
    poll 60 curl -s -o /dev/null --max-time 2 "$http/v1/models" -H "Authorization: Bearer $key" ||
        fail "router $name does not answer HTTP"
}
start_node() { # ROLE NAME FLAGS...
    local role=$1 name=$2
    shift 2
    "$bin/kvf-$role" --router "$inbox" --listen "tcp://127.0.0.1:$(free_port)" --model "$model" \
        --node-id "$name" --threads 1 "$@" > "$work/$name.log" 2>&1 &
    pids+=($!)
}
healthy() { [[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$http/health") == 200 ]]; }
wait_healthy() {
    poll 120 healthy && return 0
    curl -s "$http/health" >&2 || true
    fail "the cluster never became healthy"
}
metric() { # NAME_AND_LABELS: its value on /metrics
    curl -s --max-time 10 "$http/metrics" | awk -v m="$1" '$1 == m { print $2; found = 1 } END { if (!found) print "missing" }'
}
# Concatenated text of an SSE stream (completions text or chat content),
# after checking the stream's shape: every event is data: JSON of one id,
# [DONE] last, exactly one finish_reason, in the final choice.
sse_text() { # FILE chat|text
    python3 - "$1" "$2" <<'PY'
import json, sys
raw = open(sys.argv[1], encoding="utf-8").read()
events = [e for e in raw.split("\n\n") if e.strip()]
assert events and events[-1] == "data: [DONE]", "stream does not end with [DONE]: %r" % raw[-200:]
chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
assert all(e.startswith("data: ") for e in events), raw
ids = {c["id"] for c in chunks}
assert len(ids) == 1, ids
text, finishes = "", []
for c in chunks:
    if not c["choices"]:
        continue  # the usage chunk
    ch = c["choices"][0]
    if sys.argv[2] == "chat":
        assert c["object"] == "chat.completion.chunk", c
        text += ch["delta"].get("content") or ""
    else:
        assert c["object"] == "text_completion", c
        text += ch["text"]
    if ch["finish_reason"] is not None:
        finishes.append(ch["finish_reason"])
assert len(finishes) == 1, finishes
print(text, end="")
PY
}

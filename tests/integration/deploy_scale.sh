#!/usr/bin/env bash
# deploy/kvf-cluster end to end on 127.0.0.1: `up` with 1 prefill + 1 decode
# node on a small random model, a Poisson load (kvf bench serve) running
# through the router, `scale decode 3` during it, then `scale decode 1`
# while it still runs, then `scale prefill 2` during a second load.
# Checks: both loads finish every request (none failed, router counts no
# failure), the nodes added by scale receive work (dispatched > 0 in
# `kvf stats --json`), the drained nodes exited and left the registry,
# every node ends with 0 KV blocks in use, status/logs work, and `down`
# exits 0 with every process gone.
#
# The offered load follows this machine, not a constant: right after `up`,
# a closed loop (kvf bench serve --concurrency) measures the 1 + 1 cluster's
# capacity for the loads' length distribution, and the loads offer half of
# it, which the cluster still serves after the scale-down back to 1 + 1.
# Each load runs until the test has seen what it waits for (its scale
# events, then load_after more arrivals) and is then stopped with SIGINT
# (bench serve sends no more, and its requests in flight must all finish);
# its request count only bounds it, at LOAD_MAX_S of arrivals. Every wait
# for arrivals is given time from the measured rate.
#
# Needs KVF_BIN_DIR (ctest sets it) and python3. Every process the launcher
# started is stopped on exit (kvf-cluster down, then by pid from its pid
# files if anything is left).
set -euo pipefail

bin=${KVF_BIN_DIR:?KVF_BIN_DIR must name the bin directory of a build}
root=$(cd "$(dirname "$0")/../.." && pwd)
cluster=$root/deploy/kvf-cluster
work=$(mktemp -d /tmp/kvf-test-deploy-scale.XXXXXX)
run=$work/run
load_pids=()
kc() { "$cluster" --bin-dir "$bin" --run-dir "$run" "$@"; }

cleanup() {
    local rc=$? pid f
    for pid in "${load_pids[@]}"; do kill -TERM "$pid" 2> /dev/null || true; done
    if [[ -f $run/cluster.env ]]; then
        kc down --timeout 20 > /dev/null 2>&1 || true
    fi
    # Anything still recorded (down failed): stop it by its pid file.
    for f in "$run"/*.pid; do
        [[ -f $f ]] || continue
        pid=$(cat "$f")
        if tr '\0' ' ' < "/proc/$pid/cmdline" 2> /dev/null | grep -q "^$bin/kvf-"; then
            kill -KILL "$pid" 2> /dev/null || true
        fi
    done
    if [[ $rc != 0 ]]; then
        for f in "$run"/*.log "$work"/*.log; do
            [[ -f $f ]] && { echo "---- $f"; tail -n 25 "$f"; } >&2
        done
    fi
    rm -rf "$work"
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
pass() { echo "ok: $*"; }
# stat EXPR: evaluates a Python expression over the router's stats (d), with
# node(ID) giving one node's entry (None when the router does not list it).
stat() {
    local json
    json=$("$bin/kvf" stats --router "$client" --json) || fail "kvf stats failed"
    python3 -c '
import json, sys
d = json.loads(sys.argv[1])
def node(i):
    return next((n for n in d["nodes"] if n["id"] == i), None)
print(eval(sys.argv[2]))' "$json" "$1"
}
# pid_runs PID: the process runs (not gone, not a zombie).
pid_runs() {
    local state
    state=$(sed 's/.*) \(.\).*/\1/' "/proc/$1/stat" 2> /dev/null) || return 1
    [[ -n $state && $state != [ZX] ]]
}
# wait_for SECONDS EXPR: until stat EXPR prints True.
wait_for() {
    local deadline=$((SECONDS + $1))
    until [[ $(stat "$2") == True ]]; do
        ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
}
# The requests of every load and of the calibration.
prompt_len=16:96
output_len=64:256
# The calibration: this many requests kept in flight (they fit one decode
# node's 16M pool), CAL_REQUESTS in all.
CAL_CONCURRENCY=4
CAL_REQUESTS=16
# The loads offer LOAD_FRACTION of the measured capacity, for at most
# LOAD_MAX_S (a bound; the test stops them much sooner), and run on for
# load_after arrivals past their last scale event: those of about 4 s,
# at least 5 and at most 20 (so that a slow machine's test stays short).
LOAD_FRACTION=0.5
LOAD_MAX_S=240
# calc EXPR: evaluates a Python expression (math imported).
calc() { python3 -c "import math; print($1)"; }
# arrivals_s N: how long to wait for N arrivals of the load: 30 s plus 5
# times their mean time, for a slow machine, a sanitizer build and
# Poisson gaps.
arrivals_s() { calc "int(30 + 5 * $1 / $rate)"; }
# start_load NAME: a Poisson load at $rate through the router, in the
# background; its results go to NAME.json.
start_load() {
    local n
    n=$(calc "math.ceil($rate * $LOAD_MAX_S)")
    "$bin/kvf" bench serve --router "$client" --model "$model" --rate "$rate" --requests "$n" \
        --prompt-len "$prompt_len" --output-len "$output_len" --seed "$RANDOM" \
        --timeout $((LOAD_MAX_S + 300)) --json "$work/$1.json" > "$work/$1.log" 2>&1 &
    load_pids+=($!)
}
# load_running: the last started load still sends requests.
load_running() { kill -0 "${load_pids[-1]}" 2> /dev/null; }
# finish_load NAME: stops the last started load (SIGINT: it sends no more
# and waits for its requests in flight); it must exit 0 with every request
# it sent finished. Sets load_sent to their number.
finish_load() {
    local pid=${load_pids[-1]} rc=0
    load_running || fail "load $1 ran out of requests before the test stopped it"
    kill -INT "$pid"
    wait "$pid" || rc=$?
    unset 'load_pids[-1]'
    [[ $rc == 0 ]] || fail "load $1 exited with $rc: $(tail -n 5 "$work/$1.log")"
    local res
    res=$(python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))["split"][0]
print(r["requests_sent"], r["requests_ok"], r["requests_failed"])' "$work/$1.json") ||
        fail "load $1 wrote no results: $(tail -n 5 "$work/$1.log")"
    read -r load_sent ok failed <<< "$res"
    ((failed == 0 && ok == load_sent)) || fail "load $1: $failed of $load_sent requests failed"
    pass "load $1: $load_sent requests sent at $rate req/s, all finished"
}

model=$work/model
"$bin/kvf" mkmodel "$model" --layers 4 --hidden 256 --heads 4 --kv-heads 2 --inter 688 \
    --vocab 512 --max-pos 1024 --seed 5 > "$work/mkmodel.log"

# 1. up: returns once both nodes are live; /health answers 200.
http_port=$("$(dirname "${BASH_SOURCE[0]}")/../../deploy/free-port")
kc up --model "$model" --prefill 1 --decode 1 --http "127.0.0.1:$http_port" \
    --prefill-args "--threads 1" --decode-args "--threads 1 --kv-mem 16M" > "$work/up.out"
client=$(awk '$1 == "client" {print $2}' "$work/up.out")
[[ -n $client ]] || fail "up printed no client URL"
[[ $(stat 'sorted((n["id"], n["state"]) for n in d["nodes"])') == \
    "[('decode-0', 'live'), ('prefill-0', 'live')]" ]] || fail "up: nodes are not live"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$http_port/health")
[[ $code == 200 ]] || fail "/health answered $code"
kc up --model "$model" --prefill 1 --decode 1 > /dev/null 2>&1 && fail "a second up succeeded"
pass "up: router, prefill-0 and decode-0 live, /health 200, a second up refused"

# 2. the capacity of 1 prefill + 1 decode node for these lengths, measured
# in a closed loop; the loads offer LOAD_FRACTION of it.
"$bin/kvf" bench serve --router "$client" --model "$model" --concurrency "$CAL_CONCURRENCY" \
    --requests "$CAL_REQUESTS" --prompt-len "$prompt_len" --output-len "$output_len" --seed 1 \
    --timeout 600 --json "$work/cal.json" > "$work/cal.log" 2>&1 || fail "calibration failed"
read -r capacity e2e99 < <(python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))["split"][0]
assert r["requests_ok"] == r["requests_sent"] and r["req_per_s"] > 0, r
print(r["req_per_s"], r["e2e_ms"][2])' "$work/cal.json") || fail "calibration: $(cat "$work/cal.json")"
rate=$(calc "'%.4g' % ($LOAD_FRACTION * $capacity)")
load_after=$(calc "min(20, max(5, math.ceil(4 * $rate)))")
pass "calibration: $capacity req/s with $CAL_CONCURRENCY in flight (e2e p99 $e2e99 ms);" \
    "the loads offer $rate req/s"

# 3. scale decode 3 while the load runs: the new nodes take work.
base=$(stat 'd["requests"]["total"]')
start_load a
wait_for "$(arrivals_s 3)" "d[\"requests\"][\"total\"] >= $base + 3" ||
    fail "load a does not reach the router"
kc scale decode 3
wait_for "$(arrivals_s 10)" \
    'all((node(i) or {}).get("dispatched", 0) > 0 for i in ("decode-1", "decode-2"))' ||
    fail "decode-1 and decode-2 received no work: $(stat 'd["nodes"]')"
pass "scale decode 3 under load: decode-1 and decode-2 dispatched" \
    "$(stat 'node("decode-1")["dispatched"], node("decode-2")["dispatched"]')"

# 4. scale decode 1 while the load still runs: the newest two drain and exit;
# decode-0 serves the load on.
load_running || fail "load a ran out of requests before the scale-down"
running=$(stat 'sum(n["running"] for n in d["nodes"] if n["role"] == "decode")')
pids="$(cat "$run/decode-1.pid") $(cat "$run/decode-2.pid")"
kc scale decode 1
for pid in $pids; do
    if pid_runs "$pid"; then fail "drained decode node (pid $pid) still runs"; fi
done
wait_for 30 '(node("decode-1") is None and node("decode-2") is None and
    node("decode-0")["state"] == "live")' || fail "registry after scale-down: $(stat 'd["nodes"]')"
[[ -f $run/decode-1.pid || -f $run/decode-2.pid ]] && fail "pid files of drained nodes remain"
grep -q 'draining' "$run/decode-1.log" || fail "decode-1 did not log its drain"
held=$(awk '/draining: [0-9]+ requests held/ { for (i = 1; i < NF; i++)
    if ($i == "draining:") n += $(i + 1) } END { print n + 0 }' "$run"/decode-[12].log)
pass "scale decode 1 under load ($running sequences decoding, $held held by the drained nodes):" \
    "decode-2, decode-1 drained, exited, deregistered"
mark=$(stat 'd["requests"]["total"]')
wait_for "$(arrivals_s "$load_after")" "d[\"requests\"][\"total\"] >= $mark + $load_after" ||
    fail "load a does not go on after the scale-down: $(stat 'd["requests"]')"
finish_load a
total=$((base + load_sent))

# 5. scale prefill 2 during a second load: prefill-1 takes work.
start_load b
wait_for "$(arrivals_s 3)" "d[\"requests\"][\"total\"] >= $total + 3" ||
    fail "load b does not reach the router"
kc scale prefill 2
wait_for "$(arrivals_s 10)" '(node("prefill-1") or {}).get("dispatched", 0) > 0' ||
    fail "prefill-1 received no work: $(stat 'd["nodes"]')"
pass "scale prefill 2 under load: prefill-1 dispatched $(stat 'node("prefill-1")["dispatched"]')"
mark=$(stat 'd["requests"]["total"]')
wait_for "$(arrivals_s "$load_after")" "d[\"requests\"][\"total\"] >= $mark + $load_after" ||
    fail "load b does not go on after the scale-up: $(stat 'd["requests"]')"
finish_load b
total=$((total + load_sent))

# 6. the end state: no failure, every block back, status and logs.
[[ $(stat 'd["requests"]["failed"]') == 0 ]] || fail "the router failed requests"
[[ $(stat 'd["requests"]["total"]') == "$total" ]] ||
    fail "router total $(stat 'd["requests"]'), $total sent"
wait_for 30 'all(n["blocks_used"] == 0 and n["running"] == 0 for n in d["nodes"])' ||
    fail "KV blocks still in use: $(stat 'd["nodes"]')"
[[ $(stat 'sorted(n["id"] for n in d["nodes"])') == \
    "['decode-0', 'prefill-0', 'prefill-1']" ]] || fail "final nodes: $(stat 'd["nodes"]')"
pass "$total requests, 0 failed, $(stat 'd["requests"]["redispatched"]') re-dispatched;" \
    "every node holds 0 KV blocks"
kc status | tee "$work/status.out"
grep -q '^prefill-1 .* live ' "$work/status.out" || fail "status table lacks prefill-1"
kc status --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["router"]["pid"] and len(d["nodes"]) == 3, d
assert all(n["pid"] and n["blocks_used"] == 0 for n in d["nodes"]), d' || fail "status --json"
kc logs decode/1 -n 5 | grep -q 'stopping' || fail "logs decode/1"
kc logs router -n 5 > /dev/null || fail "logs router"
pass "status, status --json, logs"

# 7. down: every node drains and exits, then the router; exit 0.
mapfile -t pids < <(cat "$run"/*.pid)
kc down || fail "down exited $?"
for pid in "${pids[@]}"; do
    if pid_runs "$pid"; then fail "pid $pid still runs after down"; fi
done
for n in decode-0 prefill-0 prefill-1; do
    grep -q 'stopping' "$run/$n.log" || grep -q 'drain' "$run/$n.log" ||
        fail "$n did not drain: $(tail -n 5 "$run/$n.log")"
done
[[ -f $run/cluster.env ]] && fail "down left the cluster state"
pass "down: ${#pids[@]} processes drained and exited"
echo "deploy_scale: all checks passed"

#!/usr/bin/env bash
# A cluster without a cluster key (issue 20, README.md "Identity without a
# key"):
#
#   1. --require-key (or KVF_REQUIRE_KEY=1): the router, a prefill node and
#      a decode node refuse to start without a key, saying what to do; with
#      one they start;
#   2. a router without a key whose node inbox and client socket are open
#      to other hosts (tcp://0.0.0.0) says at start-up what that lets any
#      process there do, and /metrics says kvf_control_authenticated 0; on
#      loopback it does not warn about them.
#
# Each step waits for a log line or an exit, never for a fixed time.
# Needs KVF_BIN_DIR (ctest sets it), curl and python3.
set -euo pipefail

bin=${KVF_BIN_DIR:?KVF_BIN_DIR must name the bin directory of a build}
work=$(mktemp -d /tmp/kvf-test-require-key.XXXXXX)
export UCX_NET_DEVICES=lo
export KVF_LOG=${KVF_LOG:-info}
key=unused
model=$(cd "$(dirname "${BASH_SOURCE[0]}")/../data/golden/tiny-llama-f32" && pwd)

source "$(dirname "${BASH_SOURCE[0]}")/cluster.bash"
trap cleanup EXIT

# refused NAME CMD...: CMD exits 1 within 60 s, its log naming --require-key.
refused() {
    local name=$1 rc=0
    shift
    timeout 60 "$@" > "$work/$name.log" 2>&1 || rc=$?
    [[ $rc == 1 ]] || fail "$name: exit status $rc, expected 1: $(tail -3 "$work/$name.log")"
    grep -q -- '--require-key: no cluster key; give --cluster-key-file' "$work/$name.log" ||
        fail "$name: no reason given: $(tail -3 "$work/$name.log")"
}
logged() { grep -qs -- "$2" "$work/$1.log"; }

# ---- 1. --require-key --------------------------------------------------------------------
unset KVF_CLUSTER_KEY_FILE
p=$(free_port)
refused router-nokey "$bin/kvf-router" --model "$model" --require-key --http off \
    --listen "tcp://127.0.0.1:$p" --client "tcp://127.0.0.1:$(free_port)"
KVF_REQUIRE_KEY=1 refused prefill-nokey "$bin/kvf-prefill" --model "$model" \
    --router "tcp://127.0.0.1:$p" --listen "tcp://127.0.0.1:$(free_port)"
refused decode-nokey "$bin/kvf-decode" --model "$model" --require-key \
    --router "tcp://127.0.0.1:$p" --listen "tcp://127.0.0.1:$(free_port)"
pass "--require-key (flag or KVF_REQUIRE_KEY=1): router, prefill and decode refuse to start without a key"

"$bin/kvf" keygen "$work/cluster.key" > /dev/null 2>&1
start_router router-key --model "$model" --require-key --cluster-key-file "$work/cluster.key"
poll 60 logged router-key "control plane authenticated with the cluster key" ||
    fail "the router with a key did not start: $(tail -3 "$work/router-key.log")"
poll 60 logged router-key "serving: nodes at" ||
    fail "the router with a key did not serve: $(tail -3 "$work/router-key.log")"
stop_all || fail "the router with a key did not stop cleanly"
pass "--require-key with a key: the router starts"

# ---- 2. the start-up warning ----------------------------------------------------------------
port=$(free_port)
"$bin/kvf-router" --model "$model" --listen "tcp://0.0.0.0:$(free_port)" \
    --client "tcp://0.0.0.0:$(free_port)" --http "127.0.0.1:$port" > "$work/router-open.log" 2>&1 &
pids+=($!)
routers+=($!)
poll 60 logged router-open "serving: nodes at" ||
    fail "the open router did not start: $(tail -3 "$work/router-open.log")"
logged router-open "no cluster key, and the node inbox tcp://0.0.0.0:.* is open to other hosts: any process that reaches it can register a node under a new id and, as a prefill node, receive prompts" ||
    fail "no warning about the open node inbox: $(cat "$work/router-open.log")"
logged router-open "no cluster key, and the client socket tcp://0.0.0.0:.* is open to other hosts" ||
    fail "no warning about the open client socket: $(cat "$work/router-open.log")"
curl -s --max-time 10 "http://127.0.0.1:$port/metrics" > "$work/metrics.txt"
grep -q '^kvf_control_authenticated 0$' "$work/metrics.txt" ||
    fail "/metrics: $(grep kvf_control_authenticated "$work/metrics.txt")"
pass "without a key on 0.0.0.0: the router says what is open, /metrics kvf_control_authenticated 0"

start_router router-local --model "$model"
poll 60 logged router-local "serving: nodes at" ||
    fail "the local router did not start: $(tail -3 "$work/router-local.log")"
logged router-local "control plane not authenticated: no --cluster-key-file" ||
    fail "the local router did not say it is unauthenticated"
! logged router-local "is open to other hosts" || fail "a loopback router warned about open sockets"
pass "without a key on loopback: only the one-line notice"
stop_all || fail "a router did not stop cleanly"

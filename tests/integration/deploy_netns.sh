#!/usr/bin/env bash
# A kvferry cluster across hosts, on one machine: network namespaces made
# here stand for the hosts, each with its own address on a private
# 10.77.0.0/24 that exists only inside them.
#
#   kvfn<id>-sw       the switch: a bridge and one veth end per host
#   kvfn<id>-router   10.77.0.1  kvf-router
#   kvfn<id>-prefill  10.77.0.2  kvf-prefill
#   kvfn<id>-decode   10.77.0.3  kvf-decode
#   kvfn<id>-client   10.77.0.4  kvf generate --router, kvf stats
#
# Control messages are nanomsg over tcp to the router's address; the K/V goes
# from the prefill host to the decode host over UCX's TCP transport
# (UCX_TLS=tcp,self, UCX_NET_DEVICES = the host's veth). Checks: both nodes
# register from their own addresses; greedy requests through the cluster
# return the same ids as the colocated `kvf generate` in this process's
# namespace; the KV bytes the client is told were shipped match what the
# model's geometry says the prompt needs, a TCP connection other than the
# nanomsg inboxes joins the two hosts (ss); the decode node counted the
# requests it admitted and finished; every KV block comes back.
#
# Needs root and iproute2 (`ip netns`); otherwise it prints "skipped: ..."
# and exits 0. Every process and namespace made here is removed on exit.
set -euo pipefail

bin=${KVF_BIN_DIR:?KVF_BIN_DIR must name the bin directory of a build}

skip() { echo "skipped: $*"; exit 0; }
[[ $(id -u) == 0 ]] || skip "network namespaces need root"
command -v ip > /dev/null || skip "no ip command (iproute2)"

id=$$
sw=kvfn$id-sw
hosts=(router prefill decode client)
declare -A addr=([router]=10.77.0.1 [prefill]=10.77.0.2 [decode]=10.77.0.3 [client]=10.77.0.4)
made=()
pids=()
work=$(mktemp -d /tmp/kvf-test-deploy-netns.XXXXXX)

# poll SECONDS CMD...: runs CMD every 0.2 s until it succeeds (status 0) or
# SECONDS have passed (status 1). The limits are generous: they cost nothing
# when things work and leave room for a slow machine or a sanitizer build.
poll() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@"; do
        ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
}
gone() { ! kill -0 "$1" 2> /dev/null; }

cleanup() {
    local rc=$? pid ns
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2> /dev/null || true; done
    for pid in "${pids[@]}"; do
        poll 30 gone "$pid" || true
        kill -KILL "$pid" 2> /dev/null || true
        wait "$pid" 2> /dev/null || true
    done
    for ns in "${made[@]}"; do ip netns del "$ns" 2> /dev/null || true; done
    if [[ $rc != 0 ]]; then
        for f in "$work"/*.log; do
            [[ -f $f ]] && { echo "---- $f"; tail -n 30 "$f"; } >&2
        done
    fi
    rm -rf "$work"
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
pass() { echo "ok: $*"; }
in_ns() { local ns=$1; shift; ip netns exec "kvfn$id-$ns" "$@"; }

# The hosts and the switch. Every link is made inside a namespace made here,
# so nothing appears in (or can reach) this machine's own network.
if ! ip netns add "$sw" 2> /dev/null; then
    skip "cannot create a network namespace (ip netns add failed)"
fi
made+=("$sw")
if ! ip -n "$sw" link add br0 type bridge 2> /dev/null; then
    skip "cannot create a bridge inside a network namespace"
fi
ip -n "$sw" link set br0 up
ip -n "$sw" link set lo up
for h in "${hosts[@]}"; do
    ns=kvfn$id-$h
    ip netns add "$ns"
    made+=("$ns")
    ip -n "$ns" link set lo up
    # veth pair made in the switch; one end moves into the host as eth0.
    ip -n "$sw" link add "p-$h" type veth peer name "h-$h" ||
        skip "cannot create veth pairs inside a network namespace"
    ip -n "$sw" link set "h-$h" netns "$ns"
    ip -n "$ns" link set "h-$h" name eth0
    ip -n "$ns" addr add "${addr[$h]}/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$sw" link set "p-$h" master br0
    ip -n "$sw" link set "p-$h" up
done
pass "5 namespaces: switch + router ${addr[router]}, prefill ${addr[prefill]}," \
    "decode ${addr[decode]}, client ${addr[client]}"

model=$work/model
"$bin/kvf" mkmodel "$model" --layers 2 --hidden 64 --heads 4 --kv-heads 2 --inter 128 \
    --vocab 512 --max-pos 512 --seed 23 > "$work/mkmodel.log"

export KVF_LOG=info
export UCX_TLS=tcp,self
export UCX_NET_DEVICES=eth0
router_url=tcp://${addr[router]}:5555
client_url=tcp://${addr[router]}:5556
# start NS LOG ARGV...: a process on a host, output in LOG (ip netns exec
# execs the command, so $! is the process itself).
start() {
    local ns=$1 log=$2
    shift 2
    ip netns exec "kvfn$id-$ns" "$@" < /dev/null > "$work/$log" 2>&1 &
    pids+=($!)
}
start router router.log "$bin/kvf-router" --listen "$router_url" --client "$client_url" \
    --model "$model" --http "${addr[router]}:8000"
start decode decode.log "$bin/kvf-decode" --router "$router_url" \
    --listen "tcp://${addr[decode]}:6000" --model "$model" --node-id decode-h3 --threads 1 \
    --kv-mem 8M
start prefill prefill.log "$bin/kvf-prefill" --router "$router_url" \
    --listen "tcp://${addr[prefill]}:6000" --model "$model" --node-id prefill-h2 --threads 1

stats() { in_ns client "$bin/kvf" stats --router "$client_url" --json --timeout-ms 2000; }
registered() {
    stats 2> /dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)
want = {("prefill-h2", "tcp://10.77.0.2:6000"), ("decode-h3", "tcp://10.77.0.3:6000")}
sys.exit(0 if want <= {(n["id"], n["inbox"]) for n in d["nodes"] if n["state"] == "live"} else 1)'
}
poll 120 registered || fail "the nodes did not register from their hosts: $(stats 2>&1 || true)"
code=$(in_ns client curl -s -o /dev/null -w '%{http_code}' --max-time 5 \
    "http://${addr[router]}:8000/health" || true)
[[ $code == 200 ]] || fail "/health from the client host answered $code"
pass "prefill-h2 (tcp://10.77.0.2:6000) and decode-h3 (tcp://10.77.0.3:6000) registered" \
    "with the router at 10.77.0.1; /health 200 from the client host"

# Bytes of K/V per token: 2 (K and V) x layers x kv heads x head dim x 4 (f32).
per_token=$((2 * 2 * 2 * 16 * 4))
n=0
for prompt in 510,17,42,99,7 510,300,301,302,303,304,305,306,307,308,309,310,311,312,313,314,315,316,317,318,319,320,321,322,323,324,325,326,327,328,329,330,331,332,333,334,335,336,337,338,339,340 510,1; do
    n=$((n + 1))
    want=$("$bin/kvf" generate --model "$model" --prompt-ids "$prompt" --max-tokens 24 \
        --ignore-eos --ids --threads 1)
    got=$(in_ns client "$bin/kvf" generate --router "$client_url" --prompt-ids "$prompt" \
        --max-tokens 24 --ignore-eos --ids --verbose 2> "$work/generate-$n.log") ||
        fail "request $n through the cluster failed: $(cat "$work/generate-$n.log")"
    [[ $got == "$want" ]] || fail "request $n: cluster '$got' != colocated '$want'"
    kv=$(sed -n 's/.*kv shipped \([0-9]*\) bytes.*/\1/p' "$work/generate-$n.log")
    tokens=$(tr ',' '\n' <<< "$prompt" | wc -l)
    # Whole 16-token blocks are shipped: every (block, layer) slice once.
    want_kv=$(((tokens + 15) / 16 * 16 * per_token))
    [[ $kv == "$want_kv" ]] ||
        fail "request $n: kv shipped '$kv' bytes, want $want_kv ($tokens tokens)"
    pass "request $n: $tokens prompt tokens, 24 ids equal to the colocated run," \
        "$kv bytes of K/V shipped 10.77.0.2 -> 10.77.0.3"
done

# The K/V went over a TCP connection between the two hosts that is not a
# nanomsg inbox (those listen on port 6000): UCX's own.
ucx_conns=$(in_ns decode ss -tnH state established |
    awk '$3 ~ /^10\.77\.0\.3:/ && $4 ~ /^10\.77\.0\.2:/ && $3 !~ /:6000$/ && $4 !~ /:6000$/' |
    wc -l)
[[ $ucx_conns -ge 1 ]] ||
    fail "no UCX TCP connection between the hosts: $(in_ns decode ss -tn state established)"
pass "$ucx_conns UCX TCP connection(s) between 10.77.0.2 and 10.77.0.3"

json=$(stats)
python3 -c '
import json, sys
d = json.loads(sys.argv[1])
node = {n["id"]: n for n in d["nodes"]}
assert d["requests"]["failed"] == 0, d["requests"]
assert node["prefill-h2"]["dispatched"] == 3 and node["decode-h3"]["dispatched"] == 3, node
' "$json" || fail "stats after the requests: $json"
all_freed() {
    stats | python3 -c 'import json, sys
sys.exit(0 if all(n["blocks_used"] == 0 for n in json.load(sys.stdin)["nodes"]) else 1)'
}
poll 60 all_freed || fail "KV blocks still in use: $(stats)"
pass "3 requests, 0 failed, each dispatched to prefill-h2 and decode-h3; 0 KV blocks in use"

# Graceful exit of the nodes and the router; the decode node's own
# accounting says it admitted and finished the 3 requests.
for i in 2 1 0; do kill -TERM "${pids[$i]}"; done
for i in 2 1 0; do
    rc=0
    wait "${pids[$i]}" || rc=$?
    [[ $rc == 0 ]] || fail "process ${pids[$i]} exited with $rc after SIGTERM"
done
pids=()
grep -q 'admitted 3 .*finished 3 ' "$work/decode.log" ||
    fail "decode-h3 stats: $(grep 'stats:' "$work/decode.log" || true)"
pass "nodes and router exited 0 after SIGTERM; decode-h3 admitted and finished 3"
echo "deploy_netns: all checks passed"

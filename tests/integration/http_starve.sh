#!/usr/bin/env bash
# The router's HTTP server against idle connections (issue 20 item 4):
#
#   1. N connections that send nothing or half a request line, held from
#      127.0.0.2.. (each address up to the per-IP limit; N = 1000, fewer
#      with a message when the open-file limit is lower): /health answers,
#      a streamed completion equals the colocated `kvf generate`, and
#      every held connection is still open afterwards (none was dropped
#      to make room);
#   2. the per-IP limit: one address more than it is refused at once;
#   3. a malformed request line gets 400 at once, an OpenAI error object (bounded
#      at 5 s; it used to be held for 120 s);
#   4. short timeouts (a second router, --http-header-timeout 1
#      --http-idle-timeout 1): a connection that sends nothing, or half a
#      request line, is closed (bounded at 10 s), while a streamed request
#      parked in the queue for longer than both timeouts is served whole.
#
# Needs KVF_BIN_DIR (ctest sets it), curl and python3.
set -euo pipefail

bin=${KVF_BIN_DIR:?KVF_BIN_DIR must name the bin directory of a build}
work=$(mktemp -d /tmp/kvf-test-starve.XXXXXX)
export UCX_NET_DEVICES=lo
export KVF_LOG=${KVF_LOG:-info}
key=test-key-$$
model=$(cd "$(dirname "${BASH_SOURCE[0]}")/../data/golden/tiny-llama-f32" && pwd)

source "$(dirname "${BASH_SOURCE[0]}")/cluster.bash"
trap cleanup EXIT

per_ip=64
# Each held connection is a socket here and one in the router: N + the
# harness's own must fit below this shell's limit (the router raises its own).
nofile=$(ulimit -Hn)
ulimit -n "$nofile"
want=${KVF_STARVE_CONNECTIONS:-1000}
n=$(( nofile - 200 < want ? nofile - 200 : want ))
((n >= 2 * per_ip)) || { echo "skipped: the open-file limit ($nofile) is too low"; exit 0; }
((n == want)) || echo "note: holding $n connections, not $want (the open-file limit is $nofile)"

ref=$("$bin/kvf" generate --model "$model" --prompt "hello world" --max-tokens 12 --ignore-eos \
    --threads 1 | python3 -c 'import sys; t=sys.stdin.read(); print(t[:-1] if t.endswith("\n") else t, end="")')

# ---- 1-3. idle connections held ------------------------------------------------------
start_router router0 --model "$model" --api-key "$key" --http-max-connections-per-ip "$per_ip" \
    --http-header-timeout 600
start_node decode "decode-0" --kv-mem 32M --prefill-local
wait_healthy
port=${http##*:}

python3 - "$port" "$n" "$per_ip" "$key" "$ref" "${routers[0]}" <<'PY'
import json, socket, sys, time
port, n, per_ip, key, ref = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
router_pid = sys.argv[6]

def connect(src):
    s = socket.socket()
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    return s

def closed_now(s, wait):
    """True when the server closed s within wait seconds."""
    s.settimeout(wait)
    try:
        return s.recv(4096) == b""
    except (socket.timeout, BlockingIOError):
        return False
    except ConnectionError:
        return True

def request(raw, src="127.0.0.1", wait=30):
    s = connect(src)
    s.settimeout(wait)
    t = time.monotonic()
    s.sendall(raw)
    out = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        out += d
    s.close()
    return out, time.monotonic() - t

held = []
for i in range(n):
    s = connect("127.0.0.%d" % (2 + i // per_ip))
    if i % 2:
        s.sendall(b"GET /health HT")  # half a request line, never finished
    held.append(s)
# Every one is accepted and kept: the server has a thread for none of them.
for s in held[::max(1, n // 50)]:
    assert not closed_now(s, 0.05), "a held connection was closed"
print("ok: %d idle connections held" % n)
status = dict(l.split(":", 1) for l in open("/proc/%s/status" % router_pid) if ":" in l)
print("router while they are held: %s threads, VmRSS %s" % (status["Threads"].strip(),
                                                             status["VmRSS"].strip()))

out, took = request(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
assert out.startswith(b"HTTP/1.1 200"), out[:200]
assert took <= 5, took
print("ok: /health answers while they are held (%.3f s)" % took)
out, took = request(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
assert out.startswith(b"HTTP/1.1 200") and b"kvf_http_responses_total" in out, out[:200]
print("ok: /metrics answers while they are held (%.3f s)" % took)

body = json.dumps({"prompt": "hello world", "max_tokens": 12, "stream": True,
                   "ignore_eos": True, "temperature": 0}).encode()
raw = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
       b"Authorization: Bearer " + key.encode() + b"\r\nContent-Type: application/json\r\n"
       b"Content-Length: %d\r\n\r\n" % len(body)) + body
out, took = request(raw, wait=120)
head, _, rest = out.partition(b"\r\n\r\n")
assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head, out[:300]
# Chunked transfer: take the chunks apart.
data = b""
while rest:
    size, _, rest = rest.partition(b"\r\n")
    k = int(size, 16)
    if k == 0:
        break
    data, rest = data + rest[:k], rest[k + 2:]
events = [e for e in data.decode().split("\n\n") if e.strip()]
assert events[-1] == "data: [DONE]", events[-3:]
text = "".join(c["choices"][0]["text"] for c in (json.loads(e[6:]) for e in events[:-1]) if c["choices"])
assert text == ref, (text, ref)
print("ok: a streamed completion while they are held equals kvf generate (%.3f s)" % took)

# 2. The per-IP limit: the address that holds per_ip gets no more.
extra = connect("127.0.0.2")
assert closed_now(extra, 10), "a connection over the per-IP limit was kept"
extra.close()
print("ok: connection %d from one address is refused" % (per_ip + 1))

# 3. A malformed request line: 400 at once.
out, took = request(b"GET /health HTTP/1.1 extra\r\nHost: x\r\n\r\n", wait=10)
assert out.startswith(b"HTTP/1.1 400"), out[:200]
assert took < 5, took
err = json.loads(out.partition(b"\r\n\r\n")[2])["error"]
assert err["type"] == "invalid_request_error" and err["code"] == "bad_request", err
print("ok: a malformed request line gets 400 (an OpenAI error object) in %.3f s" % took)

for s in held:
    assert not closed_now(s, 0), "a held connection was dropped"
print("ok: every held connection is still open")
for s in held:
    s.close()
PY
stop_all || fail "a router did not stop cleanly"

# ---- 4. short timeouts ---------------------------------------------------------------------
start_router router1 --model "$model" --api-key "$key" --http-header-timeout 1 \
    --http-idle-timeout 1 --max-queue 4 --queue-timeout-ms 120000
port=${http##*:}
curl -s -N --max-time 120 -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
    -d '{"prompt": "hello world", "max_tokens": 12, "stream": true, "ignore_eos": true, "temperature": 0}' \
    "$http/v1/completions" > "$work/parked.txt" &
curl_pid=$!
python3 - "$port" <<'PY'
import socket, sys, time
port = int(sys.argv[1])
for what, send in (("sends nothing", b""), ("sends half a request line", b"GET /heal")):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(send)
    s.settimeout(10)
    t = time.monotonic()
    try:
        r = s.recv(100)
    except ConnectionError:
        r = b""
    assert r == b"", r
    print("ok: a connection that %s is closed after %.1f s (headers timeout 1 s)"
          % (what, time.monotonic() - t))
# The streamed request waits in the queue (no node yet) longer than both
# timeouts: this bounds the wait from below, it synchronises nothing.
time.sleep(3)
PY
start_node decode "decode-1" --kv-mem 32M --prefill-local
wait "$curl_pid" || fail "the parked stream failed: $(cat "$work/parked.txt")"
[[ $(sse_text "$work/parked.txt" text) == "$ref" ]] ||
    fail "the stream parked past the timeouts differs: $(cat "$work/parked.txt")"
pass "a stream parked in the queue past both timeouts is served whole, = kvf generate"
stop_all || fail "a router did not stop cleanly"

#!/usr/bin/env bash
# The deployment files against the binaries they run:
#
#   1. every YAML file under deploy/k8s parses (python3-yaml, installed by
#      deploy/install-deps.sh), and the cluster objects are there: router
#      Deployment + Services, prefill and decode Deployments with GPU
#      requests and probes, one HPA per pool on metrics the adapter defines;
#   2. every flag passed to a kvferry binary exists in its --help: container
#      commands and args, KVF_<NAME> variables of the ConfigMaps and env
#      (as --name of every binary that reads them), probe commands, the
#      systemd units' ExecStart (expanded as systemd does, with
#      kvferry.env) and the *_ARGS of kvferry.env, the Slurm script's srun
#      steps (kvf.sbatch --dry-run), kvf-cluster's own commands; each
#      command line is also run with --help appended, which the binaries
#      parse after every flag before it (an unknown flag fails);
#   3. every metric the HPAs' adapter rules read is one the router serves
#      (# TYPE lines of a live router's /metrics);
#   4. the Kubernetes pods, emulated on 127.0.0.1: router, prefill and decode
#      started from their Deployments' command, args and ConfigMap
#      environment (Service names and pod IPs mapped to 127.0.0.1, ports to
#      free ones, a small model and KV pool); the router's readiness probe
#      (/health) and the nodes' readiness probes (exec) pass, the liveness
#      TCP probes connect, and a request completes.
#
# Needs KVF_BIN_DIR (ctest sets it), python3 with yaml, curl. Every process
# started here is stopped by pid on exit.
set -euo pipefail

bin=${KVF_BIN_DIR:?KVF_BIN_DIR must name the bin directory of a build}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/kvf-test-deploy-manifests.XXXXXX)
py=python3
# The Debian python3 is the one python3-yaml installs into.
if ! python3 -c 'import yaml' 2> /dev/null && [[ -x /usr/bin/python3 ]]; then py=/usr/bin/python3; fi
"$py" -c 'import yaml' 2> /dev/null ||
    { echo "FAIL: python3 cannot import yaml: run deploy/install-deps.sh (python3-yaml)" >&2; exit 1; }

cleanup() {
    local rc=$? pid
    if [[ -f $work/pids ]]; then
        while read -r pid; do kill -TERM "$pid" 2> /dev/null || true; done < "$work/pids"
        # Up to 30 s for each to exit, then SIGKILL.
        local deadline=$((SECONDS + 30))
        while read -r pid; do
            while kill -0 "$pid" 2> /dev/null && ((SECONDS < deadline)); do sleep 0.1; done
            kill -KILL "$pid" 2> /dev/null || true
        done < "$work/pids"
    fi
    if [[ $rc != 0 ]]; then
        for f in "$work"/*.log; do
            [[ -f $f ]] && { echo "---- $f"; tail -n 20 "$f"; } >&2
        done
    fi
    rm -rf "$work"
}
trap cleanup EXIT

"$bin/kvf" mkmodel "$work/model" --layers 2 --hidden 64 --heads 4 --kv-heads 2 --inter 128 \
    --vocab 512 --max-pos 512 --seed 3 > "$work/mkmodel.log"

export UCX_NET_DEVICES=lo KVF_LOG=info
"$py" - "$root" "$bin" "$work" <<'EOF'
import glob, os, re, shlex, signal, socket, subprocess, sys, time, urllib.request
import yaml

root, bindir, work = sys.argv[1:]
model = os.path.join(work, "model")
BINARIES = ("kvf-router", "kvf-prefill", "kvf-decode")
KVF_COMMANDS = ("generate", "logits", "tokenize", "mkmodel", "kvcalc", "bench", "stats")
failures = []
checked = {"flags": 0, "commands": 0}


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg, file=sys.stderr)


def ok(msg):
    print("ok:", msg)


# ---- the binaries' flags ------------------------------------------------------

help_cache = {}


def flags_of(prog):
    """Flags in `prog --help` (prog: 'kvf-decode' or 'kvf stats')."""
    if prog not in help_cache:
        argv = prog.split()
        out = subprocess.run([os.path.join(bindir, argv[0])] + argv[1:] + ["--help"],
                             capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise SystemExit("%s --help failed: %s" % (prog, out.stderr))
        help_cache[prog] = set(re.findall(r"^\s+--([a-z0-9][a-z0-9-]*)", out.stdout, re.M))
    return help_cache[prog]


def check_flags(where, prog, args):
    """Every --flag among args exists in prog's --help."""
    known = flags_of(prog)
    for a in args:
        if a.startswith("--"):
            name = a[2:].split("=", 1)[0]
            checked["flags"] += 1
            if name not in known:
                fail("%s: %s has no flag --%s" % (where, prog, name))


def check_env(where, binaries, names):
    """KVF_<NAME> variables are --name flags of every binary that reads them."""
    for n in names:
        if not n.startswith("KVF_") or n == "KVF_LOG":
            continue
        flag = n[4:].lower().replace("_", "-")
        for b in binaries:
            checked["flags"] += 1
            if flag not in flags_of(b):
                fail("%s: %s would set --%s, which %s does not have" % (where, n, flag, b))


def prog_of(argv, i=0):
    """The kvferry program an argv runs from position i: 'kvf-decode', 'kvf stats', or None."""
    base = os.path.basename(argv[i])
    if base in BINARIES:
        return base
    if base == "kvf" and len(argv) > i + 1 and argv[i + 1] in KVF_COMMANDS:
        return "kvf " + argv[i + 1]
    return None


def run_help(where, argv, env=None):
    """Runs a command line with --help appended: flags are parsed in order,
    so an unknown flag or a malformed value fails before --help."""
    prog = prog_of(argv)
    exe = os.path.join(bindir, os.path.basename(argv[0]))
    full = [exe] + argv[1:] + ["--help"]
    out = subprocess.run(full, capture_output=True, text=True, timeout=30,
                         env=dict(os.environ, **(env or {})))
    checked["commands"] += 1
    if out.returncode != 0:
        fail("%s: `%s` does not parse: %s" % (where, " ".join(argv), out.stderr.strip()))
    check_flags(where, prog, argv[2 if prog.startswith("kvf ") else 1:])


def shell_invocations(script):
    """kvferry commands inside a shell script string: argv lists, each ending
    at a control operator; `sh -c` scripts are searched too."""
    # Comment lines go; a new line ends a command as ';' does (continuations
    # are joined first).
    script = "\n".join(l for l in script.split("\n") if not l.lstrip().startswith("#"))
    script = script.replace("\\\n", " ").replace("\n", " ; ")
    lex = shlex.shlex(script, posix=True, punctuation_chars=";&|")
    lex.commenters = ""
    lex.whitespace_split = True
    words = list(lex)
    found, i = [], 0
    while i < len(words):
        w = words[i]
        if os.path.basename(w) in ("sh", "bash") and i + 2 < len(words) and words[i + 1] == "-c":
            found += shell_invocations(words[i + 2])
            i += 3
            continue
        if prog_of(words, i):
            j = i
            while j < len(words) and words[j] not in (";", "&", "&&", "|", "||"):
                j += 1
            found.append(words[i:j])
            i = j
            continue
        i += 1
    return found


# ---- 1. Kubernetes manifests ----------------------------------------------------

k8s = os.path.join(root, "deploy", "k8s")
docs = {}
files = sorted(glob.glob(os.path.join(k8s, "**", "*.yaml"), recursive=True) +
               glob.glob(os.path.join(k8s, "**", "*.yml"), recursive=True))
for f in files:
    try:
        with open(f) as fh:
            loaded = [d for d in yaml.safe_load_all(fh) if d is not None]
    except yaml.YAMLError as e:
        fail("%s does not parse: %s" % (f, e))
        continue
    for d in loaded:
        if "kind" in d:
            if "apiVersion" not in d:
                fail("%s: %s without apiVersion" % (f, d["kind"]))
            docs[(d["kind"], d.get("metadata", {}).get("name"))] = (f, d)
ok("%d YAML files under deploy/k8s parse (%d objects)" % (len(files), len(docs)))
if len(files) < 5:
    fail("too few YAML files under deploy/k8s: %s" % files)

configmaps = {name: d.get("data", {}) for (kind, name), (_, d) in docs.items()
              if kind == "ConfigMap"}
deployments = {name: d for (kind, name), (_, d) in docs.items() if kind == "Deployment"}
for want in BINARIES:
    if want not in deployments:
        fail("no Deployment %s" % want)
for kind, name in (("Service", "kvf-router"), ("HorizontalPodAutoscaler", "kvf-prefill"),
                   ("HorizontalPodAutoscaler", "kvf-decode")):
    if (kind, name) not in docs:
        fail("no %s %s" % (kind, name))

pods = {}  # role -> (argv, env dict with $(VAR) unresolved, container)
for name, d in deployments.items():
    spec = d["spec"]["template"]["spec"]
    for c in spec["containers"]:
        argv = list(c.get("command", [])) + list(c.get("args", []))
        prog = prog_of(argv) if argv else None
        if prog not in BINARIES:
            fail("Deployment %s: container %s runs %s, not a kvferry binary" % (name, c["name"], argv))
            continue
        where = "%s container %s" % (name, c["name"])
        env = {}
        for ref in c.get("envFrom", []):
            cm = ref.get("configMapRef", {}).get("name")
            if cm not in configmaps:
                fail("%s: envFrom ConfigMap %s is not defined" % (where, cm))
                continue
            env.update({k: str(v) for k, v in configmaps[cm].items()})
        for e in c.get("env", []):
            env[e["name"]] = str(e.get("value", "$(fieldRef:%s)" %
                                       e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")))
        check_env(where, [prog], env)
        for key in ("livenessProbe", "readinessProbe") + (("startupProbe",) if
                                                          prog != "kvf-router" else ()):
            if key not in c:
                fail("%s: no %s" % (where, key))
        for key in ("livenessProbe", "readinessProbe", "startupProbe"):
            probe = c.get(key, {})
            for inv in shell_invocations(" ".join(shlex.quote(a) for a in
                                                  probe.get("exec", {}).get("command", []))):
                check_flags(where + " " + key, prog_of(inv), inv[2:])
        if prog == "kvf-router":
            rp = c.get("readinessProbe", {}).get("httpGet", {})
            if rp.get("path") != "/health":
                fail("%s: readiness probe is not GET /health" % where)
        else:
            res = c.get("resources", {})
            for part in ("requests", "limits"):
                if "nvidia.com/gpu" not in res.get(part, {}):
                    fail("%s: no nvidia.com/gpu in resources.%s" % (where, part))
            if spec.get("terminationGracePeriodSeconds", 30) < 60:
                fail("%s: terminationGracePeriodSeconds too short to drain" % where)
        pods[prog.split("-")[1]] = (argv, env, c)

# HPAs: one per pool, each on metrics the adapter rules define.
adapter = yaml.safe_load(open(os.path.join(k8s, "prometheus-adapter-values.yaml")))
rules = {r["name"]["as"]: r for r in adapter["rules"]["custom"]}
for pool in ("prefill", "decode"):
    hpa = docs.get(("HorizontalPodAutoscaler", "kvf-" + pool), (None, {}))[1]
    if not hpa:
        continue
    if hpa["spec"]["scaleTargetRef"]["name"] != "kvf-" + pool:
        fail("HPA kvf-%s scales %s" % (pool, hpa["spec"]["scaleTargetRef"]["name"]))
    for m in hpa["spec"]["metrics"]:
        name = m[m["type"].lower()]["metric"]["name"]
        if name not in rules:
            fail("HPA kvf-%s: metric %s has no prometheus-adapter rule" % (pool, name))
        elif 'role="%s"' % pool not in rules[name]["metricsQuery"]:
            fail("HPA kvf-%s: metric %s is not computed over the %s pool" % (pool, name, pool))
ok("Deployments, Services, probes, GPU requests, HPAs checked")

# ---- 2. systemd --------------------------------------------------------------

sd = os.path.join(root, "deploy", "systemd")
envfile = {}
for line in open(os.path.join(sd, "kvferry.env")):
    line = line.strip()
    if line and not line.startswith("#"):
        k, v = line.split("=", 1)
        envfile[k] = v.strip('"')
units = {"kvf-router.service": "kvf-router", "kvf-prefill@.service": "kvf-prefill",
         "kvf-decode@.service": "kvf-decode"}
check_env("kvferry.env (read by every unit)", BINARIES, envfile)
for var, prog in (("KVFERRY_ROUTER_ARGS", "kvf-router"), ("KVFERRY_PREFILL_ARGS", "kvf-prefill"),
                  ("KVFERRY_DECODE_ARGS", "kvf-decode")):
    run_help("kvferry.env " + var, [prog] + envfile.get(var, "").split(), env=envfile)


def systemd_expand(words, env):
    """ExecStart words after systemd's expansion: ${VAR} inside a word, a
    lone $VAR split on white space, $$ a literal $."""
    out = []
    for w in words:
        w = w.replace("$$", "\0")
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", w)
        if m:
            out += env.get(m.group(1), "").split()
            continue
        w = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), w)
        out.append(w.replace("\0", "$"))
    return out


for unit, prog in units.items():
    text = open(os.path.join(sd, unit)).read()
    for key in ("Restart=on-failure", "KillSignal=SIGTERM", "EnvironmentFile="):
        if key not in text:
            fail("%s: no %s" % (unit, key))
    stop = re.search(r"^TimeoutStopSec=(\d+)", text, re.M)
    if not stop or (prog != "kvf-router" and int(stop.group(1)) < 60):
        fail("%s: TimeoutStopSec missing or too short to drain" % unit)
    m = re.search(r"^ExecStart=((?:.*\\\n)*.*)$", text, re.M)
    if not m:
        fail("%s: no ExecStart" % unit)
        continue
    line = m.group(1).replace("\\\n", " ")
    line = line.replace("%i", "1").replace("%H", "testhost").replace("%%", "%")
    argv = systemd_expand(shlex.split(line), envfile)
    argv = [a.replace("/usr/local/bin/", bindir + "/") for a in argv]
    if prog_of(argv) == prog:
        run_help(unit, argv, env=envfile)
    elif os.path.basename(argv[0]) in ("sh", "bash") and argv[1] == "-c":
        inv = shell_invocations(argv[2])
        if len(inv) != 1 or prog_of(inv[0]) != prog:
            fail("%s: ExecStart does not run %s: %s" % (unit, prog, argv))
            continue
        # Run the unit's own sh -c script (with the env file) plus --help.
        out = subprocess.run([argv[0], "-c", argv[2] + " --help"], capture_output=True,
                             text=True, timeout=30, env=dict(os.environ, **envfile))
        checked["commands"] += 1
        if out.returncode != 0:
            fail("%s: ExecStart does not parse: %s" % (unit, out.stderr.strip()))
        check_flags(unit, prog, inv[0][1:])
    else:
        fail("%s: ExecStart runs %s" % (unit, argv[0]))
ok("systemd units and kvferry.env checked")

# ---- 3. Slurm -----------------------------------------------------------------

sbatch = os.path.join(root, "deploy", "slurm", "kvf.sbatch")
out = subprocess.run(["bash", sbatch, "--dry-run", "--hosts", "127.0.0.1,127.0.0.1,127.0.0.1,127.0.0.1",
                      "--model", model, "--prefill", "1", "--decode", "2", "--bin-dir", bindir,
                      "--prefill-args", "--threads 1", "--decode-args", "--threads 1 --kv-mem 8M",
                      "--srun-args", "--gpus-per-task=1"],
                     capture_output=True, text=True, timeout=30)
if out.returncode != 0:
    fail("kvf.sbatch --dry-run failed: %s" % out.stderr)
steps = [shlex.split(l) for l in out.stdout.splitlines() if l.strip()]
roles = []
for argv in steps:
    if argv[0] != "srun":
        fail("kvf.sbatch step is not an srun: %s" % argv)
        continue
    i = next((k for k in range(len(argv)) if prog_of(argv, k)), None)
    if i is None:
        fail("kvf.sbatch step runs no kvferry binary: %s" % argv)
        continue
    roles.append(prog_of(argv, i))
    run_help("kvf.sbatch", argv[i:])
if roles != ["kvf-router", "kvf-prefill", "kvf-decode", "kvf-decode"]:
    fail("kvf.sbatch --prefill 1 --decode 2 starts %s" % roles)
text = open(sbatch).read()
for inv in shell_invocations(re.sub(r"\$\(bin (kvf[a-z-]*)\)", r"\1", text.replace("\\\n", " "))):
    check_flags("kvf.sbatch", prog_of(inv), inv[2 if prog_of(inv).startswith("kvf ") else 1:])
ok("kvf.sbatch: %d srun steps (router, prefill, 2 decode) parse" % len(steps))

# kvf-cluster's own kvferry commands (statically: its arguments are variables).
text = open(os.path.join(root, "deploy", "kvf-cluster")).read().replace("\\\n", " ")
text = re.sub(r'"\$bin_dir/(kvf[a-z-]*)"', r"\1", text)
text = text.replace("kvf-$role", "kvf-decode")
n = 0
for inv in shell_invocations(text):
    prog = prog_of(inv)
    check_flags("kvf-cluster", prog, inv[2 if prog.startswith("kvf ") else 1:])
    if prog == "kvf-decode":  # the same line starts prefill nodes
        check_flags("kvf-cluster", "kvf-prefill", inv[1:])
    n += 1
if n < 3:
    fail("kvf-cluster: found only %d kvferry commands" % n)
ok("kvf-cluster: %d kvferry commands" % n)

# ---- 4. the pods, emulated on 127.0.0.1 ---------------------------------------


def free_port():
    out = subprocess.run([os.path.join(root, "deploy", "free-port")], check=True,
                         capture_output=True, text=True).stdout
    return int(out)


ports = {"router": {5555: free_port(), 5556: free_port(), 8000: free_port()},
         "prefill": {6000: free_port()}, "decode": {6000: free_port()}}
router_ports = ports["router"]


def localize(s, role):
    s = s.replace("kvf-router.kvferry.svc", "127.0.0.1").replace("0.0.0.0", "127.0.0.1")
    for table in (ports[role], router_ports):
        for old, new in table.items():
            s = re.sub(r"(127\.0\.0\.1|\$\(POD_IP\)):%d\b" % old, r"\g<1>:%d" % new, s)
    return s.replace("$(POD_IP)", "127.0.0.1")


procs = []
pidfile = open(os.path.join(work, "pids"), "a")


def start(role):
    argv, env, c = pods[role]
    env = {k: localize(v, role) for k, v in env.items()}
    env["KVF_MODEL"] = model
    env["POD_IP"] = "127.0.0.1"
    env["KVF_NODE_ID"] = "kvf-%s-pod-0" % role
    if role != "router":
        env["KVF_KV_MEM"] = "8M"
        env["KVF_THREADS"] = "1"
        # The pods ask for a GPU (KVF_BACKEND=cuda); this machine may have
        # none, and the reference below runs on the CPU: emulate them there.
        if env.get("KVF_BACKEND") == "cuda":
            env["KVF_BACKEND"] = "cpu"
    env["UCX_NET_DEVICES"] = "lo"
    env["UCX_TLS"] = "tcp,self"
    argv = [localize(a, role) for a in argv]
    argv[0] = os.path.join(bindir, os.path.basename(argv[0]))
    log = open(os.path.join(work, role + ".log"), "w")
    p = subprocess.Popen(argv, env=dict(os.environ, **env), stdout=log, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL)
    pidfile.write("%d\n" % p.pid)
    pidfile.flush()
    procs.append(p)
    return env, c


def probe(role, key, env, c):
    pr = c[key]
    if "httpGet" in pr:
        port = {"http": 8000}.get(pr["httpGet"]["port"], pr["httpGet"]["port"])
        url = "http://127.0.0.1:%d%s" % (ports[role][port], pr["httpGet"]["path"])
        try:
            return urllib.request.urlopen(url, timeout=2).status == 200
        except Exception:
            return False
    if "tcpSocket" in pr:
        named = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        port = named.get(pr["tcpSocket"]["port"], pr["tcpSocket"]["port"])
        try:
            socket.create_connection(("127.0.0.1", ports[role][port]), timeout=2).close()
            return True
        except OSError:
            return False
    cmd = pr["exec"]["command"]
    r = subprocess.run(cmd, env=dict(os.environ, PATH=bindir + ":" + os.environ["PATH"], **env),
                       capture_output=True, text=True, timeout=pr.get("timeoutSeconds", 1) + 5)
    return r.returncode == 0


try:
    started = {role: start(role) for role in ("router", "decode", "prefill")}
    # Generous: it costs nothing when the pods come up, and leaves room for a
    # slow machine or a sanitizer build.
    deadline = time.time() + 120
    pending = {(role, key) for role in started for key in ("livenessProbe", "readinessProbe")}
    while pending and time.time() < deadline:
        for role, key in sorted(pending):
            if probe(role, key, *started[role]):
                pending.discard((role, key))
                ok("pod %s: %s passes" % (role, key))
        for p in procs:
            if p.poll() is not None:
                raise SystemExit("FAIL: a pod's process exited with %s" % p.returncode)
        time.sleep(0.3)
    for role, key in sorted(pending):
        fail("pod %s: %s does not pass" % (role, key))
    client = "tcp://127.0.0.1:%d" % router_ports[5556]
    r = subprocess.run([os.path.join(bindir, "kvf"), "generate", "--router", client,
                        "--prompt-ids", "510,5,6,7", "--max-tokens", "8", "--ignore-eos", "--ids"],
                       capture_output=True, text=True, timeout=60)
    want = subprocess.run([os.path.join(bindir, "kvf"), "generate", "--model", model, "--threads", "1",
                           "--prompt-ids", "510,5,6,7", "--max-tokens", "8", "--ignore-eos", "--ids"],
                          capture_output=True, text=True, timeout=60)
    if r.returncode != 0 or r.stdout != want.stdout:
        fail("a request through the emulated pods: %r %s, colocated %r" % (r.stdout, r.stderr,
                                                                          want.stdout))
    else:
        ok("a request through the emulated pods returns the colocated ids %s" % r.stdout.strip())

    # ---- metrics the adapter rules read exist in the router's /metrics.
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % router_ports[8000],
                                  timeout=5).read().decode()
    served = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    for name, rule in rules.items():
        used = set(re.findall(r"\bkvf_[a-z_]+", rule["seriesQuery"] + rule["metricsQuery"]))
        for m in used:
            if m not in served:
                fail("adapter rule %s reads %s, which the router does not serve" % (name, m))
    ok("the adapter rules read %s, all served by the router" %
       sorted({m for r in rules.values()
               for m in re.findall(r"\bkvf_[a-z_]+", r["seriesQuery"])}))
finally:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()

print("checked %d flags and ran %d command lines with --help" % (checked["flags"], checked["commands"]))
if failures:
    sys.exit("%d failures" % len(failures))
print("deploy_manifests: all checks passed")
EOF

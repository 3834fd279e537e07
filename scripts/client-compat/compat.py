#!/usr/bin/env python3
"""Proves that the real OpenStack clients work against blazar-server.

Three parts, each against its own fresh blazar-server (noauth, SQLite, loopback):

* ``blazar``: replays the session recorded with python-blazarclient 4.6.0 against the real
  Blazar (reference/client-transcript.md, a verbatim copy of shared/spec/client-transcript.md:
  72 commands covering every command of the CLI),
  then a few commands the recording lacks, and compares each output with the recorded one:
  tables and JSON are parsed, ids are matched up (a reference id must always correspond to
  the same new id, and the other way round), created_at/updated_at are compared by format
  only. Every deliberate difference of blazar-rs is an entry of KNOWN_DIFFERENCES below,
  with its reason.
* ``openstack``: the same session through ``openstack reservation ...`` (the OSC plugin of
  python-blazarclient, the same command classes), compared with the same recording.
  python-openstackclient needs no Keystone for it: ``--os-auth-type none --os-endpoint URL``
  (and ``admin_token`` with ``--os-token`` for another identity) go straight to the URL.
* ``chi``: python-chi's lease helpers (Lease.add_node_reservation/submit/wait, the older
  create_lease/lease_duration/add_node_reservation/wait_for_active/get_node_reservation),
  then the lease's hosts through Blazar's allocation API, as chi's own code reads them. chi
  builds its Blazar client on a keystoneauth session from OS_* settings; OS_AUTH_TYPE=none
  with OS_ENDPOINT_OVERRIDE points it at the server without Keystone.

A failure names the command and prints the expected and the actual output side by side with
the first difference and the HTTP exchanges the command made (a logging proxy sits between
client and server). Standard library only; the clients come from the virtualenv given.

    python3 compat.py --venv .venv/clients --server target/debug/blazar-server
"""

import argparse
import datetime
import http.client
import http.server
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_REFERENCE = os.path.join(HERE, "reference", "client-transcript.md")

UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
HEX32 = r"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])"
ID_RE = re.compile("(%s|%s)" % (UUID, HEX32))
TIMESTAMP_RE = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:\.\d+)?")
# Fields whose values are the time of a write: compared by format, not value.
WRITE_TIME_KEYS = {"created_at", "updated_at"}

# The reference's Nova knew compute-1..3 with these facts; blazar-rs has no Nova and takes the
# facts from the create request (docs/compatibility.md, "Host create"), so the replay passes
# them as --extra to reproduce the recorded hosts.
CPU_INFO = json.dumps({"arch": "x86_64", "model": "Haswell-noTSX", "vendor": "Intel",
                       "topology": {"cells": 1, "sockets": 1, "cores": 8, "threads": 2},
                       "features": ["avx", "avx2", "sse4.2"]})
NOVA_FACTS = {
    "compute-1": {"vcpus": 8, "memory_mb": 16384, "local_gb": 100},
    "compute-2": {"vcpus": 16, "memory_mb": 65536, "local_gb": 500},
    "compute-3": {"vcpus": 32, "memory_mb": 131072, "local_gb": 1000},
    "compute-4": {"vcpus": 64, "memory_mb": 262144, "local_gb": 2000},
}


def nova_extras(name):
    facts = dict(NOVA_FACTS.get(name, {}), hypervisor_version=8002002, cpu_info=CPU_INFO)
    extras = []
    for key, value in facts.items():
        extras += ["--extra", "%s=%s" % (key, value)]
    return extras


# ---------------------------------------------------------------------------------------
# The reference transcript


class Step:
    def __init__(self, number, title, section):
        self.number = number
        self.title = title
        self.section = section
        self.token = None
        self.argv = []
        self.stdout = ""
        self.stderr = ""
        self.rc = 0
        self.wait_before = False

    @property
    def command(self):
        return self.argv[0] if self.argv else ""


def parse_transcript(path):
    """The steps of a client transcript written by peer/make_transcripts.py."""
    steps, section, wait_next = [], "", False
    with open(path) as f:
        lines = f.read().split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:]
        elif line.startswith("*(wait"):
            wait_next = True
        elif line.startswith("### "):
            m = re.match(r"### (\d+)\. (.*)", line)
            step = Step(int(m.group(1)), m.group(2), section)
            step.wait_before, wait_next = wait_next, False
            while not lines[i].startswith("```console"):
                i += 1
            i += 1
            words = shlex.split(lines[i][2:])
            while "=" in words[0]:
                key, _, value = words.pop(0).partition("=")
                if key == "BLAZAR_TOKEN":
                    step.token = value
            assert words[0] == "peer/blazar.sh", lines[i]
            step.argv = words[1:]
            i += 1
            out, err, target = [], [], None
            target = out
            while not lines[i].startswith("[exit "):
                if lines[i] == "--- stderr ---":
                    target = err
                else:
                    target.append(lines[i])
                i += 1
            step.rc = int(lines[i][6:-1])
            step.stdout = "\n".join(out)
            step.stderr = "\n".join(err)
            steps.append(step)
        i += 1
    return steps


# ---------------------------------------------------------------------------------------
# Parsing what the clients print


def parse_table(lines):
    """A prettytable (cliff's table formatter) as (header, rows); multi-line cells joined."""
    sep = lines[0]
    cuts = [i for i, c in enumerate(sep) if c == "+"]
    header, rows, seps = None, [], 0
    for line in lines:
        if line.startswith("+"):
            seps += 1
            continue
        cells = [line[a + 1:b].strip() for a, b in zip(cuts, cuts[1:])]
        if header is None:
            header = cells
        elif rows and cells[0] == "" and any(cells[1:]):
            # A continuation line of a multi-line row: cliff prints no separator between
            # rows, and the first column (id or field name) is never empty on a row's start.
            rows[-1] = rows[-1][:1] + [a + "\n" + b for a, b in zip(rows[-1][1:], cells[1:])]
        else:
            rows.append(cells)
    return header, rows


def parse_json_stream(text):
    """'{...}\\n{...}' (how the CLI prints a list of objects in a cell) as a list, or None."""
    decoder, objs, pos = json.JSONDecoder(), [], 0
    text = text.strip()
    while pos < len(text):
        try:
            obj, end = decoder.raw_decode(text, pos)
        except ValueError:
            return None
        objs.append(obj)
        pos = end
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return objs


def canon_cell(key, value):
    """A cell or JSON value in comparable form: embedded JSON parsed, events sorted."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        objs = parse_json_stream(value)
        if objs is not None:
            if key == "events":
                # The real Blazar lists events in the order of their random ids.
                objs.sort(key=lambda e: e.get("event_type", "") if isinstance(e, dict) else "")
            return {"json": objs}
    if isinstance(value, dict):
        return {k: canon_cell(k, v) for k, v in value.items()}
    return value


def parse_stdout(text):
    """Blocks of output: ('text', line), ('show', {field: value}), ('list', header, rows),
    ('json', obj)."""
    blocks, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("+"):
            j = i
            while j < len(lines) and lines[j][:1] in ("+", "|"):
                j += 1
            header, rows = parse_table(lines[i:j])
            if header == ["Field", "Value"]:
                blocks.append(("show", {r[0]: canon_cell(r[0], r[1]) for r in rows}))
            else:
                blocks.append(("list", header,
                               [{h: canon_cell(h, v) for h, v in zip(header, r)}
                                for r in rows]))
            i = j
            continue
        if line[:1] in ("{", "["):
            rest = "\n".join(lines[i:])
            try:
                obj, end = json.JSONDecoder().raw_decode(rest)
            except ValueError:
                obj = None
            if obj is not None:
                blocks.append(("json", canon_cell(None, obj)))
                i += rest[:end].count("\n") + 1
                continue
        if line.strip():
            blocks.append(("text", line.rstrip()))
        i += 1
    return blocks


# ---------------------------------------------------------------------------------------
# Comparing


class Mismatch(Exception):
    pass


class IdMap:
    """The correspondence between the reference's ids and this run's: a bijection, learnt as
    outputs are compared."""

    def __init__(self):
        self.to_actual, self.to_reference = {}, {}

    def bind(self, ref, act, where):
        if self.to_actual.get(ref, act) != act or self.to_reference.get(act, ref) != ref:
            raise Mismatch("%s: reference id %s was %s before, now %s (actual id %s was "
                           "reference %s before)" % (where, ref, self.to_actual.get(ref),
                                                     act, act, self.to_reference.get(act)))
        self.to_actual[ref] = act
        self.to_reference[act] = ref

    def rewrite(self, text):
        """The reference text with the ids known so far replaced by this run's."""
        return ID_RE.sub(lambda m: self.to_actual.get(m.group(0), m.group(0)), text)


# Known differences in one field, wherever it appears: field -> (reason, accept(exp, act)).
FIELD_DIFFERENCES = {
    "subnet_id": ("blazar-rs has no Neutron to find the subnet of an address in: a floating "
                  "IP created without subnet_id has none (docs/compatibility.md, Floating IP "
                  "create)", lambda exp, act: act in ("", None)),
}


class Comparer:
    def __init__(self, ids, shift=None):
        self.ids = ids
        self.shift = shift  # function applied to reference timestamps (the "now" lease)
        self.notes = []  # the known differences met

    def text(self, exp, act, where):
        if self.shift:
            exp = TIMESTAMP_RE.sub(lambda m: self.shift(m.group(0)), exp)
        e_parts, a_parts = ID_RE.split(exp), ID_RE.split(act)
        if len(e_parts) != len(a_parts):
            raise Mismatch("%s: expected %r, got %r" % (where, exp, act))
        for n, (e, a) in enumerate(zip(e_parts, a_parts)):
            if n % 2 and e != "00000000000000000000000000000000":
                if len(e) != len(a):
                    raise Mismatch("%s: expected an id like %r, got %r" % (where, e, a))
                self.ids.bind(e, a, where)
            elif e != a:
                raise Mismatch("%s: expected %r, got %r" % (where, exp, act))

    def value(self, exp, act, where, key=None):
        if key in FIELD_DIFFERENCES and exp != act and FIELD_DIFFERENCES[key][1](exp, act):
            if FIELD_DIFFERENCES[key][0] not in self.notes:
                self.notes.append(FIELD_DIFFERENCES[key][0])
            return
        if isinstance(exp, dict) and isinstance(act, dict):
            missing = [k for k in exp if k not in act]
            extra = [k for k in act if k not in exp]
            if missing or extra:
                raise Mismatch("%s: fields differ: missing %s, unexpected %s"
                               % (where, missing, extra))
            for k in exp:
                self.value(exp[k], act[k], "%s.%s" % (where, k), k)
        elif isinstance(exp, list) and isinstance(act, list):
            if len(exp) != len(act):
                raise Mismatch("%s: expected %d items, got %d" % (where, len(exp), len(act)))
            for n, (e, a) in enumerate(zip(exp, act)):
                self.value(e, a, "%s[%d]" % (where, n), key)
        elif key in WRITE_TIME_KEYS and isinstance(exp, str) and isinstance(act, str):
            if re.sub(r"\d", "N", exp) != re.sub(r"\d", "N", act):
                raise Mismatch("%s: expected a time shaped %r, got %r" % (where, exp, act))
        elif type(exp) is not type(act):
            raise Mismatch("%s: expected %r (%s), got %r (%s)" % (
                where, exp, type(exp).__name__, act, type(act).__name__))
        elif isinstance(exp, str):
            self.text(exp, act, where)
        elif exp != act:
            raise Mismatch("%s: expected %r, got %r" % (where, exp, act))

    def stdout(self, exp, act, sort_rows=None):
        e_blocks, a_blocks = parse_stdout(exp), parse_stdout(act)
        if sort_rows:
            for blocks in (e_blocks, a_blocks):
                for b in blocks:
                    if b[0] == "list":
                        b[2].sort(key=lambda row: str(row.get(sort_rows)))
        if [b[0] for b in e_blocks] != [b[0] for b in a_blocks]:
            raise Mismatch("stdout: expected blocks %s, got %s" % (
                [b[0] for b in e_blocks], [b[0] for b in a_blocks]))
        for n, (e, a) in enumerate(zip(e_blocks, a_blocks)):
            where = "stdout block %d (%s)" % (n + 1, e[0])
            if e[0] == "list":
                if e[1] != a[1]:
                    raise Mismatch("%s: expected columns %s, got %s" % (where, e[1], a[1]))
                self.value(e[2], a[2], where)
            else:
                self.value(e[1], a[1], where)

    def stderr(self, exp, act):
        e_lines = [x for x in exp.split("\n") if x.strip()]
        a_lines = [x for x in act.split("\n") if x.strip()]
        if len(e_lines) != len(a_lines):
            raise Mismatch("stderr: expected %d lines, got %d" % (len(e_lines), len(a_lines)))
        for n, (e, a) in enumerate(zip(e_lines, a_lines)):
            self.text(e, a, "stderr line %d" % (n + 1))


# ---------------------------------------------------------------------------------------
# Server, logging proxy, clients


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url, method="GET", body=None, token=None):
    req = urllib.request.Request(url, method=method,
                                 data=json.dumps(body).encode() if body is not None else None)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("X-Auth-Token", token)
    with urllib.request.urlopen(req, timeout=30) as resp:
        text = resp.read()
    return json.loads(text) if text else None


class Server:
    """A blazar-server of our own: fresh SQLite database, free loopback port."""

    def __init__(self, binary, workdir, name, extra_args=()):
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.log_path = os.path.join(workdir, "%s-server.log" % name)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [binary, "--listen", "127.0.0.1:%d" % self.port,
             "--database-url", os.path.join(workdir, "%s.db" % name), "--log", "warn"]
            + list(extra_args),
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("blazar-server exited (%s); see %s"
                                   % (self.proc.returncode, self.log_path))
            try:
                urllib.request.urlopen(self.url + "/healthz", timeout=2).read()
                break
            except (OSError, urllib.error.URLError):
                if time.monotonic() > deadline:
                    raise RuntimeError("blazar-server did not answer in 60 s")
                time.sleep(0.1)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class Proxy:
    """Forwards to the server and keeps every exchange, to show what a failing command sent
    and received."""

    def __init__(self, upstream_port):
        exchanges, lock = [], threading.Lock()
        self.exchanges, self.lock = exchanges, lock

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "connection", "content-length")}
                conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                with lock:
                    exchanges.append({
                        "request": "%s %s" % (self.command, self.path),
                        "token": self.headers.get("X-Auth-Token"),
                        "request_body": body.decode("utf-8", "replace"),
                        "status": resp.status,
                        "response_body": data.decode("utf-8", "replace"),
                    })
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def mark(self):
        with self.lock:
            return len(self.exchanges)

    def since(self, mark):
        with self.lock:
            return list(self.exchanges[mark:])

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def client_env():
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    for key in list(env):
        if key.startswith("OS_") or key.startswith("BLAZAR_"):
            del env[key]  # the clients must see only what we pass
    return env


class BlazarCli:
    """python-blazarclient's `blazar`, exactly as the reference was recorded with."""

    name = "blazar"
    # `blazar` logs at INFO on stderr, so the recording has the "Matches: ..." lines that
    # python-blazarclient logs while parsing --physical-reservation / --reservation.
    prints_matches = True

    def __init__(self, venv):
        self.exe = os.path.join(venv, "bin", "blazar")

    def words(self, args):
        return list(args)

    def argv(self, url, token, args):
        auth = (["--os-auth-type", "admin_token", "--os-token", token] if token
                else ["--os-auth-type", "none"])
        return [self.exe] + auth + ["--os-endpoint", url + "/v1"] + self.words(args)


class OpenStackCli(BlazarCli):
    """python-openstackclient's `openstack reservation ...`: `lease-update` is `lease set`,
    every other `a-b-c` is `a b c`. Its `lease create` is python-blazarclient's
    CreateLeaseBase, which has no --physical-reservation: a host reservation is a
    --reservation with resource_type=physical:host and the same keys."""

    name = "openstack"
    prints_matches = False  # openstack logs warnings only

    def __init__(self, venv):
        self.exe = os.path.join(venv, "bin", "openstack")

    def words(self, args):
        verb = ["set" if w == "update" else w for w in args[0].split("-")]
        rest = []
        for a in args[1:]:
            if rest and rest[-1] == "--physical-reservation":
                rest[-1:] = ["--reservation", "resource_type=physical:host," + a]
            else:
                rest.append(a)
        return ["reservation"] + verb + rest


# python-blazarclient 4.6.0 registers `openstack reservation host unset` with a class name that
# does not exist (UnsetAttributeHost; the class is UnsetAttributesHost), so openstack prints
# this on stderr at every start and cannot run that command. A client bug, not the server's.
OSC_UNSET_NOISE = ("Could not load 'reservation_host_unset': module "
                   "'blazarclient.v1.shell_commands.hosts' has no attribute "
                   "'UnsetAttributeHost'")


def run_client(cli, url, token, args):
    argv = cli.argv(url, token, args)
    t0 = time.monotonic()
    p = subprocess.run(argv, env=client_env(), capture_output=True, text=True, timeout=180,
                       stdin=subprocess.DEVNULL)
    err = "\n".join(x for x in p.stderr.split("\n") if x != OSC_UNSET_NOISE)
    return p.returncode, p.stdout, err, time.monotonic() - t0


# ---------------------------------------------------------------------------------------
# Known differences of blazar-rs, keyed by reference step number: (reason, kind, argument).
#
#   "error"    (status, regex): the command must fail (exit 1) with the client's own Matches:
#              lines and one ERROR line matching the regular expression, and the server's last
#              answer must have that HTTP status;
#   "expect"   a function of the reference step giving the step blazar-rs must reproduce,
#              then compared as usual;
#   "created"  the reference refused to create a host/floating IP for a reason blazar-rs
#              does not have: it must be created (and is deleted again, so that the rest of
#              the session sees what the reference saw);
#   "status"   a lease-show -c status whose value may be either of the ones given;
#   "unordered" a list whose rows are compared sorted by the column given.


def copy_step(step, **changes):
    new = Step(step.number, step.title, step.section)
    new.__dict__.update(step.__dict__)
    new.__dict__.update(changes)
    return new


NOT_ENOUGH_HOSTS = ("not enough hosts is a 409 whose message says which reservation, its "
                    "minimum, how many hosts match and how many are free, instead of a 500 "
                    "'Not enough hosts available' (docs/compatibility.md, Errors)")

KNOWN_DIFFERENCES = {
    5: ("blazar-rs has no Nova: any host name is registered (docs/compatibility.md, Host "
        "create); the reference's fake Nova refused an unknown name", "created", "host"),
    6: ("a duplicate host is a 409 'Host <name> is already registered' instead of the Nova "
        "aggregate's conflict text (docs/compatibility.md, Errors: Duplicate host)",
        "error", (409, r"^ERROR: Host 'compute-1' is already registered")),
    20: ("the private flag of a property is reported truthfully; Blazar always says False "
         "(docs/compatibility.md, Reporting)", "expect",
         lambda step: copy_step(step, stdout=step.stdout.replace(
             "| rack     | False   |", "| rack     | True    |"))),
    24: (NOT_ENOUGH_HOSTS, "error",
         (409, r"^ERROR: Not enough hosts available for reservation 1 \(physical:host, min 1\)")),
    26: (NOT_ENOUGH_HOSTS, "error",
         (409, r"^ERROR: Not enough hosts available for reservation 1 \(physical:host, min 5\)")),
    44: (NOT_ENOUGH_HOSTS + "; an update names the reservation by its id", "error",
         (409, r"^ERROR: Not enough hosts available for reservation [0-9a-f-]{36} "
               r"\(physical:host, min 1\)")),
    48: ("blazar-rs has no Neutron: any valid address on any network is registered "
         "(docs/compatibility.md, Floating IP create); the reference's fake Neutron refused "
         "an address inside its subnet's allocation pool", "created", "floatingip"),
    49: ("floating IPs are listed in the order they were registered; the real Blazar lists "
         "them in the order of their random ids, so rows are compared in address order",
         "unordered", "floating_ip_address"),
    56: ("a lease that starts now is ACTIVE within milliseconds instead of up to 10 s later "
         "(docs/compatibility.md, Lifecycle), so right after creation it may already be "
         "ACTIVE", "status", ("PENDING", "ACTIVE")),
}

# Which floating IP a lease for "amount=1" gets is the server's choice. The real Blazar takes
# the first free one in its database's order, which is the order of their random UUIDs: in the
# recording, fip-lease (step 51) got 172.24.4.201, so fip-lease-2 (step 52, requires .201 in
# an overlapping window) failed and fip-lease-3 (step 53, any address) got .200. blazar-rs
# takes them in the order they were registered, so fip-lease gets .200, fip-lease-2 succeeds
# and fip-lease-3 finds none left. Both are right; when blazar-rs takes the other branch, the
# expected outputs of steps 52, 53, 65, 69 and 71 are the recorded ones with the roles of
# the two leases swapped (see Replay.fip_swapped).
FIP_CHOICE = ("floating-IP choice: fip-lease got 172.24.4.200 (registered first) where the "
              "real Blazar's random-id order gave it .201, so fip-lease-2 succeeds and "
              "fip-lease-3 fails instead of the other way round")


def error_problems(expected, rc, out, err, exp, exchanges):
    """Exit code 1, the client's Matches: lines of the reference (printed while parsing
    --physical-reservation / --reservation), one ERROR line matching the pattern, the HTTP
    status."""
    status, pattern = expected
    exp_matches = [x for x in exp.stderr.split("\n") if x.startswith("Matches: ")]
    act_matches = [x for x in err.split("\n") if x.startswith("Matches: ")]
    errors = [x for x in err.split("\n") if x.startswith("ERROR: ")]
    others = [x for x in err.split("\n") if x.strip() and not x.startswith(("Matches: ",
                                                                            "ERROR: "))]
    problems = []
    if rc != 1:
        problems.append("exit code %d, expected 1" % rc)
    if act_matches != exp_matches:
        problems.append("the client's Matches: lines differ")
    if out.strip() or others:
        problems.append("unexpected output")
    if len(errors) != 1 or not re.search(pattern, errors[0]):
        problems.append("expected one ERROR line matching /%s/" % pattern)
    if not exchanges or exchanges[-1]["status"] != status:
        problems.append("expected the last HTTP answer to be %d" % status)
    return problems


# ---------------------------------------------------------------------------------------
# The replay


class Result:
    def __init__(self, part):
        self.part = part
        self.passed = 0
        self.failed = 0
        self.lines = []
        self.failures = []

    def ok(self, label, note=""):
        self.passed += 1
        if len(label) > 150:
            label = label[:147] + "..."
        note = "\n          known difference: %s" % note if note else ""
        self.lines.append("ok    %s%s" % (label, note))

    def skip(self, label, why):
        self.lines.append("skip  %s  (%s)" % (label, why))

    def fail(self, label, text):
        self.failed += 1
        self.lines.append("FAIL  %s" % label)
        self.failures.append("FAIL  %s\n%s" % (label, text))


def indent(text, prefix="    | "):
    text = text.rstrip("\n")
    if not text:
        return prefix + "(empty)"
    return "\n".join(prefix + line for line in text.split("\n"))


def render(rc, out, err):
    return "%s\n%s\n    [exit %d]" % (indent(out), ("    --- stderr ---\n" + indent(err))
                                      if err.strip() else "    (no stderr)", rc)


def render_http(exchanges, limit=2000):
    if not exchanges:
        return "    (no HTTP request)"
    parts = []
    for e in exchanges:
        parts.append("    > %s  (X-Auth-Token: %s)" % (e["request"], e["token"]))
        if e["request_body"]:
            parts.append(indent(e["request_body"][:limit], "    >   "))
        parts.append("    < %d" % e["status"])
        if e["response_body"]:
            body = e["response_body"]
            parts.append(indent(body[:limit] + (" ..." if len(body) > limit else ""),
                                "    <   "))
    return "\n".join(parts)


class Replay:
    def __init__(self, cli, server, proxy, steps, result, all_steps):
        self.cli, self.server, self.proxy, self.steps = cli, server, proxy, steps
        self.result = result
        self.ids = IdMap()
        self.shift = None
        self.fip_swapped = False
        self.steps_all = all_steps

    def label(self, number, args, token=None):
        shown = [self.cli.name] + self.cli.words(args)
        number = number if number == "extra" else "#%s" % number
        return "%s %s: %s%s" % (self.cli.name, number, "(as %s) " % token if token else "",
                                " ".join(shlex.quote(a) for a in shown))

    def run(self, args, token=None):
        mark = self.proxy.mark()
        rc, out, err, _ = run_client(self.cli, self.proxy.url, token, args)
        return rc, out, err, self.proxy.since(mark)

    def expected_text(self, step):
        return render(step.rc, self.ids.rewrite(step.stdout), self.ids.rewrite(step.stderr))

    def report(self, label, step_or_text, rc, out, err, exchanges, problem):
        expected = (self.expected_text(step_or_text) if isinstance(step_or_text, Step)
                    else step_or_text)
        self.result.fail(label, "  difference: %s\n  expected (the real Blazar, ids mapped to "
                         "this run's where known):\n%s\n  actual:\n%s\n  HTTP exchanges:\n%s"
                         % (problem, expected, render(rc, out, err),
                            render_http(exchanges)))

    def compare(self, step, rc, out, err, sort_rows=None):
        """Raises Mismatch; returns the notes of the known field differences met."""
        cmp = Comparer(self.ids, self.shift)
        if rc != step.rc:
            raise Mismatch("exit code %d, expected %d" % (rc, step.rc))
        cmp.stdout(step.stdout, out, sort_rows)
        cmp.stderr(step.stderr, err)
        return cmp.notes

    def args_for(self, step):
        args = [self.ids.to_actual.get(a, a) for a in step.argv]
        args = [ID_RE.sub(lambda m: self.ids.to_actual.get(m.group(0), m.group(0)), a)
                for a in args]
        if step.command == "host-create" and args[-1].startswith("compute-"):
            args = args[:-1] + nova_extras(args[-1]) + args[-1:]
        if "--end-date" in args and step.section.startswith("Lease lifecycle"):
            # The reference's lease started "now" and ended two hours later: same here.
            ref_end = datetime.datetime.strptime(args[args.index("--end-date") + 1],
                                                 "%Y-%m-%d %H:%M")
            now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
            if now.second > 40:  # create it in the minute the dates are computed from
                time.sleep(61 - now.second)
                now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
            now = now.replace(second=0, microsecond=0)
            delta = now - (ref_end - datetime.timedelta(hours=2))
            args[args.index("--end-date") + 1] = (now + datetime.timedelta(hours=2)).strftime(
                "%Y-%m-%d %H:%M")
            ref_day = ref_end.strftime("%Y-%m-%d")

            def shift(ts, delta=delta, ref_day=ref_day):
                if not ts.startswith(ref_day):
                    return ts
                fmt = "%Y-%m-%dT%H:%M:%S" if "T" in ts else "%Y-%m-%d %H:%M:%S"
                base, dot, frac = ts.partition(".")
                moved = datetime.datetime.strptime(base, fmt) + delta
                return moved.strftime(fmt) + dot + frac
            self.shift = shift
        return args

    def wait_active(self, name, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leases = http_json(self.server.url + "/v1/leases")["leases"]
            if any(x["name"] == name and x["status"] == "ACTIVE" for x in leases):
                return True
            time.sleep(0.5)
        return False

    def replay_step(self, step):
        args = self.args_for(step)
        label = self.label(step.number, args, step.token)
        if step.wait_before:
            # The reference slept 12 s for Blazar's event loop; here: until it is ACTIVE.
            if not self.wait_active("now-lease"):
                self.result.fail(label, "  now-lease did not become ACTIVE within 30 s")
        if self.cli.name == "openstack" and step.command == "host-unset":
            self.openstack_unset(step, args, label)
            return
        rc, out, err, exchanges = self.run(args, step.token)
        notes = []
        step = self.for_cli(step)
        expected = step
        try:
            if step.number == 52 and rc == 0 and step.rc == 1:
                self.fip_swapped = True
            if self.fip_swapped and step.number in (52, 53, 65, 69, 71):
                notes.append(FIP_CHOICE)
                expected = self.swap_fip_leases(step)
            known = KNOWN_DIFFERENCES.get(step.number)
            kind = None
            if known:
                reason, kind, arg = known
                notes.append(reason)
                if kind == "expect":
                    expected = arg(expected)
                elif kind == "error":
                    problems = error_problems(arg, rc, out, err, expected, exchanges)
                    if problems:
                        raise Mismatch("; ".join(problems))
                elif kind == "created":
                    self.check_created(rc, out, err, arg, step.argv[-1])
                elif kind == "status":
                    blocks = parse_stdout(out)
                    if rc != 0 or err.strip() or [b[0] for b in blocks] != ["show"] or \
                            blocks[0][1] not in [{"status": x} for x in arg]:
                        raise Mismatch("expected a table with status %s" % " or ".join(arg))
            if kind in (None, "expect", "unordered"):
                if isinstance(expected, Step):
                    notes += self.compare(expected, rc, out, err,
                                          arg if kind == "unordered" else None)
                else:  # (status, pattern) of an error
                    problems = error_problems(expected, rc, out, err, step, exchanges)
                    if problems:
                        raise Mismatch("; ".join(problems))
            self.result.ok(label, "; ".join(notes))
        except Mismatch as e:
            self.report(label, expected if isinstance(expected, Step) else step, rc, out, err,
                        exchanges, str(e))

    def for_cli(self, step):
        """The reference step as this client prints it."""
        if self.cli.prints_matches:
            return step
        return copy_step(step, stderr="\n".join(
            x for x in step.stderr.split("\n") if not x.startswith("Matches: ")))

    def swap_fip_leases(self, step):
        """The expected output of a step when fip-lease-2 got the address (see FIP_CHOICE)."""
        ref = {s.number: self.for_cli(s) for s in self.steps_all}
        fip1, fip2 = ref[54].argv[-1], ref[69].argv[-1]
        if step.number == 52:
            # fip-lease-2 is created: the reference's fip-lease-3 output, with its window
            # (11:00-13:00, so before_end 12:00) and its required address.
            lines, event = [], None
            for line in ref[53].stdout.split("\n"):
                m = re.search(r'"event_type": "(\w+)"', line)
                event = m.group(1) if m else event
                if '"time"' in line:
                    line = line.replace("2030-01-05T11:30", {
                        "start_lease": "2030-01-05T11:00",
                        "before_end_lease": "2030-01-05T12:00"}.get(event, "?"))
                    line = line.replace("2030-01-05T12:30", "2030-01-05T13:00")
                lines.append(line)
            out = "\n".join(lines)
            for field, old, new in (("start_date", "11:30", "11:00"),
                                    ("end_date", "12:30", "13:00")):
                out = out.replace("| %-12s | 2030-01-05T%s" % (field, old),
                                  "| %-12s | 2030-01-05T%s" % (field, new))
            out = out.replace('"required_floatingips": []',
                              '"required_floatingips": ["172.24.4.201"]')
            out = out.replace("fip-lease-3", "fip-lease-2")
            err = "\n".join(x for x in step.stderr.split("\n") if x.startswith("Matches: "))
            return copy_step(step, rc=0, stdout=out, stderr=err)
        if step.number == 53:
            # fip-lease-3 finds no address: Blazar's 400, with the longer message every
            # shortfall has here (docs/compatibility.md, Errors).
            return (400, r"^ERROR: Not enough floating IPs available for reservation 1 ")
        if step.number in (65, 71):
            out = step.stdout.replace("fip-lease-3", "fip-lease-2")
            out = out.replace("2030-01-05T11:30", "2030-01-05T11:00")
            out = out.replace("2030-01-05T12:30", "2030-01-05T13:00")
            return copy_step(step, stdout=out)
        if step.number == 69:
            # The address fip-lease-2 holds cannot be deleted: the error of step 54.
            return copy_step(step, rc=1, stdout="", stderr=ref[54].stderr.replace(fip1, fip2))
        return step

    def check_created(self, rc, out, err, kind, name):
        if rc != 0 or err.strip():
            raise Mismatch("expected the %s to be created (exit 0, no stderr)" % kind)
        blocks = parse_stdout(out)
        if [b[0] for b in blocks] != ["text", "show"] or \
                blocks[0][1] != "Created a new %s:" % kind:
            raise Mismatch("expected 'Created a new %s:' and a table" % kind)
        fields = blocks[1][1]
        key = "hypervisor_hostname" if kind == "host" else "floating_ip_address"
        if fields.get(key) != name:
            raise Mismatch("%s is %r, expected %r" % (key, fields.get(key), name))
        # Delete it again so that the rest of the session sees what the reference saw.
        ident = fields["id"]
        rc2, out2, err2, _ = self.run(["%s-delete" % kind, ident])
        if rc2 != 0 or out2.strip() != "Deleted %s: %s" % (kind, ident):
            raise Mismatch("deleting it again failed: %r %r" % (out2, err2))

    def openstack_unset(self, step, args, label):
        # `openstack reservation host unset` cannot be loaded (OSC_UNSET_NOISE). Check that
        # this is still so (a fixed client would make this fail: then drop the workaround),
        # and make the change with `blazar host-unset`, the same command class.
        rc, out, err, _ = self.run(args)
        if rc == 0:
            self.result.fail(label, "  `openstack reservation host unset` works now: "
                             "remove the workaround in compat.py\n" + render(rc, out, err))
            return
        self.result.skip(label, "python-blazarclient 4.6.0 bug: the OSC entry point "
                         "reservation_host_unset names UnsetAttributeHost, which does not "
                         "exist; ran `blazar host-unset` instead")
        blazar = BlazarCli(os.path.dirname(os.path.dirname(self.cli.exe)))
        rc, out, err, _ = run_client(blazar, self.proxy.url, None, args)
        try:
            self.compare(step, rc, out, err)
        except Mismatch as e:
            self.report(label + " (via blazar)", step, rc, out, err, [], str(e))

    def extra_steps(self):
        """Commands the recording lacks: a host and a floating IP deleted for real, JSON
        lists, the rest of the leases deleted. Expected values follow from the session."""
        hosts_before = self.expect_ok(["host-list", "-f", "json"])
        names = sorted(h["hypervisor_hostname"] for h in hosts_before or [])
        if names != ["compute-1", "compute-2", "compute-3"]:
            self.result.fail("%s extra: host-list -f json" % self.cli.name,
                             "  expected hosts compute-1..3, got %s" % names)
        out = self.expect_ok(["host-create"] + nova_extras("compute-4") + ["compute-4"],
                             json_out=False)
        if out is not None:
            fields = parse_stdout(out)[1][1]
            want = {"hypervisor_hostname": "compute-4", "vcpus": "64", "memory_mb": "262144",
                    "local_gb": "2000", "reservable": "True", "hypervisor_type": "QEMU",
                    "availability_zone": "nova", "service_name": "compute-4"}
            bad = {k: fields.get(k) for k in want if fields.get(k) != want[k]}
            if bad:
                self.result.fail("%s extra: host-create compute-4" % self.cli.name,
                                 "  fields differ from %s: %s" % (want, bad))
        self.expect_ok(["host-delete", "compute-4"], json_out=False,
                       stdout="Deleted host: compute-4")
        leases = self.expect_ok(["lease-list", "-f", "json"]) or []
        for lease in leases:
            self.expect_ok(["lease-delete", lease["id"]], json_out=False,
                           stdout="Deleted lease: %s" % lease["id"])
        left = self.expect_ok(["lease-list", "-f", "json"])
        if left != []:
            self.result.fail("%s extra: lease-list after deleting all" % self.cli.name,
                             "  expected [], got %s" % left)
        fips = self.expect_ok(["floatingip-list", "-f", "json"]) or []
        # Step 69 deleted .201 unless fip-lease-2 held it (FIP_CHOICE).
        want = ["172.24.4.200"] + (["172.24.4.201"] if self.fip_swapped else [])
        if sorted(f.get("floating_ip_address") for f in fips) != want:
            self.result.fail("%s extra: floatingip-list -f json" % self.cli.name,
                             "  expected floating IPs %s, got %s" % (want, fips))
        for fip in fips:
            self.expect_ok(["floatingip-delete", fip["id"]], json_out=False,
                           stdout="Deleted floatingip: %s" % fip["id"])
        allocs = self.expect_ok(["allocation-list", "host", "-f", "json"])
        if allocs is not None and any(a["reservations"] for a in allocs):
            self.result.fail("%s extra: allocation-list host -f json" % self.cli.name,
                             "  expected no reservations left, got %s" % allocs)
        self.expect_ok(["host-delete", "compute-1"], json_out=False,
                       stdout="Deleted host: compute-1")

    def expect_ok(self, args, json_out=True, stdout=None):
        label = self.label("extra", args)
        rc, out, err, exchanges = self.run(args)
        problem = None
        value = out
        if rc != 0 or err.strip():
            problem = "expected exit 0 and no stderr"
        elif json_out:
            try:
                value = json.loads(out)
            except ValueError:
                problem = "expected JSON output"
        elif stdout is not None and out.strip() != stdout:
            problem = "expected stdout %r" % stdout
        if problem:
            self.report(label, "    exit 0%s" % (", stdout: %s" % stdout if stdout else ""),
                        rc, out, err, exchanges, problem)
            return None
        self.result.ok(label)
        return value

    def run_all(self):
        for step in self.steps:
            try:
                self.replay_step(step)
            except Exception:  # a broken step must not hide the others
                self.result.fail(self.label(step.number, step.argv),
                                 indent(traceback.format_exc()))
        if len(self.steps) == len(self.steps_all):  # they build on the whole session
            self.extra_steps()


# ---------------------------------------------------------------------------------------
# python-chi


CHI_SCRIPT = r'''
import datetime, json, os, sys, traceback

def report(name, ok, detail=""):
    print(json.dumps({"check": name, "ok": bool(ok), "detail": str(detail)}), flush=True)

def check(name, fn):
    try:
        value = fn()
        report(name, True, value if value is not None else "")
        return value
    except Exception:
        report(name, False, traceback.format_exc())
        return None

import chi
import chi.lease
from chi import context
from chi.clients import blazar

def lease_hosts(lease_id):
    """The names of the hosts a lease holds: Blazar's allocation API, as chi.hardware reads
    it (resource ids are host ids)."""
    client = blazar()
    names = {h["id"]: h["hypervisor_hostname"] for h in client.host.list()}
    held = set()
    for alloc in client.allocation.list("os-hosts"):
        if any(r["lease_id"] == lease_id for r in alloc["reservations"]):
            held.add(names[alloc["resource_id"]])
    return sorted(held)

def make_hosts():
    client = blazar()
    for n, node_type in ((1, "compute_skylake"), (2, "compute_skylake"), (3, "compute_haswell")):
        host = client.host.create("chi-node-%d" % n, node_type=node_type)
        assert host["hypervisor_hostname"] == "chi-node-%d" % n, host
    names = sorted(h["hypervisor_hostname"] for h in client.host.list())
    assert names == ["chi-node-1", "chi-node-2", "chi-node-3"], names
    return names

check("blazar().host.create x3, host.list", make_hosts)

# The current API: Lease objects.
lease = chi.lease.Lease("chi-lease", duration=datetime.timedelta(hours=2))
lease.add_node_reservation(amount=2, node_type="compute_skylake")

def submit():
    lease.submit(wait_for_active=True, wait_timeout=60)
    assert lease.id, "no lease id"
    assert lease.status == "ACTIVE", lease.status
    assert len(lease.node_reservations) == 1, lease.node_reservations
    res = lease.node_reservations[0]
    assert res["status"] == "active", res
    assert (res["min"], res["max"]) == (2, 2), res
    assert json.loads(res["resource_properties"]) == ["==", "$node_type", "compute_skylake"], res
    return "%s ACTIVE" % lease.id

check("Lease.add_node_reservation + submit(wait_for_active=True)", submit)

def hosts_of_lease():
    names = lease_hosts(lease.id)
    assert names == ["chi-node-1", "chi-node-2"], names
    return names

check("hosts of the lease (allocations)", hosts_of_lease)

def by_name():
    found = chi.lease.get_lease("chi-lease")
    assert found.id == lease.id and found.status == "ACTIVE", (found.id, found.status)
    listed = [l.name for l in chi.lease.list_leases()]
    assert listed == ["chi-lease"], listed
    return found.id

check("get_lease(name), list_leases()", by_name)

# The older helpers (deprecated in chi 1.0, still used by many notebooks). chi 1.2's
# get_lease returns a Lease object when context.version >= 1.0, which wait_for_active and
# get_node_reservation index like a dict: they only work with the pre-1.0 behaviour.
context.version = "0.17"
reservations = []
chi.lease.add_node_reservation(reservations, count=1, node_type="compute_haswell")

def create_old():
    start, end = chi.lease.lease_duration(days=0, hours=1)
    created = chi.lease.create_lease("chi-old-lease", reservations, start_date=start,
                                     end_date=end)
    assert created, "create_lease returned nothing (it logs the error)"
    assert created["status"] == "PENDING", created["status"]
    return "%s starts %s" % (created["id"], created["start_date"])

check("lease_duration + add_node_reservation + create_lease", create_old)

def wait_old():
    active = chi.lease.wait_for_active("chi-old-lease")
    assert active["status"] == "ACTIVE", active["status"]
    return active["id"]

old_id = check("wait_for_active (start one minute ahead)", wait_old)

def reservation_old():
    res_id = chi.lease.get_node_reservation("chi-old-lease", count=1,
                                            node_type="compute_haswell")
    lease = chi.lease.get_lease("chi-old-lease")
    assert [r["id"] for r in lease["reservations"]] == [res_id], (res_id, lease["reservations"])
    names = lease_hosts(lease["id"])
    assert names == ["chi-node-3"], names
    return "%s on %s" % (res_id, names)

check("get_node_reservation + hosts of the lease", reservation_old)

context.version = "1.1"

def delete_all():
    lease.delete()
    chi.lease.delete_lease("chi-old-lease")
    left = chi.lease.list_leases()
    assert left == [], left
    busy = [a for a in blazar().allocation.list("os-hosts") if a["reservations"]]
    assert busy == [], busy
    return "deleted"

check("Lease.delete + delete_lease", delete_all)
'''


def run_chi(venv, server, proxy, result, workdir):
    script = os.path.join(workdir, "chi_part.py")
    with open(script, "w") as f:
        f.write(CHI_SCRIPT)
    env = client_env()
    env.update(OS_AUTH_TYPE="none", OS_ENDPOINT_OVERRIDE=proxy.url + "/v1",
               HOME=workdir, MPLCONFIGDIR=workdir)
    mark = proxy.mark()
    p = subprocess.run([os.path.join(venv, "bin", "python"), script], env=env,
                       capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
                       cwd=workdir)
    checks = []
    for line in p.stdout.split("\n"):
        if line.startswith('{"check"'):
            checks.append(json.loads(line))
    for c in checks:
        label = "chi: %s" % c["check"]
        if c["ok"]:
            result.ok(label + ("  -> %s" % c["detail"] if c["detail"] else ""))
        else:
            result.fail(label, indent(c["detail"]) + "\n  HTTP exchanges of the chi part:\n"
                        + render_http(proxy.since(mark)[-8:]))
    if p.returncode != 0 or len(checks) < 8:
        result.fail("chi: script", "  exit %d, %d checks reported\n  stdout:\n%s\n  stderr:\n%s"
                    % (p.returncode, len(checks), indent(p.stdout[-4000:]),
                       indent(p.stderr[-4000:])))


# ---------------------------------------------------------------------------------------


def run_part(part, args, steps, all_steps, workdir):
    result = Result(part)
    t0 = time.monotonic()
    server = proxy = None
    try:
        server = Server(args.server, workdir, part, args.server_arg)
        proxy = Proxy(server.port)
        if part == "chi":
            run_chi(args.venv, server, proxy, result, workdir)
        else:
            cli = BlazarCli(args.venv) if part == "blazar" else OpenStackCli(args.venv)
            Replay(cli, server, proxy, steps, result, all_steps).run_all()
    except Exception:
        result.fail("%s: setup" % part, indent(traceback.format_exc()))
    finally:
        if proxy:
            proxy.stop()
        if server:
            server.stop()
    result.seconds = time.monotonic() - t0
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--venv", required=True, help="virtualenv with the clients")
    ap.add_argument("--server", required=True, help="the blazar-server binary")
    ap.add_argument("--reference", default=DEFAULT_REFERENCE,
                    help="client transcript recorded against the real Blazar")
    ap.add_argument("--parts", default="blazar,openstack,chi",
                    help="comma-separated: blazar, openstack, chi")
    ap.add_argument("--steps", default=None,
                    help="only these reference step numbers, e.g. 1-22 (debugging)")
    ap.add_argument("--workdir", default=None, help="keep databases and logs here")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="extra blazar-server argument (debugging)")
    args = ap.parse_args()

    steps = all_steps = parse_transcript(args.reference)
    if len(steps) != 72:
        sys.exit("expected 72 steps in %s, found %d" % (args.reference, len(steps)))
    if args.steps:
        lo, _, hi = args.steps.partition("-")
        steps = [s for s in steps if int(lo) <= s.number <= int(hi or lo)]
    workdir = args.workdir or tempfile.mkdtemp(prefix="client-compat-")
    os.makedirs(workdir, exist_ok=True)
    parts = [p for p in args.parts.split(",") if p]

    results, threads = {}, []
    for part in parts:
        # The parts use their own servers and run side by side: the clients mostly wait.
        t = threading.Thread(target=lambda p=part: results.__setitem__(
            p, run_part(p, args, steps, all_steps, os.path.join(workdir, p))))
        os.makedirs(os.path.join(workdir, part), exist_ok=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()

    passed = failed = 0
    for part in parts:
        r = results[part]
        print("== %s (%.0f s)" % (part, r.seconds))
        for line in r.lines:
            print("  " + line)
        passed += r.passed
        failed += r.failed
    for part in parts:
        for text in results[part].failures:
            print()
            print(text)
    print()
    if failed or args.workdir:
        print("logs and databases: %s" % workdir)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    print("client-compat: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

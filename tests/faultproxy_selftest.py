#!/usr/bin/env python3
"""Self-test of tests/faultproxy.py: its digests against the golden vectors, its
UnansweredCall protobuf, and every fault mode against a tiny fake daemon.

    python3 tests/faultproxy_selftest.py [path/to/golden-vectors.json]

Prints one line per failed check and cmocka-style summary lines
("[  PASSED  ] N test(s)." / "[  FAILED  ] N test(s)"); exits non-zero on any failure.
"""

import base64
import hashlib
import http.client
import http.server
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "lib"))
import faultproxy as fp  # noqa: E402
from checks import check, finish  # noqa: E402

SVC = "/plimsoll.v1.SandboxService/"


# ------------------------------------------------------------------------------------
# Digests and protobuf
# ------------------------------------------------------------------------------------

def find_vectors():
    """The golden vectors: the path given, else the repository's tests/vectors copy."""
    for path in sys.argv[1:] + [os.path.join(HERE, "vectors", "golden-vectors.json")]:
        if os.path.exists(path):
            return path
    return None


def unanswered_vector():
    """The version 3 record of the exchange vector "unanswered session call 3"
    (docs/records.md §7.2), or None when the vectors are missing."""
    path = find_vectors()
    if path is None:
        return None
    for v in json.load(open(path))["vectors"]:
        if v["name"] == "unanswered session call 3" and v["kind"] == "exchange":
            return v["input"]["unanswered"]
    return None


def test_vectors():
    path = find_vectors()
    check("golden vectors found", path is not None)
    if path is None:
        return
    vectors = json.load(open(path))["vectors"]
    n = 0
    for v in vectors:
        if v["kind"] == "record":
            d = fp.record_digest_input(v["input"]["record"])
        elif v["kind"] == "result":
            d = fp.result_digest_input(v["input"]["response"])
        else:
            continue
        n += 1
        check("digest " + v["name"], d.hexdigest() == v["expect"],
              "%s != %s" % (d.hexdigest(), v["expect"]))
        if "preimage_hex" in v:
            check("preimage " + v["name"], d.preimage().hex() == v["preimage_hex"])
    check("at least 10 record vectors", sum(v["kind"] == "record" for v in vectors) >= 10)
    check("vectors checked", n > 0)


def decode_proto(data):
    """A minimal protobuf decoder: {field: [values]} (varints as ints, bytes as bytes)."""
    out, i = {}, 0

    def varint():
        nonlocal i
        shift = n = 0
        while True:
            b = data[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return n
    while i < len(data):
        key = varint()
        field, wire = key >> 3, key & 7
        if wire == 0:
            out.setdefault(field, []).append(varint())
        elif wire == 2:
            n = varint()
            out.setdefault(field, []).append(data[i:i + n])
            i += n
        else:
            raise ValueError("unexpected wire type %d" % wire)
    return out


def b64_lenient(s):
    return base64.b64decode(s + "=" * (-len(s) % 4))


def record_from_detail(value):
    """The JSON-form RunRecord inside an UnansweredCall detail value."""
    outer = decode_proto(b64_lenient(value))
    inner = decode_proto(outer[1][0])
    rec = {}
    for number, name, wire in fp.RECORD_PROTO:
        if number in inner:
            v = inner[number][0]
            rec[name] = v if wire == "varint" else v.decode()
    for name in ("startedUnixMs", "endedUnixMs", "sequence"):
        if name in rec:
            rec[name] = str(rec[name])
    return rec


def test_protobuf():
    check("NotDispatched{REQUEST} = CAE",
          base64.b64encode(fp._varint(8) + fp._varint(1)).decode().rstrip("=") == "CAE")
    check("varint 300", fp._varint(300) == b"\xac\x02")
    check("negative int64 varint is 10 bytes", len(fp._varint(-1)) == 10)
    rec = unanswered_vector()
    check("unanswered session call 3 vector found", rec is not None)
    if rec is None:
        return
    value = fp.unanswered_detail(rec)
    check("detail has no padding", "=" not in value)
    back = record_from_detail(value)
    want = {k: v for k, v in rec.items() if v not in ("", 0)}
    check("UnansweredCall round trip", back == want, "%r" % back)
    check("unanswered session call 3 record digest",
          fp.record_digest(back) == rec["recordSha256"])
    raw = fp.encode_run_record(rec)
    check("field 1 first, varint 3", raw[:2] == b"\x08\x03")
    check("zero fields omitted", 3 not in decode_proto(raw))


# ------------------------------------------------------------------------------------
# A fake daemon
# ------------------------------------------------------------------------------------

class FakeDaemon(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # head and body are two writes (see faultproxy.py)
    counts = {}
    lock = threading.Lock()
    sequence = 0
    previous = ""

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        rpc = self.path.rsplit("/", 1)[-1]
        with self.lock:
            FakeDaemon.counts[rpc] = FakeDaemon.counts.get(rpc, 0) + 1
        req = json.loads(body or b"{}")
        ids = self.headers.get_all(fp.REQUEST_ID) or []
        rid = ids[0] if len(ids) == 1 and re.fullmatch(r"[0-9a-f]{32}", ids[0]) else None
        if req.get("minimumIsolation") == "vm":  # a refusal: nothing runs
            return self.answer(400, {"code": "failed_precondition", "message": "tier",
                                     "details": [{"type": "plimsoll.v1.NotDispatched",
                                                  "value": "CAU"}]}, rid)
        if rpc == "Describe":
            return self.answer(200, {"sandbox": "fake", "isolation": "container",
                                     "protocol": 3}, rid)
        run = {"sandbox": "fake", "isolation": "container", "durationMs": "5",
               "environment": "fake-image:sha256:" + "c" * 64}
        if rpc == "Run":
            run["javascript"] = {"stdout": base64.b64encode(b"42\n").decode()}
        else:
            run["cell"] = {"stdout": base64.b64encode(b"42\n").decode(),
                           "interpreterStarted": True}
        rec = {"version": 2, "requestSha256": hashlib.sha256(body).hexdigest(),
               "resultSha256": fp.result_digest(run), "provider": "fake",
               "isolation": "container", "environment": run["environment"],
               "startedUnixMs": "1790000000000", "endedUnixMs": "1790000000005"}
        if rpc == "SessionRun":
            with self.lock:
                FakeDaemon.sequence += 1
                rec.update(session=hashlib.sha256(b"sid").hexdigest(),
                           sequence=str(FakeDaemon.sequence))
                if FakeDaemon.previous:
                    rec["previousSha256"] = FakeDaemon.previous
                rec["recordSha256"] = fp.record_digest(rec)
                FakeDaemon.previous = rec["recordSha256"]
        else:
            rec["recordSha256"] = fp.record_digest(rec)
        run["record"] = rec
        self.answer(200, {"run": run} if rpc == "SessionRun" else run, rid)

    def answer(self, status, doc, rid):
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if rid:
            self.send_header(fp.REQUEST_ID, rid)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def start_daemon():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeDaemon)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def start_proxy(upstream, *extra):
    log = tempfile.NamedTemporaryFile(prefix="faultproxy-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "faultproxy.py"),
                             "--upstream", upstream, *extra],
                            stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline().strip()
    m = re.fullmatch(r"listening (https?)://127\.0\.0\.1:(\d+)", line)
    check("listening line", m is not None, repr(line))
    return proc, int(m.group(2)), log.name


# ------------------------------------------------------------------------------------
# Client helpers
# ------------------------------------------------------------------------------------

def new_id():
    return os.urandom(16).hex()


class Client:
    """One keep-alive connection, like libcurl's."""

    def __init__(self, port, tls=False):
        if tls:
            ctx = ssl._create_unverified_context()
            self.conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx)
        else:
            self.conn = http.client.HTTPConnection("127.0.0.1", port)
        self.port = port
        self.sockets = set()

    def call(self, rpc, body=None, rid=None, path=None):
        rid = rid or new_id()
        data = json.dumps(body if body is not None else {"protocol": 3}).encode()
        self.conn.request("POST", path or SVC + rpc, data,
                          {"Content-Type": "application/json",
                           "Connect-Protocol-Version": "1", fp.REQUEST_ID: rid})
        self.sockets.add(id(self.conn.sock))
        resp = self.conn.getresponse()
        return resp.status, resp.getheaders(), resp.read(), rid

    def control(self, path, doc=None, method="POST"):
        data = json.dumps(doc).encode() if doc is not None else None
        self.conn.request(method, path, data, {"Content-Type": "application/json"})
        resp = self.conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")

    def arm(self, **spec):
        status, doc = self.control("/_fault", spec)
        check("arm %s" % spec.get("mode"), status == 200 and doc == {}, "%s %r" % (status, doc))

    def stats(self):
        return self.control("/_fault/stats", method="GET")[1]

    def reset(self):
        return self.control("/_fault/reset")


def ids_of(headers):
    return [v for k, v in headers if k.lower() == fp.REQUEST_ID.lower()]


def raw_exchange(port, rpc, timeout=5.0):
    """A raw socket request; returns (socket, head bytes, Content-Length)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    body = b'{"protocol": 3, "javascript": {"code": "1"}}'
    s.sendall(b"POST " + (SVC + rpc).encode() + b" HTTP/1.1\r\nHost: x\r\n"
              b"Content-Type: application/json\r\nPlimsoll-Request-Id: " + new_id().encode() +
              b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    head = b""
    try:
        while b"\r\n\r\n" not in head:
            chunk = s.recv(1)
            if not chunk:
                break
            head += chunk
    except socket.timeout:
        pass
    except ConnectionResetError:
        return s, b"RST", None
    m = re.search(rb"Content-Length: (\d+)", head, re.I)
    return s, head, int(m.group(1)) if m else None


def read_until_close(s, limit=None):
    # A bytearray grows in place: bytes += would copy the whole answer at every chunk,
    # 9 GB and 40 s of CPU for huge_body's 33 MiB.
    got = bytearray()
    how = None
    try:
        while how is None:
            chunk = s.recv(1 << 16)
            if not chunk:
                how = "eof"
            got += chunk
            if limit is not None and len(got) >= limit:
                how = "limit"
    except socket.timeout:
        how = "timeout"
    except ConnectionResetError:
        how = "reset"
    return bytes(got), how


# ------------------------------------------------------------------------------------
# Mode tests
# ------------------------------------------------------------------------------------

def test_modes(port, logpath):
    c = Client(port)
    js = {"protocol": 3, "javascript": {"code": "console.log(6*7)"}}
    cell = {"protocol": 3, "sessionId": "sid", "cell": {"language": "python", "code": "x"}}

    # pass, stats, reset
    c.reset()
    before = FakeDaemon.counts.get("Run", 0)
    status, headers, body, rid = c.call("Run", js)
    doc = json.loads(body)
    check("pass status", status == 200)
    check("pass echo", ids_of(headers) == [rid])
    check("pass reached the daemon", FakeDaemon.counts.get("Run", 0) == before + 1)
    check("pass record intact", fp.record_digest(doc["record"]) == doc["record"]["recordSha256"])
    st = c.stats()
    check("stats forwarded Run 1", st["forwarded"]["Run"] == 1, st)
    check("stats lists every RPC", set(fp.RPCS) <= set(st["forwarded"]), st)
    check("stats answered 1", st["answered"] == 1, st)
    c.call("Describe", {})
    check("stats forwarded Describe 1", c.stats()["forwarded"]["Describe"] == 1)
    c.reset()
    st = c.stats()
    check("reset clears counters", st["forwarded"]["Run"] == 0 and st["answered"] == 0, st)
    status, doc = c.control("/_fault", {"mode": "nonsense"})
    check("unknown mode refused", status == 400)

    # skip / count / rpc matching
    c.arm(mode="status", rpc="Run", count=1, skip=1)
    results = [c.call("Run", js)[0] for _ in range(3)]
    check("skip 1 count 1", results == [200, 503, 200], results)
    check("other rpc unaffected", c.call("Describe", {})[0] == 200)
    st = c.stats()
    check("status not forwarded", st["forwarded"]["Run"] == 2, st)
    c.reset()

    # answer rewrites
    def rewritten(mode, rpc="Run", body=js, **extra):
        c.reset()
        c.arm(mode=mode, rpc=rpc, count=1, **extra)
        status, headers, data, rid = c.call(rpc, body)
        check(mode + " forwarded", c.stats()["forwarded"][rpc] == 1)
        check(mode + " echo kept", ids_of(headers) == [rid])
        doc = json.loads(data)
        return doc.get("run", doc) if rpc == "SessionRun" else doc

    run = rewritten("corrupt_record_digest")
    rec = run["record"]
    check("corrupt_record_digest", fp.record_digest(rec) != rec["recordSha256"] and
          sum(a != b for a, b in zip(fp.record_digest(rec), rec["recordSha256"])) == 1)
    run = rewritten("corrupt_record_digest", "SessionRun", cell)
    check("corrupt_record_digest on run.record",
          fp.record_digest(run["record"]) != run["record"]["recordSha256"])
    run = rewritten("corrupt_result_digest")
    check("corrupt_result_digest", fp.result_digest(run) != run["record"]["resultSha256"])
    run = rewritten("change_stdout")
    check("change_stdout 42 -> 32", base64.b64decode(run["javascript"]["stdout"]) == b"32\n")
    check("change_stdout keeps record", fp.record_digest(run["record"]) == run["record"]["recordSha256"]
          and fp.result_digest(run) != run["record"]["resultSha256"])
    run = rewritten("change_stdout", "SessionRun", cell)
    check("change_stdout on a cell", base64.b64decode(run["cell"]["stdout"]) == b"32\n")
    run = rewritten("drop_record")
    check("drop_record", "record" not in run and "javascript" in run)
    run = rewritten("lower_tier")
    rec = run["record"]
    check("lower_tier", run["isolation"] == "process" == rec["isolation"] and
          fp.record_digest(rec) == rec["recordSha256"] and
          fp.result_digest(run) == rec["resultSha256"])
    run = rewritten("lower_tier", value="none")
    check("lower_tier value", run["isolation"] == "none" == run["record"]["isolation"])
    run = rewritten("lower_tier_raw")
    rec = run["record"]
    check("lower_tier_raw", run["isolation"] == "process" == rec["isolation"] and
          fp.record_digest(rec) != rec["recordSha256"])
    run = rewritten("inject_session_fields")
    rec = run["record"]
    check("inject_session_fields", re.fullmatch("[0-9a-f]{64}", rec["session"]) and
          rec["sequence"] == "1" and fp.record_digest(rec) == rec["recordSha256"])
    run = rewritten("two_results")
    check("two_results", "javascript" in run and "project" in run and
          fp.result_digest(run) == run["record"]["resultSha256"])
    run = rewritten("two_results", "SessionRun", cell)
    check("two_results on a cell keeps the digest", "cell" in run and "module" in run and
          fp.result_digest(run) == run["record"]["resultSha256"])
    run = rewritten("wrong_kind")
    check("wrong_kind", "javascript" not in run and
          base64.b64decode(run["project"]["steps"][0]["stdout"]) == b"42\n")
    run = rewritten("wrong_kind", recompute=True)
    rec = run["record"]
    check("wrong_kind recompute", fp.result_digest(run) == rec["resultSha256"] and
          fp.record_digest(rec) == rec["recordSha256"])
    run = rewritten("break_chain", "SessionRun", cell)
    rec = run["record"]
    check("break_chain", rec["sequence"] == "5" and fp.record_digest(rec) == rec["recordSha256"])
    run = rewritten("break_chain", "SessionRun", cell, value=9)
    check("break_chain value", run["record"]["sequence"] == "9")
    run = rewritten("malformed_answer")
    check("malformed_answer", run["record"]["startedUnixMs"] == {})
    run = rewritten("patch", value={"sandbox": "other", "record.provider": "other"}, recompute=True)
    check("patch", run["sandbox"] == "other" and
          fp.record_digest(run["record"]) == run["record"]["recordSha256"])

    # request-ID tampering
    c.reset()
    c.arm(mode="drop_request_id", count=1)
    _, headers, _, _ = c.call("Run", js)
    check("drop_request_id", ids_of(headers) == [])
    c.arm(mode="change_request_id", count=1)
    _, headers, _, rid = c.call("Run", js)
    got = ids_of(headers)
    check("change_request_id", len(got) == 1 and got[0] != rid and re.fullmatch("[0-9a-f]{32}", got[0]))
    c.arm(mode="double_request_id", count=1)
    _, headers, _, rid = c.call("Run", js)
    check("double_request_id", ids_of(headers) == [rid, rid], ids_of(headers))
    c.arm(mode="double_request_id", count=1, value="joined")
    _, headers, _, rid = c.call("Run", js)
    check("double_request_id joined", ids_of(headers) == [rid + ", " + rid])

    # replay: a success, then a refusal
    c.reset()
    c.arm(mode="replay", rpc="Run")
    before = FakeDaemon.counts.get("Run", 0)
    s1, h1, b1, rid1 = c.call("Run", js)
    s2, h2, b2, rid2 = c.call("Run", js)
    check("replay first relayed", s1 == 200 and ids_of(h1) == [rid1])
    check("replay second = first", s2 == 200 and b2 == b1 and ids_of(h2) == [rid1])
    check("replay really ran both", FakeDaemon.counts.get("Run", 0) == before + 2)
    check("replay stats", c.stats()["forwarded"]["Run"] == 2)
    c.reset()
    c.arm(mode="replay", rpc="Run")
    s1, h1, b1, rid1 = c.call("Run", dict(js, minimumIsolation="vm"))
    s2, h2, b2, rid2 = c.call("Run", js)
    check("replayed refusal", s1 == s2 == 400 and b1 == b2 and ids_of(h2) == [rid1])

    # crafted answers
    c.reset()
    c.arm(mode="status", count=1)
    status, headers, body, _ = c.call("Run", js)
    check("status 503", status == 503 and body == b"" and ids_of(headers) == [])
    c.arm(mode="status", count=1, value=502, echo=True)
    status, headers, body, rid = c.call("Run", js)
    check("status 502 echo", status == 502 and ids_of(headers) == [rid])
    c.arm(mode="status_bound_error", count=1, value=429,
          body={"code": "resource_exhausted", "message": "busy"})
    status, headers, body, rid = c.call("Run", js)
    check("status_bound_error", status == 429 and ids_of(headers) == [rid] and
          json.loads(body) == {"code": "resource_exhausted", "message": "busy"})
    check("crafted answers not forwarded", c.stats()["forwarded"]["Run"] == 0)
    c.arm(mode="status_bound_error", count=1, forward=True)
    status, _, body, _ = c.call("Run", js)
    check("status_bound_error forward", status == 503 and c.stats()["forwarded"]["Run"] == 1)
    c.arm(mode="not_dispatched_header", count=1, value="unsupported")
    status, headers, body, rid = c.call("Describe", {})
    check("not_dispatched_header", status == 400 and ids_of(headers) == [rid] and
          dict((k.lower(), v) for k, v in headers).get("plimsoll-not-dispatched") == "unsupported"
          and json.loads(body)["code"] == "invalid_argument")
    c.arm(mode="redirect", count=1)
    status, headers, body, rid = c.call("Run", js)
    loc = dict((k.lower(), v) for k, v in headers).get("location", "")
    check("redirect", status == 307 and loc.endswith(SVC + "Run") and "127.0.0.1" in loc)
    c.reset()
    c.arm(mode="malformed_json", count=1)
    status, headers, body, rid = c.call("Run", js)
    check("malformed_json", status == 200 and body == b'{"sandbox": "echo",' and
          ids_of(headers) == [rid] and c.stats()["forwarded"]["Run"] == 1)
    c.arm(mode="not_object", count=1)
    status, headers, body, rid = c.call("Run", js)
    check("not_object", status == 200 and body == b"[1]" and ids_of(headers) == [rid])
    check("crafted answers keep the connection", len(c.sockets) == 1, c.sockets)

    # unanswered
    for value, field, want in ((None, None, None), ("weaker", "isolation", "process"),
                               ("liar", "provider", "other")):
        c.reset()
        c.arm(mode="unanswered", rpc="SessionRun", count=1, value=value)
        before = FakeDaemon.counts.get("SessionRun", 0)
        seq_before = FakeDaemon.sequence
        status, headers, body, rid = c.call("SessionRun", cell)
        doc = json.loads(body)
        name = "unanswered " + (value or "plain")
        check(name + " ran", FakeDaemon.counts.get("SessionRun", 0) == before + 1)
        check(name + " answer", status == 500 and ids_of(headers) == [rid] and
              doc["code"] == "unknown" and doc["message"] == "relay lost" and
              doc["details"][0]["type"] == "plimsoll.v1.UnansweredCall", doc)
        rec = record_from_detail(doc["details"][0]["value"])
        check(name + " v3", rec.get("version") == 3 and rec.get("unanswered") == "unknown" and
              "resultSha256" not in rec and rec.get("sequence") == str(seq_before + 1), rec)
        check(name + " digest", fp.record_digest(rec) == rec["recordSha256"])
        if field:
            check(name + " " + field, rec[field] == want)
        else:
            check(name + " provider kept", rec["provider"] == "fake" and
                  rec["isolation"] == "container" and rec["environment"].startswith("fake-image"))

    # keep-alive survived everything above
    check("one client connection throughout", len(c.sockets) == 1, c.sockets)

    # transport faults (raw sockets)
    c.reset()
    c.arm(mode="cut_body", count=1)
    s, head, length = raw_exchange(port, "Run")
    got, how = read_until_close(s)
    s.close()
    check("cut_body", head.startswith(b"HTTP/1.1 200") and length and
          len(got) == length // 2 and how == "eof", (head, len(got), length, how))
    check("cut_body forwarded", c.stats()["forwarded"]["Run"] == 1)

    # the answer cut at every other part: status line, headers, 0 body bytes, 1 short,
    # chunked without its last chunk.  Each is forwarded first (the call ran).
    c.reset()
    c.arm(mode="cut_status_line", count=1)
    s, head, length = raw_exchange(port, "Run")
    got, how = read_until_close(s)
    s.close()
    check("cut_status_line", head == b"HTTP/1." and got == b"" and length is None,
          (head, got))
    st = c.stats()
    check("cut_status_line forwarded, not answered",
          st["forwarded"]["Run"] == 1 and st["answered"] == 0, st)

    c.reset()
    c.arm(mode="cut_headers", count=1)
    s, head, length = raw_exchange(port, "Run")
    got, how = read_until_close(s)
    s.close()
    status_line, _, rest = head.partition(b"\r\n")
    check("cut_headers", status_line == b"HTTP/1.1 200 OK" and rest and
          b"\r\n\r\n" not in head and got == b"", (head, got))
    check("cut_headers forwarded", c.stats()["forwarded"]["Run"] == 1)

    c.reset()
    c.arm(mode="cut_after_headers", count=1)
    s, head, length = raw_exchange(port, "Run")
    got, how = read_until_close(s)
    s.close()
    check("cut_after_headers", head.startswith(b"HTTP/1.1 200") and head.endswith(b"\r\n\r\n")
          and length and length > 0 and got == b"" and how == "eof", (head, length, got, how))
    check("cut_after_headers echo", re.search(rb"Plimsoll-Request-Id: [0-9a-f]{32}\r\n", head))
    st = c.stats()
    check("cut_after_headers forwarded, answered",
          st["forwarded"]["Run"] == 1 and st["answered"] == 1, st)

    c.reset()
    c.arm(mode="cut_last_byte", count=1)
    s, head, length = raw_exchange(port, "Run")
    got, how = read_until_close(s)
    s.close()
    check("cut_last_byte", length and len(got) == length - 1 and how == "eof" and
          "javascript" in json.loads(got + b"}"), (length, got[-20:], how))
    check("cut_last_byte forwarded", c.stats()["forwarded"]["Run"] == 1)

    c.reset()
    c.arm(mode="cut_chunked", count=1)
    s, head, length = raw_exchange(port, "Run")
    got, how = read_until_close(s)
    s.close()
    size, _, chunk = got.partition(b"\r\n")
    check("cut_chunked framing", length is None and
          re.search(rb"\r\nTransfer-Encoding: chunked\r\n", head) is not None, head)
    check("cut_chunked one whole chunk, no last chunk", how == "eof" and
          int(size, 16) == len(chunk) - 2 and chunk.endswith(b"\r\n") and
          "javascript" in json.loads(chunk[:-2]) and not got.endswith(b"0\r\n\r\n"),
          (got[:20], got[-20:], how))
    check("cut_chunked forwarded", c.stats()["forwarded"]["Run"] == 1)
    c.arm(mode="cut_chunked", count=1)  # an HTTP client sees the answer incomplete
    try:
        cc = Client(port)
        cc.call("Run", js)
        check("cut_chunked is incomplete to http.client", False, "read it whole")
    except http.client.IncompleteRead:
        check("cut_chunked is incomplete to http.client", True)
    cc.conn.close()
    # (not cut_headers: http.client takes an EOF in the header block as its end)
    for mode in ("cut_status_line", "cut_after_headers", "cut_last_byte"):
        c.arm(mode=mode, count=1)
        try:
            cc = Client(port)
            cc.call("Run", js)
            check(mode + " fails an HTTP client", False, "read it whole")
        except (http.client.HTTPException, ConnectionError):
            check(mode + " fails an HTTP client", True)
        cc.conn.close()
    status, _, _, _ = c.call("Run", js)
    check("cuts apply to count requests only", status == 200)

    c.arm(mode="stall_body", count=1)
    s, head, length = raw_exchange(port, "Run", timeout=0.5)
    got, how = read_until_close(s)
    s.close()
    check("stall_body", len(got) == length // 2 and how == "timeout", (len(got), length, how))

    c.reset()
    c.arm(mode="reset", count=1)
    s, head, length = raw_exchange(port, "Run")
    s.close()
    check("reset gives RST", head == b"RST", head)
    check("reset forwarded", c.stats()["forwarded"]["Run"] == 1)

    c.reset()
    c.arm(mode="stall_headers", count=1)
    s, head, length = raw_exchange(port, "Run", timeout=0.5)
    check("stall_headers", head == b"")
    s.close()
    check("stall_headers not forwarded", c.stats()["forwarded"]["Run"] == 0)

    c.arm(mode="delay", count=1, ms=400)
    t0 = time.monotonic()
    status, headers, body, rid = c.call("Run", js)
    took = time.monotonic() - t0
    check("delay answers late", status == 200 and ids_of(headers) == [rid] and took >= 0.38, took)
    c.arm(mode="delay", count=1, ms=30000)
    s, head, length = raw_exchange(port, "Run", timeout=0.3)
    s.close()
    deadline = time.monotonic() + 3
    seen = False
    while time.monotonic() < deadline and not seen:
        time.sleep(0.05)
        seen = "delay: ended early" in open(logpath).read()
    check("delay ends when the client leaves", seen)

    c.arm(mode="huge_body", count=1)
    s, head, length = raw_exchange(port, "Run", timeout=10)
    check("huge_body length", length == 33 * 1024 * 1024 + 2, length)
    check("huge_body echo", re.search(rb"Plimsoll-Request-Id: [0-9a-f]{32}", head) is not None)
    got, how = read_until_close(s, limit=length)
    s.close()
    check("huge_body streamed", len(got) == length and got.endswith(b" {}"), (len(got), how))

    # client framing: a chunked request body and Expect: 100-continue
    c.reset()
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    body = json.dumps(js).encode()
    s.sendall(b"POST " + (SVC + "Run").encode() + b" HTTP/1.1\r\nHost: x\r\n"
              b"Transfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n")
    interim = s.recv(64)
    s.sendall(b"%x\r\n" % 5 + body[:5] + b"\r\n" + b"%x\r\n" % (len(body) - 5) + body[5:] +
              b"\r\n0\r\n\r\n")
    resp = http.client.HTTPResponse(s)
    resp.begin()
    data = resp.read()
    s.close()
    check("100-continue", interim.startswith(b"HTTP/1.1 100"), interim)
    check("chunked request forwarded", resp.status == 200 and "javascript" in json.loads(data))

    # libcurl: one connection reused across requests
    if shutil.which("curl"):
        url = "http://127.0.0.1:%d%sDescribe" % (port, SVC)
        p = subprocess.run(["curl", "-sv", "-H", "Content-Type: application/json",
                            "-d", "{}", url, "--next", "-H", "Content-Type: application/json",
                            "-d", "{}", url], capture_output=True, text=True, timeout=20)
        check("curl reuses the connection", p.returncode == 0 and "Re-using" in p.stderr,
              p.stderr[-500:])
    c.conn.close()


def test_tls(upstream):
    if not shutil.which("openssl"):
        print("skip TLS: no openssl")
        return
    tmp = tempfile.mkdtemp(prefix="faultproxy-tls-")
    cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-keyout", key, "-out", cert],
                   check=True, capture_output=True)
    proc, port, _ = start_proxy(upstream, "--tls-cert", cert, "--tls-key", key, "--quiet")
    try:
        c = Client(port, tls=True)
        status, headers, body, rid = c.call("Run", {"protocol": 3, "javascript": {"code": "1"}})
        check("tls pass", status == 200 and ids_of(headers) == [rid])
        c.arm(mode="change_stdout", count=1)
        status, _, body, _ = c.call("Run", {"protocol": 3, "javascript": {"code": "1"}})
        check("tls rewrite", base64.b64decode(json.loads(body)["javascript"]["stdout"]) == b"32\n")
        check("tls keep-alive", len(c.sockets) == 1)
        c.arm(mode="reset", count=1)
        try:
            c.call("Run", {"protocol": 3, "javascript": {"code": "1"}})
            check("tls reset", False, "got an answer")
        except (ConnectionError, http.client.HTTPException, ssl.SSLError):
            check("tls reset", True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=5)
        shutil.rmtree(tmp)


def test_sigterm(port, proc):
    c = Client(port)
    c.arm(mode="stall_headers")
    s, _, _ = raw_exchange(port, "Run", timeout=0.3)  # a connection held open (no head comes)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = None
    took = time.monotonic() - t0
    s.close()
    check("SIGTERM exits promptly", rc == 0 and took < 2.0, (rc, took))


def main():
    test_vectors()
    test_protobuf()
    daemon = start_daemon()
    upstream = "http://127.0.0.1:%d" % daemon.server_address[1]
    proc, port, logpath = start_proxy(upstream)
    try:
        test_modes(port, logpath)
        test_tls(upstream)
        test_sigterm(port, proc)
    finally:
        if proc.poll() is None:
            proc.kill()
        text = open(logpath).read()
        check("no traceback in the proxy's log", "Traceback" not in text, text[-3000:])
        if os.environ.get("FAULTPROXY_KEEP_LOG"):
            print("proxy log: " + logpath)
        else:
            os.unlink(logpath)
        daemon.shutdown()
    return finish()


if __name__ == "__main__":
    sys.exit(main())

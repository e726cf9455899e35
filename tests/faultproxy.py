#!/usr/bin/env python3
"""faultproxy: a loopback HTTP proxy that injects faults between a plimsoll client and
a daemon, for Berth's fault-injection tests.

    python3 tests/faultproxy.py --upstream http://127.0.0.1:PORT \
        [--listen 127.0.0.1:0] [--tls-cert CERT --tls-key KEY] [--quiet]

It prints exactly one line, "listening http://HOST:PORT" ("https" with TLS), then
serves until SIGTERM or SIGINT.  Every request is forwarded to the upstream (method,
path, body and every header except the hop-by-hop ones) and its answer relayed,
unless an armed fault applies.  Standard library only; it never imports project code:
every forged answer, record digest and protobuf detail is built here, because the
client's verification is what is under test.

Control endpoints (never forwarded, never counted):

    POST /_fault        {"mode": "...", "rpc": "Run" | null, "count": N | null,
                         "skip": N, "ms": N, "value": ..., plus per-mode options}
                        arms one fault (replacing any earlier one): after `skip`
                        matching requests, the next `count` (null = all following)
                        requests whose path ends in "/<rpc>" (null = any path) get
                        the fault.  Answers 200 {}.
    POST /_fault/reset  clears the fault, the counters and the replay memory.
    GET  /_fault/stats  {"forwarded": {"Describe": n, "Run": n, ...}, "answered": n,
                         "received": n, "faulted": n}
                        forwarded = requests actually sent upstream, per RPC (the last
                        path segment); answered = requests the proxy wrote an answer
                        status line for; received = proxied requests seen; faulted =
                        requests a fault was applied to.

Per-mode options in the control JSON: "echo" (bool), "forward" (bool), "body"
(object), "recompute" (bool), "code" (Connect code).  "Forward" below means the
upstream really receives and runs the request first; "echo" means the answer carries
the request's Plimsoll-Request-Id back (when the request had exactly one valid ID).

Modes:
  pass                   forward and relay unchanged.
  Answer rewrites (forward; the RunResponse is the body, or body.run for SessionRun;
  an answer that is not a 2xx JSON object with the needed part is relayed unchanged):
  corrupt_record_digest  flip one hex digit of record.recordSha256.
  corrupt_result_digest  flip one hex digit of record.resultSha256.
  change_stdout          change the first byte of the result's stdout (javascript,
                         cell, module, or a project's first step); "value": a string
                         replaces the whole stdout.  The record is kept as is.
  drop_record            remove the record.
  lower_tier             set response and record isolation to value (default
                         "process") and recompute record.recordSha256.
  lower_tier_raw         the same without the recompute.
  inject_session_fields  record.session = value or a fixed 64-hex string, sequence
                         "1", recompute recordSha256 (for a single Run).
  two_results            add a second result kind beside the existing one: value, or
                         "project" beside javascript, "module" otherwise (a kind of
                         lower precedence leaves the result digest valid).
  wrong_kind             rename the result to value, or javascript->project,
                         project->javascript, cell->javascript, module->project, with
                         an equivalent shape.
                         Both: "recompute": true recomputes resultSha256 and
                         recordSha256 so only the kind checks can catch it.
  break_chain            record.sequence = value or "5", recompute recordSha256.
  malformed_answer       record.startedUnixMs = {}.
  patch                  value {"dotted.path": json, ...} set on the answer body
                         (e.g. {"session": "00..."} on OpenSession, {"calls": "9"} on
                         CloseSession); "recompute": true recomputes the record digest.
  Request-ID tampering (forward):
  drop_request_id        omit the Plimsoll-Request-Id answer header.
  change_request_id      replace it with value or another random 32-hex ID.
  double_request_id      send it twice (two header lines, original + original);
                         "value": "joined" sends one line "id, id" instead.
  replay                 forward (so it really runs), but answer with the first
                         upstream answer relayed for that RPC since the last reset,
                         headers (and its request ID) included.
  unanswered             SessionRun: forward, then answer 500 {"code": "unknown",
                         "message": "relay lost", "details": [UnansweredCall]} with the
                         v3 record derived from the real record; value "weaker" sets
                         isolation "process", "liar" sets provider "other" (digest
                         recomputed in both); "code" overrides "unknown" (and the
                         status follows Connect's mapping).
  Transport faults:
  cut_body               forward; headers with the full Content-Length, half the body,
                         then close.
  cut_status_line        forward; the first half of the status line ("HTTP/1."), no
                         line end, then close (not counted as answered).
  cut_headers            forward; the status line and part of the header block (cut
                         inside a header line, before the blank line), then close.
  cut_after_headers      forward; the complete headers with the full Content-Length,
                         not one body byte, then close (an empty body is thus whole).
  cut_last_byte          forward; headers with the full Content-Length and the body but
                         its last byte, then close.
  cut_chunked            forward; headers with Transfer-Encoding: chunked (no
                         Content-Length), the whole body as one chunk, then close
                         without the last (zero-size) chunk: every body byte arrived,
                         the answer is still incomplete.  (sandboxd itself always
                         frames with Content-Length; a proxy in between may not.)
  stall_body             forward; headers and half the body, then hold the socket until
                         the client closes.
  reset                  forward; then close the client connection with an RST
                         (SO_LINGER 0), no answer.
  delay                  forward; wait `ms` (ends early if the client disconnects or
                         the proxy stops), then relay the answer.
  stall_headers          never answer; hold the socket until the client closes (not
                         forwarded unless "forward": true).
  huge_body              200, echo, 33 MiB of spaces then "{}", streamed.
  Crafted answers (not forwarded unless "forward": true; the upstream answer is then
  discarded):
  status                 HTTP value (default 503), empty body, no echo unless "echo".
  status_bound_error     HTTP value (default 503), "echo": false drops the id echo,
                         "headers": {name: value} adds headers (also on status), body "body" (default
                         {"code": "unavailable", "message": "injected"}), echo.
  not_dispatched_header  400 {"code": "invalid_argument", "message": "x"},
                         Plimsoll-Not-Dispatched: value (default "request"), echo.
  redirect               307, Location = the upstream URL of the same path, echo
                         unless "echo": false.
  malformed_json         (forwarded by default) 200, echo, body '{"sandbox": "echo",'.
  not_object             200, echo, body "[1]".
"""

import argparse
import base64
import hashlib
import http.client
import http.server
import json
import os
import re
import select
import signal
import socket
import ssl
import struct
import sys
import threading
import time
import urllib.parse

REQUEST_ID = "Plimsoll-Request-Id"
NOT_DISPATCHED = "Plimsoll-Not-Dispatched"
RPCS = ("Describe", "Run", "OpenSession", "SessionRun", "CloseSession")
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
              "proxy-connection", "te", "trailer", "trailers", "transfer-encoding",
              "upgrade", "expect", "content-length"}
ID_RE = re.compile(r"[0-9a-f]{32}\Z")
HEX = "0123456789abcdef"
HUGE_BODY_SPACES = 33 * 1024 * 1024
CONNECT_STATUS = {"canceled": 499, "unknown": 500, "invalid_argument": 400,
                  "deadline_exceeded": 504, "not_found": 404, "already_exists": 409,
                  "permission_denied": 403, "resource_exhausted": 429,
                  "failed_precondition": 400, "aborted": 409, "out_of_range": 400,
                  "unimplemented": 501, "internal": 500, "unavailable": 503,
                  "data_loss": 500, "unauthenticated": 401}

STOP = threading.Event()  # set on SIGTERM: every wait ends
QUIET = False


def log(msg):
    if not QUIET:
        print("faultproxy: " + msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# Digests (docs/records.md §2, §4, §5)
# --------------------------------------------------------------------------------------

def _value(data):
    if isinstance(data, str):
        data = data.encode("utf-8")  # a lone surrogate raises: such a string has no encoding
    return struct.pack(">Q", len(data)) + data


def _get(msg, camel, default=None):
    """A JSON field by its lowerCamelCase name or its snake_case name; null = absent."""
    if not isinstance(msg, dict):
        return default
    for key in (camel, re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), camel)):
        if msg.get(key) is not None:
            return msg[key]
    return default


def _int(v):
    if v is None or v == "":
        return 0
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ValueError("not an integer: %r" % (v,))
    return int(v)


def _bool(v):
    return "true" if v is True else "false"


def _bytes(v):
    if not v:
        return b""
    s = v.replace("-", "+").replace("_", "/")
    return base64.b64decode(s + "=" * (-len(s) % 4), validate=True)


def _doubles(values):
    out = b""
    for v in values if isinstance(values, list) else [values]:
        if isinstance(v, str):
            v = {"NaN": "nan", "Infinity": "inf", "-Infinity": "-inf"}.get(v, v)
        out += struct.pack(">d", float(v))
    return out


class _Digest:
    """Builds one digest input: the domain, then (name, content) fields."""

    def __init__(self, domain):
        self.parts = [_value(domain)]

    def field(self, name, content):
        if isinstance(content, int) and not isinstance(content, bool):
            content = str(content)
        self.parts += [_value(name), _value(content)]

    def hexdigest(self):
        return hashlib.sha256(b"".join(self.parts)).hexdigest()

    def preimage(self):
        return b"".join(self.parts)


def record_digest_input(rec):
    """The record digest input (docs/records.md §5) of a JSON-form RunRecord."""
    version = _int(_get(rec, "version", 0))
    if version not in (1, 2, 3):
        raise ValueError("record version %d has no encoding" % version)
    d = _Digest("plimsoll.run-record.v%d" % version)
    d.field("request_sha256", _get(rec, "requestSha256", ""))
    d.field("result_sha256", _get(rec, "resultSha256", ""))
    if version == 3:
        d.field("unanswered", _get(rec, "unanswered", ""))
    for name in ("provider", "isolation", "environment", "policy"):
        d.field(name, _get(rec, name, ""))
    if version >= 2:
        d.field("software_identity", _get(rec, "softwareIdentity", ""))
        d.field("software_rule_id", _get(rec, "softwareRuleId", ""))
    d.field("started_unix_ms", _int(_get(rec, "startedUnixMs")))
    d.field("ended_unix_ms", _int(_get(rec, "endedUnixMs")))
    d.field("session", _get(rec, "session", ""))
    d.field("sequence", _int(_get(rec, "sequence")))
    d.field("previous_sha256", _get(rec, "previousSha256", ""))
    return d


def record_digest(rec):
    return record_digest_input(rec).hexdigest()


PROJECT_OUTCOMES = {"PROJECT_OUTCOME_UNSPECIFIED": 0, "PROJECT_OUTCOME_COMPLETED": 1,
                    "PROJECT_OUTCOME_SETUP_FAILED": 2, "PROJECT_OUTCOME_TIMED_OUT": 3,
                    "PROJECT_OUTCOME_PROTOCOL_ERROR": 4}
RESULT_KINDS = ("javascript", "project", "cell", "module")  # digest precedence order


def _outcome(v):
    return PROJECT_OUTCOMES[v] if isinstance(v, str) and v in PROJECT_OUTCOMES else _int(v)


def result_digest_input(resp):
    """The result digest input (docs/records.md §4) of a JSON-form RunResponse."""
    d = _Digest("plimsoll.run-result.v1")
    kind = next((k for k in RESULT_KINDS if isinstance(resp.get(k), dict)), "")
    d.field("kind", kind)
    r = resp.get(kind) or {}
    if kind in ("javascript", "cell"):
        d.field("exit_code", _int(_get(r, "exitCode")))
        d.field("timed_out", _bool(_get(r, "timedOut")))
        d.field("stdout", _bytes(_get(r, "stdout")))
        d.field("stderr", _bytes(_get(r, "stderr")))
        d.field("stdout_truncated", _bool(_get(r, "stdoutTruncated")))
        d.field("stderr_truncated", _bool(_get(r, "stderrTruncated")))
        if kind == "cell":
            d.field("interpreter_started", _bool(_get(r, "interpreterStarted")))
            d.field("interpreter_ended", _bool(_get(r, "interpreterEnded")))
    elif kind == "project":
        d.field("outcome", _outcome(_get(r, "outcome")))
        d.field("outcome_detail", _get(r, "outcomeDetail", ""))
        d.field("artifacts_truncated", _bool(_get(r, "artifactsTruncated")))
        steps = _get(r, "steps", [])
        d.field("steps", len(steps))
        for s in steps:
            d.field("step_command", _get(s, "command", ""))
            d.field("step_exit_code", _int(_get(s, "exitCode")))
            d.field("step_timed_out", _bool(_get(s, "timedOut")))
            d.field("step_stdout", _bytes(_get(s, "stdout")))
            d.field("step_stderr", _bytes(_get(s, "stderr")))
            d.field("step_stdout_truncated", _bool(_get(s, "stdoutTruncated")))
            d.field("step_stderr_truncated", _bool(_get(s, "stderrTruncated")))
        artifacts = _get(r, "artifacts", [])
        d.field("artifacts", len(artifacts))
        for a in artifacts:
            d.field("artifact_path", _get(a, "path", ""))
            d.field("artifact_content", _bytes(_get(a, "content")))
    elif kind == "module":
        d.field("outcome", _outcome(_get(r, "outcome")))
        d.field("outcome_detail", _get(r, "outcomeDetail", ""))
        d.field("width", _int(_get(r, "width")))
        d.field("stdout", _bytes(_get(r, "stdout")))
        d.field("stderr", _bytes(_get(r, "stderr")))
        runs = _get(r, "runs", [])
        d.field("runs", len(runs))
        for run in runs:
            d.field("run_status", _int(_get(run, "status")))
            d.field("run_outputs", _doubles(_get(run, "outputs", [])))
    return d


def result_digest(resp):
    return result_digest_input(resp).hexdigest()


# --------------------------------------------------------------------------------------
# Protobuf: the RunRecord inside a plimsoll.v1.UnansweredCall detail (docs/wire.md §5.3, §6.2)
# --------------------------------------------------------------------------------------

RECORD_PROTO = [  # (field number, JSON name, wire type)
    (1, "version", "varint"), (2, "requestSha256", "string"),
    (3, "resultSha256", "string"), (4, "provider", "string"),
    (5, "isolation", "string"), (6, "environment", "string"), (7, "policy", "string"),
    (8, "startedUnixMs", "varint"), (9, "endedUnixMs", "varint"),
    (10, "session", "string"), (11, "sequence", "varint"),
    (12, "previousSha256", "string"), (13, "recordSha256", "string"),
    (14, "softwareIdentity", "string"), (15, "softwareRuleId", "string"),
    (16, "unanswered", "string"),
]


def _varint(n):
    n &= (1 << 64) - 1  # negative int64: two's complement, 10 bytes
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_run_record(rec):
    """Binary protobuf of a JSON-form RunRecord; zero values omitted."""
    out = b""
    for number, name, wire in RECORD_PROTO:
        v = _get(rec, name)
        if wire == "varint":
            n = _int(v)
            if n:
                out += _varint(number << 3 | 0) + _varint(n)
        elif v:
            data = v.encode("utf-8")
            out += _varint(number << 3 | 2) + _varint(len(data)) + data
    return out


def unanswered_detail(rec):
    """The plimsoll.v1.UnansweredCall detail value: base64 without padding."""
    body = encode_run_record(rec)
    msg = _varint(1 << 3 | 2) + _varint(len(body)) + body
    return base64.b64encode(msg).decode("ascii").rstrip("=")


# --------------------------------------------------------------------------------------
# Shared state: the armed fault, counters, replay memory
# --------------------------------------------------------------------------------------

class Fault:
    def __init__(self, spec):
        self.spec = spec
        self.mode = spec["mode"]
        self.rpc = spec.get("rpc")
        self.count = None if spec.get("count") is None else int(spec["count"])
        self.skip = int(spec.get("skip") or 0)
        self.ms = int(spec.get("ms") or 0)
        self.value = spec.get("value")
        self.seen = 0      # matching requests seen
        self.applied = 0   # matching requests the fault was applied to

    def get(self, key, default=None):
        v = self.spec.get(key)
        return default if v is None else v

    def matches(self, path):
        return self.rpc is None or path.split("?", 1)[0].endswith("/" + self.rpc)


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        with self.lock:
            self.fault = None
            self.forwarded = {rpc: 0 for rpc in RPCS}
            self.answered = 0
            self.received = 0
            self.faulted = 0
            self.first_answers = {}

    def arm(self, fault):
        with self.lock:
            self.fault = fault

    def take(self, path):
        """The fault that applies to this request, or None."""
        with self.lock:
            self.received += 1
            f = self.fault
            if f is None or not f.matches(path):
                return None
            f.seen += 1
            if f.seen <= f.skip or (f.count is not None and f.applied >= f.count):
                return None
            f.applied += 1
            self.faulted += 1
            return f

    def count_forwarded(self, rpc):
        with self.lock:
            self.forwarded[rpc] = self.forwarded.get(rpc, 0) + 1

    def count_answered(self):
        with self.lock:
            self.answered += 1

    def remember_first(self, rpc, answer):
        """Stores the first upstream answer per RPC; returns the stored one."""
        with self.lock:
            return self.first_answers.setdefault(rpc, answer)

    def stats(self):
        with self.lock:
            return {"forwarded": dict(self.forwarded), "answered": self.answered,
                    "received": self.received, "faulted": self.faulted}


STATE = State()


# --------------------------------------------------------------------------------------
# Requests, answers and the wire
# --------------------------------------------------------------------------------------

class Request:
    def __init__(self, handler, body):
        self.method = handler.command
        self.path = handler.path
        self.rpc = handler.path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        self.headers = handler.headers.items()  # duplicates kept, in order
        self.body = body
        self.connection_tokens = {t.strip().lower()  # headers named there are hop-by-hop
                                  for v in handler.headers.get_all("Connection", [])
                                  for t in v.split(",")}
        ids = handler.headers.get_all(REQUEST_ID) or []
        # The daemon echoes only exactly one value of exactly 32 lowercase hex digits.
        self.echo_id = ids[0] if len(ids) == 1 and ID_RE.match(ids[0]) else None


class Answer:
    def __init__(self, status, headers, body, reason=None):
        self.status = status
        self.reason = reason
        self.headers = headers  # list of (name, value), hop-by-hop removed
        self.body = body

    def header(self, name):
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    def without(self, name):
        return [(k, v) for k, v in self.headers if k.lower() != name.lower()]

    def json(self):
        """The body as a JSON object for a 2xx answer, else None."""
        if not 200 <= self.status < 300:
            return None
        try:
            doc = json.loads(self.body)
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None


def crafted(status, body=b"", echo_id=None, headers=()):
    """An answer made here: a JSON body (object or bytes) and the ID echo, if given."""
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    hdrs = list(headers)
    if body and not any(k.lower() == "content-type" for k, _ in hdrs):
        hdrs.append(("Content-Type", "application/json"))
    if echo_id:
        hdrs.append((REQUEST_ID, echo_id))
    return Answer(status, hdrs, body)


class Upstream:
    def __init__(self, url):
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError("upstream must be an http(s) URL: %r" % url)
        self.url = url.rstrip("/")
        self.scheme = u.scheme
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.netloc = u.netloc
        self.prefix = u.path.rstrip("/")

    def connect(self):
        if self.scheme == "https":
            ctx = ssl._create_unverified_context()  # loopback test upstream
            return http.client.HTTPSConnection(self.host, self.port, context=ctx)
        return http.client.HTTPConnection(self.host, self.port)


UPSTREAM = None


def forward(req):
    """Sends the request upstream over a fresh connection; the answer, or None."""
    conn = UPSTREAM.connect()
    try:
        conn.putrequest(req.method, UPSTREAM.prefix + req.path,
                        skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", UPSTREAM.netloc)
        for name, value in req.headers:
            if name.lower() not in HOP_BY_HOP | req.connection_tokens | {"host"}:
                conn.putheader(name, value)
        if req.body or req.method in ("POST", "PUT", "PATCH"):
            conn.putheader("Content-Length", str(len(req.body)))
        conn.endheaders(req.body or None)
        STATE.count_forwarded(req.rpc)
        resp = conn.getresponse()
        body = resp.read()
        headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP_BY_HOP]
        answer = Answer(resp.status, headers, body, resp.reason)
        STATE.remember_first(req.rpc, answer)
        return answer
    except (OSError, http.client.HTTPException) as e:
        log("upstream %s %s failed: %s" % (req.method, req.path, e))
        return None
    finally:
        conn.close()


def gateway_error(h):
    send(h, Answer(502, [("Content-Type", "text/plain")], b"faultproxy: upstream failed\n"))


def write_head(h, answer, content_length, count=True):
    h.send_response_only(answer.status, answer.reason)
    for name, value in answer.headers:
        h.send_header(name, value)
    h.send_header("Content-Length", str(content_length))
    h.end_headers()
    if count:
        STATE.count_answered()


def send(h, answer, count=True):
    """Writes a whole answer with Content-Length framing (keep-alive safe)."""
    write_head(h, answer, len(answer.body), count)
    if h.command != "HEAD":
        h.wfile.write(answer.body)


def client_gone(sock):
    """True when the client closed its side (or sent something we will not read)."""
    if isinstance(sock, ssl.SSLSocket):
        return True  # readable while we hold the answer: close_notify or EOF
    try:
        data = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    except OSError:
        return True
    if data:
        time.sleep(0.05)  # a pipelined request: keep holding, without spinning
        return False
    return True


def hold(h, seconds=None):
    """Waits `seconds` (None = forever); True if the client left or the proxy stops."""
    deadline = None if seconds is None else time.monotonic() + seconds
    while not STOP.is_set():
        remaining = 0.05 if deadline is None else deadline - time.monotonic()
        if remaining <= 0:
            return False
        readable, _, _ = select.select([h.connection], [], [], min(0.05, remaining))
        if readable and client_gone(h.connection):
            return True
    return True


def close_client(h, rst=False):
    """Ends the client connection now: FIN, or RST with SO_LINGER 0."""
    h.close_connection = True
    if rst:
        h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        # Close the descriptor itself now: the rfile/wfile references would otherwise
        # delay the close until after socketserver's shutdown(SHUT_WR) sent a FIN.
        os.close(h.connection.detach())


# --------------------------------------------------------------------------------------
# Mode families
# --------------------------------------------------------------------------------------

def mode_pass(h, req, fault):
    answer = forward(req)
    if answer is None:
        return gateway_error(h)
    send(h, answer)


def _flip_hex(s):
    s = s or "0" * 64
    return ("1" if s[0] == "0" else "0") + s[1:]


def _run_of(doc):
    """The RunResponse in a Run answer (the body) or a SessionRun answer (body.run)."""
    return doc["run"] if isinstance(doc.get("run"), dict) else doc


def _record_of(doc):
    rec = _run_of(doc).get("record")
    if not isinstance(rec, dict):
        raise LookupError("the answer has no record")
    return rec


def _result_kind(run):
    kind = next((k for k in RESULT_KINDS if isinstance(run.get(k), dict)), None)
    if kind is None:
        raise LookupError("the answer has no result")
    return kind


def _recompute(doc, result_too=False):
    rec = _record_of(doc)
    if result_too:
        rec["resultSha256"] = result_digest(_run_of(doc))
    rec["recordSha256"] = record_digest(rec)


def _streams(run, kind):
    """(stdout, stderr, exitCode, timedOut, stdoutTruncated, stderrTruncated) of a result."""
    r = run[kind]
    if kind == "project":
        steps = _get(r, "steps", [])
        r = steps[-1] if steps else {}
    return {k: r[k] for k in ("stdout", "stderr", "exitCode", "timedOut",
                             "stdoutTruncated", "stderrTruncated") if k in r}


def _result_like(kind, streams):
    """A result of `kind` with the same outputs (an "equivalent shape")."""
    if kind in ("javascript", "cell"):
        return dict(streams)
    if kind == "project":
        step = dict(streams, command="node main.js")
        return {"outcome": "PROJECT_OUTCOME_COMPLETED", "steps": [step]}
    return {"outcome": "PROJECT_OUTCOME_COMPLETED", "width": 0,  # module
            **{k: streams[k] for k in ("stdout", "stderr") if k in streams}}


def rw_corrupt_record_digest(doc, fault):
    rec = _record_of(doc)
    rec["recordSha256"] = _flip_hex(rec.get("recordSha256"))


def rw_corrupt_result_digest(doc, fault):
    rec = _record_of(doc)
    rec["resultSha256"] = _flip_hex(rec.get("resultSha256"))


def rw_change_stdout(doc, fault):
    run = _run_of(doc)
    kind = _result_kind(run)
    r = run[kind]
    if kind == "project":
        if not _get(r, "steps"):
            raise LookupError("the project result has no step")
        r = r["steps"][0]
    if isinstance(fault.value, str):
        out = fault.value.encode()
    else:
        out = bytearray(_bytes(_get(r, "stdout")) or b"\n")
        b = out[0]
        out[0] = b - 1 if 0x31 <= b <= 0x39 else (b + 1) & 0xFF  # '4' -> '3'
    r["stdout"] = base64.b64encode(bytes(out)).decode()


def rw_drop_record(doc, fault):
    run = _run_of(doc)
    if "record" not in run:
        raise LookupError("the answer has no record")
    del run["record"]


def rw_lower_tier(doc, fault, recompute=True):
    tier = fault.get("value", "process")
    _run_of(doc)["isolation"] = tier
    _record_of(doc)["isolation"] = tier
    if recompute:
        _recompute(doc)


def rw_lower_tier_raw(doc, fault):
    rw_lower_tier(doc, fault, recompute=False)


def rw_inject_session_fields(doc, fault):
    rec = _record_of(doc)
    rec["session"] = fault.get("value", hashlib.sha256(b"faultproxy session").hexdigest())
    rec["sequence"] = "1"
    _recompute(doc)


def rw_two_results(doc, fault):
    run = _run_of(doc)
    kind = _result_kind(run)
    extra = fault.value or {"javascript": "project", "module": "cell"}.get(kind, "module")
    run[extra] = _result_like(extra, _streams(run, kind))
    if fault.get("recompute"):
        _recompute(doc, result_too=True)


WRONG_KIND = {"javascript": "project", "project": "javascript", "cell": "javascript",
              "module": "project"}


def rw_wrong_kind(doc, fault):
    run = _run_of(doc)
    kind = _result_kind(run)
    target = fault.value or WRONG_KIND[kind]
    run[target] = _result_like(target, _streams(run, kind))
    del run[kind]
    if fault.get("recompute"):
        _recompute(doc, result_too=True)


def rw_break_chain(doc, fault):
    _record_of(doc)["sequence"] = str(fault.get("value", "5"))
    _recompute(doc)


def rw_malformed_answer(doc, fault):
    _record_of(doc)["startedUnixMs"] = {}


def rw_patch(doc, fault):
    for path, new in (fault.value or {}).items():
        node, keys = doc, path.split(".")
        for key in keys[:-1]:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        if isinstance(node, list):
            node[int(keys[-1])] = new
        else:
            node[keys[-1]] = new
    if fault.get("recompute"):
        _recompute(doc)


REWRITES = {
    "corrupt_record_digest": rw_corrupt_record_digest,
    "corrupt_result_digest": rw_corrupt_result_digest,
    "change_stdout": rw_change_stdout,
    "drop_record": rw_drop_record,
    "lower_tier": rw_lower_tier,
    "lower_tier_raw": rw_lower_tier_raw,
    "inject_session_fields": rw_inject_session_fields,
    "two_results": rw_two_results,
    "wrong_kind": rw_wrong_kind,
    "break_chain": rw_break_chain,
    "malformed_answer": rw_malformed_answer,
    "patch": rw_patch,
}


def mode_rewrite(h, req, fault):
    """Forward, then rewrite the JSON answer (a liar daemon)."""
    answer = forward(req)
    if answer is None:
        return gateway_error(h)
    doc = answer.json()
    if doc is None:
        log("%s: answer %d is not a JSON object; relayed unchanged" % (fault.mode, answer.status))
        return send(h, answer)
    try:
        REWRITES[fault.mode](doc, fault)
    except (LookupError, ValueError, TypeError, AttributeError) as e:
        log("%s: not applicable (%s); relayed unchanged" % (fault.mode, e))
        return send(h, answer)
    send(h, Answer(answer.status, answer.headers, json.dumps(doc).encode(), answer.reason))


def mode_request_id(h, req, fault):
    """Forward, then drop, change or double the answer's Plimsoll-Request-Id."""
    answer = forward(req)
    if answer is None:
        return gateway_error(h)
    original = answer.header(REQUEST_ID) or req.echo_id or ""
    headers = answer.without(REQUEST_ID)
    if fault.mode == "change_request_id":
        other = fault.value
        while not other or other == original:
            other = os.urandom(16).hex()
        headers.append((REQUEST_ID, other))
    elif fault.mode == "double_request_id":
        if fault.value == "joined":
            headers.append((REQUEST_ID, original + ", " + original))
        else:
            headers += [(REQUEST_ID, original), (REQUEST_ID, original)]
    send(h, Answer(answer.status, headers, answer.body, answer.reason))


def mode_replay(h, req, fault):
    """Forward (it really runs), answer with the first answer ever relayed for the RPC."""
    answer = forward(req)
    if answer is None:
        return gateway_error(h)
    send(h, STATE.remember_first(req.rpc, answer))


def mode_unanswered(h, req, fault):
    """Forward a SessionRun, then answer as if the relay was lost (v3 record detail)."""
    answer = forward(req)
    if answer is None:
        return gateway_error(h)
    doc = answer.json()
    try:
        real = _record_of(doc or {})
    except LookupError:
        log("unanswered: the answer carries no record; relayed unchanged")
        return send(h, answer)
    code = fault.get("code", "unknown")
    rec = {"version": 3, "resultSha256": "", "unanswered": code}
    for name in ("requestSha256", "provider", "isolation", "environment", "policy",
                 "softwareIdentity", "softwareRuleId", "startedUnixMs", "endedUnixMs",
                 "session", "sequence", "previousSha256"):
        if _get(real, name) is not None:
            rec[name] = _get(real, name)
    if fault.value == "weaker":
        rec["isolation"] = "process"
    elif fault.value == "liar":
        rec["provider"] = "other"
    rec["recordSha256"] = record_digest(rec)
    body = {"code": code, "message": "relay lost",
            "details": [{"type": "plimsoll.v1.UnansweredCall",
                         "value": unanswered_detail(rec)}]}
    echo = answer.header(REQUEST_ID) or req.echo_id
    send(h, crafted(CONNECT_STATUS.get(code, 500), body, echo))


def mode_transport(h, req, fault):
    """Break the answer's framing or the connection itself."""
    if fault.mode == "stall_headers":
        if fault.get("forward"):
            forward(req)
        hold(h)
        return close_client(h)
    answer = forward(req)
    if answer is None:
        return gateway_error(h)
    if fault.mode == "reset":
        return close_client(h, rst=True)
    if fault.mode == "delay":
        if hold(h, fault.ms / 1000.0):
            log("delay: ended early (client gone or proxy stopping)")
            return close_client(h)
        return send(h, answer)
    if fault.mode in CUTS:
        return cut_answer(h, answer, fault.mode)
    # cut_body, stall_body: the full Content-Length, half the body
    write_head(h, answer, len(answer.body))
    h.wfile.write(answer.body[: len(answer.body) // 2])
    if fault.mode == "stall_body":
        hold(h)
    close_client(h)


CUTS = ("cut_status_line", "cut_headers", "cut_after_headers", "cut_last_byte",
        "cut_chunked")


def head_bytes(h, answer, framing):
    """The answer's status line and headers as sent, with `framing` (name, value) last."""
    reason = answer.reason
    if reason is None:
        reason = h.responses.get(answer.status, ("",))[0]
    lines = ["%s %d %s" % (h.protocol_version, answer.status, reason)]
    lines += ["%s: %s" % (k, v) for k, v in answer.headers + [framing]]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def cut_answer(h, answer, mode):
    """Writes part of the answer (see the cut_* modes), then closes with a FIN."""
    body = answer.body
    if mode == "cut_chunked":
        head = head_bytes(h, answer, ("Transfer-Encoding", "chunked"))
        data = head + (b"%x\r\n" % len(body) + body + b"\r\n" if body else b"")
    else:
        head = head_bytes(h, answer, ("Content-Length", str(len(body))))
        status_end = head.index(b"\r\n")  # the status line, without its CRLF
        if mode == "cut_status_line":
            data = head[: status_end // 2]
        elif mode == "cut_headers":
            # Halfway between the status line's CRLF and the blank line that ends the
            # block: the status line is whole, the blank line never sent (the framing
            # header is always there, so the block is never empty).
            data = head[: (status_end + 2 + len(head) - 2) // 2]
        elif mode == "cut_after_headers":
            data = head
        else:  # cut_last_byte
            data = head + body[:-1]
    if mode != "cut_status_line":
        STATE.count_answered()
    h.wfile.write(data)
    h.wfile.flush()
    close_client(h)


def mode_huge_body(h, req, fault):
    if fault.get("forward"):
        forward(req)
    answer = crafted(200, b"", req.echo_id, [("Content-Type", "application/json")])
    write_head(h, answer, HUGE_BODY_SPACES + 2)
    chunk = b" " * (1 << 16)
    for _ in range(HUGE_BODY_SPACES // len(chunk)):
        if STOP.is_set():
            return close_client(h)
        h.wfile.write(chunk)
    h.wfile.write(b"{}")


def mode_crafted(h, req, fault):
    """Answer without the daemon (unless "forward": true, or malformed_json)."""
    if fault.get("forward", fault.mode == "malformed_json"):
        forward(req)
    echo = req.echo_id
    extra = list((fault.get("headers") or {}).items())
    if fault.mode == "status":
        answer = crafted(int(fault.get("value", 503)), b"", echo if fault.get("echo") else None,
                         extra)
    elif fault.mode == "status_bound_error":
        body = fault.get("body", {"code": "unavailable", "message": "injected"})
        if not isinstance(body, (dict, list)):
            body = json.dumps(body).encode()  # any JSON value: "s", 5, null
        answer = crafted(int(fault.get("value", 503)), body,
                         echo if fault.get("echo", True) else None, extra)
    elif fault.mode == "not_dispatched_header":
        answer = crafted(400, {"code": "invalid_argument", "message": "x"}, echo,
                         [(NOT_DISPATCHED, str(fault.get("value", "request")))])
    elif fault.mode == "redirect":
        answer = crafted(307, b"", echo if fault.get("echo", True) else None,
                         [("Location", UPSTREAM.url + req.path)])
    elif fault.mode == "malformed_json":
        answer = crafted(200, b'{"sandbox": "echo",', echo)
    else:  # not_object
        answer = crafted(200, b"[1]", echo)
    send(h, answer)


MODES = {
    "pass": mode_pass,
    **{name: mode_rewrite for name in REWRITES},
    "drop_request_id": mode_request_id,
    "change_request_id": mode_request_id,
    "double_request_id": mode_request_id,
    "replay": mode_replay,
    "unanswered": mode_unanswered,
    "cut_body": mode_transport,
    "stall_body": mode_transport,
    **{name: mode_transport for name in CUTS},
    "reset": mode_transport,
    "delay": mode_transport,
    "stall_headers": mode_transport,
    "huge_body": mode_huge_body,
    "status": mode_crafted,
    "status_bound_error": mode_crafted,
    "not_dispatched_header": mode_crafted,
    "redirect": mode_crafted,
    "malformed_json": mode_crafted,
    "not_object": mode_crafted,
}


# --------------------------------------------------------------------------------------
# The HTTP server
# --------------------------------------------------------------------------------------

def is_control(path):
    path = path.split("?", 1)[0]
    return path == "/_fault" or path.startswith("/_fault/")


def control(h, body):
    """The /_fault endpoints; answered here, never forwarded or counted."""
    path = h.path.split("?", 1)[0].rstrip("/")
    if h.command == "GET" and path == "/_fault/stats":
        return send(h, crafted(200, STATE.stats()), count=False)
    if h.command == "POST" and path == "/_fault/reset":
        STATE.reset()
        return send(h, crafted(200, {}), count=False)
    if h.command == "POST" and path == "/_fault":
        try:
            spec = json.loads(body or b"{}")
            if not isinstance(spec, dict) or spec.get("mode") not in MODES:
                raise ValueError("unknown mode in %r" % (spec,))
            if spec.get("count") is not None and int(spec["count"]) < 0:
                raise ValueError("count must be >= 0")
            fault = Fault(spec)
        except (ValueError, TypeError) as e:
            return send(h, crafted(400, {"error": str(e)}), count=False)
        STATE.arm(fault)
        log("armed %s" % json.dumps(spec))
        return send(h, crafted(200, {}), count=False)
    send(h, crafted(404, {"error": "unknown control path"}), count=False)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, Content-Length framing both ways
    # The head and the body go in two writes: with Nagle on, the body waits for the
    # client's delayed ACK of the head (40 ms on loopback) on every answer.
    disable_nagle_algorithm = True
    server_version = "faultproxy"

    def read_body(self):
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        if length < 0:
            raise ValueError("negative Content-Length")
        data = self.rfile.read(length)
        if len(data) != length:
            raise ConnectionError("the client closed inside the request body")
        return data

    def setup(self):
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()  # here, in the handler thread

    def handle_request(self):
        try:
            try:
                body = self.read_body()
            except ValueError:
                self.close_connection = True
                return send(self, crafted(400, {"error": "bad request framing"}), count=False)
            if is_control(self.path):
                return control(self, body)
            req = Request(self, body)
            fault = STATE.take(req.path)
            if fault is not None:
                log("%s %s: %s" % (req.method, req.path, fault.mode))
            (MODES[fault.mode] if fault else mode_pass)(self, req, fault)
        except OSError as e:  # the client went away (reset, broken pipe, TLS error)
            log("client connection ended: %s" % e)
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = handle_request

    def log_message(self, fmt, *args):
        log("%s %s" % (self.address_string(), fmt % args))


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


def main(argv=None):
    global UPSTREAM, QUIET
    p = argparse.ArgumentParser(description="fault-injecting plimsoll proxy (tests only)")
    p.add_argument("--upstream", required=True, help="http://127.0.0.1:PORT")
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (default 127.0.0.1:0)")
    p.add_argument("--tls-cert")
    p.add_argument("--tls-key")
    p.add_argument("--quiet", action="store_true", help="no log lines on stderr")
    args = p.parse_args(argv)
    if bool(args.tls_cert) != bool(args.tls_key):
        p.error("--tls-cert and --tls-key go together")
    QUIET = args.quiet
    UPSTREAM = Upstream(args.upstream)
    host, _, port = args.listen.rpartition(":")
    server = Server((host.strip("[]") or "127.0.0.1", int(port)), Handler)
    scheme = "http"
    if args.tls_cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.tls_cert, args.tls_key)
        ctx.set_alpn_protocols(["http/1.1"])  # never HTTP/2
        # The handshake happens in the handler thread, not in accept().
        server.socket = ctx.wrap_socket(server.socket, server_side=True,
                                        do_handshake_on_connect=False)
        scheme = "https"

    def stop(signum, frame):
        STOP.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    print("listening %s://%s:%d" % (scheme, server.server_address[0], server.server_address[1]),
          flush=True)
    while not STOP.wait(0.5):
        pass
    server.shutdown()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

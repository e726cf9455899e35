#!/usr/bin/env python3
"""fake_openai.py — a local fake of an OpenAI-compatible chat-completions server that
streams the real chunk format, for tests/test_openai.c.

    python3 tests/fake_openai.py        # prints "listening http://127.0.0.1:PORT"

Requests: POST /<scenario>/<tag>/v1/chat/completions.  The scenario picks what the
answer does (the list is SCENARIOS below); the tag (any word) keys the counters, so
each test uses its own.  Every answer is what a real server sends:

    data: {"id":"chatcmpl-…","object":"chat.completion.chunk","created":…,"model":…,
           "choices":[{"index":0,"delta":{…},"finish_reason":null}]}

then a final chunk with a finish_reason, and `data: [DONE]`.  Tool calls come in
fragments: id, type and name only in the first, the arguments cut at byte level (in
the middle of a token and of a UTF-8 code point, the bytes put raw in the JSON string,
as a server streaming byte-level tokens does).  Responses are chunked (or, for some
faults, delimited by closing the connection), and written in pieces cut inside
multi-byte characters, with TCP_NODELAY.

Control:
    GET  /_stats/<tag>    {"requests": n, "bodies": [...], "auth": [...]}
    POST /_release/<tag>  lets a `hold` or `stall` answer go on
"""

import ctypes
import http.server
import json
import os
import signal
import socket
import sys
import threading
import time

PACE = 0.002        # seconds between the pieces of a split write: pacing, so the
                    # client sees separate reads; nothing depends on it
HOLD_LIMIT = 30.0   # a held answer goes on by itself after this long

LOCK = threading.Lock()
COUNTS = {}
BODIES = {}
AUTHS = {}
RELEASES = {}


def release_event(tag):
    with LOCK:
        return RELEASES.setdefault(tag, threading.Event())


# {====================================================== chunk format

def chunk(delta, finish=None, index=0):
    return {"id": "chatcmpl-fake0001", "object": "chat.completion.chunk",
            "created": 1767225600, "model": "fake-model", "system_fingerprint": "fp_fake",
            "choices": [{"index": index, "delta": delta, "logprobs": None,
                         "finish_reason": finish}]}


def esc_raw(b):
    """Bytes for inside a JSON string: quotes, backslashes and controls escaped,
    every byte >= 0x80 left raw (so a cut code point stays cut)."""
    out = bytearray()
    for x in b:
        if x == 0x22:
            out += b'\\"'
        elif x == 0x5C:
            out += b'\\\\'
        elif x < 0x20:
            out += b'\\u%04x' % x
        else:
            out.append(x)
    return bytes(out)


def event(obj, raw=None, eol=b"\n"):
    """One SSE event.  `raw` replaces the string "@@RAW@@" in obj by raw bytes."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
    if raw is not None:
        text = text.replace(b"@@RAW@@", esc_raw(raw))
    return b"data: " + text + eol + eol


DONE = b"data: [DONE]\n\n"


def usage():
    return {"id": "chatcmpl-fake0001", "object": "chat.completion.chunk",
            "created": 1767225600, "model": "fake-model", "choices": [],
            "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}}


def text_events(pieces, finish="stop"):
    evs = [event(chunk({"role": "assistant", "content": ""}))]
    evs += [event(chunk({"content": p})) for p in pieces]
    evs.append(event(chunk({}, finish)))
    return evs


def cut_bytes(b, size):
    return [b[i:i + size] for i in range(0, len(b), size)]


def mid_codepoint(pieces):
    """True when some cut falls inside a UTF-8 sequence."""
    return any(p and (p[0] & 0xC0) == 0x80 for p in pieces[1:])


def tool_first(index, call_id, name):
    return event(chunk({"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                        "function": {"name": name, "arguments": ""}}]}))


def tool_piece(index, piece):
    return event(chunk({"tool_calls": [{"index": index,
                                        "function": {"arguments": "@@RAW@@"}}]}), raw=piece)


def split_in_char(data):
    """Cuts one write in two, inside the first multi-byte character if any."""
    for i, x in enumerate(data):
        if x >= 0xC0:
            return [data[:i + 1], data[i + 1:]]
    mid = len(data) // 2
    return [data[:mid], data[mid:]]

# }======================================================


# {====================================================== scenarios

TOOL_ARGS = '{"code": "print(\'héllo wörld 🚀\')\\nx = 41", "language": "python"}'
TEXT = ["Hel", "lo, w", "ö", "rld — ", "ünï", "cödé ✓ ", "🚀", "!"]


def sc_text(h, req, n):
    h.stream(text_events(TEXT) + [event(usage()), DONE], split=True)


def sc_tool(h, req, n):
    pieces = cut_bytes(TOOL_ARGS.encode(), 4)
    assert mid_codepoint(pieces)
    evs = [event(chunk({"role": "assistant", "content": None})),
           tool_first(0, "call_abc123", "executeCode")]
    evs += [tool_piece(0, p) for p in pieces]
    evs += [event(chunk({}, "tool_calls")), DONE]
    h.stream(evs, split=True)


PAR_A = '{"code": "a = 1 + 1", "language": "python"}'
PAR_B = '{"query": "naïve café ☕"}'


def sc_parallel(h, req, n):
    a = cut_bytes(PAR_A.encode(), 3)
    b = cut_bytes(PAR_B.encode(), 3)
    evs = [event(chunk({"role": "assistant", "content": None})),
           tool_first(0, "call_A", "executeCode"), tool_first(1, "call_B", "lookup")]
    for i in range(max(len(a), len(b))):
        if i < len(a):
            evs.append(tool_piece(0, a[i]))
        if i < len(b):
            evs.append(tool_piece(1, b[i]))
    evs += [event(chunk({}, "tool_calls")), DONE]
    h.stream(evs, split=True)


def sc_ratelimit(h, req, n):
    if n == 1:
        h.error(429, "Rate limit reached for requests", "rate_limit_error",
                {"Retry-After": "1"})
    else:
        h.stream(text_events(["ok after ", "the wait"]) + [DONE])


def sc_flaky(h, req, n):
    if n <= 2:
        h.error(503 if n == 1 else 500, "The server is overloaded", "server_error")
    else:
        h.stream(text_events(["third time ", "lucky"]) + [DONE])


def sc_storm(h, req, n):
    h.error(500, "upstream overloaded", "server_error")


def sc_unauthorized(h, req, n):
    key = h.headers.get("Authorization", "")[len("Bearer "):]
    h.error(401, "Incorrect API key provided: %s. You can find your API key in your "
                 "account settings." % key, "invalid_request_error")


def sc_forbidden(h, req, n):
    h.error(403, "Project does not have access to model", "invalid_request_error")


def cut_events():
    return [event(chunk({"role": "assistant", "content": "Let me run "})),
            event(chunk({"content": "that."})),
            tool_first(0, "call_cut", "executeCode"),
            tool_piece(0, b'{"code": "x ='), tool_piece(0, b' 4')]


def sc_cut(h, req, n):
    """Delimited by closing the connection: to curl, a clean end of the body."""
    h.stream(cut_events(), framing="close", finish=False)


def sc_cutchunked(h, req, n):
    """Chunked, and the last chunk never comes: curl sees a broken transfer."""
    h.stream(cut_events(), finish=False)


def sc_malformed(h, req, n):
    evs = [event(chunk({"role": "assistant", "content": "partial"})),
           b'data: {"id":"chatcmpl-fake0001","choices":[{"index":0,"delta":{"content":"oops"\n\n',
           event(chunk({}, "stop")), DONE]
    h.stream(evs)


def sc_lines(h, req, n, eol):
    """CR or CRLF line ends, comments, fields without a space, multi-line data,
    event/id/retry fields."""
    out = [b": keep-alive" + eol + eol, b"retry: 3000" + eol]
    objs = [chunk({"role": "assistant", "content": ""}), chunk({"content": "Line "}),
            chunk({"content": "ends, "}), chunk({"content": "comments and "}),
            chunk({"content": "multi-line data work"}), chunk({}, "stop")]
    for i, o in enumerate(objs):
        lines = json.dumps(o, ensure_ascii=False, indent=1).encode().split(b"\n")
        ev = b"id: %d" % i + eol
        if i % 2:
            ev += b"event: message" + eol + b": a comment inside an event" + eol
        for j, line in enumerate(lines):
            ev += (b"data:" if (i + j) % 2 else b"data: ") + line + eol
        out.append(ev + eol)
    out.append(b"data:[DONE]" + eol + eol)
    h.stream(out, split=True)


def sc_crlf(h, req, n):
    sc_lines(h, req, n, b"\r\n")


def sc_cr(h, req, n):
    sc_lines(h, req, n, b"\r")


def sc_errorevent(h, req, n):
    evs = [event(chunk({"role": "assistant", "content": "I was say"})),
           event({"error": {"message": "The server had an error while processing your "
                                       "request", "type": "server_error", "code": None}})]
    h.stream(evs, finish=False)


def sc_hold(h, req, n):
    """Sends one delta, then waits for /_release/<tag> before the rest."""
    h.stream([event(chunk({"role": "assistant", "content": "first "}))], finish=False,
             end=False)
    release_event(h.tag).wait(HOLD_LIMIT)
    h.stream([event(chunk({"content": "second"})), event(chunk({}, "stop")), DONE],
             start=False)


def sc_stall(h, req, n):
    """Sends one delta, then nothing until released (the client's idle timeout)."""
    h.stream([event(chunk({"role": "assistant", "content": "stalling"}))], finish=False,
             end=False)
    release_event(h.tag).wait(HOLD_LIMIT)
    h.close_connection = True


def raw_content(piece):
    return event(chunk({"content": "@@RAW@@"}), raw=piece)


def sc_splitutf8(h, req, n):
    """Content cut inside code points at the JSON level: "café 🚀 ok"."""
    evs = [event(chunk({"role": "assistant", "content": ""})),
           raw_content(b"caf\xc3"), raw_content(b"\xa9 \xf0\x9f"), raw_content(b"\x9a"),
           raw_content(b"\x80 ok"), event(chunk({}, "stop")), DONE]
    h.stream(evs)


def sc_badutf8(h, req, n):
    """A code point that is never completed."""
    evs = [event(chunk({"role": "assistant", "content": ""})),
           raw_content(b"caf\xc3"), raw_content(b" au lait"), event(chunk({}, "stop")), DONE]
    h.stream(evs)


def sc_nodone(h, req, n):
    h.stream(text_events(["no done ", "marker"]))


def sc_json(h, req, n):
    body = json.dumps({"id": "chatcmpl-fake0002", "object": "chat.completion",
                       "created": 1767225600, "model": "fake-model",
                       "choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant",
                                                "content": "a whole answer"}}]}).encode()
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def sc_redirect(h, req, n):
    h.send_response(307)
    h.send_header("Location", "http://127.0.0.1:9/v1/chat/completions")
    h.send_header("Content-Length", "0")
    h.end_headers()


def sc_agent(h, req, n):
    """The model loop of code_chat.lua: a tool call for each user message, then a
    text answer quoting the tool result's stdout."""
    msgs = req.get("messages", [])
    last = msgs[-1] if msgs else {}
    if last.get("role") == "tool":
        try:
            out = json.loads(last.get("content", "")).get("stdout", "?")
        except (ValueError, AttributeError):
            out = "(not JSON)"
        h.stream(text_events(["The sandbox ", "said: ", out]) + [DONE], split=True)
        return
    users = sum(1 for m in msgs if m.get("role") == "user")
    code = "x = 41" if users == 1 else "x + 1"
    args = json.dumps({"code": code, "language": "python"}).encode()
    evs = [event(chunk({"role": "assistant", "content": None})),
           tool_first(0, "call_turn%d" % users, "executeCode")]
    evs += [tool_piece(0, p) for p in cut_bytes(args, 5)]
    evs += [event(chunk({}, "tool_calls")), DONE]
    h.stream(evs, split=True)


SCENARIOS = {name[3:]: fn for name, fn in globals().items() if name.startswith("sc_")
             and name != "sc_lines"}

# }======================================================


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # a stream's events are many small writes
    server_version = "fake-openai/1"

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt, *args):
        pass

    def reply_json(self, code, obj, headers=None):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def error(self, code, message, kind, headers=None):
        self.reply_json(code, {"error": {"message": message, "type": kind, "param": None,
                                         "code": None}}, headers)

    def stream(self, events, framing="chunked", split=False, finish=True, start=True,
               end=True):
        """Writes SSE events.  finish=False drops the connection after them (a cut);
        end=False leaves the response open (more comes later)."""
        if start:
            self.framing = framing
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Cache-Control", "no-cache")
            if framing == "chunked":
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.send_header("Connection", "close")
            self.end_headers()
        for ev in events:
            for piece in (split_in_char(ev) if split else [ev]):
                if not piece:
                    continue
                if self.framing == "chunked":
                    piece = b"%x\r\n" % len(piece) + piece + b"\r\n"
                self.wfile.write(piece)
                self.wfile.flush()
                if split:
                    time.sleep(PACE)
        if not end:
            return
        if finish and self.framing == "chunked":
            self.wfile.write(b"0\r\n\r\n")
        if not finish or self.framing != "chunked":
            self.close_connection = True

    def do_GET(self):
        parts = self.path.strip("/").split("/")
        if len(parts) == 2 and parts[0] == "_stats":
            with LOCK:
                self.reply_json(200, {"requests": COUNTS.get(parts[1], 0),
                                      "bodies": BODIES.get(parts[1], []),
                                      "auth": AUTHS.get(parts[1], [])})
            return
        self.reply_json(404, {"error": {"message": "no such path"}})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        parts = self.path.strip("/").split("/")
        if len(parts) == 2 and parts[0] == "_release":
            release_event(parts[1]).set()
            self.reply_json(200, {"released": parts[1]})
            return
        if len(parts) < 4 or parts[-2:] != ["chat", "completions"] or parts[0] not in SCENARIOS:
            self.reply_json(404, {"error": {"message": "unknown path %s" % self.path}})
            return
        scenario, self.tag = parts[0], parts[1]
        try:
            req = json.loads(raw)
        except ValueError:
            req = {"unparsed": raw.decode("utf-8", "replace")}
        with LOCK:
            COUNTS[self.tag] = n = COUNTS.get(self.tag, 0) + 1
            BODIES.setdefault(self.tag, []).append(req)
            AUTHS.setdefault(self.tag, []).append(self.headers.get("Authorization"))
        try:
            SCENARIOS[scenario](self, req, n)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


def die_with_parent():
    """A test that crashes must not leave the fake running: PR_SET_PDEATHSIG, else a
    watch on the parent pid."""
    try:
        if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0) == 0:
            return
    except (OSError, AttributeError):
        pass
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)
    threading.Thread(target=watch, daemon=True).start()


def main():
    die_with_parent()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print("listening http://127.0.0.1:%d" % server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

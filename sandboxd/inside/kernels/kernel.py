# kernel.py - sandboxd's persistent Python interpreter (one per session sandbox).
#
# Started by the in-sandbox supervisor as `python3 -I -c <this> PREFIX TOKEN` with fd 0
# /dev/null and fds 1 and 2 the cell's stdout and stderr (FIFOs the daemon reads).  It
# reads requests from the FIFO PREFIX-req and writes replies to PREFIX-rep; a frame is
# a 4-byte little-endian length and a body:
#   request  nonce (32 ASCII hex) + code (UTF-8)
#   reply    b"R" + TOKEN (ready, once)  |  b"D" + status (b"0" ran, b"1" raised) + nonce
#            + spawned (b"1" when the cell may have started a process, else b"0")
# Before its "D" reply it writes the end mark 0x1f + nonce + 0x1e on fds 1 and 2; the
# "D" frame goes right after fd 2's mark, in the same write (on PREFIX-rep when fd 2 is
# closed).
# Notebook semantics: one global namespace (__main__); a last expression's value is
# stored as `_` and its repr printed unless None; top-level await runs on a private
# event loop; every BaseException ends the cell (traceback on stderr from <cell N>),
# never the interpreter.
import sys, os


def _berth_kernel():
    import ast, builtins, linecache, traceback, types

    prefix, token = sys.argv[1], sys.argv[2].encode()
    rfd = os.open(prefix + "-req", os.O_RDONLY)  # not inherited by what cells start
    wfd = os.open(prefix + "-rep", os.O_WRONLY)
    forked = []  # set in a child the cell forked: it never goes on as the kernel
    os.register_at_fork(after_in_child=lambda: forked.append(True))
    # Whether a cell may have started a process (every way CPython has to, ctypes calls
    # included, raises one of these audit events; audit hooks cannot be removed).  The
    # daemon may skip its sweep after a cell that started none.
    spawned = [False]
    spawn_events = {"os.fork", "os.forkpty", "os.posix_spawn", "os.system", "os.exec",
                    "os.spawn", "subprocess.Popen", "pty.fork", "ctypes.call_function",
                    "ctypes.dlopen", "_posixsubprocess.fork_exec"}

    # Whether end_cell must make the cell's streams blocking again before it flushes (a
    # flush into a full non-blocking pipe loses what TextIOWrapper held): two system
    # calls, each a ptrace stop under gVisor, so only once a cell may have changed the
    # flag, and from then on for good.  A descriptor's flag is its open file
    # description's, shared with every dup and every child: so os.set_blocking,
    # fcntl.fcntl or fcntl.ioctl on any descriptor, and any process started or C called
    # through ctypes (the spawn events; Node, for one, makes its stdout non-blocking),
    # mark it.  os.set_blocking raises no audit event: it is wrapped.
    unblock = [False]
    flag_events = spawn_events | {"fcntl.fcntl", "fcntl.ioctl"}

    def audit(event, args):
        if event in flag_events:
            unblock[0] = True
            if event in spawn_events:
                spawned[0] = True

    sys.addaudithook(audit)
    set_blocking0 = os.set_blocking

    def set_blocking(fd, blocking, /):
        unblock[0] = True
        return set_blocking0(fd, blocking)

    set_blocking.__doc__ = set_blocking0.__doc__
    os.set_blocking = set_blocking
    for fd in (1, 2):  # as the supervisor opened them; made sure of once
        try:
            set_blocking0(fd, True)
        except OSError:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(encoding="utf-8", errors="backslashreplace",
                               line_buffering=True)
        except Exception:
            pass
    out0, err0 = sys.stdout, sys.stderr
    sys.path.insert(0, "")  # -I left the work dir out: cells import from it
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    ns = main.__dict__
    state = {"loop": None, "n": 0, "tail": b""}
    PIPE_BUF = 4096  # POSIX's floor; Linux's pipes take this much whole
    MARK_LEN = 34    # an end mark: 0x1f, the 32-character nonce, 0x1e
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    CO_COROUTINE = 0x80

    def frame(body):  # a 4-byte little-endian length, then the body
        return len(body).to_bytes(4, "little") + body

    def send(body):
        data = frame(body)
        while data:
            data = data[os.write(wfd, data):]

    pending = bytearray()
    chunk = bytearray(1 << 16)

    def next_request():
        while True:
            if len(pending) >= 4:
                size = int.from_bytes(pending[:4], "little")
                if len(pending) >= 4 + size:
                    req = bytes(pending[4:4 + size])
                    del pending[:4 + size]
                    return req
            n = os.readv(rfd, [chunk])
            if not n:
                os._exit(0)  # the daemon went away
            pending.extend(memoryview(chunk)[:n])

    def run_async(coro):
        if state["loop"] is None:
            import asyncio
            state["loop"] = asyncio.new_event_loop()
        return state["loop"].run_until_complete(coro)

    # Each stream once: a buffered stream's flush takes its lock, and Python 3.11 reads
    # the clock to take any lock, a system call in a gVisor sandbox's first second
    # (docs/performance.md).  sys.stdout is out0 unless a cell replaced it.
    def flush():
        so, se = sys.stdout, sys.stderr
        streams = [so] if se is so else [so, se]
        streams += [s for s in (out0, err0) if s is not so and s is not se]
        for s in streams:
            try:
                s.flush()
            except Exception:
                pass

    def show_error(e):
        tb = e.__traceback__
        while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell "):
            tb = tb.tb_next
        try:
            flush()
            text = "".join(traceback.format_exception(type(e), e, tb))
            err0.write(text)
        except Exception:
            pass

    # The last expression's repr, when it may go out with the stdout end mark in one
    # write (under gVisor's ptrace platform a system call costs about 0.1 ms): only while
    # sys.stdout is the kernel's own stream, in a process that did not fork, and with
    # the mark under PIPE_BUF (whole, never interleaved).  Encoded here as the stream
    # would encode it, so an encoding error is the cell's, as print's would be.
    def show_value(text):
        if sys.stdout is out0 and not forked:
            data = (text + "\n").encode(out0.encoding, out0.errors or "strict")
            if len(data) + MARK_LEN <= PIPE_BUF:
                state["tail"] = data
                return
        print(text)

    def run_cell(code):
        state["n"] += 1
        name = "<cell %d>" % state["n"]
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)
        try:
            tree = compile(code, name, "exec", ast.PyCF_ONLY_AST | flags)
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            body = compile(tree, name, "exec", flags)
            r = eval(body, ns)
            if body.co_flags & CO_COROUTINE:
                run_async(r)
            if last is not None:
                expr = compile(last, name, "eval", flags)
                value = eval(expr, ns)
                if expr.co_flags & CO_COROUTINE:
                    value = run_async(value)
                if value is not None:
                    ns["_"] = value
                    show_value(repr(value))
            return b"0"
        except BaseException as e:  # SystemExit and KeyboardInterrupt end the cell too
            show_error(e)
            return b"1"

    # Ends a cell: its streams flushed, the end mark on each of fds, and with `spawned`
    # (b"0" or b"1") the end reply, in the same write as stderr's mark (one system call
    # less a cell), or on the reply FIFO when stderr is closed.
    def end_cell(nonce, fds, status, spawned=None):
        for fd in (1, 2) if unblock[0] else ():  # a cell may have made them
            try:                                  # non-blocking: then a flush could
                set_blocking0(fd, True)           # leave output behind the end mark
            except OSError:
                pass
        flush()
        tail, state["tail"] = state["tail"], b""
        # The end mark on the streams, before the end reply: what a thread or a child
        # writes after it is output between cells, dropped by the daemon.
        mark = b"\x1f" + nonce + b"\x1e"
        reply = None
        for fd in fds:
            if fd == 1:
                data = tail + mark
            elif spawned is not None:  # (status is final now: fd 1 came first)
                reply = b"D" + status + nonce + spawned
                data = mark + frame(reply)
            else:
                data = mark
            try:
                os.write(fd, data)  # shorter than PIPE_BUF: whole, never interleaved
                if reply:
                    return
            except OSError as e:
                if fd == 1 and tail:  # the repr was lost with it, as print would have
                    show_error(e)     # failed: the cell's error
                    status = b"1"
                # else the cell closed it: the daemon takes what is queued
        if reply:
            send(reply)

    # Two cells the whole way (frame, compile, eval, repr, flush, end mark) before
    # saying ready, so that a warm sandbox's first cell finds its path warm.  Their end
    # marks go to stdout only (dropped before "ready"; stderr is kept then for a failed
    # start's diagnosis), no reply is sent, and nothing stays: no `_`, no cell in
    # linecache, and the session's cells are numbered from 1.
    try:
        for code in (b"1", b"None"):
            pending.extend(frame(b"0" * 32 + code))
            req = next_request()
            end_cell(req[:32], (1,), run_cell(req[32:].decode("utf-8", "surrogateescape")))
    except Exception:
        pass
    state["n"] = 0
    ns.pop("_", None)
    for name in [k for k in linecache.cache if k.startswith("<cell ")]:
        del linecache.cache[name]
    send(b"R" + token)
    while True:
        req = next_request()
        nonce, code = req[:32], req[32:].decode("utf-8", "surrogateescape")
        spawned[0] = False
        status = run_cell(code)
        if forked:
            os._exit(0)  # a process the cell forked never goes on as the kernel
        end_cell(nonce, (1, 2), status, b"1" if spawned[0] else b"0")


_berth_kernel()

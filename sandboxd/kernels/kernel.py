# kernel.py - sandboxd's persistent Python interpreter (one per session sandbox).
#
# Started by the in-sandbox supervisor as `python3 -I -c <this> ` with fd 0 /dev/null,
# fd 1 and fd 2 the cell's stdout and stderr pipes, fd 3 the requests and fd 4 the
# replies.  Frames on fds 3/4 are a 4-byte little-endian length and a body:
#   request  nonce (32 ASCII hex) + code (UTF-8)
#   reply    b"R" (ready, once)  |  b"D" + status (b"0" ran, b"1" raised) + nonce
# Notebook semantics: one global namespace (__main__); a last expression's value is
# stored as `_` and its repr printed unless None; top-level await runs on a private
# event loop; every BaseException ends the cell (traceback on stderr from <cell N>),
# never the interpreter.
import sys, os


def _berth_kernel():
    import ast, builtins, linecache, traceback, types

    rfd, wfd = 3, 4
    os.set_inheritable(rfd, False)
    os.set_inheritable(wfd, False)
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
    state = {"loop": None, "n": 0}
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    CO_COROUTINE = 0x80

    def send(body):
        data = len(body).to_bytes(4, "little") + body
        while data:
            data = data[os.write(wfd, data):]

    def read_exact(n):
        parts = []
        while n:
            b = os.read(rfd, min(n, 1 << 20))
            if not b:
                os._exit(0)  # the supervisor went away
            parts.append(b)
            n -= len(b)
        return b"".join(parts)

    def run_async(coro):
        if state["loop"] is None:
            import asyncio
            state["loop"] = asyncio.new_event_loop()
        return state["loop"].run_until_complete(coro)

    def flush():
        for s in (sys.stdout, sys.stderr, out0, err0):
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
                    print(repr(value))
            return b"0"
        except BaseException as e:  # SystemExit and KeyboardInterrupt end the cell too
            show_error(e)
            return b"1"

    send(b"R")
    while True:
        size = int.from_bytes(read_exact(4), "little")
        req = read_exact(size)
        nonce, code = req[:32], req[32:].decode("utf-8", "surrogateescape")
        status = run_cell(code)
        flush()
        send(b"D" + status + nonce)


_berth_kernel()

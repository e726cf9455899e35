#!/usr/bin/env python3
"""The interpreter kernels alone (sandboxd/inside/kernels/kernel.{py,js}), over FIFOs
this test makes and reads itself, with no daemon and no sandbox: what a kernel writes
and when, where the daemon's reading would hide it.

    python3 tests/kernels_test.py

Each kernel is started as the supervisor starts it (docs/daemon.md §5.3), with its
stdout and stderr on FIFOs.  Every wait is bounded (WAIT seconds) and on what the
kernel writes.  Prints one line per failed check and cmocka-style summary lines; exits
non-zero on any failure.
"""
import os
import re
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = os.path.join(ROOT, "sandboxd", "inside", "kernels")
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
sys.path.insert(0, KERNELS)
from checks import check, finish, selected  # noqa: E402
from embed import flags  # noqa: E402  (the interpreters' flags, as the supervisor's)
WAIT = 20.0
F_SETPIPE_SZ = 1031
class Kernel:
    """A kernel over four FIFOs in a temporary directory; self.fd[name] is this side's
    end of each (req, rep, out, err), opened read-write and non-blocking, as the daemon
    holds them, so no open blocks."""

    def __init__(self, lang):
        self.dir = tempfile.mkdtemp(prefix="kernel-")
        prefix = os.path.join(self.dir, "k")
        self.fd = {}
        for name in ("req", "rep", "out", "err"):
            os.mkfifo(prefix + "-" + name)
            self.fd[name] = os.open(prefix + "-" + name, os.O_RDWR | os.O_NONBLOCK)
        self.token = b"7" * 32
        with open(os.path.join(KERNELS, "kernel." + ("py" if lang == "python" else "js"))) as f:
            src = f.read()
        argv = (["python3"] + flags("python") + ["-c", src] if lang == "python" else
                ["node"] + flags("node") + ["-e", src])
        # The kernel's stdout and stderr are opened apart from this side's ends, as the
        # supervisor opens them: a cell that sets their flags sets only its own.
        out, err = (os.open(prefix + "-" + name, os.O_WRONLY) for name in ("out", "err"))
        self.proc = subprocess.Popen(argv + [prefix, self.token.decode()], cwd=self.dir,
                                     stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        os.close(out)
        os.close(err)
        self.pending = {"rep": b"", "out": b"", "err": b""}

    def read_until(self, name, test):
        """Reads the FIFO `name` until test(bytes so far) is true; those bytes, or None
        after WAIT seconds."""
        end = time.monotonic() + WAIT
        while not test(self.pending[name]):
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.fd[name]], [], [], left)[0]:
                return None
            try:
                self.pending[name] += os.read(self.fd[name], 1 << 16)
            except BlockingIOError:
                pass
        return self.pending[name]

    def reply(self):
        """The next reply frame's body, or None: from the reply FIFO (a ready, or an end
        reply when the cell closed stderr), or the end reply right after stderr's end
        mark (docs/daemon.md §5.3), which stays in place for until_mark."""
        def whole(b):
            return len(b) >= 4 and len(b) >= 4 + struct.unpack("<I", b[:4])[0]

        def after_mark(b):  # where an end reply after stderr's mark starts, or -1
            if whole(b) and b[4:5] == b"D":
                return 0  # until_mark("err") took the mark already
            for m in re.finditer(rb"\x1f[^\x1e\x1f]{32}\x1e", b):
                if whole(b[m.end():]) and b[m.end() + 4:m.end() + 5] == b"D":
                    return m.end()
            return -1

        end = time.monotonic() + WAIT
        while True:
            if whole(self.pending["rep"]):
                b = self.pending["rep"]
                size = struct.unpack("<I", b[:4])[0]
                self.pending["rep"] = b[4 + size:]
                return b[4:4 + size]
            at = after_mark(self.pending["err"])
            if at >= 0:
                b = self.pending["err"]
                size = struct.unpack("<I", b[at:at + 4])[0]
                self.pending["err"] = b[:at] + b[at + 4 + size:]
                return b[at + 4:at + 4 + size]
            left = end - time.monotonic()
            fds = [self.fd["rep"], self.fd["err"]]
            ready = select.select(fds, [], [], left)[0] if left > 0 else []
            if not ready:
                return None
            for name in ("rep", "err"):
                if self.fd[name] in ready:
                    try:
                        self.pending[name] += os.read(self.fd[name], 1 << 16)
                    except BlockingIOError:
                        pass

    def until_mark(self, name, nonce):
        """What the kernel wrote on `name` (out or err) before nonce's end mark, or None."""
        mark = b"\x1f" + nonce + b"\x1e"
        b = self.read_until(name, lambda b: mark in b)
        if b is None:
            return None
        at = b.index(mark)
        self.pending[name] = b[at + len(mark):]
        return b[:at]

    def drop_output(self):
        """Drops what the streams hold, as the daemon does before the kernel's ready."""
        for name in ("out", "err"):
            self.pending[name] = b""
            try:
                while os.read(self.fd[name], 1 << 16):
                    pass
            except BlockingIOError:
                pass

    def send(self, nonce, code):
        body = nonce + code.encode()
        os.write(self.fd["req"], struct.pack("<I", len(body)) + body)

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        for fd in self.fd.values():
            os.close(fd)


def started(lang, name):
    """A kernel of `lang` that said ready, the output of its warm-up dropped."""
    k = Kernel(lang)
    check(name + ": ready", k.reply() == b"R" + k.token)
    k.drop_output()
    return k


def check_cells(k, name, cases):
    """Runs each case (what, code, stdout, stderr, reply status) on kernel k in turn,
    and checks the cell's stdout and stderr up to its end marks and its reply (which
    says a process was started when `what` names a fork)."""
    for i, (what, code, out_want, err_want, status) in enumerate(cases):
        nonce = (b"%x" % (i + 1)) * 32
        k.send(nonce, code)
        out = k.until_mark("out", nonce)
        err = k.until_mark("err", nonce)
        check(name + ": " + what + ": stdout", out == out_want, out)
        check(name + ": " + what + ": stderr", err == err_want, err)
        check(name + ": " + what + ": reply", k.reply() == status + nonce + (
            b"1" if "fork" in what else b"0"))


def check_closed_stdout(k, name, code, word, status, what):
    """Last on k: a cell that closes stdout and ends with a value, which can no longer
    be printed: its stderr names `word` and its reply starts with `status`."""
    nonce = b"f" * 32
    k.send(nonce, code)
    err = k.until_mark("err", nonce)
    check(name + ": a closed stdout: " + what, err is not None and word in err, err)
    check(name + ": a closed stdout: reply", k.reply() == status + nonce + b"0")


def test_D41_python_output_a_non_blocking_stdout_left_buffered_precedes_the_end_mark():
    name = "test_D41_python_output_a_non_blocking_stdout_left_buffered_precedes_the_end_mark"
    k = Kernel("python")
    try:
        ready = k.reply()
        check(name + ": ready", ready == b"R" + k.token, ready)
        k.drop_output()  # the warm-up's (written before its ready)
        # Nothing reads stdout while the cell runs: its 4 KiB pipe fills, Python's
        # byte buffer keeps what the pipe did not take, its text wrapper more text,
        # and the cell says how many bytes stdout accepted.  The kernel must write all
        # of it before its end mark, though the stream is non-blocking and the pipe
        # still full when the cell ends.
        fcntl_ok = True
        try:
            import fcntl
            fcntl.fcntl(k.fd["out"], F_SETPIPE_SZ, 4096)
        except OSError:
            fcntl_ok = False
        check(name + ": the pipe is 4 KiB", fcntl_ok)
        nonce = b"a" * 32
        k.send(nonce, "import os, sys\nos.set_blocking(1, False)\n"
                      "try:\n    n = sys.stdout.buffer.write(b'x' * 20000)\n"
                      "except BlockingIOError as e:\n    n = e.characters_written\n"
                      "sys.stdout.write('z' * 3000)\n"  # and text, not yet encoded
                      "sys.stderr.write('%d\\n' % n)\nsys.stderr.flush()\nNone")
        said = k.read_until("err", lambda b: b"\n" in b)
        accepted = int(said.split(b"\n")[0]) if said else -1
        check(name + ": some of it was left in the buffer", 4096 < accepted < 20000, said)
        out = k.until_mark("out", nonce)
        check(name + ": all of it before the mark", out == b"x" * accepted + b"z" * 3000,
              None if out is None else "%d bytes" % len(out))
        err = k.until_mark("err", nonce)
        check(name + ": stderr", err == b"%d\n" % accepted, err)
        check(name + ": the reply", k.reply() == b"D0" + nonce + b"0")
        # The stream was made blocking again for the end: the next cell's output is whole.
        nonce = b"b" * 32
        k.send(nonce, "print('y' * 10000)")
        check(name + ": the next cell", k.until_mark("out", nonce) == b"y" * 10000 + b"\n")
    finally:
        k.stop()


# Python that makes the kernel's stdout non-blocking, each way end_cell must notice
# (kernel.py: unblock): then it makes the stream blocking again before it flushes.
NON_BLOCKING_WAYS = [
    ("fcntl.fcntl", "import fcntl\n"
     "fcntl.fcntl(1, fcntl.F_SETFL, fcntl.fcntl(1, fcntl.F_GETFL) | os.O_NONBLOCK)\n"),
    ("os.set_blocking on a dup", "os.set_blocking(os.dup(1), False)\n"),
    ("a ctypes call", "import ctypes\nlibc = ctypes.CDLL(None)\n"
     "libc.fcntl(1, 4, libc.fcntl(1, 3, 0) | os.O_NONBLOCK)\n"),  # F_SETFL, F_GETFL
    ("a child", "import subprocess\nsubprocess.run([sys.executable, '-c', "
     "'import os; os.set_blocking(1, False)'], check=True)\n"),
]


def test_D41_python_stdout_made_non_blocking_any_way_is_blocking_again_for_the_end():
    """The D41 case with the flag set each other way, and by a child a cell started after
    that cell ended: end_cell makes the stream blocking again from the first cell that
    may have changed it on, so every byte precedes the end mark."""
    name = "test_D41_python_stdout_made_non_blocking_any_way_is_blocking_again_for_the_end"
    fill = ("try:\n    n = sys.stdout.buffer.write(b'x' * 20000)\n"
            "except BlockingIOError as e:\n    n = e.characters_written\n"
            "sys.stdout.write('z' * 3000)\n"
            "sys.stderr.write('%d\\n' % n)\nsys.stderr.flush()\nNone")
    later = ("import subprocess\ngo = os.path.abspath('go')\n"
             "child = subprocess.Popen([sys.executable, '-c', 'import os, time\\n"
             "while not os.path.exists(%r): time.sleep(0.005)\\n"
             "os.set_blocking(1, False)' % go])\n")
    for what, code in NON_BLOCKING_WAYS + [("a child, after its cell", None)]:
        k = Kernel("python")
        try:
            check(name + ": " + what + ": ready", k.reply() == b"R" + k.token)
            k.drop_output()
            import fcntl
            fcntl.fcntl(k.fd["out"], F_SETPIPE_SZ, 4096)
            if code is None:  # the child sets the flag while the next cell runs
                k.send(b"c" * 32, "import os, sys\n" + later)
                check(name + ": " + what + ": started",
                      k.reply() == b"D0" + b"c" * 32 + b"1")
                k.drop_output()
                code = "open('go', 'w').close()\nchild.wait()\n"
            nonce = b"a" * 32
            k.send(nonce, "import os, sys\n" + code + fill)
            said = k.read_until("err", lambda b: b"\n" in b)
            accepted = int(said.split(b"\n")[0]) if said and said[:1].isdigit() else -1
            check(name + ": " + what + ": some of it was left in the buffer",
                  4096 < accepted < 20000, said)
            out = k.until_mark("out", nonce)
            check(name + ": " + what + ": all of it before the mark",
                  out == b"x" * accepted + b"z" * 3000,
                  None if out is None else "%d bytes" % len(out))
            k.until_mark("err", nonce)
            check(name + ": " + what + ": the reply", k.reply()[:34] == b"D0" + nonce)
        finally:
            k.stop()


def test_D28_D29_warm_up_leaves_no_frame_and_no_trace_before_the_first_cell():
    """Each kernel runs two cells before its ready (the JavaScript one through its own
    request FIFO): after ready, the first reply is the first cell's, and the cell finds
    no `_` and is numbered 1."""
    for lang, code, wants in (
            ("python", "print(repr(globals().get('_')))\n1/0", b"cell 1"),
            ("javascript", "console.log(typeof _); null.x", b"cell1.js")):
        name = "test_D28_D29_warm_up_leaves_no_frame_and_no_trace_before_the_first_cell: " + lang
        k = started(lang, name)
        try:
            nonce = b"c" * 32
            k.send(nonce, code)
            out = k.until_mark("out", nonce)
            err = k.until_mark("err", nonce)
            check(name + ": no _", out in (b"None\n", b"undefined\n"), out)
            check(name + ": numbered 1", err is not None and wants in err, err)
            check(name + ": the first reply is the cell's", k.reply() == b"D1" + nonce + b"0")
            check(name + ": and alone", k.pending["rep"] == b"", k.pending["rep"])
        finally:
            k.stop()


def test_D28_python_last_value_repr_in_order_wherever_stdout_goes():
    """The last expression's repr goes out with the stdout end mark in one write when it
    can (sandboxd/inside/kernels/kernel.py show_value): after what the cell printed,
    whole when longer than a pipe takes at once, to a sys.stdout the cell replaced, and
    a stdout the cell closed fails the cell as print would."""
    name = "test_D28_python_last_value_repr_in_order_wherever_stdout_goes"
    k = started("python", name)
    try:
        cases = [
            ("after output left unflushed", "print('a', end='')\n'\u00e9' * 2",
             "a'\u00e9\u00e9'\n".encode(), b"", b"D0"),
            ("longer than PIPE_BUF", "'q' * 9000", b"'" + b"q" * 9000 + b"'\n", b"", b"D0"),
            ("a lone surrogate, as the stream encodes it", "'\\ud800'",
             b"'\\ud800'\n", b"", b"D0"),
            ("to a sys.stdout the cell replaced",
             "import io, sys\nbox = io.StringIO()\nsys.stdout = box\n42", b"", b"", b"D0"),
            ("put back, the replaced stream held it",
             "sys.stdout = sys.__stdout__\nbox.getvalue()", b"'42\\n'\n", b"", b"D0"),
            ("a forked child's copy, then the kernel's",
             "import os\npid = os.fork()\nif pid == 0:\n    pass\nelse:\n"
             "    os.waitpid(pid, 0)\n'x' if pid == 0 else 'y'", b"'x'\n'y'\n", b"", b"D0"),
        ]
        check_cells(k, name, cases)
        check_closed_stdout(k, name, "import os\nos.close(1)\n7", b"OSError", b"D1",
                            "the cell's error")
    finally:
        k.stop()


def test_D41_python_each_stream_flushed_once_before_the_end_marks():
    """A cell's text still buffered in any of its streams comes before the end marks, and
    a stream that is both sys.stdout and sys.stderr is flushed once, not twice
    (kernel.py flush: every flush of a buffered stream reads the clock in Python 3.11,
    a system call in a young gVisor sandbox)."""
    name = "test_D41_python_each_stream_flushed_once_before_the_end_marks"
    k = started("python", name)
    try:
        counted = ("import sys\n"
                   "class Counted:\n"
                   "    flushes = 0\n"
                   "    def write(self, s):\n"
                   "        return sys.__stdout__.write(s)\n"
                   "    def flush(self):\n"
                   "        Counted.flushes += 1\n"
                   "        sys.__stdout__.flush()\n"
                   "sys.stdout = sys.stderr = Counted()\n"
                   "written = sys.__stdout__.write('a')\n"
                   "written = sys.__stderr__.write('b')")
        cases = [
            ("one stream as sys.stdout and sys.stderr, the kernel's own holding text",
             counted, b"a", b"b", b"D0"),
            ("that cell's end flushed it once", "Counted.flushes", b"1\n", b"", b"D0"),
            ("put back, text held in both", "sys.stdout, sys.stderr = sys.__stdout__, "
             "sys.__stderr__\nprint('c', end='')\nprint('d', end='', file=sys.stderr)",
             b"c", b"d", b"D0"),
        ]
        check_cells(k, name, cases)
    finally:
        k.stop()


def test_D41_end_reply_in_the_write_of_the_stderr_mark_or_on_the_reply_fifo():
    """Each kernel's end reply comes right after stderr's end mark, in the same write
    (nothing on the reply FIFO), and on the reply FIFO when the cell closed stderr."""
    for lang, code, close in (
            ("python", "1 + 1", "import os\nos.close(2)"),
            ("javascript", "1 + 1", "require('fs').closeSync(2)")):
        name = "test_D41_end_reply_in_the_write_of_the_stderr_mark_or_on_the_reply_fifo: " + lang
        k = started(lang, name)
        try:
            nonce = b"1" * 32
            k.send(nonce, code)
            check(name + ": stdout", k.until_mark("out", nonce) == b"2\n")
            check(name + ": stderr", k.until_mark("err", nonce) == b"")
            body = b"D0" + nonce + b"0"
            check(name + ": the reply follows the mark", k.pending["err"] ==
                  struct.pack("<I", len(body)) + body, k.pending["err"])
            check(name + ": none on the reply FIFO",
                  not select.select([k.fd["rep"]], [], [], 0.2)[0])
            check(name + ": read as the reply", k.reply() == body)
            nonce = b"2" * 32
            k.send(nonce, close)
            k.until_mark("out", nonce)
            on_fifo = k.read_until("rep", lambda b: len(b) >= 4)
            check(name + ": stderr closed: the reply on the reply FIFO", on_fifo is not None)
            check(name + ": stderr closed: the reply", k.reply() == b"D0" + nonce + b"0")
        finally:
            k.stop()


def test_D28_javascript_last_value_in_order_wherever_stdout_goes():
    """kernel.js's last value likewise goes out with the stdout end mark in one write when
    it can (showValue): after what the cell printed, before what a promise callback of the
    cell prints after it, whole when longer than a pipe takes at once, through a corked
    stream, to a process.stdout the cell replaced, and said on stderr when the cell closed
    stdout."""
    name = "test_D28_javascript_last_value_in_order_wherever_stdout_goes"
    k = started("javascript", name)
    try:
        cases = [
            ("after output", "console.log('a'); '\u00e9'.repeat(2)",
             "a\n'\u00e9\u00e9'\n".encode(), b"", b"D0"),
            ("before a promise callback's output",
             "Promise.resolve().then(() => console.log('x')); 5", b"5\nx\n", b"", b"D0"),
            ("before a callback's output a few ticks later",
             "(async () => { for (let i = 0; i < 3; i++) await null; console.log('y') })(); 6",
             b"6\ny\n", b"", b"D0"),
            ("longer than PIPE_BUF", "'q'.repeat(9000)", b"'" + b"q" * 9000 + b"'\n", b"",
             b"D0"),
            ("through a corked stream", "process.stdout.cork(); console.log('c'); 7",
             b"c\n7\n", b"", b"D0"),
            ("to a process.stdout the cell replaced",
             "globalThis.real = process.stdout; globalThis.box = [];\n"
             "Object.defineProperty(process, 'stdout', { configurable: true,\n"
             "  get: () => ({ write: (s) => box.push(s) }) });\n42", b"", b"", b"D0"),
            ("put back, the replaced stream held it",
             "Object.defineProperty(process, 'stdout', { configurable: true, get: () => real });\n"
             "box", b"[ '42\\n' ]\n", b"", b"D0"),
        ]
        check_cells(k, name, cases)
        check_closed_stdout(k, name, "require('fs').closeSync(1); 8", b"EBADF", b"D0",
                            "said on stderr")
    finally:
        k.stop()


class Signals:
    """A FIFO `sig` in kernel k's directory that cells' callbacks write words to
    (fs.appendFileSync('sig', 'word\n')), read here without blocking the kernel."""

    def __init__(self, k):
        path = os.path.join(k.dir, "sig")
        os.mkfifo(path)
        self.fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        self.got = b""

    def read(self):
        try:
            self.got += os.read(self.fd, 1 << 16)
        except BlockingIOError:
            pass
        return self.got

    def wait(self, word):
        """Whether `word` came within WAIT seconds (taken off what came)."""
        end = time.monotonic() + WAIT
        line = word + b"\n"
        while line not in self.got:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return False
            self.read()
        self.got = self.got.replace(line, b"", 1)
        return True

    def close(self):
        os.close(self.fd)


def test_D41_javascript_work_a_cell_leaves_runs_while_the_kernel_waits():
    """Between cells kernel.js waits for its next request in a read of its own only when
    Node's loop has nothing alive (docs/daemon.md §5.3): what a cell leaves running -- a
    timer, one unreferenced, an unreferenced immediate, threadpool work, a child process,
    V8's (an asynchronous compile), a worker, a signal listener -- still runs while the
    kernel waits, with no further request, and what it prints comes between cells, where
    the daemon drops it."""
    name = "test_D41_javascript_work_a_cell_leaves_runs_while_the_kernel_waits"
    k = started("javascript", name)
    sig = Signals(k)
    late = "console.log('late'); require('fs').appendFileSync('sig', '%s\\n')"
    cases = [  # the ones that leave a handle unreferenced come last: see kernel.js
        ("a timer", "setTimeout(() => { %s }, 20); 0" % (late % "timer"), b"timer"),
        ("an unreferenced timer", "setTimeout(() => { %s }, 20).unref(); 0"
         % (late % "unref-timer"), b"unref-timer"),
        ("an unreferenced immediate", "setImmediate(() => { %s }).unref(); 0"
         % (late % "unref-immediate"), b"unref-immediate"),
        ("threadpool work", "require('zlib').gzip('x', () => { %s }); 0" % (late % "zlib"),
         b"zlib"),
        ("a child process", "require('child_process').execFile('true', () => { %s }); 0"
         % (late % "child"), b"child"),
        ("V8's work", "WebAssembly.compile(new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0]))\n"
         "  .then(() => { %s }); 0" % (late % "wasm"), b"wasm"),
        ("a worker", "new (require('worker_threads').Worker)(\n"
         "  \"require('worker_threads').parentPort.postMessage(1)\", { eval: true })\n"
         "  .on('message', () => { %s }); 0" % (late % "worker"), b"worker"),
        ("a signal listener", "process.on('SIGUSR2', () => { %s }); 0" % (late % "signal"),
         b"signal"),
    ]
    try:
        for i, (what, code, word) in enumerate(cases):
            nonce = (b"%x" % (i + 1)) * 32
            k.send(nonce, code)
            out = k.until_mark("out", nonce)
            k.until_mark("err", nonce)
            check(name + ": " + what + ": the cell", out == b"0\n" and
                  k.reply() == b"D0" + nonce + (b"1" if what == "a child process" else b"0"),
                  out)
            if what == "a signal listener":
                os.kill(k.proc.pid, signal.SIGUSR2)
            check(name + ": " + what + ": ran with no request", sig.wait(word), sig.got)
            between = k.read_until("out", lambda b: b"late\n" in b)
            check(name + ": " + what + ": printed between cells", between == b"late\n", between)
            k.drop_output()  # as the daemon does
            nonce = (b"%x" % (i + 1)) * 31 + b"e"
            k.send(nonce, "1")
            out = k.until_mark("out", nonce)
            k.until_mark("err", nonce)
            check(name + ": " + what + ": the next cell",
                  out == b"1\n" and k.reply() == b"D0" + nonce + b"0", out)
    finally:
        sig.close()
        k.stop()


SLEEPS_IN = {  # the kernel functions /proc/PID/wchan names (Linux 5: ep_poll, 6: do_epoll_wait)
    "pipe_read": ("pipe_read",),  # a read of a pipe or FIFO (anon_pipe_read in Linux 6.x)
    "epoll": ("epoll_wait", "ep_poll"),  # libuv's wait
}


def blocked_in(pid, where):
    """Whether process pid comes to sleep in `where` (a key of SLEEPS_IN) within WAIT
    seconds, from its /proc wchan."""
    end = time.monotonic() + WAIT
    while time.monotonic() < end:
        with open("/proc/%d/wchan" % pid) as f:
            at = f.read()
        if any(name in at for name in SLEEPS_IN[where]):
            return True
        time.sleep(0.001)
    return False


def test_D27_javascript_kernel_waits_in_a_read_only_when_its_loop_is_idle():
    """Between cells kernel.js sleeps in a read of the request FIFO when nothing is left
    in Node's loop, and in libuv's epoll wait while a cell's timer is pending: back in the
    read once a timer has fired, or from the next cell on when it was unreferenced; after
    a cell unreferenced a handle it waits in epoll for good (docs/daemon.md §5.3)."""
    name = "test_D27_javascript_kernel_waits_in_a_read_only_when_its_loop_is_idle"
    k = started("javascript", name)
    sig = Signals(k)
    fired = "() => require('fs').appendFileSync('sig', 'fired\\n')"
    try:
        cases = [  # what, code, where it sleeps first, where once its timer fired
            ("a trivial cell", "1", "pipe_read", None),
            ("a timer", "setTimeout(%s, 500); 2" % fired, "epoll", "pipe_read"),
            ("an unreferenced timer", "setTimeout(%s, 500).unref(); 3" % fired, "epoll",
             "epoll"),
            ("the next cell", "4", "pipe_read", None),
            ("a signal listener", "void process.on('SIGUSR2', () => {})", "epoll", None),
            ("a trivial cell after it", "6", "epoll", None),
        ]
        for i, (what, code, first, then) in enumerate(cases):
            nonce = (b"%x" % (i + 1)) * 32
            k.send(nonce, code)
            k.until_mark("out", nonce)
            k.until_mark("err", nonce)
            check(name + ": " + what + ": answered", k.reply() == b"D0" + nonce + b"0")
            check(name + ": " + what + ": waits in " + first, blocked_in(k.proc.pid, first))
            if then:
                check(name + ": " + what + ": its timer fired", sig.wait(b"fired"), sig.got)
                check(name + ": " + what + ": then in " + then, blocked_in(k.proc.pid, then))
    finally:
        sig.close()
        k.stop()

def test_D27_javascript_kernel_outlives_cells_that_reach_into_its_wait():
    """kernel.js waits between cells where Node would emit 'beforeExit': a cell's own
    listener for it is never called, a cell that replaces process.emit does not end the
    kernel, and a cell awaiting what nothing alive will resolve keeps its kernel (an
    unreferenced timer of the same cell still fires)."""
    name = "test_D27_javascript_kernel_outlives_cells_that_reach_into_its_wait"
    k = started("javascript", name)
    sig = Signals(k)
    try:
        check_cells(k, name, [
            ("a beforeExit listener",
             "void process.on('beforeExit', () => require('fs').appendFileSync('sig', 'exit\\n'))",
             b"", b"", b"D0"),
            ("the next cell", "1", b"1\n", b"", b"D0"),
            ("process.emit replaced",
             "globalThis.realEmit = process.emit; process.emit = () => false; 2",
             b"2\n", b"", b"D0"),
            ("the next cell", "3", b"3\n", b"", b"D0"),
            ("and the next", "4", b"4\n", b"", b"D0"),
            ("put back", "process.emit = realEmit; 5", b"5\n", b"", b"D0"),
            ("the next cell", "6", b"6\n", b"", b"D0"),
        ])
        check(name + ": the cell's beforeExit listener was never called",
              b"exit" not in sig.read(), sig.got)
        k.send(b"a" * 32, "setTimeout(() => require('fs').appendFileSync('sig', 'fired\\n'), 20)"
               ".unref();\nawait new Promise(() => {})")
        check(name + ": a cell awaiting forever keeps its kernel", sig.wait(b"fired"), sig.got)
        check(name + ": still running", k.proc.poll() is None, k.proc.returncode)
    finally:
        sig.close()
        k.stop()


def main():
    for test in (test_D41_python_output_a_non_blocking_stdout_left_buffered_precedes_the_end_mark,
                 test_D41_python_stdout_made_non_blocking_any_way_is_blocking_again_for_the_end,
                 test_D28_D29_warm_up_leaves_no_frame_and_no_trace_before_the_first_cell,
                 test_D28_python_last_value_repr_in_order_wherever_stdout_goes,
                 test_D41_python_each_stream_flushed_once_before_the_end_marks,
                 test_D41_end_reply_in_the_write_of_the_stderr_mark_or_on_the_reply_fifo,
                 test_D28_javascript_last_value_in_order_wherever_stdout_goes,
                 test_D41_javascript_work_a_cell_leaves_runs_while_the_kernel_waits,
                 test_D27_javascript_kernel_waits_in_a_read_only_when_its_loop_is_idle,
                 test_D27_javascript_kernel_outlives_cells_that_reach_into_its_wait):
        if not selected(test.__name__):
            continue
        try:
            test()
        except Exception as e:  # a harness error fails the test, never the run
            check(test.__name__, False, repr(e))
    return finish()


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Tests of bench/report.py's runner: a benchmark still running after BENCH_TIMEOUT
seconds is killed with what it started and reported failed, and `make bench` goes on;
one that ends is not reported.

    python3 tests/report_test.py

Prints one line per failed check and cmocka-style summary lines; exits non-zero on any
failure.
"""
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
import report  # noqa: E402
from checks import check, finish  # noqa: E402


def alive(pid):
    """Whether pid is a process that has not ended (a zombie has)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_hung_benchmark_is_killed_with_what_it_started_and_reported():
    name = "test_a_hung_benchmark_is_killed_with_what_it_started_and_reported"
    d = tempfile.mkdtemp(prefix="report-")
    os.makedirs(os.path.join(d, "bench"))
    pidfile = os.path.join(d, "child.pid")
    scripts = {
        "hangs": "#!/bin/sh\nsleep 300 &\necho $! > %s\nsleep 300\n" % pidfile,
        "ends": "#!/bin/sh\nexit 0\n",
    }
    for script, text in scripts.items():
        path = os.path.join(d, "bench", script)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)
    os.environ["BENCH_TIMEOUT"] = "1"
    report.plan = lambda: [("hangs", "hangs", []), ("ends", "ends", [])]
    t0 = time.monotonic()
    failed = report.run_all(d, os.path.join(d, "json"))
    took = time.monotonic() - t0
    check(name + ": the hung one is reported, alone", [f["bench"] for f in failed] == ["hangs"],
          failed)
    check(name + ": said killed", bool(failed) and failed[0]["exit"] == "killed after 1 s",
          failed)
    check(name + ": not waited for", took < 30, took)
    child = int(open(pidfile).read()) if os.path.exists(pidfile) else 0
    end = time.monotonic() + 10
    while child and alive(child) and time.monotonic() < end:
        time.sleep(0.05)
    check(name + ": what it started is gone too", child and not alive(child), child)


def main():
    try:
        test_a_hung_benchmark_is_killed_with_what_it_started_and_reported()
    except Exception as e:  # a harness error fails the test, never the run
        check("test_a_hung_benchmark_is_killed_with_what_it_started_and_reported", False,
              repr(e))
    return finish()


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Tests of bench/report.py: a benchmark still running after BENCH_TIMEOUT seconds is
killed with what it started and reported failed, and `make bench` goes on; one that
ends is not reported.  A serve_load point is its run of median p99, and a turn lost in
any of its runs still counts.

    python3 tests/report_test.py

Prints one line per failed check and cmocka-style summary lines; exits non-zero on any
failure.
"""
import json
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


def test_a_serve_point_is_its_run_of_median_p99_with_every_runs_losses():
    name = "test_a_serve_point_is_its_run_of_median_p99_with_every_runs_losses"
    frags = tempfile.mkdtemp(prefix="report-")
    runs = [(6900.0, 29.0, 0, 0, 0), (5200.0, 44.0, 1, 1, 0), (7000.0, 26.0, 0, 0, 2)]
    for k, (rate, p99, lost, unfinished, wrong) in enumerate(runs):
        frag = {"bench": "serve_load", "params": {"conversations": 100},
                "rate": {"value": rate, "unit": "turns/s"},
                "turn_latency": {"percentiles": {"p99": p99}, "max": p99},
                "lost": {"value": lost, "unit": "turns"},
                "never_finished": {"value": unfinished, "unit": "turns"},
                "misclassified": {"value": wrong, "unit": "turns"}}
        with open(os.path.join(frags, "serve_load-100-r%d.json" % k), "w") as f:
            json.dump(frag, f)
    got = report.median_serve_round(frags, "serve_load-100", 3)
    check(name + ": the median by p99", got and report.val(got["rate"]) == 6900.0, got)
    check(name + ": every run, in the order they ran",
          got and [x["p99"] for x in got["rounds"]] == [29.0, 44.0, 26.0], got)
    check(name + ": the runs' losses are counted",
          got and report.figures.serve_losses(got) == (2, 2), got)
    check(name + ": none ran is none",
          report.median_serve_round(frags, "serve_load-300", 3) is None)


def main():
    for test in (test_a_hung_benchmark_is_killed_with_what_it_started_and_reported,
                 test_a_serve_point_is_its_run_of_median_p99_with_every_runs_losses):
        try:
            test()
        except Exception as e:  # a harness error fails the test, never the run
            check(test.__name__, False, repr(e))
    return finish()


if __name__ == "__main__":
    sys.exit(main())

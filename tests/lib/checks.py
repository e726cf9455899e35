"""checks.py — the cmocka-style frame of the Python test programs (tests/*_test.py and
tests/faultproxy_selftest.py), so tests/run.sh counts them like the C ones: check()
each named condition, then `sys.exit(finish())`.

A check's name is its test's name, optionally followed by ": what it checks".
TEST_FILTER, as in the C suites (tests/lib/testfilter.c): a glob (* and ?) over test
names; the checks it leaves out are not counted, and selected() lets a program skip the
work of a test it leaves out.
"""
import fnmatch
import os

PASSED, FAILED = [], []
_FILTER = os.environ.get("TEST_FILTER")


def selected(name):
    """Whether TEST_FILTER (if set) selects the test of this check name."""
    return not _FILTER or fnmatch.fnmatchcase(name.split(":")[0], _FILTER)


def check(name, cond, detail=""):
    """Counts a check; a failed one is printed at once with its detail."""
    if not selected(name):
        return
    (PASSED if cond else FAILED).append(name)
    if not cond:
        print("FAIL %s %s" % (name, detail), flush=True)


def finish():
    """Prints cmocka's summary lines; the exit status (1 when a check failed)."""
    print("[  PASSED  ] %d test(s)." % len(PASSED))
    if FAILED:
        print("[  FAILED  ] %d test(s), listed below:" % len(FAILED))
        for name in FAILED:
            print("[  FAILED  ] " + name)
    return 1 if FAILED else 0

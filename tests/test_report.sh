#!/bin/sh
# bench/report.py kills a benchmark that hangs, with what it started, and reports it
# failed (tests/report_test.py).
exec python3 tests/report_test.py

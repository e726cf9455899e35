#!/bin/sh
# The interpreter kernels alone over FIFOs the test reads itself (tests/kernels_test.py).
exec python3 tests/kernels_test.py

#!/bin/sh
# The README's table of figures is the one bench/results.json gives, and bench/figures.py
# decides each target from the numbers (tests/figures_test.py).
exec python3 tests/figures_test.py

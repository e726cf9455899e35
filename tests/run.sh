#!/bin/sh
# Runs every test program given on the command line (cmocka binaries and any other
# executable that prints cmocka's summary lines), then prints one closing line
# "N passed, N failed, N skipped" and exits non-zero when anything failed or a program
# crashed.  Skips are counted so that none passes unseen; under CI=true the suites turn
# a skip for a missing capability into a failure (tests/lib/capability.h), so what is
# left skipped there is skipped by design, each with its reason in the log.
passed=0; failed=0; skipped=0; crashed=""
log=$(mktemp); trap 'rm -f "$log"' EXIT
for t in "$@"; do
    name=$(basename "$t")
    echo "== $name"
    started=$(date +%s)
    # A hung program fails instead of stalling the run (TEST_TIMEOUT seconds each).
    case "$t" in
        *.sh) timeout -k 10 "${TEST_TIMEOUT:-600}" "$t" >"$log" 2>&1; rc=$? ;;
        *) timeout -k 10 "${TEST_TIMEOUT:-600}" $WRAP "$t" >"$log" 2>&1; rc=$? ;;  # WRAP: valgrind
    esac
    [ "$rc" -eq 124 ] && echo "$name: timed out after ${TEST_TIMEOUT:-600} s" >>"$log"
    cat "$log"
    echo "-- $name: $(( $(date +%s) - started )) s"   # where a long run's time goes
    p=$(sed -n 's/^\[  PASSED  \] \([0-9][0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    f=$(sed -n 's/^\[  FAILED  \] \([0-9][0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    k=$(sed -n 's/^\[  SKIPPED \] \([0-9][0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + k))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        # A crash or an exit before cmocka's summary still counts as a failure.
        failed=$((failed + 1)); crashed="$crashed $name(rc=$rc)"
    fi
done
[ -n "$crashed" ] && echo "crashed or failed outside a test:$crashed"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]

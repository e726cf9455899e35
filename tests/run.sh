#!/bin/sh
# Runs every test program given on the command line (cmocka binaries and any other
# executable that prints cmocka's summary lines), then prints one closing line
# "N passed, N failed" and exits non-zero when anything failed or a program crashed.
passed=0; failed=0; crashed=""
log=$(mktemp); trap 'rm -f "$log"' EXIT
for t in "$@"; do
    name=$(basename "$t")
    echo "== $name"
    case "$t" in
        *.sh) "$t" >"$log" 2>&1; rc=$? ;;
        *) $WRAP "$t" >"$log" 2>&1; rc=$? ;;   # WRAP: e.g. valgrind, from check-valgrind
    esac
    cat "$log"
    p=$(sed -n 's/^\[  PASSED  \] \([0-9][0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    f=$(sed -n 's/^\[  FAILED  \] \([0-9][0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    passed=$((passed + p)); failed=$((failed + f))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        # A crash or an exit before cmocka's summary still counts as a failure.
        failed=$((failed + 1)); crashed="$crashed $name(rc=$rc)"
    fi
done
[ -n "$crashed" ] && echo "crashed or failed outside a test:$crashed"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]

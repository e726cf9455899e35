# shtest.sh — the cmocka-style frame of the shell test programs (tests/test_*.sh), so
# tests/run.sh counts them like the C ones.  Source it, define test_NAME functions,
# `run NAME` each, then `finish`.  $work is a scratch directory removed at exit.
work=$(mktemp -d "${TMPDIR:-/tmp}/berth-shtest.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
passed=0
failed_names=""

run() {   # run NAME: the test function test_NAME, its output shown only on failure
    name=$1
    # TEST_FILTER, as in the C suites (tests/lib/testfilter.c): a glob over test_NAME
    # shell patterns (* and ?); the tests it leaves out are not run and not counted.
    if [ -n "${TEST_FILTER:-}" ]; then
        case "test_$name" in $TEST_FILTER) ;; *) return 0 ;; esac
    fi
    echo "[ RUN      ] $name"
    if "test_$name" > "$work/$name.log" 2>&1; then
        echo "[       OK ] $name"
        passed=$((passed + 1))
    else
        sed 's/^/    /' "$work/$name.log" | tail -40
        echo "[  FAILED  ] $name"
        failed_names="$failed_names $name"
    fi
}

has() { grep -qF -- "$2" "$1" || { echo "missing in $1: $2"; return 1; }; }      # a string
has_re() { grep -qE -- "$2" "$1" || { echo "missing in $1: $2"; return 1; }; }   # a regex

finish() {   # the summary lines, and the exit status
    echo "[  PASSED  ] $passed test(s)."
    if [ -n "$failed_names" ]; then
        n=$(echo $failed_names | wc -w)
        echo "[  FAILED  ] $n test(s), listed below:"
        for f in $failed_names; do echo "[  FAILED  ] $f"; done
        exit 1
    fi
    exit 0
}

# start_sandboxd NAME ARGS...: starts $BUILD/sandboxd on a free loopback port with ARGS,
# its log in $work/NAME.log; sets $pid and $url.  The `listening URL` line is read from
# a FIFO, so this waits exactly until the daemon serves, or fails at once if it dies.
start_sandboxd() {
    sd_name=$1; shift
    mkfifo "$work/$sd_name.out" || return 1
    "$BUILD/sandboxd" --listen 127.0.0.1:0 "$@" > "$work/$sd_name.out" 2> "$work/$sd_name.log" &
    pid=$!
    url=
    IFS= read -r sd_line < "$work/$sd_name.out" && url=${sd_line#listening }
    [ -n "$url" ] && [ "$url" != "$sd_line" ] && return 0
    cat "$work/$sd_name.log"
    url=
    return 1
}

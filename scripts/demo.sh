#!/bin/sh
# demo.sh — `make demo`: start a local sandboxd, replay the demo conversation through
# the default hooks (scripts/code_chat.lua) with the scripted model, stop the daemon.
#
#   BERTH_PROVIDER=auto|gvisor|bwrap|process|echo   the sandboxd provider (default auto:
#                              the strongest tier whose start-up smoke test passes here;
#                              echo is a protocol-correct daemon that runs nothing)
#   BUILD=build                                where make put the binaries
set -u
BUILD=${BUILD:-build}
provider=${BERTH_PROVIDER:-auto}
here=$(cd "$(dirname "$0")" && pwd)

work=$(mktemp -d "${TMPDIR:-/tmp}/berth-demo.XXXXXX") || exit 1
daemon_pid=
cleanup() {
    if [ -n "$daemon_pid" ]; then
        kill -TERM "$daemon_pid" 2>/dev/null
        wait "$daemon_pid" 2>/dev/null
    fi
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

# A fresh token, readable only by us.
umask 077
od -An -N24 -tx1 /dev/urandom | tr -d ' \n' > "$work/token"
echo >> "$work/token"

# sandboxd prints one `listening URL` line once it serves: read it from a FIFO, which
# blocks until the line is there and ends at once if the daemon dies first.
mkfifo "$work/daemon.out"
"$BUILD/sandboxd" --listen 127.0.0.1:0 --token-file "$work/token" --provider "$provider" \
    > "$work/daemon.out" 2> "$work/daemon.log" &
daemon_pid=$!
exec 3< "$work/daemon.out"
url=
IFS= read -r line <&3 && url=${line#listening }
if [ -z "$url" ] || [ "$url" = "$line" ]; then
    echo "demo: sandboxd --provider $provider did not start:" >&2
    cat "$work/daemon.log" >&2
    exit 1
fi
echo "demo: sandboxd --provider $provider listening at $url"
grep -h 'serving plimsoll' "$work/daemon.log" | sed 's/^[^ ]* /demo: /'

# With auto, the replay reads the provider (and so its expectations) from Describe.
[ "$provider" = auto ] && set -- || set -- --provider "$provider"
"$BUILD/berth" replay --daemon "$url" --token-file "$work/token" "$@" \
    "$here/demo_conversation.lua"
rc=$?
if [ $rc -ne 0 ]; then
    echo "demo: the replay failed (exit $rc); the daemon's log:" >&2
    cat "$work/daemon.log" >&2
fi
exit $rc

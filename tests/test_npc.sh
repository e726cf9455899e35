#!/bin/sh
# test_npc.sh — the NPC game-server example (runtime/examples/npc_server.c with
# scripts/npc.lua and scripts/npc_model.lua) at a small scale against a real sandboxd
# (provider echo), and `berth serve --help`.  Prints cmocka-style summary lines for
# tests/run.sh.
set -u
BUILD=${BUILD:-build}
NPC="$BUILD/examples/npc_server"
work=$(mktemp -d "${TMPDIR:-/tmp}/berth-test-npc.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT

passed=0
failed_names=""
run() {   # run NAME: the test function test_NAME
    name=$1
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
has() { grep -qE -- "$2" "$1" || { echo "missing in $1: $2"; return 1; }; }

# 20 NPCs, 20 ticks: every line answered, every cell answered, every NPC completed.
test_small_game_against_sandboxd() {
    "$NPC" --npcs 20 --ticks 20 --tick-ms 20 --lines-per-tick 3 \
        --sandboxd "$BUILD/sandboxd" --provider echo > "$work/small.out" 2>&1
    rc=$?
    cat "$work/small.out"
    [ $rc -eq 0 ] || { echo "exit status $rc"; return 1; }
    has "$work/small.out" "^npc_server: 20 NPCs, 20 ticks of 20 ms, 3 lines per tick" &&
    has "$work/small.out" ": 60 lines, 60 turns \(0 failed, 0 lost\), [0-9]+ cells \(0 failed\), 0 hook errors" &&
    has "$work/small.out" "20 NPCs completed" &&
    has "$work/small.out" "turn latency p50 [0-9.]+ ms, p99 [0-9.]+ ms" &&
    has "$work/small.out" "^  \[tick   0\] [a-z]+ → [A-Za-z]+-[0-9]+: " &&
    has "$work/small.out" "^npc_server: ok$"
}

# With room for 3 sandboxes among 12 NPCs, sandboxes are closed for others: the NPCs
# rebuild their memory from their journals, and nothing fails.
test_sandbox_cap_rebuilds_memories() {
    "$NPC" --npcs 12 --ticks 15 --tick-ms 10 --lines-per-tick 4 --max-sandboxes 3 \
        --sandboxd "$BUILD/sandboxd" --provider echo --quiet > "$work/cap.out" 2>&1
    rc=$?
    cat "$work/cap.out"
    [ $rc -eq 0 ] || { echo "exit status $rc"; return 1; }
    has "$work/cap.out" ": 60 lines, 60 turns \(0 failed, 0 lost\)" || return 1
    n=$(sed -n 's/.*, \([0-9]*\) memories rebuilt.*/\1/p' "$work/cap.out")
    [ "${n:-0}" -gt 0 ] || { echo "no memory was rebuilt"; return 1; }
    # every line is one cell, every rebuild one more
    cells=$(sed -n 's/.* turns ([^)]*), \([0-9]*\) cells.*/\1/p' "$work/cap.out")
    [ "$cells" -eq $((60 + n)) ] || { echo "cells $cells != 60 + $n"; return 1; }
}

# An idle NPC suspends (its sandbox disposed) and rebuilds when spoken to again.
test_idle_npcs_suspend() {
    "$NPC" --npcs 4 --ticks 12 --tick-ms 50 --lines-per-tick 1 --idle-timeout 0.1 \
        --sandboxd "$BUILD/sandboxd" --provider echo --quiet > "$work/idle.out" 2>&1
    rc=$?
    cat "$work/idle.out"
    [ $rc -eq 0 ] || { echo "exit status $rc"; return 1; }
    n=$(sed -n 's/.*, \([0-9]*\) suspends,.*/\1/p' "$work/idle.out")
    [ "${n:-0}" -gt 0 ] || { echo "no NPC suspended"; return 1; }
}

test_usage() {
    "$NPC" --help | grep -q '^usage: npc_server' || return 1
    "$NPC" --no-such-flag 2>/dev/null; [ $? -eq 2 ] || { echo "a bad flag should exit 2"; return 1; }
    "$BUILD/berth" serve --help | grep -q '^usage: berth serve' || return 1
    "$BUILD/berth" serve --listen 127.0.0.1:0 2>/dev/null; [ $? -eq 2 ] || return 1
    "$BUILD/berth" --help | grep -q 'serve' || return 1
}

run small_game_against_sandboxd
run sandbox_cap_rebuilds_memories
run idle_npcs_suspend
run usage

echo "[  PASSED  ] $passed test(s)."
if [ -n "$failed_names" ]; then
    n=$(echo $failed_names | wc -w)
    echo "[  FAILED  ] $n test(s), listed below:"
    for f in $failed_names; do echo "[  FAILED  ] $f"; done
    exit 1
fi
exit 0

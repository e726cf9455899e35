#!/bin/sh
# test_npc.sh — the NPC game-server example (runtime/examples/npc_server.c with
# scripts/npc.lua and scripts/npc_model.lua) with 200 NPCs against a real sandboxd
# (provider echo), its --store keeping NPCs across restarts, its --help and --version,
# and `berth serve --help`.  Prints
# cmocka-style summary lines for tests/run.sh.
set -u
BUILD=${BUILD:-build}
NPC="$BUILD/examples/npc_server"
. tests/lib/shtest.sh

# 200 NPCs (the scale), 50 ticks of 20 ms, 20 lines per tick (the default,
# npcs / 10): every line answered, every cell answered, every NPC completed.  The local
# sandboxd holds 56 sandboxes, so NPCs lose theirs to others and rebuild their memory:
# every line is one cell and every rebuild one more.
test_200_npcs_against_sandboxd() {
    "$NPC" --npcs 200 --ticks 50 --tick-ms 20 \
        --sandboxd "$BUILD/sandboxd" --provider echo > "$work/game.out" 2>&1
    rc=$?
    tail -8 "$work/game.out"
    [ $rc -eq 0 ] || { echo "exit status $rc"; return 1; }
    has_re "$work/game.out" "^npc_server: 200 NPCs, 50 ticks of 20 ms, 20 lines per tick" &&
    has_re "$work/game.out" ": 1000 lines, 1000 turns \(0 failed, 0 lost\), [0-9]+ cells \(0 failed\), 0 hook errors" &&
    has_re "$work/game.out" "200 NPCs completed" &&
    has_re "$work/game.out" "turn latency p50 [0-9.]+ ms, p99 [0-9.]+ ms" &&
    has_re "$work/game.out" "memory: RSS [0-9]+ KiB .*, Lua state [0-9.]+ KiB \([0-9]+ B per NPC" &&
    has_re "$work/game.out" "^  \[tick   0\] [a-z]+ → [A-Za-z]+-[0-9]+: " &&
    has_re "$work/game.out" "^  \[tick  40\] [a-z]+ → [A-Za-z]+-[0-9]+: " &&
    has_re "$work/game.out" "^npc_server: ok$" || return 1
    n=$(sed -n 's/.*, \([0-9]*\) memories rebuilt.*/\1/p' "$work/game.out")
    [ "${n:-0}" -gt 0 ] || { echo "no memory was rebuilt with 56 sandboxes for 200 NPCs"; return 1; }
    cells=$(sed -n 's/.* turns ([^)]*), \([0-9]*\) cells.*/\1/p' "$work/game.out")
    [ "$cells" -eq $((1000 + n)) ] || { echo "cells $cells != 1000 + $n"; return 1; }
}

# With room for 3 sandboxes among 12 NPCs, sandboxes are closed for others: the NPCs
# rebuild their memory from their journals, and nothing fails.
test_sandbox_cap_rebuilds_memories() {
    "$NPC" --npcs 12 --ticks 15 --tick-ms 10 --lines-per-tick 4 --max-sandboxes 3 \
        --sandboxd "$BUILD/sandboxd" --provider echo --quiet > "$work/cap.out" 2>&1
    rc=$?
    cat "$work/cap.out"
    [ $rc -eq 0 ] || { echo "exit status $rc"; return 1; }
    has_re "$work/cap.out" ": 60 lines, 60 turns \(0 failed, 0 lost\)" || return 1
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

# --store: a second run on the same SQLite file continues every NPC — its turns go on
# from the first run's, its journal (ctx.state) holds both runs' lines, and its first
# cell, in a fresh sandbox, rebuilds its memory from that journal.
test_store_keeps_npcs_across_restarts() {
    for run in 1 2; do
        "$NPC" --npcs 10 --ticks 10 --tick-ms 10 --lines-per-tick 2 \
            --sandboxd "$BUILD/sandboxd" --provider echo --quiet \
            --store "sqlite:$work/npcs.db" > "$work/store$run.out" 2>&1
        rc=$?
        cat "$work/store$run.out"
        [ $rc -eq 0 ] || { echo "run $run: exit status $rc"; return 1; }
        has_re "$work/store$run.out" ": 20 lines, 20 turns \(0 failed, 0 lost\)" || return 1
    done
    has "$work/store1.out" "0 NPCs resumed (0 earlier turns), 10 new" &&
    has "$work/store1.out" "journals: 20 lines remembered in all" &&
    has "$work/store1.out" ", 0 memories rebuilt" &&
    has "$work/store2.out" "10 NPCs resumed (20 earlier turns), 0 new" &&
    has "$work/store2.out" "journals: 40 lines remembered in all" || return 1
    n=$(sed -n 's/.*, \([0-9]*\) memories rebuilt.*/\1/p' "$work/store2.out")
    [ "${n:-0}" -gt 0 ] || { echo "no resumed NPC rebuilt its memory in its fresh sandbox"; return 1; }
    cells=$(sed -n 's/.* turns ([^)]*), \([0-9]*\) cells.*/\1/p' "$work/store2.out")
    [ "$cells" -eq $((20 + n)) ] || { echo "cells $cells != 20 + $n"; return 1; }
}

test_usage() {
    "$NPC" --help | grep -q '^usage: npc_server' || return 1
    "$NPC" --help | grep -q -- '--version' || { echo "--help does not list --version"; return 1; }
    # --version names the same berth version as `berth --version`
    v=$("$NPC" --version) || { echo "--version failed"; return 1; }
    echo "$v"
    want=$("$BUILD/berth" --version | sed -n 's/^berth \([^ ]*\) (\(libplimsoll [^,]*\),.*/berth \1, \2/p')
    [ -n "$want" ] || { echo "cannot read berth --version"; return 1; }
    case "$v" in
        "npc_server ($want, protocol "*) ;;
        *) echo "npc_server --version \"$v\" does not say \"$want\""; return 1 ;;
    esac
    "$NPC" --no-such-flag 2>/dev/null; [ $? -eq 2 ] || { echo "a bad flag should exit 2"; return 1; }
    "$BUILD/berth" serve --help | grep -q '^usage: berth serve' || return 1
    "$BUILD/berth" serve --listen 127.0.0.1:0 2>/dev/null; [ $? -eq 2 ] || return 1
    "$BUILD/berth" --help | grep -q 'serve' || return 1
}

run 200_npcs_against_sandboxd
run sandbox_cap_rebuilds_memories
run idle_npcs_suspend
run store_keeps_npcs_across_restarts
run usage

finish

#!/bin/sh
# test_demo.sh — berth's faces end to end with the make-built binaries: the demo
# (scripts/demo.sh: sandboxd + berth replay of scripts/demo_conversation.lua), replay
# with its own daemon, replay failing on a broken expectation and on a failing hook,
# berth chat on piped input, berth lua (and busted specs through it), the stock-Lua
# module, --help and --version.  Prints cmocka-style summary lines for tests/run.sh.
set -u
BUILD=${BUILD:-build}
B="$BUILD/berth"
. tests/lib/shtest.sh

test_help_and_version() {
    "$B" --help | grep -q '^usage: berth COMMAND' || return 1
    "$B" --version | grep -q '^berth [0-9]' || return 1
    for c in replay chat lua; do
        "$B" $c --help | grep -q "^usage: berth $c" || { echo "no help for $c"; return 1; }
        "$B" $c --version | grep -q '^berth ' || return 1
    done
    "$B" nonsense 2>/dev/null; [ $? -eq 2 ] || { echo "unknown command should exit 2"; return 1; }
    "$B" replay --no-such-flag x 2>/dev/null; [ $? -eq 2 ] || return 1
    "$B" replay 2>/dev/null; [ $? -eq 2 ] || return 1
}

test_H06_H11_H12_make_demo_script() {
    BUILD=$BUILD sh scripts/demo.sh > "$work/demo.out" 2>&1 || { cat "$work/demo.out"; return 1; }
    cat "$work/demo.out"
    has "$work/demo.out" "== turn 3 ==" &&
    has "$work/demo.out" "== idle (waiting for the idle timeout) ==" &&
    has "$work/demo.out" "-- idle: the conversation suspended (onSuspend ran) --" &&
    has "$work/demo.out" "check ok: call_2_2_1: stderr contains \"ZeroDivisionError\"" &&
    has "$work/demo.out" "-- the conversation completed (onComplete ran) --" &&
    has "$work/demo.out" "check ok: call_3_1_1: freshSandbox = true" &&
    has "$work/demo.out" "check ok: call_2_1_1: freshSandbox = false" &&
    grep -Eq "^replay: 3 turns, (2[0-9]) checks, 0 failed, 0 hook errors$" "$work/demo.out" || {
        echo "the replay did not end with 3 turns, 20+ checks, 0 failed"; return 1; }
    ! grep -q "check FAILED" "$work/demo.out"
}

test_replay_starts_its_own_daemon() {
    "$B" replay scripts/demo_conversation.lua > "$work/own.out" 2>&1 || { cat "$work/own.out"; return 1; }
    has "$work/own.out" "daemon started at http://127.0.0.1:" &&
    has "$work/own.out" "0 failed, 0 hook errors"
}

test_replay_fails_on_a_broken_expectation() {
    cat > "$work/bad.lua" <<'LUA'
return { turns = { { user = "go", replies = {
  { call = { code = "1 + 1", expect = { exitCode = 3, stdoutContains = "python 1: 1 + 1" } } },
  { say = "done" } } } } }
LUA
    "$B" replay "$work/bad.lua" > "$work/bad.out" 2>&1
    rc=$?
    cat "$work/bad.out"
    [ $rc -eq 1 ] || { echo "exit $rc, not 1"; return 1; }
    has "$work/bad.out" "check FAILED: call_1_1_1: exitCode = 3 — FAILED, got 0" &&
    has "$work/bad.out" "check ok: call_1_1_1: stdout contains" &&
    has "$work/bad.out" "1 failed"
}

test_replay_fails_on_a_hook_error() {
    cat > "$work/hooks.lua" <<'LUA'
local M = setmetatable({}, {__index = require "code_chat"})
function M.onTurn(ctx, message) error("the hook broke on " .. message) end
return M
LUA
    cat > "$work/one.lua" <<'LUA'
return { turns = { { user = "hello" }, { user = "again", replies = { { say = "x" } } } } }
LUA
    "$B" replay --hooks "$work/hooks.lua" "$work/one.lua" > "$work/hook.out" 2>&1
    rc=$?
    cat "$work/hook.out"
    [ $rc -eq 1 ] || { echo "exit $rc, not 1"; return 1; }
    # both turns ran: the host went on after the first failure
    has "$work/hook.out" "error> onTurn failed:" &&
    has "$work/hook.out" "the hook broke on again" &&
    has "$work/hook.out" "2 hook errors"
}

test_replay_rejects_a_malformed_script() {
    echo 'return { turns = { { replies = {} } } }' > "$work/mal.lua"
    "$B" replay "$work/mal.lua" > "$work/mal.out" 2>&1
    [ $? -eq 2 ] && has "$work/mal.out" "turns[1] needs a 'user' message"
}

test_chat_on_piped_input() {
    cat > "$work/chat.lua" <<'LUA'
return { turns = {
  { user = "compute", replies = { { call = { code = "6 * 7" } }, { say = "It is 42." } } },
  { user = "thanks", replies = { { say = "You're welcome." } } },
} }
LUA
    printf 'compute\nthanks\n' | "$B" chat --model "scripted:$work/chat.lua" > "$work/chat.out" 2>&1 ||
        { cat "$work/chat.out"; return 1; }
    cat "$work/chat.out"
    has "$work/chat.out" "tool> executeCode (default language) [call_1_1_1]" &&
    has "$work/chat.out" "stdout| python 1: 6 * 7" &&
    has "$work/chat.out" "assistant> It is 42." &&
    has "$work/chat.out" "assistant> You're welcome." &&
    has "$work/chat.out" "-- the conversation completed (onComplete ran) --"
}

test_lua_runs_files_with_berth_modules() {
    cat > "$work/ok.lua" <<'LUA'
local name = ...
assert(name == "first" and arg[1] == "first" and arg[0]:find("ok.lua$"))
assert(json.encode(json.decode('{"a":[]}')) == '{"a":[]}')
local r, msg, code = sandbox.executeCode{runId = "r", code = "1"}
assert(r == nil and code == "environment" and msg:find("^Nothing ran %(environment%)"), msg)
local t0 = now() sleep(0.01) assert(now() > t0)
assert(io.open and os.getenv)   -- the full standard library
print("lua ok")
LUA
    env -u PLIMSOLL_URL "$B" lua "$work/ok.lua" first > "$work/lua.out" 2>&1 || { cat "$work/lua.out"; return 1; }
    has "$work/lua.out" "lua ok" || return 1
    echo 'error("boom")' > "$work/bad_lua.lua"
    "$B" lua "$work/bad_lua.lua" > "$work/badlua.out" 2>&1
    [ $? -eq 1 ] && has "$work/badlua.out" "boom" && has "$work/badlua.out" "stack traceback"
}

test_lua_with_a_local_daemon() {
    cat > "$work/d.lua" <<'LUA'
local r = assert(sandbox.executeCode{runId = "r", code = "40 + 2"})
assert(r.stdout == "python 1: 40 + 2" and r.freshSandbox, r.stdout)
assert(sandbox.dispose("r"))
print("daemon ok")
LUA
    "$B" lua --provider echo "$work/d.lua" > "$work/d.out" 2>&1 || { cat "$work/d.out"; return 1; }
    has "$work/d.out" "daemon ok"
}

test_busted_specs_through_berth_lua() {
    [ -x /usr/bin/busted ] || { echo "busted is not installed (make deps installs lua-busted)"; return 1; }
    "$B" lua /usr/bin/busted --output=plainTerminal tests/spec > "$work/busted.out" 2>&1
    rc=$?
    cat "$work/busted.out"
    [ $rc -eq 0 ] && grep -q ' 0 failures' "$work/busted.out"
}

test_stock_lua_module() {
    [ -f "$BUILD/lua/plimsoll.so" ] || { echo "$BUILD/lua/plimsoll.so not built"; return 1; }
    command -v lua5.4 > /dev/null || { echo "lua5.4 is not installed (make deps)"; return 1; }
    od -An -N24 -tx1 /dev/urandom | tr -d ' \n' > "$work/mod.token"
    start_sandboxd mod.daemon --token-file "$work/mod.token" --provider echo || return 1
    # A sanitizer build of the module needs its runtime loaded before stock lua5.4 starts
    # (check-asan); leaks are lua5.4's business there, not the module's.
    preload=
    if nm -D "$BUILD/lua/plimsoll.so" 2>/dev/null | grep -q __asan_init; then
        preload=$(clang -print-file-name=libclang_rt.asan-x86_64.so)
    fi
    LD_PRELOAD=$preload ASAN_OPTIONS=detect_leaks=0 \
    PLIMSOLL_URL=$url PLIMSOLL_TOKEN=$(cat "$work/mod.token") BERTH_TEST_BUILD=$BUILD \
        lua5.4 tests/spec/module.lua > "$work/mod.out" 2>&1
    rc=$?
    kill $pid; wait $pid
    [ $rc -eq 0 ] || { cat "$work/mod.out"; return 1; }
    has "$work/mod.out" "module ok"
}

run help_and_version
run H06_H11_H12_make_demo_script
run replay_starts_its_own_daemon
run replay_fails_on_a_broken_expectation
run replay_fails_on_a_hook_error
run replay_rejects_a_malformed_script
run chat_on_piped_input
run lua_runs_files_with_berth_modules
run lua_with_a_local_daemon
run busted_specs_through_berth_lua
run stock_lua_module

finish

#!/bin/sh
# test_demo.sh — berth's faces end to end with the make-built binaries: the demo
# (scripts/demo.sh: sandboxd + berth replay of scripts/demo_conversation.lua), replay
# with its own daemon, replay failing on a broken expectation and on a failing hook,
# berth chat on piped input, berth lua (and busted specs through it), how each of them
# ends (idle steps, --time-limit, signals, os.exit: sandboxes disposed), the stock-Lua
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
    printf 'compute\nthanks\n' | "$B" chat --provider echo --model "scripted:$work/chat.lua" \
        > "$work/chat.out" 2>&1 || { cat "$work/chat.out"; return 1; }
    cat "$work/chat.out"
    has "$work/chat.out" "tool> executeCode (default language) [call_1_1_1]" &&
    has "$work/chat.out" "stdout| python 1: 6 * 7" &&
    # echo, named: the start and every result say that no code ran (issue 14)
    has "$work/chat.out" "berth chat: the echo provider runs NO code" &&
    has "$work/chat.out" "note| NO CODE RAN: the echo provider echoes the code back" &&
    has "$work/chat.out" "assistant> It is 42." &&
    has "$work/chat.out" "assistant> You're welcome." &&
    has "$work/chat.out" "-- the conversation completed (onComplete ran) --"
}

# Issue 14: no silent fakes.  Without a daemon, chat starts a local sandboxd with the
# strongest provider whose smoke test passes (as make demo does): the code runs.
test_chat_runs_code_on_the_strongest_provider_by_default() {
    cat > "$work/py.lua" <<'LUA'
return { turns = { { user = "compute", replies = {
  { call = { code = "print(6 * 7)" } }, { say = "It is 42." } } } } }
LUA
    printf 'compute\n' | env -u PLIMSOLL_URL -u BERTH_PROVIDER "$B" chat \
        --model "scripted:$work/py.lua" > "$work/auto.out" 2>&1 || { cat "$work/auto.out"; return 1; }
    cat "$work/auto.out"
    has "$work/auto.out" "stdout| 42" &&
    has_re "$work/auto.out" "isolation (container|kernel|vm)" &&
    ! grep -q "NO CODE" "$work/auto.out"
}

test_chat_and_serve_refuse_to_start_without_a_model() {
    printf 'hi\n' | "$B" chat --provider echo > "$work/nomodel.out" 2>&1
    rc=$?
    cat "$work/nomodel.out"
    [ $rc -eq 2 ] || { echo "chat: exit $rc, not 2"; return 1; }
    has "$work/nomodel.out" "berth chat: no model: pass --model openai[:NAME]" || return 1
    echo tok > "$work/callers"
    "$B" serve --listen 127.0.0.1:0 --token-file "$work/callers" > "$work/serve_nomodel.out" 2>&1
    rc=$?
    cat "$work/serve_nomodel.out"
    [ $rc -eq 2 ] || { echo "serve: exit $rc, not 2"; return 1; }
    has "$work/serve_nomodel.out" "no model: pass --model openai[:NAME]"
}

# A model that cannot be reached: one line saying what failed and what to do, no
# traceback, no second copy of the message.
test_chat_model_failure_is_one_line() {
    printf 'hi\n' | BERTH_MODEL_URL=http://127.0.0.1:9/v1 BERTH_MODEL=m BERTH_API_KEY=k \
        "$B" chat --provider echo --model openai > "$work/mfail.out" 2>&1
    rc=$?
    cat "$work/mfail.out"
    [ $rc -eq 1 ] || { echo "exit $rc, not 1"; return 1; }
    [ "$(grep -c 'cannot reach the model provider' "$work/mfail.out")" -eq 1 ] || {
        echo "the failure is not said exactly once"; return 1; }
    has "$work/mfail.out" "check that it runs and that BERTH_MODEL_URL names it" &&
    ! grep -q "stack traceback" "$work/mfail.out"
}

# --approve on a pipe: the question is a line of the transcript, the next input line
# answers it (n: the cell does not run and the model is told; a: this and later cells
# run without asking).
test_chat_approve_asks_before_each_cell() {
    cat > "$work/appr.lua" <<'LUA'
return { turns = {
  { user = "one", replies = { { call = { code = "1 + 1" } }, { say = "said one" } } },
  { user = "two", replies = { { call = { code = "2 + 2" } }, { say = "said two" } } },
  { user = "three", replies = { { call = { code = "3 + 3" } }, { say = "said three" } } },
} }
LUA
    printf 'one\nn\ntwo\na\nthree\n' | "$B" chat --approve --provider echo \
        --model "scripted:$work/appr.lua" > "$work/appr.out" 2>&1 || { cat "$work/appr.out"; return 1; }
    cat "$work/appr.out"
    [ "$(grep -c '^approve> run this (default language) cell?' "$work/appr.out")" -eq 2 ] || {
        echo "not asked exactly twice"; return 1; }
    has "$work/appr.out" "result> error [permission] Nothing ran: the cell was not approved (the person at the terminal said no)" &&
    has "$work/appr.out" "stdout| python 1: 2 + 2" &&
    has "$work/appr.out" "stdout| python 2: 3 + 3" &&
    ! grep -q "python 1: 1 + 1" "$work/appr.out" &&
    has "$work/appr.out" "assistant> said three"
}

test_chat_approve_needs_hooks_that_ask() {
    printf 'x\n' | "$B" chat --approve --provider echo --hooks scripts/code_chat.lua \
        --model "scripted:$work/appr.lua" > "$work/appr2.out" 2>&1
    rc=$?
    cat "$work/appr2.out"
    [ $rc -eq 1 ] && has "$work/appr2.out" "--approve needs hooks that ask approve(ctx, code, language)"
}

# timeoutMs on one executeCode call is honoured (issue 14, item 3): a cell sleeping 20 s
# with timeoutMs = 1500 is cut off after a second and a half, on a real provider.
test_executeCode_timeoutMs_per_call_is_honoured() {
    cat > "$work/tmo.lua" <<'LUA'
-- the sandbox opened first: the budget counts from when the daemon takes the call,
-- and a sandbox still opening when it ends runs nothing ("capacity")
assert(sandbox.executeCode{runId = "t", code = "1"})
local t0 = now()
local r, msg = sandbox.executeCode{runId = "t", code = "import time\ntime.sleep(20)\nprint('late')",
                                   timeoutMs = 1500}
assert(r, msg)
local took = now() - t0
assert(r.timedOut and r.stdout == "" and took < 10, ("timedOut %s after %.1f s"):format(r.timedOut, took))
print("timeout ok")
LUA
    env -u PLIMSOLL_URL "$B" lua --provider auto "$work/tmo.lua" > "$work/tmo.out" 2>&1 ||
        { cat "$work/tmo.out"; return 1; }
    has "$work/tmo.out" "timeout ok"
}

# berth chat --store: the new conversation's id is printed at start, end of input
# suspends it (kept), and --resume ID continues it in a later process: its last
# messages shown, turn numbers going on, its first cell in a fresh sandbox (the
# result the model reads says freshSandbox).  A wrong id, or --resume alone, is refused.
test_chat_store_and_resume() {
    cat > "$work/resume.lua" <<'LUA'
return { template = true, loop = true, turns = {
  { user = "*", replies = { { call = { code = "{{user}}" } }, { say = "ran {{user}}" } } } } }
LUA
    db="sqlite:$work/chat.db"
    printf 'x = 6 * 7\n' | "$B" chat --provider echo --store "$db" \
        --model "scripted:$work/resume.lua" > "$work/c1.out" 2>&1 || { cat "$work/c1.out"; return 1; }
    cat "$work/c1.out"
    id=$(sed -n 's/^-- conversation \([^ ]*\) (kept in .*/\1/p' "$work/c1.out")
    [ -n "$id" ] || { echo "no conversation id printed at start"; return 1; }
    has "$work/c1.out" "assistant> ran x = 6 * 7" &&
    has "$work/c1.out" "-- conversation $id kept: continue it with --store $db --resume $id --" || return 1
    ! grep -q "completed (onComplete ran)" "$work/c1.out" || { echo "completed, not kept"; return 1; }
    printf 'print(x)\n' | "$B" chat --provider echo --store "$db" --resume "$id" \
        --model "scripted:$work/resume.lua" > "$work/c2.out" 2>&1 || { cat "$work/c2.out"; return 1; }
    cat "$work/c2.out"
    has "$work/c2.out" "-- conversation $id resumed: 1 turn, 5 messages; the last ones: --" &&
    has "$work/c2.out" "  you> x = 6 * 7" &&
    has "$work/c2.out" "  assistant> ran x = 6 * 7" &&
    has "$work/c2.out" "tool> executeCode (default language) [call_2_1_1]" &&
    has "$work/c2.out" "assistant> ran print(x)" || return 1
    grep '^result> ' "$work/c2.out" | grep -q 'freshSandbox' || { echo "the resumed cell is not in a fresh sandbox"; return 1; }
    "$B" chat --provider echo --store "$db" --resume nosuch --model "scripted:$work/resume.lua" \
        < /dev/null > "$work/c3.out" 2>&1
    [ $? -eq 1 ] && has "$work/c3.out" "no conversation nosuch in the store" || return 1
    "$B" chat --resume "$id" --model "scripted:$work/resume.lua" < /dev/null > "$work/c4.out" 2>&1
    [ $? -eq 2 ] && has "$work/c4.out" "--resume needs --store"
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

# wait_for FILE TEXT: until FILE holds TEXT (20 s at most): the point a signal is sent.
wait_for() {
    i=0
    while ! grep -qF -- "$2" "$1" 2>/dev/null; do
        i=$((i + 1))
        [ $i -le 400 ] || { echo "never saw \"$2\" in $1"; cat "$1"; return 1; }
        sleep 0.05
    done
}

# closes_match LOG: every session the daemon opened was closed by its owner.
closes_match() {
    o=$(grep -c ' opened for caller' "$1")
    c=$(grep -c 'ended: closed (closed by its owner)' "$1")
    [ "$o" -ge 1 ] && [ "$o" -eq "$c" ] || { echo "$o sessions opened, $c closed"; cat "$1"; return 1; }
}

# No idle step leaves a replay waiting for nothing and exiting 0 halfway (the README's
# own example has { idle = true } then { idle = "wait" }).
test_replay_idle_steps_never_stall() {
    cat > "$work/i1.lua" <<'LUA'
return { turns = {
  { user = "one", replies = { { call = { code = "x = 1" } }, { say = "ok" } } },
  { idle = true }, { idle = "wait" },
  { user = "two", replies = { { say = "second answer" } } } } }
LUA
    "$B" replay "$work/i1.lua" > "$work/i1.out" 2>&1 || { cat "$work/i1.out"; return 1; }
    has "$work/i1.out" "-- idle: the conversation is suspended already --" &&
    has "$work/i1.out" "assistant> second answer" &&
    has "$work/i1.out" "replay: 2 turns, 0 checks, 0 failed, 0 hook errors" || return 1
    cat > "$work/i2.lua" <<'LUA'
return { turns = { { idle = "wait" }, { user = "two", replies = { { say = "x" } } } } }
LUA
    "$B" replay "$work/i2.lua" > "$work/i2.out" 2>&1
    [ $? -eq 1 ] || { cat "$work/i2.out"; echo "a wait before any turn: not exit 1"; return 1; }
    has "$work/i2.out" "step 1 of 2: it waits for the idle timeout before any turn" &&
    has "$work/i2.out" "stopped before the script's end" || return 1
    cat > "$work/i3.lua" <<'LUA'
return { idleTimeout = 0, turns = { { user = "one", replies = { { say = "ok" } } },
  { idle = "wait" }, { user = "two", replies = { { say = "x" } } } } }
LUA
    "$B" replay "$work/i3.lua" > "$work/i3.out" 2>&1
    [ $? -eq 1 ] && has "$work/i3.out" "step 2 of 3: it waits for the idle timeout, and there is none" || return 1
    "$B" replay --idle-timeout 0 "$work/i1.lua" > "$work/i4.out" 2>&1
    [ $? -eq 0 ] && has "$work/i4.out" "idle timeout 0 s" || { cat "$work/i4.out"; return 1; }
    sed 's/idleTimeout = 0/idleTimeout = -1/' "$work/i3.lua" > "$work/i5.lua"
    "$B" replay "$work/i5.lua" > "$work/i5.out" 2>&1
    [ $? -eq 2 ] && has "$work/i5.out" "idleTimeout must be seconds >= 0"
}

# --time-limit and SIGTERM end a replay with its sandboxes disposed and the local
# daemon's token file gone; the same for berth lua's os.exit and SIGINT.
test_replay_and_lua_dispose_their_sandboxes_however_they_end() {
    echo "token-for-the-ends" > "$work/ends.tok"
    start_sandboxd ends --provider echo --token-file "$work/ends.tok" || return 1
    cat > "$work/slow.lua" <<'LUA'
return { turns = { { user = "one", replies = { { call = { code = "plimsoll-echo:sleep:3000" } }, { say = "ok" } } } } }
LUA
    "$B" replay --time-limit 1 --daemon "$url" --daemon-token-file "$work/ends.tok" \
        "$work/slow.lua" > "$work/tl.out" 2>&1
    rc=$?
    [ $rc -eq 1 ] && has "$work/tl.out" "gave up after 1 s (--time-limit)" &&
    has "$work/tl.out" ", timed out" || { echo "exit $rc"; cat "$work/tl.out"; return 1; }
    closes_match "$work/ends.log" || return 1
    cat > "$work/exit.lua" <<'LUA'
assert(sandbox.executeCode{code = "print(1)", runId = "r"})
print("before")
os.exit(3, true)
print("after")
LUA
    "$B" lua --daemon "$url" --daemon-token-file "$work/ends.tok" "$work/exit.lua" > "$work/ex.out" 2>&1
    rc=$?
    [ $rc -eq 3 ] && has "$work/ex.out" "before" || { echo "exit $rc"; cat "$work/ex.out"; return 1; }
    ! grep -q after "$work/ex.out" || { echo "os.exit returned"; return 1; }
    closes_match "$work/ends.log" || return 1
    kill "$pid"
    mkdir "$work/tmp"
    TMPDIR="$work/tmp" "$B" replay "$work/slow.lua" > "$work/sig.out" 2>&1 &
    bp=$!
    wait_for "$work/sig.out" "tool> executeCode" || return 1
    kill -TERM $bp
    wait $bp
    rc=$?
    [ $rc -eq 143 ] && has "$work/sig.out" "stopped by a signal" || { echo "exit $rc"; cat "$work/sig.out"; return 1; }
    cat > "$work/wait.lua" <<'LUA'
assert(sandbox.executeCode{code = "print(1)", runId = "r"})
print("waiting") io.stdout:flush()
sleep(30)
LUA
    TMPDIR="$work/tmp" "$B" lua --provider echo "$work/wait.lua" > "$work/lsig.out" 2>&1 &
    bp=$!
    wait_for "$work/lsig.out" "waiting" || return 1
    kill -INT $bp
    wait $bp
    rc=$?
    [ $rc -eq 130 ] || { echo "berth lua after SIGINT: exit $rc"; return 1; }
    left=$(ls "$work/tmp")
    [ -z "$left" ] || { echo "left behind: $left"; return 1; }
}

# A closed standard input is the end of input; a line is one message whatever its
# length up to 1 MiB, and a longer one is refused whole, as one that is not UTF-8 or
# holds a NUL byte, each said; output that cannot be written is a failure; SIGTERM
# ends the chat as end of input does (status 143).
test_chat_input_ends_and_long_lines() {
    printf 'return { loop = true, turns = { { user = "*", replies = { { say = "hi" } } } } }\n' > "$work/hi.lua"
    "$B" chat --provider echo --model "scripted:$work/hi.lua" 0<&- > "$work/closed.out" 2>&1
    [ $? -eq 0 ] && has "$work/closed.out" "the conversation completed" || { cat "$work/closed.out"; return 1; }
    python3 -c "print('a' * 70000); print('b' * 5)" |
        "$B" chat --provider echo --model "scripted:$work/hi.lua" > "$work/long.out" 2>&1
    [ "$(awk '/^user>/ { print length($0) - 6 }' "$work/long.out" | tr '\n' ' ')" = "70000 5 " ] ||
        { echo "not two messages of 70000 and 5 bytes"; return 1; }
    python3 -c "print('a' * 1100000); print('short')" |
        "$B" chat --provider echo --model "scripted:$work/hi.lua" > "$work/over.out" 2>&1
    has "$work/over.out" "a line of more than 1048576 bytes was not sent" &&
    [ "$(grep -c '^user>' "$work/over.out")" -eq 1 ] && has "$work/over.out" "user> short" || return 1
    printf 'ab\377cd\nnul\000after\nnext\n' |
        "$B" chat --provider echo --model "scripted:$work/hi.lua" > "$work/bad.out" 2>&1
    has "$work/bad.out" "-- not sent: the message is not UTF-8 text --" &&
    has "$work/bad.out" "-- not sent: the line holds a NUL byte --" &&
    [ "$(grep -c '^user>' "$work/bad.out")" -eq 1 ] && has "$work/bad.out" "user> next" ||
        { cat "$work/bad.out"; return 1; }
    echo hello | "$B" chat --provider echo --model "scripted:$work/hi.lua" > /dev/full 2> "$work/full.err"
    [ $? -eq 1 ] && has "$work/full.err" "the output could not be written" || { cat "$work/full.err"; return 1; }
    mkfifo "$work/in"
    "$B" chat --provider echo --model "scripted:$work/hi.lua" < "$work/in" > "$work/term.out" 2>&1 &
    bp=$!
    exec 7> "$work/in"
    echo "hello" >&7
    wait_for "$work/term.out" "assistant> hi" || { exec 7>&-; return 1; }
    kill -TERM $bp
    wait $bp
    rc=$?
    exec 7>&-
    [ $rc -eq 143 ] && has "$work/term.out" "the conversation completed" || { echo "exit $rc"; cat "$work/term.out"; return 1; }
}

# Usage errors are status 2 and say what is wrong: an option without its value, a bad
# tier, a --store that keeps nothing for --resume or that is no store URL, a --model
# that cannot be made; --provider starts a local daemon even where PLIMSOLL_URL names
# another.
test_usage_errors_and_provider_over_the_environment() {
    "$B" replay --daemon > "$work/u1.out" 2>&1
    [ $? -eq 2 ] && has "$work/u1.out" "--daemon needs a value" || return 1
    "$B" replay --minimum-isolation bogus scripts/demo_conversation.lua > "$work/u0.out" 2>&1
    [ $? -eq 2 ] && [ "$(wc -l < "$work/u0.out")" -eq 1 ] &&
        has "$work/u0.out" "--minimum-isolation takes process, container, kernel or vm" || return 1
    printf 'return { loop = true, turns = { { user = "*", replies = { { say = "hi" } } } } }\n' > "$work/hi2.lua"
    echo hello | "$B" chat --provider echo --model "scripted:$work/hi2.lua" --store memory > "$work/u2.out" 2>&1
    [ $? -eq 2 ] && has "$work/u2.out" "--store memory keeps nothing" || return 1
    "$B" chat --provider echo --model "scripted:$work/hi2.lua" --store bogus: < /dev/null > "$work/u4.out" 2>&1
    [ $? -eq 2 ] && has "$work/u4.out" 'unknown store URL "bogus:"' || return 1
    "$B" chat --provider echo --model bogus < /dev/null > "$work/u5.out" 2>&1
    [ $? -eq 2 ] && has "$work/u5.out" 'unknown model "bogus"' || return 1
    "$B" lua --model "scripted:$work/nosuch.lua" "$work/hi2.lua" > "$work/u6.out" 2>&1
    [ $? -eq 2 ] && has "$work/u6.out" "cannot open" || return 1
    cat > "$work/prov.lua" <<'LUA'
local r = assert(sandbox.executeCode{runId = "r", code = "40 + 2"})
assert(r.stdout == "python 1: 40 + 2", r.stdout)
print("local daemon ok")
LUA
    PLIMSOLL_URL=http://127.0.0.1:1 "$B" lua --provider echo "$work/prov.lua" > "$work/u3.out" 2>&1 ||
        { cat "$work/u3.out"; return 1; }
    has "$work/u3.out" "local daemon ok"
}

# A token file's first line is the token, however long.
test_token_file_of_a_long_token() {
    python3 -c "print('T' * 1500)" > "$work/long.tok"
    start_sandboxd longtok --provider echo --token-file "$work/long.tok" || return 1
    "$B" replay --daemon "$url" --daemon-token-file "$work/long.tok" scripts/demo_conversation.lua \
        > "$work/lt.out" 2>&1
    rc=$?
    kill "$pid"
    [ $rc -eq 0 ] || { cat "$work/lt.out"; return 1; }
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
run chat_store_and_resume
run chat_runs_code_on_the_strongest_provider_by_default
run chat_and_serve_refuse_to_start_without_a_model
run chat_model_failure_is_one_line
run chat_approve_asks_before_each_cell
run chat_approve_needs_hooks_that_ask
run executeCode_timeoutMs_per_call_is_honoured
run lua_runs_files_with_berth_modules
run lua_with_a_local_daemon
run busted_specs_through_berth_lua
run stock_lua_module
run replay_idle_steps_never_stall
run replay_and_lua_dispose_their_sandboxes_however_they_end
run chat_input_ends_and_long_lines
run token_file_of_a_long_token
run usage_errors_and_provider_over_the_environment

finish

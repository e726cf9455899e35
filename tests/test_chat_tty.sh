#!/bin/sh
# test_chat_tty.sh — `berth chat` on a terminal (issue 14, item 4), driven through tmux:
# line editing with the arrow keys and a history file, the spinner while a cell runs,
# Ctrl-C cancelling the running turn back to the prompt while the local sandboxd (in
# its own process group) lives on, Ctrl-C at the prompt exiting 130, Ctrl-D exiting 0,
# --approve asking before a cell, and SIGTERM giving the terminal back.  Prints
# cmocka-style summary lines for tests/run.sh.
set -u
BUILD=${BUILD:-build}
B="$(pwd)/$BUILD/berth"
. tests/lib/shtest.sh

command -v tmux > /dev/null || {
    echo "tmux is not installed (make deps installs it)"
    echo "[  FAILED  ] 1 test(s), listed below:"; exit 1; }

sock="berth-test-$$"
T() { tmux -L "$sock" -f /dev/null "$@"; }
trap 'T kill-server 2>/dev/null; rm -rf "$work" 2>/dev/null' EXIT

# start NAME ARGS...: berth chat ARGS in a fresh 120x40 terminal; its exit status goes
# to $work/NAME.rc.  Sets $shell_pid (the pane's shell).
# Each test has a session of its own, made before the one before it is killed: killing
# the only session ends the tmux server, and a new-session racing that exit can land in
# the dying server ("no server running" for the whole test).
t=
start() {
    rcname=$1; shift
    old=$t; t="t-$rcname"
    T new-session -d -s "$t" -x 120 -y 40 \
        "BERTH_HISTORY='$work/history' '$B' chat $*; echo \$? > '$work/$rcname.rc'; sleep 600"
    [ -z "$old" ] || T kill-session -t "$old" 2>/dev/null
    shell_pid=$(T display-message -p -t "$t" '#{pane_pid}')
}

screen() { T capture-pane -p -t "$t"; }   # (trailing blanks are not kept: "you>")

# wait_for TEXT [SECONDS]: polls the screen until it shows TEXT (a fixed string).
wait_for() {
    i=0; limit=$(( ${2:-30} * 10 ))
    while [ $i -lt $limit ]; do
        screen | grep -qF -- "$1" && return 0
        sleep 0.1; i=$((i + 1))
    done
    echo "the screen never showed: $1"; screen; return 1
}

# wait_rc NAME: polls for the chat's exit status; prints it.
wait_rc() {
    i=0
    while [ $i -lt 300 ]; do
        [ -s "$work/$1.rc" ] && { cat "$work/$1.rc"; return 0; }
        sleep 0.1; i=$((i + 1))
    done
    echo "no exit status"; screen; return 1
}

only() { [ -z "${ONLY:-}" ] || [ "$ONLY" = "$1" ]; }   # ONLY=NAME: one test

cat > "$work/slow.lua" <<'LUA'
return { turns = {
  { user = "first", replies = { { call = { code = "import time\ntime.sleep(120)" } }, { say = "slept" } } },
  { user = "second", replies = { { say = "still here" } } },
} }
LUA
cat > "$work/quick.lua" <<'LUA'
return { turns = {
  { user = "one", replies = { { call = { code = "6 * 7" } }, { say = "done one" } } },
  { user = "two", replies = { { say = "done two" } } },
} }
LUA

test_arrow_keys_edit_the_line_and_history_is_kept() {
    rm -f "$work/history"
    start edit --provider echo --model "scripted:$work/quick.lua"
    wait_for "you>" || return 1
    # "oex", Left (before the x), BSpace (the e goes), Left (before the o), Right,
    # "ne", End, BSpace (the x goes): "one"
    T send-keys -t "$t" "oex" Left BSpace Left Right "ne" End BSpace
    T send-keys -t "$t" Enter
    wait_for "assistant> done one" || return 1
    T send-keys -t "$t" Up              # the history: the line before, editable
    wait_for "you> one" || return 1
    T send-keys -t "$t" C-u "two" Enter
    wait_for "assistant> done two" || return 1
    T send-keys -t "$t" C-d
    rc=$(wait_rc edit) || return 1
    [ "$rc" -eq 0 ] || { echo "Ctrl-D exited $rc, not 0"; return 1; }
    screen | grep -q '\^\[\[D' && { echo "an arrow key printed ^[[D"; return 1; }
    printf 'one\ntwo\n' | cmp -s - "$work/history" || {
        echo "history file:"; cat "$work/history"; return 1; }
}

test_ctrl_c_cancels_the_running_turn_and_the_sandboxd_lives_on() {
    start cancel --model "scripted:$work/slow.lua"
    wait_for "you>" 60 || return 1
    berth_pid=$(pgrep -P "$shell_pid" -x berth)
    daemon_pid=$(pgrep -P "$berth_pid" -x sandboxd)
    [ -n "$daemon_pid" ] || { echo "no local sandboxd under berth ($berth_pid)"; return 1; }
    [ "$(ps -o pgid= -p "$daemon_pid")" != "$(ps -o pgid= -p "$berth_pid")" ] || {
        echo "the sandboxd shares berth's process group"; return 1; }
    T send-keys -t "$t" "first" Enter
    wait_for "running the cell" 60 || return 1     # the spinner, with the elapsed time
    screen | grep -Eq 'running the cell [0-9]+\.[0-9] s' || { screen; return 1; }
    T send-keys -t "$t" C-c
    wait_for "the turn was cancelled (Ctrl-C)" || return 1
    wait_for "you>" || return 1
    kill -0 "$daemon_pid" || { echo "the sandboxd died with the Ctrl-C"; return 1; }
    [ "$(pgrep -P "$berth_pid" -x sandboxd)" = "$daemon_pid" ] || {
        echo "the sandboxd was replaced"; return 1; }
    T send-keys -t "$t" "second" Enter
    wait_for "assistant> still here" || return 1
    T send-keys -t "$t" C-c                           # at the prompt: exit, 130
    rc=$(wait_rc cancel) || return 1
    [ "$rc" -eq 130 ] || { echo "exit $rc, not 130"; return 1; }
    screen | grep -q "stack traceback" && return 1
    return 0
}

test_approve_asks_before_the_cell() {
    start approve --approve --provider echo --model "scripted:$work/quick.lua"
    wait_for "you>" || return 1
    T send-keys -t "$t" "one" Enter
    wait_for "run this cell? [y]es / [n]o / [a]lways:" || return 1
    T send-keys -t "$t" "n" Enter
    wait_for "result> error [permission] Nothing ran: the cell was not approved" || return 1
    wait_for "assistant> done one" || return 1
    T send-keys -t "$t" "/quit" Enter
    rc=$(wait_rc approve) || return 1
    [ "$rc" -eq 0 ] || { echo "exit $rc"; return 1; }
}

# SIGTERM at the prompt: the conversation ends as at end of input, the terminal is
# given back in the modes it had (readline's raw mode undone), the status is 143.
test_sigterm_gives_the_terminal_back() {
    old=$t; t="t-term"
    T new-session -d -s "$t" -x 120 -y 40 \
        "stty -a > '$work/stty.before'; BERTH_HISTORY= '$B' chat --provider echo --model 'scripted:$work/quick.lua'; echo \$? > '$work/term.rc'; stty -a > '$work/stty.after'; sleep 600"
    [ -z "$old" ] || T kill-session -t "$old" 2>/dev/null
    shell_pid=$(T display-message -p -t "$t" '#{pane_pid}')
    wait_for "you>" || return 1
    berth_pid=$(pgrep -P "$shell_pid" -x berth)
    [ -n "$berth_pid" ] || { echo "no berth under the pane's shell"; return 1; }
    kill -TERM "$berth_pid"
    rc=$(wait_rc term) || return 1
    [ "$rc" -eq 143 ] || { echo "exit $rc, not 143"; return 1; }
    i=0
    while [ ! -s "$work/stty.after" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    cmp -s "$work/stty.before" "$work/stty.after" || {
        echo "the terminal's modes changed:"; diff "$work/stty.before" "$work/stty.after"; return 1; }
}

only arrow_keys_edit_the_line_and_history_is_kept && run arrow_keys_edit_the_line_and_history_is_kept
only ctrl_c_cancels_the_running_turn_and_the_sandboxd_lives_on && run ctrl_c_cancels_the_running_turn_and_the_sandboxd_lives_on
only approve_asks_before_the_cell && run approve_asks_before_the_cell
only sigterm_gives_the_terminal_back && run sigterm_gives_the_terminal_back

finish

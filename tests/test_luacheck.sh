#!/bin/sh
# test_luacheck.sh — the shipped hooks and specs lint clean under scripts/.luacheckrc
# (the std "berth" of the host's globals), and the std really constrains: a hook that
# misspells a native or writes a global is flagged.
set -u
. tests/lib/shtest.sh
CONFIG=scripts/.luacheckrc

lint() { luacheck --no-color --formatter plain --config "$CONFIG" "$@"; }

test_shipped_scripts_and_specs_lint_clean() {
    lint scripts/ tests/spec/ > "$work/out" 2>&1
    rc=$?
    cat "$work/out"
    [ $rc -eq 0 ] && [ ! -s "$work/out" ]
}

test_the_berth_std_knows_the_host_globals() {
    cat > "$work/good.lua" <<'LUA'
local M = {}
function M.onTurn(ctx, message)
  local r, msg, code = sandbox.executeCode{code = "1", language = "python"}
  sandbox.warm(ctx.runId); sandbox.dispose(ctx.runId)
  log.info(json.encode{r = r, msg = msg, code = code, t = now(), m = message})
  sleep(0)
  return model.chat{messages = {}}
end
return M
LUA
    lint "$work/good.lua" || return 1
}

test_a_misspelled_native_and_a_new_global_are_flagged() {
    cat > "$work/bad.lua" <<'LUA'
function onTurn(ctx)
  return sandbox.executCode{code = "1"}
end
LUA
    lint "$work/bad.lua" > "$work/out" 2>&1 && { echo "luacheck passed a bad hook"; return 1; }
    cat "$work/out"
    has "$work/out" "undefined field 'executCode' of global 'sandbox'" &&
        has "$work/out" "setting non-standard global variable 'onTurn'"
}

if ! command -v luacheck >/dev/null 2>&1; then
    echo "luacheck is not installed (make deps installs lua-check)"
    echo "[  FAILED  ] 1 test(s), listed below:"; echo "[  FAILED  ] luacheck_present"; exit 1
fi
run shipped_scripts_and_specs_lint_clean
run the_berth_std_knows_the_host_globals
run a_misspelled_native_and_a_new_global_are_flagged
finish

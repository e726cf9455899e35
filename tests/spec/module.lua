-- module.lua — the stock-Lua module build/lua/plimsoll.so against a daemon given by
-- PLIMSOLL_URL and PLIMSOLL_TOKEN (tests/test_demo.sh starts a sandboxd echo).
-- Run with lua5.4; prints "module ok".
local build = os.getenv("BERTH_TEST_BUILD") or "build"
package.cpath = build .. "/lua/?.so;" .. package.cpath
local plimsoll = require "plimsoll"
assert(type(plimsoll.version) == "string")

local ok, err = pcall(plimsoll.new, {url = ""})
assert(not ok and err:find("no daemon URL"), err)

-- options are checked: an unknown key raises, naming the known ones (issue 14)
ok, err = pcall(plimsoll.new, {url = "http://127.0.0.1:1", minimumIsolaton = "kernel"})
assert(not ok and err:find("plimsoll.new: unknown option 'minimumIsolaton' %(known: url, "
                           .. "token, minimumIsolation, timeoutMs, idleCloseMs%)"), err)
ok, err = pcall(plimsoll.new, {url = "http://127.0.0.1:1", timeoutMs = 0})
assert(not ok and err:find("timeoutMs must be a whole number"), err)
-- without minimumIsolation, the floor over loopback http is container (a container
-- tier daemon is accepted: sandboxd echo here answers at its --echo-tier)
local sb = assert(plimsoll.new{})
ok, err = pcall(sb.executeCode, sb, {code = "1", lang = "javascript"})
assert(not ok and err:find("executeCode: unknown option 'lang'"), err)
ok, err = pcall(sb.warm, sb, "conv-1", "alice", {})
assert(not ok and err:find("warm takes %(runId %[, userId%]%)"), err)
ok, err = pcall(sb.dispose, sb, "conv-1", nil, "x")
assert(not ok and err:find("dispose takes"), err)
local r1 = assert(sb:executeCode{runId = "conv-1", code = "x = 41"})
assert(r1.stdout == "python 1: x = 41" and r1.freshSandbox and r1.freshInterpreter, r1.stdout)
assert(math.type(r1.exitCode) == "integer" and #r1.recordSha256 == 64)
local r2 = assert(sb:executeCode{runId = "conv-1", code = "x + 1"})
assert(r2.stdout == "python 2: x + 1" and r2.freshSandbox == nil and r2.stateKept)
assert(sb:count() == 1)
-- another conversation, another sandbox
assert(sb:warm("conv-2", "alice"))
local r3 = assert(sb:executeCode{runId = "conv-2", userId = "alice", code = "1"})
assert(r3.stdout == "python 1: 1" and r3.freshSandbox)
-- dispose blocks until the close settled; the next call gets a fresh sandbox
assert(sb:dispose("conv-1"))
local r4 = assert(sb:executeCode{runId = "conv-1", code = "x"})
assert(r4.freshSandbox and r4.stdout == "python 1: x")
-- without runId: a fresh run
local f = sb:executeCode{code = "1 + 1"}
assert(f == nil or f.stateKept == false)
-- expected failures are values, misuse raises
local n, msg, code = sb:executeCode{runId = "conv-1", code = "1", language = "cobol"}
assert(n == nil and type(msg) == "string" and type(code) == "string", tostring(msg))
assert(not pcall(sb.executeCode, sb, {code = 1}))
local tool = sb:tool()
assert(tool["function"].name == "executeCode" and tool["function"].parameters.type == "object")
assert(sb:disposeAll())
assert(sb:count() == 0)
sb:close()
sb:close()                      -- idempotent
assert(not pcall(sb.executeCode, sb, {code = "1"}))
assert(tostring(sb):find("closed"))
do
  local scoped <close> = assert(plimsoll.new{minimumIsolation = "container"})
  assert(scoped:executeCode{runId = "c", code = "1"})
end
print("module ok")

-- code_chat_spec.lua — busted specs for the default hooks (scripts/code_chat.lua),
-- run through the host: build/berth lua /usr/bin/busted tests/spec
-- The natives are replaced by fakes in _G (busted gives spec files an environment of
-- their own), so the specs see exactly what the hooks
-- send to the model and to the sandbox.

describe("code_chat", function()
  local hooks, saved

  before_each(function()
    saved = {sandbox = sandbox, model = model}
    package.loaded.code_chat = nil
    hooks = require "code_chat"
  end)

  after_each(function()
    _G.sandbox, _G.model = saved.sandbox, saved.model
  end)

  local function ctx()
    local c = {runId = "run-7", messages = json.array{}, events = {}}
    function c:emit(kind, data) self.events[#self.events + 1] = {kind, data} end
    function c:say(text) self:emit("assistant", text) end
    return c
  end

  it("warms the run's sandbox on turn start, with the user as owner", function()
    local got
    _G.sandbox = {warm = function(run, user) got = {run, user} return true end}
    local c = ctx()
    c.userId = "alice"
    hooks.onTurnStart(c)
    assert.same({"run-7", "alice"}, got)
  end)

  it("disposes on suspend and on complete", function()
    local disposed = {}
    _G.sandbox = {dispose = function(run) disposed[#disposed + 1] = run return true end}
    hooks.onSuspend(ctx())
    hooks.onComplete(ctx())
    assert.same({"run-7", "run-7"}, disposed)
  end)

  it("feeds tool results back as tool messages until the model answers", function()
    local calls, requests = {}, {}
    _G.sandbox = {
      tool = function() return {type = "function", ["function"] = {name = "executeCode"}} end,
      executeCode = function(input)
        calls[#calls + 1] = input
        return setmetatable({stdout = "42\n", exitCode = 0, stateKept = true}, {})
      end,
    }
    local replies = {
      {role = "assistant", tool_calls = json.array{{id = "c1", type = "function",
        ["function"] = {name = "executeCode",
                        arguments = '{"code":"6*7","language":"python","runId":"evil"}'}}}},
      {role = "assistant", content = "It is 42."},
    }
    _G.model = {chat = function(req)
      requests[#requests + 1] = json.decode(json.encode(req.messages))
      return table.remove(replies, 1)
    end}
    local c = ctx()
    hooks.onTurn(c, "what is 6 * 7?")
    -- the model's runId never reaches executeCode: the host keys the sandbox
    assert.same({{code = "6*7", language = "python"}}, calls)
    assert.equal(2, #requests)
    local last = requests[2]
    assert.equal("system", last[1].role)
    assert.equal("user", last[2].role)
    assert.equal("tool", last[4].role)
    assert.equal("c1", last[4].tool_call_id)
    assert.equal(42, json.decode(last[4].content).stdout == "42\n" and 42)
    assert.equal("It is 42.", c.events[#c.events][2])
  end)

  -- H17: what the system prompt the model receives tells it to do.
  it("H17: sends a system prompt on Python, loading once, stateKept, rebuilding", function()
    local sent
    _G.sandbox = {tool = function() return {type = "function"} end}
    _G.model = {chat = function(req)
      sent = req.messages[1]
      return {role = "assistant", content = "ok"}
    end}
    hooks.onTurn(ctx(), "hi")
    assert.equal("system", sent.role)
    local text = sent.content:gsub("%s+", " ")
    for _, phrase in ipairs{
      "Python for arithmetic and for any work on data",
      "Load data once and keep it in variables",
      "while a result says stateKept, your variables",
      "freshInterpreter, the interpreter was restarted: rebuild the variables",
      "freshSandbox, the files you wrote earlier are gone too",
    } do
      assert.truthy(text:find(phrase, 1, true), "the system prompt lacks: " .. phrase)
    end
  end)

  it("turns bad arguments and infrastructure failures into tool errors", function()
    _G.sandbox = {
      tool = function() return {} end,
      executeCode = function() return nil, "Nothing ran (capacity): full", "capacity" end,
    }
    local replies = {
      {role = "assistant", tool_calls = json.array{
        {id = "a", ["function"] = {name = "executeCode", arguments = "not json"}},
        {id = "b", ["function"] = {name = "executeCode", arguments = '{"code":"1"}'}},
        {id = "c", ["function"] = {name = "other", arguments = "{}"}}}},
      {role = "assistant", content = "sorry"},
    }
    local seen
    _G.model = {chat = function(req) seen = req.messages return table.remove(replies, 1) end}
    hooks.onTurn(ctx(), "go")
    local a = json.decode(seen[4].content)
    local b = json.decode(seen[5].content)
    local c = json.decode(seen[6].content)
    assert.equal("invalid_argument", a.code)
    assert.same({error = "Nothing ran (capacity): full", code = "capacity"}, b)
    assert.truthy(c.error:find("unknown tool"))
  end)

  it("stops after maxSteps model calls", function()
    _G.sandbox = {tool = function() return {} end,
               executeCode = function() return {stdout = ""} end}
    local n = 0
    _G.model = {chat = function()
      n = n + 1
      return {role = "assistant", tool_calls = json.array{
        {id = "x" .. n, ["function"] = {name = "executeCode", arguments = '{"code":"1"}'}}}}
    end}
    local c = ctx()
    hooks.onTurn(c, "loop forever")
    assert.equal(hooks.maxSteps, n)
    assert.truthy(c.events[#c.events][2]:find("stopped after"))
  end)

  it("raises a model failure so the host reports an error turn", function()
    _G.sandbox = {tool = function() return {} end}
    _G.model = {chat = function() return nil, "bad key", "unauthenticated" end}
    assert.has_error(function() hooks.onTurn(ctx(), "hi") end,
                     "the model failed (unauthenticated): bad key")
  end)
end)

-- The customisation points: a hooks table that inherits code_chat, found through
-- ctx.hooks as the host passes it.
describe("code_chat customisation points", function()
  local base, saved

  before_each(function()
    saved = {sandbox = sandbox, model = model}
    package.loaded.code_chat = nil
    base = require "code_chat"
  end)

  after_each(function()
    _G.sandbox, _G.model = saved.sandbox, saved.model
  end)

  local function derived()
    return setmetatable({}, {__index = base})
  end

  local function ctx(hooks)
    local c = {runId = "run-7", messages = json.array{}, events = {}, hooks = hooks}
    function c:emit(kind, data) self.events[#self.events + 1] = {kind, data} end
    function c:say(text) self:emit("assistant", text) end
    return c
  end

  -- A model that asks for `calls` (one executeCode per reply) and then says "done";
  -- every request's messages are kept in `seen`.
  local function scripted(codes, seen)
    local replies = {}
    for i, code in ipairs(codes) do
      replies[i] = {role = "assistant", tool_calls = json.array{{id = "c" .. i,
        type = "function", ["function"] = {name = "executeCode",
        arguments = json.encode{code = code, language = "python"}}}}}
    end
    replies[#replies + 1] = {role = "assistant", content = "done"}
    return {chat = function(req)
      seen[#seen + 1] = json.decode(json.encode(req.messages))
      return table.remove(replies, 1)
    end}
  end

  local function runs(list)
    return {tool = function() return {type = "function"} end,
            executeCode = function(input)
              list[#list + 1] = input.code
              return {stdout = "ran " .. input.code, exitCode = 0}
            end}
  end

  it("system set on an inheriting table is the one sent (string and function)", function()
    local seen = {}
    _G.sandbox, _G.model = runs({}), scripted({}, seen)
    local M = derived()
    M.system = "You are terse."
    base.onTurn(ctx(M), "hi")
    assert.same({role = "system", content = "You are terse."}, seen[1][1])
    M.system = function(c) return "Owner " .. c.runId end
    _G.model = scripted({}, seen)
    base.onTurn(ctx(M), "hi")
    assert.equal("Owner run-7", seen[2][1].content)
    M.system = 42
    assert.has_error(function() base.onTurn(ctx(M), "hi") end,
                     "hooks.system must be a string or a function returning one, not a number")
  end)

  it("maxSteps set on an inheriting table bounds the model calls", function()
    local seen = {}
    _G.sandbox, _G.model = runs({}), scripted({"1", "2", "3", "4"}, seen)
    local M = derived()
    M.maxSteps = 2
    local c = ctx(M)
    base.onTurn(c, "go")
    assert.equal(2, #seen)
    assert.equal("(stopped after 2 model steps)", c.events[#c.events][2])
  end)

  it("beforeToolCall: nothing runs the call, a call runs instead, a table answers", function()
    local ran, seen = {}, {}
    _G.sandbox, _G.model = runs(ran), scripted({"a", "b", "c"}, seen)
    local M = derived()
    function M.beforeToolCall(_, call)
      local code = json.decode(call["function"].arguments).code
      if code == "b" then
        return {id = call.id, type = "function", ["function"] = {name = "executeCode",
                arguments = '{"code":"b2","language":"python"}'}}
      elseif code == "c" then
        return {error = "Nothing ran: not approved", code = "permission"}
      end
    end
    base.onTurn(ctx(M), "go")
    assert.same({"a", "b2"}, ran)               -- c never ran
    local last = seen[#seen]
    assert.equal("ran a", json.decode(last[4].content).stdout)
    assert.equal("ran b2", json.decode(last[6].content).stdout)
    assert.same({error = "Nothing ran: not approved", code = "permission"},
                json.decode(last[8].content))
    function M.beforeToolCall() return "yes" end
    _G.model = scripted({"x"}, seen)
    assert.has_error(function() base.onTurn(ctx(M), "go") end,
      "beforeToolCall returned a string: return nothing, a call or a result table")
  end)

  it("afterToolCall sees every result once and may replace it", function()
    local seen, after = {}, {}
    _G.sandbox, _G.model = runs({}), scripted({"1", "2"}, seen)
    local M = derived()
    function M.afterToolCall(_, call, result)
      after[#after + 1] = call.id .. ":" .. result.stdout
      if call.id == "c2" then return {stdout = "hidden", exitCode = 0} end
    end
    base.onTurn(ctx(M), "go")
    assert.same({"c1:ran 1", "c2:ran 2"}, after)
    assert.equal("hidden", json.decode(seen[#seen][6].content).stdout)
  end)

  it("onError can answer a model failure in one line instead of failing the turn", function()
    _G.sandbox = runs({})
    _G.model = {chat = function() return nil, "bad key", "unauthenticated" end}
    local M, got = derived(), nil
    local line = "The model is unavailable: check BERTH_API_KEY."
    function M.onError(_, err) got = err return line end
    local c = ctx(M)
    base.onTurn(c, "hi")
    assert.same({source = "model", message = "bad key", code = "unauthenticated"}, got)
    assert.same({"assistant", line}, c.events[#c.events])
    function M.onError() end                    -- nothing: the turn fails as before
    assert.has_error(function() base.onTurn(ctx(M), "hi") end,
                     "the model failed (unauthenticated): bad key")
  end)
end)

-- scripts/examples/: each example hook, with the natives faked.
describe("example hooks", function()
  local saved, logged

  before_each(function()
    saved = {sandbox = sandbox, model = model, log = log}
    for _, m in ipairs{"code_chat", "examples.approval", "examples.logging",
                       "examples.cell_budget"} do
      package.loaded[m] = nil
    end
    logged = {}
    _G.log = setmetatable({info = function(s) logged[#logged + 1] = s end},
                          {__call = function(_, s) logged[#logged + 1] = s end})
  end)

  after_each(function()
    _G.sandbox, _G.model, _G.log = saved.sandbox, saved.model, saved.log
  end)

  local function ctx(hooks, state)
    local c = {runId = "run-1", messages = json.array{}, events = {}, hooks = hooks,
               state = state}
    function c:emit(kind, data) self.events[#self.events + 1] = {kind, data} end
    function c:say(text) self:emit("assistant", text) end
    return c
  end

  local function turn(hooks, c, codes)
    local ran, seen = {}, {}
    _G.sandbox = {tool = function() return {type = "function"} end,
                  executeCode = function(input)
                    ran[#ran + 1] = input.code
                    return {language = "python", stdout = "ok\n", stderr = "", exitCode = 0}
                  end}
    local replies = {}
    for i, code in ipairs(codes) do
      replies[i] = {role = "assistant", tool_calls = json.array{{id = "t" .. i,
        type = "function", ["function"] = {name = "executeCode",
        arguments = json.encode{code = code, language = "python"}}}}}
    end
    replies[#replies + 1] = {role = "assistant", content = "done"}
    _G.model = {chat = function(req)
      seen[#seen + 1] = json.decode(json.encode(req.messages))
      return table.remove(replies, 1)
    end}
    hooks.onTurn(c, "go")
    return ran, seen[#seen]
  end

  it("approval refuses a cell that starts a process and runs the rest", function()
    local M = require "examples.approval"
    local ran, last = turn(M, ctx(M), {"print(1)", "import subprocess; subprocess.run('id')"})
    assert.same({"print(1)"}, ran)
    local refused = json.decode(last[#last].content)
    assert.equal("permission", refused.code)
    assert.truthy(refused.error:find("not approved", 1, true))
    -- "always" approves every later cell of that conversation
    function M.approve() return "always" end
    local c = ctx(M)
    ran = turn(M, c, {"import subprocess"})
    function M.approve() return "no" end
    local ran2 = turn(M, c, {"import socket"})
    assert.same({"import subprocess"}, ran)
    assert.same({"import socket"}, ran2)
  end)

  it("logging writes one line per tool call, every turn", function()
    local M = require "examples.logging"
    local c = ctx(M)
    turn(M, c, {"1", "2"})
    turn(M, c, {"3"})
    assert.equal(3, #logged)
    local want = "^tool call t1: python exit 0 in %d+ ms, 3 bytes out, 0 bytes err$"
    assert.truthy(logged[1]:find(want))
  end)

  it("cell_budget answers past the budget without running, counting in ctx.state", function()
    local M = require "examples.cell_budget"
    M.cellBudget = 2
    local state = {}
    local c = ctx(M, state)
    local ran = turn(M, c, {"1", "2"})
    local ran2, last = turn(M, c, {"3"})
    assert.same({"1", "2"}, ran)
    assert.same({}, ran2)
    assert.equal(2, state.cellsUsed)
    assert.equal("resource_exhausted", json.decode(last[#last].content).code)
  end)
end)

describe("json (berth's own, jansson-backed)", function()
  it("keeps integers, [] and {} apart", function()
    local decoded = json.decode('{"b":{},"a":[],"n":[1,2.5]}')
    assert.equal('{"a":[],"b":{},"n":[1,2.5]}', json.encode(decoded))
    assert.equal("integer", math.type(json.decode("[1]")[1]))
  end)
end)

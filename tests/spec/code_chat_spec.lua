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

describe("json (berth's own, jansson-backed)", function()
  it("keeps integers, [] and {} apart", function()
    local decoded = json.decode('{"b":{},"a":[],"n":[1,2.5]}')
    assert.equal('{"a":[],"b":{},"n":[1,2.5]}', json.encode(decoded))
    assert.equal("integer", math.type(json.decode("[1]")[1]))
  end)
end)

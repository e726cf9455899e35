-- options_spec.lua — the host's natives check the tables and arguments Lua passes
-- them (issue 14, item 3): an unknown key raises, naming the known ones, instead of
-- being ignored (`lang = "javascript"` used to run Python).  Run through the host:
-- build/berth lua /usr/bin/busted tests/spec (no daemon or model is needed: the checks
-- come before either is used).

describe("options", function()
  local function raises(pattern, f, ...)
    local ok, err = pcall(f, ...)
    assert.is_false(ok, "expected an error matching " .. pattern)
    assert.truthy(tostring(err):find(pattern), tostring(err))
  end

  it("executeCode refuses an unknown key and lists the known ones", function()
    raises("executeCode: unknown option 'lang' %(known: code, language, files, runId, "
           .. "userId, timeoutMs%)", sandbox.executeCode, {code = "1", lang = "javascript"})
    raises("executeCode: unknown option %[number%]", sandbox.executeCode, {"1", code = "1"})
  end)

  it("executeCode refuses an unknown key in a file", function()
    raises("executeCode: a file: unknown option 'name' %(known: path, content%)",
           sandbox.executeCode, {code = "1", files = {{path = "a", content = "", name = "x"}}})
  end)

  it("executeCode checks timeoutMs: a whole number of milliseconds", function()
    for _, bad in ipairs{0, -5, 1.5, "soon", 2 ^ 31} do
      raises("timeoutMs must be a whole number of milliseconds", sandbox.executeCode,
             {runId = "r", code = "1", timeoutMs = bad})
    end
    -- a good one goes on to the call (here: no daemon, a value failure, not a raise)
    local r, msg, code = sandbox.executeCode{runId = "r", code = "1", timeoutMs = 1000}
    assert.is_nil(r)
    assert.equal("environment", code, msg)
  end)

  it("warm and dispose take (runId [, userId]) and nothing more", function()
    raises("sandbox.warm takes %(runId %[, userId%]%)", sandbox.warm, "r", "u", {x = 1})
    raises("sandbox.dispose takes %(runId %[, userId%]%)", sandbox.dispose, "r", nil, "extra")
    raises("bad argument #1", sandbox.warm, {runId = "r"})
  end)

  it("model.chat refuses an unknown key and a non-function on_delta", function()
    raises("model.chat: unknown option 'temprature' %(known: messages, tools, on_delta%)",
           model.chat, {messages = {}, temprature = 0})
    raises("model.chat: on_delta must be a function", model.chat,
           {messages = {}, on_delta = "print"})
    -- the known keys pass the check (no model here: a value failure)
    local r, _, code = model.chat{messages = {}, tools = {}, on_delta = function() end}
    assert.is_nil(r)
    assert.equal("unavailable", code)
  end)
end)

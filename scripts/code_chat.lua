-- code_chat.lua — the default chat agent hooks: the code-sandbox pattern of
-- docs/architecture.md on berth.
--
--   onTurnStart  warm the run's sandbox, without waiting
--   onTurn       the model loop with the executeCode tool (at most maxSteps calls)
--   onSuspend    dispose the sandbox right before the conversation sleeps
--   onComplete   dispose it when the conversation ends
--
-- Customise by inheriting: the hooks read their settings from the table your hooks
-- file returns (ctx.hooks), so whatever you set there wins over the defaults here.
--
--   local M = setmetatable({}, {__index = require "code_chat"})
--   M.system = "You are a terse data analyst. ..."  -- or function(ctx) return "..." end
--   M.maxSteps = 4                                    -- model calls per turn
--   function M.beforeToolCall(ctx, call) ... end      -- see below
--   function M.afterToolCall(ctx, call, result) ... end
--   function M.onError(ctx, err) ... end
--   return M
--
-- beforeToolCall(ctx, call) runs before each tool call the model makes.  `call` is the
-- model's call ({id =, type = "function", ["function"] = {name =, arguments = JSON}}).
-- Return nothing to run it; return a changed call (a table with a "function" field) to
-- run that instead; return any other table (a result, or {error = message, code =
-- code}) to hand it to the model as the call's result without running anything.
--
-- afterToolCall(ctx, call, result) runs after each call with what the model is about
-- to get (also when beforeToolCall answered for it); return a table to replace it.
--
-- onError(ctx, err) runs when the model fails: err = {source = "model", message =,
-- code =}.  Return a string to say it to the person and end the turn; return nothing
-- and the turn fails with err.message (an `error` event).
--
-- scripts/examples/ has an approval hook, a logging hook and a cell budget built on
-- these.

local M = {}

M.maxSteps = 10

-- H17: use Python for arithmetic and data, load data once, rely on variables while
-- stateKept holds, rebuild them on freshInterpreter (and files on freshSandbox).
M.system = [[
You are a helpful assistant with a code sandbox (the executeCode tool).
Write and run Python for arithmetic and for any work on data instead of computing in
your head. Load data once and keep it in variables: while a result says stateKept,
your variables, functions and imports are still there. When a result says
freshInterpreter, the interpreter was restarted: rebuild the variables you need. When
it says freshSandbox, the files you wrote earlier are gone too: pass data again in
files and rebuild from scratch.]]

-- The table whose settings count: the hooks file's own (it inherits this one).
local function settings(ctx)
  local h = ctx.hooks
  if type(h) == "table" then
    return h
  end
  return M
end

local function systemPrompt(ctx, H)
  local sys = H.system
  if type(sys) == "function" then
    sys = sys(ctx)
  end
  if type(sys) ~= "string" then
    error(("hooks.system must be a string or a function returning one, not a %s")
          :format(type(sys)), 0)
  end
  return sys
end

function M.onTurnStart(ctx)
  -- Warm, don't wait: the sandbox opens while the model thinks.  Errors are
  -- swallowed by the layer; a misconfiguration shows on the first executeCode.
  sandbox.warm(ctx.runId, ctx.userId)
end

-- One tool call, run: the model's arguments (JSON text) to a result table or an
-- error.  Guest failures (exit 1, a traceback) are results; infrastructure failures
-- come back as {error = message, code = code} for the model to read.
local function execute(call)
  local fn = call["function"] or {}
  if fn.name ~= "executeCode" then
    return {error = "unknown tool " .. tostring(fn.name), code = "invalid_argument"}
  end
  local args, why = fn.arguments, nil
  if type(args) == "string" then
    args, why = json.decode(args)
  end
  if type(args) ~= "table" then
    return {error = "the arguments are not a JSON object: " .. tostring(why),
            code = "invalid_argument"}
  end
  -- Only the model's code, language and files: never a runId, which is the host's.
  local ok, r, msg, code = pcall(sandbox.executeCode,
    {code = args.code, language = args.language, files = args.files})
  if not ok then
    return {error = tostring(r), code = "invalid_argument"}
  end
  if not r then
    return {error = msg, code = code}
  end
  return r
end

-- A tool call through the hooks' customisation points: the result the model gets.
local function toolCall(ctx, H, call)
  local result
  if H.beforeToolCall then
    local r = H.beforeToolCall(ctx, call)
    if r ~= nil and type(r) ~= "table" then
      error(("beforeToolCall returned a %s: return nothing, a call or a result table")
            :format(type(r)), 0)
    end
    if r ~= nil and r["function"] ~= nil then
      call = r
    elseif r ~= nil then
      result = r
    end
  end
  if result == nil then
    result = execute(call)
  end
  if H.afterToolCall then
    local r = H.afterToolCall(ctx, call, result)
    if r ~= nil then
      result = r
    end
  end
  return result
end

-- The model's tool list.  sandbox.tool() depends only on the host's sandbox settings,
-- and model.chat only reads the list, so one list serves every turn: converting the
-- tool into a new table at every turn was 4 % of the instructions of a turn of
-- berth serve (callgrind, bench/serve_load).  A failure is not kept: the next turn
-- asks again.
local toolList

local function modelTools()
  if toolList then
    return toolList
  end
  local tool, why = sandbox.tool()
  if not tool then
    log.warn("no executeCode tool: " .. tostring(why))
    return json.array{}
  end
  toolList = json.array{tool}
  return toolList
end

function M.onTurn(ctx, message)
  local H = settings(ctx)
  local messages = ctx.messages
  if #messages == 0 then
    messages[1] = {role = "system", content = systemPrompt(ctx, H)}
  end
  messages[#messages + 1] = {role = "user", content = message}
  local tools = modelTools()
  local maxSteps = H.maxSteps
  if math.type(maxSteps) ~= "integer" or maxSteps < 1 then
    error("hooks.maxSteps must be a positive integer, not " .. tostring(maxSteps), 0)
  end
  for _ = 1, maxSteps do
    local reply, err, code = model.chat{
      messages = messages,
      tools = tools,
      on_delta = function(text) ctx:emit("delta", text) end,
    }
    if not reply then
      local e = {source = "model", message = tostring(err), code = code}
      local said = H.onError and H.onError(ctx, e)
      if type(said) == "string" then
        ctx:say(said)
        return
      end
      error(("the model failed (%s): %s"):format(tostring(code), tostring(err)), 0)
    end
    messages[#messages + 1] = reply
    if reply.content and reply.content ~= "" then
      ctx:say(reply.content)
    end
    local calls = reply.tool_calls
    if not calls or #calls == 0 then
      return
    end
    for _, call in ipairs(calls) do
      ctx:emit("toolCall", call)
      local result = toolCall(ctx, H, call)
      if result.error then
        ctx:emit("toolResult", {id = call.id, error = result.error, code = result.code})
      else
        ctx:emit("toolResult", {id = call.id, result = result})
      end
      messages[#messages + 1] = {role = "tool", tool_call_id = call.id,
                                 content = json.encode(result)}
    end
  end
  ctx:say(("(stopped after %d model steps)"):format(maxSteps))
end

function M.onSuspend(ctx)
  sandbox.dispose(ctx.runId)
end

function M.onComplete(ctx)
  sandbox.dispose(ctx.runId)
end

return M

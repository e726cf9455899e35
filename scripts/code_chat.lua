-- code_chat.lua — the default chat agent hooks: Trigger.dev's code-sandbox pattern
-- (client.md §8.1, §9) on berth.
--
--   onTurnStart  warm the run's sandbox, without waiting
--   onTurn       the model loop with the executeCode tool (at most maxSteps calls)
--   onSuspend    dispose the sandbox right before the conversation sleeps
--   onComplete   dispose it when the conversation ends
--
-- To change one hook, keep the others:
--   local base = require "code_chat"
--   local M = setmetatable({}, {__index = base})
--   function M.onTurn(ctx, message) ... end
--   return M

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

function M.onTurnStart(ctx)
  -- Warm, don't wait: the sandbox opens while the model thinks.  Errors are
  -- swallowed by the layer; a misconfiguration shows on the first executeCode.
  sandbox.warm(ctx.runId, ctx.userId)
end

-- One tool call: the model's arguments (JSON text) to a result table or an error.
-- Guest failures (exit 1, a traceback) are results; infrastructure failures come
-- back as {error = message, code = code} for the model to read.
local function runTool(call)
  local fn = call["function"] or {}
  if fn.name ~= "executeCode" then
    return {error = "unknown tool " .. tostring(fn.name), code = "invalid_argument"}
  end
  local args, why = json.decode(fn.arguments or "")
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

function M.onTurn(ctx, message)
  local messages = ctx.messages
  if #messages == 0 then
    messages[1] = {role = "system", content = M.system}
  end
  messages[#messages + 1] = {role = "user", content = message}
  local tool, why = sandbox.tool()
  local tools = json.array{tool}
  if not tool then
    log.warn("no executeCode tool: " .. tostring(why))
    tools = json.array{}
  end
  for _ = 1, M.maxSteps do
    local reply, err, code = model.chat{
      messages = messages,
      tools = tools,
      on_delta = function(text) ctx:emit("delta", text) end,
    }
    if not reply then
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
      local result = runTool(call)
      if result.error then
        ctx:emit("toolResult", {id = call.id, error = result.error, code = result.code})
      else
        ctx:emit("toolResult", {id = call.id, result = result})
      end
      messages[#messages + 1] = {role = "tool", tool_call_id = call.id,
                                 content = json.encode(result)}
    end
  end
  ctx:say(("(stopped after %d model steps)"):format(M.maxSteps))
end

function M.onSuspend(ctx)
  sandbox.dispose(ctx.runId)
end

function M.onComplete(ctx)
  sandbox.dispose(ctx.runId)
end

return M

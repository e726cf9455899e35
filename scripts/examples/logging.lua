-- logging.lua — code_chat with one log line per tool call: what ran, how it ended,
-- how long it took and how much it printed.  Nothing is wrapped, so the line is
-- written once per call however many turns the conversation has.
--
--   berth serve --hooks scripts/examples/logging.lua ...

local M = setmetatable({}, {__index = require "code_chat"})

local started = setmetatable({}, {__mode = "k"})

function M.beforeToolCall(_, call)
  started[call] = now()
end

function M.afterToolCall(_, call, result)
  local ms = started[call] and (now() - started[call]) * 1000 or 0
  if result.error then
    log.info(("tool call %s failed after %.0f ms: [%s] %s"):format(
      tostring(call.id), ms, tostring(result.code), tostring(result.error)))
  else
    log.info(("tool call %s: %s exit %s in %.0f ms, %d bytes out, %d bytes err%s"):format(
      tostring(call.id), tostring(result.language), tostring(result.exitCode), ms,
      #(result.stdout or ""), #(result.stderr or ""),
      result.freshSandbox and ", fresh sandbox" or ""))
  end
end

return M

-- approval.lua — code_chat with an approval step before every cell.
--
-- Each cell the model wants to run goes through M.approve(ctx, code, language), which
-- answers "yes", "no" or "always" (approve this and every later cell of the
-- conversation).  The default below refuses cells that start processes or reach for
-- the network, and approves the rest; replace it with your own policy (a person in the
-- loop, an allow-list).  A refused cell never runs: the model is told why and can try
-- something else.
--
--   berth chat --hooks scripts/examples/approval.lua

local M = setmetatable({}, {__index = require "code_chat"})

M.refuse = {"subprocess", "os%.system", "socket", "urllib", "child_process", "require%('http"}

function M.approve(_, code)
  for _, pattern in ipairs(M.refuse) do
    if code:find(pattern) then
      return "no", "it uses " .. pattern:gsub("%%", "")
    end
  end
  return "yes"
end

local always = setmetatable({}, {__mode = "k"})   -- conversations that said "always"

function M.beforeToolCall(ctx, call)
  if always[ctx] then
    return
  end
  local args = json.decode(call["function"].arguments or "") or {}
  local answer, why = ctx.hooks.approve(ctx, tostring(args.code), tostring(args.language))
  if answer == "always" then
    always[ctx] = true
  elseif answer ~= "yes" then
    log.info(("refused a %s cell: %s"):format(tostring(args.language), why or "not approved"))
    local reason = why and (" (" .. why .. ")") or ""
    return {error = "Nothing ran: the cell was not approved" .. reason, code = "permission"}
  end
end

return M

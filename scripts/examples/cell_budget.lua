-- cell_budget.lua — code_chat with a budget of cells per conversation.  Once a
-- conversation has run M.cellBudget cells, further calls are answered without running
-- anything, and the model is told the budget is spent (it then answers from what it
-- has).  The count is kept in ctx.state when the host keeps one (it then survives
-- suspends and restarts with the conversation), else beside the conversation in
-- memory.
--
--   berth chat --hooks scripts/examples/cell_budget.lua

local M = setmetatable({}, {__index = require "code_chat"})

M.cellBudget = 20

local counts = setmetatable({}, {__mode = "k"})   -- when ctx.state is not there

local function used(ctx)
  if type(ctx.state) == "table" then
    return ctx.state.cellsUsed or 0
  end
  return counts[ctx] or 0
end

local function setUsed(ctx, n)
  if type(ctx.state) == "table" then
    ctx.state.cellsUsed = n
  else
    counts[ctx] = n
  end
end

function M.beforeToolCall(ctx)
  local budget = ctx.hooks.cellBudget
  local n = used(ctx)
  if n >= budget then
    return {error = ("Nothing ran: this conversation's budget of %d cells is spent; "
                     .. "answer from the results you have"):format(budget),
            code = "resource_exhausted"}
  end
  setUsed(ctx, n + 1)
end

return M

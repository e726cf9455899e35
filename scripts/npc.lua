-- npc.lua — an NPC agent for a game server (runtime/examples/npc_server.c).
--
-- Each NPC is one conversation.  Its persona comes from the game as ctx.metadata
-- ({name = "Mira", persona = "the smith, gruff but fair"}).  What players told it is
-- its memory, kept in its own sandbox as a Python dict `seen` (player -> lines),
-- updated by one executeCode each time a player's line reaches it.  A line arrives as
-- the user message, JSON: {"player": "bob", "text": "the bridge is out", "tick": 12}.
--
-- Memory and suspends: after the idle timeout the conversation suspends and its
-- sandbox is disposed (as code_chat does), and a host with a sandbox cap may close an
-- idle NPC's sandbox for another's.  The next cell then reports freshInterpreter: the
-- NPC rebuilds `seen` from its journal (ctx.state.journal, the lines in Lua) in one
-- cell.  The journal is what makes the memory durable; the sandbox holds the working
-- copy the NPC's code queries.  With a store (npc_server --store URL) ctx.state and
-- ctx.messages are kept across restarts: after one, each NPC's first cell is in a
-- fresh sandbox and it rebuilds from the journal the same way.
--
-- Events for the game (ctx:emit): toolCall / toolResult for every cell (ids "mem-<n>"
-- and "rebuild-<n>"), delta / assistant for the NPC's spoken line.

local M = {}

M.historyLimit = 8      -- model messages kept besides the persona (short-term memory)

local function persona(ctx)
  local meta = ctx.metadata or {}
  return ("You are %s, %s, a character in a village. Players talk to you. Stay in "
          .. "character, answer in one or two sentences, and remember what each player "
          .. "told you (your memory is the Python dict `seen` in your sandbox)."):format(
          meta.name or "a villager", meta.persona or "a quiet villager")
end

-- A Python string literal: a JSON string is one (\" \\ \n \uXXXX all read the same).
local function py(s)
  return json.encode(tostring(s))
end

local function cell(ctx, id, code)
  local call = {id = id, type = "function",
                ["function"] = {name = "executeCode",
                                arguments = json.encode{code = code, language = "python"}}}
  ctx:emit("toolCall", call)
  local r, msg, errcode = sandbox.executeCode{code = code, language = "python"}
  if r then
    ctx:emit("toolResult", {id = id, result = r})
  else
    ctx:emit("toolResult", {id = id, error = msg, code = errcode})
  end
  return r, msg, errcode
end

-- Records the line in the sandbox; rebuilds the whole memory there when the sandbox
-- (or its interpreter) is new.
local function remember(ctx, player, text)
  local journal = ctx.state.journal
  journal[#journal + 1] = json.array{player, text}
  local n = #journal
  local r, msg = cell(ctx, "mem-" .. n,
    ("seen = globals().get('seen') or {}\n"
     .. "seen.setdefault(%s, []).append(%s)\n"
     .. "len(seen[%s])"):format(py(player), py(text), py(player)))
  if not r then
    log.warn("memory not updated: " .. tostring(msg))
    return false
  end
  if r.freshInterpreter and n > 1 then
    -- The sandbox forgot the earlier lines: replay the journal into it.
    local rebuilt = cell(ctx, "rebuild-" .. n,
      ("seen = {}\nfor p, t in %s:\n    seen.setdefault(p, []).append(t)\n"
       .. "sum(len(v) for v in seen.values())"):format(json.encode(journal)))
    return rebuilt ~= nil
  end
  return true
end

function M.onTurnStart(ctx)
  if not ctx.state.journal then
    ctx.state.journal = json.array{}
  end
  sandbox.warm(ctx.runId, ctx.userId)
end

function M.onTurn(ctx, message)
  local line = json.decode(message)
  if type(line) ~= "table" or type(line.text) ~= "string" then
    error("a player's line must be JSON {\"player\": ..., \"text\": ...}", 0)
  end
  local player = tostring(line.player or "someone")
  remember(ctx, player, line.text)

  local history = ctx.messages
  history[#history + 1] = {role = "user", content = player .. " says: " .. line.text}
  if #history > M.historyLimit then
    -- a new table, not one changed in place: the store then rewrites the history
    local kept = json.array{}
    table.move(history, #history - M.historyLimit + 1, #history, 1, kept)
    history = kept
    ctx.messages = kept
  end
  local request = json.array{{role = "system", content = persona(ctx)}}
  for i = 1, #history do
    request[#request + 1] = history[i]
  end
  local reply, err, code = model.chat{
    messages = request,
    tools = json.array{},
    on_delta = function(text) ctx:emit("delta", text) end,
  }
  if not reply then
    error(("the model failed (%s): %s"):format(tostring(code), tostring(err)), 0)
  end
  history[#history + 1] = {role = "assistant", content = reply.content or ""}
  if reply.content and reply.content ~= "" then
    ctx:say(reply.content)
  end
end

function M.onSuspend(ctx)
  sandbox.dispose(ctx.runId)
end

function M.onComplete(ctx)
  sandbox.dispose(ctx.runId)
end

return M

-- npc_model.lua — the scripted model behind the NPC example (runtime/examples/
-- npc_server.c): any line a player says gets one of these answers, in turn.
-- `template = true` puts the request's last user message where "{{user}}" stands;
-- `loop = true` starts over when the turns run out.  See runtime/README.md.
return {
  title = "NPC lines",
  template = true,
  loop = true,
  turns = {
    { user = "*", replies = { { say = "Aye. \"{{user}}\" — I'll remember that." } } },
    { user = "*", replies = { { say = "Hm. You're not the first to tell me so." } } },
    { user = "*", replies = { { say = "Mind your step on the way out." } } },
    { user = "*", replies = { { say = "I've heard stranger things at this forge." } } },
  },
}

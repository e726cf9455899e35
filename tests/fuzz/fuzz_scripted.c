/*
 * fuzz_scripted.c — the scripted model's conversation files (runtime/models/model_scripted.c):
 * berth_script_load on any file, then, when it loads, the script played through the
 * model the way a replay plays it: every user turn sent, every tool call answered, the
 * expectations checked, the play finished.  A script is read as JSON when it starts
 * with '{' (a .json file) and as Lua otherwise (a .lua file, run with its budget).
 *
 * Checked: nothing crashes, leaks or reads out of bounds; a script that loads has a
 * non-empty "turns" array and every reply a "calls" array (what the player relies
 * on); every reply the model gives is an assistant message; the checks it reports
 * are counted by berth_scripted_finish.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ev.h>

#include "model.h"

#define MAX_CHATS 64                /* model calls per input, at most */

static struct ev_loop *loop;
static char dir[64];

typedef struct play {
  json_t *reply;
  bool done;
  unsigned checks;
} play;

static void on_check(void *ud, bool ok, const char *what)
{
  (void)ok;
  if (!what)
    abort();
  ((play *)ud)->checks++;
}

static void on_reply(void *ud, json_t *reply, const char *code, char *message)
{
  play *p = ud;
  if (!reply == !code)
    abort();                    /* exactly one of a reply and an error */
  free(message);
  p->reply = reply;
  p->done = true;
}

static void on_delta(void *ud, const char *text, size_t len)
{
  (void)ud;
  if (!text || !len)
    abort();
}

static uint64_t hash(const uint8_t *data, size_t size)
{
  uint64_t h = 1469598103934665603u;
  for (size_t i = 0; i < size; i++)
    h = (h ^ data[i]) * 1099511628211u;
  return h;
}

/* The tool result a call gets: its own expectations as the result (so that checks
 * pass), an error, or text that is not JSON, by turns. */
static json_t *result_for(const json_t *call, uint64_t pick)
{
  const json_t *expect = json_object_get(call, "expect");
  switch (pick % 3) {
  case 0: {
    char *text = expect ? json_dumps(expect, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    json_t *v = json_string(text ? text : "{}");
    free(text);
    return v ? v : json_string("{}");
  }
  case 1:
    return json_string("{\"error\": \"capacity\", \"code\": \"capacity\"}");
  default:
    return json_string("Nothing ran");
  }
}

/* One model call on `msgs`; appends the reply and the tool results to it (`calls`: the
 * script's calls of this step, whose expectations the results play back).  false when
 * the model refused. */
static bool chat(berth_model *m, json_t *msgs, const json_t *calls, play *p, uint64_t *pick)
{
  json_t *req = json_pack("{s:O, s:[]}", "messages", msgs, "tools");
  berth_model_call *c = NULL;
  char *err = NULL;
  p->done = false;
  p->reply = NULL;
  berth_model_request *r = berth_request_from_json(req);
  if (!r)
    abort();
  int rc = m->ops->chat(m, r, on_delta, on_reply, p, &c, &err);
  berth_request_free(r);
  json_decref(req);
  if (rc != 0) {
    free(err);
    return false;
  }
  if (p->done)
    abort();                    /* never from inside chat() */
  while (!p->done)
    ev_run(loop, EVRUN_ONCE);
  const char *role = json_string_value(json_object_get(p->reply, "role"));
  if (!role || strcmp(role, "assistant") != 0)
    abort();
  size_t i;
  json_t *tc;
  json_array_append(msgs, p->reply);
  json_array_foreach(json_object_get(p->reply, "tool_calls"), i, tc) {
    const char *id = json_string_value(json_object_get(tc, "id"));
    const char *args = json_string_value(json_object_get(json_object_get(tc, "function"),
                                                         "arguments"));
    if (!id || !args)
      abort();
    *pick = *pick * 6364136223846793005u + 1442695040888963407u;
    json_t *res = result_for(json_array_get(calls, i), *pick >> 33);
    json_array_append_new(msgs, json_pack("{s:s, s:s, s:o}", "role", "tool",
                                          "tool_call_id", id, "content", res));
  }
  json_decref(p->reply);
  return true;
}

static void play_script(json_t *script, uint64_t pick)
{
  static const char *const providers[] = {NULL, "echo", "bwrap", "gvisor"};
  play p = {0};
  berth_model_options mo = {loop, providers[pick % 4], on_check, &p};
  char *err = NULL;
  berth_model *m = berth_scripted_new(script, &mo, &err);
  if (!m)
    abort();                    /* a loaded script always makes a model */
  json_t *msgs = json_array();
  size_t i, chats = 0;
  json_t *turn;
  json_array_foreach(json_object_get(script, "turns"), i, turn) {
    const json_t *user = json_object_get(turn, "user");
    if (!user)
      continue;
    json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user", "content", user));
    size_t steps = json_array_size(json_object_get(turn, "replies")) + 1;
    const json_t *replies = json_object_get(turn, "replies");
    for (size_t s = 0; s < steps && chats < MAX_CHATS; s++, chats++) {
      const json_t *calls = json_object_get(json_array_get(replies, s), "calls");
      if (!chat(m, msgs, calls, &p, &pick))
        break;
    }
  }
  if (chats < MAX_CHATS) {      /* one turn more than the script has */
    json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", "more?"));
    chat(m, msgs, NULL, &p, &pick);
  }
  unsigned checked, failed;
  berth_scripted_finish(m, &checked, &failed);
  if (checked != p.checks || failed > checked)
    abort();
  json_decref(msgs);
  berth_model_free(m);
}

/* The scratch directory goes when the process ends (make test replays every run). */
static void remove_dir(void)
{
  rmdir(dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (!loop) {
    loop = ev_loop_new(EVFLAG_AUTO);
    snprintf(dir, sizeof dir, "/tmp/fuzz_scripted.XXXXXX");
    if (!loop || !mkdtemp(dir))
      abort();
    atexit(remove_dir);
  }
  size_t lead = 0;
  while (lead < size && (data[lead] == ' ' || data[lead] == '\n' || data[lead] == '\t'))
    lead++;
  char path[128];
  snprintf(path, sizeof path, "%s/script.%s", dir, lead < size && data[lead] == '{' ? "json" : "lua");
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0)
    abort();
  char *err = NULL;
  json_t *script = berth_script_load(path, &err);
  unlink(path);
  if (!script) {
    if (!err)
      abort();                  /* a refusal always says why */
    free(err);
    return 0;
  }
  const json_t *turns = json_object_get(script, "turns");
  if (err || !json_is_array(turns) || json_array_size(turns) == 0)
    abort();
  size_t i, j;
  json_t *turn, *reply;
  json_array_foreach(turns, i, turn)
    json_array_foreach(json_object_get(turn, "replies"), j, reply)
      if (!json_is_array(json_object_get(reply, "calls")))
        abort();
  play_script(script, hash(data, size));
  json_decref(script);
  return 0;
}

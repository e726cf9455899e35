/*
 * model_scripted.c — the `scripted` model adapter: plays a conversation script (the
 * format is in runtime/README.md) and checks the expectations written in it against
 * the tool results it is handed back.
 *
 * It keeps no state between calls beyond which expectations were checked: the turn
 * is the number of user messages in the request, the step the number of assistant
 * messages since the last one.  So the same script and the same results always give
 * the same replies, whatever the hooks do in between.
 */
#include "jsonlua.h"
#include "plimsoll.h"             /* the one UTF-8 checker */
#include "xalloc.h"
#include "model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ev.h>
#include <lauxlib.h>
#include <lualib.h>

#define SCRIPT_BUDGET 10000000     /* instructions a script file may take to build */

/* {====================================================== loading */

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...)
{
  va_list ap;
  va_start(ap, f);
  char *s = NULL;
  if (vasprintf(&s, f, ap) < 0)
    s = NULL;
  va_end(ap);
  return s;
}

static const char *const check_keys[] = {
  "exitCode", "timedOut", "truncated", "stateKept", "filesPersist", "freshSandbox",
  "freshInterpreter", "language", "isolation", "stdout", "stderr", "stdoutContains",
  "stderrContains", "error", "errorCode", "ok", NULL
};

static bool is_check_key(const char *k)
{
  for (int i = 0; check_keys[i]; i++)
    if (strcmp(k, check_keys[i]) == 0)
      return true;
  return false;
}

static char *check_expect(const json_t *expect, const char *where)
{
  const char *k;
  json_t *v;
  if (!json_is_object(expect))
    return fmt("%s.expect must be a table", where);
  json_object_foreach((json_t *)expect, k, v) {
    if (is_check_key(k))
      continue;
    if (!json_is_object(v))
      return fmt("%s.expect: unknown check \"%s\" (a provider block must be a table)",
                 where, k);
    for (const char *p = k; *p; p++)
      if (!(*p >= 'a' && *p <= 'z'))
        return fmt("%s.expect: unknown check \"%s\"", where, k);
    char *w = fmt("%s.expect.%s", where, k);
    char *e = check_expect(v, w);
    free(w);
    if (e)
      return e;
  }
  return NULL;
}

/* Checks the script and gives every reply a "calls" array ("call" is shorthand). */
static char *validate(json_t *script)
{
  if (!json_is_object(script))
    return fmt("a script is a table with a 'turns' array");
  json_t *turns = json_object_get(script, "turns");
  if (!json_is_array(turns) || json_array_size(turns) == 0)
    return fmt("the script needs a non-empty 'turns' array");
  size_t i, j, c;
  json_t *turn, *reply, *call;
  json_array_foreach(turns, i, turn) {
    if (!json_is_object(turn))
      return fmt("turns[%zu] must be a table", i + 1);
    json_t *idle = json_object_get(turn, "idle");
    if (idle) {
      if (!json_is_true(idle) && !(json_is_string(idle) && !strcmp(json_string_value(idle), "wait")))
        return fmt("turns[%zu].idle must be true or \"wait\"", i + 1);
      continue;
    }
    if (!json_is_string(json_object_get(turn, "user")))
      return fmt("turns[%zu] needs a 'user' message (or idle = true)", i + 1);
    json_t *replies = json_object_get(turn, "replies");
    if (!replies) {
      json_object_set_new(turn, "replies", json_array());
      continue;
    }
    if (!json_is_array(replies))
      return fmt("turns[%zu].replies must be an array", i + 1);
    json_array_foreach(replies, j, reply) {
      if (!json_is_object(reply))
        return fmt("turns[%zu].replies[%zu] must be a table", i + 1, j + 1);
      json_t *say = json_object_get(reply, "say");
      if (say && !json_is_string(say))
        return fmt("turns[%zu].replies[%zu].say must be a string", i + 1, j + 1);
      json_t *calls = json_object_get(reply, "calls");
      json_t *one = json_object_get(reply, "call");
      if (one) {
        if (calls)
          return fmt("turns[%zu].replies[%zu] has both call and calls", i + 1, j + 1);
        calls = json_array();
        json_array_append(calls, one);
        json_object_set_new(reply, "calls", calls);
        json_object_del(reply, "call");
      } else if (!calls) {
        json_object_set_new(reply, "calls", json_array());
        continue;
      }
      if (!json_is_array(calls))
        return fmt("turns[%zu].replies[%zu].calls must be an array", i + 1, j + 1);
      json_array_foreach(calls, c, call) {
        char *where = fmt("turns[%zu].replies[%zu].calls[%zu]", i + 1, j + 1, c + 1);
        char *e = NULL;
        if (!json_is_object(call))
          e = fmt("%s must be a table", where);
        else if (!json_is_string(json_object_get(call, "code")) &&
                 !json_is_string(json_object_get(call, "arguments")))
          e = fmt("%s needs code (or raw arguments text)", where);
        else if (json_object_get(call, "expect"))
          e = check_expect(json_object_get(call, "expect"), where);
        free(where);
        if (e)
          return e;
      }
    }
  }
  return NULL;
}

static void script_hook(lua_State *L, lua_Debug *ar)
{
  (void)ar;
  luaL_error(L, "the script took too long to build (more than %d instructions)",
             SCRIPT_BUDGET);
}

static int script_to_json(lua_State *L)
{
  json_t **out = lua_touserdata(L, 2);
  if (!lua_istable(L, 1))
    return luaL_error(L, "the script must return a table (got %s)", luaL_typename(L, 1));
  *out = berth_json_check(L, 1);
  return 0;
}

/* A .lua script is data: it runs in a state of its own with the base, string, table,
 * math and utf8 libraries and `json`, but no io or os. */
static json_t *load_lua(const char *path, char **err)
{
  lua_State *L = luaL_newstate();
  static const luaL_Reg libs[] = {
    {LUA_GNAME, luaopen_base}, {LUA_STRLIBNAME, luaopen_string},
    {LUA_TABLIBNAME, luaopen_table}, {LUA_MATHLIBNAME, luaopen_math},
    {LUA_UTF8LIBNAME, luaopen_utf8}, {"json", luaopen_berth_json}, {NULL, NULL}
  };
  for (const luaL_Reg *l = libs; l->func; l++) {
    luaL_requiref(L, l->name, l->func, 1);
    lua_pop(L, 1);
  }
  lua_pushnil(L);
  lua_setglobal(L, "dofile");
  lua_pushnil(L);
  lua_setglobal(L, "loadfile");
  lua_sethook(L, script_hook, LUA_MASKCOUNT, SCRIPT_BUDGET);
  json_t *script = NULL;
  if (luaL_loadfilex(L, path, "t") != LUA_OK || lua_pcall(L, 0, 1, 0) != LUA_OK) {
    *err = fmt("%s", lua_tostring(L, -1));
  } else {
    lua_sethook(L, NULL, 0, 0);
    lua_pushcfunction(L, script_to_json);
    lua_insert(L, -2);
    lua_pushlightuserdata(L, &script);
    if (lua_pcall(L, 2, 0, 0) != LUA_OK)
      *err = fmt("%s: %s", path, lua_tostring(L, -1));
  }
  lua_close(L);
  return script;
}

json_t *berth_script_load(const char *path, char **err)
{
  *err = NULL;
  size_t n = strlen(path);
  json_t *script;
  if (n > 5 && strcmp(path + n - 5, ".json") == 0) {
    json_error_t e;
    script = json_load_file(path, JSON_ALLOW_NUL, &e);
    if (!script)
      *err = fmt("%s:%d:%d: %s", path, e.line, e.column, e.text);
  } else
    script = load_lua(path, err);
  if (!script)
    return NULL;
  char *why = validate(script);
  if (why) {
    *err = fmt("%s: %s", path, why);
    free(why);
    json_decref(script);
    return NULL;
  }
  return script;
}

/* }====================================================== */

/* {====================================================== the adapter */

typedef struct scripted scripted;

struct berth_model_call {          /* a reply waiting for the next loop iteration */
  struct berth_model_call *prev, *next;
  scripted *m;
  ev_timer timer;
  json_t *reply;
  berth_delta_fn delta;
  berth_reply_fn done;
  void *ud;
};

struct scripted {
  berth_model base;
  struct ev_loop *loop;
  json_t *script;
  char *provider;
  berth_check_fn on_check;
  void *check_ud;
  unsigned checked, failed;
  json_t *seen;                    /* call ids whose expectations were checked */
  berth_model_call *calls;
  size_t n_user_turns;             /* for `loop = true` */
};

static void report(scripted *m, bool ok, const char *f, ...) __attribute__((format(printf, 3, 4)));
static void report(scripted *m, bool ok, const char *f, ...)
{
  char line[1024];
  va_list ap;
  va_start(ap, f);
  vsnprintf(line, sizeof line, f, ap);
  va_end(ap);
  m->checked++;
  if (!ok)
    m->failed++;
  if (m->on_check)
    m->on_check(m->check_ud, ok, line);
}

/* A value for a message: JSON text, cut to 120 bytes. */
static char *show(const json_t *v)
{
  if (!v)
    return berth_xstrdup("absent");
  char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
  if (s && strlen(s) > 120)
    strcpy(s + 110, "…\"");
  return s ? s : berth_xstrdup("?");
}

static bool provider_applies(const scripted *m, const char *block)
{
  if (!m->provider)
    return false;
  if (strcmp(block, "real") == 0)
    return strcmp(m->provider, "echo") != 0;
  return strcmp(block, m->provider) == 0;
}

static bool contains(const json_t *hay, const json_t *needle)
{
  if (!json_is_string(hay))
    return false;
  const char *h = json_string_value(hay);
  if (json_is_string(needle))
    return strstr(h, json_string_value(needle)) != NULL;
  size_t i;
  json_t *n;
  json_array_foreach(needle, i, n)
    if (!json_is_string(n) || !strstr(h, json_string_value(n)))
      return false;
  return true;
}

/* Checks one call's result (`res`: the tool message content as JSON, or NULL when it
 * was not JSON) against `expect`. */
static void check_result(scripted *m, const char *id, const json_t *expect, const json_t *res)
{
  const char *k;
  json_t *want;
  const json_t *err = json_is_object(res) ? json_object_get(res, "error") : NULL;
  json_object_foreach((json_t *)expect, k, want) {
    if (!is_check_key(k)) {
      if (provider_applies(m, k))
        check_result(m, id, want, res);
      continue;
    }
    char *w = show(want);
    if (strcmp(k, "error") == 0) {
      bool ok = json_is_true(want) ? err != NULL
              : json_is_false(want) ? err == NULL
              : contains(err, want);
      char *g = show(err);
      if (json_is_boolean(want))
        report(m, ok, "%s: %s%s%s", id, json_is_true(want) ? "fails" : "does not fail",
               ok ? "" : " — FAILED, got ", ok ? "" : g);
      else
        report(m, ok, "%s: error contains %s%s%s", id, w, ok ? "" : " — FAILED, got ",
               ok ? "" : g);
      free(g);
      free(w);
      continue;
    }
    if (strcmp(k, "errorCode") == 0) {
      const json_t *got = json_is_object(res) ? json_object_get(res, "code") : NULL;
      bool ok = err && json_equal(got, want);
      char *g = show(got);
      report(m, ok, "%s: errorCode = %s%s%s", id, w, ok ? "" : " — FAILED, got ", ok ? "" : g);
      free(g);
      free(w);
      continue;
    }
    if (err || !json_is_object(res)) {
      char *g = show(err ? err : res);
      report(m, false, "%s: %s = %s — FAILED, the call gave no result: %s", id, k, w, g);
      free(g);
      free(w);
      continue;
    }
    if (strcmp(k, "ok") == 0) {
      report(m, true, "%s: ran", id);
      free(w);
      continue;
    }
    const json_t *got;
    bool ok;
    const char *op = "=";
    if (strcmp(k, "stdoutContains") == 0 || strcmp(k, "stderrContains") == 0) {
      got = json_object_get(res, k[3] == 'o' ? "stdout" : "stderr");
      ok = contains(got, want);
      op = "contains";
    } else if (strcmp(k, "freshSandbox") == 0 || strcmp(k, "freshInterpreter") == 0) {
      got = json_object_get(res, k);  /* absent means false (T07) */
      ok = json_is_true(want) == json_is_true(got);
    } else {
      got = json_object_get(res, k);
      ok = json_equal(got, want);
    }
    char *g = show(got);
    report(m, ok, "%s: %s %s %s%s%s", id, strstr(k, "Contains") ? (k[3] == 'o' ? "stdout" : "stderr") : k,
           op, w, ok ? "" : " — FAILED, got ", ok ? "" : g);
    free(g);
    free(w);
  }
}

static const json_t *user_turn(const scripted *m, size_t k)
{
  size_t i, n = 0;
  json_t *turn;
  json_array_foreach(json_object_get(m->script, "turns"), i, turn)
    if (json_object_get(turn, "user") && ++n == k)
      return turn;
  return NULL;
}

static void call_id(char *buf, size_t n, size_t turn, size_t step, size_t call)
{
  snprintf(buf, n, "call_%zu_%zu_%zu", turn, step, call);
}

/* The tool message answering `id` after message `from`, parsed (NULL if none). */
static json_t *tool_result(const berth_model_request *req, size_t from, const char *id,
                           bool *found)
{
  *found = false;
  for (size_t i = from; i < (size_t)berth_request_count(req); i++) {
    const char *role = berth_request_string(req, i, "role", NULL);
    const char *tid = berth_request_string(req, i, "tool_call_id", NULL);
    if (role && tid && !strcmp(role, "tool") && !strcmp(tid, id)) {
      *found = true;
      size_t len;
      const char *content = berth_request_string(req, i, "content", &len);
      if (!content)
        return json_incref((json_t *)berth_request_value(req, i, "content"));
      return json_loadb(content, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    }
  }
  return NULL;
}

/* Checks the expectations of step `step` (1-based) of turn k. */
static void check_step(scripted *m, const json_t *turn, size_t k, size_t step,
                       const berth_model_request *req, size_t from)
{
  const json_t *reply = json_array_get(json_object_get(turn, "replies"), step - 1);
  size_t i;
  json_t *call;
  json_array_foreach(json_object_get(reply, "calls"), i, call) {
    const json_t *expect = json_object_get(call, "expect");
    char id[80];
    call_id(id, sizeof id, k, step, i + 1);
    if (!expect || json_object_get(m->seen, id))
      continue;
    json_object_set_new(m->seen, id, json_true());
    bool found;
    json_t *res = tool_result(req, from, id, &found);
    if (!found)
      report(m, false, "%s: no tool result came back for this call", id);
    else
      check_result(m, id, expect, res);
    json_decref(res);
  }
}

/* With the script's `template = true`, "{{user}}" in a reply's text and code stands
 * for the turn's user message (so one script can drive many conversations and still
 * tell them apart).  Returns a new string. */
static json_t *fill(const json_t *text, const char *user)
{
  const char *s = json_string_value(text);
  if (!user || !strstr(s, "{{user}}"))
    return json_copy((json_t *)text);
  size_t ulen = strlen(user), n = 0;
  for (const char *p = s; (p = strstr(p, "{{user}}")); p += 8)
    n++;
  size_t len = json_string_length(text) + n * ulen + 1;
  char *out = berth_xmalloc(len), *o = out;
  for (const char *p = s, *q; ; p = q + 8) {
    q = strstr(p, "{{user}}");
    size_t seg = q ? (size_t)(q - p) : strlen(p);
    memcpy(o, p, seg);
    o += seg;
    if (!q)
      break;
    memcpy(o, user, ulen);
    o += ulen;
  }
  *o = '\0';
  json_t *v = json_stringn(out, (size_t)(o - out));
  if (!v) {                     /* the user's text as given, not checked: mend it */
    size_t clen;
    char *clean = plm_utf8_lossy((const unsigned char *)out, (size_t)(o - out), &clen);
    v = clean ? json_stringn(clean, clen) : NULL;
    free(clean);
  }
  free(out);
  return v ? v : json_string("");
}

static json_t *build_reply(const json_t *turn, size_t k, size_t step, const char *user)
{
  const json_t *replies = json_object_get(turn, "replies");
  json_t *reply = json_pack("{s:s}", "role", "assistant");
  if (step > json_array_size(replies)) {
    json_object_set_new(reply, "content", json_string(""));
    return reply;
  }
  const json_t *r = json_array_get(replies, step - 1);
  const json_t *say = json_object_get(r, "say");
  json_object_set_new(reply, "content", say ? fill(say, user) : json_null());
  const json_t *calls = json_object_get(r, "calls");
  if (json_array_size(calls) == 0) {
    if (!say)
      json_object_set_new(reply, "content", json_string(""));
    return reply;
  }
  json_t *tcs = json_array();
  size_t i;
  json_t *call;
  json_array_foreach(calls, i, call) {
    char id[80];
    call_id(id, sizeof id, k, step, i + 1);
    char *args;
    const json_t *raw = json_object_get(call, "arguments");
    if (json_is_string(raw))
      args = berth_xstrdup(json_string_value(raw));
    else {
      json_t *a = json_pack("{s:o}", "code", fill(json_object_get(call, "code"), user));
      const char *opt[] = {"language", "files"};
      for (int o = 0; o < 2; o++)
        if (json_object_get(call, opt[o]))
          json_object_set(a, opt[o], json_object_get(call, opt[o]));
      args = json_dumps(a, JSON_COMPACT);
      json_decref(a);
    }
    const json_t *name = json_object_get(call, "name");
    json_array_append_new(tcs, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type",
                                         "function", "function", "name",
                                         name ? json_string_value(name) : "executeCode",
                                         "arguments", args));
    free(args);
  }
  json_object_set_new(reply, "tool_calls", tcs);
  return reply;
}

static void call_unlink(berth_model_call *c)
{
  scripted *m = c->m;
  if (c->prev)
    c->prev->next = c->next;
  else
    m->calls = c->next;
  if (c->next)
    c->next->prev = c->prev;
}

static void deliver(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)revents;
  berth_model_call *c = w->data;
  ev_timer_stop(loop, w);
  call_unlink(c);
  const json_t *content = json_object_get(c->reply, "content");
  if (c->delta && json_is_string(content) && json_string_length(content))
    c->delta(c->ud, json_string_value(content), json_string_length(content));
  c->done(c->ud, c->reply, NULL, NULL);
  free(c);
}

static int s_chat(berth_model *base, const berth_model_request *request,
                  berth_delta_fn delta, berth_reply_fn done, void *ud, berth_model_call **out,
                  char **err)
{
  scripted *m = (scripted *)base;
  long n = berth_request_count(request);
  if (n < 0) {
    *err = berth_xstrdup("scripted model: the request has no messages array");
    return -1;
  }
  /* The k-th user turn, at its step-th reply: 1 + the assistant messages after the
   * last user message.  The host's request counts the user messages appended since its
   * last call (model.h), so only this turn's messages are read here. */
  size_t last_user = 0, step = 1;
  size_t k = berth_request_user_turns(request, &last_user);
  for (size_t i = last_user + 1; k && i < (size_t)n; i++) {
    size_t len;
    const char *role = berth_request_string(request, i, "role", &len);
    if (role && len == 9 && memcmp(role, "assistant", 9) == 0)
      step++;
  }
  if (k == 0) {
    *err = berth_xstrdup("scripted model: the conversation has no user message yet");
    return -1;
  }
  const json_t *turn = user_turn(m, k);
  if (!turn && m->n_user_turns && json_is_true(json_object_get(m->script, "loop")))
    turn = user_turn(m, (k - 1) % m->n_user_turns + 1);
  json_t *reply;
  if (!turn) {
    report(m, false, "turn %zu: the conversation has more user messages than the script", k);
    reply = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
  } else {
    const char *said = berth_request_string(request, last_user, "content", NULL);
    const char *want = json_string_value(json_object_get(turn, "user"));
    /* "*" stands for any message */
    if (step == 1 && strcmp(want, "*") != 0 && (!said || strcmp(said, want) != 0))
      report(m, false, "turn %zu: the user message differs from the script's", k);
    if (step > 1 && step - 1 <= json_array_size(json_object_get(turn, "replies")))
      check_step(m, turn, k, step - 1, request, last_user);
    reply = build_reply(turn, k, step,
                        json_is_true(json_object_get(m->script, "template")) ? said : NULL);
  }
  berth_model_call *c = berth_xcalloc(1, sizeof *c);
  c->m = m;
  c->reply = reply;
  c->delta = delta;
  c->done = done;
  c->ud = ud;
  ev_timer_init(&c->timer, deliver, 0., 0.);
  c->timer.data = c;
  ev_timer_start(m->loop, &c->timer);
  c->next = m->calls;
  if (m->calls)
    m->calls->prev = c;
  m->calls = c;
  if (out)
    *out = c;
  return 0;
}

static void s_cancel(berth_model *base, berth_model_call *c)
{
  scripted *m = (scripted *)base;
  ev_timer_stop(m->loop, &c->timer);
  call_unlink(c);
  json_decref(c->reply);
  c->done(c->ud, NULL, "canceled", berth_xstrdup("the model call was cancelled"));
  free(c);
}

static void s_free(berth_model *base)
{
  scripted *m = (scripted *)base;
  while (m->calls) {             /* dropped without a callback: see model.h */
    berth_model_call *c = m->calls;
    ev_timer_stop(m->loop, &c->timer);
    call_unlink(c);
    json_decref(c->reply);
    free(c);
  }
  json_decref(m->script);
  json_decref(m->seen);
  free(m->provider);
  free(m);
}

static const berth_model_ops scripted_ops = {"scripted", s_chat, s_cancel, s_free};

berth_model *berth_scripted_new(json_t *script, const berth_model_options *o, char **err)
{
  *err = NULL;
  if (!o->loop) {
    *err = berth_xstrdup("scripted model: a loop is required");
    return NULL;
  }
  scripted *m = berth_xcalloc(1, sizeof *m);
  m->base.ops = &scripted_ops;
  m->loop = o->loop;
  m->script = json_incref(script);
  m->provider = o->provider ? berth_xstrdup(o->provider) : NULL;
  m->on_check = o->on_check;
  m->check_ud = o->check_ud;
  m->seen = json_object();
  size_t i;
  json_t *turn;
  json_array_foreach(json_object_get(script, "turns"), i, turn)
    if (json_object_get(turn, "user"))
      m->n_user_turns++;
  return &m->base;
}

const json_t *berth_scripted_script(const berth_model *m)
{
  return ((const scripted *)m)->script;
}

void berth_scripted_set_provider(berth_model *base, const char *provider)
{
  scripted *m = (scripted *)base;
  free(m->provider);
  m->provider = provider ? berth_xstrdup(provider) : NULL;
}

void berth_scripted_finish(berth_model *base, unsigned *checked, unsigned *failed)
{
  scripted *m = (scripted *)base;
  size_t i, j, c, k = 0;
  json_t *turn, *reply, *call;
  json_array_foreach(json_object_get(m->script, "turns"), i, turn) {
    if (!json_object_get(turn, "user"))
      continue;
    k++;
    json_array_foreach(json_object_get(turn, "replies"), j, reply)
      json_array_foreach(json_object_get(reply, "calls"), c, call) {
        char id[80];
        call_id(id, sizeof id, k, j + 1, c + 1);
        if (json_object_get(call, "expect") && !json_object_get(m->seen, id)) {
          json_object_set_new(m->seen, id, json_true());
          report(m, false, "%s: never checked (the turn ended before the model saw its "
                           "result)", id);
        }
      }
  }
  *checked = m->checked;
  *failed = m->failed;
}

/* }====================================================== */

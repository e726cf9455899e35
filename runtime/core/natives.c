/*
 * natives.c — what hooks call: sandbox.executeCode / warm / dispose / tool,
 * model.chat, log, sleep, now.
 *
 * Conventions (Lua's own, lauxlib.c): misuse (a wrong argument type, waiting where no
 * hook runs) raises; an expected failure returns nil, message, code with code a short
 * stable string.  A native that waits starts its operation, then yields the task
 * (berth_op_wait); its continuation (*_k) turns the C result into Lua values.
 */
#include "runtime.h"
#include "xalloc.h"
#include "jsonlua.h"
#include "chat_request.h"
#include "plmlua.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* {====================================================== owners (H01, H07) */

/* run id -> owner, kept only in the host's memory, never in a script's tables. */
static berth_owner *owner_find(berth_host *h, const char *run_id)
{
  plm_idmap_node *n = plm_idmap_get(&h->owners, run_id);
  return n ? PLM_IDMAP_OWNER(n, berth_owner, node) : NULL;
}

const char *berth_owner_get(berth_host *h, const char *run_id)
{
  berth_owner *o = owner_find(h, run_id);
  return o ? o->owner : NULL;
}

static void owner_set(berth_host *h, const char *run_id, const char *owner)
{
  berth_owner *o = owner_find(h, run_id);
  if (o) {
    free(o->owner);
    o->owner = berth_xstrdup(owner);
    return;
  }
  o = berth_xcalloc(1, sizeof *o);
  o->run_id = berth_xstrdup(run_id);
  o->owner = berth_xstrdup(owner);
  o->node.key = o->run_id;
  if (!plm_idmap_put(&h->owners, &o->node))
    berth_oom(sizeof o->node);
}

static void owner_free(berth_owner *o)
{
  free(o->run_id);
  free(o->owner);
  free(o);
}

/* Forgets the run's owner; returns it (malloc'd) or NULL. */
static char *owner_take(berth_host *h, const char *run_id)
{
  berth_owner *o = owner_find(h, run_id);
  if (!o)
    return NULL;
  plm_idmap_remove(&h->owners, &o->node);
  char *owner = o->owner;
  o->owner = NULL;
  owner_free(o);
  return owner;
}

static void drop_owner(void *ud, plm_idmap_node *n)
{
  plm_idmap_remove(ud, n);
  owner_free(PLM_IDMAP_OWNER(n, berth_owner, node));
}

void berth_owners_free(berth_host *h)
{
  plm_idmap_each(&h->owners, drop_owner, &h->owners);
  plm_idmap_free(&h->owners);
}

/* }====================================================== */

/* {====================================================== sandbox */

/* A continuation reached before its operation completed: Lua code resumed a coroutine
 * that waits for the host (one smuggled out of another hook call).  Checked before any
 * state changes, so the real waiter is not disturbed. */
static void check_done(lua_State *L, const berth_op *op)
{
  if (!op->done)
    luaL_error(L, "%s: a coroutine waiting for the host was resumed by Lua code",
               op->cls->name);
}

static int env_fail(lua_State *L, const char *why)
{
  lua_pushfstring(L, "Nothing ran (environment): %s", why);
  return plmlua_push_fail(L, lua_tostring(L, -1), "environment");
}

typedef struct exec_op {
  berth_op op;
  double started;               /* berth_clock() */
  plm_cancel *cancel;
  plm_error *err;
  plm_code_output *out;
} exec_op;

static void exec_cancel(berth_op *op)
{
  exec_op *x = (exec_op *)op;
  if (x->cancel)
    plm_cancel_fire(x->cancel);
}

static void exec_release(berth_op *op)
{
  exec_op *x = (exec_op *)op;
  plm_error_free(x->err);
  plm_code_output_free(x->out);
  plm_cancel_free(x->cancel);
  x->err = NULL;
  x->out = NULL;
  x->cancel = NULL;
}

static const berth_op_class exec_class = {"sandbox.executeCode", exec_cancel, exec_release};

static void exec_done(void *ud, plm_error *err, plm_code_output *out)
{
  exec_op *x = ud;
  berth_host *h = x->op.h;
  x->err = err;
  x->out = out;
  h->inflight--;
  /* Counted here, where every answer comes, even one whose turn is gone. */
  h->st.cells++;
  berth_hist_add(&h->st.cell_seconds, berth_clock() - x->started);
  if (err) {
    h->st.cell_errors++;
    berth_count_error(h, "cell", plmlua_error_code(err));
  }
  if (x->op.task && x->op.task->conv) {
    berth_conv_cell_done(x->op.task->conv, err == NULL);
    berth_cell_timing t = {(berth_clock() - x->started) * 1e3, 0, 0, 0, 0};
    if (out) {
      t.wait_ms = out->wait_ms;
      t.call_ms = out->call_ms;
      t.check_ms = out->check_ms;
      t.daemon_ms = out->daemon_ms;
    }
    berth_conv_set_cell_timing(x->op.task->conv, &t);
  }
  berth_op_finish(&x->op);
}

static int exec_k(lua_State *L, int status, lua_KContext ctx)
{
  (void)status;
  exec_op *x = lua_touserdata(L, (int)ctx);
  check_done(L, &x->op);
  berth_op_resumed(L, &x->op);
  int n = 1;
  if (x->err)
    n = plmlua_push_error(L, x->err);
  else
    plmlua_push_output(L, x->out);
  /* Converted: the C copies can go now rather than when the GC gets to the op (a
   * userdata with a finalizer lives until the cycle after it became garbage). */
  exec_release(&x->op);
  return n;
}

/* The key of this call: an explicit runId (and userId), else the conversation's run
 * id recorded by sandbox.warm in its onTurnStart (H03, H04).  Returns NULL with an
 * "environment" failure pushed. */
static const char *resolve_key(lua_State *L, berth_host *h, plm_key *key)
{
  const char *run = NULL, *user = NULL;
  lua_getfield(L, 1, "runId");
  if (!lua_isnil(L, -1))
    run = luaL_checkstring(L, -1);
  lua_getfield(L, 1, "userId");
  if (!lua_isnil(L, -1))
    user = luaL_checkstring(L, -1);
  lua_pop(L, 2);                /* anchored by the argument table */
  if (!run) {
    berth_task *t = berth_current_task(h);
    if (!t || !t->conv) {
      env_fail(L, "executeCode was called outside a conversation, so there is no run "
                  "id to key its sandbox (pass runId, or call it from a hook)");
      return NULL;
    }
    run = berth_conv_warmed_run_id(t->conv);
    if (!run) {
      env_fail(L, "this turn's sandbox was never warmed: onTurnStart must call "
                  "sandbox.warm(ctx.runId)");
      return NULL;
    }
  }
  key->conversation = run;
  key->owner = user ? user : berth_owner_get(h, run);
  return run;
}

static int l_execute(lua_State *L)
{
  berth_host *h = berth_host_of(L);
  plm_code_input in;
  plmlua_check_input(L, 1, &in);
  plm_key key;
  if (!resolve_key(L, h, &key))
    return 3;
  if (!h->sandboxes)
    return env_fail(L, h->env_error);
  exec_op *x = berth_op_push(L, sizeof *x, &exec_class);
  int idx = lua_gettop(L);
  x->cancel = plm_cancel_new();
  x->started = berth_clock();
  plm_error *e = plm_sandboxes_run(h->sandboxes, &key, &in, x->cancel, exec_done, x);
  if (!e)
    h->inflight++;
  if (e) {
    berth_op_drop(&x->op);
    int n = plmlua_push_error(L, e);
    plm_error_free(e);
    return n;
  }
  return berth_op_wait(L, &x->op, idx, exec_k);
}

/* warm and dispose take (runId [, userId]) and nothing else: an options table there
 * would otherwise be ignored. */
static void check_no_more(lua_State *L, int first, const char *what)
{
  if (!lua_isnoneornil(L, first))
    luaL_error(L, "%s takes (runId [, userId]); argument #%d is one too many", what, first);
}

static int l_warm(lua_State *L)
{
  berth_host *h = berth_host_of(L);
  const char *run = luaL_checkstring(L, 1);
  const char *user = luaL_optstring(L, 2, NULL);
  check_no_more(L, 3, "sandbox.warm");
  plm_key key = {user ? user : berth_owner_get(h, run), run};
  /* T16, X05: an empty run id or userId is refused at once, before anything is
   * recorded and whether or not a daemon is configured, as executeCode refuses it
   * (invalid_argument marked request, so the code is "request"). */
  plm_error *e = plm_key_check(&key);
  if (e) {
    int n = plmlua_push_error(L, e);
    plm_error_free(e);
    return n;
  }
  berth_task *t = berth_current_task(h);
  if (t && t->conv)
    berth_conv_set_warmed(t->conv, run);
  if (user)
    owner_set(h, run, user);
  if (!h->sandboxes)
    return env_fail(L, h->env_error);
  e = plm_sandboxes_warm(h->sandboxes, &key);
  if (e) {
    int n = plmlua_push_error(L, e);
    plm_error_free(e);
    return n;
  }
  lua_pushboolean(L, 1);
  return 1;
}

typedef struct dispose_op {
  berth_op op;
} dispose_op;

static const berth_op_class dispose_class = {"sandbox.dispose", NULL, NULL};

static void dispose_done(void *ud)
{
  berth_op *op = ud;
  op->h->inflight--;
  berth_op_finish(op);
}

static int dispose_k(lua_State *L, int status, lua_KContext ctx)
{
  (void)status;
  check_done(L, lua_touserdata(L, (int)ctx));
  berth_op_resumed(L, lua_touserdata(L, (int)ctx));
  lua_pushboolean(L, 1);
  return 1;
}

static int l_dispose(lua_State *L)
{
  berth_host *h = berth_host_of(L);
  const char *run = luaL_checkstring(L, 1);
  const char *user = luaL_optstring(L, 2, NULL);
  check_no_more(L, 3, "sandbox.dispose");
  if (!h->sandboxes)
    return env_fail(L, h->env_error);
  dispose_op *d = berth_op_push(L, sizeof *d, &dispose_class);
  int idx = lua_gettop(L);
  /* The run's recorded owner, forgotten (H07); a userId names the key as executeCode's
   * userId did, and forgets the record only when it is that user's. */
  const char *recorded = berth_owner_get(h, run);
  char *owner = !user || (recorded && strcmp(recorded, user) == 0) ? owner_take(h, run) : NULL;
  plm_key key = {user ? user : owner, run};
  plm_error *e = plm_sandboxes_dispose(h->sandboxes, &key, dispose_done, d);
  free(owner);
  if (!e)
    h->inflight++;
  if (e) {
    berth_op_drop(&d->op);
    int n = plmlua_push_error(L, e);
    plm_error_free(e);
    return n;
  }
  return berth_op_wait(L, &d->op, idx, dispose_k);
}

/* The executeCode tool as a model sees it, in the chat-completions shape.  It depends
 * only on the sandboxes' options (languages, mode), fixed when the host opens: it is
 * made once, and each call converts it into a new table (a hook may change its own).
 * Making it was 120 000 instructions a call, a tenth of a served turn. */
static int l_tool(lua_State *L)
{
  berth_host *h = berth_host_of(L);
  if (!h->sandboxes)
    return env_fail(L, h->env_error);
  if (!h->tool) {
    char *desc = plm_tool_description(h->sandboxes, false);
    json_t *params = plm_tool_parameters(h->sandboxes);
    if (desc && params)
      h->tool = json_pack("{s:s, s:{s:s, s:s, s:O}}", "type", "function", "function",
                          "name", "executeCode", "description", desc, "parameters", params);
    free(desc);
    json_decref(params);
    if (!h->tool)
      return luaL_error(L, "sandbox.tool: out of memory");
  }
  berth_json_push(L, h->tool);
  return 1;
}

static const luaL_Reg sandboxlib[] = {
  {"executeCode", l_execute},
  {"warm", l_warm},
  {"dispose", l_dispose},
  {"tool", l_tool},
  {NULL, NULL}
};

/* }====================================================== */

/* {====================================================== model */

typedef struct delta {
  struct delta *next;
  size_t len;
  char text[];
} delta;

typedef struct chat_op {
  berth_op op;
  berth_model *model;
  berth_model_call *call;       /* while the adapter runs it */
  delta *deltas, *last;
  json_t *reply;
  const char *code;
  char *message;
} chat_op;

static void chat_cancel(berth_op *op)
{
  chat_op *c = (chat_op *)op;
  if (c->call)                  /* the adapter calls back before returning */
    c->model->ops->cancel(c->model, c->call);
}

static void chat_release(berth_op *op)
{
  chat_op *c = (chat_op *)op;
  while (c->deltas) {
    delta *d = c->deltas;
    c->deltas = d->next;
    free(d);
  }
  c->last = NULL;
  json_decref(c->reply);
  c->reply = NULL;
  free(c->message);
  c->message = NULL;
}

static const berth_op_class chat_class = {"model.chat", chat_cancel, chat_release};

static void chat_delta(void *ud, const char *text, size_t len)
{
  chat_op *c = ud;
  delta *d = berth_xmalloc(sizeof *d + len + 1);
  d->next = NULL;
  d->len = len;
  memcpy(d->text, text, len);
  d->text[len] = '\0';
  if (c->last)
    c->last->next = d;
  else
    c->deltas = d;
  c->last = d;
  berth_op_wake(&c->op);
}

static void chat_reply(void *ud, json_t *reply, const char *code, char *message)
{
  chat_op *c = ud;
  c->call = NULL;
  c->reply = reply;
  c->code = code ? code : "unknown";
  c->message = message;
  berth_op_finish(&c->op);
}

/* Stack: 1 the request table, idx the op, idx + 1 on_delta (or nil). */
static int chat_k(lua_State *L, int status, lua_KContext ctx)
{
  (void)status;
  int idx = (int)ctx;
  chat_op *c = lua_touserdata(L, idx);
  berth_op_resumed(L, &c->op);
  while (c->deltas) {
    delta *d = c->deltas;
    c->deltas = d->next;
    if (!c->deltas)
      c->last = NULL;
    if (lua_isfunction(L, idx + 1)) {
      lua_pushvalue(L, idx + 1);
      lua_pushlstring(L, d->text, d->len);
      free(d);
      lua_callk(L, 1, 0, ctx, chat_k);  /* on_delta may itself wait */
    } else
      free(d);
  }
  if (!c->op.done)
    return berth_op_wait(L, &c->op, ctx, chat_k);
  berth_host *h = berth_host_of(L);
  h->st.model_calls++;
  if (c->reply) {
    berth_json_push(L, c->reply);
    chat_release(&c->op);       /* converted: free the C copy now (see exec_k) */
    return 1;
  }
  /* A model outage is the model's error, not the hook's: counted so, and a hook call
   * that fails after it is reported as the model's (berth_report_error). */
  berth_count_error(h, "model", c->code ? c->code : "unknown");
  berth_task *t = berth_current_task(h);
  if (t)
    t->model_failed = true;
  return plmlua_push_fail(L, c->message ? c->message : "the model call failed", c->code);
}

static int l_chat(lua_State *L)
{
  berth_host *h = berth_host_of(L);
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  static const char *const keys[] = {"messages", "tools", "on_delta", NULL};
  plmlua_check_keys(L, 1, "model.chat", keys);
  lua_getfield(L, 1, "on_delta");
  if (!lua_isnil(L, -1) && !lua_isfunction(L, -1))
    luaL_error(L, "model.chat: on_delta must be a function (got %s)", luaL_typename(L, -1));
  lua_pop(L, 1);
  if (!h->model)
    return plmlua_push_fail(L, "no model is configured (give --model scripted:FILE or --model openai[:NAME])",
                            "unavailable");
  /* The request is read from the tables while chat() runs (chat_request.h): checked
   * here to have a JSON form, converted only as far as the adapter asks. */
  lua_getfield(L, 1, "messages");
  luaL_argexpected(L, lua_istable(L, 2), 1, "a table with a 'messages' array");
  lua_getfield(L, 1, "tools");
  berth_chat_request req;
  berth_chat_request_init(&req, L, 2, lua_isnil(L, 3) ? 0 : 3);
  chat_op *c = berth_op_push(L, sizeof *c, &chat_class);
  int idx = lua_gettop(L);
  lua_getfield(L, 1, "on_delta");
  c->model = h->model;
  char *err = NULL;
  int rc = h->model->ops->chat(h->model, &req.base, chat_delta, chat_reply, c, &c->call, &err);
  berth_chat_request_done(&req);  /* adapters copy what they keep */
  if (rc != 0) {
    berth_op_drop(&c->op);
    lua_pushstring(L, err ? err : "the model refused the call");
    free(err);
    return plmlua_push_fail(L, lua_tostring(L, -1), "invalid_argument");
  }
  return berth_op_wait(L, &c->op, idx, chat_k);
}

static const luaL_Reg modellib[] = {
  {"chat", l_chat},
  {NULL, NULL}
};

/* }====================================================== */

/* {====================================================== log, sleep, now */

static int log_at(lua_State *L, berth_log_level level, int first)
{
  berth_host *h = berth_host_of(L);
  int n = lua_gettop(L);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  berth_task *t = berth_current_task(h);
  if (t && t->conv) {
    lua_pushfstring(L, "[%s] ", berth_conv_run_id(t->conv));
    luaL_addvalue(&b);
  }
  for (int i = first; i <= n; i++) {
    luaL_tolstring(L, i, NULL);
    luaL_addvalue(&b);
    if (i < n)
      luaL_addchar(&b, '\t');
  }
  luaL_pushresult(&b);
  berth_log(h, level, "%s", lua_tostring(L, -1));
  return 0;
}

static int l_log_call(lua_State *L) { return log_at(L, BERTH_LOG_INFO, 2); } /* 1 = the table */
static int l_log_debug(lua_State *L) { return log_at(L, BERTH_LOG_DEBUG, 1); }
static int l_log_info(lua_State *L) { return log_at(L, BERTH_LOG_INFO, 1); }
static int l_log_warn(lua_State *L) { return log_at(L, BERTH_LOG_WARN, 1); }
static int l_log_error(lua_State *L) { return log_at(L, BERTH_LOG_ERROR, 1); }

typedef struct sleep_op {
  berth_op op;
  ev_timer timer;
} sleep_op;

static void sleep_stop(berth_op *op)
{
  sleep_op *s = (sleep_op *)op;
  ev_timer_stop(op->h->loop, &s->timer);
}

static void sleep_cancel(berth_op *op)
{
  sleep_stop(op);
  berth_op_finish(op);
}

static const berth_op_class sleep_class = {"sleep", sleep_cancel, sleep_stop};

static void sleep_fired(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)loop;
  (void)revents;
  berth_op_finish(w->data);
}

static int sleep_k(lua_State *L, int status, lua_KContext ctx)
{
  (void)status;
  check_done(L, lua_touserdata(L, (int)ctx));
  berth_op_resumed(L, lua_touserdata(L, (int)ctx));
  return 0;
}

static int l_sleep(lua_State *L)
{
  lua_Number s = luaL_checknumber(L, 1);
  luaL_argcheck(L, s >= 0 && s == s, 1, "seconds must be a number >= 0");
  lua_settop(L, 1);
  /* A sleep may not outlast the hook call's deadline: refused at once rather than
   * holding the turn (and its conversation's queue) until the deadline ends it. */
  berth_host *h = berth_host_of(L);
  berth_task *t = berth_current_task(h);
  if (t && t->started > 0 && h->hook_deadline > 0) {   /* not the load task */
    double left = t->started + h->hook_deadline - berth_clock();
    if (s > left) {
      char why[160];
      snprintf(why, sizeof why, "sleep(%g) would outlast %s's deadline (%.3g s left of %g s)",
               (double)s, t->what, left > 0 ? left : 0., h->hook_deadline);
      return luaL_error(L, "%s", why);
    }
  }
  sleep_op *op = berth_op_push(L, sizeof *op, &sleep_class);
  ev_timer_init(&op->timer, sleep_fired, (ev_tstamp)s, 0.);
  op->timer.data = op;
  ev_timer_start(op->op.h->loop, &op->timer);
  return berth_op_wait(L, &op->op, 2, sleep_k);
}

static int l_now(lua_State *L)
{
  lua_pushnumber(L, (lua_Number)ev_time());
  return 1;
}

/* }====================================================== */

void berth_open_natives(lua_State *L)
{
  luaL_newlib(L, sandboxlib);
  lua_setglobal(L, "sandbox");
  luaL_newlib(L, modellib);
  lua_setglobal(L, "model");

  static const luaL_Reg loglib[] = {
    {"debug", l_log_debug}, {"info", l_log_info}, {"warn", l_log_warn},
    {"error", l_log_error}, {NULL, NULL}
  };
  luaL_newlib(L, loglib);
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, l_log_call);
  lua_setfield(L, -2, "__call");
  lua_setmetatable(L, -2);
  lua_setglobal(L, "log");

  lua_pushcfunction(L, l_sleep);
  lua_setglobal(L, "sleep");
  lua_pushcfunction(L, l_now);
  lua_setglobal(L, "now");
}

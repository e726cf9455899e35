/*
 * host.c — the berth host: one lua_State, one coroutine (task) per hook call, the
 * operations tasks wait on, the run queue that resumes them from the loop, and the
 * loading (and SIGHUP reloading) of the hooks file.
 *
 * A native that waits pushes an op, starts its C operation and yields the tag
 * (berth_op_wait).  The completion callback (from the loop, never from inside libcurl)
 * marks the op done and queues the task; the run queue resumes it on the next loop
 * iteration, outside any library callback, so a resumed hook may call into the library
 * again at once.  The continuation converts the C result into Lua values inside the
 * coroutine, where a memory error is an ordinary Lua error.
 */
#include "runtime.h"
#include "xalloc.h"
#include "local_sandboxd.h"     /* berth_default_floor */
#include "jsonlua.h"
#include "store/store.h"

#include <errno.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lualib.h>

#define DEFAULT_MEMORY_LIMIT ((size_t)256 << 20)
#define DEFAULT_BUDGET 200000000LL
#define DEFAULT_IDLE_TIMEOUT 30.0
#define DRAIN_LIMIT 10.0        /* seconds berth_host_free waits for cancelled calls */
#define DEFAULT_SHUTDOWN_GRACE 10.0
#define DEFAULT_HOOK_TIME_LIMIT 5.0     /* seconds one resumption of a hook call runs */
#define DEFAULT_HOOK_DEADLINE 1800.0    /* seconds a hook call takes, waits included */
#define DEFAULT_MAX_EVENTS 50000

void berth_options_init(berth_options *o)
{
  memset(o, 0, sizeof *o);
  o->memory_limit = DEFAULT_MEMORY_LIMIT;
  o->instruction_budget = DEFAULT_BUDGET;
  o->idle_timeout = DEFAULT_IDLE_TIMEOUT;
}

static void on_grace(struct ev_loop *loop, ev_timer *w, int revents);

/* {====================================================== logging and events */

void berth_log(berth_host *h, berth_log_level level, const char *fmt, ...)
{
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (h->o.log) {
    h->o.log(h->o.log_ud, level, buf);
    return;
  }
  static const char *const names[] = {"debug", "info", "warning", "error"};
  if (level == BERTH_LOG_DEBUG)
    return;
  fprintf(stderr, "berth: %s%s%s\n", level == BERTH_LOG_INFO ? "" : names[level],
          level == BERTH_LOG_INFO ? "" : ": ", buf);
}

/* The typed callback for an event, if there is one for its kind. */
static void emit_typed(berth_host *h, berth_conv *c, const char *kind, const json_t *data)
{
  const berth_callbacks *cb = &h->o.callbacks;
  void *ud = cb->ud;
  switch (kind[0]) {
    case 'd':
      if (cb->on_delta && strcmp(kind, "delta") == 0 && json_is_string(data))
        cb->on_delta(ud, c, json_string_value(data), json_string_length(data));
      return;
    case 'a':
      if (cb->on_message && strcmp(kind, "assistant") == 0 && json_is_string(data))
        cb->on_message(ud, c, json_string_value(data), json_string_length(data));
      return;
    case 'u':
      if (cb->on_turn_start && strcmp(kind, "user") == 0)
        cb->on_turn_start(ud, c, json_is_string(data) ? json_string_value(data) : "");
      return;
    case 't':
      if (cb->on_tool_call && strcmp(kind, "toolCall") == 0) {
        const json_t *fn = json_object_get(data, "function");
        const char *id = json_string_value(json_object_get(data, "id"));
        const char *name = json_string_value(json_object_get(fn, "name"));
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        cb->on_tool_call(ud, c, id ? id : "", name ? name : "", args ? args : "");
      } else if (cb->on_tool_result && strcmp(kind, "toolResult") == 0) {
        const char *id = json_string_value(json_object_get(data, "id"));
        const json_t *result = json_object_get(data, "result");
        const json_t *error = json_object_get(data, "error");
        if (result && !error)
          cb->on_tool_result(ud, c, id ? id : "", result, NULL);
        else {
          const char *code = json_string_value(json_object_get(data, "code"));
          const char *msg = json_string_value(error);
          berth_error e = {code ? code : "unknown", (char *)(msg ? msg : "the call failed")};
          cb->on_tool_result(ud, c, id ? id : "", NULL, &e);
        }
      }
      return;
    case 's':
      if (cb->on_suspended && strcmp(kind, "suspend") == 0)
        cb->on_suspended(ud, c);
      return;
    case 'c':
      if (cb->on_completed && strcmp(kind, "complete") == 0)
        cb->on_completed(ud, c);
      return;
    case 'e':
      if (cb->on_error && strcmp(kind, "error") == 0) {
        const char *code = json_string_value(json_object_get(data, "code"));
        const char *msg = json_string_value(json_object_get(data, "message"));
        berth_error e = {code ? code : "hook", (char *)(msg ? msg : "a hook failed")};
        cb->on_error(ud, c, &e);
      }
      return;
  }
}

void berth_emit(berth_host *h, berth_conv *c, const char *kind, const json_t *data)
{
  if (h->o.on_event)
    h->o.on_event(h->o.event_ud, c, kind, data);
  if (c)
    emit_typed(h, c, kind, data);
}

void berth_report_error(berth_host *h, berth_conv *c, const char *hook, const char *error,
                        bool model_failed)
{
  /* The call failed (h->errors: what the faces' exit status and berth_stats count).  In
   * the metrics' errors by source, one after a failed model call is the model's doing:
   * counted there already (natives.c), not as the hook's. */
  h->errors++;
  if (!model_failed)
    berth_count_error(h, "hook", "hook");
  berth_log(h, BERTH_LOG_ERROR, "%s%s%s failed: %s", hook, c ? " of conversation " : "",
            c ? berth_conv_run_id(c) : "", error);
  /* The conversation sees the first line; the traceback is in the log. */
  const char *nl = strchr(error, '\n');
  json_t *ev = json_pack("{s:s, s:s%, s:s}", "hook", hook, "message", error,
                         nl ? (size_t)(nl - error) : strlen(error), "code", "hook");
  berth_emit(h, c, "error", ev);
  json_decref(ev);
}

unsigned berth_host_errors(const berth_host *h) { return h->errors; }

/* }====================================================== */

/* {====================================================== tasks */

berth_host *berth_host_of(lua_State *L)
{
  return *(berth_host **)lua_getextraspace(L);
}

berth_task *berth_current_task(berth_host *h)
{
  return h->current;
}

static void ready_remove(berth_host *h, berth_task *t)
{
  berth_task **pp = &h->ready;
  h->ready_tail = NULL;
  while (*pp) {
    if (*pp == t)
      *pp = t->next_ready;
    else {
      h->ready_tail = *pp;
      pp = &(*pp)->next_ready;
    }
  }
  t->queued = false;
  t->next_ready = NULL;
}

static void task_enqueue(berth_task *t)
{
  berth_host *h = t->h;
  if (t->queued)
    return;
  t->queued = true;
  t->next_ready = NULL;
  if (h->ready_tail)
    h->ready_tail->next_ready = t;
  else
    h->ready = t;
  h->ready_tail = t;
  if (!ev_is_active(&h->runq)) {
    ev_timer_set(&h->runq, 0., 0.);
    ev_timer_start(h->loop, &h->runq);
  }
}

static void task_unlink(berth_task *t)
{
  berth_host *h = t->h;
  if (t->queued)
    ready_remove(h, t);
  if (t->prev)
    t->prev->next = t->next;
  else
    h->tasks = t->next;
  if (t->next)
    t->next->prev = t->prev;
  ev_timer_stop(h->loop, &t->deadline);
  /* Orphan what it started: completions still to come find no task and release. */
  t->op = NULL;
  while (t->owned)
    berth_op_abandon(t->owned);
  luaL_unref(h->L, LUA_REGISTRYINDEX, t->ref);
}

/* Whether task_end should run a full collection.  A hook may have filled the state
 * (a memory bomb), and lauxlib's buffers grow without the emergency collection Lua's
 * own allocations get: when the cap refused an allocation, or a hook failed, collect,
 * as Redis paces its GC between calls rather than during them.  Past half the cap a
 * full collection also runs, once the state has grown by half since the last one (up
 * to 7/8 of the cap): many live conversations keep it over half for good, and a
 * collection after every task would cost time growing with their number at every turn.
 * When the last collection freed little (under a 32nd of the cap), what is live fills
 * the state, and another one right away would free as little: the next waits until
 * the state has grown by a 32nd of the cap (but for a refused allocation).  Near the
 * cap, collecting after every task made such a host spend its time collecting
 * (test_host: test_live_data_near_the_cap_is_not_collected_every_turn). */
static bool should_collect(const berth_mem *m, bool ok)
{
  if (!m->limit)
    return !ok;
  if (m->refused)
    return true;
  size_t least = m->gc_idle ? m->after_gc + m->limit / 32 : 0;
  if (!ok)
    return m->used > least;
  size_t near_cap = m->limit - m->limit / 8;
  size_t grown = m->after_gc + m->after_gc / 2;
  if (grown > near_cap)
    grown = near_cap;
  if (grown < least)
    grown = least;
  return m->used > m->limit / 2 && m->used > grown;
}

static void collect(berth_host *h)
{
  berth_mem *m = &h->mem;
  size_t before = m->used;
  lua_gc(h->L, LUA_GCCOLLECT);
  m->after_gc = m->used;
  m->gc_idle = before < m->used + m->limit / 32; /* used may have grown */
  m->refused = m->released = false;
  m->grown = 0;
  m->collections++;
}

/* Live data past 15/16 of the cap leaves a turn too little room: admitted anyway, turns
 * failed at the cap one after another, each after Lua's emergency collection of the
 * whole state, and a host given 100 000 conversations without a store spent minutes
 * doing nothing else (bench/turns_per_second --held 100000).  What is in the state may
 * be garbage: it is collected first, unless nothing that could change the answer
 * happened since the last collection, so that a flood of refused requests does not
 * cost a full collection each. */
bool berth_host_memory_full(berth_host *h)
{
  berth_mem *m = &h->mem;
  size_t full = m->limit - m->limit / 16;
  if (!m->limit || m->used <= full)
    return false;
  if (m->released || m->refused || m->grown > m->limit / 32 || m->after_gc <= full)
    collect(h);
  return m->used > full;
}

static void task_end(berth_task *t, bool ok, const char *error)
{
  berth_host *h = t->h;
  task_unlink(t);
  if (t->done)
    t->done(t->ud, t, ok, error);
  free(t->what);
  free(t);
  if (should_collect(&h->mem, ok))
    collect(h);
}

void berth_task_kill(berth_task *t)
{
  task_unlink(t);
  free(t->what);
  free(t);
}

/* The error of a dead coroutine with its traceback, pushed on h->L. */
static void push_task_error(berth_host *h, berth_task *t)
{
  lua_State *co = t->co;
  const char *msg;
  if (lua_type(co, -1) == LUA_TSTRING || lua_type(co, -1) == LUA_TNUMBER)
    msg = lua_tostring(co, -1);
  else
    msg = lua_pushfstring(co, "(error object is a %s value)", luaL_typename(co, -1));
  luaL_traceback(h->L, co, msg, 0);
}

static void task_resume(berth_task *t, int nargs)
{
  berth_host *h = t->h;
  berth_task *prev = h->current;
  bool enforce = h->mem.enforce;
  h->current = t;
  h->mem.enforce = true;
  t->resumed = berth_clock();
  berth_budget_arm(h, t->co);
  int nres = 0;
  int status = lua_resume(t->co, h->L, nargs, &nres);
  h->mem.enforce = enforce;
  h->current = prev;
  if (status == LUA_YIELD) {
    bool waits = t->op && nres == 1 && lua_touserdata(t->co, -1) == &berth_host_yield_tag;
    lua_pop(t->co, nres);
    if (waits)
      return;
    lua_pushfstring(h->L, "%s yielded to the host without waiting for anything "
                          "(coroutine.yield outside a coroutine of its own)", t->what);
    task_end(t, false, lua_tostring(h->L, -1));
    lua_pop(h->L, 1);
    return;
  }
  if (status == LUA_OK) {
    lua_pop(t->co, nres);
    task_end(t, true, NULL);
    return;
  }
  push_task_error(h, t);
  task_end(t, false, lua_tostring(h->L, -1));
  lua_pop(h->L, 1);
}

static void on_runq(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)loop;
  (void)revents;
  berth_host *h = w->data;
  /* One at a time from the head: a task killed by another's resume (its conversation
   * freed) leaves the queue through task_unlink, never dangling here.  Completions
   * come only from the loop, so this cannot run forever. */
  berth_task *t;
  while ((t = h->ready)) {
    h->ready = t->next_ready;
    if (!h->ready)
      h->ready_tail = NULL;
    t->next_ready = NULL;
    t->queued = false;
    int nargs = t->start_nargs;
    t->start_nargs = 0;
    task_resume(t, nargs);
  }
}

/* The call's deadline passed while it waited (it cannot be running: this is a loop
 * callback): it ends as a failed call, its operations cancelled. */
static void on_deadline(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)loop;
  (void)revents;
  berth_task *t = w->data;
  berth_host *h = t->h;
  char why[256];
  snprintf(why, sizeof why, "%s did not finish within its deadline of %g s (it was waiting)",
           t->what, h->hook_deadline);
  task_end(t, false, why);
}

berth_task *berth_task_start(berth_host *h, berth_conv *conv, const char *what, int nargs,
                             berth_task_done_fn done, void *ud)
{
  lua_State *L = h->L;
  berth_task *t = berth_xcalloc(1, sizeof *t);
  t->h = h;
  t->conv = conv;
  t->what = berth_xstrdup(what);
  t->budget = h->o.instruction_budget > 0 ? h->o.instruction_budget : -1;
  t->done = done;
  t->ud = ud;
  t->started = berth_clock();
  ev_timer_init(&t->deadline, on_deadline, h->hook_deadline, 0.);
  t->deadline.data = t;
  if (h->hook_deadline > 0)
    ev_timer_start(h->loop, &t->deadline);
  t->co = lua_newthread(L);
  t->ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_xmove(L, t->co, nargs + 1);
  t->next = h->tasks;
  if (h->tasks)
    h->tasks->prev = t;
  h->tasks = t;
  t->start_nargs = nargs;
  task_enqueue(t);
  return t;
}

/* }====================================================== */

/* {====================================================== operations */

static int op_gc(lua_State *L)
{
  berth_op *op = lua_touserdata(L, 1);
  if (op->cls && op->cls->release)
    op->cls->release(op);
  return 0;
}

void *berth_op_push(lua_State *L, size_t size, const berth_op_class *cls)
{
  berth_host *h = berth_host_of(L);
  berth_task *t = h->current;
  /* Checked before anything starts, so that nothing is left running on a raise. */
  if (!t || t == &h->load_task)
    luaL_error(L, "%s cannot wait here: waiting is possible only inside a hook call "
                  "(not at the top level of a script or module)", cls->name);
  if (!lua_isyieldable(L))
    luaL_error(L, "attempt to yield across a C-call boundary (%s cannot wait inside a "
                  "metamethod, an iterator, a sort comparator or require)", cls->name);
  berth_op *op = lua_newuserdatauv(L, size, 0);
  memset(op, 0, size);
  op->cls = cls;
  op->h = h;
  op->anchor = LUA_NOREF;
  if (luaL_newmetatable(L, cls->name)) {
    lua_pushcfunction(L, op_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  /* Anchored until its result is taken: a task ended while the op runs must not let
   * the GC free the memory its completion callback will write to. */
  lua_pushvalue(L, -1);
  op->anchor = luaL_ref(L, LUA_REGISTRYINDEX);
  op->task = t;
  op->next_owned = t->owned;
  if (t->owned)
    t->owned->prev_owned = op;
  t->owned = op;
  return op;
}

static void op_disown(berth_op *op)
{
  berth_task *t = op->task;
  if (!t)
    return;
  if (op->prev_owned)
    op->prev_owned->next_owned = op->next_owned;
  else
    t->owned = op->next_owned;
  if (op->next_owned)
    op->next_owned->prev_owned = op->prev_owned;
  op->prev_owned = op->next_owned = NULL;
  if (t->op == op)
    t->op = NULL;
  op->task = NULL;
}

static void op_unanchor(berth_op *op)
{
  if (op->anchor != LUA_NOREF) {
    luaL_unref(op->h->L, LUA_REGISTRYINDEX, op->anchor);
    op->anchor = LUA_NOREF;
  }
}

void berth_op_drop(berth_op *op)
{
  op_disown(op);
  op->done = true;
  op_unanchor(op);
}

void berth_op_abandon(berth_op *op)
{
  op_disown(op);
  if (!op->done) {
    if (op->cls->cancel)
      op->cls->cancel(op);
  } else
    berth_op_wake(op);
}

int berth_op_wait(lua_State *L, berth_op *op, lua_KContext ctx, lua_KFunction k)
{
  if (op->done || !op->task)
    return k(L, LUA_OK, ctx);
  op->task->op = op;
  lua_pushlightuserdata(L, (void *)&berth_host_yield_tag);
  return lua_yieldk(L, 1, ctx, k);
}

void berth_op_wake(berth_op *op)
{
  if (op->task) {
    if (op->task->op == op)     /* else its continuation is running and will look */
      task_enqueue(op->task);
  } else if (op->done) {        /* orphaned: nobody will read the result */
    if (op->cls->release)
      op->cls->release(op);
    op_unanchor(op);
  }
}

void berth_op_finish(berth_op *op)
{
  op->done = true;
  berth_op_wake(op);
}

void berth_op_resumed(lua_State *L, berth_op *op)
{
  (void)L;
  if (op->task && op->task->op == op)
    op->task->op = NULL;
  if (op->done) {
    op_disown(op);
    op_unanchor(op);
  }
}

/* }====================================================== */

/* {====================================================== scripts */

static int msgh(lua_State *L)
{
  const char *msg = lua_tostring(L, 1);
  if (!msg)
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  luaL_traceback(L, L, msg, 1);
  return 1;
}

/* Runs the hooks file's top level with the load budget and a fresh package.loaded
 * (so modules of the scripts directory are read again on reload).  On success the
 * hooks table replaces the old one. */
static int load_hooks(berth_host *h, char **err)
{
  lua_State *L = h->L;
  int top = lua_gettop(L);
  lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  int old_loaded = lua_gettop(L);
  lua_newtable(L);
  lua_rawgeti(L, LUA_REGISTRYINDEX, h->loaded_base_ref);
  lua_pushnil(L);
  while (lua_next(L, -2)) {
    lua_pushvalue(L, -2);
    lua_insert(L, -2);
    lua_rawset(L, -5);
  }
  lua_pop(L, 1);
  lua_setfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);

  lua_pushcfunction(L, msgh);
  int handler = lua_gettop(L);
  h->load_task.budget = h->o.instruction_budget > 0 ? h->o.instruction_budget : -1;
  h->load_task.spent = false;
  h->load_task.resumed = berth_clock();
  h->load_task.events = h->load_task.event_bytes = 0;
  berth_task *prev = h->current;
  h->current = &h->load_task;
  h->mem.enforce = true;
  berth_budget_arm(h, L);
  int status = luaL_loadfilex(L, h->hooks_file, "t");
  if (status == LUA_OK)
    status = lua_pcall(L, 0, 1, handler);
  lua_sethook(L, NULL, 0, 0);
  h->mem.enforce = false;
  h->current = prev;
  const char *why = NULL;
  if (status != LUA_OK)
    why = lua_tostring(L, -1) ? lua_tostring(L, -1) : "(error object is not a string)";
  else if (lua_isnil(L, -1)) {
    lua_pop(L, 1);              /* no table returned: the hooks are globals */
    lua_pushglobaltable(L);
  } else if (!lua_istable(L, -1))
    why = lua_pushfstring(L, "%s returned a %s, not a table of hooks", h->hooks_file,
                          luaL_typename(L, -1));
  if (why) {
    *err = berth_xstrdup(why);
    lua_pushvalue(L, old_loaded);
    lua_setfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
    lua_settop(L, top);
    return -1;
  }
  if (h->hooks_ref != LUA_NOREF)
    luaL_unref(L, LUA_REGISTRYINDEX, h->hooks_ref);
  h->hooks_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_settop(L, top);
  lua_gc(L, LUA_GCCOLLECT);
  return 0;
}

int berth_host_reload(berth_host *h)
{
  if (!h->hooks_file)
    return -1;
  char *err = NULL;
  if (load_hooks(h, &err) != 0) {
    berth_log(h, BERTH_LOG_ERROR, "reload of %s refused, keeping the hooks loaded before: %s",
              h->hooks_file, err);
    free(err);
    return -1;
  }
  berth_log(h, BERTH_LOG_INFO, "reloaded hooks from %s", h->hooks_file);
  return 0;
}

static void on_sighup(struct ev_loop *loop, ev_signal *w, int revents)
{
  (void)loop;
  (void)revents;
  berth_host_reload(w->data);
}

/* }====================================================== */

/* {====================================================== the host */

static int panic(lua_State *L)
{
  fprintf(stderr, "berth: Lua panic (unprotected error): %s\n",
          lua_tostring(L, -1) ? lua_tostring(L, -1) : "?");
  abort();
}

static char *dir_of(const char *file)
{
  char *real = realpath(file, NULL);
  if (!real)
    return NULL;
  char *d = berth_xstrdup(dirname(real));
  free(real);
  return d;
}

static int log_print(lua_State *L)
{
  int n = lua_gettop(L);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (int i = 1; i <= n; i++) {
    luaL_tolstring(L, i, NULL);
    luaL_addvalue(&b);
    if (i < n)
      luaL_addchar(&b, '\t');
  }
  luaL_pushresult(&b);
  berth_log(berth_host_of(L), BERTH_LOG_INFO, "%s", lua_tostring(L, -1));
  return 0;
}

/* require finds the scripts directory's modules first, then the shipped ones. */
static void set_paths(lua_State *L, const char *dir, const char *lib)
{
  lua_getglobal(L, "package");
  int n = 0;
  const char *dirs[] = {dir, lib};
  for (int i = 0; i < 2; i++)
    if (dirs[i]) {
      lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;", dirs[i], dirs[i]);
      n++;
    }
  lua_getfield(L, -1 - n, "path");  /* the default path, last */
  lua_concat(L, n + 1);
  lua_setfield(L, -2, "path");
  lua_pop(L, 1);
}

static int open_state(berth_host *h, char **err)
{
  lua_State *L = lua_newstate(berth_alloc, &h->mem);
  if (!L) {
    *err = berth_xstrdup("cannot create a Lua state (out of memory)");
    return -1;
  }
  h->L = L;
  /* Every thread copies the main thread's extra space: natives find the host there. */
  *(berth_host **)lua_getextraspace(L) = h;
  lua_atpanic(L, panic);
  luaL_openlibs(L);
  berth_open_coroutine(L);
  luaL_requiref(L, "json", luaopen_berth_json, 1);
  lua_pop(L, 1);
  berth_open_natives(L);
  set_paths(L, h->scripts_dir, h->lib_dir);
  if (!h->o.unrestricted) {
    lua_pushcfunction(L, log_print);
    lua_setglobal(L, "print");
    berth_restrict(L, h->scripts_dir ? h->scripts_dir : "/nonexistent");
  }
  /* What a reload starts from: the libraries, without any script's modules. */
  lua_newtable(L);
  lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  lua_pushnil(L);
  while (lua_next(L, -2)) {
    lua_pushvalue(L, -2);
    lua_insert(L, -2);
    lua_rawset(L, -5);
  }
  lua_pop(L, 1);
  h->loaded_base_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  return 0;
}

/* A close that failed is only worth a line in the host's log (docs/client.md §6.10). */
static void on_close_error(void *ud, const plm_key *key, const plm_error *err)
{
  char digest[13];
  plm_key_digest(key, digest);
  berth_log(ud, BERTH_LOG_WARN, "closing the sandbox of key %s failed: %s", digest,
            err->message);
}

static int open_sandboxes(berth_host *h)
{
  if (!h->o.daemon_url || !*h->o.daemon_url) {
    h->env_error = berth_xstrdup("no plimsoll daemon is configured (give --daemon URL, or set "
                          "PLIMSOLL_URL)");
    return 0;
  }
  plm_client_options co;
  plm_client_options_init(&co);
  co.base_url = h->o.daemon_url;
  co.token = h->o.daemon_token;
  plm_error *e = plm_client_new(h->loop, &co, &h->client);
  if (!e) {
    static const char *const languages[] = {"python", "javascript"};
    plm_sandboxes_options so;
    plm_sandboxes_options_init(&so);
    so.client = h->client;
    so.languages = languages;
    so.n_languages = 2;
    /* One rule for every face (berth_default_floor): container over loopback http,
     * kernel over https. */
    so.minimum_isolation = h->o.minimum_isolation ? h->o.minimum_isolation
                                                  : berth_default_floor(h->o.daemon_url);
    so.timeout_ms = h->o.timeout_ms;
    if (h->o.max_sandboxes > 0)
      so.max_sessions = h->o.max_sandboxes;
    if (h->o.max_sandboxes_per_owner > 0)
      so.max_sessions_per_owner = h->o.max_sandboxes_per_owner;
    else if (h->o.max_sandboxes_per_owner < 0)
      so.max_sessions_per_owner = 0;
    so.on_close_error = on_close_error;
    so.on_close_error_ud = h;
    e = plm_sandboxes_new(&so, &h->sandboxes);
  }
  if (e) {
    size_t n = strlen(e->message) + 64;
    h->env_error = berth_xmalloc(n);
    snprintf(h->env_error, n, "the daemon client could not be set up: %s", e->message);
    berth_log(h, BERTH_LOG_ERROR, "%s", h->env_error);
    plm_error_free(e);
    return -1;
  }
  return 0;
}

/* The store's failures, among the host's errors (source "store"; the class is the
 * error's code, a literal of the store's small set or "other"). */
static void count_store_failure(void *ud, const berth_error *err)
{
  static const char *const codes[] = {"unavailable", "data_loss", "version",
                                      "invalid_argument"};
  const char *cls = "other";
  for (size_t i = 0; i < sizeof codes / sizeof *codes; i++)
    if (!strcmp(err->code, codes[i]))
      cls = codes[i];
  berth_count_error(ud, "store", cls);
}

int berth_host_new(const berth_options *o, berth_host **out, char **err)
{
  *out = NULL;
  *err = NULL;
  if (!o->loop) {
    *err = berth_xstrdup("berth_host_new: a loop is required");
    return -1;
  }
  berth_reserve_descriptors();   /* before its connections grow the table (berth.h) */
  berth_host *h = berth_xcalloc(1, sizeof *h);
  plm_idmap_init(&h->owners);
  h->o = *o;
  h->loop = o->loop;
  h->model = o->model;
  h->hooks_ref = LUA_NOREF;
  h->loaded_base_ref = LUA_NOREF;
  plm_idmap_init(&h->runids);
  h->mem.limit = o->memory_limit;
  /* 0: the default (none for an unrestricted host: berth lua runs the user's own
   * program); < 0: none. */
  h->hook_time_limit = o->hook_time_limit > 0 ? o->hook_time_limit
                     : o->hook_time_limit == 0 && !o->unrestricted ? DEFAULT_HOOK_TIME_LIMIT : 0;
  h->hook_deadline = o->hook_deadline > 0 ? o->hook_deadline
                   : o->hook_deadline == 0 && !o->unrestricted ? DEFAULT_HOOK_DEADLINE : 0;
  h->max_events = o->max_events ? o->max_events : DEFAULT_MAX_EVENTS;
  h->load_task.h = h;
  h->load_task.what = (char *)"the top level of the hooks file";
  if (o->hooks_file) {
    h->hooks_file = berth_xstrdup(o->hooks_file);
    if (access(o->hooks_file, R_OK) != 0) {
      size_t n = strlen(o->hooks_file) + 128;
      *err = berth_xmalloc(n);
      snprintf(*err, n, "cannot read the hooks file %s: %s", o->hooks_file, strerror(errno));
      free(h->hooks_file);
      free(h);
      return -1;
    }
  }
  if (o->scripts_dir)
    h->scripts_dir = realpath(o->scripts_dir, NULL);
  else if (o->hooks_file)
    h->scripts_dir = dir_of(o->hooks_file);
  else
    h->scripts_dir = realpath(".", NULL);
  h->lib_dir = o->lib_dir ? realpath(o->lib_dir, NULL) : NULL;
  /* Option strings are the caller's; keep copies of those used later. */
  h->o.hooks_file = h->hooks_file;
  h->o.daemon_url = o->daemon_url ? berth_xstrdup(o->daemon_url) : NULL;
  h->o.daemon_token = o->daemon_token ? berth_xstrdup(o->daemon_token) : NULL;
  h->o.minimum_isolation = o->minimum_isolation ? berth_xstrdup(o->minimum_isolation) : NULL;
  ev_timer_init(&h->runq, on_runq, 0., 0.);
  h->runq.data = h;
  ev_timer_init(&h->grace, on_grace, 0., 0.);
  h->grace.data = h;
  if (open_state(h, err) != 0 || open_sandboxes(h) != 0) {
    if (!*err)
      *err = berth_xstrdup(h->env_error ? h->env_error : "cannot start the host");
    berth_host_free(h);
    return -1;
  }
  if (h->hooks_file && load_hooks(h, err) != 0) {
    berth_host_free(h);
    return -1;
  }
  if (o->handle_sighup) {
    ev_signal_init(&h->sighup, on_sighup, SIGHUP);
    h->sighup.data = h;
    ev_signal_start(h->loop, &h->sighup);
    ev_unref(h->loop);          /* reloading alone keeps no loop alive */
  }
  if (h->o.store)
    berth_store_on_failure(h->o.store, count_store_failure, h);
  *out = h;
  return 0;
}

static void on_disposed_all(void *ud)
{
  berth_host *h = ud;
  h->shutdown.active = false;
  if (h->shutdown.fn)
    h->shutdown.fn(h->shutdown.ud);
}

/* From the grace timer only (a clean stack): cancels what still runs once the grace
 * is over, then disposes every sandbox. */
static void on_grace(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)revents;
  berth_host *h = w->data;
  if (h->disposing)
    return;
  if (berth_conv_any_running(h)) {
    double left = h->grace_deadline - berth_clock();
    if (left > 0) {
      ev_timer_set(w, left, 0.);
      ev_timer_start(loop, w);
      return;
    }
    berth_log(h, BERTH_LOG_WARN, "shutdown: cancelling the hook calls still running");
    berth_conv_cancel_all(h);
  }
  h->disposing = true;
  if (h->sandboxes)
    plm_sandboxes_dispose_all(h->sandboxes, on_disposed_all, h);
  else
    on_disposed_all(h);
}

void berth_host_drain_check(berth_host *h)
{
  if (!h->draining || h->disposing || berth_conv_any_running(h))
    return;
  ev_timer_stop(h->loop, &h->grace);
  ev_timer_set(&h->grace, 0., 0.);
  ev_timer_start(h->loop, &h->grace);
}

void berth_host_shutdown(berth_host *h, void (*done)(void *ud), void *ud)
{
  bool finished = h->draining && h->disposing && !h->shutdown.active;
  h->shutdown.fn = done;
  h->shutdown.ud = ud;
  h->shutdown.active = true;
  if (finished) {               /* called again after it finished: dispose (again) */
    h->disposing = false;
    berth_host_drain_check(h);
    return;
  }
  if (h->draining)
    return;                     /* in progress: `done` replaces the first callback */
  h->draining = true;
  double grace = h->o.shutdown_grace == 0 ? DEFAULT_SHUTDOWN_GRACE
               : h->o.shutdown_grace < 0 ? 0 : h->o.shutdown_grace;
  h->grace_deadline = berth_clock() + grace;
  berth_conv_drain_all(h);
  ev_timer_set(&h->grace, berth_conv_any_running(h) ? grace : 0., 0.);
  ev_timer_start(h->loop, &h->grace);
}

bool berth_host_shutting_down(const berth_host *h) { return h->draining; }

static void drain_tick(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)loop;
  (void)w;
  (void)revents;
}

void berth_host_free(berth_host *h)
{
  if (!h)
    return;
  h->draining = true;            /* freed conversations wake no waiting turn */
  if (h->L) {
    berth_conv_kill_all(h);
    while (h->tasks)
      berth_task_kill(h->tasks);
  }
  /* Killing the tasks cancelled their calls; let the library call them back (it does
   * not when freed with calls in flight), within a bound.  A shutdown in progress
   * (dispose_all) is waited for the same way. */
  if (h->inflight || h->shutdown.active) {
    ev_timer tick;
    ev_timer_init(&tick, drain_tick, 0.05, 0.05);
    ev_timer_start(h->loop, &tick);
    ev_now_update(h->loop);
    ev_tstamp deadline = ev_now(h->loop) + DRAIN_LIMIT;
    while ((h->inflight || h->shutdown.active) && ev_now(h->loop) < deadline)
      ev_run(h->loop, EVRUN_ONCE);
    ev_timer_stop(h->loop, &tick);
    if (h->inflight)
      berth_log(h, BERTH_LOG_WARN, "%u daemon calls still unsettled at exit", h->inflight);
  }
  h->shutdown.fn = NULL;
  ev_timer_stop(h->loop, &h->runq);
  ev_timer_stop(h->loop, &h->grace);
  if (ev_is_active(&h->sighup)) {
    ev_ref(h->loop);
    ev_signal_stop(h->loop, &h->sighup);
  }
  /* Library completions for orphaned ops run here (PLM_CANCELED), while the state
   * they write to still exists. */
  plm_sandboxes_free(h->sandboxes);
  json_decref(h->tool);
  plm_client_free(h->client);
  if (h->L)
    lua_close(h->L);
  berth_counters_free(&h->st);
  berth_owners_free(h);
  plm_idmap_free(&h->runids);    /* its conversations were freed with the tasks */
  free(h->hooks_file);
  free(h->scripts_dir);
  free(h->lib_dir);
  free(h->env_error);
  free((char *)h->o.daemon_url);
  free((char *)h->o.daemon_token);
  free((char *)h->o.minimum_isolation);
  if (h->o.store)               /* the store outlives the host (its last flush) */
    berth_store_on_failure(h->o.store, NULL, NULL);
  free(h);
}

lua_State *berth_host_lua(berth_host *h) { return h->L; }
struct ev_loop *berth_host_loop(berth_host *h) { return h->loop; }

/* }====================================================== */

/* {====================================================== berth lua FILE */

/* The file's task tells h->file_done (held in the host, not allocated: a task killed at
 * berth_host_free, after SIGINT say, has nothing of its own to free). */
static void file_done(void *ud, berth_task *t, bool ok, const char *error)
{
  berth_host *h = ud;
  if (!ok)
    fprintf(stderr, "berth: %s: %s\n", t->what, error);
  if (h->file_done)
    h->file_done(h->file_ud, ok ? 0 : 1);
}

int berth_run_file(berth_host *h, int argc, char **argv,
                   void (*done)(void *ud, int status), void *ud)
{
  lua_State *L = h->L;
  /* arg, as lua.c sets it: arg[0] the file, arg[1..] its arguments. */
  lua_createtable(L, argc, 1);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i);
  }
  lua_setglobal(L, "arg");
  if (luaL_loadfilex(L, argv[0], h->o.unrestricted ? NULL : "t") != LUA_OK) {
    fprintf(stderr, "berth: %s\n", lua_tostring(L, -1));
    lua_pop(L, 1);
    return -1;
  }
  for (int i = 1; i < argc; i++)
    lua_pushstring(L, argv[i]);
  h->file_done = done;
  h->file_ud = ud;
  berth_task_start(h, NULL, argv[0], argc - 1, file_done, h);
  return 0;
}

/* }====================================================== */

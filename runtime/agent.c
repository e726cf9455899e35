/*
 * agent.c — a conversation's life cycle, as Trigger.dev's chat agent runs it
 * (client.md §8.1, notes §4.1):
 *
 *   message ─▶ [slot] ─▶ [resume] ─▶ onTurnStart(ctx) ─▶ onTurn(ctx, message) ─▶ turnEnd
 *                                                      │ idle timeout, no message
 *                                                      ▼
 *                                          onSuspend(ctx) ─▶ suspended
 *   complete ─▶ onComplete(ctx) ─▶ completed
 *
 * One hook call at a time per conversation; messages that arrive meanwhile queue.
 * The idle timer runs only while the conversation waits for a message.  A hook that
 * fails is reported (berth_report_error) and the conversation goes on: a failed
 * onTurnStart skips that turn's onTurn (the turn failed as a whole).
 *
 * Many conversations share the host's turn slots (max_concurrent_turns): a turn takes
 * a slot before onTurnStart and gives it back at turnEnd; a conversation with a
 * message and no free slot waits in the host's slot queue, first come first served,
 * and a released slot goes to the head of that queue before any newcomer.  An idle
 * conversation holds no slot, no coroutine and no timer but its idle timer.
 */
#include "runtime.h"
#include "jsonlua.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CTX_MT "berth.ctx"

typedef enum phase { PH_NONE, PH_TURN_START, PH_TURN, PH_SUSPEND, PH_COMPLETE } phase;

static const char *const phase_hook[] = {NULL, "onTurnStart", "onTurn", "onSuspend",
                                         "onComplete"};

typedef struct msg {
  struct msg *next;
  double at;                     /* berth_clock() when it was accepted */
  char text[];
} msg;

struct berth_conv {
  berth_host *h;
  berth_conv *prev, *next;
  char *run_id, *user_id;
  char *warmed;                  /* the run id onTurnStart warmed (H01, H03) */
  void *ud;
  int ctx_ref;
  berth_task *task;              /* the hook call running now */
  phase phase;
  msg *queue, *queue_tail;
  msg *turn;                     /* the message of the turn in progress */
  unsigned turns;                /* turns started */
  unsigned turn_cells, turn_cell_errors;
  bool turn_failed;
  bool has_slot, waiting_slot;
  berth_conv *slot_next;
  bool suspended, suspend_wanted, completing, completed, registered;
  void (*complete_done)(void *ud, berth_conv *c);
  void *complete_ud;
  ev_timer idle;
};

static void pump(berth_conv *c);

/* {====================================================== ctx */

static berth_conv *ctx_conv(lua_State *L)
{
  berth_task *t = berth_current_task(berth_host_of(L));
  if (!t || !t->conv)
    luaL_error(L, "ctx methods can be called only from a conversation's hook");
  return t->conv;
}

/* ctx:emit(kind [, data]): an event for the face (a transcript, a terminal). */
static int ctx_emit(lua_State *L)
{
  berth_conv *c = ctx_conv(L);
  const char *kind = luaL_checkstring(L, 2);
  const json_t *data = NULL;
  if (!lua_isnoneornil(L, 3))
    data = berth_json_check_boxed(L, 3);
  berth_charge_event(L, data);
  berth_emit(c->h, c, kind, data);
  if (data)
    berth_json_box_free(L, -1);  /* callbacks borrow it only during the call */
  return 0;
}

/* ctx:say(text): the assistant's text for this turn. */
static int ctx_say(lua_State *L)
{
  berth_conv *c = ctx_conv(L);
  luaL_checkstring(L, 2);
  const json_t *data = berth_json_check_boxed(L, 2);
  berth_charge_event(L, data);
  berth_emit(c->h, c, "assistant", data);
  berth_json_box_free(L, -1);
  return 0;
}

/* ctx's lookups: its methods, and ctx.hooks, the hooks table loaded now (after a
 * SIGHUP reload, the new one).  A shared hook reads its settings there, so a table
 * that inherits code_chat and sets `system`, `maxSteps` or `beforeToolCall` is the
 * one obeyed, not the base it inherits from. */
static int ctx_index(lua_State *L)
{
  const char *k = lua_tostring(L, 2);
  if (k && strcmp(k, "hooks") == 0) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, berth_host_of(L)->hooks_ref);
    return 1;
  }
  lua_pushvalue(L, 2);
  lua_rawget(L, lua_upvalueindex(1));
  return 1;
}

static void push_ctx_new(lua_State *L, berth_conv *c, const json_t *metadata)
{
  lua_createtable(L, 0, 4);
  lua_pushstring(L, c->run_id);
  lua_setfield(L, -2, "runId");
  if (c->user_id) {
    lua_pushstring(L, c->user_id);
    lua_setfield(L, -2, "userId");
  }
  if (metadata) {
    berth_json_push(L, metadata);
    lua_setfield(L, -2, "metadata");
  }
  lua_newtable(L);
  berth_json_setarray(L, -1);
  lua_setfield(L, -2, "messages");
  if (luaL_newmetatable(L, CTX_MT)) {
    static const luaL_Reg methods[] = {{"emit", ctx_emit}, {"say", ctx_say}, {NULL, NULL}};
    luaL_newlib(L, methods);
    lua_pushcclosure(L, ctx_index, 1);
    lua_setfield(L, -2, "__index");
  }
  lua_setmetatable(L, -2);
}

void berth_conv_push_ctx(lua_State *L, berth_conv *c)
{
  lua_rawgeti(L, LUA_REGISTRYINDEX, c->ctx_ref);
}

/* }====================================================== */

/* {====================================================== run ids */

/* The host's table run id -> conversation, for unique run ids at O(1). */
static void push_runids(berth_host *h)
{
  lua_rawgeti(h->L, LUA_REGISTRYINDEX, h->runids_ref);
}

static bool runid_taken(berth_host *h, const char *run_id)
{
  push_runids(h);
  bool taken = lua_getfield(h->L, -1, run_id) != LUA_TNIL;
  lua_pop(h->L, 2);
  return taken;
}

static void runid_set(berth_conv *c, bool on)
{
  berth_host *h = c->h;
  lua_State *L = h->L;
  push_runids(h);
  if (on)
    lua_pushlightuserdata(L, c);
  else {
    lua_getfield(L, -1, c->run_id);
    bool mine = lua_touserdata(L, -1) == c;
    lua_pop(L, 1);
    if (!mine) {
      lua_pop(L, 1);
      return;
    }
    lua_pushnil(L);
  }
  lua_setfield(L, -2, c->run_id);
  lua_pop(L, 1);
  c->registered = on;
}

/* }====================================================== */

/* {====================================================== turn slots */

static bool take_slot(berth_conv *c)
{
  berth_host *h = c->h;
  if (c->has_slot)
    return true;
  if (h->o.max_concurrent_turns && h->turns_running >= h->o.max_concurrent_turns) {
    if (!c->waiting_slot) {
      c->waiting_slot = true;
      c->slot_next = NULL;
      if (h->slot_tail)
        h->slot_tail->slot_next = c;
      else
        h->slot_head = c;
      h->slot_tail = c;
    }
    return false;
  }
  h->turns_running++;
  c->has_slot = true;
  return true;
}

static void unwait_slot(berth_conv *c)
{
  berth_host *h = c->h;
  if (!c->waiting_slot)
    return;
  berth_conv **pp = &h->slot_head;
  h->slot_tail = NULL;
  while (*pp) {
    if (*pp == c)
      *pp = c->slot_next;
    else {
      h->slot_tail = *pp;
      pp = &(*pp)->slot_next;
    }
  }
  c->waiting_slot = false;
  c->slot_next = NULL;
}

/* Free slots go to the conversations that waited longest. */
static void wake_waiters(berth_host *h)
{
  while (h->slot_head && !h->draining &&
         (!h->o.max_concurrent_turns || h->turns_running < h->o.max_concurrent_turns)) {
    berth_conv *w = h->slot_head;
    h->slot_head = w->slot_next;
    if (!h->slot_head)
      h->slot_tail = NULL;
    w->waiting_slot = false;
    w->slot_next = NULL;
    pump(w);
  }
}

static void release_slot(berth_conv *c)
{
  if (!c->has_slot)
    return;
  c->has_slot = false;
  c->h->turns_running--;
  wake_waiters(c->h);
}

/* }====================================================== */

/* {====================================================== hooks */

/* Starts the turn of the message at the head of the queue. */
static void begin_turn(berth_conv *c)
{
  berth_host *h = c->h;
  c->turn = c->queue;
  c->queue = c->turn->next;
  if (!c->queue)
    c->queue_tail = NULL;
  h->queued--;
  c->turns++;
  c->turn_cells = c->turn_cell_errors = 0;
  c->turn_failed = false;
  h->st.turns_started++;
  if (c->suspended) {
    c->suspended = false;
    berth_emit(h, c, "resume", NULL);
  }
  json_t *text = json_string(c->turn->text);
  berth_emit(h, c, "user", text);
  json_decref(text);
}

static void end_turn(berth_conv *c, bool cancelled)
{
  berth_host *h = c->h;
  berth_turn_info info = {c->turns, !c->turn_failed && !cancelled,
                          berth_clock() - c->turn->at, c->turn_cells, c->turn_cell_errors};
  free(c->turn);
  c->turn = NULL;
  h->st.turns_ended++;
  if (!info.ok)
    h->st.turns_failed++;
  if (cancelled)
    h->st.turns_cancelled++;
  berth_hist_add(&h->st.turn_seconds, info.seconds);
  if (h->o.callbacks.on_turn_end)
    h->o.callbacks.on_turn_end(h->o.callbacks.ud, c, &info);
  if (h->o.on_event) {
    json_t *data = json_pack("{s:i, s:b, s:f, s:i}", "turn", (json_int_t)info.turn, "ok",
                             info.ok, "seconds", info.seconds, "cells",
                             (json_int_t)info.cells);
    h->o.on_event(h->o.event_ud, c, "turnEnd", data);
    json_decref(data);
  }
  release_slot(c);
}

/* A host-made error event (not a hook's failure). */
static void host_error(berth_conv *c, const char *hook, const char *code, const char *message)
{
  berth_host *h = c->h;
  berth_count_error(h, "host", code);
  json_t *ev = json_pack("{s:s, s:s, s:s}", "hook", hook, "message", message, "code", code);
  berth_emit(h, c, "error", ev);
  json_decref(ev);
}

/* During a shutdown, queued messages end at once: each still gets its turn start and
 * end, so a face that waits for a turn's end (an SSE stream) is answered. */
static void drop_queue(berth_conv *c)
{
  while (c->queue) {
    begin_turn(c);
    host_error(c, "turn", "shutting_down",
               "the host is shutting down; this message was not processed");
    c->turn_failed = true;
    end_turn(c, false);
  }
}

static void after_hook(void *ud, berth_task *t, bool ok, const char *error)
{
  berth_conv *c = ud;
  berth_host *h = c->h;
  phase ph = c->phase;
  c->task = NULL;
  c->phase = PH_NONE;
  if (!ok) {
    berth_report_error(h, c, t->what, error);
    c->turn_failed = true;
  }
  switch (ph) {
    case PH_TURN_START:
      if (ok) {
        /* onTurn(ctx, message) */
        lua_State *L = h->L;
        lua_rawgeti(L, LUA_REGISTRYINDEX, h->hooks_ref);
        lua_getfield(L, -1, "onTurn");
        lua_remove(L, -2);
        if (lua_isfunction(L, -1)) {
          berth_conv_push_ctx(L, c);
          lua_pushstring(L, c->turn->text);
          c->phase = PH_TURN;
          c->task = berth_task_start(h, c, "onTurn", 2, after_hook, c);
          return;
        }
        lua_pop(L, 1);
        berth_log(h, BERTH_LOG_WARN, "the hooks define no onTurn: message ignored");
      }
      end_turn(c, false);       /* the turn failed as a whole */
      break;
    case PH_TURN:
      end_turn(c, false);
      break;
    case PH_SUSPEND:
      c->suspended = true;
      berth_emit(h, c, "suspend", NULL);
      break;
    case PH_COMPLETE:
      c->completed = true;
      h->st.completed++;
      berth_emit(h, c, "complete", NULL);
      if (c->complete_done)
        c->complete_done(c->complete_ud, c);  /* c may be freed by now */
      if (h->draining)
        berth_host_drain_check(h);
      return;
    case PH_NONE:
      break;
  }
  pump(c);
  if (h->draining)
    berth_host_drain_check(h);
}

static int no_hook(lua_State *L)
{
  (void)L;
  return 0;
}

/* Starts hook `ph` with ctx.  A hook the script does not define runs as a no-op task,
 * still through the loop like a real one, so callers never re-enter. */
static void start_hook(berth_conv *c, phase ph)
{
  berth_host *h = c->h;
  lua_State *L = h->L;
  c->phase = ph;
  lua_rawgeti(L, LUA_REGISTRYINDEX, h->hooks_ref);
  if (lua_istable(L, -1))
    lua_getfield(L, -1, phase_hook[ph]);
  else
    lua_pushnil(L);
  lua_remove(L, -2);
  if (!lua_isfunction(L, -1)) {
    lua_pop(L, 1);
    berth_log(h, BERTH_LOG_DEBUG, "the hooks define no %s", phase_hook[ph]);
    lua_pushcfunction(L, no_hook);
  }
  berth_conv_push_ctx(L, c);
  c->task = berth_task_start(h, c, phase_hook[ph], 1, after_hook, c);
}

static void pump(berth_conv *c)
{
  berth_host *h = c->h;
  if (c->task || c->completed)
    return;
  ev_timer_stop(h->loop, &c->idle);
  if (c->queue && h->draining)
    drop_queue(c);
  if (c->queue) {
    if (!take_slot(c))
      return;                   /* woken by wake_waiters */
    begin_turn(c);
    start_hook(c, PH_TURN_START);
    return;
  }
  release_slot(c);              /* (only held between taking it and the turn) */
  if (c->suspend_wanted) {
    c->suspend_wanted = false;
    if (!c->suspended && !h->draining) {
      start_hook(c, PH_SUSPEND);
      return;
    }
  }
  if (c->completing) {
    start_hook(c, PH_COMPLETE);
    return;
  }
  if (!c->suspended && !h->draining && h->o.idle_timeout > 0) {
    ev_timer_set(&c->idle, h->o.idle_timeout, 0.);
    ev_timer_start(h->loop, &c->idle);
  }
}

static void on_idle(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)loop;
  (void)revents;
  berth_conv *c = w->data;
  c->suspend_wanted = true;
  pump(c);
}

/* }====================================================== */

/* {====================================================== shutdown */

void berth_conv_drain_all(berth_host *h)
{
  while (h->slot_head)
    unwait_slot(h->slot_head);
  for (berth_conv *c = h->convs; c; c = c->next) {
    ev_timer_stop(h->loop, &c->idle);
    c->suspend_wanted = false;
    if (!c->task)
      drop_queue(c);
  }
}

bool berth_conv_any_running(const berth_host *h)
{
  for (const berth_conv *c = h->convs; c; c = c->next)
    if (c->task)
      return true;
  return false;
}

void berth_conv_cancel_all(berth_host *h)
{
  berth_conv *next;
  for (berth_conv *c = h->convs; c; c = next) {
    next = c->next;
    if (!c->task)
      continue;
    phase ph = c->phase;
    berth_task *t = c->task;
    c->task = NULL;
    c->phase = PH_NONE;
    berth_task_kill(t);         /* its calls are cancelled (their ops orphaned) */
    char why[160];
    snprintf(why, sizeof why, "%s was cancelled: the host is shutting down",
             phase_hook[ph]);
    host_error(c, phase_hook[ph], "cancelled", why);
    switch (ph) {
      case PH_TURN_START:
      case PH_TURN:
        c->turn_failed = true;
        end_turn(c, true);
        drop_queue(c);
        break;
      case PH_SUSPEND:
        c->suspended = true;
        berth_emit(h, c, "suspend", NULL);
        break;
      case PH_COMPLETE:
        c->completed = true;
        h->st.completed++;
        berth_emit(h, c, "complete", NULL);
        if (c->complete_done)
          c->complete_done(c->complete_ud, c);  /* may free c (only c) */
        break;
      case PH_NONE:
        break;
    }
  }
}

/* }====================================================== */

/* {====================================================== public */

static berth_conv *conv_create(berth_host *h, const char *run_id, const char *user_id,
                               const json_t *metadata, void *ud)
{
  berth_conv *c = calloc(1, sizeof *c);
  c->h = h;
  c->run_id = strdup(run_id);
  c->user_id = user_id ? strdup(user_id) : NULL;
  c->ud = ud;
  push_ctx_new(h->L, c, metadata);
  c->ctx_ref = luaL_ref(h->L, LUA_REGISTRYINDEX);
  ev_timer_init(&c->idle, on_idle, 0., 0.);
  c->idle.data = c;
  c->next = h->convs;
  if (h->convs)
    h->convs->prev = c;
  h->convs = c;
  h->n_convs++;
  h->st.opened++;
  if (!runid_taken(h, run_id))
    runid_set(c, true);
  return c;
}

berth_error *berth_conv_open(berth_host *h, const berth_conv_options *o, berth_conv **out)
{
  *out = NULL;
  berth_conv_options none = {NULL, NULL, NULL, NULL};
  if (!o)
    o = &none;
  if (h->draining)
    return berth_error_new("shutting_down", "the host is shutting down and opens no new "
                                            "conversations");
  if (h->o.max_conversations && h->n_convs >= h->o.max_conversations) {
    h->st.capacity_refusals++;
    berth_count_error(h, "host", "capacity");
    return berth_error_new("capacity", "the host holds its limit of %zu conversations; "
                                       "complete one first or retry later",
                           h->o.max_conversations);
  }
  if (o->metadata && !json_is_object(o->metadata))
    return berth_error_new("invalid_argument", "a conversation's metadata must be a JSON "
                                               "object");
  char gen[32];
  const char *run_id = o->run_id;
  if (run_id) {
    if (!*run_id || strlen(run_id) > 256)
      return berth_error_new("invalid_argument", "a run id must have 1 to 256 bytes");
    if (runid_taken(h, run_id))
      return berth_error_new("exists", "a conversation with run id %s is open already",
                             run_id);
  } else {
    do
      snprintf(gen, sizeof gen, "conv-%llu", (unsigned long long)++h->conv_seq);
    while (runid_taken(h, gen));
    run_id = gen;
  }
  if (o->user_id && (!*o->user_id || strlen(o->user_id) > 256))
    return berth_error_new("invalid_argument", "a user id must have 1 to 256 bytes");
  *out = conv_create(h, run_id, o->user_id, o->metadata, o->ud);
  return NULL;
}

berth_conv *berth_conv_new(berth_host *h, const char *run_id, const char *user_id)
{
  if (h->draining)
    return NULL;
  return conv_create(h, run_id, user_id, NULL, NULL);
}

berth_error *berth_conv_message(berth_conv *c, const char *message)
{
  berth_host *h = c->h;
  if (!message)
    return berth_error_new("invalid_argument", "the message is NULL");
  if (c->completing || c->completed)
    return berth_error_new("completed", "the conversation %s is completing and takes no "
                                        "more messages", c->run_id);
  if (h->draining)
    return berth_error_new("shutting_down", "the host is shutting down and takes no new "
                                            "messages");
  if (h->o.max_queued_messages && h->queued >= h->o.max_queued_messages) {
    h->st.capacity_refusals++;
    berth_count_error(h, "host", "capacity");
    return berth_error_new("capacity", "the host holds its limit of %zu queued messages; "
                                       "retry later", h->o.max_queued_messages);
  }
  size_t n = strlen(message);
  msg *m = malloc(sizeof *m + n + 1);
  m->next = NULL;
  m->at = berth_clock();
  memcpy(m->text, message, n + 1);
  if (c->queue_tail)
    c->queue_tail->next = m;
  else
    c->queue = m;
  c->queue_tail = m;
  h->queued++;
  pump(c);
  return NULL;
}

int berth_conv_send(berth_conv *c, const char *message)
{
  berth_error *e = berth_conv_message(c, message);
  if (!e)
    return 0;
  berth_error_free(e);
  return -1;
}

void berth_conv_suspend(berth_conv *c)
{
  c->suspend_wanted = true;
  pump(c);
}

void berth_conv_complete(berth_conv *c, void (*done)(void *ud, berth_conv *c), void *ud)
{
  c->completing = true;
  c->complete_done = done;
  c->complete_ud = ud;
  pump(c);
}

void berth_conv_cell_done(berth_conv *c, bool ok)
{
  if (!c->turn)
    return;
  c->turn_cells++;
  if (!ok)
    c->turn_cell_errors++;
}

bool berth_conv_busy(const berth_conv *c) { return c->task != NULL || c->queue != NULL; }
bool berth_conv_suspended(const berth_conv *c) { return c->suspended; }
bool berth_conv_completing(const berth_conv *c) { return c->completing || c->completed; }
const char *berth_conv_run_id(const berth_conv *c) { return c->run_id; }
const char *berth_conv_user_id(const berth_conv *c) { return c->user_id; }
unsigned berth_conv_turns(const berth_conv *c) { return c->turns; }
void *berth_conv_userdata(const berth_conv *c) { return c->ud; }
void berth_conv_set_userdata(berth_conv *c, void *ud) { c->ud = ud; }
const char *berth_conv_warmed_run_id(const berth_conv *c) { return c->warmed; }

void berth_conv_set_warmed(berth_conv *c, const char *run_id)
{
  if (c->warmed && strcmp(c->warmed, run_id) == 0)
    return;
  free(c->warmed);
  c->warmed = strdup(run_id);
}

void berth_conv_free(berth_conv *c)
{
  if (!c)
    return;
  berth_host *h = c->h;
  ev_timer_stop(h->loop, &c->idle);
  if (c->task)
    berth_task_kill(c->task);
  c->task = NULL;
  unwait_slot(c);
  if (c->registered)
    runid_set(c, false);
  luaL_unref(h->L, LUA_REGISTRYINDEX, c->ctx_ref);
  if (c->prev)
    c->prev->next = c->next;
  else
    h->convs = c->next;
  if (c->next)
    c->next->prev = c->prev;
  h->n_convs--;
  while (c->queue) {
    msg *m = c->queue;
    c->queue = m->next;
    h->queued--;
    free(m);
  }
  free(c->turn);
  free(c->run_id);
  free(c->user_id);
  free(c->warmed);
  bool slot = c->has_slot;
  c->has_slot = false;
  free(c);
  if (slot) {
    h->turns_running--;
    wake_waiters(h);
  }
}

void berth_conv_kill_all(berth_host *h)
{
  while (h->convs)
    berth_conv_free(h->convs);
}

/* }====================================================== */

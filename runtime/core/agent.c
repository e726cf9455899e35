/*
 * agent.c — a conversation's life cycle, as Trigger.dev's chat agent runs it
 * (docs/architecture.md §3):
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
#include "xalloc.h"
#include "jsonlua.h"
#include "json_text.h"            /* lib/: the one compact JSON writer */
#include "store/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define CTX_MT "berth.ctx"

typedef enum phase { PH_NONE, PH_TURN_START, PH_TURN, PH_SUSPEND, PH_COMPLETE } phase;

static const char *const phase_hook[] = {NULL, "onTurnStart", "onTurn", "onSuspend",
                                         "onComplete"};

typedef struct ticket ticket;

typedef struct msg {
  struct msg *next;
  double at;                     /* berth_clock() when it was accepted */
  bool durable;                  /* stored (or no store): its turn may start */
  ticket *ticket;                /* waiting for the store to say so */
  char text[];
} msg;

/* A message's wait for the store's commit; outlives the message and the conversation
 * (both tell it they are gone), freed by the store's callback. */
struct ticket {
  berth_conv *c;                 /* NULL once the conversation is freed */
  msg *m;                        /* NULL once the message is */
  void (*stored)(void *ud, berth_conv *c, const berth_error *err);
  void *ud;
  uint32_t turn;                 /* the turn its "user" event named */
};

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
  berth_cell_timing cell_timing; /* the last executeCode's (berth_conv_take_cell_timing) */
  bool has_cell_timing;
  bool turn_failed;
  bool turn_refused;             /* its message was never taken (drop_queue) */
  bool has_slot, waiting_slot;
  berth_conv *slot_next;
  bool suspended, suspend_wanted, completing, completed, registered;
  void (*complete_done)(void *ud, berth_conv *c);
  void *complete_ud;
  ev_timer idle;
  /* the store's view (h->o.store) */
  char *sid, *caller;            /* durable id, who may see it */
  char *metadata;                /* JSON text, as opened */
  char *state;                   /* ctx.state as JSON text, as last stored */
  int64_t created_ms;
  unsigned accepted;             /* messages accepted: the next one's turn is +1 */
  uint64_t last_event;
  uint32_t stored_msgs;          /* ctx.messages entries stored ... */
  const void *stored_tbl;        /* ... of this table (another one: rewrite all) */
  /* Suspended and stored, its ctx is dropped from the Lua heap (ctx_ref LUA_NOREF)
   * and loaded again from the store when a hook next needs it: idle conversations
   * cost the running ones no heap and no collector's time. */
  bool unloaded;
  struct unload_wait *unload;    /* waiting for the store to commit the suspend */
  plm_idmap_node runid_node;     /* in h->runids while registered */
};

typedef struct unload_wait {
  berth_conv *c;                 /* NULL once the conversation is freed */
} unload_wait;

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
  lua_newtable(L);
  lua_setfield(L, -2, "state");
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

/* Run ids are unique in a host: h->runids holds each registered conversation under its
 * run id (a conversation is registered from open to free). */
static bool runid_taken(berth_host *h, const char *run_id)
{
  return plm_idmap_get(&h->runids, run_id) != NULL;
}

static void runid_set(berth_conv *c, bool on)
{
  if (on == c->registered)
    return;
  if (on) {
    c->runid_node.key = c->run_id;
    if (!plm_idmap_put(&c->h->runids, &c->runid_node))
      berth_oom(sizeof c->runid_node);
  } else
    plm_idmap_remove(&c->h->runids, &c->runid_node);
  c->registered = on;
}

/* }====================================================== */

/* {====================================================== the store */

static berth_store *store_of(const berth_conv *c) { return c->h->o.store; }

static berth_store_status conv_status(const berth_conv *c)
{
  return c->completed ? BERTH_STORE_COMPLETED
       : c->suspended ? BERTH_STORE_SUSPENDED : BERTH_STORE_OPEN;
}

/* The turn that runs now or, between turns, the next accepted one: what a host that
 * dies now leaves unfinished (marked interrupted at the next start). */
static uint32_t unfinished_turn(const berth_conv *c)
{
  if (c->turn)
    return c->turns;
  return c->queue ? c->turns + 1 : 0;
}

/* What the store needs of ctx, run protected (JSON encoding raises on what has no JSON
 * form): [1] ctx, [2] the conversation.  Pushes the state's text (or nil), then
 * whether the messages were rewritten, then the new messages' texts as a table. */
static int encode_ctx(lua_State *L)
{
  berth_conv *c = lua_touserdata(L, 2);
  lua_getfield(L, 1, "state");
  if (lua_isnil(L, -1))
    lua_pushnil(L);
  else
    berth_json_encode(L, -1, 0);
  lua_getfield(L, 1, "messages");
  int msgs = lua_gettop(L);
  lua_Integer n = lua_istable(L, msgs) ? luaL_len(L, msgs) : 0;
  bool rewrite = !lua_istable(L, msgs) || lua_topointer(L, msgs) != c->stored_tbl ||
                 n < (lua_Integer)c->stored_msgs;
  lua_pushboolean(L, rewrite);
  lua_Integer from = rewrite ? 1 : (lua_Integer)c->stored_msgs + 1;
  lua_createtable(L, n >= from ? (int)(n - from + 1) : 0, 0);  /* the new ones only */
  for (lua_Integer i = from, k = 1; i <= n; i++) {
    lua_geti(L, msgs, i);
    berth_json_encode(L, -1, 0);
    lua_rawseti(L, -3, k++);
    lua_pop(L, 1);
  }
  return 4;
}

/* Writes the conversation's record (and, with `ctx`, its new messages and state) to the
 * store's queue: the next flush commits it with the rest of this loop iteration. */
static bool store_save(berth_conv *c, bool ctx)
{
  berth_store *st = store_of(c);
  if (!st)
    return false;
  if (c->unloaded)
    ctx = false;                /* the store holds it as it is */
  berth_host *h = c->h;
  lua_State *L = h->L;
  berth_store_conv r = {0};
  r.id = c->sid;
  r.caller = c->caller;
  r.owner = c->user_id;
  r.run_id = c->run_id;
  r.metadata = c->metadata;
  r.status = conv_status(c);
  r.created_ms = c->created_ms;
  r.updated_ms = berth_store_now_ms();
  r.turns = c->turns;
  r.running_turn = unfinished_turn(c);
  r.last_event = c->last_event;
  char *state = NULL;
  if (ctx) {
    lua_pushcfunction(L, encode_ctx);
    berth_conv_push_ctx(L, c);
    lua_pushlightuserdata(L, c);
    if (lua_pcall(L, 2, 4, 0) != LUA_OK) {
      berth_log(h, BERTH_LOG_WARN, "conversation %s: ctx.messages or ctx.state has no JSON "
                "form, not stored this time: %s", c->run_id, lua_tostring(L, -1));
      lua_pop(L, 1);
      ctx = false;
    } else {
      state = lua_isstring(L, -4) ? berth_xstrdup(lua_tostring(L, -4)) : NULL;
      bool rewrite = lua_toboolean(L, -2);
      size_t n = (size_t)luaL_len(L, -1);
      const char **texts = berth_xcalloc(n ? n : 1, sizeof *texts);
      for (size_t i = 0; i < n; i++) {
        lua_rawgeti(L, -1, (lua_Integer)i + 1);
        texts[i] = lua_tostring(L, -1);
        lua_pop(L, 1);           /* (still anchored by the table) */
      }
      if (n || rewrite)
        berth_store_put_messages(st, c->sid, rewrite ? 0 : c->stored_msgs, texts, n, rewrite);
      c->stored_msgs = (rewrite ? 0 : c->stored_msgs) + (uint32_t)n;
      free(texts);
      lua_pop(L, 4);
      berth_conv_push_ctx(L, c);
      lua_getfield(L, -1, "messages");
      c->stored_tbl = lua_topointer(L, -1);
      lua_pop(L, 2);
    }
  }
  if (ctx) {
    free(c->state);
    c->state = state;
  }
  r.n_messages = c->stored_msgs;
  r.state = c->state;            /* without ctx: as stored last time */
  berth_store_put_conv(st, &r);
  return ctx;
}

/* berth_conv_record_event_text; a "user" event goes with its message's id (NULL:
 * none), which the store indexes: a retry is found without reading the events
 * (store.h). */
static uint64_t record_text(berth_conv *c, const char *kind, const char *text,
                            const char *message_id)
{
  uint64_t seq = ++c->last_event;
  berth_store *st = store_of(c);
  if (st) {
    uint32_t turn = c->turn ? c->turns : c->accepted;
    if (!strcmp(kind, "user"))
      berth_store_put_user_event(st, c->sid, seq, turn, text ? text : "null", message_id);
    else
      berth_store_put_event(st, c->sid, seq, turn, kind, text ? text : "null");
  }
  return seq;
}

static uint64_t record_event(berth_conv *c, const char *kind, const json_t *data,
                             const char *message_id)
{
  if (!store_of(c))
    return ++c->last_event;     /* (nothing to write the text for) */
  char *text = data ? plm_json_write(data, NULL) : NULL;
  uint64_t seq = record_text(c, kind, text, message_id);
  free(text);
  return seq;
}

uint64_t berth_conv_record_event(berth_conv *c, const char *kind, const json_t *data)
{
  return record_event(c, kind, data, NULL);
}

uint64_t berth_conv_record_event_text(berth_conv *c, const char *kind, const char *text)
{
  return record_text(c, kind, text, NULL);
}

const char *berth_conv_store_id(const berth_conv *c) { return c->sid ? c->sid : c->run_id; }

static void on_message_stored(void *ud, const berth_error *err)
{
  ticket *t = ud;
  berth_conv *c = t->c;
  if (t->m) {
    t->m->ticket = NULL;
    if (!err)
      t->m->durable = true;
    else if (c) {
      /* not stored: take it out before it runs (a queued message has not started).
       * Its writes stay queued in the store and may yet be applied: its turn is
       * ended there too, so that no reader takes the message for one that ran. */
      char data[160];
      snprintf(data, sizeof data, "{\"code\":\"unavailable\",\"message\":\"the message "
                                  "could not be stored, so it was not taken\"}");
      berth_store_put_event(store_of(c), c->sid, ++c->last_event, t->turn, "error", data);
      snprintf(data, sizeof data, "{\"turn\":%u,\"ok\":false,\"refused\":true}", t->turn);
      berth_store_put_event(store_of(c), c->sid, ++c->last_event, t->turn, "turn_end", data);
      msg **pp = &c->queue;
      c->queue_tail = NULL;
      while (*pp) {
        if (*pp == t->m) {
          *pp = t->m->next;
          c->h->queued--;
          c->accepted--;
          free(t->m);
        } else {
          c->queue_tail = *pp;
          pp = &(*pp)->next;
        }
      }
      store_save(c, false);
    }
  }
  if (t->stored)
    t->stored(t->ud, c, err);
  free(t);
  if (c && !err)
    pump(c);
}

/* }====================================================== */

/* {====================================================== idle ctx outside the heap */

static void on_suspend_stored(void *ud, const berth_error *err)
{
  unload_wait *u = ud;
  berth_conv *c = u->c;
  if (c) {
    c->unload = NULL;
    if (!err && c->suspended && !c->task && !c->turn && !c->queue && !c->completing &&
        !c->unloaded) {
      luaL_unref(c->h->L, LUA_REGISTRYINDEX, c->ctx_ref);
      c->ctx_ref = LUA_NOREF;
      c->h->mem.released = true;
      c->stored_tbl = NULL;
      c->unloaded = true;
    }
  }
  free(u);
}

/* Once the suspend's writes (its ctx among them) are committed, the ctx is dropped. */
static void unload_when_stored(berth_conv *c)
{
  if (c->unload || c->unloaded)
    return;
  unload_wait *u = berth_xcalloc(1, sizeof *u);
  u->c = c;
  c->unload = u;
  berth_store_sync(store_of(c), on_suspend_stored, u);
}

static berth_error *load_stored(lua_State *L, char **texts, size_t n, const char *state,
                                const char *run_id);

/* Builds the ctx of an unloaded conversation again from the store: its messages, and
 * its state as last stored (kept in C).  NULL, or why it could not. */
static berth_error *ctx_reload(berth_conv *c)
{
  berth_host *h = c->h;
  lua_State *L = h->L;
  char **texts = NULL;
  size_t n = 0;
  berth_error *e = berth_store_load_messages(store_of(c), c->sid, &texts, &n);
  if (e)
    return e;
  json_t *meta = c->metadata ? json_loads(c->metadata, 0, NULL) : NULL;
  push_ctx_new(L, c, json_is_object(meta) ? meta : NULL);
  json_decref(meta);
  int ctx = lua_gettop(L);
  lua_pushvalue(L, ctx);
  if ((e = load_stored(L, texts, n, c->state, c->run_id))) {
    lua_pop(L, 1);
    return e;
  }
  lua_getfield(L, ctx, "messages");
  c->stored_tbl = lua_topointer(L, -1);
  lua_pop(L, 1);
  c->stored_msgs = (uint32_t)n;
  c->ctx_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  c->unloaded = false;
  return NULL;
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
  store_save(c, false);
}

static void end_turn(berth_conv *c, bool cancelled)
{
  berth_host *h = c->h;
  berth_turn_info info = {c->turns, !c->turn_failed && !cancelled,
                          berth_clock() - c->turn->at, c->turn_cells, c->turn_cell_errors,
                          c->turn_refused};
  c->turn_refused = false;
  if (c->turn->ticket)
    c->turn->ticket->m = NULL;   /* (a message ended unstored by a shutdown) */
  free(c->turn);
  c->turn = NULL;
  store_save(c, true);
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
    if (info.refused)
      json_object_set_new(data, "refused", json_true());
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
    c->turn_refused = true;     /* nothing of it ran: a retry with its id runs it */
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
    berth_report_error(h, c, t->what, error, t->model_failed);
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
      if (store_save(c, true) && !h->draining)
        unload_when_stored(c);
      berth_emit(h, c, "suspend", NULL);
      break;
    case PH_COMPLETE:
      c->completed = true;
      h->st.completed++;
      store_save(c, true);
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

/* The hook call of a conversation whose ctx could not be loaded: fails with why. */
static int unloadable(lua_State *L)
{
  return luaL_error(L, "%s", lua_tostring(L, lua_upvalueindex(1)));
}

/* Starts hook `ph` with ctx.  A hook the script does not define runs as a no-op task,
 * still through the loop like a real one, so callers never re-enter. */
static void start_hook(berth_conv *c, phase ph)
{
  berth_host *h = c->h;
  lua_State *L = h->L;
  c->phase = ph;
  if (c->unloaded) {
    berth_error *e = ctx_reload(c);
    if (e) {
      /* the hook is not run: its call fails with the reason (the turn fails, the
       * conversation stays as stored, to be loaded at its next message) */
      lua_pushstring(L, e->message);
      lua_pushcclosure(L, unloadable, 1);
      lua_newtable(L);
      berth_error_free(e);
      c->task = berth_task_start(h, c, phase_hook[ph], 1, after_hook, c);
      return;
    }
  }
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
  if (c->queue && !c->queue->durable)
    return;                     /* woken by on_message_stored */
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
  berth_host *h = c->h;
  if (h->o.on_idle) {
    h->o.on_idle(h->o.idle_ud, c);   /* (may free c) */
    return;
  }
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
        store_save(c, true);
        berth_emit(h, c, "suspend", NULL);
        break;
      case PH_COMPLETE:
        c->completed = true;
        h->st.completed++;
        store_save(c, true);
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
  berth_conv *c = berth_xcalloc(1, sizeof *c);
  c->h = h;
  c->run_id = berth_xstrdup(run_id);
  c->user_id = user_id ? berth_xstrdup(user_id) : NULL;
  c->ud = ud;
  c->created_ms = berth_store_now_ms();
  if (metadata)
    c->metadata = json_dumps(metadata, JSON_COMPACT);
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

/* ctx.messages and ctx.state from stored JSON texts, run protected: [1] ctx, [2] the
 * texts (light userdata: char **), [3] their count, [4] the state text or nil. */
static int load_ctx(lua_State *L)
{
  char **texts = lua_touserdata(L, 2);
  lua_Integer n = lua_tointeger(L, 3);
  lua_getfield(L, 1, "messages");
  for (lua_Integer i = 0; i < n; i++) {
    json_error_t je;
    json_t *v = json_loads(texts[i], JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!v)
      return luaL_error(L, "stored message %d is not JSON: %s", (int)i, je.text);
    berth_json_push(L, v);
    json_decref(v);
    lua_rawseti(L, -2, i + 1);
  }
  lua_pop(L, 1);
  if (lua_isstring(L, 4)) {
    json_error_t je;
    json_t *v = json_loads(lua_tostring(L, 4), JSON_DECODE_ANY, &je);
    if (!v)
      return luaL_error(L, "the stored state is not JSON: %s", je.text);
    berth_json_push(L, v);
    json_decref(v);
    lua_setfield(L, 1, "state");
  }
  return 0;
}

/* Fills the ctx on top of the stack, which it pops, with the stored messages and state
 * (load_ctx, protected), and frees the texts.  NULL, or why the stored conversation
 * cannot be loaded (data_loss). */
static berth_error *load_stored(lua_State *L, char **texts, size_t n, const char *state,
                                const char *run_id)
{
  lua_pushcfunction(L, load_ctx);
  lua_insert(L, -2);
  lua_pushlightuserdata(L, texts);
  lua_pushinteger(L, (lua_Integer)n);
  if (state)
    lua_pushstring(L, state);
  else
    lua_pushnil(L);
  berth_error *e = NULL;
  if (lua_pcall(L, 4, 0, 0) != LUA_OK) {
    e = berth_error_new("data_loss", "the stored conversation %s cannot be loaded: %s",
                        run_id, lua_tostring(L, -1));
    lua_pop(L, 1);
  }
  berth_store_texts_free(texts, n);
  return e;
}

/* A stored conversation comes back as after an idle suspend: its history and state,
 * no sandbox (the first cell of its next turn reports freshSandbox). */
static berth_error *conv_resume(berth_host *h, const berth_store_conv *rec,
                                const berth_conv_options *o, berth_conv **out)
{
  if (strcmp(rec->caller ? rec->caller : "", o->caller ? o->caller : ""))
    return berth_error_new("exists", "a conversation with this id belongs to another "
                                     "caller");
  if (rec->status == BERTH_STORE_COMPLETED)
    return berth_error_new("completed", "the conversation %s was completed", rec->run_id);
  if (runid_taken(h, rec->run_id))
    return berth_error_new("exists", "a conversation with run id %s is open already",
                           rec->run_id);
  char **texts = NULL;
  size_t n = 0;
  berth_error *e = berth_store_load_messages(h->o.store, rec->id, &texts, &n);
  if (e)
    return e;
  /* Events may have been stored after the record was last written (a turn the host
   * died in): number on from the last one stored. */
  uint64_t last = rec->last_event;
  berth_store_event *ev = NULL;
  size_t nev = 0;
  e = berth_store_read_events(h->o.store, rec->id, last, 0, &ev, &nev);
  if (e) {
    berth_store_texts_free(texts, n);
    return e;
  }
  if (nev)
    last = ev[nev - 1].seq;
  berth_store_events_free(ev, nev);
  json_t *meta = rec->metadata ? json_loads(rec->metadata, 0, NULL) : NULL;
  berth_conv *c = conv_create(h, rec->run_id, rec->owner, json_is_object(meta) ? meta : NULL,
                              o->ud);
  json_decref(meta);
  c->sid = berth_xstrdup(rec->id);
  c->caller = berth_xstrdup(rec->caller ? rec->caller : "");
  c->created_ms = rec->created_ms;
  c->turns = c->accepted = rec->turns;
  c->last_event = last;
  c->suspended = true;
  lua_State *L = h->L;
  berth_conv_push_ctx(L, c);
  if ((e = load_stored(L, texts, n, rec->state, rec->run_id))) {
    berth_conv_free(c);
    return e;
  }
  c->stored_msgs = (uint32_t)n;
  c->state = rec->state ? berth_xstrdup(rec->state) : NULL;
  berth_conv_push_ctx(L, c);
  lua_getfield(L, -1, "messages");
  c->stored_tbl = lua_topointer(L, -1);
  lua_pop(L, 2);
  berth_log(h, BERTH_LOG_DEBUG, "conversation %s resumed from the store (%zu messages, %u "
            "turns)", c->run_id, n, c->turns);
  *out = c;
  return NULL;
}

/* What is live fills the Lua state: new work would only fail at its cap, each failure
 * after an emergency collection of the whole state, so it is refused up front. */
static berth_error *memory_refusal(berth_host *h, const char *what)
{
  h->st.capacity_refusals++;
  berth_count_error(h, "host", "capacity");
  return berth_error_new("capacity", "the Lua state's live data fills %zu of its %zu MiB "
                                     "cap, so it takes no new %s; complete conversations, "
                                     "keep them in a store (which unloads idle ones) or "
                                     "raise the cap", h->mem.used >> 20, h->mem.limit >> 20,
                         what);
}

berth_error *berth_conv_open(berth_host *h, const berth_conv_options *o, berth_conv **out)
{
  *out = NULL;
  berth_conv_options none = {NULL, NULL, NULL, NULL, NULL, NULL};
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
  if (berth_host_memory_full(h))
    return memory_refusal(h, "conversations");
  if (o->metadata && !json_is_object(o->metadata))
    return berth_error_new("invalid_argument", "a conversation's metadata must be a JSON "
                                               "object");
  if (h->o.store) {
    const char *key = o->store_id ? o->store_id : o->run_id;
    if (key) {
      berth_store_conv rec;
      bool found = false;
      berth_error *e = berth_store_get_conv(h->o.store, key, &rec, &found);
      if (e)
        return e;
      if (found) {
        e = conv_resume(h, &rec, o, out);
        berth_store_conv_clear(&rec);
        return e;
      }
    }
  }
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
  if (h->o.store && !o->run_id) {
    /* Generated run ids must not meet those of stored conversations (a run id is a
     * sandbox key): random, not counted from 1 again after a restart. */
    unsigned char r[6];
    do {
      if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
        return berth_error_new("unavailable", "no random bytes for a run id");
      snprintf(gen, sizeof gen, "conv-%02x%02x%02x%02x%02x%02x", r[0], r[1], r[2], r[3],
               r[4], r[5]);
    } while (runid_taken(h, gen));
    run_id = gen;
  }
  berth_conv *c = conv_create(h, run_id, o->user_id, o->metadata, o->ud);
  if (h->o.store) {
    c->sid = berth_xstrdup(o->store_id ? o->store_id : run_id);
    c->caller = berth_xstrdup(o->caller ? o->caller : "");
    store_save(c, true);
  }
  *out = c;
  return NULL;
}

berth_conv *berth_conv_new(berth_host *h, const char *run_id, const char *user_id)
{
  if (h->draining)
    return NULL;
  return conv_create(h, run_id, user_id, NULL, NULL);
}

static berth_error *conv_message(berth_conv *c, const char *message,
                                 const char *message_id,
                                 void (*stored)(void *ud, berth_conv *c,
                                                const berth_error *err),
                                 void *ud, bool *sync_stored);

berth_error *berth_conv_message(berth_conv *c, const char *message)
{
  bool sync = false;
  return conv_message(c, message, NULL, NULL, NULL, &sync);
}

berth_error *berth_conv_message_durable(berth_conv *c, const char *message,
                                        void (*stored)(void *ud, berth_conv *c,
                                                       const berth_error *err),
                                        void *ud)
{
  return berth_conv_message_keyed(c, message, NULL, stored, ud);
}

berth_error *berth_conv_message_keyed(berth_conv *c, const char *message,
                                      const char *message_id,
                                      void (*stored)(void *ud, berth_conv *c,
                                                     const berth_error *err),
                                      void *ud)
{
  bool sync = false;
  berth_error *e = conv_message(c, message, message_id, stored, ud, &sync);
  if (!e && sync && stored)
    stored(ud, c, NULL);
  return e;
}

uint64_t berth_conv_last_event(const berth_conv *c) { return c->last_event; }

void berth_conv_forget_sandbox(berth_conv *c)
{
  berth_host *h = c->h;
  if (!h->sandboxes)
    return;
  const char *owner = c->user_id ? c->user_id : berth_owner_get(h, c->run_id);
  plm_key key = {owner, c->run_id};
  plm_error *e = plm_sandboxes_dispose(h->sandboxes, &key, NULL, NULL);
  plm_error_free(e);            /* (no such sandbox here: nothing to forget) */
  free(c->warmed);
  c->warmed = NULL;
}

static berth_error *conv_message(berth_conv *c, const char *message,
                                 const char *message_id,
                                 void (*stored)(void *ud, berth_conv *c,
                                                const berth_error *err),
                                 void *ud, bool *sync_stored)
{
  berth_host *h = c->h;
  if (!message)
    return berth_error_new("invalid_argument", "the message is NULL");
  /* (what a model, a store and a stream all need: JSON text is UTF-8) */
  if (!plm_utf8_valid(message, strlen(message)))
    return berth_error_new("invalid_argument", "the message is not UTF-8 text");
  if (message_id && !plm_utf8_valid(message_id, strlen(message_id)))
    return berth_error_new("invalid_argument", "the message id is not UTF-8 text");
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
  if (berth_host_memory_full(h))
    return memory_refusal(h, "messages");
  if (store_of(c) && berth_store_failing(store_of(c))) {
    /* Nothing new is queued while the store fails: refused messages would each keep
     * their writes in memory until it comes back (issue 13). */
    berth_count_error(h, "store", "unavailable");
    return berth_error_new("unavailable", "the store cannot be written now, so the "
                                          "message was not taken; retry later");
  }
  size_t n = strlen(message);
  msg *m = berth_xmalloc(sizeof *m + n + 1);
  m->next = NULL;
  m->at = berth_clock();
  m->durable = true;
  m->ticket = NULL;
  memcpy(m->text, message, n + 1);
  if (c->queue_tail)
    c->queue_tail->next = m;
  else
    c->queue = m;
  c->queue_tail = m;
  h->queued++;
  c->accepted++;
  berth_store *st = store_of(c);
  if (st) {
    /* The message is durable before its turn starts (and before the face tells its
     * sender it was taken): the "user" event, the record naming its turn as the one
     * left unfinished should the host die, then a sync. */
    m->durable = false;
    json_t *data = json_pack("{s:s}", "text", message);
    /* the id is indexed as the event holds it: one that is not UTF-8 (a raw
     * Idempotency-Key) is in neither */
    json_t *mid = message_id ? json_string(message_id) : NULL;
    if (mid)
      json_object_set_new(data, "messageId", mid);
    record_event(c, "user", data, mid ? message_id : NULL);
    json_decref(data);
    store_save(c, false);
    ticket *t = berth_xcalloc(1, sizeof *t);
    t->c = c;
    t->m = m;
    t->stored = stored;
    t->ud = ud;
    t->turn = c->accepted;
    m->ticket = t;
    berth_store_sync(st, on_message_stored, t);
  } else
    *sync_stored = true;
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

bool berth_conv_cancel_turn(berth_conv *c, const char *why)
{
  if (!c->task || (c->phase != PH_TURN_START && c->phase != PH_TURN))
    return false;
  phase ph = c->phase;
  berth_task *t = c->task;
  c->task = NULL;
  c->phase = PH_NONE;
  berth_task_kill(t);           /* its calls are cancelled (their ops orphaned) */
  host_error(c, phase_hook[ph], "cancelled", why ? why : "the turn was cancelled");
  c->turn_failed = true;
  end_turn(c, true);
  pump(c);
  return true;
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

void berth_conv_set_cell_timing(berth_conv *c, const berth_cell_timing *t)
{
  c->cell_timing = *t;
  c->has_cell_timing = true;
}

bool berth_conv_take_cell_timing(berth_conv *c, berth_cell_timing *out)
{
  if (!c->has_cell_timing)
    return false;
  *out = c->cell_timing;
  c->has_cell_timing = false;
  return true;
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
  c->warmed = berth_xstrdup(run_id);
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
  if (c->unload)
    c->unload->c = NULL;
  luaL_unref(h->L, LUA_REGISTRYINDEX, c->ctx_ref);
  h->mem.released = true;
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
    if (m->ticket) {
      m->ticket->m = NULL;
      m->ticket->c = NULL;
    }
    free(m);
  }
  if (c->turn && c->turn->ticket) {
    c->turn->ticket->m = NULL;
    c->turn->ticket->c = NULL;
  }
  free(c->turn);
  free(c->run_id);
  free(c->user_id);
  free(c->warmed);
  free(c->sid);
  free(c->caller);
  free(c->metadata);
  free(c->state);
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

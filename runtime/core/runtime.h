/*
 * runtime.h — what the files of runtime/ share.  Not installed; berth.h is public.
 *
 *   host.c     the state, hook tasks (coroutines), operations that tasks wait on, the
 *              run queue, loading and reloading scripts
 *   contain.c  memory cap, instruction budget, restricted environment, coroutine.*
 *              replacements that let host yields through user coroutines
 *   natives.c  sandbox.*, model.chat, log, sleep, now
 *   strmatch.c string.find/match/gmatch/gsub with a step count; bounded rep, move
 *   agent.c    conversations: turns, idle suspend, completion, ctx
 *   jsonlua.c  JSON <-> Lua
 *   stats.c    counters, error classes, latency histograms, Prometheus text
 *   embed.c    error values, the latency clock, berth_host_open, berth_model_open
 * and, for the berth command only: cli.c, daemon.c, transcript.c, serve.c (cli.h).
 */
#ifndef BERTH_RUNTIME_H
#define BERTH_RUNTIME_H

#include <ev.h>
#include <lauxlib.h>
#include <lua.h>

#include "berth.h"
#include "embed.h"                /* berth_error_new, berth_clock */
#include "model.h"
#include "plimsoll_sandboxes.h"
#include "idmap.h"                /* lib/: the one id hash table */

typedef struct berth_task berth_task;
typedef struct berth_op berth_op;

/* {====================================================== containment */

typedef struct berth_mem {
  size_t used, limit;            /* bytes; limit 0 = none */
  size_t peak;
  size_t after_gc;               /* in use after the last collection task_end forced */
  uint64_t collections;          /* how many task_end forced (tests read it) */
  bool gc_idle;                  /* the last of those freed under a 32nd of the cap */
  bool refused;                  /* an allocation was refused at the cap since */
  bool released;                 /* a conversation's ctx was dropped since */
  size_t grown;                  /* bytes allocated since (growth only) */
  bool enforce;                  /* only while Lua code of a task runs */
} berth_mem;

void *berth_alloc(void *ud, void *ptr, size_t osize, size_t nsize);
/* Whether what is live in the Lua state fills 15/16 of its cap, so that new conversations
 * and messages are refused ("capacity").  Known from the last forced collection, or a
 * new one when a 32nd of the cap was allocated or a conversation dropped since. */
bool berth_host_memory_full(berth_host *h);
/* Arms the instruction-budget hook on thread co for the current task. */
void berth_budget_arm(berth_host *h, lua_State *co);
/* C code of a hook call did `steps` units of work (pattern-matcher steps, table
 * slots): charged to the instruction budget, and the wall clock of the resumption is
 * checked; raises (and keeps raising on every line) once either is over. */
void berth_charge(lua_State *L, long long steps);
/* An event a hook emits: counted against the call's event bound, and its bytes
 * against the memory cap; raises when over. */
void berth_charge_event(lua_State *L, const json_t *data);
/* string.find/match/gmatch/gsub with a step count (strmatch.c), string.rep and
 * table.move that cannot loop in C unbounded. */
void berth_open_bounded(lua_State *L);
/* Removes what the restricted environment does not allow and wraps what it limits
 * (io.open read-only inside the scripts directory, load text-only, …). */
void berth_restrict(lua_State *L, const char *scripts_dir);
/* Replaces coroutine.create/resume/wrap so a host yield (a native waiting) inside a
 * user coroutine is passed through to the host instead of to the user's resume. */
void berth_open_coroutine(lua_State *L);
/* The tag a waiting native yields (its address). */
extern const char berth_host_yield_tag;

/* }====================================================== */

/* {====================================================== tasks and operations */

typedef void (*berth_task_done_fn)(void *ud, berth_task *t, bool ok, const char *error);

struct berth_task {
  bool model_failed;             /* a model.chat of this call failed: its error is the model's */
  berth_host *h;
  berth_conv *conv;              /* NULL outside a conversation */
  char *what;                    /* "onTurn", a file name: for messages */
  lua_State *co;
  int ref;                       /* registry anchor of co */
  long long budget;              /* instructions left; < 0: none */
  bool spent;                    /* a limit ran out: error on every line */
  int stop;                      /* which (contain.c) */
  double started, resumed;       /* berth_clock(): the call's start, this resumption's */
  size_t events, event_bytes;    /* emitted by this call */
  ev_timer deadline;             /* the call's deadline (h->hook_deadline) */
  berth_op *op;                  /* what it waits for now */
  berth_op *owned;               /* ops it started that may still complete */
  bool queued;                   /* in the run queue */
  int start_nargs;               /* arguments of the first resume */
  berth_task *next_ready;
  berth_task_done_fn done;
  void *ud;
  berth_task *prev, *next;       /* all tasks of the host */
};

typedef struct berth_op_class {
  const char *name;              /* metatable name */
  /* The waiting task is gone: stop what can be stopped.  Completion may still come. */
  void (*cancel)(berth_op *op);
  /* Frees C resources held by the op; idempotent (also run by __gc). */
  void (*release)(berth_op *op);
} berth_op_class;

/* An operation a task waits on: a full userdata (so Lua's GC frees it and whatever it
 * holds, even if a conversion raises), anchored in the registry while it waits. */
struct berth_op {
  const berth_op_class *cls;
  berth_host *h;
  berth_task *task;              /* the task that owns it; NULL once orphaned */
  berth_op *prev_owned, *next_owned; /* the owning task's ops */
  bool done;
  int anchor;                    /* registry ref until the result is taken */
};

/* Pushes a new op userdata of `size` bytes (a struct starting with berth_op), owned by
 * the running task and anchored until done.  Raises, before anything starts, when the
 * caller cannot wait (no hook call runs, or across a C-call boundary). */
void *berth_op_push(lua_State *L, size_t size, const berth_op_class *cls);
/* The operation could not start: forget the op (the GC releases it). */
void berth_op_drop(berth_op *op);
/* Yields the running task until the op is woken; `k` then runs with ctx.  Never
 * raises. */
int berth_op_wait(lua_State *L, berth_op *op, lua_KContext ctx, lua_KFunction k);
/* From a C completion: the op is done; its task is queued (or, orphaned, the op is
 * released). */
void berth_op_finish(berth_op *op);
/* Gives the op up: nobody will read its result (cancelled if still running). */
void berth_op_abandon(berth_op *op);
/* Queues the owning task if it waits on this op (a delta, or completion). */
void berth_op_wake(berth_op *op);
/* First thing in a continuation: the task no longer waits; a done op is unanchored
 * (it stays alive on the coroutine's stack while its result is converted). */
void berth_op_resumed(lua_State *L, berth_op *op);

berth_host *berth_host_of(lua_State *L);
berth_task *berth_current_task(berth_host *h);
/* Makes the function at h->L's stack top - nargs - 1 with nargs arguments (both
 * popped) a task, queued to start on the next loop iteration (so `done` never runs
 * before this returns).  Returns it. */
berth_task *berth_task_start(berth_host *h, berth_conv *conv, const char *what, int nargs,
                             berth_task_done_fn done, void *ud);
/* Ends a task without running it further; its done callback is not called. */
void berth_task_kill(berth_task *t);

/* }====================================================== */

/* {====================================================== the host */

/* Counters behind berth_host_stats and berth_host_metrics. */
typedef struct berth_errclass {
  struct berth_errclass *next;
  const char *source;            /* "cell", "hook", "host" */
  uint64_t n;
  char cls[];
} berth_errclass;

typedef struct berth_counters {
  uint64_t opened, completed;
  uint64_t turns_started, turns_ended, turns_failed, turns_cancelled;
  uint64_t model_calls;          /* model.chat calls answered (a reply or a failure) */
  uint64_t cells, cell_errors, capacity_refusals;
  berth_hist turn_seconds, cell_seconds;
  berth_errclass *classes;
} berth_counters;

void berth_hist_add(berth_hist *hist, double seconds);
void berth_count_error(berth_host *h, const char *source, const char *cls);
void berth_counters_free(berth_counters *st);

typedef struct berth_owner {     /* run id -> owner, recorded by sandbox.warm (H01) */
  char *run_id, *owner;
  plm_idmap_node node;           /* in h->owners, under run_id */
} berth_owner;

struct berth_host {
  berth_options o;               /* strings below are copies */
  struct ev_loop *loop;
  lua_State *L;
  berth_mem mem;
  double hook_time_limit, hook_deadline; /* resolved berth_options; 0: none */
  size_t max_events;
  char *hooks_file, *scripts_dir, *lib_dir;
  int hooks_ref;                 /* the hooks table */
  int loaded_base_ref;           /* package.loaded as it was before any script */
  plm_client *client;
  plm_sandboxes *sandboxes;
  json_t *tool;                  /* sandbox.tool()'s value, made at its first call */
  char *env_error;               /* why there are no sandboxes, when there are none */
  berth_model *model;
  plm_idmap owners;              /* berth_owner by run id (lib/idmap.h) */
  berth_task *tasks, *current;
  void (*file_done)(void *ud, int status);   /* berth_run_file's, and its ud */
  void *file_ud;
  berth_task load_task;          /* budget of a script's top level */
  berth_task *ready, *ready_tail;
  ev_timer runq;
  ev_signal sighup;
  berth_conv *convs;
  unsigned errors;
  unsigned inflight;             /* library operations started and not yet called back */
  struct { void (*fn)(void *ud); void *ud; bool active; } shutdown;
  /* many conversations (agent.c) */
  size_t n_convs;
  uint64_t conv_seq;             /* for generated run ids */
  plm_idmap runids;              /* berth_conv by run id (agent.c): in C, so that the
                                    conversations held cost the collector nothing */
  size_t turns_running;          /* turn slots taken */
  size_t queued;                 /* messages accepted, not started */
  berth_conv *slot_head, *slot_tail; /* conversations waiting for a turn slot */
  bool draining;                 /* berth_host_shutdown was called */
  bool disposing;                /* ... and dispose_all started */
  ev_timer grace;                /* running hooks are cancelled when it fires */
  double grace_deadline;         /* berth_clock() */
  berth_counters st;
};

void berth_log(berth_host *h, berth_log_level level, const char *fmt, ...)
  __attribute__((format(printf, 3, 4)));
void berth_emit(berth_host *h, berth_conv *c, const char *kind, const json_t *data);
/* A hook failed: logged with its traceback, counted, sent as an "error" event. */
void berth_report_error(berth_host *h, berth_conv *c, const char *hook, const char *error,
                        bool model_failed);

/* natives.c */
void berth_open_natives(lua_State *L);
const char *berth_owner_get(berth_host *h, const char *run_id);
/* Frees every recorded owner (berth_host_free). */
void berth_owners_free(berth_host *h);

/* agent.c: the conversation a task belongs to, for natives. */
const char *berth_conv_warmed_run_id(const berth_conv *c);
void berth_conv_set_warmed(berth_conv *c, const char *run_id);
/* Pushes the conversation's ctx table. */
void berth_conv_push_ctx(lua_State *L, berth_conv *c);
void berth_conv_kill_all(berth_host *h);
/* An executeCode call of the conversation's running turn answered. */
void berth_conv_cell_done(berth_conv *c, bool ok);
/* ... and where its time went (berth_conv_take_cell_timing). */
void berth_conv_set_cell_timing(berth_conv *c, const berth_cell_timing *t);
/* Shutdown (host.c drives it): refuse new work, end queued messages, stop idle
 * timers; cancel every running hook call; whether any conversation runs a hook. */
void berth_conv_drain_all(berth_host *h);
void berth_conv_cancel_all(berth_host *h);
bool berth_conv_any_running(const berth_host *h);
/* From agent.c when a hook call of a conversation ends during a shutdown. */
void berth_host_drain_check(berth_host *h);

/* }====================================================== */

#endif

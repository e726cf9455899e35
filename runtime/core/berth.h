/*
 * berth.h — the berth host: Lua 5.4 hook scripts driving chat agents whose code runs
 * in verified plimsoll sandboxes (libplimsoll, plimsoll_sandboxes.h).  Link with
 * libberth, libplimsoll, Lua 5.4, jansson, libcurl, OpenSSL, libev (and
 * libmicrohttpd for `berth serve`).
 *
 * Model:
 *   - One host = one lua_State on one caller-supplied libev loop.  Every hook call
 *     (onTurnStart, onTurn, onSuspend, onComplete, or a file run by berth_run_file) is
 *     a coroutine; natives that wait (sandbox.executeCode, sandbox.dispose,
 *     model.chat, sleep) yield it and the loop resumes it when the wait is over.
 *   - ONE LOOP THREAD: a host and everything it owns (conversations, the model, the
 *     sandbox layer) must be used only from the thread that runs its loop, and every
 *     callback below runs on that thread, from the loop.  Nothing here is
 *     thread-safe; to feed a host from other threads, hand work to the loop thread
 *     (ev_async).  No global state: any number of hosts may live in one process, each
 *     on its own loop (call plm_global_init() once per process first).
 *   - Hooks are contained: an instruction budget per hook call, a memory cap for the
 *     state, a restricted global environment.  A failing hook is logged with its
 *     traceback and reported to its conversation as an error; the host and the other
 *     conversations go on.
 *   - A conversation (berth_conv) follows Trigger.dev's chat-agent life cycle
 *     (docs/architecture.md §3): each message runs onTurnStart then onTurn; after the idle
 *     timeout without a message it suspends (onSuspend); berth_conv_complete runs
 *     onComplete.  Messages that arrive while a turn runs wait their turn.
 *   - Many conversations: an idle conversation costs its small C record and its ctx
 *     table (its message history) — no coroutine, no sandbox once suspended.  Limits
 *     (berth_options) bound conversations, turns running at once (others queue, in
 *     arrival order) and queued messages; what is over a limit is refused with a
 *     "capacity" error and changes nothing.
 *   - Errors are values: functions that can fail return a berth_error (NULL on
 *     success) with a short stable code and a message a person can act on; the
 *     caller frees it with berth_error_free.  Older int-returning calls are kept.
 */
#ifndef BERTH_H
#define BERTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BERTH_VERSION "0.1.0"

struct ev_loop;
struct lua_State;
typedef struct berth_host berth_host;
typedef struct berth_conv berth_conv;
typedef struct berth_model berth_model;     /* model.h */
typedef struct berth_store berth_store;     /* store/store.h */

/* ---------------------------------------------------------------- errors */

/* An error value.  `code` is a static string, one of:
 *   "invalid_argument"  the call was malformed (a NULL message, a bad option)
 *   "capacity"          a limit was reached (conversations, queued messages, the Lua
 *                       state's live data filling its memory cap); retry later
 *   "shutting_down"     the host is shutting down and takes no new work
 *   "completed"         the conversation is completing or completed
 *   "exists"            a conversation with this run id is open already
 *   "hook"              a hook failed (events only)
 *   "cancelled"         the turn was cancelled by the host's shutdown (events only)
 *   "unavailable"       a model could not be set up; or the store cannot be written
 *                       now, so a message was not taken (retry later)
 * and in tool results the sandbox layer's codes ("environment", "data_loss", …). */
typedef struct berth_error {
  const char *code;
  char *message;
} berth_error;

void berth_error_free(berth_error *e);

/* ---------------------------------------------------------------- events */

typedef enum berth_log_level {
  BERTH_LOG_DEBUG, BERTH_LOG_INFO, BERTH_LOG_WARN, BERTH_LOG_ERROR
} berth_log_level;

typedef void (*berth_log_fn)(void *ud, berth_log_level level, const char *message);

/* A conversation event, for a face (terminal, replay transcript, SSE) to show.  Kinds
 * the host emits: "user" (string), "error" ({hook, message, code}), "turnEnd" ({turn,
 * ok, seconds, cells}), "suspend", "resume", "complete".  Kinds the default hooks emit
 * with ctx:emit / ctx:say: "assistant" (string), "delta" (string), "toolCall" (the
 * model's call: {id, type, function = {name, arguments}}), "toolResult" ({id, result}
 * or {id, error, code}).  `data` is borrowed for the duration of the call; it may be
 * NULL.  The callback may send, suspend or complete, but must not free the
 * conversation or the host. */
typedef void (*berth_event_fn)(void *ud, berth_conv *conv, const char *kind,
                               const json_t *data);

/* What berth_callbacks.on_turn_end reports. */
typedef struct berth_turn_info {
  unsigned turn;                 /* 1 for the conversation's first turn */
  bool ok;                       /* no hook of the turn failed, it was not cancelled */
  double seconds;                /* from berth_conv_message to the end (queueing too) */
  unsigned cells;                /* executeCode calls that answered during the turn */
  unsigned cell_errors;          /* of those, the ones that failed (infrastructure) */
  bool refused;                  /* its message was never taken (a shutdown came before
                                  * it started): nothing ran, a retry may run it */
} berth_turn_info;

/* Typed callbacks, in the order they come for a turn:
 *   on_turn_start (the message) → [on_delta … on_message] → on_tool_call →
 *   on_tool_result → … → on_turn_end;
 * on_error may come anywhere (a hook failed; then on_turn_end has ok false).
 * on_suspended after onSuspend ran, on_completed after onComplete ran.
 * Each is optional; all get `ud` and the conversation (berth_conv_userdata(conv)
 * gives the caller's per-conversation pointer).  Strings and JSON are borrowed for
 * the duration of the call.  The same rules as berth_event_fn hold: a callback may
 * send, suspend or complete, but must not free the conversation or the host. */
typedef struct berth_callbacks {
  void (*on_turn_start)(void *ud, berth_conv *c, const char *message);
  /* A piece of the assistant's text as the model streams it. */
  void (*on_delta)(void *ud, berth_conv *c, const char *text, size_t len);
  /* The assistant's whole text for one model step (after its deltas). */
  void (*on_message)(void *ud, berth_conv *c, const char *text, size_t len);
  /* A tool call starts: its id, the tool's name, its arguments (JSON text). */
  void (*on_tool_call)(void *ud, berth_conv *c, const char *id, const char *name,
                       const char *arguments);
  /* Its result: exactly one of `result` (the tool result object the model sees) and
   * `err` (an infrastructure failure: code and message) is non-NULL. */
  void (*on_tool_result)(void *ud, berth_conv *c, const char *id, const json_t *result,
                         const berth_error *err);
  void (*on_turn_end)(void *ud, berth_conv *c, const berth_turn_info *info);
  void (*on_suspended)(void *ud, berth_conv *c);
  void (*on_completed)(void *ud, berth_conv *c);
  void (*on_error)(void *ud, berth_conv *c, const berth_error *err);
  void *ud;
} berth_callbacks;

/* ---------------------------------------------------------------- the host */

typedef struct berth_options {
  struct ev_loop *loop;          /* required */
  const char *hooks_file;        /* Lua file returning the hooks table; NULL: none */
  /* Searched first by require; the only directory restricted hooks may read.  NULL:
   * the hooks file's directory (or the working directory without one). */
  const char *scripts_dir;
  const char *lib_dir;           /* also searched by require (the shipped scripts) */
  bool unrestricted;             /* full standard library (berth lua); default off */
  size_t memory_limit;           /* bytes for the Lua state; 0 = none (256 MiB) */
  long long instruction_budget;  /* per hook call; 0 = none (default 200 000 000) */
  /* Hook calls, also while they run C (pattern matching, natives).  hook_time_limit:
   * seconds one resumption of a hook call may run before it fails (0 = 5); hook_deadline:
   * seconds a hook call may take in all, its waits included — a sleep past it is
   * refused, a call still waiting then is ended (0 = 1800); max_events: events one hook
   * call may emit (0 = 50 000), their bytes counted against memory_limit.  < 0 (for
   * the doubles): none.  An unrestricted host (berth lua) has no time limits by default. */
  double hook_time_limit, hook_deadline;
  size_t max_events;
  double idle_timeout;           /* seconds before a quiet conversation suspends (30) */
  /* When set, the idle timeout does not suspend by itself: on_idle(idle_ud, c) is
   * told, and decides — berth_conv_suspend now or later, or berth_conv_free.  For a
   * host sharing its store with others (berth serve's leases): it takes the lease
   * first, so that a copy another host ran turns of since is dropped, never
   * suspended with stale state.  The rules of berth_callbacks hold, except that it
   * may free the conversation it is given.  NULL: the conversation suspends. */
  void (*on_idle)(void *ud, berth_conv *c);
  void *idle_ud;
  /* The plimsoll daemon.  A NULL url leaves the sandbox natives answering
   * "Nothing ran (environment): …". */
  const char *daemon_url, *daemon_token;
  /* The floor.  NULL: "container" for a daemon over cleartext http (which the client
   * allows only to loopback: a daemon on this machine), else "kernel" (https) — the
   * rule of the berth command and of the stock-Lua module too. */
  const char *minimum_isolation;
  int64_t timeout_ms;            /* per executeCode call; <= 0: the daemon's default */
  berth_model *model;            /* borrowed; NULL: model.chat answers nil, msg */
  berth_event_fn on_event;       /* every event, as JSON (may be NULL) */
  void *event_ud;
  berth_callbacks callbacks;     /* typed callbacks (each may be NULL) */
  berth_log_fn log;              /* NULL: "berth: …" lines on stderr */
  void *log_ud;
  bool handle_sighup;            /* SIGHUP reloads hooks_file */
  /* Limits; 0 = none.  max_conversations bounds berth_conv_open; max_concurrent_turns
   * bounds turns running at once (more wait, first come first served);
   * max_queued_messages bounds messages accepted and not yet started, host-wide;
   * max_sandboxes and max_sandboxes_per_owner are the sandbox layer's caps (idle
   * sandboxes are closed least recently used first; "capacity" when all are busy;
   * per owner the layer's default is 3). */
  size_t max_conversations;
  size_t max_concurrent_turns;
  size_t max_queued_messages;
  int max_sandboxes;
  int max_sandboxes_per_owner;   /* 0: the layer's default (3); < 0: no cap */
  /* berth_host_shutdown lets running turns finish for this long, then cancels them
   * (seconds; 0 = the default, 10; < 0 = cancel at once). */
  double shutdown_grace;
  /* Where conversations are kept (berth_store_open: "memory", "sqlite:PATH"); borrowed,
   * free it after the host.  NULL: nowhere (they live as long as the host).  With a
   * store, every conversation's record, message history (ctx.messages), hook state
   * (ctx.state) and events are written to it, and berth_conv_open with the id of a
   * stored conversation resumes it (history and state loaded, a fresh sandbox). */
  berth_store *store;
} berth_options;

void berth_options_init(berth_options *o);
/* Grows this process's descriptor table now, to hold its descriptor limit
 * (RLIMIT_NOFILE's soft value) but at most BERTH_RESERVED_DESCRIPTORS; returns how many
 * it holds for sure now (0: not grown).  The kernel grows the table by doubling as
 * descriptors are opened, and in a process with more than one thread each doubling
 * stalls the thread that opened the descriptor for an RCU grace period (10-15 ms on
 * the project's VM): a host's loop, opening connections to the daemon.  berth_host_new
 * calls it; a program with threads of its own does best to call it (after raising its
 * limit) before it starts them.  The table never shrinks.  Any thread. */
unsigned long berth_reserve_descriptors(void);
/* 4 096 connections in and as many out, twice over: a table of 128 KiB of the kernel's
 * memory. */
#define BERTH_RESERVED_DESCRIPTORS 16384ul
/* Creates the host and loads the hooks file.  Returns 0, or -1 with *err (malloc'd). */
int berth_host_new(const berth_options *o, berth_host **out, char **err);
/* The same, with the error as a value. */
berth_error *berth_host_open(const berth_options *o, berth_host **out);
/* Loads the hooks file again; on any error the old hooks stay and -1 is returned
 * (the reason is logged).  Hook calls already running finish on the old code. */
int berth_host_reload(berth_host *h);
/* Shuts the host down, gracefully: from now on new conversations and messages are
 * refused ("shutting_down"); messages not started yet end at once (turn start, an
 * error "shutting_down", turn end); running turns and hooks get
 * options.shutdown_grace to finish, after which they are cancelled (an error
 * "cancelled", then turn end — their daemon calls are cancelled too); idle timers
 * stop; then every sandbox is disposed (plm_sandboxes_dispose_all) and `done` runs
 * from the loop once every close settled.  Conversations stay allocated (free them,
 * or let berth_host_free).  During a shutdown, a berth_conv_complete `done` callback
 * may free its own conversation, no other.  Called again while it runs, the new
 * `done` replaces the first; after it finished, it disposes again and calls `done`.
 * Call before berth_host_free when a daemon is configured. */
void berth_host_shutdown(berth_host *h, void (*done)(void *ud), void *ud);
bool berth_host_shutting_down(const berth_host *h);
/* Ends running hook calls (without running their remaining code) and frees all. */
void berth_host_free(berth_host *h);
struct lua_State *berth_host_lua(berth_host *h);
struct ev_loop *berth_host_loop(berth_host *h);
/* Hook errors reported so far (each also logged and sent as an "error" event). */
unsigned berth_host_errors(const berth_host *h);

/* ---------------------------------------------------------------- statistics */

#define BERTH_HIST_BUCKETS 16

/* A latency histogram: counts per bucket (not cumulative); bucket i holds values
 * <= berth_hist_bound(i), the last one the rest (+Inf). */
typedef struct berth_hist {
  uint64_t count;
  double sum;                    /* seconds */
  uint64_t buckets[BERTH_HIST_BUCKETS];
} berth_hist;

/* The upper bound of bucket i in seconds (INFINITY for the last). */
double berth_hist_bound(int i);
/* The q-quantile (0..1) estimated from the buckets (the bucket's upper bound). */
double berth_hist_quantile(const berth_hist *hist, double q);

typedef struct berth_stats {
  uint64_t conversations;        /* open now */
  uint64_t conversations_opened, conversations_completed;
  uint64_t turns_started, turns_ended, turns_failed, turns_cancelled;
  uint64_t turns_running;        /* holding a slot now */
  uint64_t messages_queued;      /* accepted, not started */
  uint64_t cells, cell_errors;   /* executeCode calls answered; of those failed */
  uint64_t hook_errors;
  uint64_t capacity_refusals;    /* conversations or messages refused at a limit */
  uint64_t sandboxes;            /* held by the sandbox layer now */
  uint64_t lua_bytes;            /* the Lua state's memory now */
  berth_hist turn_seconds;       /* message accepted → turn end */
  berth_hist cell_seconds;       /* executeCode call → answer */
} berth_stats;

void berth_host_stats(const berth_host *h, berth_stats *out);
/* Calls fn for each class of error counted so far: source "cell" (executeCode
 * failures by code: "capacity", "data_loss", …), "hook" (class "hook"), "host"
 * (classes "capacity", "cancelled", "shutting_down"), "model" (its error codes) and
 * "store" (a failed write transaction or read, by code; a message refused while the
 * store fails). */
void berth_host_error_classes(const berth_host *h,
                              void (*fn)(void *ud, const char *source, const char *cls,
                                         uint64_t n),
                              void *ud);
/* The statistics in the Prometheus text format (version 0.0.4), metric names
 * prefixed "berth_".  malloc'd. */
char *berth_host_metrics(const berth_host *h);

/* ---------------------------------------------------------------- conversations */

typedef struct berth_conv_options {
  /* The run id (the sandbox key, ctx.runId; it appears in log lines).  NULL: a new
   * one, "conv-<n>".  Must be unique among the host's open conversations. */
  const char *run_id;
  /* The owner the server authenticated (ctx.userId; the sandbox's owner when the
   * hooks warm with it).  NULL: none. */
  const char *user_id;
  /* Data for the hooks (ctx.metadata), a JSON object (borrowed; copied).  NULL: none. */
  const json_t *metadata;
  void *ud;                      /* berth_conv_userdata */
  /* With a store (berth_options.store): the conversation's durable id (NULL: the run
   * id) and who may see it (NULL: "").  When the store holds a conversation with this
   * id, it is resumed as after an idle suspend — run id, owner, metadata, ctx.messages
   * and ctx.state from the store, a fresh sandbox at its next message — and run_id,
   * user_id and metadata above are ignored; "completed" if it was completed, "exists"
   * if another caller's. */
  const char *store_id;
  const char *caller;
} berth_conv_options;

/* Opens a conversation.  Errors: "capacity" (max_conversations, or live data filling
 * the memory cap), "shutting_down", "exists" (the run id is taken), "invalid_argument". */
berth_error *berth_conv_open(berth_host *h, const berth_conv_options *o, berth_conv **out);
/* A conversation identified by its run id (the sandbox key); user_id (optional) is the
 * owner the server authenticated, handed to hooks as ctx.userId.  No limits apply;
 * NULL only when shutting down. */
berth_conv *berth_conv_new(berth_host *h, const char *run_id, const char *user_id);
/* Queues a user message: runs onTurnStart then onTurn (resuming a suspended
 * conversation first), when a turn slot is free.  Errors: "completed",
 * "shutting_down", "capacity" (max_queued_messages, or live data filling the memory
 * cap), "invalid_argument" (NULL, or not UTF-8). */
berth_error *berth_conv_message(berth_conv *c, const char *message);
/* The same; returns -1 on any of those errors. */
int berth_conv_send(berth_conv *c, const char *message);
/* berth_conv_message, durable first: with a store, the message is written (event
 * "user") and its turn starts only once the write committed; `stored` then runs from
 * the loop with err NULL — or with the store's error, the message dropped unrun.
 * Without a store `stored` runs before this returns.  Not called when this returns an
 * error. */
berth_error *berth_conv_message_durable(berth_conv *c, const char *message,
                                        void (*stored)(void *ud, berth_conv *c,
                                                       const berth_error *err),
                                        void *ud);
/* berth_conv_message_durable with the client's id for the message (NULL: none),
 * stored in its "user" event as "messageId": a retry of a message already stored is
 * recognised there (berth serve answers it from the store, never runs it twice). */
berth_error *berth_conv_message_keyed(berth_conv *c, const char *message,
                                      const char *message_id,
                                      void (*stored)(void *ud, berth_conv *c,
                                                     const berth_error *err),
                                      void *ud);
/* The number of the conversation's last event (0: none): with the turn count, what a
 * host compares with the store's to learn that another host ran turns since. */
uint64_t berth_conv_last_event(const berth_conv *c);
/* Disposes of the sandbox this host keeps for the conversation's run (a stale one:
 * another host ran turns since); the next cell gets a fresh one.  Without waiting. */
void berth_conv_forget_sandbox(berth_conv *c);
/* Records an event of the conversation's current turn in its store (kind and data
 * are the face's: "delta", "turn_end", …; data borrowed).  Returns its number (1, 2, …
 * per conversation, kept across restarts): the SSE `id:`. */
uint64_t berth_conv_record_event(berth_conv *c, const char *kind, const json_t *data);
/* The same with data already written as compact JSON text (plm_json_write's), so a face
 * that sends the text on as well encodes it once.  NULL is JSON null. */
uint64_t berth_conv_record_event_text(berth_conv *c, const char *kind, const char *text);
/* The conversation's durable id (its run id without a store). */
const char *berth_conv_store_id(const berth_conv *c);
/* Suspends as if the idle timeout had passed (after the queued turns). */
void berth_conv_suspend(berth_conv *c);
/* Cancels the running turn (a person pressed Ctrl-C): its hook call ends where it
 * waits, its sandbox and model calls are cancelled, an "error" event with code
 * "cancelled" (message `why`) and the turn's end follow; queued messages go on.
 * Returns false, changing nothing, when no turn runs (onSuspend and onComplete are
 * not cancelled).  Not from inside a hook call. */
bool berth_conv_cancel_turn(berth_conv *c, const char *why);
/* Completes the conversation after the queued turns: runs onComplete, then `done`
 * (which may free the conversation).  Further messages are refused ("completed"). */
void berth_conv_complete(berth_conv *c, void (*done)(void *ud, berth_conv *c), void *ud);
bool berth_conv_busy(const berth_conv *c);
bool berth_conv_suspended(const berth_conv *c);
bool berth_conv_completing(const berth_conv *c);
const char *berth_conv_run_id(const berth_conv *c);
const char *berth_conv_user_id(const berth_conv *c);
unsigned berth_conv_turns(const berth_conv *c);
void *berth_conv_userdata(const berth_conv *c);
void berth_conv_set_userdata(berth_conv *c, void *ud);
/* Where the conversation's last executeCode spent its time, in milliseconds (0: not
 * measured): the native from the call to its answer (execute), waiting for the sandbox
 * before the cell was sent (wait), the cell sent to its answer checked (call), checking
 * the answer (check: record digest and chain), the daemon's own wall time, the cell's
 * run in the sandbox included (daemon).  berth serve puts it in its tool events. */
typedef struct berth_cell_timing {
  double execute_ms, wait_ms, call_ms, check_ms, daemon_ms;
} berth_cell_timing;
/* The timing of the last executeCode answered since the previous take; false when none
 * was.  Taking it forgets it. */
bool berth_conv_take_cell_timing(berth_conv *c, berth_cell_timing *out);
/* Frees the conversation; a hook call it still runs is ended. */
void berth_conv_free(berth_conv *c);

/* ---------------------------------------------------------------- a local sandboxd */

/* A sandboxd this process starts and owns, for a host on one machine (the NPC example,
 * berth chat): `sandboxd --listen 127.0.0.1:0 --provider P` with a random token in a
 * private file.  path NULL: $BERTH_SANDBOXD, else next to this program (or ../bin of an
 * installed prefix), else PATH; provider NULL: "auto" (the strongest whose smoke test
 * passes here).  With a loop (libev's default loop: child watchers live there) it is
 * started again when it dies, on the same address and token, and each conversation's
 * next call gets a fresh sandbox.  Errors: "unavailable" (it would not start; its own
 * words are on stderr).  The url and token are the daemon's for berth_options; the
 * token is a secret: never log it. */
typedef struct berth_sandboxd berth_sandboxd;
berth_error *berth_sandboxd_start(struct ev_loop *loop, const char *path,
                                  const char *provider, berth_sandboxd **out);
const char *berth_sandboxd_url(const berth_sandboxd *d);
const char *berth_sandboxd_token(const berth_sandboxd *d);
/* SIGTERM, a bounded wait for its drain, SIGKILL if it hangs; frees d (NULL is fine). */
void berth_sandboxd_stop(berth_sandboxd *d);
/* The shipped scripts directory (code_chat.lua, npc.lua, examples/): $BERTH_SCRIPTS,
 * else ../scripts or ../share/berth/scripts beside this program.  malloc'd, or NULL. */
char *berth_scripts_dir(void);

/* ---------------------------------------------------------------- models */

/* A model adapter by spec ("scripted:FILE"; see runtime/README.md), on `loop`.
 * Free it with berth_model_free after the hosts that use it. */
berth_error *berth_model_open(struct ev_loop *loop, const char *spec, berth_model **out);
void berth_model_free(berth_model *m);

/* ---------------------------------------------------------------- stores */

/* A store for berth_options.store: "memory", "sqlite:PATH" (runtime/store/store.h has
 * the rest of its interface).  Created or migrated at open; a store written by a newer
 * berth is refused (code "version"), a file that is not a berth store too
 * ("data_loss").  Free it after the hosts that use it. */
berth_error *berth_store_open(struct ev_loop *loop, const char *url, berth_store **out);
/* A process that is the only host on its store claims it once opened: while this
 * handle is open, a second claim of the same SQLite file, in this process or another,
 * fails ("unavailable"), so two hosts never write over each other's conversations
 * (`berth serve` and `berth chat` claim theirs).  Nothing to claim in "memory". */
berth_error *berth_store_claim(berth_store *s);
void berth_store_free(berth_store *s);

/* ---------------------------------------------------------------- files */

/* Runs a Lua file as a coroutine with berth's modules loaded (`berth lua`): argv[0]
 * is the file, the rest its arguments (global `arg` and `...`).  `done` runs from the
 * loop with 0, or 1 after printing the error and traceback. */
int berth_run_file(berth_host *h, int argc, char **argv,
                   void (*done)(void *ud, int status), void *ud);

#ifdef __cplusplus
}
#endif
#endif /* BERTH_H */

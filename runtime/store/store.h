/*
 * store.h — where conversations outlive the process: one small C interface with an
 * engine behind it, chosen by URL.
 *
 *   "memory"           in this process only (tests, `berth replay`)
 *   "sqlite:PATH"      an SQLite file (WAL, synchronous=FULL): the embedded default
 *   "postgresql://…"   one database for many hosts (libpq's URL; store_pg.c)
 *
 * What it keeps, per conversation (berth_store_conv): its public id, the caller (a
 * digest of the bearer token that opened it), the owner (userId), the run id, the
 * metadata and the hook-owned state (JSON texts), a status, timestamps, the number of
 * turns, the turn running now (0: none), the number of messages and of events.  Then
 * its message history (ctx.messages: one JSON text per message, in order, numbered
 * from 0) and its events (the SSE stream: numbered from 1 per conversation, each with
 * its turn number, a kind and a JSON text).  The store knows nothing of Lua, HTTP or
 * the shape of a message: it keeps texts.  Sandboxes are never stored: a session id
 * is a capability and never leaves the process.
 *
 * Threading: a store is used from its loop's thread only (the host's libev loop),
 * like everything in berth.h.  No global state; any number of stores per process.
 *
 * Writes are queued, never applied on the spot: every write made during one
 * iteration of the loop is applied in ONE transaction just before the loop next
 * waits (an ev_prepare watcher), so a turn never waits for its own fsync and a burst
 * of turns shares one.  A flush takes at most BERTH_STORE_BATCH_MAX operations; the
 * time each flush held the loop is in berth_store_stats.  Neither SQL engine applies
 * a batch on the loop's thread: SQLite's hands it to a writer thread of its own
 * (sqlite_writer.h), which applies every batch handed over meanwhile in one
 * transaction, and PostgreSQL's server works beside the loop, sent a batch as soon
 * as 512 writes are queued, so that it applies it while the iteration's other turns
 * still run.  A batch is still one transaction; callbacks still run from the loop.
 * When a write must
 * be durable before something happens (a user message before its stream is
 * acknowledged), queue it and then berth_store_sync: `done` runs from the loop once
 * the transaction holding everything queued before it committed (or failed, with the
 * error).
 *
 * Reads are synchronous in this version (SQLite answers from its page cache in
 * microseconds): each first applies what is queued, so a read sees every earlier
 * write.  They return an error value or NULL.
 *
 * Errors are values: a berth_error (berth.h) with a stable code — "unavailable" (the
 * store cannot be reached or written: a full disk, a locked or unreadable file),
 * "data_loss" (a file that is not a berth store, or is corrupt), "version" (a store
 * written by a newer berth), "invalid_argument" (a bad URL) — and a message a person
 * can act on.  Free it with berth_error_free.
 *
 * Ownership: strings passed in are copied; records and arrays returned are the
 * caller's (free them with the matching _free functions).
 *
 * The place for later steps:
 *   - PostgreSQL (asynchronous libpq on the same loop, pipelined): an engine's apply
 *     already reports its end through berth_store_batch_done (store_engine.h), so an
 *     engine may commit later, from the loop; reads get _async forms taking a
 *     callback, the synchronous ones staying for SQLite and memory.
 *
 * Leases (schema version 2; docs/many-hosts.md): see the section at the end.
 *
 * Message ids (schema version 3): a "user" event may carry the client's id for its
 * message (berth serve's messageId), kept beside the event in an indexed column, so
 * that a retry is recognised (berth_store_find_message) without reading the
 * conversation's events.
 */
#ifndef BERTH_STORE_H
#define BERTH_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "berth.h"

struct ev_loop;

/* The schema this binary writes; a store at a newer version is refused ("version"). */
#define BERTH_STORE_SCHEMA 4
/* The most operations one flush takes (the rest wait one loop iteration). */
#define BERTH_STORE_BATCH_MAX 4096
/* The most sync (and lease) callbacks called in one loop iteration; the rest are
 * called in the next ones, in order.  A sync's callback starts a turn, and an engine
 * that commits off the loop may answer every conversation's message at once: this
 * lets the turns already running end while new ones start. */
#define BERTH_STORE_ANSWERS_PER_ITERATION 1024

typedef enum berth_store_status {
  BERTH_STORE_OPEN,              /* between turns, or running one */
  BERTH_STORE_SUSPENDED,         /* idle: onSuspend ran, no sandbox */
  BERTH_STORE_COMPLETED,         /* onComplete ran: takes no more messages */
  BERTH_STORE_INTERRUPTED        /* its host died during a turn (marked at next open) */
} berth_store_status;

const char *berth_store_status_name(berth_store_status st);
/* Wall-clock Unix milliseconds (the records' timestamps). */
int64_t berth_store_now_ms(void);

typedef struct berth_store_conv {
  char *id;                      /* the public id (primary key) */
  char *caller;                  /* who may see it: a digest of the caller's token */
  char *owner;                   /* userId, or NULL */
  char *run_id;
  char *metadata;                /* JSON object text, or NULL */
  char *state;                   /* the hooks' ctx.state as JSON text, or NULL */
  berth_store_status status;
  int64_t created_ms, updated_ms;/* Unix milliseconds */
  uint32_t turns;                /* turns started */
  uint32_t running_turn;         /* the turn running now; 0 = none */
  uint32_t n_messages;           /* messages stored (0 .. n-1) */
  uint64_t last_event;           /* the last event's number; 0 = none */
  uint64_t order;                /* assigned by the store at first write: newer is larger */
  char *lease_holder;            /* read only (put_conv leaves the lease alone): the host */
  int64_t lease_expiry_ms;       /*   holding it, or NULL; until when (the store's clock) */
} berth_store_conv;

/* Frees the strings of a record (not the record itself) and zeroes it. */
void berth_store_conv_clear(berth_store_conv *r);
/* A deep copy into *dst. */
void berth_store_conv_copy(berth_store_conv *dst, const berth_store_conv *src);

typedef struct berth_store_event {
  uint64_t seq;                  /* 1, 2, … per conversation */
  uint32_t turn;
  char *kind;                    /* "user", "delta", "turn_end", … (the face's names) */
  char *data;                    /* JSON text */
} berth_store_event;

typedef struct berth_store_stats {
  uint64_t flushes, ops, failures;
  uint64_t superseded;           /* records that took a queued one's place (not in ops) */
  uint64_t fenced;               /* writes not applied: the lease was another's (fence) */
  uint64_t queued;               /* writes waiting now (kept ones too, while failing) */
  double flush_seconds_max;      /* the longest one flush held the loop (SQLite's:
                                    handing the batch to its writer) */
  double flush_seconds_sum;
  uint64_t checkpoints;          /* sqlite: WAL checkpoints made off the loop's thread */
} berth_store_stats;

typedef void (*berth_store_done_fn)(void *ud, const berth_error *err);

/* Opens (creating when needed, migrating an older schema) the store at `url`, with
 * its flushes on `loop`.  Errors: "invalid_argument", "unavailable", "data_loss",
 * "version". */
berth_error *berth_store_open(struct ev_loop *loop, const char *url, berth_store **out);
/* Applies what is queued (failures are logged to stderr), then closes. */
void berth_store_free(berth_store *s);
/* "memory", "sqlite", "postgresql". */
const char *berth_store_engine_name(const berth_store *s);
void berth_store_get_stats(const berth_store *s, berth_store_stats *out);
/* Whether the last write transaction failed and none has succeeded since: its writes
 * are kept and tried again.  While it is so, the host takes no new message (each
 * would add writes that cannot be applied either: memory held without bound). */
bool berth_store_failing(const berth_store *s);
/* `fn(ud, err)` hears of every failure the store meets, once each: a write transaction
 * that failed (its writes are kept and tried again) and a read that failed.  From the
 * loop's thread, inside the store call or flush that met it; `err` is borrowed.  NULL
 * stops it.  (The host counts them as errors of source "store".) */
void berth_store_on_failure(berth_store *s, void (*fn)(void *ud, const berth_error *err),
                            void *ud);

/* {====================================================== writes (queued) */

/* Creates or replaces the conversation's record (order is kept once assigned).  A
 * record never goes back: one whose turns or last event number is below the stored
 * one's is not applied (no error), so a host with a stale copy — a late idle suspend
 * after another host ran turns of the conversation — cannot overwrite newer state
 * (docs/many-hosts.md). */
void berth_store_put_conv(berth_store *s, const berth_store_conv *r);
/* Messages first .. first+n-1 of conversation `id` (JSON texts, copied).  With
 * `replace`, every stored message of the conversation is dropped first (the history
 * was rewritten; `first` is then 0). */
void berth_store_put_messages(berth_store *s, const char *id, uint32_t first,
                              const char *const *json, size_t n, bool replace);
/* Event `seq` of the conversation (kind and JSON text copied).  Writing an event
 * number again replaces that event whole (its message id too). */
void berth_store_put_event(berth_store *s, const char *id, uint64_t seq, uint32_t turn,
                           const char *kind, const char *json);
/* berth_store_put_event of a "user" event (a message) with the client's id for that
 * message beside it (copied; NULL: none), for berth_store_find_message.  The store
 * never reads the id out of the JSON text: this is the only way it is learned. */
void berth_store_put_user_event(berth_store *s, const char *id, uint64_t seq,
                                uint32_t turn, const char *json, const char *message_id);
/* `done` runs from the loop once everything queued so far is durable, or failed. */
void berth_store_sync(berth_store *s, berth_store_done_fn done, void *ud);
/* Applies what is queued now, from the caller's stack; NULL or the error. */
berth_error *berth_store_flush(berth_store *s);

/* }====================================================== */

/* {====================================================== reads (synchronous) */

/* *found false (and *out zeroed) when there is no such conversation. */
berth_error *berth_store_get_conv(berth_store *s, const char *id, berth_store_conv *out,
                                  bool *found);
/* The caller's conversations, newest first: at most `limit`, all older than `before`
 * (an `order`; 0 = from the newest).  The next page is before = the last one's order. */
berth_error *berth_store_list_convs(berth_store *s, const char *caller, uint64_t before,
                                    size_t limit, berth_store_conv **out, size_t *n);
void berth_store_convs_free(berth_store_conv *v, size_t n);
/* How many of the caller's conversations are not completed: what a host alone on its
 * store holds for the caller at start, loaded or not.  SQLite counts the file; the
 * memory store has nothing from before the process, and a store shared by many hosts
 * (PostgreSQL) is not counted: both answer 0. */
berth_error *berth_store_count_open(berth_store *s, const char *caller, size_t *n);
/* The whole history, in order (malloc'd array of malloc'd texts). */
berth_error *berth_store_load_messages(berth_store *s, const char *id, char ***out,
                                       size_t *n);
void berth_store_texts_free(char **v, size_t n);
/* Events numbered after `after`, in order, at most `limit` (0: all). */
berth_error *berth_store_read_events(berth_store *s, const char *id, uint64_t after,
                                     size_t limit, berth_store_event **out, size_t *n);
void berth_store_events_free(berth_store_event *v, size_t n);
/* The number of the latest "user" event of conversation `id` written with message id
 * `message_id` (berth_store_put_user_event) and numbered below `before` (0: any), in
 * *seq; *found false (and *seq 0) when there is none.  An index lookup in the SQL
 * engines: its cost does not grow with the conversation's events. */
berth_error *berth_store_find_message(berth_store *s, const char *id,
                                      const char *message_id, uint64_t before,
                                      uint64_t *seq, bool *found);

/* }====================================================== */

/* {====================================================== recovery */

/* For a host alone on its store (one that takes no leases), before it reads or marks
 * anything: from now until berth_store_free no other handle, of this process or
 * another, can claim the same store; a second claim fails ("unavailable", saying
 * so).  Two hosts alone on one store would each mark the other's running turns
 * interrupted and write over each other's conversations.  Claiming again on the same
 * handle succeeds.  SQLite: an exclusive flock on the file, which SQLite's own locks
 * and a `sqlite3` reading the file do not see; memory: one process's own, nothing to
 * claim; PostgreSQL: its hosts share it through leases, nothing to claim. */
berth_error *berth_store_claim(berth_store *s);

/* For one host alone on its store, at start: every conversation with a turn running
 * (its host died in it) gets, for that turn, an "error" event {code "interrupted",
 * message} and a "turn_end" event {turn, ok false, interrupted true}, status
 * INTERRUPTED and no running turn.  Touches only those conversations (an index of
 * running turns; no scan of the others).  *n: how many.  (With many hosts this runs
 * per conversation whose lease expired.) */
berth_error *berth_store_mark_interrupted(berth_store *s, size_t *n);

/* }====================================================== */

/* {====================================================== leases */

/*
 * A lease says which host may run a conversation's turns: a holder (a host id, at most
 * BERTH_STORE_HOST_MAX bytes) and an expiry, kept in the conversation's row.  A host
 * takes it before it stores a message, renews every lease it holds while it lives, and
 * releases it once the turn's end is stored; a host that dies (SIGKILL) loses its
 * leases at expiry.  All three are conditional updates, so two hosts never both hold
 * one lease:
 *   UPDATE … WHERE id = ? AND (holder IS NULL OR expiry < now OR holder = me)
 * They are queued with the writes and applied in order in the same transactions (a
 * release queued after a turn's end is applied after it).  PostgreSQL's statements use
 * the server's clock (hosts' clocks may differ); SQLite and memory the host's.
 */

#define BERTH_STORE_HOST_MAX 63

typedef struct berth_store_lease {
  bool found;                    /* the conversation is stored (else nothing else is set) */
  bool taken;                    /* the caller holds the lease now */
  char holder[BERTH_STORE_HOST_MAX + 1];  /* who holds it now ("" none) */
  int64_t expiry_ms;
  /* the row as it is now: whether other hosts ran turns since the caller's copy, and
   * whether a turn was left running by a holder whose lease expired */
  uint32_t turns, running_turn;
  uint64_t last_event;
} berth_store_lease;

typedef void (*berth_store_lease_fn)(void *ud, const berth_error *err,
                                     const berth_store_lease *lease);

/* Takes (or extends) conversation id's lease for `host` for ttl_ms, if nobody else
 * holds it unexpired.  `done` runs from the loop once the transaction holding it
 * committed: err NULL and *lease (taken or not), or the error (nothing was taken). */
void berth_store_lease_take(berth_store *s, const char *id, const char *host,
                            int64_t ttl_ms, berth_store_lease_fn done, void *ud);
/* Every lease `host` holds now expires ttl_ms from now (one statement).  `done` (may
 * be NULL) runs once committed or failed; a failed renewal is not tried again. */
void berth_store_lease_renew(berth_store *s, const char *host, int64_t ttl_ms,
                             berth_store_done_fn done, void *ud);
/* Frees the lease if `host` holds it (a queued write: kept and tried again on failure). */
void berth_store_lease_release(berth_store *s, const char *id, const char *host);
/* Frees every lease (a host alone on its store, at start: its predecessor's). */
void berth_store_lease_clear_all(berth_store *s);

/* The fence (many hosts).  From now on this handle's writes of a conversation that is
 * stored — an update of its record, its messages, its events — are applied only while
 * `host` holds its lease; the others are not applied, and are counted (stats.fenced)
 * and told to `fn` (berth_store_on_fenced).  So a host that lost a lease — its
 * renewals failed past the expiry, and another host took it — cannot interleave its
 * late writes (kept while the store was unreachable, say) with the new holder's.
 * What is not stored yet (a new conversation's first record) is written regardless.
 * Set it before the first write; NULL: none (a host alone on its store).  A record
 * refused because it is older than the stored one (store.h, put_conv) is counted
 * with them while the fence is set. */
void berth_store_fence(berth_store *s, const char *host);
/* `fn(ud, id)` hears of each write the fence refused, with the conversation's id
 * (borrowed), from inside the flush: it must not call the store.  NULL stops it. */
void berth_store_on_fenced(berth_store *s, void (*fn)(void *ud, const char *id), void *ud);

/* berth_store_mark_interrupted for one conversation (a lease taken over from a host
 * that died in a turn): *marked whether it had a turn running. */
berth_error *berth_store_mark_interrupted_one(berth_store *s, const char *id, bool *marked);

/* }====================================================== */

#endif

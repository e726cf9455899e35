/*
 * store_engine.h — what an engine of the store implements (store.c is the generic
 * layer: the URL, the write queue, the per-iteration flush, sync callbacks, recovery).
 * Not for callers of the store: they use store.h.
 */
#ifndef BERTH_STORE_ENGINE_H
#define BERTH_STORE_ENGINE_H

#include "idmap.h"
#include "store.h"

#include <string.h>

typedef enum store_op_kind {
  OP_PUT_CONV, OP_PUT_MESSAGES, OP_PUT_EVENT, OP_SYNC,
  OP_LEASE_TAKE,                 /* answered (lease_done) with the row; not re-queued */
  OP_LEASE_RENEW,                /* answered (done); not re-queued */
  OP_LEASE_RELEASE, OP_LEASE_CLEAR  /* writes like the others */
} store_op_kind;

/* One queued write. */
typedef struct store_op {
  struct store_op *next;
  store_op_kind kind;
  berth_store_conv conv;         /* OP_PUT_CONV (a deep copy) */
  char *id;                      /* OP_PUT_MESSAGES, OP_PUT_EVENT */
  uint32_t first;                /* OP_PUT_MESSAGES */
  size_t n;
  char **texts;
  bool replace;
  uint64_t seq;                  /* OP_PUT_EVENT */
  uint32_t turn;
  char *ev_kind, *data;
  char *message_id;              /* OP_PUT_EVENT: a "user" event's message id, or NULL */
  berth_store_done_fn done;      /* OP_SYNC (engines skip it), OP_LEASE_RENEW */
  void *ud;
  char *host;                    /* OP_LEASE_*: the holder */
  int64_t ttl_ms;
  berth_store_lease_fn lease_done;   /* OP_LEASE_TAKE: with `lease`, set by the engine */
  berth_store_lease lease;
  plm_idmap_node node;           /* OP_PUT_CONV in berth_store.latest, keyed by conv.id */
  bool latest;                   /*   (while it is there) */
  bool fenced;                   /* set by the engine: the fence refused it (store.h) */
  uint64_t barrier;              /*   the store's barrier count when it was queued */
} store_op;

/* The operations of one transaction, in the order they were queued. */
typedef struct berth_store_batch {
  berth_store *s;
  store_op *ops;
  size_t n;
} berth_store_batch;

typedef struct berth_store_vtable {
  const char *name;
  /* `where` is the URL after the engine's prefix. */
  berth_error *(*open)(berth_store *s, const char *where);
  void (*close)(berth_store *s);
  /* Applies every op of the batch in one transaction, all or nothing, then calls
   * berth_store_batch_done — before returning (SQLite, memory) or later from the loop
   * (an asynchronous engine). */
  void (*apply)(berth_store *s, berth_store_batch *b);
  berth_error *(*get_conv)(berth_store *s, const char *id, berth_store_conv *out,
                           bool *found);
  berth_error *(*list_convs)(berth_store *s, const char *caller, uint64_t before,
                             size_t limit, berth_store_conv **out, size_t *n);
  berth_error *(*load_messages)(berth_store *s, const char *id, char ***out, size_t *n);
  berth_error *(*read_events)(berth_store *s, const char *id, uint64_t after, size_t limit,
                              berth_store_event **out, size_t *n);
  /* berth_store_find_message (after the read barrier). */
  berth_error *(*find_message)(berth_store *s, const char *id, const char *message_id,
                               uint64_t before, uint64_t *seq, bool *found);
  /* Records of the conversations with a turn running. */
  berth_error *(*list_running)(berth_store *s, berth_store_conv **out, size_t *n);
  /* An asynchronous engine: waits (bounded) until every batch applied so far has
   * ended, so that berth_store_flush returns with them answered.  NULL: apply ends
   * before returning. */
  void (*settle)(berth_store *s);
  /* The engine's own figures into *out (the generic ones are set). NULL: none. */
  void (*stats)(const berth_store *s, berth_store_stats *out);
  /* An asynchronous engine, whose server works on a core of its own: a batch is
   * applied as soon as this many operations are queued, not only when the iteration
   * ends, so that the server applies it while the loop still runs the iteration's
   * other turns (else the two take turns: a commit answers a thousand syncs, a
   * thousand turns run while the server waits, their writes go in one batch, and the
   * turns wait while it applies them).  0: at the iteration's end only. */
  size_t eager_ops;
  /* berth_store_claim (store.h).  NULL: there is nothing to claim. */
  berth_error *(*claim)(berth_store *s);
  /* berth_store_count_open (store.h).  NULL: 0. */
  berth_error *(*count_open)(berth_store *s, const char *caller, size_t *n);
} berth_store_vtable;

struct berth_store {
  const berth_store_vtable *vt;
  void *engine;                  /* the engine's own state */
  struct ev_loop *loop;
  char *url;
  store_op *head, *tail;         /* queued */
  size_t queued;
  /* The last put_conv queued per conversation and not yet taken by a flush, with the
   * barrier count at its queueing (a sync, a lease operation): a newer one since that
   * barrier takes its place (store.c). */
  plm_idmap latest;
  uint64_t barrier;
  bool flushing;
  bool answering;                /* in berth_store_batch_done (its callbacks may write) */
  void *prepare, *idle;          /* ev_prepare, ev_idle (kept opaque here) */
  uint64_t next_order;           /* engines that number records themselves may use it */
  berth_store_stats st;
  berth_error *last_err;         /* the last failed apply's, until flush returns it */
  /* After a failed apply its writes are queued again (store.c): tried at retry_at,
   * the delay doubling while they fail. */
  bool failing, closing;
  double retry_at, retry_delay;
  /* Sync callbacks not called yet: while there are, the store keeps its loop alive
   * (one ev_ref), since someone waits for them. */
  size_t syncs_waiting;
  void (*failure_fn)(void *ud, const berth_error *err);   /* berth_store_on_failure */
  void *failure_ud;
  char *fence;                   /* berth_store_fence: the host, or NULL */
  void (*fenced_fn)(void *ud, const char *id);            /* berth_store_on_fenced */
  void *fenced_ud;
};

/* The conditions of a lease (one place, so the three engines agree). */
static inline bool berth_lease_free_for(const char *holder, int64_t expiry_ms,
                                        const char *host, int64_t now_ms)
{
  return !holder || !*holder || expiry_ms < now_ms || !strcmp(holder, host);
}

/* The end of an apply: err NULL (committed) or the reason (borrowed).  Runs the sync
 * callbacks of the batch and frees it. */
void berth_store_batch_done(berth_store_batch *b, const berth_error *err);

extern const berth_store_vtable berth_store_memory;
extern const berth_store_vtable berth_store_sqlite;
extern const berth_store_vtable berth_store_pg;

#endif

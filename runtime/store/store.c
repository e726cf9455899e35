/*
 * store.c — the engine-independent half of the store (store.h): the URL, the write
 * queue flushed once per loop iteration in one transaction, sync callbacks run from
 * the loop on a clean stack, and recovery of interrupted turns.
 *
 * The flush runs from an ev_prepare watcher: after every callback of an iteration ran
 * and before the loop waits, so everything one iteration wrote shares a transaction
 * (and an fsync) — or, on an engine with an eager bound (PostgreSQL, whose server
 * works beside the loop), a batch goes as soon as that many writes are queued.  Sync
 * callbacks never run inside the flush's caller (a read flushes too, from wherever it
 * is called): they are kept on a list and run from the watcher.
 */
#include "store_engine.h"
#include "diag.h"
#include "xalloc.h"
#include "embed.h"

#include <ev.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct pending_done {
  struct pending_done *next;
  berth_store_done_fn fn;
  berth_store_lease_fn lease_fn; /* a lease taken (or not): with `lease` */
  berth_store_lease lease;
  void *ud;
  berth_error *err;              /* NULL: committed */
} pending_done;

typedef struct store_watchers {
  ev_prepare prepare;
  ev_idle idle;
  ev_timer retry;                /* the next try after a failed flush */
  pending_done *dones, *dones_tail;
} store_watchers;

/* After a failed flush the same writes are tried again after this long, doubled at
 * each failure up to the most (a full disk: no busy loop, a prompt recovery). */
#define RETRY_FIRST 0.05
#define RETRY_MOST 1.0

static store_watchers *W(berth_store *s) { return s->prepare; }

int64_t berth_store_now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

const char *berth_store_status_name(berth_store_status st)
{
  static const char *const names[] = {"open", "suspended", "completed", "interrupted"};
  return (unsigned)st < 4 ? names[st] : "open";
}

static char *dup_or_null(const char *p) { return p ? berth_xstrdup(p) : NULL; }

void berth_store_conv_clear(berth_store_conv *r)
{
  if (!r)
    return;
  free(r->id);
  free(r->caller);
  free(r->owner);
  free(r->run_id);
  free(r->metadata);
  free(r->state);
  free(r->lease_holder);
  memset(r, 0, sizeof *r);
}

void berth_store_conv_copy(berth_store_conv *dst, const berth_store_conv *src)
{
  *dst = *src;
  dst->id = dup_or_null(src->id);
  dst->caller = dup_or_null(src->caller);
  dst->owner = dup_or_null(src->owner);
  dst->run_id = dup_or_null(src->run_id);
  dst->metadata = dup_or_null(src->metadata);
  dst->state = dup_or_null(src->state);
  dst->lease_holder = dup_or_null(src->lease_holder);
}

void berth_store_convs_free(berth_store_conv *v, size_t n)
{
  for (size_t i = 0; i < n; i++)
    berth_store_conv_clear(&v[i]);
  free(v);
}

void berth_store_texts_free(char **v, size_t n)
{
  for (size_t i = 0; i < n; i++)
    free(v[i]);
  free(v);
}

void berth_store_events_free(berth_store_event *v, size_t n)
{
  for (size_t i = 0; i < n; i++) {
    free(v[i].kind);
    free(v[i].data);
  }
  free(v);
}

/* {====================================================== the queue */

static void op_free(store_op *op)
{
  berth_store_conv_clear(&op->conv);
  free(op->id);
  if (op->texts)
    berth_store_texts_free(op->texts, op->n);
  free(op->ev_kind);
  free(op->data);
  free(op->message_id);
  free(op->host);
  free(op);
}

static void idle_start(berth_store *s)
{
  store_watchers *w = W(s);
  if (!w || ev_is_active(&w->idle))
    return;
  ev_idle_start(s->loop, &w->idle);
  ev_unref(s->loop);             /* pending writes alone keep no loop alive */
}

static void idle_stop(berth_store *s)
{
  store_watchers *w = W(s);
  if (!w || !ev_is_active(&w->idle))
    return;
  ev_ref(s->loop);
  ev_idle_stop(s->loop, &w->idle);
}

static berth_error *flush_once(berth_store *s);

static void enqueue(berth_store *s, store_op *op)
{
  op->next = NULL;
  if (s->tail)
    s->tail->next = op;
  else
    s->head = op;
  s->tail = op;
  s->queued++;
  /* Queued from a callback that runs after this iteration's on_prepare (another
   * prepare watcher, or what it feeds: MHD's callbacks when a resumed stream is
   * kicked), the op would wait for the loop's next wake-up, which may never come: the
   * idle watcher keeps the loop from blocking until the next on_prepare, which flushes
   * it or, while the store fails, arms the retry timer and stops the idle watcher (so
   * a failing store never spins the loop). */
  idle_start(s);
  /* The engine's eager bound (store_engine.h): not from inside a flush or an answer
   * (their callers hold the queue's or the engine's lists), nor while failing (the
   * retry timer paces the queue then).  A failure is logged and its writes kept
   * (berth_store_batch_done), as at the iteration's end. */
  if (s->vt->eager_ops && s->queued >= s->vt->eager_ops && s->loop && !s->flushing &&
      !s->answering && !s->failing)
    berth_error_free(flush_once(s));
}

/* A put_conv leaves s->latest (it is taken for a transaction, or superseded). */
static void latest_remove(berth_store *s, store_op *op)
{
  if (!op->latest)
    return;
  plm_idmap_remove(&s->latest, &op->node);
  op->latest = false;
}

/* Nothing queued so far is superseded by what comes next: an operation whose effect
 * depends on the record as the queue leaves it (a sync, that makes it durable; a lease
 * operation, that reads or conditions on the row) is a barrier.  The map's nodes are
 * left in place and no longer match: `barrier` is compared. */
static void latest_barrier(berth_store *s) { s->barrier++; }

/* A record replaces the conversation's whole record, so a later one queued since the
 * last barrier makes an earlier one useless: the earlier one, still queued, takes the
 * later one's fields in its place, and nothing more is queued.  (A turn writes its
 * record three times — the message, the turn's start, its end — and a busy loop
 * iteration holds several of them.)  In the earlier place, because a conversation's
 * first record is what gives it its place in the listing order.  The record may then
 * be applied ahead of events queued after it, in the same transaction or (past a
 * flush's bound) the one before theirs: it never claims less than was written. */
void berth_store_put_conv(berth_store *s, const berth_store_conv *r)
{
  plm_idmap_node *n = r->id ? plm_idmap_get(&s->latest, r->id) : NULL;
  if (n) {
    store_op *old = PLM_IDMAP_OWNER(n, store_op, node);
    if (old->barrier == s->barrier) {
      char *id = old->conv.id;  /* the map's key: kept */
      old->conv.id = NULL;
      berth_store_conv_clear(&old->conv);
      berth_store_conv_copy(&old->conv, r);
      free(old->conv.id);
      old->conv.id = id;
      s->st.superseded++;
      return;
    }
    latest_remove(s, old);
  }
  store_op *op = berth_xcalloc(1, sizeof *op);
  op->kind = OP_PUT_CONV;
  berth_store_conv_copy(&op->conv, r);
  if (op->conv.id) {            /* (before enqueue, which may take it for a batch) */
    op->node.key = op->conv.id;
    op->barrier = s->barrier;
    op->latest = plm_idmap_put(&s->latest, &op->node);
  }
  enqueue(s, op);
}

void berth_store_put_messages(berth_store *s, const char *id, uint32_t first,
                              const char *const *json, size_t n, bool replace)
{
  store_op *op = berth_xcalloc(1, sizeof *op);
  op->kind = OP_PUT_MESSAGES;
  op->id = berth_xstrdup(id);
  op->first = replace ? 0 : first;
  op->replace = replace;
  op->n = n;
  op->texts = berth_xcalloc(n ? n : 1, sizeof *op->texts);
  for (size_t i = 0; i < n; i++)
    op->texts[i] = berth_xstrdup(json[i]);
  enqueue(s, op);
}

static store_op *event_op(const char *id, uint64_t seq, uint32_t turn, const char *kind,
                          const char *json)
{
  store_op *op = berth_xcalloc(1, sizeof *op);
  op->kind = OP_PUT_EVENT;
  op->id = berth_xstrdup(id);
  op->seq = seq;
  op->turn = turn;
  op->ev_kind = berth_xstrdup(kind);
  op->data = berth_xstrdup(json ? json : "null");
  return op;
}

void berth_store_put_event(berth_store *s, const char *id, uint64_t seq, uint32_t turn,
                           const char *kind, const char *json)
{
  enqueue(s, event_op(id, seq, turn, kind, json));
}

void berth_store_put_user_event(berth_store *s, const char *id, uint64_t seq,
                                uint32_t turn, const char *json, const char *message_id)
{
  store_op *op = event_op(id, seq, turn, "user", json);
  op->message_id = dup_or_null(message_id);
  enqueue(s, op);
}

void berth_store_sync(berth_store *s, berth_store_done_fn done, void *ud)
{
  store_op *op = berth_xcalloc(1, sizeof *op);
  op->kind = OP_SYNC;
  op->done = done;
  op->ud = ud;
  latest_barrier(s);
  if (done && W(s) && s->syncs_waiting++ == 0)
    ev_ref(s->loop);            /* someone waits: the loop runs until it is answered */
  enqueue(s, op);               /* (last: it may take the op for a batch) */
}

/* {====================================================== leases */

static store_op *lease_op(store_op_kind kind, const char *id, const char *host,
                          int64_t ttl_ms)
{
  store_op *op = berth_xcalloc(1, sizeof *op);
  op->kind = kind;
  op->id = id ? berth_xstrdup(id) : NULL;
  op->host = host ? berth_xstrndup(host, BERTH_STORE_HOST_MAX) : NULL;
  op->ttl_ms = ttl_ms;
  return op;
}

static void enqueue_lease(berth_store *s, store_op *op)
{
  latest_barrier(s);
  enqueue(s, op);
}

void berth_store_lease_take(berth_store *s, const char *id, const char *host,
                            int64_t ttl_ms, berth_store_lease_fn done, void *ud)
{
  store_op *op = lease_op(OP_LEASE_TAKE, id, host, ttl_ms);
  op->lease_done = done;
  op->ud = ud;
  enqueue_lease(s, op);
}

void berth_store_lease_renew(berth_store *s, const char *host, int64_t ttl_ms,
                             berth_store_done_fn done, void *ud)
{
  store_op *op = lease_op(OP_LEASE_RENEW, NULL, host, ttl_ms);
  op->done = done;
  op->ud = ud;
  enqueue_lease(s, op);
}

void berth_store_lease_release(berth_store *s, const char *id, const char *host)
{
  enqueue_lease(s, lease_op(OP_LEASE_RELEASE, id, host, 0));
}

void berth_store_lease_clear_all(berth_store *s)
{
  enqueue_lease(s, lease_op(OP_LEASE_CLEAR, NULL, NULL, 0));
}

/* An op answered through a callback rather than applied again after a failure. */
static bool answered_op(const store_op *op)
{
  return op->kind == OP_SYNC || op->kind == OP_LEASE_TAKE || op->kind == OP_LEASE_RENEW;
}

/* }====================================================== */

/* The batch's ops first .. last (n of them, already out of it) go back to the head of
 * the queue, in their order. */
static void put_back(berth_store_batch *b, store_op *first, store_op *last, size_t n)
{
  berth_store *s = b->s;
  last->next = s->head;
  if (!s->head)
    s->tail = last;
  s->head = first;
  s->queued += n;
  b->n -= n;
}

/* A failed batch's writes go back to the head of the queue, in their order, to be
 * applied again (with what was queued since) once the retry delay passed: a write is
 * never dropped because one transaction failed.  Its syncs fail now, with the error:
 * what waited for them (a user message) is refused, visibly, while the writes before
 * them stay queued.  (An engine that pipelines batches may have applied a later one
 * already: its writes are replaced by these when they are applied again.) */
static void requeue_writes(berth_store_batch *b)
{
  store_op *first = NULL, **tail = &first, *last = NULL;
  size_t n = 0;
  for (store_op **pp = &b->ops; *pp;) {
    store_op *op = *pp;
    if (answered_op(op)) {      /* a take or a renewal is answered with the failure */
      pp = &op->next;
      continue;
    }
    *pp = op->next;
    op->next = NULL;
    *tail = op;
    tail = &op->next;
    last = op;
    n++;
  }
  if (first)
    put_back(b, first, last, n);
}

void berth_store_batch_done(berth_store_batch *b, const berth_error *err)
{
  berth_store *s = b->s;
  store_watchers *w = W(s);
  bool answering = s->answering;
  s->answering = true;
  if (err) {
    s->st.failures++;
    if (s->failure_fn)
      s->failure_fn(s->failure_ud, err);
    s->retry_delay = s->retry_delay ? s->retry_delay * 2 : RETRY_FIRST;
    if (s->retry_delay > RETRY_MOST)
      s->retry_delay = RETRY_MOST;
    s->retry_at = berth_clock() + s->retry_delay;
    if (!s->failing)
      berth_diag(BERTH_LOG_ERROR, "store: %zu writes failed, kept to be tried again: %s",
                 b->n, err->message);
    s->failing = true;
    berth_error_free(s->last_err);
    s->last_err = berth_error_new(err->code, "%s", err->message);
    if (!s->closing)
      requeue_writes(b);
  } else if (s->failing) {
    s->failing = false;
    s->retry_delay = 0;
    berth_diag(BERTH_LOG_INFO, "store: writes succeed again");
  }
  for (store_op *op = b->ops, *next; op; op = next) {
    next = op->next;
    if (!err && op->fenced) {
      s->st.fenced++;
      if (s->fenced_fn)
        s->fenced_fn(s->fenced_ud, op->kind == OP_PUT_CONV ? op->conv.id : op->id);
    }
    if (answered_op(op) && (op->done || op->lease_done) && w) {
      pending_done *d = berth_xcalloc(1, sizeof *d);
      d->fn = op->done;
      d->lease_fn = op->lease_done;
      d->lease = op->lease;
      d->ud = op->ud;
      d->err = err ? berth_error_new(err->code, "%s", err->message) : NULL;
      if (w->dones_tail)
        w->dones_tail->next = d;
      else
        w->dones = d;
      w->dones_tail = d;
      idle_start(s);            /* answered by the next on_prepare, as in enqueue */
    }
    op_free(op);
  }
  free(b);
  s->answering = answering;
}

/* Applies up to BERTH_STORE_BATCH_MAX queued operations in one transaction (or hands
 * them to an engine that applies them off the loop).  The error of that transaction,
 * or NULL. */
static berth_error *flush_once(berth_store *s)
{
  if (!s->head)
    return NULL;
  berth_store_batch *b = berth_xcalloc(1, sizeof *b);
  b->s = s;
  b->ops = s->head;
  store_op *last = s->head;
  b->n = 1;
  latest_remove(s, last);
  while (last->next && b->n < BERTH_STORE_BATCH_MAX) {
    last = last->next;
    latest_remove(s, last);
    b->n++;
  }
  s->head = last->next;
  if (!s->head)
    s->tail = NULL;
  last->next = NULL;
  s->queued -= b->n;
  /* The engine reports through batch_done, which keeps a copy of its error. */
  uint64_t failures = s->st.failures;
  size_t n = b->n;
  double t0 = berth_clock();
  s->flushing = true;
  s->vt->apply(s, b);
  s->flushing = false;
  double took = berth_clock() - t0;
  s->st.flushes++;
  s->st.ops += n;
  s->st.flush_seconds_sum += took;
  if (took > s->st.flush_seconds_max)
    s->st.flush_seconds_max = took;
  if (s->st.failures == failures || !s->last_err)
    return NULL;
  berth_error *err = s->last_err;
  s->last_err = NULL;
  return err;
}

berth_error *berth_store_flush(berth_store *s)
{
  berth_error *last = NULL;
  while (s->head) {
    berth_error *e = flush_once(s);
    if (e) {                    /* the writes are queued again: stop here */
      last = e;
      break;
    }
  }
  if (s->vt->settle) {          /* an asynchronous engine: wait for its answers */
    uint64_t failures = s->st.failures;
    s->vt->settle(s);
    if (s->st.failures != failures && s->last_err) {
      berth_error_free(last);
      last = s->last_err;
      s->last_err = NULL;
    }
  }
  return last;
}

/* Calls the answered callbacks in order, at most *budget of them (the rest wait for
 * the next iteration).  A sync's callback starts a turn: an engine that commits off
 * the loop (SQLite's writer, PostgreSQL's server) may answer the messages of every
 * conversation at once, and unbounded, all their turns would start in one iteration,
 * each with its coroutine alive in the Lua state until it ends (100 000 of them past
 * the state's memory cap).  A bounded number per iteration lets the turns already
 * running end as new ones start. */
static void run_dones(berth_store *s, size_t *budget)
{
  store_watchers *w = W(s);
  while (w->dones && *budget) {
    --*budget;
    pending_done *d = w->dones;
    w->dones = d->next;
    if (!w->dones)
      w->dones_tail = NULL;
    if (d->lease_fn)
      d->lease_fn(d->ud, d->err, d->err ? NULL : &d->lease);
    else
      d->fn(d->ud, d->err);
    berth_error_free(d->err);
    free(d);
    if (s->syncs_waiting && --s->syncs_waiting == 0)
      ev_unref(s->loop);
  }
}

/* Before the loop waits: one transaction for what this iteration wrote, then the
 * sync callbacks.  What they queue goes in one more round; anything left (a batch
 * over the bound) keeps the loop from blocking until the next iteration takes it. */
static void on_prepare(struct ev_loop *loop, ev_prepare *pw, int revents)
{
  (void)loop;
  (void)revents;
  berth_store *s = pw->data;
  store_watchers *w = W(s);
  size_t budget = BERTH_STORE_ANSWERS_PER_ITERATION;
  for (int round = 0; round < 2; round++) {
    if (s->head && s->failing && berth_clock() < s->retry_at)
      break;                    /* the retry timer takes it */
    if (s->head)
      berth_error_free(flush_once(s));
    run_dones(s, &budget);
    if (!s->head)
      break;
  }
  run_dones(s, &budget);
  if (s->head && s->failing) {
    if (w->dones)
      idle_start(s);            /* (answers left over: the next iteration's) */
    else
      idle_stop(s);
    if (!ev_is_active(&w->retry)) {
      double in = s->retry_at - berth_clock();
      ev_timer_set(&w->retry, in > 0 ? in : 0., 0.);
      ev_timer_start(s->loop, &w->retry);
      ev_unref(s->loop);         /* as the idle watcher: queued writes keep no loop alive */
    }
  } else if (s->head || w->dones)
    idle_start(s);
  else
    idle_stop(s);
}

static void on_retry(struct ev_loop *loop, ev_timer *tw, int revents)
{
  (void)loop;
  (void)tw;
  (void)revents;
  ev_ref(loop);                 /* (stopped: one shot) */
  /* Nothing else: the loop's next prepare tries the queued writes again. */
}

static void on_idle(struct ev_loop *loop, ev_idle *iw, int revents)
{
  (void)loop;
  (void)iw;
  (void)revents;
  /* Nothing: being active keeps the loop from blocking; on_prepare does the work. */
}

/* }====================================================== */

/* {====================================================== open and close */

berth_error *berth_store_open(struct ev_loop *loop, const char *url, berth_store **out)
{
  *out = NULL;
  if (!url || !*url)
    return berth_error_new("invalid_argument", "a store URL is needed (memory, "
                                               "sqlite:PATH)");
  const berth_store_vtable *vt = NULL;
  const char *where = NULL;
  if (!strcmp(url, "memory")) {
    vt = &berth_store_memory;
    where = "";
  } else if (!strncmp(url, "sqlite:", 7)) {
    vt = &berth_store_sqlite;
    where = url + 7;
    if (!strncmp(where, "//", 2))
      where += 2;               /* sqlite:///abs/path also works */
    if (!*where)
      return berth_error_new("invalid_argument", "the store URL %s names no file "
                                                 "(sqlite:PATH)", url);
  } else if (!strncmp(url, "postgresql:", 11) || !strncmp(url, "postgres:", 9)) {
    vt = &berth_store_pg;       /* libpq takes the whole URL */
    where = url;
  } else
    return berth_error_new("invalid_argument", "unknown store URL \"%.200s\" (memory, "
                                               "sqlite:PATH or postgresql://…)", url);
  berth_store *s = berth_xcalloc(1, sizeof *s);
  s->vt = vt;
  s->loop = loop;
  s->url = berth_xstrdup(url);
  plm_idmap_init(&s->latest);
  berth_error *e = vt->open(s, where);
  if (e) {
    free(s->url);
    free(s);
    return e;
  }
  if (loop) {
    store_watchers *w = berth_xcalloc(1, sizeof *w);
    s->prepare = w;
    ev_prepare_init(&w->prepare, on_prepare);
    w->prepare.data = s;
    ev_prepare_start(loop, &w->prepare);
    ev_unref(loop);             /* the store alone keeps no loop alive */
    ev_idle_init(&w->idle, on_idle);
    w->idle.data = s;
    ev_timer_init(&w->retry, on_retry, 0., 0.);
    w->retry.data = s;
  }
  *out = s;
  return NULL;
}

void berth_store_free(berth_store *s)
{
  if (!s)
    return;
  berth_error *e = berth_store_flush(s);
  if (e) {
    /* the last try: what is still queued could not be written, and is said so */
    berth_diag(BERTH_LOG_ERROR, "store: closing with %zu writes that could not be stored: %s",
               s->queued, e->message);
    berth_error_free(e);
  }
  s->closing = true;
  store_watchers *w = W(s);
  if (w) {
    idle_stop(s);
    if (ev_is_active(&w->retry)) {
      ev_ref(s->loop);
      ev_timer_stop(s->loop, &w->retry);
    }
    if (s->syncs_waiting) {     /* callbacks that will not be called now */
      s->syncs_waiting = 0;
      ev_unref(s->loop);
    }
    ev_ref(s->loop);
    ev_prepare_stop(s->loop, &w->prepare);
    /* Callbacks whose owners are gone by now are not called. */
    while (w->dones) {
      pending_done *d = w->dones;
      w->dones = d->next;
      berth_error_free(d->err);
      free(d);
    }
    free(w);
    s->prepare = NULL;          /* batches an engine ends while closing queue no dones */
  }
  s->vt->close(s);
  while (s->head) {
    store_op *op = s->head;
    s->head = op->next;
    op_free(op);
  }
  plm_idmap_free(&s->latest);
  berth_error_free(s->last_err);
  free(s->fence);
  free(s->url);
  free(s);
}

const char *berth_store_engine_name(const berth_store *s) { return s->vt->name; }

void berth_store_get_stats(const berth_store *s, berth_store_stats *out)
{
  *out = s->st;
  out->queued = s->queued;
  if (s->vt->stats)
    s->vt->stats(s, out);
}

bool berth_store_failing(const berth_store *s) { return s->failing; }

void berth_store_on_failure(berth_store *s, void (*fn)(void *ud, const berth_error *err),
                            void *ud)
{
  s->failure_fn = fn;
  s->failure_ud = ud;
}

void berth_store_fence(berth_store *s, const char *host)
{
  free(s->fence);
  s->fence = host ? berth_xstrndup(host, BERTH_STORE_HOST_MAX) : NULL;
}

void berth_store_on_fenced(berth_store *s, void (*fn)(void *ud, const char *id), void *ud)
{
  s->fenced_fn = fn;
  s->fenced_ud = ud;
}

/* }====================================================== */

/* {====================================================== reads */

/* The engine's answer to a read, its failure reported (a failed barrier was reported
 * as the write failure it is). */
static berth_error *read_failed(berth_store *s, berth_error *e)
{
  if (e && s->failure_fn)
    s->failure_fn(s->failure_ud, e);
  return e;
}

/* A read sees every write queued before it. */
static berth_error *read_barrier(berth_store *s)
{
  berth_error *e = berth_store_flush(s);
  if (e)
    return e;
  if (s->prepare && (s->head || W(s)->dones))
    idle_start(s);
  return NULL;
}

berth_error *berth_store_get_conv(berth_store *s, const char *id, berth_store_conv *out,
                                  bool *found)
{
  memset(out, 0, sizeof *out);
  *found = false;
  berth_error *e = read_barrier(s);
  return e ? e : read_failed(s, s->vt->get_conv(s, id, out, found));
}

berth_error *berth_store_list_convs(berth_store *s, const char *caller, uint64_t before,
                                    size_t limit, berth_store_conv **out, size_t *n)
{
  *out = NULL;
  *n = 0;
  berth_error *e = read_barrier(s);
  return e ? e : read_failed(s, s->vt->list_convs(s, caller, before, limit, out, n));
}

berth_error *berth_store_count_open(berth_store *s, const char *caller, size_t *n)
{
  *n = 0;
  if (!s->vt->count_open)
    return NULL;
  berth_error *e = read_barrier(s);
  return e ? e : read_failed(s, s->vt->count_open(s, caller, n));
}

berth_error *berth_store_load_messages(berth_store *s, const char *id, char ***out,
                                       size_t *n)
{
  *out = NULL;
  *n = 0;
  berth_error *e = read_barrier(s);
  return e ? e : read_failed(s, s->vt->load_messages(s, id, out, n));
}

berth_error *berth_store_read_events(berth_store *s, const char *id, uint64_t after,
                                     size_t limit, berth_store_event **out, size_t *n)
{
  *out = NULL;
  *n = 0;
  berth_error *e = read_barrier(s);
  return e ? e : read_failed(s, s->vt->read_events(s, id, after, limit, out, n));
}

berth_error *berth_store_find_message(berth_store *s, const char *id,
                                      const char *message_id, uint64_t before,
                                      uint64_t *seq, bool *found)
{
  *seq = 0;
  *found = false;
  berth_error *e = read_barrier(s);
  return e ? e : read_failed(s, s->vt->find_message(s, id, message_id, before, seq,
                                                     found));
}

/* }====================================================== */

/* {====================================================== recovery */

/* Ends the running turn of record r (read from the engine, events after the record
 * counted) with an error "interrupted" and a turn_end, as queued writes. */
static berth_error *interrupt_turn(berth_store *s, berth_store_conv *r)
{
  uint32_t turn = r->running_turn;
  /* the record is written at turn boundaries; events after it may be stored */
  berth_store_event *ev = NULL;
  size_t nev = 0;
  berth_error *e = read_failed(s, s->vt->read_events(s, r->id, r->last_event, 0, &ev, &nev));
  if (e)
    return e;
  if (nev)
    r->last_event = ev[nev - 1].seq;
  berth_store_events_free(ev, nev);
  char data[256];
  snprintf(data, sizeof data, "{\"code\":\"interrupted\",\"message\":\"the host stopped "
                              "while turn %u ran; it did not finish\"}", turn);
  berth_store_put_event(s, r->id, ++r->last_event, turn, "error", data);
  snprintf(data, sizeof data, "{\"turn\":%u,\"ok\":false,\"interrupted\":true}", turn);
  berth_store_put_event(s, r->id, ++r->last_event, turn, "turn_end", data);
  r->running_turn = 0;
  r->status = BERTH_STORE_INTERRUPTED;
  r->updated_ms = berth_store_now_ms();
  berth_store_put_conv(s, r);
  return NULL;
}

berth_error *berth_store_claim(berth_store *s)
{
  return s->vt->claim ? s->vt->claim(s) : NULL;
}

berth_error *berth_store_mark_interrupted(berth_store *s, size_t *n)
{
  *n = 0;
  berth_error *e = read_barrier(s);
  if (e)
    return e;
  berth_store_conv *v = NULL;
  size_t count = 0;
  e = read_failed(s, s->vt->list_running(s, &v, &count));
  if (e)
    return e;
  for (size_t i = 0; i < count && !e; i++)
    e = interrupt_turn(s, &v[i]);
  berth_store_convs_free(v, count);
  if (e)
    return e;
  *n = count;
  return berth_store_flush(s);
}

berth_error *berth_store_mark_interrupted_one(berth_store *s, const char *id, bool *marked)
{
  *marked = false;
  berth_store_conv r;
  bool found = false;
  berth_error *e = berth_store_get_conv(s, id, &r, &found);
  if (e || !found || !r.running_turn) {
    berth_store_conv_clear(&r);
    return e;
  }
  e = interrupt_turn(s, &r);
  berth_store_conv_clear(&r);
  if (!e)
    *marked = true;
  return e;
}

/* }====================================================== */

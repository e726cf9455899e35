/*
 * test_store.c — the conversation store (runtime/store/store.h) through its public
 * interface: every behavioural case runs against each engine ("memory" and a real
 * SQLite file in a temporary directory), and the SQLite-only cases (durable across
 * reopening, a newer schema, a corrupt or foreign file) against real files.  Then the
 * same cases against a private PostgreSQL cluster this program starts (tests/lib/
 * pgtest.h: initdb + pg_ctl on a unix socket in a temporary directory, a fresh
 * schema per test), and the PostgreSQL-only ones: a newer schema, a foreign
 * database, the server stopped mid-run, two handles as two hosts would have.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <ev.h>
#include <libpq-fe.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "pgtest.h"
#include "store/store.h"
#include "store/store_engine.h"        /* an engine's eager bound */
#include "store/sqlite_checkpoint.h"

static pgtest cluster;           /* the PostgreSQL group's server */

typedef struct fixture {
  const char *engine;            /* "memory", "sqlite" or "postgresql" */
  char dir[64];
  char url[200];
  char path[128];
  struct ev_loop *loop;
  berth_store *s;
} fixture;

static int setup(void **state)
{
  fixture *f = *state;
  snprintf(f->dir, sizeof f->dir, "/tmp/berth-store-XXXXXX");
  if (!mkdtemp(f->dir))
    return -1;
  snprintf(f->path, sizeof f->path, "%s/berth.db", f->dir);
  if (!strcmp(f->engine, "memory"))
    snprintf(f->url, sizeof f->url, "memory");
  else if (!strcmp(f->engine, "postgresql")) {
    if (pgtest_fresh_url(&cluster, f->url, sizeof f->url) != 0)
      return -1;
  } else
    snprintf(f->url, sizeof f->url, "sqlite:%s", f->path);
  f->loop = ev_loop_new(EVFLAG_AUTO);
  berth_error *e = berth_store_open(f->loop, f->url, &f->s);
  if (e) {
    fprintf(stderr, "%s\n", e->message);
    berth_error_free(e);
    return -1;
  }
  return 0;
}

static int teardown(void **state)
{
  fixture *f = *state;
  if (!strcmp(f->engine, "postgresql") && !cluster.running &&
      pgtest_restart_server(&cluster) != 0)
    return -1;                  /* a test that stopped it failed half-way */
  berth_store_free(f->s);
  f->s = NULL;
  ev_loop_destroy(f->loop);
  char p[200];
  static const char *const names[] = {"berth.db", "berth.db-wal", "berth.db-shm"};
  for (size_t i = 0; i < 3; i++) {
    snprintf(p, sizeof p, "%s/%s", f->dir, names[i]);
    unlink(p);
  }
  rmdir(f->dir);
  return 0;
}

static void no_error(berth_error *e)
{
  if (e)
    fail_msg("store error %s: %s", e->code, e->message);
}

static berth_store_conv record(const char *id, const char *caller)
{
  berth_store_conv r = {0};
  r.id = (char *)id;
  r.caller = (char *)caller;
  r.run_id = (char *)"conv-1";
  r.status = BERTH_STORE_OPEN;
  r.created_ms = r.updated_ms = berth_store_now_ms();
  return r;
}

/* {====================================================== every engine */

static void test_round_trip_of_a_conversation(void **state)
{
  fixture *f = *state;
  berth_store_conv r = record("c1", "k0000aaaa");
  r.owner = (char *)"k0000aaaa:alice";
  r.metadata = (char *)"{\"persona\":\"smith\"}";
  r.state = (char *)"{\"visits\":3,\"seen\":[\"bob\"]}";
  r.status = BERTH_STORE_SUSPENDED;
  r.turns = 7;
  r.n_messages = 2;
  r.last_event = 2;
  berth_store_put_conv(f->s, &r);
  const char *msgs[] = {"{\"role\":\"user\",\"content\":\"hi\"}",
                        "{\"role\":\"assistant\",\"content\":\"h\\u00e9\"}"};
  berth_store_put_messages(f->s, "c1", 0, msgs, 2, false);
  berth_store_put_event(f->s, "c1", 1, 7, "user", "\"hi\"");
  berth_store_put_event(f->s, "c1", 2, 7, "turn_end", "{\"turn\":7,\"ok\":true}");

  berth_store_conv got;
  bool found;
  no_error(berth_store_get_conv(f->s, "c1", &got, &found));
  assert_true(found);
  assert_string_equal(got.id, "c1");
  assert_string_equal(got.caller, "k0000aaaa");
  assert_string_equal(got.owner, "k0000aaaa:alice");
  assert_string_equal(got.run_id, "conv-1");
  assert_string_equal(got.metadata, r.metadata);
  assert_string_equal(got.state, r.state);
  assert_int_equal(got.status, BERTH_STORE_SUSPENDED);
  assert_int_equal(got.turns, 7);
  assert_int_equal(got.n_messages, 2);
  assert_int_equal(got.last_event, 2);
  assert_int_equal(got.created_ms, r.created_ms);
  assert_true(got.order > 0);
  berth_store_conv_clear(&got);

  char **m;
  size_t n;
  no_error(berth_store_load_messages(f->s, "c1", &m, &n));
  assert_int_equal(n, 2);
  assert_string_equal(m[0], msgs[0]);
  assert_string_equal(m[1], msgs[1]);
  berth_store_texts_free(m, n);

  no_error(berth_store_get_conv(f->s, "nope", &got, &found));
  assert_false(found);
  no_error(berth_store_load_messages(f->s, "nope", &m, &n));
  assert_int_equal(n, 0);
}

static void test_messages_and_events_keep_their_order(void **state)
{
  fixture *f = *state;
  berth_store_conv r = record("c2", "k1");
  berth_store_put_conv(f->s, &r);
  char buf[64];
  for (unsigned i = 0; i < 50; i++) {     /* appended in pieces, as turns end */
    snprintf(buf, sizeof buf, "{\"i\":%u}", i);
    const char *one = buf;
    berth_store_put_messages(f->s, "c2", i, &one, 1, false);
    berth_store_put_event(f->s, "c2", i + 1, i / 10 + 1, "delta", buf);
  }
  char **m;
  size_t n;
  no_error(berth_store_load_messages(f->s, "c2", &m, &n));
  assert_int_equal(n, 50);
  for (unsigned i = 0; i < 50; i++) {
    snprintf(buf, sizeof buf, "{\"i\":%u}", i);
    assert_string_equal(m[i], buf);
  }
  berth_store_texts_free(m, n);

  berth_store_event *ev;
  no_error(berth_store_read_events(f->s, "c2", 0, 0, &ev, &n));
  assert_int_equal(n, 50);
  for (unsigned i = 0; i < 50; i++) {
    assert_int_equal(ev[i].seq, i + 1);
    assert_int_equal(ev[i].turn, i / 10 + 1);
    assert_string_equal(ev[i].kind, "delta");
  }
  berth_store_events_free(ev, n);
  no_error(berth_store_read_events(f->s, "c2", 45, 0, &ev, &n));   /* Last-Event-ID 45 */
  assert_int_equal(n, 5);
  assert_int_equal(ev[0].seq, 46);
  berth_store_events_free(ev, n);
  no_error(berth_store_read_events(f->s, "c2", 10, 3, &ev, &n));
  assert_int_equal(n, 3);
  assert_int_equal(ev[2].seq, 13);
  berth_store_events_free(ev, n);

  /* A rewritten history replaces the stored one. */
  const char *two[] = {"\"summary\"", "\"last\""};
  berth_store_put_messages(f->s, "c2", 0, two, 2, true);
  no_error(berth_store_load_messages(f->s, "c2", &m, &n));
  assert_int_equal(n, 2);
  assert_string_equal(m[0], "\"summary\"");
  assert_string_equal(m[1], "\"last\"");
  berth_store_texts_free(m, n);
}

static void test_list_is_the_callers_own_newest_first_in_pages(void **state)
{
  fixture *f = *state;
  char id[32];
  for (int i = 0; i < 25; i++) {
    snprintf(id, sizeof id, "a%02d", i);
    berth_store_conv r = record(id, "kA");
    berth_store_put_conv(f->s, &r);
    if (i % 5 == 0) {           /* a caller B conversation now and then */
      snprintf(id, sizeof id, "b%02d", i);
      berth_store_conv rb = record(id, "kB");
      berth_store_put_conv(f->s, &rb);
    }
  }
  /* an update keeps a conversation's place */
  berth_store_conv again = record("a03", "kA");
  again.turns = 9;
  berth_store_put_conv(f->s, &again);

  uint64_t before = 0;
  int seen = 0, pages = 0, expect = 24;
  for (;;) {
    berth_store_conv *v;
    size_t n;
    no_error(berth_store_list_convs(f->s, "kA", before, 10, &v, &n));
    if (n == 0) {
      free(v);
      break;
    }
    pages++;
    for (size_t i = 0; i < n; i++) {
      snprintf(id, sizeof id, "a%02d", expect--);
      assert_string_equal(v[i].id, id);          /* newest first, no gap, no repeat */
      assert_string_equal(v[i].caller, "kA");
      if (!strcmp(id, "a03"))
        assert_int_equal(v[i].turns, 9);
      seen++;
    }
    before = v[n - 1].order;
    berth_store_convs_free(v, n);
  }
  assert_int_equal(seen, 25);
  assert_int_equal(pages, 3);
  berth_store_conv *v;
  size_t n;
  no_error(berth_store_list_convs(f->s, "kB", 0, 100, &v, &n));
  assert_int_equal(n, 5);
  berth_store_convs_free(v, n);
  no_error(berth_store_list_convs(f->s, "kC", 0, 100, &v, &n));
  assert_int_equal(n, 0);
  berth_store_convs_free(v, n);
}

static void test_running_turns_are_marked_interrupted(void **state)
{
  fixture *f = *state;
  berth_store_conv r = record("busy", "k1");
  r.turns = 3;
  r.running_turn = 3;
  r.last_event = 4;
  berth_store_put_conv(f->s, &r);
  berth_store_put_event(f->s, "busy", 4, 3, "user", "\"hello\"");
  berth_store_put_event(f->s, "busy", 5, 3, "delta", "\"h\"");   /* after the record */
  berth_store_conv q = record("quiet", "k1");
  q.turns = 2;
  q.last_event = 6;
  berth_store_put_conv(f->s, &q);

  size_t n;
  no_error(berth_store_mark_interrupted(f->s, &n));
  assert_int_equal(n, 1);
  berth_store_conv got;
  bool found;
  no_error(berth_store_get_conv(f->s, "busy", &got, &found));
  assert_true(found);
  assert_int_equal(got.status, BERTH_STORE_INTERRUPTED);
  assert_int_equal(got.running_turn, 0);
  assert_int_equal(got.last_event, 7);
  berth_store_conv_clear(&got);
  berth_store_event *ev;
  no_error(berth_store_read_events(f->s, "busy", 5, 0, &ev, &n));
  assert_int_equal(n, 2);
  assert_string_equal(ev[0].kind, "error");
  assert_non_null(strstr(ev[0].data, "\"code\":\"interrupted\""));
  assert_int_equal(ev[0].turn, 3);
  assert_string_equal(ev[1].kind, "turn_end");
  assert_non_null(strstr(ev[1].data, "\"ok\":false"));
  berth_store_events_free(ev, n);
  no_error(berth_store_get_conv(f->s, "quiet", &got, &found));
  assert_int_equal(got.status, BERTH_STORE_OPEN);
  assert_int_equal(got.last_event, 6);
  berth_store_conv_clear(&got);
  /* a second start finds nothing more to mark */
  no_error(berth_store_mark_interrupted(f->s, &n));
  assert_int_equal(n, 0);
}

static void on_deadline(struct ev_loop *loop, ev_timer *t, int revents)
{
  (void)t;
  (void)revents;
  ev_break(loop, EVBREAK_ALL);
}

/* Runs the loop until *counter reaches want, at most 15 s (then the caller's assertion
 * fails: the engine did not answer). */
static void run_until(struct ev_loop *loop, int *counter, int want)
{
  ev_timer deadline;
  ev_timer_init(&deadline, on_deadline, 15.0, 0.0);
  ev_timer_start(loop, &deadline);
  while (*counter < want && ev_is_active(&deadline))
    ev_run(loop, EVRUN_ONCE);
  ev_timer_stop(loop, &deadline);
}

typedef struct sync_seen {
  int calls;
  bool had_error;
  char code[32];                 /* the error's code */
  struct ev_loop *loop;          /* run_until's: stopped once called */
  berth_store *other;            /* a second connection to the same file, or NULL */
  bool visible_to_other;
} sync_seen;

static void on_synced(void *ud, const berth_error *err)
{
  sync_seen *w = ud;
  w->calls++;
  w->had_error = err != NULL;
  snprintf(w->code, sizeof w->code, "%s", err ? err->code : "");
  if (w->loop)
    ev_break(w->loop, EVBREAK_ONE);
  if (w->other) {
    berth_store_conv got;
    bool found = false;
    berth_error *e = berth_store_get_conv(w->other, "durable", &got, &found);
    berth_error_free(e);
    w->visible_to_other = found;
    berth_store_conv_clear(&got);
  }
}

/* Writes of one loop iteration share one transaction; a sync callback runs from the
 * loop, after the commit (with SQL: another connection already sees the row). */
static void test_one_flush_per_iteration_and_sync_after_commit(void **state)
{
  fixture *f = *state;
  berth_store_stats before, after;
  berth_store_get_stats(f->s, &before);
  sync_seen w = {0};
  if (strcmp(f->engine, "memory"))
    no_error(berth_store_open(NULL, f->url, &w.other));
  berth_store_conv r = record("durable", "k1");
  berth_store_put_conv(f->s, &r);
  for (unsigned i = 1; i <= 200; i++)
    berth_store_put_event(f->s, "durable", i, 1, "delta", "\"x\"");
  berth_store_sync(f->s, on_synced, &w);
  assert_int_equal(w.calls, 0);             /* never from the caller's stack */
  ev_run(f->loop, EVRUN_NOWAIT);
  if (strcmp(f->engine, "memory")) {
    /* Asynchronous: that iteration handed the batch over (to PostgreSQL's socket, to
     * SQLite's writer thread) and went on; the commit is answered later, and only
     * then, in a later iteration, is the callback called. */
    assert_int_equal(w.calls, 0);
    w.loop = f->loop;
    run_until(f->loop, &w.calls, 1);
  }
  assert_int_equal(w.calls, 1);
  assert_false(w.had_error);
  if (w.other)
    assert_true(w.visible_to_other);
  berth_store_get_stats(f->s, &after);
  assert_int_equal(after.flushes - before.flushes, 1);
  assert_int_equal(after.ops - before.ops, 202);
  assert_true(after.flush_seconds_max > 0);
  berth_store_free(w.other);
}

/* A prepare watcher that queues a write and a sync, once. */
typedef struct queuer {
  ev_prepare w;
  berth_store *s;
  sync_seen *seen;
  bool done;
} queuer;

static void on_queuer(struct ev_loop *loop, ev_prepare *w, int revents)
{
  (void)loop;
  (void)revents;
  queuer *q = w->data;
  if (q->done)
    return;
  q->done = true;
  berth_store_put_event(q->s, "late", 1, 1, "delta", "\"x\"");
  berth_store_sync(q->s, on_synced, q->seen);
}

/* What is queued from any callback of the loop is written and answered, a prepare
 * watcher's included: libev runs the prepare watchers in an order of its own, so the
 * store's own (which flushes) may have run already in that iteration, and the loop
 * must not then wait for something else to happen.  (`berth serve` queues a message
 * from MHD's callbacks, which run in the prepare phase when a stream the store's
 * answer resumed is kicked.)  Both orders: a queuer started after the store opened,
 * and one started before a second store on the same loop opened. */
static void test_writes_queued_from_a_prepare_watcher_are_flushed(void **state)
{
  fixture *f = *state;
  berth_store_conv r = record("late", "k1");
  berth_store_put_conv(f->s, &r);
  no_error(berth_store_flush(f->s));
  for (int order = 0; order < 2; order++) {
    sync_seen w = {.loop = f->loop};
    queuer q = {.seen = &w};
    ev_prepare_init(&q.w, on_queuer);
    q.w.data = &q;
    ev_prepare_start(f->loop, &q.w);
    berth_store *s2 = NULL;
    if (order == 1)
      no_error(berth_store_open(f->loop, f->url, &s2));
    q.s = s2 ? s2 : f->s;
    run_until(f->loop, &w.calls, 1);
    ev_prepare_stop(f->loop, &q.w);
    assert_true(q.done);
    assert_int_equal(w.calls, 1);
    assert_false(w.had_error);
    berth_store_free(s2);
  }
}

/* }====================================================== */

/* {====================================================== leases */

typedef struct lease_seen {
  struct ev_loop *loop;          /* stopped once answered */
  int calls;
  bool had_error;
  berth_store_lease lease;
} lease_seen;

static void on_lease(void *ud, const berth_error *err, const berth_store_lease *l)
{
  lease_seen *w = ud;
  w->calls++;
  w->had_error = err != NULL;
  if (l)
    w->lease = *l;
  ev_break(w->loop, EVBREAK_ONE);
}

/* Takes (or tries) the lease on handle s and runs the loop until it is answered. */
static berth_store_lease take(berth_store *s, struct ev_loop *loop, const char *id,
                              const char *host, int64_t ttl_ms)
{
  lease_seen w = {.loop = loop};
  berth_store_lease_take(s, id, host, ttl_ms, on_lease, &w);
  assert_int_equal(w.calls, 0);             /* never from the caller's stack */
  run_until(loop, &w.calls, 1);
  assert_int_equal(w.calls, 1);
  assert_false(w.had_error);
  return w.lease;
}

static void stored_conv(fixture *f, const char *id)
{
  berth_store_conv r = record(id, "k1");
  r.turns = 3;
  r.last_event = 9;
  berth_store_put_conv(f->s, &r);
  no_error(berth_store_flush(f->s));
}

/* A second handle on the same store, as another host has (memory: the same one). */
static berth_store *second_handle(fixture *f, struct ev_loop **loop2)
{
  *loop2 = f->loop;
  if (!strcmp(f->engine, "memory"))
    return f->s;
  *loop2 = ev_loop_new(EVFLAG_AUTO);
  berth_store *other = NULL;
  no_error(berth_store_open(*loop2, f->url, &other));
  return other;
}

static void close_second(fixture *f, berth_store *other, struct ev_loop *loop2)
{
  if (other == f->s)
    return;
  berth_store_free(other);
  ev_loop_destroy(loop2);
}

/* Two hosts (two handles) never both hold one lease: the second is told who holds it
 * and until when; the holder takes it again (extends it); the row's turns and last
 * event come back with the answer. */
static void test_lease_two_hosts_never_both_hold_one(void **state)
{
  fixture *f = *state;
  stored_conv(f, "L1");
  struct ev_loop *loop2;
  berth_store *other = second_handle(f, &loop2);

  berth_store_lease a = take(f->s, f->loop, "L1", "host-a", 60000);
  assert_true(a.found);
  assert_true(a.taken);
  assert_string_equal(a.holder, "host-a");
  assert_int_equal(a.turns, 3);
  assert_int_equal(a.last_event, 9);
  assert_int_equal(a.running_turn, 0);
  assert_true(a.expiry_ms > berth_store_now_ms() + 50000);

  berth_store_lease b = take(other, loop2, "L1", "host-b", 60000);
  assert_true(b.found);
  assert_false(b.taken);
  assert_string_equal(b.holder, "host-a");
  assert_true(b.expiry_ms == a.expiry_ms);

  berth_store_lease a2 = take(f->s, f->loop, "L1", "host-a", 60000);
  assert_true(a2.taken);
  assert_true(a2.expiry_ms >= a.expiry_ms);

  berth_store_conv got;
  bool found;
  no_error(berth_store_get_conv(other, "L1", &got, &found));
  assert_true(found);
  assert_string_equal(got.lease_holder, "host-a");
  assert_int_equal(got.turns, 3);
  berth_store_conv_clear(&got);

  /* a record's write leaves the lease alone */
  berth_store_conv r = record("L1", "k1");
  r.turns = 4;
  r.last_event = 9;
  berth_store_put_conv(f->s, &r);
  no_error(berth_store_flush(f->s));
  b = take(other, loop2, "L1", "host-b", 60000);
  assert_false(b.taken);
  assert_int_equal(b.turns, 4);

  berth_store_lease none = take(f->s, f->loop, "no-such", "host-a", 60000);
  assert_false(none.found);
  assert_false(none.taken);
  close_second(f, other, loop2);
}

/* A record never goes back: a stale copy's write (a late idle suspend on a host the
 * conversation left, after another host ran turns) leaves the newer record as it is,
 * through a second handle as another host writes; an equal or newer one is applied. */
static void test_a_record_never_goes_back(void **state)
{
  fixture *f = *state;
  stored_conv(f, "R1");                      /* turns 3, last event 9 */
  struct ev_loop *loop2;
  berth_store *other = second_handle(f, &loop2);
  berth_store_conv newer = record("R1", "k1");
  newer.turns = 5;
  newer.last_event = 20;
  newer.state = (char *)"{\"by\":\"host-b\"}";
  berth_store_put_conv(other, &newer);
  no_error(berth_store_flush(other));

  static const struct { uint32_t turns; uint64_t last; } stale[] = {{3, 9}, {5, 19}, {4, 30}};
  for (size_t i = 0; i < sizeof stale / sizeof *stale; i++) {
    berth_store_conv old = record("R1", "k1");
    old.turns = stale[i].turns;
    old.last_event = stale[i].last;
    old.status = BERTH_STORE_SUSPENDED;
    old.state = (char *)"{\"by\":\"host-a\"}";
    berth_store_put_conv(f->s, &old);
    no_error(berth_store_flush(f->s));
    berth_store_conv got;
    bool found;
    no_error(berth_store_get_conv(other, "R1", &got, &found));
    assert_true(found);
    assert_int_equal(got.turns, 5);
    assert_int_equal(got.last_event, 20);
    assert_int_equal(got.status, BERTH_STORE_OPEN);
    assert_string_equal(got.state, "{\"by\":\"host-b\"}");
    berth_store_conv_clear(&got);
  }
  /* equal counters: applied (a suspend after the last turn, on the host that ran it) */
  berth_store_conv same = newer;
  same.status = BERTH_STORE_SUSPENDED;
  berth_store_put_conv(f->s, &same);
  no_error(berth_store_flush(f->s));
  berth_store_conv got;
  bool found;
  no_error(berth_store_get_conv(other, "R1", &got, &found));
  assert_int_equal(got.status, BERTH_STORE_SUSPENDED);
  berth_store_conv_clear(&got);
  close_second(f, other, loop2);
}

/* A record queued after another of the same conversation, with no barrier between,
 * replaces it in the queue (store.h): the first is never written, the events between
 * are.  A sync and a lease operation are barriers: the record before one is written
 * (a lease take reads the row as it leaves it). */
static void test_a_newer_queued_record_supersedes_an_older_one(void **state)
{
  fixture *f = *state;
  berth_store_stats s0, s1;
  berth_store_get_stats(f->s, &s0);
  berth_store_conv r = record("S1", "k1");
  r.turns = 1;
  r.state = (char *)"{\"v\":1}";
  berth_store_put_conv(f->s, &r);
  berth_store_put_event(f->s, "S1", 1, 1, "user", "{}");
  r.turns = 2;
  r.last_event = 1;
  r.state = (char *)"{\"v\":2}";
  berth_store_put_conv(f->s, &r);
  berth_store_conv other = record("S2", "k1");  /* another conversation: not touched */
  berth_store_put_conv(f->s, &other);
  berth_store_get_stats(f->s, &s1);
  assert_int_equal(s1.superseded - s0.superseded, 1);
  no_error(berth_store_flush(f->s));
  berth_store_conv got;
  bool found;
  no_error(berth_store_get_conv(f->s, "S1", &got, &found));
  assert_true(found);
  assert_int_equal(got.turns, 2);
  assert_string_equal(got.state, "{\"v\":2}");
  berth_store_conv_clear(&got);
  no_error(berth_store_get_conv(f->s, "S2", &got, &found));
  assert_true(found);
  berth_store_conv_clear(&got);
  berth_store_event *ev;
  size_t n;
  no_error(berth_store_read_events(f->s, "S1", 0, 0, &ev, &n));
  assert_int_equal(n, 1);
  berth_store_events_free(ev, n);

  /* a sync between: both written, in order */
  r.turns = 3;
  berth_store_put_conv(f->s, &r);
  berth_store_sync(f->s, NULL, NULL);
  r.turns = 4;
  berth_store_put_conv(f->s, &r);
  berth_store_get_stats(f->s, &s0);
  assert_int_equal(s0.superseded, s1.superseded);
  no_error(berth_store_flush(f->s));

  /* a lease take between: it answers with the row the first record left */
  r.turns = 5;
  berth_store_put_conv(f->s, &r);
  lease_seen w = {.loop = f->loop};
  berth_store_lease_take(f->s, "S1", "host-a", 60000, on_lease, &w);
  r.turns = 6;
  berth_store_put_conv(f->s, &r);
  berth_store_get_stats(f->s, &s0);
  assert_int_equal(s0.superseded, s1.superseded);
  run_until(f->loop, &w.calls, 1);
  assert_int_equal(w.calls, 1);
  assert_false(w.had_error);
  assert_true(w.lease.taken);
  assert_int_equal(w.lease.turns, 5);
  no_error(berth_store_get_conv(f->s, "S1", &got, &found));
  assert_int_equal(got.turns, 6);
  berth_store_conv_clear(&got);
}

/* A lease its holder stopped renewing is taken over once it expired, and the former
 * holder then cannot take it back. */
static void test_lease_expired_is_taken_over(void **state)
{
  fixture *f = *state;
  stored_conv(f, "L2");
  struct ev_loop *loop2;
  berth_store *other = second_handle(f, &loop2);
  berth_store_lease a = take(f->s, f->loop, "L2", "host-a", 1);
  assert_true(a.taken);
  /* waiting for the expiry is the condition under test: the store's clock passing it */
  while (berth_store_now_ms() <= a.expiry_ms + 2) {
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
  berth_store_lease b = take(other, loop2, "L2", "host-b", 60000);
  assert_true(b.taken);
  assert_string_equal(b.holder, "host-b");
  berth_store_lease a2 = take(f->s, f->loop, "L2", "host-a", 60000);
  assert_false(a2.taken);
  assert_string_equal(a2.holder, "host-b");
  close_second(f, other, loop2);
}

typedef struct fenced_seen {
  int calls;
  char id[32];
} fenced_seen;

static void on_fenced(void *ud, const char *id)
{
  fenced_seen *w = ud;
  w->calls++;
  snprintf(w->id, sizeof w->id, "%s", id);
}

static size_t events_of(berth_store *s, const char *id)
{
  berth_store_event *ev;
  size_t n;
  no_error(berth_store_read_events(s, id, 0, 0, &ev, &n));
  berth_store_events_free(ev, n);
  return n;
}

/* The fence (store.h): a host writes a stored conversation's record, messages and
 * events only while it holds the lease.  A host whose lease expired and was taken
 * over has its late writes refused, counted and told, while the new holder's are
 * applied; a conversation not stored yet is written by anyone. */
static void test_fence_refuses_writes_of_a_lease_another_host_took(void **state)
{
  fixture *f = *state;
  stored_conv(f, "F1");                           /* turns 3, last event 9 */
  struct ev_loop *loop2;
  berth_store *other = second_handle(f, &loop2);
  if (other == f->s) {                            /* memory: one handle, one fence */
    berth_store_fence(f->s, "host-a");
    berth_store_put_event(f->s, "F1", 10, 4, "delta", "{}");
    no_error(berth_store_flush(f->s));
    berth_store_stats st;
    berth_store_get_stats(f->s, &st);
    assert_int_equal(st.fenced, 1);               /* nobody holds it: not host-a */
    assert_int_equal(events_of(f->s, "F1"), 0);
    assert_true(take(f->s, f->loop, "F1", "host-a", 60000).taken);
    berth_store_put_event(f->s, "F1", 10, 4, "delta", "{}");
    no_error(berth_store_flush(f->s));
    assert_int_equal(events_of(f->s, "F1"), 1);
    return;
  }
  berth_store_fence(f->s, "host-a");
  berth_store_fence(other, "host-b");
  fenced_seen fa = {0}, fb = {0};
  berth_store_on_fenced(f->s, on_fenced, &fa);
  berth_store_on_fenced(other, on_fenced, &fb);

  /* A holds it (briefly): its writes apply, B's do not */
  berth_store_lease a = take(f->s, f->loop, "F1", "host-a", 300);
  assert_true(a.taken);
  berth_store_put_event(f->s, "F1", 10, 4, "user", "{}");
  const char *m = "{\"role\":\"user\"}";
  berth_store_put_messages(f->s, "F1", 0, &m, 1, false);
  berth_store_conv r = record("F1", "k1");
  r.turns = 4;
  r.last_event = 10;
  r.n_messages = 1;
  berth_store_put_conv(f->s, &r);
  no_error(berth_store_flush(f->s));
  assert_int_equal(fa.calls, 0);
  berth_store_put_event(other, "F1", 11, 4, "delta", "{\"by\":\"b\"}");
  no_error(berth_store_flush(other));
  assert_int_equal(fb.calls, 1);
  assert_string_equal(fb.id, "F1");
  assert_int_equal(events_of(other, "F1"), 1);

  /* A's lease expires and B takes it over: now A's late writes are refused */
  while (berth_store_now_ms() <= a.expiry_ms + 2) {   /* the expiry is under test */
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
  berth_store_lease b = take(other, loop2, "F1", "host-b", 60000);
  assert_true(b.taken);
  assert_int_equal(b.turns, 4);
  assert_int_equal(b.last_event, 10);
  berth_store_put_event(f->s, "F1", 11, 4, "delta", "{\"by\":\"a\"}");
  const char *m2 = "{\"role\":\"assistant\",\"by\":\"a\"}";
  berth_store_put_messages(f->s, "F1", 1, &m2, 1, false);
  r.turns = 5;
  r.last_event = 11;
  r.n_messages = 2;
  r.state = (char *)"{\"by\":\"a\"}";
  berth_store_put_conv(f->s, &r);
  no_error(berth_store_flush(f->s));
  assert_int_equal(fa.calls, 3);
  berth_store_stats st;
  berth_store_get_stats(f->s, &st);
  assert_int_equal(st.fenced, 3);
  berth_store_put_event(other, "F1", 11, 5, "user", "{\"by\":\"b\"}");
  no_error(berth_store_flush(other));

  berth_store_event *ev;
  size_t n;
  no_error(berth_store_read_events(other, "F1", 0, 0, &ev, &n));
  assert_int_equal(n, 2);
  assert_string_equal(ev[1].data, "{\"by\":\"b\"}");
  berth_store_events_free(ev, n);
  char **msgs;
  no_error(berth_store_load_messages(other, "F1", &msgs, &n));
  assert_int_equal(n, 1);
  berth_store_texts_free(msgs, n);
  /* A's replacing its messages is refused too, and B's message stays; the events of a
   * conversation not stored yet are written under any fence */
  const char *m3 = "{\"role\":\"user\",\"by\":\"a\"}";
  berth_store_put_messages(f->s, "F1", 0, &m3, 1, true);
  berth_store_put_event(f->s, "F3", 1, 1, "user", "{}");
  no_error(berth_store_flush(f->s));
  assert_int_equal(fa.calls, 4);
  no_error(berth_store_load_messages(other, "F1", &msgs, &n));
  assert_int_equal(n, 1);
  assert_string_equal(msgs[0], "{\"role\":\"user\"}");
  berth_store_texts_free(msgs, n);
  assert_int_equal(events_of(other, "F3"), 1);
  berth_store_conv got;
  bool found;
  no_error(berth_store_get_conv(other, "F1", &got, &found));
  assert_int_equal(got.turns, 4);
  assert_null(got.state);
  assert_string_equal(got.lease_holder, "host-b");
  berth_store_conv_clear(&got);

  /* a new conversation is created under any fence */
  berth_store_conv fresh = record("F2", "k1");
  berth_store_put_conv(f->s, &fresh);
  no_error(berth_store_flush(f->s));
  no_error(berth_store_get_conv(other, "F2", &got, &found));
  assert_true(found);
  berth_store_conv_clear(&got);
  close_second(f, other, loop2);
}

static void on_renewed(void *ud, const berth_error *err)
{
  sync_seen *w = ud;
  w->calls++;
  w->had_error = err != NULL;
  ev_break(w->loop, EVBREAK_ONE);
}

/* Renewing extends every lease of that host (and only that host's). */
static void test_lease_renew_extends_the_hosts_leases(void **state)
{
  fixture *f = *state;
  stored_conv(f, "R1");
  stored_conv(f, "R2");
  stored_conv(f, "R3");
  berth_store_lease a1 = take(f->s, f->loop, "R1", "host-a", 1000);
  berth_store_lease a2 = take(f->s, f->loop, "R2", "host-a", 1000);
  berth_store_lease b3 = take(f->s, f->loop, "R3", "host-b", 1000);
  assert_true(a1.taken && a2.taken && b3.taken);
  sync_seen w = {.loop = f->loop};
  berth_store_lease_renew(f->s, "host-a", 600000, on_renewed, &w);
  run_until(f->loop, &w.calls, 1);
  assert_int_equal(w.calls, 1);
  assert_false(w.had_error);
  const char *ids[] = {"R1", "R2", "R3"};
  for (int i = 0; i < 3; i++) {
    berth_store_conv got;
    bool found;
    no_error(berth_store_get_conv(f->s, ids[i], &got, &found));
    assert_true(found);
    if (i < 2)
      assert_true(got.lease_expiry_ms > a1.expiry_ms + 500000);
    else
      assert_true(got.lease_expiry_ms <= b3.expiry_ms);
    berth_store_conv_clear(&got);
  }
}

/* Releasing frees the lease for anyone, but only its holder's release counts; clearing
 * frees every lease. */
static void test_lease_release_frees_it(void **state)
{
  fixture *f = *state;
  stored_conv(f, "F1");
  stored_conv(f, "F2");
  assert_true(take(f->s, f->loop, "F1", "host-a", 60000).taken);
  berth_store_lease_release(f->s, "F1", "host-b");          /* not its holder */
  assert_false(take(f->s, f->loop, "F1", "host-b", 60000).taken);
  berth_store_lease_release(f->s, "F1", "host-a");
  berth_store_lease b = take(f->s, f->loop, "F1", "host-b", 60000);
  assert_true(b.taken);
  berth_store_conv got;
  bool found;
  assert_true(take(f->s, f->loop, "F2", "host-c", 60000).taken);
  berth_store_lease_clear_all(f->s);
  no_error(berth_store_flush(f->s));
  no_error(berth_store_get_conv(f->s, "F2", &got, &found));
  assert_null(got.lease_holder);
  berth_store_conv_clear(&got);
  assert_true(take(f->s, f->loop, "F1", "host-d", 60000).taken);
}

/* A lease taken over from a host that died in a turn: that one conversation's turn is
 * marked interrupted, as at a single host's restart. */
static void test_lease_takeover_marks_that_turn_interrupted(void **state)
{
  fixture *f = *state;
  berth_store_conv r = record("T1", "k1");
  r.turns = 2;
  r.running_turn = 2;
  r.last_event = 5;
  berth_store_put_conv(f->s, &r);
  berth_store_put_event(f->s, "T1", 6, 2, "delta", "\"d\"");
  berth_store_conv q = record("T2", "k1");
  q.running_turn = 1;
  berth_store_put_conv(f->s, &q);
  no_error(berth_store_flush(f->s));
  berth_store_lease l = take(f->s, f->loop, "T1", "host-b", 60000);
  assert_true(l.taken);
  assert_int_equal(l.running_turn, 2);
  bool marked = false;
  no_error(berth_store_mark_interrupted_one(f->s, "T1", &marked));
  assert_true(marked);
  berth_store_event *ev;
  size_t n;
  no_error(berth_store_read_events(f->s, "T1", 6, 0, &ev, &n));
  assert_int_equal(n, 2);
  assert_string_equal(ev[0].kind, "error");
  assert_non_null(strstr(ev[0].data, "\"interrupted\""));
  assert_string_equal(ev[1].kind, "turn_end");
  assert_int_equal(ev[1].turn, 2);
  berth_store_events_free(ev, n);
  berth_store_conv got;
  bool found;
  no_error(berth_store_get_conv(f->s, "T1", &got, &found));
  assert_int_equal(got.running_turn, 0);
  assert_int_equal(got.status, BERTH_STORE_INTERRUPTED);
  assert_string_equal(got.lease_holder, "host-b");         /* still the taker's */
  berth_store_conv_clear(&got);
  no_error(berth_store_get_conv(f->s, "T2", &got, &found));
  assert_int_equal(got.running_turn, 1);                    /* another one: untouched */
  berth_store_conv_clear(&got);
  no_error(berth_store_mark_interrupted_one(f->s, "T1", &marked));
  assert_false(marked);
}

static uint64_t find_message(berth_store *s, const char *id, const char *mid,
                             uint64_t before)
{
  uint64_t seq = 99;
  bool found = true;
  no_error(berth_store_find_message(s, id, mid, before, &seq, &found));
  assert_true(found == (seq != 0));
  return seq;
}

/* A message id is found by the store (its index): the latest "user" event that was
 * written with it, and an earlier one below `before`; not another conversation's, not
 * one only in an event's JSON, nor one that event was written again without. */
static void test_find_message_by_id(void **state)
{
  fixture *f = *state;
  berth_store_conv r = record("F1", "k1");
  berth_store_put_conv(f->s, &r);
  static const char weird[] = "id \"q\" \\ é/ü";   /* stored as given: no JSON */
  /* by turn: "a" (1, and 5 again), none, "b", weird, and "c" sent while
   * turn 5 still ran (a queued message is numbered with the running turn) */
  const char *const mids[] = {NULL, "a", NULL, "b", weird, "a", "c"};
  uint64_t seq = 0;
  for (uint32_t turn = 1; turn <= 6; turn++) {
    const char *mid = mids[turn];
    char data[96];
    if (mid)
      snprintf(data, sizeof data, "{\"text\":\"t%u\",\"messageId\":\"%s\"}", turn,
               mid == weird ? "w" : mid);
    else
      snprintf(data, sizeof data, "{\"text\":\"t%u\"}", turn);
    berth_store_put_user_event(f->s, "F1", ++seq, turn == 6 ? 5 : turn, data, mid);
    if (turn == 5)
      continue;
    for (int d = 0; d < 3; d++)
      berth_store_put_event(f->s, "F1", ++seq, turn, "delta", "\"x\"");
    berth_store_put_event(f->s, "F1", ++seq, turn, "turn_end", "{\"ok\":true}");
  }
  /* the same id in a conversation alone, and an id only in an event's JSON */
  berth_store_conv q = record("F2", "k1");
  berth_store_put_conv(f->s, &q);
  berth_store_put_user_event(f->s, "F2", 1, 1, "{\"text\":\"x\",\"messageId\":\"z\"}",
                             "z");
  berth_store_put_event(f->s, "F2", 2, 1, "user",
                        "{\"text\":\"y\",\"messageId\":\"j\"}");
  berth_store_put_user_event(f->s, "F2", 3, 2, "{\"text\":\"z\"}", NULL);

  /* (no flush: a find sees every write queued before it) */
  assert_int_equal(find_message(f->s, "F1", "a", 0), 21);        /* the latest */
  assert_int_equal(find_message(f->s, "F1", "a", 21), 1);        /* the one before */
  assert_int_equal(find_message(f->s, "F1", "a", 1), 0);
  assert_int_equal(find_message(f->s, "F1", "b", 0), 11);
  assert_int_equal(find_message(f->s, "F1", weird, 0), 16);
  assert_int_equal(find_message(f->s, "F1", "c", 0), 22);
  assert_int_equal(find_message(f->s, "F1", "zz", 0), 0);        /* unknown */
  assert_int_equal(find_message(f->s, "F1", "z", 0), 0);         /* F2's */
  assert_int_equal(find_message(f->s, "F2", "a", 0), 0);         /* F1's */
  assert_int_equal(find_message(f->s, "F2", "z", 0), 1);
  assert_int_equal(find_message(f->s, "F2", "j", 0), 0);         /* only in its JSON */
  assert_int_equal(find_message(f->s, "nope", "a", 0), 0);

  /* the events read as before, from the one found on */
  berth_store_event *ev;
  size_t n;
  no_error(berth_store_read_events(f->s, "F1", 11 - 1, 0, &ev, &n));
  assert_int_equal(n, 26 - 10);
  assert_int_equal(ev[0].seq, 11);
  assert_int_equal(ev[0].turn, 3);
  assert_string_equal(ev[0].kind, "user");
  assert_string_equal(ev[0].data, "{\"text\":\"t3\",\"messageId\":\"b\"}");
  assert_string_equal(ev[4].kind, "turn_end");
  assert_string_equal(ev[n - 1].kind, "turn_end");
  assert_int_equal(ev[n - 1].seq, 26);
  berth_store_events_free(ev, n);

  /* an event written again is replaced whole: its id goes (or comes) with it */
  berth_store_put_event(f->s, "F1", 11, 3, "user", "{\"text\":\"t3\"}");
  berth_store_put_user_event(f->s, "F1", 12, 3, "{\"text\":\"t3\"}", "b");
  assert_int_equal(find_message(f->s, "F1", "b", 0), 12);
  assert_int_equal(find_message(f->s, "F1", "b", 12), 0);
  no_error(berth_store_flush(f->s));
  assert_int_equal(find_message(f->s, "F1", "a", 0), 21);
}

/* The schema version 2 (before message ids) as it was, with a conversation whose "user"
 * event holds its messageId in its JSON only; then version 1 (before leases). */
#define DOWNGRADE_TO_2 \
  "DROP INDEX events_by_message_id;" \
  "ALTER TABLE events DROP COLUMN message_id;" \
  "UPDATE schema_version SET version = 2;"
#define OLD_CONVERSATION \
  "INSERT INTO conversations (id, caller, run_id, status, created_ms, updated_ms, turns," \
  " last_event) VALUES ('old', 'k1', 'conv-old', 'suspended', 1, 2, 7, 30);" \
  "INSERT INTO events (conv, seq, turn, kind, data) VALUES" \
  " ('old', 27, 7, 'user', '{\"text\":\"hi\",\"messageId\":\"m-old\"}')," \
  " ('old', 28, 7, 'turn_end', '{\"ok\":true}')," \
  " ('old', 29, 8, 'user', '{\"text\":\"no id\"}');"
static const char downgrade_to_2[] = DOWNGRADE_TO_2 OLD_CONVERSATION;
/* (and a text that is not JSON, which berth never writes: it gets no id, and the
 * migration does not fail on it) */
static const char downgrade_to_1[] =
  DOWNGRADE_TO_2
  "DROP INDEX conversations_leased;"
  "ALTER TABLE conversations DROP COLUMN lease_holder;"
  "ALTER TABLE conversations DROP COLUMN lease_expiry_ms;"
  "UPDATE schema_version SET version = 1;"
  OLD_CONVERSATION
  "INSERT INTO events (conv, seq, turn, kind, data) VALUES"
  " ('old', 30, 8, 'user', 'not JSON, \"messageId\":\"m-old\"');";

/* An old store is migrated to BERTH_STORE_SCHEMA at open: its conversations and events
 * kept and readable, leases work (2), and the message ids its "user" events held in
 * their JSON are found through the index (3). */
static void check_migrated(fixture *f)
{
  berth_store_conv got;
  bool found;
  no_error(berth_store_get_conv(f->s, "old", &got, &found));
  assert_true(found);
  assert_int_equal(got.turns, 7);
  assert_int_equal(got.status, BERTH_STORE_SUSPENDED);
  assert_null(got.lease_holder);
  berth_store_conv_clear(&got);
  berth_store_lease l = take(f->s, f->loop, "old", "host-a", 60000);
  assert_true(l.taken);
  assert_int_equal(l.last_event, 30);
  berth_store_event *ev;
  size_t n;
  no_error(berth_store_read_events(f->s, "old", 0, 0, &ev, &n));
  assert_true(n == 3 || n == 4);
  assert_int_equal(ev[0].seq, 27);
  assert_string_equal(ev[0].kind, "user");
  assert_string_equal(ev[0].data, "{\"text\":\"hi\",\"messageId\":\"m-old\"}");
  if (n == 4)
    assert_string_equal(ev[3].data, "not JSON, \"messageId\":\"m-old\"");
  berth_store_events_free(ev, n);
  assert_int_equal(find_message(f->s, "old", "m-old", 0), 27);
  assert_int_equal(find_message(f->s, "old", "no id", 0), 0);
  /* new ones are written and found beside the old */
  berth_store_put_user_event(f->s, "old", 31, 9, "{\"text\":\"again\"}", "m-old");
  assert_int_equal(find_message(f->s, "old", "m-old", 0), 31);
  assert_int_equal(find_message(f->s, "old", "m-old", 31), 27);
}

/* {====================================================== SQLite files */

static void sql_on_file(const char *path, const char *text)
{
  sqlite3 *db;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  char *err = NULL;
  if (sqlite3_exec(db, text, NULL, NULL, &err) != SQLITE_OK)
    fail_msg("%s: %s", text, err);
  sqlite3_close(db);
}

/* The integer one query answers on the file, read through a connection of its own. */
static int int_on_file(const char *path, const char *sql)
{
  sqlite3 *db;
  sqlite3_stmt *q;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &q, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(q), SQLITE_ROW);
  int v = sqlite3_column_int(q, 0);
  sqlite3_finalize(q);
  sqlite3_close(db);
  return v;
}

static int version_on_file(const char *path)
{
  return int_on_file(path, "SELECT version FROM schema_version");
}

static void test_sqlite_keeps_everything_across_reopening(void **state)
{
  fixture *f = *state;
  berth_store_conv r = record("kept", "k1");
  r.state = (char *)"{\"n\":1}";
  berth_store_put_conv(f->s, &r);
  const char *m = "{\"role\":\"user\",\"content\":\"x\"}";
  berth_store_put_messages(f->s, "kept", 0, &m, 1, false);
  berth_store_free(f->s);       /* flushes */
  f->s = NULL;
  assert_int_equal(version_on_file(f->path), BERTH_STORE_SCHEMA);
  no_error(berth_store_open(f->loop, f->url, &f->s));
  berth_store_conv got;
  bool found;
  no_error(berth_store_get_conv(f->s, "kept", &got, &found));
  assert_true(found);
  assert_string_equal(got.state, "{\"n\":1}");
  berth_store_conv_clear(&got);
  char **v;
  size_t n;
  no_error(berth_store_load_messages(f->s, "kept", &v, &n));
  assert_int_equal(n, 1);
  assert_string_equal(v[0], m);
  berth_store_texts_free(v, n);
}

static off_t file_size(const char *path)
{
  struct stat st;
  return stat(path, &st) == 0 ? st.st_size : -1;
}

/* A JSON string of len bytes, quotes included (malloc'd). */
static char *json_string_of(size_t len, char fill)
{
  char *v = malloc(len + 1);
  assert_non_null(v);
  memset(v, fill, len);
  v[0] = v[len - 1] = '"';
  v[len] = 0;
  return v;
}

/* `flushes` flushes of 400 events of `data` each, spread over conversations w0..w49. */
static void write_events(fixture *f, uint64_t *seq, int flushes, const char *data)
{
  for (int flush = 0; flush < flushes; flush++) {
    for (int i = 0; i < 400; i++) {
      char id[16];
      snprintf(id, sizeof id, "w%d", i % 50);
      berth_store_put_event(f->s, id, ++*seq, 1, "delta", data);
    }
    no_error(berth_store_flush(f->s));
  }
}

static void on_poll(struct ev_loop *loop, ev_timer *t, int revents)
{
  (void)revents;
  ev_break(loop, EVBREAK_ONE);
  (void)t;
}

/* Checkpoints are made off the loop's thread (sqlite_checkpoint.h): once the WAL
 * crossed its threshold, its pages reach the database file while the store stays
 * open and the loop does nothing but wait; the WAL stays bounded however much is
 * written. */
static void test_sqlite_checkpoints_off_the_loop_and_bounds_the_wal(void **state)
{
  fixture *f = *state;
  char wal[160];
  snprintf(wal, sizeof wal, "%s-wal", f->path);
  off_t db0 = file_size(f->path);
  char *big = json_string_of(3000, 'x');
  uint64_t seq = 0;
  write_events(f, &seq, 4, big);   /* ~1 600 pages: past the threshold once */
  /* the thread copies the pages: polled for up to 15 s, the loop otherwise idle */
  ev_timer poll;
  ev_timer_init(&poll, on_poll, 0.02, 0.02);
  ev_timer_start(f->loop, &poll);
  double until = ev_now(f->loop) + 15;
  berth_store_stats st;
  berth_store_get_stats(f->s, &st);
  while (st.checkpoints < 1 && ev_now(f->loop) < until) {
    ev_run(f->loop, EVRUN_ONCE);
    berth_store_get_stats(f->s, &st);
  }
  ev_timer_stop(f->loop, &poll);
  assert_true(st.checkpoints >= 1);             /* by the thread, not in a commit */
  assert_true(file_size(f->path) >= db0 + 4 * 1024 * 1024);

  /* much more, without pause: the WAL stays under its bound (pages of 4 KiB + 24) */
  write_events(f, &seq, 60, big);
  free(big);
  off_t wal_size = file_size(wal);
  assert_true(wal_size > 0);
  assert_true(wal_size <= (off_t)(8000 + 2000) * (4096 + 24) + 32);
  berth_store_event *ev;
  size_t n;
  no_error(berth_store_read_events(f->s, "w7", 0, 0, &ev, &n));
  assert_int_equal(n, 64 * 8);
  berth_store_events_free(ev, n);
}

static void exec_ok(sqlite3 *db, const char *sql)
{
  char *err = NULL;
  if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK)
    fail_msg("%s: %s", sql, err ? err : "?");
}

static void sleep_ms(int ms)
{
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* The WAL starts over even while the writer writes on (sqlite_checkpoint.h): the
 * thread's checkpoint copies what was committed while a write transaction is open,
 * and after that transaction's commit the writer copies the rest (lite_ckpt_finish:
 * the transaction's pages), so the write after it begins the WAL again.  Left to the
 * thread, the write after the commit would find that commit's pages not copied yet
 * and append to the WAL.
 *
 * One attempt: 1 when the WAL started over, 0 when it grew, -1 when the thread's
 * checkpoint lost its race with the transaction's start.  A PASSIVE checkpoint gives
 * up the frames a reader's mark is being moved past, and BEGIN moves one: then it
 * copies nothing new, the commit finds too much left to finish and wakes the thread
 * again, which shows as a second checkpoint (seen about once in ten runs with /tmp
 * a tmpfs; harmless in the store, whose WAL then starts over a cycle later). */
static int wal_starts_over(const char *dir, int attempt)
{
  char path[200], wal[210];
  snprintf(path, sizeof path, "%s/ckpt%d.db", dir, attempt);
  snprintf(wal, sizeof wal, "%s-wal", path);
  sqlite3 *db;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  exec_ok(db, "PRAGMA journal_mode = WAL; CREATE TABLE t (x BLOB)");
  lite_ckpt *c = lite_ckpt_start(db, path);
  assert_non_null(c);
  /* past the threshold in one commit (a row a page), which wakes the thread */
  char sql[200];
  snprintf(sql, sizeof sql, "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 "
                            "FROM n WHERE i < %d) INSERT INTO t SELECT zeroblob(3000) "
                            "FROM n", LITE_CKPT_FRAMES + 300);
  exec_ok(db, sql);
  /* the thread copies it while a write transaction is open (polled for up to 15 s) */
  exec_ok(db, "BEGIN IMMEDIATE; INSERT INTO t VALUES (zeroblob(3000))");
  for (int i = 0; i < 3000 && lite_ckpt_made(c) < 1; i++)
    sleep_ms(5);
  assert_int_equal(lite_ckpt_made(c), 1);
  exec_ok(db, "COMMIT");
  lite_ckpt_finish(c, db);      /* as the store's writer does after each transaction */
  /* at once: the next write starts the WAL from its beginning, so the file does not
   * grow (appended, its pages would make it longer) */
  off_t before = file_size(wal);
  assert_true(before >= (off_t)LITE_CKPT_FRAMES * 4096);
  exec_ok(db, "INSERT INTO t VALUES (1)");
  int verdict = file_size(wal) == before;
  if (!verdict) {             /* the lost race, or a WAL that never starts over */
    for (int i = 0; i < 3000 && lite_ckpt_made(c) < 2; i++)
      sleep_ms(5);
    if (lite_ckpt_made(c) >= 2)
      verdict = -1;
  }
  lite_ckpt_stop(c, db);
  sqlite3_close(db);
  char shm[210];
  snprintf(shm, sizeof shm, "%s-shm", path);
  unlink(path);
  unlink(wal);
  unlink(shm);
  return verdict;
}

static void test_sqlite_checkpoint_thread_starts_the_wal_over(void **state)
{
  fixture *f = *state;
  int verdict = -1;
  for (int attempt = 1; attempt <= 5 && verdict < 0; attempt++)
    verdict = wal_starts_over(f->dir, attempt);
  if (verdict < 0)
    fail_msg("5 times the WAL grew and the thread was woken again: its checkpoint lost "
             "the race with the transaction each time, or lite_ckpt_finish copied nothing");
  if (verdict == 0)
    fail_msg("the WAL grew: the write after lite_ckpt_finish did not start it over");
}

/* Answers are called at most BERTH_STORE_ANSWERS_PER_ITERATION per loop iteration,
 * the rest in the next ones, in the order of their syncs (store.h): 3 times that many
 * syncs answered by one commit take at least 3 iterations.  The answers left over
 * must keep the loop from blocking (nothing else here would wake it before the
 * deadline); the last answer comes from the store's prepare watcher, so the test
 * breaks the loop there rather than let that iteration wait for an event. */
typedef struct answers {
  int calls, out_of_order, expected;
  struct ev_loop *loop;
} answers;

typedef struct answer_slot {
  answers *a;
  int index;
} answer_slot;

static void on_answer(void *ud, const berth_error *err)
{
  answer_slot *slot = ud;
  if (err || slot->index != slot->a->calls)
    slot->a->out_of_order++;
  slot->a->calls++;
  if (slot->a->calls == slot->a->expected)
    ev_break(slot->a->loop, EVBREAK_ONE);
}

static void test_answers_per_iteration_are_bounded(void **state)
{
  fixture *f = *state;
  enum { N = 3 * BERTH_STORE_ANSWERS_PER_ITERATION };
  answers a = {0, 0, N, f->loop};
  answer_slot *slots = calloc(N, sizeof *slots);
  for (int i = 0; i < N; i++) {
    berth_store_put_event(f->s, "answered", (uint64_t)i + 1, 1, "delta", "\"x\"");
    slots[i] = (answer_slot){&a, i};
    berth_store_sync(f->s, on_answer, &slots[i]);
  }
  ev_timer deadline;
  ev_timer_init(&deadline, on_deadline, 15.0, 0.0);
  ev_timer_start(f->loop, &deadline);
  int most = 0, iterations = 0;
  while (a.calls < N && ev_is_active(&deadline)) {
    int before = a.calls;
    ev_run(f->loop, EVRUN_ONCE);
    iterations++;
    if (a.calls - before > most)
      most = a.calls - before;
  }
  ev_timer_stop(f->loop, &deadline);
  free(slots);
  assert_int_equal(a.calls, N);
  assert_int_equal(a.out_of_order, 0);
  assert_true(most > 0 && most <= BERTH_STORE_ANSWERS_PER_ITERATION);
  assert_true(iterations >= 3);
}

/* SQLite's batches are applied on the store's writer thread (sqlite_writer.h): the
 * loop goes on meanwhile.  Another connection holds the file's write lock, so the
 * writer cannot commit; a timer of the loop finds the sync unanswered, and only then
 * lets the lock go.  Were the batch applied on the loop, the flush would wait out
 * the lock inside ev_prepare and fail, and the sync's answer (an error) would come
 * before the timer.  Then every write is there, once, in order. */
typedef struct lock_holder {
  sqlite3 *db;
  const sync_seen *w;
  int ran;
  bool sync_was_pending, released;
} lock_holder;

static void on_release_lock(struct ev_loop *loop, ev_timer *t, int revents)
{
  (void)loop;
  (void)revents;
  lock_holder *lh = t->data;
  lh->ran++;
  lh->sync_was_pending = lh->w->calls == 0;
  lh->released = sqlite3_exec(lh->db, "COMMIT", NULL, NULL, NULL) == SQLITE_OK;
}

static void test_sqlite_batches_are_applied_off_the_loop(void **state)
{
  fixture *f = *state;
  sqlite3 *db;
  assert_int_equal(sqlite3_open(f->path, &db), SQLITE_OK);
  assert_int_equal(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
  char *big = json_string_of(1024, 'y');
  for (uint64_t seq = 1; seq <= 4000; seq++)
    berth_store_put_event(f->s, seq % 2 ? "odd" : "even", seq, 1, "delta", big);
  free(big);
  sync_seen w = {.loop = f->loop};
  berth_store_sync(f->s, on_synced, &w);
  lock_holder lh = {db, &w, 0, false, false};
  ev_timer t;
  ev_timer_init(&t, on_release_lock, 0., 0.);
  t.data = &lh;
  ev_timer_start(f->loop, &t);
  run_until(f->loop, &w.calls, 1);
  ev_timer_stop(f->loop, &t);
  sqlite3_close(db);
  assert_int_equal(lh.ran, 1);
  assert_true(lh.sync_was_pending);
  assert_true(lh.released);
  assert_int_equal(w.calls, 1);
  assert_false(w.had_error);
  berth_store_stats st;
  berth_store_get_stats(f->s, &st);
  assert_int_equal(st.queued, 0);
  assert_int_equal(st.failures, 0);
  const char *ids[] = {"odd", "even"};
  for (int i = 0; i < 2; i++) {
    berth_store_event *ev;
    size_t n;
    no_error(berth_store_read_events(f->s, ids[i], 0, 0, &ev, &n));
    assert_int_equal(n, 2000);
    for (size_t k = 0; k < n; k++)
      assert_int_equal(ev[k].seq, 2 * k + (i == 0 ? 1 : 2));
    berth_store_events_free(ev, n);
  }
}

static void test_sqlite_newer_schema_is_refused_untouched(void **state)
{
  fixture *f = *state;
  berth_store_free(f->s);
  f->s = NULL;
  sql_on_file(f->path, "UPDATE schema_version SET version = 99");
  berth_store *s = NULL;
  berth_error *e = berth_store_open(f->loop, f->url, &s);
  assert_non_null(e);
  assert_null(s);
  assert_string_equal(e->code, "version");
  assert_non_null(strstr(e->message, "newer berth"));
  assert_non_null(strstr(e->message, "schema version 99"));
  assert_non_null(strstr(e->message, f->path));
  berth_error_free(e);
  assert_int_equal(version_on_file(f->path), 99);
}

static void test_sqlite_corrupt_or_foreign_file_is_refused(void **state)
{
  fixture *f = *state;
  berth_store_free(f->s);
  f->s = NULL;
  char p[200];
  snprintf(p, sizeof p, "%s-wal", f->path);
  unlink(p);
  snprintf(p, sizeof p, "%s-shm", f->path);
  unlink(p);
  FILE *out = fopen(f->path, "w");
  assert_non_null(out);
  for (int i = 0; i < 4096; i++)
    fputc("garbage!"[i % 8], out);
  fclose(out);
  berth_store *s = NULL;
  berth_error *e = berth_store_open(f->loop, f->url, &s);
  assert_non_null(e);
  assert_null(s);
  assert_string_equal(e->code, "data_loss");
  assert_non_null(strstr(e->message, "not a readable berth database"));
  berth_error_free(e);

  unlink(f->path);
  sql_on_file(f->path, "CREATE TABLE accounts (name TEXT)");
  e = berth_store_open(f->loop, f->url, &s);
  assert_non_null(e);
  assert_string_equal(e->code, "data_loss");
  assert_non_null(strstr(e->message, "not a berth store"));
  berth_error_free(e);
}

/* What berth_store_claim promises (store.h): one host alone on a SQLite file.  A
 * second claim fails, from another handle of this process or from another process,
 * while the first handle is open, and says why; the file stays readable meanwhile;
 * once the first handle closed, a claim succeeds again. */
static int claim_in_child(const char *url)
{
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    berth_store *s = NULL;
    berth_error *e = berth_store_open(NULL, url, &s);
    if (!e)
      e = berth_store_claim(s);
    int code = !e ? 0 : !strcmp(e->code, "unavailable") ? 3 : 4;
    _exit(code);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  return WEXITSTATUS(st);
}

static void test_sqlite_a_second_host_cannot_claim_the_file(void **state)
{
  fixture *f = *state;
  no_error(berth_store_claim(f->s));
  no_error(berth_store_claim(f->s));            /* again on the same handle */
  struct ev_loop *loop2;
  berth_store *other = second_handle(f, &loop2);
  berth_error *e = berth_store_claim(other);
  assert_non_null(e);
  assert_string_equal(e->code, "unavailable");
  assert_non_null(strstr(e->message, "in use by another berth"));
  assert_non_null(strstr(e->message, f->path));
  berth_error_free(e);
  assert_int_equal(claim_in_child(f->url), 3);
  berth_store_conv got;                          /* the claim is no lock on reading */
  bool found;
  no_error(berth_store_get_conv(other, "nobody", &got, &found));
  assert_false(found);
  close_second(f, other, loop2);
  berth_store_free(f->s);
  f->s = NULL;
  assert_int_equal(claim_in_child(f->url), 0);
  no_error(berth_store_open(f->loop, f->url, &f->s));
  no_error(berth_store_claim(f->s));
}

static void test_bad_urls_are_refused(void **state)
{
  (void)state;
  static const char *const bad[] = {"", "sqlite:", "redis://x",
                                    "postgresql:///db?no_such_option=1",
                                    "postgresql://[::1/db"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    berth_store *s = NULL;
    berth_error *e = berth_store_open(NULL, bad[i], &s);
    assert_non_null(e);
    assert_null(s);
    assert_string_equal(e->code, "invalid_argument");
    berth_error_free(e);
  }
}

/* }====================================================== */

static void test_sqlite_version_1_is_migrated_to_2(void **state)
{
  fixture *f = *state;
  berth_store_free(f->s);
  f->s = NULL;
  sql_on_file(f->path, downgrade_to_1);
  assert_int_equal(version_on_file(f->path), 1);
  no_error(berth_store_open(f->loop, f->url, &f->s));
  assert_int_equal(version_on_file(f->path), BERTH_STORE_SCHEMA);
  check_migrated(f);
}

/* The index is there after the migration, and the lookup uses it. */
static void check_index_on_file(const char *path)
{
  sqlite3 *db;
  sqlite3_stmt *q;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  assert_int_equal(sqlite3_prepare_v2(db, "EXPLAIN QUERY PLAN SELECT max(seq) FROM events"
                                          " WHERE conv = 'old' AND message_id = 'm'"
                                          " AND seq < 99", -1, &q, NULL), SQLITE_OK);
  bool indexed = false;
  while (sqlite3_step(q) == SQLITE_ROW)
    indexed |= strstr((const char *)sqlite3_column_text(q, 3),
                      "events_by_message_id") != NULL;
  sqlite3_finalize(q);
  sqlite3_close(db);
  assert_true(indexed);
}

static void test_sqlite_version_2_is_migrated_to_3(void **state)
{
  fixture *f = *state;
  berth_store_free(f->s);
  f->s = NULL;
  sql_on_file(f->path, downgrade_to_2);
  assert_int_equal(version_on_file(f->path), 2);
  no_error(berth_store_open(f->loop, f->url, &f->s));
  assert_int_equal(version_on_file(f->path), BERTH_STORE_SCHEMA);
  check_index_on_file(f->path);
  check_migrated(f);
}

/* Version 3 as it was: messages and events WITHOUT ROWID. */
static const char downgrade_to_3[] =
  "DROP TABLE messages; DROP TABLE events;"
  "CREATE TABLE messages (conv TEXT NOT NULL, seq INTEGER NOT NULL, body TEXT NOT NULL,"
  "  PRIMARY KEY (conv, seq)) WITHOUT ROWID;"
  "CREATE TABLE events (conv TEXT NOT NULL, seq INTEGER NOT NULL, turn INTEGER NOT NULL,"
  "  kind TEXT NOT NULL, data TEXT NOT NULL, message_id TEXT,"
  "  PRIMARY KEY (conv, seq)) WITHOUT ROWID;"
  "CREATE INDEX events_by_message_id ON events (conv, message_id)"
  "  WHERE message_id IS NOT NULL;"
  "UPDATE schema_version SET version = 3;"
  OLD_CONVERSATION
  "UPDATE events SET message_id = 'm-old' WHERE conv = 'old' AND seq = 27;"
  "INSERT INTO messages (conv, seq, body) VALUES ('old', 0, '{\"role\":\"user\"}'),"
  " ('old', 1, '{\"role\":\"assistant\"}');";

/* How many of the file's tables are WITHOUT ROWID. */
static int without_rowid_tables(const char *path)
{
  return int_on_file(path, "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
                           " AND sql LIKE '%WITHOUT ROWID%'");
}

/* 3 -> 4 rebuilds messages and events as rowid tables, every row and id kept. */
static void test_sqlite_version_3_is_migrated_to_4(void **state)
{
  fixture *f = *state;
  berth_store_free(f->s);
  f->s = NULL;
  sql_on_file(f->path, downgrade_to_3);
  assert_int_equal(version_on_file(f->path), 3);
  assert_int_equal(without_rowid_tables(f->path), 2);
  no_error(berth_store_open(f->loop, f->url, &f->s));
  assert_int_equal(version_on_file(f->path), 4);
  assert_int_equal(without_rowid_tables(f->path), 0);
  check_index_on_file(f->path);
  check_migrated(f);
  char **m;
  size_t n;
  no_error(berth_store_load_messages(f->s, "old", &m, &n));
  assert_int_equal(n, 2);
  assert_string_equal(m[1], "{\"role\":\"assistant\"}");
  berth_store_texts_free(m, n);
}

/* {====================================================== PostgreSQL */

static int version_in_db(const char *url)
{
  PGconn *c = PQconnectdb(url);
  assert_int_equal(PQstatus(c), CONNECTION_OK);
  PGresult *r = PQexec(c, "SELECT version FROM schema_version");
  assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
  assert_int_equal(PQntuples(r), 1);
  int v = atoi(PQgetvalue(r, 0, 0));
  PQclear(r);
  PQfinish(c);
  return v;
}

static void test_pg_newer_schema_is_refused_untouched(void **state)
{
  fixture *f = *state;
  berth_store_free(f->s);
  f->s = NULL;
  assert_int_equal(version_in_db(f->url), BERTH_STORE_SCHEMA);
  assert_int_equal(pgtest_sql(f->url, "UPDATE schema_version SET version = 99"), 0);
  berth_store *s = NULL;
  berth_error *e = berth_store_open(f->loop, f->url, &s);
  assert_non_null(e);
  assert_null(s);
  assert_string_equal(e->code, "version");
  assert_non_null(strstr(e->message, "newer berth"));
  assert_non_null(strstr(e->message, "schema version 99"));
  berth_error_free(e);
  assert_int_equal(version_in_db(f->url), 99);
}

static void test_pg_version_1_is_migrated_to_2(void **state)
{
  fixture *f = *state;
  berth_store_free(f->s);
  f->s = NULL;
  assert_int_equal(pgtest_sql(f->url, downgrade_to_1), 0);
  assert_int_equal(version_in_db(f->url), 1);
  no_error(berth_store_open(f->loop, f->url, &f->s));
  assert_int_equal(version_in_db(f->url), BERTH_STORE_SCHEMA);
  check_migrated(f);
}

/* The partial index is there, and serves the lookup (the planner proves that
 * message_id = $2 implies IS NOT NULL, with the generic plan too). */
static void check_index_in_db(const char *url)
{
  PGconn *c = PQconnectdb(url);
  assert_int_equal(PQstatus(c), CONNECTION_OK);
  PGresult *r = PQexec(c, "SELECT count(*) FROM pg_indexes WHERE schemaname ="
                          " current_schema() AND indexname = 'events_by_message_id'"
                          " AND indexdef LIKE '%(conv, message_id, seq) WHERE%NOT NULL%'");
  assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
  assert_string_equal(PQgetvalue(r, 0, 0), "1");
  PQclear(r);
  static const char *const plan[] = {
    "SET enable_seqscan = off", "SET plan_cache_mode = force_generic_plan",
    ("PREPARE f(text, text, bigint) AS SELECT max(seq) FROM events"
     " WHERE conv = $1 AND message_id = $2 AND seq < $3"),
  };
  for (size_t i = 0; i < 3; i++) {
    r = PQexec(c, plan[i]);
    assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
    PQclear(r);
  }
  r = PQexec(c, "EXPLAIN EXECUTE f('old', 'm', 99)");
  assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
  bool indexed = false;
  for (int i = 0; i < PQntuples(r); i++)
    indexed |= strstr(PQgetvalue(r, i, 0), "events_by_message_id") != NULL;
  PQclear(r);
  PQfinish(c);
  assert_true(indexed);
}

static void test_pg_version_2_is_migrated_to_3(void **state)
{
  fixture *f = *state;
  berth_store_free(f->s);
  f->s = NULL;
  assert_int_equal(pgtest_sql(f->url, downgrade_to_2), 0);
  assert_int_equal(version_in_db(f->url), 2);
  no_error(berth_store_open(f->loop, f->url, &f->s));
  assert_int_equal(version_in_db(f->url), BERTH_STORE_SCHEMA);
  check_index_in_db(f->url);
  check_migrated(f);
}

/* 3 -> 4 in PostgreSQL: the message id index holds seq too. */
static void test_pg_version_3_is_migrated_to_4(void **state)
{
  fixture *f = *state;
  berth_store_free(f->s);
  f->s = NULL;
  assert_int_equal(pgtest_sql(f->url, "DROP INDEX events_by_message_id;"
                                      "CREATE INDEX events_by_message_id ON events"
                                      " (conv, message_id) WHERE message_id IS NOT NULL;"
                                      "UPDATE schema_version SET version = 3;"
                                      OLD_CONVERSATION
                                      "UPDATE events SET message_id = 'm-old'"
                                      " WHERE conv = 'old' AND seq = 27;"), 0);
  assert_int_equal(version_in_db(f->url), 3);
  no_error(berth_store_open(f->loop, f->url, &f->s));
  assert_int_equal(version_in_db(f->url), 4);
  check_index_in_db(f->url);
  check_migrated(f);
}

static void test_pg_foreign_database_is_refused(void **state)
{
  fixture *f = *state;
  char url[200];
  assert_int_equal(pgtest_fresh_url(&cluster, url, sizeof url), 0);
  assert_int_equal(pgtest_sql(url, "CREATE TABLE accounts (name TEXT)"), 0);
  berth_store *s = NULL;
  berth_error *e = berth_store_open(f->loop, url, &s);
  assert_non_null(e);
  assert_null(s);
  assert_string_equal(e->code, "data_loss");
  assert_non_null(strstr(e->message, "not a berth store"));
  berth_error_free(e);
  assert_int_equal(pgtest_sql(url, "SELECT name FROM accounts"), 0);   /* untouched */
}

/* A server that cannot be reached, or refuses, is "unavailable"; the message names the
 * database and never holds the URL's password. */
static void test_pg_unreachable_is_unavailable_and_hides_the_password(void **state)
{
  fixture *f = *state;
  char url[300];
  snprintf(url, sizeof url, "postgresql://%s:s3cret-pw@/no_such_db?host=%s", cluster.user,
           cluster.dir);
  berth_store *s = NULL;
  berth_error *e = berth_store_open(f->loop, url, &s);
  assert_non_null(e);
  assert_null(s);
  assert_string_equal(e->code, "unavailable");
  assert_non_null(strstr(e->message, "no_such_db"));
  assert_null(strstr(e->message, "s3cret-pw"));
  berth_error_free(e);
  snprintf(url, sizeof url, "postgresql://u:s3cret-pw@/berth?host=%s/nowhere", cluster.dir);
  e = berth_store_open(f->loop, url, &s);
  assert_non_null(e);
  assert_string_equal(e->code, "unavailable");
  assert_null(strstr(e->message, "s3cret-pw"));
  berth_error_free(e);
}

/* PostgreSQL stops (as if it crashed) while the host runs: what was acknowledged
 * before is kept; a sync meanwhile fails with "unavailable" (nothing acknowledged),
 * and reads too, at once; the writes are kept (store.c tries them again) and once the
 * server is back they and the next ones are stored, on a new connection. */
static void test_pg_server_stopped_mid_run_fails_writes_and_resumes(void **state)
{
  fixture *f = *state;
  berth_store_conv r = record("kept", "k1");
  r.n_messages = 2;
  berth_store_put_conv(f->s, &r);
  const char *msgs[] = {"{\"role\":\"user\",\"content\":\"a\"}",
                        "{\"role\":\"assistant\",\"content\":\"b\"}"};
  berth_store_put_messages(f->s, "kept", 0, msgs, 2, false);
  sync_seen before = {.loop = f->loop};
  berth_store_sync(f->s, on_synced, &before);
  run_until(f->loop, &before.calls, 1);
  assert_int_equal(before.calls, 1);
  assert_false(before.had_error);           /* acknowledged */

  assert_int_equal(pgtest_stop_server(&cluster, true), 0);
  berth_store_conv d = record("during", "k1");
  berth_store_put_conv(f->s, &d);
  sync_seen during = {.loop = f->loop};
  berth_store_sync(f->s, on_synced, &during);
  run_until(f->loop, &during.calls, 1);
  assert_int_equal(during.calls, 1);
  assert_true(during.had_error);
  assert_string_equal(during.code, "unavailable");
  berth_store_conv got;
  bool found;
  berth_error *e = berth_store_get_conv(f->s, "kept", &got, &found);
  assert_non_null(e);
  assert_string_equal(e->code, "unavailable");
  berth_error_free(e);

  assert_int_equal(pgtest_restart_server(&cluster), 0);
  berth_store_conv a = record("after", "k1");
  berth_store_put_conv(f->s, &a);
  sync_seen after = {.loop = f->loop};
  berth_store_sync(f->s, on_synced, &after);
  run_until(f->loop, &after.calls, 1);
  assert_int_equal(after.calls, 1);
  assert_false(after.had_error);

  no_error(berth_store_get_conv(f->s, "kept", &got, &found));
  assert_true(found);
  assert_int_equal(got.n_messages, 2);
  berth_store_conv_clear(&got);
  char **m;
  size_t n;
  no_error(berth_store_load_messages(f->s, "kept", &m, &n));
  assert_int_equal(n, 2);
  assert_string_equal(m[1], msgs[1]);
  berth_store_texts_free(m, n);
  no_error(berth_store_get_conv(f->s, "after", &got, &found));
  assert_true(found);
  berth_store_conv_clear(&got);
  no_error(berth_store_get_conv(f->s, "during", &got, &found));
  assert_true(found);                        /* kept, and applied once it came back */
  berth_store_conv_clear(&got);
  berth_store_stats st;
  berth_store_get_stats(f->s, &st);
  assert_true(st.failures >= 1);
  uint64_t failures = st.failures;

  /* Restarted while the host is idle: its connection is stale, and the next write
   * notices that before using it (it reconnects instead of failing). */
  assert_int_equal(pgtest_stop_server(&cluster, false), 0);
  assert_int_equal(pgtest_restart_server(&cluster), 0);
  berth_store_conv later = record("later", "k1");
  berth_store_put_conv(f->s, &later);
  sync_seen again = {.loop = f->loop};
  berth_store_sync(f->s, on_synced, &again);
  run_until(f->loop, &again.calls, 1);
  assert_int_equal(again.calls, 1);
  assert_false(again.had_error);
  berth_store_get_stats(f->s, &st);
  assert_int_equal(st.failures, failures);  /* not one failed try on the stale one */
}

/* PostgreSQL refuses text that is not UTF-8; a batch holding some is stored anyway
 * (the ill-formed bytes as U+FFFD) rather than failing at every retry. */
static void test_pg_ill_formed_utf8_is_stored_not_refused(void **state)
{
  fixture *f = *state;
  berth_store_conv r = record("bytes", "k1");
  r.state = (char *)"{\"raw\":\"a\xff\xfe b\"}";
  berth_store_put_conv(f->s, &r);
  const char *m = "{\"content\":\"ok \xc3\"}";
  berth_store_put_messages(f->s, "bytes", 0, &m, 1, false);
  sync_seen w = {.loop = f->loop};
  berth_store_sync(f->s, on_synced, &w);
  run_until(f->loop, &w.calls, 1);
  assert_int_equal(w.calls, 1);
  assert_false(w.had_error);
  berth_store_conv got;
  bool found;
  no_error(berth_store_get_conv(f->s, "bytes", &got, &found));
  assert_true(found);
  assert_string_equal(got.state, "{\"raw\":\"a\xef\xbf\xbd\xef\xbf\xbd b\"}");
  berth_store_conv_clear(&got);
  char **v;
  size_t n;
  no_error(berth_store_load_messages(f->s, "bytes", &v, &n));
  assert_int_equal(n, 1);
  assert_string_equal(v[0], "{\"content\":\"ok \xef\xbf\xbd\"}");
  berth_store_texts_free(v, n);
}

/* The pid of the server process serving connections named `app`, or -1. */
static pid_t backend_of(const char *url, const char *app)
{
  char sql[200];
  snprintf(sql, sizeof sql, "SELECT pid FROM pg_stat_activity WHERE application_name = '%s'",
           app);
  PGconn *c = PQconnectdb(url);
  PGresult *r = PQexec(c, sql);
  pid_t pid = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1
                ? (pid_t)atoi(PQgetvalue(r, 0, 0)) : -1;
  PQclear(r);
  PQfinish(c);
  return pid;
}

static double seconds(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A server that stops answering (its process frozen) never hangs the host: the batch
 * fails "unavailable" once the URL's connect_timeout passed, and the store carries on
 * with a new connection. */
static void test_pg_a_server_that_stops_answering_fails_the_batch_in_bounded_time(
  void **state)
{
  fixture *f = *state;
  char url[300];
  snprintf(url, sizeof url, "%s&application_name=berth-frozen&connect_timeout=1", f->url);
  berth_store *s = NULL;
  no_error(berth_store_open(f->loop, url, &s));
  pid_t backend = backend_of(f->url, "berth-frozen");
  assert_true(backend > 0);

  assert_int_equal(kill(backend, SIGSTOP), 0);
  berth_store_conv r = record("frozen", "k1");
  berth_store_put_conv(s, &r);
  sync_seen w = {.loop = f->loop};
  berth_store_sync(s, on_synced, &w);
  double t0 = seconds();
  run_until(f->loop, &w.calls, 1);
  double took = seconds() - t0;
  kill(backend, SIGCONT);
  assert_int_equal(w.calls, 1);
  assert_true(w.had_error);
  assert_string_equal(w.code, "unavailable");
  assert_true(took >= 0.9 && took < 5.0);

  berth_store_conv r2 = record("thawed", "k1");
  berth_store_put_conv(s, &r2);
  sync_seen w2 = {.loop = f->loop};
  berth_store_sync(s, on_synced, &w2);
  run_until(f->loop, &w2.calls, 1);
  assert_int_equal(w2.calls, 1);
  assert_false(w2.had_error);
  berth_store_free(s);
}

/* Two handles on one database, each on its own loop, as two hosts have: each sees the
 * other's committed writes, and one listing orders them all. */
static void test_pg_two_handles_see_each_others_writes(void **state)
{
  fixture *f = *state;
  struct ev_loop *loop2 = ev_loop_new(EVFLAG_AUTO);
  berth_store *other = NULL;
  no_error(berth_store_open(loop2, f->url, &other));

  berth_store_conv r = record("from-1", "k1");
  berth_store_put_conv(f->s, &r);
  sync_seen w1 = {.loop = f->loop};
  berth_store_sync(f->s, on_synced, &w1);
  run_until(f->loop, &w1.calls, 1);
  assert_false(w1.had_error);
  berth_store_conv got;
  bool found;
  no_error(berth_store_get_conv(other, "from-1", &got, &found));
  assert_true(found);
  berth_store_conv_clear(&got);

  berth_store_conv r2 = record("from-2", "k1");
  r2.n_messages = 1;
  berth_store_put_conv(other, &r2);
  const char *m = "\"hello from host 2\"";
  berth_store_put_messages(other, "from-2", 0, &m, 1, false);
  sync_seen w2 = {.loop = loop2};
  berth_store_sync(other, on_synced, &w2);
  run_until(loop2, &w2.calls, 1);
  assert_false(w2.had_error);
  char **v;
  size_t n;
  no_error(berth_store_load_messages(f->s, "from-2", &v, &n));
  assert_int_equal(n, 1);
  assert_string_equal(v[0], m);
  berth_store_texts_free(v, n);

  berth_store_conv *list;
  no_error(berth_store_list_convs(f->s, "k1", 0, 10, &list, &n));
  assert_int_equal(n, 2);
  assert_string_equal(list[0].id, "from-2");    /* newest first, whoever wrote it */
  assert_string_equal(list[1].id, "from-1");
  berth_store_convs_free(list, n);
  berth_store_free(other);
  ev_loop_destroy(loop2);
}

/* An iteration that queues more than the engine's eager bound (store_engine.h) has
 * its batches sent while it still runs, so the server works meanwhile: before the loop
 * runs, the first ones are sent, no callback has run (never from the caller's stack),
 * and a record written after its predecessor was sent is queued anew, not folded into
 * the one in flight.  Then everything lands, in order. */
static void test_pg_a_long_iteration_sends_batches_before_it_ends(void **state)
{
  fixture *f = *state;
  size_t bound = berth_store_pg.eager_ops;
  assert_true(bound > 1);
  berth_store_stats s0, s1;
  berth_store_get_stats(f->s, &s0);
  sync_seen first = {.loop = f->loop}, last = {.loop = f->loop};
  berth_store_sync(f->s, on_synced, &first);
  for (unsigned i = 1; i + 1 < bound; i++)
    berth_store_put_event(f->s, "eager", i, 1, "delta", "\"x\"");
  berth_store_conv r = record("eager", "k1");
  r.turns = 1;
  berth_store_put_conv(f->s, &r);           /* the bound-th: sent with the rest */
  berth_store_get_stats(f->s, &s1);
  assert_int_equal(s1.flushes - s0.flushes, 1);
  assert_int_equal(s1.queued, 0);
  r.turns = 2;
  r.last_event = 3 * bound;
  berth_store_put_conv(f->s, &r);           /* its predecessor is in flight */
  for (uint64_t i = bound - 1; i <= 3 * bound; i++)
    berth_store_put_event(f->s, "eager", i, 1, "delta", "\"y\"");
  berth_store_sync(f->s, on_synced, &last);
  berth_store_get_stats(f->s, &s1);
  assert_int_equal(s1.superseded, s0.superseded);
  assert_int_equal(s1.flushes - s0.flushes, 3);
  assert_int_equal(first.calls + last.calls, 0);
  run_until(f->loop, &last.calls, 1);
  assert_int_equal(first.calls, 1);
  assert_int_equal(last.calls, 1);
  assert_false(first.had_error || last.had_error);
  berth_store_conv got;
  bool found;
  no_error(berth_store_get_conv(f->s, "eager", &got, &found));
  assert_true(found);
  assert_int_equal(got.turns, 2);
  berth_store_conv_clear(&got);
  berth_store_event *ev;
  size_t n;
  no_error(berth_store_read_events(f->s, "eager", 0, 0, &ev, &n));
  assert_int_equal(n, 3 * bound);
  for (size_t i = 0; i < n; i++)
    assert_int_equal(ev[i].seq, i + 1);
  assert_string_equal(ev[bound - 3].data, "\"x\"");
  assert_string_equal(ev[bound - 2].data, "\"y\"");
  berth_store_events_free(ev, n);
}

static int pg_group_setup(void **state)
{
  (void)state;
  return pgtest_start(&cluster);
}

static int pg_group_teardown(void **state)
{
  (void)state;
  pgtest_destroy(&cluster);
  return 0;
}

/* }====================================================== */

int main(void)
{
  static fixture mem = {"memory"}, lite = {"sqlite"};
#define BOTH(fn) {#fn "/memory", fn, setup, teardown, &mem}, \
                 {#fn "/sqlite", fn, setup, teardown, &lite}
#define LITE(fn) cmocka_unit_test_prestate_setup_teardown(fn, setup, teardown, &lite)
  const struct CMUnitTest tests[] = {
    BOTH(test_round_trip_of_a_conversation),
    BOTH(test_messages_and_events_keep_their_order),
    BOTH(test_list_is_the_callers_own_newest_first_in_pages),
    BOTH(test_running_turns_are_marked_interrupted),
    BOTH(test_one_flush_per_iteration_and_sync_after_commit),
    BOTH(test_writes_queued_from_a_prepare_watcher_are_flushed),
    BOTH(test_lease_two_hosts_never_both_hold_one),
    BOTH(test_a_record_never_goes_back),
    BOTH(test_a_newer_queued_record_supersedes_an_older_one),
    BOTH(test_lease_expired_is_taken_over),
    BOTH(test_fence_refuses_writes_of_a_lease_another_host_took),
    BOTH(test_lease_renew_extends_the_hosts_leases),
    BOTH(test_lease_release_frees_it),
    BOTH(test_lease_takeover_marks_that_turn_interrupted),
    BOTH(test_find_message_by_id),
    BOTH(test_answers_per_iteration_are_bounded),
    LITE(test_sqlite_version_1_is_migrated_to_2),
    LITE(test_sqlite_version_2_is_migrated_to_3),
    LITE(test_sqlite_version_3_is_migrated_to_4),
    LITE(test_sqlite_keeps_everything_across_reopening),
    LITE(test_sqlite_checkpoints_off_the_loop_and_bounds_the_wal),
    LITE(test_sqlite_checkpoint_thread_starts_the_wal_over),
    LITE(test_sqlite_batches_are_applied_off_the_loop),
    LITE(test_sqlite_newer_schema_is_refused_untouched),
    LITE(test_sqlite_corrupt_or_foreign_file_is_refused),
    LITE(test_sqlite_a_second_host_cannot_claim_the_file),
    cmocka_unit_test(test_bad_urls_are_refused),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  static fixture pgf = {"postgresql"};
#define PG(fn) {#fn "/postgresql", fn, setup, teardown, &pgf}
  const struct CMUnitTest postgresql[] = {
    PG(test_round_trip_of_a_conversation),
    PG(test_messages_and_events_keep_their_order),
    PG(test_list_is_the_callers_own_newest_first_in_pages),
    PG(test_running_turns_are_marked_interrupted),
    PG(test_one_flush_per_iteration_and_sync_after_commit),
    PG(test_writes_queued_from_a_prepare_watcher_are_flushed),
    PG(test_lease_two_hosts_never_both_hold_one),
    PG(test_a_record_never_goes_back),
    PG(test_a_newer_queued_record_supersedes_an_older_one),
    PG(test_lease_expired_is_taken_over),
    PG(test_fence_refuses_writes_of_a_lease_another_host_took),
    PG(test_lease_renew_extends_the_hosts_leases),
    PG(test_lease_release_frees_it),
    PG(test_lease_takeover_marks_that_turn_interrupted),
    PG(test_find_message_by_id),
    PG(test_pg_version_1_is_migrated_to_2),
    PG(test_pg_version_2_is_migrated_to_3),
    PG(test_pg_version_3_is_migrated_to_4),
    PG(test_pg_newer_schema_is_refused_untouched),
    PG(test_pg_foreign_database_is_refused),
    PG(test_pg_unreachable_is_unavailable_and_hides_the_password),
    PG(test_pg_server_stopped_mid_run_fails_writes_and_resumes),
    PG(test_pg_a_server_that_stops_answering_fails_the_batch_in_bounded_time),
    PG(test_pg_ill_formed_utf8_is_stored_not_refused),
    PG(test_pg_two_handles_see_each_others_writes),
    PG(test_pg_a_long_iteration_sends_batches_before_it_ends),
    PG(test_answers_per_iteration_are_bounded),
  };
  failed += cmocka_run_group_tests(postgresql, pg_group_setup, pg_group_teardown);
  return failed;
}

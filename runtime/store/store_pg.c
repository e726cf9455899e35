/*
 * store_pg.c — the "postgresql://…" engine: one PostgreSQL database shared by any
 * number of berth hosts, through libpq (Debian's libpq-dev), driven by the store's
 * libev loop so that no write ever holds the loop while the server works.
 *
 * One connection in pipeline mode, non-blocking.  A write batch is its queries
 * (prepared statements) followed by a Sync: the queries between two Syncs run as one
 * implicit transaction, committed at the Sync (rolled back whole when one fails), and
 * the PGRES_PIPELINE_SYNC result means committed.  Batches are sent as soon as they
 * are flushed, without waiting for the previous one's answer (pipelined), and their
 * answers arrive in order on the socket, watched by an ev_io; berth_store_batch_done
 * runs from that watcher.  Reads are synchronous (store.h): they go down the same
 * pipeline behind the writes queued before them, and this engine waits for their
 * answer with poll(2), bounded.
 *
 * Failures: a broken connection (the server stopped, a network cut) fails every batch
 * in flight with "unavailable" (none of them was acknowledged: their Sync result never
 * came) and drops the connection; the next batch or read connects again, so service
 * resumes by itself when the server is back.  No answer within PG_TIMEOUT seconds (or
 * the URL's connect_timeout) counts as a broken connection: nothing here waits
 * unbounded.
 *
 * Schema: the SQLite engine's (store_sqlite.c), in PostgreSQL's dialect — the same
 * tables, columns, keys and version numbers — migrated at open in one transaction
 * under an advisory lock (hosts starting together migrate once).  A database at a newer
 * version is refused untouched ("version").
 *
 * The URL is libpq's (postgresql://user@host/db?…, host=/socket/dir for a unix
 * socket).  It may hold a password, so it never appears in a message: they name the
 * database and the host only.
 */
#include "store_engine.h"
#include "diag.h"
#include "xalloc.h"
#include "embed.h"

#include <errno.h>
#include <ev.h>
#include <inttypes.h>
#include <libpq-fe.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plimsoll.h"              /* the one UTF-8 checker */

/* How long a batch, a read or a connection attempt may wait for the server, unless
 * the URL's connect_timeout says otherwise. */
#define PG_TIMEOUT 10.0
/* Batches sent and not answered yet, at most (send_unsent says why). */
#define PG_IN_FLIGHT 16
/* Operations queued that make a batch before the iteration ends (store_engine.h). */
#define PG_EAGER_OPS 512

/* A key of pg_advisory_xact_lock: migrations of one database run one at a time. */
#define PG_MIGRATION_LOCK "6652916542964" /* "berth" as a number */

/* {====================================================== schema */

/* migrations[v]: from version v to v + 1, one statement per string (a pipeline takes
 * no multi-statement texts).  Mirrors store_sqlite.c's migrations. */
static const char *const migration_0[] = {
  "CREATE TABLE schema_version (version INTEGER NOT NULL)",
  "CREATE TABLE conversations ("
  "  n BIGSERIAL PRIMARY KEY, id TEXT NOT NULL UNIQUE, caller TEXT NOT NULL, owner TEXT,"
  "  run_id TEXT NOT NULL, metadata TEXT, state TEXT, status TEXT NOT NULL,"
  "  created_ms BIGINT NOT NULL, updated_ms BIGINT NOT NULL,"
  "  turns BIGINT NOT NULL DEFAULT 0, running_turn BIGINT NOT NULL DEFAULT 0,"
  "  n_messages BIGINT NOT NULL DEFAULT 0, last_event BIGINT NOT NULL DEFAULT 0)",
  "CREATE INDEX conversations_by_caller ON conversations (caller, n)",
  "CREATE INDEX conversations_running ON conversations (running_turn)"
  "  WHERE running_turn > 0",
  "CREATE TABLE messages (conv TEXT NOT NULL, seq BIGINT NOT NULL, body TEXT NOT NULL,"
  "  PRIMARY KEY (conv, seq))",
  "CREATE TABLE events (conv TEXT NOT NULL, seq BIGINT NOT NULL, turn BIGINT NOT NULL,"
  "  kind TEXT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (conv, seq))",
  "INSERT INTO schema_version (version) VALUES (0)",
  NULL,
};

/* 1 -> 2: leases (store.h) */
static const char *const migration_1[] = {
  "ALTER TABLE conversations ADD COLUMN lease_holder TEXT",
  "ALTER TABLE conversations ADD COLUMN lease_expiry_ms BIGINT NOT NULL DEFAULT 0",
  "CREATE INDEX conversations_leased ON conversations (lease_holder)"
  "  WHERE lease_holder IS NOT NULL",
  NULL,
};

/* 2 -> 3: message ids, indexed (store_sqlite.c).  The ids stored before are taken from
 * their "user" events' JSON once (json, not jsonb: no other field is decoded), in one
 * UPDATE; should a text not be JSON (berth writes none such) that UPDATE fails, and
 * they are taken one by one, a text that is not JSON getting no id, rather than the
 * store never opening again. */
static const char *const migration_2[] = {
  "ALTER TABLE events ADD COLUMN message_id TEXT",
  "DO $$ DECLARE r record; m text; BEGIN"
  "  UPDATE events SET message_id = data::json ->> 'messageId'"
  "    WHERE kind = 'user' AND data LIKE '%\"messageId\"%';"
  " EXCEPTION WHEN data_exception THEN"
  "  FOR r IN SELECT conv, seq, data FROM events"
  "    WHERE kind = 'user' AND data LIKE '%\"messageId\"%' LOOP"
  "    BEGIN m := r.data::json ->> 'messageId';"
  "    EXCEPTION WHEN data_exception THEN m := NULL; END;"
  "    UPDATE events SET message_id = m WHERE conv = r.conv AND seq = r.seq;"
  "  END LOOP;"
  " END $$",
  "CREATE INDEX events_by_message_id ON events (conv, message_id)"
  "  WHERE message_id IS NOT NULL",
  NULL,
};

/* 3 -> 4: the message id index holds seq too (the lookup reads it alone).  SQLite's
 * messages and events also became rowid tables (rows in arrival order, the key an
 * index beside them): what PostgreSQL's heap tables were from the start. */
static const char *const migration_3[] = {
  "DROP INDEX events_by_message_id",
  "CREATE INDEX events_by_message_id ON events (conv, message_id, seq)"
  "  WHERE message_id IS NOT NULL",
  NULL,
};

static const char *const *const migrations[BERTH_STORE_SCHEMA] = {migration_0, migration_1,
                                                                  migration_2, migration_3};

#define CONV_COLUMNS "n, id, caller, owner, run_id, metadata, state, status, created_ms, " \
                     "updated_ms, turns, running_turn, n_messages, last_event, lease_holder, " \
                     "lease_expiry_ms"

enum {
  P_PUT_CONV, P_DEL_MESSAGES, P_PUT_MESSAGE, P_PUT_EVENT, P_GET_CONV, P_LIST, P_RUNNING,
  P_MESSAGES, P_EVENTS, P_FIND_MESSAGE, P_LEASE_TAKE, P_LEASE_RENEW, P_LEASE_RELEASE,
  P_LEASE_CLEAR, P_COUNT
};

/* Leases are timed by the server's clock: the hosts' clocks may differ. */
#define PG_NOW "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
#define LEASE_FREE "(lease_holder IS NULL OR lease_expiry_ms < " PG_NOW \
                   " OR lease_holder = $2)"
/* A write of conversation $1 under the fence `host` (a parameter: NULL, no fence): the
 * conversation is not stored, or `host` holds its lease (store.h).  Checked as the
 * statement starts: a write under way when another host takes the lease may land,
 * none after. */
#define FENCE(host) "(" host "::text IS NULL OR NOT EXISTS (SELECT 1 FROM conversations" \
                    " WHERE id = $1::text AND (lease_holder IS NULL OR lease_holder <> " \
                    host "::text)))"

static const char *const sql[P_COUNT] = {
  "INSERT INTO conversations (id, caller, owner, run_id, metadata, state, status,"
  " created_ms, updated_ms, turns, running_turn, n_messages, last_event)"
  " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
  " ON CONFLICT (id) DO UPDATE SET caller = $2, owner = $3, run_id = $4, metadata = $5,"
  " state = $6, status = $7, created_ms = $8, updated_ms = $9, turns = $10,"
  " running_turn = $11, n_messages = $12, last_event = $13"
  " WHERE conversations.turns <= $10 AND conversations.last_event <= $13"  /* never back */
  " AND ($14::text IS NULL OR conversations.lease_holder = $14)",          /* the fence */
  "DELETE FROM messages WHERE conv = $1 AND " FENCE("$2"),
  "INSERT INTO messages (conv, seq, body) SELECT $1::text, $2::bigint, $3::text"
  " WHERE " FENCE("$4") " ON CONFLICT (conv, seq) DO UPDATE SET body = EXCLUDED.body",
  "INSERT INTO events (conv, seq, turn, kind, data, message_id)"
  " SELECT $1::text, $2::bigint, $3::bigint, $4::text, $5::text, $6::text"
  " WHERE " FENCE("$7") " ON CONFLICT (conv, seq) DO UPDATE SET turn = EXCLUDED.turn,"
  " kind = EXCLUDED.kind, data = EXCLUDED.data, message_id = EXCLUDED.message_id",
  "SELECT " CONV_COLUMNS " FROM conversations WHERE id = $1",
  "SELECT " CONV_COLUMNS " FROM conversations WHERE caller = $1 AND n < $2"
  " ORDER BY n DESC LIMIT $3",
  "SELECT " CONV_COLUMNS " FROM conversations WHERE running_turn > 0",
  "SELECT body FROM messages WHERE conv = $1 ORDER BY seq",
  "SELECT seq, turn, kind, data FROM events WHERE conv = $1 AND seq > $2 ORDER BY seq"
  " LIMIT $3",
  /* (message_id = $2 implies it is not NULL: the partial index serves it) */
  "SELECT max(seq) FROM events WHERE conv = $1 AND message_id = $2 AND seq < $3",
  /* $1 id, $2 host, $3 ttl: the row either way (taken: its holder is $2) */
  "UPDATE conversations SET"
  " lease_holder = CASE WHEN " LEASE_FREE " THEN $2 ELSE lease_holder END,"
  " lease_expiry_ms = CASE WHEN " LEASE_FREE " THEN " PG_NOW " + $3::bigint"
  " ELSE lease_expiry_ms END"
  " WHERE id = $1 RETURNING lease_holder, lease_expiry_ms, turns, running_turn, last_event",
  "UPDATE conversations SET lease_expiry_ms = " PG_NOW " + $2::bigint"
  " WHERE lease_holder = $1",
  "UPDATE conversations SET lease_holder = NULL, lease_expiry_ms = 0"
  " WHERE id = $1 AND lease_holder = $2",
  "UPDATE conversations SET lease_holder = NULL, lease_expiry_ms = 0"
  " WHERE lease_holder IS NOT NULL",
};

static const char *stmt_name(int i)
{
  static const char *const names[P_COUNT] = {"berth_put_conv", "berth_del_messages",
                                             "berth_put_message", "berth_put_event",
                                             "berth_get_conv", "berth_list",
                                             "berth_running", "berth_messages",
                                             "berth_events", "berth_find_message",
                                             "berth_lease_take",
                                             "berth_lease_renew", "berth_lease_release",
                                             "berth_lease_clear"};
  return names[i];
}

/* }====================================================== */

/* {====================================================== the connection */

typedef enum { PG_DOWN, PG_CONNECTING, PG_READY } pg_state;

typedef enum {
  R_WRITE,                       /* a batch: batch_done when it ends */
  R_SETUP,                       /* the prepared statements of a new connection */
  R_WAIT                         /* a read or a migration step: its caller waits */
} req_kind;

/* What went down the pipeline up to one Sync, answered in order. */
typedef struct pgreq {
  struct pgreq *next;
  req_kind kind;
  berth_store_batch *batch;      /* R_WRITE */
  bool sent, done;
  PGresult *rows;                /* R_WAIT: the last result with rows */
  store_op *cur;                 /* R_WRITE: the op the next result answers */
  size_t left;                   /*   and how many of its statements are unanswered */
  berth_error *err;              /* the first failure */
} pgreq;

typedef struct pg {
  berth_store *s;
  char *name;                    /* "database D on H": for messages (no password) */
  PGconn *conn;
  pg_state state;
  int want;                      /* EV_READ / EV_WRITE the connection waits for */
  bool flush_pending;            /* output libpq could not send yet */
  bool schema_ok;                /* migrated: a new connection prepares statements */
  pgreq *head, *tail;            /* in sending order; the unsent ones last */
  double progress;               /* berth_clock() of the last sign of life */
  double timeout;                /* seconds without one that count as a failure */
  berth_error *last_err;         /* why the connection last failed */
  ev_io io;
  ev_timer timer;
} pg;

static berth_error *unavailable(pg *p, const char *why)
{
  size_t n = strcspn(why, "\n");  /* libpq's first line says it; the rest is advice */
  return berth_error_new("unavailable", "the PostgreSQL store (%s) is unavailable: %.*s",
                         p->name, (int)n, why);
}

static berth_error *error_copy(const berth_error *e)
{
  return berth_error_new(e->code, "%s", e->message);
}

static bool outstanding(const pg *p)
{
  return p->head != NULL;
}

static void enqueue(pg *p, pgreq *q)
{
  if (p->tail)
    p->tail->next = q;
  else
    p->head = q;
  p->tail = q;
}

static pgreq *req_new(req_kind kind)
{
  pgreq *q = berth_xcalloc(1, sizeof *q);
  q->kind = kind;
  return q;
}

static void req_free(pgreq *q)
{
  PQclear(q->rows);
  berth_error_free(q->err);
  free(q);
}

/* The end of a request taken off the queue: a batch is reported; a waited-for
 * request is marked done for its caller, who frees it. */
static void finish(pgreq *q, const berth_error *err)
{
  if (err && !q->err)
    q->err = error_copy(err);
  switch (q->kind) {
    case R_WRITE:
      berth_store_batch_done(q->batch, q->err);
      req_free(q);
      break;
    case R_SETUP:
      if (q->err)
        berth_diag(BERTH_LOG_ERROR, "store: preparing statements: %s", q->err->message);
      req_free(q);
      break;
    case R_WAIT:
      q->done = true;
      break;
  }
}

static void complete_head(pg *p, const berth_error *err)
{
  pgreq *q = p->head;
  p->head = q->next;
  if (!p->head)
    p->tail = NULL;
  q->next = NULL;
  finish(q, err);
}

/* Drops the connection and fails every request, sent or not, with err. */
static void fail_all(pg *p, berth_error *err)
{
  if (p->conn)
    PQfinish(p->conn);
  p->conn = NULL;
  p->state = PG_DOWN;
  p->flush_pending = false;
  berth_error_free(p->last_err);
  p->last_err = err;
  /* Newest first: store.c puts a failed batch's writes back at the head of its queue,
   * so the oldest, put back last, is again applied first. */
  pgreq *rev = NULL;
  while (p->head) {
    pgreq *q = p->head;
    p->head = q->next;
    q->next = rev;
    rev = q;
  }
  p->tail = NULL;
  while (rev) {
    pgreq *q = rev;
    rev = q->next;
    q->next = NULL;
    finish(q, err);
  }
}

static void fail_with_conn_error(pg *p)
{
  const char *why = p->conn ? PQerrorMessage(p->conn) : "";
  fail_all(p, unavailable(p, *why ? why : "the connection was lost"));
}

/* PostgreSQL refuses text that is not UTF-8, and a batch it refuses would fail again
 * at every retry: an ill-formed sequence (a tool's raw bytes in a message, say) is
 * stored as U+FFFD instead, where SQLite would keep the bytes. */
static bool send_prepared(pg *p, int stmt, int n, const char *const *vals)
{
  const char *v[16] = {0};
  char *lossy[16] = {0};
  for (int i = 0; i < n; i++) {
    v[i] = vals[i];
    if (vals[i] && !plm_utf8_valid(vals[i], strlen(vals[i])))
      v[i] = lossy[i] = plm_utf8_lossy((const unsigned char *)vals[i], strlen(vals[i]), NULL);
  }
  bool ok = PQsendQueryPrepared(p->conn, stmt_name(stmt), n, v, NULL, NULL, 0) == 1;
  for (int i = 0; i < n; i++)
    free(lossy[i]);
  return ok;
}

/* How many statements send_batch sends for an op: its results come in that order. */
static size_t op_statements(const store_op *op)
{
  switch (op->kind) {
    case OP_SYNC: return 0;
    case OP_PUT_MESSAGES: return (op->replace ? 1 : 0) + op->n;
    default: return 1;
  }
}

/* The queries of one batch, then its Sync. */
static bool send_batch(pg *p, pgreq *q)
{
  char a[24], b[24], c[24], d[24], e[24], f[24], g[24];
  const char *fence = p->s->fence;
  for (store_op *op = q->batch->ops; op; op = op->next) {
    op->fenced = false;
    switch (op->kind) {
      case OP_PUT_CONV: {
        const berth_store_conv *r = &op->conv;
        snprintf(a, sizeof a, "%" PRId64, r->created_ms);
        snprintf(b, sizeof b, "%" PRId64, r->updated_ms);
        snprintf(c, sizeof c, "%" PRIu32, r->turns);
        snprintf(d, sizeof d, "%" PRIu32, r->running_turn);
        snprintf(e, sizeof e, "%" PRIu32, r->n_messages);
        snprintf(f, sizeof f, "%" PRIu64, r->last_event);
        const char *v[14] = {r->id, r->caller ? r->caller : "", r->owner,
                             r->run_id ? r->run_id : "", r->metadata, r->state,
                             berth_store_status_name(r->status), a, b, c, d, e, f, fence};
        if (!send_prepared(p, P_PUT_CONV, 14, v))
          return false;
        break;
      }
      case OP_PUT_MESSAGES:
        if (op->replace) {
          const char *v[2] = {op->id, fence};
          if (!send_prepared(p, P_DEL_MESSAGES, 2, v))
            return false;
        }
        for (size_t i = 0; i < op->n; i++) {
          snprintf(a, sizeof a, "%" PRIu64, (uint64_t)op->first + i);
          const char *v[4] = {op->id, a, op->texts[i], fence};
          if (!send_prepared(p, P_PUT_MESSAGE, 4, v))
            return false;
        }
        break;
      case OP_PUT_EVENT: {
        snprintf(a, sizeof a, "%" PRIu64, op->seq);
        snprintf(g, sizeof g, "%" PRIu32, op->turn);
        const char *v[7] = {op->id, a, g, op->ev_kind, op->data, op->message_id, fence};
        if (!send_prepared(p, P_PUT_EVENT, 7, v))
          return false;
        break;
      }
      case OP_LEASE_TAKE: {
        snprintf(a, sizeof a, "%" PRId64, op->ttl_ms);
        const char *v[3] = {op->id, op->host, a};
        if (!send_prepared(p, P_LEASE_TAKE, 3, v))
          return false;
        break;
      }
      case OP_LEASE_RENEW: {
        snprintf(a, sizeof a, "%" PRId64, op->ttl_ms);
        const char *v[2] = {op->host, a};
        if (!send_prepared(p, P_LEASE_RENEW, 2, v))
          return false;
        break;
      }
      case OP_LEASE_RELEASE: {
        const char *v[2] = {op->id, op->host};
        if (!send_prepared(p, P_LEASE_RELEASE, 2, v))
          return false;
        break;
      }
      case OP_LEASE_CLEAR:
        if (!send_prepared(p, P_LEASE_CLEAR, 0, NULL))
          return false;
        break;
      case OP_SYNC:
        break;
    }
  }
  q->cur = q->batch->ops;
  q->left = q->cur ? op_statements(q->cur) : 0;
  if (PQpipelineSync(p->conn) != 1)
    return false;
  q->sent = true;
  return true;
}

/* Sends the batches not sent yet, in order, while fewer than PG_IN_FLIGHT are sent and
 * unanswered.  Bounded so: what the server has not read stays in libpq's output
 * buffer, which libpq moves to its front at every partial send, and a buffer of
 * thousands of batches made every send cost the whole of it.  False when the
 * connection failed. */
static bool send_unsent(pg *p)
{
  size_t flying = 0;
  for (pgreq *q = p->head; q; q = q->next) {
    if (q->sent) {
      flying++;
      continue;
    }
    if (flying >= PG_IN_FLIGHT)
      break;
    if (!send_batch(p, q))
      return false;
    flying++;
  }
  int f = PQflush(p->conn);
  p->flush_pending = f == 1;
  return f >= 0;
}

/* Prepares the statements on the connection, ahead of everything not yet sent (the
 * batches that waited for the connection).  False when the connection failed. */
static bool send_setup(pg *p)
{
  pgreq *q = req_new(R_SETUP);
  bool ok = true;
  for (int i = 0; i < P_COUNT && ok; i++)
    ok = PQsendPrepare(p->conn, stmt_name(i), sql[i], 0, NULL) == 1;
  ok = ok && PQpipelineSync(p->conn) == 1;
  q->sent = true;
  pgreq **at = &p->head;         /* after what was sent already, before the rest */
  while (*at && (*at)->sent)
    at = &(*at)->next;
  q->next = *at;
  *at = q;
  if (!q->next)
    p->tail = q;
  if (!ok)
    fail_with_conn_error(p);
  return ok;
}

/* A new connection is ready: pipeline mode, its statements prepared (ahead of
 * everything else), then the batches that waited for it. */
static void on_connected(pg *p)
{
  if (PQsetnonblocking(p->conn, 1) != 0 || PQenterPipelineMode(p->conn) != 1) {
    fail_with_conn_error(p);
    return;
  }
  p->state = PG_READY;
  if (p->schema_ok && !send_setup(p))
    return;
  if (!send_unsent(p))
    fail_with_conn_error(p);
}

/* The server's notices (a shutdown's "terminating connection", say) are not the host's
 * to print: what matters comes back as an error. */
static void ignore_notice(void *arg, const char *message)
{
  (void)arg;
  (void)message;
}

static void conn_start(pg *p)
{
  /* The URL comes last: what it says (its own application_name) wins. */
  static const char *const keys[] = {"client_encoding", "application_name", "dbname", NULL};
  const char *vals[] = {"UTF8", "berth", p->s->url, NULL};
  p->conn = PQconnectStartParams(keys, vals, 1);
  p->progress = berth_clock();
  if (!p->conn || PQstatus(p->conn) == CONNECTION_BAD) {
    if (!p->conn)
      fail_all(p, unavailable(p, "out of memory"));
    else
      fail_with_conn_error(p);
    return;
  }
  PQsetNoticeProcessor(p->conn, ignore_notice, NULL);
  p->state = PG_CONNECTING;
  p->want = EV_WRITE;            /* libpq: as if PQconnectPoll said WRITING */
}

/* A connection left idle may have been closed by the server meanwhile (it was
 * stopped, or restarted): notice it now rather than failing the next batch on it. */
static void check_idle(pg *p)
{
  if (p->state != PG_READY || outstanding(p))
    return;
  /* An idle connection is readable only when the server said something: a notice
   * ("terminating connection…"), then the end of the stream. */
  for (int round = 0; round < 8; round++) {
    struct pollfd pf = {PQsocket(p->conn), POLLIN, 0};
    if (poll(&pf, 1, 0) <= 0)
      return;
    if (!PQconsumeInput(p->conn) || PQstatus(p->conn) == CONNECTION_BAD) {
      PQfinish(p->conn);
      p->conn = NULL;
      p->state = PG_DOWN;
      return;
    }
  }
}

/* A write's result, to the op it answers: a lease take's row (its answer is given
 * when the batch ends: committed, or not at all); a write the fence refused (no row
 * written, the fence set) is marked. */
static void op_answered(pg *p, pgreq *q, PGresult *r)
{
  while (q->cur && q->left == 0) {
    q->cur = q->cur->next;
    q->left = q->cur ? op_statements(q->cur) : 0;
  }
  store_op *op = q->cur;
  if (!op)
    return;
  bool deleting = op->kind == OP_PUT_MESSAGES && op->replace && q->left == op->n + 1;
  q->left--;
  if (op->kind != OP_LEASE_TAKE) {
    if (p->s->fence && !deleting &&
        (op->kind == OP_PUT_CONV || op->kind == OP_PUT_EVENT ||
         op->kind == OP_PUT_MESSAGES) && !strcmp(PQcmdTuples(r), "0"))
      op->fenced = true;
    return;
  }
  berth_store_lease *l = &op->lease;
  memset(l, 0, sizeof *l);
  if (PQntuples(r) < 1)
    return;
  const char *holder = PQgetisnull(r, 0, 0) ? NULL : PQgetvalue(r, 0, 0);
  l->found = true;
  l->taken = holder && !strcmp(holder, op->host);
  snprintf(l->holder, sizeof l->holder, "%s", holder ? holder : "");
  l->expiry_ms = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
  l->turns = (uint32_t)strtoull(PQgetvalue(r, 0, 2), NULL, 10);
  l->running_turn = (uint32_t)strtoull(PQgetvalue(r, 0, 3), NULL, 10);
  l->last_event = strtoull(PQgetvalue(r, 0, 4), NULL, 10);
}

/* Reads every result available without blocking, ending requests at their Sync. */
static void read_results(pg *p)
{
  int nulls = 0;
  while (p->conn && p->head && p->head->sent && !PQisBusy(p->conn)) {
    PGresult *r = PQgetResult(p->conn);
    if (!r) {                    /* between two queries' results */
      if (++nulls > 1)
        break;
      continue;
    }
    nulls = 0;
    p->progress = berth_clock();
    pgreq *q = p->head;
    switch (PQresultStatus(r)) {
      case PGRES_PIPELINE_SYNC:
        PQclear(r);
        complete_head(p, NULL);
        if (p->state == PG_READY && !send_unsent(p)) {  /* one answered: the next goes */
          fail_with_conn_error(p);
          return;
        }
        continue;
      case PGRES_TUPLES_OK:
        if (q->kind == R_WAIT) {
          PQclear(q->rows);
          q->rows = r;
          continue;
        }
        if (q->kind == R_WRITE)  /* in a batch only lease takes return rows */
          op_answered(p, q, r);
        break;
      case PGRES_COMMAND_OK:
        if (q->kind == R_WRITE)
          op_answered(p, q, r);
        break;
      case PGRES_PIPELINE_ABORTED:
        if (!q->err)
          q->err = unavailable(p, "the transaction was aborted");
        break;
      default:
        if (!q->err) {
          const char *m = PQresultErrorMessage(r);
          q->err = unavailable(p, m && *m ? m : PQresStatus(PQresultStatus(r)));
        }
        break;
    }
    PQclear(r);
  }
}

/* Moves the connection on as far as it goes without blocking; revents: what the socket
 * is ready for. */
static void step(pg *p, int revents)
{
  if (p->state == PG_CONNECTING) {
    if (!(revents & p->want))
      return;
    p->progress = berth_clock();
    switch (PQconnectPoll(p->conn)) {
      case PGRES_POLLING_READING: p->want = EV_READ; return;
      case PGRES_POLLING_WRITING: p->want = EV_WRITE; return;
      case PGRES_POLLING_OK: on_connected(p); break;
      default: fail_with_conn_error(p); return;
    }
  }
  if (p->state != PG_READY)
    return;
  bool broken = !PQconsumeInput(p->conn);
  if (!broken) {
    int f = PQflush(p->conn);
    broken = f < 0;
    p->flush_pending = f == 1;
  }
  read_results(p);
  if (broken || PQstatus(p->conn) == CONNECTION_BAD)
    fail_with_conn_error(p);
}

/* What the socket is waited for now (0: nothing outstanding). */
static int wanted(const pg *p)
{
  if (!p->conn)
    return 0;
  if (p->state == PG_CONNECTING)
    return p->want;
  if (!outstanding(p))
    return 0;
  return EV_READ | (p->flush_pending ? EV_WRITE : 0);
}

/* The loop's watchers follow the connection: the socket while something is
 * outstanding, and a timer bounding how long it may stay silent. */
static void watch(pg *p)
{
  struct ev_loop *loop = p->s->loop;
  if (!loop)
    return;
  int want = wanted(p);
  int fd = want ? PQsocket(p->conn) : -1;
  if (ev_is_active(&p->io) && (p->io.fd != fd || (p->io.events & (EV_READ | EV_WRITE))
                                                   != want))
    ev_io_stop(loop, &p->io);
  if (want && fd >= 0 && !ev_is_active(&p->io)) {
    ev_io_set(&p->io, fd, want);
    ev_io_start(loop, &p->io);
  }
  if (want && !ev_is_active(&p->timer)) {
    ev_timer_set(&p->timer, 1.0, 1.0);
    ev_timer_start(loop, &p->timer);
  } else if (!want && ev_is_active(&p->timer))
    ev_timer_stop(loop, &p->timer);
}

static void on_io(struct ev_loop *loop, ev_io *w, int revents)
{
  (void)loop;
  pg *p = w->data;
  step(p, revents);
  watch(p);
}

static void on_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)loop;
  (void)revents;
  pg *p = w->data;
  if (outstanding(p) || p->state == PG_CONNECTING) {
    /* What arrived while the loop was busy elsewhere is a sign of life too: read it
     * before calling the server silent. */
    if (p->state == PG_READY && berth_clock() - p->progress > p->timeout)
      step(p, EV_READ | EV_WRITE);
    if (p->conn && berth_clock() - p->progress > p->timeout) {
      char why[80];
      snprintf(why, sizeof why, "no answer within %g s", p->timeout);
      fail_all(p, unavailable(p, why));
    }
  }
  watch(p);
}

/* Drives the connection from the caller's stack until q is done (q NULL: until
 * nothing is outstanding and no connection is being made), at most p->timeout of
 * silence. */
static void wait_for(pg *p, pgreq *q)
{
  p->progress = berth_clock();   /* (the wait starts the count: earlier silence was
                                    the loop's, busy elsewhere) */
  for (;;) {
    if (q ? q->done : (!outstanding(p) && p->state != PG_CONNECTING))
      break;
    int want = wanted(p);
    /* at most p->timeout without a sign of life: a long queue that keeps answering
     * is waited for */
    double left = p->progress + p->timeout - berth_clock();
    if (!want || left <= 0) {
      char why[80];
      snprintf(why, sizeof why, "no answer within %g s", p->timeout);
      fail_all(p, unavailable(p, want ? why : "nothing to wait for"));
      break;
    }
    struct pollfd pf = {PQsocket(p->conn), (short)((want & EV_READ ? POLLIN : 0) |
                                                   (want & EV_WRITE ? POLLOUT : 0)), 0};
    int n = poll(&pf, 1, (int)(left * 1000) + 1);
    if (n < 0 && errno != EINTR) {
      fail_all(p, unavailable(p, strerror(errno)));
      break;
    }
    int revents = 0;
    if (pf.revents & (POLLIN | POLLHUP | POLLERR))
      revents |= EV_READ;
    if (pf.revents & (POLLOUT | POLLHUP | POLLERR))
      revents |= EV_WRITE;
    if (revents)
      step(p, revents);
  }
  watch(p);
}

/* Connects when there is no connection, and waits until everything sent before is
 * answered.  NULL when ready, or the error. */
static berth_error *ready(pg *p)
{
  check_idle(p);
  if (p->state == PG_DOWN)
    conn_start(p);
  wait_for(p, NULL);
  if (p->state == PG_READY)
    return NULL;
  return p->last_err ? error_copy(p->last_err) : unavailable(p, "not connected");
}

/* Sends queries (texts or, with stmt >= 0, one prepared statement) and a Sync, and
 * waits for their answer: the last rows in *rows (the caller's to PQclear). */
static berth_error *roundtrip(pg *p, int stmt, const char *const *texts, int n,
                              const char *const *vals, PGresult **rows)
{
  if (rows)
    *rows = NULL;
  berth_error *e = ready(p);
  if (e)
    return e;
  pgreq *q = req_new(R_WAIT);
  enqueue(p, q);
  bool ok = true;
  if (stmt >= 0)
    ok = send_prepared(p, stmt, n, vals);
  else
    for (int i = 0; i < n && ok; i++)
      ok = PQsendQueryParams(p->conn, texts[i], 0, NULL, NULL, NULL, NULL, 0) == 1;
  if (!(ok && PQpipelineSync(p->conn) == 1))
    fail_with_conn_error(p);
  else {
    q->sent = true;
    int f = PQflush(p->conn);
    p->flush_pending = f == 1;
    wait_for(p, q);
  }
  e = q->err;
  q->err = NULL;
  if (!e && rows) {
    *rows = q->rows;
    q->rows = NULL;
  }
  req_free(q);
  return e;
}

/* }====================================================== */

/* {====================================================== open, migrate, close */

static int64_t int_at(const PGresult *r, int row, int col)
{
  return PQgetisnull(r, row, col) ? 0 : strtoll(PQgetvalue(r, row, col), NULL, 10);
}

/* How many tables the schema has, and whether schema_version is one of them. */
#define PG_WHAT_IS_THERE "SELECT (SELECT count(*) FROM pg_tables WHERE schemaname =" \
                         " current_schema()), to_regclass('schema_version') IS NOT NULL"
#define PG_LOCK "SELECT pg_advisory_xact_lock(" PG_MIGRATION_LOCK ")"

static berth_error *migrate(pg *p)
{
  static const char *const lock[] = {"BEGIN", PG_LOCK, PG_WHAT_IS_THERE};
  static const char *const rollback[] = {"ROLLBACK"};
  PGresult *r;
  berth_error *e = roundtrip(p, -1, lock, 3, NULL, &r);
  if (e)
    goto fail;
  int64_t objects = r && PQntuples(r) ? int_at(r, 0, 0) : 0;
  bool ours = r && PQntuples(r) && !strcmp(PQgetvalue(r, 0, 1), "t");
  PQclear(r);
  int64_t version = 0;
  if (ours) {
    static const char *const read[] = {"SELECT max(version) FROM schema_version"};
    if ((e = roundtrip(p, -1, read, 1, NULL, &r)))
      goto fail;
    version = r && PQntuples(r) ? int_at(r, 0, 0) : 0;
    PQclear(r);
  } else if (objects) {
    e = berth_error_new("data_loss", "the store (%s) is a PostgreSQL database but not a "
                                     "berth store (it has tables and no schema_version); "
                                     "nothing was changed: give another --store, or a "
                                     "schema of its own (options=-csearch_path=…)",
                        p->name);
    goto fail;
  }
  if (version > BERTH_STORE_SCHEMA) {
    e = berth_error_new("version", "the store (%s) was written by a newer berth (schema "
                                   "version %" PRId64 "; this berth knows up to %d): "
                                   "upgrade berth, or give another --store; nothing was "
                                   "changed", p->name, version, BERTH_STORE_SCHEMA);
    goto fail;
  }
  const char *steps[64];
  char ups[BERTH_STORE_SCHEMA][64];
  int n = 0;
  for (int64_t v = version; v < BERTH_STORE_SCHEMA; v++) {
    for (const char *const *m = migrations[v]; *m; m++)
      steps[n++] = *m;
    snprintf(ups[v], sizeof ups[v], "UPDATE schema_version SET version = %d", (int)v + 1);
    steps[n++] = ups[v];
  }
  steps[n++] = "COMMIT";
  if ((e = roundtrip(p, -1, steps, n, NULL, NULL)))
    goto fail;
  return NULL;
fail:
  if (p->state == PG_READY)
    berth_error_free(roundtrip(p, -1, rollback, 1, NULL, NULL));
  return e;
}

static void pg_close(berth_store *s)
{
  pg *p = s->engine;
  if (!p)
    return;
  if (p->conn)
    wait_for(p, NULL);           /* what was flushed last is answered */
  fail_all(p, unavailable(p, "the store was closed"));
  if (s->loop) {
    ev_io_stop(s->loop, &p->io);
    ev_timer_stop(s->loop, &p->timer);
  }
  berth_error_free(p->last_err);
  free(p->name);
  free(p);
  s->engine = NULL;
}

/* "database D on H" from the URL's parts, and its connect_timeout (or PG_TIMEOUT), or
 * an error for a URL libpq refuses. */
static berth_error *describe(const char *url, char **name, double *timeout)
{
  char *msg = NULL;
  PQconninfoOption *opts = PQconninfoParse(url, &msg);
  if (!opts) {
    berth_error *e = berth_error_new("invalid_argument", "the store URL is not one "
                                                         "PostgreSQL accepts: %s",
                                     msg ? msg : "out of memory");
    PQfreemem(msg);
    return e;
  }
  const char *db = NULL, *host = NULL;
  *timeout = PG_TIMEOUT;
  for (PQconninfoOption *o = opts; o->keyword; o++) {
    if (!strcmp(o->keyword, "dbname"))
      db = o->val;
    else if (!strcmp(o->keyword, "host"))
      host = o->val;
    else if (!strcmp(o->keyword, "connect_timeout") && o->val && atoi(o->val) > 0)
      *timeout = atoi(o->val);
  }
  size_t len = 64 + (db ? strlen(db) : 0) + (host ? strlen(host) : 0);
  *name = berth_xmalloc(len);
  snprintf(*name, len, "database %s on %s", db && *db ? db : "(default)",
           host && *host ? host : "the default socket");
  PQconninfoFree(opts);
  return NULL;
}

static berth_error *pg_open(berth_store *s, const char *where)
{
  (void)where;                   /* libpq takes the whole URL */
  char *name = NULL;
  double timeout = PG_TIMEOUT;
  berth_error *e = describe(s->url, &name, &timeout);
  if (e)
    return e;
  pg *p = berth_xcalloc(1, sizeof *p);
  p->s = s;
  p->name = name;
  p->timeout = timeout;
  s->engine = p;
  ev_io_init(&p->io, on_io, 0, EV_READ);
  p->io.data = p;
  ev_timer_init(&p->timer, on_timer, 1.0, 1.0);
  p->timer.data = p;
  if ((e = ready(p)) || (e = migrate(p)))
    goto fail;
  p->schema_ok = true;
  if (!send_setup(p)) {
    e = error_copy(p->last_err);
    goto fail;
  }
  if ((e = ready(p)))
    goto fail;
  return NULL;
fail:
  pg_close(s);
  return e;
}

/* }====================================================== */

/* {====================================================== writes */

static void pg_apply(berth_store *s, berth_store_batch *b)
{
  pg *p = s->engine;
  pgreq *q = req_new(R_WRITE);
  q->batch = b;
  check_idle(p);
  enqueue(p, q);
  if (p->state == PG_DOWN)
    conn_start(p);               /* sent once connected (or failed with it) */
  else if (p->state == PG_READY && !send_unsent(p))
    fail_with_conn_error(p);
  if (!s->loop)
    wait_for(p, NULL);           /* no loop to answer on: synchronous */
  else
    watch(p);
}

/* Waits for every batch in flight: berth_store_flush returns with them answered. */
static void pg_settle(berth_store *s)
{
  pg *p = s->engine;
  if (outstanding(p) || p->state == PG_CONNECTING)
    wait_for(p, NULL);
}

/* }====================================================== */

/* {====================================================== reads */

static char *text_at(const PGresult *r, int row, int col)
{
  return PQgetisnull(r, row, col) ? NULL : berth_xstrdup(PQgetvalue(r, row, col));
}

static berth_store_status status_of(const char *name)
{
  for (int st = BERTH_STORE_OPEN; st <= BERTH_STORE_INTERRUPTED; st++)
    if (name && !strcmp(name, berth_store_status_name((berth_store_status)st)))
      return (berth_store_status)st;
  return BERTH_STORE_OPEN;
}

static void rows_conv(const PGresult *r, berth_store_conv **out, size_t *n)
{
  int rows = r ? PQntuples(r) : 0;
  berth_store_conv *v = rows ? berth_xcalloc((size_t)rows, sizeof *v) : NULL;
  for (int i = 0; i < rows; i++) {
    berth_store_conv *c = &v[i];
    c->order = (uint64_t)int_at(r, i, 0);
    c->id = text_at(r, i, 1);
    c->caller = text_at(r, i, 2);
    c->owner = text_at(r, i, 3);
    c->run_id = text_at(r, i, 4);
    c->metadata = text_at(r, i, 5);
    c->state = text_at(r, i, 6);
    c->status = status_of(PQgetvalue(r, i, 7));
    c->created_ms = int_at(r, i, 8);
    c->updated_ms = int_at(r, i, 9);
    c->turns = (uint32_t)int_at(r, i, 10);
    c->running_turn = (uint32_t)int_at(r, i, 11);
    c->n_messages = (uint32_t)int_at(r, i, 12);
    c->last_event = (uint64_t)int_at(r, i, 13);
    c->lease_holder = text_at(r, i, 14);
    c->lease_expiry_ms = int_at(r, i, 15);
  }
  *out = v;
  *n = (size_t)rows;
}

static berth_error *pg_get_conv(berth_store *s, const char *id, berth_store_conv *out,
                                bool *found)
{
  PGresult *r;
  const char *v[1] = {id};
  berth_error *e = roundtrip(s->engine, P_GET_CONV, NULL, 1, v, &r);
  if (e)
    return e;
  berth_store_conv *rows;
  size_t n;
  rows_conv(r, &rows, &n);
  PQclear(r);
  if (n) {
    *out = rows[0];
    memset(&rows[0], 0, sizeof rows[0]);
    *found = true;
  }
  berth_store_convs_free(rows, n);
  return NULL;
}

static berth_error *pg_list_convs(berth_store *s, const char *caller, uint64_t before,
                                  size_t limit, berth_store_conv **out, size_t *n)
{
  char b[24], l[24];
  snprintf(b, sizeof b, "%" PRId64, before && before < (uint64_t)INT64_MAX ? (int64_t)before
                                                                           : INT64_MAX);
  snprintf(l, sizeof l, "%zu", limit);
  const char *v[3] = {caller, b, limit ? l : NULL};   /* LIMIT NULL: no limit */
  PGresult *r;
  berth_error *e = roundtrip(s->engine, P_LIST, NULL, 3, v, &r);
  if (e)
    return e;
  rows_conv(r, out, n);
  PQclear(r);
  return NULL;
}

static berth_error *pg_list_running(berth_store *s, berth_store_conv **out, size_t *n)
{
  PGresult *r;
  berth_error *e = roundtrip(s->engine, P_RUNNING, NULL, 0, NULL, &r);
  if (e)
    return e;
  rows_conv(r, out, n);
  PQclear(r);
  return NULL;
}

static berth_error *pg_load_messages(berth_store *s, const char *id, char ***out, size_t *n)
{
  PGresult *r;
  const char *v[1] = {id};
  berth_error *e = roundtrip(s->engine, P_MESSAGES, NULL, 1, v, &r);
  if (e)
    return e;
  int rows = r ? PQntuples(r) : 0;
  char **t = rows ? berth_xcalloc((size_t)rows, sizeof *t) : NULL;
  for (int i = 0; i < rows; i++)
    t[i] = text_at(r, i, 0);
  PQclear(r);
  *out = t;
  *n = (size_t)rows;
  return NULL;
}

static berth_error *pg_read_events(berth_store *s, const char *id, uint64_t after,
                                   size_t limit, berth_store_event **out, size_t *n)
{
  char a[24], l[24];
  snprintf(a, sizeof a, "%" PRIu64, after);
  snprintf(l, sizeof l, "%zu", limit);
  const char *v[3] = {id, a, limit ? l : NULL};
  PGresult *r;
  berth_error *e = roundtrip(s->engine, P_EVENTS, NULL, 3, v, &r);
  if (e)
    return e;
  int rows = r ? PQntuples(r) : 0;
  berth_store_event *ev = rows ? berth_xcalloc((size_t)rows, sizeof *ev) : NULL;
  for (int i = 0; i < rows; i++) {
    ev[i].seq = (uint64_t)int_at(r, i, 0);
    ev[i].turn = (uint32_t)int_at(r, i, 1);
    ev[i].kind = text_at(r, i, 2);
    ev[i].data = text_at(r, i, 3);
  }
  PQclear(r);
  *out = ev;
  *n = (size_t)rows;
  return NULL;
}

static berth_error *pg_find_message(berth_store *s, const char *id, const char *message_id,
                                    uint64_t before, uint64_t *seq, bool *found)
{
  char b[24];
  snprintf(b, sizeof b, "%" PRId64, before && before < (uint64_t)INT64_MAX ? (int64_t)before
                                                                           : INT64_MAX);
  const char *v[3] = {id, message_id, b};
  PGresult *r;
  berth_error *e = roundtrip(s->engine, P_FIND_MESSAGE, NULL, 3, v, &r);
  if (e)
    return e;
  if (r && PQntuples(r) && !PQgetisnull(r, 0, 0)) {
    *seq = (uint64_t)int_at(r, 0, 0);
    *found = true;
  }
  PQclear(r);
  return NULL;
}

/* }====================================================== */

const berth_store_vtable berth_store_pg = {
  "postgresql", pg_open, pg_close, pg_apply, pg_get_conv, pg_list_convs,
  pg_load_messages, pg_read_events, pg_find_message, pg_list_running, pg_settle, NULL,
  PG_EAGER_OPS,
};

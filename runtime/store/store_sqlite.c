/*
 * store_sqlite.c — the "sqlite:PATH" engine: one SQLite file (Debian's libsqlite3),
 * in WAL mode with synchronous=FULL, so a committed batch survives a crash of the
 * process and of the machine.  One connection, prepared statements kept.  Batches are
 * applied by the writer thread (sqlite_writer.h), every batch handed over since it
 * last looked in one IMMEDIATE transaction; the loop's thread reads on the same
 * connection, once the writer is settled (store.c's read barrier).  Without a loop
 * there is no writer, and a batch is applied when it is flushed.
 *
 * Schema (version 4; the same tables the PostgreSQL engine uses):
 *   schema_version(version)
 *   conversations(n INTEGER PRIMARY KEY — the listing order, id UNIQUE, caller, owner,
 *                 run_id, metadata, state, status, created_ms, updated_ms, turns,
 *                 running_turn, n_messages, last_event, lease_holder,
 *                 lease_expiry_ms — version 2: the lease, store.h)
 *   messages(conv, seq, body)              primary key (conv, seq)
 *   events(conv, seq, turn, kind, data, message_id — version 3: a "user" event's
 *          message id, store.h)      primary key (conv, seq); an index on
 *                                    (conv, message_id) where message_id is set
 *   (version 4: messages and events are rowid tables, as PostgreSQL's heap tables
 *   are: rows in arrival order, the primary key an index beside them; the message
 *   id index holds seq too)
 * Migrations run at open inside one transaction: migrations[v] takes version v to
 * v + 1.  A file at a newer version than BERTH_STORE_SCHEMA is refused untouched.
 */
#include "sqlite_checkpoint.h"
#include "sqlite_writer.h"
#include "store_engine.h"
#include "xalloc.h"
#include "embed.h"

#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

/* migrations[v]: from version v to v + 1 (0: an empty file to the first schema). */
static const char *const migrations[BERTH_STORE_SCHEMA] = {
  "CREATE TABLE schema_version (version INTEGER NOT NULL);"
  "CREATE TABLE conversations ("
  "  n INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, caller TEXT NOT NULL, owner TEXT,"
  "  run_id TEXT NOT NULL, metadata TEXT, state TEXT, status TEXT NOT NULL,"
  "  created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL,"
  "  turns INTEGER NOT NULL DEFAULT 0, running_turn INTEGER NOT NULL DEFAULT 0,"
  "  n_messages INTEGER NOT NULL DEFAULT 0, last_event INTEGER NOT NULL DEFAULT 0);"
  "CREATE INDEX conversations_by_caller ON conversations (caller, n);"
  "CREATE INDEX conversations_running ON conversations (running_turn) "
  "  WHERE running_turn > 0;"
  "CREATE TABLE messages (conv TEXT NOT NULL, seq INTEGER NOT NULL, body TEXT NOT NULL,"
  "  PRIMARY KEY (conv, seq)) WITHOUT ROWID;"
  "CREATE TABLE events (conv TEXT NOT NULL, seq INTEGER NOT NULL, turn INTEGER NOT NULL,"
  "  kind TEXT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (conv, seq)) WITHOUT ROWID;"
  "INSERT INTO schema_version (version) VALUES (0);",
  /* 1 -> 2: leases (many hosts on one store) */
  "ALTER TABLE conversations ADD COLUMN lease_holder TEXT;"
  "ALTER TABLE conversations ADD COLUMN lease_expiry_ms INTEGER NOT NULL DEFAULT 0;"
  "CREATE INDEX conversations_leased ON conversations (lease_holder)"
  "  WHERE lease_holder IS NOT NULL;",
  /* 2 -> 3: message ids, indexed (a retry is found without reading the events).  The
   * ids stored before are taken from their "user" events' JSON, once, so a retry of
   * a message taken before the upgrade is still recognised. */
  "ALTER TABLE events ADD COLUMN message_id TEXT;"
  "UPDATE events SET message_id = json_extract(data, '$.messageId')"
  "  WHERE kind = 'user' AND CASE WHEN json_valid(data)"
  "    THEN json_type(data, '$.messageId') = 'text' ELSE 0 END;"
  "CREATE INDEX events_by_message_id ON events (conv, message_id)"
  "  WHERE message_id IS NOT NULL;",
  /* 3 -> 4: messages and events in rowid tables, so rows are appended in the order
   * they come (a flush of many conversations' turns dirties a few pages at the end,
   * not one page per conversation: a third less written per turn, measured by
   * bench/store_turns), their (conv, seq) keys in an index beside them. */
  "CREATE TABLE messages_4 (conv TEXT NOT NULL, seq INTEGER NOT NULL, body TEXT NOT NULL,"
  "  PRIMARY KEY (conv, seq));"
  "INSERT INTO messages_4 (conv, seq, body) SELECT conv, seq, body FROM messages;"
  "DROP TABLE messages;"
  "ALTER TABLE messages_4 RENAME TO messages;"
  "CREATE TABLE events_4 (conv TEXT NOT NULL, seq INTEGER NOT NULL, turn INTEGER NOT NULL,"
  "  kind TEXT NOT NULL, data TEXT NOT NULL, message_id TEXT, PRIMARY KEY (conv, seq));"
  "INSERT INTO events_4 (conv, seq, turn, kind, data, message_id)"
  "  SELECT conv, seq, turn, kind, data, message_id FROM events;"
  "DROP TABLE events;"
  "ALTER TABLE events_4 RENAME TO events;"
  /* (with seq: the lookup reads the index alone, and no plan prefers the key's) */
  "CREATE INDEX events_by_message_id ON events (conv, message_id, seq)"
  "  WHERE message_id IS NOT NULL;",
};

#define CONV_COLUMNS "n, id, caller, owner, run_id, metadata, state, status, created_ms, " \
                     "updated_ms, turns, running_turn, n_messages, last_event, lease_holder, " \
                     "lease_expiry_ms"

enum {
  S_PUT_CONV, S_ADD_CONV, S_FENCED, S_DEL_MESSAGES, S_PUT_MESSAGE, S_PUT_EVENT, S_GET_CONV,
  S_LIST, S_RUNNING, S_MESSAGES, S_EVENTS, S_FIND_MESSAGE, S_BEGIN, S_COMMIT, S_ROLLBACK,
  S_LEASE_TAKE, S_LEASE_RENEW, S_LEASE_RELEASE, S_LEASE_CLEAR, S_COUNT_OPEN, S_COUNT
};

#define LEASE_FREE "(lease_holder IS NULL OR lease_expiry_ms < ?3 OR lease_holder = ?2)"

static const char *const sql[S_COUNT] = {
  /* the record's fields a conversation changes (the others are set once, below) */
  "UPDATE conversations SET metadata = ?5, state = ?6, status = ?7, updated_ms = ?9,"
  " turns = ?10, running_turn = ?11, n_messages = ?12, last_event = ?13"
  " WHERE id = ?1 AND turns <= ?10 AND last_event <= ?13"      /* never back (store.h) */
  " AND (?14 IS NULL OR lease_holder = ?14)",                 /* the fence (store.h) */
  "INSERT INTO conversations (id, caller, owner, run_id, metadata, state, status,"
  " created_ms, updated_ms, turns, running_turn, n_messages, last_event)"
  " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"
  " ON CONFLICT (id) DO NOTHING",
  /* A write of conversation ?1 under the fence ?2 is refused when the conversation is
   * stored and ?2 does not hold its lease (store.h).  Asked once before an op's writes,
   * in their transaction, rather than as a WHERE of each: an INSERT ... SELECT needs a
   * statement journal (a savepoint a statement), a fifth of the writer's work. */
  "SELECT 1 FROM conversations WHERE id = ?1 AND (lease_holder IS NULL"
  " OR lease_holder <> ?2)",
  "DELETE FROM messages WHERE conv = ?1",
  "INSERT OR REPLACE INTO messages (conv, seq, body) VALUES (?1, ?2, ?3)",
  "INSERT OR REPLACE INTO events (conv, seq, turn, kind, data, message_id)"
  " VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
  "SELECT " CONV_COLUMNS " FROM conversations WHERE id = ?1",
  "SELECT " CONV_COLUMNS " FROM conversations WHERE caller = ?1 AND n < ?2"
  " ORDER BY n DESC LIMIT ?3",
  "SELECT " CONV_COLUMNS " FROM conversations WHERE running_turn > 0",
  "SELECT body FROM messages WHERE conv = ?1 ORDER BY seq",
  ("SELECT seq, turn, kind, data FROM events WHERE conv = ?1 AND seq > ?2 ORDER BY seq"
   " LIMIT ?3"),
  /* (message_id = ?2 implies it is not NULL: the partial index serves it) */
  "SELECT max(seq) FROM events WHERE conv = ?1 AND message_id = ?2 AND seq < ?3",
  "BEGIN IMMEDIATE",
  "COMMIT",
  "ROLLBACK",
  /* ?1 id, ?2 host, ?3 now, ?4 ttl: the row either way (taken: its holder is ?2) */
  "UPDATE conversations SET"
  " lease_holder = CASE WHEN " LEASE_FREE " THEN ?2 ELSE lease_holder END,"
  " lease_expiry_ms = CASE WHEN " LEASE_FREE " THEN ?3 + ?4 ELSE lease_expiry_ms END"
  " WHERE id = ?1 RETURNING lease_holder, lease_expiry_ms, turns, running_turn, last_event",
  "UPDATE conversations SET lease_expiry_ms = ?2 + ?3 WHERE lease_holder = ?1",
  "UPDATE conversations SET lease_holder = NULL, lease_expiry_ms = 0"
  " WHERE id = ?1 AND lease_holder = ?2",
  "UPDATE conversations SET lease_holder = NULL, lease_expiry_ms = 0"
  " WHERE lease_holder IS NOT NULL",
  /* (conversations_by_caller serves it) */
  "SELECT count(*) FROM conversations WHERE caller = ?1 AND status <> 'completed'",
};

/* A batch goes to the writer once this many writes are queued (store_engine.h), so
 * that it applies them while the loop runs the iteration's other turns. */
#define LITE_EAGER_OPS 512

typedef struct lite {
  sqlite3 *db;
  char *path;
  sqlite3_stmt *st[S_COUNT];
  lite_ckpt *ckpt;               /* NULL: SQLite's automatic checkpoints */
  lite_writer *writer;           /* NULL (no loop, or no thread): apply on the caller's */
  int lock_fd;                   /* the file, flock()ed while this store is open; or -1 */
} lite;

static berth_error *lite_write(void *ud, lite_job *jobs);
static void lite_after(void *ud);

/* An error value for what SQLite said (rc), about the store's file. */
static berth_error *lite_error(lite *l, int rc, const char *doing)
{
  const char *why = l->db ? sqlite3_errmsg(l->db) : sqlite3_errstr(rc);
  switch (rc & 0xff) {
    case SQLITE_NOTADB:
    case SQLITE_CORRUPT:
      return berth_error_new("data_loss", "the store %s is not a readable berth database "
                                          "(%s, %s); nothing was changed: move it away "
                                          "or give another --store", l->path, why, doing);
    case SQLITE_FULL:
      return berth_error_new("unavailable", "the store %s cannot grow: the disk is full "
                                            "(%s)", l->path, doing);
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return berth_error_new("unavailable", "the store %s is locked by another process "
                                            "(%s)", l->path, doing);
    default:
      return berth_error_new("unavailable", "the store %s: %s (%s)", l->path, why, doing);
  }
}

static int exec(lite *l, const char *text)
{
  return sqlite3_exec(l->db, text, NULL, NULL, NULL);
}

static void lite_close(berth_store *s)
{
  lite *l = s->engine;
  if (!l)
    return;
  lite_writer_stop(l->writer);   /* (store.c settled it: nothing is left to apply) */
  lite_ckpt_stop(l->ckpt, l->db);
  for (int i = 0; i < S_COUNT; i++)
    sqlite3_finalize(l->st[i]);
  sqlite3_close(l->db);
  if (l->lock_fd >= 0)
    close(l->lock_fd);          /* (releases the flock) */
  free(l->path);
  free(l);
  s->engine = NULL;
}

/* The version the file is at: 0 for an empty file; -1 for a database that is not a
 * berth store (it has tables and no schema_version).  rc on failure. */
static int read_version(lite *l, int *version)
{
  sqlite3_stmt *q;
  int rc = sqlite3_prepare_v2(l->db, "SELECT (SELECT count(*) FROM sqlite_master),"
                                     " (SELECT count(*) FROM sqlite_master WHERE"
                                     "  type = 'table' AND name = 'schema_version')",
                              -1, &q, NULL);
  if (rc != SQLITE_OK)
    return rc;
  rc = sqlite3_step(q);
  if (rc != SQLITE_ROW) {
    sqlite3_finalize(q);
    return rc;
  }
  int objects = sqlite3_column_int(q, 0), ours = sqlite3_column_int(q, 1);
  sqlite3_finalize(q);
  if (!ours) {
    *version = objects ? -1 : 0;
    return SQLITE_OK;
  }
  rc = sqlite3_prepare_v2(l->db, "SELECT max(version) FROM schema_version", -1, &q, NULL);
  if (rc != SQLITE_OK)
    return rc;
  rc = sqlite3_step(q);
  *version = rc == SQLITE_ROW ? sqlite3_column_int(q, 0) : 0;
  sqlite3_finalize(q);
  return rc == SQLITE_ROW ? SQLITE_OK : rc;
}

/* Creates or migrates the schema in one transaction; refuses what is not ours or is
 * newer. */
static berth_error *migrate(lite *l)
{
  int rc = exec(l, "BEGIN IMMEDIATE");
  if (rc != SQLITE_OK)
    return lite_error(l, rc, "opening");
  int version = 0;
  rc = read_version(l, &version);
  if (rc != SQLITE_OK) {
    exec(l, "ROLLBACK");
    return lite_error(l, rc, "reading its schema version");
  }
  if (version < 0) {
    exec(l, "ROLLBACK");
    return berth_error_new("data_loss", "the store %s is an SQLite database but not a berth "
                                        "store (it has tables and no schema_version); "
                                        "nothing was changed: give another --store",
                           l->path);
  }
  if (version > BERTH_STORE_SCHEMA) {
    exec(l, "ROLLBACK");
    return berth_error_new("version", "the store %s was written by a newer berth (schema "
                                      "version %d; this berth knows up to %d): upgrade "
                                      "berth, or give another --store; nothing was "
                                      "changed", l->path, version, BERTH_STORE_SCHEMA);
  }
  for (int v = version; v < BERTH_STORE_SCHEMA; v++) {
    rc = exec(l, migrations[v]);
    if (rc == SQLITE_OK) {
      char up[80];
      snprintf(up, sizeof up, "UPDATE schema_version SET version = %d", v + 1);
      rc = exec(l, up);
    }
    if (rc != SQLITE_OK) {
      berth_error *e = lite_error(l, rc, "migrating its schema");
      exec(l, "ROLLBACK");
      return e;
    }
  }
  rc = exec(l, "COMMIT");
  if (rc != SQLITE_OK) {
    berth_error *e = lite_error(l, rc, "migrating its schema");
    exec(l, "ROLLBACK");
    return e;
  }
  return NULL;
}

/* berth_store_claim: an exclusive flock on the file, held until the store closes.
 * flock and SQLite's own fcntl locks do not see each other, so neither SQLite nor a
 * `sqlite3` reading the file is held back; the descriptor is close-on-exec, so no
 * child keeps the lock. */
static berth_error *lite_claim(berth_store *s)
{
  lite *l = s->engine;
  const char *file = sqlite3_db_filename(l->db, "main");
  if (l->lock_fd >= 0 || !file || !*file)  /* (claimed; ":memory:" has no file) */
    return NULL;
  int fd = open(file, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return berth_error_new("unavailable", "cannot open the store %s to lock it: %s", l->path,
                           strerror(errno));
  if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
    l->lock_fd = fd;
    return NULL;
  }
  int err = errno;
  close(fd);
  if (err == EWOULDBLOCK)
    return berth_error_new("unavailable", "the store %s is in use by another berth: one host "
                                          "to a SQLite file (PostgreSQL is for many hosts)",
                           l->path);
  return berth_error_new("unavailable", "cannot lock the store %s: %s", l->path,
                         strerror(err));
}

static berth_error *lite_open(berth_store *s, const char *path)
{
  lite *l = berth_xcalloc(1, sizeof *l);
  l->lock_fd = -1;
  l->path = berth_xstrdup(path);
  s->engine = l;
  int rc = sqlite3_open_v2(path, &l->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                                         SQLITE_OPEN_NOMUTEX, NULL);
  berth_error *e = NULL;
  if (rc != SQLITE_OK) {
    e = berth_error_new("unavailable", "cannot open the store %s: %s", path,
                        l->db ? sqlite3_errmsg(l->db) : sqlite3_errstr(rc));
    goto fail;
  }
  /* How long a write waits for another process's lock: it holds the loop meanwhile,
   * so briefly.  One berth per file is the rule; this covers `sqlite3` reading it. */
  sqlite3_busy_timeout(l->db, 1000);
  rc = exec(l, "PRAGMA journal_mode = WAL");
  if (rc != SQLITE_OK) {
    e = lite_error(l, rc, "setting WAL mode");
    goto fail;
  }
  rc = exec(l, "PRAGMA synchronous = FULL");
  if (rc != SQLITE_OK) {
    e = lite_error(l, rc, "setting synchronous");
    goto fail;
  }
  if ((e = migrate(l)))
    goto fail;
  /* A cache for the pages of the conversations that are turning: each turn's rows go
   * into index leaves of their own conversation, scattered over a file that grows with
   * every conversation held, and SQLite's default 2 MB left the writer reading most of
   * them back (2 600 misses a transaction beside 100 000 held).  32 MiB at most, taken
   * as pages are read (docs/performance.md §7). */
  rc = exec(l, "PRAGMA cache_size = -32768");
  if (rc != SQLITE_OK) {
    e = lite_error(l, rc, "setting its cache size");
    goto fail;
  }
  for (int i = 0; i < S_COUNT; i++) {
    rc = sqlite3_prepare_v3(l->db, sql[i], -1, SQLITE_PREPARE_PERSISTENT, &l->st[i], NULL);
    if (rc != SQLITE_OK) {
      e = lite_error(l, rc, "preparing its statements");
      goto fail;
    }
  }
  l->ckpt = lite_ckpt_start(l->db, path);
  if (s->loop)
    l->writer = lite_writer_start(s->loop, lite_write, lite_after, l);
  return NULL;
fail:
  lite_close(s);
  return e;
}

/* {====================================================== writes */

static void bind_text(sqlite3_stmt *q, int i, const char *v)
{
  if (v)
    sqlite3_bind_text(q, i, v, -1, SQLITE_STATIC);
  else
    sqlite3_bind_null(q, i);
}

/* (Bindings are not cleared: every write binds all of its statement's parameters.) */
static int run(sqlite3_stmt *q)
{
  int rc = sqlite3_step(q);
  sqlite3_reset(q);
  return rc == SQLITE_DONE || rc == SQLITE_ROW ? SQLITE_OK : rc;
}

static void bind_conv(sqlite3_stmt *q, const berth_store_conv *r)
{
  bind_text(q, 1, r->id);
  bind_text(q, 2, r->caller ? r->caller : "");
  bind_text(q, 3, r->owner);
  bind_text(q, 4, r->run_id ? r->run_id : "");
  bind_text(q, 5, r->metadata);
  bind_text(q, 6, r->state);
  bind_text(q, 7, berth_store_status_name(r->status));
  sqlite3_bind_int64(q, 8, r->created_ms);
  sqlite3_bind_int64(q, 9, r->updated_ms);
  sqlite3_bind_int64(q, 10, r->turns);
  sqlite3_bind_int64(q, 11, r->running_turn);
  sqlite3_bind_int64(q, 12, r->n_messages);
  sqlite3_bind_int64(q, 13, (sqlite3_int64)r->last_event);
}

/* An update of the fields a conversation changes (no index but the running turns'
 * is touched), and an insert only when that found no row: cheaper than an upsert,
 * which writes every column and index entry again.  (An update the guard refused also
 * finds no row: the insert then does nothing.) */
static int put_conv(lite *l, store_op *op, const char *fence)
{
  sqlite3_stmt *q = l->st[S_PUT_CONV];
  bind_conv(q, &op->conv);
  bind_text(q, 14, fence);
  int rc = run(q);
  if (rc != SQLITE_OK || sqlite3_changes(l->db) > 0)
    return rc;
  q = l->st[S_ADD_CONV];
  bind_conv(q, &op->conv);
  rc = run(q);
  op->fenced = rc == SQLITE_OK && fence && sqlite3_changes(l->db) == 0;
  return rc;
}

/* Whether op must not write: the fence refuses its conversation (S_FENCED; then
 * op->fenced, for all of the op's writes: one transaction), or asking failed (*rc gets
 * SQLite's code).  No fence refuses nothing. */
static bool fence_stops(lite *l, store_op *op, const char *fence, int *rc)
{
  *rc = SQLITE_OK;
  if (!fence)
    return false;
  sqlite3_stmt *q = l->st[S_FENCED];
  bind_text(q, 1, op->id);
  bind_text(q, 2, fence);
  int step = sqlite3_step(q);
  sqlite3_reset(q);
  if (step == SQLITE_ROW)
    op->fenced = true;
  else if (step != SQLITE_DONE)
    *rc = step;
  return step != SQLITE_DONE;
}

static int put_messages(lite *l, store_op *op, const char *fence)
{
  int rc = SQLITE_OK;
  if ((!op->replace && op->n == 0) || fence_stops(l, op, fence, &rc))
    return rc;
  if (op->replace) {
    bind_text(l->st[S_DEL_MESSAGES], 1, op->id);
    rc = run(l->st[S_DEL_MESSAGES]);
  }
  sqlite3_stmt *q = l->st[S_PUT_MESSAGE];
  for (size_t i = 0; i < op->n && rc == SQLITE_OK; i++) {
    bind_text(q, 1, op->id);
    sqlite3_bind_int64(q, 2, (sqlite3_int64)(op->first + i));
    bind_text(q, 3, op->texts[i]);
    rc = run(q);
  }
  return rc;
}

static int put_event(lite *l, store_op *op, const char *fence)
{
  int rc;
  if (fence_stops(l, op, fence, &rc))
    return rc;
  sqlite3_stmt *q = l->st[S_PUT_EVENT];
  bind_text(q, 1, op->id);
  sqlite3_bind_int64(q, 2, (sqlite3_int64)op->seq);
  sqlite3_bind_int64(q, 3, op->turn);
  bind_text(q, 4, op->ev_kind);
  bind_text(q, 5, op->data);
  bind_text(q, 6, op->message_id);
  return run(q);
}

static int lease_take(lite *l, store_op *op)
{
  sqlite3_stmt *q = l->st[S_LEASE_TAKE];
  berth_store_lease *r = &op->lease;
  memset(r, 0, sizeof *r);
  bind_text(q, 1, op->id);
  bind_text(q, 2, op->host);
  sqlite3_bind_int64(q, 3, berth_store_now_ms());
  sqlite3_bind_int64(q, 4, op->ttl_ms);
  int rc = sqlite3_step(q);
  if (rc == SQLITE_ROW) {
    const char *holder = (const char *)sqlite3_column_text(q, 0);
    r->found = true;
    r->taken = holder && !strcmp(holder, op->host);
    snprintf(r->holder, sizeof r->holder, "%s", holder ? holder : "");
    r->expiry_ms = sqlite3_column_int64(q, 1);
    r->turns = (uint32_t)sqlite3_column_int64(q, 2);
    r->running_turn = (uint32_t)sqlite3_column_int64(q, 3);
    r->last_event = (uint64_t)sqlite3_column_int64(q, 4);
    rc = sqlite3_step(q);
  }
  sqlite3_reset(q);
  sqlite3_clear_bindings(q);
  return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static int lease_update(lite *l, const store_op *op)
{
  sqlite3_stmt *q;
  switch (op->kind) {
    case OP_LEASE_RENEW:
      q = l->st[S_LEASE_RENEW];
      bind_text(q, 1, op->host);
      sqlite3_bind_int64(q, 2, berth_store_now_ms());
      sqlite3_bind_int64(q, 3, op->ttl_ms);
      break;
    case OP_LEASE_RELEASE:
      q = l->st[S_LEASE_RELEASE];
      bind_text(q, 1, op->id);
      bind_text(q, 2, op->host);
      break;
    default:
      q = l->st[S_LEASE_CLEAR];
      break;
  }
  return run(q);
}

/* The jobs' operations in one transaction, each job's under its fence: on the
 * writer's thread (sqlite_writer.h), or on the loop's when there is no writer. */
static berth_error *lite_write(void *ud, lite_job *jobs)
{
  lite *l = ud;
  int rc = run(l->st[S_BEGIN]);
  for (lite_job *j = jobs; j && rc == SQLITE_OK; j = j->next)
    for (store_op *op = j->batch->ops; op && rc == SQLITE_OK; op = op->next) {
      op->fenced = false;
      switch (op->kind) {
        case OP_PUT_CONV: rc = put_conv(l, op, j->fence); break;
        case OP_PUT_MESSAGES: rc = put_messages(l, op, j->fence); break;
        case OP_PUT_EVENT: rc = put_event(l, op, j->fence); break;
        case OP_LEASE_TAKE: rc = lease_take(l, op); break;
        case OP_LEASE_RENEW:
        case OP_LEASE_RELEASE:
        case OP_LEASE_CLEAR: rc = lease_update(l, op); break;
        case OP_SYNC: break;
      }
    }
  if (rc == SQLITE_OK)
    rc = run(l->st[S_COMMIT]);
  if (rc == SQLITE_OK)
    return NULL;
  berth_error *e = lite_error(l, rc, "writing");
  if (!sqlite3_get_autocommit(l->db))
    run(l->st[S_ROLLBACK]);
  return e;
}

/* After a transaction, its batches handed back: what the checkpoints left to the
 * writer (sqlite_checkpoint.h). */
static void lite_after(void *ud)
{
  lite *l = ud;
  lite_ckpt_finish(l->ckpt, l->db);
}

static void lite_apply(berth_store *s, berth_store_batch *b)
{
  lite *l = s->engine;
  if (l->writer) {
    lite_writer_submit(l->writer, b, s->fence);
    return;
  }
  lite_job j = {NULL, b, s->fence, NULL};
  berth_error *e = lite_write(l, &j);
  berth_store_batch_done(b, e);
  berth_error_free(e);
  lite_after(l);
}

static void lite_settle(berth_store *s)
{
  lite *l = s->engine;
  if (l->writer)
    lite_writer_settle(l->writer);
}

/* }====================================================== */

/* {====================================================== reads */

static char *col_text(sqlite3_stmt *q, int i)
{
  const unsigned char *t = sqlite3_column_text(q, i);
  return t ? berth_xstrdup((const char *)t) : NULL;
}

static berth_store_status status_of(const char *name)
{
  for (int st = BERTH_STORE_OPEN; st <= BERTH_STORE_INTERRUPTED; st++)
    if (name && !strcmp(name, berth_store_status_name((berth_store_status)st)))
      return (berth_store_status)st;
  return BERTH_STORE_OPEN;
}

static void row_conv(sqlite3_stmt *q, berth_store_conv *r)
{
  r->order = (uint64_t)sqlite3_column_int64(q, 0);
  r->id = col_text(q, 1);
  r->caller = col_text(q, 2);
  r->owner = col_text(q, 3);
  r->run_id = col_text(q, 4);
  r->metadata = col_text(q, 5);
  r->state = col_text(q, 6);
  r->status = status_of((const char *)sqlite3_column_text(q, 7));
  r->created_ms = sqlite3_column_int64(q, 8);
  r->updated_ms = sqlite3_column_int64(q, 9);
  r->turns = (uint32_t)sqlite3_column_int64(q, 10);
  r->running_turn = (uint32_t)sqlite3_column_int64(q, 11);
  r->n_messages = (uint32_t)sqlite3_column_int64(q, 12);
  r->last_event = (uint64_t)sqlite3_column_int64(q, 13);
  r->lease_holder = col_text(q, 14);
  r->lease_expiry_ms = sqlite3_column_int64(q, 15);
}

/* Steps q to the end, one record per row. */
static berth_error *rows_conv(lite *l, sqlite3_stmt *q, berth_store_conv **out, size_t *n)
{
  berth_store_conv *v = NULL;
  size_t count = 0, cap = 0;
  int rc;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    if (count == cap) {
      cap = cap ? 2 * cap : 16;
      v = berth_xrealloc(v, cap * sizeof *v);
    }
    memset(&v[count], 0, sizeof *v);
    row_conv(q, &v[count++]);
  }
  sqlite3_reset(q);
  sqlite3_clear_bindings(q);
  if (rc != SQLITE_DONE) {
    berth_store_convs_free(v, count);
    return lite_error(l, rc, "reading conversations");
  }
  *out = v;
  *n = count;
  return NULL;
}

static berth_error *lite_get_conv(berth_store *s, const char *id, berth_store_conv *out,
                                  bool *found)
{
  lite *l = s->engine;
  sqlite3_stmt *q = l->st[S_GET_CONV];
  bind_text(q, 1, id);
  berth_store_conv *v = NULL;
  size_t n = 0;
  berth_error *e = rows_conv(l, q, &v, &n);
  if (e)
    return e;
  if (n) {
    *out = v[0];
    memset(&v[0], 0, sizeof v[0]);
    *found = true;
  }
  berth_store_convs_free(v, n);
  return NULL;
}

static berth_error *lite_list_convs(berth_store *s, const char *caller, uint64_t before,
                                    size_t limit, berth_store_conv **out, size_t *n)
{
  lite *l = s->engine;
  sqlite3_stmt *q = l->st[S_LIST];
  bind_text(q, 1, caller);
  sqlite3_bind_int64(q, 2, before && before < (uint64_t)INT64_MAX ? (sqlite3_int64)before
                                                                   : INT64_MAX);
  sqlite3_bind_int64(q, 3, limit ? (sqlite3_int64)limit : -1);
  return rows_conv(l, q, out, n);
}

static berth_error *lite_count_open(berth_store *s, const char *caller, size_t *n)
{
  lite *l = s->engine;
  sqlite3_stmt *q = l->st[S_COUNT_OPEN];
  bind_text(q, 1, caller);
  int rc = sqlite3_step(q);
  *n = rc == SQLITE_ROW ? (size_t)sqlite3_column_int64(q, 0) : 0;
  sqlite3_reset(q);
  return rc == SQLITE_ROW ? NULL : lite_error(l, rc, "counting a caller's conversations");
}

static berth_error *lite_list_running(berth_store *s, berth_store_conv **out, size_t *n)
{
  lite *l = s->engine;
  return rows_conv(l, l->st[S_RUNNING], out, n);
}

static berth_error *lite_load_messages(berth_store *s, const char *id, char ***out, size_t *n)
{
  lite *l = s->engine;
  sqlite3_stmt *q = l->st[S_MESSAGES];
  bind_text(q, 1, id);
  char **v = NULL;
  size_t count = 0, cap = 0;
  int rc;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    if (count == cap) {
      cap = cap ? 2 * cap : 16;
      v = berth_xrealloc(v, cap * sizeof *v);
    }
    v[count++] = col_text(q, 0);
  }
  sqlite3_reset(q);
  sqlite3_clear_bindings(q);
  if (rc != SQLITE_DONE) {
    berth_store_texts_free(v, count);
    return lite_error(l, rc, "reading messages");
  }
  *out = v;
  *n = count;
  return NULL;
}

static berth_error *lite_read_events(berth_store *s, const char *id, uint64_t after,
                                     size_t limit, berth_store_event **out, size_t *n)
{
  lite *l = s->engine;
  sqlite3_stmt *q = l->st[S_EVENTS];
  bind_text(q, 1, id);
  sqlite3_bind_int64(q, 2, (sqlite3_int64)after);
  sqlite3_bind_int64(q, 3, limit ? (sqlite3_int64)limit : -1);
  berth_store_event *v = NULL;
  size_t count = 0, cap = 0;
  int rc;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    if (count == cap) {
      cap = cap ? 2 * cap : 16;
      v = berth_xrealloc(v, cap * sizeof *v);
    }
    v[count].seq = (uint64_t)sqlite3_column_int64(q, 0);
    v[count].turn = (uint32_t)sqlite3_column_int64(q, 1);
    v[count].kind = col_text(q, 2);
    v[count].data = col_text(q, 3);
    count++;
  }
  sqlite3_reset(q);
  sqlite3_clear_bindings(q);
  if (rc != SQLITE_DONE) {
    berth_store_events_free(v, count);
    return lite_error(l, rc, "reading events");
  }
  *out = v;
  *n = count;
  return NULL;
}

static berth_error *lite_find_message(berth_store *s, const char *id,
                                      const char *message_id, uint64_t before,
                                      uint64_t *seq, bool *found)
{
  lite *l = s->engine;
  sqlite3_stmt *q = l->st[S_FIND_MESSAGE];
  bind_text(q, 1, id);
  bind_text(q, 2, message_id);
  sqlite3_bind_int64(q, 3, before && before < (uint64_t)INT64_MAX ? (sqlite3_int64)before
                                                                   : INT64_MAX);
  int rc = sqlite3_step(q);
  if (rc == SQLITE_ROW && sqlite3_column_type(q, 0) != SQLITE_NULL) {
    *seq = (uint64_t)sqlite3_column_int64(q, 0);
    *found = true;
  }
  sqlite3_reset(q);
  sqlite3_clear_bindings(q);
  return rc == SQLITE_ROW ? NULL : lite_error(l, rc, "finding a message id");
}

/* }====================================================== */

static void lite_stats(const berth_store *s, berth_store_stats *out)
{
  const lite *l = s->engine;
  out->checkpoints = l ? lite_ckpt_made(l->ckpt) : 0;
}

const berth_store_vtable berth_store_sqlite = {
  "sqlite", lite_open, lite_close, lite_apply, lite_get_conv, lite_list_convs,
  lite_load_messages, lite_read_events, lite_find_message, lite_list_running,
  lite_settle, lite_stats, LITE_EAGER_OPS, lite_claim, lite_count_open,
};

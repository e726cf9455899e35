/*
 * sqlite_checkpoint.c — checkpoints of the store's WAL on a thread of their own
 * (sqlite_checkpoint.h says why).
 */
#include "sqlite_checkpoint.h"
#include "diag.h"
#include "xalloc.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

struct lite_ckpt {
  sqlite3 *db;                   /* the thread's own connection */
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool wanted, stop, busy;       /* under mu */
  uint64_t made, failed;         /* under mu */
  int copied;                    /* under mu: the WAL's frames the last checkpoint copied,
                                    0 once the writer's next commit looked at it */
  bool finish;                   /* the committing thread's: lite_ckpt_finish copies */
};

static void *checkpointer(void *arg)
{
  lite_ckpt *c = arg;
  pthread_mutex_lock(&c->mu);
  for (;;) {
    while (!c->wanted && !c->stop)
      pthread_cond_wait(&c->cv, &c->mu);
    if (c->stop)
      break;
    c->wanted = false;
    c->busy = true;
    pthread_mutex_unlock(&c->mu);
    int copied = 0;
    int rc = sqlite3_wal_checkpoint_v2(c->db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, &copied);
    pthread_mutex_lock(&c->mu);
    c->busy = false;
    if (rc == SQLITE_OK) {
      c->made++;
      c->copied = copied;
    }
    else if (c->failed++ == 0)  /* once: the next ones say nothing new */
      berth_diag(BERTH_LOG_WARN, "store: a checkpoint of the WAL failed (%s); it is tried "
                                 "again as the WAL grows", sqlite3_errstr(rc));
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

/* After each commit of the store's connection: wakes the thread once the WAL holds
 * enough pages (and it is not already at work).  A WAL starts again from its
 * beginning only when a write begins with every page of it copied.  A thread copying
 * while the writer writes without pause seldom sees that: each of its checkpoints
 * ends behind the commits made meanwhile, and it started again after every commit,
 * copying each commit's pages (and syncing twice) until the WAL reached its bound.
 * Under bench/serve_load it copied three pages in four that were written, the same
 * pages again and again.  So when the thread's last checkpoint left at most
 * LITE_CKPT_REST pages behind, this commit's thread copies them itself, in RESTART
 * mode, and the next write starts the WAL from its beginning: the thread copies the
 * bulk, in parallel, and the writer waits only for the last commits' pages and a
 * sync.  It does so in lite_ckpt_finish, once the commit's batches are handed back:
 * here, inside the commit, their syncs would wait for it too.  The thread's figure
 * is taken by the first commit after it: a later one could be of a WAL that started
 * again meanwhile.
 *
 * Past LITE_CKPT_MOST the writer copies all that is left itself, as SQLite's
 * automatic checkpoint would have, also in RESTART mode: a PASSIVE checkpoint gives
 * up at once while the thread's is running, and the WAL then grew past its bound;
 * RESTART waits for that one (the connection's busy timeout), copies the rest, and
 * lets the next commit start the WAL from its beginning.  Only the writer's thread
 * waits, not the loop. */
static int on_wal(void *ud, sqlite3 *db, const char *schema, int frames)
{
  lite_ckpt *c = ud;
  pthread_mutex_lock(&c->mu);
  int copied = c->copied;
  c->copied = 0;
  bool idle = !c->busy && !c->wanted;
  bool rest = idle && copied && frames >= copied && frames - copied <= LITE_CKPT_REST;
  if (idle && !rest && frames >= LITE_CKPT_FRAMES && frames < LITE_CKPT_MOST) {
    c->wanted = true;
    pthread_cond_signal(&c->cv);
  }
  pthread_mutex_unlock(&c->mu);
  if (frames < LITE_CKPT_FRAMES)
    return SQLITE_OK;
  if (frames >= LITE_CKPT_MOST)
    sqlite3_wal_checkpoint_v2(db, schema, SQLITE_CHECKPOINT_RESTART, NULL, NULL);
  else if (rest)
    c->finish = true;
  return SQLITE_OK;
}

void lite_ckpt_finish(lite_ckpt *c, sqlite3 *db)
{
  if (!c || !c->finish)
    return;
  c->finish = false;
  sqlite3_wal_checkpoint_v2(db, NULL, SQLITE_CHECKPOINT_RESTART, NULL, NULL);
}

lite_ckpt *lite_ckpt_start(sqlite3 *db, const char *path)
{
  lite_ckpt *c = berth_xcalloc(1, sizeof *c);
  /* A connection knows the file is in WAL mode once it read it: until then its
   * checkpoints do nothing. */
  if (sqlite3_open_v2(path, &c->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) !=
      SQLITE_OK ||
      sqlite3_exec(c->db, "SELECT count(*) FROM sqlite_master", NULL, NULL, NULL) !=
      SQLITE_OK) {
    sqlite3_close(c->db);
    free(c);
    return NULL;
  }
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  if (pthread_create(&c->thread, NULL, checkpointer, c) != 0) {
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    sqlite3_close(c->db);
    free(c);
    return NULL;
  }
  sqlite3_wal_hook(db, on_wal, c);   /* (replaces the automatic checkpoint's hook) */
  return c;
}

void lite_ckpt_stop(lite_ckpt *c, sqlite3 *db)
{
  if (!c)
    return;
  sqlite3_wal_hook(db, NULL, NULL);
  pthread_mutex_lock(&c->mu);
  c->stop = true;
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
  pthread_join(c->thread, NULL);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  sqlite3_close(c->db);
  free(c);
}

uint64_t lite_ckpt_made(lite_ckpt *c)
{
  if (!c)
    return 0;
  pthread_mutex_lock(&c->mu);
  uint64_t made = c->made;
  pthread_mutex_unlock(&c->mu);
  return made;
}

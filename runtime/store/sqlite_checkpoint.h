/*
 * sqlite_checkpoint.h — the SQLite engine's checkpoints, made off the writer's thread.
 *
 * In WAL mode every commit appends pages to the -wal file, and a checkpoint copies
 * them back into the database (and syncs it).  SQLite's automatic checkpoint runs
 * inside the commit that crossed its threshold, so one transaction of the store, and
 * every sync waiting for it, would wait for a checkpoint of the whole WAL.  Instead the store's
 * connection has automatic checkpoints off, and its WAL hook wakes a thread of this
 * module, which checkpoints PASSIVE on a connection of its own: it copies what no
 * reader needs and never waits for the writer.  After its next commit the writer
 * copies what the thread left behind, when that is little (LITE_CKPT_REST pages: the
 * commits made while the thread copied; lite_ckpt_finish), so that SQLite starts the
 * WAL from its beginning at the next write.  The file stays near the threshold's size
 * (at most LITE_CKPT_MOST pages and one commit's), and a page that many commits wrote
 * since the last checkpoint is copied once.
 *
 * Threads: lite_ckpt_start and lite_ckpt_stop from the loop's thread, while no one
 * else uses `db`; the WAL hook runs inside `db`'s commits, on the thread that makes
 * them (the store's writer, sqlite_writer.h), and so does lite_ckpt_finish.  The
 * checkpoint thread touches only its own connection and this module's state, under
 * its mutex.
 * Errors: a checkpoint that fails (a full disk) is tried again at the next wake-up;
 * the WAL grows meanwhile and nothing is lost.  lite_ckpt_start fails only when the
 * file cannot be opened a second time or no thread can be made: the caller then
 * keeps SQLite's automatic checkpoints.
 */
#ifndef BERTH_SQLITE_CHECKPOINT_H
#define BERTH_SQLITE_CHECKPOINT_H

#include <sqlite3.h>
#include <stdint.h>

/* WAL pages past which a checkpoint is started (SQLite's own default threshold), and
 * past which the thread that commits makes it itself (sqlite_checkpoint.c says when). */
#define LITE_CKPT_FRAMES 1000
#define LITE_CKPT_MOST 8000
/* What the thread's checkpoint may leave behind for the writer to copy (pages). */
#define LITE_CKPT_REST 250

typedef struct lite_ckpt lite_ckpt;

/* Turns `db`'s automatic checkpoints off and starts the thread for the file `path`.
 * NULL when it could not (`db` unchanged: automatic checkpoints stay on). */
lite_ckpt *lite_ckpt_start(sqlite3 *db, const char *path);
/* Stops and joins the thread and closes its connection; `db`'s WAL hook is removed.
 * NULL is ignored. */
void lite_ckpt_stop(lite_ckpt *c, sqlite3 *db);
/* Copies what the thread's last checkpoint left behind, when a commit found it little
 * (LITE_CKPT_REST pages), so that the next write starts the WAL from its beginning.
 * Called by the thread that commits on `db`, between its transactions, once it
 * handed the commit's work back (the copy and its sync delay no sync of that commit).
 * Does nothing when there is nothing to finish, or for NULL. */
void lite_ckpt_finish(lite_ckpt *c, sqlite3 *db);
/* The checkpoints the thread made so far (0 for NULL). */
uint64_t lite_ckpt_made(lite_ckpt *c);

#endif

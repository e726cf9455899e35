/*
 * sqlite_writer.h — the SQLite engine's batches, applied on a thread of their own.
 *
 * Applying a batch is SQLite's B-tree work and a commit that syncs the WAL: about 30
 * µs a turn at 10 000 conversations.  Done in the loop's ev_prepare, the loop waited
 * for it, and the host's turns and the store's writes took turns on one core.  Here
 * the loop hands each batch over and goes on; a thread applies what was handed over
 * since it last looked in one transaction (one WAL sync for as many batches as the
 * loop made meanwhile, up to LITE_WRITER_GROUP operations), and the loop ends the
 * batches
 * (berth_store_batch_done) when the thread says so, through an ev_async.  A batch is
 * still all or nothing: its transaction commits all of it or none, and a failed one
 * fails every batch in it, each kept to be tried again (store.c).
 *
 * Threads: every function here is called from the loop's thread; `write` runs on the
 * writer's.  The connection is the writer's while batches are handed over and not
 * ended: the engine reads on it only after lite_writer_settle, which returns with the
 * writer idle.  The operations of a batch are the writer's from lite_writer_submit
 * until it is ended; nothing else touches them (store.c took them off its queue).
 * Errors: what `write` returns, for each batch of that transaction.  lite_writer_start
 * fails only when no thread can be made: the caller then applies on the loop.
 */
#ifndef BERTH_SQLITE_WRITER_H
#define BERTH_SQLITE_WRITER_H

#include <ev.h>

#include "store_engine.h"

/* The most operations of one transaction, when more batches wait: the batches are
 * taken whole, in order, and the first one whatever its size. */
#define LITE_WRITER_GROUP 4096

/* A batch handed over, with the fence it was made under (store.h, berth_store_fence). */
typedef struct lite_job {
  struct lite_job *next;
  berth_store_batch *batch;
  char *fence;                   /* a copy, or NULL */
  berth_error *err;              /* set by the writer: NULL, or why it failed */
} lite_job;

/* Applies the jobs (a list, in the order they were handed over) in one transaction;
 * returns NULL, or why none of them is (then the writer's to free). */
typedef berth_error *(*lite_write_fn)(void *ud, lite_job *jobs);

typedef struct lite_writer lite_writer;

/* `after` (or NULL) runs on the writer's thread after each transaction, once its jobs
 * were handed back to the loop (whose syncs may be answered meanwhile), before the
 * writer counts as idle: work on the connection that no sync should wait for. */
lite_writer *lite_writer_start(struct ev_loop *loop, lite_write_fn write,
                               void (*after)(void *ud), void *ud);
/* Hands a batch over (the fence copied). */
void lite_writer_submit(lite_writer *w, berth_store_batch *b, const char *fence);
/* Waits until every batch handed over is applied, and ends them, in order. */
void lite_writer_settle(lite_writer *w);
/* Settles, stops the thread and frees w.  NULL is ignored. */
void lite_writer_stop(lite_writer *w);

#endif

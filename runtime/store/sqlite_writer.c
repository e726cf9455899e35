/*
 * sqlite_writer.c — the SQLite engine's batches, applied on a thread of their own
 * (sqlite_writer.h says why).
 */
#include "sqlite_writer.h"
#include "embed.h"                /* berth_error_new */
#include "xalloc.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

struct lite_writer {
  struct ev_loop *loop;
  ev_async ended;                /* the writer's word that jobs are done */
  lite_write_fn write;
  void (*after)(void *ud);
  void *ud;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t work, idle;     /* for the writer; for lite_writer_settle */
  lite_job *todo, *todo_tail;    /* under mu: handed over, not taken yet */
  lite_job *done, *done_tail;    /* under mu: applied (or failed), not ended yet */
  bool busy, stop;               /* under mu */
};

static void append(lite_job **head, lite_job **tail, lite_job *first, lite_job *last)
{
  if (*tail)
    (*tail)->next = first;
  else
    *head = first;
  *tail = last;
}

static void *writer(void *arg)
{
  lite_writer *w = arg;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    while (!w->todo && !w->stop)
      pthread_cond_wait(&w->work, &w->mu);
    if (!w->todo)
      break;                    /* stopped, nothing left */
    /* Batches up to LITE_WRITER_GROUP operations (one at least) make a transaction:
     * a backlog is committed, and its syncs answered, in parts, so that the turns
     * waiting for them start a part at a time (not all the conversations' at once,
     * each with its coroutine alive in the Lua state until its turn ends). */
    lite_job *jobs = w->todo, *last = jobs;
    size_t ops = jobs->batch->n;
    while (last->next && ops + last->next->batch->n <= LITE_WRITER_GROUP) {
      last = last->next;
      ops += last->batch->n;
    }
    w->todo = last->next;
    if (!w->todo)
      w->todo_tail = NULL;
    last->next = NULL;
    w->busy = true;
    pthread_mutex_unlock(&w->mu);
    berth_error *e = w->write(w->ud, jobs);
    for (lite_job *j = jobs; j; j = j->next)
      j->err = e ? berth_error_new(e->code, "%s", e->message) : NULL;
    berth_error_free(e);
    pthread_mutex_lock(&w->mu);
    append(&w->done, &w->done_tail, jobs, last);
    ev_async_send(w->loop, &w->ended);
    if (w->after) {             /* still busy: the loop reads on the connection only
                                   once the writer is idle */
      pthread_mutex_unlock(&w->mu);
      w->after(w->ud);
      pthread_mutex_lock(&w->mu);
    }
    w->busy = false;
    pthread_cond_broadcast(&w->idle);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

/* Ends the jobs the writer is done with, in order (from the loop's thread). */
static void end_done(lite_writer *w)
{
  pthread_mutex_lock(&w->mu);
  lite_job *j = w->done;
  w->done = w->done_tail = NULL;
  pthread_mutex_unlock(&w->mu);
  while (j) {
    lite_job *next = j->next;
    berth_store_batch_done(j->batch, j->err);
    berth_error_free(j->err);
    free(j->fence);
    free(j);
    j = next;
  }
}

static void on_ended(struct ev_loop *loop, ev_async *a, int revents)
{
  (void)loop;
  (void)revents;
  end_done(a->data);
}

lite_writer *lite_writer_start(struct ev_loop *loop, lite_write_fn write,
                               void (*after)(void *ud), void *ud)
{
  lite_writer *w = berth_xcalloc(1, sizeof *w);
  w->loop = loop;
  w->write = write;
  w->after = after;
  w->ud = ud;
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->work, NULL);
  pthread_cond_init(&w->idle, NULL);
  if (pthread_create(&w->thread, NULL, writer, w) != 0) {
    pthread_cond_destroy(&w->idle);
    pthread_cond_destroy(&w->work);
    pthread_mutex_destroy(&w->mu);
    free(w);
    return NULL;
  }
  ev_async_init(&w->ended, on_ended);
  w->ended.data = w;
  ev_async_start(loop, &w->ended);
  ev_unref(loop);               /* the writer alone keeps no loop alive (a sync does) */
  return w;
}

void lite_writer_submit(lite_writer *w, berth_store_batch *b, const char *fence)
{
  lite_job *j = berth_xcalloc(1, sizeof *j);
  j->batch = b;
  j->fence = fence ? berth_xstrdup(fence) : NULL;
  pthread_mutex_lock(&w->mu);
  append(&w->todo, &w->todo_tail, j, j);
  pthread_cond_signal(&w->work);
  pthread_mutex_unlock(&w->mu);
}

void lite_writer_settle(lite_writer *w)
{
  pthread_mutex_lock(&w->mu);
  while (w->todo || w->busy)
    pthread_cond_wait(&w->idle, &w->mu);
  pthread_mutex_unlock(&w->mu);
  end_done(w);
}

void lite_writer_stop(lite_writer *w)
{
  if (!w)
    return;
  pthread_mutex_lock(&w->mu);
  w->stop = true;
  pthread_cond_signal(&w->work);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->thread, NULL);  /* (it applies what it was handed first) */
  end_done(w);
  ev_ref(w->loop);
  ev_async_stop(w->loop, &w->ended);
  pthread_cond_destroy(&w->idle);
  pthread_cond_destroy(&w->work);
  pthread_mutex_destroy(&w->mu);
  free(w);
}

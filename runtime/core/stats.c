/*
 * stats.c — what a host counts (conversations, turns, cells, errors by class, latency
 * histograms) and its rendering in the Prometheus text format, for embedders
 * (berth_host_stats) and for `berth serve`'s GET /metrics.
 */
#include "runtime.h"
#include "xalloc.h"
#include "store/store.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* {====================================================== histograms */

static const double bounds[BERTH_HIST_BUCKETS - 1] = {
  0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30
};

double berth_hist_bound(int i)
{
  if (i < 0)
    return 0;
  return i < BERTH_HIST_BUCKETS - 1 ? bounds[i] : INFINITY;
}

void berth_hist_add(berth_hist *hist, double seconds)
{
  if (!(seconds >= 0))
    seconds = 0;
  int i = 0;
  while (i < BERTH_HIST_BUCKETS - 1 && seconds > bounds[i])
    i++;
  hist->buckets[i]++;
  hist->count++;
  hist->sum += seconds;
}

double berth_hist_quantile(const berth_hist *hist, double q)
{
  if (!hist->count)
    return 0;
  double want = q * (double)hist->count;
  uint64_t seen = 0;
  for (int i = 0; i < BERTH_HIST_BUCKETS; i++) {
    seen += hist->buckets[i];
    if ((double)seen >= want && seen)
      return berth_hist_bound(i);
  }
  return INFINITY;
}

/* }====================================================== */

/* {====================================================== counters */

void berth_count_error(berth_host *h, const char *source, const char *cls)
{
  berth_errclass **pp = &h->st.classes;
  for (; *pp; pp = &(*pp)->next)
    if ((*pp)->source == source && strcmp((*pp)->cls, cls) == 0) {
      (*pp)->n++;
      return;
    }
  size_t n = strlen(cls);
  berth_errclass *e = berth_xmalloc(sizeof *e + n + 1);
  e->next = NULL;
  e->source = source;           /* a string literal of the caller */
  e->n = 1;
  memcpy(e->cls, cls, n + 1);
  *pp = e;
}

void berth_counters_free(berth_counters *st)
{
  while (st->classes) {
    berth_errclass *e = st->classes;
    st->classes = e->next;
    free(e);
  }
}

void berth_host_stats(const berth_host *h, berth_stats *out)
{
  memset(out, 0, sizeof *out);
  out->conversations = h->n_convs;
  out->conversations_opened = h->st.opened;
  out->conversations_completed = h->st.completed;
  out->turns_started = h->st.turns_started;
  out->turns_ended = h->st.turns_ended;
  out->turns_failed = h->st.turns_failed;
  out->turns_cancelled = h->st.turns_cancelled;
  out->turns_running = h->turns_running;
  out->messages_queued = h->queued;
  out->cells = h->st.cells;
  out->cell_errors = h->st.cell_errors;
  out->hook_errors = h->errors;
  out->capacity_refusals = h->st.capacity_refusals;
  out->sandboxes = h->sandboxes ? plm_sandboxes_count(h->sandboxes) : 0;
  out->lua_bytes = h->mem.used;
  out->turn_seconds = h->st.turn_seconds;
  out->cell_seconds = h->st.cell_seconds;
}

void berth_host_error_classes(const berth_host *h,
                              void (*fn)(void *ud, const char *source, const char *cls,
                                         uint64_t n),
                              void *ud)
{
  for (const berth_errclass *e = h->st.classes; e; e = e->next)
    fn(ud, e->source, e->cls, e->n);
}

/* }====================================================== */

/* {====================================================== Prometheus text */

static void head(FILE *f, const char *name, const char *type, const char *help)
{
  fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void one(FILE *f, const char *name, const char *type, const char *help, uint64_t v)
{
  head(f, name, type, help);
  fprintf(f, "%s %llu\n", name, (unsigned long long)v);
}

/* A label value with \, " and newline escaped. */
static void label(FILE *f, const char *s)
{
  for (; *s; s++) {
    if (*s == '\\' || *s == '"')
      fputc('\\', f);
    if (*s == '\n') {
      fputs("\\n", f);
      continue;
    }
    fputc(*s, f);
  }
}

static void hist(FILE *f, const char *name, const char *help, const berth_hist *hs)
{
  head(f, name, "histogram", help);
  uint64_t cum = 0;
  for (int i = 0; i < BERTH_HIST_BUCKETS - 1; i++) {
    cum += hs->buckets[i];
    fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], (unsigned long long)cum);
  }
  fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)hs->count);
  fprintf(f, "%s_sum %.9g\n%s_count %llu\n", name, hs->sum, name,
          (unsigned long long)hs->count);
}

char *berth_host_metrics(const berth_host *h)
{
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f)
    return NULL;
  berth_stats s;
  berth_host_stats(h, &s);
  one(f, "berth_conversations", "gauge", "Conversations open.", s.conversations);
  one(f, "berth_conversations_opened_total", "counter", "Conversations opened.",
      s.conversations_opened);
  one(f, "berth_conversations_completed_total", "counter",
      "Conversations completed (onComplete ran).", s.conversations_completed);
  one(f, "berth_turns_started_total", "counter", "Turns started.", s.turns_started);
  one(f, "berth_model_calls_total", "counter", "Model calls answered (replies and failures).",
      h->st.model_calls);
  head(f, "berth_turns_total", "counter", "Turns ended, by outcome.");
  uint64_t failed = s.turns_failed - s.turns_cancelled;
  fprintf(f, "berth_turns_total{outcome=\"ok\"} %llu\n",
          (unsigned long long)(s.turns_ended - s.turns_failed));
  fprintf(f, "berth_turns_total{outcome=\"failed\"} %llu\n", (unsigned long long)failed);
  fprintf(f, "berth_turns_total{outcome=\"cancelled\"} %llu\n",
          (unsigned long long)s.turns_cancelled);
  one(f, "berth_turns_running", "gauge", "Turns running (holding a turn slot).",
      s.turns_running);
  one(f, "berth_messages_queued", "gauge", "Messages accepted and not started.",
      s.messages_queued);
  head(f, "berth_cells_total", "counter", "executeCode calls answered, by outcome.");
  fprintf(f, "berth_cells_total{outcome=\"ok\"} %llu\n",
          (unsigned long long)(s.cells - s.cell_errors));
  fprintf(f, "berth_cells_total{outcome=\"error\"} %llu\n", (unsigned long long)s.cell_errors);
  head(f, "berth_errors_total", "counter",
       "Errors by source (cell, hook, host, model, store) and class (the error code).");
  for (const berth_errclass *e = h->st.classes; e; e = e->next) {
    fputs("berth_errors_total{source=\"", f);
    label(f, e->source);
    fputs("\",class=\"", f);
    label(f, e->cls);
    fprintf(f, "\"} %llu\n", (unsigned long long)e->n);
  }
  one(f, "berth_sandboxes", "gauge", "Sandboxes held by the sandbox layer.", s.sandboxes);
  if (h->o.store) {
    berth_store_stats ss;
    berth_store_get_stats(h->o.store, &ss);
    one(f, "berth_store_queued_writes", "gauge",
        "Store writes waiting (kept and tried again while the store fails).", ss.queued);
    one(f, "berth_store_failing", "gauge",
        "1 while the store's last write transaction failed: no new message is taken.",
        berth_store_failing(h->o.store));
    one(f, "berth_store_flushes_total", "counter", "Store write transactions applied.",
        ss.flushes);
    one(f, "berth_store_fenced_writes_total", "counter",
        "Writes the store refused: another host holds the conversation's lease.",
        ss.fenced);
    one(f, "berth_store_checkpoints_total", "counter",
        "SQLite WAL checkpoints made off the loop's thread.", ss.checkpoints);
  }
  one(f, "berth_lua_memory_bytes", "gauge", "Bytes of the Lua state.", s.lua_bytes);
  hist(f, "berth_turn_duration_seconds",
       "Turn latency, from the message's arrival to the turn's end.", &s.turn_seconds);
  hist(f, "berth_cell_duration_seconds",
       "executeCode latency, from the call to its answer.", &s.cell_seconds);
  if (fclose(f) != 0) {
    free(buf);
    return NULL;
  }
  return buf;
}

/* }====================================================== */

/*
 * bench/benchhost.h — what the host benchmarks (turns_per_second, store_turns,
 * idle_memory) share: the clocks they read (benchclock.h), a log that keeps only
 * errors, and the scripted model that answers every message with "ok" and runs no
 * code, so a turn's cost is the host's own.
 *
 * Header only (static inline): each benchmark is one file, built by itself.
 */
#ifndef BENCH_BENCHHOST_H
#define BENCH_BENCHHOST_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "benchclock.h"
#include "berth.h"

/* Removes a directory the benchmark made for its store (mkdtemp under /tmp), with what
 * the store left in it; says so on stderr, prefixed with `who`, when it cannot. */
static inline void bh_remove_dir(const char *dir, const char *who)
{
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0)
    fprintf(stderr, "%s: cannot remove %s\n", who, dir);
}

/* berth_options.log: errors only (a benchmark's output is its figures). */
static inline void bh_quiet(void *ud, berth_log_level level, const char *m)
{
  (void)ud;
  if (level == BERTH_LOG_ERROR)
    fprintf(stderr, "berth: %s\n", m);
}

/* The scripted model that says "ok" to every message, on `loop`.  NULL (the reason on
 * stderr, prefixed with `who`) when it cannot be made. */
static inline berth_model *bh_ok_model(struct ev_loop *loop, const char *who)
{
  char script[] = "/tmp/berth-bench-XXXXXX.lua";
  int fd = mkstemps(script, 4);
  const char text[] =
    "return { loop = true, turns = { { user = '*', replies = { { say = 'ok' } } } } }\n";
  if (fd < 0 || write(fd, text, sizeof text - 1) != (ssize_t)(sizeof text - 1)) {
    fprintf(stderr, "%s: cannot write the model's script in /tmp\n", who);
    if (fd >= 0)
      close(fd);
    return NULL;
  }
  close(fd);
  char spec[64];
  snprintf(spec, sizeof spec, "scripted:%s", script);
  berth_model *model = NULL;
  berth_error *e = berth_model_open(loop, spec, &model);
  unlink(script);
  if (e) {
    fprintf(stderr, "%s: %s\n", who, e->message);
    berth_error_free(e);
    return NULL;
  }
  return model;
}

#endif

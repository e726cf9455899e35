/*
 * bench/turns_per_second.c — scripted turns per second with no code, on one core.
 *
 * One host with the shipped hooks (scripts/code_chat.lua) and the scripted model (one
 * reply, "ok", to any message), no daemon: each turn is onTurnStart (warm answers
 * "Nothing ran" at once) and onTurn (the tool description, one model.chat call that
 * converts the history to JSON and back, the reply streamed as a delta, ctx:say), each
 * a coroutine resumed from the loop, with every typed callback set.  --conversations
 * conversations each get --turns turns, one after another, all conversations at once;
 * the process is pinned to one CPU.
 *
 * Prints turns/s over wall time and over CPU time, and the turns' latency (message to
 * end, which includes waiting behind the other conversations' turns).  Target:
 * >= 20 000 turns/s.  Bounded: --time-limit seconds at most (default 60).
 * BENCH_JSON=PATH also writes the figures there, with the distribution of every turn's
 * latency measured by the benchmark itself (bench/benchjson.h).
 */
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <ev.h>
#include <lua.h>

#include "benchhost.h"
#include "benchjson.h"
#include "berth.h"
#include "plimsoll.h"

#define TARGET 20000.0

typedef struct bench {
  struct ev_loop *loop;
  berth_host *h;
  berth_conv **convs;
  double *sent;                  /* per conversation: when its last message went */
  double *lat;                   /* every turn's latency, seconds */
  size_t n_lat;
  unsigned n, turns;
  unsigned long long ended, failed, deltas, messages;
  bool stop;
} bench;

static void on_delta(void *ud, berth_conv *c, const char *t, size_t n)
{
  (void)c; (void)t; (void)n;
  ((bench *)ud)->deltas++;
}

static void on_message(void *ud, berth_conv *c, const char *t, size_t n)
{
  (void)c; (void)t; (void)n;
  ((bench *)ud)->messages++;
}

static void on_turn_end(void *ud, berth_conv *c, const berth_turn_info *info)
{
  bench *b = ud;
  size_t idx = (size_t)(uintptr_t)berth_conv_userdata(c);
  double t = bh_now();
  if (b->n_lat < (size_t)b->n * b->turns)
    b->lat[b->n_lat++] = t - b->sent[idx];
  b->sent[idx] = t;
  b->ended++;
  if (!info->ok)
    b->failed++;
  if (info->turn < b->turns && !b->stop) {
    berth_error *e = berth_conv_message(c, "hello");
    if (e) {
      fprintf(stderr, "turns_per_second: %s\n", e->message);
      berth_error_free(e);
      b->failed++;
    }
  } else if (b->ended == (unsigned long long)b->n * b->turns || b->stop)
    ev_break(b->loop, EVBREAK_ALL);
}

static void on_limit(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)revents;
  bench *b = w->data;
  b->stop = true;
  fprintf(stderr, "turns_per_second: time limit reached\n");
  ev_break(loop, EVBREAK_ALL);
}

int main(int argc, char **argv)
{
  unsigned n = 2000, turns = 10;
  double limit = 60;
  const char *scripts = getenv("BERTH_SCRIPTS") && *getenv("BERTH_SCRIPTS")
                        ? getenv("BERTH_SCRIPTS") : "scripts";
  static const struct option opts[] = {
    {"conversations", required_argument, NULL, 'c'}, {"turns", required_argument, NULL, 't'},
    {"time-limit", required_argument, NULL, 'l'}, {"scripts", required_argument, NULL, 's'},
    {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}
  };
  int ch;
  while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1)
    switch (ch) {
      case 'c': n = (unsigned)atoi(optarg); break;
      case 't': turns = (unsigned)atoi(optarg); break;
      case 'l': limit = atof(optarg); break;
      case 's': scripts = optarg; break;
      default:
        printf("usage: turns_per_second [--conversations N (2000)] [--turns N (10)] "
               "[--time-limit S (60)] [--scripts DIR]\n");
        return ch == 'h' ? 0 : 2;
    }
  if (!n || !turns)
    return 2;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(0, &set);
  bool pinned = sched_setaffinity(0, sizeof set, &set) == 0;

  plm_global_init();
  bench b;
  memset(&b, 0, sizeof b);
  b.n = n;
  b.turns = turns;
  b.loop = ev_loop_new(EVFLAG_AUTO);
  char hooks[4096];
  snprintf(hooks, sizeof hooks, "%s/code_chat.lua", scripts);
  berth_model *model = bh_ok_model(b.loop, "turns_per_second");
  if (!model)
    return 1;
  berth_error *e = NULL;
  berth_options o;
  berth_options_init(&o);
  o.loop = b.loop;
  o.hooks_file = hooks;
  o.lib_dir = scripts;
  o.model = model;
  o.log = bh_quiet;
  berth_callbacks cb = {NULL, on_delta, on_message, NULL, NULL, on_turn_end, NULL, NULL, NULL,
                        &b};
  o.callbacks = cb;
  if ((e = berth_host_open(&o, &b.h))) {
    fprintf(stderr, "turns_per_second: %s\n", e->message);
    return 1;
  }
  b.convs = calloc(n, sizeof *b.convs);
  b.sent = calloc(n, sizeof *b.sent);
  b.lat = calloc((size_t)n * turns, sizeof *b.lat);
  for (unsigned i = 0; i < n; i++) {
    if ((e = berth_conv_open(b.h, NULL, &b.convs[i]))) {
      fprintf(stderr, "turns_per_second: %s\n", e->message);
      return 1;
    }
    berth_conv_set_userdata(b.convs[i], (void *)(uintptr_t)i);
  }
  ev_timer limit_timer;
  ev_timer_init(&limit_timer, on_limit, limit, 0.);
  limit_timer.data = &b;
  ev_timer_start(b.loop, &limit_timer);

  double w0 = bh_now(), c0 = bh_cpu();
  for (unsigned i = 0; i < n; i++) {
    b.sent[i] = bh_now();
    berth_conv_message(b.convs[i], "hello");
  }
  ev_run(b.loop, 0);
  double wall = bh_now() - w0, cpu_s = bh_cpu() - c0;
  ev_timer_stop(b.loop, &limit_timer);

  berth_stats st;
  berth_host_stats(b.h, &st);
  double rate = (double)b.ended / wall;
  printf("turns_per_second: %u conversations x %u turns, scripted model, no code, %s\n", n,
         turns, pinned ? "pinned to CPU 0" : "not pinned");
  printf("  turns             %llu (%llu failed), %llu deltas, %llu messages\n", b.ended,
         b.failed, b.deltas, b.messages);
  printf("  wall              %.3f s  -> %.0f turns/s\n", wall, rate);
  printf("  cpu               %.3f s  -> %.0f turns/s of CPU, %.1f us per turn\n", cpu_s,
         (double)b.ended / cpu_s, cpu_s / (double)b.ended * 1e6);
  printf("  latency (queued)  p50 <= %.4g s, p99 <= %.4g s (host histogram)\n",
         berth_hist_quantile(&st.turn_seconds, 0.5), berth_hist_quantile(&st.turn_seconds, 0.99));
  printf("  lua state         %.1f MiB at the end (history of %u turns each)\n",
         (double)st.lua_bytes / (1 << 20), turns);
  bool ok = !b.stop && !b.failed && b.ended == (unsigned long long)n * turns;
  printf("  target            >= %.0f turns/s: %s\n", TARGET,
         !ok ? "FAILED (turns failed or time limit)" : rate >= TARGET ? "met" : "NOT met");
  json_t *out = bj_new("turns_per_second");
  bj_param(out, "conversations", json_integer(n));
  bj_param(out, "turns", json_integer(turns));
  bj_param(out, "pinned", json_boolean(pinned));
  bj_fig(out, "turns", (double)b.ended, "turns");
  bj_fig(out, "failed", (double)b.failed, "turns");
  bj_fig(out, "wall", wall, "s");
  bj_fig(out, "cpu", cpu_s, "s");
  bj_fig(out, "rate_wall", rate, "turns/s");
  bj_fig(out, "rate_cpu", (double)b.ended / cpu_s, "turns/s");
  bj_fig(out, "cpu_per_turn", cpu_s / (double)b.ended * 1e6, "us");
  bj_fig(out, "lua_state", (double)st.lua_bytes, "B");
  bj_fig(out, "target", TARGET, "turns/s");
  json_object_set_new(out, "met", json_boolean(ok && rate >= TARGET));
  for (size_t i = 0; i < b.n_lat; i++)
    b.lat[i] *= 1000;
  json_object_set_new(out, "turn_latency", bj_dist(b.lat, b.n_lat, "ms", false));
  if (bj_write(out))
    ok = false;
  for (unsigned i = 0; i < n; i++)
    berth_conv_free(b.convs[i]);
  free(b.convs);
  free(b.sent);
  free(b.lat);
  berth_host_free(b.h);
  berth_model_free(model);
  ev_loop_destroy(b.loop);
  return ok ? 0 : 1;
}

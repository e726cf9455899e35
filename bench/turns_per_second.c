/*
 * bench/turns_per_second.c — scripted turns per second with no code, on one core.
 *
 * One host with the shipped hooks (scripts/code_chat.lua) and the scripted model (one
 * reply, "ok", to any message), no daemon: each turn is onTurnStart (warm answers
 * "Nothing ran" at once) and onTurn (the tool description, one model.chat call that
 * converts the history to JSON and back, the reply streamed as a delta, ctx:say), each
 * a coroutine resumed from the loop, with every typed callback set.  --conversations
 * conversations each get --turns turns, one after another, all conversations at once;
 * the loop's thread is pinned to one CPU (a store's threads are not).
 *
 * --held N first opens N other conversations, gives each --held-turns turns (3) and
 * suspends them: the conversations a host holds idle while others run.  With --store
 * URL ("memory", "sqlite" for a new file in /tmp, or any store URL) a suspended
 * conversation's history leaves the Lua heap once stored (runtime/core/agent.c), so
 * the held ones should cost the running ones nothing; without one they keep it there.
 * The measured turns are the --conversations' only.
 *
 * Prints turns/s over wall time and over CPU time, and the turns' latency (message to
 * end, which includes waiting behind the other conversations' turns).  Targets (issue
 * 15): >= 50 000 turns/s at 1 000 conversations, >= 40 000 with 100 000 held; below
 * them the bar is the first one, 20 000.  Bounded: --time-limit seconds at most
 * (default 60), the held conversations' turns included.
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
#include "store/store.h"

#define TARGET 20000.0          /* any number of conversations */
#define TARGET_1000 50000.0     /* 1 000 conversations, nothing held */
#define TARGET_HELD 40000.0     /* 1 000 conversations, 100 000 held */

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
  /* the held conversations' phase */
  bool holding;
  unsigned held, held_turns;
  unsigned long long held_ended, held_suspended;
  bool stored;                   /* the store answered the sync after the suspends */
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

/* The conversation's next message.  A refusal (the host is full) counts as a failed
 * turn and stops the run: the host cannot do what was asked of it. */
static void next_message(bench *b, berth_conv *c)
{
  berth_error *e = berth_conv_message(c, "hello");
  if (!e)
    return;
  if (!b->stop)
    fprintf(stderr, "turns_per_second: %s\n", e->message);
  berth_error_free(e);
  b->failed++;
  b->stop = true;
  ev_break(b->loop, EVBREAK_ALL);
}

/* A held conversation's turn: the next one, or the phase ends with the last. */
static void held_turn_end(bench *b, berth_conv *c, const berth_turn_info *info)
{
  if (!info->ok)
    b->failed++;
  if (info->turn < b->held_turns && !b->stop)
    next_message(b, c);
  else if (++b->held_ended == b->held || b->stop)
    ev_break(b->loop, EVBREAK_ALL);
}

static void on_suspended(void *ud, berth_conv *c)
{
  (void)c;
  bench *b = ud;
  if (b->holding && ++b->held_suspended == b->held)
    ev_break(b->loop, EVBREAK_ALL);
}

static void on_stored(void *ud, const berth_error *err)
{
  bench *b = ud;
  if (err) {
    fprintf(stderr, "turns_per_second: the store: %s\n", err->message);
    b->failed++;
  }
  b->stored = true;
  ev_break(b->loop, EVBREAK_ALL);
}

static void on_turn_end(void *ud, berth_conv *c, const berth_turn_info *info)
{
  bench *b = ud;
  if (b->holding) {
    held_turn_end(b, c, info);
    return;
  }
  size_t idx = (size_t)(uintptr_t)berth_conv_userdata(c);
  double t = bh_now();
  if (b->n_lat < (size_t)b->n * b->turns)
    b->lat[b->n_lat++] = t - b->sent[idx];
  b->sent[idx] = t;
  b->ended++;
  if (!info->ok)
    b->failed++;
  if (info->turn < b->turns && !b->stop)
    next_message(b, c);
  else if (b->ended == (unsigned long long)b->n * b->turns || b->stop)
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
  unsigned n = 2000, turns = 10, held = 0, held_turns = 3;
  const char *store_url = NULL;
  double limit = 60;
  const char *scripts = getenv("BERTH_SCRIPTS") && *getenv("BERTH_SCRIPTS")
                        ? getenv("BERTH_SCRIPTS") : "scripts";
  static const struct option opts[] = {
    {"conversations", required_argument, NULL, 'c'}, {"turns", required_argument, NULL, 't'},
    {"time-limit", required_argument, NULL, 'l'}, {"scripts", required_argument, NULL, 's'},
    {"held", required_argument, NULL, 'H'}, {"held-turns", required_argument, NULL, 'T'},
    {"store", required_argument, NULL, 'S'}, {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0}
  };
  int ch;
  while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1)
    switch (ch) {
      case 'c': n = (unsigned)atoi(optarg); break;
      case 't': turns = (unsigned)atoi(optarg); break;
      case 'l': limit = atof(optarg); break;
      case 's': scripts = optarg; break;
      case 'H': held = (unsigned)atoi(optarg); break;
      case 'T': held_turns = (unsigned)atoi(optarg); break;
      case 'S': store_url = optarg; break;
      default:
        printf("usage: turns_per_second [--conversations N (2000)] [--turns N (10)] "
               "[--held N (0)] [--held-turns N (3)] [--store memory|sqlite|URL] "
               "[--time-limit S (60)] [--scripts DIR]\n");
        return ch == 'h' ? 0 : 2;
    }
  if (!n || !turns || (held && !held_turns)) {
    fprintf(stderr, "turns_per_second: --conversations, --turns and --held-turns must be "
            "positive\n");
    return 2;
  }
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
  /* The store, if any: "sqlite" alone is a new file in a directory of its own. */
  char dir[64] = "", url[512];
  berth_store *store = NULL;
  if (store_url) {
    snprintf(url, sizeof url, "%s", store_url);
    if (!strcmp(store_url, "sqlite")) {
      snprintf(dir, sizeof dir, "/tmp/berth-bench-tps-XXXXXX");
      if (!mkdtemp(dir)) {
        perror("turns_per_second: mkdtemp");
        return 1;
      }
      snprintf(url, sizeof url, "sqlite:%s/berth.db", dir);
    }
    if ((e = berth_store_open(b.loop, url, &store))) {
      fprintf(stderr, "turns_per_second: the store %s: %s\n", store_url, e->message);
      return 1;
    }
  }
  /* Pinned once the store is open: its threads (SQLite's writer and checkpointer)
   * inherit the affinity of the thread that starts them, and run on any CPU, as a
   * served store's do (bench/store_turns.c pins the same way). */
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(0, &set);
  bool pinned = sched_setaffinity(0, sizeof set, &set) == 0;
  berth_options o;
  berth_options_init(&o);
  o.loop = b.loop;
  o.store = store;
  o.hooks_file = hooks;
  o.lib_dir = scripts;
  o.model = model;
  o.log = bh_quiet;
  berth_callbacks cb = {.on_delta = on_delta, .on_message = on_message,
                        .on_turn_end = on_turn_end, .on_suspended = on_suspended, .ud = &b};
  o.callbacks = cb;
  if ((e = berth_host_open(&o, &b.h))) {
    fprintf(stderr, "turns_per_second: %s\n", e->message);
    return 1;
  }
  ev_timer limit_timer;
  ev_timer_init(&limit_timer, on_limit, limit, 0.);
  limit_timer.data = &b;
  ev_timer_start(b.loop, &limit_timer);

  /* The held conversations: their turns, their suspends, and (with a store) the sync
   * that follows every suspend's write, after which each has left the Lua heap. */
  berth_conv **kept = calloc(held ? held : 1, sizeof *kept);
  double held_s = 0;
  size_t held_lua = 0;
  if (held) {
    b.holding = true;
    b.held = held;
    b.held_turns = held_turns;
    double t0 = bh_now();
    for (unsigned i = 0; i < held; i++) {
      if ((e = berth_conv_open(b.h, NULL, &kept[i]))) {
        fprintf(stderr, "turns_per_second: %s\n", e->message);
        return 1;
      }
      next_message(&b, kept[i]);
    }
    ev_run(b.loop, 0);
    for (unsigned i = 0; i < held && !b.stop; i++)
      berth_conv_suspend(kept[i]);
    if (!b.stop)
      ev_run(b.loop, 0);
    if (store && !b.stop) {
      berth_store_sync(store, on_stored, &b);
      while (!b.stored && !b.stop)
        ev_run(b.loop, 0);
    }
    b.holding = false;
    held_s = bh_now() - t0;
    lua_gc(berth_host_lua(b.h), LUA_GCCOLLECT);
    lua_gc(berth_host_lua(b.h), LUA_GCCOLLECT);  /* finalizers' objects go in the second */
    berth_stats hs;
    berth_host_stats(b.h, &hs);
    held_lua = hs.lua_bytes;
    if (b.stop || b.held_suspended != held) {
      fprintf(stderr, "turns_per_second: %llu of %u held conversations suspended\n",
              b.held_suspended, held);
      return 1;
    }
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
  double w0 = bh_now(), c0 = bh_cpu();
  for (unsigned i = 0; i < n; i++) {
    b.sent[i] = bh_now();
    next_message(&b, b.convs[i]);
  }
  ev_run(b.loop, 0);
  double wall = bh_now() - w0, cpu_s = bh_cpu() - c0;
  ev_timer_stop(b.loop, &limit_timer);

  berth_stats st;
  berth_host_stats(b.h, &st);
  double rate = (double)b.ended / wall;
  printf("turns_per_second: %u conversations x %u turns, scripted model, no code, %s\n", n,
         turns, pinned ? "the loop pinned to CPU 0" : "not pinned");
  if (held)
    printf("  held              %u conversations (%u turns each, suspended%s) in %.1f s; "
           "lua state then %.1f MiB\n", held, held_turns,
           store ? ", history in the store" : ", no store: history in the heap", held_s,
           (double)held_lua / (1 << 20));
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
  /* The targets where they apply (1 000 conversations, nothing or 100 000
   * held), the first one elsewhere. */
  double target = n != 1000 ? TARGET : held >= 100000 ? TARGET_HELD : !held ? TARGET_1000
                  : TARGET;
  printf("  target            >= %.0f turns/s: %s\n", target,
         !ok ? "FAILED (turns failed or time limit)" : rate >= target ? "met" : "NOT met");
  json_t *out = bj_new("turns_per_second");
  bj_param(out, "conversations", json_integer(n));
  bj_param(out, "turns", json_integer(turns));
  bj_param(out, "pinned", json_boolean(pinned));
  bj_param(out, "held", json_integer(held));
  bj_param(out, "held_turns", json_integer(held ? held_turns : 0));
  bj_param(out, "store", json_string(store ? berth_store_engine_name(store) : "none"));
  bj_fig(out, "turns", (double)b.ended, "turns");
  bj_fig(out, "failed", (double)b.failed, "turns");
  bj_fig(out, "wall", wall, "s");
  bj_fig(out, "cpu", cpu_s, "s");
  bj_fig(out, "rate_wall", rate, "turns/s");
  bj_fig(out, "rate_cpu", (double)b.ended / cpu_s, "turns/s");
  bj_fig(out, "cpu_per_turn", cpu_s / (double)b.ended * 1e6, "us");
  bj_fig(out, "lua_state", (double)st.lua_bytes, "B");
  bj_fig(out, "held_lua_state", (double)held_lua, "B");
  bj_fig(out, "target", target, "turns/s");
  json_object_set_new(out, "met", json_boolean(ok && rate >= target));
  for (size_t i = 0; i < b.n_lat; i++)
    b.lat[i] *= 1000;
  json_object_set_new(out, "turn_latency", bj_dist(b.lat, b.n_lat, "ms", false));
  if (bj_write(out))
    ok = false;
  for (unsigned i = 0; i < n; i++)
    berth_conv_free(b.convs[i]);
  for (unsigned i = 0; i < held; i++)
    berth_conv_free(kept[i]);
  free(kept);
  free(b.convs);
  free(b.sent);
  free(b.lat);
  berth_host_free(b.h);
  berth_store_free(store);
  if (*dir)
    bh_remove_dir(dir, "turns_per_second");
  berth_model_free(model);
  ev_loop_destroy(b.loop);
  return ok ? 0 : 1;
}

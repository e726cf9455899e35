/*
 * bench/idle_memory.c — what an idle conversation costs, with 10 000 of them in one
 * host.
 *
 * One host with the shipped hooks (scripts/code_chat.lua) and the scripted model.
 * Three states are measured, each after two full collections of the Lua state (an
 * object with a finalizer goes in the cycle after the one that found it garbage):
 *   opened     berth_conv_open only: the C record and the ctx table;
 *   one turn   after one scripted turn each (history: system, user, assistant), idle,
 *              waiting for the next message (its idle timer armed);
 *   suspended  after the idle timeout: onSuspend ran (with a daemon, the sandbox is
 *              disposed).
 * Figures per conversation: allocator bytes in use (jemalloc's stats.allocated: this
 * program's malloc is jemalloc, as the berth program's is (Makefile, PROG_HEAP_LIBS),
 * so it counts the C records, jansson, libplimsoll and the Lua state alike), of which
 * the Lua state's, and the RSS growth.
 * Target: <= 8 KiB (allocator bytes).
 *
 * Without a daemon, warm answers "Nothing ran" at once; with --sandboxd PATH every
 * conversation also warms a real sandbox in sandboxd (provider echo) during the "one
 * turn" state, which adds the sandbox layer's entry for it.  Bounded: --time-limit.
 * BENCH_JSON=PATH also writes the figures there (bench/benchjson.h).
 */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ev.h>
#include <jemalloc/jemalloc.h>
#include <lua.h>

#include "benchhost.h"
#include "benchjson.h"
#include "berth.h"
#include "plimsoll.h"
#include "sbxproc.h"

#define TARGET 8192.0

typedef struct bench {
  struct ev_loop *loop;
  berth_host *h;
  unsigned n;
  unsigned long long ended, failed, suspended;
  bool timed_out;
} bench;

static void on_turn_end(void *ud, berth_conv *c, const berth_turn_info *i)
{
  (void)c;
  bench *b = ud;
  if (!i->ok)
    b->failed++;                /* (a failed turn is no idle conversation's cost) */
  if (++b->ended == b->n)
    ev_break(b->loop, EVBREAK_ALL);
}

static void on_suspended(void *ud, berth_conv *c)
{
  (void)c;
  bench *b = ud;
  if (++b->suspended == b->n)
    ev_break(b->loop, EVBREAK_ALL);
}

static void on_limit(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)revents;
  ((bench *)w->data)->timed_out = true;
  ev_break(loop, EVBREAK_ALL);
}

typedef struct snap {
  double alloc, lua, rss;
} snap;

static snap take(bench *b)
{
  lua_State *L = berth_host_lua(b->h);
  lua_gc(L, LUA_GCCOLLECT, 0);
  lua_gc(L, LUA_GCCOLLECT, 0);
  uint64_t epoch = 1;            /* the statistics are refreshed by a new epoch */
  size_t len = sizeof epoch, allocated = 0;
  if (mallctl("epoch", &epoch, &len, &epoch, len) != 0 ||
      (len = sizeof allocated, mallctl("stats.allocated", &allocated, &len, NULL, 0)) != 0) {
    fprintf(stderr, "idle_memory: jemalloc gives no statistics\n");
    exit(1);
  }
  berth_stats st;
  berth_host_stats(b->h, &st);
  long pages = 0, resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f) {
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
      resident = 0;
    fclose(f);
  }
  return (snap){(double)allocated, (double)st.lua_bytes,
                (double)resident * (double)sysconf(_SC_PAGESIZE)};
}

static void show(json_t *out, const char *key, const char *what, snap base, snap s,
                 unsigned n, bool *met)
{
  double per = (s.alloc - base.alloc) / n;
  json_t *state = bj_obj(out, key);
  bj_fig(state, "allocator", per, "B/conversation");
  bj_fig(state, "lua", (s.lua - base.lua) / n, "B/conversation");
  bj_fig(state, "rss", (s.rss - base.rss) / n, "B/conversation");
  printf("  %-10s %6.0f B allocator (%5.0f B of it Lua), RSS +%6.0f B per conversation"
         "  %s\n", what, per, (s.lua - base.lua) / n, (s.rss - base.rss) / n,
         per <= TARGET ? "" : "(over the target)");
  if (per > TARGET)
    *met = false;
}

int main(int argc, char **argv)
{
  unsigned n = 10000;
  double limit = 120;
  const char *sandboxd = NULL;
  const char *scripts = getenv("BERTH_SCRIPTS") && *getenv("BERTH_SCRIPTS")
                        ? getenv("BERTH_SCRIPTS") : "scripts";
  static const struct option opts[] = {
    {"conversations", required_argument, NULL, 'c'}, {"sandboxd", required_argument, NULL, 'd'},
    {"time-limit", required_argument, NULL, 'l'}, {"scripts", required_argument, NULL, 's'},
    {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}
  };
  int ch;
  while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1)
    switch (ch) {
      case 'c': n = (unsigned)atoi(optarg); break;
      case 'd': sandboxd = optarg; break;
      case 'l': limit = atof(optarg); break;
      case 's': scripts = optarg; break;
      default:
        printf("usage: idle_memory [--conversations N (10000)] [--sandboxd PATH] "
               "[--time-limit S (120)] [--scripts DIR]\n");
        return ch == 'h' ? 0 : 2;
    }
  if (!n)
    return 2;
  plm_global_init();
  sbx_proc sbx;
  memset(&sbx, 0, sizeof sbx);
  if (sandboxd) {
    char count[32];
    snprintf(count, sizeof count, "%u", n + 16);
    const char *extra[] = {"--max-sessions", count, NULL};
    setenv("BUILD", "build", 0);
    if (sbx_start(&sbx, extra) != 0)
      return 1;
  }
  bench b;
  memset(&b, 0, sizeof b);
  b.n = n;
  b.loop = ev_loop_new(EVFLAG_AUTO);
  char hooks[4096];
  snprintf(hooks, sizeof hooks, "%s/code_chat.lua", scripts);
  berth_model *model = bh_ok_model(b.loop, "idle_memory");
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
  o.idle_timeout = 3600;         /* suspended below, on purpose */
  if (sandboxd) {
    o.daemon_url = sbx.url;
    o.daemon_token = sbx.token;
    o.minimum_isolation = "container";
    o.max_concurrent_turns = 256;
  }
  berth_callbacks cb = {0};
  cb.on_turn_end = on_turn_end;
  cb.on_suspended = on_suspended;
  cb.ud = &b;
  o.callbacks = cb;
  if ((e = berth_host_open(&o, &b.h))) {
    fprintf(stderr, "idle_memory: %s\n", e->message);
    return 1;
  }
  ev_timer lim;
  ev_timer_init(&lim, on_limit, limit, 0.);
  lim.data = &b;
  ev_timer_start(b.loop, &lim);
  ev_unref(b.loop);

  berth_conv **convs = calloc(n, sizeof *convs);
  snap base = take(&b);
  for (unsigned i = 0; i < n; i++)
    if ((e = berth_conv_open(b.h, NULL, &convs[i]))) {
      fprintf(stderr, "idle_memory: %s\n", e->message);
      return 1;
    }
  snap opened = take(&b);
  for (unsigned i = 0; i < n; i++)
    berth_conv_message(convs[i], "hello");
  ev_run(b.loop, 0);
  berth_stats st;
  berth_host_stats(b.h, &st);
  unsigned long long sandboxes = st.sandboxes;
  snap turned = take(&b);
  for (unsigned i = 0; i < n; i++)
    berth_conv_suspend(convs[i]);
  if (!b.timed_out)
    ev_run(b.loop, 0);
  snap suspended = take(&b);

  bool met = !b.timed_out && b.ended == n && b.failed == 0 && b.suspended == n;
  printf("idle_memory: %u conversations in one host, %s\n", n,
         sandboxd ? "sandboxd (echo) warmed for each" : "no daemon");
  json_t *out = bj_new("idle_memory");
  bj_param(out, "conversations", json_integer(n));
  bj_param(out, "daemon", json_boolean(sandboxd != NULL));
  show(out, "opened", "opened", base, opened, n, &met);
  show(out, "one_turn", "one turn", base, turned, n, &met);
  show(out, "suspended", "suspended", base, suspended, n, &met);
  printf("  sandboxes held after the turns: %llu; turns %llu (%llu failed), suspends %llu%s\n",
         sandboxes, b.ended, b.failed, b.suspended, b.timed_out ? " (time limit reached)" : "");
  printf("  target <= %.0f B per idle conversation (allocator bytes): %s\n", TARGET,
         met ? "met" : "NOT met");
  bj_fig(out, "sandboxes_held", (double)sandboxes, "sandboxes");
  bj_fig(out, "turns", (double)b.ended, "turns");
  bj_fig(out, "failed_turns", (double)b.failed, "turns");
  bj_fig(out, "suspends", (double)b.suspended, "suspends");
  bj_fig(out, "target", TARGET, "B/conversation");
  json_object_set_new(out, "met", json_boolean(met));
  json_object_set_new(out, "timed_out", json_boolean(b.timed_out));
  if (bj_write(out))
    met = false;

  ev_ref(b.loop);
  ev_timer_stop(b.loop, &lim);
  for (unsigned i = 0; i < n; i++)
    berth_conv_free(convs[i]);
  free(convs);
  berth_host_free(b.h);
  berth_model_free(model);
  ev_loop_destroy(b.loop);
  if (sandboxd)
    sbx_stop(&sbx);
  return met ? 0 : 1;
}

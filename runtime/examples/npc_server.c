/*
 * npc_server.c — a game server hosting NPC agents with the berth embedding API
 * (runtime/core/berth.h): one host on the game's libev loop, one conversation per NPC,
 * each with its own persona (ctx.metadata) and its own memory kept in its own sandbox
 * (scripts/npc.lua), driven by a scripted model (scripts/npc_model.lua).
 *
 * A fixed tick (--tick-ms) drives the game: on each tick some players speak to some
 * NPCs (a seeded random choice, so runs repeat); each line becomes a message to that
 * NPC's conversation and its turn streams back through the callbacks while the game
 * goes on ticking.  After --ticks ticks the players stop, the server waits for the
 * turns in flight, completes every NPC (onComplete disposes its sandbox), shuts the
 * host down and prints its statistics.  Exit status 0 when every line was answered
 * and nothing failed.
 *
 * With --store URL (berth_options.store) the NPCs outlive the server: each NPC's
 * conversation (its history, ctx.state with its journal) is kept there, the server
 * stops without completing them, and the next run with the same store resumes every
 * NPC where it was — its first cell in a fresh sandbox, rebuilt from its journal.
 *
 *   build/examples/npc_server --npcs 200 --ticks 100 --sandboxd build/sandboxd \
 *       --provider echo
 */
#include <errno.h>
#include <getopt.h>
#include <malloc.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ev.h>
#include <jansson.h>
#include <lua.h>

#include "berth.h"
#include "plimsoll.h"

#define DRAIN_LIMIT 60.0         /* seconds to wait for the last turns */

static const char usage[] =
  "usage: npc_server [options]\n"
  "\n"
  "A fixed-tick game loop with NPCs, each its own berth conversation with its own\n"
  "persona and its own memory in its own sandbox.  Prints a short log and stats.\n"
  "\n"
  "  --npcs N               NPCs (default 200)\n"
  "  --ticks N              ticks to play (default 100)\n"
  "  --tick-ms MS           tick length (default 50)\n"
  "  --lines-per-tick N     player lines per tick (default npcs / 10, at least 1)\n"
  "  --daemon URL           a plimsoll daemon, with --token-file FILE\n"
  "  --sandboxd PATH        start a local sandboxd (default), --provider NAME (echo)\n"
  "  --max-sandboxes N      sandboxes held at once; idle ones are closed least\n"
  "                         recently used (default 56 with a local sandboxd)\n"
  "  --idle-timeout S       an NPC nobody spoke to for S seconds suspends (default 2)\n"
  "  --scripts DIR          where npc.lua and npc_model.lua are (default: scripts)\n"
  "  --seed N               the players' random choices (default 1)\n"
  "  --store URL            keep the NPCs' conversations (sqlite:PATH): a later run\n"
  "                         with the same store continues them\n"
  "  --quiet                no log lines, only the stats\n"
  "  --help, --version\n";

static const char *const players[] = {"ada", "bob", "cyd", "dee", "eli", "fay", "gus", "hal"};
static const char *const phrases[] = {
  "the bridge is out", "wolves near the mill", "have you seen my cat?",
  "the mayor is lying", "I found a strange coin", "rain is coming",
  "the well tastes odd", "a stranger asked about you",
};
static const char *const names[] = {"Mira", "Tomas", "Ilse", "Brand", "Odo", "Wren", "Kasia",
                                    "Fenn", "Liv", "Garrick"};
static const char *const trades[] = {"the smith, gruff but fair", "the baker, who hears "
                                     "everything", "the guard, suspicious of strangers",
                                     "the herbalist, patient and odd", "the innkeeper, "
                                     "cheerful and nosy"};

typedef struct npc {
  berth_conv *conv;
  char name[32];
  unsigned lines, answered;
  unsigned remembered;           /* its journal's length (the last "mem-<n>" cell) */
  bool completed;
} npc;

typedef struct game {
  struct ev_loop *loop;
  berth_host *h;
  npc *npcs;
  unsigned n_npcs, ticks, tick, lines_per_tick;
  double tick_s;
  ev_timer tick_timer, drain_timer;
  unsigned long long sent, ended, failed, suspends, rebuilds, completed;
  double *lat;                   /* turn latencies, seconds */
  size_t n_lat, cap_lat;
  unsigned logged_tick;
  bool quiet, shut, players_done, timed_out;
  unsigned seed;
  bool keep;                     /* a store: NPCs are kept, not completed, at the end */
} game;

/* {====================================================== callbacks */

static npc *npc_of(berth_conv *c)
{
  return berth_conv_userdata(c);
}

static void on_message(void *ud, berth_conv *c, const char *text, size_t len)
{
  game *g = ud;
  npc *n = npc_of(c);
  if (!g->quiet && g->tick % 10 == 1 && g->logged_tick != g->tick) {
    g->logged_tick = g->tick;   /* one answer every ten ticks */
    printf("  [tick %3u] %s: %.*s\n", g->tick, n->name, (int)len, text);
  }
}

static void on_tool_call(void *ud, berth_conv *c, const char *id, const char *name,
                         const char *arguments)
{
  (void)name;
  (void)arguments;
  game *g = ud;
  if (!strncmp(id, "rebuild-", 8))
    g->rebuilds++;
  else if (!strncmp(id, "mem-", 4)) {
    unsigned n = (unsigned)strtoul(id + 4, NULL, 10);
    if (n > npc_of(c)->remembered)
      npc_of(c)->remembered = n;
  }
}

static void on_error(void *ud, berth_conv *c, const berth_error *e)
{
  game *g = ud;
  if (!g->quiet)
    fprintf(stderr, "  [tick %3u] %s: error (%s): %s\n", g->tick, npc_of(c)->name, e->code,
            e->message);
}

static void on_turn_end(void *ud, berth_conv *c, const berth_turn_info *info)
{
  game *g = ud;
  npc *n = npc_of(c);
  n->answered++;
  g->ended++;
  if (!info->ok)
    g->failed++;
  if (g->n_lat == g->cap_lat) {
    g->cap_lat = g->cap_lat ? g->cap_lat * 2 : 1024;
    g->lat = realloc(g->lat, g->cap_lat * sizeof *g->lat);
  }
  g->lat[g->n_lat++] = info->seconds;
  if (g->players_done && g->ended == g->sent) {  /* the last one: finish from the loop */
    ev_timer_stop(g->loop, &g->drain_timer);
    ev_timer_set(&g->drain_timer, 0., 0.);
    ev_timer_start(g->loop, &g->drain_timer);
  }
}

static void on_suspended(void *ud, berth_conv *c)
{
  (void)c;
  ((game *)ud)->suspends++;
}

static void on_completed(void *ud, berth_conv *c)
{
  game *g = ud;
  npc_of(c)->completed = true;
  g->completed++;
}

/* }====================================================== */

/* {====================================================== the game loop */

static void on_shut(void *ud)
{
  game *g = ud;
  g->shut = true;
  ev_break(g->loop, EVBREAK_ALL);
}

/* Every NPC completes (onComplete disposes its sandbox), then the host shuts down. */
static void finish(game *g)
{
  ev_timer_stop(g->loop, &g->tick_timer);
  ev_timer_stop(g->loop, &g->drain_timer);
  for (unsigned i = 0; i < g->n_npcs && !g->keep; i++)
    berth_conv_complete(g->npcs[i].conv, NULL, NULL);
  berth_host_shutdown(g->h, on_shut, g);
}

/* Fires once the last turn ended (0 s), or when the drain limit is over. */
static void on_drain(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)loop;
  (void)revents;
  game *g = w->data;
  if (g->ended != g->sent) {
    g->timed_out = true;
    fprintf(stderr, "npc_server: %llu turns still running after %.0f s\n",
            g->sent - g->ended, DRAIN_LIMIT);
  }
  finish(g);
}

static double urand(unsigned *seed)
{
  *seed = *seed * 1103515245u + 12345u;
  return (double)((*seed >> 8) & 0xffffff) / 16777216.0;
}

static void speak(game *g)
{
  for (unsigned k = 0; k < g->lines_per_tick; k++) {
    npc *n = &g->npcs[(unsigned)(urand(&g->seed) * g->n_npcs) % g->n_npcs];
    const char *who = players[(unsigned)(urand(&g->seed) * 8) % 8];
    const char *what = phrases[(unsigned)(urand(&g->seed) * 8) % 8];
    json_t *line = json_pack("{s:s, s:s, s:i}", "player", who, "text", what, "tick",
                             (json_int_t)g->tick);
    char *text = json_dumps(line, JSON_COMPACT);
    json_decref(line);
    berth_error *e = berth_conv_message(n->conv, text);
    free(text);
    if (e) {
      fprintf(stderr, "npc_server: %s refused a line (%s): %s\n", n->name, e->code, e->message);
      berth_error_free(e);
      g->failed++;
      continue;
    }
    n->lines++;
    g->sent++;
    if (!g->quiet && g->tick % 10 == 0 && k == 0) {
      printf("  [tick %3u] %s → %s: \"%s\"\n", g->tick, who, n->name, what);
    }
  }
}

static void on_tick(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)revents;
  game *g = w->data;
  if (g->tick < g->ticks) {
    speak(g);
    g->tick++;
    return;
  }
  /* the players stopped: finish once the turns in flight ended (bounded) */
  ev_timer_stop(loop, w);
  g->players_done = true;
  ev_timer_set(&g->drain_timer, g->ended == g->sent ? 0. : DRAIN_LIMIT, 0.);
  ev_timer_start(loop, &g->drain_timer);
}

/* }====================================================== */

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double quantile(double *v, size_t n, double q)
{
  if (!n)
    return 0;
  size_t i = (size_t)ceil(q * (double)n);
  return v[i ? i - 1 : 0];
}

static long rss_kib(void)
{
  FILE *f = fopen("/proc/self/statm", "r");
  long pages = 0, resident = 0;
  if (f) {
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
      resident = 0;
    fclose(f);
  }
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static void quiet_log(void *ud, berth_log_level level, const char *message)
{
  game *g = ud;
  if (level >= BERTH_LOG_WARN && !g->quiet)
    fprintf(stderr, "berth: %s\n", message);
}

static char *read_token(const char *path)
{
  FILE *f = fopen(path, "r");
  if (!f)
    return NULL;
  char line[512];
  char *tok = NULL;
  while (!tok && fgets(line, sizeof line, f)) {
    line[strcspn(line, "\r\n")] = '\0';
    if (line[0] && line[0] != '#')
      tok = strdup(line);
  }
  fclose(f);
  return tok;
}

static bool is_dir_with(const char *dir, const char *file)
{
  char p[4096];
  snprintf(p, sizeof p, "%s/%s", dir, file);
  return access(p, R_OK) == 0;
}

int main(int argc, char **argv)
{
  game g;
  memset(&g, 0, sizeof g);
  g.n_npcs = 200;
  g.ticks = 100;
  g.tick_s = 0.05;
  g.seed = 1;
  const char *daemon_url = NULL, *token_file = NULL, *sandboxd = NULL, *provider = NULL;
  const char *scripts = NULL, *store_url = NULL;
  berth_store *store = NULL;
  long max_sandboxes = -1;
  double idle = 2.0;
  enum { O_NPCS = 256, O_TICKS, O_TICK_MS, O_LINES, O_DAEMON, O_TOKEN, O_SANDBOXD, O_PROVIDER,
         O_MAX_SB, O_IDLE, O_SCRIPTS, O_SEED, O_QUIET, O_HELP, O_VERSION, O_STORE };
  static const struct option opts[] = {
    {"npcs", required_argument, NULL, O_NPCS}, {"ticks", required_argument, NULL, O_TICKS},
    {"tick-ms", required_argument, NULL, O_TICK_MS},
    {"lines-per-tick", required_argument, NULL, O_LINES},
    {"daemon", required_argument, NULL, O_DAEMON},
    {"token-file", required_argument, NULL, O_TOKEN},
    {"sandboxd", required_argument, NULL, O_SANDBOXD},
    {"provider", required_argument, NULL, O_PROVIDER},
    {"max-sandboxes", required_argument, NULL, O_MAX_SB},
    {"idle-timeout", required_argument, NULL, O_IDLE},
    {"scripts", required_argument, NULL, O_SCRIPTS}, {"seed", required_argument, NULL, O_SEED},
    {"quiet", no_argument, NULL, O_QUIET}, {"help", no_argument, NULL, O_HELP},
    {"version", no_argument, NULL, O_VERSION},
    {"store", required_argument, NULL, O_STORE},
    {NULL, 0, NULL, 0}
  };
  int c;
  while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (c) {
      case O_NPCS: g.n_npcs = (unsigned)atoi(optarg); break;
      case O_TICKS: g.ticks = (unsigned)atoi(optarg); break;
      case O_TICK_MS: g.tick_s = atof(optarg) / 1000.0; break;
      case O_LINES: g.lines_per_tick = (unsigned)atoi(optarg); break;
      case O_DAEMON: daemon_url = optarg; break;
      case O_TOKEN: token_file = optarg; break;
      case O_SANDBOXD: sandboxd = optarg; break;
      case O_PROVIDER: provider = optarg; break;
      case O_MAX_SB: max_sandboxes = atol(optarg); break;
      case O_IDLE: idle = atof(optarg); break;
      case O_SCRIPTS: scripts = optarg; break;
      case O_SEED: g.seed = (unsigned)atoi(optarg); break;
      case O_QUIET: g.quiet = true; break;
      case O_STORE: store_url = optarg; break;
      case O_HELP: fputs(usage, stdout); return 0;
      case O_VERSION:           /* as `berth --version` (runtime/faces/cli.c) */
        printf("npc_server (berth %s, libplimsoll %s, protocol %d, %s)\n", BERTH_VERSION,
               PLIMSOLL_VERSION, PLIMSOLL_PROTOCOL, LUA_RELEASE);
        return 0;
      default: fputs(usage, stderr); return 2;
    }
  }
  if (optind != argc || g.n_npcs == 0 || g.ticks == 0 || !(g.tick_s > 0)) {
    fputs(usage, stderr);
    return 2;
  }
  if (!g.lines_per_tick)
    g.lines_per_tick = g.n_npcs / 10 ? g.n_npcs / 10 : 1;

  char *found = NULL;
  if (!scripts && getenv("BERTH_SCRIPTS") && *getenv("BERTH_SCRIPTS"))
    scripts = getenv("BERTH_SCRIPTS");
  if (!scripts && is_dir_with("scripts", "npc.lua"))
    scripts = "scripts";
  if (!scripts && (found = berth_scripts_dir()) && is_dir_with(found, "npc.lua"))
    scripts = found;
  if (!scripts) {
    fprintf(stderr, "npc_server: cannot find npc.lua (give --scripts DIR)\n");
    return 2;
  }
  char hooks[4096], model_spec[4200];
  snprintf(hooks, sizeof hooks, "%s/npc.lua", scripts);
  snprintf(model_spec, sizeof model_spec, "scripted:%s/npc_model.lua", scripts);

  plm_global_init();
  signal(SIGPIPE, SIG_IGN);
  g.loop = ev_default_loop(0);
  int status = 1;
  berth_sandboxd *local = NULL;
  char *token = NULL;
  berth_model *model = NULL;
  if (daemon_url) {
    if (token_file && !(token = read_token(token_file))) {
      fprintf(stderr, "npc_server: cannot read a token from %s\n", token_file);
      goto out;
    }
  } else {
    berth_error *se = berth_sandboxd_start(g.loop, sandboxd, provider ? provider : "echo",
                                           &local);
    if (se) {
      fprintf(stderr, "npc_server: %s\n", se->message);
      berth_error_free(se);
      goto out;
    }
    daemon_url = berth_sandboxd_url(local);
    token = strdup(berth_sandboxd_token(local));
    if (max_sandboxes < 0)
      max_sandboxes = 56;        /* under sandboxd's default of 64 sessions */
  }
  berth_error *e = berth_model_open(g.loop, model_spec, &model);
  if (e) {
    fprintf(stderr, "npc_server: %s\n", e->message);
    berth_error_free(e);
    goto out;
  }

  if (store_url) {
    /* The store starts threads: size the descriptor table before they share it, so
     * the NPCs' connections never stall the loop as it grows (berth.h). */
    berth_reserve_descriptors();
    if ((e = berth_store_open(g.loop, store_url, &store))) {
      fprintf(stderr, "npc_server: %s\n", e->message);
      berth_error_free(e);
      goto out;
    }
    g.keep = true;
  }

  berth_options o;
  berth_options_init(&o);
  o.loop = g.loop;
  o.store = store;
  o.hooks_file = hooks;
  o.lib_dir = scripts;
  o.daemon_url = daemon_url;
  o.daemon_token = token;
  o.minimum_isolation = "container";
  o.model = model;
  o.idle_timeout = idle;
  o.log = quiet_log;
  o.log_ud = &g;
  o.max_conversations = g.n_npcs;
  if (max_sandboxes > 0) {
    o.max_sandboxes = (int)max_sandboxes;
    /* busy sandboxes are never closed for another: keep the turns under the cap */
    o.max_concurrent_turns = (size_t)(max_sandboxes > 1 ? max_sandboxes / 2 : 1);
  }
  berth_callbacks cb = {NULL, NULL, on_message, on_tool_call, NULL, on_turn_end,
                        on_suspended, on_completed, on_error, &g};
  o.callbacks = cb;
  if ((e = berth_host_open(&o, &g.h))) {
    fprintf(stderr, "npc_server: %s\n", e->message);
    berth_error_free(e);
    goto out;
  }

  long rss0 = rss_kib();
  unsigned resumed = 0, earlier_turns = 0;
  g.npcs = calloc(g.n_npcs, sizeof *g.npcs);
  for (unsigned i = 0; i < g.n_npcs; i++) {
    npc *n = &g.npcs[i];
    snprintf(n->name, sizeof n->name, "%s-%u", names[i % 10], i);
    json_t *meta = json_pack("{s:s, s:s}", "name", n->name, "persona", trades[i % 5]);
    char run[32];
    snprintf(run, sizeof run, "npc-%u", i);
    berth_conv_options co = {run, NULL, meta, n};
    e = berth_conv_open(g.h, &co, &n->conv);
    json_decref(meta);
    if (e) {
      fprintf(stderr, "npc_server: %s\n", e->message);
      berth_error_free(e);
      goto out;
    }
    if (berth_conv_turns(n->conv)) {   /* resumed from the store */
      resumed++;
      earlier_turns += berth_conv_turns(n->conv);
    }
  }
  if (store)
    printf("npc_server: store %s: %u NPCs resumed (%u earlier turns), %u new\n", store_url,
           resumed, earlier_turns, g.n_npcs - resumed);
  printf("npc_server: %u NPCs, %u ticks of %.0f ms, %u lines per tick, daemon %s%s\n",
         g.n_npcs, g.ticks, g.tick_s * 1000, g.lines_per_tick, local ? "started at " : "",
         daemon_url);
  ev_timer_init(&g.tick_timer, on_tick, g.tick_s, g.tick_s);
  g.tick_timer.data = &g;
  ev_timer_start(g.loop, &g.tick_timer);
  ev_timer_init(&g.drain_timer, on_drain, 0., 0.);
  g.drain_timer.data = &g;
  double t0 = ev_time();
  ev_run(g.loop, 0);
  double wall = ev_time() - t0;

  /* The state's memory without its garbage (twice: objects with finalizers go in the
   * cycle after the one that found them). */
  lua_gc(berth_host_lua(g.h), LUA_GCCOLLECT, 0);
  lua_gc(berth_host_lua(g.h), LUA_GCCOLLECT, 0);
  berth_stats st;
  berth_host_stats(g.h, &st);
  qsort(g.lat, g.n_lat, sizeof *g.lat, cmp_double);
  long rss1 = rss_kib();
  unsigned long long lost = g.sent - g.ended;
  printf("npc_server: %.1f s: %llu lines, %llu turns (%llu failed, %llu lost), %llu cells "
         "(%llu failed), %llu hook errors, %llu suspends, %llu memories rebuilt, %llu NPCs "
         "completed\n",
         wall, g.sent, g.ended, g.failed, lost, (unsigned long long)st.cells,
         (unsigned long long)st.cell_errors, (unsigned long long)st.hook_errors, g.suspends,
         g.rebuilds, g.completed);
  printf("npc_server: turn latency p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
         quantile(g.lat, g.n_lat, 0.50) * 1000, quantile(g.lat, g.n_lat, 0.99) * 1000,
         g.n_lat ? g.lat[g.n_lat - 1] * 1000 : 0);
  unsigned long long remembered = 0;
  for (unsigned i = 0; i < g.n_npcs; i++)
    remembered += g.npcs[i].remembered;
  printf("npc_server: journals: %llu lines remembered in all (this run's and earlier)\n",
         remembered);
  printf("npc_server: memory: RSS %ld KiB (+%ld KiB over the run), Lua state %.1f KiB "
         "(%.0f B per NPC, after the game)\n", rss1, rss1 - rss0, (double)st.lua_bytes / 1024,
         (double)st.lua_bytes / g.n_npcs);
  status = g.shut && !g.timed_out && lost == 0 && g.failed == 0 && st.cell_errors == 0 && st.hook_errors == 0 &&
           g.completed == (g.keep ? 0 : g.n_npcs) ? 0 : 1;
  printf("npc_server: %s\n", status ? "FAILED" : "ok");

out:
  if (g.npcs)
    for (unsigned i = 0; i < g.n_npcs; i++)
      berth_conv_free(g.npcs[i].conv);
  free(g.npcs);
  berth_host_free(g.h);
  berth_store_free(store);       /* after the host: its last writes */
  berth_model_free(model);
  berth_sandboxd_stop(local);
  free(token);
  free(found);
  free(g.lat);
  ev_loop_destroy(g.loop);
  return status;
}

/*
 * bench/serve_load.c — a load run through `berth serve` against sandboxd (echo).
 *
 * Starts build/sandboxd (--max-sessions above the conversation count) and
 * build/berth serve on it with a scripted model whose every turn runs one cell — the
 * user's message as code — and says "ran: <message>".  Opens --conversations
 * conversations (default 1000, spread over the two callers), each on the handle and
 * so the connection its turns then use, as a client with keep-alive does; then drives
 * all of them at once, each through --cells turns (default 10) one after another, at most
 * --concurrency streams in flight (default: all).  The message of turn t of
 * conversation c is `v = "c<c>-t<t>"`, so every result names where it belongs.
 *
 * Checks every turn's event stream:
 *   lost           a turn without its tool_result or its turn_end, a transport error,
 *                  a status other than 200;
 *   misclassified  a tool_result that is an error, or whose stdout is not exactly
 *                  `python <t>: v = "c<c>-t<t>"` (the echo of this conversation's t-th
 *                  cell in its own sandbox), or a turn_end not ok, or a tool_result
 *                  whose id is not the tool_call's;
 * then cross-checks the server's own counters (GET /metrics), stops it with SIGTERM
 * (which disposes every sandbox) and checks it exits 0.
 *
 * The load is driven by libcurl's socket interface on a libev loop (lib/curl_ev.h, the
 * driver libplimsoll's transport uses), each conversation reusing its one easy handle:
 * it shares the two cores with the server and sandboxd, so what it costs a turn is CPU
 * the server does not get.  (Driven by curl_multi_perform and curl_multi_poll over
 * every stream, with a new handle a turn, it took 105-130 us a turn.)
 *
 * Prints turns/s, cells, lost, misclassified, p50/p99/max turn latency (client side:
 * request sent to the stream's end), and p50/p99 of the turns after each
 * conversation's first (which all start at once and open their sandboxes).  Bounded:
 * --time-limit (default 100 s) stops the run and reports it as failed.  Scale down
 * with --conversations / --cells.
 * BENCH_JSON=PATH also writes the figures there, with the latency distribution as a
 * histogram (bench/benchjson.h).
 */
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>
#include <ev.h>
#include <jansson.h>

#include "benchclock.h"
#include "benchjson.h"
#include "curl_ev.h"
#include "sbxproc.h"
#include "servetest.h"

static const char script[] =
  "return { template = true, loop = true, turns = {\n"
  "  { user = '*', replies = {\n"
  "    { call = { code = '{{user}}' } },\n"
  "    { say = 'ran: {{user}}' } } } } }\n";

typedef struct conv {
  char id[40];
  int caller;
  unsigned turn;                 /* turns started */
  st_stream st;
  CURLU *url;                    /* its messages' URL, parsed once (lib/transport.c) */
  bool active;
} conv;

typedef struct run {
  st_server *srv;
  struct ev_loop *loop;
  plm_curl_ev cev;
  CURLM *multi;                  /* cev's */
  struct curl_slist *headers[2]; /* each caller's */
  CURLU *open_url;               /* POST /v1/conversations, parsed once */
  bool opening;                  /* phase one: the conversations are being opened */
  unsigned opened, open_failed;
  conv *convs;
  unsigned n, cells, concurrency, in_flight, next;
  unsigned long long done, lost, misclassified, cells_ok;
  double *lat;
  size_t n_lat;
  double *later;                 /* the turns after each conversation's first */
  size_t n_later;
  double deadline;
  ev_timer stop;                 /* the time limit's grace: transfers still running */
  bool timed_out, finished;
  char first_problem[512];
} run;

static void problem(run *r, const char *fmt, const char *a, const char *b)
{
  if (!r->first_problem[0])
    snprintf(r->first_problem, sizeof r->first_problem, fmt, a, b);
}

/* The conversation's own easy handle, made at its open and kept for its turns. */
static void conv_handle(run *r, conv *c)
{
  st_stream *st = &c->st;
  st->easy = curl_easy_init();
  curl_easy_setopt(st->easy, CURLOPT_HTTPHEADER, r->headers[c->caller]);
  curl_easy_setopt(st->easy, CURLOPT_WRITEFUNCTION, st_stream_write);
  curl_easy_setopt(st->easy, CURLOPT_WRITEDATA, st);
  curl_easy_setopt(st->easy, CURLOPT_PRIVATE, c);
  curl_easy_setopt(st->easy, CURLOPT_TIMEOUT, 120L);
  curl_easy_setopt(st->easy, CURLOPT_NOSIGNAL, 1L);
}

static void transfer(run *r, conv *c, const char *body)
{
  st_stream *st = &c->st;
  curl_easy_setopt(st->easy, CURLOPT_COPYPOSTFIELDS, body);
  st->len = 0;
  st->status = 0;
  st->started = st_now();
  curl_multi_add_handle(r->multi, st->easy);
  c->active = true;
  r->in_flight++;
}

/* Opens conversation idx on its own handle (POST /v1/conversations). */
static void start_open(run *r, conv *c, unsigned idx)
{
  c->caller = (int)(idx % 2);
  conv_handle(r, c);
  curl_easy_setopt(c->st.easy, CURLOPT_CURLU, r->open_url);
  transfer(r, c, "{}");
}

/* Starts turn c->turn + 1 of conversation idx on the conversation's own easy handle. */
static void start_turn(run *r, conv *c, unsigned idx)
{
  char body[128];
  snprintf(body, sizeof body, "{\"content\": \"v = \\\"c%u-t%u\\\"\"}", idx, c->turn + 1);
  if (!c->url) {
    char url[256];
    snprintf(url, sizeof url, "%s/v1/conversations/%s/messages", r->srv->url, c->id);
    c->url = curl_url();
    curl_url_set(c->url, CURLUPART_URL, url, 0);
    /* the same every turn: libcurl copies the parsed parts where it would parse the
     * text at each transfer, CPU this load would take from the server */
    curl_easy_setopt(c->st.easy, CURLOPT_CURLU, c->url);
  }
  transfer(r, c, body);
  c->turn++;
}

static void check_turn(run *r, conv *c, unsigned idx)
{
  st_stream *st = &c->st;
  r->lat[r->n_lat++] = st->ended - st->started;
  if (c->turn > 1)
    r->later[r->n_later++] = st->ended - st->started;
  if (st->result != CURLE_OK || st->status != 200) {
    r->lost++;
    problem(r, "transport or status failure on %s (%s)", c->id,
            curl_easy_strerror(st->result));
    return;
  }
  json_t *ev = st_stream_events(st);
  const json_t *call = NULL, *res = NULL, *end = NULL;
  size_t i;
  json_t *e;
  json_array_foreach(ev, i, e) {
    const char *name = json_string_value(json_object_get(e, "event"));
    const json_t *data = json_object_get(e, "data");
    if (!strcmp(name, "tool_call"))
      call = data;
    else if (!strcmp(name, "tool_result"))
      res = data;
    else if (!strcmp(name, "turn_end"))
      end = data;
  }
  if (!call || !res || !end) {
    r->lost++;
    problem(r, "a turn of %s lost an event: %s", c->id, st->buf ? st->buf : "");
    json_decref(ev);
    return;
  }
  char want[128];
  snprintf(want, sizeof want, "python %u: v = \"c%u-t%u\"", c->turn, idx, c->turn);
  const json_t *result = json_object_get(res, "result");
  const char *out = json_string_value(json_object_get(result, "stdout"));
  if (!result || !out || strcmp(out, want) != 0 || !json_is_true(json_object_get(end, "ok")) ||
      !json_equal(json_object_get(res, "id"), json_object_get(call, "id"))) {
    r->misclassified++;
    char *text = json_dumps(res, JSON_COMPACT);
    problem(r, "misclassified: wanted %s, got %s", want, text ? text : "?");
    free(text);
  } else
    r->cells_ok++;
  json_decref(ev);
}

/* A conversation's open answered: its id, or the run fails. */
static void open_done(run *r, conv *c, unsigned idx)
{
  st_stream *st = &c->st;
  json_t *j = st->result == CURLE_OK ? json_loadb(st->buf ? st->buf : "", st->len, 0, NULL)
                                     : NULL;
  const char *id = json_string_value(json_object_get(j, "id"));
  if (st->status != 201 || !id || strlen(id) >= sizeof c->id) {
    fprintf(stderr, "serve_load: opening conversation %u: HTTP %ld (%s)\n", idx, st->status,
            curl_easy_strerror(st->result));
    r->open_failed++;
  } else {
    snprintf(c->id, sizeof c->id, "%s", id);
    r->opened++;
  }
  json_decref(j);
}

/* Starts conversations not started yet as slots free up; ends the loop when every turn
 * is done, or when the time limit passed and nothing is in flight. */
static void fill_and_maybe_end(run *r)
{
  if (r->opening) {
    while (r->next < r->n && r->in_flight < r->concurrency) {
      start_open(r, &r->convs[r->next], r->next);
      r->next++;
    }
    if (r->opened + r->open_failed == r->n || r->open_failed)
      ev_break(r->loop, EVBREAK_ALL);
    return;
  }
  while (r->next < r->n && r->in_flight < r->concurrency && st_now() < r->deadline) {
    start_turn(r, &r->convs[r->next], r->next);
    r->next++;
  }
  if (r->done == (unsigned long long)r->n * r->cells)
    r->finished = true;
  else if (st_now() >= r->deadline && r->in_flight == 0) {
    r->timed_out = true;
    r->finished = true;
  }
  if (r->finished)
    ev_break(r->loop, EVBREAK_ALL);
}

/* The driver's drain (curl_ev.h): retires finished turns and starts their next ones. */
static void drain(void *ud)
{
  run *r = ud;
  CURLcode rc;
  conv *c;
  while ((c = plm_curl_ev_next_done(&r->cev, &rc))) {
    st_stream *st = &c->st;
    st->result = rc;
    st->ended = st_now();
    curl_easy_getinfo(st->easy, CURLINFO_RESPONSE_CODE, &st->status);
    c->active = false;
    r->in_flight--;
    unsigned idx = (unsigned)(c - r->convs);
    if (r->opening) {
      open_done(r, c, idx);
      continue;
    }
    r->done++;
    check_turn(r, c, idx);
    if (c->turn < r->cells && st_now() < r->deadline)
      start_turn(r, c, idx);
  }
  fill_and_maybe_end(r);
}

/* The time limit and its grace passed with transfers still running: they are lost. */
static void on_stop(struct ev_loop *loop, ev_timer *w, int revents)
{
  run *r = w->data;
  r->timed_out = true;
  r->finished = true;
  ev_break(loop, EVBREAK_ALL);
}

static double metric(const char *text, const char *name)
{
  size_t n = strlen(name);
  for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
    if (!strncmp(p, name, n) && p[n] == ' ')
      return atof(p + n + 1);
  return -1;
}

int main(int argc, char **argv)
{
  unsigned n = 1000, cells = 10, concurrency = 0, max_turns = 256;
  double limit = 100;
  static const struct option opts[] = {
    {"conversations", required_argument, NULL, 'n'}, {"cells", required_argument, NULL, 'c'},
    {"concurrency", required_argument, NULL, 'k'},
    {"max-concurrent-turns", required_argument, NULL, 'm'},
    {"time-limit", required_argument, NULL, 'l'}, {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0}
  };
  int ch;
  while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1)
    switch (ch) {
      case 'n': n = (unsigned)atoi(optarg); break;
      case 'c': cells = (unsigned)atoi(optarg); break;
      case 'k': concurrency = (unsigned)atoi(optarg); break;
      case 'm': max_turns = (unsigned)atoi(optarg); break;
      case 'l': limit = atof(optarg); break;
      default:
        printf("usage: serve_load [--conversations N (1000)] [--cells N (10)] "
               "[--concurrency N (all)] [--max-concurrent-turns N (256)] "
               "[--time-limit S (100)]\n");
        return ch == 'h' ? 0 : 2;
    }
  if (!n || !cells)
    return 2;
  if (!concurrency || concurrency > n)
    concurrency = n;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  signal(SIGPIPE, SIG_IGN);
  sbx_proc sbx;
  char max_sessions[32], max_convs[32], turns[32];
  snprintf(max_sessions, sizeof max_sessions, "%u", n + 64);
  snprintf(max_convs, sizeof max_convs, "%u", n);
  snprintf(turns, sizeof turns, "%u", max_turns);
  const char *sbx_args[] = {"--max-sessions", max_sessions, NULL};
  if (sbx_start(&sbx, sbx_args) != 0)
    return 1;
  const char *serve_args[] = {"--daemon", sbx.url, "--token-file-daemon", sbx.token_file,
                              "--max-conversations", max_convs, "--max-concurrent-turns",
                              turns, "--max-queued-messages", max_convs, NULL};
  st_server srv;
  if (st_start(&srv, script, serve_args) != 0) {
    sbx_stop(&sbx);
    return 1;
  }
  int status = 1;
  run r;
  memset(&r, 0, sizeof r);
  r.srv = &srv;
  r.n = n;
  r.cells = cells;
  r.concurrency = concurrency;
  r.convs = calloc(n, sizeof *r.convs);
  r.lat = calloc((size_t)n * cells, sizeof *r.lat);
  r.later = calloc((size_t)n * cells, sizeof *r.later);
  r.loop = ev_loop_new(EVFLAG_AUTO);
  if (!r.loop || plm_curl_ev_init(&r.cev, r.loop, drain, &r) != 0) {
    fprintf(stderr, "serve_load: cannot make the event loop or the curl multi handle\n");
    goto out;
  }
  r.multi = r.cev.multi;
  curl_multi_setopt(r.multi, CURLMOPT_MAXCONNECTS, (long)concurrency + 16);
  for (int k = 0; k < 2; k++)
    r.headers[k] = st_headers(srv.token[k], "application/json");
  /* Phase one: the conversations are opened through the load's own loop, each on
   * the handle its turns use and at most --concurrency at once, so that their
   * connections are in the multi handle's cache when the turns start.  A client that
   * opens a conversation and then talks in it keeps its connection (HTTP keep-alive);
   * opened one by one on connections of their own, every first turn connected anew. */
  char url[256];
  snprintf(url, sizeof url, "%s/v1/conversations", srv.url);
  r.open_url = curl_url();
  curl_url_set(r.open_url, CURLUPART_URL, url, 0);
  double t_open = st_now();
  r.opening = true;
  fill_and_maybe_end(&r);
  ev_run(r.loop, 0);
  r.opening = false;
  r.next = 0;
  if (r.opened != n) {
    fprintf(stderr, "serve_load: %u of %u conversations opened\n", r.opened, n);
    goto out;
  }
  double opened = st_now() - t_open;

  double t0 = st_now();
  double cpu0[3] = {bh_cpu_of(srv.pid), bh_cpu_of(sbx.pid), bh_cpu_of(0)};
  r.deadline = t0 + limit;
  fill_and_maybe_end(&r);
  ev_timer_init(&r.stop, on_stop, limit + 30, 0.);
  r.stop.data = &r;
  ev_timer_start(r.loop, &r.stop);
  if (!r.finished)
    ev_run(r.loop, 0);
  ev_timer_stop(r.loop, &r.stop);
  double wall = st_now() - t0;
  /* Where the CPU of the turns went: the server, the daemon, this load (per turn). */
  double per_turn[3] = {bh_cpu_of(srv.pid) - cpu0[0], bh_cpu_of(sbx.pid) - cpu0[1],
                        bh_cpu_of(0) - cpu0[2]};
  for (int i = 0; i < 3; i++)
    per_turn[i] = r.done ? per_turn[i] * 1e6 / (double)r.done : 0;
  unsigned long long want = (unsigned long long)n * cells;
  unsigned long long unfinished = want - r.done;

  char *metrics = NULL;
  snprintf(url, sizeof url, "%s/metrics", srv.url);
  st_call("GET", url, srv.token[0], NULL, &metrics);
  double m_cells = metric(metrics, "berth_cells_total{outcome=\"ok\"}");
  double m_cell_err = metric(metrics, "berth_cells_total{outcome=\"error\"}");
  double m_turns = metric(metrics, "berth_turns_total{outcome=\"ok\"}");
  double m_sandboxes = metric(metrics, "berth_sandboxes");
  free(metrics);
  double t_stop = st_now();
  int exit_code = st_stop(&srv);
  double stopped = st_now() - t_stop;

  for (size_t i = 0; i < r.n_lat; i++)
    r.lat[i] *= 1000;
  for (size_t i = 0; i < r.n_later; i++)
    r.later[i] *= 1000;
  qsort(r.lat, r.n_lat, sizeof *r.lat, bj_cmp_double);
  qsort(r.later, r.n_later, sizeof *r.later, bj_cmp_double);
  printf("serve_load: %u conversations x %u cells through berth serve (sandboxd echo), "
         "%u streams at once, --max-concurrent-turns %u\n", n, cells, concurrency, max_turns);
  printf("  opened            %u conversations in %.2f s\n", n, opened);
  printf("  turns             %llu of %llu in %.2f s -> %.0f turns/s (one cell each)\n",
         r.done, want, wall, (double)r.done / wall);
  printf("  CPU per turn      server %.0f us, sandboxd %.0f us, this load %.0f us "
         "(the scheduler's count)\n", per_turn[0], per_turn[1], per_turn[2]);
  printf("  results lost      %llu (+%llu never finished)\n", r.lost, unfinished);
  printf("  misclassified     %llu\n", r.misclassified);
  printf("  turn latency      p50 %.1f ms, p99 %.1f ms, max %.1f ms (client: request to "
         "stream end)\n", bj_pct(r.lat, r.n_lat, 0.5), bj_pct(r.lat, r.n_lat, 0.99),
         r.n_lat ? r.lat[r.n_lat - 1] : 0);
  /* Every conversation's first turn starts at once and opens its sandbox: at 10 cells
   * a conversation they are a tenth of the turns, so they make the p99 above. */
  if (r.n_later)
    printf("  later turns       p50 %.1f ms, p99 %.1f ms (each conversation's first turn, "
           "which opens its sandbox, left out)\n", bj_pct(r.later, r.n_later, 0.5),
           bj_pct(r.later, r.n_later, 0.99));
  else
    printf("  later turns       none (one turn a conversation)\n");
  printf("  server counters   %.0f cells ok, %.0f cells failed, %.0f turns ok, %.0f "
         "sandboxes held\n", m_cells, m_cell_err, m_turns, m_sandboxes);
  printf("  SIGTERM           exit %d after %.2f s (every sandbox disposed)\n", exit_code,
         stopped);
  if (r.first_problem[0])
    printf("  first problem     %s\n", r.first_problem);
  bool ok = !r.timed_out && unfinished == 0 && r.lost == 0 && r.misclassified == 0 &&
            r.cells_ok == want && m_cells == (double)want && m_cell_err == 0 && exit_code == 0;
  printf("  result            %s\n", ok ? "ok: 0 results lost, 0 misclassified"
                                        : r.timed_out ? "FAILED (time limit)" : "FAILED");
  status = ok ? 0 : 1;
  json_t *j = bj_new("serve_load");
  bj_param(j, "conversations", json_integer(n));
  bj_param(j, "cells", json_integer(cells));
  bj_param(j, "concurrency", json_integer(concurrency));
  bj_param(j, "max_concurrent_turns", json_integer(max_turns));
  bj_param(j, "provider", json_string("echo"));
  bj_fig(j, "open", opened, "s");
  bj_fig(j, "wall", wall, "s");
  bj_fig(j, "turns", (double)r.done, "turns");
  bj_fig(j, "rate", (double)r.done / wall, "turns/s");
  bj_fig(j, "server_cpu_per_turn", per_turn[0], "us");
  bj_fig(j, "sandboxd_cpu_per_turn", per_turn[1], "us");
  bj_fig(j, "load_cpu_per_turn", per_turn[2], "us");
  bj_fig(j, "lost", (double)r.lost, "turns");
  bj_fig(j, "never_finished", (double)unfinished, "turns");
  bj_fig(j, "misclassified", (double)r.misclassified, "turns");
  bj_fig(j, "server_cells_ok", m_cells, "cells");
  bj_fig(j, "server_cells_failed", m_cell_err, "cells");
  bj_fig(j, "sigterm_exit", exit_code, "status");
  bj_fig(j, "sigterm", stopped, "s");
  json_object_set_new(j, "ok", json_boolean(ok));
  json_object_set_new(j, "turn_latency", bj_dist(r.lat, r.n_lat, "ms", false));
  json_object_set_new(j, "later_turn_latency", bj_dist(r.later, r.n_later, "ms", false));
  if (bj_write(j))
    status = 1;
out:
  for (unsigned i = 0; i < n; i++) {
    st_stream *st = &r.convs[i].st;
    if (st->easy) {
      if (r.convs[i].active)
        curl_multi_remove_handle(r.multi, st->easy);
      curl_easy_cleanup(st->easy);
    }
    curl_url_cleanup(r.convs[i].url);
    free(st->buf);
  }
  curl_url_cleanup(r.open_url);
  if (r.loop) {
    plm_curl_ev_fini(&r.cev);
    ev_loop_destroy(r.loop);
  }
  curl_slist_free_all(r.headers[0]);
  curl_slist_free_all(r.headers[1]);
  free(r.convs);
  free(r.lat);
  free(r.later);
  if (srv.pid > 0)
    st_stop(&srv);
  sbx_stop(&sbx);
  curl_global_cleanup();
  return status;
}

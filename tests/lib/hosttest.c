/*
 * hosttest.c — see hosttest.h.
 */
#include "hosttest.h"

#include <ev.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void ht_init(ht *t)
{
  memset(t, 0, sizeof *t);
  snprintf(t->dir, sizeof t->dir, "/tmp/berth-test-XXXXXX");
  if (!mkdtemp(t->dir))
    abort();
  t->loop = ev_loop_new(EVFLAG_AUTO);
  t->events = json_array();
  t->checks = json_array();
  t->logs = json_array();
}

const char *ht_file(ht *t, const char *name, const char *content)
{
  static char path[256];
  snprintf(path, sizeof path, "%s/%s", t->dir, name);
  FILE *f = fopen(path, "w");
  if (!f)
    abort();
  fputs(content, f);
  fclose(f);
  return path;
}

static void on_event(void *ud, berth_conv *c, const char *kind, const json_t *data)
{
  ht *t = ud;
  json_array_append_new(t->events,
                        json_pack("{s:s, s:O?, s:s?}", "kind", kind, "data", data, "run",
                                  c ? berth_conv_run_id(c) : NULL));
}

/* Kept for the tests to read, shown only when asked for. */
static void quiet_log(void *ud, berth_log_level level, const char *message)
{
  ht *t = ud;
  json_array_append_new(t->logs, json_string(message));
  if (level >= BERTH_LOG_WARN && getenv("BERTH_TEST_VERBOSE"))
    fprintf(stderr, "  [host] %s\n", message);
}

char *ht_host_try(ht *t, const char *hooks, const char *url, const char *token,
                  void (*tweak)(berth_options *o))
{
  berth_options o;
  berth_options_init(&o);
  o.loop = t->loop;
  char hooks_copy[256];
  if (hooks) {
    snprintf(hooks_copy, sizeof hooks_copy, "%s", hooks);
    o.hooks_file = hooks_copy;
  }
  o.lib_dir = "scripts";
  o.daemon_url = url;
  o.daemon_token = token;
  o.minimum_isolation = "container";
  o.model = t->model;
  o.on_event = on_event;
  o.event_ud = t;
  o.log = quiet_log;
  o.log_ud = t;
  if (tweak)
    tweak(&o);
  char *err = NULL;
  if (berth_host_new(&o, &t->host, &err) != 0)
    return err;
  return NULL;
}

void ht_host(ht *t, const char *hooks, const char *url, const char *token,
             void (*tweak)(berth_options *o))
{
  char *err = ht_host_try(t, hooks, url, token, tweak);
  if (err) {
    fprintf(stderr, "ht_host: %s\n", err);
    abort();
  }
}

static void on_check(void *ud, bool ok, const char *what)
{
  ht *t = ud;
  json_array_append_new(t->checks, json_pack("{s:b, s:s}", "ok", ok, "what", what));
  if (!ok)
    fprintf(stderr, "  check FAILED: %s\n", what);
}

void ht_model(ht *t, const char *script_lua, const char *provider)
{
  char path[256];
  snprintf(path, sizeof path, "%s", ht_file(t, "script.lua", script_lua));
  char *err = NULL;
  json_t *script = berth_script_load(path, &err);
  if (!script) {
    fprintf(stderr, "ht_model: %s\n", err);
    abort();
  }
  berth_model_options mo = {t->loop, provider, on_check, t};
  t->model = berth_scripted_new(script, &mo, &err);
  json_decref(script);
}

static void tick(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)loop;
  (void)w;
  (void)revents;
}

bool ht_wait(ht *t, bool (*pred)(ht *t, void *ud), void *ud, double seconds)
{
  /* A ticker so that EVRUN_ONCE returns to look at the condition even when the
   * loop has nothing else due; the deadline bounds the wait. */
  ev_timer ticker;
  ev_timer_init(&ticker, tick, 0.02, 0.02);
  ev_timer_start(t->loop, &ticker);
  ev_now_update(t->loop);
  ev_tstamp deadline = ev_now(t->loop) + seconds;
  bool ok;
  while (!(ok = pred(t, ud)) && ev_now(t->loop) < deadline)
    ev_run(t->loop, EVRUN_ONCE);
  ev_timer_stop(t->loop, &ticker);
  return ok;
}

int ht_count(const ht *t, const char *kind)
{
  int n = 0;
  size_t i;
  json_t *ev;
  json_array_foreach(t->events, i, ev)
    if (strcmp(json_string_value(json_object_get(ev, "kind")), kind) == 0)
      n++;
  return n;
}

const json_t *ht_event(const ht *t, const char *kind, int k)
{
  size_t i;
  json_t *ev;
  json_array_foreach(t->events, i, ev)
    if (strcmp(json_string_value(json_object_get(ev, "kind")), kind) == 0 && k-- == 0)
      return json_object_get(ev, "data");
  return NULL;
}

typedef struct count_want {
  const char *kind;
  int n;
} count_want;

static bool has_count(ht *t, void *ud)
{
  count_want *w = ud;
  return ht_count(t, w->kind) >= w->n;
}

bool ht_wait_events(ht *t, const char *kind, int n, double seconds)
{
  count_want w = {kind, n};
  return ht_wait(t, has_count, &w, seconds);
}

static void on_completed(void *ud, berth_conv *c)
{
  (void)c;
  ((ht *)ud)->completed++;
}

static bool shut_done;

static void on_shut(void *ud)
{
  (void)ud;
  shut_done = true;
}

static bool is_shut(ht *t, void *ud)
{
  (void)t;
  (void)ud;
  return shut_done;
}

static bool is_completed(ht *t, void *ud)
{
  return t->completed >= *(int *)ud;
}

bool ht_complete(ht *t, double seconds)
{
  int want = t->completed + 1;
  berth_conv_complete(t->conv, on_completed, t);
  if (!ht_wait(t, is_completed, &want, seconds))
    return false;
  shut_done = false;
  berth_host_shutdown(t->host, on_shut, NULL);
  return ht_wait(t, is_shut, NULL, seconds);
}

void ht_free(ht *t)
{
  if (t->conv)
    berth_conv_free(t->conv);
  berth_host_free(t->host);
  berth_model_free(t->model);
  json_decref(t->events);
  json_decref(t->checks);
  json_decref(t->logs);
  ev_loop_destroy(t->loop);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", t->dir);
  if (system(cmd) != 0)
    fprintf(stderr, "ht_free: could not remove %s\n", t->dir);
}

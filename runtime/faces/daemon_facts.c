/*
 * daemon_facts.c — what a daemon's Describe says of where code runs, for the faces
 * (cli.h): the chat's banner, replay's provider expectations, serve's "noCodeRan".
 */
#include "cli.h"
#include "xalloc.h"
#include "plimsoll.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct facts_wait {
  bool done;
  char *error;
  berth_daemon_facts *facts;
} facts_wait;

static void on_facts(void *ud, plm_error *err, plm_info *info)
{
  facts_wait *d = ud;
  d->done = true;
  if (err) {
    d->error = berth_xstrdup(err->message);
    plm_error_free(err);
    return;
  }
  berth_daemon_facts *f = d->facts;
  f->sandbox = info->sandbox ? berth_xstrdup(info->sandbox) : NULL;
  f->isolation = info->isolation ? berth_xstrdup(info->isolation) : NULL;
  plm_info_free(info);
}

int berth_daemon_describe(struct ev_loop *loop, const char *url, const char *token,
                          berth_daemon_facts *f)
{
  f->sandbox = f->isolation = NULL;
  plm_client_options co;
  plm_client_options_init(&co);
  co.base_url = url;
  co.token = token;
  plm_client *client = NULL;
  plm_error *e = plm_client_new(loop, &co, &client);
  facts_wait d = {false, NULL, f};
  if (!e)
    e = plm_describe(client, NULL, on_facts, &d);
  if (e) {
    fprintf(stderr, "berth: the daemon at %s: %s\n", url, e->message);
    plm_error_free(e);
    plm_client_free(client);
    return -1;
  }
  while (!d.done)
    ev_run(loop, EVRUN_ONCE);
  plm_client_free(client);
  if (d.error) {
    fprintf(stderr, "berth: the daemon at %s did not answer Describe: %s\n", url, d.error);
    free(d.error);
    return -1;
  }
  return 0;
}

void berth_daemon_facts_clear(berth_daemon_facts *f)
{
  free(f->sandbox);
  free(f->isolation);
  f->sandbox = f->isolation = NULL;
}

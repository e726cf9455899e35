/*
 * hosttest.h — helpers for tests of the berth host: a host on a private loop with
 * its events recorded, hook files written to a temporary directory, and bounded
 * waits on observable conditions (never a fixed sleep).
 */
#ifndef TESTS_HOSTTEST_H
#define TESTS_HOSTTEST_H

#include <stdbool.h>

#include <jansson.h>

#include "berth.h"
#include "model.h"

typedef struct ht {
  struct ev_loop *loop;
  berth_host *host;
  berth_model *model;
  berth_conv *conv;
  json_t *events;              /* [{kind, data, run}] in order */
  json_t *checks;              /* scripted-model checks: [{ok, what}] */
  json_t *logs;                /* every line the host logged, in order: [message] */
  char dir[64];                /* temporary directory for hooks and scripts */
  int completed;               /* berth_conv_complete callbacks seen */
} ht;

/* A temporary directory; files written there by ht_file. */
void ht_init(ht *t);
/* Writes dir/name; returns the path (static buffer, copy it if kept). */
const char *ht_file(ht *t, const char *name, const char *content);
/* Creates the host: hooks file (a path, or NULL), daemon url/token (or NULL), options
 * adjusted by `tweak` (may be NULL).  Fails the test on error. */
void ht_host(ht *t, const char *hooks, const char *url, const char *token,
             void (*tweak)(berth_options *o));
/* As ht_host but returns the error text (malloc'd) or NULL. */
char *ht_host_try(ht *t, const char *hooks, const char *url, const char *token,
                  void (*tweak)(berth_options *o));
/* A scripted model from a .lua script text (written to the temp dir). */
void ht_model(ht *t, const char *script_lua, const char *provider);
/* Runs the loop until pred(t, ud) holds; false after `seconds`. */
bool ht_wait(ht *t, bool (*pred)(ht *t, void *ud), void *ud, double seconds);
/* Runs the loop until `n` events of `kind` were recorded. */
bool ht_wait_events(ht *t, const char *kind, int n, double seconds);
int ht_count(const ht *t, const char *kind);
/* The i-th (0-based) event of `kind`'s data, borrowed; NULL if none. */
const json_t *ht_event(const ht *t, const char *kind, int i);
/* Completes t->conv and waits for it, then shuts down the host (dispose all). */
bool ht_complete(ht *t, double seconds);
/* Frees everything (conversation, host, model, files). */
void ht_free(ht *t);

#endif

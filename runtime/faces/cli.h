/*
 * cli.h — the berth command (cli.c) and what its faces share: what a daemon's Describe
 * says (daemon_facts.c) and the transcript printer (transcript.c).  The local sandboxd
 * they start is the core's (local_sandboxd.h), as embedders' is.
 */
#ifndef BERTH_CLI_H
#define BERTH_CLI_H

#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

#include <ev.h>
#include <jansson.h>

#include "berth.h"
#include "local_sandboxd.h"   /* core: the local sandboxd, the floor */

int berth_cli_main(int argc, char **argv);
/* `berth serve` (serve.c). */
int berth_cmd_serve(int argc, char **argv);

/* The request bodies `berth serve` accepts, decoded and checked (serve.c; apart from
 * MHD, so tests/fuzz/fuzz_serve.c runs the code the server runs).  Each returns NULL
 * with its result, or why the body is refused (malloc'd; a 400 invalid_argument). */
typedef struct berth_serve_create {
  json_t *body;                 /* owns what follows; json_decref when done */
  const char *user;             /* "userId": 1..128 bytes, no NUL; NULL when absent */
  const json_t *metadata;       /* an object, or NULL when absent */
} berth_serve_create;
char *berth_serve_create_body(const char *body, size_t len, berth_serve_create *out);
/* {"content": "<text without NUL>"} and nothing else: *content points into *out. */
char *berth_serve_message_body(const char *body, size_t len, json_t **out,
                               const char **content);

/* {====================================================== daemons */

/* What a daemon's Describe says of where code runs (malloc'd strings; NULL when it
 * does not say).  The provider's name: "echo" runs no code, and the faces say so. */
typedef struct berth_daemon_facts {
  char *sandbox, *isolation;
} berth_daemon_facts;
/* Asks the daemon at url (a first check that it answers, with this token), running
 * `loop` until it does.  Returns 0, or -1 with a message on stderr. */
int berth_daemon_describe(struct ev_loop *loop, const char *url, const char *token,
                          berth_daemon_facts *f);
void berth_daemon_facts_clear(berth_daemon_facts *f);

/* }====================================================== */

/* {====================================================== transcript */

typedef struct berth_transcript {
  FILE *out;
  bool streaming;               /* print deltas as they come (chat) */
  bool in_delta;                /* a delta line is open */
  bool no_code_runs;            /* the echo provider: each result says nothing ran */
  unsigned turn;
} berth_transcript;

/* Prints one conversation event (a berth_event_fn body). */
void berth_transcript_event(berth_transcript *t, const char *kind, const json_t *data);
void berth_transcript_check(berth_transcript *t, bool ok, const char *what);

/* }====================================================== */

#endif

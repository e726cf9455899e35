/*
 * cli.h — the berth command (cli.c) and what its faces share: a local sandboxd
 * started and stopped by berth (daemon.c) and the transcript printer (transcript.c).
 */
#ifndef BERTH_CLI_H
#define BERTH_CLI_H

#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

#include <ev.h>
#include <jansson.h>

#include "berth.h"

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

/* The directory of the shipped scripts (code_chat.lua): $BERTH_SCRIPTS, else next to
 * the executable (../scripts, ../share/berth/scripts).  malloc'd, or NULL. */
char *berth_find_scripts_dir(void);

/* The floor a face uses without --minimum-isolation: "container" for a daemon reached
 * over cleartext http, which the client allows only to loopback (a daemon on this
 * machine: local development), else "kernel" (https: a production daemon). */
const char *berth_default_floor(const char *daemon_url);

/* {====================================================== local daemon */

typedef struct berth_daemon {
  pid_t pid;
  int out_fd;                   /* its stdout, kept open so late writes cannot fail */
  char url[256];
  char token[80];
  char token_file[64];
  /* How it was started, to start it again (berth_daemon_watch). */
  char *prog, *provider;
  bool verbose;
  struct ev_loop *loop;         /* non-NULL while watched */
  ev_child child;
  ev_timer retry;
  double retry_after;           /* seconds before the next attempt */
  unsigned restarts;
} berth_daemon;

/* Starts `sandboxd --listen 127.0.0.1:0 --token-file <new file> --provider provider`
 * (path NULL: $BERTH_SANDBOXD, else next to berth, else PATH) and reads its one
 * `listening URL` line (bounded wait).  Returns 0, or -1 with a message on stderr. */
int berth_daemon_start(berth_daemon *d, const char *path, const char *provider, bool verbose);
/* SIGTERM, bounded wait for the drain, SIGKILL if it hangs; removes the token file. */
void berth_daemon_stop(berth_daemon *d);
/* Keeps it running on `loop` (libev's default loop: child watchers live there): when
 * it dies, it is started again (logged) on the same address with the same token, so
 * the host's client needs no change, and each conversation's next call opens a fresh
 * sandbox (its session is gone with the old daemon).  A start that fails is retried
 * (1 s, doubling to 30 s).  The watch does not keep the loop running. */
void berth_daemon_watch(berth_daemon *d, struct ev_loop *loop);

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

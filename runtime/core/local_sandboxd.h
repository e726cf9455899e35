/*
 * local_sandboxd.h — a sandboxd this process starts, watches and stops (the faces'
 * local daemon, and berth_sandboxd_* of berth.h for embedders), and the rules a host
 * shares with them: where the shipped scripts are, and the default isolation floor.
 */
#ifndef BERTH_LOCAL_SANDBOXD_H
#define BERTH_LOCAL_SANDBOXD_H

#include <stdbool.h>
#include <sys/types.h>

#include <ev.h>

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

#endif

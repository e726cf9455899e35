/*
  * mhd_ev.h — a libmicrohttpd daemon driven by a libev loop: sandboxd's, `berth serve`'s
  * and serve's metrics listener each run one this way.
  *
  * The daemon runs in external mode with its own epoll set (MHD_USE_EPOLL): an ev_io
  * watches that set's descriptor, an ev_timer follows MHD_get_timeout (re-armed after
  * every run, whichever phase of the loop made it) and a "kick" runs MHD after a
  * resume or a handed-over connection, once the callback that kicked has returned
  * (from any callback: a prepare watcher's too) — MHD_run is never called from
  * inside one of MHD's own callbacks ("make sure to run MHD_run() afterwards", says
  * its manual).  A run repeats MHD_run while MHD says it is due at once, a few times
  * at most: it takes a finished keep-alive connection one step per run, and each step
  * through the loop would cost an iteration.
  *
  *   struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_EPOLL | ..., ...);
  *   httpd_mhd m;
  *   if (!httpd_mhd_attach(&m, loop, d, &why)) ...;      (m must not move: it holds
  *   ... MHD_resume_connection(c); httpd_mhd_kick(&m);      the watchers)
  *   httpd_mhd_detach(&m); MHD_stop_daemon(d);
  *
  * One thread: the loop's.  The daemon stays the caller's to stop.
  */
#ifndef HTTPD_MHD_EV_H
#define HTTPD_MHD_EV_H

#include <ev.h>
#include <microhttpd.h>
#include <stdbool.h>

typedef struct httpd_mhd {
    struct ev_loop *loop;
    struct MHD_Daemon *daemon;
    ev_io io;                     /* MHD's epoll set is readable */
    ev_timer timer;               /* MHD's own next timeout */
    ev_timer kick;                /* fed, never started: see httpd_mhd_kick */
} httpd_mhd;

/* Starts watching `daemon` (started with MHD_USE_EPOLL and without a thread of its own).
  * false, with a malloc'd message in *why, when it has no epoll set to watch. */
bool httpd_mhd_attach(httpd_mhd *m, struct ev_loop *loop, struct MHD_Daemon *daemon,
                                            char **why);

/* MHD runs once the current callback has returned, in the same loop iteration (the
  * kick is fed to the loop as an event): after MHD_resume_connection or
  * MHD_add_connection, and whenever the caller holds data MHD should now send. */
void httpd_mhd_kick(httpd_mhd *m);

/* MHD runs now.  Never from inside an MHD callback. */
void httpd_mhd_run(httpd_mhd *m);

/* Stops the watchers (idempotent; a never-attached zeroed httpd_mhd is fine); before
  * MHD_stop_daemon. */
void httpd_mhd_detach(httpd_mhd *m);

#endif

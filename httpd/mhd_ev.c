/*
  * mhd_ev.c — a libmicrohttpd daemon driven by a libev loop (mhd_ev.h).
  */
#include "mhd_ev.h"

#include <stdlib.h>
#include <string.h>

static void on_ready(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)revents;
    httpd_mhd_run(w->data);
}

static void on_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    httpd_mhd_run(w->data);
}

/* The timer follows MHD's own next timeout (`has` and `ms`, MHD_get_timeout's), set
 * after every run: whichever phase of the loop ran MHD (a kick fed from a prepare
 * watcher runs after the loop's prepare phase), the loop then waits no longer than
 * MHD asked.  A connection MHD still has steps for (a timeout of 0) has no event left
 * to wake it: the request behind a keep-alive answer may already sit in MHD's buffer. */
static void follow_timeout(httpd_mhd *m, enum MHD_Result has, MHD_UNSIGNED_LONG_LONG ms)
{
    ev_timer_stop(m->loop, &m->timer);
    if (has == MHD_YES) {
        ev_timer_set(&m->timer, (double)ms / 1000.0, 0.);
        ev_timer_start(m->loop, &m->timer);
    }
}

bool httpd_mhd_attach(httpd_mhd *m, struct ev_loop *loop, struct MHD_Daemon *daemon,
                                            char **why)
{
    memset(m, 0, sizeof *m);
    const union MHD_DaemonInfo *info =
        daemon ? MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_EPOLL_FD) : NULL;
    if (!info || info->epoll_fd < 0) {
        *why = strdup("libmicrohttpd would not start (epoll with suspend/resume)");
        return false;
    }
    m->loop = loop;
    m->daemon = daemon;
    ev_io_init(&m->io, on_ready, info->epoll_fd, EV_READ);
    m->io.data = m;
    ev_io_start(loop, &m->io);
    ev_timer_init(&m->timer, on_timer, 0., 0.);
    m->timer.data = m;
    ev_timer_init(&m->kick, on_timer, 0., 0.);
    m->kick.data = m;
    MHD_UNSIGNED_LONG_LONG ms = 0;
    enum MHD_Result has = MHD_get_timeout(daemon, &ms);
    follow_timeout(m, has, ms);
    return true;
}

/* Fed rather than started as a zero timer: libev invokes a watcher fed from a callback
  * once that callback has returned, in the same iteration, so an answer goes out
  * without another trip through epoll_wait (and never from inside the feeder). */
void httpd_mhd_kick(httpd_mhd *m)
{
    ev_feed_event(m->loop, &m->kick, EV_TIMER);
}

/* MHD takes a connection one step per run: after an answer is sent it asks to run
  * at once (a timeout of 0) twice more before it reads the next request.  Each of
  * those through the loop costs an iteration and two epoll_waits, so a few runs that
  * are due now are made here, bounded so that other watchers are never starved; what
  * is still due after them is the timer's (follow_timeout). */
#define MHD_RUNS_IN_A_ROW 4

void httpd_mhd_run(httpd_mhd *m)
{
    MHD_UNSIGNED_LONG_LONG ms = 0;
    enum MHD_Result has;
    int runs = 0;
    do {
        MHD_run(m->daemon);
        has = MHD_get_timeout(m->daemon, &ms);
    } while (++runs < MHD_RUNS_IN_A_ROW && has == MHD_YES && ms == 0);
    follow_timeout(m, has, ms);
}

void httpd_mhd_detach(httpd_mhd *m)
{
    if (!m->loop)
        return;
    ev_io_stop(m->loop, &m->io);
    ev_timer_stop(m->loop, &m->timer);
    ev_timer_stop(m->loop, &m->kick);
    m->loop = NULL;
}

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

/* Before the loop blocks: wake up when MHD next needs to run (its timeouts, and at once
  * when it holds data read but not yet processed). */
static void on_prepare(struct ev_loop *loop, ev_prepare *w, int revents)
{
    (void)revents;
    httpd_mhd *m = w->data;
    MHD_UNSIGNED_LONG_LONG ms;
    ev_timer_stop(loop, &m->timer);
    if (MHD_get_timeout(m->daemon, &ms) == MHD_YES) {
        ev_timer_set(&m->timer, (double)ms / 1000.0, 0.);
        ev_timer_start(loop, &m->timer);
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
    ev_prepare_init(&m->prepare, on_prepare);
    m->prepare.data = m;
    ev_prepare_start(loop, &m->prepare);
    return true;
}

void httpd_mhd_kick(httpd_mhd *m)
{
    ev_timer_start(m->loop, &m->kick);
}

void httpd_mhd_run(httpd_mhd *m)
{
    MHD_run(m->daemon);
}

void httpd_mhd_detach(httpd_mhd *m)
{
    if (!m->loop)
        return;
    ev_io_stop(m->loop, &m->io);
    ev_timer_stop(m->loop, &m->timer);
    ev_timer_stop(m->loop, &m->kick);
    ev_prepare_stop(m->loop, &m->prepare);
    m->loop = NULL;
}

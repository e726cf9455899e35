/*
 * connguard.c — see connguard.h.
 *
 * Untrusted connections sit in one list in the order they came, so their deadlines
 * (arrival + the header timeout) rise along it: the head is both the next to expire
 * and (nearly, see pick_victim) the oldest to close past the cap, and one timer armed
 * for the head serves all.
 * Trusted and shut-down connections leave the list; MHD's closed notice frees them.
 *
 * Self-contained (libc, libev, MHD) so that runtime/ can build it too.
 */
#include "connguard.h"

#include <ev.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>

#define NOTICE_EVERY_S 10.
#define VICTIM_SCAN 64       /* strangers looked at for one MHD has read dry */
#define MIN_DEFAULT_LIMIT 16u
#define MAX_DEFAULT_LIMIT 4096u

typedef struct guarded {
    connguard *g;
    int fd;
    ev_tstamp deadline;
    bool listed;                   /* untrusted and open: in the list */
    bool shut;                     /* shut down by the guard, MHD not done yet */
    struct guarded *prev, *next;
} guarded;

struct connguard {
    struct ev_loop *loop;
    unsigned max;
    double header_timeout;
    guarded *head, *tail;          /* untrusted, oldest first */
    size_t open;                   /* not shut down by the guard */
    size_t unreaped;               /* shut down, MHD's closed notice still to come */
    uint64_t closed_late, closed_over_cap, noticed;
    ev_timer deadline;
    ev_tstamp last_notice;
    void (*notice_cb)(void *ud, const char *line);
    void *notice_ud;
};

static void unlist(guarded *c)
{
    connguard *g = c->g;
    if (!c->listed)
        return;
    if (c->prev)
        c->prev->next = c->next;
    else
        g->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else
        g->tail = c->prev;
    c->prev = c->next = NULL;
    c->listed = false;
}

static void rearm(connguard *g)
{
    ev_timer_stop(g->loop, &g->deadline);
    if (!g->head)
        return;
    ev_tstamp in = g->head->deadline - ev_now(g->loop);
    ev_timer_set(&g->deadline, in > 0 ? in : 0., 0.);
    ev_timer_start(g->loop, &g->deadline);
}

static void notice(connguard *g)
{
    ev_tstamp now = ev_now(g->loop);
    uint64_t closed = g->closed_late + g->closed_over_cap;
    if (!g->notice_cb || closed == g->noticed ||
        (g->last_notice && now - g->last_notice < NOTICE_EVERY_S))
        return;
    char line[200];
    snprintf(line, sizeof line,
             "closed %llu connections that sent no authenticated request (%llu past the header "
             "timeout, %llu over the cap of %u)", (unsigned long long)(closed - g->noticed),
             (unsigned long long)g->closed_late, (unsigned long long)g->closed_over_cap, g->max);
    g->noticed = closed;
    g->last_notice = now;
    g->notice_cb(g->notice_ud, line);
}

/* MHD finds the end on its next read of the socket and reaps the connection. */
static void shut(guarded *c)
{
    unlist(c);
    c->shut = true;
    c->g->open--;
    c->g->unreaped++;
    shutdown(c->fd, SHUT_RDWR);
}

/* Past the cap: the oldest stranger whose bytes MHD has read.  One with unread bytes
 * may be a whole request MHD has not parsed yet (connections come in batches, before
 * MHD reads any of them); a flood's connection has none left once MHD read its
 * dribble.  Only the first few are looked at: past them the oldest goes anyway. */
static guarded *pick_victim(connguard *g)
{
    guarded *c = g->head;
    for (int i = 0; c && i < VICTIM_SCAN; i++, c = c->next) {
        int unread = 0;
        if (ioctl(c->fd, FIONREAD, &unread) != 0 || unread == 0)
            return c;
    }
    return g->head;
}

static void on_deadline(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)revents;
    connguard *g = w->data;
    ev_tstamp now = ev_now(loop);
    while (g->head && g->head->deadline <= now + 0.001) {
        shut(g->head);
        g->closed_late++;
    }
    rearm(g);
    notice(g);
}

void connguard_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                      enum MHD_ConnectionNotificationCode code)
{
    connguard *g = cls;
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        guarded *c = *socket_context;
        *socket_context = NULL;
        if (!c)
            return;
        if (c->shut)
            g->unreaped--;
        else
            g->open--;
        unlist(c);
        free(c);
        rearm(g);
        return;
    }
    if (code != MHD_CONNECTION_NOTIFY_STARTED)
        return;
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    guarded *c = calloc(1, sizeof *c);
    if (!c || !info)
        abort(); /* out of memory; MHD always knows the fd of a connection it starts */
    c->g = g;
    c->fd = info->connect_fd;
    c->deadline = ev_now(g->loop) + g->header_timeout;
    c->prev = g->tail;
    if (g->tail)
        g->tail->next = c;
    else
        g->head = c;
    g->tail = c;
    c->listed = true;
    g->open++;
    *socket_context = c;
    /* Past the cap: the oldest stranger goes, which is this one when all are trusted. */
    while (g->open > g->max && g->head) {
        shut(pick_victim(g));
        g->closed_over_cap++;
    }
    rearm(g);
    notice(g);
}

void connguard_trust(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    guarded *c = info ? info->socket_context : NULL;
    if (!c || !c->listed)
        return;
    bool was_head = c == c->g->head;
    unlist(c);
    if (was_head)
        rearm(c->g);
}

connguard *connguard_new(struct ev_loop *loop, unsigned max_connections,
                         double header_timeout_s)
{
    connguard *g = calloc(1, sizeof *g);
    if (!g)
        abort();
    g->loop = loop;
    g->max = max_connections ? max_connections : 1;
    g->header_timeout = header_timeout_s > 0 ? header_timeout_s : 1.;
    ev_timer_init(&g->deadline, on_deadline, 0., 0.);
    g->deadline.data = g;
    return g;
}

void connguard_free(connguard *g)
{
    if (!g)
        return;
    ev_timer_stop(g->loop, &g->deadline);
    /* MHD_stop_daemon sent every closed notice; anything left is only unlinked. */
    while (g->head) {
        guarded *c = g->head;
        unlist(c);
        free(c);
    }
    free(g);
}

unsigned connguard_mhd_limit(const connguard *g)
{
    return g->max + g->max / 4 + 16;
}

size_t connguard_open(const connguard *g)
{
    return g->open;
}

size_t connguard_unreaped(const connguard *g)
{
    return g->unreaped;
}

uint64_t connguard_closed_late(const connguard *g)
{
    return g->closed_late;
}

uint64_t connguard_closed_over_cap(const connguard *g)
{
    return g->closed_over_cap;
}

void connguard_on_notice(connguard *g, void (*cb)(void *ud, const char *line), void *ud)
{
    g->notice_cb = cb;
    g->notice_ud = ud;
}

unsigned long connguard_raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 1024;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t want = rl.rlim_max;
        rl.rlim_cur = want;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            getrlimit(RLIMIT_NOFILE, &rl);
    }
    return rl.rlim_cur == RLIM_INFINITY ? (unsigned long)-1 : (unsigned long)rl.rlim_cur;
}

unsigned connguard_default_limit(unsigned long fd_limit)
{
    unsigned long half = fd_limit / 2;
    if (half < MIN_DEFAULT_LIMIT)
        return MIN_DEFAULT_LIMIT;
    return half > MAX_DEFAULT_LIMIT ? MAX_DEFAULT_LIMIT : (unsigned)half;
}

/*
 * listener.c — accept, peek at the first byte, hand over or turn a TLS handshake away.
 */
#include "listener.h"

#include "listen.h"  /* httpd/: shared with berth serve */

#include "log.h"
#include "util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ev.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LINGER_S 2.          /* after turning TLS away: read until the peer closes */
#define BACKLOG 1024         /* a burst of connections waits here, not in SYN retries */
#define TLS_HANDSHAKE 0x16

static const char tls_refusal[] =
    "HTTP/1.1 400 Bad Request\r\n"
    "Content-Type: text/plain; charset=utf-8\r\n"
    "Connection: close\r\n"
    "Content-Length: 70\r\n"
    "\r\n"
    "this plimsoll daemon speaks cleartext HTTP: use http://, not https://\n";

typedef struct sniff {
    sbx_listener *l;
    int fd;
    struct sockaddr_storage addr;
    socklen_t addr_len;
    bool refusing;                 /* the 400 is written; draining until EOF */
    ev_io io;
    ev_timer timer;
    struct sniff *prev, *next;
} sniff;

struct sbx_listener {
    struct ev_loop *loop;
    int fd;
    ev_io io;
    ev_timer retry;                /* accept again after running out of descriptors */
    double silent_s;               /* a client silent this long is closed */
    size_t max_silent;             /* past this many, the oldest silent one is closed */
    sbx_accept_cb cb;
    void *ud;
    sniff *sniffing, *last;        /* oldest first */
    size_t n_sniffing;
};

int sbx_listen_bind(const char *host, const char *port, unsigned *bound_port, char **why)
{
    return httpd_listen(host, port, BACKLOG, bound_port, why);
}

/* ---------------------------------------------------------------- one connection */

static void sniff_unlink(sniff *s)
{
    sbx_listener *l = s->l;
    ev_io_stop(l->loop, &s->io);
    ev_timer_stop(l->loop, &s->timer);
    if (s->prev)
        s->prev->next = s->next;
    else
        l->sniffing = s->next;
    if (s->next)
        s->next->prev = s->prev;
    else
        l->last = s->prev;
    l->n_sniffing--;
}

static void hand_over(sniff *s)
{
    sbx_listener *l = s->l;
    sniff_unlink(s);
    l->cb(l->ud, s->fd, (struct sockaddr *)&s->addr, s->addr_len);
    free(s);
}

static void drop(sniff *s)
{
    sniff_unlink(s);
    close(s->fd);
    free(s);
}

/* Reads and discards what the peer sent; false at EOF or on an error. */
static bool drain(int fd)
{
    char buf[4096];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n > 0)
            continue;
        return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
    }
}

/* The handshake is read first: closing with unread data would send a reset that can
 * overtake the answer. */
static void refuse_tls(sniff *s)
{
    sbx_listener *l = s->l;
    if (!drain(s->fd) ||
        send(s->fd, tls_refusal, sizeof tls_refusal - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof tls_refusal - 1)) {
        drop(s);
        return;
    }
    shutdown(s->fd, SHUT_WR);
    s->refusing = true;
    ev_timer_stop(l->loop, &s->timer);
    ev_timer_set(&s->timer, LINGER_S, 0.);
    ev_timer_start(l->loop, &s->timer);
    sbx_log("turned away a TLS handshake on the cleartext port");
}

static void on_sniff_readable(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)revents;
    sniff *s = w->data;
    if (s->refusing) {
        if (!drain(s->fd))
            drop(s);
        return;
    }
    unsigned char first;
    ssize_t n = recv(s->fd, &first, 1, MSG_PEEK);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n <= 0)
        drop(s); /* closed before saying anything */
    else if (first == TLS_HANDSHAKE)
        refuse_tls(s);
    else
        hand_over(s);
}

/* Refused, or silent for the whole header timeout: a client that means to call sends
 * its request at once, and one that does not would hold a descriptor for nothing. */
static void on_sniff_timeout(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    drop(w->data);
}

/* A flood of silent connections: the oldest goes, as on MHD's side (connguard.h).  It
 * may have spoken since the last loop iteration (accepting comes first): then it is
 * handed over as it would have been, not cut. */
static void make_room(sbx_listener *l)
{
    sniff *s = l->sniffing;
    unsigned char first;
    if (!s->refusing && recv(s->fd, &first, 1, MSG_PEEK) == 1 && first != TLS_HANDSHAKE)
        hand_over(s);
    else
        drop(s);
}

/* ---------------------------------------------------------------- accepting */

static void on_retry(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)revents;
    sbx_listener *l = w->data;
    if (l->fd >= 0)
        ev_io_start(loop, &l->io);
}

static void on_acceptable(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)revents;
    sbx_listener *l = w->data;
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        int fd = accept4(l->fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* Out of descriptors: pause rather than spin on a level-triggered fd. */
                sbx_log("accept: %s; pausing for 1 s", strerror(errno));
                ev_io_stop(loop, &l->io);
                ev_timer_set(&l->retry, 1., 0.);
                ev_timer_start(loop, &l->retry);
            }
            return; /* EAGAIN, or a connection that died in the backlog */
        }
        if (l->n_sniffing >= l->max_silent)
            make_room(l);
        sniff *s = sbx_xcalloc(1, sizeof *s);
        s->l = l;
        s->fd = fd;
        memcpy(&s->addr, &ss, len);
        s->addr_len = len;
        ev_io_init(&s->io, on_sniff_readable, fd, EV_READ);
        s->io.data = s;
        ev_timer_init(&s->timer, on_sniff_timeout, l->silent_s, 0.);
        s->timer.data = s;
        ev_io_start(loop, &s->io);
        ev_timer_start(loop, &s->timer);
        s->prev = l->last;
        if (l->last)
            l->last->next = s;
        else
            l->sniffing = s;
        l->last = s;
        l->n_sniffing++;
    }
}

sbx_listener *sbx_listener_new(struct ev_loop *loop, int listen_fd, double silent_s,
                               size_t max_silent, sbx_accept_cb cb, void *ud)
{
    sbx_listener *l = sbx_xcalloc(1, sizeof *l);
    l->loop = loop;
    l->fd = listen_fd;
    l->silent_s = silent_s;
    l->max_silent = max_silent ? max_silent : 1;
    l->cb = cb;
    l->ud = ud;
    ev_io_init(&l->io, on_acceptable, listen_fd, EV_READ);
    l->io.data = l;
    ev_timer_init(&l->retry, on_retry, 1., 0.);
    l->retry.data = l;
    ev_io_start(loop, &l->io);
    return l;
}

void sbx_listener_stop(sbx_listener *l)
{
    if (l->fd < 0)
        return;
    ev_io_stop(l->loop, &l->io);
    ev_timer_stop(l->loop, &l->retry);
    close(l->fd);
    l->fd = -1;
}

void sbx_listener_free(sbx_listener *l)
{
    if (!l)
        return;
    sbx_listener_stop(l);
    while (l->sniffing)
        drop(l->sniffing);
    free(l);
}

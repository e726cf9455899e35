/*
 * curl_ev.c — see curl_ev.h.
 */
#include "curl_ev.h"

#include <stdlib.h>
#include <string.h>

struct plm_curl_ev_sock {
    ev_io io;
    plm_curl_ev *ev;
    plm_curl_ev_sock *prev, *next;
};

/* ---------------------------------------------------------------- libev glue */

static void io_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    plm_curl_ev_sock *s = w->data;
    plm_curl_ev *ev = s->ev; /* the action may remove the socket and free `s` */
    int action = (revents & EV_READ ? CURL_CSELECT_IN : 0) |
                 (revents & EV_WRITE ? CURL_CSELECT_OUT : 0);
    int running;
    curl_multi_socket_action(ev->multi, w->fd, action, &running);
    ev->drain(ev->ud);
}

static void timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    plm_curl_ev *ev = w->data;
    int running;
    curl_multi_socket_action(ev->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    ev->drain(ev->ud);
}

static void sock_forget(plm_curl_ev *ev, plm_curl_ev_sock *s)
{
    ev_io_stop(ev->loop, &s->io);
    if (s->prev)
        s->prev->next = s->next;
    else
        ev->socks = s->next;
    if (s->next)
        s->next->prev = s->prev;
    free(s);
}

/* Tolerates a REMOVE for a socket it never saw, and re-initialises the watcher on
 * every registration: the fd number may be a new socket's. */
static int sock_cb(CURL *e, curl_socket_t fd, int what, void *userp, void *socketp)
{
    plm_curl_ev *ev = userp;
    plm_curl_ev_sock *s = socketp;
    if (what == CURL_POLL_REMOVE) {
        if (s) {
            curl_multi_assign(ev->multi, fd, NULL);
            sock_forget(ev, s);
        }
        return 0;
    }
    int kind = (what & CURL_POLL_IN ? EV_READ : 0) | (what & CURL_POLL_OUT ? EV_WRITE : 0);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s)
            return -1;
        s->ev = ev;
        s->next = ev->socks;
        if (ev->socks)
            ev->socks->prev = s;
        ev->socks = s;
        curl_multi_assign(ev->multi, fd, s);
    } else {
        ev_io_stop(ev->loop, &s->io);
    }
    ev_io_init(&s->io, io_cb, fd, kind);
    s->io.data = s;
    ev_io_start(ev->loop, &s->io);
    return 0;
}

static int multi_timer_cb(CURLM *m, long timeout_ms, void *userp)
{
    plm_curl_ev *ev = userp;
    ev_timer_stop(ev->loop, &ev->timer);
    if (timeout_ms >= 0) {
        /* Never call curl from here, even for 0: arm a timer and let the loop do it.
         * / 1000.0, not / 1000: the example's integer division turns 999 ms into 0. */
        ev_timer_set(&ev->timer, timeout_ms / 1000.0, 0.);
        ev_timer_start(ev->loop, &ev->timer);
    }
    return 0;
}

/* ---------------------------------------------------------------- the driver */

int plm_curl_ev_init(plm_curl_ev *ev, struct ev_loop *loop, void (*drain)(void *ud), void *ud)
{
    memset(ev, 0, sizeof *ev);
    ev->loop = loop;
    ev->drain = drain;
    ev->ud = ud;
    ev_timer_init(&ev->timer, timer_cb, 0., 0.);
    ev->timer.data = ev;
    ev->multi = curl_multi_init();
    if (!ev->multi)
        return -1;
    curl_multi_setopt(ev->multi, CURLMOPT_SOCKETFUNCTION, sock_cb);
    curl_multi_setopt(ev->multi, CURLMOPT_SOCKETDATA, ev);
    curl_multi_setopt(ev->multi, CURLMOPT_TIMERFUNCTION, multi_timer_cb);
    curl_multi_setopt(ev->multi, CURLMOPT_TIMERDATA, ev);
    /* libcurl's own bound is 4 x the transfers in flight, so it shrinks as they end
     * and closes connections the next burst opens again: at 100 concurrent turns of
     * `berth serve` on a loopback sandboxd, 3 calls in 10 came on a new connection
     * (606-645 connects for 2 000 turns; 100 with this bound, and sandboxd's CPU per
     * cell 70-80 -> 60-63 us, bench/serve_load). */
    curl_multi_setopt(ev->multi, CURLMOPT_MAXCONNECTS, (long)PLM_CURL_EV_MAX_CONNECTS);
    return 0;
}

void plm_curl_ev_fini(plm_curl_ev *ev)
{
    if (ev->multi)
        curl_multi_cleanup(ev->multi); /* closes cached connections (REMOVE through sock_cb) */
    ev->multi = NULL;
    while (ev->socks) /* any curl did not remove: stop before anything leaks */
        sock_forget(ev, ev->socks);
    ev_timer_stop(ev->loop, &ev->timer);
}

void *plm_curl_ev_next_done(plm_curl_ev *ev, CURLcode *rc)
{
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(ev->multi, &left))) {
        if (msg->msg != CURLMSG_DONE)
            continue;
        char *priv = NULL;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &priv);
        *rc = msg->data.result;
        curl_multi_remove_handle(ev->multi, msg->easy_handle); /* msg is gone after this */
        return priv;
    }
    return NULL;
}

void plm_curl_ev_hold(plm_curl_ev *ev)
{
    ev->dispatching++;
}

bool plm_curl_ev_release(plm_curl_ev *ev)
{
    return --ev->dispatching == 0 && ev->free_pending;
}

bool plm_curl_ev_defer_free(plm_curl_ev *ev)
{
    if (ev->dispatching)
        ev->free_pending = true;
    return ev->dispatching != 0;
}

/* ---------------------------------------------------------------- easy handles */

void plm_curl_ev_post_opts(CURL *e, const char *url, const char *body, size_t len,
                           struct curl_slist *headers, curl_write_callback write_cb,
                           curl_write_callback header_cb, void *ud, char *errbuf)
{
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, write_cb);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, ud);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, header_cb);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, ud);
    curl_easy_setopt(e, CURLOPT_PRIVATE, ud);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L); /* a redirect is an error, never followed */
}

bool plm_curl_ev_header(const char *line, size_t n, size_t *name_len, const char **value,
                        size_t *value_len)
{
    const char *colon = memchr(line, ':', n);
    if (!colon)
        return false;
    const char *v = colon + 1, *end = line + n;
    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ' || end[-1] == '\t'))
        end--;
    *name_len = (size_t)(colon - line);
    *value = v;
    *value_len = (size_t)(end - v);
    return true;
}

/*
 * curl_ev.h — one libcurl multi handle driven by a libev loop (the shape of curl's
 * evhiperfifo example), shared by libplimsoll's transport (transport.c) and berth's
 * model-provider client (runtime/models/http.c).  Internal: not part of plimsoll.h, not
 * installed.
 *
 * Pitfalls this driver is written around (docs/architecture.md §4.1):
 *  - curl is never called from its own callbacks: a timeout, even of 0, arms an
 *    ev_timer and the loop calls curl;
 *  - curl's timeout is converted with / 1000.0 (the example divides integers);
 *  - the socket callback tolerates unknown or already-removed sockets and
 *    re-initialises the ev_io on every registration, because fd numbers are reused;
 *    watchers curl never removed are stopped when the driver ends;
 *  - after each curl_multi_socket_action the owner's `drain` runs, from the loop and
 *    outside every libcurl callback: that is where it takes finished transfers
 *    (plm_curl_ev_next_done) and calls its own callers, between plm_curl_ev_hold and
 *    plm_curl_ev_release, so that a caller freeing the owner from there is deferred.
 */
#ifndef PLIMSOLL_CURL_EV_H
#define PLIMSOLL_CURL_EV_H

#include <curl/curl.h>
#include <ev.h>
#include <stdbool.h>
#include <stddef.h>

/* Idle connections the multi handle keeps for reuse, whatever number of transfers is in
 * flight now.  A connection is still reused only while young enough (the owner's
 * CURLOPT_MAXAGE_CONN). */
#define PLM_CURL_EV_MAX_CONNECTS 256

typedef struct plm_curl_ev_sock plm_curl_ev_sock;

typedef struct plm_curl_ev {
    struct ev_loop *loop;
    CURLM *multi;
    ev_timer timer;             /* curl's own timeout */
    plm_curl_ev_sock *socks;    /* ev_io watchers curl asked for */
    void (*drain)(void *ud);    /* after every curl_multi_socket_action */
    void *ud;
    int dispatching;            /* > 0 while callbacks run: defer the owner's free */
    bool free_pending;          /* the owner's free was asked for meanwhile */
} plm_curl_ev;

/* Makes the multi handle and hooks it to `loop`; -1 when curl cannot. */
int plm_curl_ev_init(plm_curl_ev *ev, struct ev_loop *loop, void (*drain)(void *ud), void *ud);
/* Cleans up the multi handle (remove every easy handle first) and stops every
 * watcher.  Safe after a failed init. */
void plm_curl_ev_fini(plm_curl_ev *ev);

/* Takes the next finished transfer off the multi handle (it is removed from it): its
 * CURLOPT_PRIVATE, and its result in *rc.  NULL when there is none. */
void *plm_curl_ev_next_done(plm_curl_ev *ev, CURLcode *rc);

/* The reentrancy guard around the owner's callbacks to its callers. */
void plm_curl_ev_hold(plm_curl_ev *ev);
/* Ends a hold: true when it was the outermost and a free was deferred meanwhile, so
 * the owner must free itself now (and touch nothing after). */
bool plm_curl_ev_release(plm_curl_ev *ev);
/* First thing in the owner's free: true (the free is remembered, return at once) when
 * called from inside a hold. */
bool plm_curl_ev_defer_free(plm_curl_ev *ev);

/* The options every POST on the driver sets: the URL, the body (not copied) and its
 * length, the header list, the write and header callbacks with `ud` (also set as
 * CURLOPT_PRIVATE, what plm_curl_ev_next_done returns), curl's error text into
 * `errbuf` (CURL_ERROR_SIZE bytes), http(s) only, no signals and no redirects. */
void plm_curl_ev_post_opts(CURL *e, const char *url, const char *body, size_t len,
                           struct curl_slist *headers, curl_write_callback write_cb,
                           curl_write_callback header_cb, void *ud, char *errbuf);

/* One header line as libcurl hands it (n bytes, not NUL-terminated): false when it has
 * no colon; else the name's length and the value without the blanks around it and the
 * line end. */
bool plm_curl_ev_header(const char *line, size_t n, size_t *name_len, const char **value,
                        size_t *value_len);

#endif

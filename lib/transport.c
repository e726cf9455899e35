/*
 * transport.c — one Connect unary exchange at a time per easy handle, many at once on
 * one libcurl multi handle driven by libev (curl_ev.c, the shape of curl's evhiperfifo
 * example).
 *
 * Pitfalls this file is written around (docs/architecture.md §4.1):
 *  - completions are collected from curl_multi_info_read after curl_multi_socket_action
 *    returns, and only then handed to callers: a caller may start another exchange from
 *    its callback, which must never happen inside a libcurl callback;
 *  - the socket and timer rules (fd reuse, / 1000.0) are curl_ev.c's;
 *  - cancellation only marks the exchange and arms a zero timer; removal happens there;
 *  - a request is sent at most once (prereq_cb, open_socket_cb, CURLOPT_MAXAGE_CONN).
 */
#include "curl_ev.h"
#include "internal.h"
#include "random.h"

#include <curl/curl.h>
#include <errno.h>
#include <ev.h>
#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#define X509_DEPTH_ZERO_SELF_SIGNED 18  /* X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT */
#define RECV_BUFFER (64L * 1024)        /* CURLOPT_BUFFERSIZE: see plm_http_post */

typedef struct xfer xfer;

struct plm_http {
    plm_curl_ev ev;             /* the multi handle on the loop (curl_ev.h) */
    ev_timer reap;              /* zero-delay: completes cancelled exchanges */
    xfer *inflight;
    CURL *spare[8];             /* easy handles of finished exchanges, for the next */
    int n_spare;
    char *base_url, *ca_file;
    struct curl_slist *fixed;   /* the headers every request sends (the bearer's last) */
    long timeout_ms;
    bool loopback;
    /* Each procedure's URL, parsed once (procedure_url): libcurl parses a URL given
     * as text again at every transfer, 15 000 instructions of its ~100 000 a call. */
    struct procedure_url {
        char *method, *text;
        CURLU *parsed;          /* NULL: libcurl refused it (it says so at the transfer) */
    } *urls;
    size_t n_urls;
};

struct xfer {
    plm_http *h;
    CURL *easy;
    /* This request's id header, ahead of the fixed ones: only it is built per call. */
    struct curl_slist id_node;
    char id_header[64];
    char *req_body;
    const char *method;
    char *buf;
    size_t len, cap;
    bool too_large;
    int id_count;               /* Plimsoll-Request-Id values seen in the final answer */
    bool head_done;             /* the final answer's blank line ending its headers came */
    char id_seen[40];
    plm_refusal mark;
    char errbuf[CURL_ERROR_SIZE];
    plm_exchange_cb cb;
    void *ud;
    plm_listener cancel_l;
    bool canceled;
    int attempts;               /* request sends; a second one is curl's own retry */
    long long started_us;       /* when the call started: the request deadline runs from here */
    CURLcode rc;                /* the transfer's result, between detach and dispatch */
    xfer *prev, *next;
    plm_exchange x;
};

/* ---------------------------------------------------------------- curl callbacks */

static size_t write_cb(char *ptr, size_t size, size_t nmemb, void *ud)
{
    xfer *t = ud;
    size_t n = size * nmemb;
    if (t->len + n > PLM_MAX_ANSWER_BYTES) {
        t->too_large = true;
        return 0; /* aborts the transfer with CURLE_WRITE_ERROR */
    }
    size_t need = t->len + n + 1 + PLM_JSON_PADDING; /* the reader's padding */
    if (need > t->cap) {
        size_t cap = t->cap ? t->cap : 4096;
        while (cap < need)
            cap *= 2;
        char *nb = realloc(t->buf, cap);
        if (!nb)
            return 0;
        t->buf = nb;
        t->cap = cap;
    }
    memcpy(t->buf + t->len, ptr, n);
    t->len += n;
    t->buf[t->len] = '\0';
    return n;
}

static size_t header_cb(char *line, size_t size, size_t nmemb, void *ud)
{
    xfer *t = ud;
    size_t n = size * nmemb;
    if (n >= 5 && strncmp(line, "HTTP/", 5) == 0) {
        /* A new status line (after 1xx): only the final answer's headers count. */
        t->id_count = 0;
        t->mark = PLM_REFUSAL_NONE;
        t->head_done = false;
        return n;
    }
    if ((n == 2 && line[0] == '\r' && line[1] == '\n') || (n == 1 && line[0] == '\n')) {
        t->head_done = true;
        return n;
    }
    size_t name_len, vlen;
    const char *v;
    if (!plm_curl_ev_header(line, n, &name_len, &v, &vlen))
        return n;
    if (name_len == 19 && strncasecmp(line, "Plimsoll-Request-Id", 19) == 0) {
        /* Two values, or two joined by a proxy, never match. */
        t->id_count += memchr(v, ',', vlen) ? 2 : 1;
        if (vlen < sizeof t->id_seen) {
            memcpy(t->id_seen, v, vlen);
            t->id_seen[vlen] = '\0';
        } else {
            t->id_seen[0] = '\0';
        }
    } else if (name_len == 23 && strncasecmp(line, "Plimsoll-Not-Dispatched", 23) == 0) {
        t->mark = PLM_REFUSAL_NONE;
        for (int r = PLM_REFUSAL_REQUEST; r <= PLM_REFUSAL_ENVIRONMENT; r++) {
            const char *name = plm_refusal_name((plm_refusal)r);
            if (strlen(name) == vlen && strncmp(name, v, vlen) == 0)
                t->mark = (plm_refusal)r;
        }
    }
    return n;
}

/* libcurl re-sends a request whose reused connection died before any answer byte
 * ("connection died, retrying a fresh connect").  The first send may have reached the
 * daemon and run, so a second send would run a call twice: refuse it.  The exchange
 * then fails as "may have run", which is the truth. */
static int prereq_cb(void *ud, char *conn_primary_ip, char *conn_local_ip, int conn_primary_port,
                     int conn_local_port)
{
    xfer *t = ud;
    return ++t->attempts > 1 ? CURL_PREREQFUNC_ABORT : CURL_PREREQFUNC_OK;
}

/* A transfer that already sent its request gets no second connection: the retry it
 * would carry could run the call twice (see prereq_cb). */
static curl_socket_t open_socket_cb(void *ud, curlsocktype purpose, struct curl_sockaddr *a)
{
    xfer *t = ud;
    if (t->attempts > 0)
        return CURL_SOCKET_BAD;
    return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

/* ---------------------------------------------------------------- completion */

static long long mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void unlink_xfer(plm_http *h, xfer *t)
{
    if (t->prev)
        t->prev->next = t->next;
    else if (h->inflight == t)
        h->inflight = t->next;
    if (t->next)
        t->next->prev = t->prev;
    t->prev = t->next = NULL;
}

static void xfer_free(xfer *t)
{
    plm_cancel_unlisten(&t->cancel_l);
    /* A spare keeps its options (not curl_easy_reset: 6 600 instructions a call): the
     * next exchange sets every one of them again, the same set each time, before its
     * transfer starts (but CURLOPT_NOPROXY, the same for every exchange of a transport,
     * set once).  Meanwhile the pointers they hold (this body, this header
     * node) dangle unread. */
    if (t->easy && t->h->n_spare < (int)PLM_ARRAY_LEN(t->h->spare))
        t->h->spare[t->h->n_spare++] = t->easy;
    else if (t->easy)
        curl_easy_cleanup(t->easy);
    free(t->req_body);
    free(t->buf);
    plm_error_free(t->x.transport_err);
    free(t);
}

/* Why an exchange read no answer (docs/client.md §2.2 steps 6–7).  Only failures proven to
 * happen before any request byte left are marked `environment`. */
static plm_error *classify(xfer *t, CURLcode rc)
{
    const char *m = t->method;
    const char *why = t->errbuf[0] ? t->errbuf : curl_easy_strerror(rc);
    plm_error *e;
    long oserr = 0, verify = 0;
    curl_easy_getinfo(t->easy, CURLINFO_OS_ERRNO, &oserr);
    curl_easy_getinfo(t->easy, CURLINFO_SSL_VERIFYRESULT, &verify);
    if (t->canceled) {
        e = plm_err_new(PLM_CANCELED, PLM_REFUSAL_NONE,
                        "plimsoll: %s: cancelled during the exchange; the call may have run", m);
    } else if (rc == CURLE_OPERATION_TIMEDOUT ||
               mono_us() - t->started_us >= (long long)t->h->timeout_ms * 1000) {
        /* A failure reported once the request deadline has passed is the deadline's, even
         * one proven to come before sending (a refused connect): docs/client.md §2.2 step 6. */
        e = plm_err_new(PLM_DEADLINE_EXCEEDED, PLM_REFUSAL_NONE,
                        "plimsoll: %s: no complete answer within %ld ms; the call may have run",
                        m, t->h->timeout_ms);
    } else if (t->attempts > 1 || (t->attempts == 1 && rc == CURLE_COULDNT_CONNECT)) {
        /* Sent once, then curl tried again on a fresh connection: whatever that second
         * attempt met, the first may have run. */
        e = plm_err_new(PLM_UNAVAILABLE, PLM_REFUSAL_NONE,
                        "plimsoll: %s: the connection to %s closed before an answer; the call "
                        "may have run, and it is not sent again", m, t->h->base_url);
    } else if (rc == CURLE_WRITE_ERROR && t->too_large) {
        e = plm_err_new(PLM_RESOURCE_EXHAUSTED, PLM_REFUSAL_NONE,
                        "plimsoll: %s: the answer is larger than %u bytes; the call may have run",
                        m, PLM_MAX_ANSWER_BYTES);
    } else if (t->attempts == 0 &&
               ((rc == CURLE_COULDNT_CONNECT && oserr == ECONNREFUSED) ||
               (rc == CURLE_SSL_CONNECT_ERROR && strstr(why, "wrong version number")) ||
                (rc == CURLE_PEER_FAILED_VERIFICATION && verify == X509_DEPTH_ZERO_SELF_SIGNED))) {
        /* Only these are proven to fail before any byte of the request left, and only
         * when no earlier attempt of this exchange was sent. */
        e = plm_err_new(PLM_UNAVAILABLE, PLM_REFUSAL_ENVIRONMENT,
                        "plimsoll: %s: cannot reach the daemon at %s (%s); nothing was sent",
                        m, t->h->base_url, why);
    } else {
        e = plm_err_new(PLM_UNAVAILABLE, PLM_REFUSAL_NONE,
                        "plimsoll: %s: the exchange with %s failed (%s); the call may have run",
                        m, t->h->base_url, why);
    }
    if (e)
        e->cause = plm_printf("curl: %s", why);
    return e;
}

static void complete(xfer *t, CURLcode rc)
{
    plm_http *h = t->h;
    if (!t->canceled && rc == CURLE_OK && !t->head_done) {
        /* libcurl takes an EOF inside the header block as its end: not an answer. */
        t->x.transport_err = plm_err_new(PLM_UNAVAILABLE, PLM_REFUSAL_NONE,
                                         "plimsoll: %s: the connection to %s closed inside the "
                                         "answer's headers; the call may have run",
                                         t->method, h->base_url);
    } else if (t->canceled || rc != CURLE_OK) {
        t->x.transport_err = classify(t, rc);
    } else {
        curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &t->x.status);
        t->x.body = t->buf ? t->buf : "";
        t->x.body_len = t->len;
        t->x.bound = t->id_count == 1 && strcmp(t->id_seen, t->x.request_id) == 0;
        t->x.header_mark = t->mark;
    }
    plm_curl_ev_hold(&h->ev);
    t->cb(t->ud, &t->x);
    plm_curl_ev_release(&h->ev); /* never the outermost hold: the caller frees */
    xfer_free(t);
}

/* The driver's drain, after every curl_multi_socket_action. */
static void check_multi_info(void *ud)
{
    plm_http *h = ud;
    /* Detach every finished exchange first, then run callbacks: a callback may add
     * new handles, which must not interleave with curl_multi_info_read. */
    xfer *done = NULL, **tail = &done, *t;
    CURLcode rc;
    while ((t = plm_curl_ev_next_done(&h->ev, &rc))) {
        unlink_xfer(h, t);
        t->rc = rc;
        *tail = t;
        tail = &t->next;
    }
    plm_curl_ev_hold(&h->ev);
    while (done) {
        t = done;
        done = t->next;
        t->next = NULL;
        complete(t, t->rc);
    }
    if (plm_curl_ev_release(&h->ev))
        plm_http_free(h);
}

static void reap_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    plm_http *h = w->data;
    plm_curl_ev_hold(&h->ev);
    for (xfer *t = h->inflight, *next; t; t = next) {
        next = t->next;
        if (!t->canceled)
            continue;
        curl_multi_remove_handle(h->ev.multi, t->easy);
        unlink_xfer(h, t);
        complete(t, CURLE_ABORTED_BY_CALLBACK);
        next = h->inflight; /* callbacks may have changed the list: rescan */
    }
    if (plm_curl_ev_release(&h->ev))
        plm_http_free(h);
}

static void on_cancel(plm_listener *l)
{
    xfer *t = (xfer *)((char *)l - offsetof(xfer, cancel_l));
    t->canceled = true;
    ev_timer_start(t->h->ev.loop, &t->h->reap);
}

/* ---------------------------------------------------------------- public */

plm_http *plm_http_new(struct ev_loop *loop, const plm_http_config *cfg)
{
    plm_http *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    int rc = plm_curl_ev_init(&h->ev, loop, check_multi_info, h);
    ev_timer_init(&h->reap, reap_cb, 0., 0.);
    h->reap.data = h;
    h->timeout_ms = cfg->timeout_ms;
    h->loopback = cfg->loopback;
    h->base_url = strdup(cfg->base_url);
    h->ca_file = plm_strdup(cfg->ca_file);
    /* The bearer's header exists once, in this list, cleansed when it is freed. */
    char *auth = cfg->token && *cfg->token ? plm_printf("Authorization: Bearer %s", cfg->token)
                                           : NULL;
    const char *headers[] = {"Content-Type: application/json", "Connect-Protocol-Version: 1",
                             "Expect:", /* no 100-continue round trip */
                             auth};
    bool headers_ok = !(cfg->token && *cfg->token && !auth);
    for (size_t i = 0; headers_ok && i < PLM_ARRAY_LEN(headers) && headers[i]; i++) {
        struct curl_slist *l = curl_slist_append(h->fixed, headers[i]);
        headers_ok = l != NULL;
        h->fixed = l ? l : h->fixed;
    }
    if (auth) {
        OPENSSL_cleanse(auth, strlen(auth));
        free(auth);
    }
    if (!h->base_url || rc != 0 || !headers_ok) {
        plm_http_free(h);
        return NULL;
    }
    return h;
}

void plm_http_free(plm_http *h)
{
    if (!h)
        return;
    if (plm_curl_ev_defer_free(&h->ev))
        return;
    plm_curl_ev_hold(&h->ev); /* a callback's plm_http_free waits, then is moot */
    while (h->inflight) {
        xfer *t = h->inflight;
        curl_multi_remove_handle(h->ev.multi, t->easy);
        unlink_xfer(h, t);
        t->canceled = true;
        complete(t, CURLE_ABORTED_BY_CALLBACK);
    }
    plm_curl_ev_release(&h->ev);
    ev_timer_stop(h->ev.loop, &h->reap);
    plm_curl_ev_fini(&h->ev); /* removes remaining sockets */
    while (h->n_spare)
        curl_easy_cleanup(h->spare[--h->n_spare]);
    for (size_t i = 0; i < h->n_urls; i++) {
        free(h->urls[i].method);
        free(h->urls[i].text);
        curl_url_cleanup(h->urls[i].parsed);
    }
    free(h->urls);
    free(h->base_url);
    for (struct curl_slist *l = h->fixed; l; l = l->next) /* one holds the bearer */
        OPENSSL_cleanse(l->data, strlen(l->data));
    curl_slist_free_all(h->fixed);
    free(h->ca_file);
    free(h);
}

static void new_request_id(char out[33])
{
    unsigned char b[16];
    if (!plm_random_bytes(b, sizeof b))
        abort(); /* no randomness: refusing to run beats reusing ids */
    plm_hex_encode(b, sizeof b, out);
}

/* The URL of a procedure (one entry per procedure the client calls, kept until the
 * transport is freed), parsed once for CURLOPT_CURLU: libcurl then copies the parsed
 * parts, read only, where it would parse the text again; NULL when out of memory. */
static const struct procedure_url *procedure_url(plm_http *h, const char *method)
{
    for (size_t i = 0; i < h->n_urls; i++)
        if (strcmp(h->urls[i].method, method) == 0)
            return &h->urls[i];
    struct procedure_url *grown = realloc(h->urls, (h->n_urls + 1) * sizeof *grown);
    if (!grown)
        return NULL;
    h->urls = grown;
    struct procedure_url *p = &h->urls[h->n_urls];
    p->method = strdup(method);
    p->text = plm_printf("%s/plimsoll.v1.SandboxService/%s", h->base_url, method);
    p->parsed = p->text ? curl_url() : NULL;
    if (p->parsed && curl_url_set(p->parsed, CURLUPART_URL, p->text, 0) != CURLUE_OK) {
        curl_url_cleanup(p->parsed);
        p->parsed = NULL;
    }
    if (!p->method || !p->text) {
        free(p->method);
        free(p->text);
        curl_url_cleanup(p->parsed);
        return NULL;
    }
    h->n_urls++;
    return p;
}

int plm_http_post(plm_http *h, const char *method, char *body, size_t len, plm_cancel *cancel,
                  plm_exchange_cb cb, void *ud)
{
    xfer *t = calloc(1, sizeof *t);
    if (!t) {
        free(body);
        return -1;
    }
    t->h = h;
    t->method = method;
    t->req_body = body;
    t->cb = cb;
    t->ud = ud;
    t->mark = PLM_REFUSAL_NONE;
    t->started_us = mono_us();
    new_request_id(t->x.request_id);
    const struct procedure_url *url = procedure_url(h, method);
    snprintf(t->id_header, sizeof t->id_header, "Plimsoll-Request-Id: %s", t->x.request_id);
    t->id_node.data = t->id_header;
    t->id_node.next = h->fixed;
    bool fresh = h->n_spare == 0;   /* a spare has this transport's options already */
    t->easy = fresh ? curl_easy_init() : h->spare[--h->n_spare];
    if (!url || !t->easy)
        goto fail;
    CURL *e = t->easy;
    plm_curl_ev_post_opts(e, url->text, body, len, &t->id_node, write_cb, header_cb, t,
                          t->errbuf);
    curl_easy_setopt(e, CURLOPT_CURLU, url->parsed);   /* NULL (refused): the text alone */
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, h->timeout_ms);
    curl_easy_setopt(e, CURLOPT_PREREQFUNCTION, prereq_cb);
    curl_easy_setopt(e, CURLOPT_PREREQDATA, t);
    curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, open_socket_cb);
    curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, t);
    /* Reuse only connections idle for under 5 s: an older one is likelier to have been
     * closed by the server, and a request lost that way cannot be sent again. */
    curl_easy_setopt(e, CURLOPT_MAXAGE_CONN, 5L);
    if (h->ca_file)
        curl_easy_setopt(e, CURLOPT_CAINFO, h->ca_file);
    if (fresh) {
        /* A daemon on loopback is reached directly, whatever http_proxy or all_proxy
         * say: a proxy cannot reach this machine's loopback, and the bearer would cross
         * the network in cleartext to get there.  (A remote https daemon may go through
         * one: the tunnel keeps TLS end to end.) */
        if (h->loopback)
            curl_easy_setopt(e, CURLOPT_NOPROXY, "*");
        /* Receive in 64 KiB reads, not libcurl's 16 KiB: a 32 KiB cell's answer then
         * comes in one recv, and libcurl 7.88 polls the socket after each read (3 recv
         * and 4 poll a call before, 1 and 2 after; client CPU 119 -> 111 us,
         * bench/client).  Spares keep their buffer: at most 9 x 64 KiB a client. */
        curl_easy_setopt(e, CURLOPT_BUFFERSIZE, RECV_BUFFER);
    }
    if (curl_multi_add_handle(h->ev.multi, e) != CURLM_OK)
        goto fail;
    t->next = h->inflight;
    if (h->inflight)
        h->inflight->prev = t;
    h->inflight = t;
    t->cancel_l.fn = on_cancel;
    plm_cancel_listen(cancel, &t->cancel_l);
    return 0;
fail:
    xfer_free(t);
    return -1;
}

/*
 * http.c — libmicrohttpd on libev.
 *
 * Connections come from the listener (listener.h), which turns TLS handshakes away.
 * MHD runs on the loop as httpd/mhd_ev.h says.  A call whose answer is not ready when
 * its handler returns is suspended; answering it later stores the response, resumes
 * the connection and kicks MHD (httpd_mhd_kick: never MHD_run from inside an MHD
 * callback, where a resume can happen too), and MHD calls the access handler again,
 * which queues the response.
 *
 * A call has two owners: MHD (until its request-completed notice) and the handler
 * (until it answers).  Whichever lets go last frees it, so a provider that answers
 * after its connection died never touches freed memory.
 *
 * Connections are bounded by a guard (connguard.h): one that has sent no request
 * that passed the checks below (an authenticated one) within --header-timeout-ms is
 * closed, and past --max-connections the oldest such is closed for the newcomer, so a
 * flood of idle connections locks no caller out and never cuts a call in progress.
 */
#include "http.h"

#include "config.h"
#include "json_text.h"
#include "connguard.h"
#include "head.h"
#include "listener.h"
#include "mhd_ev.h"
#include "tokens.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define REQUEST_ID_HEADER "Plimsoll-Request-Id"
#define NOT_DISPATCHED_HEADER "Plimsoll-Not-Dispatched"

struct sbx_http {
    struct ev_loop *loop;
    const sbx_config *cfg;
    const sbx_route *routes;
    size_t n_routes;
    void *app;
    struct MHD_Daemon *daemon;
    sbx_listener *listener;
    connguard *guard;
    uint64_t refused_conns;        /* MHD_add_connection failures not logged yet */
    ev_tstamp refused_logged_at;
    unsigned port;
    httpd_mhd mhd;                 /* MHD on the loop (mhd_ev.h) */
    plm_json_reader *reader;       /* the bodies' (json_text.h) */
    bool quiesced;
    size_t active;                 /* calls MHD still holds (answer not sent yet) */
    void (*idle_cb)(void *ud);
    void *idle_ud;
};

struct sbx_call {
    sbx_http *h;
    struct MHD_Connection *conn;   /* NULL once MHD is done with the request */
    const sbx_route *route;
    int refs;
    bool dispatched;               /* the handler has it (until it answers) */
    bool answered;                 /* `response` is the answer (NULL: could not build one) */
    bool suspended;
    int64_t started_ms;
    char request_id[33];           /* "" unless exactly one well-formed value came */
    char principal[65];
    char *body;
    size_t len, cap;
    bool too_large;
    size_t discarded;              /* bytes dropped after the cap (chunked bodies) */
    json_t *json;
    struct MHD_Response *response; /* ready to queue */
    unsigned status;
};

/* ---------------------------------------------------------------- calls */

static void call_unref(sbx_call *c)
{
    if (--c->refs > 0)
        return;
    if (c->response)
        MHD_destroy_response(c->response);
    free(c->body);
    json_decref(c->json);
    free(c);
}

const json_t *sbx_call_body(const sbx_call *c)
{
    return c->json;
}

const char *sbx_call_principal(const sbx_call *c)
{
    return c->principal;
}

int64_t sbx_call_started_ms(const sbx_call *c)
{
    return c->started_ms;
}

/* MHD watches no suspended connection, so a caller that hung up while its call was
 * working is noticed only here: the peer's FIN (POLLRDHUP) or a reset.  A keep-alive
 * client sends nothing more until it has this answer, so readable data is no sign. */
bool sbx_call_caller_gone(const sbx_call *c)
{
    if (!c->conn)
        return true;
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!info)
        return false;
    struct pollfd p = {.fd = info->connect_fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* Headers every answer carries. */
static void common_headers(sbx_call *c, struct MHD_Response *r)
{
    if (c->request_id[0])
        MHD_add_response_header(r, REQUEST_ID_HEADER, c->request_id);
    if (c->h->quiesced) /* draining: let clients reconnect elsewhere */
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
}

static struct MHD_Response *json_response(sbx_call *c, json_t *body)
{
    char *text = plm_json_write(body, NULL);
    json_decref(body);
    if (!text)
        text = sbx_xstrdup("{\"code\":\"internal\",\"message\":\"cannot encode the answer\"}");
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return NULL;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    common_headers(c, r);
    return r;
}

static struct MHD_Response *error_response(sbx_call *c, const sbx_err *e, unsigned *status)
{
    struct MHD_Response *r = json_response(c, sbx_err_body(e));
    if (r && e->nd_header)
        MHD_add_response_header(r, NOT_DISPATCHED_HEADER, e->nd_header);
    if (r && e->http_status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "POST");
    if (r && e->http_status == MHD_HTTP_UNSUPPORTED_MEDIA_TYPE)
        MHD_add_response_header(r, "Accept-Post", "application/json");
    *status = e->http_status ? e->http_status : sbx_http_status(e->code);
    return r;
}

/* Stores the answer; resumes the connection if the handler answered late. */
static void call_answer(sbx_call *c, struct MHD_Response *r, unsigned status)
{
    if (!c->dispatched) { /* a programming error: answered twice */
        sbx_log("internal: a call was answered twice; the second answer is dropped");
        if (r)
            MHD_destroy_response(r);
        return;
    }
    c->dispatched = false;
    sbx_http *h = c->h;
    if (c->conn) {
        c->answered = true;
        c->response = r;
        c->status = status;
        if (c->suspended) {
            c->suspended = false;
            MHD_resume_connection(c->conn);
            httpd_mhd_kick(&h->mhd);
        }
    } else if (r) {
        MHD_destroy_response(r); /* the connection is gone: nobody to answer */
    }
    call_unref(c);
}

void sbx_call_reply_json(sbx_call *c, json_t *body)
{
    call_answer(c, json_response(c, body), MHD_HTTP_OK);
}

void sbx_call_reply_error(sbx_call *c, sbx_err *err)
{
    unsigned status = 500;
    struct MHD_Response *r = error_response(c, err, &status);
    sbx_err_free(err);
    call_answer(c, r, status);
}

void sbx_call_reply_empty(sbx_call *c, unsigned status)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (r)
        common_headers(c, r);
    call_answer(c, r, status);
}

/* ---------------------------------------------------------------- checks before dispatch */

struct id_scan {
    unsigned count;
    const char *value;
};

static enum MHD_Result scan_request_id(void *cls, enum MHD_ValueKind kind, const char *key,
                                       const char *value)
{
    (void)kind;
    struct id_scan *s = cls;
    if (key && strcasecmp(key, REQUEST_ID_HEADER) == 0) {
        s->count++;
        s->value = value;
    }
    return MHD_YES;
}

/* Echoed only when exactly one value of exactly 32 lowercase hex digits came. */
static void read_request_id(sbx_call *c)
{
    struct id_scan s = {0, NULL};
    MHD_get_connection_values(c->conn, MHD_HEADER_KIND, scan_request_id, &s);
    if (s.count != 1 || !s.value || strlen(s.value) != 32)
        return;
    for (size_t i = 0; i < 32; i++)
        if (!strchr("0123456789abcdef", s.value[i]) || s.value[i] == '\0')
            return;
    memcpy(c->request_id, s.value, 33);
}

/* application/json, with or without parameters ("; charset=utf-8"). */
static bool json_content_type(const char *ct)
{
    static const char want[] = "application/json";
    if (!ct)
        return false;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    if (strncasecmp(ct, want, sizeof want - 1) != 0)
        return false;
    ct += sizeof want - 1;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    return *ct == '\0' || *ct == ';';
}

/* Compares the token's SHA-256 with every configured one in constant time (no early
 * exit), so timing tells nothing about which token or how much of it matched. */
static bool authenticate(sbx_call *c)
{
    httpd_token_hash hash;
    if (!httpd_bearer_hash(MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND,
                                                       MHD_HTTP_HEADER_AUTHORIZATION), hash))
        return false;
    int found = 0;
    const sbx_config *cfg = c->h->cfg;
    for (size_t i = 0; i < cfg->n_tokens; i++)
        found |= CRYPTO_memcmp(hash, cfg->token_hashes[i], sizeof hash) == 0;
    if (found)
        plm_hex_encode(hash, sizeof hash, c->principal);
    OPENSSL_cleanse(hash, sizeof hash);
    return found;
}

static sbx_err *before_handler(sbx_err *e, const char *header)
{
    e->nd_header = header;
    return e;
}

/* Checks on the request line and headers, before any of the body is read. */
static sbx_err *check_headers(sbx_call *c, const char *url, const char *method,
                              const char *version)
{
    sbx_http *h = c->h;
    /* Before anything else: a head that would leave no room for the answer (head.h). */
    size_t head = httpd_head_bytes(c->conn, method, url, version);
    if (head > HTTPD_HEAD_MOST) {
        sbx_err *e = sbx_err_new(PLM_RESOURCE_EXHAUSTED, PLM_REFUSAL_NONE,
                                 "the request's head takes %zu bytes of a connection's "
                                 "memory, over this daemon's limit of %zu; nothing ran",
                                 head, HTTPD_HEAD_MOST);
        e->http_status = MHD_HTTP_REQUEST_HEADER_FIELDS_TOO_LARGE;
        return before_handler(e, "request");
    }
    for (size_t i = 0; i < h->n_routes && !c->route; i++)
        if (strcmp(url, h->routes[i].path) == 0)
            c->route = &h->routes[i];
    if (!c->route) { /* HTTP 404 as Connect's router answers, whatever the code maps to */
        sbx_err *e = sbx_err_new(PLM_UNIMPLEMENTED, PLM_REFUSAL_NONE,
                                 "no procedure at %.200s; nothing ran", url);
        e->http_status = MHD_HTTP_NOT_FOUND;
        return before_handler(e, "unsupported");
    }
    if (strcmp(method, MHD_HTTP_METHOD_POST) != 0) {
        sbx_err *e = sbx_err_new(PLM_UNIMPLEMENTED, PLM_REFUSAL_NONE,
                                 "%.200s takes POST, not %.20s; nothing ran", url, method);
        e->http_status = MHD_HTTP_METHOD_NOT_ALLOWED;
        return before_handler(e, "request");
    }
    if (h->quiesced)
        return sbx_err_new(PLM_UNAVAILABLE, PLM_REFUSAL_CAPACITY,
                           "the daemon is shutting down; nothing ran");
    if (c->route->rpc &&
        !json_content_type(MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND,
                                                       MHD_HTTP_HEADER_CONTENT_TYPE))) {
        sbx_err *e = sbx_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_NONE,
                                 "the body must be Content-Type application/json; nothing ran");
        e->http_status = MHD_HTTP_UNSUPPORTED_MEDIA_TYPE;
        return before_handler(e, "request");
    }
    const char *cl = MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(cl, &end, 10);
        if (errno == 0 && *end == '\0' && n > h->cfg->max_body_bytes)
            return before_handler(
                sbx_err_new(PLM_RESOURCE_EXHAUSTED, PLM_REFUSAL_NONE,
                            "the request body (%llu bytes) is over this daemon's limit of %zu "
                            "bytes; nothing ran", n, h->cfg->max_body_bytes),
                "request");
    }
    if (c->route->rpc && !authenticate(c))
        return sbx_err_new(PLM_UNAUTHENTICATED, PLM_REFUSAL_PERMISSION,
                           "this daemon needs Authorization: Bearer <token> with a token of "
                           "its token file; nothing ran");
    return NULL;
}

/* Keeps the body up to the cap.  Past it (a chunked body with no Content-Length) the
 * rest is dropped as it arrives, and a sender that keeps going for another cap's
 * worth is cut off: false closes the connection. */
static bool take_body(sbx_call *c, const char *data, size_t n)
{
    size_t max = c->h->cfg->max_body_bytes;
    if (!c->too_large && c->len + n > max) {
        c->too_large = true;
        c->discarded = c->len;
        free(c->body);
        c->body = NULL;
        c->len = c->cap = 0;
    }
    if (c->too_large) {
        c->discarded += n;
        return c->discarded <= 2 * max;
    }
    if (c->len + n > c->cap) {
        c->cap = c->len + n > 2 * c->cap ? c->len + n : 2 * c->cap;
        if (c->cap > max)
            c->cap = max;
        c->body = sbx_xrealloc(c->body, c->cap + 1 + PLM_JSON_PADDING); /* the reader's */
    }
    memcpy(c->body + c->len, data, n);
    c->len += n;
    return true;
}

/* The whole body is here: it must be one JSON object (an empty body is the empty
 * message, as in protobuf). */
static sbx_err *parse_body(sbx_call *c)
{
    if (c->too_large)
        return before_handler(sbx_err_new(PLM_RESOURCE_EXHAUSTED, PLM_REFUSAL_NONE,
                                          "the request body is over this daemon's limit of %zu "
                                          "bytes; nothing ran", c->h->cfg->max_body_bytes),
                              "request");
    if (!c->route->rpc)
        return NULL;
    if (c->len == 0) {
        c->json = json_object();
        return NULL;
    }
    /* Program output and code may hold NUL (\u0000); duplicate names are ambiguous. */
    c->json = plm_json_read(c->h->reader, c->body, c->len, PLM_JSON_REJECT_DUPLICATES);
    if (!c->json) {
        /* What is wrong and where, from jansson: a refused body is rare, and its
         * answer reads as it did before.  The one text jansson takes and the reader
         * refuses holds a raw U+0000 byte (json_text.h): that is named instead. */
        json_error_t jerr;
        json_t *v = json_loadb(c->body, c->len, JSON_ALLOW_NUL | JSON_DECODE_ANY |
                               JSON_REJECT_DUPLICATES, &jerr);
        bool raw_nul = v != NULL;
        json_decref(v);
        const char *nul = memchr(c->body, 0, c->len);
        return before_handler(sbx_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_NONE,
                                          "the body is not valid JSON (%s at byte %d); nothing ran",
                                          raw_nul ? "a raw U+0000 byte" : jerr.text,
                                          raw_nul && nul ? (int)(nul - c->body) : jerr.position),
                              "request");
    }
    if (!json_is_object(c->json))
        return before_handler(sbx_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_NONE,
                                          "the body is not a JSON object; nothing ran"),
                              "request");
    return NULL;
}

/* ---------------------------------------------------------------- MHD callbacks */

static enum MHD_Result queue(sbx_call *c)
{
    struct MHD_Response *r = c->response;
    c->response = NULL;
    if (!r) /* no answer could be built, or it is already queued: close the connection */
        return MHD_NO;
    enum MHD_Result ok = MHD_queue_response(c->conn, c->status, r);
    MHD_destroy_response(r);
    return ok;
}

/* An answer written before any handler: the call never reaches `dispatched`. */
static enum MHD_Result refuse_now(sbx_call *c, sbx_err *e)
{
    c->response = error_response(c, e, &c->status);
    sbx_log("refused %s before dispatch: %s %s", c->route ? c->route->path : "(no route)",
            plm_code_name(e->code), e->message);
    sbx_err_free(e);
    return queue(c);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    sbx_http *h = cls;
    sbx_call *c = *con_cls;
    if (!c) { /* headers are in, nothing of the body yet */
        c = sbx_xcalloc(1, sizeof *c);
        c->h = h;
        c->conn = conn;
        c->refs = 1; /* MHD's, dropped at the request-completed notice */
        c->started_ms = sbx_now_ms();
        h->active++;
        *con_cls = c;
        read_request_id(c);
        sbx_err *e = check_headers(c, url, method, version);
        if (e)
            return refuse_now(c, e);
        connguard_trust(conn); /* a known caller: only MHD's idle timeout from now on */
        return MHD_YES;
    }
    if (c->answered) /* after a resume (or a spurious call once answered) */
        return queue(c);
    if (*upload_data_size) {
        bool more = take_body(c, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return more ? MHD_YES : MHD_NO;
    }
    if (c->dispatched || c->suspended)
        return MHD_YES; /* spurious call while the handler works */
    sbx_err *e = parse_body(c);
    if (e)
        return refuse_now(c, e);
    c->dispatched = true;
    c->refs++; /* the handler's, dropped when it answers */
    c->route->handler(h->app, c);
    if (c->answered) /* answered right away */
        return queue(c);
    if (c->dispatched) { /* answered later: park the connection */
        c->suspended = true;
        MHD_suspend_connection(conn);
    }
    return MHD_YES;
}

/* The answer is sent (or the connection died): MHD lets go of the call. */
static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)conn;
    (void)toe;
    sbx_http *h = cls;
    sbx_call *c = *con_cls;
    *con_cls = NULL;
    if (!c)
        return;
    c->conn = NULL;
    c->suspended = false;
    call_unref(c);
    if (--h->active == 0 && h->idle_cb)
        h->idle_cb(h->idle_ud);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = '\0';
    /* A peer that hung up (or a connection the guard closed) is no event: one line per
     * connection would let a flood fill the log.  The guard logs a summary. */
    if (strstr(line, "detected connection closure") ||
        strstr(line, "reached connection limit")) /* counted in on_accepted */
        return;
    sbx_log("http: %s", line);
}

/* ---------------------------------------------------------------- life cycle */

static void on_guard_notice(void *ud, const char *line)
{
    (void)ud;
    sbx_log("http: %s", line);
}

/* A connection accepted (and sniffed) by the listener: MHD takes it from here. */
static void on_accepted(void *ud, int fd, const struct sockaddr *addr, socklen_t len)
{
    sbx_http *h = ud;
    /* The listener hands connections over in batches; connections the guard shut
     * meanwhile still count against MHD's limit until MHD_run reaps them. */
    if (connguard_unreaped(h->guard) >= 8)
        httpd_mhd_run(&h->mhd);
    /* On failure MHD closes the socket itself.  Logged once per 10 s at most: a flood
     * must not become a flood of log lines. */
    if (MHD_add_connection(h->daemon, fd, addr, len) != MHD_YES) {
        h->refused_conns++;
        if (ev_now(h->loop) - h->refused_logged_at >= 10.) {
            sbx_log("http: could not take %llu new connections (limit reached?)",
                    (unsigned long long)h->refused_conns);
            h->refused_conns = 0;
            h->refused_logged_at = ev_now(h->loop);
        }
    }
    httpd_mhd_kick(&h->mhd); /* external mode: MHD picks it up in MHD_run */
}

sbx_http *sbx_http_new(struct ev_loop *loop, const sbx_config *cfg, const sbx_route *routes,
                       size_t n_routes, void *app, char **why)
{
    sbx_http *h = sbx_xcalloc(1, sizeof *h);
    h->loop = loop;
    h->cfg = cfg;
    h->routes = routes;
    h->n_routes = n_routes;
    h->app = app;
    h->reader = plm_json_reader_new();
    if (!h->reader) {
        *why = sbx_xstrdup("out of memory");
        free(h);
        return NULL;
    }
    int listen_fd = sbx_listen_bind(cfg->listen_host, cfg->listen_port, &h->port, why);
    if (listen_fd < 0) {
        plm_json_reader_free(h->reader);
        free(h);
        return NULL;
    }
    /* Every connection is a descriptor: take all the kernel allows, and keep half of
     * them (by default) for the sandboxes. */
    unsigned long fds = connguard_raise_fd_limit();
    unsigned max_conns = cfg->max_connections ? cfg->max_connections
                                              : connguard_default_limit(fds);
    h->guard = connguard_new(loop, max_conns, cfg->header_timeout_ms / 1000.0);
    connguard_on_notice(h->guard, on_guard_notice, h);
    /* MHD gets no listening socket: the listener accepts and hands connections over. */
    h->daemon = MHD_start_daemon(
        MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ERROR_LOG,
        0, NULL, NULL, on_request, h,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h, /* first, so every message goes through it */
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
        MHD_OPTION_NOTIFY_CONNECTION, connguard_notify, h->guard,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)120,
        MHD_OPTION_CONNECTION_LIMIT, connguard_mhd_limit(h->guard),
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, HTTPD_POOL_BYTES,
        MHD_OPTION_END);
    if (!httpd_mhd_attach(&h->mhd, loop, h->daemon, why)) {
        if (h->daemon)
            MHD_stop_daemon(h->daemon);
        connguard_free(h->guard);
        close(listen_fd);
        plm_json_reader_free(h->reader);
        free(h);
        return NULL;
    }
    /* Connections yet to say their first byte wait in the listener: a quarter more. */
    size_t max_silent = max_conns / 4 > 16 ? max_conns / 4 : 16;
    h->listener = sbx_listener_new(loop, listen_fd, cfg->header_timeout_ms / 1000.0,
                                   max_silent, on_accepted, h);
    sbx_log("http: at most %u connections (descriptor limit %lu), %u ms to send an "
            "authenticated request, %u runs at once (%u per caller), %u sessions per caller",
            max_conns, fds, cfg->header_timeout_ms, cfg->max_runs, cfg->max_runs_per_caller,
            cfg->max_per_caller);
    return h;
}

unsigned sbx_http_port(const sbx_http *h)
{
    return h->port;
}

void sbx_http_quiesce(sbx_http *h)
{
    h->quiesced = true;
    sbx_listener_stop(h->listener);
}

size_t sbx_http_active(const sbx_http *h)
{
    return h->active;
}

void sbx_http_on_idle(sbx_http *h, void (*cb)(void *ud), void *ud)
{
    h->idle_cb = cb;
    h->idle_ud = ud;
}

void sbx_http_free(sbx_http *h)
{
    if (!h)
        return;
    httpd_mhd_detach(&h->mhd);
    sbx_listener_free(h->listener);
    MHD_stop_daemon(h->daemon); /* closes the connections, each with its completed notice */
    connguard_free(h->guard);
    plm_json_reader_free(h->reader);
    free(h);
}

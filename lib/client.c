/*
 * client.c — the client: construction rules for the base URL (docs/client.md §2.1), the
 * answer pipeline of one RPC (binding, redirects, Connect errors: §2.2, §4.3),
 * Describe, and single runs in a fresh sandbox (§2.5).
 */
#include "internal.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <ev.h>
#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>

#define NOT_BOUND_SUFFIX                                                                   \
    " (the answer does not carry this request's Plimsoll-Request-Id back (a daemon older " \
    "than protocol 3, or an intermediary that answered with another request's answer or "  \
    "dropped the header), so what it says about the call is ignored)"

void plm_global_init(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

void plm_client_options_init(plm_client_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->request_timeout_ms = PLM_DEFAULT_REQUEST_TIMEOUT_MS;
}

/* ---------------------------------------------------------------- construction */

static plm_error *bad_url(const char *why)
{
    return plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_NONE, "plimsoll: baseUrl %s", why);
}

bool plm_loopback_host(const char *host)
{
    struct in_addr a4;
    if (strcmp(host, "localhost") == 0 || strcmp(host, "::1") == 0 ||
        strcmp(host, "[::1]") == 0)
        return true;
    return strncmp(host, "127.", 4) == 0 && inet_pton(AF_INET, host, &a4) == 1;
}

static plm_error *check_base_url(const char *url, bool insecure, char **out, bool *loopback)
{
    *out = NULL;
    *loopback = false;
    if (!url || !*url)
        return bad_url("is required");
    size_t n = strlen(url);
    if (strchr(" \t\r\n\f\v", url[0]) || strchr(" \t\r\n\f\v", url[n - 1]))
        return bad_url("must not have surrounding whitespace");
    if (strpbrk(url, "?#"))
        return bad_url("must not carry a query or a fragment");
    CURLU *u = curl_url();
    char *scheme = NULL, *host = NULL, *user = NULL, *password = NULL;
    plm_error *e = NULL;
    if (!u || curl_url_set(u, CURLUPART_URL, url, CURLU_NON_SUPPORT_SCHEME) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK) {
        e = bad_url("is not an absolute URL");
    } else if (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0) {
        e = bad_url("must use http or https");
    } else if (curl_url_get(u, CURLUPART_USER, &user, 0) == CURLUE_OK ||
               curl_url_get(u, CURLUPART_PASSWORD, &password, 0) == CURLUE_OK) {
        e = bad_url("must not carry userinfo");
    } else if (strcmp(scheme, "http") == 0 && !insecure && !plm_loopback_host(host)) {
        e = bad_url("uses cleartext http to a non-loopback host; use https, or set "
                    "insecureHttp to allow it");
    }
    if (!e) {
        *loopback = plm_loopback_host(host);
        *out = strdup(url);
        size_t len = strlen(*out);
        while (len > 0 && (*out)[len - 1] == '/')
            (*out)[--len] = '\0';
    }
    curl_free(scheme);
    curl_free(host);
    curl_free(user);
    curl_free(password);
    curl_url_cleanup(u);
    return e;
}

plm_error *plm_client_new(struct ev_loop *loop, const plm_client_options *o, plm_client **out)
{
    if (!out)
        return plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_NONE,
                           "plimsoll: plm_client_new needs somewhere to put the client");
    *out = NULL;
    if (!o)
        return plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_NONE, "plimsoll: options are required");
    if (o->request_timeout_ms <= 0 || o->request_timeout_ms > 2147483647LL)
        return plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_NONE,
                           "plimsoll: requestTimeoutMs must be > 0 and <= 2^31-1 (got %lld)",
                           (long long)o->request_timeout_ms);
    char *base;
    bool loopback;
    plm_error *e = check_base_url(o->base_url, o->insecure_http, &base, &loopback);
    if (e)
        return e;
    plm_client *c = calloc(1, sizeof *c);
    if (!c) {
        free(base);
        return plm_err_new(PLM_INTERNAL, PLM_REFUSAL_NONE, "plimsoll: out of memory");
    }
    c->own_loop = loop == NULL;
    c->loop = loop ? loop : ev_loop_new(EVFLAG_AUTO);
    c->timeout_ms = (long)o->request_timeout_ms;
    c->token = plm_strdup(o->token && *o->token ? o->token : NULL);
    c->js_grant = plm_strdup(o->javascript_grant_profile);
    c->project_grant = plm_strdup(o->project_grant_profile);
    plm_http_config cfg = {base, c->token, o->ca_file, c->timeout_ms, loopback};
    c->http = c->loop ? plm_http_new(c->loop, &cfg) : NULL;
    c->reader = plm_json_reader_new();
    free(base);
    if (!c->http || !c->reader) {
        plm_client_free(c);
        return plm_err_new(PLM_INTERNAL, PLM_REFUSAL_NONE, "plimsoll: cannot set up the transport");
    }
    *out = c;
    return NULL;
}

void plm_client_free(plm_client *c)
{
    if (!c)
        return;
    plm_http_free(c->http);
    plm_json_reader_free(c->reader);
    if (c->own_loop && c->loop)
        ev_loop_destroy(c->loop);
    if (c->token) /* the bearer does not linger in freed memory */
        OPENSSL_cleanse(c->token, strlen(c->token));
    free(c->token);
    free(c->js_grant);
    free(c->project_grant);
    free(c);
}

struct ev_loop *plm_client_loop(plm_client *c)
{
    return c ? c->loop : NULL;
}

/* ---------------------------------------------------------------- one RPC */

typedef struct rpc {
    plm_client *c;
    const char *method;
    plm_rpc_cb cb;
    void *ud;
} rpc;

/* When a Connect error body has no code, the HTTP status decides (docs/wire.md §6.1). */
static plm_code code_from_status(long status)
{
    switch (status) {
    case 400: return PLM_INTERNAL;
    case 401: return PLM_UNAUTHENTICATED;
    case 403: return PLM_PERMISSION_DENIED;
    case 404: return PLM_UNIMPLEMENTED;
    case 429: case 502: case 503: case 504: return PLM_UNAVAILABLE;
    default: return PLM_UNKNOWN;
    }
}

/* docs/client.md §4.3. */
static plm_error *error_from_wire(const char *method, long status, json_t *body, bool bound,
                                  plm_refusal header_mark)
{
    if (!json_is_object(body))
        body = NULL;
    plm_code code = code_from_status(status);
    const json_t *cj = json_object_get(body, "code");
    if (cj && !(json_is_string(cj) && plm_code_parse(json_string_value(cj), &code)))
        code = PLM_UNKNOWN;
    const char *msg = json_string_value(json_object_get(body, "message"));
    char status_msg[32];
    snprintf(status_msg, sizeof status_msg, "HTTP %ld", status);
    if (!msg)
        msg = status_msg;
    if (!bound) {
        plm_error *e = plm_err_new(code, PLM_REFUSAL_NONE, "plimsoll: %s: %s%s", method, msg,
                                   NOT_BOUND_SUFFIX);
        if (e)
            e->answer_not_bound = true;
        return e;
    }
    plm_error *e = plm_err_new(code, PLM_REFUSAL_NONE, "plimsoll: %s: %s", method, msg);
    if (!e)
        return NULL;
    plm_details d;
    plm_details_parse(json_object_get(body, "details"), &d);
    if (d.has_not_dispatched)
        e->not_dispatched = d.reason;
    else if (header_mark != PLM_REFUSAL_NONE && header_mark != PLM_REFUSAL_UNKNOWN)
        e->not_dispatched = header_mark;
    if (d.has_session_ended) {
        e->session_ended = d.end;
        e->session_ended_detail = d.end_detail;
        d.end_detail = NULL;
    }
    if (e->not_dispatched == PLM_REFUSAL_NONE) {
        e->unanswered = d.unanswered; /* kept only when nothing says it did not run */
        d.unanswered = NULL;
    }
    plm_details_clear(&d);
    return e;
}

static void rpc_done(void *ud, plm_exchange *x)
{
    rpc *r = ud;
    plm_error *err = NULL;
    json_t *body = NULL;
    if (x->transport_err) {
        err = x->transport_err;
        x->transport_err = NULL;
    } else if (x->status >= 300 && x->status < 400) {
        err = plm_err_new(PLM_UNKNOWN, PLM_REFUSAL_NONE,
                          "plimsoll: %s: the daemon answered a redirect (HTTP %ld), which is never "
                          "followed; the call may have run", r->method, x->status);
    } else {
        /* An empty body is {}; a body that is not JSON is "no body". */
        body = x->body_len == 0 ? json_object() : plm_json_read(r->c->reader, x->body, x->body_len, 0);
        if (x->status < 200 || x->status >= 300) {
            err = error_from_wire(r->method, x->status, body, x->bound, x->header_mark);
        } else if (!x->bound) {
            err = plm_err_new(PLM_DATA_LOSS, PLM_REFUSAL_NONE,
                              "plimsoll: %s: the answer does not carry this request's "
                              "Plimsoll-Request-Id back (a daemon older than protocol 3, or an "
                              "intermediary that answered with another request's answer or dropped "
                              "the header); the call may have run", r->method);
            if (err)
                err->answer_not_bound = true;
        } else if (!json_is_object(body)) {
            err = plm_err_new(PLM_INTERNAL, PLM_REFUSAL_NONE,
                              "plimsoll: %s: the daemon's answer is not a JSON message", r->method);
        }
    }
    if (!err && !body)
        err = plm_err_new(PLM_INTERNAL, PLM_REFUSAL_NONE, "plimsoll: out of memory");
    if (err) {
        json_decref(body);
        body = NULL;
    }
    r->cb(r->ud, err, body);
    json_decref(body);
    free(r);
}

plm_error *plm_rpc(plm_client *c, const char *method, const json_t *req, plm_cancel *cancel,
                   plm_rpc_cb cb, void *ud)
{
    plm_error *e = plm_check_cancel(cancel, method);
    if (e)
        return e;
    size_t len = 0;
    char *body = plm_json_write(req, &len);
    rpc *r = calloc(1, sizeof *r);
    if (!body || !r) {
        free(body);
        free(r);
        return plm_err_new(PLM_INTERNAL, PLM_REFUSAL_REQUEST, "plimsoll: %s: out of memory", method);
    }
    r->c = c;
    r->method = method;
    r->cb = cb;
    r->ud = ud;
    if (plm_http_post(c->http, method, body, len, cancel, rpc_done, r) < 0) {
        free(r);
        return plm_err_new(PLM_INTERNAL, PLM_REFUSAL_REQUEST,
                           "plimsoll: %s: cannot start the HTTP exchange", method);
    }
    return NULL;
}

/* ---------------------------------------------------------------- Describe */

typedef struct describe_op {
    plm_info_cb cb;
    void *ud;
} describe_op;

static void describe_done(void *ud, plm_error *err, json_t *ans)
{
    describe_op *op = ud;
    plm_info *info = NULL;
    if (!err)
        err = plm_map_info(ans, &info);
    op->cb(op->ud, err, info);
    free(op);
}

plm_error *plm_describe(plm_client *c, plm_cancel *cancel, plm_info_cb cb, void *ud)
{
    if (!c || !cb)
        return plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST,
                           "plimsoll: Describe needs a client and a callback");
    describe_op *op = calloc(1, sizeof *op);
    if (!op)
        return plm_err_new(PLM_INTERNAL, PLM_REFUSAL_REQUEST, "plimsoll: out of memory");
    op->cb = cb;
    op->ud = ud;
    json_t *req = json_object();
    plm_error *e = plm_rpc(c, "Describe", req, cancel, describe_done, op);
    json_decref(req);
    if (e)
        free(op);
    return e;
}

/* ---------------------------------------------------------------- single runs */

typedef struct run_op {
    json_t *req;
    plm_result_cb cb;
    void *ud;
} run_op;

plm_check plm_finish_answer(const char *method, const json_t *req, json_t *resp,
                            const plm_chain *chain, plm_error **err, plm_result **out,
                            plm_record **checked)
{
    plm_record *rec = NULL;
    plm_result *r = NULL;
    plm_check c;
    *out = NULL;
    if (checked)
        *checked = NULL;
    /* Map first, so the output is decoded once and the digest reads the decoded bytes;
     * nothing of the mapping is handed out unless every check passed. */
    *err = plm_map_result(resp, NULL, &r);
    if (*err) {
        c = PLM_CHECK_MALFORMED;
    } else {
        c = plm_verify_mapped(req, resp, r, chain, &rec, err);
        if (rec && checked)
            *checked = plm_record_copy(rec);
        if (rec && (c == PLM_CHECK_OK || c == PLM_CHECK_FLOOR)) {
            r->record = *rec; /* take the members */
            free(rec);
            rec = NULL;
            if (c == PLM_CHECK_FLOOR)
                (*err)->result = r; /* the floor check carries the mapped result */
            else
                *out = r;
            r = NULL;
        }
        plm_record_free(rec);
        plm_result_free(r);
    }
    if (*err) {
        plm_err_prefix(*err, method);
        plm_err_prefix(*err, "plimsoll");
        if (!(*err)->wire)
            (*err)->wire = json_incref(resp);
    }
    return c;
}

static void run_done(void *ud, plm_error *err, json_t *ans)
{
    run_op *op = ud;
    plm_result *r = NULL;
    if (!err)
        plm_finish_answer("Run", op->req, ans, NULL, &err, &r, NULL);
    op->cb(op->ud, err, r);
    json_decref(op->req);
    free(op);
}

static plm_error *start_run(plm_client *c, json_t *req, const plm_run_options *o,
                            plm_result_cb cb, void *ud)
{
    run_op *op = calloc(1, sizeof *op);
    if (!op) {
        json_decref(req);
        return plm_err_new(PLM_INTERNAL, PLM_REFUSAL_REQUEST, "plimsoll: out of memory");
    }
    op->req = req;
    op->cb = cb;
    op->ud = ud;
    plm_error *e = plm_rpc(c, "Run", req, o ? o->cancel : NULL, run_done, op);
    if (e) {
        json_decref(req);
        free(op);
    }
    return e;
}

/* The envelope of a single run, from the call's own options. */
static plm_error *run_envelope(json_t *req, const plm_run_options *o)
{
    json_t *rule = NULL;
    plm_error *e = plm_rule_to_json(o ? o->software : NULL, &rule);
    if (!e)
        e = plm_envelope(req, o, o ? o->minimum_isolation : NULL, rule);
    return e;
}

plm_error *plm_run_javascript(plm_client *c, const char *code, const plm_run_options *o,
                              plm_result_cb cb, void *ud)
{
    if (!c || !code || !cb)
        return plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST,
                           "plimsoll: runJavaScript needs a client, code and a callback");
    json_t *req = json_object(), *js = json_object();
    plm_error *e = run_envelope(req, o);
    if (!e)
        e = plm_put_text(js, "code", code, "request.javascript.code");
    if (!e && c->js_grant && *c->js_grant)
        e = plm_put_text(js, "grantProfile", c->js_grant, "request.javascript.grantProfile");
    json_object_set_new(req, "javascript", js);
    if (e) {
        json_decref(req);
        return e;
    }
    return start_run(c, req, o, cb, ud);
}

plm_error *plm_run_project(plm_client *c, const plm_project *p, const plm_run_options *o,
                           plm_result_cb cb, void *ud)
{
    if (!c || !p || !cb)
        return plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST,
                           "plimsoll: runProject needs a client, a project and a callback");
    json_t *req = json_object(), *proj = NULL;
    plm_error *e = run_envelope(req, o);
    if (!e)
        e = plm_project_to_json(p, c->project_grant, &proj);
    if (e) {
        json_decref(req);
        return e;
    }
    json_object_set_new(req, "project", proj);
    return start_run(c, req, o, cb, ud);
}

/*
 * session.c — sessions (docs/client.md §2.6, §5): open with its checks, one FIFO queue for
 * every call and the close, the record chain followed call by call, unanswered
 * (version 3) records chained or refused, a session stopped after any call without a
 * checkable answer, and a memoized close.
 *
 * The session id is a capability: it is held here, sent only in SessionRun and
 * CloseSession bodies, and never put in a message, a log line or a return value.
 */
#include "internal.h"

#include <ev.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define UINT32_CAP 4294967295LL

typedef struct waiter {
    plm_close_cb cb;
    void *ud;
    struct waiter *next;
} waiter;

typedef struct sop {
    plm_session *s;             /* NULL once the session handle was freed */
    bool is_close;
    json_t *req;
    const char *method;
    plm_cancel *cancel;
    plm_result_cb cb;           /* calls */
    void *ud;
    struct sop *next;
} sop;

struct plm_session {
    plm_client *c;
    char *id;                   /* the capability: never leaves this file but in bodies */
    plm_hex fingerprint;
    char *isolation, *sandbox, *software_identity;
    int64_t expires_at_ms;
    uint32_t idle_timeout_ms;
    char *floor;
    json_t *rule;
    uint64_t calls;
    plm_hex last;
    plm_session_end end;
    char *end_detail;
    char *stopped;
    sop *head, *tail;           /* head is in flight when `busy` */
    bool busy;
    /* memoized close */
    bool closing;               /* a close is queued or in flight */
    bool closed;                /* a close was answered (or failed after dispatch) */
    plm_error *close_err;
    plm_close_summary *close_summary;
    waiter *waiters;            /* closes waiting for the outcome */
    ev_timer deliver;           /* hands a memoized outcome to later closes, off-stack */
    int depth;                  /* > 0 while this file runs callbacks */
    bool free_pending;
};

static void pump(plm_session *s);
static void session_destroy(plm_session *s);

/* ---------------------------------------------------------------- accessors */

/* A NULL handle reads as nothing (and, for `ended`, never as open). */
const char *plm_session_fingerprint(const plm_session *s) { return s ? s->fingerprint : NULL; }
const char *plm_session_isolation(const plm_session *s) { return s ? s->isolation : NULL; }
const char *plm_session_sandbox(const plm_session *s) { return s ? s->sandbox : NULL; }
const char *plm_session_software_identity(const plm_session *s) { return s ? s->software_identity : NULL; }
int64_t plm_session_expires_at_ms(const plm_session *s) { return s ? s->expires_at_ms : 0; }
uint32_t plm_session_idle_timeout_ms(const plm_session *s) { return s ? s->idle_timeout_ms : 0; }
const char *plm_session_stopped(const plm_session *s) { return s ? s->stopped : NULL; }

plm_session_end plm_session_ended(const plm_session *s, const char **detail)
{
    if (detail)
        *detail = s && s->end_detail ? s->end_detail : "";
    return s ? s->end : PLM_END_UNKNOWN;
}

void plm_session_chain(const plm_session *s, uint64_t *calls, const char **last)
{
    if (calls)
        *calls = s ? s->calls : 0;
    if (last)
        *last = s ? s->last : NULL;
}

static void note_end(plm_session *s, plm_session_end end, const char *detail)
{
    if (end == PLM_END_OPEN || s->end != PLM_END_OPEN)
        return; /* the first end wins */
    s->end = end;
    free(s->end_detail);
    s->end_detail = plm_strdup_or_empty(detail);
}

static void stop(plm_session *s, const char *reason)
{
    if (!s->stopped)
        s->stopped = plm_strdup_or_empty(reason);
}

/* ---------------------------------------------------------------- open */

typedef struct open_op {
    plm_client *c;
    char *floor;
    json_t *rule;
    plm_session_cb cb;
    void *ud;
} open_op;

static void ignore_close(void *ud, plm_error *err, plm_close_summary *sum)
{
    plm_error_free(err);
    plm_close_summary_free(sum);
}

static plm_error *open_refusal(const char *why, const char *a)
{
    return plm_err_new(PLM_DATA_LOSS, PLM_REFUSAL_NONE, "plimsoll: OpenSession: %s%s", why,
                       a ? a : "");
}

static plm_session *session_from_answer(open_op *op, const json_t *a, plm_error **err)
{
    const char *id, *fp, *iso, *sbx, *sw;
    int64_t expires = 0;
    uint32_t idle = 0;
    if (plm_jstring(plm_jget(a, "sessionId", "session_id"), "sessionId", &id, err) < 0 ||
        plm_jstring(plm_jget(a, "session", NULL), "session", &fp, err) < 0 ||
        plm_jstring(plm_jget(a, "isolation", NULL), "isolation", &iso, err) < 0 ||
        plm_jstring(plm_jget(a, "sandbox", NULL), "sandbox", &sbx, err) < 0 ||
        plm_jstring(plm_jget(a, "softwareIdentity", "software_identity"), "softwareIdentity", &sw, err) < 0 ||
        plm_jint64(plm_jget(a, "expiresUnixMs", "expires_unix_ms"), "expiresUnixMs", &expires, err) < 0 ||
        plm_juint32(plm_jget(a, "idleTimeoutMs", "idle_timeout_ms"), "idleTimeoutMs", &idle, err) < 0)
        return NULL;
    plm_session *s = calloc(1, sizeof *s);
    if (!s) {
        *err = plm_err_new(PLM_INTERNAL, PLM_REFUSAL_NONE, "plimsoll: out of memory");
        return NULL;
    }
    s->c = op->c;
    s->id = strdup(id);
    plm_sha256_hex(id, strlen(id), s->fingerprint);
    s->isolation = strdup(iso);
    s->sandbox = strdup(sbx);
    s->software_identity = strdup(sw);
    s->expires_at_ms = expires;
    s->idle_timeout_ms = idle;
    s->floor = op->floor;
    op->floor = NULL;
    s->rule = op->rule;
    op->rule = NULL;
    ev_timer_init(&s->deliver, NULL, 0., 0.);
    /* The three checks of docs/client.md §2.6; a failure closes the session first. */
    if (strcmp(fp, s->fingerprint) != 0)
        *err = open_refusal("the session fingerprint is not the SHA-256 of the session id", NULL);
    else if (s->floor && *s->floor && !plm_meets(s->isolation, s->floor))
        *err = plm_err_new(PLM_DATA_LOSS, PLM_REFUSAL_NONE,
                           "plimsoll: OpenSession: the session's isolation %s is below the "
                           "requested %s", s->isolation, s->floor);
    else if (!plm_software_rule_allows(s->rule, s->software_identity))
        *err = open_refusal("the session's software identity is outside the rule: ",
                            s->software_identity);
    return s;
}

static void open_done(void *ud, plm_error *err, json_t *ans)
{
    open_op *op = ud;
    plm_session *s = NULL;
    if (!err) {
        s = session_from_answer(op, ans, &err);
        if (s && err) {
            plm_error *ce = plm_session_close(s, NULL, ignore_close, NULL);
            plm_error_free(ce);
            s->free_pending = true; /* freed once that close completes */
            if (ce)
                session_destroy(s);
            s = NULL;
        }
    }
    op->cb(op->ud, err, s);
    free(op->floor);
    json_decref(op->rule);
    free(op);
}

static plm_error *refuse(const char *fmt, const char *a)
{
    return plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST, fmt, a ? a : "");
}

static plm_error *put_ms(json_t *req, const char *key, int64_t ms)
{
    if (ms > 0)
        json_object_set_new(req, key, json_integer(ms > UINT32_CAP ? UINT32_CAP : ms));
    return NULL;
}

plm_error *plm_open_session(plm_client *c, const plm_session_options *o,
                            plm_session_cb cb, void *ud)
{
    plm_session_options none = {0};
    if (!c || !cb)
        return refuse("plimsoll: OpenSession needs a client and a callback%s", NULL);
    if (!o)
        o = &none;
    json_t *rule = NULL, *req = json_object();
    plm_error *e = plm_rule_to_json(o->software, &rule);
    if (!e && o->owner && !*o->owner)
        e = refuse("plimsoll: OpenSession: owner must be a non-empty string (an empty owner "
                   "would escape the daemon's per-owner cap)%s", NULL);
    json_t *langs = json_array();
    for (size_t i = 0; !e && i < o->n_languages; i++) {
        const char *l = o->languages ? o->languages[i] : NULL;
        if (!l || (strcmp(l, "python") != 0 && strcmp(l, "javascript") != 0)) {
            e = refuse("plimsoll: OpenSession: unknown language %s in the hint (python or "
                       "javascript)",
                       l ? (plm_utf8_valid(l, strlen(l)) ? l : "(ill-formed text)") : "(null)");
            break;
        }
        size_t j;
        json_t *v;
        bool dup = false;
        json_array_foreach(langs, j, v) dup |= strcmp(json_string_value(v), l) == 0;
        if (!dup)
            json_array_append_new(langs, json_string(l));
    }
    if (!e)
        e = plm_envelope(req, NULL, o->minimum_isolation, rule ? json_incref(rule) : NULL);
    if (!e && o->trace_id)
        e = plm_put_text(req, "traceId", o->trace_id, "request.traceId");
    if (!e) {
        put_ms(req, "lifetimeMs", o->lifetime_ms);
        put_ms(req, "idleTimeoutMs", o->idle_timeout_ms);
        if (json_array_size(langs))
            json_object_set(req, "languages", langs);
        if (o->owner) {
            if (!plm_utf8_valid(o->owner, strlen(o->owner))) {
                e = refuse("plimsoll: OpenSession: the owner is not well-formed UTF-8%s", NULL);
            } else {
                plm_hex owner;
                plm_owner_digest(c->token, o->owner, owner);
                json_object_set_new(req, "owner", json_string(owner));
            }
        }
    }
    json_decref(langs);
    open_op *op = e ? NULL : calloc(1, sizeof *op);
    if (!e && !op)
        e = plm_err_new(PLM_INTERNAL, PLM_REFUSAL_REQUEST, "plimsoll: out of memory");
    if (!e) {
        op->c = c;
        op->floor = plm_strdup(o->minimum_isolation);
        op->rule = rule;
        rule = NULL;
        op->cb = cb;
        op->ud = ud;
        e = plm_rpc(c, "OpenSession", req, o->cancel, open_done, op);
        if (e) {
            free(op->floor);
            json_decref(op->rule);
            free(op);
        }
    }
    json_decref(rule);
    json_decref(req);
    return e;
}

/* ---------------------------------------------------------------- the queue */

static void sop_free(sop *op)
{
    json_decref(op->req);
    free(op);
}

/* Runs a user callback with the session marked busy-in-callback, so a plm_session_free
 * from inside it is deferred until this file is done with the session. */
#define IN_CALLBACK(s, stmt)        \
    do {                            \
        if (s) (s)->depth++;        \
        stmt;                       \
        if (s) (s)->depth--;        \
    } while (0)

static plm_error *stopped_error(plm_session *s, const char *method)
{
    return plm_err_new(PLM_FAILED_PRECONDITION, PLM_REFUSAL_REQUEST,
                       "plimsoll: %s: an earlier call on this session ended without an answer "
                       "this client could check (%s); open a new one", method, s->stopped);
}

/* What refuses a queued operation at its turn, before anything is sent. */
static plm_error *precheck(plm_session *s, sop *op)
{
    plm_error *e = plm_check_cancel(op->cancel, op->method);
    if (!e && !op->is_close && s->stopped)
        e = stopped_error(s, op->method);
    return e;
}

static void call_done(void *ud, plm_error *err, json_t *ans);
static void close_done(void *ud, plm_error *err, json_t *ans);

static plm_error *send_op(plm_session *s, sop *op)
{
    /* The id joins the body only now, and only in the body. */
    json_object_set_new(op->req, "sessionId", json_string(s->id));
    return plm_rpc(s->c, op->method, op->req, op->cancel, op->is_close ? close_done : call_done, op);
}

static void finish_close(plm_session *s, plm_error *err, plm_close_summary *sum);

/* Completes an operation that never left the queue. */
static void refuse_op(plm_session *s, sop *op, plm_error *e)
{
    if (op->is_close) {
        finish_close(s, e, NULL);
        sop_free(op);
    } else {
        IN_CALLBACK(s, op->cb(op->ud, e, NULL));
        sop_free(op);
    }
}

/* Starts queued operations until one is in flight or the queue is empty. */
static void pump(plm_session *s)
{
    while (s->head && !s->busy) {
        sop *op = s->head;
        plm_error *e = precheck(s, op);
        if (!e)
            e = send_op(s, op);
        if (!e) {
            s->busy = true;
            return;
        }
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
        refuse_op(s, op, e);
    }
}

/* Queues `op`.  When the queue is empty it is sent now, and a refusal is returned to
 * the caller directly (the callback is then never called). */
static plm_error *submit(plm_session *s, sop *op)
{
    op->s = s;
    if (!s->head) {
        plm_error *e = precheck(s, op);
        if (!e)
            e = send_op(s, op);
        if (e) {
            sop_free(op);
            return e;
        }
        s->head = s->tail = op;
        s->busy = true;
        return NULL;
    }
    s->tail->next = op;
    s->tail = op;
    return NULL;
}

/* Pops the head after its answer; returns the session, or NULL when it was freed. */
static plm_session *pop(sop *op)
{
    plm_session *s = op->s;
    if (!s)
        return NULL;
    s->busy = false;
    s->head = op->next;
    if (!s->head)
        s->tail = NULL;
    return s;
}

static void after_callbacks(plm_session *s)
{
    if (!s)
        return;
    if (s->free_pending && s->depth == 0 && !s->busy) {
        session_destroy(s);
        return;
    }
    pump(s);
}

/* ---------------------------------------------------------------- calls */

static plm_chain chain_of(plm_session *s)
{
    plm_chain ch = {s->fingerprint, s->calls, s->last};
    return ch;
}

static void advance(plm_session *s, const plm_record *rec)
{
    s->calls = rec->sequence;
    snprintf(s->last, sizeof s->last, "%s", rec->record_sha256);
}

/* docs/client.md §5.4: an error that may have run, carrying the call's v3 record. */
static plm_error *handle_unanswered(plm_session *s, sop *op, plm_error *err)
{
    plm_chain ch = chain_of(s);
    plm_error *problem = NULL;
    const plm_record *rec = err->unanswered;
    plm_verify_unanswered(op->req, rec, &ch, &problem);
    if (!problem) {
        if (strcmp(rec->provider, s->sandbox) != 0)
            problem = plm_err_new(PLM_DATA_LOSS, PLM_REFUSAL_NONE,
                                  "the unanswered record names provider %s, but the session "
                                  "opened as %s", rec->provider, s->sandbox);
        else if (strcmp(rec->isolation, s->isolation) != 0 ||
                 strcmp(rec->software_identity, s->software_identity) != 0)
            problem = plm_err_new(PLM_DATA_LOSS, PLM_REFUSAL_NONE,
                                  "the unanswered record states isolation %s, but the session "
                                  "opened as %s", rec->isolation, s->isolation);
    }
    if (!problem) {
        advance(s, rec);
        err->record = plm_record_copy(rec);
        return err; /* the original error: its outcome is unknown, the session goes on */
    }
    stop(s, problem->message);
    plm_err_prefix(problem, op->method);
    plm_err_prefix(problem, "plimsoll");
    problem->cause = plm_strdup(err->message);
    plm_error_free(err);
    return problem;
}

/* A monotonic clock in milliseconds, for plm_result.check_ms. */
static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void call_done(void *ud, plm_error *err, json_t *ans)
{
    sop *op = ud;
    plm_session *s = op->s;
    plm_result *r = NULL;
    if (!s) {
        /* The handle was freed while this call was in flight: with no chain left to
         * check the answer against, nothing in it can be believed. */
        if (!err)
            err = plm_err_new(PLM_CANCELED, PLM_REFUSAL_NONE,
                              "plimsoll: %s: the session handle was freed while this call was "
                              "in flight; it may have run", op->method);
    } else if (err) {
        if (err->session_ended != PLM_END_OPEN)
            note_end(s, err->session_ended, err->session_ended_detail);
        if (err->not_dispatched != PLM_REFUSAL_NONE) {
            /* nothing ran: the session stays usable */
        } else if (err->unanswered) {
            err = handle_unanswered(s, op, err);
        } else {
            stop(s, err->message); /* the daemon may have advanced its chain */
        }
    } else {
        const json_t *run = plm_jget(ans, "run", NULL);
        plm_session_end ended = plm_session_end_from_json(plm_jget(ans, "ended", NULL));
        const char *detail = json_string_value(plm_jget(ans, "endDetail", "end_detail"));
        note_end(s, ended, detail);
        if (!json_is_object(run)) {
            err = plm_err_new(PLM_DATA_LOSS, PLM_REFUSAL_NONE,
                              "plimsoll: SessionRun: the answer carries no run; the call may "
                              "have run");
            err->wire = json_incref(ans);
        } else {
            plm_chain ch = chain_of(s);
            plm_record *checked = NULL;
            double t0 = now_ms();
            plm_finish_answer(op->method, op->req, (json_t *)run, &ch, &err, &r, &checked);
            if (r)
                r->check_ms = now_ms() - t0;
            if (checked)
                advance(s, checked);
            plm_record_free(checked);
            if (r) {
                r->ended = ended;
                r->end_detail = plm_strdup_or_empty(detail);
            }
        }
        if (err)
            stop(s, err->message);
    }
    pop(op);
    IN_CALLBACK(s, op->cb(op->ud, err, r));
    sop_free(op);
    after_callbacks(s);
}

static plm_error *start_call(plm_session *s, const char *method, json_t *payload_key_value,
                             const char *payload_key, const plm_run_options *o,
                             plm_result_cb cb, void *ud)
{
    json_t *req = json_object(), *call_rule = NULL, *rule = NULL;
    plm_error *e = plm_rule_to_json(o ? o->software : NULL, &call_rule);
    if (!e)
        e = plm_rule_merge(s->rule, call_rule, &rule);
    json_decref(call_rule);
    /* The session's floor unless the call asks for an equal or stronger one. */
    const char *floor = s->floor;
    const char *want = o ? o->minimum_isolation : NULL;
    if (!e && want && *want) {
        if (!plm_valid_floor(want))
            e = plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST,
                            "plimsoll: %s: minimumIsolation %s is not process, container, kernel "
                            "or vm", method, want);
        else if (plm_tier_rank(want) >= plm_tier_rank(floor))
            floor = want;
    }
    if (!e)
        e = plm_envelope(req, o, floor, rule);
    else
        json_decref(rule);
    if (e) {
        json_decref(req);
        json_decref(payload_key_value);
        return e;
    }
    json_object_set_new(req, payload_key, payload_key_value);
    sop *op = calloc(1, sizeof *op);
    if (!op) {
        json_decref(req);
        return plm_err_new(PLM_INTERNAL, PLM_REFUSAL_REQUEST, "plimsoll: out of memory");
    }
    op->req = req;
    op->method = method;
    op->cancel = o ? o->cancel : NULL;
    op->cb = cb;
    op->ud = ud;
    return submit(s, op);
}

plm_error *plm_session_run_cell(plm_session *s, const plm_cell *cell, const plm_run_options *o,
                                plm_result_cb cb, void *ud)
{
    if (!s || !cell || !cb)
        return refuse("plimsoll: runCell needs a session, a cell and a callback%s", NULL);
    const char *lang = cell->language ? cell->language : "";
    if (strcmp(lang, "python") != 0 && strcmp(lang, "javascript") != 0)
        return refuse("plimsoll: SessionRun: a cell's language must be python or javascript, "
                      "not %s", plm_utf8_valid(lang, strlen(lang)) ? lang : "(ill-formed text)");
    json_t *p = json_object(), *files = NULL;
    json_object_set_new(p, "language", json_string(lang));
    plm_error *e = plm_put_text(p, "code", cell->code, "request.cell.code");
    if (!e)
        e = plm_files_to_json(cell->files, cell->n_files, "request.cell", &files);
    if (e) {
        json_decref(p);
        return e;
    }
    json_object_set_new(p, "files", files); /* always present, possibly empty */
    return start_call(s, "SessionRun", p, "cell", o, cb, ud);
}

plm_error *plm_session_run_javascript(plm_session *s, const char *code,
                                      const plm_run_options *o, plm_result_cb cb, void *ud)
{
    if (!s || !code || !cb)
        return refuse("plimsoll: runJavaScript needs a session, code and a callback%s", NULL);
    json_t *p = json_object();
    plm_error *e = plm_put_text(p, "code", code, "request.javascript.code");
    if (!e && s->c->js_grant && *s->c->js_grant)
        e = plm_put_text(p, "grantProfile", s->c->js_grant, "request.javascript.grantProfile");
    if (e) {
        json_decref(p);
        return e;
    }
    return start_call(s, "SessionRun", p, "javascript", o, cb, ud);
}

plm_error *plm_session_run_project(plm_session *s, const plm_project *proj,
                                   const plm_run_options *o, plm_result_cb cb, void *ud)
{
    if (!s || !proj || !cb)
        return refuse("plimsoll: runProject needs a session, a project and a callback%s", NULL);
    json_t *p = NULL;
    plm_error *e = plm_project_to_json(proj, s->c->project_grant, &p);
    if (e)
        return e;
    return start_call(s, "SessionRun", p, "project", o, cb, ud);
}

/* ---------------------------------------------------------------- close */

static plm_close_summary *summary_copy(const plm_close_summary *src)
{
    plm_close_summary *d = calloc(1, sizeof *d);
    if (d) {
        *d = *src;
        d->session = plm_strdup(src->session);
        d->last_record_sha256 = plm_strdup(src->last_record_sha256);
    }
    return d;
}

/* Hands the memoized outcome to every waiting close, each its own copy. */
static void deliver_waiters(plm_session *s)
{
    while (s->waiters) {
        waiter *w = s->waiters;
        s->waiters = w->next;
        plm_error *e = s->close_err ? plm_err_copy(s->close_err) : NULL;
        plm_close_summary *sum = s->close_summary ? summary_copy(s->close_summary) : NULL;
        IN_CALLBACK(s, w->cb(w->ud, e, sum));
        free(w);
    }
}

static void deliver_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
    plm_session *s = t->data;
    deliver_waiters(s);
    after_callbacks(s);
}

static void finish_close(plm_session *s, plm_error *err, plm_close_summary *sum)
{
    s->closing = false;
    if (err && err->not_dispatched != PLM_REFUSAL_NONE) {
        /* Refused before anything ran: forget it, so the next close tries again. */
        waiter *ws = s->waiters;
        s->waiters = NULL;
        while (ws) {
            waiter *w = ws;
            ws = w->next;
            plm_error *e = ws ? plm_err_copy(err) : err;
            IN_CALLBACK(s, w->cb(w->ud, e, NULL));
            free(w);
        }
        return;
    }
    s->closed = true;
    s->close_err = err;
    s->close_summary = sum;
    deliver_waiters(s);
}

static plm_close_summary *map_summary(const json_t *a, plm_error **err)
{
    const char *fp, *last;
    plm_close_summary *sum = calloc(1, sizeof *sum);
    if (!sum ||
        plm_jstring(plm_jget(a, "session", NULL), "session", &fp, err) < 0 ||
        plm_juint64(plm_jget(a, "calls", NULL), "calls", &sum->calls, err) < 0 ||
        plm_jstring(plm_jget(a, "lastRecordSha256", "last_record_sha256"), "lastRecordSha256",
                    &last, err) < 0) {
        free(sum);
        if (!*err)
            *err = plm_err_new(PLM_INTERNAL, PLM_REFUSAL_NONE, "plimsoll: out of memory");
        return NULL;
    }
    sum->session = strdup(fp);
    sum->last_record_sha256 = strdup(last);
    sum->end = plm_session_end_from_json(plm_jget(a, "ended", NULL));
    return sum;
}

static void close_done(void *ud, plm_error *err, json_t *ans)
{
    sop *op = ud;
    plm_session *s = pop(op);
    plm_close_summary *sum = NULL;
    if (!s) {
        plm_error_free(err);
        sop_free(op);
        return;
    }
    if (!err)
        sum = map_summary(ans, &err);
    if (err && err->session_ended != PLM_END_OPEN)
        note_end(s, err->session_ended, err->session_ended_detail);
    if (sum) {
        note_end(s, sum->end, "");
        /* Another holder of the id, or a call this client has no answer for, shows here. */
        if (strcmp(sum->session, s->fingerprint) != 0 || sum->calls != s->calls ||
            strcmp(sum->last_record_sha256, s->last) != 0) {
            err = plm_err_new(PLM_DATA_LOSS, PLM_REFUSAL_NONE,
                              "plimsoll: CloseSession: the daemon counts %llu calls ending %s, "
                              "this client saw %llu ending %s",
                              (unsigned long long)sum->calls,
                              *sum->last_record_sha256 ? sum->last_record_sha256 : "(none)",
                              (unsigned long long)s->calls, *s->last ? s->last : "(none)");
            err->wire = json_incref(ans);
            plm_close_summary_free(sum);
            sum = NULL;
        }
    }
    sop_free(op);
    finish_close(s, err, sum);
    after_callbacks(s);
}

plm_error *plm_session_close(plm_session *s, plm_cancel *cancel, plm_close_cb cb, void *ud)
{
    if (!s || !cb)
        return refuse("plimsoll: close needs a session and a callback%s", NULL);
    waiter *w = calloc(1, sizeof *w);
    if (!w)
        return plm_err_new(PLM_INTERNAL, PLM_REFUSAL_REQUEST, "plimsoll: out of memory");
    w->cb = cb;
    w->ud = ud;
    if (s->closed || s->closing) {
        /* Memoized: exactly one CloseSession is ever sent. */
        w->next = s->waiters;
        s->waiters = w;
        if (s->closed) {
            s->deliver.data = s;
            ev_set_cb(&s->deliver, deliver_cb);
            ev_timer_start(s->c->loop, &s->deliver);
        }
        return NULL;
    }
    sop *op = calloc(1, sizeof *op);
    if (!op) {
        free(w);
        return plm_err_new(PLM_INTERNAL, PLM_REFUSAL_REQUEST, "plimsoll: out of memory");
    }
    op->is_close = true;
    op->method = "CloseSession";
    op->cancel = cancel;
    op->req = json_object();
    json_object_set_new(op->req, "protocol", json_integer(PLIMSOLL_PROTOCOL));
    plm_error *e = submit(s, op);
    if (e) {
        free(w);
        return e;
    }
    s->closing = true;
    s->waiters = w;
    return NULL;
}

/* ---------------------------------------------------------------- free */

static void session_destroy(plm_session *s)
{
    ev_timer_stop(s->c->loop, &s->deliver);
    free(s->id);
    free(s->isolation);
    free(s->sandbox);
    free(s->software_identity);
    free(s->floor);
    json_decref(s->rule);
    free(s->end_detail);
    free(s->stopped);
    plm_error_free(s->close_err);
    plm_close_summary_free(s->close_summary);
    free(s);
}

void plm_session_free(plm_session *s)
{
    if (!s)
        return;
    if (s->depth > 0) {
        s->free_pending = true;
        return;
    }
    /* An operation in flight finishes without the session; queued ones never leave. */
    sop *op = s->head;
    if (s->busy && op) {
        op->s = NULL;
        op = op->next;
    }
    s->head = s->tail = NULL;
    s->busy = false;
    s->depth++;
    while (op) {
        sop *next = op->next;
        plm_error *e = plm_err_new(PLM_CANCELED, PLM_REFUSAL_REQUEST,
                                   "plimsoll: %s: the session handle was freed before this call "
                                   "was sent", op->method);
        if (op->is_close)
            finish_close(s, e, NULL);
        else
            op->cb(op->ud, e, NULL);
        sop_free(op);
        op = next;
    }
    if (s->closing && !s->closed) {
        /* The close was sent and its answer will find no session: it may have run. */
        finish_close(s, plm_err_new(PLM_CANCELED, PLM_REFUSAL_NONE,
                                    "plimsoll: CloseSession: the session handle was freed "
                                    "while the close was in flight; it may have run"), NULL);
    } else {
        deliver_waiters(s);
    }
    s->depth--;
    session_destroy(s);
}

struct ev_loop *plm_session_loop(plm_session *s)
{
    return s ? s->c->loop : NULL;
}

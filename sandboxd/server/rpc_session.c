/*
 * rpc_session.c — OpenSession, SessionRun and CloseSession (docs/daemon.md §3).
 *
 * A session call is looked up, validated against the session (so a call that can
 * never run is refused at once), then waits for the session's turn, checks that the
 * session still stands, runs in the provider, and is chained.
 */
#include "rpc.h"

#include "log.h"
#include "records.h"
#include "util.h"

#include <ev.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOT_FOUND_DETAIL "no such session for this caller"

static sbx_err *not_found(void)
{
    return sbx_err_session(PLM_NOT_FOUND, PLM_END_NOT_FOUND, NOT_FOUND_DETAIL,
                           "no such session for this caller (it may have been closed, or the "
                           "daemon restarted); nothing ran");
}

static sbx_err *ended(const sbx_session *s)
{
    const char *detail;
    plm_session_end end = sbx_session_end_reason(s, &detail);
    return sbx_err_session(PLM_FAILED_PRECONDITION, end, detail,
                           "the session has ended (%s: %s); nothing ran",
                           plm_session_end_name(end), detail);
}

static void set_u64_string(json_t *o, const char *name, uint64_t v)
{
    if (v) {
        char text[24];
        snprintf(text, sizeof text, "%" PRIu64, v);
        json_object_set_new(o, name, json_string(text));
    }
}

/* ---------------------------------------------------------------- OpenSession */

typedef struct open_op {
    sbx_app *app;
    sbx_call *call;
    sbx_request req;
} open_op;

static void open_op_free(open_op *op)
{
    sbx_request_clear(&op->req);
    free(op);
}

static void on_opened(void *ud, sbx_err *err, sbx_session *s)
{
    open_op *op = ud;
    /* The tier a real sandbox measured at open may fall short of what was checked
     * before: then the session is closed unused. */
    if (!err && !plm_meets(sbx_session_tier(s), op->req.floor)) {
        err = sbx_err_new(PLM_FAILED_PRECONDITION, PLM_REFUSAL_ISOLATION,
                          "the session opened at tier %s, below the requested floor %s; it was "
                          "closed unused", sbx_session_tier(s), op->req.floor);
        sbx_session_end(s, PLM_END_CLOSED, "below the requested floor");
        sbx_session_forget(s);
    } else if (!err && sbx_call_caller_gone(op->call)) {
        /* D10: nobody would learn the new session's id, so nobody could close it: it
         * would hold a slot until its idle timeout.  Closed now, unused. */
        sbx_log("OpenSession: the caller hung up while its sandbox was made; closed it unused");
        err = sbx_err_new(PLM_CANCELED, PLM_REFUSAL_NONE,
                          "the caller hung up while the session was opened; it was closed "
                          "unused");
        sbx_session_end(s, PLM_END_CLOSED, "its caller hung up during the open");
        sbx_session_forget(s);
    }
    if (err) {
        sbx_rpc_refuse(op->call, "OpenSession", err);
        open_op_free(op);
        return;
    }
    const sbx_facts *f = op->app->facts;
    json_t *o = json_object();
    json_object_set_new(o, "sessionId", json_string(sbx_session_id(s)));
    json_object_set_new(o, "session", json_string(sbx_session_fingerprint(s)));
    json_object_set_new(o, "sandbox", json_string(f->name));
    json_object_set_new(o, "isolation", json_string(sbx_session_tier(s)));
    set_u64_string(o, "expiresUnixMs", (uint64_t)sbx_session_expires_ms(s));
    if (sbx_session_idle_ms(s))
        json_object_set_new(o, "idleTimeoutMs", json_integer(sbx_session_idle_ms(s)));
    if (*sbx_session_software_identity(s))
        json_object_set_new(o, "softwareIdentity", json_string(sbx_session_software_identity(s)));
    sbx_call_reply_json(op->call, o);
    open_op_free(op);
}

void sbx_rpc_open_session(void *ud, sbx_call *call)
{
    sbx_app *app = ud;
    open_op *op = sbx_xcalloc(1, sizeof *op);
    op->app = app;
    op->call = call;
    if (!sbx_rpc_read(app, call, SBX_RPC_OPEN, &op->req)) {
        free(op);
        return;
    }
    const sbx_facts *f = app->facts;
    sbx_err *err = NULL;
    if (!plm_meets(f->tier, op->req.floor))
        err = sbx_err_new(PLM_FAILED_PRECONDITION, PLM_REFUSAL_ISOLATION,
                          "the %s tier here is below the requested floor %s; nothing ran",
                          f->tier, op->req.floor);
    else if (op->req.rule && !plm_software_rule_allows(op->req.rule, f->session.software_identity))
        err = sbx_err_new(PLM_FAILED_PRECONDITION, PLM_REFUSAL_ENVIRONMENT,
                          "the session's software is outside the request's softwareRule; "
                          "nothing ran");
    if (!err) {
        sbx_open_req oreq = {
            .principal = sbx_call_principal(call),
            .owner = op->req.owner,
            .lifetime_ms = op->req.lifetime_ms,
            .idle_ms = op->req.idle_ms,
            /* Known languages the sandbox lacks are dropped from the hint, silently. */
            .languages = op->req.languages & f->session.languages,
        };
        err = sbx_registry_open(app->sessions, &oreq, on_opened, op);
    }
    if (err) {
        sbx_rpc_refuse(call, "OpenSession", err);
        open_op_free(op);
    }
}

/* ---------------------------------------------------------------- SessionRun */

/* A cell still running this long after its dispatch is logged as dispatched: a call
 * that never ends shows in the log, and a quick one costs one line (its answer), not
 * two, each a write to stderr. */
#define DISPATCH_LOG_AFTER_S 0.25

typedef struct call_op {
    sbx_app *app;
    sbx_call *call;
    sbx_request req;
    plm_hex request_sha;
    sbx_session *s;                /* a reference */
    ev_timer running;              /* SessionRun: the dispatch line, if it takes long */
    uint64_t number;               /* SessionRun: the call's number in its session */
} call_op;

static void call_op_free(call_op *op)
{
    ev_timer_stop(op->app->loop, &op->running);
    if (op->s)
        sbx_session_unref(op->s);
    sbx_request_clear(&op->req);
    free(op);
}

static void on_still_running(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    call_op *op = w->data;
    sbx_log("SessionRun %s in session %.12s call %" PRIu64 " dispatched %.0f ms ago, running",
            sbx_kind_name(op->req.job.kind), sbx_session_fingerprint(op->s), op->number,
            DISPATCH_LOG_AFTER_S * 1000);
}

static call_op *call_op_new(sbx_app *app, sbx_call *call)
{
    call_op *op = sbx_xcalloc(1, sizeof *op);
    op->app = app;
    op->call = call;
    ev_timer_init(&op->running, on_still_running, 0., 0.);
    op->running.data = op;
    return op;
}

/* Refused after the turn was taken: nothing ran, the idle deadline stays. */
static void refuse_in_turn(call_op *op, const char *what, sbx_err *err)
{
    sbx_session_release_turn(op->s, false);
    sbx_rpc_refuse(op->call, what, err);
    call_op_free(op);
}

static void on_session_run_done(void *ud, sbx_result *res)
{
    call_op *op = ud;
    sbx_session *s = op->s;
    const sbx_facts *f = op->app->facts;
    if (res->status == SBX_RUN_REFUSED) {
        sbx_err *err = res->error ? res->error
                                  : sbx_err_new(PLM_INTERNAL, PLM_REFUSAL_CAPACITY,
                                                "the provider refused the call");
        res->error = NULL;
        sbx_result_free(res);
        refuse_in_turn(op, "SessionRun", err);
        return;
    }
    sbx_record_ctx ctx = {
        .provider = f->name,
        .isolation = sbx_session_tier(s),
        .environment = res->environment,
        .policy = f->policy,
        .software_identity = res->software_identity ? res->software_identity
                                                    : sbx_session_software_identity(s),
        .software_rule_id = op->req.rule_id,
        .started_ms = sbx_call_started_ms(op->call),
        .ended_ms = sbx_now_ms(),
        .session = sbx_session_fingerprint(s),
        .sequence = sbx_session_calls(s) + 1,
        .previous = sbx_session_last_sha(s),
    };
    if (res->ended != PLM_END_OPEN)
        sbx_session_end(s, res->ended, res->end_detail);
    sbx_err *err = NULL;
    plm_record *rec = NULL;
    json_t *answer = NULL;
    if (res->status == SBX_RUN_UNANSWERED) {
        sbx_err *failure = res->error ? res->error
                                      : sbx_err_new(PLM_UNKNOWN, PLM_REFUSAL_NONE,
                                                    "the call's answer was lost; it may have run");
        res->error = NULL;
        failure->not_dispatched = PLM_REFUSAL_NONE; /* it may have run: never marked */
        rec = sbx_unanswered_record(&ctx, op->request_sha, failure->code, &err);
        if (rec) {
            sbx_session_chain_push(s, rec->record_sha256);
            failure->unanswered = rec;
            err = failure;
        } else {
            sbx_err_free(failure);
        }
    } else {
        answer = sbx_answer(&ctx, res, op->request_sha, &rec, &err);
        if (answer) {
            sbx_session_chain_push(s, rec->record_sha256);
            plm_record_free(rec);
        }
    }
    sbx_result_free(res);
    /* A call whose record could not be made did not enter the chain, but it ran. */
    sbx_session_release_turn(s, true);
    if (!answer) {
        sbx_log("SessionRun in session %.12s call %" PRIu64 " failed: %s (%s)",
                sbx_session_fingerprint(s), ctx.sequence, plm_code_name(err->code), err->message);
        sbx_call_reply_error(op->call, err);
        call_op_free(op);
        return;
    }
    json_t *o = json_object();
    json_object_set_new(o, "run", answer);
    const char *detail;
    plm_session_end end = sbx_session_end_reason(s, &detail);
    if (end != PLM_END_OPEN) { /* it ended during (or right after) this call */
        json_object_set_new(o, "ended", json_string(sbx_end_json_name(end)));
        if (*detail)
            json_object_set_new(o, "endDetail", json_string(detail));
    }
    sbx_log("SessionRun %s in session %.12s call %" PRIu64 "%s%s answered in %lld ms",
            sbx_kind_name(op->req.job.kind), sbx_session_fingerprint(s), ctx.sequence,
            op->req.trace_id ? " trace " : "", op->req.trace_id ? op->req.trace_id : "",
            (long long)(ctx.ended_ms - ctx.started_ms));
    sbx_call_reply_json(op->call, o);
    call_op_free(op);
}

static void session_run_turn(void *ud, sbx_session *s)
{
    call_op *op = ud;
    if (!sbx_session_known(s)) {
        refuse_in_turn(op, "SessionRun", not_found());
        return;
    }
    if (sbx_session_end_reason(s, NULL) != PLM_END_OPEN) {
        refuse_in_turn(op, "SessionRun", ended(s));
        return;
    }
    sbx_session_begin_call(s);
    op->number = sbx_session_calls(s) + 1;
    ev_timer_set(&op->running, DISPATCH_LOG_AFTER_S, 0.);
    ev_timer_start(op->app->loop, &op->running);
    op->app->ops->session_run(sbx_session_provider(s), &op->req.job, on_session_run_done, op);
}

/* Looks the session up; on refusal answers and returns NULL. */
static sbx_session *find_session(sbx_app *app, sbx_call *call, const char *what, const char *id)
{
    sbx_session *s = sbx_registry_find(app->sessions, id, sbx_call_principal(call));
    if (!s)
        sbx_rpc_refuse(call, what, not_found());
    return s;
}

/* Takes the session's turn for `op` (whose `s` holds a reference): runs `cb` now or
 * when granted, or refuses a second waiter. */
static bool take_turn(call_op *op, const char *what, sbx_turn_cb cb)
{
    switch (sbx_session_take_turn(op->s, cb, op)) {
    case SBX_TURN_NOW:
        cb(op, op->s);
        return true;
    case SBX_TURN_QUEUED:
        return true;
    case SBX_TURN_BUSY:
    default:
        sbx_rpc_refuse(op->call, what,
                       sbx_err_new(PLM_RESOURCE_EXHAUSTED, PLM_REFUSAL_CAPACITY,
                                   "a call of this session runs and another already waits for "
                                   "its turn; nothing ran"));
        call_op_free(op);
        return false;
    }
}

void sbx_rpc_session_run(void *ud, sbx_call *call)
{
    sbx_app *app = ud;
    call_op *op = call_op_new(app, call);
    if (!sbx_rpc_read(app, call, SBX_RPC_SESSION_RUN, &op->req)) {
        free(op);
        return;
    }
    op->s = find_session(app, call, "SessionRun", op->req.session_id);
    if (!op->s) {
        call_op_free(op);
        return;
    }
    /* Before the turn: a call that can never run here is refused at once, even on an
     * ended session. */
    sbx_err *err = sbx_rpc_dispatchable(app->facts, &op->req, sbx_session_tier(op->s),
                                        sbx_session_software_identity(op->s), true);
    if (!err)
        err = sbx_rpc_request_digest(&op->req, op->request_sha);
    if (err) {
        sbx_rpc_refuse(call, "SessionRun", err);
        call_op_free(op);
        return;
    }
    take_turn(op, "SessionRun", session_run_turn);
}

/* ---------------------------------------------------------------- CloseSession */

static void close_turn(void *ud, sbx_session *s)
{
    call_op *op = ud;
    if (!sbx_session_known(s)) { /* closed by the call that held the turn */
        refuse_in_turn(op, "CloseSession", not_found());
        return;
    }
    const char *found_detail = NULL;
    plm_session_end found = sbx_session_found_end(s, &found_detail);
    if (found != PLM_END_OPEN) /* how it ended, though the provider has not told it yet */
        sbx_session_end(s, found, found_detail);
    else if (sbx_session_end_reason(s, NULL) == PLM_END_OPEN)
        sbx_session_end(s, PLM_END_CLOSED, "closed by its owner");
    json_t *o = json_object();
    json_object_set_new(o, "session", json_string(sbx_session_fingerprint(s)));
    set_u64_string(o, "calls", sbx_session_calls(s));
    if (*sbx_session_last_sha(s))
        json_object_set_new(o, "lastRecordSha256", json_string(sbx_session_last_sha(s)));
    json_object_set_new(o, "ended", json_string(sbx_end_json_name(sbx_session_end_reason(s, NULL))));
    sbx_log("CloseSession: session %.12s closed after %" PRIu64 " calls",
            sbx_session_fingerprint(s), sbx_session_calls(s));
    sbx_session_forget(s); /* a second close is not_found */
    sbx_session_release_turn(s, false);
    sbx_call_reply_json(op->call, o);
    call_op_free(op);
}

void sbx_rpc_close_session(void *ud, sbx_call *call)
{
    sbx_app *app = ud;
    call_op *op = call_op_new(app, call);
    if (!sbx_rpc_read(app, call, SBX_RPC_CLOSE, &op->req)) {
        free(op);
        return;
    }
    op->s = find_session(app, call, "CloseSession", op->req.session_id);
    if (!op->s) {
        call_op_free(op);
        return;
    }
    take_turn(op, "CloseSession", close_turn);
}

/*
 * rpc.c — Describe and Run, and the checks every procedure shares.
 */
#include "rpc.h"

#include "log.h"
#include "records.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- shared */

void sbx_rpc_refuse(sbx_call *call, const char *what, sbx_err *err)
{
    sbx_log("%s for caller %.12s refused: %s (%s)", what, sbx_call_principal(call),
            plm_code_name(err->code), err->message);
    sbx_call_reply_error(call, err);
}

bool sbx_rpc_read(sbx_app *app, sbx_call *call, sbx_rpc rpc, sbx_request *req)
{
    static const char *const names[] = {"Run", "OpenSession", "SessionRun", "CloseSession"};
    const json_t *body = sbx_call_body(call);
    /* The protocol comes first: a client of another protocol is told so whatever else
     * its request holds. */
    sbx_err *err = sbx_request_protocol(body, SBX_PROTOCOL);
    if (!err && rpc == SBX_RPC_OPEN &&
        (!app->facts->supports_sessions || app->cfg->max_sessions == 0))
        err = sbx_err_new(PLM_UNIMPLEMENTED, PLM_REFUSAL_UNSUPPORTED,
                          "this daemon has no sessions (provider %s, --max-sessions %u); "
                          "nothing ran", app->facts->name, app->cfg->max_sessions);
    if (!err)
        err = sbx_request_parse(req, rpc, body);
    if (err) {
        sbx_rpc_refuse(call, names[rpc], err);
        return false;
    }
    return true;
}

static unsigned language_bit(const char *language)
{
    return strcmp(language, "python") == 0 ? SBX_LANG_PYTHON : SBX_LANG_JAVASCRIPT;
}

sbx_err *sbx_rpc_dispatchable(const sbx_facts *f, const sbx_request *req, const char *tier,
                              const char *software_identity, bool in_session)
{
    const sbx_job *job = &req->job;
    bool supported = true, grants = false;
    switch (job->kind) {
    case SBX_KIND_JAVASCRIPT:
        supported = f->supports_javascript;
        grants = f->supports_javascript_grants;
        break;
    case SBX_KIND_PROJECT:
        supported = f->supports_project;
        grants = f->supports_project_grants;
        break;
    case SBX_KIND_MODULE:
        supported = f->supports_module;
        break;
    default:
        break;
    }
    if (!supported)
        return sbx_err_new(PLM_UNIMPLEMENTED, PLM_REFUSAL_UNSUPPORTED,
                           "the %s provider runs no %s payloads; nothing ran", f->name,
                           sbx_kind_name(job->kind));
    if (*job->grant_profile && (!grants || in_session))
        return sbx_err_new(PLM_PERMISSION_DENIED, PLM_REFUSAL_PERMISSION,
                           "grant profile \"%.64s\" is not allowed here%s; nothing ran",
                           job->grant_profile, in_session ? " (no grants in sessions)" : "");
    if (job->kind == SBX_KIND_CELL && !(f->session.languages & language_bit(job->language)))
        return sbx_err_new(PLM_FAILED_PRECONDITION, PLM_REFUSAL_ENVIRONMENT,
                           "this session's sandbox has no %s interpreter; nothing ran",
                           job->language);
    if (!plm_meets(tier, req->floor))
        return sbx_err_new(PLM_FAILED_PRECONDITION, PLM_REFUSAL_ISOLATION,
                           "the %s tier here is below the requested floor %s; nothing ran", tier,
                           req->floor);
    if (req->rule && !plm_software_rule_allows(req->rule, software_identity))
        return sbx_err_new(PLM_FAILED_PRECONDITION, PLM_REFUSAL_ENVIRONMENT,
                           *software_identity
                               ? "the selected software %.300s is outside the request's "
                                 "softwareRule; nothing ran"
                               : "this provider states no software identity%.0s, so no "
                                 "softwareRule can be met; nothing ran",
                           software_identity);
    return NULL;
}

sbx_err *sbx_rpc_request_digest(const sbx_request *req, plm_hex hex)
{
    plm_error *perr = plm_request_digest(req->json, hex);
    if (!perr)
        return NULL;
    sbx_err *e = sbx_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST,
                             "the request has no digest (%s); nothing ran",
                             perr->message ? perr->message : "malformed");
    plm_error_free(perr);
    return e;
}

/* ---------------------------------------------------------------- Describe */

static json_t *languages_json(unsigned langs)
{
    json_t *a = json_array();
    if (langs & SBX_LANG_JAVASCRIPT)
        json_array_append_new(a, json_string("javascript"));
    if (langs & SBX_LANG_PYTHON)
        json_array_append_new(a, json_string("python"));
    return a;
}

static void set_env(json_t *o, const char *name, const sbx_env_facts *e)
{
    json_t *env = json_object();
    if (*e->identity)
        json_object_set_new(env, "identity", json_string(e->identity));
    if (e->max_timeout_ms)
        json_object_set_new(env, "maxTimeoutMs", json_integer(e->max_timeout_ms));
    if (*e->software_identity)
        json_object_set_new(env, "softwareIdentity", json_string(e->software_identity));
    if (e->languages)
        json_object_set_new(env, "languages", languages_json(e->languages));
    /* An extension (docs/wire.md §5.1): clients that do not know it ignore it. */
    if (e->n_python_packages) {
        json_t *pk = json_object();
        for (size_t i = 0; i < e->n_python_packages; i++)
            json_object_set_new(pk, e->python_packages[i].name,
                                json_string(e->python_packages[i].version));
        json_object_set_new(env, "pythonPackages", pk);
    }
    if (json_object_size(env))
        json_object_set_new(o, name, env);
    else
        json_decref(env);
}

static void set_flag(json_t *o, const char *name, bool v)
{
    if (v)
        json_object_set_new(o, name, json_true());
}

static void set_u32(json_t *o, const char *name, uint32_t v)
{
    if (v)
        json_object_set_new(o, name, json_integer(v));
}

void sbx_rpc_describe(void *ud, sbx_call *call)
{
    sbx_app *app = ud;
    const sbx_facts *f = app->facts;
    const sbx_config *cfg = app->cfg;
    bool sessions = f->supports_sessions && cfg->max_sessions > 0;
    json_t *d = json_object();
    json_object_set_new(d, "sandbox", json_string(f->name));
    json_object_set_new(d, "isolation", json_string(f->tier));
    set_flag(d, "supportsProject", f->supports_project);
    set_flag(d, "supportsJavascriptGrants", f->supports_javascript_grants);
    set_flag(d, "supportsProjectGrants", f->supports_project_grants);
    set_flag(d, "supportsModule", f->supports_module);
    set_u32(d, "protocol", SBX_PROTOCOL);
    set_env(d, "javascriptEnvironment", &f->javascript);
    set_env(d, "projectEnvironment", &f->project);
    set_env(d, "moduleEnvironment", &f->module);
    json_t *res = json_object();
    set_u32(res, "memoryMb", f->memory_mb);
    if (f->cpus != 0)
        json_object_set_new(res, "cpus", json_real(f->cpus));
    set_u32(res, "pids", f->pids);
    set_u32(res, "diskMb", f->disk_mb);
    if (json_object_size(res))
        json_object_set_new(d, "resources", res);
    else
        json_decref(res);
    if (*f->policy)
        json_object_set_new(d, "policy", json_string(f->policy));
    if (sessions) {
        set_flag(d, "supportsSessions", true);
        set_u32(d, "sessionLifetimeMs", cfg->lifetime_ms);
        set_u32(d, "sessionIdleTimeoutMs", cfg->idle_ms);
        set_env(d, "sessionEnvironment", &f->session);
        set_u32(d, "maxSessionsPerCaller", cfg->max_per_caller);
        set_u32(d, "maxSessionsPerOwner", cfg->max_per_owner);
    }
    sbx_call_reply_json(call, d);
}

/* ---------------------------------------------------------------- Run */

typedef struct run_op {
    sbx_app *app;
    sbx_call *call;
    sbx_request req;
    plm_hex request_sha;
    struct run_op *prev, *next;    /* app->runs, while admitted */
} run_op;

/* Admission (docs/daemon.md §2.1, §6): a slot of --max-concurrent-runs and of the
 * caller's share, or a refusal before anything is dispatched.  Every executing run
 * holds a sandbox of up to --memory-mb, so without it a caller's burst of runs holds
 * as much memory as it likes. */
static sbx_err *admit_run(sbx_app *app, run_op *op)
{
    const sbx_config *cfg = app->cfg;
    /* The share first: a caller over it is told so, whatever the others run. */
    if (cfg->max_runs_per_caller) {
        const char *principal = sbx_call_principal(op->call);
        uint32_t mine = 0;
        for (const run_op *o = app->runs; o; o = o->next)
            mine += strcmp(sbx_call_principal(o->call), principal) == 0;
        if (mine >= cfg->max_runs_per_caller)
            return sbx_err_new(PLM_RESOURCE_EXHAUSTED, PLM_REFUSAL_CAPACITY,
                               "this caller already executes its share of %u runs; nothing "
                               "ran, retry later", cfg->max_runs_per_caller);
    }
    if (app->runs_active >= cfg->max_runs)
        return sbx_err_new(PLM_RESOURCE_EXHAUSTED, PLM_REFUSAL_CAPACITY,
                           "this daemon already executes its limit of %u runs; nothing ran, "
                           "retry later", cfg->max_runs);
    op->next = app->runs;
    if (app->runs)
        app->runs->prev = op;
    app->runs = op;
    app->runs_active++;
    return NULL;
}

static void release_run(run_op *op)
{
    sbx_app *app = op->app;
    if (op->prev)
        op->prev->next = op->next;
    else
        app->runs = op->next;
    if (op->next)
        op->next->prev = op->prev;
    op->prev = op->next = NULL;
    app->runs_active--;
}

static void run_op_free(run_op *op)
{
    sbx_request_clear(&op->req);
    free(op);
}

static void on_run_done(void *ud, sbx_result *res)
{
    run_op *op = ud;
    const sbx_facts *f = op->app->facts;
    sbx_err *err = NULL;
    release_run(op);
    if (res->status != SBX_RUN_ANSWERED) {
        /* A single run has no chain: a lost answer is a plain error (unmarked). */
        err = res->error;
        res->error = NULL;
        if (!err)
            err = sbx_err_new(PLM_INTERNAL, PLM_REFUSAL_NONE, "the provider failed the run");
        sbx_rpc_refuse(op->call, "Run", err);
    } else {
        sbx_record_ctx ctx = {
            .provider = f->name,
            .isolation = f->tier,
            .environment = res->environment,
            .policy = f->policy,
            .software_identity = res->software_identity,
            .software_rule_id = op->req.rule_id,
            .started_ms = sbx_call_started_ms(op->call),
            .ended_ms = sbx_now_ms(),
            .session = "",
        };
        plm_record *rec;
        json_t *answer = sbx_answer(&ctx, res, op->request_sha, &rec, &err);
        if (answer) {
            sbx_log("Run %s for caller %.12s%s%s answered in %lld ms",
                    sbx_kind_name(op->req.job.kind), sbx_call_principal(op->call),
                    op->req.trace_id ? " trace " : "", op->req.trace_id ? op->req.trace_id : "",
                    (long long)(ctx.ended_ms - ctx.started_ms));
            plm_record_free(rec);
            sbx_call_reply_json(op->call, answer);
        } else {
            sbx_rpc_refuse(op->call, "Run", err);
        }
    }
    sbx_result_free(res);
    run_op_free(op);
}

void sbx_rpc_run(void *ud, sbx_call *call)
{
    sbx_app *app = ud;
    run_op *op = sbx_xcalloc(1, sizeof *op);
    op->app = app;
    op->call = call;
    if (!sbx_rpc_read(app, call, SBX_RPC_RUN, &op->req)) {
        free(op);
        return;
    }
    const sbx_facts *f = app->facts;
    const sbx_env_facts *env = op->req.job.kind == SBX_KIND_PROJECT ? &f->project
                               : op->req.job.kind == SBX_KIND_MODULE ? &f->module
                                                                     : &f->javascript;
    sbx_err *err = sbx_rpc_dispatchable(f, &op->req, f->tier, env->software_identity, false);
    if (!err)
        err = sbx_rpc_request_digest(&op->req, op->request_sha);
    if (!err)
        err = admit_run(app, op);
    if (err) {
        sbx_rpc_refuse(call, "Run", err);
        run_op_free(op);
        return;
    }
    app->ops->run(app->provider, &op->req.job, on_run_done, op);
}

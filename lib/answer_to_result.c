/*
 * answer_to_result.c — from checked wire answers to plm_result / plm_info (docs/client.md §2.4–2.5).
 * Any value of the wrong type is a malformed answer (DATA_LOSS), never a crash.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

static int str_field(const json_t *o, const char *camel, const char *snake, char **out,
                     plm_error **err)
{
    const char *s;
    if (plm_jstring(plm_jget(o, camel, snake), camel, &s, err) < 0)
        return -1;
    *out = strdup(s);
    return 0;
}

static int streams(const json_t *r, plm_bytes *out, plm_bytes *err_b, bool *out_t, bool *err_t,
                   plm_error **err)
{
    if (plm_jbytes(plm_jget(r, "stdout", NULL), "stdout", out, err) < 0 ||
        plm_jbytes(plm_jget(r, "stderr", NULL), "stderr", err_b, err) < 0 ||
        plm_jbool(plm_jget(r, "stdoutTruncated", "stdout_truncated"), "stdoutTruncated", out_t, err) < 0 ||
        plm_jbool(plm_jget(r, "stderrTruncated", "stderr_truncated"), "stderrTruncated", err_t, err) < 0)
        return -1;
    return 0;
}

/* A stream's text: its bytes themselves when they are well-formed UTF-8 already (they
 * end in a NUL: plm_bytes), else a lossy copy.  Program output is mostly well-formed,
 * and a copy of 1 MiB was a tenth of what verifying it costs; plm_result_free frees
 * the text only when it is a copy of its own. */
static char *text_of(const plm_bytes *b)
{
    if (b->data && plm_utf8_valid((const char *)b->data, b->len))
        return (char *)b->data;
    return plm_utf8_lossy(b->data ? b->data : (const unsigned char *)"", b->len, NULL);
}

static plm_outcome outcome_of(const json_t *v)
{
    static const char *const names[] = {
        "PROJECT_OUTCOME_UNSPECIFIED", "PROJECT_OUTCOME_COMPLETED", "PROJECT_OUTCOME_SETUP_FAILED",
        "PROJECT_OUTCOME_TIMED_OUT", "PROJECT_OUTCOME_PROTOCOL_ERROR",
    };
    if (json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= 4)
        return (plm_outcome)json_integer_value(v);
    for (int i = 0; json_is_string(v) && i < 5; i++) {
        if (strcmp(json_string_value(v), names[i]) == 0)
            return (plm_outcome)i;
    }
    return PLM_OUTCOME_UNSPECIFIED;
}

static int map_project(const json_t *p, plm_result *r, plm_error **err)
{
    const json_t *arr;
    size_t n;
    r->outcome = outcome_of(plm_jget(p, "outcome", NULL));
    if (str_field(p, "outcomeDetail", "outcome_detail", &r->outcome_detail, err) < 0 ||
        plm_jbool(plm_jget(p, "artifactsTruncated", "artifacts_truncated"), "artifactsTruncated",
                  &r->artifacts_truncated, err) < 0 ||
        plm_jarray(plm_jget(p, "steps", NULL), "steps", &arr, &n, err) < 0)
        return -1;
    r->steps = calloc(n ? n : 1, sizeof *r->steps);
    for (size_t i = 0; r->steps && i < n; i++, r->n_steps++) {
        const json_t *s = json_array_get(arr, i);
        plm_step *st = &r->steps[i];
        if (!json_is_object(s)) {
            *err = plm_err_malformed("a step is not an object");
            return -1;
        }
        if (str_field(s, "command", NULL, &st->command, err) < 0 ||
            plm_jint32(plm_jget(s, "exitCode", "exit_code"), "step exitCode", &st->exit_code, err) < 0 ||
            plm_jbool(plm_jget(s, "timedOut", "timed_out"), "step timedOut", &st->timed_out, err) < 0 ||
            plm_jint64(plm_jget(s, "durationMs", "duration_ms"), "step durationMs", &st->duration_ms, err) < 0 ||
            streams(s, &st->stdout_bytes, &st->stderr_bytes, &st->stdout_truncated,
                    &st->stderr_truncated, err) < 0) {
            r->n_steps++;
            return -1;
        }
    }
    if (plm_jarray(plm_jget(p, "artifacts", NULL), "artifacts", &arr, &n, err) < 0)
        return -1;
    r->artifacts = calloc(n ? n : 1, sizeof *r->artifacts);
    for (size_t i = 0; r->artifacts && i < n; i++, r->n_artifacts++) {
        const json_t *a = json_array_get(arr, i);
        plm_artifact *art = &r->artifacts[i];
        if (str_field(a, "path", NULL, &art->path, err) < 0 ||
            plm_jbytes(plm_jget(a, "content", NULL), "artifact content", &art->content, err) < 0) {
            r->n_artifacts++;
            return -1;
        }
    }
    return 0;
}

plm_error *plm_map_result(const json_t *resp, plm_record *rec, plm_result **out)
{
    plm_error *err = NULL;
    plm_result *r = calloc(1, sizeof *r);
    *out = NULL;
    if (!r) {
        plm_record_free(rec);
        return plm_err_new(PLM_INTERNAL, PLM_REFUSAL_NONE, "plimsoll: out of memory");
    }
    if (rec) {
        r->record = *rec; /* take the members */
        free(rec);
    }
    const json_t *p;
    if (str_field(resp, "sandbox", NULL, &r->sandbox, &err) < 0 ||
        str_field(resp, "isolation", NULL, &r->isolation, &err) < 0 ||
        str_field(resp, "softwareIdentity", "software_identity", &r->software_identity, &err) < 0 ||
        str_field(resp, "environment", NULL, &r->environment, &err) < 0 ||
        plm_jint64(plm_jget(resp, "durationMs", "duration_ms"), "durationMs", &r->duration_ms, &err) < 0)
        goto fail;
    plm_result_kinds(resp, &r->kind);
    if (r->kind == PLM_KIND_JAVASCRIPT || r->kind == PLM_KIND_CELL) {
        p = plm_jget(resp, r->kind == PLM_KIND_CELL ? "cell" : "javascript", NULL);
        if (!json_is_object(p)) {
            err = plm_err_malformed("the result is not an object");
            goto fail;
        }
        if (plm_jint32(plm_jget(p, "exitCode", "exit_code"), "exitCode", &r->exit_code, &err) < 0 ||
            plm_jbool(plm_jget(p, "timedOut", "timed_out"), "timedOut", &r->timed_out, &err) < 0 ||
            streams(p, &r->stdout_bytes, &r->stderr_bytes, &r->stdout_truncated,
                    &r->stderr_truncated, &err) < 0 ||
            plm_jbool(plm_jget(p, "interpreterStarted", "interpreter_started"), "interpreterStarted",
                      &r->interpreter_started, &err) < 0 ||
            plm_jbool(plm_jget(p, "interpreterEnded", "interpreter_ended"), "interpreterEnded",
                      &r->interpreter_ended, &err) < 0)
            goto fail;
        r->stdout_text = text_of(&r->stdout_bytes);
        r->stderr_text = text_of(&r->stderr_bytes);
    } else if (r->kind == PLM_KIND_PROJECT) {
        p = plm_jget(resp, "project", NULL);
        if (!json_is_object(p)) {
            err = plm_err_malformed("the result is not an object");
            goto fail;
        }
        if (map_project(p, r, &err) < 0)
            goto fail;
    }
    *out = r;
    return NULL;
fail:
    plm_result_free(r);
    return err;
}

/* pythonPackages, sandboxd's extension (docs/wire.md §5.1): {name: version}.  Another
 * daemon may shape a field of that name otherwise, so what is not a string is skipped,
 * never an error: it is information, and no run depends on it. */
static void map_packages(const json_t *o, plm_environment *env)
{
    if (!json_is_object(o) || json_object_size(o) == 0)
        return;
    env->python_packages = calloc(json_object_size(o), sizeof *env->python_packages);
    if (!env->python_packages)
        return;
    const char *name;
    json_t *v;
    json_object_foreach((json_t *)o, name, v) {
        const char *version = json_string_value(v);
        if (!version || !*name)
            continue;
        plm_package *pk = &env->python_packages[env->n_python_packages];
        pk->name = strdup(name);
        pk->version = strdup(version);
        if (!pk->name || !pk->version) {
            free(pk->name);
            free(pk->version);
            pk->name = pk->version = NULL;
            break;
        }
        env->n_python_packages++;
    }
}

static int map_env(const json_t *e, plm_environment *env, plm_error **err)
{
    const json_t *langs;
    size_t n;
    if (e && !json_is_null(e) && !json_is_object(e)) {
        *err = plm_err_malformed("an environment is not an object");
        return -1;
    }
    if (str_field(e, "identity", NULL, &env->identity, err) < 0 ||
        str_field(e, "softwareIdentity", "software_identity", &env->software_identity, err) < 0 ||
        plm_juint32(plm_jget(e, "maxTimeoutMs", "max_timeout_ms"), "maxTimeoutMs",
                    &env->max_timeout_ms, err) < 0 ||
        plm_jarray(plm_jget(e, "languages", NULL), "languages", &langs, &n, err) < 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        const char *l = json_string_value(json_array_get(langs, i));
        if (l && strcmp(l, "javascript") == 0) env->javascript = true;
        if (l && strcmp(l, "python") == 0) env->python = true;
    }
    map_packages(plm_jget(e, "pythonPackages", "python_packages"), env);
    return 0;
}

plm_error *plm_map_info(const json_t *a, plm_info **out)
{
    plm_error *err = NULL;
    plm_info *i = calloc(1, sizeof *i);
    *out = NULL;
    if (!i)
        return plm_err_new(PLM_INTERNAL, PLM_REFUSAL_NONE, "plimsoll: out of memory");
    const json_t *res = plm_jget(a, "resources", NULL);
    if (str_field(a, "sandbox", NULL, &i->sandbox, &err) < 0 ||
        str_field(a, "isolation", NULL, &i->isolation, &err) < 0 ||
        str_field(a, "policy", NULL, &i->policy, &err) < 0 ||
        plm_juint32(plm_jget(a, "protocol", NULL), "protocol", &i->protocol, &err) < 0 ||
        plm_jbool(plm_jget(a, "supportsProject", "supports_project"), "supportsProject", &i->supports_project, &err) < 0 ||
        plm_jbool(plm_jget(a, "supportsModule", "supports_module"), "supportsModule", &i->supports_module, &err) < 0 ||
        plm_jbool(plm_jget(a, "supportsJavascriptGrants", "supports_javascript_grants"), "supportsJavascriptGrants", &i->supports_javascript_grants, &err) < 0 ||
        plm_jbool(plm_jget(a, "supportsProjectGrants", "supports_project_grants"), "supportsProjectGrants", &i->supports_project_grants, &err) < 0 ||
        plm_jbool(plm_jget(a, "supportsSessions", "supports_sessions"), "supportsSessions", &i->supports_sessions, &err) < 0 ||
        plm_juint32(plm_jget(a, "sessionLifetimeMs", "session_lifetime_ms"), "sessionLifetimeMs", &i->session_lifetime_ms, &err) < 0 ||
        plm_juint32(plm_jget(a, "sessionIdleTimeoutMs", "session_idle_timeout_ms"), "sessionIdleTimeoutMs", &i->session_idle_timeout_ms, &err) < 0 ||
        plm_juint32(plm_jget(a, "maxSessionsPerCaller", "max_sessions_per_caller"), "maxSessionsPerCaller", &i->max_sessions_per_caller, &err) < 0 ||
        plm_juint32(plm_jget(a, "maxSessionsPerOwner", "max_sessions_per_owner"), "maxSessionsPerOwner", &i->max_sessions_per_owner, &err) < 0 ||
        map_env(plm_jget(a, "javascriptEnvironment", "javascript_environment"), &i->javascript, &err) < 0 ||
        map_env(plm_jget(a, "projectEnvironment", "project_environment"), &i->project, &err) < 0 ||
        map_env(plm_jget(a, "moduleEnvironment", "module_environment"), &i->module, &err) < 0 ||
        map_env(plm_jget(a, "sessionEnvironment", "session_environment"), &i->session, &err) < 0 ||
        plm_juint32(plm_jget(res, "memoryMb", "memory_mb"), "memoryMb", &i->memory_mb, &err) < 0 ||
        plm_juint32(plm_jget(res, "pids", NULL), "pids", &i->pids, &err) < 0 ||
        plm_juint32(plm_jget(res, "diskMb", "disk_mb"), "diskMb", &i->disk_mb, &err) < 0 ||
        plm_jdouble(plm_jget(res, "cpus", NULL), "cpus", &i->cpus, &err) < 0) {
        plm_info_free(i);
        return err;
    }
    *out = i;
    return NULL;
}

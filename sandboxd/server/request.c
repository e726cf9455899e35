/*
 * request.c — request messages into sbx_request, with every check of docs/wire.md §5 and
 * docs/daemon.md §2–3 that needs nothing but the request itself.
 */
#include "request.h"

#include "util.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define RULE_IDENTITY_EXTRA "._:/@+-"
#define NAME_EXTRA "._:-"        /* owner, traceId */

#define BAD(...) sbx_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST, __VA_ARGS__)

const char *sbx_kind_name(sbx_kind kind)
{
    static const char *const names[] = {"", "javascript", "project", "cell", "module"};
    return (unsigned)kind < SBX_ARRAY_LEN(names) ? names[kind] : "";
}

/* ---------------------------------------------------------------- readers */

/* The field under its JSON name or its proto name; null counts as absent. */
static const json_t *field(const json_t *obj, const char *camel, const char *snake)
{
    const json_t *v = json_object_get(obj, camel);
    if (!v && snake)
        v = json_object_get(obj, snake);
    return v && !json_is_null(v) ? v : NULL;
}

/* A string field; absent is "".  `len` may be NULL. */
static sbx_err *read_string(const json_t *obj, const char *camel, const char *snake,
                            const char *what, const char **out, size_t *len)
{
    const json_t *v = field(obj, camel, snake);
    if (!v) {
        *out = "";
        if (len)
            *len = 0;
        return NULL;
    }
    if (!json_is_string(v))
        return BAD("%s must be a string; nothing ran", what);
    *out = json_string_value(v);
    if (len)
        *len = json_string_length(v);
    return NULL;
}

/* An integer field in [min, max]: a JSON integer or a decimal string. */
static sbx_err *read_int(const json_t *obj, const char *camel, const char *snake,
                         const char *what, long long min, long long max, long long *out)
{
    const json_t *v = field(obj, camel, snake);
    *out = 0;
    if (!v)
        return NULL;
    long long n;
    if (json_is_integer(v)) {
        n = json_integer_value(v);
    } else if (json_is_string(v)) {
        const char *s = json_string_value(v);
        char *end;
        if (!*s || json_string_length(v) != strlen(s) || strchr(" \t\n+", *s))
            return BAD("%s must be an integer; nothing ran", what);
        n = strtoll(s, &end, 10);
        if (*end)
            return BAD("%s must be an integer; nothing ran", what);
    } else {
        return BAD("%s must be an integer; nothing ran", what);
    }
    if (n < min || n > max)
        return BAD("%s (%lld) is out of range; nothing ran", what, n);
    *out = n;
    return NULL;
}

static sbx_err *read_u32(const json_t *obj, const char *camel, const char *snake,
                         const char *what, uint32_t *out)
{
    long long n;
    sbx_err *e = read_int(obj, camel, snake, what, 0, UINT32_MAX, &n);
    *out = (uint32_t)n;
    return e;
}

/* A repeated field: absent is an empty array. */
static sbx_err *read_array(const json_t *obj, const char *camel, const char *snake,
                           const char *what, const json_t **out)
{
    const json_t *v = field(obj, camel, snake);
    *out = v;
    if (v && !json_is_array(v))
        return BAD("%s must be a list; nothing ran", what);
    return NULL;
}

/* ---------------------------------------------------------------- the envelope */

sbx_err *sbx_request_protocol(const json_t *body, uint32_t protocol)
{
    const json_t *v = field(body, "protocol", NULL);
    long long n = 0;
    if (v) {
        sbx_err *e = read_int(body, "protocol", NULL, "protocol", 0, UINT32_MAX, &n);
        if (e) {
            e->not_dispatched = PLM_REFUSAL_PROTOCOL;
            return e;
        }
    }
    if (n == 0)
        return sbx_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_PROTOCOL,
                           "the request states no protocol; this daemon serves protocol %u; "
                           "nothing ran", protocol);
    if (n != protocol)
        return sbx_err_new(PLM_UNIMPLEMENTED, PLM_REFUSAL_PROTOCOL,
                           "this daemon serves protocol %u and the request states %lld; "
                           "nothing ran", protocol, n);
    return NULL;
}

static sbx_err *read_floor(sbx_request *req, const json_t *body)
{
    sbx_err *e = read_string(body, "minimumIsolation", "minimum_isolation", "minimumIsolation",
                             &req->floor, NULL);
    if (e)
        return e;
    if (!plm_valid_floor(req->floor))
        return BAD("minimumIsolation \"%.40s\" is not one of process, container, kernel, vm; "
                   "nothing ran", req->floor);
    return NULL;
}

/* Accepted only as [A-Za-z0-9._:-]{1,64}; anything else is dropped without a word. */
static void read_trace_id(sbx_request *req, const json_t *body)
{
    const json_t *v = field(body, "traceId", "trace_id");
    if (v && json_is_string(v) &&
        sbx_charset_ok(json_string_value(v), json_string_length(v), 64, NAME_EXTRA))
        req->trace_id = json_string_value(v);
}

/* exact: one identity; approved: 1 to 32; each 1–256 of [A-Za-z0-9._:/@+-], unique. */
static sbx_err *read_rule(sbx_request *req, const json_t *body)
{
    const json_t *rule = field(body, "softwareRule", "software_rule");
    if (rule && !json_is_object(rule))
        return BAD("softwareRule must be an object; nothing ran");
    const char *mode = "";
    const json_t *ids = NULL;
    sbx_err *e;
    if (rule && ((e = read_string(rule, "mode", NULL, "softwareRule.mode", &mode, NULL)) ||
                 (e = read_array(rule, "identities", NULL, "softwareRule.identities", &ids))))
        return e;
    size_t n = json_array_size(ids);
    if (!*mode) {
        if (n)
            return BAD("softwareRule names identities but no mode (exact or approved); "
                       "nothing ran");
        req->rule_id = sbx_xstrdup("");
        return NULL; /* an empty rule imposes nothing */
    }
    if (strcmp(mode, "exact") == 0) {
        if (n != 1)
            return BAD("softwareRule mode exact takes exactly one identity, not %zu; nothing ran",
                       n);
    } else if (strcmp(mode, "approved") == 0) {
        if (n < 1 || n > 32)
            return BAD("softwareRule mode approved takes 1 to 32 identities, not %zu; "
                       "nothing ran", n);
    } else {
        return BAD("softwareRule.mode \"%.40s\" is not exact or approved; nothing ran", mode);
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *id = json_array_get(ids, i);
        if (!json_is_string(id) || !sbx_charset_ok(json_string_value(id), json_string_length(id),
                                                   256, RULE_IDENTITY_EXTRA))
            return BAD("softwareRule.identities[%zu] must be 1 to 256 characters of "
                       "[A-Za-z0-9._:/@+-]; nothing ran", i);
        for (size_t j = 0; j < i; j++)
            if (json_equal((json_t *)id, json_array_get(ids, j)))
                return BAD("softwareRule.identities[%zu] repeats identity %zu; nothing ran", i, j);
    }
    req->rule = rule;
    req->rule_id = plm_software_rule_id(rule);
    if (!req->rule_id)
        return BAD("softwareRule is malformed; nothing ran");
    return NULL;
}

/* ---------------------------------------------------------------- payloads */

/* Relative, no empty, "." or ".." component, no NUL: a path that cannot leave the work
 * directory or alias another.  `reserved`: nor under .plimsoll/, where the daemon and
 * the clients' fresh-run projects keep their own files (a cell may not write there). */
static const char *unsafe_path(const char *p, size_t len, bool reserved)
{
    if (len == 0)
        return "is empty";
    if (len > SBX_MAX_PATH_BYTES)
        return "is longer than 1024 bytes";
    if (memchr(p, '\0', len))
        return "holds a NUL byte";
    if (p[0] == '/')
        return "is absolute";
    if (p[len - 1] == '/')
        return "ends with /";
    if (reserved && (strncmp(p, ".plimsoll/", 10) == 0 || strcmp(p, ".plimsoll") == 0))
        return "is under the reserved .plimsoll/ directory";
    for (const char *c = p; c < p + len;) {
        const char *slash = memchr(c, '/', (size_t)(p + len - c));
        size_t n = slash ? (size_t)(slash - c) : (size_t)(p + len - c);
        if (n == 0)
            return "has an empty component (//)";
        if (n == 1 && c[0] == '.')
            return "has a . component";
        if (n == 2 && c[0] == '.' && c[1] == '.')
            return "has a .. component";
        c += n + 1;
    }
    return NULL;
}

static sbx_err *read_files(sbx_request *req, const json_t *payload, const char *kind)
{
    const json_t *files;
    char what[48];
    snprintf(what, sizeof what, "%s.files", kind);
    sbx_err *e = read_array(payload, "files", NULL, what, &files);
    if (e)
        return e;
    size_t n = json_array_size(files);
    if (n > SBX_MAX_FILES)
        return BAD("%s has %zu files; at most %d are allowed; nothing ran", what, n, SBX_MAX_FILES);
    req->files = sbx_xcalloc(n, sizeof *req->files);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *f = json_array_get(files, i);
        sbx_file *out = &req->files[i];
        char name[64];
        snprintf(name, sizeof name, "%s[%zu]", what, i);
        if (!json_is_object(f))
            return BAD("%s must be an object {path, content}; nothing ran", name);
        char pname[72], cname[72];
        snprintf(pname, sizeof pname, "%s.path", name);
        snprintf(cname, sizeof cname, "%s.content", name);
        if ((e = read_string(f, "path", NULL, pname, &out->path.data, &out->path.len)) ||
            (e = read_string(f, "content", NULL, cname, &out->content.data, &out->content.len)))
            return e;
        const char *why = unsafe_path(out->path.data, out->path.len, strcmp(kind, "cell") == 0);
        if (why)
            return BAD("%s \"%.100s\" %s; file paths must stay inside the work directory; "
                       "nothing ran", pname, out->path.data, why);
        for (size_t j = 0; j < i; j++)
            if (req->files[j].path.len == out->path.len &&
                memcmp(req->files[j].path.data, out->path.data, out->path.len) == 0)
                return BAD("%s \"%.100s\" repeats file %zu; nothing ran", pname, out->path.data, j);
        total += out->path.len + out->content.len;
        if (total > SBX_MAX_FILE_BYTES)
            return BAD("%s are over the 4 MiB limit at file %zu; nothing ran", what, i);
    }
    req->job.files = req->files;
    req->job.n_files = n;
    return NULL;
}

/* steps or artifacts: lists of strings. */
static sbx_err *read_strings(const json_t *payload, const char *camel, const char *what,
                             size_t max, size_t max_len, bool paths, sbx_bytes **out, size_t *n_out)
{
    const json_t *arr;
    sbx_err *e = read_array(payload, camel, NULL, what, &arr);
    if (e)
        return e;
    size_t n = json_array_size(arr);
    if (n > max)
        return BAD("%s has %zu entries; at most %zu are allowed; nothing ran", what, n, max);
    *out = sbx_xcalloc(n, sizeof **out);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(arr, i);
        if (!json_is_string(v))
            return BAD("%s[%zu] must be a string; nothing ran", what, i);
        sbx_bytes b = {json_string_value(v), json_string_length(v)};
        if (b.len == 0 || b.len > max_len)
            return BAD("%s[%zu] must be 1 to %zu bytes; nothing ran", what, i, max_len);
        const char *why = paths ? unsafe_path(b.data, b.len, false) : NULL;
        if (why)
            return BAD("%s[%zu] \"%.100s\" %s; nothing ran", what, i, b.data, why);
        (*out)[i] = b;
    }
    *n_out = n;
    return NULL;
}

static sbx_err *read_payload(sbx_request *req, const json_t *body)
{
    static const struct { const char *name; sbx_kind kind; } kinds[] = {
        {"javascript", SBX_KIND_JAVASCRIPT}, {"project", SBX_KIND_PROJECT},
        {"cell", SBX_KIND_CELL}, {"module", SBX_KIND_MODULE},
    };
    const json_t *payload = NULL;
    size_t count = 0;
    for (size_t i = 0; i < SBX_ARRAY_LEN(kinds); i++) {
        /* SessionRunRequest has no module member: there it is an unknown field. */
        if (kinds[i].kind == SBX_KIND_MODULE && req->rpc == SBX_RPC_SESSION_RUN)
            continue;
        const json_t *p = field(body, kinds[i].name, NULL);
        if (p) {
            count++;
            payload = p;
            req->job.kind = kinds[i].kind;
        }
    }
    if (count == 0)
        return BAD("the request carries no payload (javascript, project or %s); nothing ran",
                   req->rpc == SBX_RPC_RUN ? "module" : "cell");
    if (count > 1)
        return BAD("the request carries %zu payloads; exactly one is allowed; nothing ran", count);
    const char *kind = sbx_kind_name(req->job.kind);
    if (!json_is_object(payload))
        return BAD("%s must be an object; nothing ran", kind);
    if (req->rpc == SBX_RPC_RUN && req->job.kind == SBX_KIND_CELL)
        return BAD("Run does not take a cell payload: cells run in a session (SessionRun); "
                   "nothing ran");
    sbx_err *e = NULL;
    switch (req->job.kind) {
    case SBX_KIND_JAVASCRIPT:
        if ((e = read_string(payload, "code", NULL, "javascript.code", &req->job.code.data,
                             &req->job.code.len)) ||
            (e = read_string(payload, "grantProfile", "grant_profile", "javascript.grantProfile",
                             &req->job.grant_profile, NULL)))
            return e;
        break;
    case SBX_KIND_PROJECT:
        if ((e = read_string(payload, "grantProfile", "grant_profile", "project.grantProfile",
                             &req->job.grant_profile, NULL)) ||
            (e = read_files(req, payload, "project")) ||
            (e = read_strings(payload, "steps", "project.steps", SBX_MAX_STEPS,
                              SBX_MAX_STEP_BYTES, false, &req->steps, &req->job.n_steps)) ||
            (e = read_strings(payload, "artifacts", "project.artifacts", SBX_MAX_ARTIFACTS,
                              SBX_MAX_PATH_BYTES, true, &req->artifacts, &req->job.n_artifacts)))
            return e;
        req->job.steps = req->steps;
        req->job.artifacts = req->artifacts;
        break;
    case SBX_KIND_CELL:
        if ((e = read_string(payload, "language", NULL, "cell.language", &req->job.language,
                             NULL)) ||
            (e = read_string(payload, "code", NULL, "cell.code", &req->job.code.data,
                             &req->job.code.len)))
            return e;
        if (strcmp(req->job.language, "javascript") != 0 && strcmp(req->job.language, "python") != 0)
            return BAD("cell.language \"%.40s\" is not javascript or python; nothing ran",
                       req->job.language);
        if ((e = read_files(req, payload, "cell")))
            return e;
        break;
    case SBX_KIND_MODULE:
        /* Only its shape: no provider here runs modules, and the capability check
         * comes next. */
        if ((e = read_string(payload, "model", NULL, "module.model", &req->job.code.data,
                             &req->job.code.len)))
            return e;
        break;
    default:
        break;
    }
    if (!req->job.grant_profile)
        req->job.grant_profile = "";
    if (!req->job.language)
        req->job.language = "";
    return NULL;
}

/* ---------------------------------------------------------------- sessions */

static sbx_err *read_session_id(sbx_request *req, const json_t *body)
{
    sbx_err *e = read_string(body, "sessionId", "session_id", "sessionId", &req->session_id, NULL);
    if (!e && !*req->session_id)
        e = BAD("sessionId is required; nothing ran");
    return e;
}

static sbx_err *read_open(sbx_request *req, const json_t *body)
{
    sbx_err *e;
    const json_t *langs;
    const char *owner;
    size_t owner_len;
    if ((e = read_u32(body, "lifetimeMs", "lifetime_ms", "lifetimeMs", &req->lifetime_ms)) ||
        (e = read_u32(body, "idleTimeoutMs", "idle_timeout_ms", "idleTimeoutMs", &req->idle_ms)) ||
        (e = read_array(body, "languages", NULL, "languages", &langs)) ||
        (e = read_string(body, "owner", NULL, "owner", &owner, &owner_len)))
        return e;
    for (size_t i = 0; i < json_array_size(langs); i++) {
        const json_t *l = json_array_get(langs, i);
        const char *name = json_is_string(l) ? json_string_value(l) : NULL;
        if (name && strcmp(name, "javascript") == 0)
            req->languages |= SBX_LANG_JAVASCRIPT;
        else if (name && strcmp(name, "python") == 0)
            req->languages |= SBX_LANG_PYTHON;
        else
            return BAD("languages[%zu] is not a known language (javascript, python); nothing ran",
                       i);
    }
    if (owner_len) { /* "" is proto3's absent: no owner */
        if (!sbx_charset_ok(owner, owner_len, 64, NAME_EXTRA))
            return BAD("owner must be 1 to 64 characters of [A-Za-z0-9._:-]; nothing ran");
        req->owner = owner;
    }
    return NULL;
}

/* ---------------------------------------------------------------- entry points */

sbx_err *sbx_request_parse(sbx_request *req, sbx_rpc rpc, const json_t *body)
{
    memset(req, 0, sizeof *req);
    req->rpc = rpc;
    req->json = body;
    req->floor = "";
    long long protocol;
    sbx_err *e = read_int(body, "protocol", NULL, "protocol", 0, UINT32_MAX, &protocol);
    if (e)
        goto fail;
    req->protocol = (uint32_t)protocol;
    if (rpc != SBX_RPC_CLOSE) {
        read_trace_id(req, body);
        if ((e = read_floor(req, body)) || (e = read_rule(req, body)))
            goto fail;
    }
    long long timeout;
    switch (rpc) {
    case SBX_RPC_RUN:
    case SBX_RPC_SESSION_RUN:
        if ((e = read_int(body, "timeoutMs", "timeout_ms", "timeoutMs", INT32_MIN, INT32_MAX,
                          &timeout)))
            goto fail;
        req->job.timeout_ms = (int32_t)timeout;
        if (rpc == SBX_RPC_SESSION_RUN && (e = read_session_id(req, body)))
            goto fail;
        if ((e = read_payload(req, body)))
            goto fail;
        break;
    case SBX_RPC_OPEN:
        if ((e = read_open(req, body)))
            goto fail;
        break;
    case SBX_RPC_CLOSE:
        if ((e = read_session_id(req, body)))
            goto fail;
        break;
    }
    return NULL;
fail:
    sbx_request_clear(req);
    return e;
}

void sbx_request_clear(sbx_request *req)
{
    free(req->rule_id);
    free(req->files);
    free(req->steps);
    free(req->artifacts);
    req->rule_id = NULL;
    req->files = NULL;
    req->steps = req->artifacts = NULL;
}

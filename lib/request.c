/*
 * request.c — building request bodies (docs/client.md §2.3).  Every string is checked as
 * UTF-8 as it is put in (plm_put_text with lib/utf8.c, json_string elsewhere): an
 * ill-formed one is refused before sending with a message naming the field's path.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#define INT32_CAP 2147483647LL

static plm_error *refuse(const char *fmt, const char *a, long long b)
{
    return plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST, fmt, a ? a : "", b);
}

plm_error *plm_put_text(json_t *obj, const char *key, const char *s, const char *path)
{
    /* One check and one copy of what may be a long text (a cell's code): jansson's
     * json_string would check it again, a character at a time. */
    size_t n = s ? strlen(s) : 0;
    json_t *v = plm_utf8_valid(s, n) ? json_stringn_nocheck(s ? s : "", n) : NULL;
    if (!v)
        return refuse("plimsoll: the %s is not well-formed UTF-8 text%.0lld", path, 0);
    json_object_set_new(obj, key, v);
    return NULL;
}

static bool identity_char(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           strchr("._:/@+-", c) != NULL;
}

static plm_error *check_identity(const char *id)
{
    size_t n = id ? strlen(id) : 0;
    if (n < 1 || n > 256)
        return refuse("plimsoll: a software identity must be 1 to 256 characters (got %s%lld)",
                      "", (long long)n);
    for (size_t i = 0; i < n; i++) {
        if (!identity_char(id[i]))
            return refuse("plimsoll: the software identity %s has a character outside "
                          "[A-Za-z0-9._:/@+-]%.0lld", id, 0);
    }
    return NULL;
}

/* Validates a rule from its JSON form: exact takes one identity, approved 1 to 32,
 * all unique and well-formed. */
static plm_error *check_rule_json(const json_t *rule)
{
    const char *mode = json_string_value(json_object_get(rule, "mode"));
    const json_t *ids = json_object_get(rule, "identities");
    size_t n = json_array_size(ids);
    if (!mode || (strcmp(mode, "exact") != 0 && strcmp(mode, "approved") != 0))
        return refuse("plimsoll: a software rule's mode must be exact or approved, not %s%.0lld",
                      mode, 0);
    if (strcmp(mode, "exact") == 0 && n != 1)
        return refuse("plimsoll: an exact software rule takes exactly one identity (got %s%lld)",
                      "", (long long)n);
    if (n < 1 || n > 32)
        return refuse("plimsoll: an approved software rule takes 1 to 32 identities (got %s%lld)",
                      "", (long long)n);
    for (size_t i = 0; i < n; i++) {
        const char *a = json_string_value(json_array_get(ids, i));
        plm_error *e = check_identity(a);
        if (e)
            return e;
        for (size_t j = 0; j < i; j++) {
            if (strcmp(a, json_string_value(json_array_get(ids, j))) == 0)
                return refuse("plimsoll: the software identity %s is listed twice%.0lld", a, 0);
        }
    }
    return NULL;
}

plm_error *plm_rule_to_json(const plm_software_rule *r, json_t **out)
{
    *out = NULL;
    if (!r)
        return NULL;
    json_t *rule = json_object();
    json_t *ids = json_array();
    json_object_set_new(rule, "mode", json_string(r->mode ? r->mode : ""));
    json_object_set_new(rule, "identities", ids);
    for (size_t i = 0; i < r->n_identities; i++) {
        json_t *s = r->identities ? json_string(r->identities[i] ? r->identities[i] : "") : NULL;
        if (!s) {
            json_decref(rule);
            return refuse("plimsoll: software identity %s%lld is not well-formed text", "#",
                          (long long)i);
        }
        json_array_append_new(ids, s);
    }
    if (!json_string_value(json_object_get(rule, "mode"))) {
        json_decref(rule);
        return refuse("plimsoll: the software rule's mode is not well-formed text%s%.0lld", "", 0);
    }
    plm_error *e = check_rule_json(rule);
    if (e) {
        json_decref(rule);
        return e;
    }
    *out = rule;
    return NULL;
}

/* A session's rule and a call's rule narrow to their intersection, in the session
 * rule's order: one identity left is exact, more are approved (docs/client.md §2.3). */
plm_error *plm_rule_merge(const json_t *srule, const json_t *crule, json_t **out)
{
    *out = NULL;
    if (!srule && !crule)
        return NULL;
    if (!srule || !crule) {
        *out = json_deep_copy(srule ? srule : crule);
        return NULL;
    }
    json_t *ids = json_array();
    size_t i, j;
    const json_t *a, *b;
    json_array_foreach(json_object_get(srule, "identities"), i, a) {
        json_array_foreach(json_object_get(crule, "identities"), j, b) {
            if (json_equal(a, b)) {
                json_array_append(ids, (json_t *)a);
                break;
            }
        }
    }
    if (json_array_size(ids) == 0) {
        json_decref(ids);
        return refuse("plimsoll: the call's software rule shares no identity with the "
                      "session's%s%.0lld", "", 0);
    }
    json_t *rule = json_object();
    json_object_set_new(rule, "mode", json_string(json_array_size(ids) == 1 ? "exact" : "approved"));
    json_object_set_new(rule, "identities", ids);
    *out = rule;
    return NULL;
}

plm_error *plm_files_to_json(const plm_file *f, size_t n, const char *path, json_t **out)
{
    if (!f && n > 0) {
        *out = NULL;
        return refuse("plimsoll: the %s.files list is NULL but counts %lld entries", path,
                      (long long)n);
    }
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_object();
        char p[160];
        snprintf(p, sizeof p, "%s.files[%zu].path", path, i);
        plm_error *e = plm_put_text(o, "path", f ? f[i].path : "", p);
        if (!e) {
            snprintf(p, sizeof p, "%s.files[%zu].content", path, i);
            e = plm_put_text(o, "content", f ? f[i].content : "", p);
        }
        json_array_append_new(arr, o);
        if (e) {
            json_decref(arr);
            *out = NULL;
            return e;
        }
    }
    *out = arr;
    return NULL;
}

static plm_error *strings_to_json(const char *const *v, size_t n, const char *path, json_t **out)
{
    if (!v && n > 0) {
        *out = NULL;
        return refuse("plimsoll: the %s list is NULL but counts %lld entries", path, (long long)n);
    }
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_string(v[i] ? v[i] : "");
        if (!s) {
            json_decref(arr);
            *out = NULL;
            return refuse("plimsoll: the %s is not well-formed UTF-8 text (entry %lld)", path,
                          (long long)i);
        }
        json_array_append_new(arr, s);
    }
    *out = arr;
    return NULL;
}

plm_error *plm_project_to_json(const plm_project *p, const char *grant, json_t **out)
{
    json_t *o = json_object(), *v;
    plm_error *e;
    *out = NULL;
    if ((e = plm_files_to_json(p->files, p->n_files, "request.project", &v)))
        goto fail;
    json_object_set_new(o, "files", v);
    if ((e = strings_to_json(p->steps, p->n_steps, "request.project.steps", &v)))
        goto fail;
    json_object_set_new(o, "steps", v);
    if ((e = strings_to_json(p->artifacts, p->n_artifacts, "request.project.artifacts", &v)))
        goto fail;
    json_object_set_new(o, "artifacts", v);
    if (grant && *grant && (e = plm_put_text(o, "grantProfile", grant, "request.project.grantProfile")))
        goto fail;
    *out = o;
    return NULL;
fail:
    json_decref(o);
    return e;
}

plm_error *plm_envelope(json_t *req, const plm_run_options *o, const char *floor, json_t *rule)
{
    plm_error *e;
    json_object_set_new(req, "protocol", json_integer(PLIMSOLL_PROTOCOL));
    if (!plm_valid_floor(floor)) {
        json_decref(rule);
        return refuse("plimsoll: minimumIsolation %s is not process, container, kernel or vm%.0lld",
                      floor, 0);
    }
    if (floor && *floor)
        json_object_set_new(req, "minimumIsolation", json_string(floor));
    if (o && o->trace_id && (e = plm_put_text(req, "traceId", o->trace_id, "request.traceId"))) {
        json_decref(rule);
        return e;
    }
    if (o && o->timeout_ms > 0)
        json_object_set_new(req, "timeoutMs",
                            json_integer(o->timeout_ms > INT32_CAP ? INT32_CAP : o->timeout_ms));
    if (rule)
        json_object_set_new(req, "softwareRule", rule);
    return NULL;
}

plm_error *plm_check_cancel(const plm_cancel *c, const char *method)
{
    if (plm_cancel_fired(c))
        return plm_err_new(PLM_CANCELED, PLM_REFUSAL_REQUEST,
                           "plimsoll: %s: cancelled before sending; nothing was sent", method);
    return NULL;
}

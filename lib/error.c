/*
 * error.c — error values: construction, names of codes, refusals and session ends.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const code_names[] = {
    "ok", "canceled", "unknown", "invalid_argument", "deadline_exceeded", "not_found",
    "already_exists", "permission_denied", "resource_exhausted", "failed_precondition",
    "aborted", "out_of_range", "unimplemented", "internal", "unavailable", "data_loss",
    "unauthenticated",
};

static const char *const refusal_names[] = {
    "unknown", "request", "permission", "protocol", "unsupported", "isolation",
    "capacity", "environment",
};

static const char *const end_names[] = {
    "open", "closed", "expired", "disk_exceeded", "main_process_ended", "boundary_failed",
    "sandbox_changed", "shutdown", "replaced", "not_found", "unclaimed", "unknown",
};

const char *plm_code_name(plm_code code)
{
    if ((int)code < 0 || (size_t)code >= PLM_ARRAY_LEN(code_names))
        return "unknown";
    return code_names[code];
}

bool plm_code_parse(const char *name, plm_code *out)
{
    if (!name || !out)
        return false;
    for (size_t i = 1; i < PLM_ARRAY_LEN(code_names); i++) {
        if (strcmp(name, code_names[i]) == 0) {
            *out = (plm_code)i;
            return true;
        }
    }
    return false;
}

const char *plm_refusal_name(plm_refusal r)
{
    if ((int)r < 0 || (size_t)r >= PLM_ARRAY_LEN(refusal_names))
        return NULL;
    return refusal_names[r];
}

const char *plm_session_end_name(plm_session_end e)
{
    if ((int)e < 0 || (size_t)e >= PLM_ARRAY_LEN(end_names))
        return "unknown";
    return end_names[e];
}

/* Any value other than absent / 0 / UNSPECIFIED is an end; an unknown one is
 * "ended, reason unknown", never open (docs/client.md §4.1). */
plm_session_end plm_session_end_from_json(const json_t *v)
{
    if (!v || json_is_null(v))
        return PLM_END_OPEN;
    if (json_is_integer(v)) {
        json_int_t n = json_integer_value(v);
        if (n == 0)
            return PLM_END_OPEN;
        if (n >= 1 && n <= 10)
            return (plm_session_end)n;
        return PLM_END_UNKNOWN;
    }
    if (!json_is_string(v))
        return PLM_END_UNKNOWN;
    const char *s = json_string_value(v);
    if (strncmp(s, "SESSION_END_", 12) == 0)
        s += 12;
    if (strcmp(s, "UNSPECIFIED") == 0 || *s == '\0')
        return PLM_END_OPEN;
    for (int i = 1; i <= 10; i++) {
        if (strcasecmp(s, end_names[i]) == 0)
            return (plm_session_end)i;
    }
    return PLM_END_UNKNOWN;
}

char *plm_strdup(const char *s)
{
    return s ? strdup(s) : NULL;
}

char *plm_strdup_or_empty(const char *s)
{
    return strdup(s ? s : "");
}

static char *vprintf_alloc(const char *fmt, va_list ap)
{
    char *out = NULL;
    if (vasprintf(&out, fmt, ap) < 0)
        return NULL;
    return out;
}

char *plm_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = vprintf_alloc(fmt, ap);
    va_end(ap);
    return s;
}

plm_error *plm_err_new(plm_code code, plm_refusal mark, const char *fmt, ...)
{
    plm_error *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->code = code;
    e->not_dispatched = mark;
    e->session_ended = PLM_END_OPEN;
    va_list ap;
    va_start(ap, fmt);
    e->message = vprintf_alloc(fmt, ap);
    va_end(ap);
    return e;
}

plm_error *plm_err_malformed(const char *what)
{
    return plm_err_new(PLM_DATA_LOSS, PLM_REFUSAL_NONE,
                       "plimsoll: the daemon's answer is malformed (%s)", what);
}

void plm_err_prefix(plm_error *e, const char *prefix)
{
    if (!e || !prefix)
        return;
    char *m = plm_printf("%s: %s", prefix, e->message ? e->message : "");
    if (m) {
        free(e->message);
        e->message = m;
    }
}

plm_error *plm_err_copy(const plm_error *src)
{
    plm_error *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    *e = *src;
    e->message = plm_strdup(src->message);
    e->session_ended_detail = plm_strdup(src->session_ended_detail);
    e->cause = plm_strdup(src->cause);
    e->wire = src->wire ? json_deep_copy(src->wire) : NULL;
    e->result = NULL; /* mapped results are not copied; the wire form is */
    e->unanswered = src->unanswered ? plm_record_copy(src->unanswered) : NULL;
    e->record = src->record ? plm_record_copy(src->record) : NULL;
    return e;
}

void plm_error_free(plm_error *e)
{
    if (!e)
        return;
    free(e->message);
    free(e->session_ended_detail);
    free(e->cause);
    json_decref(e->wire);
    plm_result_free(e->result);
    plm_record_free(e->unanswered);
    plm_record_free(e->record);
    free(e);
}

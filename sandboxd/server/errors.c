/*
 * errors.c — building refusals and their Connect error bodies.
 */
#include "errors.h"

#include "details.h"
#include "util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static char *vformat(const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0)
        return sbx_xstrdup("(unprintable message)");
    char *s = sbx_xmalloc((size_t)n + 1);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    return s;
}

sbx_err *sbx_err_new(plm_code code, plm_refusal reason, const char *fmt, ...)
{
    sbx_err *e = sbx_xcalloc(1, sizeof *e);
    e->code = code;
    e->not_dispatched = reason;
    e->ended = PLM_END_OPEN;
    va_list ap;
    va_start(ap, fmt);
    e->message = vformat(fmt, ap);
    va_end(ap);
    return e;
}

sbx_err *sbx_err_session(plm_code code, plm_session_end end, const char *detail,
                         const char *fmt, ...)
{
    sbx_err *e = sbx_xcalloc(1, sizeof *e);
    e->code = code;
    /* A call refused because of its session ran nothing; clients key on SessionEnded. */
    e->not_dispatched = PLM_REFUSAL_REQUEST;
    e->ended = end;
    e->end_detail = sbx_xstrdup(detail);
    va_list ap;
    va_start(ap, fmt);
    e->message = vformat(fmt, ap);
    va_end(ap);
    return e;
}

void sbx_err_free(sbx_err *e)
{
    if (!e)
        return;
    free(e->message);
    free(e->end_detail);
    plm_record_free(e->unanswered);
    free(e);
}

unsigned sbx_http_status(plm_code code)
{
    switch (code) {
    case PLM_OK: return 200;
    case PLM_CANCELED: return 499;
    case PLM_INVALID_ARGUMENT: return 400;
    case PLM_DEADLINE_EXCEEDED: return 504;
    case PLM_NOT_FOUND: return 404;
    case PLM_ALREADY_EXISTS: return 409;
    case PLM_PERMISSION_DENIED: return 403;
    case PLM_RESOURCE_EXHAUSTED: return 429;
    case PLM_FAILED_PRECONDITION: return 400;
    case PLM_ABORTED: return 409;
    case PLM_OUT_OF_RANGE: return 400;
    case PLM_UNIMPLEMENTED: return 501;
    case PLM_UNAVAILABLE: return 503;
    case PLM_UNAUTHENTICATED: return 401;
    case PLM_UNKNOWN:
    case PLM_INTERNAL:
    case PLM_DATA_LOSS:
    default: return 500;
    }
}

static void add_detail(json_t *details, const char *type, char *value)
{
    json_array_append_new(details, json_pack("{s:s, s:s}", "type", type, "value", value));
    free(value);
}

json_t *sbx_err_body(const sbx_err *e)
{
    json_t *body = json_pack("{s:s, s:s}", "code", plm_code_name(e->code), "message",
                             e->message ? e->message : "");
    json_t *details = json_array();
    if (e->not_dispatched != PLM_REFUSAL_NONE)
        add_detail(details, "plimsoll.v1.NotDispatched",
                   sbx_detail_not_dispatched(e->not_dispatched));
    if (e->ended != PLM_END_OPEN)
        add_detail(details, "plimsoll.v1.SessionEnded",
                   sbx_detail_session_ended(e->ended, e->end_detail));
    /* A marked refusal ran nothing, so it never carries an unanswered record. */
    if (e->unanswered && e->not_dispatched == PLM_REFUSAL_NONE)
        add_detail(details, "plimsoll.v1.UnansweredCall", sbx_detail_unanswered(e->unanswered));
    if (json_array_size(details))
        json_object_set_new(body, "details", details);
    else
        json_decref(details);
    return body;
}

const char *sbx_end_json_name(plm_session_end e)
{
    static const char *const names[] = {
        "SESSION_END_UNSPECIFIED", "SESSION_END_CLOSED", "SESSION_END_EXPIRED",
        "SESSION_END_DISK_EXCEEDED", "SESSION_END_MAIN_PROCESS_ENDED",
        "SESSION_END_BOUNDARY_FAILED", "SESSION_END_SANDBOX_CHANGED", "SESSION_END_SHUTDOWN",
        "SESSION_END_REPLACED", "SESSION_END_NOT_FOUND", "SESSION_END_UNCLAIMED",
    };
    if ((int)e < 0 || (size_t)e >= SBX_ARRAY_LEN(names))
        return "SESSION_END_UNSPECIFIED";
    return names[e];
}

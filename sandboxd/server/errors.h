/*
 * errors.h — a refusal or failure on its way to the caller, and its Connect body.
 *
 * The codes, refusal reasons and session ends are the wire enums of plimsoll.h
 * (plm_code, plm_refusal, plm_session_end): their numbers are the protobuf numbers.
 */
#ifndef SBX_ERRORS_H
#define SBX_ERRORS_H

#include "plimsoll.h"

#include <jansson.h>

typedef struct sbx_err {
    plm_code code;
    char *message;
    plm_refusal not_dispatched;  /* PLM_REFUSAL_NONE: no NotDispatched detail (may have run) */
    plm_session_end ended;       /* PLM_END_OPEN: no SessionEnded detail */
    char *end_detail;
    plm_record *unanswered;      /* a v3 record for an UnansweredCall detail, or NULL */
    /* HTTP layer only: the Plimsoll-Not-Dispatched header ("request", "unsupported")
     * of an answer written before any procedure handler was reached. */
    const char *nd_header;
    unsigned http_status;        /* 0: Connect's mapping of `code` */
} sbx_err;

/* A refusal that ran nothing (reason != PLM_REFUSAL_NONE) or a failure (NONE). */
sbx_err *sbx_err_new(plm_code code, plm_refusal reason, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A session call refused because of its session: adds SessionEnded{end, detail}. */
sbx_err *sbx_err_session(plm_code code, plm_session_end end, const char *detail,
                         const char *fmt, ...) __attribute__((format(printf, 4, 5)));
void sbx_err_free(sbx_err *e);

/* Connect's HTTP status for a code (docs/wire.md §6.1). */
unsigned sbx_http_status(plm_code code);
/* The Connect error body: {"code", "message", "details": [...]}. */
json_t *sbx_err_body(const sbx_err *e);
/* The JSON spelling of a SessionEnd ("SESSION_END_CLOSED"). */
const char *sbx_end_json_name(plm_session_end e);

#endif

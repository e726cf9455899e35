/*
 * request.h — reading and validating request messages (docs/wire.md §5) into typed
 * values.  Every refusal here ran nothing: invalid_argument with NotDispatched
 * {request} (or {protocol} for the protocol number), and a message naming the field.
 *
 * Field names are read in lowerCamelCase, then snake_case, as protobuf JSON parsers
 * do; int32/uint32 fields take numbers or decimal strings.
 */
#ifndef SBX_REQUEST_H
#define SBX_REQUEST_H

#include "errors.h"
#include "provider.h"

#include <jansson.h>
#include <stdint.h>

#define SBX_MAX_FILES 200
#define SBX_MAX_FILE_BYTES (4u << 20)  /* paths and contents of one payload together */
#define SBX_MAX_STEPS 64
#define SBX_MAX_STEP_BYTES (64u << 10)
#define SBX_MAX_ARTIFACTS 200
#define SBX_MAX_PATH_BYTES 1024

typedef enum sbx_rpc { SBX_RPC_RUN, SBX_RPC_OPEN, SBX_RPC_SESSION_RUN, SBX_RPC_CLOSE } sbx_rpc;

typedef struct sbx_request {
    sbx_rpc rpc;
    const json_t *json;            /* the body, borrowed */
    uint32_t protocol;
    const char *floor;             /* "" when none */
    const char *trace_id;          /* NULL when absent or not well-formed (dropped) */
    const json_t *rule;            /* NULL when no rule */
    char *rule_id;                 /* softwareRuleId, "" when no rule */
    const char *session_id;        /* SessionRun, CloseSession */
    uint32_t lifetime_ms, idle_ms; /* OpenSession, 0 = the daemon's */
    unsigned languages;            /* OpenSession hint, SBX_LANG_* */
    const char *owner;             /* OpenSession, NULL when none */
    sbx_job job;                   /* Run, SessionRun */
    /* storage behind job's arrays */
    sbx_file *files;
    sbx_bytes *steps, *artifacts;
} sbx_request;

/* The protocol number, checked before anything else of the body is read. */
sbx_err *sbx_request_protocol(const json_t *body, uint32_t protocol);
/* Reads and validates the rest.  On error the request is cleared. */
sbx_err *sbx_request_parse(sbx_request *req, sbx_rpc rpc, const json_t *body);
void sbx_request_clear(sbx_request *req);

/* "javascript", "project", "cell", "module". */
const char *sbx_kind_name(sbx_kind kind);

#endif

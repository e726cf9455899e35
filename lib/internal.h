/*
 * internal.h — helpers shared by libplimsoll's source files.  Not installed.
 */
#ifndef PLIMSOLL_INTERNAL_H
#define PLIMSOLL_INTERNAL_H

#include "json_text.h"
#include "plimsoll.h"

#include <stdarg.h>

#define PLM_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---- errors (error.c) */
plm_error *plm_err_new(plm_code code, plm_refusal mark, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The reference's wording for an answer whose shape is wrong. */
plm_error *plm_err_malformed(const char *what);
plm_error *plm_err_copy(const plm_error *e);
/* Prefix an error's message: "<prefix>: <message>". */
void plm_err_prefix(plm_error *e, const char *prefix);
char *plm_strdup(const char *s);       /* NULL stays NULL */
char *plm_strdup_or_empty(const char *s);
char *plm_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- UTF-8 (utf8.c): public, in plimsoll.h */

/* ---- base64 (base64.c), through OpenSSL */
/* Lenient decode: standard or URL-safe alphabet, padding optional.  Returns 0 and a
 * malloc'd buffer (NUL-terminated, *len excludes it) or -1 when the text is not base64. */
int plm_base64_decode(const char *text, size_t text_len, unsigned char **out, size_t *len);
/* (the encoder, plm_base64_encode, is json_text.h's: sandboxd writes bytes too) */

/* ---- JSON readers (json.c).  proto3 JSON: absent or null is the zero value; names
 * are looked up in lowerCamelCase, then snake_case.  On a wrong type each returns -1
 * and sets *err to PLM_DATA_LOSS "the daemon's answer is malformed (<what> …)". */
const json_t *plm_jget(const json_t *obj, const char *camel, const char *snake);
int plm_jstring(const json_t *v, const char *what, const char **out, plm_error **err);
int plm_jbool(const json_t *v, const char *what, bool *out, plm_error **err);
int plm_jint64(const json_t *v, const char *what, int64_t *out, plm_error **err);
int plm_juint64(const json_t *v, const char *what, uint64_t *out, plm_error **err);
int plm_jint32(const json_t *v, const char *what, int32_t *out, plm_error **err);
int plm_juint32(const json_t *v, const char *what, uint32_t *out, plm_error **err);
int plm_jdouble(const json_t *v, const char *what, double *out, plm_error **err);
int plm_jbytes(const json_t *v, const char *what, plm_bytes *out, plm_error **err);
/* A repeated field: NULL for absent/null (n = 0), else the array. */
int plm_jarray(const json_t *v, const char *what, const json_t **arr, size_t *n, plm_error **err);
/* Strict 64-bit record integers (records: 1–20 digits or a JSON integer within 2^53). */
int plm_jrecord_int(const json_t *v, const char *field, bool is_signed, int64_t *s, uint64_t *u,
                    plm_error **err);

/* ---- protobuf error details (details.c) */
typedef struct plm_details {
    bool has_not_dispatched;
    plm_refusal reason;
    bool has_session_ended;
    plm_session_end end;
    char *end_detail;
    plm_record *unanswered;
} plm_details;
/* Reads a Connect error body's `details` array; undecodable entries are ignored. */
void plm_details_parse(const json_t *details, plm_details *out);
void plm_details_clear(plm_details *d);

/* ---- tiers (digest.c) */
int plm_tier_rank(const char *tier);  /* -1 unknown, 0 none … 4 vm */

/* ---- answer verification (verify.c): docs/records.md §7 */
typedef struct plm_chain {
    const char *fingerprint;
    uint64_t last_sequence;
    const char *last_sha256;
} plm_chain;

/* Which check an answer failed; the names are those of golden-vectors.json. */
typedef enum plm_check {
    PLM_CHECK_OK = 0,
    PLM_CHECK_FLOOR_INVALID,   /* the request's own floor is not a floor */
    PLM_CHECK_NO_RECORD,
    PLM_CHECK_VERSION,
    PLM_CHECK_MALFORMED,       /* a record field of the wrong type */
    PLM_CHECK_REQUEST_DIGEST,
    PLM_CHECK_RESULT_DIGEST,
    PLM_CHECK_PROVIDER,        /* "provider or isolation" */
    PLM_CHECK_ENVIRONMENT,
    PLM_CHECK_SOFTWARE,
    PLM_CHECK_RECORD_DIGEST,
    PLM_CHECK_SESSION_FIELDS,  /* "session fields on a single run" */
    PLM_CHECK_CHAIN,
    PLM_CHECK_RESULT_COUNT,
    PLM_CHECK_KIND,
    PLM_CHECK_FLOOR,
    PLM_CHECK_EVIDENCE,        /* unanswered record vs the session's evidence from open */
} plm_check;

const char *plm_check_name(plm_check c);

/* Verifies an answered call: `req` as sent, `resp` the RunResponse as received, `chain`
 * NULL for a single run.  Returns PLM_CHECK_OK and the checked record in *rec, or the
 * first failed check with a DATA_LOSS error (message without a method prefix); after a
 * late failure (result count, kind, floor) *rec still holds the checked record. */
plm_check plm_verify_answer(const json_t *req, const json_t *resp, const plm_chain *chain,
                            plm_record **rec, plm_error **err);
/* The same, digesting the result from `mapped` (the answer already mapped) when it is
 * a javascript or cell result, so its output is decoded once. */
plm_check plm_verify_mapped(const json_t *req, const json_t *resp, const plm_result *mapped,
                            const plm_chain *chain, plm_record **rec, plm_error **err);
plm_error *plm_result_digest_mapped(const plm_result *r, plm_hex hex);
/* Verifies the v3 record of an unanswered session call (docs/records.md §7.2). */
plm_check plm_verify_unanswered(const json_t *req, const plm_record *rec, const plm_chain *chain,
                                plm_error **err);
/* The result kinds present in a RunResponse, and the kind a request asks for. */
plm_kind plm_request_kind(const json_t *req);
int plm_result_kinds(const json_t *resp, plm_kind *first);

/* ---- cancellation listeners (cancel.c) */
typedef struct plm_listener {
    void (*fn)(struct plm_listener *l);
    struct plm_listener *prev, *next;
    plm_cancel *owner;
} plm_listener;
void plm_cancel_listen(plm_cancel *c, plm_listener *l);
void plm_cancel_unlisten(plm_listener *l);

/* ---- transport (transport.c): one Connect unary exchange over libcurl multi on libev */
typedef struct plm_http plm_http;
typedef struct plm_exchange {
    /* outcome, valid in the done callback */
    plm_error *transport_err;   /* set when no HTTP answer was read */
    long status;
    char *body;                 /* NUL-terminated; unless empty, PLM_JSON_PADDING more
                                   bytes follow (for plm_json_read) */
    size_t body_len;
    bool bound;                 /* exactly our Plimsoll-Request-Id came back */
    plm_refusal header_mark;    /* Plimsoll-Not-Dispatched, NONE when absent/unknown */
    char request_id[33];
} plm_exchange;

typedef void (*plm_exchange_cb)(void *ud, plm_exchange *x);

typedef struct plm_http_config {
    const char *base_url, *token, *ca_file;
    long timeout_ms;
    bool loopback;              /* the daemon is on this machine: never through a proxy */
} plm_http_config;

plm_http *plm_http_new(struct ev_loop *loop, const plm_http_config *cfg);
/* Cancels every exchange in flight (their callbacks run with PLM_CANCELED) and frees. */
void plm_http_free(plm_http *h);
/* Starts POST <base>/plimsoll.v1.SandboxService/<method> with `body` (taken; `len`
 * bytes).  The callback runs exactly once, from the loop; `x` is valid only during
 * the callback. */
int plm_http_post(plm_http *h, const char *method, char *body, size_t len, plm_cancel *cancel,
                  plm_exchange_cb cb, void *ud);

/* ---- the client (client.c) and its RPC layer */
struct plm_client {
    struct ev_loop *loop;
    bool own_loop;
    plm_http *http;
    plm_json_reader *reader;    /* the answers' */
    char *token, *js_grant, *project_grant;
    long timeout_ms;
};

/* The answer of one RPC after transport, binding and error mapping: on success `answer`
 * is the body, a JSON object (the callee takes a reference). */
typedef void (*plm_rpc_cb)(void *ud, plm_error *err, json_t *answer);
/* Sends `req` (borrowed).  Returns NULL when started, else the error (cb not called). */
plm_error *plm_rpc(plm_client *c, const char *method, const json_t *req, plm_cancel *cancel,
                   plm_rpc_cb cb, void *ud);

/* ---- request building (request.c).  Each returns NULL or an invalid_argument error
 * marked `request`; nothing is sent when one fails. */
plm_error *plm_put_text(json_t *obj, const char *key, const char *s, const char *path);
plm_error *plm_rule_to_json(const plm_software_rule *r, json_t **out);
plm_error *plm_rule_merge(const json_t *session_rule, const json_t *call_rule, json_t **out);
plm_error *plm_files_to_json(const plm_file *f, size_t n, const char *path, json_t **out);
/* protocol, minimumIsolation, traceId, timeoutMs, softwareRule (taken) into `req`. */
plm_error *plm_envelope(json_t *req, const plm_run_options *o, const char *floor, json_t *rule);
plm_error *plm_project_to_json(const plm_project *p, const char *grant, json_t **out);
plm_error *plm_check_cancel(const plm_cancel *c, const char *method);

/* ---- answer mapping (answer_to_result.c) */
/* Maps a checked RunResponse; takes `rec`.  Malformed values are DATA_LOSS. */
plm_error *plm_map_result(const json_t *resp, plm_record *rec, plm_result **out);
plm_error *plm_map_info(const json_t *ans, plm_info **out);

/* Checks and maps an answered run (client.c); `checked` (optional) receives a copy of
 * the record whenever it checked and chained, even if a later check failed. */
plm_check plm_finish_answer(const char *method, const json_t *req, json_t *resp,
                            const plm_chain *chain, plm_error **err, plm_result **out,
                            plm_record **checked);

struct ev_loop *plm_session_loop(plm_session *s);

#endif

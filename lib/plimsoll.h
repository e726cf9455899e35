/*
 * plimsoll.h — libplimsoll, a verified client for the plimsoll code-execution
 * sandbox protocol (protocol 3).
 *
 * A plimsoll daemon runs untrusted Python or JavaScript in an isolated sandbox and
 * answers with a run record whose SHA-256 digests cover what was asked and what came
 * back.  This library recomputes those digests on every answer, follows session
 * chains, binds every answer to its request id and checks the isolation tier, so a
 * lying, broken or downgraded daemon is reported as PLM_DATA_LOSS, never believed.
 *
 * Model:
 *   - Asynchronous on a caller-supplied libev loop.  Every operation takes a
 *     completion callback and returns at once.  The callback runs on the loop,
 *     never from inside a libcurl callback, exactly once per started operation.
 *   - An operation that fails before any I/O (bad arguments, ill-formed UTF-8, an
 *     already-cancelled handle, a stopped session) returns its error directly and
 *     never calls the callback.  Such errors are marked not dispatched.
 *   - Ownership: every plm_error, plm_result, plm_info and plm_close_summary handed
 *     to a callback or returned belongs to the caller, who frees it with the
 *     matching *_free function.  Strings in option structs are copied.
 *   - One loop thread: a client and everything made from it must be used from the
 *     thread that runs its loop.  No globals; call plm_global_init() once per
 *     process before any thread starts (it initialises libcurl).
 *   - Session ids are capabilities.  They live only inside this library: they are
 *     never logged, never part of an error message, never returned to the caller.
 *     A session is known to callers by its fingerprint (SHA-256 of the id).
 *
 * The blocking wrappers (plm_*_sync) run the client's own loop until the operation
 * completes; use them only with a client created with a NULL loop (a private one).
 */
#ifndef PLIMSOLL_H
#define PLIMSOLL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PLIMSOLL_VERSION "0.1.0"
#define PLIMSOLL_PROTOCOL 3                    /* the protocol number this client speaks */
#define PLM_DEFAULT_REQUEST_TIMEOUT_MS 360000  /* each HTTP exchange, like the reference */
#define PLM_MAX_ANSWER_BYTES (32u << 20)       /* larger answers are resource_exhausted */

struct ev_loop;

/* ---------------------------------------------------------------- errors */

/* The 16 Connect codes (docs/wire.md §6.1).  PLM_OK is not an error code. */
typedef enum plm_code {
    PLM_OK = 0,
    PLM_CANCELED,
    PLM_UNKNOWN,
    PLM_INVALID_ARGUMENT,
    PLM_DEADLINE_EXCEEDED,
    PLM_NOT_FOUND,
    PLM_ALREADY_EXISTS,
    PLM_PERMISSION_DENIED,
    PLM_RESOURCE_EXHAUSTED,
    PLM_FAILED_PRECONDITION,
    PLM_ABORTED,
    PLM_OUT_OF_RANGE,
    PLM_UNIMPLEMENTED,
    PLM_INTERNAL,
    PLM_UNAVAILABLE,
    PLM_DATA_LOSS,
    PLM_UNAUTHENTICATED
} plm_code;

/* Why nothing ran.  PLM_REFUSAL_NONE means the call MAY HAVE RUN (whatever the code);
 * every other value, PLM_REFUSAL_UNKNOWN included, means certainly nothing ran. */
typedef enum plm_refusal {
    PLM_REFUSAL_NONE = -1,
    PLM_REFUSAL_UNKNOWN = 0,
    PLM_REFUSAL_REQUEST = 1,
    PLM_REFUSAL_PERMISSION = 2,
    PLM_REFUSAL_PROTOCOL = 3,
    PLM_REFUSAL_UNSUPPORTED = 4,
    PLM_REFUSAL_ISOLATION = 5,
    PLM_REFUSAL_CAPACITY = 6,
    PLM_REFUSAL_ENVIRONMENT = 7
} plm_refusal;

/* How a session ended (wire enum numbers).  PLM_END_OPEN: not ended.
 * PLM_END_UNKNOWN: ended for a reason this client cannot name — never "open". */
typedef enum plm_session_end {
    PLM_END_OPEN = 0,
    PLM_END_CLOSED = 1,
    PLM_END_EXPIRED = 2,
    PLM_END_DISK_EXCEEDED = 3,
    PLM_END_MAIN_PROCESS_ENDED = 4,
    PLM_END_BOUNDARY_FAILED = 5,
    PLM_END_SANDBOX_CHANGED = 6,
    PLM_END_SHUTDOWN = 7,
    PLM_END_REPLACED = 8,
    PLM_END_NOT_FOUND = 9,
    PLM_END_UNCLAIMED = 10,
    PLM_END_UNKNOWN = 11
} plm_session_end;

typedef struct plm_record plm_record;
typedef struct plm_result plm_result;

/* A failed call (docs/client.md §4.1).  Fields not set are zero / NULL / NONE / OPEN. */
typedef struct plm_error {
    plm_code code;
    char *message;              /* a sentence a person can act on; never a session id */
    plm_refusal not_dispatched; /* PLM_REFUSAL_NONE: the call may have run */
    plm_session_end session_ended; /* from a SessionEnded detail; OPEN when absent */
    char *session_ended_detail;
    bool answer_not_bound;      /* the answer did not carry our Plimsoll-Request-Id */
    json_t *wire;               /* evidence: the raw answer (or close summary) as received */
    plm_result *result;         /* evidence: the mapped result, when one could be mapped */
    plm_record *unanswered;     /* the daemon's UnansweredCall v3 record (unchecked) */
    plm_record *record;         /* set once a session checked and chained `unanswered` */
    char *cause;                /* the underlying failure, e.g. "connect: Connection refused" */
} plm_error;

void plm_error_free(plm_error *err);
const char *plm_code_name(plm_code code);          /* "data_loss"; "unknown" if out of range */
bool plm_code_parse(const char *name, plm_code *out);
const char *plm_refusal_name(plm_refusal r);       /* "capacity"; NULL for NONE */
const char *plm_session_end_name(plm_session_end e); /* "replaced", "open", "unknown" */
/* A session end from its wire form: an enum name (with or without SESSION_END_) or number. */
plm_session_end plm_session_end_from_json(const json_t *v);

/* ---------------------------------------------------------------- records */

struct plm_record {
    uint32_t version;           /* 1, 2 (answered) or 3 (unanswered session call) */
    char *request_sha256;
    char *result_sha256;
    char *provider;
    char *isolation;
    char *environment;
    char *policy;
    int64_t started_unix_ms;
    int64_t ended_unix_ms;
    char *session;              /* session fingerprint, "" for a single run */
    uint64_t sequence;
    char *previous_sha256;
    char *record_sha256;
    char *software_identity;
    char *software_rule_id;
    char *unanswered;           /* v3: the Connect code the call ended with */
};

void plm_record_free(plm_record *rec);
plm_record *plm_record_copy(const plm_record *rec);

/* ---------------------------------------------------------------- digests
 * The byte-exact digest encoding of docs/records.md.  All write 64 lowercase hex digits
 * and a NUL into `hex`.  They return NULL on success, or an error (PLM_DATA_LOSS for
 * text that is not well-formed UTF-8 or a value of the wrong JSON type). */
typedef char plm_hex[65];

/* Request digest of a RunRequest or SessionRunRequest in proto3 JSON form. */
plm_error *plm_request_digest(const json_t *request, plm_hex hex);
/* Result digest of a RunResponse (a SessionRunResponse's `run`) in proto3 JSON form. */
plm_error *plm_result_digest(const json_t *response, plm_hex hex);
/* Record digest over the record's fields (domain plimsoll.run-record.v<version>). */
plm_error *plm_record_digest(const plm_record *rec, plm_hex hex);
/* Lowercase hex SHA-256 of bytes (a session fingerprint is this over the id). */
void plm_sha256_hex(const void *data, size_t len, plm_hex hex);
/* Lowercase hex of n bytes into out, which holds 2n + 1 (NUL-terminated). */
void plm_hex_encode(const void *data, size_t n, char *out);
/* DSSE's pre-authentication encoding, the bytes a signed record's envelope signs:
 * "DSSEv1 <len(type)> <type> <len> <payload>".  malloc'd (*out_len bytes), or NULL
 * when out of memory. */
unsigned char *plm_dsse_pae(const char *type, const void *payload, size_t len,
                            size_t *out_len);
/* Whether a URL's host is loopback: exactly "localhost", "::1" ("[::1]") or an IPv4
 * address 127.x.y.z (a name such as 127.evil.example is not).  The one rule for where
 * cleartext http may go (PLM_OPT insecure_http aside), which berth's model client and
 * serve's warning share. */
bool plm_loopback_host(const char *host);
/* softwareRuleId of a SoftwareRule in JSON form (NULL or mode "" = no rule, "").
 * Returns a malloc'd string, or NULL when the rule is malformed. */
char *plm_software_rule_id(const json_t *rule);
/* Whether `rule` (JSON, may be NULL) allows `identity`. */
bool plm_software_rule_allows(const json_t *rule, const char *identity);
/* hex(HMAC-SHA256(SHA-256("plimsoll session owner key v2\n" + token),
 *                 "plimsoll session owner v2\n" + owner)); token NULL means "". */
void plm_owner_digest(const char *token, const char *owner, plm_hex hex);
/* Record fields from / to their proto3 JSON form.  From-JSON returns NULL and sets
 * *err (PLM_DATA_LOSS "the record's X is not an integer", …) on a malformed record. */
plm_record *plm_record_from_json(const json_t *obj, plm_error **err);
json_t *plm_record_to_json(const plm_record *rec);

/* Tiers: none < process < container < kernel < vm.  An unknown tier meets nothing; a
 * floor outside process/container/kernel/vm is met by nothing.  A NULL or "" floor is
 * met by every known tier. */
bool plm_meets(const char *tier, const char *floor);
bool plm_valid_floor(const char *floor);           /* "", process, container, kernel, vm */

/* ---------------------------------------------------------------- UTF-8 */

/* The project's one UTF-8 checker (RFC 3629: no overlongs, no surrogates, nothing past
 * U+10FFFF), public so that berth and sandboxd use the same one.  Thread-safe, no
 * allocation but plm_utf8_lossy's result.
 *   plm_utf8_sequence: the length (1-4) of the well-formed sequence at s[0..n), or 0.
 *   plm_utf8_valid: whether all of s[0..len) is well-formed (NUL bytes are).
 *   plm_utf8_lossy: a malloc'd, NUL-terminated copy in which each ill-formed part is
 *   U+FFFD (maximal subparts, as WHATWG's decoder), its length in *out_len when not
 *   NULL; NULL when out of memory.  Free it with free(). */
size_t plm_utf8_sequence(const unsigned char *s, size_t n);
bool plm_utf8_valid(const char *s, size_t len);
char *plm_utf8_lossy(const unsigned char *s, size_t len, size_t *out_len);

/* ---------------------------------------------------------------- cancellation */

/* A cancellation handle (the reference's AbortSignal).  Firing it cancels every
 * operation started with it: before sending → PLM_CANCELED marked request; during
 * the exchange → PLM_CANCELED unmarked (it may have run).  Free it only after every
 * operation that uses it has completed. */
typedef struct plm_cancel plm_cancel;
plm_cancel *plm_cancel_new(void);
void plm_cancel_fire(plm_cancel *c);
bool plm_cancel_fired(const plm_cancel *c);
void plm_cancel_free(plm_cancel *c);

/* ---------------------------------------------------------------- client */

typedef struct plm_client plm_client;

typedef struct plm_client_options {
    const char *base_url;       /* required: http(s)://host[:port][/prefix] */
    const char *token;          /* bearer token; NULL or "" sends none */
    bool insecure_http;         /* allow cleartext http to a non-loopback host */
    const char *javascript_grant_profile;
    const char *project_grant_profile;
    int64_t request_timeout_ms; /* (0, 2^31-1]; plm_client_options_init sets 360000 */
    const char *ca_file;        /* optional CA bundle for https (tests, private CAs) */
} plm_client_options;

void plm_client_options_init(plm_client_options *o);

/* Creates a client on `loop` (NULL: a private loop, for the *_sync wrappers).
 * Errors: PLM_INVALID_ARGUMENT, never marked, for a bad URL or timeout. */
plm_error *plm_client_new(struct ev_loop *loop, const plm_client_options *o, plm_client **out);
/* Frees the client.  Operations still in flight complete with PLM_CANCELED first. */
void plm_client_free(plm_client *c);
struct ev_loop *plm_client_loop(plm_client *c);

/* A software rule: mode "exact" (one identity) or "approved" (1 to 32). */
typedef struct plm_software_rule {
    const char *mode;
    const char *const *identities;
    size_t n_identities;
} plm_software_rule;

typedef struct plm_run_options {
    int64_t timeout_ms;         /* <= 0: the daemon's default; clamped to 2^31-1 */
    const char *minimum_isolation; /* floor: NULL/"", process, container, kernel, vm */
    const plm_software_rule *software;
    const char *trace_id;
    plm_cancel *cancel;
} plm_run_options;

typedef struct plm_file {
    const char *path;
    const char *content;        /* UTF-8 text */
} plm_file;

typedef struct plm_project {
    const plm_file *files;
    size_t n_files;
    const char *const *steps;
    size_t n_steps;
    const char *const *artifacts;
    size_t n_artifacts;
} plm_project;

typedef struct plm_cell {
    const char *language;       /* "python" or "javascript" */
    const char *code;
    const plm_file *files;      /* written into the work dir before the code runs */
    size_t n_files;
} plm_cell;

/* ---------------------------------------------------------------- results */

typedef enum plm_kind {
    PLM_KIND_NONE = 0, PLM_KIND_JAVASCRIPT, PLM_KIND_PROJECT, PLM_KIND_CELL, PLM_KIND_MODULE
} plm_kind;

typedef enum plm_outcome {
    PLM_OUTCOME_UNSPECIFIED = 0, PLM_OUTCOME_COMPLETED, PLM_OUTCOME_SETUP_FAILED,
    PLM_OUTCOME_TIMED_OUT, PLM_OUTCOME_PROTOCOL_ERROR
} plm_outcome;

typedef struct plm_bytes {
    unsigned char *data;        /* raw bytes, followed by a NUL not counted in len */
    size_t len;
} plm_bytes;

typedef struct plm_step {
    char *command;
    plm_bytes stdout_bytes, stderr_bytes;
    int32_t exit_code;
    bool timed_out, stdout_truncated, stderr_truncated;
    int64_t duration_ms;
} plm_step;

typedef struct plm_artifact {
    char *path;
    plm_bytes content;
} plm_artifact;

/* A checked result.  A non-zero exit code, a timeout or a truncation is a normal
 * result, never an error. */
struct plm_result {
    plm_kind kind;
    /* evidence */
    char *sandbox, *isolation, *software_identity, *environment;
    int64_t duration_ms;
    plm_record record;          /* the checked record */
    /* javascript and cell */
    plm_bytes stdout_bytes, stderr_bytes;
    /* UTF-8, ill-formed sequences as U+FFFD.  Where the bytes are well-formed already,
     * the text is the same memory as the bytes (no copy): both belong to the result,
     * are read-only and go with plm_result_free; copy what must outlive it. */
    char *stdout_text, *stderr_text;
    int32_t exit_code;
    bool timed_out, stdout_truncated, stderr_truncated;
    bool interpreter_started, interpreter_ended; /* cell only */
    /* project */
    plm_outcome outcome;
    char *outcome_detail;
    plm_step *steps; size_t n_steps;
    plm_artifact *artifacts; size_t n_artifacts;
    bool artifacts_truncated;
    /* a session call: the session ended during or after this call */
    plm_session_end ended;
    char *end_detail;
    /* milliseconds this client spent checking the answer (digests, record, chain) */
    double check_ms;
};

void plm_result_free(plm_result *r);

/* A Python package and its version, as a daemon states it. */
typedef struct plm_package {
    char *name, *version;
} plm_package;

typedef struct plm_environment {
    char *identity, *software_identity;
    uint32_t max_timeout_ms;
    bool javascript, python;    /* languages the daemon proved at start-up */
    /* sandboxd's extension `pythonPackages`: packages a check proved importable there
     * (none from a daemon that does not state them, or has not finished its check) */
    plm_package *python_packages;
    size_t n_python_packages;
} plm_environment;

typedef struct plm_info {
    char *sandbox, *isolation, *policy;
    uint32_t protocol;
    bool supports_project, supports_module, supports_javascript_grants,
         supports_project_grants, supports_sessions;
    uint32_t session_lifetime_ms, session_idle_timeout_ms;
    uint32_t max_sessions_per_caller, max_sessions_per_owner;
    plm_environment javascript, project, module, session;
    uint32_t memory_mb, pids, disk_mb;
    double cpus;
} plm_info;

void plm_info_free(plm_info *info);

/* ---------------------------------------------------------------- operations */

typedef void (*plm_info_cb)(void *ud, plm_error *err, plm_info *info);
typedef void (*plm_result_cb)(void *ud, plm_error *err, plm_result *result);

plm_error *plm_describe(plm_client *c, plm_cancel *cancel, plm_info_cb cb, void *ud);
plm_error *plm_run_javascript(plm_client *c, const char *code, const plm_run_options *o,
                              plm_result_cb cb, void *ud);
plm_error *plm_run_project(plm_client *c, const plm_project *p, const plm_run_options *o,
                           plm_result_cb cb, void *ud);

/* ---------------------------------------------------------------- sessions */

typedef struct plm_session plm_session;

typedef struct plm_session_options {
    const char *minimum_isolation;
    const plm_software_rule *software;
    int64_t lifetime_ms, idle_timeout_ms; /* <= 0: the daemon's */
    const char *trace_id;
    const char *const *languages; size_t n_languages; /* hint: python, javascript */
    const char *owner;          /* NULL: no owner; "" is refused.  Sent as a digest. */
    plm_cancel *cancel;
} plm_session_options;

typedef struct plm_close_summary {
    char *session;              /* fingerprint */
    uint64_t calls;
    char *last_record_sha256;
    plm_session_end end;
} plm_close_summary;

void plm_close_summary_free(plm_close_summary *s);

typedef void (*plm_session_cb)(void *ud, plm_error *err, plm_session *s);
typedef void (*plm_close_cb)(void *ud, plm_error *err, plm_close_summary *summary);

plm_error *plm_open_session(plm_client *c, const plm_session_options *o,
                            plm_session_cb cb, void *ud);
/* Session calls go through one FIFO queue: each is sent after the previous settles. */
plm_error *plm_session_run_cell(plm_session *s, const plm_cell *cell,
                                const plm_run_options *o, plm_result_cb cb, void *ud);
plm_error *plm_session_run_javascript(plm_session *s, const char *code,
                                      const plm_run_options *o, plm_result_cb cb, void *ud);
plm_error *plm_session_run_project(plm_session *s, const plm_project *p,
                                   const plm_run_options *o, plm_result_cb cb, void *ud);
/* Close is memoized: exactly one CloseSession is sent; every close gets a copy of
 * its outcome.  A close refused not dispatched clears the memo. */
plm_error *plm_session_close(plm_session *s, plm_cancel *cancel, plm_close_cb cb, void *ud);
/* Frees the handle.  Queued calls complete with PLM_CANCELED (marked request);
 * it does not close the session on the daemon: close first. */
void plm_session_free(plm_session *s);

const char *plm_session_fingerprint(const plm_session *s);
const char *plm_session_isolation(const plm_session *s);
const char *plm_session_sandbox(const plm_session *s);
const char *plm_session_software_identity(const plm_session *s);
int64_t plm_session_expires_at_ms(const plm_session *s);
uint32_t plm_session_idle_timeout_ms(const plm_session *s);
const char *plm_session_stopped(const plm_session *s);   /* NULL unless stopped */
plm_session_end plm_session_ended(const plm_session *s, const char **detail);
void plm_session_chain(const plm_session *s, uint64_t *calls, const char **last_sha256);

/* ---------------------------------------------------------------- blocking wrappers */

void plm_global_init(void);
plm_error *plm_describe_sync(plm_client *c, plm_info **out);
plm_error *plm_run_javascript_sync(plm_client *c, const char *code,
                                   const plm_run_options *o, plm_result **out);
plm_error *plm_open_session_sync(plm_client *c, const plm_session_options *o,
                                 plm_session **out);
plm_error *plm_session_run_cell_sync(plm_session *s, const plm_cell *cell,
                                     const plm_run_options *o, plm_result **out);
plm_error *plm_session_run_javascript_sync(plm_session *s, const char *code,
                                           const plm_run_options *o, plm_result **out);
plm_error *plm_session_close_sync(plm_session *s, plm_close_summary **out);

#ifdef __cplusplus
}
#endif
#endif /* PLIMSOLL_H */

/*
 * provider.h — the interface between sandboxd's protocol server and a sandbox
 * provider (echo today; gvisor, bwrap and process next).
 *
 * The server validates every request, checks floors, rules, caps and the session
 * turn, builds records and chains; a provider only creates sandboxes and runs code.
 *
 * Contract:
 *   - Everything runs on the daemon's one libev loop.  A provider may start child
 *     processes and watch them with its own watchers on that loop.
 *   - Every operation is asynchronous and completes through its callback exactly
 *     once, never from inside the call that started it (at the earliest on the next
 *     loop iteration), so the server can use one code path for fast and slow
 *     providers alike.
 *   - Strings in a job are borrowed: they stay valid until the job's callback has
 *     run.  Results and errors handed to a callback belong to the callback.
 *   - At most one run is in flight per session (the server serializes the turn).
 *     session_close may be called while that run is in flight (lifetime expiry,
 *     shutdown): the provider then ends the run early if it can, completes its
 *     callback first, and calls the close callback last.  After the close callback
 *     the session handle is gone.
 *   - destroy() is called only once no operation is in flight.
 */
#ifndef SBX_PROVIDER_H
#define SBX_PROVIDER_H

#include "errors.h"
#include "plimsoll.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ev_loop;
struct sbx_config;

typedef enum sbx_kind {
    SBX_KIND_NONE = 0, SBX_KIND_JAVASCRIPT, SBX_KIND_PROJECT, SBX_KIND_CELL, SBX_KIND_MODULE
} sbx_kind;

/* Languages, as a bit set (a session's warm hint, an environment's proven list). */
enum { SBX_LANG_JAVASCRIPT = 1u << 0, SBX_LANG_PYTHON = 1u << 1 };

/* ---------------------------------------------------------------- facts (Describe) */

/* A Python package a start-up check imported inside a sandbox, and its version. */
typedef struct sbx_package {
    const char *name, *version;
} sbx_package;

typedef struct sbx_env_facts {
    const char *identity;          /* exact outer image or interpreter artifact, or "" */
    const char *software_identity; /* selected executable image, or "" */
    uint32_t max_timeout_ms;       /* 0 = unsupported or unstated */
    unsigned languages;            /* SBX_LANG_* proven at start-up */
    /* Describe's pythonPackages: proven importable in this environment's sandboxes; set
     * once, by a check that may end after the daemon is serving (NULL until then). */
    const sbx_package *python_packages;
    size_t n_python_packages;
} sbx_env_facts;

typedef struct sbx_facts {
    const char *name;              /* provider id, RunResponse.sandbox and record.provider */
    const char *tier;              /* process, container, kernel or vm */
    const char *policy;            /* sandbox policy digest, "" when none */
    bool supports_javascript, supports_project, supports_module, supports_sessions;
    bool supports_javascript_grants, supports_project_grants;
    sbx_env_facts javascript, project, module, session;
    uint32_t memory_mb, pids, disk_mb;
    double cpus;
} sbx_facts;

/* ---------------------------------------------------------------- jobs */

typedef struct sbx_bytes {
    const char *data;              /* may hold NUL bytes */
    size_t len;
} sbx_bytes;

typedef struct sbx_file {
    sbx_bytes path, content;       /* path already checked safe and unique */
} sbx_file;

typedef struct sbx_job {
    sbx_kind kind;
    int32_t timeout_ms;            /* as requested; 0 = the provider's default */
    sbx_bytes code;                /* javascript, cell */
    const char *language;          /* cell: "javascript" or "python" */
    const char *grant_profile;     /* javascript, project; "" = none */
    const sbx_file *files;         /* project, cell */
    size_t n_files;
    const sbx_bytes *steps;        /* project */
    size_t n_steps;
    const sbx_bytes *artifacts;    /* project */
    size_t n_artifacts;
} sbx_job;

/* ---------------------------------------------------------------- results */

typedef struct sbx_buf {
    unsigned char *data;           /* malloc'd, may be NULL when len is 0 */
    size_t len;
} sbx_buf;

typedef struct sbx_step_result {
    char *command;
    sbx_buf out, err;
    int32_t exit_code;
    bool timed_out, out_truncated, err_truncated;
    int64_t duration_ms;
} sbx_step_result;

typedef struct sbx_artifact {
    char *path;
    sbx_buf content;
} sbx_artifact;

typedef enum sbx_run_status {
    SBX_RUN_ANSWERED = 0,  /* the result below is the answer */
    SBX_RUN_REFUSED,       /* nothing ran: `error` carries a NotDispatched reason */
    SBX_RUN_UNANSWERED,    /* it may have run, then failed with `error`'s code; in a
                              session the call still takes its place in the chain */
} sbx_run_status;

typedef struct sbx_result {
    sbx_run_status status;
    sbx_err *error;                /* REFUSED / UNANSWERED */
    sbx_kind kind;
    /* javascript and cell */
    sbx_buf out, err;
    int32_t exit_code;
    bool timed_out, out_truncated, err_truncated;
    bool interpreter_started, interpreter_ended; /* cell */
    /* project */
    int outcome;                   /* ProjectOutcome number */
    char *outcome_detail;
    sbx_step_result *steps;
    size_t n_steps;
    sbx_artifact *artifacts;
    size_t n_artifacts;
    bool artifacts_truncated;
    /* where it ran, when stated ("" / NULL otherwise) */
    char *environment, *software_identity;
    /* a session call: the session ended during or right after this call */
    plm_session_end ended;
    char *end_detail;
} sbx_result;

sbx_result *sbx_result_new(sbx_kind kind);
void sbx_result_free(sbx_result *r);
/* Copies bytes into a result buffer. */
void sbx_buf_set(sbx_buf *b, const void *data, size_t len);

/* ---------------------------------------------------------------- callbacks */

typedef struct sbx_provider sbx_provider;
typedef struct sbx_psession sbx_psession;   /* a provider's session (its sandbox) */

typedef void (*sbx_run_cb)(void *ud, sbx_result *result);
/* On success `err` is NULL and `s` the new session; `tier` and `software_identity`
 * are what the session measured at open (borrowed from the provider, valid until
 * the session is closed). */
typedef void (*sbx_open_cb)(void *ud, sbx_err *err, sbx_psession *s, const char *tier,
                            const char *software_identity);
typedef void (*sbx_done_cb)(void *ud);
typedef void (*sbx_smoke_cb)(void *ud, char *why_failed /* NULL: passed; malloc'd */);
/* A session ended by the provider between calls (sandbox gone, boundary failed). */
typedef void (*sbx_session_ended_cb)(void *ud, plm_session_end why, const char *detail);

typedef struct sbx_open_params {
    uint32_t lifetime_ms;          /* effective (the server enforces it too) */
    uint32_t idle_ms;              /* effective, 0 = never suspend */
    unsigned languages;            /* SBX_LANG_* hint: interpreters to warm */
    sbx_session_ended_cb on_ended; /* may be called at most once, between calls */
    void *on_ended_ud;
} sbx_open_params;

/* ---------------------------------------------------------------- the interface */

typedef struct sbx_provider_ops {
    const char *name;              /* the --provider value */
    /* Creates the provider from the configuration; NULL and *why on failure. */
    sbx_provider *(*create)(struct ev_loop *loop, const struct sbx_config *cfg, char **why);
    void (*destroy)(sbx_provider *p);
    const sbx_facts *(*facts)(const sbx_provider *p);
    /* Start-up check that the provider really works at the tier it claims: the daemon
     * offers nothing until it passed. */
    void (*smoke_test)(sbx_provider *p, sbx_smoke_cb cb, void *ud);
    /* One run in a fresh sandbox (javascript, project or module). */
    void (*run)(sbx_provider *p, const sbx_job *job, sbx_run_cb cb, void *ud);
    void (*session_open)(sbx_provider *p, const sbx_open_params *params, sbx_open_cb cb,
                         void *ud);
    /* One call in a session (javascript, project or cell). */
    void (*session_run)(sbx_psession *s, const sbx_job *job, sbx_run_cb cb, void *ud);
    /* The idle timer fired with no call in flight; NULL or a no-op when the provider
     * has nothing to freeze.  `cb` reports nothing: a failed suspend is retried after
     * another idle period by the server. */
    void (*session_suspend)(sbx_psession *s, sbx_done_cb cb, void *ud);
    /* Ends the sandbox (see the contract above).  Never fails from the server's
     * point of view: a provider that cannot prove the sandbox gone logs it. */
    void (*session_close)(sbx_psession *s, plm_session_end why, sbx_done_cb cb, void *ud);
    /* An end the provider found (the sweep after a call: disk over budget, a process
     * it could not prove gone) and has refused a call with, but tells through on_ended
     * only from the loop; or PLM_END_OPEN.  Its detail in *detail, the provider's,
     * valid until the loop runs again.  CloseSession asks first: the refused call's
     * answer may reach the owner before the tell reaches the server, and the close must
     * report that end, not "closed".  NULL: every end is told at once. */
    plm_session_end (*session_found_end)(const sbx_psession *s, const char **detail);
} sbx_provider_ops;

/* The providers compiled in; NULL when `name` is none of them. */
const sbx_provider_ops *sbx_provider_find(const char *name);
/* "auto, gvisor, bwrap, process, echo" (for messages).  "auto" is no provider of its
 * own: the daemon tries gvisor, then bwrap, and serves the first whose smoke test passes. */
const char *sbx_provider_names(void);

#endif

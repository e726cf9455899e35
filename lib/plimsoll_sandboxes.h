/*
 * plimsoll_sandboxes.h — one sandbox per conversation (the reference's CodeSandboxes,
 * docs/client.md §6) and the model-facing executeCode tool (docs/client.md §7), on top of the
 * verified client in plimsoll.h.
 *
 * A conversation is named by a key: a run id (a string key), or an owner and a
 * conversation (a pair, whose owner is the user the per-owner cap counts).  Each key
 * keeps one plimsoll session; its first answered call reports fresh_sandbox, a cell
 * that started a new interpreter reports fresh_interpreter, and a sandbox that ended
 * (expired, replaced, idle-closed, disposed) is reopened on the next call.  A call
 * without a key always runs fresh.
 *
 * Same model as plimsoll.h: one loop thread, completion callbacks that run from the
 * loop exactly once per started operation, errors returned directly (and the callback
 * never called) when refused before anything started, ownership of outputs and errors
 * passed to the callback.  Every error from plm_sandboxes_run carries a message that
 * begins "Nothing ran (<reason>): " when it is marked not dispatched, else "The code
 * may have run, and there is no checked answer for it: ".
 */
#ifndef PLIMSOLL_SANDBOXES_H
#define PLIMSOLL_SANDBOXES_H

#include "plimsoll.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct plm_sandboxes plm_sandboxes;

/* A conversation key: owner NULL names a string key (conversation = the run id);
 * otherwise both must be non-empty.  Both are well-formed UTF-8.  Encoded injectively
 * inside, as a JSON array (["run-1"], ["alice","a"]); the owner is what the per-owner
 * cap counts, and is sent to the daemon only as its keyed digest. */
typedef struct plm_key {
    const char *owner;
    const char *conversation;
} plm_key;

typedef enum plm_sessions_mode {
    PLM_SESSIONS_AUTO = 0,      /* sessions when Describe states supportsSessions */
    PLM_SESSIONS_ALWAYS,        /* no sessions → unimplemented, marked unsupported */
    PLM_SESSIONS_NEVER          /* every call runs fresh */
} plm_sessions_mode;

typedef void (*plm_close_error_cb)(void *ud, const plm_key *key, const plm_error *err);

typedef struct plm_sandboxes_options {
    plm_client *client;         /* required; borrowed, must outlive the sandboxes */
    plm_sessions_mode sessions;
    const char *const *languages; size_t n_languages; /* offered; first is the default */
    const char *minimum_isolation; /* NULL or "": "kernel" */
    int64_t timeout_ms;         /* per call; <= 0: the daemon's default */
    int64_t session_lifetime_ms, session_idle_timeout_ms; /* passed to OpenSession */
    int64_t idle_close_ms;      /* default 600000; <= 0 never closes */
    int max_sessions_per_owner; /* default 3; 0 = no cap */
    int max_sessions;           /* default 0 = no cap */
    size_t max_output_chars;    /* default (and 0): 16000, per stream, in UTF-16 code units */
    /* Called from the loop when closing a sandbox fails; `key` (as passed: the pair for a
     * pair) and `err` are borrowed for the call.  data_loss there means the daemon
     * counted a call this client has no checked answer for.  Default: one stderr line
     * "plimsoll: closing the sandbox for key <12-hex digest> failed: <message>". */
    plm_close_error_cb on_close_error;
    void *on_close_error_ud;
} plm_sandboxes_options;

void plm_sandboxes_options_init(plm_sandboxes_options *o);
plm_error *plm_sandboxes_new(const plm_sandboxes_options *o, plm_sandboxes **out);
/* Closes nothing: call plm_sandboxes_dispose_all first and wait for it.  Like
 * plm_client_free, it completes what is still pending before it returns: a call not yet
 * sent with PLM_CANCELED marked request, a call whose code may have been sent with
 * PLM_CANCELED unmarked, a dispose's `done`, a persistent query.  The client must
 * outlive it; free the client after it (its operations still in flight then find their
 * call detached). */
void plm_sandboxes_free(plm_sandboxes *sb);

/* One executeCode call's input. */
typedef struct plm_code_input {
    const char *code;
    const char *language;       /* NULL: the first offered language */
    const plm_file *files;      /* at most 198 */
    size_t n_files;
    int64_t timeout_ms;         /* this call's budget; <= 0: the instance's timeout_ms
                                 * (the daemon clamps it to its own maximum) */
} plm_code_input;

/* What the model receives (docs/client.md §7.2). */
typedef struct plm_code_output {
    char *language;
    int32_t exit_code;
    bool timed_out;
    char *stdout_text, *stderr_text; /* cut to max_output_chars */
    bool truncated;
    bool state_kept;
    bool fresh_interpreter;     /* emitted only when true */
    bool files_persist;
    bool fresh_sandbox;         /* emitted only when true */
    char *isolation;
    char *record_sha256;
    /* Where the call's time went, in milliseconds, for a host that shows it (never in
     * the JSON the model sees; 0 when not measured, as on the fresh path).  wait: the
     * call to its cell sent (the sandbox opening, a slot); call: the cell sent to its
     * answer checked; check: checking the answer (record digest and chain); daemon: the
     * daemon's own wall time (durationMs), the cell's run in the sandbox included. */
    double wait_ms, call_ms, check_ms, daemon_ms;
} plm_code_output;

void plm_code_output_free(plm_code_output *out);
/* The JSON the model sees, keys in the reference's order. */
json_t *plm_code_output_to_json(const plm_code_output *out);

typedef void (*plm_code_cb)(void *ud, plm_error *err, plm_code_output *out);
typedef void (*plm_done_cb)(void *ud);

/* One executeCode call; key NULL runs fresh.  Refused at once (marked request, the
 * callback never called): an invalid key, no or empty code, ill-formed UTF-8, more than
 * 198 files, a file without a path or under .plimsoll/, a language the tool does not
 * offer, an already-fired `cancel`.  Everything else is reported through `cb`. */
plm_error *plm_sandboxes_run(plm_sandboxes *sb, const plm_key *key, const plm_code_input *in,
                             plm_cancel *cancel, plm_code_cb cb, void *ud);
/* Starts the key's sandbox without waiting; never evicts (at a cap it does nothing);
 * a no-op when the key has an entry or under PLM_SESSIONS_NEVER; open errors are
 * swallowed and the failed entry removed.  Returns an error only for an invalid key. */
plm_error *plm_sandboxes_warm(plm_sandboxes *sb, const plm_key *key);
/* Removes the key's entry now (caps count it gone) and closes its session in the
 * background; `done` (optional) runs from the loop once the close settled.  Returns an
 * error only for an invalid key. */
plm_error *plm_sandboxes_dispose(plm_sandboxes *sb, const plm_key *key, plm_done_cb done,
                                 void *ud);
void plm_sandboxes_dispose_all(plm_sandboxes *sb, plm_done_cb done, void *ud);
/* Whether calls keep state: false under NEVER, else Describe's supportsSessions. */
typedef void (*plm_bool_cb)(void *ud, plm_error *err, bool value);
plm_error *plm_sandboxes_persistent(plm_sandboxes *sb, plm_bool_cb cb, void *ud);
/* NULL when `key` is a valid key, else the invalid_argument error (marked request) every
 * call taking it would refuse it with, so a caller can refuse it before anything else. */
plm_error *plm_key_check(const plm_key *key);
/* The first 12 hex digits of SHA-256 of the key's encoding: the only form of a key
 * that may appear in a log line. */
void plm_key_digest(const plm_key *key, char out[13]);
/* Number of entries held (for tests, metrics and the caps). */
size_t plm_sandboxes_count(const plm_sandboxes *sb);

/* The executeCode tool as a model sees it: the description (conversation scope unless
 * `fresh_scope`, or the instance never keeps sessions) and the JSON Schema of its
 * parameters.  Both malloc'd / new refs.  Neither connects; `sb` NULL describes the
 * default languages. */
char *plm_tool_description(const plm_sandboxes *sb, bool fresh_scope);
json_t *plm_tool_parameters(const plm_sandboxes *sb);

#ifdef __cplusplus
}
#endif
#endif /* PLIMSOLL_SANDBOXES_H */

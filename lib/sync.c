/*
 * sync.c — blocking wrappers for simple programs and tests: start the operation, then
 * run the client's loop until its callback has run.  Use them with a private loop
 * (plm_client_new with a NULL loop), never from inside a callback.
 */
#include "internal.h"

#include <ev.h>

typedef struct waitbox {
    bool done;
    plm_error *err;
    void *value;
} waitbox;

static plm_error *wait_for(struct ev_loop *loop, plm_error *started, waitbox *b, void **out)
{
    if (started)
        return started;
    while (!b->done)
        ev_run(loop, EVRUN_ONCE);
    *out = b->value;
    return b->err;
}

/* A wrapper needs its handle and somewhere to put the outcome; refused before anything
 * starts, like every bad argument. */
static plm_error *bad_args(const char *what)
{
    return plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST, "plimsoll: %s", what);
}

static void info_cb(void *ud, plm_error *err, plm_info *v)
{
    waitbox *b = ud;
    b->done = true;
    b->err = err;
    b->value = v;
}

static void result_cb(void *ud, plm_error *err, plm_result *v)
{
    waitbox *b = ud;
    b->done = true;
    b->err = err;
    b->value = v;
}

static void session_cb(void *ud, plm_error *err, plm_session *v)
{
    waitbox *b = ud;
    b->done = true;
    b->err = err;
    b->value = v;
}

static void close_cb(void *ud, plm_error *err, plm_close_summary *v)
{
    waitbox *b = ud;
    b->done = true;
    b->err = err;
    b->value = v;
}

plm_error *plm_describe_sync(plm_client *c, plm_info **out)
{
    waitbox b = {0};
    if (!out)
        return bad_args("Describe needs somewhere to put the answer");
    *out = NULL;
    return wait_for(plm_client_loop(c), plm_describe(c, NULL, info_cb, &b), &b, (void **)out);
}

plm_error *plm_run_javascript_sync(plm_client *c, const char *code, const plm_run_options *o,
                                   plm_result **out)
{
    waitbox b = {0};
    if (!out)
        return bad_args("runJavaScript needs somewhere to put the result");
    *out = NULL;
    return wait_for(plm_client_loop(c), plm_run_javascript(c, code, o, result_cb, &b), &b,
                    (void **)out);
}

plm_error *plm_open_session_sync(plm_client *c, const plm_session_options *o, plm_session **out)
{
    waitbox b = {0};
    if (!out)
        return bad_args("OpenSession needs somewhere to put the session");
    *out = NULL;
    return wait_for(plm_client_loop(c), plm_open_session(c, o, session_cb, &b), &b, (void **)out);
}

plm_error *plm_session_run_cell_sync(plm_session *s, const plm_cell *cell,
                                     const plm_run_options *o, plm_result **out)
{
    waitbox b = {0};
    if (out)
        *out = NULL;
    if (!s || !out)
        return bad_args("runCell needs a session and somewhere to put the result");
    return wait_for(plm_session_loop(s), plm_session_run_cell(s, cell, o, result_cb, &b), &b,
                    (void **)out);
}

plm_error *plm_session_run_javascript_sync(plm_session *s, const char *code,
                                           const plm_run_options *o, plm_result **out)
{
    waitbox b = {0};
    if (out)
        *out = NULL;
    if (!s || !out)
        return bad_args("runJavaScript needs a session and somewhere to put the result");
    return wait_for(plm_session_loop(s), plm_session_run_javascript(s, code, o, result_cb, &b),
                    &b, (void **)out);
}

plm_error *plm_session_close_sync(plm_session *s, plm_close_summary **out)
{
    waitbox b = {0};
    if (out)
        *out = NULL;
    if (!s || !out)
        return bad_args("close needs a session and somewhere to put the summary");
    return wait_for(plm_session_loop(s), plm_session_close(s, NULL, close_cb, &b), &b,
                    (void **)out);
}

/*
 * test_faults.c — the daemon fails under a conversation: killed in the middle of a
 * cell, down between cells, restarted with all its sessions gone; and its answer is
 * cut (by tests/faultproxy.py) at every part: in the status line, in the headers,
 * right after them, mid-body, one byte short, and chunked without its last chunk.
 * Each case asserts the exact classification, that no call that ran is reported as
 * not dispatched, and that serving goes on afterwards: the same client's next call,
 * or the conversation's next call in a fresh sandbox once the daemon is back.
 * (tests/faults/README.md lists every fault scenario and the test that covers it.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <ev.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fault.h"
#include "internal.h"
#include "launch.h"
#include "plimsoll_sandboxes.h"
#include "sbxproc.h"

typedef struct box {
    bool done;
    plm_error *err;
    plm_code_output *out;
} box;

static void on_code(void *ud, plm_error *err, plm_code_output *out)
{
    box *b = ud;
    b->done = true;
    b->err = err;
    b->out = out;
}

/* One conversation's executeCode through the per-conversation layer, waited for. */
static plm_error *execute(plm_sandboxes *sb, struct ev_loop *loop, const plm_key *key,
                          const char *code, plm_code_output **out)
{
    box b = {0};
    plm_code_input in = {code, "python", NULL, 0};
    plm_error *e = plm_sandboxes_run(sb, key, &in, NULL, on_code, &b);
    if (e)
        return e;
    while (!b.done)
        ev_run(loop, EVRUN_ONCE);
    *out = b.out;
    return b.err;
}

static void kill_hard(sbx_proc *p)
{
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    p->pid = 0; /* reaped: sbx_stop only removes its files */
}

/* Starts another daemon on the same address with the same token file. */
static pid_t restart_on(const sbx_proc *p, char *url, size_t url_len)
{
    char listen[64], bin[256], tokens[256];
    snprintf(listen, sizeof listen, "%s", strstr(p->url, "://") + 3);
    snprintf(bin, sizeof bin, "%s/sandboxd", getenv("BUILD") ? getenv("BUILD") : "build");
    snprintf(tokens, sizeof tokens, "%s", p->token_file);
    char *argv[] = {bin, "--listen", listen, "--token-file", tokens, "--provider", "echo", NULL};
    return spawn_listening(argv, url, url_len);
}

typedef struct world {
    sbx_proc d;
    fault_proxy p;              /* pid 0 unless the world is proxied */
    plm_client *c;
    plm_sandboxes *sb;
} world;

/* A daemon, and a client (with its sandbox layer) talking to it directly or through
 * the fault proxy. */
static int setup_world(void **state, bool proxied)
{
    world *w = calloc(1, sizeof *w);
    if (!w)
        return -1;
    *state = w; /* the teardown runs even when the setup fails */
    if (sbx_start(&w->d, NULL) < 0)
        return -1;
    if (proxied && fault_start(&w->p, w->d.url) < 0)
        return -1;
    plm_client_options o;
    plm_client_options_init(&o);
    o.base_url = proxied ? w->p.url : w->d.url;
    o.token = w->d.token;
    if (plm_client_new(NULL, &o, &w->c))
        return -1;
    plm_sandboxes_options so;
    plm_sandboxes_options_init(&so);
    so.client = w->c;
    so.minimum_isolation = "container";
    if (plm_sandboxes_new(&so, &w->sb))
        return -1;
    return 0;
}

static int setup(void **state)
{
    return setup_world(state, false);
}

static int setup_proxied(void **state)
{
    return setup_world(state, true);
}

static void dispose_done(void *ud)
{
    *(bool *)ud = true;
}

static int teardown(void **state)
{
    world *w = *state;
    if (!w)
        return 0;
    if (w->sb) {
        bool done = false;
        plm_sandboxes_dispose_all(w->sb, dispose_done, &done);
        while (!done)
            ev_run(plm_client_loop(w->c), EVRUN_ONCE);
        plm_sandboxes_free(w->sb);
    }
    plm_client_free(w->c);
    if (w->p.pid > 0)
        fault_stop(&w->p);
    sbx_stop(&w->d);
    free(w);
    return 0;
}

static void ok(plm_error *e)
{
    if (e) {
        print_error("unexpected error [%s]: %s\n", plm_code_name(e->code), e->message);
        plm_error_free(e);
        fail();
    }
}

static void contains(const char *hay, const char *needle)
{
    if (!hay || !strstr(hay, needle))
        fail_msg("\"%s\" does not contain \"%s\"", hay ? hay : "(null)", needle);
}

static const char *mark_name(plm_refusal r)
{
    return r == PLM_REFUSAL_NONE ? "unmarked" : plm_refusal_name(r);
}

/* A call whose answer was lost after the daemon ran it: `unavailable`, no
 * not-dispatched mark, a message that says it may have run.  Frees `e`. */
static void expect_may_have_run(plm_error *e, const char *what, const char *prefix)
{
    if (!e)
        fail_msg("%s: the broken answer was taken as a success", what);
    if (e->code != PLM_UNAVAILABLE || e->not_dispatched != PLM_REFUSAL_NONE)
        fail_msg("%s: expected unavailable/unmarked, got %s/%s: %s", what,
                 plm_code_name(e->code), mark_name(e->not_dispatched), e->message);
    if (prefix && strncmp(e->message, prefix, strlen(prefix)) != 0)
        fail_msg("%s: \"%s\" does not start with \"%s\"", what, e->message, prefix);
    contains(e->message, "may have run");
    plm_error_free(e);
}

/* After a restart: the conversation's next call is answered in a new sandbox, which
 * says so, and the call after it continues there.  `n` numbers the codes. */
static void conversation_goes_on_fresh(world *w, const plm_key *key, int n)
{
    struct ev_loop *loop = plm_client_loop(w->c);
    char code[32], want[64];
    plm_code_output *out = NULL;
    snprintf(code, sizeof code, "x + %d", n);
    ok(execute(w->sb, loop, key, code, &out));
    assert_true(out->fresh_sandbox);
    assert_true(out->fresh_interpreter);
    snprintf(want, sizeof want, "python 1: %s", code);
    assert_string_equal(out->stdout_text, want);
    plm_code_output_free(out);
    snprintf(code, sizeof code, "x + %d", n + 1);
    ok(execute(w->sb, loop, key, code, &out));
    assert_false(out->fresh_sandbox);
    snprintf(want, sizeof want, "python 2: %s", code);
    assert_string_equal(out->stdout_text, want);
    plm_code_output_free(out);
}

/* ---------------------------------------------------------------- answers cut */

#define MAY_HAVE_RUN_PREFIX "The code may have run, and there is no checked answer for it: "

static void arm(world *w, const char *mode, const char *rpc)
{
    char spec[128];
    snprintf(spec, sizeof spec, "{\"mode\":\"%s\",\"rpc\":\"%s\",\"count\":1}", mode, rpc);
    assert_int_equal(fault_arm(&w->p, spec), 0);
}

/* A snippet on `c`, which must be answered and verified: "javascript 1: <code>". */
static void run_ok(plm_client *c, const char *code)
{
    plm_result *r = NULL;
    char want[64];
    ok(plm_run_javascript_sync(c, code, NULL, &r));
    snprintf(want, sizeof want, "javascript 1: %s", code);
    assert_string_equal(r->stdout_text, want);
    plm_result_free(r);
}

/* The answer to a single Run is cut as `mode` says, once on the client's first (new)
 * connection and once on a reused keep-alive one.  Each time the daemon ran the call
 * exactly once (the proxy forwarded it, and nothing sent it again), the client says
 * it may have run, and the same client's next call is answered and verified. */
static void cut_single_run(world *w, const char *mode)
{
    for (int reused = 0; reused < 2; reused++) {
        assert_int_equal(fault_reset(&w->p), 0);
        plm_client_options o;
        plm_client_options_init(&o);
        o.base_url = w->p.url;
        o.token = w->d.token;
        plm_client *c = NULL;
        ok(plm_client_new(NULL, &o, &c));
        if (reused)
            run_ok(c, "warm the connection");
        arm(w, mode, "Run");
        plm_result *r = NULL;
        plm_error *e = plm_run_javascript_sync(c, "cut", NULL, &r);
        assert_null(r);
        expect_may_have_run(e, mode, "plimsoll: Run: ");
        assert_int_equal(fault_forwarded(&w->p, "Run"), reused + 1); /* ran, not re-sent */
        run_ok(c, "after the cut");
        assert_int_equal(fault_forwarded(&w->p, "Run"), reused + 2);
        plm_client_free(c);
    }
}

/* The answer to a conversation's SessionRun is cut as `mode` says.  The call may have
 * run, so the layer says so and does not rerun it (S16: the session is stopped, one
 * SessionRun more is all the daemon got); the conversation's next call is answered in
 * a new sandbox that says freshSandbox, and the one after continues there. */
static void cut_session_call(world *w, const char *mode)
{
    struct ev_loop *loop = plm_client_loop(w->c);
    plm_key key = {"carol", mode};
    plm_code_output *out = NULL;
    assert_int_equal(fault_reset(&w->p), 0);
    ok(execute(w->sb, loop, &key, "x = 1", &out));
    assert_true(out->fresh_sandbox);
    plm_code_output_free(out);
    arm(w, mode, "SessionRun");
    plm_error *e = execute(w->sb, loop, &key, "x + 1", &out);
    assert_null(out);
    expect_may_have_run(e, mode, MAY_HAVE_RUN_PREFIX);
    assert_int_equal(fault_forwarded(&w->p, "SessionRun"), 2);
    conversation_goes_on_fresh(w, &key, 2);
    assert_int_equal(fault_forwarded(&w->p, "OpenSession"), 2);
    assert_int_equal(fault_forwarded(&w->p, "SessionRun"), 4); /* nothing rerun */
}

static void test_W16_S16_answer_cut_in_the_status_line_may_have_run_then_serving_goes_on(void **state)
{
    cut_single_run(*state, "cut_status_line");
    cut_session_call(*state, "cut_status_line");
}

static void test_W16_S16_answer_cut_in_the_headers_may_have_run_then_serving_goes_on(void **state)
{
    cut_single_run(*state, "cut_headers");
    cut_session_call(*state, "cut_headers");
}

static void test_W18_S16_answer_cut_after_the_headers_may_have_run_then_serving_goes_on(void **state)
{
    cut_single_run(*state, "cut_after_headers");
    cut_session_call(*state, "cut_after_headers");
}

static void test_W18_S16_answer_cut_mid_body_may_have_run_then_serving_goes_on(void **state)
{
    cut_single_run(*state, "cut_body");
    cut_session_call(*state, "cut_body");
}

static void test_W18_S16_answer_cut_one_byte_short_may_have_run_then_serving_goes_on(void **state)
{
    cut_single_run(*state, "cut_last_byte");
    cut_session_call(*state, "cut_last_byte");
}

/* Every body byte arrived (the JSON would parse and check); the last chunk did not. */
static void test_W18_S16_chunked_answer_cut_before_its_last_chunk_may_have_run_then_serving_goes_on(void **state)
{
    cut_single_run(*state, "cut_chunked");
    cut_session_call(*state, "cut_chunked");
}

/* ---------------------------------------------------------------- the daemon fails */

static void test_fault_daemon_killed_mid_cell_is_may_have_run(void **state)
{
    world *w = *state;
    struct ev_loop *loop = plm_client_loop(w->c);
    plm_key key = {NULL, "run-killed"};
    plm_code_output *out = NULL;
    ok(execute(w->sb, loop, &key, "x = 1", &out));
    assert_true(out->fresh_sandbox);
    plm_code_output_free(out);
    /* The cell is in flight (the daemon holds it 5 s) when the daemon dies. */
    box b = {0};
    plm_code_input in = {"plimsoll-echo:sleep:5000", "python", NULL, 0};
    ok(plm_sandboxes_run(w->sb, &key, &in, NULL, on_code, &b));
    /* Bounded poll on an observable condition: the daemon logs the dispatch. */
    char *log = NULL;
    for (int i = 0; i < 500 && !(log && strstr(log, "call 2 dispatched")); i++) {
        free(log);
        ev_run(loop, EVRUN_NOWAIT);
        usleep(10000);
        log = sbx_read_log(&w->d);
    }
    assert_non_null(strstr(log ? log : "", "call 2 dispatched"));
    free(log);
    kill_hard(&w->d);
    while (!b.done)
        ev_run(loop, EVRUN_ONCE);
    assert_null(b.out);
    assert_non_null(b.err);
    assert_int_equal(b.err->code, PLM_UNAVAILABLE);
    assert_int_equal(b.err->not_dispatched, PLM_REFUSAL_NONE);
    assert_non_null(strstr(b.err->message, "The code may have run"));
    plm_error_free(b.err);
    /* A daemon back on the same address serves the conversation's next call in a new
     * sandbox (the old one died with its daemon), and the one after continues there. */
    char url[128];
    pid_t again = restart_on(&w->d, url, sizeof url);
    assert_true(again > 0);
    conversation_goes_on_fresh(w, &key, 2);
    bool done = false;
    plm_sandboxes_dispose_all(w->sb, dispose_done, &done);
    while (!done)
        ev_run(loop, EVRUN_ONCE);
    spawn_stop(again);
}

static void test_fault_daemon_down_between_cells_is_nothing_ran(void **state)
{
    world *w = *state;
    struct ev_loop *loop = plm_client_loop(w->c);
    plm_key key = {"alice", "conv-down"};
    plm_code_output *out = NULL;
    ok(execute(w->sb, loop, &key, "x = 1", &out));
    plm_code_output_free(out);
    kill_hard(&w->d);
    plm_error *e = execute(w->sb, loop, &key, "x + 1", &out);
    assert_null(out);
    assert_non_null(e);
    assert_int_equal(e->code, PLM_UNAVAILABLE);
    assert_int_equal(e->not_dispatched, PLM_REFUSAL_ENVIRONMENT); /* refused connect */
    assert_non_null(strstr(e->message, "Nothing ran (environment)"));
    plm_error_free(e);
    /* Back up: nothing ran, and the new daemon does not know the session, so the next
     * call is answered in a new sandbox, and the one after continues there. */
    char url[128];
    pid_t again = restart_on(&w->d, url, sizeof url);
    assert_true(again > 0);
    conversation_goes_on_fresh(w, &key, 2);
    bool done = false;
    plm_sandboxes_dispose_all(w->sb, dispose_done, &done);
    while (!done)
        ev_run(loop, EVRUN_ONCE);
    spawn_stop(again);
}

static void test_fault_daemon_restarted_conversation_gets_a_fresh_sandbox(void **state)
{
    world *w = *state;
    struct ev_loop *loop = plm_client_loop(w->c);
    plm_key key = {"bob", "conv-restart"};
    plm_code_output *out = NULL;
    ok(execute(w->sb, loop, &key, "x = 1", &out));
    assert_true(out->fresh_sandbox);
    plm_code_output_free(out);
    ok(execute(w->sb, loop, &key, "x + 1", &out));
    assert_false(out->fresh_sandbox);
    assert_string_equal(out->stdout_text, "python 2: x + 1");
    plm_code_output_free(out);
    kill_hard(&w->d);
    char url[128];
    pid_t again = restart_on(&w->d, url, sizeof url);
    assert_true(again > 0);
    /* The new daemon does not know the session: not_found, nothing ran, so the layer
     * reruns the call once in a new sandbox and says so. */
    ok(execute(w->sb, loop, &key, "x + 2", &out));
    assert_true(out->fresh_sandbox);
    assert_true(out->fresh_interpreter);
    assert_string_equal(out->stdout_text, "python 1: x + 2");
    plm_code_output_free(out);
    ok(execute(w->sb, loop, &key, "x + 3", &out));
    assert_false(out->fresh_sandbox);
    assert_string_equal(out->stdout_text, "python 2: x + 3");
    plm_code_output_free(out);
    bool done = false;
    plm_sandboxes_dispose_all(w->sb, dispose_done, &done);
    while (!done)
        ev_run(loop, EVRUN_ONCE);
    spawn_stop(again);
}

int main(void)
{
    plm_global_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fault_daemon_killed_mid_cell_is_may_have_run, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fault_daemon_down_between_cells_is_nothing_ran, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fault_daemon_restarted_conversation_gets_a_fresh_sandbox, setup, teardown),
        cmocka_unit_test_setup_teardown(test_W16_S16_answer_cut_in_the_status_line_may_have_run_then_serving_goes_on, setup_proxied, teardown),
        cmocka_unit_test_setup_teardown(test_W16_S16_answer_cut_in_the_headers_may_have_run_then_serving_goes_on, setup_proxied, teardown),
        cmocka_unit_test_setup_teardown(test_W18_S16_answer_cut_after_the_headers_may_have_run_then_serving_goes_on, setup_proxied, teardown),
        cmocka_unit_test_setup_teardown(test_W18_S16_answer_cut_mid_body_may_have_run_then_serving_goes_on, setup_proxied, teardown),
        cmocka_unit_test_setup_teardown(test_W18_S16_answer_cut_one_byte_short_may_have_run_then_serving_goes_on, setup_proxied, teardown),
        cmocka_unit_test_setup_teardown(test_W18_S16_chunked_answer_cut_before_its_last_chunk_may_have_run_then_serving_goes_on, setup_proxied, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_faults.c — the daemon fails under a conversation: killed in the middle of a
 * cell, down between cells, restarted with all its sessions gone.  Each case asserts
 * the exact classification, that no completed result is lost or misreported, and that
 * the conversation goes on in a fresh sandbox once the daemon is back.
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
    plm_client *c;
    plm_sandboxes *sb;
} world;

static int setup(void **state)
{
    world *w = calloc(1, sizeof *w);
    if (sbx_start(&w->d, NULL) < 0)
        return -1;
    plm_client_options o;
    plm_client_options_init(&o);
    o.base_url = w->d.url;
    o.token = w->d.token;
    if (plm_client_new(NULL, &o, &w->c))
        return -1;
    plm_sandboxes_options so;
    plm_sandboxes_options_init(&so);
    so.client = w->c;
    so.minimum_isolation = "container";
    if (plm_sandboxes_new(&so, &w->sb))
        return -1;
    *state = w;
    return 0;
}

static void dispose_done(void *ud)
{
    *(bool *)ud = true;
}

static int teardown(void **state)
{
    world *w = *state;
    bool done = false;
    plm_sandboxes_dispose_all(w->sb, dispose_done, &done);
    while (!done)
        ev_run(plm_client_loop(w->c), EVRUN_ONCE);
    plm_sandboxes_free(w->sb);
    plm_client_free(w->c);
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

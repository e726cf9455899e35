/*
 * test_sandboxes.c — the per-conversation sandbox layer (conformance group X, and the
 * T items that need a daemon) against a real sandboxd (provider echo), through the
 * real client, mostly through tests/faultproxy.py, which counts what reaches the daemon
 * and injects the faults a daemon or a network can cause.
 *
 * Each test runs its own sandboxes on a private loop and waits for callbacks with
 * ev_run(EVRUN_ONCE), bounded by a guard timer; nothing sleeps.  The echo provider
 * answers a cell "<language> <n>: <code>" (n counted per language per session) and
 * lists the cell's files on stderr, which is what the assertions read.
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
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fault.h"
#include "internal.h"
#include "plimsoll_sandboxes.h"
#include "sbxproc.h"

/* The shared daemon: sessions on, the test endpoints, tier container. */
static sbx_proc daemon_a;
static fault_proxy proxy_a;

/* ---------------------------------------------------------------- fixtures */

typedef struct fx {
    plm_client *client;
    struct ev_loop *loop;
    plm_sandboxes *sb;
    fault_proxy *proxy;
    int close_errors;
    plm_code close_code;
    char close_owner[64], close_conversation[64];
} fx;

static void count_close_error(void *ud, const plm_key *key, const plm_error *err)
{
    fx *f = ud;
    f->close_errors++;
    f->close_code = err->code;
    snprintf(f->close_owner, sizeof f->close_owner, "%s", key->owner ? key->owner : "");
    snprintf(f->close_conversation, sizeof f->close_conversation, "%s", key->conversation);
}

/* Defaults for these tests: the echo daemon states container, so the floor is lowered
 * (the default kernel floor has its own test), and close errors are counted. */
static void opts_init(plm_sandboxes_options *o)
{
    plm_sandboxes_options_init(o);
    o->minimum_isolation = "container";
}

static plm_client *client_at(const char *url, const char *token)
{
    plm_client_options co;
    plm_client_options_init(&co);
    co.base_url = url;
    co.token = token;
    plm_client *c = NULL;
    plm_error *e = plm_client_new(NULL, &co, &c);
    if (e)
        fail_msg("client: %s", e->message);
    return c;
}

/* With the options as given (the reporter included). */
static void fx_start_raw(fx *f, const char *url, const char *token, fault_proxy *px,
                         plm_sandboxes_options *o)
{
    memset(f, 0, sizeof *f);
    f->client = client_at(url, token);
    f->loop = plm_client_loop(f->client);
    f->proxy = px;
    o->client = f->client;
    plm_error *e = plm_sandboxes_new(o, &f->sb);
    if (e)
        fail_msg("sandboxes: %s", e->message);
}

/* With close errors counted in `f`. */
static void fx_start(fx *f, const char *url, const char *token, fault_proxy *px,
                     plm_sandboxes_options *o)
{
    o->on_close_error = count_close_error;
    o->on_close_error_ud = f;
    fx_start_raw(f, url, token, px, o);
}

/* Through proxy A, with the given options (NULL: the defaults above). */
static void fx_a(fx *f, plm_sandboxes_options *o)
{
    plm_sandboxes_options d;
    if (!o) {
        opts_init(&d);
        o = &d;
    }
    fx_start(f, proxy_a.url, daemon_a.token, &proxy_a, o);
}

static void guard_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
    *(bool *)t->data = true;
}

typedef bool (*pred_fn)(void *ud);

static void tick_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
}

/* Runs the loop until `pred` holds, failing after `limit` seconds.  A predicate that
 * reads something outside the loop (the proxy's counters) is asked again every 5 ms:
 * otherwise it would be asked only when an event woke the loop, which can be the very
 * answer the test means to act before (X56: a cancel meant to beat a delayed open). */
static void loop_until(struct ev_loop *loop, pred_fn pred, void *ud, double limit)
{
    bool expired = false;
    ev_timer guard, tick;
    ev_timer_init(&guard, guard_cb, limit, 0.);
    guard.data = &expired;
    ev_timer_start(loop, &guard);
    ev_timer_init(&tick, tick_cb, 0.005, 0.005);
    ev_timer_start(loop, &tick);
    while (!pred(ud) && !expired)
        ev_run(loop, EVRUN_ONCE);
    ev_timer_stop(loop, &tick);
    ev_timer_stop(loop, &guard);
    if (!pred(ud))
        fail_msg("timed out after %.1f s", limit);
}

static bool flag_set(void *ud)
{
    return *(bool *)ud;
}

/* Lets `seconds` pass on the loop (the scenario needs time to pass, e.g. an idle close). */
static void loop_for(struct ev_loop *loop, double seconds)
{
    bool done = false;
    ev_timer t;
    ev_timer_init(&t, guard_cb, seconds, 0.);
    t.data = &done;
    ev_timer_start(loop, &t);
    loop_until(loop, flag_set, &done, seconds + 10.);
}

static void on_done(void *ud)
{
    *(bool *)ud = true;
}

static void fx_stop(fx *f)
{
    bool done = false;
    plm_sandboxes_dispose_all(f->sb, on_done, &done);
    loop_until(f->loop, flag_set, &done, 10.);
    assert_int_equal(plm_sandboxes_count(f->sb), 0);
    plm_sandboxes_free(f->sb);
    plm_client_free(f->client);
}

static long forwarded(fx *f, const char *rpc)
{
    return fault_forwarded(f->proxy, rpc);
}

typedef struct count_wait {
    fx *f;
    const char *rpc;
    long want;
} count_wait;

static bool count_reached(void *ud)
{
    count_wait *w = ud;
    return forwarded(w->f, w->rpc) >= w->want;
}

static void wait_forwarded(fx *f, const char *rpc, long want)
{
    count_wait w = {f, rpc, want};
    loop_until(f->loop, count_reached, &w, 10.);
}

static bool close_reported(void *ud)
{
    return ((fx *)ud)->close_errors > 0;
}

static bool sandboxes_empty(void *ud)
{
    return plm_sandboxes_count(ud) == 0;
}

static void arm(fault_proxy *px, const char *spec)
{
    assert_int_equal(fault_arm(px, spec), 0);
}

static void end_all_sessions(const sbx_proc *d)
{
    char url[192];
    snprintf(url, sizeof url, "%s/test/end-sessions", d->url);
    assert_int_equal(http_call("POST", url, "", NULL), 200);
}

static int reset_proxy_a(void **state)
{
    return fault_reset(&proxy_a);
}

/* ---------------------------------------------------------------- calls */

typedef struct outcome {
    bool done;
    plm_error *err;
    plm_code_output *out;
} outcome;

static void on_out(void *ud, plm_error *err, plm_code_output *out)
{
    outcome *o = ud;
    if (o->done)
        fail_msg("a call's callback ran twice");
    o->done = true;
    o->err = err;
    o->out = out;
}

static plm_key str_key(const char *id)
{
    return (plm_key){NULL, id};
}

static plm_key pair(const char *owner, const char *conversation)
{
    return (plm_key){owner, conversation};
}

/* Starts a call; `key` NULL runs fresh.  A refusal before the start fails the test. */
static void start(fx *f, const plm_key *key, const char *code, const char *lang,
                  const plm_file *files, size_t n, plm_cancel *cancel, outcome *o)
{
    memset(o, 0, sizeof *o);
    plm_code_input in = {code, lang, files, n};
    plm_error *e = plm_sandboxes_run(f->sb, key, &in, cancel, on_out, o);
    if (e)
        fail_msg("refused at once [%s]: %s", plm_code_name(e->code), e->message);
}

static void wait_out(fx *f, outcome *o)
{
    loop_until(f->loop, flag_set, &o->done, 15.);
}

static plm_code_output *got(outcome *o)
{
    if (o->err)
        fail_msg("call failed [%s]: %s", plm_code_name(o->err->code), o->err->message);
    assert_non_null(o->out);
    return o->out;
}

static plm_code_output *run_ok(fx *f, const plm_key *key, const char *code, const char *lang)
{
    outcome o;
    start(f, key, code, lang, NULL, 0, NULL, &o);
    wait_out(f, &o);
    return got(&o);
}

static plm_error *run_fail(fx *f, const plm_key *key, const char *code, const char *lang)
{
    outcome o;
    start(f, key, code, lang, NULL, 0, NULL, &o);
    wait_out(f, &o);
    if (!o.err)
        fail_msg("expected an error, got stdout \"%s\"", o.out->stdout_text);
    return o.err;
}

static void contains(const char *hay, const char *needle)
{
    if (!hay || !strstr(hay, needle))
        fail_msg("\"%s\" does not contain \"%s\"", hay ? hay : "(null)", needle);
}

static void starts_with(const char *s, const char *lead)
{
    if (!s || strncmp(s, lead, strlen(lead)) != 0)
        fail_msg("\"%s\" does not start with \"%s\"", s ? s : "(null)", lead);
}

/* Asserts an error's class and message lead, and frees it. */
static void expect_err(plm_error *e, plm_code code, plm_refusal mark, const char *lead)
{
    assert_non_null(e);
    if (e->code != code || e->not_dispatched != mark)
        fail_msg("expected %s/%s, got %s/%s: %s", plm_code_name(code),
                 mark == PLM_REFUSAL_NONE ? "unmarked" : plm_refusal_name(mark),
                 plm_code_name(e->code),
                 e->not_dispatched == PLM_REFUSAL_NONE ? "unmarked"
                                                       : plm_refusal_name(e->not_dispatched),
                 e->message);
    if (lead)
        starts_with(e->message, lead);
    plm_error_free(e);
}

enum { NO = 0, YES = 1, ANY = 2 };

/* Checks one output and frees it: stdout, and the four state flags. */
static void expect_out(plm_code_output *o, const char *stdout_text, int fresh_sandbox,
                       int fresh_interpreter, int state_kept, int files_persist)
{
    assert_non_null(o);
    if (stdout_text)
        assert_string_equal(o->stdout_text, stdout_text);
    if (fresh_sandbox != ANY && o->fresh_sandbox != (fresh_sandbox == YES))
        fail_msg("\"%s\": freshSandbox is %d", o->stdout_text, o->fresh_sandbox);
    if (fresh_interpreter != ANY && o->fresh_interpreter != (fresh_interpreter == YES))
        fail_msg("\"%s\": freshInterpreter is %d", o->stdout_text, o->fresh_interpreter);
    if (state_kept != ANY && o->state_kept != (state_kept == YES))
        fail_msg("\"%s\": stateKept is %d", o->stdout_text, o->state_kept);
    if (files_persist != ANY && o->files_persist != (files_persist == YES))
        fail_msg("\"%s\": filesPersist is %d", o->stdout_text, o->files_persist);
    assert_int_equal(strlen(o->record_sha256), 64);
    plm_code_output_free(o);
}

static void expect_python(fx *f, const plm_key *key, const char *code, const char *stdout_text,
                          int fresh_sandbox, int fresh_interpreter)
{
    expect_out(run_ok(f, key, code, "python"), stdout_text, fresh_sandbox, fresh_interpreter,
               ANY, ANY);
}

static void fire_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
    plm_cancel_fire(t->data);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A second daemon with its own flags, behind its own proxy. */
typedef struct side {
    sbx_proc d;
    fault_proxy px;
} side;

/* A test has at most one; the teardown stops it even when the test failed midway. */
static side side_d;

static side *side_start(const char *const *args)
{
    side *s = &side_d;
    memset(s, 0, sizeof *s);
    assert_int_equal(sbx_start(&s->d, args), 0);
    assert_int_equal(fault_start(&s->px, s->d.url), 0);
    return s;
}

static int side_teardown(void **state)
{
    if (side_d.px.pid > 0)
        fault_stop(&side_d.px);
    if (side_d.d.pid > 0)
        sbx_stop(&side_d.d);
    memset(&side_d, 0, sizeof side_d);
    return 0;
}

/* ---------------------------------------------------------------- keys */

static void test_X01_X05_invalid_keys_are_refused_marked_request(void **state)
{
    fx f;
    fx_a(&f, NULL);
    plm_key bad[] = {{NULL, ""}, {"", "a"}, {"alice", ""}, {NULL, NULL}, {"alice", NULL}};
    plm_code_input in = {"1", NULL, NULL, 0};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        outcome o = {0};
        plm_error *e = plm_sandboxes_run(f.sb, &bad[i], &in, NULL, on_out, &o);
        assert_non_null(e);
        assert_string_equal(e->message, "Nothing ran (request): plimsoll: a sandbox key is a "
                                        "nonempty string, or a nonempty owner and conversation");
        expect_err(e, PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST, "Nothing ran (request): plimsoll: ");
        /* warm and dispose say it at once, without the lead (they run no code) */
        expect_err(plm_sandboxes_warm(f.sb, &bad[i]), PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST,
                   "plimsoll: a sandbox key is a nonempty string");
        expect_err(plm_sandboxes_dispose(f.sb, &bad[i], NULL, NULL), PLM_INVALID_ARGUMENT,
                   PLM_REFUSAL_REQUEST, "plimsoll: a sandbox key is a nonempty string");
        assert_false(o.done);
    }
    expect_err(plm_sandboxes_warm(f.sb, NULL), PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST, NULL);
    assert_int_equal(plm_sandboxes_count(f.sb), 0);
    assert_int_equal(forwarded(&f, "Describe"), 0); /* nothing was sent */
    fx_stop(&f);
}

static void test_X02_X03_key_encodings_never_alias(void **state)
{
    fx f;
    fx_a(&f, NULL);
    /* The string key '["alice","a"]' is not the pair {alice, a}. */
    plm_key s = str_key("[\"alice\",\"a\"]"), p = pair("alice", "a");
    expect_python(&f, &s, "1", "python 1: 1", YES, YES);
    expect_python(&f, &p, "2", "python 1: 2", YES, YES);
    /* Separators inside an ID cannot make two pairs one (a C string holds no NUL, so a
     * quote and a comma stand for every separator). */
    plm_key q1 = pair("a\",\"b", "c"), q2 = pair("a", "b\",\"c"), q3 = pair("a,b", "c");
    expect_python(&f, &q1, "3", "python 1: 3", YES, YES);
    expect_python(&f, &q2, "4", "python 1: 4", YES, YES);
    expect_python(&f, &q3, "5", "python 1: 5", YES, YES);
    assert_int_equal(plm_sandboxes_count(f.sb), 5);
    assert_int_equal(forwarded(&f, "OpenSession"), 5);
    fx_stop(&f);
}

static void test_X04_key_digest_is_12_hex_of_the_encoding(void **state)
{
    plm_hex hex;
    char d[13];
    plm_key p = pair("alice", "a"), s = str_key("run-1");
    plm_sha256_hex("[\"alice\",\"a\"]", 13, hex);
    plm_key_digest(&p, d);
    assert_int_equal(strlen(d), 12);
    assert_memory_equal(d, hex, 12);
    plm_sha256_hex("[\"run-1\"]", 9, hex);
    plm_key_digest(&s, d);
    assert_memory_equal(d, hex, 12);
}

/* The encoding is json_dumps's: a quote, a backslash and a control character escaped
 * (\u001F in upper case), other text as it is; a key that is not well-formed UTF-8,
 * or empty, is refused by plm_key_check (called at every warm) as by every use. */
static void test_X04_key_encoding_escapes_and_refuses_ill_formed_text(void **state)
{
    (void)state;
    plm_hex hex;
    char d[13];
    plm_key k = pair("a\"\\\x1f", "\xc3\xa9");
    const char *want = "[\"a\\\"\\\\\\u001F\",\"\xc3\xa9\"]";
    plm_sha256_hex(want, strlen(want), hex);
    plm_key_digest(&k, d);
    assert_memory_equal(d, hex, 12);
    assert_null(plm_key_check(&k));
    plm_key bad[] = {str_key("x\xff"), pair("\xc3", "a"), pair("a", "\xed\xa0\x80"), str_key(""),
                     pair("", "a")};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        plm_error *e = plm_key_check(&bad[i]);
        assert_non_null(e);
        assert_int_equal(e->code, PLM_INVALID_ARGUMENT);
        plm_error_free(e);
    }
}

/* ---------------------------------------------------------------- one key, one sandbox */

static void test_X07_X08_X09_a_key_keeps_one_interpreter(void **state)
{
    fx f;
    fx_a(&f, NULL);
    plm_key k = str_key("conv-1");
    assert_null(plm_sandboxes_warm(f.sb, &k));
    assert_int_equal(plm_sandboxes_count(f.sb), 1);
    plm_file data = {"data.csv", "a,b\n1,2\n"};
    outcome o;
    start(&f, &k, "x = 1", NULL, &data, 1, NULL, &o); /* python is the default */
    wait_out(&f, &o);
    plm_code_output *a = got(&o);
    assert_string_equal(a->language, "python");
    assert_string_equal(a->stdout_text, "python 1: x = 1");
    assert_string_equal(a->stderr_text, "data.csv\n");
    assert_true(a->fresh_sandbox && a->fresh_interpreter && a->state_kept && a->files_persist);
    assert_string_equal(a->isolation, "container");
    plm_code_output *b = run_ok(&f, &k, "x + 1", NULL);
    assert_string_equal(b->stdout_text, "python 2: x + 1");
    assert_false(b->fresh_sandbox || b->fresh_interpreter);
    assert_true(b->state_kept && b->files_persist);
    assert_string_equal(b->isolation, "container");
    assert_string_not_equal(a->record_sha256, b->record_sha256);
    for (const char *h = b->record_sha256; *h; h++)
        assert_non_null(strchr("0123456789abcdef", *h));
    plm_code_output_free(a);
    plm_code_output_free(b);
    /* JavaScript in the same sandbox: a new interpreter, not a new sandbox. */
    expect_out(run_ok(&f, &k, "1", "javascript"), "javascript 1: 1", NO, YES, YES, YES);
    assert_int_equal(forwarded(&f, "OpenSession"), 1);
    /* Disposing twice sends one CloseSession; the second finds no entry at once. */
    bool d1 = false, d2 = false;
    assert_null(plm_sandboxes_dispose(f.sb, &k, on_done, &d1));
    assert_int_equal(plm_sandboxes_count(f.sb), 0);
    assert_null(plm_sandboxes_dispose(f.sb, &k, on_done, &d2));
    loop_until(f.loop, flag_set, &d1, 10.);
    loop_until(f.loop, flag_set, &d2, 10.);
    assert_int_equal(forwarded(&f, "CloseSession"), 1);
    assert_int_equal(f.close_errors, 0);
    fx_stop(&f);
}

static void test_X06_keys_never_share_a_sandbox(void **state)
{
    fx f;
    fx_a(&f, NULL);
    plm_key a = str_key("a"), b = str_key("b");
    expect_python(&f, &a, "1", "python 1: 1", YES, YES);
    expect_python(&f, &b, "1", "python 1: 1", YES, YES);
    fx_stop(&f);
}

static void test_X46_X07_parallel_calls_share_one_open_and_one_is_fresh(void **state)
{
    fx f;
    fx_a(&f, NULL);
    plm_key k = str_key("pair");
    outcome o1, o2;
    start(&f, &k, "a", NULL, NULL, 0, NULL, &o1);
    start(&f, &k, "b", NULL, NULL, 0, NULL, &o2);
    assert_int_equal(plm_sandboxes_count(f.sb), 0); /* the entry comes after the Describe */
    wait_out(&f, &o1);
    wait_out(&f, &o2);
    plm_code_output *a = got(&o1), *b = got(&o2);
    assert_string_equal(a->stdout_text, "python 1: a");
    assert_string_equal(b->stdout_text, "python 2: b");
    assert_int_equal(a->fresh_sandbox + b->fresh_sandbox, 1);
    plm_code_output_free(a);
    plm_code_output_free(b);
    assert_int_equal(forwarded(&f, "OpenSession"), 1);
    assert_int_equal(forwarded(&f, "Describe"), 1);
    fx_stop(&f);
}

/* ---------------------------------------------------------------- fresh runs */

static void test_X10_X64_a_call_without_key_runs_fresh(void **state)
{
    fx f;
    fx_a(&f, NULL);
    plm_file data = {"data.csv", "a\n"};
    outcome o;
    start(&f, NULL, "print(1)", NULL, &data, 1, NULL, &o);
    wait_out(&f, &o);
    plm_code_output *out = got(&o);
    /* The echo runs no code: a project answers each step's command. */
    assert_string_equal(out->stdout_text, "python3 -I .plimsoll/run.py\n");
    assert_string_equal(out->language, "python");
    assert_string_equal(out->isolation, "container");
    expect_out(out, NULL, NO, NO, NO, NO);
    expect_out(run_ok(&f, NULL, "1", "javascript"), "node --expose-internals .plimsoll/run.cjs\n",
               NO, NO, NO, NO);
    assert_int_equal(forwarded(&f, "OpenSession"), 0);
    assert_int_equal(forwarded(&f, "Run"), 2);
    assert_int_equal(plm_sandboxes_count(f.sb), 0);
    fx_stop(&f);
}

static void on_bool(void *ud, plm_error *err, bool value)
{
    outcome *o = ud;
    o->done = true;
    o->err = err;
    o->out = value ? (plm_code_output *)1 : NULL; /* a flag, never freed */
}

static void test_X10_X24_sessions_never_runs_fresh_and_is_not_persistent(void **state)
{
    plm_sandboxes_options o;
    opts_init(&o);
    o.sessions = PLM_SESSIONS_NEVER;
    fx f;
    fx_a(&f, &o);
    outcome p = {0};
    assert_null(plm_sandboxes_persistent(f.sb, on_bool, &p));
    wait_out(&f, &p);
    assert_null(p.err);
    assert_null(p.out);
    assert_int_equal(forwarded(&f, "Describe"), 0); /* false without describing */
    plm_key k = str_key("never");
    assert_null(plm_sandboxes_warm(f.sb, &k));
    assert_int_equal(plm_sandboxes_count(f.sb), 0);
    expect_out(run_ok(&f, &k, "1", NULL), "python3 -I .plimsoll/run.py\n", NO, NO, NO, NO);
    assert_int_equal(forwarded(&f, "OpenSession"), 0);
    fx_stop(&f);
}

static void test_X11_sessions_never_on_a_sessions_only_daemon_is_unsupported(void **state)
{
    /* The reference's sessions-only fake refuses single runs; the proxy plays it. */
    plm_sandboxes_options o;
    opts_init(&o);
    o.sessions = PLM_SESSIONS_NEVER;
    fx f;
    fx_a(&f, &o);
    arm(&proxy_a, "{\"mode\":\"status_bound_error\",\"rpc\":\"Run\",\"value\":501,"
                  "\"headers\":{\"Plimsoll-Not-Dispatched\":\"unsupported\"},"
                  "\"body\":{\"code\":\"unimplemented\",\"message\":\"sessions only\"}}");
    plm_key k = str_key("k");
    expect_err(run_fail(&f, &k, "1", NULL), PLM_UNIMPLEMENTED, PLM_REFUSAL_UNSUPPORTED,
               "Nothing ran (unsupported): plimsoll: Run: sessions only");
    fx_stop(&f);
}

static void test_X12_sessions_always_needs_a_daemon_with_sessions(void **state)
{
    const char *args[] = {"--max-sessions", "0", NULL};
    side *s = side_start(args);
    plm_sandboxes_options o;
    opts_init(&o);
    o.sessions = PLM_SESSIONS_ALWAYS;
    fx f;
    fx_start(&f, s->px.url, s->d.token, &s->px, &o);
    plm_key k = str_key("k");
    expect_err(run_fail(&f, &k, "1", NULL), PLM_UNIMPLEMENTED, PLM_REFUSAL_UNSUPPORTED,
               "Nothing ran (unsupported): plimsoll: the daemon (echo) does not keep sessions");
    outcome p = {0};
    assert_null(plm_sandboxes_persistent(f.sb, on_bool, &p));
    wait_out(&f, &p);
    expect_err(p.err, PLM_UNIMPLEMENTED, PLM_REFUSAL_UNSUPPORTED, NULL);
    /* Without a key, a call runs fresh even under "always". */
    expect_out(run_ok(&f, NULL, "1", NULL), "python3 -I .plimsoll/run.py\n", NO, NO, NO, NO);
    fx_stop(&f);

    /* auto: a keyed call runs fresh, persistent() is false, and a warm fails silently. */
    opts_init(&o);
    fx_start(&f, s->px.url, s->d.token, &s->px, &o);
    p = (outcome){0};
    assert_null(plm_sandboxes_persistent(f.sb, on_bool, &p));
    wait_out(&f, &p);
    assert_null(p.err);
    assert_null(p.out);
    assert_null(plm_sandboxes_warm(f.sb, &k));
    assert_int_equal(plm_sandboxes_count(f.sb), 1);
    loop_until(f.loop, sandboxes_empty, f.sb, 10.); /* the failed entry is removed */
    expect_out(run_ok(&f, &k, "1", NULL), "python3 -I .plimsoll/run.py\n", NO, NO, NO, NO);
    assert_int_equal(forwarded(&f, "OpenSession"), 0);
    fx_stop(&f);
}

/* ---------------------------------------------------------------- languages */

static void test_X13_X08_a_language_the_tool_does_not_offer_is_refused(void **state)
{
    static const char *const js_only[] = {"javascript"};
    plm_sandboxes_options o;
    opts_init(&o);
    o.languages = js_only;
    o.n_languages = 1;
    fx f;
    fx_a(&f, &o);
    plm_key k = str_key("js");
    plm_code_input in = {"1", "python", NULL, 0};
    outcome out = {0};
    expect_err(plm_sandboxes_run(f.sb, &k, &in, NULL, on_out, &out), PLM_INVALID_ARGUMENT,
               PLM_REFUSAL_REQUEST, "Nothing ran (request): plimsoll: this tool runs javascript, "
                                    "not python");
    in.language = "cobol";
    expect_err(plm_sandboxes_run(f.sb, &k, &in, NULL, on_out, &out), PLM_INVALID_ARGUMENT,
               PLM_REFUSAL_REQUEST, "Nothing ran (request): plimsoll: this tool runs javascript, "
                                    "not cobol");
    assert_false(out.done);
    /* The default is the first offered language. */
    plm_code_output *r = run_ok(&f, &k, "1", NULL);
    assert_string_equal(r->language, "javascript");
    expect_out(r, "javascript 1: 1", YES, YES, YES, YES);
    fx_stop(&f);
}

static void test_X14_a_language_the_image_lacks_is_refused_unsupported(void **state)
{
    fx f;
    fx_a(&f, NULL);
    arm(&proxy_a, "{\"mode\":\"patch\",\"rpc\":\"Describe\",\"count\":1,"
                  "\"value\":{\"projectEnvironment.languages\":[\"javascript\"]}}");
    plm_key k = str_key("img");
    expect_err(run_fail(&f, &k, "1", "python"), PLM_UNIMPLEMENTED, PLM_REFUSAL_UNSUPPORTED,
               "Nothing ran (unsupported): plimsoll: the sandbox image has no python interpreter "
               "(it runs javascript)");
    /* Refused before anything opened; the refusal dropped the Describe, and the daemon's
     * real one (no languages stated: an older daemon) lets the call through. */
    assert_int_equal(forwarded(&f, "OpenSession"), 0);
    expect_python(&f, &k, "1", "python 1: 1", YES, YES);
    assert_int_equal(forwarded(&f, "Describe"), 2);
    fx_stop(&f);
}

/* ---------------------------------------------------------------- ended sessions */

static void test_X15_retry_once_after_session_ended_not_dispatched(void **state)
{
    fx f;
    fx_a(&f, NULL);
    plm_key k = str_key("ended");
    expect_python(&f, &k, "1", "python 1: 1", YES, YES);
    expect_python(&f, &k, "x = 1", "python 2: x = 1", NO, NO);
    end_all_sessions(&daemon_a);
    expect_python(&f, &k, "2", "python 1: 2", YES, YES);
    expect_python(&f, &k, "3", "python 2: 3", NO, NO);
    assert_int_equal(forwarded(&f, "OpenSession"), 2);
    assert_int_equal(forwarded(&f, "SessionRun"), 5); /* the refused call and its rerun */
    assert_int_equal(forwarded(&f, "CloseSession"), 1); /* the ended one, collected */
    assert_int_equal(f.close_errors, 0);
    fx_stop(&f);
}

typedef struct stat_wait {
    fault_proxy *px;
    long want;
} stat_wait;

static bool answered_reached(void *ud)
{
    stat_wait *w = ud;
    char url[192], *body = NULL;
    snprintf(url, sizeof url, "%s/_fault/stats", w->px->url);
    if (http_call("GET", url, NULL, &body) != 200) {
        free(body);
        return false;
    }
    json_t *j = json_loads(body, 0, NULL);
    free(body);
    long n = (long)json_integer_value(json_object_get(j, "answered"));
    json_decref(j);
    return n >= w->want;
}

static void test_X16_unclaimed_warm_is_replaced_on_the_first_call(void **state)
{
    const char *args[] = {"--session-idle-ms", "1000", "--test-endpoints", NULL};
    side *s = side_start(args);
    plm_sandboxes_options o;
    opts_init(&o);
    fx f;
    fx_start(&f, s->px.url, s->d.token, &s->px, &o);
    plm_key k = str_key("warm");
    assert_null(plm_sandboxes_warm(f.sb, &k));
    /* Once the daemon answered the open (Describe and OpenSession), wait for its idle
     * timeout to end the session no request named. */
    stat_wait w = {&s->px, 2};
    loop_until(f.loop, answered_reached, &w, 10.);
    char url[192];
    snprintf(url, sizeof url, "%s/test/wait-ended", s->d.url);
    assert_int_equal(http_call("POST", url, "", NULL), 200);
    expect_python(&f, &k, "1", "python 1: 1", YES, YES);
    assert_int_equal(forwarded(&f, "OpenSession"), 2);
    assert_int_equal(forwarded(&f, "SessionRun"), 2);
    fx_stop(&f);
}

static void test_X17_a_forgotten_session_is_replaced_and_the_call_reruns(void **state)
{
    fx f;
    fx_a(&f, NULL);
    plm_key k = str_key("forgot");
    expect_python(&f, &k, "x = 1", "python 1: x = 1", YES, YES);
    /* A restarted daemon answers not_found, ended and not dispatched (the proxy plays
     * it; "CAE" is NotDispatched{request}, "CAk" SessionEnded{not_found}). */
    arm(&proxy_a, "{\"mode\":\"status_bound_error\",\"rpc\":\"SessionRun\",\"count\":1,"
                  "\"value\":404,\"body\":{\"code\":\"not_found\",\"message\":\"no such "
                  "session\",\"details\":[{\"type\":\"plimsoll.v1.NotDispatched\",\"value\":"
                  "\"CAE\"},{\"type\":\"plimsoll.v1.SessionEnded\",\"value\":\"CAk\"}]}}");
    expect_python(&f, &k, "2", "python 1: 2", YES, YES);
    assert_int_equal(forwarded(&f, "OpenSession"), 2);
    fx_stop(&f);
}

static void test_X19_deadline_and_ended_sandbox_say_their_state_is_not_kept(void **state)
{
    fx f;
    fx_a(&f, NULL);
    plm_key k = str_key("deadline");
    expect_python(&f, &k, "1", "python 1: 1", YES, YES);
    plm_code_output *d = run_ok(&f, &k, "plimsoll-fake:past-deadline", NULL);
    assert_int_equal(d->exit_code, 124);
    assert_true(d->timed_out);
    expect_out(d, NULL, NO, NO, NO, YES);
    expect_out(run_ok(&f, &k, "2", NULL), "python 1: 2", NO, YES, YES, YES);
    plm_code_output *e = run_ok(&f, &k, "plimsoll-fake:ends-session", NULL);
    assert_int_equal(e->exit_code, 0);
    expect_out(e, NULL, NO, NO, NO, NO);
    assert_int_equal(plm_sandboxes_count(f.sb), 0); /* dropped at once */
    expect_python(&f, &k, "3", "python 1: 3", YES, YES);
    wait_forwarded(&f, "CloseSession", 1);
    assert_int_equal(f.close_errors, 0);
    fx_stop(&f);
}

static void test_X20_an_end_this_client_cannot_name_still_ends(void **state)
{
    fx f;
    fx_a(&f, NULL);
    plm_key k = str_key("hostlost");
    expect_python(&f, &k, "x = 1", "python 1: x = 1", YES, YES);
    arm(&proxy_a, "{\"mode\":\"patch\",\"rpc\":\"SessionRun\",\"count\":1,"
                  "\"value\":{\"ended\":\"SESSION_END_HOST_LOST\"}}");
    expect_out(run_ok(&f, &k, "x", NULL), "python 2: x", NO, NO, NO, NO);
    expect_python(&f, &k, "x", "python 1: x", YES, YES);
    fx_stop(&f);
}

static void test_X21_X63_a_session_ending_under_two_calls_is_closed_once(void **state)
{
    fx f;
    fx_a(&f, NULL);
    plm_key k = str_key("two");
    outcome o1, o2;
    start(&f, &k, "plimsoll-fake:ends-session", NULL, NULL, 0, NULL, &o1);
    start(&f, &k, "2", NULL, NULL, 0, NULL, &o2);
    wait_out(&f, &o1);
    wait_out(&f, &o2);
    expect_out(got(&o1), "python 1: plimsoll-fake:ends-session", YES, YES, NO, NO);
    /* The second was refused (ended, not dispatched) and ran again in a new sandbox. */
    expect_out(got(&o2), "python 1: 2", YES, YES, YES, YES);
    wait_forwarded(&f, "CloseSession", 1);
    assert_int_equal(forwarded(&f, "OpenSession"), 2);
    assert_int_equal(forwarded(&f, "CloseSession"), 1);
    assert_int_equal(f.close_errors, 0);
    fx_stop(&f);
}

static void test_X18_X22_owner_cap_across_instances_reruns_fresh_once(void **state)
{
    const char *args[] = {"--max-sessions-per-owner", "1", NULL};
    side *s = side_start(args);
    plm_sandboxes_options o;
    opts_init(&o);
    fx a, b;
    fx_start(&a, s->px.url, s->d.token, &s->px, &o);
    opts_init(&o);
    fx_start(&b, s->px.url, s->d.token, &s->px, &o);
    plm_key one = pair("alice", "one"), two = pair("alice", "two");
    expect_python(&a, &one, "1", "python 1: 1", YES, YES);
    /* Another instance opens the user's second conversation: the daemon replaces one. */
    expect_python(&b, &two, "2", "python 1: 2", YES, YES);
    /* Both calls of a parallel pair are refused as replaced and run again; one open. */
    outcome o1, o2;
    start(&a, &one, "3", NULL, NULL, 0, NULL, &o1);
    start(&a, &one, "4", NULL, NULL, 0, NULL, &o2);
    wait_out(&a, &o1);
    wait_out(&a, &o2);
    plm_code_output *r1 = got(&o1), *r2 = got(&o2);
    assert_string_equal(r1->stdout_text, "python 1: 3");
    assert_string_equal(r2->stdout_text, "python 2: 4");
    assert_int_equal(r1->fresh_sandbox + r2->fresh_sandbox, 1);
    plm_code_output_free(r1);
    plm_code_output_free(r2);
    wait_forwarded(&a, "CloseSession", 1);
    assert_int_equal(forwarded(&a, "OpenSession"), 3);
    assert_int_equal(forwarded(&a, "CloseSession"), 1);
    assert_int_equal(a.close_errors + b.close_errors, 0);
    fx_stop(&a);
    fx_stop(&b);
}

static void test_X22_X40_a_tampered_close_count_is_reported_once(void **state)
{
    fx f;
    fx_a(&f, NULL);
    plm_key k = pair("alice", "tampered");
    outcome o1, o2;
    start(&f, &k, "plimsoll-fake:ends-session", NULL, NULL, 0, NULL, &o1);
    start(&f, &k, "2", NULL, NULL, 0, NULL, &o2);
    arm(&proxy_a, "{\"mode\":\"patch\",\"rpc\":\"CloseSession\",\"count\":1,"
                  "\"value\":{\"calls\":\"9\"}}");
    wait_out(&f, &o1);
    wait_out(&f, &o2);
    plm_code_output_free(got(&o1));
    plm_code_output_free(got(&o2));
    loop_until(f.loop, close_reported, &f, 10.); /* the close's answer reaches the reporter */
    assert_int_equal(f.close_errors, 1);
    assert_int_equal(f.close_code, PLM_DATA_LOSS);
    assert_string_equal(f.close_owner, "alice"); /* the key as passed: the pair */
    assert_string_equal(f.close_conversation, "tampered");
    fx_stop(&f);
    assert_int_equal(f.close_errors, 1);
}

/* ---------------------------------------------------------------- before dispatch */

static int closed_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    bind(fd, (struct sockaddr *)&a, sizeof a);
    getsockname(fd, (struct sockaddr *)&a, &len);
    close(fd); /* nothing listens there now */
    return ntohs(a.sin_port);
}

static void test_X23_X24_X47_an_unreachable_daemon_is_marked_environment(void **state)
{
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", closed_port());
    plm_sandboxes_options o;
    opts_init(&o);
    fx f;
    fx_start(&f, url, NULL, NULL, &o);
    plm_key k = str_key("k");
    expect_err(run_fail(&f, &k, "1", NULL), PLM_UNAVAILABLE, PLM_REFUSAL_ENVIRONMENT,
               "Nothing ran (environment): plimsoll: ");
    expect_err(run_fail(&f, NULL, "1", NULL), PLM_UNAVAILABLE, PLM_REFUSAL_ENVIRONMENT,
               "Nothing ran (environment): plimsoll: ");
    outcome p = {0};
    assert_null(plm_sandboxes_persistent(f.sb, on_bool, &p));
    wait_out(&f, &p);
    expect_err(p.err, PLM_UNAVAILABLE, PLM_REFUSAL_ENVIRONMENT, "plimsoll: ");
    /* A reserved path is refused before anything, whatever the daemon (X47). */
    plm_file reserved = {".plimsoll/run.py", "x"};
    plm_code_input in = {"1", NULL, &reserved, 1};
    outcome out = {0};
    expect_err(plm_sandboxes_run(f.sb, NULL, &in, NULL, on_out, &out), PLM_INVALID_ARGUMENT,
               PLM_REFUSAL_REQUEST, "Nothing ran (request): plimsoll: \".plimsoll/run.py\"");
    plm_sandboxes_free(f.sb);
    opts_init(&o);
    o.client = f.client;
    o.sessions = PLM_SESSIONS_NEVER;
    assert_null(plm_sandboxes_new(&o, &f.sb));
    expect_err(plm_sandboxes_run(f.sb, &k, &in, NULL, on_out, &out), PLM_INVALID_ARGUMENT,
               PLM_REFUSAL_REQUEST, "Nothing ran (request): plimsoll: \".plimsoll/run.py\"");
    assert_false(out.done);
    fx_stop(&f);
}

static void expect_environment(fx *f, const char *spec, const plm_key *key, plm_code code,
                               const char *lead)
{
    arm(f->proxy, spec);
    expect_err(run_fail(f, key, "1", NULL), code, PLM_REFUSAL_ENVIRONMENT, lead);
    fault_reset(f->proxy);
}

static void test_X23_X26_failures_before_the_code_is_sent_say_nothing_ran(void **state)
{
    fx f;
    fx_a(&f, NULL);
    plm_key k = str_key("env");
    /* A 503 on Describe: not bound either, and still nothing ran. */
    expect_environment(&f, "{\"mode\":\"status\",\"rpc\":\"Describe\",\"value\":503}", &k,
                       PLM_UNAVAILABLE, "Nothing ran (environment): plimsoll: Describe: HTTP 503");
    /* Describe's connection dropped after sending. */
    expect_environment(&f, "{\"mode\":\"reset\",\"rpc\":\"Describe\"}", &k, PLM_UNAVAILABLE,
                       "Nothing ran (environment): plimsoll: ");
    /* A 503 on OpenSession; the failed entry is gone, so the next call opens again. */
    expect_environment(&f, "{\"mode\":\"status\",\"rpc\":\"OpenSession\",\"value\":503}", &k,
                       PLM_UNAVAILABLE, "Nothing ran (environment): plimsoll: OpenSession: HTTP 503");
    assert_int_equal(plm_sandboxes_count(f.sb), 0);
    /* An open whose fingerprint does not match: data_loss, and still nothing ran. */
    expect_environment(&f, "{\"mode\":\"patch\",\"rpc\":\"OpenSession\",\"value\":{\"session\":"
                           "\"0000000000000000000000000000000000000000000000000000000000000000\"}}",
                       &k, PLM_DATA_LOSS, "Nothing ran (environment): plimsoll: OpenSession: ");
    expect_python(&f, &k, "1", "python 1: 1", YES, YES);
    fx_stop(&f);
}

static void test_X26_X44_T12_a_call_that_may_have_run_says_so_and_is_not_retried(void **state)
{
    fx f;
    fx_a(&f, NULL);
    plm_key k = str_key("lost");
    expect_python(&f, &k, "x = 1", "python 1: x = 1", YES, YES);
    /* The daemon runs the cell, and the answer never comes back. */
    arm(&proxy_a, "{\"mode\":\"reset\",\"rpc\":\"SessionRun\",\"count\":1}");
    plm_error *e = run_fail(&f, &k, "x", NULL);
    const char *lead = "The code may have run, and there is no checked answer for it: plimsoll: ";
    starts_with(e->message, lead);
    assert_null(strstr(e->message + 1, "The code may have run")); /* the lead, once */
    expect_err(e, PLM_UNAVAILABLE, PLM_REFUSAL_NONE, lead);
    assert_int_equal(forwarded(&f, "SessionRun"), 2); /* not retried */
    /* The session stopped; the next call gets a new sandbox and says so. */
    expect_python(&f, &k, "x", "python 1: x", YES, YES);
    fx_stop(&f);
    /* Closing the stopped session finds a call this client has no answer for. */
    assert_int_equal(f.close_errors, 1);
    assert_int_equal(f.close_code, PLM_DATA_LOSS);
}

static void test_X45_an_unanswered_call_the_session_checked_keeps_the_sandbox(void **state)
{
    fx f;
    fx_a(&f, NULL);
    plm_key k = str_key("unanswered");
    expect_python(&f, &k, "1", "python 1: 1", YES, YES);
    plm_error *e = run_fail(&f, &k, "plimsoll-echo:unanswered", NULL);
    assert_non_null(e->record);
    assert_int_equal(e->record->sequence, 2);
    expect_err(e, PLM_UNKNOWN, PLM_REFUSAL_NONE,
               "The code may have run, and there is no checked answer for it: ");
    expect_python(&f, &k, "3", "python 3: 3", NO, NO);
    assert_int_equal(forwarded(&f, "OpenSession"), 1);
    fx_stop(&f);
    assert_int_equal(f.close_errors, 0); /* the close count agrees */
}

/* ---------------------------------------------------------------- the Describe cache */

static void test_X30_X31_a_refusal_that_says_the_daemon_changed_reads_describe_again(void **state)
{
    fx f;
    fx_a(&f, NULL);
    plm_key k = str_key("changed");
    /* The first Describe says no sessions and no projects: the fresh run is refused. */
    arm(&proxy_a, "{\"mode\":\"patch\",\"rpc\":\"Describe\",\"count\":1,\"value\":"
                  "{\"supportsSessions\":false,\"supportsProject\":false}}");
    expect_err(run_fail(&f, &k, "1", "python"), PLM_UNIMPLEMENTED, PLM_REFUSAL_UNSUPPORTED,
               "Nothing ran (unsupported): plimsoll: the daemon (echo) runs JavaScript snippets "
               "only, not python");
    assert_int_equal(forwarded(&f, "Run"), 0);
    expect_python(&f, &k, "1", "python 1: 1", YES, YES);
    assert_int_equal(forwarded(&f, "Describe"), 2);
    /* Request refusals keep it. */
    plm_code_input cobol = {"1", "cobol", NULL, 0};
    outcome o = {0};
    expect_err(plm_sandboxes_run(f.sb, &k, &cobol, NULL, on_out, &o), PLM_INVALID_ARGUMENT,
               PLM_REFUSAL_REQUEST, NULL);
    expect_python(&f, &k, "2", "python 2: 2", NO, NO);
    /* A failed Describe is not cached. */
    plm_sandboxes_options opts;
    opts_init(&opts);
    fx g;
    fx_a(&g, &opts);
    fault_reset(&proxy_a);
    arm(&proxy_a, "{\"mode\":\"status\",\"rpc\":\"Describe\",\"value\":503,\"count\":1}");
    plm_key j = str_key("j");
    expect_err(run_fail(&g, &j, "1", NULL), PLM_UNAVAILABLE, PLM_REFUSAL_ENVIRONMENT, NULL);
    expect_python(&g, &j, "1", "python 1: 1", YES, YES);
    /* The proxy answered the first itself: the one that reached the daemon is the second. */
    assert_int_equal(forwarded(&g, "Describe"), 1);
    fx_stop(&g);
    fx_stop(&f);
}

static void test_X30_X51_E25_capacity_keeps_the_describe_and_busy_entries(void **state)
{
    plm_sandboxes_options o;
    opts_init(&o);
    o.max_sessions_per_owner = 1;
    fx f;
    fx_a(&f, &o);
    plm_key a = pair("alice", "a"), b = pair("alice", "b");
    arm(&proxy_a, "{\"mode\":\"delay\",\"rpc\":\"SessionRun\",\"ms\":300}");
    outcome first;
    start(&f, &a, "1", NULL, NULL, 0, NULL, &first);
    wait_forwarded(&f, "SessionRun", 1); /* alice/a is in flight */
    assert_null(plm_sandboxes_warm(f.sb, &b)); /* at a busy cap: a silent no-op */
    assert_int_equal(plm_sandboxes_count(f.sb), 1);
    expect_err(run_fail(&f, &b, "1", NULL), PLM_RESOURCE_EXHAUSTED, PLM_REFUSAL_CAPACITY,
               "Nothing ran (capacity): plimsoll: this user has 1 sandboxes, the most this tool "
               "keeps, each with a call in flight");
    wait_out(&f, &first);
    expect_out(got(&first), "python 1: 1", YES, YES, YES, YES);
    assert_int_equal(forwarded(&f, "OpenSession"), 1);
    assert_int_equal(forwarded(&f, "CloseSession"), 0);
    assert_int_equal(forwarded(&f, "Describe"), 1);
    fx_stop(&f);
}

static void test_X30_X39_a_floor_the_daemon_cannot_meet_is_refused_isolation(void **state)
{
    plm_sandboxes_options o;
    opts_init(&o);
    o.minimum_isolation = "vm";
    fx f;
    fx_a(&f, &o);
    plm_key k = str_key("vm");
    for (int i = 1; i <= 2; i++) {
        expect_err(run_fail(&f, &k, "1", NULL), PLM_FAILED_PRECONDITION, PLM_REFUSAL_ISOLATION,
                   "Nothing ran (isolation): plimsoll: OpenSession: ");
        assert_int_equal(forwarded(&f, "Describe"), i); /* each refusal reads it again */
    }
    fx_stop(&f);
    /* The default floor is kernel: refused on the sessions path and on the fresh path. */
    plm_sandboxes_options_init(&o);
    fx_a(&f, &o);
    assert_null(o.minimum_isolation);
    expect_err(run_fail(&f, &k, "1", NULL), PLM_FAILED_PRECONDITION, PLM_REFUSAL_ISOLATION, NULL);
    expect_err(run_fail(&f, NULL, "1", NULL), PLM_FAILED_PRECONDITION, PLM_REFUSAL_ISOLATION,
               "Nothing ran (isolation): plimsoll: Run: ");
    assert_int_equal(forwarded(&f, "SessionRun"), 0);
    fx_stop(&f);
}

/* ---------------------------------------------------------------- dispose and idle close */

static void test_X32_the_first_call_after_a_dispose_or_idle_close_is_fresh(void **state)
{
    fx f;
    fx_a(&f, NULL);
    plm_key k = str_key("disposed");
    expect_python(&f, &k, "x = 1", "python 1: x = 1", YES, YES);
    assert_null(plm_sandboxes_dispose(f.sb, &k, NULL, NULL));
    expect_python(&f, &k, "x + 1", "python 1: x + 1", YES, YES);
    fx_stop(&f);

    plm_sandboxes_options o;
    opts_init(&o);
    o.idle_close_ms = 20;
    fx_a(&f, &o);
    expect_python(&f, &k, "x = 1", "python 1: x = 1", YES, YES);
    assert_int_equal(plm_sandboxes_count(f.sb), 1);
    loop_until(f.loop, sandboxes_empty, f.sb, 10.);
    wait_forwarded(&f, "CloseSession", 2);
    expect_python(&f, &k, "x", "python 1: x", YES, YES);
    fx_stop(&f);
}

static void test_X33_defaults(void **state)
{
    plm_sandboxes_options o;
    plm_sandboxes_options_init(&o);
    assert_int_equal(o.sessions, PLM_SESSIONS_AUTO);
    assert_int_equal(o.idle_close_ms, 600000);
    assert_int_equal(o.max_sessions_per_owner, 3);
    assert_int_equal(o.max_sessions, 0);
    assert_int_equal(o.max_output_chars, 16000);
    assert_null(o.minimum_isolation); /* kernel */
    plm_sandboxes *sb = NULL;
    expect_err(plm_sandboxes_new(&o, &sb), PLM_INVALID_ARGUMENT, PLM_REFUSAL_NONE, NULL);
    assert_null(sb);
}

static void test_X34_the_idle_close_waits_for_a_call_in_flight(void **state)
{
    plm_sandboxes_options o;
    opts_init(&o);
    o.idle_close_ms = 50;
    fx f;
    fx_a(&f, &o);
    plm_key k = str_key("busy");
    arm(&proxy_a, "{\"mode\":\"delay\",\"rpc\":\"SessionRun\",\"ms\":150}");
    expect_python(&f, &k, "x = 1", "python 1: x = 1", YES, YES);
    expect_python(&f, &k, "x", "python 2: x", NO, NO);
    assert_int_equal(forwarded(&f, "OpenSession"), 1);
    fx_stop(&f);
}

static void test_X35_an_open_slower_than_the_idle_close_still_answers(void **state)
{
    plm_sandboxes_options o;
    opts_init(&o);
    o.idle_close_ms = 20;
    fx f;
    fx_a(&f, &o);
    arm(&proxy_a, "{\"mode\":\"delay\",\"rpc\":\"OpenSession\",\"ms\":150}");
    plm_key k = str_key("slow");
    plm_code_output *r = run_ok(&f, &k, "1", NULL);
    assert_int_equal(r->exit_code, 0);
    expect_out(r, "python 1: 1", YES, YES, YES, YES);
    plm_key w = str_key("slow-warm");
    assert_null(plm_sandboxes_warm(f.sb, &w));
    loop_for(f.loop, 0.4);
    r = run_ok(&f, &w, "1", NULL);
    assert_int_equal(r->exit_code, 0);
    expect_out(r, "python 1: 1", YES, YES, YES, YES);
    fx_stop(&f);
}

static void test_X36_idle_timers_do_not_keep_the_loop_running(void **state)
{
    fx f;
    fx_a(&f, NULL); /* the default idle close: ten minutes */
    plm_key k = str_key("unref");
    expect_python(&f, &k, "1", "python 1: 1", YES, YES);
    assert_int_equal(plm_sandboxes_count(f.sb), 1);
    double t0 = now_s();
    alarm(20); /* a loop kept alive would otherwise hang here */
    ev_run(f.loop, 0);
    alarm(0);
    assert_true(now_s() - t0 < 5.);
    assert_int_equal(plm_sandboxes_count(f.sb), 1); /* nothing fired */
    fx_stop(&f);
}

static void test_X61_dispose_removes_at_once_waits_for_the_open_and_closes(void **state)
{
    fx f;
    fx_a(&f, NULL);
    arm(&proxy_a, "{\"mode\":\"delay\",\"rpc\":\"OpenSession\",\"ms\":150}");
    plm_key k = str_key("opening");
    assert_null(plm_sandboxes_warm(f.sb, &k));
    wait_forwarded(&f, "OpenSession", 1); /* the open is in flight */
    bool done = false;
    assert_null(plm_sandboxes_dispose(f.sb, &k, on_done, &done));
    assert_int_equal(plm_sandboxes_count(f.sb), 0); /* synchronously */
    loop_until(f.loop, flag_set, &done, 10.);
    assert_int_equal(forwarded(&f, "CloseSession"), 1);
    fault_reset(&proxy_a);

    /* A call in flight finishes first; the close runs behind it. */
    plm_key c = str_key("in-flight");
    expect_python(&f, &c, "1", "python 1: 1", YES, YES);
    arm(&proxy_a, "{\"mode\":\"delay\",\"rpc\":\"SessionRun\",\"ms\":150}");
    outcome o;
    start(&f, &c, "2", NULL, NULL, 0, NULL, &o);
    wait_forwarded(&f, "SessionRun", 2); /* the cell is at the daemon */
    done = false;
    assert_null(plm_sandboxes_dispose(f.sb, &c, on_done, &done));
    loop_until(f.loop, flag_set, &done, 10.);
    assert_true(o.done); /* it answered before the close settled */
    expect_out(got(&o), "python 2: 2", NO, NO, YES, YES);
    assert_int_equal(f.close_errors, 0);
    /* A failed open is ignored by a dispose. */
    fault_reset(&proxy_a);
    arm(&proxy_a, "{\"mode\":\"status\",\"rpc\":\"OpenSession\",\"value\":503}");
    plm_key x = str_key("fails");
    assert_null(plm_sandboxes_warm(f.sb, &x));
    done = false;
    assert_null(plm_sandboxes_dispose(f.sb, &x, on_done, &done));
    loop_until(f.loop, flag_set, &done, 10.);
    fx_stop(&f);
}

static void test_X62_dispose_all_disposes_every_key(void **state)
{
    fx f;
    fx_a(&f, NULL);
    plm_key keys[] = {str_key("one"), pair("alice", "two"), pair("bob", "three")};
    for (int i = 0; i < 3; i++)
        expect_python(&f, &keys[i], "1", "python 1: 1", YES, YES);
    bool done = false;
    plm_sandboxes_dispose_all(f.sb, on_done, &done);
    assert_int_equal(plm_sandboxes_count(f.sb), 0);
    loop_until(f.loop, flag_set, &done, 10.);
    assert_int_equal(forwarded(&f, "CloseSession"), 3);
    done = false;
    plm_sandboxes_dispose_all(f.sb, on_done, &done); /* nothing left: done on the loop */
    assert_false(done);
    loop_until(f.loop, flag_set, &done, 10.);
    fx_stop(&f);
}

/* ---------------------------------------------------------------- caps */

static void test_X48_X49_the_owner_cap_closes_the_least_recently_used(void **state)
{
    plm_sandboxes_options o;
    opts_init(&o);
    o.max_sessions_per_owner = 2;
    fx f;
    fx_a(&f, &o);
    plm_key aa = pair("alice", "a"), ab = pair("alice", "b"), ac = pair("alice", "c"),
            ba = pair("bob", "a");
    expect_python(&f, &aa, "x = 1", "python 1: x = 1", YES, YES);
    expect_python(&f, &ab, "x = 1", "python 1: x = 1", YES, YES);
    expect_python(&f, &aa, "x = 2", "python 2: x = 2", NO, NO);
    expect_python(&f, &ba, "x = 1", "python 1: x = 1", YES, YES);
    /* String keys name no owner: the per-owner cap does not count them (X49). */
    plm_key r1 = str_key("r1"), r2 = str_key("r2"), r3 = str_key("r3");
    expect_python(&f, &r1, "1", "python 1: 1", YES, YES);
    expect_python(&f, &r2, "1", "python 1: 1", YES, YES);
    expect_python(&f, &r3, "1", "python 1: 1", YES, YES);
    assert_int_equal(forwarded(&f, "CloseSession"), 0);
    expect_python(&f, &ac, "x = 1", "python 1: x = 1", YES, YES);
    assert_int_equal(forwarded(&f, "CloseSession"), 1); /* b's, closed before c opened */
    expect_python(&f, &aa, "x", "python 3: x", NO, NO);
    expect_python(&f, &ba, "x", "python 2: x", NO, NO); /* another owner is never touched */
    expect_python(&f, &ab, "x", "python 1: x", YES, YES);
    assert_int_equal(f.close_errors, 0);
    fx_stop(&f);
}

static void test_X50_max_sessions_caps_the_instance(void **state)
{
    plm_sandboxes_options o;
    opts_init(&o);
    o.max_sessions = 2;
    fx f;
    fx_a(&f, &o);
    plm_key r1 = str_key("r1"), a = pair("alice", "a"), r3 = str_key("r3");
    expect_python(&f, &r1, "1", "python 1: 1", YES, YES);
    expect_python(&f, &a, "1", "python 1: 1", YES, YES);
    expect_python(&f, &r3, "1", "python 1: 1", YES, YES);
    assert_int_equal(forwarded(&f, "CloseSession"), 1);
    expect_python(&f, &a, "2", "python 2: 2", NO, NO);
    expect_python(&f, &r1, "2", "python 1: 2", YES, YES);
    fx_stop(&f);
}

static void test_X52_X53_a_warm_never_evicts_and_at_a_cap_does_nothing(void **state)
{
    plm_sandboxes_options o;
    opts_init(&o);
    o.max_sessions_per_owner = 1;
    fx f;
    fx_a(&f, &o);
    plm_key in_use = pair("alice", "in-use"), tab = pair("alice", "new-tab");
    expect_python(&f, &in_use, "x = 1", "python 1: x = 1", YES, YES);
    assert_null(plm_sandboxes_warm(f.sb, &tab));
    assert_int_equal(plm_sandboxes_count(f.sb), 1);
    assert_null(plm_sandboxes_warm(f.sb, &in_use)); /* has an entry: nothing */
    expect_python(&f, &in_use, "x", "python 2: x", NO, NO);
    assert_int_equal(forwarded(&f, "OpenSession"), 1);
    assert_int_equal(forwarded(&f, "CloseSession"), 0);
    expect_python(&f, &tab, "1", "python 1: 1", YES, YES);
    assert_int_equal(forwarded(&f, "CloseSession"), 1);
    fx_stop(&f);

    fault_reset(&proxy_a);
    opts_init(&o);
    o.max_sessions_per_owner = 2;
    o.max_sessions = 2;
    fx_a(&f, &o);
    plm_key a = pair("alice", "a"), b = pair("alice", "b"), run1 = str_key("run-1");
    expect_python(&f, &a, "1", "python 1: 1", YES, YES);
    assert_null(plm_sandboxes_warm(f.sb, &b));
    assert_null(plm_sandboxes_warm(f.sb, &run1)); /* the instance cap is full */
    assert_int_equal(plm_sandboxes_count(f.sb), 2);
    wait_forwarded(&f, "OpenSession", 2);
    assert_int_equal(forwarded(&f, "CloseSession"), 0);
    /* A warmed entry is subject to eviction once open, like any idle one. */
    expect_python(&f, &b, "1", "python 1: 1", YES, YES);
    fx_stop(&f);

    /* A warm whose open fails is removed, and the key's next call opens again. */
    fault_reset(&proxy_a);
    fx_a(&f, NULL);
    arm(&proxy_a, "{\"mode\":\"status\",\"rpc\":\"OpenSession\",\"value\":503,\"count\":1}");
    plm_key w = str_key("w");
    assert_null(plm_sandboxes_warm(f.sb, &w));
    loop_until(f.loop, sandboxes_empty, f.sb, 10.);
    expect_python(&f, &w, "1", "python 1: 1", YES, YES);
    assert_int_equal(forwarded(&f, "OpenSession"), 1); /* the proxy answered the first itself */
    fx_stop(&f);
}

static void test_X54_an_evicting_open_waits_for_the_evicted_close(void **state)
{
    plm_sandboxes_options o;
    opts_init(&o);
    o.max_sessions_per_owner = 1;
    fx f;
    fx_a(&f, &o);
    plm_key a = pair("alice", "a"), b = pair("alice", "b");
    expect_python(&f, &a, "x = 1", "python 1: x = 1", YES, YES);
    arm(&proxy_a, "{\"mode\":\"delay\",\"rpc\":\"CloseSession\",\"ms\":200}");
    outcome ob;
    start(&f, &b, "1", NULL, NULL, 0, NULL, &ob);
    wait_forwarded(&f, "CloseSession", 1);
    assert_int_equal(plm_sandboxes_count(f.sb), 1); /* a left the map at once */
    /* The close is held for 200 ms; b's open goes only after it settled. */
    assert_int_equal(forwarded(&f, "OpenSession"), 1);
    wait_out(&f, &ob);
    expect_out(got(&ob), "python 1: 1", YES, YES, YES, YES);
    assert_int_equal(forwarded(&f, "OpenSession"), 2);
    fault_reset(&proxy_a);
    expect_python(&f, &a, "x", "python 1: x", YES, YES);
    fx_stop(&f);
}

static void test_X55_a_daemon_capacity_refusal_closes_nothing(void **state)
{
    const char *args[] = {"--max-sessions", "1", NULL};
    side *s = side_start(args);
    plm_sandboxes_options o;
    opts_init(&o);
    fx f;
    fx_start(&f, s->px.url, s->d.token, &s->px, &o);
    plm_key a = str_key("a"), b = str_key("b");
    expect_python(&f, &a, "1", "python 1: 1", YES, YES);
    expect_err(run_fail(&f, &b, "1", NULL), PLM_RESOURCE_EXHAUSTED, PLM_REFUSAL_CAPACITY,
               "Nothing ran (capacity): plimsoll: OpenSession: ");
    assert_int_equal(forwarded(&f, "CloseSession"), 0);
    expect_python(&f, &a, "2", "python 2: 2", NO, NO);
    fx_stop(&f);
}

/* ---------------------------------------------------------------- cancellation */

static void test_X56_a_call_cancelled_before_or_while_opening_keeps_no_sandbox(void **state)
{
    fx f;
    fx_a(&f, NULL);
    plm_key k = str_key("abort");
    plm_cancel *pre = plm_cancel_new();
    plm_cancel_fire(pre);
    plm_code_input in = {"1", NULL, NULL, 0};
    outcome o = {0};
    expect_err(plm_sandboxes_run(f.sb, &k, &in, pre, on_out, &o), PLM_CANCELED,
               PLM_REFUSAL_REQUEST, "Nothing ran (request): plimsoll: ");
    plm_cancel_free(pre);
    assert_int_equal(forwarded(&f, "OpenSession"), 0);

    /* The open is held far longer than the cancel takes to fire, so that a loaded
     * machine cannot let the open finish (and the cell start) first. */
    arm(&proxy_a, "{\"mode\":\"delay\",\"rpc\":\"OpenSession\",\"ms\":1500}");
    plm_cancel *c = plm_cancel_new();
    start(&f, &k, "1", NULL, NULL, 0, c, &o);
    wait_forwarded(&f, "OpenSession", 1);
    ev_timer t;
    ev_timer_init(&t, fire_cb, 0.03, 0.);
    t.data = c;
    ev_timer_start(f.loop, &t);
    wait_out(&f, &o);
    expect_err(o.err, PLM_CANCELED, PLM_REFUSAL_REQUEST, "Nothing ran (request): plimsoll: ");
    assert_int_equal(plm_sandboxes_count(f.sb), 0);
    wait_forwarded(&f, "CloseSession", 1); /* closed once it opened */
    assert_int_equal(forwarded(&f, "SessionRun"), 0);
    plm_cancel_free(c);
    fault_reset(&proxy_a);
    expect_python(&f, &k, "1", "python 1: 1", YES, YES);
    fx_stop(&f);
}

static void test_X57_a_call_cancelled_during_the_describe_leaves_it_to_others(void **state)
{
    fx f;
    fx_a(&f, NULL);
    arm(&proxy_a, "{\"mode\":\"delay\",\"rpc\":\"Describe\",\"ms\":2000}");
    plm_key k = str_key("describe");
    plm_cancel *c = plm_cancel_new();
    outcome gone, other;
    double t0 = now_s();
    start(&f, &k, "1", NULL, NULL, 0, c, &gone);
    start(&f, &k, "2", NULL, NULL, 0, NULL, &other);
    ev_timer t;
    ev_timer_init(&t, fire_cb, 0.03, 0.);
    t.data = c;
    ev_timer_start(f.loop, &t);
    wait_out(&f, &gone);
    assert_true(now_s() - t0 < 1.5);   /* not held by the Describe it left (2 s) */
    expect_err(gone.err, PLM_CANCELED, PLM_REFUSAL_REQUEST, "Nothing ran (request): ");
    assert_false(other.done);
    wait_out(&f, &other);
    expect_out(got(&other), "python 1: 2", YES, YES, YES, YES);
    assert_int_equal(forwarded(&f, "Describe"), 1);
    plm_cancel_free(c);
    fx_stop(&f);
}

/* ---------------------------------------------------------------- the snippet path */

static void test_X37_X38_a_daemon_without_projects_runs_javascript_snippets(void **state)
{
    fx f;
    fx_a(&f, NULL);
    arm(&proxy_a, "{\"mode\":\"patch\",\"rpc\":\"Describe\",\"value\":{\"supportsProject\":false}}");
    /* The echo answers a snippet with its code: the runner wrapping the cell. */
    plm_code_output *r = run_ok(&f, NULL, "console.log(\"printed\"); 1 + 2 + 3", "javascript");
    starts_with(r->stdout_text, "javascript 1: (() => {");
    contains(r->stdout_text, "(0, eval)(\"console.log(\\\"printed\\\"); 1 + 2 + 3\")");
    assert_string_equal(r->isolation, "container");
    expect_out(r, NULL, NO, NO, NO, NO);
    expect_err(run_fail(&f, NULL, "1", "python"), PLM_UNIMPLEMENTED, PLM_REFUSAL_UNSUPPORTED,
               "Nothing ran (unsupported): plimsoll: the daemon (echo) runs JavaScript snippets "
               "only, not python");
    plm_file file = {"a.txt", "x"};
    outcome o;
    start(&f, NULL, "1", "javascript", &file, 1, NULL, &o);
    wait_out(&f, &o);
    expect_err(o.err, PLM_UNIMPLEMENTED, PLM_REFUSAL_UNSUPPORTED,
               "Nothing ran (unsupported): plimsoll: the daemon (echo) runs JavaScript snippets "
               "only, which take no files");
    assert_int_equal(forwarded(&f, "Run"), 1);
    fx_stop(&f);
}

/* ---------------------------------------------------------------- the tool's input and output */

static void test_T04_T05_output_is_cut_to_max_output_chars(void **state)
{
    plm_sandboxes_options o;
    opts_init(&o);
    o.max_output_chars = 6;
    fx f;
    fx_a(&f, &o);
    plm_key k = str_key("cut");
    plm_code_output *r = run_ok(&f, &k, "print('hello')", NULL);
    assert_string_equal(r->stdout_text, "python");
    assert_true(r->truncated);
    plm_code_output_free(r);
    fx_stop(&f);

    /* "python 1: " is 10 units; the emoji is units 11-12: the cut keeps neither half. */
    opts_init(&o);
    o.max_output_chars = 11;
    fx_a(&f, &o);
    r = run_ok(&f, &k, "\xF0\x9F\x98\x80!", NULL);
    assert_string_equal(r->stdout_text, "python 1: ");
    assert_true(r->truncated);
    plm_code_output_free(r);
    r = run_ok(&f, &k, "a", NULL); /* exactly 11 units: not cut */
    assert_string_equal(r->stdout_text, "python 2: a");
    assert_false(r->truncated);
    plm_code_output_free(r);
    fx_stop(&f);
}

static void test_T01_T02_T17_input_checks_before_anything_is_sent(void **state)
{
    fx f;
    fx_a(&f, NULL);
    static plm_file files[200];
    static char names[200][16];
    for (int i = 0; i < 200; i++) {
        snprintf(names[i], sizeof names[i], "input-%d.txt", i);
        files[i] = (plm_file){names[i], "x"};
    }
    /* 198 files pass, and reach the daemon with the cell and the runner (200 in all). */
    outcome o;
    start(&f, NULL, "sum([1, 2, 3])", NULL, files, 198, NULL, &o);
    wait_out(&f, &o);
    expect_out(got(&o), "python3 -I .plimsoll/run.py\n", NO, NO, NO, NO);
    for (size_t n = 199; n <= 200; n++) {
        plm_code_input in = {"1", NULL, files, n};
        plm_error *e = plm_sandboxes_run(f.sb, NULL, &in, NULL, on_out, &o);
        assert_non_null(e);
        contains(e->message, "files");
        expect_err(e, PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST, "Nothing ran (request): ");
    }
    plm_code_input empty = {"", NULL, NULL, 0};
    expect_err(plm_sandboxes_run(f.sb, NULL, &empty, NULL, on_out, &o), PLM_INVALID_ARGUMENT,
               PLM_REFUSAL_REQUEST, "Nothing ran (request): ");
    plm_code_input ill = {"\xC3(", NULL, NULL, 0};
    expect_err(plm_sandboxes_run(f.sb, NULL, &ill, NULL, on_out, &o), PLM_INVALID_ARGUMENT,
               PLM_REFUSAL_REQUEST, "Nothing ran (request): ");
    plm_file nameless = {"", "x"}, dir = {".plimsoll", "x"}, near = {".plimsollx", "x"};
    plm_code_input bad = {"1", NULL, &nameless, 1};
    expect_err(plm_sandboxes_run(f.sb, NULL, &bad, NULL, on_out, &o), PLM_INVALID_ARGUMENT,
               PLM_REFUSAL_REQUEST, NULL);
    bad.files = &dir;
    expect_err(plm_sandboxes_run(f.sb, NULL, &bad, NULL, on_out, &o), PLM_INVALID_ARGUMENT,
               PLM_REFUSAL_REQUEST, "Nothing ran (request): plimsoll: \".plimsoll\" is under "
                                    ".plimsoll/");
    start(&f, NULL, "1", NULL, &near, 1, NULL, &o); /* only the directory itself is reserved */
    wait_out(&f, &o);
    plm_code_output_free(got(&o));
    assert_int_equal(forwarded(&f, "Run"), 2);
    fx_stop(&f);
}

static void test_X28_freeing_completes_every_pending_callback_once(void **state)
{
    /* C has no unhandled rejections; its counterpart: whatever is pending when the
     * instance is freed gets its callback exactly once, before the free returns. */
    fx f;
    fx_a(&f, NULL);
    plm_key k = str_key("busy"), d = str_key("disposing"), w = str_key("opening");
    expect_python(&f, &k, "1", "python 1: 1", YES, YES);
    expect_python(&f, &d, "1", "python 1: 1", YES, YES);
    arm(&proxy_a, "{\"mode\":\"delay\",\"ms\":300}");
    outcome sent, queued, opening, persistent = {0};
    start(&f, &k, "2", NULL, NULL, 0, NULL, &sent);
    start(&f, &k, "3", NULL, NULL, 0, NULL, &queued);
    start(&f, &w, "1", NULL, NULL, 0, NULL, &opening);
    wait_forwarded(&f, "OpenSession", 3); /* w's open and k's cell are in flight */
    wait_forwarded(&f, "SessionRun", 3);
    bool disposed = false;
    assert_null(plm_sandboxes_dispose(f.sb, &d, on_done, &disposed));
    assert_null(plm_sandboxes_persistent(f.sb, on_bool, &persistent));
    plm_sandboxes_free(f.sb);
    assert_true(sent.done && queued.done && opening.done && persistent.done && disposed);
    expect_err(sent.err, PLM_CANCELED, PLM_REFUSAL_NONE,
               "The code may have run, and there is no checked answer for it: ");
    expect_err(queued.err, PLM_CANCELED, PLM_REFUSAL_NONE, NULL);
    expect_err(opening.err, PLM_CANCELED, PLM_REFUSAL_REQUEST,
               "Nothing ran (request): plimsoll: the sandboxes were freed");
    assert_null(persistent.err);
    /* What the client still had in flight comes back to detached calls and entries. */
    loop_for(f.loop, 0.5);
    plm_client_free(f.client);
}

/* ---------------------------------------------------------------- the default reporter */

static void test_X29_the_default_close_warning_names_the_key_by_a_digest(void **state)
{
    plm_sandboxes_options o;
    opts_init(&o);
    fx f;
    fx_start_raw(&f, proxy_a.url, daemon_a.token, &proxy_a, &o); /* the default reporter */
    plm_key k = pair("alice@example.com", "chat-1");
    expect_python(&f, &k, "1", "python 1: 1", YES, YES);
    arm(&proxy_a, "{\"mode\":\"patch\",\"rpc\":\"CloseSession\",\"value\":{\"calls\":\"9\"}}");
    char path[] = "/tmp/plm-stderr-XXXXXX";
    int fd = mkstemp(path);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    bool done = false;
    assert_null(plm_sandboxes_dispose(f.sb, &k, on_done, &done));
    loop_until(f.loop, flag_set, &done, 10.);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    char text[2048] = {0};
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    close(fd);
    unlink(path);
    assert_true(n > 0);
    char digest[13], lead[80];
    plm_key_digest(&k, digest);
    snprintf(lead, sizeof lead, "plimsoll: closing the sandbox for key %s failed: plimsoll: ",
             digest);
    starts_with(text, lead);
    int lines = 0;
    for (ssize_t i = 0; i < n; i++)
        lines += text[i] == '\n';
    assert_int_equal(lines, 1);
    assert_null(strstr(text, "alice"));
    assert_null(strstr(text, "example"));
    assert_null(strstr(text, "chat-1"));
    fx_stop(&f);
}

static void test_X27_a_failing_close_blocks_no_eviction_and_no_dispose(void **state)
{
    plm_sandboxes_options o;
    opts_init(&o);
    o.max_sessions_per_owner = 1;
    fx f;
    fx_a(&f, &o);
    arm(&proxy_a, "{\"mode\":\"patch\",\"rpc\":\"CloseSession\",\"value\":{\"calls\":\"9\"}}");
    plm_key a = pair("alice", "a"), b = pair("alice", "b");
    expect_python(&f, &a, "1", "python 1: 1", YES, YES);
    expect_python(&f, &b, "1", "python 1: 1", YES, YES); /* evicts a, whose close fails */
    assert_int_equal(f.close_errors, 1);
    assert_string_equal(f.close_conversation, "a");
    bool done = false;
    assert_null(plm_sandboxes_dispose(f.sb, &b, on_done, &done));
    loop_until(f.loop, flag_set, &done, 10.);
    assert_int_equal(f.close_errors, 2);
    assert_int_equal(f.close_code, PLM_DATA_LOSS);
    fx_stop(&f);
}

/* ---------------------------------------------------------------- main */

static int group_setup(void **state)
{
    const char *args[] = {"--test-endpoints", NULL};
    if (sbx_start(&daemon_a, args) < 0)
        return -1;
    return fault_start(&proxy_a, daemon_a.url);
}

static int group_teardown(void **state)
{
    fault_stop(&proxy_a);
    sbx_stop(&daemon_a);
    return 0;
}

#define T(name) cmocka_unit_test_setup_teardown(name, reset_proxy_a, side_teardown)

int main(void)
{
    plm_global_init();
    const struct CMUnitTest tests[] = {
        T(test_X01_X05_invalid_keys_are_refused_marked_request),
        T(test_X02_X03_key_encodings_never_alias),
        T(test_X04_key_digest_is_12_hex_of_the_encoding),
        T(test_X04_key_encoding_escapes_and_refuses_ill_formed_text),
        T(test_X07_X08_X09_a_key_keeps_one_interpreter),
        T(test_X06_keys_never_share_a_sandbox),
        T(test_X46_X07_parallel_calls_share_one_open_and_one_is_fresh),
        T(test_X10_X64_a_call_without_key_runs_fresh),
        T(test_X10_X24_sessions_never_runs_fresh_and_is_not_persistent),
        T(test_X11_sessions_never_on_a_sessions_only_daemon_is_unsupported),
        T(test_X12_sessions_always_needs_a_daemon_with_sessions),
        T(test_X13_X08_a_language_the_tool_does_not_offer_is_refused),
        T(test_X14_a_language_the_image_lacks_is_refused_unsupported),
        T(test_X15_retry_once_after_session_ended_not_dispatched),
        T(test_X16_unclaimed_warm_is_replaced_on_the_first_call),
        T(test_X17_a_forgotten_session_is_replaced_and_the_call_reruns),
        T(test_X19_deadline_and_ended_sandbox_say_their_state_is_not_kept),
        T(test_X20_an_end_this_client_cannot_name_still_ends),
        T(test_X21_X63_a_session_ending_under_two_calls_is_closed_once),
        T(test_X18_X22_owner_cap_across_instances_reruns_fresh_once),
        T(test_X22_X40_a_tampered_close_count_is_reported_once),
        T(test_X23_X24_X47_an_unreachable_daemon_is_marked_environment),
        T(test_X23_X26_failures_before_the_code_is_sent_say_nothing_ran),
        T(test_X26_X44_T12_a_call_that_may_have_run_says_so_and_is_not_retried),
        T(test_X45_an_unanswered_call_the_session_checked_keeps_the_sandbox),
        T(test_X30_X31_a_refusal_that_says_the_daemon_changed_reads_describe_again),
        T(test_X30_X51_E25_capacity_keeps_the_describe_and_busy_entries),
        T(test_X30_X39_a_floor_the_daemon_cannot_meet_is_refused_isolation),
        T(test_X32_the_first_call_after_a_dispose_or_idle_close_is_fresh),
        T(test_X33_defaults),
        T(test_X34_the_idle_close_waits_for_a_call_in_flight),
        T(test_X35_an_open_slower_than_the_idle_close_still_answers),
        T(test_X36_idle_timers_do_not_keep_the_loop_running),
        T(test_X61_dispose_removes_at_once_waits_for_the_open_and_closes),
        T(test_X62_dispose_all_disposes_every_key),
        T(test_X48_X49_the_owner_cap_closes_the_least_recently_used),
        T(test_X50_max_sessions_caps_the_instance),
        T(test_X52_X53_a_warm_never_evicts_and_at_a_cap_does_nothing),
        T(test_X54_an_evicting_open_waits_for_the_evicted_close),
        T(test_X55_a_daemon_capacity_refusal_closes_nothing),
        T(test_X56_a_call_cancelled_before_or_while_opening_keeps_no_sandbox),
        T(test_X57_a_call_cancelled_during_the_describe_leaves_it_to_others),
        T(test_X37_X38_a_daemon_without_projects_runs_javascript_snippets),
        T(test_T04_T05_output_is_cut_to_max_output_chars),
        T(test_T01_T02_T17_input_checks_before_anything_is_sent),
        T(test_X28_freeing_completes_every_pending_callback_once),
        T(test_X29_the_default_close_warning_names_the_key_by_a_digest),
        T(test_X27_a_failing_close_blocks_no_eviction_and_no_dispose),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

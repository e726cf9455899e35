/*
 * test_client_daemon.c — libplimsoll against a real sandboxd (provider echo) over
 * loopback HTTP, directly and through tests/faultproxy.py, which corrupts, drops,
 * replays, cuts and delays answers.  Each case asserts the exact error class of
 * docs/client.md and docs/conformance.md, and that evidence is attached where the spec says.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include "capability.h"
#include <ev.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fault.h"
#include "internal.h"
#include "sbxproc.h"
#include "wiretap.h"

static sbx_proc daemon_proc;
static fault_proxy proxy;
static wiretap tap; /* global, so a failed test's teardown stops its threads */

/* ---------------------------------------------------------------- helpers */

static plm_client *client_at(const char *url, const char *token, int64_t timeout_ms)
{
    plm_client_options o;
    plm_client_options_init(&o);
    o.base_url = url;
    o.token = token;
    if (timeout_ms)
        o.request_timeout_ms = timeout_ms;
    plm_client *c = NULL;
    plm_error *e = plm_client_new(NULL, &o, &c);
    if (e)
        fail_msg("client: %s", e->message);
    return c;
}

static plm_client *direct(void) { return client_at(daemon_proc.url, daemon_proc.token, 0); }
static plm_client *proxied(void) { return client_at(proxy.url, daemon_proc.token, 0); }

static void arm(const char *spec)
{
    assert_int_equal(fault_arm(&proxy, spec), 0);
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

/* Asserts the class of an error and frees it. */
static void expect(plm_error *e, plm_code code, plm_refusal mark, const char *needle)
{
    if (!e)
        fail_msg("expected %s, got success", plm_code_name(code));
    if (e->code != code || e->not_dispatched != mark)
        fail_msg("expected %s/%s, got %s/%s: %s", plm_code_name(code),
                 mark == PLM_REFUSAL_NONE ? "unmarked" : plm_refusal_name(mark),
                 plm_code_name(e->code),
                 e->not_dispatched == PLM_REFUSAL_NONE ? "unmarked" : plm_refusal_name(e->not_dispatched),
                 e->message);
    if (needle)
        contains(e->message, needle);
    plm_error_free(e);
}

static plm_result *run_js(plm_client *c, const char *code, const plm_run_options *o, plm_error **err)
{
    plm_result *r = NULL;
    *err = plm_run_javascript_sync(c, code, o, &r);
    return r;
}

static plm_session *open_session(plm_client *c, const plm_session_options *o)
{
    plm_session *s = NULL;
    ok(plm_open_session_sync(c, o, &s));
    assert_non_null(s);
    return s;
}

static plm_result *cell(plm_session *s, const char *lang, const char *code, plm_error **err)
{
    plm_cell cl = {lang, code, NULL, 0};
    plm_result *r = NULL;
    *err = plm_session_run_cell_sync(s, &cl, NULL, &r);
    return r;
}

static void close_expect(plm_session *s, uint64_t calls, plm_session_end end)
{
    plm_close_summary *sum = NULL;
    ok(plm_session_close_sync(s, &sum));
    assert_int_equal(sum->calls, calls);
    assert_int_equal(sum->end, end);
    assert_string_equal(sum->session, plm_session_fingerprint(s));
    plm_close_summary_free(sum);
}

static int group_setup(void **state)
{
    const char *args[] = {"--test-endpoints", "--echo-tier", "container", NULL};
    if (sbx_start(&daemon_proc, args) < 0)
        return -1;
    return fault_start(&proxy, daemon_proc.url);
}

static int group_teardown(void **state)
{
    fault_stop(&proxy);
    sbx_stop(&daemon_proc);
    return 0;
}

static int reset_proxy(void **state)
{
    return fault_reset(&proxy);
}

static int stop_tap(void **state)
{
    wiretap_stop(&tap);
    return 0;
}

/* ---------------------------------------------------------------- describe and runs */

static void test_W33_describe_states_protocol_provider_and_sessions(void **state)
{
    plm_client *c = direct();
    plm_info *info = NULL;
    ok(plm_describe_sync(c, &info));
    assert_int_equal(info->protocol, 3);
    assert_string_equal(info->sandbox, "echo");
    assert_string_equal(info->isolation, "container");
    assert_true(info->supports_sessions);
    assert_true(info->session.python);
    assert_true(info->session.javascript);
    assert_true(info->session_lifetime_ms > 0);
    plm_info_free(info);
    plm_client_free(c);
}

static void test_W01_bearer_token_is_required_by_this_daemon(void **state)
{
    plm_client *c = client_at(daemon_proc.url, "not-the-token", 0);
    plm_error *e = NULL;
    plm_result *r = run_js(c, "1", NULL, &e);
    assert_null(r);
    expect(e, PLM_UNAUTHENTICATED, PLM_REFUSAL_PERMISSION, NULL);
    plm_client_free(c);
}

static void test_R01_single_run_verified_end_to_end(void **state)
{
    plm_client *c = direct();
    plm_error *e = NULL;
    plm_run_options o = {.minimum_isolation = "container", .timeout_ms = 5000};
    plm_result *r = run_js(c, "console.log(6*7)", &o, &e);
    ok(e);
    assert_int_equal(r->kind, PLM_KIND_JAVASCRIPT);
    assert_string_equal(r->stdout_text, "javascript 1: console.log(6*7)");
    assert_int_equal(r->record.version, 2);
    assert_int_equal(strlen(r->record.record_sha256), 64);
    assert_string_equal(r->record.session, "");
    assert_int_equal(r->record.sequence, 0);
    plm_result_free(r);
    plm_client_free(c);
}

/* A daemon on loopback is reached directly whatever proxy the environment names: a
 * proxy cannot reach this machine's loopback, and the bearer would go to it in
 * cleartext.  The proxy named here is a closed port, so a call through it fails. */
static void test_loopback_daemon_is_never_reached_through_a_proxy(void **state)
{
    static const char *const vars[] = {"http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"};
    for (size_t i = 0; i < PLM_ARRAY_LEN(vars); i++)
        setenv(vars[i], "http://127.0.0.1:1", 1);
    unsetenv("no_proxy");
    unsetenv("NO_PROXY");
    plm_client *c = direct();
    plm_error *e = NULL;
    plm_result *r = run_js(c, "1", NULL, &e);
    for (size_t i = 0; i < PLM_ARRAY_LEN(vars); i++)
        unsetenv(vars[i]);
    ok(e);
    assert_string_equal(r->stdout_text, "javascript 1: 1");
    plm_result_free(r);
    plm_client_free(c);
}

static void test_E18_floor_above_tier_refused_before_dispatch(void **state)
{
    plm_client *c = direct();
    plm_error *e = NULL;
    plm_run_options o = {.minimum_isolation = "kernel"};
    assert_null(run_js(c, "1", &o, &e));
    expect(e, PLM_FAILED_PRECONDITION, PLM_REFUSAL_ISOLATION, NULL);
    plm_session *s = NULL;
    plm_session_options so = {.minimum_isolation = "vm"};
    expect(plm_open_session_sync(c, &so, &s), PLM_FAILED_PRECONDITION, PLM_REFUSAL_ISOLATION, NULL);
    assert_null(s);
    plm_client_free(c);
}

/* ---------------------------------------------------------------- record checks (R) */

static void run_through_fault(const char *spec, const plm_run_options *o, plm_code code,
                              const char *needle, bool want_wire)
{
    plm_client *c = proxied();
    arm(spec);
    plm_error *e = NULL;
    plm_result *r = run_js(c, "console.log(42)", o, &e);
    assert_null(r);
    assert_non_null(e);
    if (want_wire)
        assert_non_null(e->wire);
    assert_false(e->answer_not_bound);
    expect(e, code, PLM_REFUSAL_NONE, needle);
    plm_client_free(c);
}

static void test_R09_missing_record_is_data_loss(void **state)
{
    run_through_fault("{\"mode\":\"drop_record\",\"rpc\":\"Run\"}", NULL, PLM_DATA_LOSS,
                      "no run record", true);
}

static void test_R12_changed_output_byte_is_data_loss_with_result(void **state)
{
    run_through_fault("{\"mode\":\"change_stdout\",\"rpc\":\"Run\"}", NULL, PLM_DATA_LOSS,
                      "result digest", true);
}

static void test_R13_isolation_differing_from_record_is_data_loss(void **state)
{
    run_through_fault("{\"mode\":\"patch\",\"rpc\":\"Run\",\"value\":{\"isolation\":\"vm\"}}",
                      NULL, PLM_DATA_LOSS, "provider or isolation", true);
}

static void test_R15_record_digest_mismatch_is_data_loss(void **state)
{
    run_through_fault("{\"mode\":\"corrupt_record_digest\",\"rpc\":\"Run\"}", NULL,
                      PLM_DATA_LOSS, "record digest", true);
}

static void test_R11_result_digest_field_tampered_is_data_loss(void **state)
{
    run_through_fault("{\"mode\":\"corrupt_result_digest\",\"rpc\":\"Run\"}", NULL,
                      PLM_DATA_LOSS, "result digest", true);
}

static void test_R16_single_run_with_session_fields_is_data_loss(void **state)
{
    run_through_fault("{\"mode\":\"inject_session_fields\",\"rpc\":\"Run\"}", NULL,
                      PLM_DATA_LOSS, "session fields", true);
}

static void test_R17_two_results_is_data_loss(void **state)
{
    run_through_fault("{\"mode\":\"two_results\",\"rpc\":\"Run\",\"value\":\"project\"}", NULL,
                      PLM_DATA_LOSS, "the answer holds 2 results; a run has one", true);
}

static void test_R18_result_of_another_kind_is_data_loss(void **state)
{
    run_through_fault("{\"mode\":\"wrong_kind\",\"rpc\":\"Run\",\"recompute\":true}", NULL,
                      PLM_DATA_LOSS, "not of the request's kind", true);
}

static void test_R19_E21_result_below_floor_is_data_loss_with_mapped_result(void **state)
{
    plm_client *c = proxied();
    arm("{\"mode\":\"lower_tier\",\"rpc\":\"Run\",\"value\":\"process\"}");
    plm_run_options o = {.minimum_isolation = "container"};
    plm_error *e = NULL;
    assert_null(run_js(c, "console.log(42)", &o, &e));
    assert_non_null(e);
    assert_non_null(e->result);
    assert_string_equal(e->result->isolation, "process");
    assert_string_equal(e->result->stdout_text, "javascript 1: console.log(42)");
    expect(e, PLM_DATA_LOSS, PLM_REFUSAL_NONE,
           "result isolation process is below the requested container; execution may have occurred");
    plm_client_free(c);
}

static void test_R20_E16_malformed_answer_is_data_loss(void **state)
{
    run_through_fault("{\"mode\":\"malformed_answer\",\"rpc\":\"Run\"}", NULL, PLM_DATA_LOSS,
                      "startedUnixMs", false);
    run_through_fault("{\"mode\":\"patch\",\"rpc\":\"Run\",\"value\":{\"javascript.stdout\":7}}",
                      NULL, PLM_DATA_LOSS, "malformed", false);
    run_through_fault("{\"mode\":\"patch\",\"rpc\":\"Run\",\"value\":{\"record\":\"x\"}}",
                      NULL, PLM_DATA_LOSS, "malformed", false);
    run_through_fault("{\"mode\":\"patch\",\"rpc\":\"Run\",\"value\":{\"javascript.exitCode\":[1]}}",
                      NULL, PLM_DATA_LOSS, "malformed", false);
    run_through_fault("{\"mode\":\"patch\",\"rpc\":\"Run\",\"value\":{\"sandbox\":{}}}",
                      NULL, PLM_DATA_LOSS, NULL, false);
}

/* ---------------------------------------------------------------- binding (E) */

static void test_E06_answer_without_request_id_is_data_loss_not_bound(void **state)
{
    plm_client *c = proxied();
    arm("{\"mode\":\"drop_request_id\"}");
    plm_info *info = NULL;
    plm_error *e = plm_describe_sync(c, &info);
    assert_null(info);
    assert_non_null(e);
    assert_true(e->answer_not_bound);
    expect(e, PLM_DATA_LOSS, PLM_REFUSAL_NONE,
           "plimsoll: Describe: the answer does not carry this request's Plimsoll-Request-Id back");
    arm("{\"mode\":\"change_request_id\",\"rpc\":\"Run\"}");
    assert_null(run_js(c, "1", NULL, &e));
    assert_true(e->answer_not_bound);
    expect(e, PLM_DATA_LOSS, PLM_REFUSAL_NONE, "the call may have run");
    arm("{\"mode\":\"double_request_id\",\"rpc\":\"Run\"}");
    assert_null(run_js(c, "1", NULL, &e));
    assert_true(e->answer_not_bound);
    expect(e, PLM_DATA_LOSS, PLM_REFUSAL_NONE, NULL);
    arm("{\"mode\":\"double_request_id\",\"rpc\":\"Run\",\"value\":\"joined\"}");
    assert_null(run_js(c, "1", NULL, &e));
    assert_true(e->answer_not_bound);
    expect(e, PLM_DATA_LOSS, PLM_REFUSAL_NONE, NULL);
    plm_client_free(c);
}

static void test_E07_replayed_success_is_not_bound_although_it_really_ran(void **state)
{
    plm_client *c = proxied();
    arm("{\"mode\":\"replay\",\"rpc\":\"Run\"}");
    plm_error *e = NULL;
    plm_result *first = run_js(c, "console.log(1)", NULL, &e);
    ok(e);
    plm_result_free(first);
    assert_null(run_js(c, "console.log(1)", NULL, &e));
    assert_true(e->answer_not_bound);
    expect(e, PLM_DATA_LOSS, PLM_REFUSAL_NONE, NULL);
    assert_int_equal(fault_forwarded(&proxy, "Run"), 2); /* the second call really ran */
    plm_client_free(c);
}

static void test_E08_E09_unbound_error_keeps_only_code_and_message(void **state)
{
    plm_client *c = proxied();
    /* A refusal that carries every mark, but without our id: none of it is believed. */
    arm("{\"mode\":\"status_bound_error\",\"rpc\":\"Run\",\"value\":400,\"echo\":false,"
        "\"body\":{\"code\":\"failed_precondition\",\"message\":\"tier too low\","
        "\"details\":[{\"type\":\"plimsoll.v1.NotDispatched\",\"value\":\"CAU\"}]}}");
    plm_error *e = NULL;
    assert_null(run_js(c, "1", NULL, &e));
    assert_non_null(e);
    assert_true(e->answer_not_bound);
    assert_int_equal(e->session_ended, PLM_END_OPEN);
    assert_null(e->unanswered);
    expect(e, PLM_FAILED_PRECONDITION, PLM_REFUSAL_NONE,
           "tier too low (the answer does not carry this request's Plimsoll-Request-Id back (a "
           "daemon older than protocol 3, or an intermediary that answered with another "
           "request's answer or dropped the header), so what it says about the call is ignored)");
    plm_client_free(c);
}

static void test_E02_E10_header_mark_on_bound_error_without_detail(void **state)
{
    plm_client *c = proxied();
    arm("{\"mode\":\"not_dispatched_header\",\"rpc\":\"Run\",\"value\":\"request\"}");
    plm_error *e = NULL;
    assert_null(run_js(c, "1", NULL, &e));
    assert_false(e->answer_not_bound);
    expect(e, PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST, NULL);
    arm("{\"mode\":\"not_dispatched_header\",\"rpc\":\"Run\",\"value\":\"unknown\"}");
    assert_null(run_js(c, "1", NULL, &e));
    expect(e, PLM_INVALID_ARGUMENT, PLM_REFUSAL_NONE, NULL); /* "unknown" is no mark */
    plm_client_free(c);
}

static void test_E10_daemon_body_cap_refusal_is_marked_request(void **state)
{
    sbx_proc small;
    const char *args[] = {"--max-body-bytes", "256", NULL};
    assert_int_equal(sbx_start(&small, args), 0);
    plm_client *c = client_at(small.url, small.token, 0);
    char code[600];
    memset(code, 'x', sizeof code - 1);
    code[sizeof code - 1] = '\0';
    plm_error *e = NULL;
    assert_null(run_js(c, code, NULL, &e));
    assert_non_null(e);
    assert_false(e->answer_not_bound);
    assert_int_equal(e->not_dispatched, PLM_REFUSAL_REQUEST);
    plm_error_free(e);
    plm_client_free(c);
    sbx_stop(&small);
}

static void test_E01_E05_error_bodies_of_any_shape_give_a_code_and_no_mark(void **state)
{
    static const char *bodies[] = {
        "{\"code\":\"internal\",\"details\":5}", "{\"code\":7,\"message\":{}}",
        "{\"code\":\"bogus\"}", "{\"details\":[null,3,\"x\"]}", "[1]", "\"s\"",
        "{\"code\":\"unavailable\",\"details\":[{\"type\":\"plimsoll.v1.NotDispatched\",\"value\":\"!!\"}]}",
    };
    static const plm_code want[] = {PLM_INTERNAL, PLM_UNKNOWN, PLM_UNKNOWN, PLM_UNKNOWN,
                                    PLM_UNKNOWN, PLM_UNKNOWN, PLM_UNAVAILABLE};
    plm_client *c = proxied();
    for (size_t i = 0; i < PLM_ARRAY_LEN(bodies); i++) {
        char spec[512];
        snprintf(spec, sizeof spec,
                 "{\"mode\":\"status_bound_error\",\"rpc\":\"Run\",\"value\":500,\"echo\":true,"
                 "\"body\":%s}", bodies[i]);
        arm(spec);
        plm_error *e = NULL;
        assert_null(run_js(c, "1", NULL, &e));
        assert_non_null(e);
        assert_non_null(e->message);
        if (e->code != want[i])
            fail_msg("body %s gave %s", bodies[i], plm_code_name(e->code));
        assert_int_equal(e->not_dispatched, PLM_REFUSAL_NONE);
        plm_error_free(e);
    }
    plm_client_free(c);
}

static void test_E04_code_from_status_when_body_has_none(void **state)
{
    static const long statuses[] = {400, 401, 403, 404, 429, 502, 503, 504, 418};
    static const plm_code want[] = {PLM_INTERNAL, PLM_UNAUTHENTICATED, PLM_PERMISSION_DENIED,
                                    PLM_UNIMPLEMENTED, PLM_UNAVAILABLE, PLM_UNAVAILABLE,
                                    PLM_UNAVAILABLE, PLM_UNAVAILABLE, PLM_UNKNOWN};
    plm_client *c = proxied();
    for (size_t i = 0; i < PLM_ARRAY_LEN(statuses); i++) {
        char spec[160];
        snprintf(spec, sizeof spec, "{\"mode\":\"status\",\"rpc\":\"Run\",\"value\":%ld,\"echo\":true}",
                 statuses[i]);
        arm(spec);
        plm_error *e = NULL;
        assert_null(run_js(c, "1", NULL, &e));
        char msg[32];
        snprintf(msg, sizeof msg, "HTTP %ld", statuses[i]);
        if (e->code != want[i])
            fail_msg("status %ld gave %s", statuses[i], plm_code_name(e->code));
        expect(e, want[i], PLM_REFUSAL_NONE, msg);
    }
    plm_client_free(c);
}

static void test_E11_unknown_procedure_404_with_header_is_unimplemented_unsupported(void **state)
{
    plm_client *c = proxied();
    arm("{\"mode\":\"status\",\"rpc\":\"Run\",\"value\":404,\"echo\":true,"
        "\"headers\":{\"Plimsoll-Not-Dispatched\":\"unsupported\"}}");
    plm_error *e = NULL;
    assert_null(run_js(c, "1", NULL, &e));
    expect(e, PLM_UNIMPLEMENTED, PLM_REFUSAL_UNSUPPORTED, NULL);
    plm_client_free(c);
}

/* ---------------------------------------------------------------- transport (W) */

static void test_W12_redirect_is_unknown_and_not_followed(void **state)
{
    plm_client *c = proxied();
    arm("{\"mode\":\"redirect\",\"rpc\":\"Run\",\"value\":307}");
    plm_error *e = NULL;
    assert_null(run_js(c, "1", NULL, &e));
    expect(e, PLM_UNKNOWN, PLM_REFUSAL_NONE, "redirect (HTTP 307)");
    assert_int_equal(fault_forwarded(&proxy, "Run"), 0);
    plm_client_free(c);
}

static void test_W08_no_headers_within_deadline_is_deadline_exceeded(void **state)
{
    plm_client *c = client_at(proxy.url, daemon_proc.token, 200);
    arm("{\"mode\":\"stall_headers\",\"rpc\":\"Run\"}");
    plm_error *e = NULL;
    assert_null(run_js(c, "1", NULL, &e));
    expect(e, PLM_DEADLINE_EXCEEDED, PLM_REFUSAL_NONE, NULL);
    plm_client_free(c);
}

static void test_W09_half_body_then_stall_is_deadline_exceeded(void **state)
{
    plm_client *c = client_at(proxy.url, daemon_proc.token, 300);
    arm("{\"mode\":\"stall_body\",\"rpc\":\"Run\"}");
    plm_error *e = NULL;
    assert_null(run_js(c, "1", NULL, &e));
    expect(e, PLM_DEADLINE_EXCEEDED, PLM_REFUSAL_NONE, NULL);
    plm_client_free(c);
}

typedef struct box {
    bool done;
    plm_error *err;
    plm_result *r;
    int order;
} box;

static void box_cb(void *ud, plm_error *err, plm_result *r)
{
    box *b = ud;
    b->done = true;
    b->err = err;
    b->r = r;
}

static void fire_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
    plm_cancel_fire(t->data);
}

static void test_W10_cancel_during_exchange_is_canceled_unmarked(void **state)
{
    plm_client *c = proxied();
    arm("{\"mode\":\"stall_headers\",\"rpc\":\"Run\"}");
    plm_cancel *k = plm_cancel_new();
    plm_run_options o = {.cancel = k};
    box b = {0};
    ok(plm_run_javascript(c, "1", &o, box_cb, &b));
    ev_timer t;
    ev_timer_init(&t, fire_cb, 0.05, 0.);
    t.data = k;
    ev_timer_start(plm_client_loop(c), &t);
    while (!b.done)
        ev_run(plm_client_loop(c), EVRUN_ONCE);
    assert_null(b.r);
    expect(b.err, PLM_CANCELED, PLM_REFUSAL_NONE, NULL);
    plm_cancel_free(k);
    plm_client_free(c);
}

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

static void test_W13_connection_refused_is_unavailable_marked_environment(void **state)
{
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", closed_port());
    plm_client *c = client_at(url, NULL, 0);
    plm_error *e = NULL;
    assert_null(run_js(c, "1", NULL, &e));
    assert_non_null(e->cause);
    expect(e, PLM_UNAVAILABLE, PLM_REFUSAL_ENVIRONMENT, NULL);
    plm_client_free(c);
}

static void test_W14_https_to_cleartext_listener_is_marked_environment(void **state)
{
    char url[160];
    snprintf(url, sizeof url, "https%s", strchr(daemon_proc.url, ':'));
    plm_client *c = client_at(url, daemon_proc.token, 0);
    plm_error *e = NULL;
    assert_null(run_js(c, "1", NULL, &e));
    expect(e, PLM_UNAVAILABLE, PLM_REFUSAL_ENVIRONMENT, NULL);
    plm_client_free(c);
}

/* A self-signed certificate for 127.0.0.1, made for this run. */
static int make_cert(char *dir, char *cert, char *key)
{
    if (!mkdtemp(dir))
        return -1;
    sprintf(cert, "%s/cert.pem", dir);
    sprintf(key, "%s/key.pem", dir);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "openssl req -x509 -newkey rsa:2048 -nodes -keyout %s -out %s -days 1 "
             "-subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 >/dev/null 2>&1",
             key, cert);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_W15_self_signed_certificate_is_marked_environment(void **state)
{
    char dir[] = "/tmp/berth-tls-XXXXXX", cert[128], key[128];
    assert_int_equal(make_cert(dir, cert, key), 0);
    fault_proxy tls;
    assert_int_equal(fault_start_tls(&tls, daemon_proc.url, cert, key), 0);
    contains(tls.url, "https://");
    plm_client *c = client_at(tls.url, daemon_proc.token, 0);
    plm_error *e = NULL;
    assert_null(run_js(c, "1", NULL, &e));
    expect(e, PLM_UNAVAILABLE, PLM_REFUSAL_ENVIRONMENT, NULL);
    plm_client_free(c);
    /* Trusting that certificate, the same daemon answers over TLS and is verified. */
    plm_client_options o;
    plm_client_options_init(&o);
    o.base_url = tls.url;
    o.token = daemon_proc.token;
    o.ca_file = cert;
    ok(plm_client_new(NULL, &o, &c));
    plm_result *r = run_js(c, "1", NULL, &e);
    ok(e);
    assert_string_equal(r->stdout_text, "javascript 1: 1");
    plm_result_free(r);
    plm_client_free(c);
    fault_stop(&tls);
    unlink(cert);
    unlink(key);
    rmdir(dir);
}

static void test_W16_connection_reset_after_sending_is_unavailable_unmarked(void **state)
{
    plm_client *c = proxied();
    arm("{\"mode\":\"reset\",\"rpc\":\"Run\"}");
    plm_error *e = NULL;
    assert_null(run_js(c, "1", NULL, &e));
    expect(e, PLM_UNAVAILABLE, PLM_REFUSAL_NONE, NULL);
    assert_int_equal(fault_forwarded(&proxy, "Run"), 1); /* it did run */
    plm_client_free(c);
}

static void test_W18_answer_cut_mid_body_is_unavailable_unmarked(void **state)
{
    plm_client *c = proxied();
    arm("{\"mode\":\"cut_body\",\"rpc\":\"Run\"}");
    plm_error *e = NULL;
    assert_null(run_js(c, "1", NULL, &e));
    expect(e, PLM_UNAVAILABLE, PLM_REFUSAL_NONE, NULL);
    plm_client_free(c);
}

static void test_W20_answer_over_32_MiB_is_resource_exhausted(void **state)
{
    plm_client *c = proxied();
    arm("{\"mode\":\"huge_body\",\"rpc\":\"Run\"}");
    plm_error *e = NULL;
    assert_null(run_js(c, "1", NULL, &e));
    expect(e, PLM_RESOURCE_EXHAUSTED, PLM_REFUSAL_NONE, NULL);
    plm_client_free(c);
}

static void test_W21_W22_body_that_is_not_a_json_object_is_internal(void **state)
{
    plm_client *c = proxied();
    arm("{\"mode\":\"malformed_json\",\"rpc\":\"Run\"}");
    plm_error *e = NULL;
    assert_null(run_js(c, "1", NULL, &e));
    expect(e, PLM_INTERNAL, PLM_REFUSAL_NONE, "not a JSON message");
    arm("{\"mode\":\"not_object\",\"rpc\":\"Run\"}");
    assert_null(run_js(c, "1", NULL, &e));
    expect(e, PLM_INTERNAL, PLM_REFUSAL_NONE, "not a JSON message");
    plm_client_free(c);
}

/* ---------------------------------------------------------------- sessions (S) */

static void test_S05_S12_S24_two_snippets_chain_and_close(void **state)
{
    plm_client *c = direct();
    plm_session *s = open_session(c, NULL);
    assert_int_equal(strlen(plm_session_fingerprint(s)), 64);
    plm_result *r1 = NULL, *r2 = NULL;
    ok(plm_session_run_javascript_sync(s, "a", NULL, &r1));
    ok(plm_session_run_javascript_sync(s, "b", NULL, &r2));
    assert_string_equal(r1->stdout_text, "x");
    assert_string_equal(r2->stdout_text, "xx");
    assert_int_equal(r1->record.sequence, 1);
    assert_int_equal(r2->record.sequence, 2);
    assert_string_equal(r2->record.previous_sha256, r1->record.record_sha256);
    assert_string_equal(r1->record.session, plm_session_fingerprint(s));
    uint64_t calls;
    const char *last;
    plm_session_chain(s, &calls, &last);
    assert_int_equal(calls, 2);
    assert_string_equal(last, r2->record.record_sha256);
    close_expect(s, 2, PLM_END_CLOSED);
    assert_int_equal(plm_session_ended(s, NULL), PLM_END_CLOSED);
    plm_result_free(r1);
    plm_result_free(r2);
    plm_session_free(s);
    plm_client_free(c);
}

static void test_S06_cells_share_the_chain_with_snippets(void **state)
{
    plm_client *c = direct();
    const char *langs[] = {"python", "javascript", "python"};
    plm_session_options so = {.languages = langs, .n_languages = 3};
    plm_session *s = open_session(c, &so);
    plm_result *r = NULL;
    ok(plm_session_run_javascript_sync(s, "1", NULL, &r));
    plm_result_free(r);
    plm_error *e = NULL;
    r = cell(s, "python", "x = 1", &e);
    ok(e);
    assert_string_equal(r->stdout_text, "python 1: x = 1");
    assert_true(r->interpreter_started);
    plm_result_free(r);
    plm_file f = {"in/a.csv", "1,2\n"};
    plm_cell cl = {"python", "x + 1", &f, 1};
    ok(plm_session_run_cell_sync(s, &cl, NULL, &r));
    assert_string_equal(r->stdout_text, "python 2: x + 1");
    assert_string_equal(r->stderr_text, "in/a.csv\n");
    assert_false(r->interpreter_started);
    assert_int_equal(r->record.sequence, 3);
    plm_result_free(r);
    close_expect(s, 3, PLM_END_CLOSED);
    plm_session_free(s);
    plm_client_free(c);
}

static void never_result(void *ud, plm_error *err, plm_result *r)
{
    fail_msg("a refused call must not call back");
}

static void test_S07_unknown_cell_language_refused_session_usable(void **state)
{
    plm_client *c = direct();
    plm_session *s = open_session(c, NULL);
    plm_cell ruby = {"ruby", "puts 1", NULL, 0};
    expect(plm_session_run_cell(s, &ruby, NULL, never_result, NULL), PLM_INVALID_ARGUMENT,
           PLM_REFUSAL_REQUEST, "ruby");
    plm_error *e = NULL;
    plm_result *r = cell(s, "javascript", "1", &e);
    ok(e);
    assert_int_equal(r->record.sequence, 1);
    plm_result_free(r);
    close_expect(s, 1, PLM_END_CLOSED);
    plm_session_free(s);
    plm_client_free(c);
}

static void test_S09_concurrent_calls_are_serialized_in_order(void **state)
{
    plm_client *c = direct();
    plm_session *s = open_session(c, NULL);
    box b[4] = {{0}};
    for (int i = 0; i < 4; i++)
        ok(plm_session_run_javascript(s, "x", NULL, box_cb, &b[i]));
    while (!(b[0].done && b[1].done && b[2].done && b[3].done))
        ev_run(plm_client_loop(c), EVRUN_ONCE);
    for (int i = 0; i < 4; i++) {
        ok(b[i].err);
        assert_int_equal(b[i].r->record.sequence, (uint64_t)i + 1);
        assert_int_equal(strlen(b[i].r->stdout_text), (size_t)i + 1);
        plm_result_free(b[i].r);
    }
    close_expect(s, 4, PLM_END_CLOSED);
    plm_session_free(s);
    plm_client_free(c);
}

static void end_all_sessions(void)
{
    char url[192];
    snprintf(url, sizeof url, "%s/test/end-sessions", daemon_proc.url);
    assert_int_equal(http_call("POST", url, "", NULL), 200);
}

static void test_S13_E23_call_on_ended_session_refused_with_reason(void **state)
{
    plm_client *c = direct();
    plm_session *s = open_session(c, NULL);
    end_all_sessions();
    plm_error *e = NULL;
    assert_null(cell(s, "python", "1", &e));
    assert_int_equal(e->session_ended, PLM_END_EXPIRED);
    expect(e, PLM_FAILED_PRECONDITION, PLM_REFUSAL_REQUEST, NULL);
    assert_int_equal(plm_session_ended(s, NULL), PLM_END_EXPIRED);
    assert_null(plm_session_stopped(s));
    close_expect(s, 0, PLM_END_EXPIRED);
    plm_session_free(s);
    plm_client_free(c);
}

static void test_S10_session_ending_during_a_call_is_reported(void **state)
{
    plm_client *c = direct();
    plm_session *s = open_session(c, NULL);
    plm_error *e = NULL;
    plm_result *r = cell(s, "python", "plimsoll-fake:ends-session", &e);
    ok(e);
    assert_int_equal(r->ended, PLM_END_DISK_EXCEEDED);
    assert_int_equal(plm_session_ended(s, NULL), PLM_END_DISK_EXCEEDED);
    plm_result_free(r);
    assert_null(cell(s, "python", "1", &e));
    assert_int_equal(e->session_ended, PLM_END_DISK_EXCEEDED);
    expect(e, PLM_FAILED_PRECONDITION, PLM_REFUSAL_REQUEST, NULL);
    close_expect(s, 1, PLM_END_DISK_EXCEEDED);
    plm_session_free(s);
    plm_client_free(c);
}

static void test_S26_deadline_cell_result(void **state)
{
    plm_client *c = direct();
    plm_session *s = open_session(c, NULL);
    plm_error *e = NULL;
    plm_result *r = cell(s, "python", "plimsoll-fake:past-deadline", &e);
    ok(e);
    assert_int_equal(r->exit_code, 124);
    assert_true(r->timed_out);
    assert_true(r->interpreter_ended);
    plm_result_free(r);
    r = cell(s, "python", "1", &e);
    ok(e);
    assert_true(r->interpreter_started); /* the next cell starts a fresh interpreter */
    plm_result_free(r);
    close_expect(s, 2, PLM_END_CLOSED);
    plm_session_free(s);
    plm_client_free(c);
}

static void test_S18_R21_unanswered_call_with_checking_record_advances_chain(void **state)
{
    plm_client *c = direct();
    plm_session *s = open_session(c, NULL);
    plm_error *e = NULL;
    plm_result *r = cell(s, "python", "1", &e);
    ok(e);
    plm_result_free(r);
    assert_null(cell(s, "python", "plimsoll-echo:unanswered", &e));
    assert_non_null(e);
    assert_non_null(e->record);
    assert_int_equal(e->record->sequence, 2);
    assert_int_equal(e->record->version, 3);
    expect(e, PLM_UNKNOWN, PLM_REFUSAL_NONE, NULL);
    assert_null(plm_session_stopped(s));
    r = cell(s, "python", "3", &e);
    ok(e);
    assert_int_equal(r->record.sequence, 3);
    plm_result_free(r);
    close_expect(s, 3, PLM_END_CLOSED);
    plm_session_free(s);
    plm_client_free(c);
}

static void test_S19_lying_unanswered_record_stops_the_session(void **state)
{
    static const char *lies[] = {"weaker", "liar"};
    static const char *needles[] = {"below the call's minimum container", "the session opened as echo"};
    plm_client *c = proxied();
    for (int i = 0; i < 2; i++) {
        plm_session_options so = {.minimum_isolation = "container"};
        plm_session *s = open_session(c, &so);
        char spec[128];
        snprintf(spec, sizeof spec, "{\"mode\":\"unanswered\",\"rpc\":\"SessionRun\",\"value\":\"%s\"}",
                 lies[i]);
        arm(spec);
        plm_error *e = NULL;
        assert_null(cell(s, "python", "1", &e));
        assert_non_null(e);
        assert_non_null(e->cause);
        expect(e, PLM_DATA_LOSS, PLM_REFUSAL_NONE, needles[i]);
        assert_non_null(plm_session_stopped(s));
        plm_cell cl = {"python", "2", NULL, 0};
        expect(plm_session_run_cell(s, &cl, NULL, never_result, NULL), PLM_FAILED_PRECONDITION,
               PLM_REFUSAL_REQUEST, "open a new one");
        fault_reset(&proxy);
        plm_close_summary *sum = NULL;
        plm_error *ce = plm_session_close_sync(s, &sum); /* the daemon counts a call we refused */
        expect(ce, PLM_DATA_LOSS, PLM_REFUSAL_NONE, "the daemon counts 1 calls");
        plm_session_free(s);
    }
    plm_client_free(c);
}

static void test_S11_broken_chain_is_data_loss_and_stops_the_session(void **state)
{
    plm_client *c = proxied();
    plm_session *s = open_session(c, NULL);
    arm("{\"mode\":\"break_chain\",\"rpc\":\"SessionRun\",\"value\":\"5\"}");
    plm_error *e = NULL;
    assert_null(cell(s, "python", "1", &e));
    assert_non_null(e->wire);
    expect(e, PLM_DATA_LOSS, PLM_REFUSAL_NONE, "the session's chain is broken");
    assert_non_null(plm_session_stopped(s));
    long before = fault_forwarded(&proxy, "SessionRun");
    plm_cell cl = {"python", "2", NULL, 0};
    expect(plm_session_run_cell(s, &cl, NULL, never_result, NULL), PLM_FAILED_PRECONDITION,
           PLM_REFUSAL_REQUEST, NULL);
    assert_int_equal(fault_forwarded(&proxy, "SessionRun"), before);
    plm_close_summary *sum = NULL;
    plm_error_free(plm_session_close_sync(s, &sum));
    plm_close_summary_free(sum);
    plm_session_free(s);
    plm_client_free(c);
}

static void test_S16_unchecked_failure_stops_session_and_nothing_more_is_sent(void **state)
{
    plm_client *c = proxied();
    plm_session *s = open_session(c, NULL);
    plm_error *e = NULL;
    plm_result *r = cell(s, "python", "1", &e);
    ok(e);
    plm_result_free(r);
    arm("{\"mode\":\"reset\",\"rpc\":\"SessionRun\"}");
    assert_null(cell(s, "python", "2", &e));
    expect(e, PLM_UNAVAILABLE, PLM_REFUSAL_NONE, NULL);
    assert_null(cell(s, "python", "3", &e));
    expect(e, PLM_FAILED_PRECONDITION, PLM_REFUSAL_REQUEST,
           "ended without an answer this client could check");
    assert_int_equal(fault_forwarded(&proxy, "SessionRun"), 2);
    plm_close_summary *sum = NULL;
    expect(plm_session_close_sync(s, &sum), PLM_DATA_LOSS, PLM_REFUSAL_NONE, "this client saw 1");
    plm_session_free(s);
    plm_client_free(c);
}

static void test_S17_refused_call_leaves_session_usable(void **state)
{
    plm_client *c = proxied();
    plm_session *s = open_session(c, NULL);
    arm("{\"mode\":\"not_dispatched_header\",\"rpc\":\"SessionRun\",\"value\":\"environment\",\"count\":1}");
    plm_error *e = NULL;
    assert_null(cell(s, "python", "1", &e));
    expect(e, PLM_INVALID_ARGUMENT, PLM_REFUSAL_ENVIRONMENT, NULL);
    assert_null(plm_session_stopped(s));
    assert_int_equal(plm_session_ended(s, NULL), PLM_END_OPEN);
    plm_result *r = cell(s, "python", "2", &e);
    ok(e);
    assert_int_equal(r->record.sequence, 1);
    plm_result_free(r);
    close_expect(s, 1, PLM_END_CLOSED);
    plm_session_free(s);
    plm_client_free(c);
}

static void test_S20_queued_call_cancelled_before_sending(void **state)
{
    plm_client *c = direct();
    plm_session *s = open_session(c, NULL);
    plm_cancel *k = plm_cancel_new();
    box first = {0}, queued = {0}, later = {0};
    plm_run_options o = {.cancel = k};
    ok(plm_session_run_javascript(s, "a", NULL, box_cb, &first));
    ok(plm_session_run_javascript(s, "b", &o, box_cb, &queued));
    plm_cancel_fire(k);
    ok(plm_session_run_javascript(s, "c", NULL, box_cb, &later));
    while (!(first.done && queued.done && later.done))
        ev_run(plm_client_loop(c), EVRUN_ONCE);
    ok(first.err);
    assert_null(queued.r);
    expect(queued.err, PLM_CANCELED, PLM_REFUSAL_REQUEST, NULL);
    ok(later.err);
    assert_int_equal(later.r->record.sequence, 2);
    assert_null(plm_session_stopped(s));
    plm_result_free(first.r);
    plm_result_free(later.r);
    close_expect(s, 2, PLM_END_CLOSED);
    plm_cancel_free(k);
    plm_session_free(s);
    plm_client_free(c);
}

static void test_S21_ill_formed_text_in_session_call_refused_session_usable(void **state)
{
    plm_client *c = direct();
    plm_session *s = open_session(c, NULL);
    plm_file f = {"bad\xff.txt", "x"};
    plm_cell cl = {"python", "1", &f, 1};
    expect(plm_session_run_cell(s, &cl, NULL, never_result, NULL), PLM_INVALID_ARGUMENT,
           PLM_REFUSAL_REQUEST, "request.cell.files[0].path");
    expect(plm_session_run_javascript(s, "\xc3", NULL, never_result, NULL), PLM_INVALID_ARGUMENT,
           PLM_REFUSAL_REQUEST, "request.javascript.code");
    assert_null(plm_session_stopped(s));
    plm_error *e = NULL;
    plm_result *r = cell(s, "python", "1", &e);
    ok(e);
    uint64_t calls;
    plm_session_chain(s, &calls, NULL);
    assert_int_equal(calls, 1);
    plm_result_free(r);
    close_expect(s, 1, PLM_END_CLOSED);
    plm_session_free(s);
    plm_client_free(c);
}

typedef struct cbox {
    bool done;
    plm_error *err;
    plm_close_summary *sum;
} cbox;

static void cbox_cb(void *ud, plm_error *err, plm_close_summary *sum)
{
    cbox *b = ud;
    b->done = true;
    b->err = err;
    b->sum = sum;
}

static void test_S04_session_freed_with_call_in_flight_reports_canceled(void **state)
{
    plm_client *c = direct();
    plm_session *s = open_session(c, NULL);
    box b = {0};
    plm_cell cl = {"python", "1", NULL, 0};
    ok(plm_session_run_cell(s, &cl, NULL, box_cb, &b));
    plm_session_free(s);
    while (!b.done)
        ev_run(plm_client_loop(c), EVRUN_ONCE);
    assert_null(b.r);
    expect(b.err, PLM_CANCELED, PLM_REFUSAL_NONE, "freed while this call was in flight");
    plm_client_free(c);
}

static void test_S22_close_is_memoized_one_close_sent(void **state)
{
    plm_client *c = proxied();
    plm_session *s = open_session(c, NULL);
    plm_result *r = NULL;
    ok(plm_session_run_javascript_sync(s, "a", NULL, &r));
    plm_result_free(r);
    cbox a = {0}, b = {0}, third = {0};
    ok(plm_session_close(s, NULL, cbox_cb, &a));
    ok(plm_session_close(s, NULL, cbox_cb, &b));
    while (!(a.done && b.done))
        ev_run(plm_client_loop(c), EVRUN_ONCE);
    ok(plm_session_close(s, NULL, cbox_cb, &third));
    while (!third.done)
        ev_run(plm_client_loop(c), EVRUN_ONCE);
    cbox *all[] = {&a, &b, &third};
    for (int i = 0; i < 3; i++) {
        ok(all[i]->err);
        assert_int_equal(all[i]->sum->calls, 1);
        assert_string_equal(all[i]->sum->last_record_sha256, a.sum->last_record_sha256);
    }
    for (int i = 0; i < 3; i++)
        plm_close_summary_free(all[i]->sum);
    assert_int_equal(fault_forwarded(&proxy, "CloseSession"), 1);
    plm_session_free(s);
    plm_client_free(c);
}

static void test_S23_close_refused_not_dispatched_clears_memo(void **state)
{
    plm_client *c = proxied();
    plm_session *s = open_session(c, NULL);
    plm_cancel *k = plm_cancel_new();
    plm_cancel_fire(k);
    cbox a = {0};
    expect(plm_session_close(s, k, cbox_cb, &a), PLM_CANCELED, PLM_REFUSAL_REQUEST, NULL);
    close_expect(s, 0, PLM_END_CLOSED);
    assert_int_equal(fault_forwarded(&proxy, "CloseSession"), 1);
    plm_cancel_free(k);
    plm_session_free(s);
    plm_client_free(c);
}

static void test_S25_close_count_mismatch_is_data_loss_with_summary(void **state)
{
    plm_client *c = proxied();
    plm_session *s = open_session(c, NULL);
    arm("{\"mode\":\"patch\",\"rpc\":\"CloseSession\",\"value\":{\"calls\":\"9\"}}");
    plm_close_summary *sum = NULL;
    plm_error *e = plm_session_close_sync(s, &sum);
    assert_null(sum);
    assert_non_null(e);
    assert_non_null(e->wire);
    expect(e, PLM_DATA_LOSS, PLM_REFUSAL_NONE, "the daemon counts 9 calls");
    plm_session_free(s);
    plm_client_free(c);
}

static void test_S03_open_with_wrong_fingerprint_closes_then_fails(void **state)
{
    plm_client *c = proxied();
    arm("{\"mode\":\"patch\",\"rpc\":\"OpenSession\",\"value\":{\"session\":"
        "\"0000000000000000000000000000000000000000000000000000000000000000\"}}");
    plm_session *s = NULL;
    plm_error *e = plm_open_session_sync(c, NULL, &s);
    assert_null(s);
    assert_null(e->wire);
    expect(e, PLM_DATA_LOSS, PLM_REFUSAL_NONE, "fingerprint");
    /* The close that follows is sent before the failure is reported. */
    for (int i = 0; i < 100 && fault_forwarded(&proxy, "CloseSession") < 1; i++)
        ev_run(plm_client_loop(c), EVRUN_ONCE);
    assert_int_equal(fault_forwarded(&proxy, "CloseSession"), 1);
    plm_client_free(c);
}

static void test_S03_open_below_floor_is_data_loss(void **state)
{
    plm_client *c = proxied();
    arm("{\"mode\":\"patch\",\"rpc\":\"OpenSession\",\"value\":{\"isolation\":\"process\"}}");
    plm_session *s = NULL;
    plm_session_options so = {.minimum_isolation = "container"};
    expect(plm_open_session_sync(c, &so, &s), PLM_DATA_LOSS, PLM_REFUSAL_NONE, "below");
    assert_null(s);
    plm_client_free(c);
}

static void test_S08_session_floor_carried_on_every_call(void **state)
{
    /* The session was opened with floor container; a call asking for process still
     * carries container, which the daemon's tier meets.  A call asking for kernel is
     * refused by the daemon before dispatch (the echo tier is container). */
    plm_client *c = direct();
    plm_session_options so = {.minimum_isolation = "container"};
    plm_session *s = open_session(c, &so);
    plm_cell cl = {"python", "1", NULL, 0};
    plm_run_options weak = {.minimum_isolation = "process"}, strong = {.minimum_isolation = "kernel"};
    plm_result *r = NULL;
    ok(plm_session_run_cell_sync(s, &cl, &weak, &r));
    plm_result_free(r);
    expect(plm_session_run_cell_sync(s, &cl, &strong, &r), PLM_FAILED_PRECONDITION,
           PLM_REFUSAL_ISOLATION, NULL);
    close_expect(s, 1, PLM_END_CLOSED);
    plm_session_free(s);
    plm_client_free(c);
}

/* ---------------------------------------------------------------- more W, R, E, S */

static void test_W02_each_request_carries_a_fresh_id(void **state)
{
    /* Three Describes through a proxy that answers every one with the first answer (and
     * its id): only the first is bound, so each request carried a new id. */
    plm_client *c = proxied();
    arm("{\"mode\":\"replay\",\"rpc\":\"Describe\"}");
    plm_info *info = NULL;
    ok(plm_describe_sync(c, &info));
    plm_info_free(info);
    for (int i = 0; i < 2; i++) {
        plm_error *e = plm_describe_sync(c, &info);
        assert_null(info);
        assert_non_null(e);
        assert_true(e->answer_not_bound);
        plm_error_free(e);
    }
    plm_client_free(c);
}

static void test_W17_refusal_reported_after_cancel_is_canceled(void **state)
{
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", closed_port());
    plm_client *c = client_at(url, NULL, 0);
    plm_cancel *k = plm_cancel_new();
    plm_run_options o = {.cancel = k};
    box b = {0};
    ok(plm_run_javascript(c, "1", &o, box_cb, &b));
    plm_cancel_fire(k); /* before the loop ever reports the refused connect */
    while (!b.done)
        ev_run(plm_client_loop(c), EVRUN_ONCE);
    expect(b.err, PLM_CANCELED, PLM_REFUSAL_NONE, NULL);
    plm_cancel_free(k);
    plm_client_free(c);
}

static void test_W17_refusal_reported_after_the_deadline_is_deadline_exceeded(void **state)
{
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", closed_port());
    plm_client *c = client_at(url, NULL, 1);
    box b = {0};
    ok(plm_run_javascript(c, "1", NULL, box_cb, &b));
    /* The refusal is reported only when the loop runs: let the 1 ms request deadline
     * pass first (the condition under test, not a wait for another party). */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do
        clock_gettime(CLOCK_MONOTONIC, &t1);
    while ((t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec) < 3000000LL);
    while (!b.done)
        ev_run(plm_client_loop(c), EVRUN_ONCE);
    assert_null(b.r);
    expect(b.err, PLM_DEADLINE_EXCEEDED, PLM_REFUSAL_NONE, NULL);
    plm_client_free(c);
}

static void test_W24_a_call_whose_answer_was_lost_is_not_sent_again(void **state)
{
    plm_client *c = proxied();
    plm_error *e = NULL;
    plm_result *r = run_js(c, "warm the connection", NULL, &e);
    ok(e);
    plm_result_free(r);
    arm("{\"mode\":\"reset\",\"rpc\":\"Run\",\"count\":1}");
    assert_null(run_js(c, "1", NULL, &e)); /* on the reused keep-alive connection */
    expect(e, PLM_UNAVAILABLE, PLM_REFUSAL_NONE, NULL);
    assert_int_equal(fault_forwarded(&proxy, "Run"), 2); /* ran once, never re-sent */
    plm_client_free(c);
}

static void test_W27_lifetime_and_idle_are_passed_capped_or_omitted(void **state)
{
    plm_client *c = direct();
    plm_session_options so = {.idle_timeout_ms = 1500, .lifetime_ms = 60000};
    plm_session *s = open_session(c, &so);
    assert_int_equal(plm_session_idle_timeout_ms(s), 1500);
    close_expect(s, 0, PLM_END_CLOSED);
    plm_session_free(s);
    plm_session_options neg = {.idle_timeout_ms = -1, .lifetime_ms = 0};
    s = open_session(c, &neg);
    assert_int_equal(plm_session_idle_timeout_ms(s), 300000); /* omitted: the daemon's */
    close_expect(s, 0, PLM_END_CLOSED);
    plm_session_free(s);
    plm_client_free(c);
}

static void test_W28_grant_sent_only_when_configured_and_never_on_cells(void **state)
{
    plm_client_options o;
    plm_client_options_init(&o);
    o.base_url = daemon_proc.url;
    o.token = daemon_proc.token;
    o.javascript_grant_profile = "net-egress";
    plm_client *c = NULL;
    ok(plm_client_new(NULL, &o, &c));
    plm_error *e = NULL;
    /* This daemon offers no grants, so a snippet that names one is refused... */
    assert_null(run_js(c, "1", NULL, &e));
    assert_int_not_equal(e->not_dispatched, PLM_REFUSAL_NONE);
    plm_error_free(e);
    /* ...while a cell, which never carries a grant, runs. */
    plm_session *s = open_session(c, NULL);
    plm_result *r = cell(s, "python", "1", &e);
    ok(e);
    plm_result_free(r);
    close_expect(s, 1, PLM_END_CLOSED);
    plm_session_free(s);
    plm_client_free(c);
    c = direct(); /* no grant configured: the same snippet runs */
    r = run_js(c, "1", NULL, &e);
    ok(e);
    plm_result_free(r);
    plm_client_free(c);
}

static void test_W29_trace_id_is_not_validated_by_the_client(void **state)
{
    plm_client *c = direct();
    plm_run_options o = {.trace_id = "not a valid trace id! it has spaces and is long long long long long long"};
    plm_error *e = NULL;
    plm_result *r = run_js(c, "1", &o, &e);
    ok(e); /* the daemon drops it silently; the record is still checked */
    plm_result_free(r);
    plm_client_free(c);
}

static void test_W32_describe_maps_absent_fields_and_filters_languages(void **state)
{
    plm_client *c = proxied();
    arm("{\"mode\":\"patch\",\"rpc\":\"Describe\",\"value\":{\"maxSessionsPerOwner\":1,"
        "\"sessionEnvironment.languages\":[\"python\",\"cobol\"],\"projectEnvironment\":null}}");
    plm_info *info = NULL;
    ok(plm_describe_sync(c, &info));
    assert_int_equal(info->max_sessions_per_owner, 1);
    assert_int_equal(info->max_sessions_per_caller, 0);
    assert_true(info->session.python);
    assert_false(info->session.javascript);
    assert_int_equal(info->project.max_timeout_ms, 0);
    assert_string_equal(info->policy, "");
    plm_info_free(info);
    plm_client_free(c);
}

static void test_R10_record_version_must_be_2_under_protocol_3(void **state)
{
    run_through_fault("{\"mode\":\"patch\",\"rpc\":\"Run\",\"recompute\":true,\"value\":"
                      "{\"record.version\":1}}", NULL, PLM_DATA_LOSS, "version", true);
    run_through_fault("{\"mode\":\"patch\",\"rpc\":\"Run\",\"recompute\":true,\"value\":"
                      "{\"record.version\":3}}", NULL, PLM_DATA_LOSS, "version", true);
    run_through_fault("{\"mode\":\"patch\",\"rpc\":\"Run\",\"recompute\":true,\"value\":"
                      "{\"record.unanswered\":\"unknown\"}}", NULL, PLM_DATA_LOSS, "unanswered", true);
}

static void test_R14_environment_and_software_must_match_the_answer(void **state)
{
    run_through_fault("{\"mode\":\"patch\",\"rpc\":\"Run\",\"recompute\":true,\"value\":"
                      "{\"record.environment\":\"other-image\"}}", NULL, PLM_DATA_LOSS,
                      "environment", true);
    run_through_fault("{\"mode\":\"patch\",\"rpc\":\"Run\",\"recompute\":true,\"value\":"
                      "{\"record.softwareRuleId\":\"exact:x\"}}", NULL, PLM_DATA_LOSS,
                      "software", true);
    run_through_fault("{\"mode\":\"patch\",\"rpc\":\"Run\",\"recompute\":true,\"value\":"
                      "{\"record.softwareIdentity\":\"x\"}}", NULL, PLM_DATA_LOSS,
                      "software identity", true);
}

static void test_E19_E26_open_on_a_daemon_without_sessions_is_unsupported(void **state)
{
    sbx_proc none;
    const char *args[] = {"--max-sessions", "0", NULL};
    assert_int_equal(sbx_start(&none, args), 0);
    plm_client *c = client_at(none.url, none.token, 0);
    plm_session *s = NULL;
    expect(plm_open_session_sync(c, NULL, &s), PLM_UNIMPLEMENTED, PLM_REFUSAL_UNSUPPORTED, NULL);
    assert_null(s);
    plm_client_free(c);
    sbx_stop(&none);
}

static void test_E24_replaced_session_is_refused_with_its_reason(void **state)
{
    sbx_proc capped;
    const char *args[] = {"--max-sessions-per-owner", "1", NULL};
    assert_int_equal(sbx_start(&capped, args), 0);
    plm_client *c = client_at(capped.url, capped.token, 0);
    plm_session_options so = {.owner = "alice@example.com"};
    plm_session *first = open_session(c, &so);
    plm_session *second = open_session(c, &so); /* the daemon replaces the idle first */
    plm_error *e = NULL;
    assert_null(cell(first, "python", "1", &e));
    assert_int_equal(e->session_ended, PLM_END_REPLACED);
    expect(e, PLM_FAILED_PRECONDITION, PLM_REFUSAL_REQUEST, NULL);
    plm_result *r = cell(second, "python", "1", &e);
    ok(e);
    plm_result_free(r);
    close_expect(second, 1, PLM_END_CLOSED);
    plm_session_free(first);
    plm_session_free(second);
    plm_client_free(c);
    sbx_stop(&capped);
}

static void test_S15_unlisted_end_name_reads_as_unknown_never_open(void **state)
{
    plm_client *c = proxied();
    plm_session *s = open_session(c, NULL);
    arm("{\"mode\":\"patch\",\"rpc\":\"SessionRun\",\"value\":{\"ended\":\"SESSION_END_HOST_LOST\"}}");
    plm_error *e = NULL;
    plm_result *r = cell(s, "python", "1", &e);
    ok(e);
    assert_int_equal(r->ended, PLM_END_UNKNOWN);
    assert_int_equal(plm_session_ended(s, NULL), PLM_END_UNKNOWN);
    plm_result_free(r);
    fault_reset(&proxy);
    close_expect(s, 1, PLM_END_CLOSED);
    assert_int_equal(plm_session_ended(s, NULL), PLM_END_UNKNOWN); /* the first end stays */
    plm_session_free(s);
    plm_client_free(c);
}

/* ---------------------------------------------------------------- guest failures, URLs, ids, reuse */

static void test_E22_guest_failure_is_a_result_not_an_error(void **state)
{
    /* The echo provider runs nothing; the process provider runs real python3 and node. */
    sbx_proc real;
    const char *args[] = {"--provider", "process", "--pool", "1", NULL};
    if (sbx_start(&real, args) != 0) {
        skip_missing_capability("skipped: sandboxd --provider process does not start here\n");
    }
    plm_client *c = client_at(real.url, real.token, 0);
    plm_error *e = NULL;
    plm_result *r = run_js(c, "throw new Error('boom')", NULL, &e);
    ok(e);
    assert_int_equal(r->kind, PLM_KIND_JAVASCRIPT);
    assert_int_not_equal(r->exit_code, 0);
    assert_false(r->timed_out);
    contains(r->stderr_text, "boom");
    assert_int_equal(strlen(r->record.record_sha256), 64); /* checked like any answer */
    plm_result_free(r);
    plm_session *s = open_session(c, NULL);
    r = cell(s, "python", "raise ValueError('boom')", &e);
    ok(e);
    assert_int_equal(r->exit_code, 1);
    contains(r->stderr_text, "boom");
    contains(r->stderr_text, "ValueError");
    plm_result_free(r);
    r = cell(s, "javascript", "throw new Error('boom')", &e);
    ok(e);
    assert_int_equal(r->exit_code, 1);
    contains(r->stderr_text, "boom");
    plm_result_free(r);
    r = cell(s, "python", "print(6 * 7)", &e); /* the session is still usable */
    ok(e);
    assert_int_equal(r->exit_code, 0);
    contains(r->stdout_text, "42");
    assert_int_equal(r->record.sequence, 3);
    plm_result_free(r);
    assert_null(plm_session_stopped(s));
    close_expect(s, 3, PLM_END_CLOSED);
    plm_session_free(s);
    plm_client_free(c);
    sbx_stop(&real);
}

static void test_W04_trailing_slashes_stripped_against_the_daemon(void **state)
{
    assert_int_equal(wiretap_relay(&tap, wiretap_port_of(daemon_proc.url)), 0);
    char url[160];
    snprintf(url, sizeof url, "%s///", tap.url);
    plm_client *c = client_at(url, daemon_proc.token, 0);
    plm_info *info = NULL;
    ok(plm_describe_sync(c, &info));
    assert_string_equal(info->sandbox, "echo");
    plm_info_free(info);
    plm_error *e = NULL;
    plm_result *r = run_js(c, "1", NULL, &e);
    ok(e);
    assert_string_equal(r->stdout_text, "javascript 1: 1");
    plm_result_free(r);
    plm_client_free(c);
    char *sent = wiretap_sent(&tap);
    contains(sent, "POST /plimsoll.v1.SandboxService/Describe HTTP/1.1\r\n");
    contains(sent, "POST /plimsoll.v1.SandboxService/Run HTTP/1.1\r\n");
    if (strstr(sent, "//plimsoll"))
        fail_msg("a doubled slash was sent:\n%.300s", sent);
    free(sent);
    wiretap_stop(&tap);
}

/* Connections to the daemon are kept across bursts of calls (docs/client.md §2.2):
 * 20 calls at once open at most 20 connections, and 20 more once those ended open
 * none.  libcurl's own bound (4 x the calls in flight) shrank as the first burst
 * ended and closed most of them. */
static void test_connections_are_kept_across_bursts_of_calls(void **state)
{
    enum { BURST = 20 };
    assert_int_equal(wiretap_relay(&tap, wiretap_port_of(daemon_proc.url)), 0);
    plm_client *c = client_at(tap.url, daemon_proc.token, 0);
    int after_first = 0;
    for (int round = 0; round < 2; round++) {
        box b[BURST] = {{0}};
        for (int i = 0; i < BURST; i++)
            ok(plm_run_javascript(c, "1", NULL, box_cb, &b[i]));
        for (int i = 0; i < BURST; i++) {
            while (!b[i].done)
                ev_run(plm_client_loop(c), EVRUN_ONCE);
            ok(b[i].err);
            assert_string_equal(b[i].r->stdout_text, "javascript 1: 1");
            plm_result_free(b[i].r);
        }
        if (round == 0)
            after_first = wiretap_connections(&tap);
    }
    assert_in_range(after_first, 1, BURST);
    assert_int_equal(wiretap_connections(&tap), after_first);
    plm_client_free(c);
    wiretap_stop(&tap);
}

static void lacks_id(const char *what, const char *hay, const char *id)
{
    if (hay && strstr(hay, id))
        fail_msg("the session id appears in the %s: %.300s", what, hay);
}

static void record_lacks_id(const char *what, const plm_record *rec, const char *id)
{
    if (!rec)
        return;
    json_t *j = plm_record_to_json(rec);
    char *d = json_dumps(j, 0);
    lacks_id(what, d, id);
    free(d);
    json_decref(j);
}

static void result_lacks_id(const char *what, const plm_result *r, const char *id)
{
    if (!r)
        return;
    const char *strs[] = {r->sandbox, r->isolation, r->software_identity, r->environment,
                          r->stdout_text, r->stderr_text, r->outcome_detail, r->end_detail};
    for (size_t i = 0; i < PLM_ARRAY_LEN(strs); i++)
        lacks_id(what, strs[i], id);
    record_lacks_id(what, &r->record, id);
}

/* Asserts that nothing an error carries holds the session id, then frees it. */
static void error_lacks_id(plm_error *e, const char *id)
{
    assert_non_null(e);
    lacks_id("message", e->message, id);
    lacks_id("cause", e->cause, id);
    lacks_id("session-ended detail", e->session_ended_detail, id);
    if (e->wire) {
        char *d = json_dumps(e->wire, JSON_ENCODE_ANY);
        lacks_id("wire evidence", d, id);
        free(d);
    }
    result_lacks_id("result evidence", e->result, id);
    record_lacks_id("unanswered record", e->unanswered, id);
    record_lacks_id("checked record", e->record, id);
    plm_error_free(e);
}

/* The id the client sent in its last SessionRun or CloseSession body, from the wire. */
static void session_id_from_wire(wiretap *t, const plm_session *s, char *id, size_t cap)
{
    char *sent = wiretap_sent(t);
    const char *key = "\"sessionId\":\"", *p = NULL;
    for (const char *q = strstr(sent, key); q; q = strstr(q + 1, key))
        p = q;
    assert_non_null(p);
    p += strlen(key);
    size_t n = strcspn(p, "\"");
    assert_true(n > 0 && n < cap);
    memcpy(id, p, n);
    id[n] = '\0';
    free(sent);
    plm_hex fp;
    plm_sha256_hex(id, n, fp);
    assert_string_equal(fp, plm_session_fingerprint(s)); /* it really is this session's id */
}

static void session_accessors_lack_id(const plm_session *s, const char *id)
{
    const char *detail = NULL, *last = NULL;
    plm_session_ended(s, &detail);
    plm_session_chain(s, NULL, &last);
    const char *strs[] = {plm_session_fingerprint(s), plm_session_isolation(s),
                          plm_session_sandbox(s), plm_session_software_identity(s),
                          plm_session_stopped(s), detail, last};
    for (size_t i = 0; i < PLM_ARRAY_LEN(strs); i++)
        lacks_id("session accessor", strs[i], id);
}

/* A session with one answered cell, and its id as the client sent it. */
static plm_session *tapped_session(plm_client *c, char *id, size_t cap)
{
    plm_error *e = NULL;
    plm_session *s = open_session(c, NULL);
    plm_result *r = cell(s, "python", "1", &e);
    ok(e);
    plm_result_free(r);
    session_id_from_wire(&tap, s, id, cap);
    return s;
}

/* Untampered again: close (whatever it says) and free. */
static void close_untampered(plm_session *s)
{
    plm_close_summary *sum = NULL;
    fault_reset(&proxy);
    plm_error_free(plm_session_close_sync(s, &sum));
    plm_close_summary_free(sum);
    plm_session_free(s);
}

static void test_S04_session_id_never_leaks_into_errors_or_results(void **state)
{
    /* client -> wiretap (sees the id on the wire) -> fault proxy (tampers) -> sandboxd */
    assert_int_equal(wiretap_relay(&tap, wiretap_port_of(proxy.url)), 0);
    plm_client *c = client_at(tap.url, daemon_proc.token, 0);
    char id[256];
    plm_error *e = NULL;

    /* 1. A chain broken by a tampered answer: data_loss with the answer attached, and
     *    the session stops; the refusal that follows and the close mismatch as well. */
    plm_session *s = open_session(c, NULL);
    plm_result *r = cell(s, "python", "1", &e);
    ok(e);
    session_id_from_wire(&tap, s, id, sizeof id);
    result_lacks_id("result", r, id);
    plm_result_free(r);
    arm("{\"mode\":\"break_chain\",\"rpc\":\"SessionRun\",\"value\":\"5\"}");
    assert_null(cell(s, "python", "2", &e));
    assert_int_equal(e->code, PLM_DATA_LOSS);
    error_lacks_id(e, id);
    plm_cell cl = {"python", "3", NULL, 0};
    e = plm_session_run_cell(s, &cl, NULL, never_result, NULL);
    assert_int_equal(e->code, PLM_FAILED_PRECONDITION);
    error_lacks_id(e, id);
    session_accessors_lack_id(s, id);
    fault_reset(&proxy);
    plm_close_summary *sum = NULL;
    e = plm_session_close_sync(s, &sum); /* the daemon counts 2 calls, this client 1 */
    assert_int_equal(e->code, PLM_DATA_LOSS);
    error_lacks_id(e, id);
    plm_session_free(s);

    /* 2. An unanswered record naming another provider, and a cancelled exchange. */
    s = tapped_session(c, id, sizeof id);
    arm("{\"mode\":\"unanswered\",\"rpc\":\"SessionRun\",\"value\":\"liar\"}");
    assert_null(cell(s, "python", "2", &e));
    assert_int_equal(e->code, PLM_DATA_LOSS);
    error_lacks_id(e, id);
    close_untampered(s);

    s = tapped_session(c, id, sizeof id);
    arm("{\"mode\":\"stall_headers\",\"rpc\":\"SessionRun\"}");
    plm_cancel *k = plm_cancel_new();
    plm_run_options o = {.cancel = k};
    box b = {0};
    ok(plm_session_run_cell(s, &cl, &o, box_cb, &b));
    ev_timer tm;
    ev_timer_init(&tm, fire_cb, 0.05, 0.);
    tm.data = k;
    ev_timer_start(plm_client_loop(c), &tm);
    while (!b.done)
        ev_run(plm_client_loop(c), EVRUN_ONCE);
    assert_int_equal(b.err->code, PLM_CANCELED);
    error_lacks_id(b.err, id);
    plm_cancel_free(k);
    close_untampered(s);

    /* 3. A session the daemon ended (expired), then a close of it: its reason and detail. */
    s = tapped_session(c, id, sizeof id);
    end_all_sessions();
    assert_null(cell(s, "python", "2", &e));
    assert_int_equal(e->session_ended, PLM_END_EXPIRED);
    error_lacks_id(e, id);
    ok(plm_session_close_sync(s, &sum));
    lacks_id("close summary", sum->session, id);
    lacks_id("close summary", sum->last_record_sha256, id);
    plm_close_summary_free(sum);
    session_accessors_lack_id(s, id);
    /* ...and a call after the close (refused here or by the daemon). */
    assert_null(cell(s, "python", "3", &e));
    error_lacks_id(e, id);
    plm_session_free(s);
    plm_client_free(c);
    wiretap_stop(&tap);
}

static void test_W24_keep_alive_one_connection_for_sequential_calls(void **state)
{
    assert_int_equal(wiretap_relay(&tap, wiretap_port_of(daemon_proc.url)), 0);
    plm_client *c = client_at(tap.url, daemon_proc.token, 0);
    for (int i = 0; i < 3; i++) {
        plm_info *info = NULL;
        ok(plm_describe_sync(c, &info));
        plm_info_free(info);
        plm_error *e = NULL;
        plm_result *r = run_js(c, "1", NULL, &e);
        ok(e);
        plm_result_free(r);
    }
    plm_session *s = open_session(c, NULL);
    plm_error *e = NULL;
    plm_result *r = cell(s, "python", "1", &e);
    ok(e);
    plm_result_free(r);
    close_expect(s, 1, PLM_END_CLOSED);
    plm_session_free(s);
    char *sent = wiretap_sent(&tap);
    int requests = 0;
    for (const char *p = strstr(sent, "POST /"); p; p = strstr(p + 1, "POST /"))
        requests++;
    free(sent);
    assert_int_equal(requests, 9);
    if (wiretap_connections(&tap) != 1)
        fail_msg("%d sequential calls used %d TCP connections", requests, wiretap_connections(&tap));
    /* A second client has its own connection. */
    plm_client *c2 = client_at(tap.url, daemon_proc.token, 0);
    plm_info *info = NULL;
    ok(plm_describe_sync(c2, &info));
    plm_info_free(info);
    assert_int_equal(wiretap_connections(&tap), 2);
    plm_client_free(c2);
    plm_client_free(c);
    wiretap_stop(&tap);
}

int main(void)
{
    plm_global_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_W33_describe_states_protocol_provider_and_sessions, reset_proxy),
        cmocka_unit_test_setup(test_W01_bearer_token_is_required_by_this_daemon, reset_proxy),
        cmocka_unit_test_setup(test_R01_single_run_verified_end_to_end, reset_proxy),
        cmocka_unit_test_setup(test_loopback_daemon_is_never_reached_through_a_proxy, reset_proxy),
        cmocka_unit_test_setup(test_E18_floor_above_tier_refused_before_dispatch, reset_proxy),
        cmocka_unit_test_setup(test_R09_missing_record_is_data_loss, reset_proxy),
        cmocka_unit_test_setup(test_R11_result_digest_field_tampered_is_data_loss, reset_proxy),
        cmocka_unit_test_setup(test_R12_changed_output_byte_is_data_loss_with_result, reset_proxy),
        cmocka_unit_test_setup(test_R13_isolation_differing_from_record_is_data_loss, reset_proxy),
        cmocka_unit_test_setup(test_R15_record_digest_mismatch_is_data_loss, reset_proxy),
        cmocka_unit_test_setup(test_R16_single_run_with_session_fields_is_data_loss, reset_proxy),
        cmocka_unit_test_setup(test_R17_two_results_is_data_loss, reset_proxy),
        cmocka_unit_test_setup(test_R18_result_of_another_kind_is_data_loss, reset_proxy),
        cmocka_unit_test_setup(test_R19_E21_result_below_floor_is_data_loss_with_mapped_result, reset_proxy),
        cmocka_unit_test_setup(test_R20_E16_malformed_answer_is_data_loss, reset_proxy),
        cmocka_unit_test_setup(test_E04_code_from_status_when_body_has_none, reset_proxy),
        cmocka_unit_test_setup(test_E01_E05_error_bodies_of_any_shape_give_a_code_and_no_mark, reset_proxy),
        cmocka_unit_test_setup(test_E06_answer_without_request_id_is_data_loss_not_bound, reset_proxy),
        cmocka_unit_test_setup(test_E07_replayed_success_is_not_bound_although_it_really_ran, reset_proxy),
        cmocka_unit_test_setup(test_E08_E09_unbound_error_keeps_only_code_and_message, reset_proxy),
        cmocka_unit_test_setup(test_E02_E10_header_mark_on_bound_error_without_detail, reset_proxy),
        cmocka_unit_test_setup(test_E10_daemon_body_cap_refusal_is_marked_request, reset_proxy),
        cmocka_unit_test_setup(test_E11_unknown_procedure_404_with_header_is_unimplemented_unsupported, reset_proxy),
        cmocka_unit_test_setup(test_W08_no_headers_within_deadline_is_deadline_exceeded, reset_proxy),
        cmocka_unit_test_setup(test_W09_half_body_then_stall_is_deadline_exceeded, reset_proxy),
        cmocka_unit_test_setup(test_W10_cancel_during_exchange_is_canceled_unmarked, reset_proxy),
        cmocka_unit_test_setup(test_W12_redirect_is_unknown_and_not_followed, reset_proxy),
        cmocka_unit_test_setup(test_W13_connection_refused_is_unavailable_marked_environment, reset_proxy),
        cmocka_unit_test_setup(test_W14_https_to_cleartext_listener_is_marked_environment, reset_proxy),
        cmocka_unit_test_setup(test_W15_self_signed_certificate_is_marked_environment, reset_proxy),
        cmocka_unit_test_setup(test_W16_connection_reset_after_sending_is_unavailable_unmarked, reset_proxy),
        cmocka_unit_test_setup(test_W18_answer_cut_mid_body_is_unavailable_unmarked, reset_proxy),
        cmocka_unit_test_setup(test_W20_answer_over_32_MiB_is_resource_exhausted, reset_proxy),
        cmocka_unit_test_setup(test_W21_W22_body_that_is_not_a_json_object_is_internal, reset_proxy),
        cmocka_unit_test_setup(test_S05_S12_S24_two_snippets_chain_and_close, reset_proxy),
        cmocka_unit_test_setup(test_S06_cells_share_the_chain_with_snippets, reset_proxy),
        cmocka_unit_test_setup(test_S07_unknown_cell_language_refused_session_usable, reset_proxy),
        cmocka_unit_test_setup(test_S08_session_floor_carried_on_every_call, reset_proxy),
        cmocka_unit_test_setup(test_S09_concurrent_calls_are_serialized_in_order, reset_proxy),
        cmocka_unit_test_setup_teardown(test_connections_are_kept_across_bursts_of_calls, reset_proxy, stop_tap),
        cmocka_unit_test_setup(test_S10_session_ending_during_a_call_is_reported, reset_proxy),
        cmocka_unit_test_setup(test_S11_broken_chain_is_data_loss_and_stops_the_session, reset_proxy),
        cmocka_unit_test_setup(test_S13_E23_call_on_ended_session_refused_with_reason, reset_proxy),
        cmocka_unit_test_setup(test_S16_unchecked_failure_stops_session_and_nothing_more_is_sent, reset_proxy),
        cmocka_unit_test_setup(test_S17_refused_call_leaves_session_usable, reset_proxy),
        cmocka_unit_test_setup(test_S26_deadline_cell_result, reset_proxy),
        cmocka_unit_test_setup(test_S18_R21_unanswered_call_with_checking_record_advances_chain, reset_proxy),
        cmocka_unit_test_setup(test_S19_lying_unanswered_record_stops_the_session, reset_proxy),
        cmocka_unit_test_setup(test_S20_queued_call_cancelled_before_sending, reset_proxy),
        cmocka_unit_test_setup(test_S21_ill_formed_text_in_session_call_refused_session_usable, reset_proxy),
        cmocka_unit_test_setup(test_S04_session_freed_with_call_in_flight_reports_canceled, reset_proxy),
        cmocka_unit_test_setup(test_S22_close_is_memoized_one_close_sent, reset_proxy),
        cmocka_unit_test_setup(test_S23_close_refused_not_dispatched_clears_memo, reset_proxy),
        cmocka_unit_test_setup(test_S25_close_count_mismatch_is_data_loss_with_summary, reset_proxy),
        cmocka_unit_test_setup(test_S03_open_with_wrong_fingerprint_closes_then_fails, reset_proxy),
        cmocka_unit_test_setup(test_S03_open_below_floor_is_data_loss, reset_proxy),
        cmocka_unit_test_setup(test_W02_each_request_carries_a_fresh_id, reset_proxy),
        cmocka_unit_test_setup(test_W17_refusal_reported_after_cancel_is_canceled, reset_proxy),
        cmocka_unit_test_setup(test_W17_refusal_reported_after_the_deadline_is_deadline_exceeded, reset_proxy),
        cmocka_unit_test_setup(test_W24_a_call_whose_answer_was_lost_is_not_sent_again, reset_proxy),
        cmocka_unit_test_setup(test_W27_lifetime_and_idle_are_passed_capped_or_omitted, reset_proxy),
        cmocka_unit_test_setup(test_W28_grant_sent_only_when_configured_and_never_on_cells, reset_proxy),
        cmocka_unit_test_setup(test_W29_trace_id_is_not_validated_by_the_client, reset_proxy),
        cmocka_unit_test_setup(test_W32_describe_maps_absent_fields_and_filters_languages, reset_proxy),
        cmocka_unit_test_setup(test_R10_record_version_must_be_2_under_protocol_3, reset_proxy),
        cmocka_unit_test_setup(test_R14_environment_and_software_must_match_the_answer, reset_proxy),
        cmocka_unit_test_setup(test_E19_E26_open_on_a_daemon_without_sessions_is_unsupported, reset_proxy),
        cmocka_unit_test_setup(test_E24_replaced_session_is_refused_with_its_reason, reset_proxy),
        cmocka_unit_test_setup(test_S15_unlisted_end_name_reads_as_unknown_never_open, reset_proxy),
        cmocka_unit_test_setup(test_E22_guest_failure_is_a_result_not_an_error, reset_proxy),
        cmocka_unit_test_setup_teardown(test_W04_trailing_slashes_stripped_against_the_daemon, reset_proxy, stop_tap),
        cmocka_unit_test_setup_teardown(test_S04_session_id_never_leaks_into_errors_or_results, reset_proxy, stop_tap),
        cmocka_unit_test_setup_teardown(test_W24_keep_alive_one_connection_for_sequential_calls, reset_proxy, stop_tap),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

/*
 * test_client_local.c — client behaviour that needs no daemon: construction rules and
 * every refusal made before sending (nothing may leave the process, so these run
 * against a port where nothing listens and would fail differently if anything did).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cmocka.h>

#include "internal.h"
#include "wiretap.h"

static wiretap tap; /* global, so a failed test's teardown stops its threads */

static int stop_tap(void **state)
{
    wiretap_stop(&tap);
    return 0;
}

static plm_error *make(const char *url, bool insecure, int64_t timeout, plm_client **c)
{
    plm_client_options o;
    plm_client_options_init(&o);
    o.base_url = url;
    o.insecure_http = insecure;
    if (timeout)
        o.request_timeout_ms = timeout;
    return plm_client_new(NULL, &o, c);
}

static void expect_refused(const char *url, bool insecure, const char *needle)
{
    plm_client *c = NULL;
    plm_error *e = make(url, insecure, 0, &c);
    if (!e)
        fail_msg("%s was accepted", url);
    assert_null(c);
    assert_int_equal(e->code, PLM_INVALID_ARGUMENT);
    assert_int_equal(e->not_dispatched, PLM_REFUSAL_NONE);
    if (needle && !strstr(e->message, needle))
        fail_msg("message for %s lacks \"%s\": %s", url, needle, e->message);
    plm_error_free(e);
}

static void expect_accepted(const char *url, bool insecure)
{
    plm_client *c = NULL;
    plm_error *e = make(url, insecure, 0, &c);
    if (e)
        fail_msg("%s refused: %s", url, e->message);
    plm_client_free(c);
}

static void test_W03_base_url_must_be_absolute_http_or_https(void **state)
{
    expect_refused("", false, "required");
    expect_refused(NULL, false, "required");
    expect_refused(" http://localhost:1", false, "whitespace");
    expect_refused("http://localhost:1 ", false, "whitespace");
    expect_refused("localhost:8080/x", false, NULL);
    expect_refused("/relative/path", false, "absolute");
    expect_refused("ftp://localhost/", false, "http or https");
}

static void test_W04_userinfo_query_fragment_refused(void **state)
{
    expect_refused("http://user:pw@localhost:1", false, "userinfo");
    expect_refused("http://user@localhost:1", false, "userinfo");
    expect_refused("http://localhost:1/?a=b", false, "query");
    expect_refused("http://localhost:1/#frag", false, "fragment");
    expect_refused("http://localhost:1/x?", false, "query");
}

static void test_W05_cleartext_needs_loopback_or_insecure_http(void **state)
{
    expect_refused("http://example.com", false, "insecureHttp");
    expect_refused("http://10.0.0.1:8080", false, "insecureHttp");
    expect_accepted("http://example.com", true);
    expect_accepted("https://example.com", false);
}

static void test_W06_loopback_is_exact(void **state)
{
    expect_accepted("http://127.0.0.2", false);
    expect_accepted("http://[::1]:9", false);
    expect_accepted("http://localhost", false);
    expect_accepted("http://127.0.0.1:8080/prefix/", false);
    expect_refused("http://127.evil.example", false, "insecureHttp");
    expect_refused("http://localhost.evil.example", false, "insecureHttp");
}

static void test_W07_request_timeout_bounds(void **state)
{
    const int64_t bad[] = {-1, 0, 2147483648LL};
    for (size_t i = 0; i < 3; i++) {
        plm_client *c = NULL;
        plm_client_options o;
        plm_client_options_init(&o);
        o.base_url = "http://localhost:1";
        o.request_timeout_ms = bad[i];
        plm_error *e = plm_client_new(NULL, &o, &c);
        assert_non_null(e);
        assert_int_equal(e->code, PLM_INVALID_ARGUMENT);
        assert_non_null(strstr(e->message, "requestTimeoutMs"));
        plm_error_free(e);
    }
    plm_client_options o;
    plm_client_options_init(&o);
    assert_int_equal(o.request_timeout_ms, 360000);
    plm_client *c = NULL;
    assert_null(make("http://localhost:1", false, 2147483647LL, &c));
    plm_client_free(c);
}

/* A client whose daemon does not exist: any request that did leave would come back
 * unavailable, so a refusal with the request mark proves nothing was sent. */
static plm_client *offline_client(void)
{
    plm_client *c = NULL;
    plm_error *e = make("http://127.0.0.1:1", false, 0, &c);
    assert_null(e);
    return c;
}

static void expect_request_refusal(plm_error *e, plm_code code, const char *needle)
{
    assert_non_null(e);
    assert_int_equal(e->code, code);
    assert_int_equal(e->not_dispatched, PLM_REFUSAL_REQUEST);
    if (needle && !strstr(e->message, needle))
        fail_msg("message lacks \"%s\": %s", needle, e->message);
    plm_error_free(e);
}

static void never(void *ud, plm_error *err, plm_result *r)
{
    fail_msg("a refused call must not call back");
}

static void never_session(void *ud, plm_error *err, plm_session *s)
{
    fail_msg("a refused open must not call back");
}

static void test_W11_cancelled_before_sending_is_marked_request(void **state)
{
    plm_client *c = offline_client();
    plm_cancel *k = plm_cancel_new();
    plm_cancel_fire(k);
    plm_run_options o = {.cancel = k};
    expect_request_refusal(plm_run_javascript(c, "1", &o, never, NULL), PLM_CANCELED, "nothing was sent");
    plm_session_options so = {.cancel = k};
    expect_request_refusal(plm_open_session(c, &so, never_session, NULL), PLM_CANCELED, NULL);
    plm_cancel_free(k);
    plm_client_free(c);
}

static void test_W23_ill_formed_utf8_refused_before_sending(void **state)
{
    plm_client *c = offline_client();
    expect_request_refusal(plm_run_javascript(c, "x = '\xed\xa0\x80'", NULL, never, NULL),
                           PLM_INVALID_ARGUMENT, "request.javascript.code");
    plm_file f = {"in.txt", "bad \xff"};
    plm_project p = {.files = &f, .n_files = 1};
    expect_request_refusal(plm_run_project(c, &p, NULL, never, NULL), PLM_INVALID_ARGUMENT,
                           "request.project.files[0].content");
    const char *steps[] = {"echo \xc0\xaf"};
    plm_project p2 = {.steps = steps, .n_steps = 1};
    expect_request_refusal(plm_run_project(c, &p2, NULL, never, NULL), PLM_INVALID_ARGUMENT,
                           "request.project.steps");
    plm_run_options o = {.trace_id = "t\xff"};
    expect_request_refusal(plm_run_javascript(c, "1", &o, never, NULL), PLM_INVALID_ARGUMENT,
                           "request.traceId");
    plm_client_free(c);
}

static void test_W30_software_rule_shape(void **state)
{
    plm_client *c = offline_client();
    const char *two[] = {"a", "b"};
    const char *dup[] = {"a", "a"};
    const char *badc[] = {"a b"};
    const char *empty[] = {""};
    const char *ok[] = {"oci-manifest:linux/amd64@sha256:ab"};
    char long_id[258];
    memset(long_id, 'a', 257);
    long_id[257] = '\0';
    const char *longs[] = {long_id};
    const char *many[33];
    char names[33][8];
    for (int i = 0; i < 33; i++) {
        snprintf(names[i], sizeof names[i], "id%d", i);
        many[i] = names[i];
    }
    plm_software_rule rules[] = {
        {"exact", two, 2}, {"exact", NULL, 0}, {"approved", NULL, 0}, {"approved", dup, 2},
        {"approved", badc, 1}, {"exact", empty, 1}, {"exact", longs, 1}, {"approved", many, 33},
        {"sometimes", ok, 1},
    };
    for (size_t i = 0; i < PLM_ARRAY_LEN(rules); i++) {
        plm_run_options o = {.software = &rules[i]};
        expect_request_refusal(plm_run_javascript(c, "1", &o, never, NULL), PLM_INVALID_ARGUMENT,
                               "software");
    }
    plm_client_free(c);
}

static void test_W31_rule_merge_intersects_in_session_order(void **state)
{
    json_t *s = json_pack("{s:s, s:[s,s,s]}", "mode", "approved", "identities", "c", "a", "b");
    json_t *call = json_pack("{s:s, s:[s,s]}", "mode", "approved", "identities", "b", "c");
    json_t *one = json_pack("{s:s, s:[s]}", "mode", "exact", "identities", "a");
    json_t *none = json_pack("{s:s, s:[s]}", "mode", "exact", "identities", "z");
    json_t *out = NULL;
    assert_null(plm_rule_merge(s, call, &out));
    json_t *want = json_pack("{s:s, s:[s,s]}", "mode", "approved", "identities", "c", "b");
    assert_true(json_equal(out, want));
    json_decref(out);
    json_decref(want);
    assert_null(plm_rule_merge(s, one, &out));
    assert_string_equal(json_string_value(json_object_get(out, "mode")), "exact");
    json_decref(out);
    plm_error *e = plm_rule_merge(s, none, &out);
    expect_request_refusal(e, PLM_INVALID_ARGUMENT, NULL);
    assert_null(out);
    json_decref(s);
    json_decref(call);
    json_decref(one);
    json_decref(none);
}

static void test_S01_open_session_refusals(void **state)
{
    plm_client *c = offline_client();
    const char *cobol[] = {"python", "cobol"};
    plm_session_options o = {.languages = cobol, .n_languages = 2};
    expect_request_refusal(plm_open_session(c, &o, never_session, NULL), PLM_INVALID_ARGUMENT, "cobol");
    plm_session_options o2 = {.owner = ""};
    expect_request_refusal(plm_open_session(c, &o2, never_session, NULL), PLM_INVALID_ARGUMENT, "owner");
    const char *dup[] = {"x", "x"};
    plm_software_rule r = {"approved", dup, 2};
    plm_session_options o3 = {.software = &r};
    expect_request_refusal(plm_open_session(c, &o3, never_session, NULL), PLM_INVALID_ARGUMENT, NULL);
    plm_session_options o4 = {.minimum_isolation = "bogus"};
    expect_request_refusal(plm_open_session(c, &o4, never_session, NULL), PLM_INVALID_ARGUMENT, "bogus");
    plm_client_free(c);
}

static void test_R02_encoder_refuses_ill_formed_text(void **state)
{
    plm_record r = {.version = 2, .request_sha256 = "a", .result_sha256 = "",
                    .provider = "p\xed\xb0\x80", .isolation = "", .environment = "", .policy = "",
                    .session = "", .previous_sha256 = "", .software_identity = "",
                    .software_rule_id = "", .unanswered = ""};
    plm_hex hex;
    plm_error *e = plm_record_digest(&r, hex);
    assert_non_null(e);
    assert_int_equal(e->code, PLM_DATA_LOSS);
    assert_string_equal(hex, "");
    plm_error_free(e);
}

static void test_R07_rule_allows(void **state)
{
    json_t *rule = json_pack("{s:s, s:[s,s]}", "mode", "approved", "identities", "a", "b");
    assert_true(plm_software_rule_allows(NULL, ""));
    assert_true(plm_software_rule_allows(NULL, "anything"));
    assert_true(plm_software_rule_allows(rule, "b"));
    assert_false(plm_software_rule_allows(rule, "c"));
    assert_false(plm_software_rule_allows(rule, ""));
    json_decref(rule);
}

static void test_R08_record_integers_are_strict(void **state)
{
    const char *bad[] = {
        "{\"startedUnixMs\": \"12x\"}", "{\"startedUnixMs\": {}}", "{\"sequence\": \"-1\"}",
        "{\"endedUnixMs\": 1.5}", "{\"endedUnixMs\": \"123456789012345678901\"}",
        "{\"startedUnixMs\": 9007199254740992}", "{\"version\": \"two\"}",
    };
    for (size_t i = 0; i < PLM_ARRAY_LEN(bad); i++) {
        json_t *j = json_loads(bad[i], 0, NULL);
        plm_error *e = NULL;
        plm_record *r = plm_record_from_json(j, &e);
        if (r)
            fail_msg("accepted %s", bad[i]);
        assert_non_null(e);
        assert_int_equal(e->code, PLM_DATA_LOSS);
        assert_non_null(strstr(e->message, "is not an integer"));
        plm_error_free(e);
        json_decref(j);
    }
    json_t *j = json_loads("{\"startedUnixMs\": \"-17\", \"sequence\": 9007199254740991}", 0, NULL);
    plm_error *e = NULL;
    plm_record *r = plm_record_from_json(j, &e);
    assert_non_null(r);
    assert_int_equal(r->started_unix_ms, -17);
    assert_int_equal(r->sequence, 9007199254740991ULL);
    plm_record_free(r);
    json_decref(j);
}

static void test_E14_session_end_names(void **state)
{
    struct { const char *json; plm_session_end want; } cases[] = {
        {"null", PLM_END_OPEN}, {"0", PLM_END_OPEN}, {"\"SESSION_END_UNSPECIFIED\"", PLM_END_OPEN},
        {"\"UNSPECIFIED\"", PLM_END_OPEN}, {"1", PLM_END_CLOSED}, {"\"SESSION_END_REPLACED\"", PLM_END_REPLACED},
        {"\"unclaimed\"", PLM_END_UNCLAIMED}, {"10", PLM_END_UNCLAIMED}, {"11", PLM_END_UNKNOWN},
        {"99", PLM_END_UNKNOWN}, {"-1", PLM_END_UNKNOWN}, {"\"HOST_LOST\"", PLM_END_UNKNOWN},
        {"\"OPEN\"", PLM_END_UNKNOWN}, {"\"UNKNOWN\"", PLM_END_UNKNOWN},
        {"\"SESSION_END_HOST_LOST\"", PLM_END_UNKNOWN},
    };
    for (size_t i = 0; i < PLM_ARRAY_LEN(cases); i++) {
        json_t *v = json_loads(cases[i].json, JSON_DECODE_ANY, NULL);
        if (plm_session_end_from_json(v) != cases[i].want)
            fail_msg("%s mapped to %s", cases[i].json, plm_session_end_name(plm_session_end_from_json(v)));
        json_decref(v);
    }
    assert_string_equal(plm_session_end_name(PLM_END_DISK_EXCEEDED), "disk_exceeded");
}

static void test_E17_tier_order(void **state)
{
    assert_true(plm_meets("vm", "kernel"));
    assert_true(plm_meets("kernel", "kernel"));
    assert_false(plm_meets("container", "kernel"));
    assert_false(plm_meets("none", "process"));
    assert_false(plm_meets("vm", "bogus"));
    assert_false(plm_meets("bogus", "process"));
    assert_true(plm_meets("process", NULL));
    assert_false(plm_meets("bogus", NULL));
}

static void test_S02_owner_digest_is_keyed_by_token(void **state)
{
    plm_hex a, b, c;
    plm_owner_digest("tok", "alice", a);
    plm_owner_digest("tok", "bob", b);
    plm_owner_digest("other", "alice", c);
    assert_int_equal(strlen(a), 64);
    assert_string_not_equal(a, b);
    assert_string_not_equal(a, c);
    /* HMAC-SHA256(SHA256("plimsoll session owner key v2\n"), "plimsoll session owner v2\nalice"),
     * computed independently with Python's hmac module. */
    plm_owner_digest(NULL, "alice", a);
    assert_string_equal(a, "893e9e7c37114f87487e47bf9a841ee603c6af6e40b894911a4cd1aab667d30e");
}

static void test_W34_lossy_text(void **state)
{
    char *t = plm_utf8_lossy((const unsigned char *)"a\xff" "b\xe2\x82", 5, NULL);
    assert_string_equal(t, "a\xef\xbf\xbd" "b\xef\xbf\xbd");
    free(t);
    unsigned char *out;
    size_t n;
    assert_int_equal(plm_base64_decode("NDIK", 4, &out, &n), 0);
    assert_int_equal(n, 3);
    assert_memory_equal(out, "42\n", 3);
    free(out);
    assert_int_equal(plm_base64_decode("_-8", 3, &out, &n), 0); /* URL-safe, unpadded */
    assert_int_equal(n, 2);
    assert_int_equal(out[0], 0xff);
    assert_int_equal(out[1], 0xef);
    free(out);
    assert_int_equal(plm_base64_decode("a$==", 4, &out, &n), -1);
}

/* A stream's text is its bytes themselves when they are well-formed UTF-8 (no copy of
 * the output), and a lossy copy of its own otherwise; plm_result_free frees each once
 * (memcheck runs this in check-valgrind). */
static void test_W34_result_text_is_the_bytes_when_well_formed_else_a_lossy_copy(void **state)
{
    (void)state;
    json_error_t je;
    json_t *resp = json_loads(
        "{\"sandbox\": \"s\", \"isolation\": \"container\", \"softwareIdentity\": \"x\","
        " \"environment\": \"\", \"durationMs\": \"1\", \"cell\": {\"exitCode\": 0,"
        " \"timedOut\": false, \"stdout\": \"aMOpCg==\", \"stderr\": \"Yf9i\","
        " \"stdoutTruncated\": false, \"stderrTruncated\": false}}", 0, &je);
    assert_non_null(resp);
    plm_result *r = NULL;
    plm_error *e = plm_map_result(resp, NULL, &r);
    assert_null(e);
    assert_non_null(r);
    assert_string_equal(r->stdout_text, "h\xc3\xa9\n");          /* "hé\n": well-formed */
    assert_ptr_equal(r->stdout_text, (char *)r->stdout_bytes.data);
    assert_string_equal(r->stderr_text, "a\xef\xbf\xbd" "b");    /* "a\xff" "b": U+FFFD */
    assert_ptr_not_equal(r->stderr_text, (char *)r->stderr_bytes.data);
    assert_int_equal(r->stderr_bytes.len, 3);
    assert_int_equal(r->stderr_bytes.data[1], 0xff);               /* the bytes untouched */
    plm_result_free(r);
    json_decref(resp);
}

/* The decoder reads 32 characters at a time where the CPU can: every length around
 * the block edges decodes what OpenSSL encoded, in both alphabets, padded or not, and
 * one character outside both alphabets anywhere (inside a block or in the tail) makes
 * the whole text not base64. */
static void test_W34_base64_decode_agrees_with_openssl_at_every_length_and_rejects_junk_anywhere(void **state)
{
    enum { MAX = 700 };
    unsigned char raw[MAX];
    for (size_t i = 0; i < MAX; i++)
        raw[i] = (unsigned char)(i * 131 + 7 + (i >> 3));
    for (size_t len = 0; len < MAX; len++) {
        char *b64 = plm_base64_encode(raw, len, true);
        size_t tn = strlen(b64);
        for (int form = 0; form < 3; form++) {
            char *t = strdup(b64);
            size_t n = tn;
            if (form >= 1)                          /* unpadded */
                while (n > 0 && t[n - 1] == '=')
                    t[--n] = '\0';
            for (size_t i = 0; form == 2 && i < n; i++)  /* URL-safe */
                t[i] = t[i] == '+' ? '-' : t[i] == '/' ? '_' : t[i];
            unsigned char *out;
            size_t got;
            assert_int_equal(plm_base64_decode(t, n, &out, &got), 0);
            assert_int_equal(got, len);
            assert_memory_equal(out, raw, len);
            assert_int_equal(out[got], 0);
            free(out);
            free(t);
        }
        free(b64);
    }
    /* 3 * 64 bytes: 256 characters, blocks and a tail */
    char *b64 = plm_base64_encode(raw, 192, true);
    static const char junk[] = {' ', '\n', '=', '.', '*', '@', '[', '`', '{', '\x80', '\xff', '\0', ':'};
    for (size_t pos = 0; pos < 256; pos++) {
        for (size_t j = 0; j < sizeof junk; j++) {
            char t[257];
            memcpy(t, b64, 257);
            if (junk[j] == '=' && pos >= 254)
                continue;                           /* that is padding */
            t[pos] = junk[j];
            unsigned char *out = (unsigned char *)"untouched";
            size_t got = 1;
            if (plm_base64_decode(t, 256, &out, &got) != -1)
                fail_msg("junk 0x%02x at %zu decoded", (unsigned char)junk[j], pos);
            assert_null(out);
        }
    }
    free(b64);
}

static void test_W25_W26_envelope_order_and_timeout_clamping(void **state)
{
    struct { int64_t in; json_int_t want; } cases[] = {
        {0, 0}, {-5, 0}, {1, 1}, {30000, 30000}, {2147483647LL, 2147483647LL},
        {2147483648LL, 2147483647LL}, {INT64_MAX, 2147483647LL},
    };
    for (size_t i = 0; i < PLM_ARRAY_LEN(cases); i++) {
        json_t *req = json_object();
        plm_run_options o = {.timeout_ms = cases[i].in, .trace_id = "t-1"};
        const char *ids[] = {"a"};
        plm_software_rule r = {"exact", ids, 1};
        json_t *rule = NULL;
        assert_null(plm_rule_to_json(&r, &rule));
        assert_null(plm_envelope(req, &o, "container", rule));
        const json_t *t = json_object_get(req, "timeoutMs");
        if (cases[i].want == 0)
            assert_null(t); /* omitted, and digested as 0 */
        else
            assert_int_equal(json_integer_value(t), cases[i].want);
        /* protocol first, then the floor, the trace id, the timeout and the rule */
        const char *key;
        json_t *v;
        const char *order[] = {"protocol", "minimumIsolation", "traceId", "timeoutMs", "softwareRule"};
        size_t k = 0;
        json_object_foreach(req, key, v) {
            while (k < 5 && strcmp(order[k], key) != 0)
                k++;
            if (k == 5)
                fail_msg("key %s out of order", key);
        }
        assert_int_equal(json_integer_value(json_object_get(req, "protocol")), 3);
        json_decref(req);
    }
}

static void test_E03_refusal_reasons_all_mark_not_dispatched(void **state)
{
    /* NotDispatched{reason: n} for n = 0..8, as field 1 varint, base64 without padding. */
    static const char *values[] = {"", "CAE", "CAI", "CAM", "CAQ", "CAU", "CAY", "CAc", "CAg"};
    static const plm_refusal want[] = {
        PLM_REFUSAL_UNKNOWN, PLM_REFUSAL_REQUEST, PLM_REFUSAL_PERMISSION, PLM_REFUSAL_PROTOCOL,
        PLM_REFUSAL_UNSUPPORTED, PLM_REFUSAL_ISOLATION, PLM_REFUSAL_CAPACITY,
        PLM_REFUSAL_ENVIRONMENT, PLM_REFUSAL_UNKNOWN,
    };
    for (size_t i = 0; i < PLM_ARRAY_LEN(values); i++) {
        json_t *d = json_pack("[{s:s, s:s}]", "type", "plimsoll.v1.NotDispatched", "value", values[i]);
        plm_details det;
        plm_details_parse(d, &det);
        assert_true(det.has_not_dispatched);
        assert_int_equal(det.reason, want[i]);
        plm_details_clear(&det);
        json_decref(d);
    }
    assert_string_equal(plm_refusal_name(PLM_REFUSAL_CAPACITY), "capacity");
    assert_null(plm_refusal_name(PLM_REFUSAL_NONE));
}

static void test_E12_E15_session_ended_and_unanswered_details_decode(void **state)
{
    /* SessionEnded{CLOSED, "the session has ended"} from docs/wire.md §6.2. */
    json_t *d = json_pack("[{s:s, s:s}]", "type", "plimsoll.v1.SessionEnded", "value",
                          "CAESFXRoZSBzZXNzaW9uIGhhcyBlbmRlZA");
    plm_details det;
    plm_details_parse(d, &det);
    assert_true(det.has_session_ended);
    assert_int_equal(det.end, PLM_END_CLOSED);
    assert_string_equal(det.end_detail, "the session has ended");
    assert_false(det.has_not_dispatched);
    plm_details_clear(&det);
    json_decref(d);
    /* reason 0 and 42 read as ended-for-an-unknown-reason; 2 as expired (E15) */
    struct { const char *v; plm_session_end want; } ends[] = {{"CAA", PLM_END_UNKNOWN},
                                                              {"CCo", PLM_END_UNKNOWN},
                                                              {"CAI", PLM_END_EXPIRED}};
    for (size_t i = 0; i < 3; i++) {
        d = json_pack("[{s:s, s:s}]", "type", "plimsoll.v1.SessionEnded", "value", ends[i].v);
        plm_details_parse(d, &det);
        assert_int_equal(det.end, ends[i].want);
        plm_details_clear(&det);
        json_decref(d);
    }
    /* UnansweredCall: field 1 = RunRecord{1: 3, 2: "ab", 5: "container", 11: 7}, with an
     * unknown fixed32 field (tag 0x7d) and an unknown fixed64 field (0x79) skipped. */
    static const unsigned char rec[] = {0x08, 0x03, 0x12, 0x02, 'a', 'b', 0x2a, 0x09, 'c', 'o',
                                        'n', 't', 'a', 'i', 'n', 'e', 'r', 0x58, 0x07, 0x7d, 1, 2, 3,
                                        4, 0x79, 1, 2, 3, 4, 5, 6, 7, 8};
    unsigned char msg[64];
    msg[0] = 0x0a;
    msg[1] = sizeof rec;
    memcpy(msg + 2, rec, sizeof rec);
    char *b64 = plm_base64_encode(msg, sizeof rec + 2, false);
    d = json_pack("[{s:s, s:s}]", "type", "plimsoll.v1.UnansweredCall", "value", b64);
    plm_details_parse(d, &det);
    assert_non_null(det.unanswered);
    assert_int_equal(det.unanswered->version, 3);
    assert_string_equal(det.unanswered->request_sha256, "ab");
    assert_string_equal(det.unanswered->isolation, "container");
    assert_int_equal(det.unanswered->sequence, 7);
    assert_string_equal(det.unanswered->provider, "");
    plm_details_clear(&det);
    json_decref(d);
    free(b64);
}

static void test_E13_undecodable_detail_states_nothing(void **state)
{
    static const char *bad[] = {"!!!", "CA", "/w", "CP////////////////8B", "EgVhYg"};
    for (size_t i = 0; i < PLM_ARRAY_LEN(bad); i++) {
        json_t *d = json_pack("[{s:s, s:s}, {s:s, s:s}]", "type", "plimsoll.v1.NotDispatched",
                              "value", bad[i], "type", "plimsoll.v1.UnansweredCall", "value", bad[i]);
        plm_details det;
        plm_details_parse(d, &det);
        /* "EgVhYg" is a well-formed message with only an unknown field: it decodes. */
        if (i < 4)
            assert_false(det.has_not_dispatched);
        assert_null(det.unanswered);
        plm_details_clear(&det);
        json_decref(d);
    }
    /* A detail whose string is not UTF-8 does not decode either. */
    static const unsigned char se[] = {0x08, 0x02, 0x12, 0x01, 0xff};
    char *b64 = plm_base64_encode(se, sizeof se, false);
    json_t *d = json_pack("[{s:s, s:s}]", "type", "plimsoll.v1.SessionEnded", "value", b64);
    plm_details det;
    plm_details_parse(d, &det);
    assert_false(det.has_session_ended);
    plm_details_clear(&det);
    json_decref(d);
    free(b64);
}

/* ---------------------------------------------------------------- the wire, seen from a local listener */

/* The header block of the first request in `req` (up to the blank line). */
static const char *head_end(const char *req)
{
    const char *e = strstr(req, "\r\n\r\n");
    assert_non_null(e);
    return e + 2;
}

/* How many header lines named `name` the first request carries; the last value in out. */
static int header_count(const char *req, const char *name, char *out, size_t cap)
{
    const char *end = head_end(req);
    size_t nl = strlen(name);
    int n = 0;
    for (const char *line = strstr(req, "\r\n"); line && line + 2 < end; line = strstr(line, "\r\n")) {
        line += 2;
        if (strncasecmp(line, name, nl) == 0 && line[nl] == ':') {
            n++;
            const char *v = line + nl + 1;
            while (*v == ' ')
                v++;
            size_t vl = (size_t)(strstr(v, "\r\n") - v);
            if (out) {
                snprintf(out, cap, "%.*s", (int)(vl < cap ? vl : cap - 1), v);
            }
        }
    }
    return n;
}

static void expect_header(const char *req, const char *name, const char *value)
{
    char v[256] = "";
    int n = header_count(req, name, v, sizeof v);
    if (n != 1)
        fail_msg("%d %s headers in:\n%s", n, name, req);
    if (value && strcmp(v, value) != 0)
        fail_msg("%s is \"%s\", not \"%s\"", name, v, value);
}

static plm_client *client_for(const char *url, const char *token)
{
    plm_client_options o;
    plm_client_options_init(&o);
    o.base_url = url;
    o.token = token;
    plm_client *c = NULL;
    plm_error *e = plm_client_new(NULL, &o, &c);
    if (e)
        fail_msg("client for %s: %s", url, e->message);
    return c;
}

static void describe_ok(plm_client *c)
{
    plm_info *info = NULL;
    plm_error *e = plm_describe_sync(c, &info);
    if (e)
        fail_msg("Describe failed [%s]: %s", plm_code_name(e->code), e->message);
    plm_info_free(info);
}

static void test_W01_exact_method_path_and_headers_bearer_only_with_a_token(void **state)
{
    assert_int_equal(wiretap_canned(&tap, 200, NULL, "{}", true), 0);
    const char *tokens[] = {NULL, "", "s3cret-token"};
    for (size_t i = 0; i < PLM_ARRAY_LEN(tokens); i++) {
        wiretap_clear(&tap);
        plm_client *c = client_for(tap.url, tokens[i]);
        describe_ok(c);
        plm_error *e = NULL;
        plm_result *r = NULL;
        e = plm_run_javascript_sync(c, "1", NULL, &r); /* {} holds no record: data_loss */
        assert_null(r);
        assert_non_null(e);
        plm_error_free(e);
        plm_client_free(c);
        char *sent = wiretap_sent(&tap);
        const char *second = strstr(sent + 1, "POST ");
        assert_non_null(second);
        const char *reqs[] = {sent, second};
        const char *lines[] = {"POST /plimsoll.v1.SandboxService/Describe HTTP/1.1\r\n",
                               "POST /plimsoll.v1.SandboxService/Run HTTP/1.1\r\n"};
        for (int k = 0; k < 2; k++) {
            const char *req = reqs[k];
            if (strncmp(req, lines[k], strlen(lines[k])) != 0)
                fail_msg("request line: %.80s", req);
            expect_header(req, "Content-Type", "application/json");
            expect_header(req, "Connect-Protocol-Version", "1");
            char id[128] = "";
            assert_int_equal(header_count(req, "Plimsoll-Request-Id", id, sizeof id), 1);
            assert_int_equal(strlen(id), 32);
            assert_int_equal(strspn(id, "0123456789abcdef"), 32);
            if (tokens[i] && *tokens[i])
                expect_header(req, "Authorization", "Bearer s3cret-token");
            else if (header_count(req, "Authorization", NULL, 0) != 0)
                fail_msg("an Authorization header with token %s:\n%s",
                         tokens[i] ? "\"\"" : "NULL", req);
        }
        /* Describe sends {} (W32) */
        const char *body = strstr(sent, "\r\n\r\n") + 4;
        assert_int_equal(strncmp(body, "{}", 2), 0);
        free(sent);
    }
    wiretap_stop(&tap);
}

static void test_W04_trailing_slashes_of_an_accepted_url_are_stripped(void **state)
{
    assert_int_equal(wiretap_canned(&tap, 200, NULL, "{}", true), 0);
    struct { const char *suffix, *path; } cases[] = {
        {"/", "/plimsoll.v1.SandboxService/Describe"},
        {"///", "/plimsoll.v1.SandboxService/Describe"},
        {"/prefix//", "/prefix/plimsoll.v1.SandboxService/Describe"},
        {"/a/b/", "/a/b/plimsoll.v1.SandboxService/Describe"},
    };
    for (size_t i = 0; i < PLM_ARRAY_LEN(cases); i++) {
        wiretap_clear(&tap);
        char url[128], line[160];
        snprintf(url, sizeof url, "%s%s", tap.url, cases[i].suffix);
        plm_client *c = client_for(url, NULL);
        describe_ok(c);
        plm_client_free(c);
        char *sent = wiretap_sent(&tap);
        snprintf(line, sizeof line, "POST %s HTTP/1.1\r\n", cases[i].path);
        if (strncmp(sent, line, strlen(line)) != 0)
            fail_msg("base %s sent: %.100s", url, sent);
        free(sent);
    }
    wiretap_stop(&tap);
}

static void test_W21_empty_body_reads_as_empty_object_and_non_json_as_no_body(void **state)
{
    assert_int_equal(wiretap_canned(&tap, 200, NULL, "", true), 0);
    plm_client *c = client_for(tap.url, NULL);
    /* An empty 2xx body is {}: Describe maps it to zero values (not "not a JSON message"). */
    plm_info *info = NULL;
    plm_error *e = plm_describe_sync(c, &info);
    if (e)
        fail_msg("empty Describe answer failed [%s]: %s", plm_code_name(e->code), e->message);
    assert_int_equal(info->protocol, 0);
    assert_string_equal(info->sandbox, "");
    assert_false(info->supports_sessions);
    plm_info_free(info);
    /* ...and a Run answered {} has no record: data_loss, not internal. */
    plm_result *r = NULL;
    e = plm_run_javascript_sync(c, "1", NULL, &r);
    assert_null(r);
    assert_non_null(e);
    assert_int_equal(e->code, PLM_DATA_LOSS);
    assert_int_equal(e->not_dispatched, PLM_REFUSAL_NONE);
    assert_false(e->answer_not_bound);
    assert_non_null(strstr(e->message, "no run record"));
    plm_error_free(e);
    /* A non-JSON error body is no body: the code comes from the status, the message is
     * "HTTP <status>", even when the text looks like a Connect error cut short. */
    struct { int status; const char *body; plm_code want; } bad[] = {
        {503, "<html>Service Unavailable</html>", PLM_UNAVAILABLE},
        {429, "{\"code\":\"permission_denied\",\"message\":\"cut", PLM_UNAVAILABLE},
        {404, "not found", PLM_UNIMPLEMENTED},
        {400, "{\"code\":", PLM_INTERNAL},
        {500, "}", PLM_UNKNOWN},
    };
    for (size_t i = 0; i < PLM_ARRAY_LEN(bad); i++) {
        wiretap_set_answer(&tap, bad[i].status, NULL, bad[i].body, true);
        e = plm_run_javascript_sync(c, "1", NULL, &r);
        assert_null(r);
        assert_non_null(e);
        char msg[64];
        snprintf(msg, sizeof msg, "HTTP %d", bad[i].status);
        if (e->code != bad[i].want || !strstr(e->message, msg))
            fail_msg("%d %s gave %s: %s", bad[i].status, bad[i].body, plm_code_name(e->code),
                     e->message);
        assert_int_equal(e->not_dispatched, PLM_REFUSAL_NONE);
        assert_false(e->answer_not_bound);
        plm_error_free(e);
    }
    /* No body still lets a bound header mark the refusal (E10). */
    wiretap_set_answer(&tap, 400, "Plimsoll-Not-Dispatched: request\r\n", "not json", true);
    e = plm_run_javascript_sync(c, "1", NULL, &r);
    assert_non_null(e);
    assert_int_equal(e->code, PLM_INTERNAL);
    assert_int_equal(e->not_dispatched, PLM_REFUSAL_REQUEST);
    plm_error_free(e);
    plm_client_free(c);
    wiretap_stop(&tap);
}

/* ---------------------------------------------------------------- argument validation */

static void never_info(void *ud, plm_error *err, plm_info *i)
{
    fail_msg("a refused Describe must not call back");
}

static void never_close(void *ud, plm_error *err, plm_close_summary *s)
{
    fail_msg("a refused close must not call back");
}

/* An error for bad arguments: invalid_argument, and marked request for an operation
 * (nothing was sent), never marked for construction. */
static void expect_bad_args(const char *what, plm_error *e, plm_refusal mark)
{
    if (!e)
        fail_msg("%s: accepted", what);
    if (e->code != PLM_INVALID_ARGUMENT || e->not_dispatched != mark || !e->message || !*e->message)
        fail_msg("%s: %s/%d: %s", what, plm_code_name(e->code), (int)e->not_dispatched,
                 e->message ? e->message : "(no message)");
    plm_error_free(e);
}

static void test_API_null_and_invalid_arguments_are_invalid_argument(void **state)
{
    plm_client *c = offline_client();
    plm_client *cnull = NULL;
    plm_client_options o;
    plm_client_options_init(&o);
    o.base_url = "http://127.0.0.1:1";
    plm_info *info = (plm_info *)1;
    plm_result *res = (plm_result *)1;
    plm_session *sess = (plm_session *)1;
    plm_close_summary *sum = (plm_close_summary *)1;
    plm_cell py = {"python", "1", NULL, 0};
    /* (A NULL string inside a list reads as "", by design; a NULL list with a count is
     * a bad argument.) */
    plm_project nofiles = {.files = NULL, .n_files = 2};
    plm_project nosteps = {.steps = NULL, .n_steps = 1};
    plm_project noartifacts = {.artifacts = NULL, .n_artifacts = 1};
    plm_software_rule nomode = {NULL, NULL, 0};
    plm_software_rule noids = {"exact", NULL, 1};
    plm_run_options badrule = {.software = &nomode}, badrule2 = {.software = &noids};
    plm_run_options badfloor = {.minimum_isolation = "moon"};
    plm_session_options nolangs = {.languages = NULL, .n_languages = 2};
    plm_session_options sbadrule = {.software = &noids};
    const plm_run_options *no_opts = NULL;
    const plm_refusal R = PLM_REFUSAL_REQUEST, N = PLM_REFUSAL_NONE;

    struct { const char *what; plm_error *e; plm_refusal mark; } cases[] = {
        {"client_new(NULL options)", plm_client_new(NULL, NULL, &cnull), N},
        {"client_new(NULL out)", plm_client_new(NULL, &o, NULL), N},
        {"describe(NULL client)", plm_describe(NULL, NULL, never_info, NULL), R},
        {"describe(NULL cb)", plm_describe(c, NULL, NULL, NULL), R},
        {"run_javascript(NULL client)", plm_run_javascript(NULL, "1", no_opts, never, NULL), R},
        {"run_javascript(NULL code)", plm_run_javascript(c, NULL, no_opts, never, NULL), R},
        {"run_javascript(NULL cb)", plm_run_javascript(c, "1", no_opts, NULL, NULL), R},
        {"run_javascript(rule without mode)", plm_run_javascript(c, "1", &badrule, never, NULL), R},
        {"run_javascript(rule without identities)", plm_run_javascript(c, "1", &badrule2, never, NULL), R},
        {"run_javascript(bad floor)", plm_run_javascript(c, "1", &badfloor, never, NULL), R},
        {"run_project(NULL client)", plm_run_project(NULL, &nofiles, no_opts, never, NULL), R},
        {"run_project(NULL project)", plm_run_project(c, NULL, no_opts, never, NULL), R},
        {"run_project(NULL cb)", plm_run_project(c, &nofiles, no_opts, NULL, NULL), R},
        {"run_project(NULL files, n 2)", plm_run_project(c, &nofiles, no_opts, never, NULL), R},
        {"run_project(NULL steps, n 1)", plm_run_project(c, &nosteps, no_opts, never, NULL), R},
        {"run_project(NULL artifacts, n 1)", plm_run_project(c, &noartifacts, no_opts, never, NULL), R},
        {"open_session(NULL client)", plm_open_session(NULL, NULL, never_session, NULL), R},
        {"open_session(NULL cb)", plm_open_session(c, NULL, NULL, NULL), R},
        {"open_session(NULL languages, n 2)", plm_open_session(c, &nolangs, never_session, NULL), R},
        {"open_session(bad rule)", plm_open_session(c, &sbadrule, never_session, NULL), R},
        {"session_run_cell(NULL session)", plm_session_run_cell(NULL, &py, NULL, never, NULL), R},
        {"session_run_javascript(NULL session)", plm_session_run_javascript(NULL, "1", NULL, never, NULL), R},
        {"session_run_project(NULL session)", plm_session_run_project(NULL, &nofiles, NULL, never, NULL), R},
        {"session_close(NULL session)", plm_session_close(NULL, NULL, never_close, NULL), R},
        {"describe_sync(NULL client)", plm_describe_sync(NULL, &info), R},
        {"describe_sync(NULL out)", plm_describe_sync(c, NULL), R},
        {"run_javascript_sync(NULL client)", plm_run_javascript_sync(NULL, "1", NULL, &res), R},
        {"run_javascript_sync(NULL code)", plm_run_javascript_sync(c, NULL, NULL, &res), R},
        {"run_javascript_sync(NULL out)", plm_run_javascript_sync(c, "1", NULL, NULL), R},
        {"open_session_sync(NULL client)", plm_open_session_sync(NULL, NULL, &sess), R},
        {"open_session_sync(NULL out)", plm_open_session_sync(c, NULL, NULL), R},
        {"session_run_cell_sync(NULL session)", plm_session_run_cell_sync(NULL, &py, NULL, &res), R},
        {"session_run_cell_sync(NULL out)", plm_session_run_cell_sync(NULL, &py, NULL, NULL), R},
        {"session_run_javascript_sync(NULL session)", plm_session_run_javascript_sync(NULL, "1", NULL, &res), R},
        {"session_close_sync(NULL session)", plm_session_close_sync(NULL, &sum), R},
        {"session_close_sync(NULL out)", plm_session_close_sync(NULL, NULL), R},
    };
    for (size_t i = 0; i < PLM_ARRAY_LEN(cases); i++)
        expect_bad_args(cases[i].what, cases[i].e, cases[i].mark);
    assert_null(cnull);
    assert_null(info);
    assert_null(res);
    assert_null(sess);
    assert_null(sum);

    /* The digest helpers: a NULL value or output is an invalid argument too. */
    plm_hex hex;
    json_t *obj = json_object();
    plm_record rec = {.version = 2};
    struct { const char *what; plm_error *e; } digests[] = {
        {"request_digest(NULL request)", plm_request_digest(NULL, hex)},
        {"request_digest(NULL hex)", plm_request_digest(obj, NULL)},
        {"result_digest(NULL response)", plm_result_digest(NULL, hex)},
        {"result_digest(NULL hex)", plm_result_digest(obj, NULL)},
        {"record_digest(NULL record)", plm_record_digest(NULL, hex)},
        {"record_digest(NULL hex)", plm_record_digest(&rec, NULL)},
    };
    for (size_t i = 0; i < PLM_ARRAY_LEN(digests); i++)
        expect_bad_args(digests[i].what, digests[i].e, N);
    plm_error *err = (plm_error *)1;
    assert_null(plm_record_from_json(NULL, &err));
    expect_bad_args("record_from_json(NULL)", err, N);
    assert_null(plm_record_from_json(obj, NULL)); /* nowhere to say why: just NULL */
    json_decref(obj);

    /* Everything else takes NULL without crashing. */
    plm_client_options_init(NULL);
    plm_error_free(NULL);
    plm_record_free(NULL);
    plm_result_free(NULL);
    plm_info_free(NULL);
    plm_close_summary_free(NULL);
    plm_client_free(NULL);
    plm_session_free(NULL);
    plm_cancel_fire(NULL);
    plm_cancel_free(NULL);
    assert_false(plm_cancel_fired(NULL));
    assert_null(plm_client_loop(NULL));
    assert_null(plm_record_copy(NULL));
    assert_null(plm_record_to_json(NULL));
    plm_code code = PLM_OK;
    assert_false(plm_code_parse(NULL, &code));
    assert_false(plm_code_parse("internal", NULL));
    assert_string_equal(plm_code_name((plm_code)99), "unknown");
    assert_null(plm_refusal_name((plm_refusal)99));
    assert_int_equal(plm_session_end_from_json(NULL), PLM_END_OPEN);
    assert_string_equal(plm_session_end_name((plm_session_end)99), "unknown");
    plm_sha256_hex(NULL, 0, hex);
    assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    plm_sha256_hex("x", 1, NULL);
    plm_owner_digest(NULL, NULL, hex);
    assert_int_equal(strlen(hex), 64);
    plm_owner_digest("t", "o", NULL);
    char *id = plm_software_rule_id(NULL);
    assert_string_equal(id, "");
    free(id);
    assert_false(plm_meets(NULL, "process"));
    assert_true(plm_valid_floor(NULL));
    assert_null(plm_session_fingerprint(NULL));
    assert_null(plm_session_isolation(NULL));
    assert_null(plm_session_sandbox(NULL));
    assert_null(plm_session_software_identity(NULL));
    assert_null(plm_session_stopped(NULL));
    assert_int_equal(plm_session_expires_at_ms(NULL), 0);
    assert_int_equal(plm_session_idle_timeout_ms(NULL), 0);
    const char *detail = NULL;
    assert_int_equal(plm_session_ended(NULL, &detail), PLM_END_UNKNOWN);
    assert_string_equal(detail, "");
    uint64_t calls = 7;
    const char *last = "x";
    plm_session_chain(NULL, &calls, &last);
    assert_int_equal(calls, 0);
    assert_null(last);
    plm_client_free(c);
}

int main(void)
{
    plm_global_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_W03_base_url_must_be_absolute_http_or_https),
        cmocka_unit_test(test_W04_userinfo_query_fragment_refused),
        cmocka_unit_test(test_W05_cleartext_needs_loopback_or_insecure_http),
        cmocka_unit_test(test_W06_loopback_is_exact),
        cmocka_unit_test(test_W07_request_timeout_bounds),
        cmocka_unit_test(test_W11_cancelled_before_sending_is_marked_request),
        cmocka_unit_test(test_W23_ill_formed_utf8_refused_before_sending),
        cmocka_unit_test(test_W30_software_rule_shape),
        cmocka_unit_test(test_W31_rule_merge_intersects_in_session_order),
        cmocka_unit_test(test_S01_open_session_refusals),
        cmocka_unit_test(test_R02_encoder_refuses_ill_formed_text),
        cmocka_unit_test(test_R07_rule_allows),
        cmocka_unit_test(test_R08_record_integers_are_strict),
        cmocka_unit_test(test_E14_session_end_names),
        cmocka_unit_test(test_E17_tier_order),
        cmocka_unit_test(test_S02_owner_digest_is_keyed_by_token),
        cmocka_unit_test(test_W34_lossy_text),
        cmocka_unit_test(test_W34_result_text_is_the_bytes_when_well_formed_else_a_lossy_copy),
        cmocka_unit_test(test_W34_base64_decode_agrees_with_openssl_at_every_length_and_rejects_junk_anywhere),
        cmocka_unit_test(test_W25_W26_envelope_order_and_timeout_clamping),
        cmocka_unit_test(test_E03_refusal_reasons_all_mark_not_dispatched),
        cmocka_unit_test(test_E12_E15_session_ended_and_unanswered_details_decode),
        cmocka_unit_test(test_E13_undecodable_detail_states_nothing),
        cmocka_unit_test_teardown(test_W01_exact_method_path_and_headers_bearer_only_with_a_token, stop_tap),
        cmocka_unit_test_teardown(test_W04_trailing_slashes_of_an_accepted_url_are_stripped, stop_tap),
        cmocka_unit_test_teardown(test_W21_empty_body_reads_as_empty_object_and_non_json_as_no_body, stop_tap),
        cmocka_unit_test(test_API_null_and_invalid_arguments_are_invalid_argument),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

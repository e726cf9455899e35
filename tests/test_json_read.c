/*
 * test_json_read.c — the client's JSON reader and writer against jansson's own.
 *
 * lib/json_read.cc parses answers with simdjson and lib/json_write.c writes requests;
 * both promise jansson's behaviour (docs/wire.md §4): the reader accepts exactly what
 * json_loadb(JSON_ALLOW_NUL | JSON_DECODE_ANY) accepts and gives equal values, the
 * writer gives json_dumps(JSON_COMPACT | JSON_ENCODE_ANY)'s bytes.  Each case here is
 * put to both and the answers compared; tests/fuzz/fuzz_json.c does the same with
 * arbitrary bytes.
 */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "internal.h"

/* The text with the reader's padding after it, as the transport gives it. */
static json_t *read_padded(plm_json_reader *r, const char *text, size_t len, int flags)
{
    char *buf = malloc(len + 1 + PLM_JSON_PADDING);
    assert_non_null(buf);
    memcpy(buf, text, len);
    memset(buf + len, 0, 1 + PLM_JSON_PADDING);
    json_t *v = plm_json_read(r, buf, len, flags);
    free(buf);
    return v;
}

/* Both readers on one text: both refuse it, or both take it to equal values. */
static void same_as_jansson(plm_json_reader *r, const char *text, size_t len, int flags)
{
    size_t jflags = JSON_ALLOW_NUL | JSON_DECODE_ANY |
                    (flags & PLM_JSON_REJECT_DUPLICATES ? JSON_REJECT_DUPLICATES : 0);
    json_t *want = json_loadb(text, len, jflags, NULL);
    json_t *got = read_padded(r, text, len, flags);
    if (!want != !got || (want && !json_equal(want, got))) {
        char *w = want ? json_dumps(want, JSON_ENCODE_ANY) : NULL;
        char *g = got ? json_dumps(got, JSON_ENCODE_ANY) : NULL;
        print_error("text %.80s: jansson %s, json_read %s\n", text, w ? w : "refuses",
                    g ? g : "refuses");
        free(w);
        free(g);
        fail();
    }
    /* a real and an integer of equal value are json_equal: the type must match too */
    if (want && json_typeof(want) != json_typeof(got))
        fail_msg("text %.80s: jansson type %d, json_read type %d", text, json_typeof(want),
                 json_typeof(got));
    json_decref(want);
    json_decref(got);
}

static const char *const texts[] = {
    "{}", "[]", "0", "-0", "1", "-1", "\"\"", "\"a\"", "true", "false", "null",
    " {\"a\" : [1, 2.5, \"x\", null, true, false, {}] } ",
    /* numbers at the edges of json_int_t, and reals */
    "9223372036854775807", "-9223372036854775808", "9223372036854775808",
    "18446744073709551615", "18446744073709551616", "-9223372036854775809",
    "123456789012345678901234567890", "1.0", "-0.0", "1e2", "1E+2", "1e-2", "1.5e-400",
    "1e400", "-1e400", "100000000000000000000.0", "0.1", "2.2250738585072014e-308",
    "01", "1.", ".5", "+1", "-", "1e", "0x10", "NaN", "Infinity",
    /* strings: escapes, surrogates, control characters, U+0000 */
    "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"", "\"\\u00e9\\u20AC\"", "\"\\ud83d\\ude00\"",
    "\"\\ud800\"", "\"\\udc00\"", "\"\\ud800\\u0041\"", "\"\\ud800x\"", "\"\\u0000x\"",
    "\"\\u00\"", "\"\\x\"", "\"\t\"", "\"a\x01\"", "\"\x7f\"", "\"unterminated",
    /* UTF-8: well-formed, overlong, surrogates, past U+10FFFF, cut short */
    "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"",
    "\"\xf4\x90\x80\x80\"", "\"\xe2\x82\"", "\"\xff\"", "\xef\xbb\xbf{}",
    /* keys: duplicates, U+0000, escapes */
    "{\"a\":1,\"a\":2}", "{\"\\u0000\":1}", "{\"a\\u0000b\":1}", "{\"\\u00e9\":{\"\":[]}}",
    /* structure */
    "[1,]", "{\"a\":1,}", "{\"a\"}", "{1:2}", "[1 2]", "{\"a\":1} x", "{\"a\":1}   ",
    "", "   ", "nul", "truex", "[", "]", "{\"a\":[}", "\"a\" \"b\"",
};

static void test_W21_simdjson_reads_what_jansson_reads(void **state)
{
    (void)state;
    plm_json_reader *r = plm_json_reader_new();
    assert_non_null(r);
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        same_as_jansson(r, texts[i], strlen(texts[i]), 0);
        same_as_jansson(r, texts[i], strlen(texts[i]), PLM_JSON_REJECT_DUPLICATES);
    }
    /* U+0000 inside the text itself (not escaped) is a control character */
    same_as_jansson(r, "\"a\0b\"", 5, 0);
    /* ...and is never JSON: jansson takes it right after a number or a literal, the
     * reader does not (docs/wire.md §4) */
    static const struct { const char *text; size_t len; } nul_after[] = {
        {"1\0", 2}, {"[1\0]", 4}, {"true\0", 5}, {"{\"a\":1\0}", 8}};
    for (size_t i = 0; i < sizeof nul_after / sizeof *nul_after; i++) {
        json_t *v = json_loadb(nul_after[i].text, nul_after[i].len, JSON_ALLOW_NUL | JSON_DECODE_ANY,
                               NULL);
        assert_non_null(v); /* (if jansson mends this, the case has no point left) */
        json_decref(v);
        assert_null(read_padded(r, nul_after[i].text, nul_after[i].len, 0));
    }
    plm_json_reader_free(r);
}

/* jansson takes 2048 levels of nesting and no more. */
static void test_W21_nesting_depth_is_janssons(void **state)
{
    (void)state;
    plm_json_reader *r = plm_json_reader_new();
    for (size_t depth = 2046; depth <= 2050; depth++) {
        char *text = malloc(2 * depth + 1);
        memset(text, '[', depth);
        memset(text + depth, ']', depth);
        text[2 * depth] = '\0';
        same_as_jansson(r, text, 2 * depth, 0);
        free(text);
    }
    plm_json_reader_free(r);
}

/* Answers of every size, one reader for all: a base64 stdout as sandboxd sends it.
 * Past 4 MiB a text is read with buffers of its own; the reader's serve the next. */
static void test_W21_large_answers_read_as_jansson_reads_them(void **state)
{
    (void)state;
    plm_json_reader *r = plm_json_reader_new();
    size_t sizes[] = {0, 1, 100, 4095, 65536, 300 * 1024, 2 << 20, 5 << 20, 1000};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        size_t n = sizes[i];
        unsigned char *raw = malloc(n + 1);
        for (size_t k = 0; k < n; k++)
            raw[k] = (unsigned char)(k * 7 + i);
        char *b64 = plm_base64_encode(raw, n, true);
        char *text = plm_printf("{\"sandbox\":\"echo\",\"cell\":{\"stdout\":\"%s\","
                                "\"stderr\":\"\\u00e9\\n\"},\"record\":{\"sequence\":\"%zu\"}}",
                                b64, n);
        same_as_jansson(r, text, strlen(text), 0);
        free(raw);
        free(b64);
        free(text);
    }
    plm_json_reader_free(r);
}

static void same_text_as_jansson(const json_t *v)
{
    char *want = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    size_t len = 0;
    char *got = plm_json_write(v, &len);
    assert_non_null(want);
    assert_non_null(got);
    if (strcmp(want, got) != 0)
        fail_msg("json_dumps %.200s\nplm_json_write %.200s", want, got);
    assert_int_equal(len, strlen(want));
    free(want);
    free(got);
}

static void test_W01_request_body_is_json_dumps_byte_for_byte(void **state)
{
    (void)state;
    /* every value of every text jansson reads */
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        json_t *v = json_loadb(texts[i], strlen(texts[i]), JSON_ALLOW_NUL | JSON_DECODE_ANY, NULL);
        if (v)
            same_text_as_jansson(v);
        json_decref(v);
    }
    /* every byte that may stand in a string, alone and in runs across 16-byte blocks */
    char s[3 * 256];
    for (int c = 1; c < 128; c++) {
        for (size_t at = 0; at < 40; at += 13) {
            memset(s, 'x', sizeof s);
            s[at] = (char)c;
            s[at + 17] = (char)c;
            json_t *v = json_stringn(s, at + 33);
            assert_non_null(v);
            same_text_as_jansson(v);
            json_decref(v);
        }
    }
    json_t *nul = json_stringn("a\0b", 3);
    same_text_as_jansson(nul);
    json_decref(nul);
    /* a key holding U+0000 is written whole, as jansson writes it (json.encode makes
     * one from a Lua string) */
    json_t *nulkey = json_object();
    assert_int_equal(json_object_setn_new(nulkey, "k\0ey", 4, json_integer(1)), 0);
    assert_int_equal(json_object_setn_new(nulkey, "k", 1, json_integer(2)), 0);
    same_text_as_jansson(nulkey);
    json_decref(nulkey);
    /* a cell as session.c builds it: keys in the order they were put, reals and all */
    char *code = malloc(40000);
    for (size_t k = 0; k < 39999; k++)
        code[k] = "for i in range(3):\n\tprint(\"\\u00e9\", i) # é\r\n"[k % 44];
    code[39999] = '\0';
    json_t *req = json_pack("{s:i, s:s, s:s, s:{s:s, s:s, s:[{s:s, s:b}]}, s:f, s:n, s:I}",
                            "protocol", 3, "sessionId", "x", "minimumIsolation", "container",
                            "cell", "language", "python", "code", code, "files", "path",
                            "a\"b", "executable", 1, "ratio", 0.1, "none", "big",
                            (json_int_t)-9223372036854775807LL);
    assert_non_null(req);
    same_text_as_jansson(req);
    json_decref(req);
    free(code);
}

/* The writer's reals are json_dumps's (lib/json_write.c plm_json_put_real): every
 * power of ten from 1e-320 to 1e308 and its neighbours, both signs and both zeros, the
 * largest and smallest doubles, and finite doubles of pseudo-random bits. */
static void test_W01_reals_are_json_dumps_s(void **state)
{
    (void)state;
    for (int e = -320; e <= 308; e++) {
        char text[32];
        snprintf(text, sizeof text, "1e%d", e);
        double p = strtod(text, NULL);
        const double near[] = {p, -p, nextafter(p, 0), nextafter(p, INFINITY), p * 1.5, p / 3};
        for (size_t i = 0; i < sizeof near / sizeof *near; i++) {
            json_t *v = json_real(near[i]);
            same_text_as_jansson(v);
            json_decref(v);
        }
    }
    const double ends[] = {0.0, -0.0, DBL_MAX, -DBL_MAX, DBL_MIN, 5e-324, 0.1, 1e16, 1e17,
                           9007199254740993.0, 123456789.125, 1.0 / 3};
    for (size_t i = 0; i < sizeof ends / sizeof *ends; i++) {
        json_t *v = json_real(ends[i]);
        same_text_as_jansson(v);
        json_decref(v);
    }
    uint64_t x = 0x2545f4914f6cdd1du;          /* xorshift64 */
    for (int i = 0; i < 100000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        double d;
        memcpy(&d, &x, sizeof d);
        if (!isfinite(d))
            continue;
        json_t *v = json_real(d);
        same_text_as_jansson(v);
        json_decref(v);
    }
}

/* One real both ways (the writer's fast path, json_text.h): where it takes x, its text
 * is printf's "%.17g", byte for byte; and every x of its range it takes. */
static void same_real_as_printf(double x, bool in_range)
{
    char want[64], got[PLM_REAL_TEXT];
    size_t n = plm_real17_text(got, x);
    if (!n) {
        assert_false(in_range);
        return;
    }
    snprintf(want, sizeof want, "%.17g", x);
    assert_string_equal(got, want);
    assert_int_equal(n, strlen(want));
}

/* The fast path's range, 1e-4 <= |x| < 1e15: doubles spread evenly over the decades,
 * decimals of a few places (a timing in ms, a price), the neighbours of every power
 * of ten at its ends, and doubles of a few significant bits, whose decimal expansions
 * end early: among them the exact ties, which printf rounds to even (rounding them
 * away from zero fails here).  Outside the range it declines. */
static void test_W01_reals_of_everyday_scale_are_printf_s(void **state)
{
    (void)state;
    uint64_t r = 0x9e3779b97f4a7c15u;             /* xorshift64 */
    for (int i = 0; i < 100000; i++) {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        double v = pow(10.0, -4.0 + 19.0 * (double)(r >> 11) / 9007199254740992.0);
        bool in = v >= 1e-4 && v < 1e15;
        same_real_as_printf(v, in);
        same_real_as_printf(-v, in);
    }
    for (long m = 1; m < 100000; m++) {
        same_real_as_printf((double)m / 1000, true);
        same_real_as_printf((double)m / 1e6, (double)m / 1e6 >= 1e-4);
        same_real_as_printf((double)m / 7, true);
    }
    for (int e = -4; e <= 15; e++) {
        double p = pow(10.0, e), lo = p, hi = p;
        for (int k = 0; k < 40; k++) {
            lo = nextafter(lo, 0);
            hi = nextafter(hi, INFINITY);
            same_real_as_printf(lo, lo >= 1e-4 && lo < 1e15);
            same_real_as_printf(hi, hi >= 1e-4 && hi < 1e15);
        }
    }
    for (int e = -66; e < 50; e++)
        for (int m = 1; m < 1024; m++) {
            double v = ldexp(m, e);
            same_real_as_printf(v, v >= 1e-4 && v < 1e15);
        }
    const double outside[] = {0.0, -0.0, 9.9999999999999991e-5, 1e15, 1e300, 5e-324, NAN,
                              INFINITY, -INFINITY};
    char buf[PLM_REAL_TEXT];
    for (size_t i = 0; i < sizeof outside / sizeof *outside; i++)
        assert_int_equal(plm_real17_text(buf, outside[i]), 0);
}

/* One integer both ways: the text and its length are printf's. */
static void same_decimal_as_printf(uint64_t u)
{
    char want[32], got[PLM_INT_TEXT + 8];
    memset(got, '#', sizeof got);
    int n = snprintf(want, sizeof want, "%" PRIu64, u);
    assert_int_equal(plm_u64_text(got, u), (size_t)n);
    assert_string_equal(got, want);
    int64_t v = (int64_t)u;
    memset(got, '#', sizeof got);
    n = snprintf(want, sizeof want, "%" PRId64, v);
    assert_int_equal(plm_i64_text(got, v), (size_t)n);
    assert_string_equal(got, want);
    assert_true((size_t)n < PLM_INT_TEXT);
}

/* The writer's integers (and the digests' canonical ones, lib/digest.c) are printf's
 * decimal text: every power of ten and its neighbours, both ends of both ranges, and
 * pseudo-random values of every magnitude. */
static void test_W01_integers_are_printf_s_decimal_text(void **state)
{
    (void)state;
    uint64_t p = 1;
    for (int i = 0; i < 20; i++, p *= 10)
        for (int d = -2; d <= 2; d++)
            same_decimal_as_printf(p + (uint64_t)(int64_t)d);
    const uint64_t ends[] = {0, 1, 9, UINT64_MAX, UINT64_MAX - 1, (uint64_t)INT64_MAX,
                             (uint64_t)INT64_MIN, (uint64_t)INT64_MIN + 1};
    for (size_t i = 0; i < sizeof ends / sizeof *ends; i++)
        same_decimal_as_printf(ends[i]);
    uint64_t x = 0x9e3779b97f4a7c15u;          /* xorshift64 */
    for (int i = 0; i < 200000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        same_decimal_as_printf(x >> (x % 64));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_W21_simdjson_reads_what_jansson_reads),
        cmocka_unit_test(test_W21_nesting_depth_is_janssons),
        cmocka_unit_test(test_W21_large_answers_read_as_jansson_reads_them),
        cmocka_unit_test(test_W01_request_body_is_json_dumps_byte_for_byte),
        cmocka_unit_test(test_W01_integers_are_printf_s_decimal_text),
        cmocka_unit_test(test_W01_reals_are_json_dumps_s),
        cmocka_unit_test(test_W01_reals_of_everyday_scale_are_printf_s),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

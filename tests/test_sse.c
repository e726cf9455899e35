/*
 * test_sse.c — the server-sent events parser alone (runtime/models/sse.c): the line and
 * field rules of the event-stream format, and that any way of cutting the input into
 * pieces gives exactly the events of the whole.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "sse.h"

/* Events as JSON [{type, data, id}] (data kept byte for byte), for json_equal. */
typedef struct got {
  json_t *evs;
  int stop_at;                  /* return 7 from this event (1-based); 0: never */
} got;

static int collect(void *ud, const berth_sse_event *ev)
{
  got *g = ud;
  assert_int_equal(ev->data[ev->len], '\0');
  json_array_append_new(g->evs, json_pack("{s:s, s:o, s:s}", "type", ev->type, "data",
                                          json_stringn_nocheck(ev->data, ev->len), "id",
                                          ev->id));
  return g->stop_at && (int)json_array_size(g->evs) == g->stop_at ? 7 : 0;
}

/* Parses `in` cut at the given offsets (ascending); returns the events (new ref) and
 * whether the end discarded something. */
static json_t *parse_cut(const char *in, size_t n, const size_t *cuts, size_t ncuts,
                         bool *lost)
{
  berth_sse p;
  berth_sse_init(&p, 0);
  got g = {json_array(), 0};
  size_t at = 0;
  for (size_t i = 0; i <= ncuts; i++) {
    size_t end = i < ncuts ? cuts[i] : n;
    assert_int_equal(berth_sse_feed(&p, in + at, end - at, collect, &g), 0);
    at = end;
  }
  bool l = berth_sse_end(&p);
  if (lost)
    *lost = l;
  berth_sse_free(&p);
  return g.evs;
}

static json_t *parse(const char *in, size_t n)
{
  return parse_cut(in, n, NULL, 0, NULL);
}

static json_t *parse_bytewise(const char *in, size_t n)
{
  size_t *cuts = malloc((n + 1) * sizeof *cuts);
  for (size_t i = 0; i < n; i++)
    cuts[i] = i;
  json_t *evs = parse_cut(in, n, cuts, n, NULL);
  free(cuts);
  return evs;
}

/* The events of `in` (a C string) are exactly `want` (JSON text), whole, byte by
 * byte, and cut once at every offset. */
static void expect_events(const char *in, const char *want)
{
  size_t n = strlen(in);
  json_t *w = json_loads(want, 0, NULL);
  assert_non_null(w);
  json_t *whole = parse(in, n);
  if (!json_equal(whole, w)) {
    char *s = json_dumps(whole, JSON_COMPACT);
    fail_msg("events of %s: %s, want %s", in, s, want);
  }
  json_t *bytes = parse_bytewise(in, n);
  assert_true(json_equal(bytes, w));
  for (size_t c = 0; c <= n; c++) {
    json_t *one = parse_cut(in, n, &c, 1, NULL);
    if (!json_equal(one, w))
      fail_msg("cut at %zu of %s differs", c, in);
    json_decref(one);
  }
  json_decref(bytes);
  json_decref(whole);
  json_decref(w);
}

static void test_sse_data_event_basic(void **state)
{
  (void)state;
  expect_events("data: hello\n\n", "[{\"type\":\"message\",\"data\":\"hello\",\"id\":\"\"}]");
  expect_events("data: one\n\ndata: two\n\n",
                "[{\"type\":\"message\",\"data\":\"one\",\"id\":\"\"},"
                " {\"type\":\"message\",\"data\":\"two\",\"id\":\"\"}]");
}

static void test_sse_optional_single_space_after_colon(void **state)
{
  (void)state;
  expect_events("data:x\n\n", "[{\"type\":\"message\",\"data\":\"x\",\"id\":\"\"}]");
  expect_events("data:  x\n\n", "[{\"type\":\"message\",\"data\":\" x\",\"id\":\"\"}]");
  expect_events("data:\n\n", "[{\"type\":\"message\",\"data\":\"\",\"id\":\"\"}]");
  expect_events("data: \n\n", "[{\"type\":\"message\",\"data\":\"\",\"id\":\"\"}]");
  expect_events("data:x:y\n\n", "[{\"type\":\"message\",\"data\":\"x:y\",\"id\":\"\"}]");
}

static void test_sse_multiline_data_joined_with_newline(void **state)
{
  (void)state;
  expect_events("data: a\ndata: b\ndata:\ndata: c\n\n",
                "[{\"type\":\"message\",\"data\":\"a\\nb\\n\\nc\",\"id\":\"\"}]");
  /* a JSON object spread over data lines parses as one text */
  expect_events("data: {\"a\":\ndata: 1}\n\n",
                "[{\"type\":\"message\",\"data\":\"{\\\"a\\\":\\n1}\",\"id\":\"\"}]");
}

static void test_sse_line_ends_cr_lf_crlf_mixed(void **state)
{
  (void)state;
  const char *want = "[{\"type\":\"message\",\"data\":\"a\",\"id\":\"\"},"
                     " {\"type\":\"message\",\"data\":\"b\",\"id\":\"\"},"
                     " {\"type\":\"message\",\"data\":\"c\",\"id\":\"\"},"
                     " {\"type\":\"message\",\"data\":\"d\",\"id\":\"\"}]";
  expect_events("data: a\r\rdata: b\n\ndata: c\r\n\r\ndata: d\r\n\n", want);
  expect_events("data: a\r\n\r\ndata: b\r\n\r\ndata: c\r\n\r\ndata: d\r\n\r\n", want);
  expect_events("data: a\r\rdata: b\r\rdata: c\r\rdata: d\r\r", want);
  expect_events("data: x\r\ndata: y\rdata: z\n\r\n",
                "[{\"type\":\"message\",\"data\":\"x\\ny\\nz\",\"id\":\"\"}]");
}

/* A CR at the end of one piece and the LF at the start of the next are one line
 * end: treating the LF as a blank line would dispatch "a" alone. */
static void test_sse_crlf_split_between_pieces_is_one_line_end(void **state)
{
  (void)state;
  const char in[] = "data: a\r\ndata: b\r\n\r\n";
  size_t cut = 8;               /* right after the first CR */
  assert_int_equal(in[cut - 1], '\r');
  json_t *evs = parse_cut(in, sizeof in - 1, &cut, 1, NULL);
  assert_int_equal(json_array_size(evs), 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(evs, 0), "data")),
                      "a\nb");
  json_decref(evs);
}

static void test_sse_comments_ignored(void **state)
{
  (void)state;
  expect_events(": hi\ndata: x\n: inside an event\n\n",
                "[{\"type\":\"message\",\"data\":\"x\",\"id\":\"\"}]");
  expect_events(":\n\n: keep-alive\r\n\r\n", "[]");
  expect_events(":data: not data\n\n", "[]");
}

static void test_sse_event_id_and_retry_fields(void **state)
{
  (void)state;
  expect_events("event: update\nid: 7\ndata: x\n\ndata: y\n\n",
                "[{\"type\":\"update\",\"data\":\"x\",\"id\":\"7\"},"
                " {\"type\":\"message\",\"data\":\"y\",\"id\":\"7\"}]");
  /* the type resets after each dispatch and after a blank line without data */
  expect_events("event: lost\n\ndata: y\n\n",
                "[{\"type\":\"message\",\"data\":\"y\",\"id\":\"\"}]");
  expect_events("event:\ndata: y\n\n", "[{\"type\":\"message\",\"data\":\"y\",\"id\":\"\"}]");
  /* an id holding NUL is ignored; an empty id clears it */
  const char nul[] = "id: 1\ndata: a\n\nid: x\0y\ndata: b\n\nid\ndata: c\n\n";
  json_t *evs = parse(nul, sizeof nul - 1);
  json_t *want = json_loads("[{\"type\":\"message\",\"data\":\"a\",\"id\":\"1\"},"
                            " {\"type\":\"message\",\"data\":\"b\",\"id\":\"1\"},"
                            " {\"type\":\"message\",\"data\":\"c\",\"id\":\"\"}]", 0, NULL);
  assert_true(json_equal(evs, want));
  json_decref(evs);
  json_decref(want);

  berth_sse p;
  berth_sse_init(&p, 0);
  got g = {json_array(), 0};
  assert_int_equal(berth_sse_retry(&p), -1);
  const char *r = "retry: 1500\n\nretry: 15x\n\nretry:\n\nretry: -3\n\n";
  assert_int_equal(berth_sse_feed(&p, r, strlen(r), collect, &g), 0);
  assert_int_equal(berth_sse_retry(&p), 1500);
  assert_int_equal(json_array_size(g.evs), 0);
  json_decref(g.evs);
  berth_sse_free(&p);
}

static void test_sse_field_without_colon_has_empty_value(void **state)
{
  (void)state;
  expect_events("data\n\n", "[{\"type\":\"message\",\"data\":\"\",\"id\":\"\"}]");
  expect_events("data\ndata\n\n", "[{\"type\":\"message\",\"data\":\"\\n\",\"id\":\"\"}]");
}

static void test_sse_unknown_fields_ignored(void **state)
{
  (void)state;
  expect_events("foo: bar\ndata: x\nbaz\n\n",
                "[{\"type\":\"message\",\"data\":\"x\",\"id\":\"\"}]");
  expect_events("Data: x\n\n", "[]");        /* field names are case-sensitive */
  expect_events(" data: x\n\n", "[]");
}

static void test_sse_blank_lines_without_data_dispatch_nothing(void **state)
{
  (void)state;
  expect_events("\n\n\r\n\r\r", "[]");
  expect_events("id: 3\n\n", "[]");
}

static void test_sse_end_discards_an_unterminated_event(void **state)
{
  (void)state;
  const char *cases[] = {"data: x\n", "data: x", "data: x\r", "data: a\n\ndata: b"};
  const size_t events[] = {0, 0, 0, 1};
  for (int i = 0; i < 4; i++) {
    bool lost = false;
    json_t *evs = parse_cut(cases[i], strlen(cases[i]), NULL, 0, &lost);
    assert_int_equal(json_array_size(evs), events[i]);
    assert_true(lost);
    json_decref(evs);
  }
  bool lost = true;
  const char *ok = "data: x\n\n: bye\n";
  json_t *evs = parse_cut(ok, strlen(ok), NULL, 0, &lost);
  assert_int_equal(json_array_size(evs), 1);
  assert_false(lost);
  json_decref(evs);
}

static void test_sse_byte_order_mark_skipped_once(void **state)
{
  (void)state;
  expect_events("\xEF\xBB\xBF" "data: x\n\n",
                "[{\"type\":\"message\",\"data\":\"x\",\"id\":\"\"}]");
  /* only one: a second one is part of the field name, which is then unknown */
  expect_events("\xEF\xBB\xBF\xEF\xBB\xBF" "data: x\n\n", "[]");
  /* a partial mark is not a mark: its bytes start the first line */
  expect_events("\xEF\xBB" "data: x\n\ndata: y\n\n",
                "[{\"type\":\"message\",\"data\":\"y\",\"id\":\"\"}]");
  expect_events("\xEF\n" "data: y\n\n", "[{\"type\":\"message\",\"data\":\"y\",\"id\":\"\"}]");
  /* not at the start: data */
  expect_events("data: \xEF\xBB\xBFx\n\n",
                "[{\"type\":\"message\",\"data\":\"\xEF\xBB\xBFx\",\"id\":\"\"}]");
}

static void test_sse_utf8_split_across_pieces_reassembled(void **state)
{
  (void)state;
  expect_events("data: caf\xC3\xA9 \xF0\x9F\x9A\x80 \xE2\x9C\x93\n\n",
                "[{\"type\":\"message\",\"data\":\"caf\\u00e9 \\ud83d\\ude80 \\u2713\","
                "\"id\":\"\"}]");
}

/* A stream with every kind of line, cut into three pieces at every pair of offsets:
 * the events never change. */
static void test_sse_every_split_point_gives_the_same_events(void **state)
{
  (void)state;
  const char in[] = "\xEF\xBB\xBF: hello\r\nretry: 10\r\nevent: a\rdata: \xC3\xA9t\xC3\xA9\r\n"
                    "data:{\"k\":\r\n\r\nid: 9\ndata: [DONE]\n\n:\rdata\r\r";
  size_t n = sizeof in - 1;
  json_t *whole = parse(in, n);
  json_t *want = json_loads("[{\"type\":\"a\",\"data\":\"\\u00e9t\\u00e9\\n{\\\"k\\\":\","
                            "\"id\":\"\"}, {\"type\":\"message\",\"data\":\"[DONE]\",\"id\":\"9\"},"
                            " {\"type\":\"message\",\"data\":\"\",\"id\":\"9\"}]", 0, NULL);
  assert_true(json_equal(whole, want));
  for (size_t i = 0; i <= n; i++)
    for (size_t j = i; j <= n; j++) {
      size_t cuts[2] = {i, j};
      json_t *evs = parse_cut(in, n, cuts, 2, NULL);
      if (!json_equal(evs, whole))
        fail_msg("cut at %zu and %zu differs", i, j);
      json_decref(evs);
    }
  json_t *bytes = parse_bytewise(in, n);
  assert_true(json_equal(bytes, whole));
  json_decref(bytes);
  json_decref(whole);
  json_decref(want);
}

static void test_sse_nul_bytes_in_data_kept(void **state)
{
  (void)state;
  const char in[] = "data: a\0b\n\n";
  berth_sse p;
  berth_sse_init(&p, 0);
  got g = {json_array(), 0};
  assert_int_equal(berth_sse_feed(&p, in, sizeof in - 1, collect, &g), 0);
  assert_int_equal(json_array_size(g.evs), 1);
  const json_t *d = json_object_get(json_array_get(g.evs, 0), "data");
  assert_int_equal(json_string_length(d), 3);
  assert_memory_equal(json_string_value(d), "a\0b", 3);
  json_decref(g.evs);
  berth_sse_free(&p);
}

static void test_sse_too_large_line_or_event_refused(void **state)
{
  (void)state;
  const char *inputs[] = {"data: 0123456789abcdef\n\n",                 /* one line */
                          "data: 01234567\ndata: 01234567\ndata: 0123\n\n", /* the event */
                          ": 0123456789abcdefghij\n"};                   /* a comment too */
  for (int i = 0; i < 3; i++)
    for (int split = 0; split < 2; split++) {
      berth_sse p;
      berth_sse_init(&p, 16);
      got g = {json_array(), 0};
      size_t n = strlen(inputs[i]);
      int rc = 0;
      if (split)
        for (size_t k = 0; k < n && rc == 0; k++)
          rc = berth_sse_feed(&p, inputs[i] + k, 1, collect, &g);
      else
        rc = berth_sse_feed(&p, inputs[i], n, collect, &g);
      assert_int_equal(rc, BERTH_SSE_TOO_LARGE);
      assert_int_equal(json_array_size(g.evs), 0);
      json_decref(g.evs);
      berth_sse_free(&p);
    }
  /* at the limit is fine */
  berth_sse p;
  berth_sse_init(&p, 16);
  got g = {json_array(), 0};
  assert_int_equal(berth_sse_feed(&p, "data: 0123456789\n\n", 18, collect, &g), 0);
  assert_int_equal(json_array_size(g.evs), 1);
  json_decref(g.evs);
  berth_sse_free(&p);
}

static void test_sse_callback_stop_returns_its_value(void **state)
{
  (void)state;
  berth_sse p;
  berth_sse_init(&p, 0);
  got g = {json_array(), 1};
  const char *in = "data: a\n\ndata: b\n\n";
  assert_int_equal(berth_sse_feed(&p, in, strlen(in), collect, &g), 7);
  assert_int_equal(json_array_size(g.evs), 1);
  json_decref(g.evs);
  berth_sse_free(&p);
}

static void test_sse_done_marker_is_plain_data(void **state)
{
  (void)state;
  expect_events("data: [DONE]\n\n", "[{\"type\":\"message\",\"data\":\"[DONE]\",\"id\":\"\"}]");
}

int main(void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_sse_data_event_basic),
    cmocka_unit_test(test_sse_optional_single_space_after_colon),
    cmocka_unit_test(test_sse_multiline_data_joined_with_newline),
    cmocka_unit_test(test_sse_line_ends_cr_lf_crlf_mixed),
    cmocka_unit_test(test_sse_crlf_split_between_pieces_is_one_line_end),
    cmocka_unit_test(test_sse_comments_ignored),
    cmocka_unit_test(test_sse_event_id_and_retry_fields),
    cmocka_unit_test(test_sse_field_without_colon_has_empty_value),
    cmocka_unit_test(test_sse_unknown_fields_ignored),
    cmocka_unit_test(test_sse_blank_lines_without_data_dispatch_nothing),
    cmocka_unit_test(test_sse_end_discards_an_unterminated_event),
    cmocka_unit_test(test_sse_byte_order_mark_skipped_once),
    cmocka_unit_test(test_sse_utf8_split_across_pieces_reassembled),
    cmocka_unit_test(test_sse_every_split_point_gives_the_same_events),
    cmocka_unit_test(test_sse_nul_bytes_in_data_kept),
    cmocka_unit_test(test_sse_too_large_line_or_event_refused),
    cmocka_unit_test(test_sse_callback_stop_returns_its_value),
    cmocka_unit_test(test_sse_done_marker_is_plain_data),
  };
  return cmocka_run_group_tests_name("sse", tests, NULL, NULL);
}

/*
 * test_serve.c — `berth serve` end to end: the real binary, a real sandboxd (provider
 * echo: a cell answers "<language> <n>: <code>") behind tests/faultproxy.py (whose
 * counters say what the daemon really received), and HTTP from libcurl.
 *
 * The model is scripted with `template = true`: each turn runs one cell whose code is
 * the user's message, then says "ran: <message>"; so a message picks its own cell
 * (plimsoll-echo:sleep:MS holds a turn for MS ms).
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <jansson.h>

#include "berth.h"
#include "fault.h"
#include "flood.h"
#include "launch.h"
#include "sbxproc.h"
#include "servetest.h"

#define WAIT 20.0                /* seconds: a bound on each wait, never a sleep */

static const char script[] =
  "return { template = true, loop = true, turns = {\n"
  "  { user = '*', replies = {\n"
  "    { call = { code = '{{user}}' } },\n"
  "    { say = 'ran: {{user}}' } } } } }\n";

static sbx_proc sbxd;
static fault_proxy proxy;

static int group_setup(void **state)
{
  (void)state;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  if (sbx_start(&sbxd, NULL) != 0)
    return -1;
  return fault_start(&proxy, sbxd.url);
}

static int group_teardown(void **state)
{
  (void)state;
  fault_stop(&proxy);
  sbx_stop(&sbxd);
  curl_global_cleanup();
  return 0;
}

/* A server on the proxied daemon with extra options (NULL-terminated). */
static st_server *serve(const char *const *more)
{
  const char *args[32] = {"--daemon", proxy.url, "--daemon-token-file", sbxd.token_file};
  int n = 4;
  for (int i = 0; more && more[i]; i++)
    args[n++] = more[i];
  args[n] = NULL;
  st_server *s = calloc(1, sizeof *s);
  assert_int_equal(st_start(s, script, args), 0);
  return s;
}

static void stop(st_server *s, int want_status)
{
  int status = st_stop(s);
  if (status != want_status) {
    char *log = st_read_log(s);
    fprintf(stderr, "serve log:\n%s\n", log ? log : "");
    free(log);
  }
  assert_int_equal(status, want_status);
  free(s);
}

/* POST /v1/conversations → the new id (copied into id). */
static void create(st_server *s, int caller, const char *body, char id[40])
{
  json_t *j = NULL;
  long status = st_call_json("POST", st_url(s, "/v1/conversations"), s->token[caller], body, &j);
  assert_int_equal(status, 201);
  const char *v = json_string_value(json_object_get(j, "id"));
  assert_non_null(v);
  assert_int_equal(strlen(v), 32);
  snprintf(id, 40, "%s", v);
  json_decref(j);
}

/* One turn: POST …/messages, read the whole event stream. */
static json_t *turn(st_server *s, int caller, const char *id, const char *message,
                    long *status)
{
  json_t *body = json_pack("{s:s}", "content", message);
  char *text = json_dumps(body, JSON_COMPACT);
  json_decref(body);
  char *out = NULL;
  *status = st_call("POST", st_url(s, "/v1/conversations/%s/messages", id), s->token[caller],
                    text, &out);
  free(text);
  json_t *events = *status == 200 ? st_sse_parse(out, strlen(out)) : json_loads(out, 0, NULL);
  free(out);
  return events;
}

static const char *ev_name(const json_t *events, size_t i)
{
  return json_string_value(json_object_get(json_array_get(events, i), "event"));
}

static const json_t *ev_data(const json_t *events, size_t i)
{
  return json_object_get(json_array_get(events, i), "data");
}

/* The events' names joined by spaces (for one readable assertion). */
static char *names(const json_t *events)
{
  static char buf[512];
  buf[0] = '\0';
  for (size_t i = 0; i < json_array_size(events); i++) {
    if (i)
      strcat(buf, " ");
    strncat(buf, ev_name(events, i), 64);
  }
  return buf;
}

static const char *error_code(const json_t *body)
{
  return json_string_value(json_object_get(json_object_get(body, "error"), "code"));
}

/* {====================================================== the happy path */

static void test_create_message_delete(void **state)
{
  (void)state;
  st_server *s = serve(NULL);
  char id[40];
  create(s, 0, NULL, id);
  long status;
  json_t *ev = turn(s, 0, id, "x = 41", &status);
  assert_int_equal(status, 200);
  assert_string_equal(names(ev), "tool_call tool_result delta message turn_end");
  /* the call, then its result from the daemon, for this call */
  const json_t *call = ev_data(ev, 0);
  assert_string_equal(json_string_value(json_object_get(call, "name")), "executeCode");
  assert_string_equal(json_string_value(json_object_get(call, "arguments")),
                      "{\"code\":\"x = 41\"}");
  const json_t *res = ev_data(ev, 1);
  assert_string_equal(json_string_value(json_object_get(res, "id")),
                      json_string_value(json_object_get(call, "id")));
  const json_t *r = json_object_get(res, "result");
  assert_non_null(r);
  assert_string_equal(json_string_value(json_object_get(r, "stdout")), "python 1: x = 41");
  /* the daemon's provider is echo (its Describe says): the result says nothing ran */
  assert_true(json_is_true(json_object_get(res, "noCodeRan")));
  assert_true(json_is_true(json_object_get(r, "freshSandbox")));
  assert_int_equal(json_integer_value(json_object_get(r, "exitCode")), 0);
  assert_int_equal(strlen(json_string_value(json_object_get(r, "recordSha256"))), 64);
  assert_string_equal(json_string_value(json_object_get(ev_data(ev, 2), "text")),
                      "ran: x = 41");
  const json_t *end = ev_data(ev, 4);
  assert_true(json_is_true(json_object_get(end, "ok")));
  assert_int_equal(json_integer_value(json_object_get(end, "turn")), 1);
  assert_int_equal(json_integer_value(json_object_get(end, "cells")), 1);
  json_decref(ev);

  /* the second turn runs in the same sandbox: the daemon counts on */
  ev = turn(s, 0, id, "x + 1", &status);
  assert_int_equal(status, 200);
  r = json_object_get(ev_data(ev, 1), "result");
  assert_string_equal(json_string_value(json_object_get(r, "stdout")), "python 2: x + 1");
  assert_null(json_object_get(r, "freshSandbox"));
  json_decref(ev);

  json_t *j = NULL;
  assert_int_equal(st_call_json("GET", st_url(s, "/v1/conversations/%s", id), s->token[0], NULL,
                                &j), 200);
  assert_int_equal(json_integer_value(json_object_get(j, "turns")), 2);
  assert_true(json_is_false(json_object_get(j, "busy")));
  json_decref(j);

  long closes = fault_forwarded(&proxy, "CloseSession");
  assert_int_equal(st_call_json("DELETE", st_url(s, "/v1/conversations/%s", id), s->token[0],
                                NULL, &j), 200);
  assert_true(json_is_true(json_object_get(j, "completed")));
  json_decref(j);
  /* onComplete disposed the sandbox before the answer came */
  assert_int_equal(fault_forwarded(&proxy, "CloseSession"), closes + 1);
  /* and the conversation is gone */
  assert_int_equal(st_call_json("GET", st_url(s, "/v1/conversations/%s", id), s->token[0], NULL,
                                &j), 404);
  json_decref(j);
  ev = turn(s, 0, id, "1", &status);
  assert_int_equal(status, 404);
  json_decref(ev);
  stop(s, 0);
}

static bool all_done(void *ud)
{
  st_stream **v = ud;
  for (int i = 0; i < 2; i++)
    if (!v[i]->done)
      return false;
  return true;
}

/* With a user id and metadata; two messages at once on one conversation: the second
 * waits for the first, and both run in its one sandbox. */
static void test_user_and_queueing_in_one_conversation(void **state)
{
  (void)state;
  st_server *s = serve(NULL);
  char id[40];
  create(s, 1, "{\"userId\": \"alice\", \"metadata\": {\"npc\": \"guard\"}}", id);
  /* two messages at once on one conversation: the second waits for the first */
  CURLM *m = curl_multi_init();
  st_stream a, b;
  a.ud = b.ud = NULL;
  st_stream_start(&a, m, st_url(s, "/v1/conversations/%s/messages", id), s->token[1],
                  "{\"content\": \"plimsoll-echo:sleep:300\"}");
  st_stream_start(&b, m, st_url(s, "/v1/conversations/%s/messages", id), s->token[1],
                  "{\"content\": \"y = 2\"}");
  st_stream *both[2] = {&a, &b};
  assert_true(st_pump(m, all_done, both, WAIT));
  assert_int_equal(a.status, 200);
  assert_int_equal(b.status, 200);
  json_t *ea = st_stream_events(&a), *eb = st_stream_events(&b);
  assert_string_equal(names(ea), "tool_call tool_result delta message turn_end");
  assert_string_equal(names(eb), "tool_call tool_result delta message turn_end");
  /* in order, in one sandbox: the first turn ended before the second began */
  assert_int_equal(json_integer_value(json_object_get(ev_data(ea, 4), "turn")), 1);
  assert_int_equal(json_integer_value(json_object_get(ev_data(eb, 4), "turn")), 2);
  const json_t *rb = json_object_get(ev_data(eb, 1), "result");
  assert_string_equal(json_string_value(json_object_get(rb, "stdout")), "python 2: y = 2");
  /* and the second waited: its stream began before the first's request was sent,
   * and ended after that turn's 300 ms sleep.  (Not b.ended >= a.ended: both end in
   * one read of the client's, which may take b's end first.) */
  assert_true(b.ended - b.started >= 0.3);
  json_decref(ea);
  json_decref(eb);
  st_stream_free(&a, m);
  st_stream_free(&b, m);
  curl_multi_cleanup(m);
  stop(s, 0);
}

/* }====================================================== */

/* {====================================================== callers and bad input */

static void test_other_callers_conversation_is_404(void **state)
{
  (void)state;
  st_server *s = serve(NULL);
  char id[40];
  create(s, 0, NULL, id);
  char *unknown_body = NULL, *other_body = NULL;
  /* an id nobody has, and alice's id asked by bob: the same answer */
  assert_int_equal(st_call("GET", st_url(s, "/v1/conversations/%s", "0123456789abcdef0123456789abcdef"),
                           s->token[1], NULL, &unknown_body), 404);
  assert_int_equal(st_call("GET", st_url(s, "/v1/conversations/%s", id), s->token[1], NULL,
                           &other_body), 404);
  assert_string_equal(unknown_body, other_body);
  free(unknown_body);
  free(other_body);
  long status;
  json_t *ev = turn(s, 1, id, "stolen = 1", &status);
  assert_int_equal(status, 404);
  assert_string_equal(error_code(ev), "not_found");
  json_decref(ev);
  assert_int_equal(st_call("DELETE", st_url(s, "/v1/conversations/%s", id), s->token[1], NULL,
                           NULL), 404);
  /* nothing changed for alice: no turn ran, her conversation works */
  json_t *j = NULL;
  assert_int_equal(st_call_json("GET", st_url(s, "/v1/conversations/%s", id), s->token[0], NULL,
                                &j), 200);
  assert_int_equal(json_integer_value(json_object_get(j, "turns")), 0);
  json_decref(j);
  ev = turn(s, 0, id, "mine = 1", &status);
  assert_int_equal(status, 200);
  assert_string_equal(json_string_value(json_object_get(json_object_get(ev_data(ev, 1),
                                                                        "result"), "stdout")),
                      "python 1: mine = 1");
  json_decref(ev);
  stop(s, 0);
}

static void test_401_without_a_token(void **state)
{
  (void)state;
  st_server *s = serve(NULL);
  json_t *j = NULL;
  assert_int_equal(st_call_json("POST", st_url(s, "/v1/conversations"), NULL, NULL, &j), 401);
  assert_string_equal(error_code(j), "unauthenticated");
  json_decref(j);
  assert_int_equal(st_call("POST", st_url(s, "/v1/conversations"), "not-a-token", NULL, NULL), 401);
  assert_int_equal(st_call("GET", st_url(s, "/metrics"), NULL, NULL, NULL), 401);
  /* a token of the file, but not as a bearer token */
  CURL *e = curl_easy_init();
  char hdr[128];
  snprintf(hdr, sizeof hdr, "Authorization: Basic %s", s->token[0]);
  struct curl_slist *h = curl_slist_append(NULL, hdr);
  curl_easy_setopt(e, CURLOPT_URL, st_url(s, "/v1/conversations"));
  curl_easy_setopt(e, CURLOPT_POSTFIELDS, "");
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
  FILE *null = fopen("/dev/null", "w");
  curl_easy_setopt(e, CURLOPT_WRITEDATA, null);
  assert_int_equal(curl_easy_perform(e), CURLE_OK);
  long code = 0;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code);
  assert_int_equal(code, 401);
  fclose(null);
  curl_slist_free_all(h);
  curl_easy_cleanup(e);
  /* health needs no token */
  assert_int_equal(st_call_json("GET", st_url(s, "/healthz"), NULL, NULL, &j), 200);
  assert_string_equal(json_string_value(json_object_get(j, "status")), "ok");
  json_decref(j);
  /* and nothing was created */
  char *metrics = NULL;
  assert_int_equal(st_call("GET", st_url(s, "/metrics"), s->token[0], NULL, &metrics), 200);
  assert_non_null(strstr(metrics, "\nberth_conversations_opened_total 0\n"));
  free(metrics);
  stop(s, 0);
}

static void test_400_malformed_input_changes_nothing(void **state)
{
  (void)state;
  st_server *s = serve(NULL);
  static const char *const bad_create[] = {
    "{", "[]", "\"x\"", "{\"userId\": 5}", "{\"user\": \"a\"}", "{\"metadata\": []}",
    "{\"userId\": \"\"}", "{\"a\":1,\"a\":2}", NULL
  };
  for (int i = 0; bad_create[i]; i++) {
    json_t *j = NULL;
    long status = st_call_json("POST", st_url(s, "/v1/conversations"), s->token[0], bad_create[i],
                               &j);
    if (status != 400)
      fail_msg("create with %s: %ld", bad_create[i], status);
    assert_string_equal(error_code(j), "invalid_argument");
    assert_non_null(json_string_value(json_object_get(json_object_get(j, "error"), "message")));
    json_decref(j);
  }
  char id[40];
  create(s, 0, NULL, id);
  static const char *const bad_message[] = {
    "", "{", "{}", "{\"content\": 5}", "{\"content\": \"a\", \"more\": 1}",
    "{\"content\": \"a\\u0000b\"}", "[\"content\"]", NULL
  };
  for (int i = 0; bad_message[i]; i++) {
    json_t *j = NULL;
    long status = st_call_json("POST", st_url(s, "/v1/conversations/%s/messages", id),
                               s->token[0], bad_message[i], &j);
    if (status != 400)
      fail_msg("message %s: %ld", bad_message[i], status);
    assert_string_equal(error_code(j), "invalid_argument");
    json_decref(j);
  }
  /* a body that is not JSON by its type */
  assert_int_equal(st_call_type("POST", st_url(s, "/v1/conversations"), s->token[0], "a=b",
                                "application/x-www-form-urlencoded", NULL), 415);
  /* routes and methods */
  json_t *j = NULL;
  assert_int_equal(st_call_json("PUT", st_url(s, "/v1/conversations/%s", id), s->token[0], NULL,
                                &j), 405);
  assert_string_equal(error_code(j), "method_not_allowed");
  json_decref(j);
  assert_int_equal(st_call("DELETE", st_url(s, "/v1/conversations"), s->token[0], NULL, NULL),
                   405);
  assert_int_equal(st_call("GET", st_url(s, "/v2/nothing"), s->token[0], NULL, NULL), 404);
  assert_int_equal(st_call("GET", st_url(s, "/v1/conversations/%s/other", id), s->token[0], NULL,
                           NULL), 404);
  /* one conversation, no turn, no cell: the bad requests changed nothing */
  assert_int_equal(st_call_json("GET", st_url(s, "/v1/conversations/%s", id), s->token[0], NULL,
                                &j), 200);
  assert_int_equal(json_integer_value(json_object_get(j, "turns")), 0);
  json_decref(j);
  char *metrics = NULL;
  assert_int_equal(st_call("GET", st_url(s, "/metrics"), s->token[0], NULL, &metrics), 200);
  assert_non_null(strstr(metrics, "\nberth_conversations 1\n"));
  assert_non_null(strstr(metrics, "\nberth_conversations_opened_total 1\n"));
  assert_non_null(strstr(metrics, "\nberth_turns_started_total 0\n"));
  free(metrics);
  stop(s, 0);
}

/* A refusal's reason quotes what the caller sent (jansson's parse error, the name of an
 * unknown field cut to 64 bytes); ill-formed UTF-8 there once made the error body
 * unencodable, and the caller got a bare "{}" (found by tests/fuzz/fuzz_serve.c). */
static void test_400_reason_is_json_even_for_ill_formed_bytes(void **state)
{
  (void)state;
  st_server *s = serve(NULL);
  char cut[128];                /* 63 bytes, then a 2-byte character cut at byte 64 */
  snprintf(cut, sizeof cut, "{\"%.63s\xc3\xa9\": 1}",
           "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
  const char *const bodies[] = {"{\"us\\\xde\x87serId\": 1}", "{\"userId\": \xff}", cut,
                                NULL};
  for (int i = 0; bodies[i]; i++) {
    json_t *j = NULL;
    long status = st_call_json("POST", st_url(s, "/v1/conversations"), s->token[0], bodies[i],
                               &j);
    if (status != 400)
      fail_msg("create with body %d: %ld", i, status);
    if (!error_code(j))
      fail_msg("body %d: the answer has no error object", i);
    assert_string_equal(error_code(j), "invalid_argument");
    assert_non_null(json_string_value(json_object_get(json_object_get(j, "error"), "message")));
    json_decref(j);
  }
  stop(s, 0);
}

static void test_413_oversized_body(void **state)
{
  (void)state;
  static const char *const more[] = {"--max-body-bytes", "4096", NULL};
  st_server *s = serve(more);
  char id[40];
  create(s, 0, NULL, id);
  size_t n = 5000;
  char *big = malloc(n + 32);
  snprintf(big, n + 32, "{\"content\": \"%0*d\"}", (int)n, 0);
  json_t *j = NULL;
  assert_int_equal(st_call_json("POST", st_url(s, "/v1/conversations/%s/messages", id),
                                s->token[0], big, &j), 413);
  assert_string_equal(error_code(j), "payload_too_large");
  json_decref(j);
  /* the same without a Content-Length (chunked) */
  CURL *e = curl_easy_init();
  char hdr[128];
  snprintf(hdr, sizeof hdr, "Authorization: Bearer %s", s->token[0]);
  struct curl_slist *h = curl_slist_append(NULL, hdr);
  h = curl_slist_append(h, "Transfer-Encoding: chunked");
  h = curl_slist_append(h, "Content-Type: application/json");
  curl_easy_setopt(e, CURLOPT_URL, st_url(s, "/v1/conversations/%s/messages", id));
  curl_easy_setopt(e, CURLOPT_POSTFIELDS, big);
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
  FILE *null = fopen("/dev/null", "w");
  curl_easy_setopt(e, CURLOPT_WRITEDATA, null);
  curl_easy_perform(e);
  long code = 0;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code);
  assert_int_equal(code, 413);
  fclose(null);
  curl_slist_free_all(h);
  curl_easy_cleanup(e);
  free(big);
  /* no turn started; the conversation still takes a small message */
  assert_int_equal(st_call_json("GET", st_url(s, "/v1/conversations/%s", id), s->token[0], NULL,
                                &j), 200);
  assert_int_equal(json_integer_value(json_object_get(j, "turns")), 0);
  json_decref(j);
  long status;
  json_t *ev = turn(s, 0, id, "ok = 1", &status);
  assert_int_equal(status, 200);
  json_decref(ev);
  stop(s, 0);
}

static double metric(const char *text, const char *want);

/* POST /v1/conversations with a cookie of `n` bytes: the status (0: closed with no
 * answer); a 431's error code into `code`. */
static long create_with_cookie(st_server *s, size_t n, char code[40])
{
  char *cookie = malloc(n + 16);
  snprintf(cookie, n + 16, "Cookie: x=%0*d", (int)n, 0);
  char *body = NULL;
  long status = st_call_extra("POST", st_url(s, "/v1/conversations"), s->token[0], "{}",
                              "application/json", cookie, &body);
  code[0] = '\0';
  if (status == 431) {
    json_t *j = json_loads(body, 0, NULL); /* (libmicrohttpd's own 431 is HTML) */
    snprintf(code, 40, "%s", !j ? "(not JSON)" : error_code(j) ? error_code(j) : "");
    json_decref(j);
  }
  free(body);
  free(cookie);
  return status;
}

/* A head that leaves libmicrohttpd too little of the connection's memory to answer
 * (httpd/head.h) is refused with 431 before anything happens: a scan of one cookie's
 * size across that edge (about 16 KB) opens a conversation only for a 201.  Without the
 * guard, 15 sizes of this scan opened one and the connection closed with no answer. */
static void test_431_a_head_too_large_to_answer_is_refused_before_it_acts(void **state)
{
  (void)state;
  st_server *s = serve(NULL);
  int created = 0, refused = 0, unanswered = 0;
  for (size_t n = 15000; n <= 16600; n += (n < 15800 ? 100 : 5)) {
    char code[40];
    long status = create_with_cookie(s, n, code);
    if (status == 201)
      created++;
    else if (status == 431) {
      refused++;
      if (strcmp(code, "headers_too_large") != 0 && strcmp(code, "(not JSON)") != 0)
        fail_msg("a cookie of %zu bytes: 431 with code \"%s\"", n, code);
    } else if (status == 0)
      unanswered++;             /* libmicrohttpd's own edge: nothing was done */
    else
      fail_msg("a cookie of %zu bytes: %ld", n, status);
  }
  char code[40];
  assert_int_equal(create_with_cookie(s, 100, code), 201);
  created++;
  assert_true(refused > 0);
  char *metrics = NULL;
  assert_int_equal(st_call("GET", st_url(s, "/metrics"), s->token[0], NULL, &metrics), 200);
  double opened = metric(metrics, "berth_conversations_opened_total");
  free(metrics);
  if (opened != created)
    fail_msg("%.0f conversations opened for %d answered 201 (%d refused, %d unanswered)",
             opened, created, refused, unanswered);
  stop(s, 0);
}

/* A DELETE during a turn waits for it (then onComplete runs); a client that goes away
 * mid-turn leaves the conversation usable. */
static void test_delete_waits_and_clients_may_leave(void **state)
{
  (void)state;
  st_server *s = serve(NULL);
  char a[40], b[40];
  create(s, 0, NULL, a);
  create(s, 0, NULL, b);
  CURLM *m = curl_multi_init();
  st_stream st = {0};
  st_stream_start(&st, m, st_url(s, "/v1/conversations/%s/messages", a), s->token[0],
                  "{\"content\": \"plimsoll-echo:sleep:400\"}");
  st_seen w = {&st, "event: tool_call"};
  assert_true(st_pump(m, st_saw, &w, WAIT));
  json_t *j = NULL;
  assert_int_equal(st_call_json("DELETE", st_url(s, "/v1/conversations/%s", a), s->token[0],
                                NULL, &j), 200);
  json_decref(j);
  /* the DELETE answered after the turn: its stream is complete */
  assert_true(st_pump(m, st_done, &st, WAIT));
  json_t *events = st_stream_events(&st);
  assert_string_equal(names(events), "tool_call tool_result delta message turn_end");
  json_decref(events);
  st_stream_free(&st, m);

  /* b: the client hangs up while its cell runs */
  st_stream gone = {0};
  st_stream_start(&gone, m, st_url(s, "/v1/conversations/%s/messages", b), s->token[0],
                  "{\"content\": \"plimsoll-echo:sleep:300\"}");
  st_seen w2 = {&gone, "event: tool_call"};
  assert_true(st_pump(m, st_saw, &w2, WAIT));
  st_stream_free(&gone, m);     /* closes the connection */
  curl_multi_cleanup(m);
  /* the turn still ends; the next one runs in the same sandbox */
  long status;
  json_t *ev = turn(s, 0, b, "after = 1", &status);
  assert_int_equal(status, 200);
  assert_string_equal(names(ev), "tool_call tool_result delta message turn_end");
  assert_int_equal(json_integer_value(json_object_get(ev_data(ev, 4), "turn")), 2);
  assert_string_equal(json_string_value(json_object_get(json_object_get(ev_data(ev, 1),
                                                                        "result"), "stdout")),
                      "python 2: after = 1");
  json_decref(ev);
  char *metrics = NULL;
  assert_int_equal(st_call("GET", st_url(s, "/metrics"), s->token[0], NULL, &metrics), 200);
  assert_non_null(strstr(metrics, "\nberth_http_streams 0\n"));
  free(metrics);
  stop(s, 0);
}

/* }====================================================== */

/* {====================================================== limits */

static void test_capacity_at_max_conversations(void **state)
{
  (void)state;
  /* (no per-caller cap: the server's own cap is what is reached here) */
  static const char *const more[] = {"--max-conversations", "2",
                                     "--max-conversations-per-caller", "0", NULL};
  st_server *s = serve(more);
  char a[40], b[40], c[40];
  create(s, 0, NULL, a);
  create(s, 1, NULL, b);
  json_t *j = NULL;
  assert_int_equal(st_call_json("POST", st_url(s, "/v1/conversations"), s->token[0], NULL, &j),
                   429);
  assert_string_equal(error_code(j), "capacity");
  assert_non_null(strstr(json_string_value(json_object_get(json_object_get(j, "error"),
                                                           "message")), "limit of 2"));
  json_decref(j);
  /* the refused one left no trace; deleting one makes room */
  char *metrics = NULL;
  st_call("GET", st_url(s, "/metrics"), s->token[0], NULL, &metrics);
  assert_non_null(strstr(metrics, "\nberth_conversations 2\n"));
  assert_non_null(strstr(metrics, "berth_errors_total{source=\"host\",class=\"capacity\"} 1\n"));
  free(metrics);
  assert_int_equal(st_call("DELETE", st_url(s, "/v1/conversations/%s", a), s->token[0], NULL, NULL),
                   200);
  create(s, 0, NULL, c);
  stop(s, 0);
}

/* POST /v1/conversations by `caller` is refused 429 capacity with the caller's cap. */
static void assert_caller_refused(st_server *s, int caller, const char *limit)
{
  json_t *j = NULL;
  assert_int_equal(st_call_json("POST", st_url(s, "/v1/conversations"), s->token[caller], NULL,
                                &j), 429);
  assert_string_equal(error_code(j), "capacity");
  const char *m = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
  assert_non_null(m);
  char want[96];
  snprintf(want, sizeof want, "this caller holds its limit of %s conversations", limit);
  if (!strstr(m, want))
    fail_msg("\"%s\" does not say \"%s\"", m, want);
  json_decref(j);
}

/* A caller at --max-conversations-per-caller is refused while the other caller still
 * gets conversations, up to the server's cap; a delete gives the caller room again. */
static void test_capacity_per_caller(void **state)
{
  (void)state;
  static const char *const more[] = {"--max-conversations", "5",
                                     "--max-conversations-per-caller", "2", NULL};
  st_server *s = serve(more);
  char a[40], b[40], c[40], d[40], e[40];
  create(s, 0, NULL, a);
  create(s, 0, "{\"userId\": \"alice\"}", b);
  assert_caller_refused(s, 0, "2");
  create(s, 1, NULL, c);       /* the other caller is not locked out */
  create(s, 1, NULL, d);
  assert_caller_refused(s, 1, "2");
  /* the refusals left no trace: four open; a turn still runs */
  char *metrics = NULL;
  st_call("GET", st_url(s, "/metrics"), s->token[0], NULL, &metrics);
  assert_non_null(strstr(metrics, "\nberth_conversations 4\n"));
  free(metrics);
  long status;
  json_t *ev = turn(s, 1, d, "d = 1", &status);
  assert_int_equal(status, 200);
  assert_string_equal(names(ev), "tool_call tool_result delta message turn_end");
  json_decref(ev);
  /* a delete frees the caller's slot */
  assert_int_equal(st_call("DELETE", st_url(s, "/v1/conversations/%s", a), s->token[0], NULL,
                           NULL), 200);
  create(s, 0, NULL, e);
  assert_caller_refused(s, 0, "2");
  stop(s, 0);
}

/* By default, with two callers, each may hold half of --max-conversations (rounded
 * up): one caller cannot fill the server. */
static void test_capacity_per_caller_by_default(void **state)
{
  (void)state;
  static const char *const more[] = {"--max-conversations", "5", NULL};
  st_server *s = serve(more);
  char id[5][40];
  create(s, 0, NULL, id[0]);
  create(s, 0, NULL, id[1]);
  create(s, 0, NULL, id[2]);
  assert_caller_refused(s, 0, "3");
  create(s, 1, NULL, id[3]);   /* the rest of the server is the other caller's */
  create(s, 1, NULL, id[4]);
  char *log = st_read_log(s);
  assert_non_null(log);
  assert_non_null(strstr(log, "limits: 5 conversations (3 per caller), "));
  free(log);
  stop(s, 0);
}

/* --max-sandboxes 1: each conversation's cell closes the other's idle sandbox, and the
 * conversation whose sandbox was closed starts again in a fresh one. */
static void test_max_sandboxes_closes_the_idle_one(void **state)
{
  (void)state;
  assert_int_equal(fault_reset(&proxy), 0);
  static const char *const more[] = {"--max-sandboxes", "1", NULL};
  st_server *s = serve(more);
  char a[40], b[40];
  create(s, 0, NULL, a);
  create(s, 1, NULL, b);
  static const struct { int caller; const char *conv, *code, *stdout_; } steps[] = {
    {0, "a", "x = 1", "python 1: x = 1"},
    {1, "b", "y = 2", "python 1: y = 2"},
    {0, "a", "x", "python 1: x"},
  };
  for (size_t i = 0; i < 3; i++) {
    long status;
    json_t *ev = turn(s, steps[i].caller, steps[i].conv[0] == 'a' ? a : b, steps[i].code,
                      &status);
    assert_int_equal(status, 200);
    assert_string_equal(names(ev), "tool_call tool_result delta message turn_end");
    const json_t *r = json_object_get(ev_data(ev, 1), "result");
    assert_string_equal(json_string_value(json_object_get(r, "stdout")), steps[i].stdout_);
    assert_true(json_is_true(json_object_get(r, "freshSandbox")));
    json_decref(ev);
  }
  /* one sandbox at a time: three opens, each after closing the one before */
  assert_int_equal(fault_forwarded(&proxy, "OpenSession"), 3);
  assert_int_equal(fault_forwarded(&proxy, "CloseSession"), 2);
  char *metrics = NULL;
  st_call("GET", st_url(s, "/metrics"), s->token[0], NULL, &metrics);
  assert_non_null(strstr(metrics, "\nberth_sandboxes 1\n"));
  free(metrics);
  stop(s, 0);
}

typedef struct three {
  st_stream *v[3];
  st_server *s;
} three;

static bool first_running_second_queued(void *ud)
{
  three *t = ud;
  char *metrics = NULL;
  st_call("GET", st_url(t->s, "/metrics"), t->s->token[0], NULL, &metrics);
  bool ok = strstr(metrics, "\nberth_turns_running 1\n") &&
            strstr(metrics, "\nberth_messages_queued 1\n");
  free(metrics);
  return ok;
}

static bool first_running(void *ud)
{
  three *t = ud;
  char *metrics = NULL;
  st_call("GET", st_url(t->s, "/metrics"), t->s->token[0], NULL, &metrics);
  bool ok = strstr(metrics, "\nberth_turns_running 1\n") != NULL;
  free(metrics);
  return ok;
}

static bool all_three_done(void *ud)
{
  three *t = ud;
  for (int i = 0; i < 3; i++)
    if (t->v[i] && !t->v[i]->done)
      return false;
  return true;
}

/* One turn at a time, one message may wait, the next is refused ("capacity"). */
static void test_turn_queue_and_capacity(void **state)
{
  (void)state;
  static const char *const more[] = {"--max-concurrent-turns", "1", "--max-queued-messages",
                                     "1", NULL};
  st_server *s = serve(more);
  char a[40], b[40], c[40];
  create(s, 0, NULL, a);
  create(s, 0, NULL, b);
  create(s, 1, NULL, c);
  CURLM *m = curl_multi_init();
  st_stream sa = {0}, sb = {0};
  three t = {{&sa, &sb, NULL}, s};
  st_stream_start(&sa, m, st_url(s, "/v1/conversations/%s/messages", a), s->token[0],
                  "{\"content\": \"plimsoll-echo:sleep:500\"}");
  /* a's turn starts once its message is stored (a loop iteration later): until then a
   * is the one queued message, and b would be refused for the queue's bound. */
  assert_true(st_pump(m, first_running, &t, WAIT));
  st_stream_start(&sb, m, st_url(s, "/v1/conversations/%s/messages", b), s->token[0],
                  "{\"content\": \"b = 1\"}");
  assert_true(st_pump(m, first_running_second_queued, &t, WAIT));
  long status;
  json_t *refused = turn(s, 1, c, "c = 1", &status);
  assert_int_equal(status, 429);
  assert_string_equal(error_code(refused), "capacity");
  json_decref(refused);
  assert_true(st_pump(m, all_three_done, &t, WAIT));
  json_t *ea = st_stream_events(&sa), *eb = st_stream_events(&sb);
  assert_string_equal(names(ea), "tool_call tool_result delta message turn_end");
  assert_string_equal(names(eb), "tool_call tool_result delta message turn_end");
  /* b waited for a's slot: its turn took longer than its own cell */
  assert_true(json_real_value(json_object_get(ev_data(eb, 4), "seconds")) >= 0.3);
  json_decref(ea);
  json_decref(eb);
  st_stream_free(&sa, m);
  st_stream_free(&sb, m);
  curl_multi_cleanup(m);
  /* c was refused without a trace: its first turn is turn 1 */
  json_t *ev = turn(s, 1, c, "c = 1", &status);
  assert_int_equal(status, 200);
  assert_int_equal(json_integer_value(json_object_get(ev_data(ev, 4), "turn")), 1);
  json_decref(ev);
  stop(s, 0);
}

/* }====================================================== */

/* {====================================================== metrics */

/* Every line is a comment (# HELP / # TYPE) or `name{labels} value`; returns the
 * sample of `want` (exact name with labels), or -1. */
static double metric(const char *text, const char *want)
{
  double found = -1;
  const char *p = text;
  while (*p) {
    const char *e = strchr(p, '\n');
    assert_non_null(e);         /* every line ends with a newline */
    size_t n = (size_t)(e - p);
    char line[512];
    assert_true(n < sizeof line);
    memcpy(line, p, n);
    line[n] = '\0';
    p = e + 1;
    if (line[0] == '#') {
      char name[128], kind[32];
      if (sscanf(line, "# TYPE %127s %31s", name, kind) == 2)
        assert_true(!strcmp(kind, "counter") || !strcmp(kind, "gauge") ||
                    !strcmp(kind, "histogram"));
      else
        assert_int_equal(strncmp(line, "# HELP ", 7), 0);
      continue;
    }
    /* name: [a-zA-Z_:][a-zA-Z0-9_:]*, optional {k="v",...}, a space, a number */
    size_t i = 0;
    assert_true((line[0] >= 'a' && line[0] <= 'z') || line[0] == '_');
    while (line[i] && line[i] != '{' && line[i] != ' ')
      i++;
    if (line[i] == '{') {
      char *close = strchr(line + i, '}');
      assert_non_null(close);
      i = (size_t)(close - line) + 1;
    }
    assert_int_equal(line[i], ' ');
    char *end;
    double v = strtod(line + i + 1, &end);
    assert_true(end != line + i + 1 && *end == '\0');
    if (strlen(want) == i && !strncmp(line, want, i))
      found = v;
  }
  return found;
}

static void test_metrics_parse_and_move(void **state)
{
  (void)state;
  st_server *s = serve(NULL);
  char *before = NULL, *after = NULL;
  assert_int_equal(st_call("GET", st_url(s, "/metrics"), s->token[1], NULL, &before), 200);
  char id[40];
  create(s, 0, NULL, id);
  long status;
  json_t *ev = turn(s, 0, id, "m = 1", &status);
  assert_int_equal(status, 200);
  json_decref(ev);
  assert_int_equal(st_call("GET", st_url(s, "/metrics"), s->token[1], NULL, &after), 200);
  static const struct { const char *name; double moved; } want[] = {
    {"berth_conversations", 1},
    {"berth_conversations_opened_total", 1},
    {"berth_turns_started_total", 1},
    {"berth_turns_total{outcome=\"ok\"}", 1},
    {"berth_turns_total{outcome=\"failed\"}", 0},
    {"berth_cells_total{outcome=\"ok\"}", 1},
    {"berth_cells_total{outcome=\"error\"}", 0},
    {"berth_turn_duration_seconds_count", 1},
    {"berth_turn_duration_seconds_bucket{le=\"+Inf\"}", 1},
    {"berth_cell_duration_seconds_count", 1},
    {"berth_http_responses_total{code=\"201\"}", 1},
  };
  for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
    double b = metric(before, want[i].name), a = metric(after, want[i].name);
    if (a < 0)
      fail_msg("no sample %s", want[i].name);
    if (b < 0)
      b = 0;
    if (a - b != want[i].moved)
      fail_msg("%s moved by %g, not %g", want[i].name, a - b, want[i].moved);
  }
  assert_true(metric(after, "berth_turn_duration_seconds_sum") > 0);
  /* buckets are cumulative */
  double prev = 0;
  static const char *const les[] = {"0.0005", "0.001", "0.01", "0.1", "1", "10", "30", "+Inf"};
  for (size_t i = 0; i < sizeof les / sizeof *les; i++) {
    char name[96];
    snprintf(name, sizeof name, "berth_turn_duration_seconds_bucket{le=\"%s\"}", les[i]);
    double v = metric(after, name);
    assert_true(v >= prev);
    prev = v;
  }
  /* no conversation id and no token in the text */
  assert_null(strstr(after, id));
  assert_null(strstr(after, s->token[0]));
  free(before);
  free(after);
  stop(s, 0);
}

/* --metrics-listen: /metrics alone on an address of its own, without a token, for a
 * scraper; the API's /metrics still wants one (issue 14, item 6). */
static void test_metrics_listen_serves_metrics_without_a_token(void **state)
{
  (void)state;
  const char *more[] = {"--metrics-listen", "127.0.0.1:0", NULL};
  st_server *s = serve(more);
  assert_true(s->metrics_url[0]);
  assert_null(strstr(s->metrics_url, s->url));        /* a port of its own */
  char *text = NULL;
  assert_int_equal(st_call("GET", s->metrics_url, NULL, NULL, &text), 200);
  assert_non_null(strstr(text, "\nberth_build_info{version=\""));
  assert_non_null(strstr(text, "\nprocess_open_fds "));
  assert_true(metric(text, "berth_conversations") == 0);
  free(text);
  /* it moves with the API */
  char id[40];
  create(s, 0, NULL, id);
  assert_int_equal(st_call("GET", s->metrics_url, NULL, NULL, &text), 200);
  assert_true(metric(text, "berth_conversations") == 1);
  assert_null(strstr(text, id));
  free(text);
  /* /metrics alone, GET alone */
  char other[160];
  snprintf(other, sizeof other, "%.*s/v1/conversations",
           (int)(strlen(s->metrics_url) - strlen("/metrics")), s->metrics_url);
  assert_int_equal(st_call("GET", other, s->token[0], NULL, NULL), 404);
  assert_int_equal(st_call("POST", s->metrics_url, NULL, "{}", NULL), 405);
  /* the API's own /metrics still needs a caller's token */
  assert_int_equal(st_call("GET", st_url(s, "/metrics"), NULL, NULL, NULL), 401);
  stop(s, 0);
}

/* }====================================================== */

/* {====================================================== SIGTERM */

/* SIGTERM while a cell runs: no new connection, the turn finishes, every sandbox is
 * disposed, exit 0. */
static void test_sigterm_finishes_turns_and_disposes(void **state)
{
  (void)state;
  assert_int_equal(fault_reset(&proxy), 0);
  st_server *s = serve(NULL);
  char idle[40], busy[40];
  create(s, 0, NULL, idle);
  long status;
  json_t *ev = turn(s, 0, idle, "i = 1", &status);   /* a second sandbox, idle */
  assert_int_equal(status, 200);
  json_decref(ev);
  create(s, 1, NULL, busy);
  CURLM *m = curl_multi_init();
  st_stream st = {0};
  st_stream_start(&st, m, st_url(s, "/v1/conversations/%s/messages", busy), s->token[1],
                  "{\"content\": \"plimsoll-echo:sleep:800\"}");
  st_seen w = {&st, "event: tool_call"};
  assert_true(st_pump(m, st_saw, &w, WAIT));      /* the cell is running now */
  assert_int_equal(fault_forwarded(&proxy, "CloseSession"), 0);
  kill(s->pid, SIGTERM);
  assert_true(st_pump(m, st_done, &st, WAIT));
  assert_int_equal(st.status, 200);
  assert_int_equal(st.result, CURLE_OK);
  json_t *events = st_stream_events(&st);
  assert_string_equal(names(events), "tool_call tool_result delta message turn_end");
  const json_t *r = json_object_get(ev_data(events, 1), "result");
  assert_non_null(r);
  assert_string_equal(json_string_value(json_object_get(r, "stdout")),
                      "python 1: plimsoll-echo:sleep:800");
  assert_true(json_is_true(json_object_get(ev_data(events, 4), "ok")));
  json_decref(events);
  st_stream_free(&st, m);
  curl_multi_cleanup(m);
  int code = st_wait_exit(s, WAIT);
  assert_int_equal(code, 0);
  /* both sandboxes were closed before it exited */
  assert_int_equal(fault_forwarded(&proxy, "OpenSession"), 2);
  assert_int_equal(fault_forwarded(&proxy, "CloseSession"), 2);
  /* the log holds no token; the access log names conversations by their public id */
  char *log = st_read_log(s);
  assert_non_null(log);
  assert_non_null(strstr(log, "SIGTERM"));
  assert_null(strstr(log, s->token[0]));
  assert_null(strstr(log, s->token[1]));
  assert_non_null(strstr(log, busy));
  free(log);
  /* nothing listens any more */
  assert_int_equal(st_call("GET", st_url(s, "/healthz"), NULL, NULL, NULL), 0);
  stop(s, -1);                  /* already gone */
}

/* A turn longer than the grace is cancelled: an error event, the turn's end. */
static void test_sigterm_cancels_after_the_grace(void **state)
{
  (void)state;
  assert_int_equal(fault_reset(&proxy), 0);
  static const char *const more[] = {"--shutdown-grace", "0.3", NULL};
  st_server *s = serve(more);
  char id[40];
  create(s, 0, NULL, id);
  CURLM *m = curl_multi_init();
  st_stream st = {0};
  st_stream_start(&st, m, st_url(s, "/v1/conversations/%s/messages", id), s->token[0],
                  "{\"content\": \"plimsoll-echo:sleep:4000\"}");
  st_seen w = {&st, "event: tool_call"};
  assert_true(st_pump(m, st_saw, &w, WAIT));
  double t0 = st_now();
  kill(s->pid, SIGTERM);
  assert_true(st_pump(m, st_done, &st, WAIT));
  assert_true(st_now() - t0 < 2.5);  /* well before the cell's 4 s */
  json_t *events = st_stream_events(&st);
  assert_string_equal(names(events), "tool_call error turn_end");
  assert_string_equal(json_string_value(json_object_get(ev_data(events, 1), "code")),
                      "cancelled");
  assert_true(json_is_false(json_object_get(ev_data(events, 2), "ok")));
  json_decref(events);
  st_stream_free(&st, m);
  curl_multi_cleanup(m);
  /* (echo's close waits for the cell it runs, so the exit comes after the 4 s) */
  assert_int_equal(st_wait_exit(s, WAIT), 0);
  assert_int_equal(fault_forwarded(&proxy, "CloseSession"),
                   fault_forwarded(&proxy, "OpenSession"));
  stop(s, -1);
}

/* The server's descriptor table holds its connections from the start: grown by the
 * kernel as they come, each doubling would stall its loop for an RCU grace period
 * (berth_reserve_descriptors, berth.h), since the store's threads share the table. */
static void test_serve_sizes_its_descriptor_table_before_its_threads_start(void **state)
{
  (void)state;
  st_server *s = serve(NULL);
  unsigned long soft = proc_number(s->pid, "limits", "Max open files");
  unsigned long want = soft < BERTH_RESERVED_DESCRIPTORS ? soft : BERTH_RESERVED_DESCRIPTORS;
  unsigned long table = proc_number(s->pid, "status", "FDSize:");
  if (table < want)
    fail_msg("a descriptor table of %lu for a limit of %lu", table, soft);
  assert_true(proc_number(s->pid, "status", "Threads:") > 1);  /* what makes it matter */
  stop(s, 0);
}

/* Issue 11, item 9: 8 300 idle connections without a token made `berth serve` time
 * out new opens.  With --max-connections 100 and --header-timeout 1, 400 idle
 * connections (half silent, half with headers that never end): a turn streaming
 * since before the flood runs to its end past the header timeout, a caller opens a
 * conversation during the flood, and every idle connection is closed soon after. */
static void test_I11_9_an_idle_connection_flood_locks_no_caller_out(void **state)
{
  (void)state;
  flood_raise_fd_limit();
  static const char *const more[] = {"--max-connections", "100", "--header-timeout", "1",
                                     NULL};
  st_server *s = serve(more);
  unsigned port = 0;
  assert_int_equal(sscanf(s->url, "http://127.0.0.1:%u", &port), 1);
  char id[40], other[40];
  create(s, 0, NULL, id);
  CURLM *m = curl_multi_init();
  st_stream st = {0};
  st_stream_start(&st, m, st_url(s, "/v1/conversations/%s/messages", id), s->token[0],
                  "{\"content\": \"plimsoll-echo:sleep:2500\"}");
  st_seen w = {&st, "event: tool_call"};
  assert_true(st_pump(m, st_saw, &w, WAIT));
  flood f;
  double t0 = st_now();
  assert_int_equal(flood_open(&f, port, 400), 0);
  create(s, 1, NULL, other);           /* a new caller, in the flood */
  assert_true(st_pump(m, st_done, &st, WAIT));
  assert_int_equal(st.status, 200);
  json_t *events = st_stream_events(&st);
  assert_string_equal(names(events), "tool_call tool_result delta message turn_end");
  json_decref(events);
  st_stream_free(&st, m);
  curl_multi_cleanup(m);
  size_t closed = flood_closed(&f, 6.0);
  if (closed != f.n)
    fail_msg("%zu of %zu idle connections still open %.1f s later", f.n - closed, f.n,
             st_now() - t0);
  flood_close(&f);
  char *log = st_read_log(s);
  assert_non_null(log);
  assert_non_null(strstr(log, "over the cap of 100"));
  free(log);
  stop(s, 0);
}

/* }====================================================== */

/* {====================================================== issue 11: a local sandboxd that dies */

/* The one child of `berth serve` (its own sandboxd), or -1. */
static pid_t only_child(pid_t pid)
{
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  int child = -1;
  if (fscanf(f, "%d", &child) != 1)
    child = -1;
  fclose(f);
  return child;
}

typedef struct respawn {
  const st_server *s;
  pid_t old;
} respawn;

/* berth logged the restart (it logs once the new daemon listens). */
static bool restarted(void *ud)
{
  respawn *r = ud;
  char *log = st_read_log(r->s);
  bool yes = log && strstr(log, "is running again");
  free(log);
  return yes;
}

/* The server's log with --log-format json: every line checked to be one JSON record
 * with "ts", "level" and "msg", all of them in an array. */
static json_t *json_log(st_server *s)
{
  char *log = st_read_log(s);
  assert_non_null(log);
  json_t *all = json_array();
  char *save = NULL;
  for (char *line = strtok_r(log, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    json_t *o = json_loads(line, 0, NULL);
    if (!o)
      fail_msg("a log record that is not JSON: %s", line);
    assert_non_null(json_string_value(json_object_get(o, "ts")));
    assert_non_null(json_string_value(json_object_get(o, "level")));
    assert_non_null(json_string_value(json_object_get(o, "msg")));
    json_array_append_new(all, o);
  }
  free(log);
  return all;
}

/* SIGKILL the sandboxd berth started: berth starts it again (logged, in the log's own
 * format: with --log-format json those lines are JSON records too), and the
 * conversation's next cell runs, in a fresh sandbox the model is told about. */
static void test_I11_local_sandboxd_killed_is_restarted(void **state)
{
  (void)state;
  const char *build = getenv("BUILD") && *getenv("BUILD") ? getenv("BUILD") : "build";
  char sandboxd[256];
  snprintf(sandboxd, sizeof sandboxd, "%s/sandboxd", build);
  const char *args[] = {"--sandboxd", sandboxd, "--provider", "echo", "--log-format", "json",
                        NULL};
  st_server *s = calloc(1, sizeof *s);
  assert_int_equal(st_start(s, script, args), 0);
  char id[40];
  create(s, 0, NULL, id);
  long status;
  json_t *ev = turn(s, 0, id, "x = 1", &status);
  assert_int_equal(status, 200);
  assert_true(json_is_true(json_object_get(json_object_get(ev_data(ev, 1), "result"),
                                           "freshSandbox")));
  json_decref(ev);

  pid_t old = only_child(s->pid);
  assert_true(old > 0);
  assert_int_equal(kill(old, SIGKILL), 0);
  respawn r = {s, old};
  CURLM *multi = curl_multi_init();   /* no transfers: st_pump as a bounded wait */
  assert_true(st_pump(multi, restarted, &r, WAIT));
  curl_multi_cleanup(multi);
  pid_t now = only_child(s->pid);
  assert_true(now > 0 && now != old);

  ev = turn(s, 0, id, "x + 1", &status);
  assert_int_equal(status, 200);
  assert_string_equal(names(ev), "tool_call tool_result delta message turn_end");
  const json_t *res = ev_data(ev, 1);
  assert_null(json_object_get(res, "error"));
  const json_t *result = json_object_get(res, "result");
  assert_true(json_is_true(json_object_get(result, "freshSandbox")));
  assert_int_equal(json_integer_value(json_object_get(result, "exitCode")), 0);
  assert_string_equal(json_string_value(json_object_get(result, "stdout")), "python 1: x + 1");
  json_decref(ev);
  /* and another conversation too */
  char id2[40];
  create(s, 1, NULL, id2);
  ev = turn(s, 1, id2, "y = 2", &status);
  assert_int_equal(status, 200);
  assert_string_equal(json_string_value(json_object_get(
                        json_object_get(ev_data(ev, 1), "result"), "stdout")),
                      "python 1: y = 2");
  json_decref(ev);
  json_t *log = json_log(s), *o;
  bool killed = false, again = false;
  size_t i;
  json_array_foreach(log, i, o) {
    const char *m = json_string_value(json_object_get(o, "msg"));
    const char *level = json_string_value(json_object_get(o, "level"));
    if (strstr(m, "was killed by signal 9") && !strcmp(level, "warn"))
      killed = true;
    if (strstr(m, "is running again") && !strcmp(level, "info"))
      again = true;
  }
  json_decref(log);
  assert_true(killed);
  assert_true(again);
  stop(s, 0);
}

/* }====================================================== */

/* Issue 14, operators: --log-format json makes every record one JSON object with a
 * timestamp and a level; each request gets an access record naming the caller by label
 * and the conversation by its public id (never a token); a hook's failure reaches the
 * API caller as an error id, its text only in the log under that id; /readyz answers;
 * a listen address off loopback is warned about. */
static bool log_checks(st_server *s, const char *id, const char *eid)
{
  json_t *log = json_log(s), *o;
  bool hook_logged = false, access_logged = false, warned = false;
  size_t i;
  json_array_foreach(log, i, o) {
    const char *level = json_string_value(json_object_get(o, "level"));
    const char *m = json_string_value(json_object_get(o, "msg"));
    if (strstr(m, eid) && strstr(m, "secret detail in boom") && strstr(m, id))
      hook_logged = true;
    if (!strncmp(m, "access ", 7) && strstr(m, "POST") && strstr(m, id))
      access_logged = true;
    if (!strcmp(level, "warn") && strstr(m, "cleartext"))
      warned = true;
    if (strstr(m, s->token[0]))
      fail_msg("a log record holds a caller's token: %s", m);
  }
  json_decref(log);
  assert_true(hook_logged);
  assert_true(warned);
  return access_logged;
}

static void test_operators_json_log_access_records_hook_error_ids_readyz(void **state)
{
  (void)state;
  char hooks[128];
  snprintf(hooks, sizeof hooks, "/tmp/berth-ops-hooks-%d.lua", (int)getpid());
  FILE *f = fopen(hooks, "w");
  assert_non_null(f);
  fputs("return { onTurn = function(ctx, m) error('secret detail in ' .. m) end }\n", f);
  fclose(f);
  const char *more[] = {"--log-format", "json", "--hooks", hooks, "--listen", "0.0.0.0:0",
                        NULL};
  st_server *s = serve(more);
  char id[40];
  create(s, 0, NULL, id);
  long status;
  json_t *events = turn(s, 0, id, "boom", &status);
  assert_int_equal(status, 200);
  const json_t *err = NULL;
  for (size_t i = 0; i < json_array_size(events); i++)
    if (!strcmp(ev_name(events, i), "error"))
      err = ev_data(events, i);
  assert_non_null(err);
  assert_string_equal(json_string_value(json_object_get(err, "code")), "hook");
  char eid[16];
  snprintf(eid, sizeof eid, "%s", json_string_value(json_object_get(err, "errorId")));
  assert_int_equal(strlen(eid), 8);
  const char *said = json_string_value(json_object_get(err, "message"));
  assert_null(strstr(said, "secret"));
  assert_null(strstr(said, ".lua"));
  json_decref(events);
  /* The POST's access record follows its answer: each /readyz is a loop turn later. */
  bool access_logged = false;
  for (int i = 0; i < 50 && !access_logged; i++) {
    assert_int_equal(st_call("GET", st_url(s, "/readyz"), NULL, NULL, NULL), 200);
    access_logged = log_checks(s, id, eid);
  }
  assert_true(access_logged);
  unlink(hooks);
  stop(s, 0);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_create_message_delete),
    cmocka_unit_test(test_user_and_queueing_in_one_conversation),
    cmocka_unit_test(test_other_callers_conversation_is_404),
    cmocka_unit_test(test_401_without_a_token),
    cmocka_unit_test(test_431_a_head_too_large_to_answer_is_refused_before_it_acts),
    cmocka_unit_test(test_400_malformed_input_changes_nothing),
    cmocka_unit_test(test_400_reason_is_json_even_for_ill_formed_bytes),
    cmocka_unit_test(test_413_oversized_body),
    cmocka_unit_test(test_delete_waits_and_clients_may_leave),
    cmocka_unit_test(test_capacity_at_max_conversations),
    cmocka_unit_test(test_capacity_per_caller),
    cmocka_unit_test(test_capacity_per_caller_by_default),
    cmocka_unit_test(test_max_sandboxes_closes_the_idle_one),
    cmocka_unit_test(test_turn_queue_and_capacity),
    cmocka_unit_test(test_metrics_parse_and_move),
    cmocka_unit_test(test_metrics_listen_serves_metrics_without_a_token),
    cmocka_unit_test(test_sigterm_finishes_turns_and_disposes),
    cmocka_unit_test(test_sigterm_cancels_after_the_grace),
    cmocka_unit_test(test_serve_sizes_its_descriptor_table_before_its_threads_start),
    cmocka_unit_test(test_I11_9_an_idle_connection_flood_locks_no_caller_out),
    cmocka_unit_test(test_I11_local_sandboxd_killed_is_restarted),
    cmocka_unit_test(test_operators_json_log_access_records_hook_error_ids_readyz),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

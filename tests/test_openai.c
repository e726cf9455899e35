/*
 * test_openai.c — the `openai` model adapter (runtime/models/model_openai.c), through a
 * real host whose hooks call model.chat, against tests/fake_openai.py (a local server
 * speaking the chat-completions chunk format, with faults chosen per request by the
 * URL path and requests counted per tag); the stream assembler alone on crafted
 * chunks (tool-call keying rules, split UTF-8); and one whole turn of the shipped
 * hooks with the executeCode tool against a real sandboxd (provider echo).
 *
 * Waits are bounded conditions on what the loop delivers (hosttest.h); the fake's
 * `hold` scenario is released by the test, never by a timer.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <ev.h>

#include "hosttest.h"
#include "openai.h"
#include "runtime.h"
#include "sbxproc.h"
#include "launch.h"

#define WAIT 20.0               /* seconds: a bound on each wait, never a sleep */
#define KEY "sk-test-SECRET-0123456789abcdef"

static pid_t fake_pid = -1;
static char fake_url[256];

/* {====================================================== the fake */

typedef struct body {
  char *s;
  size_t len;
} body;

static size_t body_write(char *p, size_t size, size_t n, void *ud)
{
  body *b = ud;
  char *s = realloc(b->s, b->len + size * n + 1);
  if (!s)
    return 0;
  memcpy(s + b->len, p, size * n);
  b->s = s;
  b->len += size * n;
  b->s[b->len] = '\0';
  return size * n;
}

/* A blocking request to the fake's control paths; returns its JSON (new ref). */
static json_t *fake_call(const char *method, const char *path)
{
  char url[512];
  snprintf(url, sizeof url, "%s%s", fake_url, path);
  CURL *e = curl_easy_init();
  body b = {NULL, 0};
  curl_easy_setopt(e, CURLOPT_URL, url);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, body_write);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(e, CURLOPT_TIMEOUT, 10L);
  curl_easy_setopt(e, CURLOPT_NOPROXY, "*");
  if (strcmp(method, "POST") == 0)
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, "");
  assert_int_equal(curl_easy_perform(e), CURLE_OK);
  curl_easy_cleanup(e);
  json_t *j = json_loads(b.s ? b.s : "", 0, NULL);
  free(b.s);
  assert_non_null(j);
  return j;
}

static json_t *fake_stats(const char *tag)
{
  char path[128];
  snprintf(path, sizeof path, "/_stats/%s", tag);
  return fake_call("GET", path);
}

static long fake_count(const char *tag)
{
  json_t *s = fake_stats(tag);
  long n = (long)json_integer_value(json_object_get(s, "requests"));
  json_decref(s);
  return n;
}

static void fake_release(const char *tag)
{
  char path[128];
  snprintf(path, sizeof path, "/_release/%s", tag);
  json_decref(fake_call("POST", path));
}

static int group_setup(void **state)
{
  (void)state;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  char *const argv[] = {"python3", "tests/fake_openai.py", NULL};
  fake_pid = spawn_listening(argv, fake_url, sizeof fake_url);
  return fake_pid > 0 ? 0 : -1;
}

static int group_teardown(void **state)
{
  (void)state;
  spawn_stop(fake_pid);
  curl_global_cleanup();
  return 0;
}

/* }====================================================== */

/* {====================================================== a host whose hook calls model.chat */

/* The message is a JSON request {messages, tools?}; the hook emits each delta (and
 * "badDelta" for one that is not whole UTF-8), then "reply" or "failure". */
static const char chat_hooks[] =
  "return { onTurn = function(ctx, m)\n"
  "  local req = json.decode(m)\n"
  "  if req.illFormed then req.messages[1].content = req.messages[1].content .. '\\255' end\n"
  "  local reply, err, code = model.chat{messages = req.messages, tools = req.tools,\n"
  "    on_delta = function(d)\n"
  "      if utf8.len(d) == nil then ctx:emit('badDelta', #d) end\n"
  "      ctx:emit('delta', d)\n"
  "    end}\n"
  "  if reply then ctx:emit('reply', reply)\n"
  "  else ctx:emit('failure', {message = err, code = code}) end\n"
  "end }\n";

static const char hello[] = "{\"messages\": [{\"role\": \"user\", \"content\": \"hello\"}]}";

typedef void (*tweak_fn)(berth_openai_options *o);

static void fast_retries(berth_openai_options *o)
{
  o->backoff_base = 0.01;
  o->backoff_max = 0.05;
}

static berth_model *model_for(ht *t, const char *scenario, const char *tag, tweak_fn tweak)
{
  char url[512];
  snprintf(url, sizeof url, "%s/%s/%s/v1/", fake_url, scenario, tag);
  berth_openai_options oo;
  berth_openai_options_init(&oo);
  oo.url = url;
  oo.api_key = KEY;
  oo.model = "fake-model";
  fast_retries(&oo);
  if (tweak)
    tweak(&oo);
  berth_model_options mo = {t->loop, NULL, NULL, NULL};
  char *err = NULL;
  berth_model *m = berth_openai_new(&oo, &mo, &err);
  if (!m)
    fail_msg("berth_openai_new: %s", err);
  return m;
}

static ht *start_with(berth_model *(*make)(ht *t, void *ud), void *ud)
{
  ht *t = calloc(1, sizeof *t);
  ht_init(t);
  t->model = make(t, ud);
  char hooks[256];
  snprintf(hooks, sizeof hooks, "%s", ht_file(t, "hooks.lua", chat_hooks));
  ht_host(t, hooks, NULL, NULL, NULL);
  t->conv = berth_conv_new(t->host, "run-o", NULL);
  return t;
}

typedef struct spec {
  const char *scenario, *tag;
  tweak_fn tweak;
} spec;

static berth_model *make_fake(ht *t, void *ud)
{
  spec *s = ud;
  return model_for(t, s->scenario, s->tag, s->tweak);
}

static ht *start(const char *scenario, const char *tag, tweak_fn tweak)
{
  spec s = {scenario, tag, tweak};
  return start_with(make_fake, &s);
}

static void stop(ht *t)
{
  ht_free(t);
  free(t);
}

static void send_turn(ht *t, const char *request)
{
  int ends = ht_count(t, "turnEnd");
  assert_int_equal(berth_conv_send(t->conv, request), 0);
  assert_true(ht_wait_events(t, "turnEnd", ends + 1, WAIT));
  assert_int_equal(ht_count(t, "error"), 0);
}

/* The reply of the last turn (fails the test when the call failed). */
static const json_t *reply_of(ht *t)
{
  int n = ht_count(t, "reply");
  if (n == 0) {
    const json_t *f = ht_event(t, "failure", ht_count(t, "failure") - 1);
    fail_msg("the model call failed: %s",
             f ? json_string_value(json_object_get(f, "message")) : "(no event)");
  }
  return ht_event(t, "reply", n - 1);
}

/* The failure of the last turn: its message, and its code checked. */
static const char *failure_of(ht *t, const char *code)
{
  assert_int_equal(ht_count(t, "reply"), 0);
  const json_t *f = ht_event(t, "failure", ht_count(t, "failure") - 1);
  assert_non_null(f);
  const char *msg = json_string_value(json_object_get(f, "message"));
  assert_non_null(msg);
  const char *got = json_string_value(json_object_get(f, "code"));
  if (!got || strcmp(got, code) != 0)
    fail_msg("code %s, want %s (message: %s)", got ? got : "(none)", code, msg);
  assert_null(strstr(msg, KEY));
  return msg;
}

static void assert_contains(const char *hay, const char *needle)
{
  if (!hay || !strstr(hay, needle))
    fail_msg("\"%s\" does not contain \"%s\"", hay ? hay : "(null)", needle);
}

/* All deltas, joined; none may be cut inside a UTF-8 sequence. */
static char *joined_deltas(ht *t)
{
  size_t len = 0;
  char *s = calloc(1, 1);
  for (int i = 0; i < ht_count(t, "delta"); i++) {
    const json_t *d = ht_event(t, "delta", i);
    s = realloc(s, len + json_string_length(d) + 1);
    memcpy(s + len, json_string_value(d), json_string_length(d));
    len += json_string_length(d);
    s[len] = '\0';
  }
  assert_int_equal(ht_count(t, "badDelta"), 0);
  return s;
}

static const char *content_of(const json_t *reply)
{
  assert_string_equal(json_string_value(json_object_get(reply, "role")), "assistant");
  return json_string_value(json_object_get(reply, "content"));
}

/* }====================================================== */

/* {====================================================== streaming text */

static void test_openai_text_deltas_reach_on_delta_in_order(void **state)
{
  (void)state;
  ht *t = start("text", "text1", NULL);
  send_turn(t, hello);
  const char *want = "Hello, wörld — ünïcödé ✓ 🚀!";
  assert_string_equal(content_of(reply_of(t)), want);
  assert_null(json_object_get(reply_of(t), "tool_calls"));
  char *all = joined_deltas(t);
  assert_string_equal(all, want);
  free(all);
  assert_true(ht_count(t, "delta") >= 1);
  /* what was sent: the model, stream: true, the messages, the key, no empty tools */
  json_t *s = fake_stats("text1");
  assert_int_equal(json_integer_value(json_object_get(s, "requests")), 1);
  const json_t *b = json_array_get(json_object_get(s, "bodies"), 0);
  assert_string_equal(json_string_value(json_object_get(b, "model")), "fake-model");
  assert_true(json_is_true(json_object_get(b, "stream")));
  assert_null(json_object_get(b, "tools"));
  json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"hello\"}]", 0, NULL);
  assert_true(json_equal(json_object_get(b, "messages"), msgs));
  json_decref(msgs);
  assert_string_equal(json_string_value(json_array_get(json_object_get(s, "auth"), 0)),
                      "Bearer " KEY);
  json_decref(s);
  stop(t);
}

static bool has_delta(ht *t, void *ud)
{
  (void)ud;
  return ht_count(t, "delta") > 0;
}

/* The first delta reaches Lua while the server still holds the rest back. */
static void test_openai_deltas_arrive_before_the_stream_ends(void **state)
{
  (void)state;
  ht *t = start("hold", "hold1", NULL);
  assert_int_equal(berth_conv_send(t->conv, hello), 0);
  assert_true(ht_wait(t, has_delta, NULL, WAIT));
  assert_string_equal(json_string_value(ht_event(t, "delta", 0)), "first ");
  assert_int_equal(ht_count(t, "reply"), 0);
  assert_int_equal(ht_count(t, "turnEnd"), 0);
  fake_release("hold1");
  assert_true(ht_wait_events(t, "turnEnd", 1, WAIT));
  assert_string_equal(content_of(reply_of(t)), "first second");
  assert_int_equal(ht_count(t, "delta"), 2);
  stop(t);
}

static void test_openai_crlf_cr_comments_and_multiline_data(void **state)
{
  (void)state;
  const char *scenarios[] = {"crlf", "cr"};
  for (int i = 0; i < 2; i++) {
    ht *t = start(scenarios[i], scenarios[i], NULL);
    send_turn(t, hello);
    assert_string_equal(content_of(reply_of(t)), "Line ends, comments and multi-line data work");
    char *all = joined_deltas(t);
    assert_string_equal(all, "Line ends, comments and multi-line data work");
    free(all);
    stop(t);
  }
}

static void test_openai_utf8_split_inside_json_strings_reassembled(void **state)
{
  (void)state;
  ht *t = start("splitutf8", "splitutf8", NULL);
  send_turn(t, hello);
  assert_string_equal(content_of(reply_of(t)), "café 🚀 ok");
  char *all = joined_deltas(t);    /* and no delta ended inside a code point */
  assert_string_equal(all, "café 🚀 ok");
  free(all);
  stop(t);
}

static void test_openai_stream_without_done_but_with_finish_reason_accepted(void **state)
{
  (void)state;
  ht *t = start("nodone", "nodone", NULL);
  send_turn(t, hello);
  assert_string_equal(content_of(reply_of(t)), "no done marker");
  stop(t);
}

static void test_openai_non_streamed_json_answer_accepted(void **state)
{
  (void)state;
  ht *t = start("json", "json1", NULL);
  send_turn(t, hello);
  assert_string_equal(content_of(reply_of(t)), "a whole answer");
  char *all = joined_deltas(t);
  assert_string_equal(all, "a whole answer");
  free(all);
  stop(t);
}

/* }====================================================== */

/* {====================================================== tool calls */

static const char with_tools[] =
  "{\"messages\": [{\"role\": \"user\", \"content\": \"run it\"}],\n"
  " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"executeCode\",\n"
  "   \"description\": \"runs code\", \"parameters\": {\"type\": \"object\",\n"
  "   \"properties\": {\"code\": {\"type\": \"string\"}}, \"required\": [\"code\"]}}}]}";

static void assert_call(const json_t *call, const char *id, const char *name, const char *args)
{
  assert_string_equal(json_string_value(json_object_get(call, "id")), id);
  assert_string_equal(json_string_value(json_object_get(call, "type")), "function");
  const json_t *fn = json_object_get(call, "function");
  assert_string_equal(json_string_value(json_object_get(fn, "name")), name);
  assert_string_equal(json_string_value(json_object_get(fn, "arguments")), args);
}

static void test_openai_split_tool_call_arguments_assembled(void **state)
{
  (void)state;
  ht *t = start("tool", "tool1", NULL);
  send_turn(t, with_tools);
  const json_t *reply = reply_of(t);
  assert_null(json_object_get(reply, "content"));   /* null: left out in Lua */
  const json_t *calls = json_object_get(reply, "tool_calls");
  assert_int_equal(json_array_size(calls), 1);
  assert_call(json_array_get(calls, 0), "call_abc123", "executeCode",
              "{\"code\": \"print('héllo wörld 🚀')\\nx = 41\", \"language\": \"python\"}");
  assert_int_equal(ht_count(t, "delta"), 0);
  json_t *s = fake_stats("tool1");
  const json_t *b = json_array_get(json_object_get(s, "bodies"), 0);
  const json_t *tool = json_array_get(json_object_get(b, "tools"), 0);
  assert_string_equal(json_string_value(json_object_get(json_object_get(tool, "function"),
                                                        "name")), "executeCode");
  json_decref(s);
  stop(t);
}

/* The body is written around the texts of the request's parts: valid JSON in the
 * order the API's examples give (model, messages, stream, tools), a real kept as a
 * real, ill-formed UTF-8 in the history mended, not sent as is. */
static void test_openai_body_written_from_the_hooks_tables(void **state)
{
  (void)state;
  ht *t = start("text", "body1", NULL);
  send_turn(t, "{\"illFormed\": true, \"messages\": [{\"role\": \"user\", \"content\": \"caf\"},\n"
               " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\",\n"
               "  \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}]},\n"
               " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"{\\\"x\\\": 1}\"}],\n"
               " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\",\n"
               "  \"parameters\": {\"type\": \"object\", \"minimum\": 0.5, \"n\": 3}}}]}");
  assert_non_null(reply_of(t));
  json_t *s = fake_stats("body1");
  const json_t *b = json_array_get(json_object_get(s, "bodies"), 0);
  assert_null(json_object_get(b, "unparsed"));
  const char *order[] = {"model", "messages", "stream", "tools"};
  size_t k = 0;
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)b, key, v) {
    assert_true(k < 4);
    assert_string_equal(key, order[k++]);
  }
  assert_int_equal(k, 4);
  json_t *want = json_loads(
    "[{\"content\": \"caf\ufffd\", \"role\": \"user\"},"
    " {\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"arguments\": \"{}\","
    "   \"name\": \"f\"}, \"id\": \"c1\", \"type\": \"function\"}]},"
    " {\"content\": \"{\\\"x\\\": 1}\", \"role\": \"tool\", \"tool_call_id\": \"c1\"}]", 0, NULL);
  assert_non_null(want);
  assert_true(json_equal(json_object_get(b, "messages"), want));
  json_decref(want);
  const json_t *params = json_object_get(json_object_get(json_array_get(
    json_object_get(b, "tools"), 0), "function"), "parameters");
  assert_true(json_is_real(json_object_get(params, "minimum")));
  assert_true(json_real_value(json_object_get(params, "minimum")) == 0.5);
  assert_true(json_is_integer(json_object_get(params, "n")));
  json_decref(s);
  stop(t);
}

static void test_openai_parallel_tool_calls_kept_apart(void **state)
{
  (void)state;
  ht *t = start("parallel", "parallel1", NULL);
  send_turn(t, with_tools);
  const json_t *calls = json_object_get(reply_of(t), "tool_calls");
  assert_int_equal(json_array_size(calls), 2);
  assert_call(json_array_get(calls, 0), "call_A", "executeCode",
              "{\"code\": \"a = 1 + 1\", \"language\": \"python\"}");
  assert_call(json_array_get(calls, 1), "call_B", "lookup", "{\"query\": \"naïve café ☕\"}");
  stop(t);
}

/* }====================================================== */

/* {====================================================== retries and errors */

static void test_openai_retry_after_429_then_success(void **state)
{
  (void)state;
  ht *t = start("ratelimit", "rl1", NULL);
  ev_now_update(t->loop);
  ev_tstamp t0 = ev_now(t->loop);
  send_turn(t, hello);
  ev_now_update(t->loop);
  assert_string_equal(content_of(reply_of(t)), "ok after the wait");
  assert_int_equal(fake_count("rl1"), 2);
  /* Retry-After: 1 was honoured, though the backoff alone is 10 ms */
  assert_true(ev_now(t->loop) - t0 >= 0.95);
  stop(t);
}

static void test_openai_5xx_retried_until_success(void **state)
{
  (void)state;
  ht *t = start("flaky", "flaky1", NULL);
  send_turn(t, hello);
  assert_string_equal(content_of(reply_of(t)), "third time lucky");
  assert_int_equal(fake_count("flaky1"), 3);
  stop(t);
}

static void test_openai_5xx_storm_gives_up_after_max_attempts(void **state)
{
  (void)state;
  ht *t = start("storm", "storm1", NULL);
  send_turn(t, hello);
  const char *msg = failure_of(t, "unavailable");
  assert_contains(msg, "HTTP 500");
  assert_contains(msg, "4 tries");
  assert_contains(msg, "upstream overloaded");
  assert_int_equal(fake_count("storm1"), 4);
  stop(t);
}

static void one_attempt(berth_openai_options *o)
{
  fast_retries(o);
  o->max_attempts = 1;
}

static void test_openai_attempts_are_bounded_by_the_option(void **state)
{
  (void)state;
  ht *t = start("storm", "storm2", one_attempt);
  send_turn(t, hello);
  assert_contains(failure_of(t, "unavailable"), "1 try");
  assert_int_equal(fake_count("storm2"), 1);
  stop(t);
}

/* Bytes of the stream arrived, then it broke: an error, never a second request. */
static void test_openai_no_retry_after_stream_bytes_arrived(void **state)
{
  (void)state;
  static const struct {
    const char *scenario, *tag, *code, *says;
  } cases[] = {
    {"cut", "cut1", "unavailable", "ended before the reply was complete"},
    {"cutchunked", "cut2", "unavailable", "broke off"},
    {"errorevent", "cut3", "unavailable", "reported an error in the stream"},
  };
  for (int i = 0; i < 3; i++) {
    ht *t = start(cases[i].scenario, cases[i].tag, NULL);
    send_turn(t, with_tools);
    assert_contains(failure_of(t, cases[i].code), cases[i].says);
    assert_true(ht_count(t, "delta") >= 1);     /* text had been shown */
    assert_int_equal(fake_count(cases[i].tag), 1);
    stop(t);
  }
}

static void test_openai_401_names_the_key_problem_without_the_key(void **state)
{
  (void)state;
  ht *t = start("unauthorized", "auth1", NULL);
  send_turn(t, hello);
  const char *msg = failure_of(t, "unauthenticated");   /* checks the key is absent */
  assert_contains(msg, "the model provider refused the API key (HTTP 401); check BERTH_API_KEY");
  assert_contains(msg, "Incorrect API key provided: [redacted]");
  assert_int_equal(fake_count("auth1"), 1);
  /* a model outage is counted as the model's error, and the call as a model call */
  char *metrics = berth_host_metrics(t->host);
  assert_contains(metrics, "berth_errors_total{source=\"model\",class=\"unauthenticated\"} 1\n");
  assert_contains(metrics, "berth_model_calls_total 1\n");
  free(metrics);
  stop(t);

  t = start("forbidden", "auth2", NULL);
  send_turn(t, hello);
  assert_contains(failure_of(t, "permission_denied"),
                  "the model provider refused the API key (HTTP 403); check BERTH_API_KEY");
  stop(t);
}

static void test_openai_malformed_stream_is_an_error(void **state)
{
  (void)state;
  ht *t = start("malformed", "bad1", NULL);
  send_turn(t, hello);
  const char *msg = failure_of(t, "protocol");
  assert_contains(msg, "malformed");
  assert_contains(msg, "not valid JSON");
  assert_string_equal(json_string_value(ht_event(t, "delta", 0)), "partial");
  assert_int_equal(fake_count("bad1"), 1);
  stop(t);
}

static void test_openai_invalid_utf8_at_the_end_is_an_error(void **state)
{
  (void)state;
  ht *t = start("badutf8", "badutf8", NULL);
  send_turn(t, hello);
  assert_contains(failure_of(t, "protocol"), "not valid UTF-8");
  stop(t);
}

static void short_idle(berth_openai_options *o)
{
  fast_retries(o);
  o->idle_timeout = 1;
}

static void test_openai_stalled_stream_hits_the_idle_timeout(void **state)
{
  (void)state;
  ht *t = start("stall", "stall1", short_idle);
  send_turn(t, hello);
  assert_contains(failure_of(t, "deadline_exceeded"), "broke off");
  assert_int_equal(fake_count("stall1"), 1);
  fake_release("stall1");
  stop(t);
}

static void test_openai_redirect_is_not_followed(void **state)
{
  (void)state;
  ht *t = start("redirect", "redir1", NULL);
  send_turn(t, hello);
  assert_contains(failure_of(t, "invalid_argument"), "redirect");
  stop(t);
}

static berth_model *make_unreachable(ht *t, void *ud)
{
  (void)ud;
  berth_openai_options oo;
  berth_openai_options_init(&oo);
  oo.url = "http://127.0.0.1:1/v1";
  oo.model = "m";
  oo.api_key = KEY;
  berth_model_options mo = {t->loop, NULL, NULL, NULL};
  char *err = NULL;
  berth_model *m = berth_openai_new(&oo, &mo, &err);
  assert_non_null(m);
  return m;
}

static void test_openai_unreachable_server_is_an_error(void **state)
{
  (void)state;
  ht *t = start_with(make_unreachable, NULL);
  send_turn(t, hello);
  assert_contains(failure_of(t, "unavailable"), "cannot reach the model provider");
  stop(t);
}

/* The conversation is freed while the model streams: the call is cancelled (its
 * callback runs before cancel returns), nothing leaks, the host goes on. */
static void test_openai_call_cancelled_when_its_conversation_is_freed(void **state)
{
  (void)state;
  ht *t = start("hold", "hold2", NULL);
  assert_int_equal(berth_conv_send(t->conv, hello), 0);
  assert_true(ht_wait(t, has_delta, NULL, WAIT));
  berth_conv_free(t->conv);
  t->conv = NULL;
  fake_release("hold2");
  /* a new conversation on the same model still works */
  t->conv = berth_conv_new(t->host, "run-p", NULL);
  assert_int_equal(berth_conv_send(t->conv, hello), 0);
  assert_true(ht_wait_events(t, "turnEnd", 1, WAIT));
  assert_int_equal(fake_count("hold2"), 2);
  stop(t);
}

/* Two conversations stream from one model (one multi handle) at the same time. */
static void test_openai_concurrent_calls_share_one_client(void **state)
{
  (void)state;
  ht *t = start("text", "conc1", NULL);
  berth_conv *other = berth_conv_new(t->host, "run-q", NULL);
  assert_int_equal(berth_conv_send(t->conv, hello), 0);
  assert_int_equal(berth_conv_send(other, hello), 0);
  assert_true(ht_wait_events(t, "turnEnd", 2, WAIT));
  assert_int_equal(ht_count(t, "reply"), 2);
  for (int i = 0; i < 2; i++)
    assert_string_equal(content_of(ht_event(t, "reply", i)), "Hello, wörld — ünïcödé ✓ 🚀!");
  assert_int_equal(fake_count("conc1"), 2);
  berth_conv_free(other);
  stop(t);
}

/* }====================================================== */

/* {====================================================== construction and environment */

static char *try_new(const char *url, bool insecure, const char *model, const char *key)
{
  struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
  berth_openai_options oo;
  berth_openai_options_init(&oo);
  oo.url = url;
  oo.insecure_http = insecure;
  oo.model = model;
  oo.api_key = key;
  berth_model_options mo = {loop, NULL, NULL, NULL};
  char *err = NULL;
  berth_model *m = berth_openai_new(&oo, &mo, &err);
  berth_model_free(m);
  ev_loop_destroy(loop);
  assert_true((m == NULL) == (err != NULL));
  if (err)
    assert_null(strstr(err, KEY));
  return err;
}

static void test_openai_url_model_and_key_rules(void **state)
{
  (void)state;
  char *e;
  assert_null(try_new("http://127.0.0.1:11434/v1", false, "m", NULL));
  assert_null(try_new("http://localhost:8080/v1/", false, "m", KEY));
  assert_null(try_new("http://[::1]:8080/v1/chat/completions", false, "m", KEY));
  assert_null(try_new("https://api.example.com/v1", false, "m", KEY));
  assert_null(try_new("http://10.0.0.5:8000/v1", true, "m", KEY));
  e = try_new("http://10.0.0.5:8000/v1", false, "m", KEY);
  assert_contains(e, "BERTH_MODEL_INSECURE_HTTP=1");
  free(e);
  e = try_new("http://127.evil.example/v1", false, "m", KEY);
  assert_contains(e, "cleartext");
  free(e);
  e = try_new("https://user:" KEY "@api.example.com/v1", false, "m", NULL);
  assert_contains(e, "user or password");
  free(e);
  e = try_new("https://api.example.com/v1?x=1", false, "m", KEY);
  assert_contains(e, "query");
  free(e);
  e = try_new("ftp://api.example.com/v1", false, "m", KEY);
  assert_contains(e, "http or https");
  free(e);
  e = try_new("http://127.0.0.1/v1", false, NULL, KEY);
  assert_contains(e, "set BERTH_MODEL");
  free(e);
  e = try_new("http://127.0.0.1/v1", false, "m", "sk-a\r\nX-Injected: 1");
  assert_contains(e, "line break");
  free(e);
  /* the name goes into every request body as a JSON string */
  e = try_new("http://127.0.0.1/v1", false, "llama\xff", KEY);
  assert_contains(e, "is not UTF-8 text");
  free(e);
}

static void clear_env(void)
{
  unsetenv("BERTH_MODEL_URL");
  unsetenv("BERTH_MODEL");
  unsetenv("BERTH_API_KEY");
  unsetenv("BERTH_MODEL_INSECURE_HTTP");
  unsetenv("BERTH_MODEL_TIMEOUT");
}

static berth_model *make_from_env(ht *t, void *ud)
{
  berth_model_options mo = {t->loop, NULL, NULL, NULL};
  char *err = NULL;
  berth_model *m = berth_model_new(ud, &mo, &err);
  if (!m)
    fail_msg("berth_model_new(%s): %s", (const char *)ud, err);
  return m;
}

/* `--model openai` reads BERTH_MODEL_URL, BERTH_API_KEY and BERTH_MODEL;
 * `openai:NAME` overrides the model. */
static void test_openai_selected_by_spec_from_the_environment(void **state)
{
  (void)state;
  char url[512];
  snprintf(url, sizeof url, "%s/text/env1/v1", fake_url);
  clear_env();
  setenv("BERTH_MODEL_URL", url, 1);
  setenv("BERTH_API_KEY", KEY, 1);
  setenv("BERTH_MODEL", "model-from-env", 1);
  ht *t = start_with(make_from_env, "openai");
  send_turn(t, hello);
  assert_string_equal(content_of(reply_of(t)), "Hello, wörld — ünïcödé ✓ 🚀!");
  stop(t);
  t = start_with(make_from_env, "openai:model-from-spec");
  send_turn(t, hello);
  stop(t);
  json_t *s = fake_stats("env1");
  const json_t *bodies = json_object_get(s, "bodies");
  assert_string_equal(json_string_value(json_object_get(json_array_get(bodies, 0), "model")),
                      "model-from-env");
  assert_string_equal(json_string_value(json_object_get(json_array_get(bodies, 1), "model")),
                      "model-from-spec");
  assert_string_equal(json_string_value(json_array_get(json_object_get(s, "auth"), 0)),
                      "Bearer " KEY);
  json_decref(s);

  struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
  berth_model_options mo = {loop, NULL, NULL, NULL};
  char *err = NULL;
  setenv("BERTH_MODEL_TIMEOUT", "soon", 1);
  assert_null(berth_model_new("openai", &mo, &err));
  assert_contains(err, "BERTH_MODEL_TIMEOUT");
  free(err);
  unsetenv("BERTH_MODEL");
  unsetenv("BERTH_MODEL_TIMEOUT");
  assert_null(berth_model_new("openai", &mo, &err));
  assert_contains(err, "BERTH_MODEL");
  free(err);
  assert_null(berth_model_new("gpt", &mo, &err));
  assert_contains(err, "openai");
  free(err);
  ev_loop_destroy(loop);
  clear_env();
}

/* }====================================================== */

/* {====================================================== the stream assembler alone */

typedef struct shown {
  char text[256];
  int calls;
  bool cut;                     /* a delta ended inside a UTF-8 sequence */
} shown;

static void on_shown(void *ud, const char *text, size_t len)
{
  shown *s = ud;
  size_t have = strlen(s->text);
  assert_true(have + len < sizeof s->text);
  memcpy(s->text + have, text, len);
  s->text[have + len] = '\0';
  s->calls++;
  unsigned char last = (unsigned char)text[len - 1];
  if (last >= 0xC0)
    s->cut = true;
}

/* Feeds events (each a JSON text, or "[DONE]") and returns the reply or NULL. */
static json_t *assemble(shown *sh, const char *const *events, const char **code, char **err)
{
  berth_oai_stream *s = berth_oai_stream_new(sh ? on_shown : NULL, sh);
  for (const char *const *e = events; *e; e++) {
    char line[2048];
    int n = snprintf(line, sizeof line, "data: %s\n\n", *e);
    if (berth_oai_stream_feed(s, line, (size_t)n) != 0)
      break;
  }
  json_t *reply = berth_oai_stream_finish(s, code, err);
  berth_oai_stream_free(s);
  return reply;
}

#define TC(frag) "{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[" frag "]}}]}"
#define FINISH(why) "{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"" why "\"}]}"

static json_t *assemble_ok(shown *sh, const char *const *events)
{
  const char *code;
  char *err;
  json_t *reply = assemble(sh, events, &code, &err);
  if (!reply)
    fail_msg("%s: %s", code, err);
  return reply;
}

static const json_t *call_at(const json_t *reply, size_t i)
{
  return json_array_get(json_object_get(reply, "tool_calls"), i);
}

/* Servers that reuse index 0 for a second call with a new id (docs/architecture.md §6.2). */
static void test_openai_stream_reused_index_with_a_new_id_starts_a_new_call(void **state)
{
  (void)state;
  const char *ev[] = {
    TC("{\"index\":0,\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}"),
    TC("{\"index\":0,\"function\":{\"arguments\":\"{\\\"a\\\":1}\"}}"),
    TC("{\"index\":0,\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{\\\"b\\\"\"}}"),
    TC("{\"index\":0,\"id\":\"c2\",\"function\":{\"arguments\":\":2}\"}}"),
    FINISH("tool_calls"), "[DONE]", NULL};
  json_t *r = assemble_ok(NULL, ev);
  assert_int_equal(json_array_size(json_object_get(r, "tool_calls")), 2);
  assert_call(call_at(r, 0), "c1", "f", "{\"a\":1}");
  assert_call(call_at(r, 1), "c2", "g", "{\"b\":2}");
  json_decref(r);
}

/* id only in the first fragment, the name only in the last (agentscope-java#1223),
 * a name repeated in every fragment, and arguments sent as JSON rather than text. */
static void test_openai_stream_late_name_repeated_name_and_object_arguments(void **state)
{
  (void)state;
  const char *ev[] = {
    TC("{\"index\":0,\"id\":\"c1\",\"function\":{\"arguments\":\"{\\\"x\\\":\"}}"),
    TC("{\"index\":0,\"function\":{\"arguments\":\"3}\"}}"),
    TC("{\"index\":0,\"function\":{\"name\":\"late\"}}"),
    TC("{\"index\":1,\"id\":\"c2\",\"function\":{\"name\":\"same\",\"arguments\":\"{\"}}"),
    TC("{\"index\":1,\"function\":{\"name\":\"same\",\"arguments\":\"}\"}}"),
    TC("{\"index\":2,\"id\":\"c3\",\"function\":{\"name\":\"obj\",\"arguments\":{\"k\":[1,2]}}}"),
    TC("{\"index\":3,\"id\":\"c4\",\"function\":{\"name\":\"noargs\"}}"),
    FINISH("tool_calls"), NULL};
  json_t *r = assemble_ok(NULL, ev);
  assert_call(call_at(r, 0), "c1", "late", "{\"x\":3}");
  assert_call(call_at(r, 1), "c2", "same", "{}");
  assert_call(call_at(r, 2), "c3", "obj", "{\"k\":[1,2]}");
  assert_call(call_at(r, 3), "c4", "noargs", "{}");
  json_decref(r);
}

/* Fragments without an index follow their id, else the latest call. */
static void test_openai_stream_fragments_without_index_follow_ids(void **state)
{
  (void)state;
  const char *ev[] = {
    TC("{\"id\":\"a\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"n\\\":\"}}"),
    TC("{\"id\":\"b\",\"function\":{\"name\":\"g\",\"arguments\":\"[\"}}"),
    TC("{\"id\":\"a\",\"function\":{\"arguments\":\"1}\"}}"),
    TC("{\"function\":{\"arguments\":\"]\"}}"),
    FINISH("tool_calls"), NULL};
  json_t *r = assemble_ok(NULL, ev);
  assert_call(call_at(r, 0), "a", "f", "{\"n\":1}");
  assert_call(call_at(r, 1), "b", "g", "[]");
  json_decref(r);
}

/* (choice, index) is the key: choice 1's index 0 is not choice 0's; the reply is the
 * first choice's. */
static void test_openai_stream_choices_keyed_apart(void **state)
{
  (void)state;
  const char *ev[] = {
    "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"zero\",\"tool_calls\":[{\"index\":0,"
    "\"id\":\"c0\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"c\\\":\"}}]}},"
    "{\"index\":1,\"delta\":{\"content\":\"one\",\"tool_calls\":[{\"index\":0,\"id\":\"d0\","
    "\"function\":{\"name\":\"h\",\"arguments\":\"{\\\"d\\\":\"}}]}}]}",
    "{\"choices\":[{\"index\":1,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":"
    "{\"arguments\":\"1}\"}}]}},{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,"
    "\"function\":{\"arguments\":\"0}\"}}]},\"finish_reason\":\"tool_calls\"}]}",
    "{\"choices\":[],\"usage\":{\"total_tokens\":3}}", "[DONE]", NULL};
  shown sh = {"", 0, false};
  json_t *r = assemble_ok(&sh, ev);
  assert_string_equal(json_string_value(json_object_get(r, "content")), "zero");
  assert_string_equal(sh.text, "zero");
  assert_int_equal(json_array_size(json_object_get(r, "tool_calls")), 1);
  assert_call(call_at(r, 0), "c0", "f", "{\"c\":0}");
  json_decref(r);
}

static void test_openai_stream_delta_holds_back_an_incomplete_code_point(void **state)
{
  (void)state;
  const char *ev[] = {
    "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"caf\xC3\"}}]}",
    "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\xA9 \xF0\x9F\x9A\"}}]}",
    "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\x80!\"},\"finish_reason\":\"stop\"}]}",
    NULL};
  shown sh = {"", 0, false};
  json_t *r = assemble_ok(&sh, ev);
  assert_string_equal(json_string_value(json_object_get(r, "content")), "café 🚀!");
  assert_string_equal(sh.text, "café 🚀!");
  assert_int_equal(sh.calls, 3);
  assert_false(sh.cut);
  json_decref(r);
}

static void test_openai_stream_errors(void **state)
{
  (void)state;
  static const struct {
    const char *events[4];
    const char *code, *says;
  } cases[] = {
    {{"{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"cut\"}}]}", NULL},
     "unavailable", "no finish_reason and no [DONE]"},
    {{TC("{\"index\":0,\"id\":\"c\",\"function\":{\"arguments\":\"{}\"}}"), FINISH("tool_calls"),
      NULL}, "protocol", "never got a function name"},
    {{"{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\xFF\"}}]}", FINISH("stop"), NULL},
     "protocol", "not valid UTF-8"},
    {{"[1,2]", NULL}, "protocol", "not a JSON object"},
    {{"{\"choices\":[\"x\"]}", NULL}, "protocol", "a choice is not an object"},
    {{"{\"error\":{\"message\":\"overloaded\"}}", NULL}, "unavailable", "overloaded"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *code;
    char *err;
    assert_null(assemble(NULL, cases[i].events, &code, &err));
    assert_string_equal(code, cases[i].code);
    assert_contains(err, cases[i].says);
    free(err);
  }
}

/* }====================================================== */

/* {====================================================== a whole turn with executeCode */

static sbx_proc sbxd;

static berth_model *make_agent(ht *t, void *ud)
{
  (void)ud;
  return model_for(t, "agent", "agent1", NULL);
}

static void test_openai_whole_turn_with_execute_code_against_sandboxd(void **state)
{
  (void)state;
  assert_int_equal(sbx_start(&sbxd, NULL), 0);
  ht *t = calloc(1, sizeof *t);
  ht_init(t);
  t->model = make_agent(t, NULL);
  ht_host(t, "scripts/code_chat.lua", sbxd.url, sbxd.token, NULL);
  t->conv = berth_conv_new(t->host, "run-agent", NULL);
  send_turn(t, "define x");
  send_turn(t, "and add one");
  assert_int_equal(ht_count(t, "toolCall"), 2);
  assert_call(ht_event(t, "toolCall", 0), "call_turn1", "executeCode",
              "{\"code\": \"x = 41\", \"language\": \"python\"}");
  const json_t *r0 = json_object_get(ht_event(t, "toolResult", 0), "result");
  const json_t *r1 = json_object_get(ht_event(t, "toolResult", 1), "result");
  assert_string_equal(json_string_value(json_object_get(r0, "stdout")), "python 1: x = 41");
  assert_string_equal(json_string_value(json_object_get(r1, "stdout")), "python 2: x + 1");
  assert_true(json_is_true(json_object_get(r1, "stateKept")));
  /* the model saw the tool results: its answers quote them */
  assert_string_equal(json_string_value(ht_event(t, "assistant", 0)),
                      "The sandbox said: python 1: x = 41");
  assert_string_equal(json_string_value(ht_event(t, "assistant", 1)),
                      "The sandbox said: python 2: x + 1");
  assert_true(ht_count(t, "delta") >= 2);
  /* what the model was sent: the system prompt, the tool, the results */
  json_t *s = fake_stats("agent1");
  const json_t *bodies = json_object_get(s, "bodies");
  assert_int_equal(json_array_size(bodies), 4);
  const json_t *first = json_array_get(bodies, 0);
  assert_string_equal(json_string_value(json_object_get(
                        json_array_get(json_object_get(first, "messages"), 0), "role")), "system");
  assert_string_equal(json_string_value(json_object_get(json_object_get(
                        json_array_get(json_object_get(first, "tools"), 0), "function"), "name")),
                      "executeCode");
  const json_t *msgs = json_object_get(json_array_get(bodies, 1), "messages");
  const json_t *tool_msg = json_array_get(msgs, json_array_size(msgs) - 1);
  assert_string_equal(json_string_value(json_object_get(tool_msg, "role")), "tool");
  assert_string_equal(json_string_value(json_object_get(tool_msg, "tool_call_id")), "call_turn1");
  const json_t *asked = json_array_get(msgs, json_array_size(msgs) - 2);
  assert_null(json_object_get(asked, "content"));
  assert_call(json_array_get(json_object_get(asked, "tool_calls"), 0), "call_turn1",
              "executeCode", "{\"code\": \"x = 41\", \"language\": \"python\"}");
  json_decref(s);
  assert_true(ht_complete(t, WAIT));
  stop(t);
  sbx_stop(&sbxd);
}

/* }====================================================== */

int main(void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_openai_text_deltas_reach_on_delta_in_order),
    cmocka_unit_test(test_openai_deltas_arrive_before_the_stream_ends),
    cmocka_unit_test(test_openai_crlf_cr_comments_and_multiline_data),
    cmocka_unit_test(test_openai_utf8_split_inside_json_strings_reassembled),
    cmocka_unit_test(test_openai_stream_without_done_but_with_finish_reason_accepted),
    cmocka_unit_test(test_openai_non_streamed_json_answer_accepted),
    cmocka_unit_test(test_openai_split_tool_call_arguments_assembled),
    cmocka_unit_test(test_openai_body_written_from_the_hooks_tables),
    cmocka_unit_test(test_openai_parallel_tool_calls_kept_apart),
    cmocka_unit_test(test_openai_retry_after_429_then_success),
    cmocka_unit_test(test_openai_5xx_retried_until_success),
    cmocka_unit_test(test_openai_5xx_storm_gives_up_after_max_attempts),
    cmocka_unit_test(test_openai_attempts_are_bounded_by_the_option),
    cmocka_unit_test(test_openai_no_retry_after_stream_bytes_arrived),
    cmocka_unit_test(test_openai_401_names_the_key_problem_without_the_key),
    cmocka_unit_test(test_openai_malformed_stream_is_an_error),
    cmocka_unit_test(test_openai_invalid_utf8_at_the_end_is_an_error),
    cmocka_unit_test(test_openai_stalled_stream_hits_the_idle_timeout),
    cmocka_unit_test(test_openai_redirect_is_not_followed),
    cmocka_unit_test(test_openai_unreachable_server_is_an_error),
    cmocka_unit_test(test_openai_call_cancelled_when_its_conversation_is_freed),
    cmocka_unit_test(test_openai_concurrent_calls_share_one_client),
    cmocka_unit_test(test_openai_url_model_and_key_rules),
    cmocka_unit_test(test_openai_selected_by_spec_from_the_environment),
    cmocka_unit_test(test_openai_stream_reused_index_with_a_new_id_starts_a_new_call),
    cmocka_unit_test(test_openai_stream_late_name_repeated_name_and_object_arguments),
    cmocka_unit_test(test_openai_stream_fragments_without_index_follow_ids),
    cmocka_unit_test(test_openai_stream_choices_keyed_apart),
    cmocka_unit_test(test_openai_stream_delta_holds_back_an_incomplete_code_point),
    cmocka_unit_test(test_openai_stream_errors),
    cmocka_unit_test(test_openai_whole_turn_with_execute_code_against_sandboxd),
  };
  return cmocka_run_group_tests_name("openai", tests, group_setup, group_teardown);
}

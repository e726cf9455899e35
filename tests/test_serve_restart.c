/*
 * test_serve_restart.c — conversations outlive `berth serve` (issue 13): the real
 * binary on its default store (sqlite:<state dir>/berth.db), a real sandboxd (provider
 * echo: a cell answers "<language> <n>: <code>"), HTTP from libcurl.  The server is
 * stopped (SIGTERM, or SIGKILL in the middle of a turn) and started again on the same
 * state directory and tokens.
 *
 * The model is scripted with `template = true`: each turn runs one cell whose code is
 * the user's message, then says "ran: <message>".  With the shipped hooks a turn adds
 * four messages to ctx.messages (user, the assistant's call, the tool result, the
 * answer) after the system message of the first turn.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <jansson.h>

#include "sbxproc.h"
#include "servetest.h"

#define WAIT 20.0

static const char script[] =
  "return { template = true, loop = true, turns = {\n"
  "  { user = '*', replies = {\n"
  "    { call = { code = '{{user}}' } },\n"
  "    { say = 'ran: {{user}}' } } } } }\n";

static sbx_proc sbxd;

static int group_setup(void **state)
{
  (void)state;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  return sbx_start(&sbxd, NULL);
}

static int group_teardown(void **state)
{
  (void)state;
  sbx_stop(&sbxd);
  curl_global_cleanup();
  return 0;
}

static const char *const server_args[] = {"--daemon", NULL, "--token-file-daemon", NULL,
                                          "--max-sandboxes", "16", NULL};

static const char *const *args(void)
{
  static const char *a[8];
  memcpy(a, server_args, sizeof server_args);
  a[1] = sbxd.url;
  a[3] = sbxd.token_file;
  return a;
}

/* args() and one more option with its value (one static array: one use at a time). */
static const char *const *args_and(const char *option, const char *value)
{
  static const char *a[12];
  size_t k = 0;
  for (const char *const *p = args(); *p; p++)
    a[k++] = *p;
  a[k++] = option;
  a[k++] = value;
  a[k] = NULL;
  return a;
}

static void create(st_server *s, int caller, char id[40])
{
  json_t *j = NULL;
  assert_int_equal(st_call_json("POST", st_url(s, "/v1/conversations"), s->token[caller],
                                "{\"userId\": \"u\", \"metadata\": {\"n\": 1}}", &j), 201);
  snprintf(id, 40, "%s", json_string_value(json_object_get(j, "id")));
  json_decref(j);
}

/* One turn; the events (NULL unless 200), *raw the stream's text when asked for. */
static json_t *turn(st_server *s, int caller, const char *id, const char *message,
                    long *status, char **raw)
{
  json_t *body = json_pack("{s:s}", "content", message);
  char *text = json_dumps(body, JSON_COMPACT);
  json_decref(body);
  char *out = NULL;
  *status = st_call("POST", st_url(s, "/v1/conversations/%s/messages", id), s->token[caller],
                    text, &out);
  free(text);
  json_t *events = *status == 200 ? st_sse_parse(out, strlen(out)) : NULL;
  if (raw)
    *raw = out;
  else
    free(out);
  return events;
}

/* Starts the turn of message `body` in conversation `id` on stream `st` of `m`, and
 * waits until its tool call is out: the turn is running (a slow echo cell). */
static void start_turn(st_server *s, CURLM *m, st_stream *st, const char *id, const char *body)
{
  st_stream_start(st, m, st_url(s, "/v1/conversations/%s/messages", id), s->token[0], body);
  st_seen w = {st, "event: tool_call"};
  assert_true(st_pump(m, st_saw, &w, WAIT));
}

static json_t *event_named(json_t *events, const char *name)
{
  size_t i;
  json_t *e;
  json_array_foreach(events, i, e)
    if (!strcmp(json_string_value(json_object_get(e, "event")), name))
      return json_object_get(e, "data");
  return NULL;
}

static bool fresh_sandbox(json_t *events)
{
  json_t *r = json_object_get(event_named(events, "tool_result"), "result");
  return json_is_true(json_object_get(r, "freshSandbox"));
}

static json_t *history(st_server *s, const char *id)
{
  json_t *j = NULL;
  assert_int_equal(st_call_json("GET", st_url(s, "/v1/conversations/%s/messages", id),
                                s->token[0], NULL, &j), 200);
  json_t *m = json_incref(json_object_get(j, "messages"));
  json_decref(j);
  return m;
}

static int conversations_wanted(void)
{
  const char *n = getenv("BERTH_RESTART_CONVERSATIONS");
  return n && atoi(n) > 0 ? atoi(n) : 200;   /* the 1 000: set it (~110 s here) */
}

static void stop(st_server *s)
{
  int status = st_stop(s);
  if (status != 0) {
    char *log = st_read_log(s);
    fprintf(stderr, "serve log:\n%s\n", log ? log : "");
    free(log);
  }
  assert_int_equal(status, 0);
  free(s);
}

/* {====================================================== restart */

/* 200 conversations (BERTH_RESTART_CONVERSATIONS=1000 for the figure), one turn each, then a restart: all are listed, every history
 * is intact, each next message resumes it (turn 2) in a fresh sandbox, and the model
 * is told so (the tool result it reads says freshSandbox).  Unknown and other
 * callers' ids are still 404. */
static void test_restart_keeps_every_conversation_history_and_state(void **state)
{
  (void)state;
  int n = conversations_wanted();
  st_server *s = calloc(1, sizeof *s);
  assert_int_equal(st_start(s, script, args()), 0);
  char (*ids)[40] = calloc((size_t)n, sizeof *ids);
  double t0 = st_now();
  for (int i = 0; i < n; i++) {
    create(s, 0, ids[i]);
    char code[32];
    snprintf(code, sizeof code, "x = %d", i);
    long status;
    json_t *ev = turn(s, 0, ids[i], code, &status, NULL);
    assert_int_equal(status, 200);
    assert_true(json_is_true(json_object_get(event_named(ev, "turn_end"), "ok")));
    json_decref(ev);
  }
  /* The first conversation's second turn before the restart: its sandbox is kept. */
  long status;
  json_t *ev = turn(s, 0, ids[n - 1], "y = 1", &status, NULL);
  assert_int_equal(status, 200);
  assert_false(fresh_sandbox(ev));
  json_decref(ev);
  double t1 = st_now();

  assert_int_equal(st_restart(s, SIGTERM, args()), 0);
  double t2 = st_now();

  /* Listed, newest first, in pages, exactly once each. */
  int listed = 0;
  char cursor[32] = "";
  for (;;) {
    json_t *j = NULL;
    assert_int_equal(st_call_json("GET", st_url(s, "/v1/conversations?limit=300%s%s",
                                             *cursor ? "&cursor=" : "", cursor),
                                  s->token[0], NULL, &j), 200);
    json_t *list = json_object_get(j, "conversations");
    size_t i;
    json_t *c;
    json_array_foreach(list, i, c) {
      assert_string_equal(json_string_value(json_object_get(c, "id")), ids[n - 1 - listed]);
      assert_string_equal(json_string_value(json_object_get(c, "userId")), "u");
      listed++;
    }
    json_t *next = json_object_get(j, "nextCursor");
    if (!json_is_string(next)) {
      json_decref(j);
      break;
    }
    snprintf(cursor, sizeof cursor, "%s", json_string_value(next));
    json_decref(j);
  }
  assert_int_equal(listed, n);
  json_t *other = NULL;
  assert_int_equal(st_call_json("GET", st_url(s, "/v1/conversations"), s->token[1], NULL,
                                &other), 200);
  assert_int_equal(json_array_size(json_object_get(other, "conversations")), 0);
  json_decref(other);

  int resumed = 0, fresh = 0, intact = 0;
  for (int i = 0; i < n; i++) {
    json_t *m = history(s, ids[i]);
    char want[32];
    snprintf(want, sizeof want, "x = %d", i);
    size_t expect = i == n - 1 ? 9 : 5;
    if (json_array_size(m) == expect &&
        !strcmp(json_string_value(json_object_get(json_array_get(m, 0), "role")), "system") &&
        !strcmp(json_string_value(json_object_get(json_array_get(m, 1), "content")), want))
      intact++;
    json_decref(m);
    ev = turn(s, 0, ids[i], "z = 2", &status, NULL);
    assert_int_equal(status, 200);
    json_t *end = event_named(ev, "turn_end");
    if (json_integer_value(json_object_get(end, "turn")) == (i == n - 1 ? 3 : 2) &&
        json_is_true(json_object_get(end, "ok")))
      resumed++;
    if (fresh_sandbox(ev))
      fresh++;
    json_decref(ev);
    /* what the model read: the tool message of this turn */
    m = history(s, ids[i]);
    const char *tool = json_string_value(json_object_get(
      json_array_get(m, json_array_size(m) - 2), "content"));
    assert_non_null(tool);
    assert_non_null(strstr(tool, "\"freshSandbox\":true"));
    json_decref(m);
  }
  double t3 = st_now();
  fprintf(stderr, "restart: %d conversations: %.1f s to fill, restart %.2f s, %.1f s to "
                  "resume all\n", n, t1 - t0, t2 - t1, t3 - t2);
  assert_int_equal(intact, n);
  assert_int_equal(resumed, n);
  assert_int_equal(fresh, n);

  /* A wrong id is 404, and so is another caller's; a known one is not. */
  json_t *j = NULL;
  assert_int_equal(st_call_json("POST", st_url(s, "/v1/conversations/%s/messages",
                                            "0123456789abcdef0123456789abcdef"),
                                s->token[0], "{\"content\": \"a\"}", &j), 404);
  assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                      "not_found");
  json_decref(j);
  ev = turn(s, 1, ids[0], "a", &status, NULL);
  assert_int_equal(status, 404);
  assert_int_equal(st_call("GET", st_url(s, "/v1/conversations/%s/messages", ids[0]),
                           s->token[1], NULL, NULL), 404);
  assert_int_equal(st_call("GET", st_url(s, "/v1/conversations/%s", ids[0]), s->token[0], NULL,
                           NULL), 200);
  /* the log holds no token (conversations it names by their public id) */
  char *log = st_read_log(s);
  assert_non_null(log);
  assert_null(strstr(log, s->token[0]));
  free(log);
  free(ids);
  stop(s);
}

/* }====================================================== */

/* {====================================================== interrupted */

/* A turn running when its host is SIGKILLed is marked interrupted: replaying its
 * events (?after=N; Last-Event-ID is read the same way) ends in an `error` event with code interrupted
 * and a failed turn_end; the conversation is listed interrupted and goes on with its
 * next message (turn 2, a fresh sandbox). */
static void test_turn_running_at_sigkill_is_marked_interrupted(void **state)
{
  (void)state;
  st_server *s = calloc(1, sizeof *s);
  assert_int_equal(st_start(s, script, args()), 0);
  char id[40];
  create(s, 0, id);
  CURLM *m = curl_multi_init();
  st_stream st = {0};
  start_turn(s, m, &st, id, "{\"content\": \"plimsoll-echo:sleep:3000\"}");
  assert_non_null(memmem(st.buf, st.len, "id: ", 4));   /* SSE events carry ids */
  assert_int_equal(st_restart(s, SIGKILL, args()), 128 + SIGKILL);
  st_pump(m, st_done, &st, WAIT);
  st_stream_free(&st, m);

  char *raw = NULL;
  assert_int_equal(st_call("GET", st_url(s, "/v1/conversations/%s/events?after=0", id),
                           s->token[0], NULL, &raw), 200);
  json_t *ev = st_sse_parse(raw, strlen(raw));
  free(raw);
  size_t k = json_array_size(ev);
  if (k < 4) {
    char *dump = json_dumps(ev, 0);
    char *log = st_read_log(s);
    fail_msg("events after the restart: %s\nlog:\n%s", dump, log);
  }
  assert_string_equal(json_string_value(json_object_get(json_array_get(ev, 0), "event")),
                      "user");
  assert_string_equal(json_string_value(json_object_get(json_array_get(ev, k - 2), "event")),
                      "error");
  json_t *err = json_object_get(json_array_get(ev, k - 2), "data");
  assert_string_equal(json_string_value(json_object_get(err, "code")), "interrupted");
  json_t *end = json_object_get(json_array_get(ev, k - 1), "data");
  assert_true(json_is_false(json_object_get(end, "ok")));
  assert_int_equal(json_integer_value(json_object_get(end, "turn")), 1);
  json_decref(ev);

  /* after=N: only what came after that event (the error, the turn's end) */
  assert_int_equal(st_call("GET", st_url(s, "/v1/conversations/%s/events?after=%zu", id, k - 2),
                           s->token[0], NULL, &raw), 200);
  ev = st_sse_parse(raw, strlen(raw));
  free(raw);
  assert_int_equal(json_array_size(ev), 2);
  assert_string_equal(json_string_value(json_object_get(json_array_get(ev, 0), "event")),
                      "error");
  json_decref(ev);
  json_t *list = NULL;
  assert_int_equal(st_call_json("GET", st_url(s, "/v1/conversations"), s->token[0], NULL, &list),
                   200);
  assert_string_equal(json_string_value(json_object_get(
    json_array_get(json_object_get(list, "conversations"), 0), "status")), "interrupted");
  json_decref(list);

  long status;
  ev = turn(s, 0, id, "x = 1", &status, NULL);
  assert_int_equal(status, 200);
  assert_int_equal(json_integer_value(json_object_get(event_named(ev, "turn_end"), "turn")), 2);
  assert_true(fresh_sandbox(ev));
  json_decref(ev);
  curl_multi_cleanup(m);
  stop(s);
}

/* One host alone on a SQLite file (docs/many-hosts.md): a second `berth serve` on the
 * file of one that is in a turn does not start -- it would have marked that turn
 * interrupted -- and the turn ends as it would have. */
static void test_a_second_host_on_the_same_sqlite_file_is_refused(void **state)
{
  (void)state;
  st_server *s = calloc(1, sizeof *s);
  assert_int_equal(st_start(s, script, args()), 0);
  char id[40];
  create(s, 0, id);
  CURLM *m = curl_multi_init();
  st_stream st = {0};
  start_turn(s, m, &st, id, "{\"content\": \"plimsoll-echo:sleep:1500\"}");

  char store[200];
  snprintf(store, sizeof store, "sqlite:%s/berth.db", s->dir);
  const char *const *extra = args_and("--store", store);
  st_server *other = calloc(1, sizeof *other);
  assert_int_equal(st_start_like(other, s, script, extra), -1);
  free(other);

  assert_true(st_pump(m, st_done, &st, WAIT));
  json_t *ev = st_sse_parse(st.buf, st.len);
  json_t *end = event_named(ev, "turn_end");
  assert_non_null(end);
  assert_true(json_is_true(json_object_get(end, "ok")));
  assert_null(event_named(ev, "error"));
  json_decref(ev);
  st_stream_free(&st, m);
  curl_multi_cleanup(m);
  stop(s);
}

/* {====================================================== message ids */

typedef struct answer {
  long status;
  char *body;
  size_t len;
  bool replayed;                 /* X-Berth-Replayed: 1 */
  bool retry_after;
} answer;

static size_t on_answer_body(char *p, size_t size, size_t n, void *ud)
{
  answer *a = ud;
  a->body = realloc(a->body, a->len + size * n + 1);
  memcpy(a->body + a->len, p, size * n);
  a->len += size * n;
  a->body[a->len] = 0;
  return size * n;
}

static size_t on_answer_header(char *p, size_t size, size_t n, void *ud)
{
  answer *a = ud;
  if (size * n >= 19 && !strncasecmp(p, "X-Berth-Replayed: 1", 19))
    a->replayed = true;
  if (size * n >= 12 && !strncasecmp(p, "Retry-After:", 12))
    a->retry_after = true;
  return size * n;
}

/* POST …/messages with the client's id for the message: in the body's messageId, or
 * (header) as an Idempotency-Key. */
static answer post_keyed(st_server *s, const char *id, const char *content, const char *mid,
                         bool header)
{
  answer a = {0};
  json_t *body = json_pack("{s:s}", "content", content);
  if (!header)
    json_object_set_new(body, "messageId", json_string(mid));
  char *text = json_dumps(body, JSON_COMPACT);
  json_decref(body);
  char line[256];
  struct curl_slist *h = NULL;
  snprintf(line, sizeof line, "Authorization: Bearer %s", s->token[0]);
  h = curl_slist_append(h, line);
  h = curl_slist_append(h, "Content-Type: application/json");
  h = curl_slist_append(h, "Expect:");
  if (header) {
    snprintf(line, sizeof line, "Idempotency-Key: %s", mid);
    h = curl_slist_append(h, line);
  }
  CURL *e = curl_easy_init();
  curl_easy_setopt(e, CURLOPT_URL, st_url(s, "/v1/conversations/%s/messages", id));
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
  curl_easy_setopt(e, CURLOPT_POSTFIELDS, text);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_answer_body);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &a);
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_answer_header);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, &a);
  curl_easy_setopt(e, CURLOPT_TIMEOUT, 30L);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  if (curl_easy_perform(e) == CURLE_OK)
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &a.status);
  curl_easy_cleanup(e);
  curl_slist_free_all(h);
  free(text);
  if (!a.body)
    a.body = strdup("");
  return a;
}

/* The events of a 200 answer, checked to be turn `turn`; a replay's start with the
 * stored "user" event (`content`, with message id `mid`), which a live stream does not
 * repeat. */
static json_t *one_turn(answer *a, int turn, const char *content, const char *mid)
{
  if (a->status != 200)
    fail_msg("status %ld: %s", a->status, a->body);
  json_t *ev = st_sse_parse(a->body, a->len);
  json_t *user = event_named(ev, "user");
  if (a->replayed) {
    assert_ptr_equal(user, json_object_get(json_array_get(ev, 0), "data"));
    assert_string_equal(json_string_value(json_object_get(user, "text")), content);
    assert_string_equal(json_string_value(json_object_get(user, "messageId")), mid);
  } else
    assert_null(user);
  assert_int_equal(json_integer_value(json_object_get(event_named(ev, "turn_end"), "turn")),
                   turn);
  free(a->body);
  a->body = NULL;
  return ev;
}

static size_t count_named(json_t *events, const char *name)
{
  size_t i, n = 0;
  json_t *e;
  json_array_foreach(events, i, e)
    n += !strcmp(json_string_value(json_object_get(e, "event")), name);
  return n;
}

/* A message whose id is stored is answered from the store (through its index), never
 * run again: any earlier turn of a longer conversation is replayed whole (body
 * messageId or Idempotency-Key), also after a restart; one still running is 503 busy
 * with Retry-After; one whose host was SIGKILLed in it replays its interrupted end;
 * an unknown id runs. */
static void test_message_id_is_answered_from_the_store(void **state)
{
  (void)state;
  st_server *s = calloc(1, sizeof *s);
  assert_int_equal(st_start(s, script, args()), 0);
  char id[40], mid[32], content[32];
  create(s, 0, id);
  enum { TURNS = 12 };
  for (int t = 1; t <= TURNS; t++) {
    snprintf(mid, sizeof mid, "m-%d", t);
    snprintf(content, sizeof content, "x = %d", t);
    answer a = post_keyed(s, id, content, mid, t % 2);
    assert_false(a.replayed);
    json_decref(one_turn(&a, t, content, mid));
  }
  /* a retry of turn 3 (body), of turn 8 (header): replayed, nothing runs */
  for (int round = 0; round < 2; round++) {
    for (int t = 3; t <= 8; t += 5) {
      snprintf(mid, sizeof mid, "m-%d", t);
      snprintf(content, sizeof content, "x = %d", t);
      answer a = post_keyed(s, id, "ignored", mid, t == 8);
      assert_true(a.replayed);
      json_t *ev = one_turn(&a, t, content, mid);
      assert_int_equal(count_named(ev, "user"), 1);
      assert_int_equal(count_named(ev, "tool_call"), 1);
      assert_int_equal(count_named(ev, "turn_end"), 1);
      json_decref(ev);
    }
    if (round == 0)             /* the same from the store a new process opens */
      assert_int_equal(st_restart(s, SIGTERM, args()), 0);
  }

  /* a turn still running: busy, then its host dies in it and a retry replays its end */
  CURLM *m = curl_multi_init();
  st_stream st = {0};
  start_turn(s, m, &st, id,
             "{\"content\": \"plimsoll-echo:sleep:3000\", \"messageId\": \"slow\"}");
  answer a = post_keyed(s, id, "plimsoll-echo:sleep:3000", "slow", true);
  assert_int_equal(a.status, 503);
  assert_true(a.retry_after);
  assert_non_null(strstr(a.body, "\"busy\""));
  free(a.body);
  assert_int_equal(st_restart(s, SIGKILL, args()), 128 + SIGKILL);
  st_pump(m, st_done, &st, WAIT);
  st_stream_free(&st, m);
  curl_multi_cleanup(m);
  a = post_keyed(s, id, "plimsoll-echo:sleep:3000", "slow", false);
  assert_true(a.replayed);
  json_t *ev = one_turn(&a, TURNS + 1, "plimsoll-echo:sleep:3000", "slow");
  json_t *err = event_named(ev, "error");
  assert_string_equal(json_string_value(json_object_get(err, "code")), "interrupted");
  json_decref(ev);

  /* an id not stored runs (the next turn) */
  a = post_keyed(s, id, "x = 99", "m-new", false);
  assert_false(a.replayed);
  json_decref(one_turn(&a, TURNS + 2, "x = 99", "m-new"));
  stop(s);
}

/* }====================================================== */

/* An Idempotency-Key is held to messageId's rule (1 to 128 bytes, UTF-8): one that
 * breaks it is refused (400) before anything runs, never dropped (a retry would then
 * run the message again). */
static void test_an_idempotency_key_out_of_rule_is_refused(void **state)
{
  (void)state;
  st_server *s = calloc(1, sizeof *s);
  assert_int_equal(st_start(s, script, args()), 0);
  char id[40];
  create(s, 0, id);
  char longkey[130];
  memset(longkey, 'k', 129);
  longkey[129] = 0;
  const char *bad[] = {longkey, "bad\xff" "key"};
  for (size_t i = 0; i < 2; i++) {
    answer a = post_keyed(s, id, "n = 1", bad[i], true);
    assert_int_equal(a.status, 400);
    assert_non_null(strstr(a.body, "Idempotency-Key must be 1 to 128 bytes of UTF-8"));
    free(a.body);
  }
  longkey[128] = 0;             /* 128 bytes: kept, so the retry is answered from the store */
  answer a = post_keyed(s, id, "n = 1", longkey, true);
  json_decref(one_turn(&a, 1, "n = 1", longkey));
  a = post_keyed(s, id, "n = 1", longkey, true);
  assert_true(a.replayed);
  json_decref(one_turn(&a, 1, "n = 1", longkey));
  stop(s);
}

/* While a DELETE waits for the conversation's running turn, the conversation is gone
 * for every other request: 404, never a 500 naming its run id. */
static void test_a_conversation_being_deleted_is_not_found(void **state)
{
  (void)state;
  st_server *s = calloc(1, sizeof *s);
  assert_int_equal(st_start(s, script, args()), 0);
  char id[40];
  create(s, 0, id);
  CURLM *m = curl_multi_init();
  st_stream a = {0}, d = {0};
  start_turn(s, m, &a, id, "{\"content\": \"plimsoll-echo:sleep:1500\"}");
  st_stream_start(&d, m, st_url(s, "/v1/conversations/%s", id), s->token[0], "");
  curl_multi_remove_handle(m, d.easy);
  curl_easy_setopt(d.easy, CURLOPT_CUSTOMREQUEST, "DELETE");
  curl_multi_add_handle(m, d.easy);
  long code = 200;
  char *out = NULL;
  for (int i = 0; i < 200 && code == 200; i++) {   /* until the DELETE has begun */
    int running;
    curl_multi_perform(m, &running);
    curl_multi_poll(m, NULL, 0, 10, NULL);
    free(out);
    out = NULL;
    code = st_call("GET", st_url(s, "/v1/conversations/%s", id), s->token[0], NULL, &out);
  }
  if (code != 404)
    fail_msg("GET while deleting: %ld %s", code, out ? out : "");
  assert_null(strstr(out, "run id"));
  free(out);
  out = NULL;
  assert_int_equal(st_call("POST", st_url(s, "/v1/conversations/%s/messages", id),
                           s->token[0], "{\"content\": \"y = 1\"}", &out), 404);
  free(out);
  out = NULL;
  assert_int_equal(st_call("DELETE", st_url(s, "/v1/conversations/%s", id), s->token[0],
                           NULL, &out), 404);
  free(out);
  assert_true(st_pump(m, st_done, &d, WAIT));
  assert_true(st_pump(m, st_done, &a, WAIT));
  long status = 0;
  curl_easy_getinfo(d.easy, CURLINFO_RESPONSE_CODE, &status);
  assert_true(status == 200 || status == 204);
  st_stream_free(&a, m);
  st_stream_free(&d, m);
  curl_multi_cleanup(m);
  stop(s);
}

/* --max-conversations-per-caller counts what the caller holds in the store from before
 * a restart, loaded or not: a restart makes no room; a deletion does. */
static void test_the_per_caller_cap_holds_across_a_restart(void **state)
{
  (void)state;
  const char *const *extra = args_and("--max-conversations-per-caller", "2");
  st_server *s = calloc(1, sizeof *s);
  assert_int_equal(st_start(s, script, extra), 0);
  char a[40], b[40];
  create(s, 0, a);
  create(s, 0, b);
  const char *body = "{\"userId\": \"u\"}";
  assert_int_equal(st_call("POST", st_url(s, "/v1/conversations"), s->token[0], body, NULL),
                   429);
  assert_int_equal(st_restart(s, SIGTERM, extra), 0);
  assert_int_equal(st_call("POST", st_url(s, "/v1/conversations"), s->token[0], body, NULL),
                   429);
  assert_int_equal(st_call("GET", st_url(s, "/v1/conversations/%s", a), s->token[0], NULL,
                           NULL), 200);                  /* loaded: still two held */
  assert_int_equal(st_call("POST", st_url(s, "/v1/conversations"), s->token[0], body, NULL),
                   429);
  char *out = NULL;
  long st = st_call("DELETE", st_url(s, "/v1/conversations/%s", b), s->token[0], NULL, &out);
  free(out);
  assert_true(st == 200 || st == 204);                   /* never loaded before */
  assert_int_equal(st_call("POST", st_url(s, "/v1/conversations"), s->token[0], body, NULL),
                   201);
  assert_int_equal(st_call("POST", st_url(s, "/v1/conversations"), s->token[0], body, NULL),
                   429);
  stop(s);
}

static bool answered_200(void *stream)
{
  st_stream *st = stream;
  long code = 0;
  curl_easy_getinfo(st->easy, CURLINFO_RESPONSE_CODE, &code);
  return code == 200;
}

/* A message acknowledged (200) and still queued when SIGTERM came ends with
 * "shutting_down" and a turn_end that says it was never taken ("refused"): nothing of
 * it ran, so a retry with its id after the restart runs it (once: the next retry is
 * answered from the store), never replays the shutdown forever. */
static void test_a_message_queued_at_sigterm_runs_when_retried(void **state)
{
  (void)state;
  const char *const *extra = args_and("--max-concurrent-turns", "1");
  st_server *s = calloc(1, sizeof *s);
  assert_int_equal(st_start(s, script, extra), 0);
  char busy[40], queued[40];
  create(s, 0, busy);
  create(s, 0, queued);
  CURLM *m = curl_multi_init();
  st_stream a = {0}, q = {0};
  start_turn(s, m, &a, busy, "{\"content\": \"plimsoll-echo:sleep:1000\"}");
  st_stream_start(&q, m, st_url(s, "/v1/conversations/%s/messages", queued), s->token[0],
                  "{\"content\": \"x = 1\", \"messageId\": \"m-queued\"}");
  assert_true(st_pump(m, answered_200, &q, WAIT));   /* acknowledged, waiting for a slot */
  assert_int_equal(st_restart(s, SIGTERM, extra), 0);
  assert_true(st_pump(m, st_done, &q, WAIT));
  json_t *ev = st_sse_parse(q.buf, q.len);
  json_t *err = event_named(ev, "error");
  assert_non_null(err);
  assert_string_equal(json_string_value(json_object_get(err, "code")), "shutting_down");
  assert_true(json_is_true(json_object_get(event_named(ev, "turn_end"), "refused")));
  json_decref(ev);
  st_stream_free(&a, m);
  st_stream_free(&q, m);
  curl_multi_cleanup(m);

  answer r = post_keyed(s, queued, "x = 1", "m-queued", false);
  assert_false(r.replayed);
  ev = one_turn(&r, 2, "x = 1", "m-queued");
  json_t *end = event_named(ev, "turn_end");
  assert_true(json_is_true(json_object_get(end, "ok")));
  assert_null(json_object_get(end, "refused"));
  assert_int_equal(json_integer_value(json_object_get(end, "cells")), 1);
  json_decref(ev);
  r = post_keyed(s, queued, "x = 1", "m-queued", false);
  assert_true(r.replayed);
  ev = one_turn(&r, 2, "x = 1", "m-queued");
  assert_true(json_is_true(json_object_get(event_named(ev, "turn_end"), "ok")));
  json_decref(ev);
  stop(s);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_turn_running_at_sigkill_is_marked_interrupted),
    cmocka_unit_test(test_restart_keeps_every_conversation_history_and_state),
    cmocka_unit_test(test_message_id_is_answered_from_the_store),
    cmocka_unit_test(test_a_second_host_on_the_same_sqlite_file_is_refused),
    cmocka_unit_test(test_a_message_queued_at_sigterm_runs_when_retried),
    cmocka_unit_test(test_an_idempotency_key_out_of_rule_is_refused),
    cmocka_unit_test(test_a_conversation_being_deleted_is_not_found),
    cmocka_unit_test(test_the_per_caller_cap_holds_across_a_restart),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

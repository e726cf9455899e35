/*
 * model_openai.c — the `openai` model adapter: OpenAI-compatible chat completions
 * with `stream: true` (Ollama, llama.cpp, vLLM, OpenAI and their kin).
 *
 * One call: POST {url}/chat/completions with {model, messages, tools, stream: true},
 * written around the request's texts (model.h: written straight from the hook's
 * tables, never built as a tree); the response's
 * server-sent events are handed, as they arrive and always from the loop (http.c
 * drains outside libcurl's callbacks), to the stream assembler (openai_stream.c),
 * which passes text to `delta` and builds the assistant message at the end.
 *
 * Retries: only on 429 and 5xx, which come before any byte of a stream, so a reply
 * is never half shown and then started again; at most max_attempts tries; the wait
 * doubles from backoff_base (capped at backoff_max) with jitter from RAND_bytes
 * (between half and all of it), and is at least what Retry-After (or retry-after-ms)
 * asks — a longer ask than max_retry_after fails at once instead.  A stream that
 * breaks, a malformed stream and every other status fail without a retry.
 *
 * The API key goes only into the Authorization header: never into a URL (userinfo is
 * refused), a log line or an error message (messages built from what the server sent
 * are scrubbed of it, for servers that echo it back).
 */
#include "berth.h"
#include "plimsoll.h"             /* plm_loopback_host: one rule */
#include "xalloc.h"
#include "http.h"
#include "json_text.h"            /* lib/: the one compact JSON writer */
#include "openai.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <ev.h>
#include <openssl/rand.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define OAI_ATTEMPTS 4
#define OAI_BACKOFF_BASE 0.5
#define OAI_BACKOFF_MAX 8.0
#define OAI_MAX_RETRY_AFTER 60.0
#define OAI_CONNECT_TIMEOUT 10.0
#define OAI_IDLE_TIMEOUT 120.0
#define OAI_TIMEOUT 600.0
#define OAI_ERROR_BODY_MAX ((size_t)64 << 10)   /* kept of an error answer */
#define OAI_WHOLE_BODY_MAX ((size_t)32 << 20)   /* a non-streamed answer */

void berth_openai_options_init(berth_openai_options *o)
{
  memset(o, 0, sizeof *o);
  o->url = BERTH_OPENAI_DEFAULT_URL;
  o->max_attempts = OAI_ATTEMPTS;
  o->backoff_base = OAI_BACKOFF_BASE;
  o->backoff_max = OAI_BACKOFF_MAX;
  o->max_retry_after = OAI_MAX_RETRY_AFTER;
  o->connect_timeout = OAI_CONNECT_TIMEOUT;
  o->idle_timeout = OAI_IDLE_TIMEOUT;
  o->timeout = OAI_TIMEOUT;
}

static char *oai_fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *oai_fmt(const char *f, ...)
{
  va_list ap;
  va_start(ap, f);
  char *s = NULL;
  if (vasprintf(&s, f, ap) < 0)
    s = NULL;
  va_end(ap);
  return s ? s : berth_xstrdup("(out of memory)");
}

int berth_openai_options_env(berth_openai_options *o, char **err)
{
  const char *v;
  *err = NULL;
  if ((v = getenv("BERTH_MODEL_URL")) && *v)
    o->url = v;
  if ((v = getenv("BERTH_API_KEY")) && *v)
    o->api_key = v;
  if ((v = getenv("BERTH_MODEL")) && *v)
    o->model = v;
  if ((v = getenv("BERTH_MODEL_INSECURE_HTTP")) && *v)
    o->insecure_http = strcmp(v, "0") != 0 && strcasecmp(v, "no") != 0 &&
                       strcasecmp(v, "false") != 0;
  if ((v = getenv("BERTH_MODEL_TIMEOUT")) && *v) {
    char *end;
    double t = strtod(v, &end);
    if (end == v || *end || !(t > 0) || t > 86400) {
      *err = oai_fmt("BERTH_MODEL_TIMEOUT must be seconds > 0 (got \"%.40s\")", v);
      return -1;
    }
    o->timeout = t;
  }
  return 0;
}

/* {====================================================== the adapter */

typedef struct openai openai;

/* A call (cast to berth_model_call for the interface). */
typedef struct oai_call {
  struct oai_call *prev, *next;
  openai *m;
  char *body;                   /* the request JSON, sent again on a retry */
  size_t body_len;
  berth_delta_fn delta;
  berth_reply_fn done;
  void *ud;
  int attempt;                  /* tries started */
  berth_http_req *req;          /* the try in flight */
  ev_timer backoff;             /* the wait before the next try */
  berth_oai_stream *stream;     /* a 2xx event stream */
  long status;
  bool sse, whole;              /* 2xx: an event stream, or one JSON body */
  char *text;                   /* an error answer's body, or a non-streamed one */
  size_t text_len, text_cap;
  double retry_after;           /* seconds the server asked to wait, or -1 */
} oai_call;

struct openai {
  berth_model base;
  struct ev_loop *loop;
  berth_http *http;
  char *url;                    /* …/chat/completions */
  char *key;                    /* for scrubbing messages; NULL when none */
  char *auth;                   /* the Authorization header line */
  char *model;
  char *model_json;             /* the model's name as a JSON string */
  bool loopback;
  berth_openai_options o;       /* numbers only; the strings are the copies above */
  oai_call *calls;
};

/* Removes every occurrence of the key from a message (malloc'd; returns it). */
static char *scrub(const openai *m, char *msg)
{
  if (!msg || !m->key || strlen(m->key) < 4)
    return msg;
  size_t kl = strlen(m->key);
  char *p;
  while ((p = strstr(msg, m->key))) {
    static const char mark[] = "[redacted]";
    size_t n = strlen(msg), at = (size_t)(p - msg);
    char *s = berth_xmalloc(n - kl + sizeof mark);
    memcpy(s, msg, at);
    memcpy(s + at, mark, sizeof mark - 1);
    memcpy(s + at + sizeof mark - 1, p + kl, n - at - kl + 1);
    free(msg);
    msg = s;
  }
  return msg;
}

static void call_free(oai_call *c)
{
  openai *m = c->m;
  if (c->prev)
    c->prev->next = c->next;
  else
    m->calls = c->next;
  if (c->next)
    c->next->prev = c->prev;
  ev_timer_stop(m->loop, &c->backoff);
  berth_http_cancel(c->req);
  berth_oai_stream_free(c->stream);
  free(c->body);
  free(c->text);
  free(c);
}

/* Ends the call: frees it, then calls back (which may start another call). */
static void call_end(oai_call *c, json_t *reply, const char *code, char *message)
{
  berth_reply_fn done = c->done;
  void *ud = c->ud;
  message = scrub(c->m, message);
  call_free(c);
  done(ud, reply, code, message);
}

/* What the server said in an error answer: error.message, message or detail from a
 * JSON body, else the start of the text.  malloc'd, or NULL. */
static char *server_says(const oai_call *c)
{
  if (!c->text_len)
    return NULL;
  json_t *j = json_loadb(c->text, c->text_len, 0, NULL);
  const json_t *e = json_object_get(j, "error");
  const char *s = json_string_value(json_object_get(e, "message"));
  if (!s)
    s = json_string_value(e);
  if (!s)
    s = json_string_value(json_object_get(j, "message"));
  if (!s)
    s = json_string_value(json_object_get(j, "detail"));
  char *out;
  if (s)
    out = oai_fmt("%.300s", s);
  else {
    size_t n = c->text_len < 200 ? c->text_len : 200, o = 0;
    out = berth_xmalloc(n + 1);
    for (size_t i = 0; out && i < n; i++)
      if (c->text[i] != '\r' && c->text[i] != '\n')
        out[o++] = (c->text[i] >= 0x20 && c->text[i] < 0x7F) ? c->text[i] : '?';
    if (out)
      out[o] = '\0';
  }
  json_decref(j);
  return out;
}

/* Seconds from Retry-After (seconds or an HTTP date) or retry-after-ms; -1 if none. */
static double retry_after(const berth_http_head *hd)
{
  char *end;
  if (hd->retry_after_ms) {
    double ms = strtod(hd->retry_after_ms, &end);
    if (end != hd->retry_after_ms && ms >= 0)
      return ms / 1000.0;
  }
  if (hd->retry_after) {
    double s = strtod(hd->retry_after, &end);
    if (end != hd->retry_after && s >= 0)
      return s;
    time_t at = curl_getdate(hd->retry_after, NULL);
    if (at != (time_t)-1) {
      double d = difftime(at, time(NULL));
      return d > 0 ? d : 0;
    }
  }
  return -1;
}

/* The wait before try `attempt + 1`: exponential, full jitter in its upper half. */
static double backoff(const openai *m, int attempt, double asked)
{
  double d = m->o.backoff_base;
  for (int i = 1; i < attempt && d < m->o.backoff_max; i++)
    d *= 2;
  if (d > m->o.backoff_max)
    d = m->o.backoff_max;
  uint32_t r = 0;
  if (RAND_bytes((unsigned char *)&r, sizeof r) != 1)
    r = UINT32_MAX / 2;         /* no randomness: no jitter, still a bounded wait */
  d = d / 2 + d / 2 * (r / (double)UINT32_MAX);
  return asked > d ? asked : d;
}

static int start_attempt(oai_call *c);

static void on_backoff(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)revents;
  oai_call *c = w->data;
  ev_timer_stop(loop, w);
  if (start_attempt(c) != 0)
    call_end(c, NULL, "unavailable",
             oai_fmt("the model call could not be sent again to %s", c->m->url));
}

static int on_head(void *ud, const berth_http_head *hd)
{
  oai_call *c = ud;
  c->status = hd->status;
  if (hd->status >= 200 && hd->status < 300) {
    /* Anything but JSON is read as an event stream (some servers label it oddly). */
    c->whole = strncasecmp(hd->content_type, "application/json", 16) == 0;
    c->sse = !c->whole;
    c->stream = berth_oai_stream_new(c->delta, c->ud);
    return c->stream ? 0 : 1;
  }
  c->retry_after = retry_after(hd);
  return 0;
}

static int on_chunk(void *ud, const char *data, size_t len)
{
  oai_call *c = ud;
  if (c->sse)                   /* 1: [DONE]; -1: malformed; either ends the exchange */
    return berth_oai_stream_feed(c->stream, data, len) != 0;
  size_t max = c->whole ? OAI_WHOLE_BODY_MAX : OAI_ERROR_BODY_MAX;
  if (len > max - c->text_len) {
    if (c->whole)
      return 1;                 /* too large: text_len short of received tells */
    len = max - c->text_len;    /* an error answer: its start is enough */
  }
  if (c->text_len + len + 1 > c->text_cap) {
    size_t cap = c->text_cap ? c->text_cap : 4096;
    while (cap < c->text_len + len + 1)
      cap *= 2;
    char *t = berth_xrealloc(c->text, cap);
    c->text = t;
    c->text_cap = cap;
  }
  memcpy(c->text + c->text_len, data, len);
  c->text_len += len;
  c->text[c->text_len] = '\0';
  return 0;
}

/* A 2xx answer ended (or broke). */
static void finish_stream(oai_call *c, const berth_http_result *res)
{
  openai *m = c->m;
  const char *code = NULL;
  char *msg = NULL;
  if (c->whole && !res->error) {
    if (c->text_len != res->received) {
      call_end(c, NULL, "resource_exhausted",
               oai_fmt("the model's answer from %s is larger than %zu bytes", m->url,
                       (size_t)OAI_WHOLE_BODY_MAX));
      return;
    }
    berth_oai_stream_whole(c->stream, c->text, c->text_len);
  }
  if (res->error && !berth_oai_stream_error(c->stream, NULL) &&
      !berth_oai_stream_complete(c->stream)) {
    call_end(c, NULL, res->timed_out ? "deadline_exceeded" : "unavailable",
             oai_fmt("the model's answer from %s broke off after %zu bytes (%s); the "
                     "reply is incomplete and is not asked for again", m->url, res->received,
                     res->error));
    return;
  }
  json_t *reply = berth_oai_stream_finish(c->stream, &code, &msg);
  call_end(c, reply, code, msg);
}

static void on_done(void *ud, const berth_http_result *res)
{
  oai_call *c = ud;
  openai *m = c->m;
  c->req = NULL;
  long st = res->status;
  if (st >= 200 && st < 300) {
    if (c->stream)
      finish_stream(c, res);
    else
      call_end(c, NULL, "resource_exhausted", berth_xstrdup("openai model: out of memory"));
    return;
  }
  if (st == 0) {
    if (res->timed_out)
      call_end(c, NULL, "deadline_exceeded",
               oai_fmt("the model provider at %s did not answer in time (%s); try again, "
                       "or raise BERTH_MODEL_TIMEOUT", m->url,
                       res->error ? res->error : "timeout"));
    else
      call_end(c, NULL, "unavailable",
               oai_fmt("cannot reach the model provider at %s (%s); check that it runs "
                       "and that BERTH_MODEL_URL names it", m->url,
                       res->error ? res->error : "no answer"));
    return;
  }
  bool retryable = st == 429 || (st >= 500 && st < 600);
  if (retryable && c->attempt < m->o.max_attempts) {
    if (c->retry_after > m->o.max_retry_after) {
      call_end(c, NULL, st == 429 ? "resource_exhausted" : "unavailable",
               oai_fmt("the model provider answered HTTP %ld and asks to retry after %.0f s, "
                       "longer than berth waits (%.0f s)", st, c->retry_after,
                       m->o.max_retry_after));
      return;
    }
    double d = backoff(m, c->attempt, c->retry_after);
    free(c->text);
    c->text = NULL;
    c->text_len = c->text_cap = 0;
    ev_timer_init(&c->backoff, on_backoff, d, 0.);
    c->backoff.data = c;
    ev_timer_start(m->loop, &c->backoff);
    return;
  }
  char *said = server_says(c);
  const char *code;
  char *msg;
  if (st == 401 || st == 403) {
    code = st == 401 ? "unauthenticated" : "permission_denied";
    msg = oai_fmt("the model provider refused the API key (HTTP %ld); check BERTH_API_KEY%s%s%s",
                  st, said ? " (it said: " : "", said ? said : "", said ? ")" : "");
  } else if (retryable) {
    code = st == 429 ? "resource_exhausted" : "unavailable";
    msg = oai_fmt("the model provider answered HTTP %ld to %d tr%s%s%s", st, c->attempt,
                  c->attempt == 1 ? "y" : "ies", said ? ": " : "", said ? said : "");
  } else if (st >= 300 && st < 400) {
    code = "invalid_argument";
    msg = oai_fmt("the model provider at %s redirected (HTTP %ld), and berth does not follow "
                  "redirects with the API key; set BERTH_MODEL_URL to the final address",
                  m->url, st);
  } else if (st == 404) {
    code = "not_found";
    msg = oai_fmt("the model provider answered HTTP 404 for %s%s%s; check BERTH_MODEL_URL "
                  "and BERTH_MODEL (\"%s\")", m->url, said ? ": " : "", said ? said : "",
                  m->model);
  } else {
    code = "invalid_argument";
    msg = oai_fmt("the model provider rejected the request (HTTP %ld)%s%s", st,
                  said ? ": " : "", said ? said : "");
  }
  free(said);
  call_end(c, NULL, code, msg);
}

static int start_attempt(oai_call *c)
{
  openai *m = c->m;
  c->attempt++;
  c->status = 0;
  c->sse = c->whole = false;
  c->retry_after = -1;
  c->text_len = 0;
  berth_oai_stream_free(c->stream);
  c->stream = NULL;
  const char *headers[] = {"Content-Type: application/json", "Accept: text/event-stream",
                           "User-Agent: berth/" BERTH_VERSION, m->auth, NULL};
  berth_http_post p;
  memset(&p, 0, sizeof p);
  p.url = m->url;
  p.headers = headers;
  p.body = c->body;
  p.body_len = c->body_len;
  p.connect_timeout_ms = (long)(m->o.connect_timeout * 1000);
  p.idle_timeout_s = m->o.idle_timeout > 0 ? (long)(m->o.idle_timeout + 0.999) : 0;
  p.timeout_ms = (long)(m->o.timeout * 1000);
  p.no_proxy = m->loopback;
  static const berth_http_cbs cbs = {on_head, on_chunk, on_done};
  c->req = berth_http_start(m->http, &p, &cbs, c);
  return c->req ? 0 : -1;
}

/* The body, {"model":…,"messages":…,"stream":true,"tools":…}, in the order and bytes
 * json_pack and json_dumps gave it, written around the texts of the request's parts
 * (model.h): the history is written once, straight from the host's tables. */
static char *request_body(const openai *m, const berth_model_request *request,
                          size_t *len, char **err)
{
  const char *msgs, *tools;
  size_t mlen, tlen;
  if (berth_request_count(request) < 0) {
    *err = berth_xstrdup("openai model: the request has no messages array");
    return NULL;
  }
  if (berth_request_text(request, "messages", &msgs, &mlen) != 0 ||
      berth_request_text(request, "tools", &tools, &tlen) != 0) {
    *err = berth_xstrdup("openai model: the request cannot be encoded (out of memory)");
    return NULL;
  }
  plm_json_out o = {0};
  plm_json_put_raw(&o, "{\"model\":", 9);
  plm_json_put_raw(&o, m->model_json, strlen(m->model_json));
  plm_json_put_raw(&o, ",\"messages\":", 12);
  plm_json_put_raw(&o, msgs, mlen);
  plm_json_put_raw(&o, ",\"stream\":true", 14);
  if (tools && tools[0] == '[' && tlen > 2) {   /* [] is refused by some */
    plm_json_put_raw(&o, ",\"tools\":", 9);
    plm_json_put_raw(&o, tools, tlen);
  }
  plm_json_put_raw(&o, "}", 2);     /* with the NUL */
  if (o.failed) {
    free(o.p);
    *err = berth_xstrdup("openai model: the request cannot be encoded (out of memory)");
    return NULL;
  }
  *len = o.len - 1;
  return o.p;
}

static int o_chat(berth_model *base, const berth_model_request *request,
                  berth_delta_fn delta, berth_reply_fn done, void *ud, berth_model_call **out,
                  char **err)
{
  openai *m = (openai *)base;
  size_t body_len;
  char *body = request_body(m, request, &body_len, err);
  if (!body)
    return -1;
  oai_call *c = berth_xcalloc(1, sizeof *c);
  c->m = m;
  c->body = body;
  c->body_len = body_len;
  c->delta = delta;
  c->done = done;
  c->ud = ud;
  ev_init(&c->backoff, on_backoff);
  c->next = m->calls;
  if (m->calls)
    m->calls->prev = c;
  m->calls = c;
  if (start_attempt(c) != 0) {
    call_free(c);
    *err = oai_fmt("openai model: cannot start a request to %s", m->url);
    return -1;
  }
  if (out)
    *out = (berth_model_call *)c;
  return 0;
}

/* Calls back before returning, as natives.c expects. */
static void o_cancel(berth_model *base, berth_model_call *call)
{
  (void)base;
  call_end((oai_call *)call, NULL, "canceled", berth_xstrdup("the model call was cancelled"));
}

static void o_free(berth_model *base)
{
  openai *m = (openai *)base;
  while (m->calls)              /* dropped without a callback, as the scripted model */
    call_free(m->calls);
  berth_http_free(m->http);
  free(m->url);
  free(m->key);
  free(m->auth);
  free(m->model);
  free(m->model_json);
  free(m);
}

static const berth_model_ops openai_ops = {"openai", o_chat, o_cancel, o_free};

/* }====================================================== */

/* {====================================================== construction */


/* The endpoint for a base URL, or NULL with *err. */
static char *endpoint(const char *url, bool insecure, bool *loopback, char **err)
{
  size_t n = strlen(url);
  if (n == 0 || strchr(" \t\r\n", url[0]) || strchr(" \t\r\n", url[n - 1])) {
    *err = berth_xstrdup("BERTH_MODEL_URL must not be empty or have surrounding whitespace");
    return NULL;
  }
  if (strpbrk(url, "?#")) {
    *err = oai_fmt("BERTH_MODEL_URL %s must not carry a query or a fragment", url);
    return NULL;
  }
  CURLU *u = curl_url();
  char *scheme = NULL, *host = NULL, *user = NULL, *password = NULL, *out = NULL;
  if (!u || curl_url_set(u, CURLUPART_URL, url, CURLU_NON_SUPPORT_SCHEME) != CURLUE_OK ||
      curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
      curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK)
    *err = oai_fmt("BERTH_MODEL_URL %s is not an absolute http(s) URL", url);
  else if (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0)
    *err = oai_fmt("BERTH_MODEL_URL %s must use http or https", url);
  else if (curl_url_get(u, CURLUPART_USER, &user, 0) == CURLUE_OK ||
           curl_url_get(u, CURLUPART_PASSWORD, &password, 0) == CURLUE_OK)
    *err = berth_xstrdup("BERTH_MODEL_URL must not carry a user or password (give the key in "
                  "BERTH_API_KEY)");
  else {
    *loopback = plm_loopback_host(host);
    if (strcmp(scheme, "http") == 0 && !*loopback && !insecure)
      *err = oai_fmt("BERTH_MODEL_URL %s uses cleartext http to a non-loopback host, which "
                     "would send the API key and the conversation unencrypted; use https, "
                     "or set BERTH_MODEL_INSECURE_HTTP=1 to allow it", url);
  }
  if (!*err) {
    while (n > 0 && url[n - 1] == '/')
      n--;
    static const char path[] = "/chat/completions";
    size_t pl = sizeof path - 1;
    if (n >= pl && memcmp(url + n - pl, path, pl) == 0)
      out = oai_fmt("%.*s", (int)n, url);
    else
      out = oai_fmt("%.*s%s", (int)n, url, path);
  }
  curl_free(scheme);
  curl_free(host);
  curl_free(user);
  curl_free(password);
  curl_url_cleanup(u);
  return out;
}

berth_model *berth_openai_new(const berth_openai_options *oo, const berth_model_options *o,
                              char **err)
{
  *err = NULL;
  if (!o || !o->loop) {
    *err = berth_xstrdup("openai model: a loop is required");
    return NULL;
  }
  if (!oo->model || !*oo->model) {
    *err = berth_xstrdup("the openai model needs a model name: set BERTH_MODEL (for example "
                  "llama3.1 for Ollama, gpt-4o-mini for OpenAI), or give --model "
                  "openai:NAME");
    return NULL;
  }
  if (oo->api_key && strpbrk(oo->api_key, "\r\n")) {
    *err = berth_xstrdup("BERTH_API_KEY holds a line break");
    return NULL;
  }
  if (oo->max_attempts < 1 || !(oo->backoff_base >= 0) || !(oo->backoff_max >= 0) ||
      !(oo->timeout > 0) || !(oo->connect_timeout > 0) || oo->idle_timeout < 0) {
    *err = berth_xstrdup("openai model: bad retry or timeout options");
    return NULL;
  }
  json_t *name = json_string(oo->model);
  char *model_json = name ? plm_json_write(name, NULL) : NULL;
  json_decref(name);
  if (!model_json) {
    *err = berth_xstrdup("the model name (BERTH_MODEL or --model openai:NAME) is not UTF-8 text");
    return NULL;
  }
  bool loopback = false;
  char *url = endpoint(oo->url ? oo->url : BERTH_OPENAI_DEFAULT_URL, oo->insecure_http,
                       &loopback, err);
  if (!url) {
    free(model_json);
    return NULL;
  }
  openai *m = berth_xcalloc(1, sizeof *m);
  if (!m || !(m->http = berth_http_new(o->loop))) {
    free(m);
    free(url);
    free(model_json);
    *err = berth_xstrdup("openai model: cannot set up the HTTP client");
    return NULL;
  }
  m->base.ops = &openai_ops;
  m->loop = o->loop;
  m->url = url;
  m->loopback = loopback;
  m->model = berth_xstrdup(oo->model);
  m->model_json = model_json;
  if (oo->api_key && *oo->api_key) {
    m->key = berth_xstrdup(oo->api_key);
    m->auth = oai_fmt("Authorization: Bearer %s", oo->api_key);
  }
  m->o = *oo;
  m->o.url = m->o.api_key = m->o.model = NULL;
  return &m->base;
}

/* }====================================================== */

/*
 * openai_stream.c — chat.completion.chunk events to one assistant message, with no
 * I/O (openai.h).  The SSE framing is sse.c's; this file reads each event's data:
 *
 *   data: {"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}
 *   data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1",
 *          "type":"function","function":{"name":"executeCode","arguments":""}}]}, …}]}
 *   data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,
 *          "function":{"arguments":"{\"co"}}]}, …}]}
 *   data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}
 *   data: [DONE]
 *
 * Tool calls (docs/architecture.md §6.2): fragments are keyed by (choice index, tool_calls[].index);
 * id and name usually come only in the first fragment; a different non-empty id at
 * an occupied index starts a new call (servers that reuse index 0); arguments are
 * raw text, concatenated, and never parsed here (the hooks parse them, and tell the
 * model when they are not JSON).  A fragment without an index goes to the call with
 * its id, else to the choice's latest call.
 *
 * Split UTF-8: a server that streams byte-level tokens can cut a code point between
 * two chunks, so one chunk's JSON string ends with a lead byte and the next starts
 * with the continuation bytes.  jansson refuses ill-formed UTF-8, so such an event
 * is loaded through a mapping: each byte that is not part of a well-formed sequence
 * becomes the private-use code point U+10FF00 + byte (U+10FF80..U+10FFFF), and the
 * strings read from that event are mapped back to bytes.  Well-formed sequences that
 * already encode U+10FF80..U+10FFFF are mapped byte by byte too, so raw text always
 * comes back exactly; the one ambiguity left is such a code point written as a \u
 * escape in an event that also holds ill-formed bytes.  Only the assembled text is
 * checked: it must be valid UTF-8 when the stream ends.  Text handed to `delta`
 * holds back an incomplete sequence at its end until the rest arrives, and stops at
 * an ill-formed byte (the reply then fails).
 */
#include "openai.h"
#include "xalloc.h"
#include "sse.h"
#include "plimsoll.h"  /* the one UTF-8 checker */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OAI_MAX_TOTAL ((size_t)32 << 20)  /* bytes of text and arguments assembled */
#define OAI_MAX_EVENT ((size_t)8 << 20)   /* one SSE line or event */

typedef struct oai_buf {
  char *s;
  size_t len, cap;
} oai_buf;

typedef struct oai_choice {
  long index;
  oai_buf content;
  size_t emitted;               /* bytes of content handed to `delta` */
  bool finished;                /* a finish_reason came */
} oai_choice;

typedef struct oai_tool {
  long choice, index;
  oai_buf id, name, args;
} oai_tool;

struct berth_oai_stream {
  berth_sse sse;
  berth_delta_fn delta;
  void *ud;
  oai_choice *choices;
  size_t n_choices;
  long reply;                   /* the choice whose message is returned (the first) */
  bool have_reply;
  oai_tool *tools;
  size_t n_tools;
  bool done;                    /* [DONE] */
  bool mapped;                  /* the event being read went through the byte mapping */
  size_t total;
  unsigned long events;
  char *error;
  const char *code;
};

/* {====================================================== helpers */

static void oai_fail(berth_oai_stream *s, const char *code, const char *f, ...)
  __attribute__((format(printf, 3, 4)));
static void oai_fail(berth_oai_stream *s, const char *code, const char *f, ...)
{
  if (s->error)
    return;                     /* the first error is the one that matters */
  va_list ap;
  va_start(ap, f);
  if (vasprintf(&s->error, f, ap) < 0)
    s->error = NULL;
  va_end(ap);
  if (!s->error)
    s->error = berth_xstrdup("the model's stream failed");
  s->code = code;
}

static int buf_add(berth_oai_stream *s, oai_buf *b, const char *t, size_t n)
{
  if (n > OAI_MAX_TOTAL - s->total) {
    oai_fail(s, "resource_exhausted", "the model's reply is larger than %zu bytes",
             (size_t)OAI_MAX_TOTAL);
    return -1;
  }
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + n + 1)
      cap *= 2;
    char *p = berth_xrealloc(b->s, cap);
    b->s = p;
    b->cap = cap;
  }
  memcpy(b->s + b->len, t, n);
  b->len += n;
  b->s[b->len] = '\0';
  s->total += n;
  return 0;
}

static bool buf_eq(const oai_buf *b, const char *t, size_t n)
{
  return b->len == n && (n == 0 || memcmp(b->s, t, n) == 0);
}

/* U+10FF80..U+10FFFF: the code points that stand for raw bytes. */
static bool u8_reserved(const unsigned char *p, size_t len)
{
  return len == 4 && p[0] == 0xF4 && p[1] == 0x8F && p[2] >= 0xBE;
}

/* Offset of the first ill-formed byte, or n when all of it is valid. */
static size_t u8_check(const char *s, size_t n)
{
  const unsigned char *p = (const unsigned char *)s;
  size_t i = 0, k;
  while (i < n && (k = plm_utf8_sequence(p + i, n - i)) != 0)
    i += k;
  return i;
}

/* Loads one event's JSON; ill-formed UTF-8 goes through the byte mapping. */
static json_t *oai_load(berth_oai_stream *s, const char *d, size_t n, json_error_t *e)
{
  const unsigned char *p = (const unsigned char *)d;
  size_t i = 0, k, extra = 0;
  s->mapped = false;
  for (i = 0; i < n; i += k ? k : 1) {
    k = plm_utf8_sequence(p + i, n - i);
    if (k == 0)
      extra += 3;
    else if (u8_reserved(p + i, k))
      extra += 12;
  }
  if (extra == 0)
    return json_loadb(d, n, JSON_ALLOW_NUL, e);
  unsigned char *m = berth_xmalloc(n + extra);
  size_t o = 0;
  for (i = 0; i < n;) {
    k = plm_utf8_sequence(p + i, n - i);
    if (k && !u8_reserved(p + i, k)) {
      memcpy(m + o, p + i, k);
      o += k;
      i += k;
      continue;
    }
    size_t raw = k ? k : 1;
    for (size_t r = 0; r < raw; r++, i++) {
      m[o++] = 0xF4;
      m[o++] = 0x8F;
      m[o++] = (unsigned char)(0xBE | ((p[i] >> 6) & 1));
      m[o++] = (unsigned char)(0x80 | (p[i] & 0x3F));
    }
  }
  json_t *j = json_loadb((const char *)m, o, JSON_ALLOW_NUL, e);
  free(m);
  s->mapped = true;
  return j;
}

/* Appends a JSON string's bytes to b, mapped back when the event was mapped. */
static int add_str(berth_oai_stream *s, oai_buf *b, const json_t *v)
{
  const char *t = json_string_value(v);
  size_t n = json_string_length(v);
  if (!s->mapped)
    return buf_add(s, b, t, n);
  const unsigned char *p = (const unsigned char *)t;
  size_t i = 0, start = 0;
  while (i < n) {
    if (n - i >= 4 && u8_reserved(p + i, 4)) {
      char byte = (char)(0x80 | ((p[i + 2] & 1) << 6) | (p[i + 3] & 0x3F));
      if (buf_add(s, b, t + start, i - start) || buf_add(s, b, &byte, 1))
        return -1;
      i += 4;
      start = i;
    } else
      i++;
  }
  return buf_add(s, b, t + start, n - start);
}

/* A string member as (mapped-back) bytes in a scratch buffer; false when absent. */
static bool get_str(berth_oai_stream *s, const json_t *o, const char *key, oai_buf *scratch)
{
  const json_t *v = json_object_get(o, key);
  scratch->len = 0;
  if (!json_is_string(v))
    return false;
  return add_str(s, scratch, v) == 0;
}

/* A short printable excerpt of bad data, for messages. */
static void excerpt(char *out, size_t size, const char *d, size_t n)
{
  size_t o = 0;
  for (size_t i = 0; i < n && o + 4 < size; i++)
    out[o++] = (d[i] >= 0x20 && d[i] < 0x7F) ? d[i] : '?';
  if (o + 4 >= size && n > o)
    memcpy(out + o, "...", 3), o += 3;
  out[o] = '\0';
}

/* }====================================================== */

/* {====================================================== chunks */

static oai_choice *choice_get(berth_oai_stream *s, long index)
{
  for (size_t i = 0; i < s->n_choices; i++)
    if (s->choices[i].index == index)
      return &s->choices[i];
  oai_choice *c = berth_xrealloc(s->choices, (s->n_choices + 1) * sizeof *c);
  s->choices = c;
  c = &s->choices[s->n_choices++];
  memset(c, 0, sizeof *c);
  c->index = index;
  if (!s->have_reply) {
    s->have_reply = true;
    s->reply = index;
  }
  return c;
}

static int add_content(berth_oai_stream *s, oai_choice *c, const json_t *v)
{
  if (add_str(s, &c->content, v))
    return -1;
  if (s->delta && c->index == s->reply) {
    /* Up to an incomplete sequence at the end (its rest may come) or an ill-formed
     * byte (the reply will fail): `delta` only ever sees whole UTF-8. */
    size_t end = c->emitted + u8_check(c->content.s + c->emitted,
                                       c->content.len - c->emitted);
    if (end > c->emitted) {
      s->delta(s->ud, c->content.s + c->emitted, end - c->emitted);
      c->emitted = end;
    }
  }
  return 0;
}

static oai_tool *tool_new(berth_oai_stream *s, long choice, long index)
{
  oai_tool *t = berth_xrealloc(s->tools, (s->n_tools + 1) * sizeof *t);
  s->tools = t;
  t = &s->tools[s->n_tools++];
  memset(t, 0, sizeof *t);
  t->choice = choice;
  t->index = index;
  return t;
}

/* The call a fragment continues, or NULL for a new one.  Newest first: once a new
 * id has taken an index, the older call there has ended. */
static oai_tool *tool_find(berth_oai_stream *s, long choice, bool has_index, long index,
                           const oai_buf *id)
{
  for (size_t i = s->n_tools; i-- > 0;) {
    oai_tool *t = &s->tools[i];
    if (t->choice != choice)
      continue;
    if (has_index ? t->index == index : (id->len == 0 || buf_eq(&t->id, id->s, id->len)))
      return t;
  }
  return NULL;
}

static int tool_fragment(berth_oai_stream *s, long choice, const json_t *f)
{
  if (!json_is_object(f)) {
    oai_fail(s, "protocol", "the model's stream is malformed: a tool_calls entry is not "
                            "an object (event %lu)", s->events);
    return -1;
  }
  oai_buf id = {0}, name = {0};
  const json_t *jidx = json_object_get(f, "index");
  bool has_index = json_is_integer(jidx);
  long index = has_index ? (long)json_integer_value(jidx) : 0;
  get_str(s, f, "id", &id);
  oai_tool *t = s->error ? NULL : tool_find(s, choice, has_index, index, &id);
  if (t && id.len && t->id.len && !buf_eq(&t->id, id.s, id.len))
    t = NULL;                   /* a new call at an occupied index */
  if (!t && !s->error) {
    long n = 0;
    for (size_t i = 0; i < s->n_tools; i++)
      n += s->tools[i].choice == choice;
    t = tool_new(s, choice, has_index ? index : n);
  }
  if (t && id.len && !t->id.len)
    buf_add(s, &t->id, id.s, id.len);
  const json_t *fn = json_object_get(f, "function");
  if (t && !s->error && json_is_object(fn)) {
    /* The name whole in the first fragment (usual), repeated in each (some
     * servers), or in pieces (a few). */
    if (get_str(s, fn, "name", &name) && name.len && !buf_eq(&t->name, name.s, name.len))
      buf_add(s, &t->name, name.s, name.len);
    const json_t *a = json_object_get(fn, "arguments");
    if (s->error)
      ;
    else if (json_is_string(a))
      add_str(s, &t->args, a);
    else if (json_is_object(a) || json_is_array(a)) {
      /* Some servers send the arguments as JSON rather than as text. */
      char *text = json_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY);
      if (!text)
        oai_fail(s, "resource_exhausted", "out of memory");
      else
        buf_add(s, &t->args, text, strlen(text));
      free(text);
    }
  }
  free(id.s);
  free(name.s);
  return s->error ? -1 : 0;
}

static int read_choice(berth_oai_stream *s, const json_t *ch, size_t pos)
{
  if (!json_is_object(ch)) {
    oai_fail(s, "protocol", "the model's stream is malformed: a choice is not an object "
                            "(event %lu)", s->events);
    return -1;
  }
  const json_t *jidx = json_object_get(ch, "index");
  long index = json_is_integer(jidx) ? (long)json_integer_value(jidx) : (long)pos;
  oai_choice *c = choice_get(s, index);
  if (!c)
    return -1;
  const json_t *d = json_object_get(ch, "delta");
  if (!json_is_object(d))
    d = json_object_get(ch, "message");   /* a whole message (non-streamed shape) */
  if (json_is_object(d)) {
    const json_t *v = json_object_get(d, "content");
    if (json_is_string(v) && add_content(s, c, v))
      return -1;
    v = json_object_get(d, "refusal");    /* shown as the reply's text */
    if (json_is_string(v) && add_content(s, c, v))
      return -1;
    size_t i;
    const json_t *f;
    json_array_foreach(json_object_get(d, "tool_calls"), i, f)
      if (tool_fragment(s, index, f))
        return -1;
  }
  if (json_is_string(json_object_get(ch, "finish_reason")))
    c->finished = true;
  return 0;
}

/* One event's data, parsed. */
static int read_chunk(berth_oai_stream *s, const char *data, size_t len)
{
  json_error_t e;
  memset(&e, 0, sizeof e);
  json_t *j = oai_load(s, data, len, &e);
  char ex[64];
  if (!j) {
    excerpt(ex, sizeof ex, data, len);
    oai_fail(s, "protocol", "the model's stream is malformed: event %lu is not valid JSON "
                            "(%s at byte %d): %s", s->events, e.text, e.position, ex);
    return -1;
  }
  int rc = 0;
  const json_t *err = json_object_get(j, "error");
  if (!json_is_object(j)) {
    excerpt(ex, sizeof ex, data, len);
    oai_fail(s, "protocol", "the model's stream is malformed: event %lu is not a JSON "
                            "object: %s", s->events, ex);
    rc = -1;
  } else if (err && !json_is_null(err)) {
    const json_t *msg = json_is_object(err) ? json_object_get(err, "message") : err;
    oai_buf m = {0};
    if (json_is_string(msg))
      add_str(s, &m, msg);
    oai_fail(s, "unavailable", "the model provider reported an error in the stream: %s",
             m.len ? m.s : "(no message)");
    free(m.s);
    rc = -1;
  } else {
    size_t i;
    const json_t *ch;
    json_array_foreach(json_object_get(j, "choices"), i, ch)
      if ((rc = read_choice(s, ch, i)) != 0)
        break;
  }
  json_decref(j);
  return rc;
}

static int on_event(void *ud, const berth_sse_event *ev)
{
  berth_oai_stream *s = ud;
  s->events++;
  if (strcmp(ev->type, "error") == 0) {
    char ex[160];
    excerpt(ex, sizeof ex, ev->data, ev->len);
    oai_fail(s, "unavailable", "the model provider sent an error event: %s", ex);
    return -1;
  }
  const char *d = ev->data;
  size_t n = ev->len;
  while (n && (*d == ' ' || *d == '\t'))
    d++, n--;
  while (n && (d[n - 1] == ' ' || d[n - 1] == '\t'))
    n--;
  if (n == 6 && memcmp(d, "[DONE]", 6) == 0) {
    s->done = true;
    return 1;
  }
  return read_chunk(s, ev->data, ev->len) ? -1 : 0;
}

/* }====================================================== */

/* {====================================================== public */

berth_oai_stream *berth_oai_stream_new(berth_delta_fn delta, void *ud)
{
  berth_oai_stream *s = berth_xcalloc(1, sizeof *s);
  berth_sse_init(&s->sse, OAI_MAX_EVENT);
  s->delta = delta;
  s->ud = ud;
  return s;
}

void berth_oai_stream_free(berth_oai_stream *s)
{
  if (!s)
    return;
  berth_sse_free(&s->sse);
  for (size_t i = 0; i < s->n_choices; i++)
    free(s->choices[i].content.s);
  for (size_t i = 0; i < s->n_tools; i++) {
    free(s->tools[i].id.s);
    free(s->tools[i].name.s);
    free(s->tools[i].args.s);
  }
  free(s->choices);
  free(s->tools);
  free(s->error);
  free(s);
}

int berth_oai_stream_feed(berth_oai_stream *s, const char *buf, size_t len)
{
  if (s->error)
    return -1;
  if (s->done)
    return 1;
  int rc = berth_sse_feed(&s->sse, buf, len, on_event, s);
  if (rc == BERTH_SSE_TOO_LARGE)
    oai_fail(s, "resource_exhausted", "the model's stream is malformed: a line or an event "
                                      "is larger than %zu bytes", (size_t)OAI_MAX_EVENT);
  if (s->error)
    return -1;
  return s->done ? 1 : 0;
}

int berth_oai_stream_whole(berth_oai_stream *s, const char *body, size_t len)
{
  if (s->error)
    return -1;
  s->events++;
  if (read_chunk(s, body, len))
    return -1;
  s->done = true;
  return 0;
}

bool berth_oai_stream_complete(const berth_oai_stream *s)
{
  if (s->done)
    return true;
  for (size_t i = 0; i < s->n_choices; i++)
    if (s->choices[i].index == s->reply)
      return s->choices[i].finished;
  return false;
}

const char *berth_oai_stream_error(const berth_oai_stream *s, const char **code)
{
  if (code)
    *code = s->code;
  return s->error;
}

/* Checks one assembled text; fails the stream when it is not valid UTF-8. */
static bool valid_text(berth_oai_stream *s, const oai_buf *b, const char *what)
{
  size_t bad = u8_check(b->s, b->len);
  if (bad == b->len)
    return true;
  oai_fail(s, "protocol", "the model's stream is malformed: %s is not valid UTF-8 "
                          "(byte %zu of %zu)", what, bad, b->len);
  return false;
}

static json_t *build_reply(berth_oai_stream *s)
{
  oai_choice *c = NULL;
  for (size_t i = 0; i < s->n_choices; i++)
    if (s->choices[i].index == s->reply)
      c = &s->choices[i];
  oai_buf empty = {0};
  const oai_buf *content = c ? &c->content : &empty;
  if (!valid_text(s, content, "the reply's text"))
    return NULL;
  json_t *calls = json_array();
  size_t n = 0;
  for (size_t i = 0; i < s->n_tools; i++) {
    oai_tool *t = &s->tools[i];
    if (!c || t->choice != c->index)
      continue;
    n++;
    char what[64];
    snprintf(what, sizeof what, "tool call %zu's name", n);
    if (!t->name.len) {
      oai_fail(s, "protocol", "the model's stream is malformed: tool call %zu (index %ld) "
                              "never got a function name", n, t->index);
      break;
    }
    if (!valid_text(s, &t->name, what) || !valid_text(s, &t->id, "a tool call id"))
      break;
    snprintf(what, sizeof what, "tool call %zu's arguments", n);
    if (!valid_text(s, &t->args, what))
      break;
    char gen[32];
    snprintf(gen, sizeof gen, "call_berth_%zu", n);
    json_t *call = json_pack("{s:s%, s:s, s:{s:s%, s:s%}}",
                             "id", t->id.len ? t->id.s : gen, t->id.len ? t->id.len : strlen(gen),
                             "type", "function",
                             "function", "name", t->name.s, t->name.len,
                             "arguments", t->args.len ? t->args.s : "{}",
                             t->args.len ? t->args.len : 2);
    if (!call) {
      oai_fail(s, "resource_exhausted", "out of memory");
      break;
    }
    json_array_append_new(calls, call);
  }
  if (s->error) {
    json_decref(calls);
    return NULL;
  }
  if (c && s->delta && c->emitted < content->len) {
    s->delta(s->ud, content->s + c->emitted, content->len - c->emitted);
    c->emitted = content->len;
  }
  json_t *reply = json_object();
  json_object_set_new(reply, "role", json_string("assistant"));
  if (json_array_size(calls) && content->len == 0)
    json_object_set_new(reply, "content", json_null());
  else
    json_object_set_new(reply, "content", json_stringn(content->len ? content->s : "",
                                                       content->len));
  if (json_array_size(calls))
    json_object_set_new(reply, "tool_calls", calls);
  else
    json_decref(calls);
  return reply;
}

json_t *berth_oai_stream_finish(berth_oai_stream *s, const char **code, char **err)
{
  *code = NULL;
  *err = NULL;
  json_t *reply = NULL;
  if (!s->error && !berth_oai_stream_complete(s))
    oai_fail(s, "unavailable", "the model's stream ended before the reply was complete "
                               "(no finish_reason and no [DONE] after %lu event%s): it was "
                               "cut off", s->events, s->events == 1 ? "" : "s");
  if (!s->error)
    reply = build_reply(s);
  if (!reply) {
    *code = s->code ? s->code : "unknown";
    *err = berth_xstrdup(s->error ? s->error : "the model's stream failed");
  }
  return reply;
}

/* }====================================================== */

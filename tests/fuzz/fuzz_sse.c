/*
 * fuzz_sse.c — the server-sent events parser (runtime/models/sse.c) and the chat-completions
 * stream assembler behind the openai model (runtime/models/openai_stream.c), on arbitrary
 * bytes fed in arbitrary pieces.  Nothing may crash, leak or read out of bounds, and
 * the parser's events must not depend on where the input was cut: the events of a
 * split feed (pieces of 1..64 bytes, chosen from a hash of the input, and byte by
 * byte for short inputs) are compared with those of one whole feed.
 *
 * Built by `make fuzz` with the files of lib/ only, so the runtime files are included
 * here.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../runtime/core/xalloc.c"
#include "../../runtime/models/sse.c"
#include "../../runtime/models/openai_stream.c"

#define FUZZ_MAX_EVENT 4096     /* small, so the size limits are reached too */

typedef struct trace {
  unsigned char *b;
  size_t len, cap;
} trace;

static void trace_add(trace *t, const void *p, size_t n)
{
  if (t->len + n > t->cap) {
    size_t cap = t->cap ? t->cap : 1024;
    while (cap < t->len + n)
      cap *= 2;
    t->b = realloc(t->b, cap);
    if (!t->b)
      abort();
    t->cap = cap;
  }
  memcpy(t->b + t->len, p, n);
  t->len += n;
}

/* Each event as type NUL, length, data, id NUL: a byte string to compare. */
static int record(void *ud, const berth_sse_event *ev)
{
  trace *t = ud;
  if (ev->data[ev->len] != '\0')
    abort();
  trace_add(t, ev->type, strlen(ev->type) + 1);
  trace_add(t, &ev->len, sizeof ev->len);
  trace_add(t, ev->data, ev->len);
  trace_add(t, ev->id, strlen(ev->id) + 1);
  return 0;
}

static uint64_t next(uint64_t *s)
{
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* Feeds data in pieces (size 0: random 1..64, else that size); returns the first
 * non-zero result, and the end's verdict in *lost. */
static int run_parser(const uint8_t *data, size_t size, uint64_t seed, size_t piece,
                      trace *t, bool *lost)
{
  berth_sse p;
  berth_sse_init(&p, FUZZ_MAX_EVENT);
  int rc = 0;
  size_t at = 0;
  while (at < size && rc == 0) {
    size_t n = piece ? piece : 1 + next(&seed) % 64;
    if (n > size - at)
      n = size - at;
    rc = berth_sse_feed(&p, (const char *)data + at, n, record, t);
    at += n;
  }
  *lost = rc == 0 && berth_sse_end(&p);
  berth_sse_free(&p);
  return rc;
}

static void count_delta(void *ud, const char *text, size_t len)
{
  if (len == 0 || !text)
    abort();                    /* a delta is never empty */
  *(size_t *)ud += len;
}

static void run_stream(const uint8_t *data, size_t size, uint64_t seed)
{
  size_t shown = 0;
  berth_oai_stream *s = berth_oai_stream_new(count_delta, &shown);
  size_t at = 0;
  int rc = 0;
  while (at < size && rc == 0) {
    size_t n = 1 + next(&seed) % 64;
    if (n > size - at)
      n = size - at;
    rc = berth_oai_stream_feed(s, (const char *)data + at, n);
    at += n;
  }
  const char *code;
  char *err;
  json_t *reply = berth_oai_stream_finish(s, &code, &err);
  if (!reply == !err)
    abort();                    /* exactly one of a reply and an error */
  if (reply) {
    const json_t *content = json_object_get(reply, "content");
    if (json_is_string(content) && shown != json_string_length(content))
      abort();                  /* the deltas add up to the reply's text */
  }
  json_decref(reply);
  free(err);
  berth_oai_stream_free(s);

  s = berth_oai_stream_new(NULL, NULL);
  berth_oai_stream_whole(s, (const char *)data, size);
  reply = berth_oai_stream_finish(s, &code, &err);
  json_decref(reply);
  free(err);
  berth_oai_stream_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  uint64_t seed = 1469598103934665603ULL;
  for (size_t i = 0; i < size; i++)
    seed = (seed ^ data[i]) * 1099511628211ULL;
  seed |= 1;

  trace whole = {0}, split = {0};
  bool lost_whole, lost_split;
  int rc_whole = run_parser(data, size, seed, size ? size : 1, &whole, &lost_whole);
  int rc_split = run_parser(data, size, seed, 0, &split, &lost_split);
  if (rc_whole != rc_split || lost_whole != lost_split || whole.len != split.len ||
      (whole.len && memcmp(whole.b, split.b, whole.len) != 0))
    abort();                    /* the cuts changed the events */
  if (size <= 512) {
    trace bytes = {0};
    bool lost_bytes;
    int rc_bytes = run_parser(data, size, seed, 1, &bytes, &lost_bytes);
    if (rc_bytes != rc_whole || lost_bytes != lost_whole || bytes.len != whole.len ||
        (whole.len && memcmp(whole.b, bytes.b, whole.len) != 0))
      abort();
    free(bytes.b);
  }
  free(whole.b);
  free(split.b);

  run_stream(data, size, seed);
  return 0;
}

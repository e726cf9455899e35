/*
 * sse.h — an incremental parser for server-sent events (the WHATWG "event stream"
 * format): bytes in, events out, no I/O, no Lua, no libev.
 *
 * Feed it the body of a text/event-stream response in pieces of any size, split
 * anywhere (inside a line, between the CR and LF of a CRLF, inside a UTF-8 code
 * point); it calls back once per complete event, exactly as if the body had come in
 * one piece.  The rules (docs/architecture.md §6.1; html.spec.whatwg.org "Parsing an event
 * stream"):
 *   - lines end with CRLF, LF or CR;
 *   - a line starting with ':' is a comment;
 *   - "field:value" with one optional space after the colon removed; a line without
 *     a colon is a field with an empty value;
 *   - "data" lines are joined with '\n'; "event" sets the type, "id" the last event
 *     id (unless it holds a NUL), "retry" the reconnection time (digits only); other
 *     fields are ignored;
 *   - a blank line dispatches the event, if any data line came;
 *   - one leading UTF-8 byte order mark is skipped;
 *   - at the end of the stream an event not followed by a blank line is discarded.
 * What the data means ("[DONE]", JSON) is the caller's business.
 */
#ifndef BERTH_SSE_H
#define BERTH_SSE_H

#include <stdbool.h>
#include <stddef.h>

#define BERTH_SSE_TOO_LARGE (-1)    /* a line or an event's data exceeded the limit */

typedef struct berth_sse_event {
  const char *type;             /* the event field, or "message" */
  const char *data;             /* NUL-terminated; may also hold NUL bytes */
  size_t len;
  const char *id;               /* the last event id so far ("" if none) */
} berth_sse_event;

/* Returns 0 to go on; any other value stops berth_sse_feed, which returns it. */
typedef int (*berth_sse_fn)(void *ud, const berth_sse_event *ev);

/* Private: embed it, and use the functions below. */
typedef struct berth_sse {
  char *line;                   /* the line being read (only when split across feeds) */
  size_t line_len, line_cap;
  char *data;                   /* the event's data lines, each followed by '\n' */
  size_t data_len, data_cap;
  bool has_data;
  char *type, *id;              /* NUL-terminated, or NULL */
  size_t type_len, id_len;
  long long retry;              /* the last valid retry field (ms), or -1 */
  size_t max;                   /* limit on a line and on an event's data */
  unsigned bom;                 /* bytes of the byte order mark matched so far */
  bool bom_done;
  bool after_cr;                /* the last byte was CR: an LF right after belongs to it */
  unsigned long events;         /* dispatched so far */
} berth_sse;

/* max: the longest line or event data accepted, in bytes (0: 16 MiB). */
void berth_sse_init(berth_sse *p, size_t max);
void berth_sse_free(berth_sse *p);
/* Parses len bytes, calling fn for each complete event.  Returns 0, fn's non-zero
 * value (the rest of buf is left unread) or BERTH_SSE_TOO_LARGE.  Out of memory is
 * xalloc.h's policy.
 * After a non-zero return the parser must not be fed again (free it). */
int berth_sse_feed(berth_sse *p, const char *buf, size_t len, berth_sse_fn fn, void *ud);
/* The stream ended.  Returns true when something was discarded: a line without its
 * line end, or data lines not followed by a blank line. */
bool berth_sse_end(berth_sse *p);
/* The reconnection time the stream asked for (ms), or -1. */
long long berth_sse_retry(const berth_sse *p);

#endif

/*
 * sse.c — the incremental server-sent events parser (sse.h).
 *
 * A line that ends inside the piece being fed is parsed straight from that piece;
 * only a line split across feeds is copied into the line buffer.  A CR that ends one
 * feed leaves `after_cr` set, so an LF that starts the next one is taken as the rest
 * of a CRLF, not as an empty line (which would dispatch an event too early).
 */
#include "sse.h"
#include "xalloc.h"

#include <stdlib.h>
#include <string.h>

#define SSE_DEFAULT_MAX ((size_t)16 << 20)
#define SSE_RETRY_MAX 86400000LL  /* a day, in ms: longer values are capped */

static const unsigned char sse_bom[3] = {0xEF, 0xBB, 0xBF};

void berth_sse_init(berth_sse *p, size_t max)
{
  memset(p, 0, sizeof *p);
  p->max = max ? max : SSE_DEFAULT_MAX;
  p->retry = -1;
}

void berth_sse_free(berth_sse *p)
{
  free(p->line);
  free(p->data);
  free(p->type);
  free(p->id);
  memset(p, 0, sizeof *p);
  p->retry = -1;
}

long long berth_sse_retry(const berth_sse *p)
{
  return p->retry;
}

/* Makes room for `need` bytes (plus a NUL) in a growing buffer. */
static int sse_reserve(char **buf, size_t *cap, size_t need)
{
  if (need + 1 <= *cap)
    return 0;
  size_t n = *cap ? *cap : 256;
  while (n < need + 1)
    n *= 2;
  char *b = berth_xrealloc(*buf, n);
  *buf = b;
  *cap = n;
  return 0;
}

static int sse_append_line(berth_sse *p, const char *s, size_t n)
{
  if (n > p->max - p->line_len)
    return BERTH_SSE_TOO_LARGE;
  int rc = sse_reserve(&p->line, &p->line_cap, p->line_len + n);
  if (rc)
    return rc;
  memcpy(p->line + p->line_len, s, n);
  p->line_len += n;
  return 0;
}

/* Replaces *dst (a NUL-terminated copy) by s[0..n). */
static int sse_set(char **dst, size_t *dst_len, const char *s, size_t n)
{
  char *c = berth_xmalloc(n + 1);
  memcpy(c, s, n);
  c[n] = '\0';
  free(*dst);
  *dst = c;
  *dst_len = n;
  return 0;
}

static int sse_dispatch(berth_sse *p, berth_sse_fn fn, void *ud)
{
  if (!p->has_data) {
    p->type_len = 0;            /* the event type buffer is reset either way */
    return 0;
  }
  size_t n = p->data_len;
  if (n && p->data[n - 1] == '\n')
    n--;
  p->data[n] = '\0';
  berth_sse_event ev;
  ev.type = p->type_len ? p->type : "message";
  ev.data = p->data;
  ev.len = n;
  ev.id = p->id ? p->id : "";
  p->events++;
  int rc = fn(ud, &ev);
  p->data_len = 0;
  p->has_data = false;
  p->type_len = 0;
  return rc;
}

static bool sse_field(const char *f, size_t n, const char *name)
{
  return strlen(name) == n && memcmp(f, name, n) == 0;
}

static int sse_line(berth_sse *p, const char *line, size_t n, berth_sse_fn fn, void *ud)
{
  if (n == 0)
    return sse_dispatch(p, fn, ud);
  if (line[0] == ':')
    return 0;                   /* a comment (often a keep-alive) */
  const char *colon = memchr(line, ':', n);
  size_t flen = colon ? (size_t)(colon - line) : n;
  const char *v = colon ? colon + 1 : line + n;
  size_t vlen = colon ? n - flen - 1 : 0;
  if (vlen && *v == ' ') {      /* one space only: "data:  x" keeps " x" */
    v++;
    vlen--;
  }
  if (sse_field(line, flen, "data")) {
    if (vlen + 1 > p->max - p->data_len)
      return BERTH_SSE_TOO_LARGE;
    int rc = sse_reserve(&p->data, &p->data_cap, p->data_len + vlen + 1);
    if (rc)
      return rc;
    memcpy(p->data + p->data_len, v, vlen);
    p->data_len += vlen;
    p->data[p->data_len++] = '\n';
    p->has_data = true;
  } else if (sse_field(line, flen, "event")) {
    return sse_set(&p->type, &p->type_len, v, vlen);
  } else if (sse_field(line, flen, "id")) {
    if (!memchr(v, '\0', vlen))
      return sse_set(&p->id, &p->id_len, v, vlen);
  } else if (sse_field(line, flen, "retry")) {
    long long ms = 0;
    size_t i;
    for (i = 0; i < vlen && v[i] >= '0' && v[i] <= '9'; i++)
      if (ms < SSE_RETRY_MAX)
        ms = ms * 10 + (v[i] - '0');
    if (vlen && i == vlen)
      p->retry = ms < SSE_RETRY_MAX ? ms : SSE_RETRY_MAX;
  }
  return 0;                     /* any other field is ignored */
}

int berth_sse_feed(berth_sse *p, const char *buf, size_t len, berth_sse_fn fn, void *ud)
{
  size_t i = 0;
  int rc;
  while (!p->bom_done && i < len) {
    if ((unsigned char)buf[i] == sse_bom[p->bom]) {
      i++;
      if (++p->bom == 3)
        p->bom_done = true;
    } else {
      /* Not a byte order mark after all: what matched starts the first line (it
       * holds no line end). */
      p->bom_done = true;
      if (p->bom && (rc = sse_append_line(p, (const char *)sse_bom, p->bom)) != 0)
        return rc;
    }
  }
  while (i < len) {
    if (p->after_cr) {
      p->after_cr = false;
      if (buf[i] == '\n') {
        i++;
        continue;
      }
    }
    size_t j = i;
    while (j < len && buf[j] != '\n' && buf[j] != '\r')
      j++;
    if (j == len)               /* no line end in this piece: keep the start */
      return sse_append_line(p, buf + i, len - i);
    const char *line = buf + i;
    size_t n = j - i;
    if (p->line_len) {
      if ((rc = sse_append_line(p, buf + i, n)) != 0)
        return rc;
      line = p->line;
      n = p->line_len;
    } else if (n > p->max)
      return BERTH_SSE_TOO_LARGE;
    p->after_cr = buf[j] == '\r';
    i = j + 1;
    rc = sse_line(p, line, n, fn, ud);
    p->line_len = 0;
    if (rc)
      return rc;
  }
  return 0;
}

bool berth_sse_end(berth_sse *p)
{
  bool lost = p->line_len > 0 || p->has_data || (p->bom && !p->bom_done);
  p->line_len = 0;
  p->data_len = 0;
  p->has_data = false;
  p->type_len = 0;
  return lost;
}

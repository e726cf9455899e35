/*
 * http.c — streaming POSTs on one libcurl multi handle driven by the host's libev
 * loop (http.h), through libplimsoll's driver lib/curl_ev.c (as lib/transport.c).
 *
 * The curl callbacks (header, write) only record: the status and the headers we
 * need, body bytes appended to the request's pending buffer, and the request put on
 * the `dirty` list.  After curl_multi_socket_action returns, dispatch() collects the
 * finished transfers (curl_multi_info_read, each removed from the multi handle right
 * away) and then, one dirty request at a time, hands the caller its head, its
 * pending bytes and finally its completion.  Callers may start, cancel or free from
 * there: a request whose callback is running (`in_cb`) is only marked when
 * cancelled, and freed once the callback has returned.
 *
 * The idle timeout is ours, not curl's LOW_SPEED_LIMIT/TIME: curl measures an average
 * speed over a window of seconds, so a stream that stalls after a burst was cut only
 * ~5 s past the limit asked for.  Here it is what http.h says: no byte for that long
 * (an ev_timer that looks at when the last byte came, re-armed for what is left).
 */
#include "http.h"
#include "xalloc.h"

#include "curl_ev.h"

#include <curl/curl.h>
#include <ev.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define HTTP_DEFAULT_MAX ((size_t)64 << 20)

struct berth_http {
  plm_curl_ev ev;               /* the multi handle on the loop (lib/curl_ev.h) */
  berth_http_req *all;          /* every request not yet freed */
  berth_http_req *dirty, *dirty_tail;  /* requests with something to hand over */
};

struct berth_http_req {
  berth_http *h;
  CURL *easy;
  struct curl_slist *headers;
  char *body;
  berth_http_cbs cbs;
  void *ud;
  size_t max_bytes;
  long status;                  /* of the response being read */
  char content_type[128];
  char retry_after[64], retry_after_ms[32];
  bool has_retry_after, has_retry_after_ms;
  bool head_ready, head_sent;
  char *pending;                /* body bytes not handed over yet */
  size_t plen, pcap;
  size_t received;
  bool too_large;
  bool attached;                /* in the multi handle */
  bool finished;                /* curl is done with it: rc holds the result */
  bool canceled, in_cb, queued;
  ev_timer idle;                /* idle_s without a byte ends it (active when set) */
  double idle_s;
  ev_tstamp last_byte;
  CURLcode rc;
  char errbuf[CURL_ERROR_SIZE];
  berth_http_req *prev, *next;  /* h->all */
  berth_http_req *next_dirty;
};

/* {====================================================== curl callbacks (record only) */

static void req_queue(berth_http_req *r)
{
  berth_http *h = r->h;
  if (r->queued)
    return;
  r->queued = true;
  r->next_dirty = NULL;
  if (h->dirty_tail)
    h->dirty_tail->next_dirty = r;
  else
    h->dirty = r;
  h->dirty_tail = r;
}

/* Copies the header value [v, end) into out (cut to its size). */
static void header_copy(char *out, size_t size, const char *v, const char *end)
{
  size_t n = (size_t)(end - v);
  if (n >= size)
    n = size - 1;
  memcpy(out, v, n);
  out[n] = '\0';
}

static size_t header_cb(char *line, size_t size, size_t nmemb, void *ud)
{
  berth_http_req *r = ud;
  size_t n = size * nmemb;
  r->last_byte = ev_now(r->h->ev.loop);
  if (n >= 5 && memcmp(line, "HTTP/", 5) == 0) {
    /* A new response (after a 1xx): only the final one's headers count. */
    const char *sp = memchr(line, ' ', n);
    r->status = sp ? strtol(sp + 1, NULL, 10) : 0;
    r->content_type[0] = '\0';
    r->has_retry_after = r->has_retry_after_ms = false;
    return n;
  }
  if ((n == 2 && line[0] == '\r' && line[1] == '\n') || (n == 1 && line[0] == '\n')) {
    if (r->status >= 200 && !r->head_ready) {
      r->head_ready = true;
      req_queue(r);
    }
    return n;
  }
  size_t name, vlen;
  const char *v;
  if (r->head_ready || !plm_curl_ev_header(line, n, &name, &v, &vlen))
    return n;                   /* trailers are not wanted */
  const char *end = v + vlen;
  if (name == 12 && strncasecmp(line, "Content-Type", 12) == 0)
    header_copy(r->content_type, sizeof r->content_type, v, end);
  else if (name == 11 && strncasecmp(line, "Retry-After", 11) == 0) {
    header_copy(r->retry_after, sizeof r->retry_after, v, end);
    r->has_retry_after = true;
  } else if (name == 14 && strncasecmp(line, "retry-after-ms", 14) == 0) {
    header_copy(r->retry_after_ms, sizeof r->retry_after_ms, v, end);
    r->has_retry_after_ms = true;
  }
  return n;
}

static size_t write_cb(char *ptr, size_t size, size_t nmemb, void *ud)
{
  berth_http_req *r = ud;
  size_t n = size * nmemb;
  r->last_byte = ev_now(r->h->ev.loop);
  if (n > r->max_bytes - r->received) {
    r->too_large = true;
    return 0;                   /* CURLE_WRITE_ERROR */
  }
  if (r->plen + n > r->pcap) {
    size_t cap = r->pcap ? r->pcap : 16384;
    while (cap < r->plen + n)
      cap *= 2;
    char *b = berth_xrealloc(r->pending, cap);
    r->pending = b;
    r->pcap = cap;
  }
  memcpy(r->pending + r->plen, ptr, n);
  r->plen += n;
  r->received += n;
  if (!r->head_ready && r->status >= 200)
    r->head_ready = true;
  req_queue(r);
  return n;
}

/* }====================================================== */

/* {====================================================== dispatch (from the loop) */

static void req_free(berth_http_req *r)
{
  berth_http *h = r->h;
  if (r->queued) {
    berth_http_req **pp = &h->dirty;
    h->dirty_tail = NULL;
    while (*pp) {
      if (*pp == r)
        *pp = r->next_dirty;
      else {
        h->dirty_tail = *pp;
        pp = &(*pp)->next_dirty;
      }
    }
  }
  if (r->prev)
    r->prev->next = r->next;
  else
    h->all = r->next;
  if (r->next)
    r->next->prev = r->prev;
  ev_timer_stop(h->ev.loop, &r->idle);
  if (r->attached)
    curl_multi_remove_handle(h->ev.multi, r->easy);
  curl_easy_cleanup(r->easy);
  curl_slist_free_all(r->headers);
  free(r->body);
  free(r->pending);
  free(r);
}

/* Finished transfers: removed from the multi handle at once, delivered later. */
static void collect(berth_http *h)
{
  berth_http_req *r;
  CURLcode rc;
  while ((r = plm_curl_ev_next_done(&h->ev, &rc))) {
    r->attached = false;
    r->finished = true;
    r->rc = rc;
    req_queue(r);
  }
}

static void deliver(berth_http_req *r)
{
  berth_http *h = r->h;
  int stop = 0;
  r->in_cb = true;
  if (r->head_ready && !r->head_sent) {
    r->head_sent = true;
    if (r->cbs.head) {
      berth_http_head hd = {r->status, r->content_type,
                            r->has_retry_after ? r->retry_after : NULL,
                            r->has_retry_after_ms ? r->retry_after_ms : NULL};
      stop = r->cbs.head(r->ud, &hd);
    }
  }
  while (!stop && r->plen && !r->canceled && !h->ev.free_pending) {
    size_t n = r->plen;
    r->plen = 0;                /* nothing appends while we are outside curl */
    stop = r->cbs.chunk(r->ud, r->pending, n);
  }
  if (r->canceled || h->ev.free_pending) {
    r->in_cb = false;
    if (r->canceled)
      req_free(r);
    return;                     /* berth_http_free frees the rest */
  }
  if (!stop && !r->finished) {
    r->in_cb = false;
    return;
  }
  ev_timer_stop(h->ev.loop, &r->idle);
  if (r->attached) {
    curl_multi_remove_handle(h->ev.multi, r->easy);
    r->attached = false;
  }
  berth_http_result res;
  memset(&res, 0, sizeof res);
  res.status = r->head_sent ? r->status : 0;
  res.stopped = stop != 0;
  res.too_large = r->too_large;
  res.received = r->received;
  if (!stop && r->rc != CURLE_OK) {
    res.timed_out = r->rc == CURLE_OPERATION_TIMEDOUT;
    res.error = r->too_large ? "the response is too large"
              : r->errbuf[0] ? r->errbuf : curl_easy_strerror(r->rc);
  }
  r->cbs.done(r->ud, &res);
  r->in_cb = false;
  req_free(r);
}

/* The driver's drain, after every curl_multi_socket_action. */
static void dispatch(void *ud)
{
  berth_http *h = ud;
  plm_curl_ev_hold(&h->ev);
  while (!h->ev.free_pending) {
    collect(h);
    berth_http_req *r = h->dirty;
    if (!r)
      break;
    h->dirty = r->next_dirty;
    if (!h->dirty)
      h->dirty_tail = NULL;
    r->queued = false;
    r->next_dirty = NULL;
    deliver(r);
  }
  if (plm_curl_ev_release(&h->ev))
    berth_http_free(h);
}

/* No byte for idle_s: the transfer ends as timed out (from the loop, outside curl). */
static void on_idle(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)revents;
  berth_http_req *r = w->data;
  if (r->finished || r->canceled)
    return;
  double left = r->last_byte + r->idle_s - ev_now(loop);
  if (left > 0) {
    ev_timer_set(w, left, 0.);
    ev_timer_start(loop, w);
    return;
  }
  berth_http *h = r->h;
  if (r->attached) {
    curl_multi_remove_handle(h->ev.multi, r->easy);
    r->attached = false;
  }
  r->finished = true;
  r->rc = CURLE_OPERATION_TIMEDOUT;
  snprintf(r->errbuf, sizeof r->errbuf, "no byte for %.0f s: the stream stalled", r->idle_s);
  req_queue(r);
  dispatch(h);
}

/* }====================================================== */

/* {====================================================== public */

berth_http *berth_http_new(struct ev_loop *loop)
{
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
    return NULL;
  berth_http *h = berth_xcalloc(1, sizeof *h);
  if (!h || plm_curl_ev_init(&h->ev, loop, dispatch, h) != 0) {
    free(h);
    curl_global_cleanup();
    return NULL;
  }
  return h;
}

void berth_http_free(berth_http *h)
{
  if (!h)
    return;
  if (plm_curl_ev_defer_free(&h->ev))
    return;
  while (h->all)
    req_free(h->all);
  plm_curl_ev_fini(&h->ev);     /* closes cached connections, stops every watcher */
  free(h);
  curl_global_cleanup();
}

berth_http_req *berth_http_start(berth_http *h, const berth_http_post *p,
                                 const berth_http_cbs *cbs, void *ud)
{
  if (h->ev.free_pending)
    return NULL;
  berth_http_req *r = berth_xcalloc(1, sizeof *r);
  r->h = h;
  r->cbs = *cbs;
  r->ud = ud;
  r->max_bytes = p->max_bytes ? p->max_bytes : HTTP_DEFAULT_MAX;
  r->body = berth_xmalloc(p->body_len + 1);
  r->easy = curl_easy_init();
  if (!r->body || !r->easy) {
    if (r->easy)
      curl_easy_cleanup(r->easy);
    free(r->body);
    free(r);
    return NULL;
  }
  memcpy(r->body, p->body, p->body_len);
  r->body[p->body_len] = '\0';
  struct curl_slist *hd = NULL;
  for (const char *const *s = p->headers; s && *s; s++)
    hd = curl_slist_append(hd, *s);
  hd = curl_slist_append(hd, "Expect:");  /* no 100-continue round trip */
  r->headers = hd;
  CURL *e = r->easy;
  /* No redirect is followed: the key must not go elsewhere. */
  plm_curl_ev_post_opts(e, p->url, r->body, p->body_len, hd, write_cb, header_cb, r, r->errbuf);
  curl_easy_setopt(e, CURLOPT_SUPPRESS_CONNECT_HEADERS, 1L);
  curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
  if (p->connect_timeout_ms > 0)
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, p->connect_timeout_ms);
  if (p->timeout_ms > 0)
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, p->timeout_ms);
  if (p->no_proxy)
    curl_easy_setopt(e, CURLOPT_NOPROXY, "*");
  if (curl_multi_add_handle(h->ev.multi, e) != CURLM_OK) {
    curl_easy_cleanup(e);
    curl_slist_free_all(hd);
    free(r->body);
    free(r);
    return NULL;
  }
  r->attached = true;
  ev_timer_init(&r->idle, on_idle, 0., 0.);
  r->idle.data = r;
  if (p->idle_timeout_s > 0) {  /* from the start: a server that never answers too */
    r->idle_s = (double)p->idle_timeout_s;
    r->last_byte = ev_now(h->ev.loop);
    ev_timer_set(&r->idle, r->idle_s, 0.);
    ev_timer_start(h->ev.loop, &r->idle);
  }
  r->next = h->all;
  if (h->all)
    h->all->prev = r;
  h->all = r;
  return r;
}

void berth_http_cancel(berth_http_req *r)
{
  if (!r || r->canceled)
    return;
  r->canceled = true;
  if (!r->in_cb)                /* else deliver() frees it when the callback returns */
    req_free(r);
}

/* }====================================================== */

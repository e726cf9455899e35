/*
 * http.h — a small libcurl multi-socket client on a libev loop for streaming POSTs
 * (the model adapters' transport), on the driver lib/transport.c uses too
 * (lib/curl_ev.c), and to the same rules (docs/architecture.md §4.1):
 *   - every callback to the caller runs from the loop after curl_multi_socket_action
 *     has returned, never inside a libcurl callback: the curl callbacks only queue
 *     (headers seen, body bytes, completion), and the queue is drained afterwards;
 *     so a caller may start, cancel or free requests from its callbacks;
 *   - the socket callback tolerates unknown sockets and re-initialises the ev_io on
 *     every registration (fd numbers are reused), and stops it before curl closes;
 *   - curl's timeout is converted with / 1000.0.
 *
 * Per request, in this order: `head` once when the final response's headers are in
 * (not for 1xx), `chunk` for body bytes as they arrive (consecutive reads may be
 * merged into one call), then `done` exactly once — unless berth_http_cancel or
 * berth_http_free came first, after which nothing is called.  A non-zero return from
 * `head` or `chunk` ends the request at once: `done` follows with `stopped` set.
 */
#ifndef BERTH_HTTP_H
#define BERTH_HTTP_H

#include <stdbool.h>
#include <stddef.h>

struct ev_loop;

typedef struct berth_http berth_http;
typedef struct berth_http_req berth_http_req;

typedef struct berth_http_head {
  long status;                  /* the final status code */
  const char *content_type;     /* "" when absent */
  const char *retry_after;      /* Retry-After, or NULL */
  const char *retry_after_ms;   /* retry-after-ms (some providers), or NULL */
} berth_http_head;

typedef struct berth_http_result {
  long status;                  /* 0: no response came */
  const char *error;            /* NULL: the transfer completed; else curl's reason */
  bool timed_out;               /* connect, idle or total timeout */
  bool too_large;               /* the body passed max_bytes */
  bool stopped;                 /* a callback returned non-zero */
  size_t received;              /* body bytes */
} berth_http_result;

typedef struct berth_http_cbs {
  int (*head)(void *ud, const berth_http_head *head);                /* may be NULL */
  int (*chunk)(void *ud, const char *data, size_t len);
  void (*done)(void *ud, const berth_http_result *res);
} berth_http_cbs;

typedef struct berth_http_post {
  const char *url;
  const char *const *headers;   /* "Name: value" strings, NULL-terminated (copied) */
  const char *body;             /* copied */
  size_t body_len;
  long connect_timeout_ms;      /* 0: curl's default */
  long idle_timeout_s;          /* no body byte for this long ends it; 0: none */
  long timeout_ms;              /* the whole exchange; 0: none */
  size_t max_bytes;             /* body limit; 0: 64 MiB */
  bool no_proxy;                /* ignore proxy environment variables (loopback) */
} berth_http_post;

berth_http *berth_http_new(struct ev_loop *loop);
/* Ends every request without calling back.  From a callback, takes effect once the
 * callbacks of this round have returned (and no further callback runs). */
void berth_http_free(berth_http *h);
/* Starts a POST.  Returns NULL (nothing will be called) if it cannot start. */
berth_http_req *berth_http_start(berth_http *h, const berth_http_post *p,
                                 const berth_http_cbs *cbs, void *ud);
/* Ends the request; no callback of it runs after this returns. */
void berth_http_cancel(berth_http_req *r);

#endif

/*
 * http.h — the HTTP/1.1 server: libmicrohttpd in external-select epoll mode, driven by
 * the daemon's libev loop.
 *
 * Before a route's handler runs, this layer refuses on its own (with the header
 * `Plimsoll-Not-Dispatched`) an unknown path, another method than POST, a wrong
 * content type, a body over the cap and a body that is not one JSON object, and
 * refuses an unknown bearer token (unauthenticated, NotDispatched{permission}).  It
 * echoes a well-formed `Plimsoll-Request-Id` on every answer.
 *
 * A handler answers each call exactly once, at once or later from any loop callback:
 * the connection is suspended meanwhile and resumed when the answer is ready.
 */
#ifndef SBX_HTTP_H
#define SBX_HTTP_H

#include "errors.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ev_loop;
struct sbx_config;

typedef struct sbx_http sbx_http;
typedef struct sbx_call sbx_call;

typedef void (*sbx_handler)(void *app, sbx_call *call);

typedef struct sbx_route {
    const char *path;
    /* A Connect procedure: needs Content-Type application/json, a known bearer token
     * and a body that is one JSON object.  Other routes (test endpoints) take any body. */
    bool rpc;
    sbx_handler handler;
} sbx_route;

/* Binds cfg->listen_host:listen_port and starts serving `routes` (kept by reference).
 * NULL and *why (malloc'd) on failure. */
sbx_http *sbx_http_new(struct ev_loop *loop, const struct sbx_config *cfg,
                       const sbx_route *routes, size_t n_routes, void *app, char **why);
/* The bound port (useful with port 0). */
unsigned sbx_http_port(const sbx_http *h);
/* Stops accepting connections; later requests on open connections are refused
 * `unavailable` (nothing ran) and their connections closed. */
void sbx_http_quiesce(sbx_http *h);
/* Requests whose answer is not completely sent yet (idle keep-alive connections do
 * not count). */
size_t sbx_http_active(const sbx_http *h);
/* Called (from the loop) whenever the active count drops to zero. */
void sbx_http_on_idle(sbx_http *h, void (*cb)(void *ud), void *ud);
void sbx_http_free(sbx_http *h);

/* ---- one call */
const json_t *sbx_call_body(const sbx_call *c);        /* the JSON object (rpc routes) */
const char *sbx_call_principal(const sbx_call *c);     /* SHA-256 hex of the token, or "" */
int64_t sbx_call_started_ms(const sbx_call *c);        /* when the request arrived */
/* Whether the caller has closed its side of the connection (a suspended call's caller
 * may hang up while it works): its answer would reach nobody. */
bool sbx_call_caller_gone(const sbx_call *c);
/* Answers, taking ownership of the argument. */
void sbx_call_reply_json(sbx_call *c, json_t *body);   /* 200 application/json */
void sbx_call_reply_error(sbx_call *c, sbx_err *err);
void sbx_call_reply_empty(sbx_call *c, unsigned status);

#endif

/*
 * test_endpoints.c — the test endpoints.  wait-ended parks its call until the registry
 * reports that every session has ended, or its 10 s bound passes.
 */
#include "test_endpoints.h"

#include "log.h"
#include "util.h"

#include <ev.h>
#include <stdlib.h>

#define WAIT_ENDED_S 10.

typedef struct waiter {
    sbx_test_endpoints *t;
    sbx_call *call;
    ev_timer timeout;
    struct waiter *prev, *next;
} waiter;

struct sbx_test_endpoints {
    sbx_app *app;
    waiter *waiters;
};

static void waiter_done(waiter *w, unsigned status)
{
    sbx_test_endpoints *t = w->t;
    ev_timer_stop(t->app->loop, &w->timeout);
    if (w->prev)
        w->prev->next = w->next;
    else
        t->waiters = w->next;
    if (w->next)
        w->next->prev = w->prev;
    sbx_call_reply_empty(w->call, status);
    free(w);
}

static void on_wait_timeout(struct ev_loop *loop, ev_timer *timer, int revents)
{
    (void)loop;
    (void)revents;
    waiter_done(timer->data, 504);
}

static void on_session_end(void *ud)
{
    sbx_test_endpoints *t = ud;
    if (!sbx_registry_all_ended(t->app->sessions))
        return;
    while (t->waiters)
        waiter_done(t->waiters, 200);
}

sbx_test_endpoints *sbx_test_endpoints_new(sbx_app *app)
{
    sbx_test_endpoints *t = sbx_xcalloc(1, sizeof *t);
    t->app = app;
    sbx_registry_on_end(app->sessions, on_session_end, t);
    return t;
}

void sbx_test_endpoints_free(sbx_test_endpoints *t)
{
    if (!t)
        return;
    /* Only after the server stopped; a waiter left then has no connection. */
    while (t->waiters) {
        waiter *w = t->waiters;
        t->waiters = w->next;
        ev_timer_stop(t->app->loop, &w->timeout);
        free(w);
    }
    sbx_registry_on_end(t->app->sessions, NULL, NULL);
    free(t);
}

void sbx_test_end_sessions(void *ud, sbx_call *call)
{
    sbx_app *app = ud;
    sbx_log("test endpoint: ending every session as expired");
    sbx_registry_end_all(app->sessions, PLM_END_EXPIRED, "ended by the test endpoint");
    sbx_call_reply_empty(call, 200);
}

void sbx_test_wait_ended(void *ud, sbx_call *call)
{
    sbx_app *app = ud;
    sbx_test_endpoints *t = app->test_endpoints;
    if (sbx_registry_all_ended(app->sessions)) {
        sbx_call_reply_empty(call, 200);
        return;
    }
    waiter *w = sbx_xcalloc(1, sizeof *w);
    w->t = t;
    w->call = call;
    w->next = t->waiters;
    if (t->waiters)
        t->waiters->prev = w;
    t->waiters = w;
    ev_timer_init(&w->timeout, on_wait_timeout, WAIT_ENDED_S, 0.);
    w->timeout.data = w;
    ev_timer_start(app->loop, &w->timeout);
}

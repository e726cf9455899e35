/*
 * main.c — sandboxd: start-up, the loop, and the drain on SIGTERM / SIGINT.
 *
 * Start-up order: flags, token file, provider, the provider's smoke test (nothing is
 * offered until it passed), the session registry, the HTTP server, then exactly one
 * line on stdout: `listening http://HOST:PORT`.
 *
 * Drain: stop accepting, end every session as `shutdown`, let every request in flight
 * get its answer sent and every sandbox close, then exit 0.
 */
#include "daemon.h"
#include "config.h"
#include "http.h"
#include "log.h"
#include "records.h"
#include "rpc.h"
#include "sessions.h"
#include "sup_proto.h"
#include "test_endpoints.h"
#include "util.h"

#include <ev.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DRAIN_LIMIT_S 10.

typedef struct daemon_state {
    sbx_app app;
    sbx_http *http;
    ev_signal sigterm, sigint;
    ev_timer drain_limit;
    bool draining, sessions_quiet, forced;
} daemon_state;

static const sbx_route rpc_routes[] = {
    {SBX_SERVICE_PREFIX "Describe", true, sbx_rpc_describe},
    {SBX_SERVICE_PREFIX "Run", true, sbx_rpc_run},
    {SBX_SERVICE_PREFIX "OpenSession", true, sbx_rpc_open_session},
    {SBX_SERVICE_PREFIX "SessionRun", true, sbx_rpc_session_run},
    {SBX_SERVICE_PREFIX "CloseSession", true, sbx_rpc_close_session},
    /* only served with --test-endpoints (they come last: see main) */
    {"/test/end-sessions", false, sbx_test_end_sessions},
    {"/test/wait-ended", false, sbx_test_wait_ended},
};
#define N_RPC_ROUTES 5

/* ---------------------------------------------------------------- smoke test */

typedef struct smoke_state {
    bool done;
    char *why;
} smoke_state;

static void on_smoke(void *ud, char *why_failed)
{
    smoke_state *s = ud;
    s->done = true;
    s->why = why_failed;
}

static bool smoke_test(sbx_app *app)
{
    smoke_state s = {false, NULL};
    app->ops->smoke_test(app->provider, on_smoke, &s);
    while (!s.done)
        ev_run(app->loop, EVRUN_ONCE);
    if (s.why) {
        sbx_log("provider %s failed its smoke test at tier %s: %s", app->facts->name,
                app->facts->tier, s.why);
        free(s.why);
        return false;
    }
    sbx_log("provider %s passed its smoke test at tier %s", app->facts->name, app->facts->tier);
    return true;
}

/* Creates and smoke-tests the named providers in order and keeps the first that passed
 * (--provider auto: the strongest tier this machine supports). */
static bool start_provider(sbx_app *app, const char *const *names)
{
    for (; *names; names++) {
        const sbx_provider_ops *ops = sbx_provider_find(*names);
        char *why = NULL;
        sbx_provider *p = ops->create(app->loop, app->cfg, &why);
        if (!p) {
            sbx_log("provider %s would not start: %s", *names, why ? why : "?");
            free(why);
            continue;
        }
        app->ops = ops;
        app->provider = p;
        app->facts = ops->facts(p);
        if (smoke_test(app))
            return true;
        ops->destroy(p);
        app->provider = NULL;
    }
    return false;
}

/* ---------------------------------------------------------------- drain */

static void maybe_finish(daemon_state *d)
{
    if (d->draining && d->sessions_quiet && sbx_http_active(d->http) == 0)
        ev_break(d->app.loop, EVBREAK_ALL);
}

static void on_sessions_quiet(void *ud)
{
    daemon_state *d = ud;
    d->sessions_quiet = true;
    maybe_finish(d);
}

static void on_http_idle(void *ud)
{
    maybe_finish(ud);
}

static void on_drain_limit(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)revents;
    daemon_state *d = w->data;
    sbx_log("drain: still busy after %.0f s (%zu requests in flight); stopping anyway",
            DRAIN_LIMIT_S, sbx_http_active(d->http));
    d->forced = true;
    ev_break(loop, EVBREAK_ALL);
}

static void on_signal(struct ev_loop *loop, ev_signal *w, int revents)
{
    (void)revents;
    daemon_state *d = w->data;
    if (d->draining)
        return;
    d->draining = true;
    sbx_log("%s: draining (no new connections, every session ends as shutdown)",
            strsignal(w->signum));
    sbx_http_quiesce(d->http);
    sbx_http_on_idle(d->http, on_http_idle, d);
    ev_timer_init(&d->drain_limit, on_drain_limit, DRAIN_LIMIT_S, 0.);
    d->drain_limit.data = d;
    ev_timer_start(loop, &d->drain_limit);
    sbx_registry_shutdown(d->app.sessions, on_sessions_quiet, d);
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
    /* The same binary is the helper inside every sandbox (supervisor.c). */
    if (argc > 1 && strcmp(argv[1], "--berth-supervisor") == 0)
        return sbx_supervisor_main(argc - 2, argv + 2);
    sbx_config cfg;
    int rc = sbx_config_parse(&cfg, argc, argv);
    if (rc) {
        sbx_config_free(&cfg);
        return rc == 1 ? 0 : 2;
    }
    static const char *const auto_order[] = {"gvisor", "bwrap", NULL};
    const char *const chosen[] = {cfg.provider, NULL};
    bool auto_pick = strcmp(cfg.provider, "auto") == 0;
    if (!auto_pick && !sbx_provider_find(cfg.provider)) {
        fprintf(stderr, "sandboxd: unknown provider \"%s\" (available: %s)\n\n"
                        "usage: sandboxd --listen HOST:PORT --token-file FILE [--provider NAME] "
                        "[options]; see --help\n", cfg.provider, sbx_provider_names());
        sbx_config_free(&cfg);
        return 2;
    }
    if (sbx_config_load_tokens(&cfg) != 0) {
        sbx_config_free(&cfg);
        return 2;
    }
    if (cfg.record_key_path) { /* before any provider: a bad key starts nothing */
        char *why = NULL;
        if (sbx_records_load_key(cfg.record_key_path, &why) != 0) {
            fprintf(stderr, "sandboxd: %s\n", why);
            free(why);
            sbx_config_free(&cfg);
            return 2;
        }
        sbx_log("records are signed (DSSE, Ed25519) with key %s", sbx_records_key_id());
    }
    signal(SIGPIPE, SIG_IGN);

    daemon_state d;
    memset(&d, 0, sizeof d);
    sbx_app *app = &d.app;
    app->loop = ev_default_loop(EVFLAG_AUTO);
    app->cfg = &cfg;
    if (!start_provider(app, auto_pick ? auto_order : chosen)) {
        sbx_log("no provider passed its smoke test (--provider %s)", cfg.provider);
        sbx_config_free(&cfg);
        return 1;
    }
    const sbx_provider_ops *ops = app->ops;
    char *why = NULL;
    app->sessions = sbx_registry_new(app->loop, &cfg, ops, app->provider);
    if (cfg.test_endpoints)
        app->test_endpoints = sbx_test_endpoints_new(app);
    size_t n_routes = cfg.test_endpoints ? SBX_ARRAY_LEN(rpc_routes) : N_RPC_ROUTES;
    d.http = sbx_http_new(app->loop, &cfg, rpc_routes, n_routes, app, &why);
    if (!d.http) {
        sbx_log("%s", why ? why : "cannot start the HTTP server");
        free(why);
        sbx_test_endpoints_free(app->test_endpoints);
        sbx_registry_free(app->sessions);
        ops->destroy(app->provider);
        sbx_config_free(&cfg);
        return 1;
    }
    bool v6 = strchr(cfg.listen_host, ':') != NULL;
    printf("listening http://%s%s%s:%u\n", v6 ? "[" : "", cfg.listen_host, v6 ? "]" : "",
           sbx_http_port(d.http));
    fflush(stdout);
    sbx_log("serving plimsoll protocol %u with provider %s at tier %s (%zu tokens, sessions %s)",
            SBX_PROTOCOL, app->facts->name, app->facts->tier, cfg.n_tokens,
            cfg.max_sessions ? "on" : "off");

    ev_signal_init(&d.sigterm, on_signal, SIGTERM);
    ev_signal_init(&d.sigint, on_signal, SIGINT);
    d.sigterm.data = d.sigint.data = &d;
    ev_signal_start(app->loop, &d.sigterm);
    ev_signal_start(app->loop, &d.sigint);

    ev_run(app->loop, 0);

    if (d.forced) { /* something still runs: leave the cleanup to the kernel */
        sbx_log("stopped (forced)");
        return 0;
    }
    ev_signal_stop(app->loop, &d.sigterm);
    ev_signal_stop(app->loop, &d.sigint);
    ev_timer_stop(app->loop, &d.drain_limit);
    sbx_http_free(d.http);
    sbx_test_endpoints_free(app->test_endpoints);
    sbx_registry_free(app->sessions);
    ops->destroy(app->provider);
    sbx_config_free(&cfg);
    ev_loop_destroy(app->loop);
    sbx_log("stopped");
    return 0;
}

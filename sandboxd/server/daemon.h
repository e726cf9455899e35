/*
 * daemon.h — what every handler needs: the loop, the configuration, the provider and
 * the session registry.  One per process, created by main and passed as the route
 * handlers' `app` (no globals).
 */
#ifndef SBX_APP_H
#define SBX_APP_H

#include "config.h"
#include "provider.h"
#include "sessions.h"

struct ev_loop;
struct sbx_test_endpoints;

typedef struct sbx_app {
    struct ev_loop *loop;
    const sbx_config *cfg;
    const sbx_provider_ops *ops;
    sbx_provider *provider;
    const sbx_facts *facts;
    sbx_registry *sessions;
    struct sbx_test_endpoints *test_endpoints;     /* NULL without --test-endpoints */
    /* Single runs executing now, for the admission limits (rpc.c). */
    uint32_t runs_active;
    struct run_op *runs;
} sbx_app;

#endif

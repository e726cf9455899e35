/*
 * test_endpoints.h — endpoints for client test suites (--test-endpoints only), as plimsoll's
 * test daemons serve them (docs/daemon.md §9, docs/conformance.md D59):
 *   POST /test/end-sessions  ends every session as `expired`; 200, no body.
 *   POST /test/wait-ended    200 once every opened session has ended, 504 after 10 s.
 * No token is needed: they exist only on a daemon started for tests.
 */
#ifndef SBX_TESTEP_H
#define SBX_TESTEP_H

#include "daemon.h"
#include "http.h"

typedef struct sbx_test_endpoints sbx_test_endpoints;

sbx_test_endpoints *sbx_test_endpoints_new(sbx_app *app);
void sbx_test_endpoints_free(sbx_test_endpoints *t);

void sbx_test_end_sessions(void *app, sbx_call *call);
void sbx_test_wait_ended(void *app, sbx_call *call);

#endif

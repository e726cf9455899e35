/*
 * rpc.h — the five procedures of plimsoll.v1.SandboxService (docs/wire.md §2), as route
 * handlers for http.h.  `app` is the sbx_app.
 */
#ifndef SBX_RPC_H
#define SBX_RPC_H

#include "daemon.h"
#include "http.h"
#include "request.h"

#define SBX_SERVICE_PREFIX "/plimsoll.v1.SandboxService/"

void sbx_rpc_describe(void *app, sbx_call *call);
void sbx_rpc_run(void *app, sbx_call *call);
void sbx_rpc_open_session(void *app, sbx_call *call);
void sbx_rpc_session_run(void *app, sbx_call *call);
void sbx_rpc_close_session(void *app, sbx_call *call);

/* ---- shared by rpc.c and rpc_session.c */

/* The protocol check, then the rest of the request; on refusal answers the call and
 * returns false. */
bool sbx_rpc_read(sbx_app *app, sbx_call *call, sbx_rpc rpc, sbx_request *req);
/* Whether this run can happen here at all: payload kind, grants, the floor against
 * `tier`, the software rule against `software_identity`. */
sbx_err *sbx_rpc_dispatchable(const sbx_facts *f, const sbx_request *req, const char *tier,
                              const char *software_identity, bool in_session);
/* The request digest of the body exactly as received. */
sbx_err *sbx_rpc_request_digest(const sbx_request *req, plm_hex hex);
/* Answers with a refusal and logs it. */
void sbx_rpc_refuse(sbx_call *call, const char *what, sbx_err *err);

#endif

/*
 * sessions.h — the session registry (docs/daemon.md §3 and §6): ids and fingerprints,
 * ownership by principal, caps and per-owner LRU replacement, the per-session turn,
 * lifetime / idle / unclaimed timers, ends, tombstones and the record chain.
 *
 * The registry knows nothing of HTTP or JSON; the RPC layer drives it.
 */
#ifndef SBX_SESSIONS_H
#define SBX_SESSIONS_H

#include "errors.h"
#include "provider.h"

#include <stdbool.h>
#include <stdint.h>

struct ev_loop;
struct sbx_config;

typedef struct sbx_registry sbx_registry;
typedef struct sbx_session sbx_session;

sbx_registry *sbx_registry_new(struct ev_loop *loop, const struct sbx_config *cfg,
                               const sbx_provider_ops *ops, sbx_provider *provider);
/* Frees everything left (after the loop stopped). */
void sbx_registry_free(sbx_registry *r);

/* ---- open */
typedef struct sbx_open_req {
    const char *principal;
    const char *owner;             /* NULL: no owner, counted against no owner cap */
    uint32_t lifetime_ms;          /* requested; 0 = the daemon's */
    uint32_t idle_ms;              /* requested; 0 = the daemon's */
    unsigned languages;            /* SBX_LANG_* hint, already narrowed to the provider's */
} sbx_open_req;

/* On success `s` is the new session (the registry's; take a ref to keep it). */
typedef void (*sbx_opened_cb)(void *ud, sbx_err *err, sbx_session *s);
/* Reserves a place (per-owner cap with LRU replacement, then the daemon-wide cap, then
 * the per-caller cap).  A refusal is returned at once and touches nothing (`cb` is
 * not called).  Otherwise it returns NULL, replaces the chosen sessions, waits for
 * their sandboxes to be gone, opens the provider's session, registers it and answers
 * through `cb` from the loop. */
sbx_err *sbx_registry_open(sbx_registry *r, const sbx_open_req *req, sbx_opened_cb cb,
                           void *ud);

/* ---- lookup: (id, principal); another principal's id is not found.  Marks the
 * session claimed.  Returns a new reference, or NULL. */
sbx_session *sbx_registry_find(sbx_registry *r, const char *id, const char *principal);
void sbx_session_ref(sbx_session *s);
void sbx_session_unref(sbx_session *s);

/* ---- the turn: one call at a time, at most one more waiting. */
typedef enum sbx_turn { SBX_TURN_NOW, SBX_TURN_QUEUED, SBX_TURN_BUSY } sbx_turn;
typedef void (*sbx_turn_cb)(void *ud, sbx_session *s);
/* NOW: the caller holds the turn (cb unused).  QUEUED: cb runs when it is granted, from
 * the loop.  BUSY: someone already waits; refuse the call. */
sbx_turn sbx_session_take_turn(sbx_session *s, sbx_turn_cb cb, void *ud);
/* A call is about to run in the provider: the idle timer stops. */
void sbx_session_begin_call(sbx_session *s);
/* Gives the turn back.  `executed`: the call ran (the idle timer restarts for a full
 * period and the LRU clock ticks); otherwise the idle timer keeps its old deadline, so
 * refusals do not keep a session awake. */
void sbx_session_release_turn(sbx_session *s, bool executed);

/* ---- state */
bool sbx_session_known(const sbx_session *s);            /* still registered (not forgotten) */
plm_session_end sbx_session_end_reason(const sbx_session *s, const char **detail);
/* An end its provider found but has not told yet (provider.h: session_found_end), or
 * PLM_END_OPEN. */
plm_session_end sbx_session_found_end(const sbx_session *s, const char **detail);
/* Ends the session (first reason wins) and closes its sandbox.  An end other than
 * CLOSED leaves a tombstone for 10 minutes so the owner's CloseSession collects it. */
void sbx_session_end(sbx_session *s, plm_session_end why, const char *detail);
/* Forgets it (CloseSession answered): later calls find nothing. */
void sbx_session_forget(sbx_session *s);

const char *sbx_session_fingerprint(const sbx_session *s);
const char *sbx_session_id(const sbx_session *s);        /* only for the open answer */
const char *sbx_session_tier(const sbx_session *s);
const char *sbx_session_software_identity(const sbx_session *s);
int64_t sbx_session_expires_ms(const sbx_session *s);
uint32_t sbx_session_idle_ms(const sbx_session *s);
sbx_psession *sbx_session_provider(const sbx_session *s); /* NULL once ended */

/* ---- the chain */
uint64_t sbx_session_calls(const sbx_session *s);
const char *sbx_session_last_sha(const sbx_session *s);  /* "" before the first call */
void sbx_session_chain_push(sbx_session *s, const char *record_sha256);

/* ---- the whole registry */
void sbx_registry_end_all(sbx_registry *r, plm_session_end why, const char *detail);
/* No session open and none opening (every session ever opened has ended). */
bool sbx_registry_all_ended(const sbx_registry *r);
/* Called after a session ends or an open fails (from inside the ending call). */
void sbx_registry_on_end(sbx_registry *r, void (*cb)(void *ud), void *ud);
/* Refuses new opens, ends every session as shutdown; `cb` runs once no provider
 * operation (open, close, suspend) is in flight. */
void sbx_registry_shutdown(sbx_registry *r, void (*cb)(void *ud), void *ud);

#endif

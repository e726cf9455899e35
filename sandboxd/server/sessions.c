/*
 * sessions.c — the session registry.
 *
 * A session moves OPENING (a place reserved, the provider creating the sandbox) →
 * LIVE (registered; open, or ended and kept as a tombstone that refuses calls with
 * its end) → FORGOTTEN (unlinked; freed once the last reference and the provider's
 * last operation are gone).  Caps count opening sessions and registered ones that
 * have not ended: kept as counts (the daemon's and each caller's), changed as a session
 * starts opening, fails to open or ends, so an open costs the same with 10 sessions
 * held as with 10 000 (a walk of every session at each open was 8 % of sandboxd in a
 * burst of 2 000 opens, growing with every session held).
 *
 * Timers run on the loop's clock; expiresUnixMs is reported in wall-clock time.
 */
#include "sessions.h"

#include "config.h"
#include "idmap.h"
#include "log.h"
#include "util.h"

#include <ev.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOMBSTONE_S (10. * 60.)
#define UNCLAIMED_DEFAULT_S (5. * 60.) /* when idle is 0 (never suspend) */
#define MIN_IDLE_MS 1000u

typedef enum sess_state { S_OPENING, S_LIVE, S_FORGOTTEN } sess_state;

/* What one caller holds (the per-caller cap): a record per principal that ever opened,
 * kept until the registry goes.  Principals are the callers the token file lets in. */
typedef struct caller_count {
    plm_idmap_node node;           /* in the registry's `callers`, keyed by principal */
    char principal[65];
    size_t held;
} caller_count;

struct sbx_session {
    sbx_registry *reg;
    int refs;
    sess_state state;
    char id[33];
    char fp[65];                   /* SHA-256 of the id, hex: logs name it, `live` is keyed by it */
    plm_idmap_node by_fp;          /* in the registry's `live` while S_LIVE */
    char principal[65];
    caller_count *caller;          /* its principal's count */
    bool held;                     /* counted against the caps: opening, or open */
    char *owner;
    char *tier, *software_identity;
    sbx_psession *ps;              /* NULL once the provider closed it */
    int provider_ops;              /* provider operations in flight (open, suspend, close) */
    plm_session_end end;
    char *end_detail;
    bool claimed;
    uint64_t calls;
    char last_sha[65];
    uint64_t used;                 /* LRU clock */
    uint32_t lifetime_ms, idle_ms; /* effective */
    int64_t expires_ms;
    ev_tstamp idle_at;             /* the idle timer's deadline (loop clock), 0 = none */
    ev_timer lifetime, idle, tombstone, grant;
    bool busy, has_waiter;         /* the turn */
    sbx_turn_cb waiter_cb;
    void *waiter_ud;
    /* while opening */
    sbx_opened_cb opened_cb;
    void *opened_ud;
    unsigned languages;
    int victims_pending;           /* replaced sessions whose sandboxes are not gone yet */
    sbx_session *gone_waiter;      /* as a victim: the open waiting for our sandbox */
    sbx_session *prev, *next;
};

struct sbx_registry {
    struct ev_loop *loop;
    const sbx_config *cfg;
    const sbx_provider_ops *ops;
    sbx_provider *provider;
    sbx_session *sessions;         /* registered: open and tombstones */
    plm_idmap live;                /* the same, by fingerprint: a call's lookup */
    sbx_session *opening;
    size_t held;                   /* sessions opening, and registered ones not ended */
    plm_idmap callers;             /* caller_count by principal */
    uint64_t clock;
    int provider_ops;              /* across all sessions */
    bool shutting_down;
    void (*on_end)(void *ud);
    void *on_end_ud;
    void (*quiet_cb)(void *ud);
    void *quiet_ud;
    ev_timer quiet_now;            /* reports "already quiet" from the loop */
};

static void start_provider_open(sbx_session *s);
static void on_idle(struct ev_loop *loop, ev_timer *w, int revents);
static void on_lifetime(struct ev_loop *loop, ev_timer *w, int revents);
static void on_tombstone(struct ev_loop *loop, ev_timer *w, int revents);
static void on_grant(struct ev_loop *loop, ev_timer *w, int revents);
static void on_quiet_now(struct ev_loop *loop, ev_timer *w, int revents);

/* ---------------------------------------------------------------- lists, refs, life */

static void list_add(sbx_session **head, sbx_session *s)
{
    s->prev = NULL;
    s->next = *head;
    if (*head)
        (*head)->prev = s;
    *head = s;
}

static void list_del(sbx_session **head, sbx_session *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        *head = s->next;
    if (s->next)
        s->next->prev = s->prev;
    s->prev = s->next = NULL;
}

/* The count of `principal`'s sessions, made on its first open. */
static caller_count *caller_of(sbx_registry *r, const char *principal)
{
    plm_idmap_node *n = plm_idmap_get(&r->callers, principal);
    if (n)
        return PLM_IDMAP_OWNER(n, caller_count, node);
    caller_count *c = sbx_xcalloc(1, sizeof *c);
    snprintf(c->principal, sizeof c->principal, "%s", principal);
    c->node.key = c->principal;
    if (!plm_idmap_put(&r->callers, &c->node))
        sbx_out_of_memory();
    return c;
}

static void caller_free(void *ud, plm_idmap_node *n)
{
    plm_idmap_remove(ud, n);
    free(PLM_IDMAP_OWNER(n, caller_count, node));
}

/* The session counts against the caps from now (it starts opening)... */
static void hold(sbx_session *s)
{
    s->held = true;
    s->reg->held++;
    s->caller->held++;
}

/* ...until it fails to open or ends.  Once. */
static void unhold(sbx_session *s)
{
    if (!s->held)
        return;
    s->held = false;
    s->reg->held--;
    s->caller->held--;
}

static sbx_session *session_new(sbx_registry *r, const sbx_open_req *req)
{
    sbx_session *s = sbx_xcalloc(1, sizeof *s);
    s->reg = r;
    s->refs = 1; /* the registry's, until forgotten */
    s->state = S_OPENING;
    s->end = PLM_END_OPEN;
    snprintf(s->principal, sizeof s->principal, "%s", req->principal);
    s->caller = caller_of(r, s->principal);
    s->owner = sbx_xstrdup(req->owner);
    s->languages = req->languages;
    ev_timer_init(&s->lifetime, on_lifetime, 0., 0.);
    ev_timer_init(&s->idle, on_idle, 0., 0.);
    ev_timer_init(&s->tombstone, on_tombstone, 0., 0.);
    ev_timer_init(&s->grant, on_grant, 0., 0.);
    s->lifetime.data = s->idle.data = s->tombstone.data = s->grant.data = s;
    return s;
}

static void session_free(sbx_session *s)
{
    struct ev_loop *loop = s->reg->loop;
    ev_timer_stop(loop, &s->lifetime);
    ev_timer_stop(loop, &s->idle);
    ev_timer_stop(loop, &s->tombstone);
    ev_timer_stop(loop, &s->grant);
    free(s->owner);
    free(s->tier);
    free(s->software_identity);
    free(s->end_detail);
    OPENSSL_cleanse(s->id, sizeof s->id); /* the capability does not linger in the heap */
    free(s);
}

void sbx_session_ref(sbx_session *s)
{
    s->refs++;
}

void sbx_session_unref(sbx_session *s)
{
    if (--s->refs == 0 && s->provider_ops == 0)
        session_free(s);
}

/* A provider operation keeps its session alive until it completes. */
static void provider_op_begin(sbx_session *s)
{
    s->provider_ops++;
    s->reg->provider_ops++;
}

static void provider_op_end(sbx_session *s)
{
    sbx_registry *r = s->reg;
    s->provider_ops--;
    r->provider_ops--;
    if (s->refs == 0 && s->provider_ops == 0)
        session_free(s);
    if (r->provider_ops == 0 && r->shutting_down && r->quiet_cb) {
        void (*cb)(void *) = r->quiet_cb;
        r->quiet_cb = NULL;
        cb(r->quiet_ud);
    }
}

/* ---------------------------------------------------------------- accessors */

bool sbx_session_known(const sbx_session *s) { return s->state == S_LIVE; }
const char *sbx_session_fingerprint(const sbx_session *s) { return s->fp; }
const char *sbx_session_id(const sbx_session *s) { return s->id; }
const char *sbx_session_tier(const sbx_session *s) { return s->tier; }
const char *sbx_session_software_identity(const sbx_session *s) { return s->software_identity; }
int64_t sbx_session_expires_ms(const sbx_session *s) { return s->expires_ms; }
uint32_t sbx_session_idle_ms(const sbx_session *s) { return s->idle_ms; }
sbx_psession *sbx_session_provider(const sbx_session *s) { return s->end ? NULL : s->ps; }
uint64_t sbx_session_calls(const sbx_session *s) { return s->calls; }
const char *sbx_session_last_sha(const sbx_session *s) { return s->last_sha; }

plm_session_end sbx_session_end_reason(const sbx_session *s, const char **detail)
{
    if (detail)
        *detail = s->end_detail ? s->end_detail : "";
    return s->end;
}

plm_session_end sbx_session_found_end(const sbx_session *s, const char **detail)
{
    if (s->end != PLM_END_OPEN || !s->ps || !s->reg->ops->session_found_end)
        return PLM_END_OPEN;
    return s->reg->ops->session_found_end(s->ps, detail);
}

void sbx_session_chain_push(sbx_session *s, const char *record_sha256)
{
    s->calls++;
    snprintf(s->last_sha, sizeof s->last_sha, "%s", record_sha256);
}

/* ---------------------------------------------------------------- ending */

static void on_provider_closed(void *ud)
{
    sbx_session *s = ud;
    s->ps = NULL;
    sbx_session *waiter = s->gone_waiter;
    s->gone_waiter = NULL;
    if (waiter && --waiter->victims_pending == 0)
        start_provider_open(waiter);
    provider_op_end(s);
}

void sbx_session_end(sbx_session *s, plm_session_end why, const char *detail)
{
    sbx_registry *r = s->reg;
    if (s->end != PLM_END_OPEN || s->state != S_LIVE)
        return; /* the first reason wins */
    s->end = why;
    unhold(s);
    s->end_detail = sbx_xstrdup(detail ? detail : "");
    ev_timer_stop(r->loop, &s->lifetime);
    ev_timer_stop(r->loop, &s->idle);
    s->idle_at = 0;
    sbx_log("session %.12s ended: %s (%s)", s->fp, plm_session_end_name(why), s->end_detail);
    if (s->ps) {
        provider_op_begin(s);
        r->ops->session_close(s->ps, why, on_provider_closed, s);
    }
    if (why != PLM_END_CLOSED) { /* the owner's CloseSession still collects the count */
        ev_timer_set(&s->tombstone, TOMBSTONE_S, 0.);
        ev_timer_start(r->loop, &s->tombstone);
    }
    if (r->on_end)
        r->on_end(r->on_end_ud);
}

void sbx_session_forget(sbx_session *s)
{
    if (s->state != S_LIVE)
        return;
    ev_timer_stop(s->reg->loop, &s->tombstone);
    s->state = S_FORGOTTEN;
    unhold(s);                   /* (ended before, as a rule) */
    list_del(&s->reg->sessions, s);
    plm_idmap_remove(&s->reg->live, &s->by_fp);
    sbx_session_unref(s); /* the registry's reference */
}

/* The provider ended the session between calls (sandbox gone, boundary failed). */
static void on_provider_ended(void *ud, plm_session_end why, const char *detail)
{
    sbx_session_end(ud, why, detail);
}

/* ---------------------------------------------------------------- timers */

static void arm_idle(sbx_session *s, ev_tstamp after)
{
    struct ev_loop *loop = s->reg->loop;
    ev_timer_stop(loop, &s->idle);
    if (after < 0)
        after = 0;
    s->idle_at = ev_now(loop) + after;
    ev_timer_set(&s->idle, after, 0.);
    ev_timer_start(loop, &s->idle);
}

static void on_tombstone(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    sbx_session *s = w->data;
    sbx_log("session %.12s forgotten: its tombstone expired", s->fp);
    sbx_session_forget(s);
}

static void on_suspended(void *ud)
{
    sbx_session *s = ud;
    sbx_session_release_turn(s, false);
    provider_op_end(s);
}

static void on_idle(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    sbx_session *s = w->data;
    s->idle_at = 0;
    if (!s->claimed) { /* its open answer was probably lost */
        sbx_session_end(s, PLM_END_UNCLAIMED,
                        "no request named the session before its first idle timeout");
        return;
    }
    /* Never suspends, or a call holds the turn (its end re-arms the timer). */
    if (s->idle_ms == 0 || s->busy || !s->ps || !s->reg->ops->session_suspend)
        return;
    s->busy = true; /* the suspend holds the turn, so no call runs meanwhile */
    provider_op_begin(s);
    s->reg->ops->session_suspend(s->ps, on_suspended, s);
}

static void on_lifetime(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    sbx_session_end(w->data, PLM_END_EXPIRED, "the session reached the end of its lifetime");
}

/* ---------------------------------------------------------------- the turn */

static void on_grant(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    sbx_session *s = w->data;
    sbx_turn_cb cb = s->waiter_cb;
    s->has_waiter = false;
    s->waiter_cb = NULL;
    cb(s->waiter_ud, s); /* `busy` stays set: the turn passes straight to the waiter */
}

sbx_turn sbx_session_take_turn(sbx_session *s, sbx_turn_cb cb, void *ud)
{
    if (!s->busy) {
        s->busy = true;
        return SBX_TURN_NOW;
    }
    if (s->has_waiter)
        return SBX_TURN_BUSY;
    s->has_waiter = true;
    s->waiter_cb = cb;
    s->waiter_ud = ud;
    return SBX_TURN_QUEUED;
}

void sbx_session_begin_call(sbx_session *s)
{
    ev_timer_stop(s->reg->loop, &s->idle);
}

void sbx_session_release_turn(sbx_session *s, bool executed)
{
    sbx_registry *r = s->reg;
    if (s->end == PLM_END_OPEN && s->state == S_LIVE) {
        if (executed) {
            s->used = ++r->clock;
            if (s->idle_ms)
                arm_idle(s, s->idle_ms / 1000.0);
        } else if (s->idle_at > 0 && !ev_is_active(&s->idle)) {
            arm_idle(s, s->idle_at - ev_now(r->loop)); /* back to the old deadline */
        }
    }
    if (s->has_waiter) { /* granted from the loop, never inside the releaser's stack */
        ev_timer_set(&s->grant, 0., 0.);
        ev_timer_start(r->loop, &s->grant);
    } else {
        s->busy = false;
    }
}

/* ---------------------------------------------------------------- lookup */

sbx_session *sbx_registry_find(sbx_registry *r, const char *id, const char *principal)
{
    if (!id || strlen(id) != 32 || strlen(principal) != 64)
        return NULL;
    /* Looked up by the id's SHA-256, never the id: how long the table's string
     * compares take says nothing of the capability.  Then constant-time on it, both
     * compared in full. */
    plm_hex fp;
    plm_sha256_hex(id, 32, fp);
    plm_idmap_node *n = plm_idmap_get(&r->live, fp);
    if (!n)
        return NULL;
    sbx_session *s = PLM_IDMAP_OWNER(n, sbx_session, by_fp);
    if (CRYPTO_memcmp(s->id, id, 32) | CRYPTO_memcmp(s->principal, principal, 64))
        return NULL;
    s->claimed = true;
    sbx_session_ref(s);
    return s;
}

/* ---------------------------------------------------------------- open */

static bool same_owner(const sbx_session *s, const char *principal, const char *owner)
{
    return owner && s->owner && strcmp(s->principal, principal) == 0 &&
           strcmp(s->owner, owner) == 0;
}

static int by_used(const void *a, const void *b)
{
    const sbx_session *x = *(sbx_session *const *)a, *y = *(sbx_session *const *)b;
    return x->used < y->used ? -1 : x->used > y->used;
}

/* The per-owner cap: the owner's least recently used idle sessions to replace.
 * Returns how many are needed (the victims in *out, malloc'd, oldest first) or -1
 * when fewer are idle.  It walks every session, but only with an owner cap set
 * (--max-sessions-per-owner) and an open that names its owner. */
static int pick_victims(sbx_registry *r, const sbx_open_req *req, sbx_session ***out)
{
    *out = NULL;
    uint32_t cap = r->cfg->max_per_owner;
    if (!req->owner || cap == 0)
        return 0;
    size_t held = 0, idle = 0;
    for (sbx_session *s = r->sessions; s; s = s->next)
        if (s->end == PLM_END_OPEN && same_owner(s, req->principal, req->owner))
            held++;
    for (sbx_session *s = r->opening; s; s = s->next)
        if (same_owner(s, req->principal, req->owner))
            held++;
    if (held + 1 <= cap)
        return 0;
    size_t need = held + 1 - cap;
    sbx_session **cands = sbx_xcalloc(held, sizeof *cands);
    /* Idle = its turn can be had without waiting: no call, close or suspend. */
    for (sbx_session *s = r->sessions; s; s = s->next)
        if (s->end == PLM_END_OPEN && same_owner(s, req->principal, req->owner) && !s->busy &&
            !s->has_waiter)
            cands[idle++] = s;
    if (idle < need) {
        free(cands);
        return -1;
    }
    qsort(cands, idle, sizeof *cands, by_used);
    *out = cands;
    return (int)need;
}

/* Opening sessions and registered ones not ended, of one principal or of all. */
static size_t count_held(const sbx_registry *r, const char *principal)
{
    if (!principal)
        return r->held;
    plm_idmap_node *n = plm_idmap_get(&r->callers, principal);
    return n ? PLM_IDMAP_OWNER(n, caller_count, node)->held : 0;
}

static uint32_t effective_lifetime(uint32_t configured, uint32_t requested)
{
    return requested && requested < configured ? requested : configured;
}

/* min(configured, requested) with 0 meaning "never"; at least 1 s when not never. */
static uint32_t effective_idle(uint32_t configured, uint32_t requested)
{
    uint32_t v = configured;
    if (requested && (configured == 0 || requested < configured))
        v = requested;
    return v && v < MIN_IDLE_MS ? MIN_IDLE_MS : v;
}

static void on_provider_opened(void *ud, sbx_err *err, sbx_psession *ps, const char *tier,
                               const char *software_identity)
{
    sbx_session *s = ud;
    sbx_registry *r = s->reg;
    s->ps = ps;
    list_del(&r->opening, s);
    if (!err && r->shutting_down)
        err = sbx_err_new(PLM_UNAVAILABLE, PLM_REFUSAL_CAPACITY,
                          "the daemon is shutting down; no session was opened");
    if (!err && !sbx_random_hex(16, s->id))
        err = sbx_err_new(PLM_INTERNAL, PLM_REFUSAL_CAPACITY,
                          "no random bytes for a session id; no session was opened");
    if (err) {
        if (ps) { /* close what was made: nobody will ever name it */
            provider_op_begin(s);
            r->ops->session_close(ps, PLM_END_SHUTDOWN, on_provider_closed, s);
        }
        s->state = S_FORGOTTEN;
        unhold(s);
        sbx_opened_cb cb = s->opened_cb;
        void *cb_ud = s->opened_ud;
        sbx_session_unref(s);
        cb(cb_ud, err, NULL);
        if (r->on_end) /* one opening fewer: "every session has ended" may now hold */
            r->on_end(r->on_end_ud);
        provider_op_end(s);
        return;
    }
    plm_sha256_hex(s->id, 32, s->fp);
    s->tier = sbx_xstrdup(tier);
    s->software_identity = sbx_xstrdup(software_identity ? software_identity : "");
    list_add(&r->sessions, s);
    s->by_fp.key = s->fp;
    if (!plm_idmap_put(&r->live, &s->by_fp))
        sbx_out_of_memory();
    s->state = S_LIVE;
    s->used = ++r->clock;
    s->expires_ms = sbx_now_ms() + s->lifetime_ms;
    ev_timer_set(&s->lifetime, s->lifetime_ms / 1000.0, 0.);
    ev_timer_start(r->loop, &s->lifetime);
    arm_idle(s, s->idle_ms ? s->idle_ms / 1000.0 : UNCLAIMED_DEFAULT_S);
    sbx_log("session %.12s opened for caller %.12s%s (lifetime %u ms, idle %u ms)", s->fp,
            s->principal, s->owner ? " and an owner" : "", s->lifetime_ms, s->idle_ms);
    s->opened_cb(s->opened_ud, NULL, s);
    provider_op_end(s);
}

static void start_provider_open(sbx_session *s)
{
    sbx_registry *r = s->reg;
    sbx_open_params params = {
        .lifetime_ms = s->lifetime_ms,
        .idle_ms = s->idle_ms,
        .languages = s->languages,
        .on_ended = on_provider_ended,
        .on_ended_ud = s,
    };
    provider_op_begin(s);
    r->ops->session_open(r->provider, &params, on_provider_opened, s);
}

sbx_err *sbx_registry_open(sbx_registry *r, const sbx_open_req *req, sbx_opened_cb cb, void *ud)
{
    const sbx_config *cfg = r->cfg;
    if (r->shutting_down)
        return sbx_err_new(PLM_UNAVAILABLE, PLM_REFUSAL_CAPACITY,
                           "the daemon is shutting down; no session was opened");
    sbx_session **victims;
    int need = pick_victims(r, req, &victims);
    if (need < 0)
        return sbx_err_new(PLM_RESOURCE_EXHAUSTED, PLM_REFUSAL_CAPACITY,
                           "this owner holds its cap of %u sessions and none is idle to replace; "
                           "nothing ran", cfg->max_per_owner);
    /* Replaced sessions stop counting, so these caps cannot refuse a replacing open. */
    if (count_held(r, NULL) - (size_t)need + 1 > cfg->max_sessions) {
        free(victims);
        return sbx_err_new(PLM_RESOURCE_EXHAUSTED, PLM_REFUSAL_CAPACITY,
                           "the daemon holds its cap of %u sessions; nothing ran",
                           cfg->max_sessions);
    }
    if (cfg->max_per_caller &&
        count_held(r, req->principal) - (size_t)need + 1 > cfg->max_per_caller) {
        free(victims);
        return sbx_err_new(PLM_RESOURCE_EXHAUSTED, PLM_REFUSAL_CAPACITY,
                           "this caller holds its cap of %u sessions; nothing ran",
                           cfg->max_per_caller);
    }
    sbx_session *s = session_new(r, req);
    s->lifetime_ms = effective_lifetime(cfg->lifetime_ms, req->lifetime_ms);
    s->idle_ms = effective_idle(cfg->idle_ms, req->idle_ms);
    s->opened_cb = cb;
    s->opened_ud = ud;
    list_add(&r->opening, s);
    hold(s);
    /* Counted before any victim's close can finish, so the open starts exactly once. */
    s->victims_pending = need + 1;
    for (int i = 0; i < need; i++) {
        sbx_session *v = victims[i];
        sbx_log("session %.12s replaced to make room for a newer session of its owner", v->fp);
        if (v->ps) {
            v->gone_waiter = s;
            sbx_session_end(v, PLM_END_REPLACED,
                            "closed to make room for a newer session of the same owner");
        } else {
            sbx_session_end(v, PLM_END_REPLACED,
                            "closed to make room for a newer session of the same owner");
            s->victims_pending--;
        }
    }
    free(victims);
    if (--s->victims_pending == 0)
        start_provider_open(s);
    return NULL;
}

/* ---------------------------------------------------------------- the registry */

sbx_registry *sbx_registry_new(struct ev_loop *loop, const sbx_config *cfg,
                               const sbx_provider_ops *ops, sbx_provider *provider)
{
    sbx_registry *r = sbx_xcalloc(1, sizeof *r);
    r->loop = loop;
    r->cfg = cfg;
    r->ops = ops;
    r->provider = provider;
    plm_idmap_init(&r->live);
    plm_idmap_init(&r->callers);
    ev_timer_init(&r->quiet_now, on_quiet_now, 0., 0.);
    r->quiet_now.data = r;
    return r;
}

void sbx_registry_end_all(sbx_registry *r, plm_session_end why, const char *detail)
{
    for (sbx_session *s = r->sessions, *next; s; s = next) {
        next = s->next;
        sbx_session_end(s, why, detail);
    }
}

bool sbx_registry_all_ended(const sbx_registry *r)
{
    return count_held(r, NULL) == 0;
}

void sbx_registry_on_end(sbx_registry *r, void (*cb)(void *ud), void *ud)
{
    r->on_end = cb;
    r->on_end_ud = ud;
}

static void on_quiet_now(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    sbx_registry *r = w->data;
    if (r->quiet_cb && r->provider_ops == 0) {
        void (*cb)(void *) = r->quiet_cb;
        r->quiet_cb = NULL;
        cb(r->quiet_ud);
    }
}

void sbx_registry_shutdown(sbx_registry *r, void (*cb)(void *ud), void *ud)
{
    r->shutting_down = true;
    r->quiet_cb = cb;
    r->quiet_ud = ud;
    sbx_registry_end_all(r, PLM_END_SHUTDOWN, "the daemon is shutting down");
    if (r->provider_ops == 0) /* already quiet: report from the loop all the same */
        ev_timer_start(r->loop, &r->quiet_now);
}

void sbx_registry_free(sbx_registry *r)
{
    if (!r)
        return;
    ev_timer_stop(r->loop, &r->quiet_now);
    /* After the loop stopped: whatever is left goes, references or not. */
    while (r->sessions) {
        sbx_session *s = r->sessions;
        list_del(&r->sessions, s);
        session_free(s);
    }
    while (r->opening) {
        sbx_session *s = r->opening;
        list_del(&r->opening, s);
        session_free(s);
    }
    plm_idmap_free(&r->live); /* its entries were the sessions */
    plm_idmap_each(&r->callers, caller_free, &r->callers);
    plm_idmap_free(&r->callers);
    free(r);
}

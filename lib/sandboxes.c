/*
 * sandboxes.c — one sandbox per conversation (docs/client.md §6): keys, the shared
 * Describe, entries that each hold one session, the executeCode call with its one
 * retry, caps with least-recently-used eviction, warm, dispose, the idle close and
 * the close-error reporter.
 *
 * Life of an entry: created by a call or a warm (a call may first evict idle entries
 * over a cap), it waits for the evicted sandboxes' closes to settle, asks the shared
 * Describe whether the daemon keeps sessions, and opens one.  It leaves the map when it
 * is dropped (its session ended or stopped), disposed (by the caller, an eviction or
 * the idle close) or when its open failed; the one that removes it closes its session,
 * behind any call still queued there, and the entry "settles" once that close is done.
 * Only entries in the map count against the caps.
 *
 * Every user callback is delivered from a zero-delay timer, never from inside the
 * session or transport callbacks that caused it, so a callback may call back into this
 * layer (or free it) freely.  plm_sandboxes_free, like plm_client_free, completes what
 * is still pending before it returns; the few operations of the client that are still
 * in flight then find their call or entry "detached" and only free it.
 */
#include "internal.h"
#include "sandboxes_internal.h"
#include "idmap.h"
#include "json_text.h"

#include <ev.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_IDLE_CLOSE_MS 600000
#define DEFAULT_PER_OWNER 3
#define DEFAULT_MAX_OUTPUT 16000

#define KEY_MESSAGE "plimsoll: a sandbox key is a nonempty string, or a nonempty owner and " \
                    "conversation"
#define MAY_HAVE_RUN "The code may have run, and there is no checked answer for it"

static const char *const default_languages[] = {"python", "javascript"};

typedef struct entry entry;
typedef struct call call;
typedef struct group group;

/* An intrusive list link: the instance keeps its entries, calls, disposes and
 * persistent() queries in lists, so that plm_sandboxes_free finds every one. */
typedef struct node {
    struct node *prev, *next;
} node;

#define OWNER(ptr, type, member) ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

static void node_push(node **head, node *n)
{
    n->prev = NULL;
    n->next = *head;
    if (*head)
        (*head)->prev = n;
    *head = n;
}

static void node_drop(node **head, node *n)
{
    if (n->prev)
        n->prev->next = n->next;
    else if (*head == n)
        *head = n->next;
    if (n->next)
        n->next->prev = n->prev;
    n->prev = n->next = NULL;
}

/* Something waiting for the shared Describe.  `fn` owns `err`; `info` is borrowed for
 * the duration of the call. */
typedef struct dwait {
    void (*fn)(struct dwait *w, plm_error *err, const plm_info *info);
    struct dwait *prev, *next;
} dwait;

/* Waits for an entry to settle: an open that needs the evicted sandbox's slot back, or
 * a dispose that reports completion. */
typedef struct hook {
    entry *opener;
    group *group;
    struct hook *next;
} hook;

typedef enum entry_state {
    E_WAITING,      /* for the closes of the sandboxes evicted to make room */
    E_DESCRIBING,   /* for the Describe that says whether the daemon keeps sessions */
    E_OPENING,      /* OpenSession in flight */
    E_OPEN,
    E_FAILED,       /* the open failed, or was no longer wanted */
} entry_state;

struct entry {
    plm_sandboxes *sb;
    int refs;                   /* the entry's own life until it settles, plus each call */
    char *id;                   /* the key's encoding: the map's key */
    char *owner, *conversation;
    plm_key key;                /* the key as passed, for the close-error reporter */
    bool current;               /* in the map (the caps count it) */
    plm_idmap_node mapped;      /* in the map, under `id`, while current */
    bool detached;              /* its instance was freed while the open was in flight */
    node link;                  /* in the instance's list of every entry not yet freed */
    uint64_t used;              /* the logical clock when a call last started or ended */
    int in_flight;
    bool answered;              /* a call was answered here: later ones are not the first */
    entry_state state;
    int closes_pending;
    dwait dw;
    plm_session *session;
    call *waiters, *waiters_tail; /* calls waiting for the open */
    ev_timer idle;              /* unref'd: never keeps the loop alive */
    ev_timer later;             /* reports a close refused at once, off the caller's stack */
    plm_error *close_err;
    bool closing;
    bool settled;               /* closed, or never opened: the hooks ran */
    hook *hooks;
};

/* A monotonic clock in milliseconds: where a call's time went (plm_code_output). */
static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

typedef enum call_stage { C_DESCRIBE, C_OPEN, C_CELL, C_FRESH, C_DONE } call_stage;

struct call {
    plm_sandboxes *sb;
    node link;                  /* in the instance's calls */
    bool detached;              /* completed by plm_sandboxes_free; the client still has it */
    char *id, *owner, *conversation; /* id NULL: no key, a fresh run */
    const char *language;       /* one of the instance's languages */
    char *code;
    plm_file *files;
    size_t n_files;
    int64_t timeout_ms;         /* the call's own, else the instance's */
    plm_cancel *cancel;
    plm_code_cb cb;
    void *ud;
    call_stage stage;
    bool retried;
    dwait dw;
    plm_listener cancel_l;
    ev_timer wake;              /* handles a cancellation on the loop */
    entry *e;                   /* the entry this attempt holds */
    plm_session *s;             /* the session its cell went to */
    call *next_waiter, *prev_waiter;
    bool projects;              /* from the Describe */
    char *daemon;
    ev_timer deliver;
    plm_error *err;
    plm_code_output *out;
    double started_ms, sent_ms; /* now_ms(): plm_sandboxes_run, the cell sent */
};

/* One dispose or dispose_all: `done` runs once every entry in it settled. */
struct group {
    plm_sandboxes *sb;
    node link;
    size_t left;
    plm_done_cb done;
    void *ud;
    ev_timer deliver;
};

typedef struct persist_op {
    plm_sandboxes *sb;
    node link;
    dwait dw;
    plm_bool_cb cb;
    void *ud;
    ev_timer deliver;
    plm_error *err;
    bool value;
    bool ready;                 /* err and value are set: only the delivery is left */
} persist_op;

struct plm_sandboxes {
    plm_client *client;
    struct ev_loop *loop;
    plm_sessions_mode mode;
    char **languages;
    size_t n_languages;
    char *floor;
    int64_t timeout_ms, lifetime_ms, idle_timeout_ms, idle_close_ms;
    int per_owner, max_sessions;
    size_t max_output;
    plm_close_error_cb on_close_error;
    void *on_close_error_ud;

    plm_info *info;             /* the cached Describe */
    const plm_info *pinned;     /* being handed to waiters: dropping it must not free it */
    bool describing;
    plm_error *describe_err;    /* a Describe refused before it started */
    dwait *dwaits, *dwaits_tail;
    ev_timer kick;              /* hands the cache (or that refusal) to waiters */

    struct describe_op *describe; /* the Describe in flight */
    node *entries;              /* every entry; the map is those `current` (the caps scan it) */
    size_t n_entries;           /* current ones */
    plm_idmap map;              /* the current ones by id */
    uint64_t clock;
    node *calls, *groups, *persists;
    bool freeing;
};

typedef struct describe_op {
    plm_sandboxes *sb;          /* NULL once the instance was freed */
} describe_op;

#define FOR_ENTRIES(sb, e)                                                        \
    for (node *n_ = (sb)->entries, *next_; n_ && (next_ = n_->next, 1); n_ = next_) \
        for (entry *e = OWNER(n_, entry, link); e; e = NULL)

static void need_info(plm_sandboxes *sb, dwait *w);
static void kick_cb(struct ev_loop *loop, ev_timer *t, int revents);
static void entry_begin_open(entry *e);
static void retire(entry *e);
static void attempt(call *c);

/* ---------------------------------------------------------------- small helpers */

static void start_soon(plm_sandboxes *sb, ev_timer *t)
{
    ev_timer_set(t, 0., 0.);
    ev_timer_start(sb->loop, t);
}

static plm_error *oom(void)
{
    return plm_err_new(PLM_INTERNAL, PLM_REFUSAL_REQUEST, "plimsoll: out of memory");
}

static plm_error *canceled_before_sent(void)
{
    return plm_err_new(PLM_CANCELED, PLM_REFUSAL_REQUEST,
                       "plimsoll: the call was canceled before it was sent");
}

static plm_error *freed_error(const char *what)
{
    return plm_err_new(PLM_CANCELED, PLM_REFUSAL_REQUEST,
                       "plimsoll: the sandboxes were freed before %s", what);
}

/* docs/client.md §6.6, before dispatch: whatever fails before the code can be sent ran nothing,
 * so an unmarked failure there is marked environment, keeping everything else. */
static plm_error *before_dispatch(plm_error *e)
{
    if (e && e->not_dispatched == PLM_REFUSAL_NONE)
        e->not_dispatched = PLM_REFUSAL_ENVIRONMENT;
    return e;
}

/* The lead that says whether the code ran, added once. */
static void says_whether_it_ran(plm_error *e)
{
    char lead[64];
    if (e->not_dispatched != PLM_REFUSAL_NONE) {
        const char *why = plm_refusal_name(e->not_dispatched);
        snprintf(lead, sizeof lead, "Nothing ran (%s)", why ? why : "unknown");
    } else {
        snprintf(lead, sizeof lead, "%s", MAY_HAVE_RUN);
    }
    size_t n = strlen(lead);
    const char *m = e->message ? e->message : "";
    if (strncmp(m, lead, n) != 0 || strncmp(m + n, ": ", 2) != 0)
        plm_err_prefix(e, lead);
}

/* Refusals that can mean the daemon changed since the cached Describe. */
static bool daemon_may_have_changed(plm_refusal r)
{
    return r == PLM_REFUSAL_UNSUPPORTED || r == PLM_REFUSAL_ENVIRONMENT ||
           r == PLM_REFUSAL_PROTOCOL || r == PLM_REFUSAL_ISOLATION;
}

static void drop_describe(plm_sandboxes *sb)
{
    if (sb->info != sb->pinned)
        plm_info_free(sb->info);
    sb->info = NULL;
}

/* ---------------------------------------------------------------- keys */

/* NULL, or why `key` is no key: a conversation that is missing or empty, an empty
 * owner, or either not well-formed UTF-8 (the one checker's verdict, jansson's too). */
static plm_error *key_refusal(const plm_key *key)
{
    if (!key || !key->conversation || !*key->conversation || (key->owner && !*key->owner))
        return plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST, KEY_MESSAGE);
    if ((key->owner && !plm_utf8_valid(key->owner, strlen(key->owner))) ||
        !plm_utf8_valid(key->conversation, strlen(key->conversation)))
        return plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST,
                           "plimsoll: a sandbox key's owner and conversation must be "
                           "well-formed UTF-8 text");
    return NULL;
}

/* The key's injective encoding, a JSON array: ["run-1"] or ["alice","a"].  Written as
 * json_dumps writes it (json_text.h), which escapes as JSON.stringify does except
 * that a control character's \u00XX is in upper case.  NULL (and *err) for an invalid
 * key. */
static char *key_encode(const plm_key *key, plm_error **err)
{
    *err = key_refusal(key);
    if (*err)
        return NULL;
    plm_json_out o = {0};
    plm_json_put_raw(&o, "[", 1);
    if (key->owner) {
        plm_json_put_string(&o, key->owner, strlen(key->owner));
        plm_json_put_raw(&o, ",", 1);
    }
    plm_json_put_string(&o, key->conversation, strlen(key->conversation));
    plm_json_put_raw(&o, "]", 1);
    plm_json_put_raw(&o, "", 1); /* the NUL */
    if (o.failed) {
        free(o.p);
        *err = plm_err_new(PLM_INTERNAL, PLM_REFUSAL_REQUEST, "plimsoll: out of memory");
        return NULL;
    }
    return o.p;
}

/* Called for every warm of every turn: checked, not encoded. */
plm_error *plm_key_check(const plm_key *key)
{
    return key_refusal(key);
}

void plm_key_digest(const plm_key *key, char out[13])
{
    plm_error *err;
    char *id = key_encode(key, &err);
    plm_hex hex;
    plm_sha256_hex(id ? id : "", id ? strlen(id) : 0, hex);
    memcpy(out, hex, 12);
    out[12] = '\0';
    free(id);
    plm_error_free(err);
}

/* ---------------------------------------------------------------- options */

void plm_sandboxes_options_init(plm_sandboxes_options *o)
{
    memset(o, 0, sizeof *o);
    o->sessions = PLM_SESSIONS_AUTO;
    o->idle_close_ms = DEFAULT_IDLE_CLOSE_MS;
    o->max_sessions_per_owner = DEFAULT_PER_OWNER;
    o->max_output_chars = DEFAULT_MAX_OUTPUT;
}

static plm_error *bad_option(const char *fmt, const char *a)
{
    return plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_NONE, fmt, a ? a : "(null)");
}

/* A caller's string, fit for a message. */
static const char *shown(const char *s)
{
    if (!s)
        return "(null)";
    return plm_utf8_valid(s, strlen(s)) ? s : "(ill-formed text)";
}

static plm_error *check_options(const plm_sandboxes_options *o)
{
    if (!o || !o->client)
        return bad_option("plimsoll: the sandboxes need a client%s", "");
    if (o->sessions != PLM_SESSIONS_AUTO && o->sessions != PLM_SESSIONS_ALWAYS &&
        o->sessions != PLM_SESSIONS_NEVER)
        return bad_option("plimsoll: sessions must be auto, always or never%s", "");
    if (o->n_languages && !o->languages)
        return bad_option("plimsoll: n_languages is set but languages is NULL%s", "");
    for (size_t i = 0; i < o->n_languages; i++) {
        const char *l = o->languages[i];
        if (!plm_runner_for(l))
            return bad_option("plimsoll: the tool offers python or javascript, not %s",
                              shown(l));
        for (size_t j = 0; j < i; j++) {
            if (strcmp(o->languages[j], l) == 0)
                return bad_option("plimsoll: the language %s is offered twice", l);
        }
    }
    const char *floor = o->minimum_isolation;
    if (floor && *floor && !plm_valid_floor(floor))
        return bad_option("plimsoll: minimum_isolation must be process, container, kernel or "
                          "vm, not %s", shown(floor));
    return NULL;
}

plm_error *plm_sandboxes_new(const plm_sandboxes_options *o, plm_sandboxes **out)
{
    if (out)
        *out = NULL;
    plm_error *e = out ? check_options(o) : bad_option("plimsoll: out is NULL%s", "");
    if (e)
        return e;
    plm_sandboxes *sb = calloc(1, sizeof *sb);
    if (!sb)
        return oom();
    sb->client = o->client;
    sb->loop = plm_client_loop(o->client);
    sb->mode = o->sessions;
    plm_idmap_init(&sb->map);
    const char *const *langs = o->n_languages ? o->languages : default_languages;
    size_t n = o->n_languages ? o->n_languages : PLM_ARRAY_LEN(default_languages);
    bool ok = (sb->languages = calloc(n, sizeof *sb->languages)) != NULL;
    sb->n_languages = n;
    for (size_t i = 0; ok && i < n; i++)
        ok = (sb->languages[i] = strdup(langs[i])) != NULL;
    /* kernel unless asked: the weakest tier fit for hostile code */
    sb->floor = strdup(o->minimum_isolation && *o->minimum_isolation ? o->minimum_isolation
                                                                      : "kernel");
    sb->timeout_ms = o->timeout_ms;
    sb->lifetime_ms = o->session_lifetime_ms;
    sb->idle_timeout_ms = o->session_idle_timeout_ms;
    sb->idle_close_ms = o->idle_close_ms;
    sb->per_owner = o->max_sessions_per_owner;
    sb->max_sessions = o->max_sessions;
    sb->max_output = o->max_output_chars ? o->max_output_chars : DEFAULT_MAX_OUTPUT;
    sb->on_close_error = o->on_close_error;
    sb->on_close_error_ud = o->on_close_error_ud;
    ev_timer_init(&sb->kick, kick_cb, 0., 0.);
    sb->kick.data = sb;
    if (!ok || !sb->floor) {
        plm_sandboxes_free(sb);
        return oom();
    }
    *out = sb;
    return NULL;
}

void plm_sandboxes_languages(const plm_sandboxes *sb, const char *const **langs, size_t *n)
{
    *langs = (const char *const *)sb->languages;
    *n = sb->n_languages;
}

plm_sessions_mode plm_sandboxes_mode(const plm_sandboxes *sb)
{
    return sb->mode;
}

size_t plm_sandboxes_count(const plm_sandboxes *sb)
{
    return sb ? sb->n_entries : 0;
}

/* ---------------------------------------------------------------- the shared Describe */

static void deliver_info(plm_sandboxes *sb, plm_error *err)
{
    dwait *w = sb->dwaits;
    sb->dwaits = sb->dwaits_tail = NULL; /* waiters added meanwhile wait for the next round */
    const plm_info *info = err ? NULL : sb->info;
    sb->pinned = info;
    while (w) {
        dwait *next = w->next;
        w->prev = w->next = NULL;
        plm_error *e = err ? (next ? plm_err_copy(err) : err) : NULL;
        if (err && !e)
            e = oom();
        w->fn(w, before_dispatch(e), info);
        if (!next)
            err = NULL; /* handed to the last waiter */
        w = next;
    }
    plm_error_free(err); /* nobody was waiting */
    sb->pinned = NULL;
    if (info && info != sb->info)
        plm_info_free((plm_info *)info); /* dropped while it was handed out */
}

static void on_describe(void *ud, plm_error *err, plm_info *info)
{
    describe_op *op = ud;
    plm_sandboxes *sb = op->sb;
    free(op);
    if (!sb) { /* the instance was freed meanwhile */
        plm_error_free(err);
        plm_info_free(info);
        return;
    }
    sb->describe = NULL;
    sb->describing = false;
    if (!err && !info)
        err = plm_err_new(PLM_INTERNAL, PLM_REFUSAL_NONE, "plimsoll: Describe answered nothing");
    if (!err) {
        drop_describe(sb);
        sb->info = info; /* a failure is not cached: the next call describes again */
    }
    deliver_info(sb, err);
}

static void start_describe(plm_sandboxes *sb)
{
    describe_op *op = calloc(1, sizeof *op);
    plm_error *err = op ? NULL : oom();
    if (op) {
        op->sb = sb;
        sb->describe = op;
        sb->describing = true;
        err = plm_describe(sb->client, NULL, on_describe, op);
    }
    if (err) {
        free(op);
        sb->describe = NULL;
        sb->describing = false;
        plm_error_free(sb->describe_err);
        sb->describe_err = err;
        start_soon(sb, &sb->kick);
    }
}

static void kick_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
    plm_sandboxes *sb = t->data;
    plm_error *err = sb->describe_err;
    sb->describe_err = NULL;
    if (err || sb->info)
        deliver_info(sb, err);
    else if (!sb->describing && sb->dwaits)
        start_describe(sb);
}

/* The Describe is shared: one in flight for every waiter, cached once it answered. */
static void need_info(plm_sandboxes *sb, dwait *w)
{
    w->next = NULL;
    w->prev = sb->dwaits_tail;
    if (sb->dwaits_tail)
        sb->dwaits_tail->next = w;
    else
        sb->dwaits = w;
    sb->dwaits_tail = w;
    if (sb->info) {
        start_soon(sb, &sb->kick);
    } else if (!sb->describing && !ev_is_active(&sb->kick)) {
        start_describe(sb);
    }
}

static void stop_waiting_info(plm_sandboxes *sb, dwait *w)
{
    if (w->prev)
        w->prev->next = w->next;
    else if (sb->dwaits == w)
        sb->dwaits = w->next;
    else
        return; /* not waiting */
    if (w->next)
        w->next->prev = w->prev;
    else
        sb->dwaits_tail = w->prev;
    w->prev = w->next = NULL;
}

/* ---------------------------------------------------------------- persistent() */

static void persist_deliver(struct ev_loop *loop, ev_timer *t, int revents)
{
    persist_op *op = t->data;
    ev_timer_stop(op->sb->loop, &op->deliver);
    node_drop(&op->sb->persists, &op->link);
    op->cb(op->ud, op->err, op->value);
    free(op);
}

static plm_error *no_sessions(const plm_info *info, bool name_daemon)
{
    if (name_daemon)
        return plm_err_new(PLM_UNIMPLEMENTED, PLM_REFUSAL_UNSUPPORTED,
                           "plimsoll: the daemon (%s) does not keep sessions",
                           info && info->sandbox ? info->sandbox : "?");
    return plm_err_new(PLM_UNIMPLEMENTED, PLM_REFUSAL_UNSUPPORTED,
                       "plimsoll: the daemon does not keep sessions");
}

static void persist_answer(persist_op *op, plm_error *err, const plm_info *info)
{
    if (!err && !info->supports_sessions && op->sb->mode == PLM_SESSIONS_ALWAYS)
        err = no_sessions(info, true);
    op->err = err;
    op->value = !err && info->supports_sessions;
    op->ready = true;
}

static void persist_on_info(dwait *w, plm_error *err, const plm_info *info)
{
    persist_op *op = OWNER(w, persist_op, dw);
    persist_answer(op, err, info);
    start_soon(op->sb, &op->deliver);
}

plm_error *plm_sandboxes_persistent(plm_sandboxes *sb, plm_bool_cb cb, void *ud)
{
    if (!sb || !cb)
        return plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST,
                           "plimsoll: persistent needs the sandboxes and a callback");
    if (sb->freeing)
        return freed_error("persistent was asked");
    persist_op *op = calloc(1, sizeof *op);
    if (!op)
        return oom();
    op->sb = sb;
    op->cb = cb;
    op->ud = ud;
    op->dw.fn = persist_on_info;
    ev_timer_init(&op->deliver, persist_deliver, 0., 0.);
    op->deliver.data = op;
    node_push(&sb->persists, &op->link);
    if (sb->mode == PLM_SESSIONS_NEVER) {
        op->ready = true; /* false, without describing */
        start_soon(sb, &op->deliver);
    }
    else
        need_info(sb, &op->dw);
    return NULL;
}

/* ---------------------------------------------------------------- the map */

static entry *lookup(const plm_sandboxes *sb, const char *id)
{
    plm_idmap_node *n = plm_idmap_get(&sb->map, id);
    return n ? PLM_IDMAP_OWNER(n, entry, mapped) : NULL;
}

/* In the map, and the owner's when `owner` is set. */
static bool matches(const entry *e, const char *owner)
{
    return e->current && (!owner || (e->owner && strcmp(e->owner, owner) == 0));
}

static size_t count_matching(const plm_sandboxes *sb, const char *owner)
{
    size_t n = 0;
    FOR_ENTRIES(sb, e)
        n += matches(e, owner);
    return n;
}

/* One more fits under both caps without closing anything. */
static bool has_room(const plm_sandboxes *sb, const char *owner)
{
    if (owner && sb->per_owner > 0 && count_matching(sb, owner) >= (size_t)sb->per_owner)
        return false;
    return sb->max_sessions <= 0 || sb->n_entries < (size_t)sb->max_sessions;
}

static void hooks_free(entry *e);

static void entry_destroy(entry *e)
{
    if (!e->detached) {
        ev_timer_stop(e->sb->loop, &e->later);
        node_drop(&e->sb->entries, &e->link);
    }
    hooks_free(e);
    plm_error_free(e->close_err);
    free(e->id);
    free(e->owner);
    free(e->conversation);
    free(e);
}

static void entry_unref(entry *e)
{
    if (--e->refs == 0)
        entry_destroy(e);
}

/* ---------------------------------------------------------------- the idle close */

static void idle_disarm(entry *e)
{
    if (ev_is_active(&e->idle)) {
        ev_ref(e->sb->loop); /* balances the ev_unref that followed its start */
        ev_timer_stop(e->sb->loop, &e->idle);
    }
}

static void idle_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
    entry *e = t->data;
    ev_ref(loop); /* the expired timer stopped itself: balance its ev_unref */
    /* A call in flight keeps its sandbox; its end arms the timer again. */
    if (e->current && e->in_flight == 0)
        retire(e);
}

/* Arms (or re-arms) the idle close of the key's current entry. */
static void touch(plm_sandboxes *sb, const char *id)
{
    entry *e = lookup(sb, id);
    if (!e || sb->idle_close_ms <= 0)
        return;
    idle_disarm(e);
    ev_timer_set(&e->idle, (double)sb->idle_close_ms / 1000.0, 0.);
    ev_timer_start(sb->loop, &e->idle);
    ev_unref(sb->loop); /* a pending idle close never keeps the loop running */
}

/* ---------------------------------------------------------------- entries */

/* Out of the map: the caps no longer count it. */
static void unlink_entry(entry *e)
{
    if (!e->current)
        return;
    e->current = false;
    e->sb->n_entries--;
    plm_idmap_remove(&e->sb->map, &e->mapped);
    idle_disarm(e);
}

static void report_close_error(plm_sandboxes *sb, const plm_key *key, const plm_error *err)
{
    if (sb->on_close_error) {
        sb->on_close_error(sb->on_close_error_ud, key, err);
        return;
    }
    /* A key can hold a user's ID: a log line names it by a digest only. */
    char digest[13];
    plm_key_digest(key, digest);
    fprintf(stderr, "plimsoll: closing the sandbox for key %s failed: %s\n", digest,
            err && err->message ? err->message : "(no message)");
}

static hook *add_hook(entry *e, entry *opener, group *g)
{
    hook *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->opener = opener;
    h->group = g;
    h->next = e->hooks;
    e->hooks = h;
    return h;
}

static void group_settled(group *g);

static void hooks_free(entry *e)
{
    while (e->hooks) {
        hook *h = e->hooks;
        e->hooks = h->next;
        free(h);
    }
}

/* The entry is done with its session (closed, or never opened). */
static void settle(entry *e)
{
    e->settled = true;
    hook *h = e->hooks;
    e->hooks = NULL;
    while (h) {
        hook *next = h->next;
        if (h->opener) {
            /* How the close went never decides the open that waited for it. */
            if (--h->opener->closes_pending == 0)
                entry_begin_open(h->opener);
            entry_unref(h->opener);
        }
        if (h->group)
            group_settled(h->group);
        free(h);
        h = next;
    }
    entry_unref(e);
}

static void entry_closed(entry *e, plm_error *err)
{
    if (e->detached || e->sb->freeing) { /* plm_sandboxes_free is freeing the session */
        plm_error_free(err);
        return;
    }
    if (err)
        report_close_error(e->sb, &e->key, err);
    plm_error_free(err);
    plm_session_free(e->session); /* from inside its close callback: session.c defers it */
    e->session = NULL;
    settle(e);
}

static void on_closed(void *ud, plm_error *err, plm_close_summary *sum)
{
    plm_close_summary_free(sum);
    entry_closed(ud, err);
}

static void closed_later(struct ev_loop *loop, ev_timer *t, int revents)
{
    entry *e = t->data;
    plm_error *err = e->close_err;
    e->close_err = NULL;
    entry_closed(e, err);
}

/* Closes the session behind whatever is queued in it; errors go to the reporter. */
static void start_close(entry *e)
{
    e->closing = true;
    plm_error *err = plm_session_close(e->session, NULL, on_closed, e);
    if (err) { /* refused at once: nothing is queued, so the handle can go, on the loop */
        e->close_err = err;
        start_soon(e->sb, &e->later);
    }
}

/* Removes the entry now (the caps count it gone) and closes its session once open.
 * Only the remover closes, so a session is closed once however many calls saw it end. */
static void retire(entry *e)
{
    if (!e->current)
        return;
    unlink_entry(e);
    if (e->state == E_OPEN && !e->closing)
        start_close(e);
    /* waiting, describing or opening: the open's end decides (entry_on_open, entry_fail) */
}

/* docs/client.md §6.10 drop(key, session): only if the entry still holds exactly that one. */
static void drop(entry *e, plm_session *s)
{
    if (e->current && e->session == s)
        retire(e);
}

static void call_finish(call *c, plm_error *err, plm_code_output *out);
static void end_attempt(call *c);
static void send_cell(call *c);

static call *take_waiters(entry *e)
{
    call *w = e->waiters;
    e->waiters = e->waiters_tail = NULL;
    return w;
}

/* The open failed (err), or nobody needs it any more (err NULL): the entry leaves the
 * map without a close, so the key's next call opens again. */
static void entry_fail(entry *e, plm_error *err)
{
    e->state = E_FAILED;
    unlink_entry(e);
    for (call *c = take_waiters(e), *next; c; c = next) {
        next = c->next_waiter;
        c->next_waiter = c->prev_waiter = NULL;
        plm_error *copy = err ? plm_err_copy(err) : NULL;
        end_attempt(c);
        call_finish(c, before_dispatch(copy ? copy : oom()), NULL);
    }
    plm_error_free(err);
    settle(e);
}

static void abort_open(call *c);

static void entry_on_open(void *ud, plm_error *err, plm_session *s)
{
    entry *e = ud;
    if (e->detached) { /* the instance is gone: keep nothing (it closes nothing either) */
        plm_error_free(err);
        plm_session_free(s);
        entry_destroy(e);
        return;
    }
    if (!err && !s)
        err = plm_err_new(PLM_INTERNAL, PLM_REFUSAL_NONE, "plimsoll: OpenSession answered nothing");
    if (err) {
        entry_fail(e, err);
        return;
    }
    e->state = E_OPEN;
    e->session = s;
    /* The idle close starts now: an open slower than it is not idle. */
    if (e->current)
        touch(e->sb, e->id);
    /* The calls that waited go first, so a close asked for meanwhile runs behind them. */
    for (call *c = take_waiters(e), *next; c; c = next) {
        next = c->next_waiter;
        c->next_waiter = c->prev_waiter = NULL;
        if (plm_cancel_fired(c->cancel))
            abort_open(c);
        else
            send_cell(c);
    }
    if (!e->current && !e->closing) /* removed while it opened */
        start_close(e);
}

static void entry_on_info(dwait *w, plm_error *err, const plm_info *info)
{
    entry *e = OWNER(w, entry, dw);
    plm_sandboxes *sb = e->sb;
    if (!err && (sb->mode == PLM_SESSIONS_NEVER || !info->supports_sessions))
        err = no_sessions(info, sb->mode == PLM_SESSIONS_ALWAYS);
    if (!err && !e->current && !e->waiters) {
        entry_fail(e, NULL); /* disposed before anything was sent: nothing to open */
        return;
    }
    if (err) {
        entry_fail(e, err);
        return;
    }
    e->state = E_OPENING;
    /* The tool's languages are the hint (a warm pool starts their interpreters); the
     * owner lets a daemon hold the user to its own per-owner cap across processes. */
    plm_session_options o = {
        .minimum_isolation = sb->floor,
        .lifetime_ms = sb->lifetime_ms,
        .idle_timeout_ms = sb->idle_timeout_ms,
        .languages = (const char *const *)sb->languages,
        .n_languages = sb->n_languages,
        .owner = e->owner,
    };
    err = plm_open_session(sb->client, &o, entry_on_open, e);
    if (err)
        entry_fail(e, err);
}

static void entry_begin_open(entry *e)
{
    if (!e->current && !e->waiters) {
        entry_fail(e, NULL);
        return;
    }
    e->state = E_DESCRIBING;
    e->dw.fn = entry_on_info;
    need_info(e->sb, &e->dw);
}

static entry *entry_new(plm_sandboxes *sb, const char *id, const char *owner,
                        const char *conversation)
{
    entry *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->sb = sb;
    e->refs = 1;
    e->id = strdup(id);
    e->owner = plm_strdup(owner);
    e->conversation = strdup(conversation);
    if (!e->id || !e->conversation || (owner && !e->owner)) {
        free(e->id);
        free(e->owner);
        free(e->conversation);
        free(e);
        return NULL;
    }
    e->key.owner = e->owner;
    e->key.conversation = e->conversation;
    e->mapped.key = e->id;
    if (!plm_idmap_put(&sb->map, &e->mapped)) {
        free(e->id);
        free(e->owner);
        free(e->conversation);
        free(e);
        return NULL;
    }
    ev_timer_init(&e->idle, idle_cb, 0., 0.);
    e->idle.data = e;
    ev_timer_init(&e->later, closed_later, 0., 0.);
    e->later.data = e;
    node_push(&sb->entries, &e->link);
    e->current = true;
    sb->n_entries++;
    e->used = ++sb->clock;
    return e;
}

/* ---------------------------------------------------------------- caps */

typedef struct victims {
    entry **v;
    size_t n, cap;
} victims;

static entry *least_recent_idle(const plm_sandboxes *sb, const char *owner)
{
    entry *best = NULL;
    FOR_ENTRIES(sb, e) {
        if (e->in_flight == 0 && matches(e, owner) && (!best || e->used < best->used))
            best = e;
    }
    return best;
}

/* docs/client.md §6.9: disposes the least recently used idle entries that match until fewer
 * than `cap` remain; with every one busy, refuses before anything opens. */
static plm_error *make_room(plm_sandboxes *sb, const char *owner, int cap, const char *whose,
                            victims *out)
{
    if (cap <= 0)
        return NULL;
    size_t held = count_matching(sb, owner);
    while (held >= (size_t)cap) {
        entry *v = least_recent_idle(sb, owner);
        if (!v)
            return plm_err_new(PLM_RESOURCE_EXHAUSTED, PLM_REFUSAL_CAPACITY,
                               "plimsoll: %s has %zu sandboxes, the most this tool keeps, each "
                               "with a call in flight", whose, held);
        if (out->n == out->cap) {
            size_t ncap = out->cap ? 2 * out->cap : 4;
            entry **nv = realloc(out->v, ncap * sizeof *nv);
            if (!nv)
                return oom();
            out->v = nv;
            out->cap = ncap;
        }
        v->refs++;
        out->v[out->n++] = v;
        retire(v);
        held--;
    }
    return NULL;
}

/* A new entry for a call: room first, then the entry, whose open waits for the evicted
 * sandboxes' closes so the daemon has their slots back by then. */
static entry *entry_for_call(plm_sandboxes *sb, const call *c, plm_error **err)
{
    victims vs = {0};
    *err = c->owner ? make_room(sb, c->owner, sb->per_owner, "this user", &vs) : NULL;
    if (!*err)
        *err = make_room(sb, NULL, sb->max_sessions, "this app", &vs);
    entry *e = *err ? NULL : entry_new(sb, c->id, c->owner, c->conversation);
    if (!*err && !e)
        *err = oom();
    for (size_t i = 0; i < vs.n; i++) {
        entry *v = vs.v[i];
        if (e && !v->settled && add_hook(v, e, NULL)) {
            e->closes_pending++;
            e->refs++;
        }
        entry_unref(v);
    }
    free(vs.v);
    if (e && e->closes_pending == 0)
        entry_begin_open(e);
    return e;
}

/* ---------------------------------------------------------------- warm */

plm_error *plm_sandboxes_warm(plm_sandboxes *sb, const plm_key *key)
{
    plm_error *err;
    char *id = key_encode(key, &err);
    if (!id)
        return err;
    if (!sb || sb->freeing) {
        free(id);
        return sb ? freed_error("the warm")
                  : plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST,
                                "plimsoll: warm needs the sandboxes");
    }
    /* A warm is a guess: it never closes another sandbox, and does nothing at a cap. */
    if (sb->mode != PLM_SESSIONS_NEVER && !lookup(sb, id) &&
        has_room(sb, key->owner)) {
        entry *e = entry_new(sb, id, key->owner, key->conversation);
        if (e)
            entry_begin_open(e); /* a failure removes the entry, and is swallowed */
    }
    free(id);
    return NULL;
}

/* ---------------------------------------------------------------- dispose */

static void group_deliver(struct ev_loop *loop, ev_timer *t, int revents)
{
    group *g = t->data;
    ev_timer_stop(g->sb->loop, &g->deliver);
    node_drop(&g->sb->groups, &g->link);
    if (g->done)
        g->done(g->ud);
    free(g);
}

static void group_settled(group *g)
{
    if (--g->left == 0)
        start_soon(g->sb, &g->deliver);
}

static group *group_new(plm_sandboxes *sb, plm_done_cb done, void *ud)
{
    group *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->sb = sb;
    g->left = 1; /* held until every entry joined */
    g->done = done;
    g->ud = ud;
    ev_timer_init(&g->deliver, group_deliver, 0., 0.);
    g->deliver.data = g;
    node_push(&sb->groups, &g->link);
    return g;
}

static void dispose_into(entry *e, group *g)
{
    if (g && add_hook(e, NULL, g))
        g->left++;
    retire(e);
}

plm_error *plm_sandboxes_dispose(plm_sandboxes *sb, const plm_key *key, plm_done_cb done,
                                 void *ud)
{
    plm_error *err;
    char *id = key_encode(key, &err);
    if (!id)
        return err;
    if (!sb || sb->freeing) {
        free(id);
        return sb ? freed_error("the dispose")
                  : plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST,
                                "plimsoll: dispose needs the sandboxes");
    }
    group *g = done ? group_new(sb, done, ud) : NULL;
    if (done && !g) {
        free(id);
        return oom();
    }
    entry *e = lookup(sb, id);
    free(id);
    if (e)
        dispose_into(e, g);
    if (g)
        group_settled(g);
    return NULL;
}

void plm_sandboxes_dispose_all(plm_sandboxes *sb, plm_done_cb done, void *ud)
{
    if (!sb || sb->freeing)
        return;
    group *g = done ? group_new(sb, done, ud) : NULL;
    FOR_ENTRIES(sb, e) {
        if (e->current)
            dispose_into(e, g); /* each leaves the map at once */
    }
    if (g)
        group_settled(g);
}

/* ---------------------------------------------------------------- run: the end of a call */

static void call_free(call *c)
{
    free(c->id);
    free(c->owner);
    free(c->conversation);
    free(c->code);
    for (size_t i = 0; i < c->n_files; i++) {
        free((char *)c->files[i].path);
        free((char *)c->files[i].content);
    }
    free(c->files);
    free(c->daemon);
    free(c);
}

static void call_deliver(struct ev_loop *loop, ev_timer *t, int revents)
{
    call *c = t->data;
    ev_timer_stop(c->sb->loop, &c->deliver);
    node_drop(&c->sb->calls, &c->link);
    c->cb(c->ud, c->err, c->out);
    call_free(c);
}

static void call_finish(call *c, plm_error *err, plm_code_output *out)
{
    plm_sandboxes *sb = c->sb;
    c->stage = C_DONE;
    plm_cancel_unlisten(&c->cancel_l);
    ev_timer_stop(sb->loop, &c->wake);
    if (!err && !out)
        err = plm_err_new(PLM_INTERNAL, PLM_REFUSAL_NONE, "plimsoll: out of memory");
    if (err) {
        says_whether_it_ran(err);
        /* The daemon may have been restarted with sessions on or off, or another image,
         * tier or protocol: read its Describe again.  Capacity or request say nothing. */
        if (daemon_may_have_changed(err->not_dispatched))
            drop_describe(sb);
        plm_code_output_free(out);
        out = NULL;
    }
    c->err = err;
    c->out = out;
    start_soon(sb, &c->deliver);
}

/* docs/client.md §6.6 step 8, for every outcome of an attempt. */
static void end_attempt(call *c)
{
    entry *e = c->e;
    if (!e)
        return;
    e->in_flight--;
    e->used = ++c->sb->clock;
    touch(c->sb, c->id);
    c->e = NULL;
    c->s = NULL;
    entry_unref(e);
}

/* ---------------------------------------------------------------- run: the session path */

/* A call plm_sandboxes_free completed already: what comes back now is dropped. */
static bool dropped_as_detached(call *c, plm_error *err, plm_result *r)
{
    if (!c->detached)
        return false;
    plm_error_free(err);
    plm_result_free(r);
    call_free(c);
    return true;
}

static void cell_done(void *ud, plm_error *err, plm_result *r)
{
    call *c = ud;
    if (dropped_as_detached(c, err, r))
        return;
    plm_sandboxes *sb = c->sb;
    entry *e = c->e;
    plm_session *s = c->s;
    if (!err && !r)
        err = plm_err_new(PLM_INTERNAL, PLM_REFUSAL_NONE,
                          "plimsoll: the session answered neither a result nor an error");
    if (!err) {
        /* Read once answered: of calls made at once only the first to answer is first. */
        bool first = !e->answered;
        e->answered = true;
        bool ended = plm_session_ended(s, NULL) != PLM_END_OPEN;
        if (ended)
            drop(e, s); /* the next call opens a new sandbox */
        plm_code_output *out = plm_output_new(
            c->language, r->exit_code, r->timed_out, &r->stdout_bytes, &r->stderr_bytes,
            r->stdout_truncated || r->stderr_truncated, sb->max_output, r->isolation,
            r->record.record_sha256);
        if (out) {
            out->state_kept = !r->interpreter_ended && !ended;
            out->fresh_interpreter = r->interpreter_started;
            out->files_persist = !ended;
            out->fresh_sandbox = first;
            out->wait_ms = c->sent_ms - c->started_ms;
            out->call_ms = now_ms() - c->sent_ms;
            out->check_ms = r->check_ms;
            out->daemon_ms = (double)r->duration_ms;
        }
        plm_result_free(r);
        end_attempt(c);
        call_finish(c, NULL, out);
        return;
    }
    plm_result_free(r);
    /* The only automatic retry: a call refused because its session had ended ran nothing. */
    if (!c->retried && err->session_ended != PLM_END_OPEN &&
        err->not_dispatched != PLM_REFUSAL_NONE) {
        c->retried = true;
        drop(e, s);
        end_attempt(c);
        plm_error_free(err);
        attempt(c);
        return;
    }
    /* A session that stopped (an answer this client could not check) or ended is not
     * kept; one whose unanswered record was checked and chained goes on. */
    if (plm_session_stopped(s) || plm_session_ended(s, NULL) != PLM_END_OPEN)
        drop(e, s);
    end_attempt(c);
    call_finish(c, err, NULL);
}

static void send_cell(call *c)
{
    plm_sandboxes *sb = c->sb;
    c->stage = C_CELL;
    c->s = c->e->session;
    c->sent_ms = now_ms();
    plm_cell cell = {c->language, c->code, c->files, c->n_files};
    plm_run_options o = {.timeout_ms = c->timeout_ms, .minimum_isolation = sb->floor,
                         .cancel = c->cancel};
    plm_error *err = plm_session_run_cell(c->s, &cell, &o, cell_done, c);
    if (err)
        cell_done(c, err, NULL);
}

/* Cancelled while its sandbox opened: nothing was sent.  A sandbox no call has used is
 * not kept for a call that has gone; the open finishes, then it is closed. */
static void abort_open(call *c)
{
    entry *e = c->e;
    if (e->in_flight == 1 && !e->answered && e->current)
        retire(e);
    end_attempt(c);
    call_finish(c, canceled_before_sent(), NULL);
}

static void attempt(call *c)
{
    plm_sandboxes *sb = c->sb;
    c->stage = C_OPEN;
    if (plm_cancel_fired(c->cancel)) { /* a call already cancelled opens no sandbox */
        call_finish(c, canceled_before_sent(), NULL);
        return;
    }
    entry *e = lookup(sb, c->id);
    if (!e) {
        plm_error *err;
        e = entry_for_call(sb, c, &err);
        if (!e) {
            call_finish(c, err, NULL);
            return;
        }
    }
    /* The call holds its entry from here, the open included, so neither the idle close
     * nor an eviction lets the sandbox go while the call waits for it. */
    c->e = e;
    e->refs++;
    e->in_flight++;
    e->used = ++sb->clock;
    if (e->state == E_OPEN) {
        send_cell(c);
        return;
    }
    c->prev_waiter = e->waiters_tail;
    if (e->waiters_tail)
        e->waiters_tail->next_waiter = c;
    else
        e->waiters = c;
    e->waiters_tail = c;
}

/* ---------------------------------------------------------------- run: the fresh path */

static void fresh_done(void *ud, plm_error *err, plm_result *r)
{
    call *c = ud;
    if (dropped_as_detached(c, err, r))
        return;
    plm_code_output *out = NULL;
    if (!err && !r)
        err = plm_err_new(PLM_INTERNAL, PLM_REFUSAL_NONE,
                          "plimsoll: the run answered neither a result nor an error");
    if (err)
        plm_result_free(r);
    else
        err = plm_fresh_output(r, c->language, c->sb->max_output, &out);
    call_finish(c, err, out);
}

static void run_fresh(call *c)
{
    plm_sandboxes *sb = c->sb;
    c->stage = C_FRESH;
    plm_run_options o = {.timeout_ms = c->timeout_ms, .minimum_isolation = sb->floor,
                         .cancel = c->cancel};
    plm_error *err;
    if (!c->projects) {
        /* A snippet is all this daemon runs (wasm): JavaScript, without files. */
        if (strcmp(c->language, "javascript") != 0) {
            err = plm_err_new(PLM_UNIMPLEMENTED, PLM_REFUSAL_UNSUPPORTED,
                              "plimsoll: the daemon (%s) runs JavaScript snippets only, not %s",
                              c->daemon, c->language);
        } else if (c->n_files) {
            err = plm_err_new(PLM_UNIMPLEMENTED, PLM_REFUSAL_UNSUPPORTED,
                              "plimsoll: the daemon (%s) runs JavaScript snippets only, which "
                              "take no files", c->daemon);
        } else {
            char *snippet = plm_snippet_runner(c->code);
            err = snippet ? plm_run_javascript(sb->client, snippet, &o, fresh_done, c) : oom();
            free(snippet);
        }
    } else {
        const plm_runner *runner = plm_runner_for(c->language);
        size_t n;
        plm_file *files = plm_fresh_files(runner, c->code, c->files, c->n_files, &n);
        plm_project p = {files, n, &runner->step, 1, NULL, 0};
        err = files ? plm_run_project(sb->client, &p, &o, fresh_done, c) : oom();
        free(files);
    }
    if (err)
        call_finish(c, err, NULL);
}

/* ---------------------------------------------------------------- run: before dispatch */

/* "python" or "python, javascript": what an environment states it runs. */
static void env_languages(const plm_environment *env, char *buf, size_t len)
{
    snprintf(buf, len, "%s%s%s", env->python ? "python" : "",
             env->python && env->javascript ? ", " : "", env->javascript ? "javascript" : "");
}

static bool env_runs(const plm_environment *env, const char *language)
{
    return strcmp(language, "python") == 0 ? env->python : env->javascript;
}

/* docs/client.md §6.6 step 3: an environment that states languages must state this one; one
 * that states none predates the statement and is let through. */
static plm_error *check_proved(const plm_environment *env, const char *language,
                               const char *what)
{
    if ((!env->python && !env->javascript) || env_runs(env, language))
        return NULL;
    char runs[32];
    env_languages(env, runs, sizeof runs);
    return plm_err_new(PLM_UNIMPLEMENTED, PLM_REFUSAL_UNSUPPORTED,
                       "plimsoll: %s has no %s interpreter (it runs %s)", what, language, runs);
}

static void call_on_info(dwait *w, plm_error *err, const plm_info *info)
{
    call *c = OWNER(w, call, dw);
    plm_sandboxes *sb = c->sb;
    if (err) {
        call_finish(c, err, NULL);
        return;
    }
    c->projects = info->supports_project;
    c->daemon = plm_strdup_or_empty(info->sandbox);
    err = check_proved(&info->project, c->language, "the sandbox image");
    /* Without a key there is no conversation to scope a sandbox to: sharing one would
     * hand one conversation's files to another. */
    bool persistent = c->id && sb->mode != PLM_SESSIONS_NEVER && info->supports_sessions;
    if (!err && c->id && sb->mode == PLM_SESSIONS_ALWAYS && !info->supports_sessions)
        err = no_sessions(info, true);
    if (!err && persistent)
        err = check_proved(&info->session, c->language, "the daemon's session sandbox");
    if (err)
        call_finish(c, err, NULL);
    else if (persistent)
        attempt(c);
    else
        run_fresh(c);
}

/* The cancellation listener only schedules: the call reacts on the loop. */
static void on_call_cancel(plm_listener *l)
{
    call *c = OWNER(l, call, cancel_l);
    start_soon(c->sb, &c->wake);
}

static void unlink_waiter(call *c)
{
    entry *e = c->e;
    if (c->prev_waiter)
        c->prev_waiter->next_waiter = c->next_waiter;
    else
        e->waiters = c->next_waiter;
    if (c->next_waiter)
        c->next_waiter->prev_waiter = c->prev_waiter;
    else
        e->waiters_tail = c->prev_waiter;
    c->next_waiter = c->prev_waiter = NULL;
}

static void wake_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
    call *c = t->data;
    if (c->stage == C_DESCRIBE) {
        /* The Describe is shared: this call stops waiting, the Describe goes on. */
        stop_waiting_info(c->sb, &c->dw);
        call_finish(c, canceled_before_sent(), NULL);
    } else if (c->stage == C_OPEN && c->e) {
        unlink_waiter(c);
        abort_open(c);
    }
    /* Once the code may have been sent, the transport answers the cancellation. */
}

/* The checks a call can fail before anything starts; NULL or a request-marked error. */
static plm_error *check_input(const plm_sandboxes *sb, const plm_code_input *in,
                              const char **language)
{
    if (!in || !in->code)
        return plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST,
                           "plimsoll: a call needs its code");
    if (!*in->code)
        return plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST,
                           "plimsoll: the code is empty; send at least one character");
    if (!plm_utf8_valid(in->code, strlen(in->code)))
        return plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST,
                           "plimsoll: the code is not well-formed UTF-8 text");
    if (in->n_files && !in->files)
        return plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST,
                           "plimsoll: n_files is set but files is NULL");
    if (in->n_files > PLM_MAX_CALL_FILES)
        return plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST,
                           "plimsoll: files holds %zu files, more than the %d a call takes (the "
                           "daemon takes 200, and a fresh run adds its cell and its runner)",
                           in->n_files, PLM_MAX_CALL_FILES);
    for (size_t i = 0; i < in->n_files; i++) {
        const plm_file *f = &in->files[i];
        if (!f->path || !*f->path || !plm_utf8_valid(f->path, strlen(f->path)) ||
            (f->content && !plm_utf8_valid(f->content, strlen(f->content))))
            return plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST,
                               "plimsoll: files[%zu] needs a nonempty path, and a path and "
                               "content of well-formed UTF-8 text", i);
        /* A fresh run's runner and cell live there; a file of the call's own would
         * replace them. */
        if (strcmp(f->path, ".plimsoll") == 0 || strncmp(f->path, ".plimsoll/", 10) == 0)
            return plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST,
                               "plimsoll: \"%s\" is under .plimsoll/, which the sandbox's "
                               "runner reserves", f->path);
    }
    const char *want = in->language ? in->language : sb->languages[0];
    for (size_t i = 0; i < sb->n_languages; i++) {
        if (strcmp(sb->languages[i], want) == 0) {
            *language = sb->languages[i];
            return NULL;
        }
    }
    char *offered = plm_strdup("");
    for (size_t i = 0; offered && i < sb->n_languages; i++) {
        char *t = plm_printf("%s%s%s", offered, i ? " or " : "", sb->languages[i]);
        free(offered);
        offered = t;
    }
    plm_error *e = plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST,
                               "plimsoll: this tool runs %s, not %s", offered ? offered : "",
                               shown(want));
    free(offered);
    return e;
}

static call *call_new(plm_sandboxes *sb, const plm_key *key, const char *id,
                      const plm_code_input *in, const char *language)
{
    call *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->sb = sb;
    c->id = plm_strdup(id);
    c->owner = key ? plm_strdup(key->owner) : NULL;
    c->conversation = key ? plm_strdup(key->conversation) : NULL;
    c->language = language;
    c->timeout_ms = in->timeout_ms > 0 ? in->timeout_ms : sb->timeout_ms;
    c->code = strdup(in->code);
    c->files = calloc(in->n_files ? in->n_files : 1, sizeof *c->files);
    bool ok = c->code && c->files && (!id || (c->id && c->conversation)) &&
              (!key || !key->owner || c->owner);
    for (size_t i = 0; ok && i < in->n_files; i++, c->n_files++) {
        c->files[i].path = strdup(in->files[i].path);
        c->files[i].content = strdup(in->files[i].content ? in->files[i].content : "");
        ok = c->files[i].path && c->files[i].content;
    }
    if (!ok) {
        call_free(c); /* n_files counts the file that failed: its other half is freed too */
        return NULL;
    }
    return c;
}

plm_error *plm_sandboxes_run(plm_sandboxes *sb, const plm_key *key, const plm_code_input *in,
                             plm_cancel *cancel, plm_code_cb cb, void *ud)
{
    plm_error *err = NULL;
    char *id = NULL;
    const char *language = NULL;
    if (!sb || !cb)
        err = plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST,
                          "plimsoll: run needs the sandboxes and a callback");
    else if (sb->freeing)
        err = freed_error("the call was sent");
    if (!err && key)
        id = key_encode(key, &err);
    if (!err)
        err = check_input(sb, in, &language);
    if (!err && plm_cancel_fired(cancel))
        err = canceled_before_sent();
    call *c = err ? NULL : call_new(sb, key, id, in, language);
    free(id);
    if (!err && !c)
        err = oom();
    if (err) {
        says_whether_it_ran(err);
        return err; /* every refusal here is marked request: the Describe stays cached */
    }
    c->cancel = cancel;
    c->cb = cb;
    c->ud = ud;
    c->started_ms = now_ms();
    c->stage = C_DESCRIBE;
    c->dw.fn = call_on_info;
    ev_timer_init(&c->wake, wake_cb, 0., 0.);
    c->wake.data = c;
    ev_timer_init(&c->deliver, call_deliver, 0., 0.);
    c->deliver.data = c;
    c->cancel_l.fn = on_call_cancel;
    plm_cancel_listen(cancel, &c->cancel_l);
    node_push(&sb->calls, &c->link);
    need_info(sb, &c->dw);
    return NULL;
}

/* ---------------------------------------------------------------- free */

/* Completes a pending call now.  One whose cell or fresh run the client still holds is
 * kept, detached, until that operation calls back (or the client is freed). */
static void call_complete_now(call *c)
{
    plm_sandboxes *sb = c->sb;
    node_drop(&sb->calls, &c->link);
    plm_cancel_unlisten(&c->cancel_l);
    ev_timer_stop(sb->loop, &c->wake);
    ev_timer_stop(sb->loop, &c->deliver);
    plm_error *err = c->err;
    plm_code_output *out = c->out;
    bool held = c->stage == C_CELL || c->stage == C_FRESH;
    if (c->stage == C_DESCRIBE)
        stop_waiting_info(sb, &c->dw);
    if (held)
        err = plm_err_new(PLM_CANCELED, PLM_REFUSAL_NONE,
                          "plimsoll: the sandboxes were freed while the call was in flight; "
                          "it may have run");
    else if (c->stage != C_DONE)
        err = freed_error("the call was sent");
    if (c->stage != C_DONE && err)
        says_whether_it_ran(err);
    c->err = NULL;
    c->out = NULL;
    c->detached = held;
    c->cb(c->ud, err, out);
    if (!held)
        call_free(c);
}

void plm_sandboxes_free(plm_sandboxes *sb)
{
    if (!sb || sb->freeing)
        return;
    sb->freeing = true; /* from here every entry point refuses */
    ev_timer_stop(sb->loop, &sb->kick);
    if (sb->describe)
        sb->describe->sb = NULL;
    /* Every callback still owed runs now, as plm_client_free does. */
    while (sb->calls)
        call_complete_now(OWNER(sb->calls, call, link));
    while (sb->persists) {
        persist_op *op = OWNER(sb->persists, persist_op, link);
        node_drop(&sb->persists, &op->link);
        ev_timer_stop(sb->loop, &op->deliver);
        if (!op->ready) {
            stop_waiting_info(sb, &op->dw);
            persist_answer(op, sb->info ? NULL : freed_error("the Describe answered"), sb->info);
        }
        op->cb(op->ud, op->err, op->value);
        free(op);
    }
    while (sb->groups) {
        group *g = OWNER(sb->groups, group, link);
        node_drop(&sb->groups, &g->link);
        ev_timer_stop(sb->loop, &g->deliver);
        if (g->done)
            g->done(g->ud);
        free(g);
    }
    /* Closes nothing: a session handle goes (its queued calls were completed above), the
     * daemon ends the session by its own idle timeout.  Callers close first, with
     * plm_sandboxes_dispose_all. */
    FOR_ENTRIES(sb, e) {
        idle_disarm(e);
        ev_timer_stop(sb->loop, &e->later);
        node_drop(&sb->entries, &e->link);
        plm_session *s = e->session;
        e->session = NULL;
        plm_session_free(s);
        e->detached = true;
        if (e->state != E_OPENING)
            entry_destroy(e); /* an open in flight finds the entry detached, and frees it */
    }
    plm_idmap_free(&sb->map);   /* (its entries went above, or go with their open) */
    plm_info_free(sb->info);
    plm_error_free(sb->describe_err);
    for (size_t i = 0; sb->languages && i < sb->n_languages; i++)
        free(sb->languages[i]);
    free(sb->languages);
    free(sb->floor);
    free(sb);
}

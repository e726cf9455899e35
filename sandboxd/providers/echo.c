/*
 * echo.c — the `echo` provider: runs no code, answers with what it was sent.
 *
 * Sessions mirror plimsoll's in-memory test provider (docs/daemon.md §9):
 * a snippet answers its nth call with n "x" characters (one counter shared by
 * snippets and cells), a cell answers "<language> <n>: <code>" with n counted per
 * language, and magic cell codes reproduce a deadline, a session that ends itself and
 * (sandboxd's own) a call whose answer is lost and a call that takes a while:
 *   plimsoll-fake:past-deadline   exit 124, timedOut, interpreterEnded; counter reset
 *   plimsoll-fake:ends-session    answers, then the session ends disk_exceeded
 *   plimsoll-echo:unanswered      counts in the chain, fails `unknown` (UnansweredCall)
 *   plimsoll-echo:sleep:MS        answers after MS ms (at most 10 000): holds the turn  Unlike the fake it also answers
 * single runs, so a client can be tested end to end without a real sandbox.
 *
 * Every answer is deferred to the next loop iteration through the same callback path
 * a real provider takes after seconds.
 */
#include "config.h"
#include "provider.h"
#include "util.h"

#include <ev.h>
#include <stdlib.h>
#include <string.h>

#define MAGIC_PAST_DEADLINE "plimsoll-fake:past-deadline"
#define MAGIC_ENDS_SESSION "plimsoll-fake:ends-session"
#define MAGIC_UNANSWERED "plimsoll-echo:unanswered"
#define MAGIC_SLEEP "plimsoll-echo:sleep:"
#define MAX_SLEEP_MS 10000

typedef enum op_type { OP_RUN, OP_SESSION_RUN, OP_OPEN, OP_SUSPEND, OP_CLOSE, OP_SMOKE } op_type;

typedef struct echo_op {
    ev_timer timer;                /* 0 s: fires on the next loop iteration */
    op_type type;
    sbx_provider *p;
    sbx_psession *s;
    const sbx_job *job;
    void *ud;
    union {
        sbx_run_cb run;
        sbx_open_cb open;
        sbx_done_cb done;
        sbx_smoke_cb smoke;
    } cb;
    struct echo_op *prev, *next;   /* the provider's pending operations */
} echo_op;

struct sbx_psession {
    sbx_provider *p;
    uint64_t calls;                /* snippets and cells */
    uint64_t cells_js, cells_py;   /* per-language cell counters */
    echo_op *running;              /* the call in flight, if any */
    echo_op *closing;              /* a close waiting for that call */
    sbx_psession *prev, *next;
};

struct sbx_provider {
    struct ev_loop *loop;
    sbx_facts facts;
    char *tier;
    echo_op *ops;
    sbx_psession *sessions;
};

/* ---------------------------------------------------------------- deferral */

static void op_fire(struct ev_loop *loop, ev_timer *w, int revents);

static echo_op *op_start_after(sbx_provider *p, op_type type, void *ud, double after)
{
    echo_op *op = sbx_xcalloc(1, sizeof *op);
    op->type = type;
    op->p = p;
    op->ud = ud;
    op->next = p->ops;
    if (p->ops)
        p->ops->prev = op;
    p->ops = op;
    ev_timer_init(&op->timer, op_fire, after, 0.);
    op->timer.data = op;
    ev_timer_start(p->loop, &op->timer);
    return op;
}

static echo_op *op_start(sbx_provider *p, op_type type, void *ud)
{
    return op_start_after(p, type, ud, 0.);
}

static void op_unlink(echo_op *op)
{
    ev_timer_stop(op->p->loop, &op->timer);
    if (op->prev)
        op->prev->next = op->next;
    else
        op->p->ops = op->next;
    if (op->next)
        op->next->prev = op->prev;
}

/* ---------------------------------------------------------------- answers */

static bool code_is(const sbx_job *job, const char *magic)
{
    size_t n = strlen(magic);
    return job->code.len == n && memcmp(job->code.data, magic, n) == 0;
}

/* stderr of a cell: each file's path followed by "\n". */
static void list_files(sbx_buf *b, const sbx_job *job)
{
    size_t len = 0;
    for (size_t i = 0; i < job->n_files; i++)
        len += job->files[i].path.len + 1;
    if (!len)
        return;
    unsigned char *d = sbx_xmalloc(len + 1);
    size_t at = 0;
    for (size_t i = 0; i < job->n_files; i++) {
        memcpy(d + at, job->files[i].path.data, job->files[i].path.len);
        at += job->files[i].path.len;
        d[at++] = '\n';
    }
    d[at] = '\0';
    b->data = d;
    b->len = len;
}

/* "<language> <n>: <code>", no trailing newline. */
static void echo_code(sbx_buf *b, const char *language, uint64_t n, sbx_bytes code)
{
    char *head = sbx_printf("%s %llu: ", language, (unsigned long long)n);
    size_t hl = strlen(head);
    b->data = sbx_xmalloc(hl + code.len + 1);
    memcpy(b->data, head, hl);
    if (code.len)
        memcpy(b->data + hl, code.data, code.len);
    b->len = hl + code.len;
    b->data[b->len] = '\0';
    free(head);
}

static sbx_result *answer_project(const sbx_job *job, bool echo_steps)
{
    sbx_result *r = sbx_result_new(SBX_KIND_PROJECT);
    r->outcome = 1; /* PROJECT_OUTCOME_COMPLETED */
    if (!echo_steps)
        return r;
    r->steps = sbx_xcalloc(job->n_steps, sizeof *r->steps);
    for (size_t i = 0; i < job->n_steps; i++) {
        sbx_step_result *st = &r->steps[r->n_steps++];
        st->command = sbx_xstrndup(job->steps[i].data, job->steps[i].len);
        sbx_buf_set(&st->out, job->steps[i].data, job->steps[i].len + 1);
        st->out.data[job->steps[i].len] = '\n';
    }
    r->artifacts = sbx_xcalloc(job->n_artifacts, sizeof *r->artifacts);
    for (size_t a = 0; a < job->n_artifacts; a++) {
        for (size_t f = 0; f < job->n_files; f++) {
            const sbx_file *file = &job->files[f];
            if (file->path.len == job->artifacts[a].len &&
                memcmp(file->path.data, job->artifacts[a].data, file->path.len) == 0) {
                sbx_artifact *art = &r->artifacts[r->n_artifacts++];
                art->path = sbx_xstrndup(file->path.data, file->path.len);
                sbx_buf_set(&art->content, file->content.data, file->content.len);
                break;
            }
        }
    }
    return r;
}

static sbx_result *refuse(sbx_kind kind, plm_code code, plm_refusal reason, const char *msg)
{
    sbx_result *r = sbx_result_new(kind);
    r->status = SBX_RUN_REFUSED;
    r->error = sbx_err_new(code, reason, "%s", msg);
    return r;
}

static sbx_result *answer_single(const sbx_job *job)
{
    switch (job->kind) {
    case SBX_KIND_JAVASCRIPT: {
        sbx_result *r = sbx_result_new(SBX_KIND_JAVASCRIPT);
        echo_code(&r->out, "javascript", 1, job->code);
        return r;
    }
    case SBX_KIND_PROJECT:
        return answer_project(job, true);
    default:
        return refuse(job->kind, PLM_UNIMPLEMENTED, PLM_REFUSAL_UNSUPPORTED,
                      "the echo provider runs no modules and no cells outside a session; "
                      "nothing ran");
    }
}

static sbx_result *answer_cell(sbx_psession *s, const sbx_job *job)
{
    bool python = strcmp(job->language, "python") == 0;
    uint64_t *counter = python ? &s->cells_py : &s->cells_js;
    s->calls++;
    uint64_t n = ++*counter;
    sbx_result *r = sbx_result_new(SBX_KIND_CELL);
    list_files(&r->err, job);
    r->interpreter_started = n == 1;
    if (code_is(job, MAGIC_PAST_DEADLINE)) {
        r->exit_code = 124;
        r->timed_out = true;
        r->interpreter_ended = true;
        *counter = 0; /* the next cell of this language starts a fresh interpreter */
        return r;
    }
    echo_code(&r->out, job->language, n, job->code);
    if (code_is(job, MAGIC_ENDS_SESSION)) {
        r->ended = PLM_END_DISK_EXCEEDED;
        r->end_detail = sbx_xstrdup("the session's files are over the disk limit "
                                    "(echo: " MAGIC_ENDS_SESSION ")");
    } else if (code_is(job, MAGIC_UNANSWERED)) {
        r->status = SBX_RUN_UNANSWERED;
        r->error = sbx_err_new(PLM_UNKNOWN, PLM_REFUSAL_NONE,
                               "the cell ran but its answer was lost (echo: " MAGIC_UNANSWERED
                               "); it may have run");
    }
    return r;
}

static sbx_result *answer_session(sbx_psession *s, const sbx_job *job)
{
    switch (job->kind) {
    case SBX_KIND_JAVASCRIPT: {
        sbx_result *r = sbx_result_new(SBX_KIND_JAVASCRIPT);
        s->calls++;
        r->out.data = sbx_xmalloc(s->calls + 1);
        memset(r->out.data, 'x', s->calls);
        r->out.data[s->calls] = '\0';
        r->out.len = s->calls;
        return r;
    }
    case SBX_KIND_PROJECT:
        return answer_project(job, false); /* as the fake: completed, no steps, not counted */
    case SBX_KIND_CELL:
        return answer_cell(s, job);
    default:
        return refuse(job->kind, PLM_UNIMPLEMENTED, PLM_REFUSAL_UNSUPPORTED,
                      "sessions take snippets, projects and cells; nothing ran");
    }
}

/* ---------------------------------------------------------------- sessions */

static sbx_psession *session_new(sbx_provider *p)
{
    sbx_psession *s = sbx_xcalloc(1, sizeof *s);
    s->p = p;
    s->next = p->sessions;
    if (p->sessions)
        p->sessions->prev = s;
    p->sessions = s;
    return s;
}

static void session_free(sbx_psession *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        s->p->sessions = s->next;
    if (s->next)
        s->next->prev = s->prev;
    free(s);
}

static void op_fire(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    echo_op *op = w->data;
    sbx_provider *p = op->p;
    op_unlink(op);
    switch (op->type) {
    case OP_RUN:
        op->cb.run(op->ud, answer_single(op->job));
        break;
    case OP_SESSION_RUN: {
        sbx_psession *s = op->s;
        s->running = NULL;
        op->cb.run(op->ud, answer_session(s, op->job));
        if (s->closing) { /* a close waited for this call: it completes last */
            echo_op *close = s->closing;
            s->closing = NULL;
            ev_timer_start(p->loop, &close->timer);
        }
        break;
    }
    case OP_OPEN:
        op->cb.open(op->ud, NULL, session_new(p), p->tier, "");
        break;
    case OP_SUSPEND:
        op->cb.done(op->ud); /* nothing to freeze */
        break;
    case OP_CLOSE: {
        sbx_done_cb cb = op->cb.done;
        void *ud = op->ud;
        session_free(op->s);
        free(op);
        cb(ud);
        return;
    }
    case OP_SMOKE:
        op->cb.smoke(op->ud, NULL);
        break;
    }
    free(op);
}

/* ---------------------------------------------------------------- the interface */

static sbx_provider *echo_create(struct ev_loop *loop, const sbx_config *cfg, char **why)
{
    (void)why;
    sbx_provider *p = sbx_xcalloc(1, sizeof *p);
    p->loop = loop;
    p->tier = sbx_xstrdup(cfg->echo_tier);
    sbx_facts *f = &p->facts;
    f->name = "echo";
    f->tier = p->tier;
    f->policy = "";
    f->supports_javascript = true;
    f->supports_project = true;
    f->supports_sessions = cfg->max_sessions > 0;
    f->javascript = (sbx_env_facts){"", "", 30000, SBX_LANG_JAVASCRIPT};
    f->project = (sbx_env_facts){"", "", 120000, 0};
    f->module = (sbx_env_facts){"", "", 0, 0};
    f->session = (sbx_env_facts){"", "", 120000, SBX_LANG_JAVASCRIPT | SBX_LANG_PYTHON};
    return p;
}

static void echo_destroy(sbx_provider *p)
{
    /* Normally empty; after a forced exit, drop what is left without calling back. */
    while (p->ops) {
        echo_op *op = p->ops;
        op_unlink(op);
        free(op);
    }
    while (p->sessions)
        session_free(p->sessions);
    free(p->tier);
    free(p);
}

static const sbx_facts *echo_facts(const sbx_provider *p)
{
    return &p->facts;
}

static void echo_smoke_test(sbx_provider *p, sbx_smoke_cb cb, void *ud)
{
    op_start(p, OP_SMOKE, ud)->cb.smoke = cb;
}

static void echo_run(sbx_provider *p, const sbx_job *job, sbx_run_cb cb, void *ud)
{
    echo_op *op = op_start(p, OP_RUN, ud);
    op->job = job;
    op->cb.run = cb;
}

static void echo_session_open(sbx_provider *p, const sbx_open_params *params, sbx_open_cb cb,
                              void *ud)
{
    (void)params; /* nothing to warm, nothing to time: the server keeps the clocks */
    op_start(p, OP_OPEN, ud)->cb.open = cb;
}

/* The delay a "plimsoll-echo:sleep:MS" cell asks for, in seconds (0 otherwise). */
static double sleep_of(const sbx_job *job)
{
    size_t n = strlen(MAGIC_SLEEP);
    if (job->kind != SBX_KIND_CELL || job->code.len <= n || job->code.len > n + 5 ||
        memcmp(job->code.data, MAGIC_SLEEP, n) != 0)
        return 0.;
    unsigned ms = 0;
    for (size_t i = n; i < job->code.len; i++) {
        char c = job->code.data[i];
        if (c < '0' || c > '9')
            return 0.;
        ms = ms * 10 + (unsigned)(c - '0');
    }
    return (ms > MAX_SLEEP_MS ? MAX_SLEEP_MS : ms) / 1000.0;
}

static void echo_session_run(sbx_psession *s, const sbx_job *job, sbx_run_cb cb, void *ud)
{
    echo_op *op = op_start_after(s->p, OP_SESSION_RUN, ud, sleep_of(job));
    op->s = s;
    op->job = job;
    op->cb.run = cb;
    s->running = op;
}

static void echo_session_suspend(sbx_psession *s, sbx_done_cb cb, void *ud)
{
    echo_op *op = op_start(s->p, OP_SUSPEND, ud);
    op->s = s;
    op->cb.done = cb;
}

static void echo_session_close(sbx_psession *s, plm_session_end why, sbx_done_cb cb, void *ud)
{
    (void)why;
    echo_op *op = op_start(s->p, OP_CLOSE, ud);
    op->s = s;
    op->cb.done = cb;
    if (s->running) { /* the call in flight ends first (provider.h contract), at once */
        ev_timer_stop(s->p->loop, &s->running->timer);
        ev_timer_set(&s->running->timer, 0., 0.);
        ev_timer_start(s->p->loop, &s->running->timer);
        ev_timer_stop(s->p->loop, &op->timer);
        s->closing = op;
    }
}

const sbx_provider_ops sbx_echo_provider = {
    .name = "echo",
    .create = echo_create,
    .destroy = echo_destroy,
    .facts = echo_facts,
    .smoke_test = echo_smoke_test,
    .run = echo_run,
    .session_open = echo_session_open,
    .session_run = echo_session_run,
    .session_suspend = echo_session_suspend,
    .session_close = echo_session_close,
};

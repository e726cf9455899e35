/*
 * real_provider.c — sessions, cells, snippets, projects and the warm pool of the
 * providers that run real code (see real_provider.h; what they prove at start-up is
 * startup_checks.c's).
 *
 * A cell's way (docs/daemon.md §5.3): the call waits for the previous call's sweep, thaws a
 * suspended sandbox, starts the language's interpreter if none runs (the call then
 * says interpreter_started), and sends the cell (files, code, caps, a fresh nonce) to
 * the supervisor, which writes the files and hands the code to the kernel.  The answer
 * comes back as the cell's kept output and a DONE (ran / raised), an EXITED (the
 * interpreter died: exit 1, interpreter_ended) or FILES_FAILED (nothing ran).  A
 * deadline that passes after the code was sent kills the interpreter and answers 124
 * (timed_out, interpreter_ended); before that, the call is refused deadline_exceeded
 * and nothing ran.  After the answer, off the caller's path, the supervisor sweeps:
 * every process but itself and the live interpreters is killed and the disk measured;
 * a sweep that cannot prove the strays gone ends the session boundary_failed, a disk
 * over the budget ends it disk_exceeded (both reported to the next call).
 *
 * A project (docs/daemon.md §5.5) runs on the snippets' lane: its files are written,
 * then its steps, each in a fresh `/bin/sh -c` under the step deadline (the call's
 * timeout), in order, stopping at the first that fails; then its artifacts are read
 * back (8 MiB in all).  The whole run has a backstop of the timeout + 5 s.  In a
 * session every process of the session, the interpreters included, is killed first.
 *
 * The warm pool keeps `--pool` sandboxes with every proven interpreter started; an
 * open takes one (oldest warm first) and a new one is started in its place.  A member
 * is never reused after a session and is replaced after 30 minutes.
 */
#include "real_internal.h"

#include "cgroup.h"
#include "kernels.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#define ARTIFACTS_CAP (8u << 20)       /* a project's artifacts, in all */
#define BACKSTOP_S 5.0                 /* a project's whole run: its timeout + this */
#define COMMAND_UNITS 16384            /* a step's command as its result states it (UTF-16
                                          units, as the reference's runner cuts it) */
#define KILL_BOUND_S 5.0               /* an interpreter's death after SUP_KILL */
#define MEMBER_MAX_AGE_S (30. * 60.)
#define POOL_CHECK_S 60.0
#define POOL_RETRY_S 5.0
#define POOL_MAX_LAUNCHING 2
#define POOL_REFILL_DELAY_S 0.25

typedef struct call call;

struct sbx_psession {
    sbx_provider *p;
    sbx_box *box;
    sbx_session_ended_cb on_ended;
    void *on_ended_ud;
    bool fresh[3];                 /* that interpreter started and no cell said so yet */
    bool suspended, sweeping, closing, end_told;
    bool close_after_call;         /* the close waits for the call in flight */
    bool no_sweep;                 /* the call just answered started no process */
    call *cur;                     /* the call in flight */
    call *after_sweep;             /* a call waiting for the sweep */
    plm_session_end pending_end;   /* found by a sweep, told between calls */
    char *pending_detail;
    ev_timer tell;                 /* tells pending_end from the loop */
    /* opening */
    bool opening;
    sbx_open_cb open_cb;
    void *open_ud;
    ev_timer open_later;
    /* closing */
    sbx_done_cb close_cb;
    void *close_ud;
    sbx_psession *prev, *next;
};

struct call {
    sbx_provider *p;
    sbx_psession *s;               /* NULL for a single Run */
    sbx_box *box;
    const sbx_job *job;
    int lang;                      /* SUP_LANG_PY / JS (cells), SUP_LANG_EXEC (snippets) */
    sbx_run_cb cb;
    void *ud;
    double timeout_s;
    ev_timer deadline, kill_bound, later;
    bool timed_out, killing, waiting_interp, sent, launched, thawing;
    bool op_active;                /* a box operation of the call is in flight */
    bool restarted;                /* an interpreter that ended while starting was replaced */
    uint64_t oom_before;
    sbx_result *pending;           /* answered from the loop (`later`) */
    /* a project */
    sbx_result *proj;              /* the answer being built */
    int stage;                     /* P_* */
    size_t at;                     /* the step or artifact in hand */
    double step_timeout_s, step_started;
    ev_timer step_deadline;
    bool quiescing, step_running, step_timed_out, over_budget;
    uint32_t artifact_room;
    call *prev, *next;             /* single runs in flight */
};





void sbx_real_pool_fill(sbx_provider *p);
static void pool_refill_soon(sbx_provider *p);
static void pool_retry_later(sbx_provider *p);
static void call_step(call *c);
static void project_begin(call *c);
static sbx_result *project_killed_result(call *c);
static void on_step_deadline(struct ev_loop *loop, ev_timer *w, int revents);
static void thaw_then_step(call *c);
static void continue_close(sbx_psession *s);
static void session_after_call(sbx_psession *s);
static void session_free(sbx_psession *s);

/* ---------------------------------------------------------------- small things */

static int lang_of(const char *language)
{
    return strcmp(language, "python") == 0 ? SUP_LANG_PY : SUP_LANG_JS;
}

unsigned sbx_real_lang_bit(int lang)
{
    return lang == SUP_LANG_PY ? SBX_LANG_PYTHON : SBX_LANG_JAVASCRIPT;
}

const char *sbx_real_lang_word(int lang)
{
    return lang == SUP_LANG_PY ? "python" : "javascript";
}

static void box_config(sbx_provider *p, sbx_box_config *bc, char *id, size_t id_len)
{
    snprintf(id, id_len, "b%llu", (unsigned long long)++p->seq);
    const sbx_config *cfg = p->cfg;
    *bc = (sbx_box_config){
        .id = id,
        .python = cfg->python_path,
        .node = cfg->node_path,
        .work_mb = cfg->work_mb,
        .tmp_mb = 16,
        .shm_mb = 16,
        .mem_mb = cfg->memory_mb,
        .nofile = 4096,
        .uid = (uid_t)-1,
        .gid = (gid_t)-1,
        /* tmpfs file systems that cannot hold more than the budget need no measuring */
        .measure_disk = cfg->disk_mb && cfg->work_mb + 32 > cfg->disk_mb,
    };
    p->be->box_config(p->bk, bc);
}

sbx_box *sbx_real_new_box(sbx_provider *p, const sbx_box_events *ev, void *ud)
{
    char id[32];
    sbx_box_config bc;
    box_config(p, &bc, id, sizeof id);
    return sbx_box_new(p->loop, p->be->box_ops, p->bk, &bc, ev, ud);
}

static void on_box_closed_free(void *ud)
{
    (void)ud;
}

static sbx_result *refusal(sbx_kind kind, plm_code code, plm_refusal reason, char *msg)
{
    sbx_result *r = sbx_result_new(kind);
    r->status = SBX_RUN_REFUSED;
    r->error = sbx_err_new(code, reason, "%s", msg);
    free(msg);
    return r;
}

/* "killed by SIGKILL", "exit status 3". */
void sbx_real_describe_wait(int status, char *out, size_t n)
{
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        const char *name = sig == SIGKILL ? "SIGKILL" : sig == SIGSEGV ? "SIGSEGV"
                         : sig == SIGABRT ? "SIGABRT" : sig == SIGTERM ? "SIGTERM" : NULL;
        if (name)
            snprintf(out, n, "killed by %s", name);
        else
            snprintf(out, n, "killed by signal %d", sig);
    } else if (WIFEXITED(status)) {
        snprintf(out, n, "exit status %d", WEXITSTATUS(status));
    } else {
        snprintf(out, n, "status %d", status);
    }
}

/* Appends a line of the daemon's own to a result's stderr, within the cap (it is not a
 * truncation marker: the cell's own bytes are never cut for it). */
static void note_stderr(sbx_result *r, const char *text)
{
    size_t n = strlen(text);
    if (r->err.len + n > OUTPUT_CAP)
        return;
    r->err.data = sbx_xrealloc(r->err.data, r->err.len + n + 1);
    memcpy(r->err.data + r->err.len, text, n);
    r->err.len += n;
    r->err.data[r->err.len] = '\0';
}

/* ---------------------------------------------------------------- calls */

/* A call is freed only once nothing else holds it: a box operation still in flight
 * (its deadline answered first) is cancelled, so its late end finds no call to report
 * to; a thaw in flight is never left behind (on_deadline waits for it). */
static void call_free(call *c)
{
    if (c->op_active && c->box)
        sbx_box_cancel(c->box, c->lang);
    c->op_active = false;
    ev_timer_stop(c->p->loop, &c->deadline);
    ev_timer_stop(c->p->loop, &c->kill_bound);
    ev_timer_stop(c->p->loop, &c->later);
    ev_timer_stop(c->p->loop, &c->step_deadline);
    sbx_result_free(c->pending);
    sbx_result_free(c->proj);
    free(c);
}

static void on_single_box_closed(void *ud);

/* The call's answer goes out; what follows (a sweep, a box's close) comes after. */
static void call_finish(call *c, sbx_result *r)
{
    ev_timer_stop(c->p->loop, &c->deadline);
    ev_timer_stop(c->p->loop, &c->kill_bound);
    ev_timer_stop(c->p->loop, &c->step_deadline);
    sbx_run_cb cb = c->cb;
    void *ud = c->ud;
    sbx_psession *s = c->s;
    if (s) {
        /* The sweep starts before the answer is built and sent, so the two overlap. */
        if (s->after_sweep == c) /* its deadline passed while the sweep went on */
            s->after_sweep = NULL;
        s->cur = NULL;
        call_free(c);
        session_after_call(s);
        cb(ud, r);
        return;
    }
    /* A single run: its sandbox goes. */
    sbx_provider *p = c->p;
    if (c->prev)
        c->prev->next = c->next;
    else
        p->runs = c->next;
    if (c->next)
        c->next->prev = c->prev;
    sbx_box *box = c->box;
    if (r->status == SBX_RUN_ANSWERED && !r->software_identity) {
        const sbx_env_facts *env = c->job->kind == SBX_KIND_PROJECT ? &p->facts.project
                                                                    : &p->facts.javascript;
        r->software_identity = sbx_xstrdup(env->software_identity);
    }
    call_free(c);
    cb(ud, r);
    if (box)
        sbx_box_close(box, on_single_box_closed, NULL);
}

static void on_single_box_closed(void *ud)
{
    (void)ud;
}

static void on_call_later(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    call *c = w->data;
    sbx_result *r = c->pending;
    c->pending = NULL;
    call_finish(c, r);
}

/* Answers from the loop (never inside the call that started the operation). */
static void call_finish_later(call *c, sbx_result *r)
{
    c->pending = r;
    ev_timer_start(c->p->loop, &c->later);
}

static void on_kill_bound(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    call *c = w->data;
    /* The supervisor did not report the interpreter dead: the sandbox cannot be
     * trusted.  The answer stands (124); the session ends. */
    sbx_log("sandbox %s: the %s interpreter did not die within %.0f s of a kill; ending the "
            "sandbox", sbx_box_id(c->box),
            c->job->kind == SBX_KIND_PROJECT ? "step's"
            : c->lang == SUP_LANG_EXEC       ? "snippet's"
                                             : sbx_real_lang_word(c->lang),
            KILL_BOUND_S);
    sbx_result *r;
    if (c->job->kind == SBX_KIND_PROJECT) {
        r = project_killed_result(c);
    } else {
        r = sbx_result_new(c->job->kind);
        r->exit_code = 124;
        r->timed_out = true;
        r->interpreter_ended = c->job->kind == SBX_KIND_CELL;
        r->interpreter_started = c->launched;
    }
    r->ended = PLM_END_BOUNDARY_FAILED;
    r->end_detail = sbx_xstrdup("an interpreter killed at its deadline could not be proven gone");
    if (c->s)
        c->s->end_told = true;
    /* Nothing in it can be trusted now, and whatever holds it (a stopped supervisor, a
     * blocked one) must not hold the close either: it is ended by force, the call's
     * operation given up first so that its end is nobody's. */
    if (c->op_active)
        sbx_box_cancel(c->box, c->lang);
    c->op_active = false;
    sbx_box_abort(c->box, "an interpreter killed at its deadline could not be proven gone");
    call_finish(c, r);
}

static sbx_result *deadline_refusal(const call *c)
{
    return refusal(c->job->kind, PLM_DEADLINE_EXCEEDED, PLM_REFUSAL_CAPACITY,
                   sbx_printf("the call's deadline (%.0f ms) passed before its code was sent; "
                              "nothing ran", c->timeout_s * 1000));
}

static void on_deadline(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    call *c = w->data;
    c->timed_out = true;
    if (c->thawing)
        return; /* the thaw holds the call (bounded): on_thawed refuses it */
    if (c->sent && c->job->kind == SBX_KIND_PROJECT) {
        /* The backstop: a step running is killed (its end answers), anything else
         * (a file, an artifact: bounded) ends the run once it is done. */
        c->over_budget = true;
        if (c->step_running && !c->killing) {
            c->killing = true;
            sbx_box_kill(c->box, SUP_LANG_EXEC);
            ev_timer_set(&c->kill_bound, KILL_BOUND_S, 0.);
            ev_timer_start(c->p->loop, &c->kill_bound);
        }
        return;
    }
    if (c->sent) { /* the code may be running: kill it, answer 124 when it is gone */
        c->killing = true;
        sbx_box_kill(c->box, c->lang);
        ev_timer_set(&c->kill_bound, KILL_BOUND_S, 0.);
        ev_timer_start(c->p->loop, &c->kill_bound);
        return;
    }
    /* Nothing was sent: refuse.  An interpreter being started for it is dropped. */
    if (c->waiting_interp && c->lang != SUP_LANG_EXEC)
        sbx_box_kill(c->box, c->lang);
    c->waiting_interp = false;
    call_finish(c, deadline_refusal(c));
}

static void on_cell_result(void *ud, sbx_cell_result *cr)
{
    call *c = ud;
    c->op_active = false;
    sbx_provider *p = c->p;
    sbx_kind kind = c->job->kind;
    sbx_result *r = NULL;
    switch (cr->end) {
    case SBX_CELL_FILES_FAILED:
        r = refusal(kind, PLM_INVALID_ARGUMENT, PLM_REFUSAL_REQUEST,
                    sbx_printf("cell.files[%u] could not be written into the work directory "
                               "(%s%s); the code was not run", cr->file_index, cr->errcode,
                               strcmp(cr->errcode, "ENOTREG") == 0
                                   ? ": the path names something that is not a regular "
                                     "file, such as a FIFO"
                                   : ""));
        break;
    case SBX_CELL_NOT_RUN:
        r = refusal(kind, PLM_FAILED_PRECONDITION, PLM_REFUSAL_ENVIRONMENT,
                    sbx_printf("no %s interpreter was listening; nothing ran",
                               c->lang == SUP_LANG_EXEC ? "node" : sbx_real_lang_word(c->lang)));
        break;
    case SBX_CELL_NO_NONCE:
        r = refusal(kind, PLM_INTERNAL, PLM_REFUSAL_ENVIRONMENT,
                    sbx_printf("sandboxd could not get random bytes for the cell's end-of-output "
                               "nonce; nothing ran"));
        break;
    case SBX_CELL_SANDBOX_GONE:
        if (c->s && c->s->closing) {
            if (!c->sent) {
                r = refusal(kind, PLM_ABORTED, PLM_REFUSAL_CAPACITY,
                            sbx_printf("the session ended before the code was sent; nothing ran"));
            } else {
                r = sbx_result_new(kind);
                r->status = SBX_RUN_UNANSWERED;
                r->error = sbx_err_new(PLM_ABORTED, PLM_REFUSAL_NONE,
                                       "the session ended while the call ran; it may have run");
            }
            break;
        }
        if (!c->sent) {
            r = refusal(kind, PLM_UNAVAILABLE, PLM_REFUSAL_ENVIRONMENT,
                        sbx_printf("the sandbox ended before the code was sent (%s); nothing ran",
                                   cr->text ? cr->text : "gone"));
            if (c->s && !c->s->end_told) { /* told between calls */
                c->s->pending_end = PLM_END_MAIN_PROCESS_ENDED;
                free(c->s->pending_detail);
                c->s->pending_detail = sbx_xstrdup(cr->text ? cr->text : "the sandbox ended");
            }
            break;
        }
        /* It ran and the whole sandbox went with it (a memory bomb under gVisor): the
         * answer says so, and the session ends. */
        r = sbx_result_new(kind);
        r->exit_code = c->timed_out ? 124 : 1;
        r->timed_out = c->timed_out;
        r->interpreter_ended = kind == SBX_KIND_CELL;
        r->interpreter_started = c->launched;
        r->out = cr->out;
        r->err = cr->err;
        cr->out.data = cr->err.data = NULL;
        r->out_truncated = cr->out_truncated;
        r->err_truncated = cr->err_truncated;
        {
            char *line = sbx_printf("\n[sandboxd: the sandbox ended during the call (%s); the "
                                    "session is over]\n", cr->text ? cr->text : "gone");
            note_stderr(r, line);
            free(line);
        }
        if (c->s) {
            r->ended = PLM_END_MAIN_PROCESS_ENDED;
            r->end_detail = sbx_xstrdup(cr->text ? cr->text : "the sandbox ended during the call");
            c->s->end_told = true;
        }
        break;
    case SBX_CELL_RAN:
    case SBX_CELL_RAISED:
    case SBX_CELL_DIED:
    case SBX_CELL_EXITED:
    case SBX_CELL_WRITTEN: /* a project's, never a cell's or a snippet's: as a death */
    case SBX_CELL_READ:
        r = sbx_result_new(kind);
        r->out = cr->out;
        r->err = cr->err;
        cr->out.data = cr->err.data = NULL;
        r->out_truncated = cr->out_truncated;
        r->err_truncated = cr->err_truncated;
        r->interpreter_started = kind == SBX_KIND_CELL && c->launched;
        if (cr->end == SBX_CELL_RAN) {
            r->exit_code = 0;
        } else if (cr->end == SBX_CELL_RAISED) {
            r->exit_code = 1;
        } else if (c->timed_out) {
            r->exit_code = 124;
            r->timed_out = true;
            r->interpreter_ended = kind == SBX_KIND_CELL;
        } else if (cr->end == SBX_CELL_EXITED) {
            r->exit_code = WIFEXITED(cr->wait_status) ? WEXITSTATUS(cr->wait_status)
                           : WIFSIGNALED(cr->wait_status) ? 128 + WTERMSIG(cr->wait_status) : 1;
        } else { /* the interpreter died in the cell */
            r->exit_code = 1;
            r->interpreter_ended = true;
            char how[64];
            sbx_real_describe_wait(cr->wait_status, how, sizeof how);
            bool oom = p->be->oom_kills && p->be->oom_kills(p->bk, c->box) > c->oom_before;
            char *line;
            if (oom)
                line = sbx_printf("\n[sandboxd: the %s interpreter was %s: out of memory (the "
                                  "sandbox's limit is %u MiB)]\n", sbx_real_lang_word(c->lang), how,
                                  p->cfg->memory_mb);
            else if (cr->text && *cr->text)
                line = sbx_printf("\n[sandboxd: the %s interpreter ended (%s): %s]\n",
                                  sbx_real_lang_word(c->lang), how, cr->text);
            else
                line = sbx_printf("\n[sandboxd: the %s interpreter ended (%s)]\n",
                                  sbx_real_lang_word(c->lang), how);
            note_stderr(r, line);
            free(line);
        }
        if (kind == SBX_KIND_CELL && r->interpreter_ended && c->s)
            c->s->fresh[c->lang] = false;
        break;
    }
    if (c->s)
        c->s->no_sweep = kind == SBX_KIND_CELL && !cr->spawned &&
                         (cr->end == SBX_CELL_RAN || cr->end == SBX_CELL_RAISED);
    free(cr->out.data);
    free(cr->err.data);
    free(cr->text);
    if (kind == SBX_KIND_CELL && c->s && r->status == SBX_RUN_ANSWERED)
        c->s->fresh[c->lang] = false; /* said once */
    call_finish(c, r);
}

static uint32_t effective_timeout(int32_t asked, uint32_t dflt, uint32_t max)
{
    if (asked <= 0)
        return dflt;
    return (uint32_t)asked < max ? (uint32_t)asked : max;
}

/* Moves a call forward from wherever it waits. */
static void call_step(call *c)
{
    sbx_box *box = c->box;
    if (c->s && c->s->closing) {
        call_finish(c, refusal(c->job->kind, PLM_ABORTED, PLM_REFUSAL_CAPACITY,
                               sbx_printf("the session ended before the code was sent; "
                                          "nothing ran")));
        return;
    }
    if (c->job->kind == SBX_KIND_PROJECT) {
        project_begin(c);
        return;
    }
    if (c->lang == SUP_LANG_EXEC) {
        c->sent = c->op_active = true;
        sbx_box_exec(box, &c->job->code, OUTPUT_CAP, OUTPUT_CAP, on_cell_result, c);
        return;
    }
    switch (sbx_box_interp(box, c->lang)) {
    case SBX_I_NONE:
        if (!sbx_box_alive(box)) {
            c->sent = false;
            c->op_active = true;
            sbx_box_cell(box, c->lang, c->job, OUTPUT_CAP, OUTPUT_CAP, on_cell_result, c); /* GONE */
            return;
        }
        c->launched = true;
        if (c->s)
            c->s->fresh[c->lang] = true;
        sbx_box_start(box, c->lang);
        c->waiting_interp = true;
        return;
    case SBX_I_STARTING:
        c->waiting_interp = true;
        return;
    case SBX_I_IDLE:
    case SBX_I_RUNNING:
        break;
    }
    c->waiting_interp = false;
    if (c->s && c->s->fresh[c->lang])
        c->launched = true;
    c->oom_before = c->p->be->oom_kills ? c->p->be->oom_kills(c->p->bk, box) : 0;
    c->sent = sbx_box_interp(box, c->lang) == SBX_I_IDLE;
    c->op_active = true;
    sbx_box_cell(box, c->lang, c->job, OUTPUT_CAP, OUTPUT_CAP, on_cell_result, c);
}

static call *call_new(sbx_provider *p, sbx_psession *s, sbx_box *box, const sbx_job *job,
                      sbx_run_cb cb, void *ud)
{
    call *c = sbx_xcalloc(1, sizeof *c);
    c->p = p;
    c->s = s;
    c->box = box;
    c->job = job;
    c->cb = cb;
    c->ud = ud;
    const sbx_config *cfg = p->cfg;
    uint32_t ms;
    if (job->kind == SBX_KIND_CELL) {
        c->lang = lang_of(job->language);
        ms = effective_timeout(job->timeout_ms, cfg->cell_timeout_ms, cfg->cell_timeout_max_ms);
    } else if (job->kind == SBX_KIND_PROJECT) { /* project timeouts are the cells' */
        c->lang = SUP_LANG_EXEC;
        ms = effective_timeout(job->timeout_ms, cfg->cell_timeout_ms, cfg->cell_timeout_max_ms);
    } else {
        c->lang = SUP_LANG_EXEC;
        ms = effective_timeout(job->timeout_ms, cfg->snippet_timeout_ms, cfg->snippet_timeout_max_ms);
    }
    c->timeout_s = ms / 1000.0;
    if (job->kind == SBX_KIND_PROJECT) { /* each step has the timeout; the run a backstop */
        c->step_timeout_s = c->timeout_s;
        c->timeout_s += BACKSTOP_S;
    }
    ev_timer_init(&c->deadline, on_deadline, c->timeout_s, 0.);
    ev_timer_init(&c->kill_bound, on_kill_bound, KILL_BOUND_S, 0.);
    ev_timer_init(&c->later, on_call_later, 0., 0.);
    ev_timer_init(&c->step_deadline, on_step_deadline, c->step_timeout_s, 0.);
    c->deadline.data = c->kill_bound.data = c->later.data = c->step_deadline.data = c;
    return c;
}

/* An interpreter of a box the call uses came up or failed. */
static void call_on_interp(call *c, int lang, bool up, const char *text)
{
    if (!c->waiting_interp || c->lang != lang)
        return;
    c->waiting_interp = false;
    if (up) {
        call_step(c);
        return;
    }
    if (!c->restarted) { /* one more try: it may have been an earlier call's, killed */
        c->restarted = true;
        call_step(c);
        return;
    }
    call_finish(c, refusal(c->job->kind, PLM_FAILED_PRECONDITION, PLM_REFUSAL_ENVIRONMENT,
                           sbx_printf("the %s interpreter could not start (%s); nothing ran",
                                      sbx_real_lang_word(lang), text && *text ? text : "it exited at once")));
}

/* ---------------------------------------------------------------- sessions: events */

static void tell_end(sbx_psession *s, plm_session_end why, const char *detail)
{
    if (s->end_told || s->closing)
        return;
    s->end_told = true;
    if (s->on_ended)
        s->on_ended(s->on_ended_ud, why, detail);
}

static void on_tell(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    sbx_psession *s = w->data;
    if (s->cur || s->sweeping || s->pending_end == PLM_END_OPEN)
        return; /* told after the call or the sweep */
    plm_session_end why = s->pending_end;
    char *detail = s->pending_detail;
    s->pending_end = PLM_END_OPEN;
    s->pending_detail = NULL;
    tell_end(s, why, detail ? detail : "");
    free(detail);
}

plm_session_end sbx_real_session_found_end(const sbx_psession *s, const char **detail)
{
    if (s->end_told || s->closing || s->pending_end == PLM_END_OPEN)
        return PLM_END_OPEN;
    *detail = s->pending_detail ? s->pending_detail : "";
    return s->pending_end;
}

static void schedule_tell(sbx_psession *s, plm_session_end why, const char *detail)
{
    if (s->end_told || s->closing)
        return;
    if (s->pending_end == PLM_END_OPEN) {
        s->pending_end = why;
        free(s->pending_detail);
        s->pending_detail = sbx_xstrdup(detail);
    }
    ev_timer_start(s->p->loop, &s->tell);
}

static void on_sess_interp(void *ud, sbx_box *b, int lang, bool up, const char *text)
{
    (void)b;
    sbx_psession *s = ud;
    if (!up)
        s->fresh[lang] = false;
    if (s->cur)
        call_on_interp(s->cur, lang, up, text);
}

static void on_sess_dead(void *ud, sbx_box *b, const char *why)
{
    (void)b;
    sbx_psession *s = ud;
    /* A call in flight learns it from its own operation; otherwise it is told now. */
    if (!s->cur && !s->sweeping)
        schedule_tell(s, PLM_END_MAIN_PROCESS_ENDED, why);
}

static void on_sess_ready(void *ud, sbx_box *b, const char *err);

static const sbx_box_events session_events = {on_sess_ready, on_sess_interp, on_sess_dead};

/* ---------------------------------------------------------------- sessions: sweep */

static void on_swept(void *ud, bool ok, bool clean, uint32_t killed, uint64_t disk)
{
    sbx_psession *s = ud;
    sbx_provider *p = s->p;
    s->sweeping = false;
    if (killed)
        sbx_log("sandbox %s: the sweep killed %u leftover process%s", sbx_box_id(s->box), killed,
                killed == 1 ? "" : "es");
    if (!ok) {
        schedule_tell(s, PLM_END_MAIN_PROCESS_ENDED, "the sandbox ended");
    } else if (!clean) {
        schedule_tell(s, PLM_END_BOUNDARY_FAILED,
                      "the sweep after the call could not prove every leftover process gone");
    } else if (p->cfg->disk_mb && disk > (uint64_t)p->cfg->disk_mb << 20) {
        char *d = sbx_printf("the session's files use %llu MiB, over the %u MiB budget",
                             (unsigned long long)(disk >> 20), p->cfg->disk_mb);
        schedule_tell(s, PLM_END_DISK_EXCEEDED, d);
        free(d);
    }
    call *next = s->after_sweep;
    if (s->closing) { /* the box is closing: a call that waited for the sweep ran nothing */
        s->after_sweep = NULL;
        if (next) {
            s->cur = next;
            call_finish(next, refusal(next->job->kind, PLM_ABORTED, PLM_REFUSAL_CAPACITY,
                                      sbx_printf("the session ended before the call started; "
                                                 "nothing ran")));
        }
        return;
    }
    s->after_sweep = NULL;
    if (s->pending_end != PLM_END_OPEN) {
        ev_timer_start(p->loop, &s->tell);
        if (next) { /* the session is over: the waiting call runs nothing */
            const char *d = s->pending_detail ? s->pending_detail : "";
            sbx_result *r = sbx_result_new(next->job->kind);
            r->status = SBX_RUN_REFUSED;
            r->error = sbx_err_session(PLM_FAILED_PRECONDITION, s->pending_end, d,
                                       "the session has ended (%s: %s); nothing ran",
                                       plm_session_end_name(s->pending_end), d);
            s->cur = next;
            call_finish(next, r);
        }
        return;
    }
    if (next) {
        s->cur = next;
        call_step(next);
    }
}

static bool p_sweeps_on_hint(const sbx_psession *s)
{
    return s->p->be->sweep_on_hint;
}

static void session_after_call(sbx_psession *s)
{
    if (s->closing) {
        if (s->close_after_call) { /* the close waited for this call */
            s->close_after_call = false;
            continue_close(s);
        }
        return;
    }
    if (s->end_told || !sbx_box_alive(s->box)) {
        if (!s->end_told && !sbx_box_alive(s->box))
            schedule_tell(s, PLM_END_MAIN_PROCESS_ENDED, "the sandbox ended");
        return;
    }
    if (s->pending_end != PLM_END_OPEN) {
        /* The session is over (the call was refused with its end): tell the registry
         * now, before the owner's next request -- a CloseSession must report that
         * end, not "closed" -- and sweep nothing more. */
        ev_timer_start(s->p->loop, &s->tell);
        return;
    }
    if (s->sweeping)
        return; /* a call refused while the last sweep ran: that sweep covers it */
    /* The kernel says this cell started no process: nothing to kill, and only a disk
     * whose budget its file systems' sizes do not hold is measured. */
    if (p_sweeps_on_hint(s) && s->no_sweep && !sbx_box_measures_disk(s->box))
        return;
    s->sweeping = true;
    sbx_box_sweep(s->box, !s->no_sweep, on_swept, s);
}

/* ---------------------------------------------------------------- projects */

enum { P_QUIESCE, P_FILES, P_STEPS, P_ARTIFACTS };

/* Appends a line of the daemon's own to a step's stderr, within the cap. */
static void note_buf(sbx_buf *b, const char *text)
{
    size_t n = strlen(text);
    if (b->len + n > OUTPUT_CAP)
        return;
    b->data = sbx_xrealloc(b->data, b->len + n + 1);
    memcpy(b->data + b->len, text, n);
    b->len += n;
    b->data[b->len] = '\0';
}

/* A step's command as its result states it: at most COMMAND_UNITS UTF-16 units, cut
 * before a character that would not fit whole (the request's text is valid UTF-8). */
static char *command_of(const sbx_bytes *step)
{
    const unsigned char *p = (const unsigned char *)step->data;
    size_t i = 0, units = 0;
    while (i < step->len) {
        size_t len = p[i] < 0x80 ? 1 : p[i] < 0xe0 ? 2 : p[i] < 0xf0 ? 3 : 4;
        size_t u = len == 4 ? 2 : 1;
        if (units + u > COMMAND_UNITS || i + len > step->len)
            break;
        units += u;
        i += len;
    }
    return sbx_xstrndup(step->data, i);
}

static sbx_step_result *add_step(call *c, const sbx_bytes *step)
{
    sbx_result *r = c->proj;
    r->steps = sbx_xrealloc(r->steps, (r->n_steps + 1) * sizeof *r->steps);
    sbx_step_result *st = &r->steps[r->n_steps++];
    memset(st, 0, sizeof *st);
    st->command = command_of(step);
    return st;
}

static void project_op_done(void *ud, sbx_cell_result *cr);

static void project_finish(call *c)
{
    sbx_result *r = c->proj;
    c->proj = NULL;
    call_finish(c, r);
}

static void project_over(call *c, int outcome, char *detail)
{
    c->proj->outcome = outcome;
    free(c->proj->outcome_detail);
    c->proj->outcome_detail = detail;
}

static void project_next(call *c);

/* The artifacts, in order, while the 8 MiB last; one that does not fit ends them. */
static void project_artifact(call *c)
{
    const sbx_job *job = c->job;
    if (c->at >= job->n_artifacts || c->over_budget) {
        project_finish(c);
        return;
    }
    c->op_active = true;
    sbx_box_read(c->box, &job->artifacts[c->at], c->artifact_room, project_op_done, c);
}

static void project_step(call *c)
{
    const sbx_job *job = c->job;
    if (c->at >= job->n_steps) {
        c->stage = P_ARTIFACTS;
        c->at = 0;
        project_artifact(c);
        return;
    }
    const sbx_bytes *step = &job->steps[c->at];
    if (memchr(step->data, '\0', step->len)) { /* no shell can be given it */
        project_over(c, PLM_OUTCOME_SETUP_FAILED,
                     sbx_printf("project.steps[%zu] holds a NUL byte, which no shell command "
                                "can hold", c->at));
        project_finish(c);
        return;
    }
    c->step_running = true;
    c->step_timed_out = false;
    c->step_started = ev_time();
    c->oom_before = c->p->be->oom_kills ? c->p->be->oom_kills(c->p->bk, c->box) : 0;
    ev_timer_set(&c->step_deadline, c->step_timeout_s, 0.);
    ev_timer_start(c->p->loop, &c->step_deadline);
    c->op_active = true;
    sbx_box_step(c->box, step, OUTPUT_CAP, OUTPUT_CAP, project_op_done, c);
}

static void on_step_deadline(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    call *c = w->data;
    if (!c->step_running || c->killing)
        return;
    c->step_timed_out = c->killing = true;
    sbx_box_kill(c->box, SUP_LANG_EXEC);
    ev_timer_set(&c->kill_bound, KILL_BOUND_S, 0.);
    ev_timer_start(c->p->loop, &c->kill_bound);
}

/* The step in hand ended: how, as the reference's runner says it (124 at a deadline;
 * -1 for a shell killed by a signal, with sandboxd's word on why on its stderr). */
static void step_ended(call *c, sbx_cell_result *cr)
{
    sbx_step_result *st = add_step(c, &c->job->steps[c->at]);
    ev_timer_stop(c->p->loop, &c->step_deadline);
    ev_timer_stop(c->p->loop, &c->kill_bound);
    c->step_running = c->killing = false;
    st->out = cr->out;
    st->err = cr->err;
    cr->out.data = cr->err.data = NULL;
    st->out_truncated = cr->out_truncated;
    st->err_truncated = cr->err_truncated;
    st->duration_ms = (int64_t)((ev_time() - c->step_started) * 1000);
    int ws = cr->wait_status;
    bool oom = cr->end == SBX_CELL_EXITED && c->p->be->oom_kills &&
               c->p->be->oom_kills(c->p->bk, c->box) > c->oom_before;
    char how[64];
    sbx_real_describe_wait(ws, how, sizeof how);
    char *line = NULL;
    if (c->step_timed_out || c->over_budget) {
        st->exit_code = 124;
        st->timed_out = true;
    } else if (cr->end == SBX_CELL_EXITED && WIFEXITED(ws)) {
        st->exit_code = WEXITSTATUS(ws);
        if (oom) /* the shell saw its child killed: say why */
            line = sbx_printf("\n[sandboxd: a process of the step was killed: out of memory "
                              "(the sandbox's limit is %u MiB)]\n", c->p->cfg->memory_mb);
    } else {
        st->exit_code = -1;
        line = cr->end != SBX_CELL_EXITED
                   ? sbx_printf("\n[sandboxd: the sandbox ended during the step (%s)]\n",
                                cr->text ? cr->text : "gone")
               : oom ? sbx_printf("\n[sandboxd: the step was %s: out of memory (the sandbox's "
                                  "limit is %u MiB)]\n", how, c->p->cfg->memory_mb)
                     : sbx_printf("\n[sandboxd: the step was %s]\n", how);
    }
    if (line) {
        note_buf(&st->err, line);
        free(line);
    }
}

/* The sandbox ended under the project. */
static void project_gone(call *c, sbx_cell_result *cr)
{
    sbx_kind kind = SBX_KIND_PROJECT;
    if (c->s && c->s->closing) {
        sbx_result *r;
        if (!c->sent) {
            r = refusal(kind, PLM_ABORTED, PLM_REFUSAL_CAPACITY,
                        sbx_printf("the session ended before the project started; nothing ran"));
        } else {
            r = sbx_result_new(kind);
            r->status = SBX_RUN_UNANSWERED;
            r->error = sbx_err_new(PLM_ABORTED, PLM_REFUSAL_NONE,
                                   "the session ended while the project ran; it may have run");
        }
        call_finish(c, r);
        return;
    }
    const char *why = cr && cr->text ? cr->text : "gone";
    if (!c->sent) {
        if (c->s && !c->s->end_told) {
            c->s->pending_end = PLM_END_MAIN_PROCESS_ENDED;
            free(c->s->pending_detail);
            c->s->pending_detail = sbx_xstrdup(why);
        }
        call_finish(c, refusal(kind, PLM_UNAVAILABLE, PLM_REFUSAL_ENVIRONMENT,
                               sbx_printf("the sandbox ended before the project started (%s); "
                                          "nothing ran", why)));
        return;
    }
    if (c->step_running)
        step_ended(c, cr);
    project_over(c, PLM_OUTCOME_PROTOCOL_ERROR,
                 sbx_printf("the sandbox ended during the run (%s)", why));
    if (c->s) {
        c->proj->ended = PLM_END_MAIN_PROCESS_ENDED;
        c->proj->end_detail = sbx_xstrdup(why);
        c->s->end_told = true;
    }
    project_finish(c);
}

/* A step killed at its deadline could not be proven gone (on_kill_bound). */
static sbx_result *project_killed_result(call *c)
{
    sbx_cell_result cr;
    memset(&cr, 0, sizeof cr);
    cr.end = SBX_CELL_EXITED;
    cr.wait_status = SIGKILL;
    if (c->op_active) /* the output so far stays with the box's operation: none is kept */
        sbx_box_cancel(c->box, SUP_LANG_EXEC);
    c->op_active = false;
    if (c->step_running)
        step_ended(c, &cr);
    project_over(c, PLM_OUTCOME_TIMED_OUT,
                 sbx_xstrdup("a step killed at its deadline could not be proven gone"));
    sbx_result *r = c->proj;
    c->proj = NULL;
    return r;
}

static void project_op_done(void *ud, sbx_cell_result *cr)
{
    call *c = ud;
    c->op_active = false;
    switch (cr->end) {
    case SBX_CELL_SANDBOX_GONE:
    case SBX_CELL_NOT_RUN:
    case SBX_CELL_NO_NONCE:
        project_gone(c, cr);
        break;
    case SBX_CELL_FILES_FAILED: /* as the reference's runner: no step runs, no artifacts */
        project_over(c, PLM_OUTCOME_SETUP_FAILED,
                     sbx_printf("project.files[%u] could not be written into the work directory "
                                "(%s)", cr->file_index, cr->errcode));
        project_finish(c);
        break;
    case SBX_CELL_WRITTEN:
        c->stage = P_STEPS;
        c->at = 0;
        project_next(c);
        break;
    case SBX_CELL_EXITED: {
        step_ended(c, cr);
        const sbx_step_result *st = &c->proj->steps[c->proj->n_steps - 1];
        if (c->over_budget) {
            project_over(c, PLM_OUTCOME_TIMED_OUT, sbx_xstrdup("run exceeded the time budget"));
            project_finish(c);
            break;
        }
        if (st->timed_out)
            project_over(c, PLM_OUTCOME_TIMED_OUT,
                         sbx_printf("step %zu exceeded its time budget", c->at + 1));
        if (st->timed_out || st->exit_code != 0) { /* the chain stops; artifacts still come */
            c->stage = P_ARTIFACTS;
            c->at = 0;
        } else {
            c->at++;
        }
        project_next(c);
        break;
    }
    case SBX_CELL_READ: {
        sbx_result *r = c->proj;
        if (cr->read_status == SUP_READ_OK && cr->out.len <= c->artifact_room) {
            r->artifacts = sbx_xrealloc(r->artifacts, (r->n_artifacts + 1) * sizeof *r->artifacts);
            sbx_artifact *a = &r->artifacts[r->n_artifacts++];
            a->path = sbx_xstrndup(c->job->artifacts[c->at].data, c->job->artifacts[c->at].len);
            a->content = cr->out;
            cr->out.data = NULL;
            c->artifact_room -= (uint32_t)a->content.len;
            c->at++;
        } else if (cr->read_status == SUP_READ_SKIPPED) {
            c->at++;
        } else { /* over what is left: the rest are not read */
            r->artifacts_truncated = true;
            c->at = c->job->n_artifacts;
        }
        if (c->over_budget)
            project_over(c, PLM_OUTCOME_TIMED_OUT, sbx_xstrdup("run exceeded the time budget"));
        project_next(c);
        break;
    }
    default: /* RAN, RAISED, DIED: not a project's */
        project_gone(c, cr);
        break;
    }
    free(cr->out.data);
    free(cr->err.data);
    free(cr->text);
}

static void project_next(call *c)
{
    if (c->over_budget && c->stage != P_ARTIFACTS) {
        project_over(c, PLM_OUTCOME_TIMED_OUT, sbx_xstrdup("run exceeded the time budget"));
        project_finish(c);
        return;
    }
    if (c->stage == P_STEPS)
        project_step(c);
    else
        project_artifact(c);
}

static void project_files(call *c)
{
    c->sent = true; /* from here on the project may have run */
    c->stage = P_FILES;
    c->op_active = true;
    sbx_box_files(c->box, c->job->files, c->job->n_files, project_op_done, c);
}

/* Before a project in a session every process of it goes, the interpreters too (as
 * plimsolld's quiesce): the next cell of each language starts a fresh one. */
static void on_quiesced(void *ud, bool ok, bool clean, uint32_t killed, uint64_t disk)
{
    sbx_psession *s = ud;
    s->fresh[SUP_LANG_JS] = s->fresh[SUP_LANG_PY] = false;
    call *c = s->cur;
    if (s->closing || !c || !c->quiescing) { /* the call was answered meanwhile (its
                                                deadline): an ordinary sweep's end */
        on_swept(ud, ok, clean, killed, disk);
        return;
    }
    s->sweeping = false;
    c->quiescing = false;
    if (killed)
        sbx_log("sandbox %s: %u process%s killed before a project", sbx_box_id(s->box), killed,
                killed == 1 ? "" : "es");
    if (!ok) {
        project_gone(c, NULL);
        return;
    }
    if (!clean) {
        schedule_tell(s, PLM_END_BOUNDARY_FAILED,
                      "the processes of the session could not be proven gone before a project");
        call_finish(c, refusal(SBX_KIND_PROJECT, PLM_UNAVAILABLE, PLM_REFUSAL_ENVIRONMENT,
                               sbx_printf("the session's processes could not be proven gone "
                                          "before the project; nothing ran")));
        return;
    }
    project_files(c);
}

static void project_begin(call *c)
{
    c->proj = sbx_result_new(SBX_KIND_PROJECT);
    c->proj->outcome = PLM_OUTCOME_COMPLETED;
    c->artifact_room = ARTIFACTS_CAP;
    if (c->s) {
        c->stage = P_QUIESCE;
        c->quiescing = c->s->sweeping = true;
        sbx_box_quiesce(c->box, on_quiesced, c->s);
        return;
    }
    project_files(c);
}

/* ---------------------------------------------------------------- sessions: open */

static sbx_psession *session_new(sbx_provider *p, const sbx_open_params *params)
{
    sbx_psession *s = sbx_xcalloc(1, sizeof *s);
    s->p = p;
    s->on_ended = params->on_ended;
    s->on_ended_ud = params->on_ended_ud;
    s->pending_end = PLM_END_OPEN;
    ev_timer_init(&s->tell, on_tell, 0., 0.);
    ev_timer_init(&s->open_later, NULL, 0., 0.);
    s->tell.data = s->open_later.data = s;
    s->next = p->sessions;
    if (p->sessions)
        p->sessions->prev = s;
    p->sessions = s;
    return s;
}

static void session_unlink(sbx_psession *s)
{
    sbx_provider *p = s->p;
    if (s->prev)
        s->prev->next = s->next;
    else if (p->sessions == s)
        p->sessions = s->next;
    if (s->next)
        s->next->prev = s->prev;
    s->prev = s->next = NULL;
}

static void session_free(sbx_psession *s)
{
    ev_timer_stop(s->p->loop, &s->tell);
    ev_timer_stop(s->p->loop, &s->open_later);
    session_unlink(s);
    free(s->pending_detail);
    free(s);
}

static void on_open_box_closed(void *ud)
{
    session_free(ud);
}

static void on_sess_ready(void *ud, sbx_box *b, const char *err)
{
    sbx_psession *s = ud;
    sbx_provider *p = s->p;
    if (!s->opening)
        return;
    s->opening = false;
    sbx_open_cb cb = s->open_cb;
    void *cb_ud = s->open_ud;
    if (err) {
        sbx_err *e = sbx_err_new(PLM_UNAVAILABLE, PLM_REFUSAL_ENVIRONMENT,
                                 "the sandbox could not be started (%s); no session was opened",
                                 err);
        s->closing = true;
        sbx_box_close(b, on_open_box_closed, s);
        cb(cb_ud, e, NULL, NULL, NULL);
        return;
    }
    for (int l = 1; l <= 2; l++) /* warm what the open hinted */
        if (s->fresh[l] && (p->langs & sbx_real_lang_bit(l)))
            sbx_box_start(b, l);
    cb(cb_ud, NULL, s, p->be->tier, p->facts.session.software_identity);
}

static void on_open_later(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    sbx_psession *s = w->data;
    s->opening = false;
    s->open_cb(s->open_ud, NULL, s, s->p->be->tier, s->p->facts.session.software_identity);
}

/* A warm member for a new session, or NULL. */
static member *pool_take(sbx_provider *p)
{
    member *best = NULL;
    for (member *m = p->members; m; m = m->next) {
        if (!m->ready || !sbx_box_ready(m->box))
            continue;
        bool warm = (m->up & p->langs) == p->langs;
        bool best_warm = best && (best->up & p->langs) == p->langs;
        if (!best || (warm && !best_warm) || (warm == best_warm && m->born < best->born))
            best = m;
    }
    if (!best)
        return NULL;
    if (best->prev)
        best->prev->next = best->next;
    else
        p->members = best->next;
    if (best->next)
        best->next->prev = best->prev;
    p->n_members--;
    return best;
}

void sbx_real_session_open(sbx_provider *p, const sbx_open_params *params, sbx_open_cb cb,
                           void *ud)
{
    sbx_psession *s = session_new(p, params);
    s->opening = true;
    s->open_cb = cb;
    s->open_ud = ud;
    member *m = p->serving ? pool_take(p) : NULL;
    if (m) {
        s->box = m->box;
        sbx_box_set_events(s->box, &session_events, s);
        for (int l = 1; l <= 2; l++) {
            sbx_interp_state st = sbx_box_interp(s->box, l);
            s->fresh[l] = st == SBX_I_IDLE || st == SBX_I_STARTING;
        }
        free(m);
        sbx_box_wake(s->box); /* idle in the pool: it wakes while the answer travels */
        ev_set_cb(&s->open_later, on_open_later);
        ev_timer_start(p->loop, &s->open_later); /* answered from the loop */
        pool_refill_soon(p);
        return;
    }
    for (int l = 1; l <= 2; l++) /* the hint: started once the sandbox is up */
        s->fresh[l] = (params->languages & sbx_real_lang_bit(l)) != 0;
    s->box = sbx_real_new_box(p, &session_events, s);
    pool_refill_soon(p);
}

/* ---------------------------------------------------------------- sessions: calls */

void sbx_real_session_run(sbx_psession *s, const sbx_job *job, sbx_run_cb cb, void *ud)
{
    sbx_provider *p = s->p;
    if (job->kind == SBX_KIND_MODULE) {
        call *c = call_new(p, s, s->box, job, cb, ud);
        s->cur = c;
        call_finish_later(c, refusal(job->kind, PLM_UNIMPLEMENTED, PLM_REFUSAL_UNSUPPORTED,
                                     sbx_printf("the %s provider runs no module payloads; "
                                                "nothing ran", p->be->name)));
        return;
    }
    call *c = call_new(p, s, s->box, job, cb, ud);
    s->no_sweep = false;
    ev_timer_start(p->loop, &c->deadline);
    if (s->sweeping) { /* the previous call's sweep finishes first */
        s->after_sweep = c;
        return;
    }
    s->cur = c;
    if (s->pending_end != PLM_END_OPEN) { /* found between calls, not told yet */
        const char *d = s->pending_detail ? s->pending_detail : "";
        sbx_result *r = sbx_result_new(job->kind);
        r->status = SBX_RUN_REFUSED;
        r->error = sbx_err_session(PLM_FAILED_PRECONDITION, s->pending_end, d,
                                   "the session has ended (%s: %s); nothing ran",
                                   plm_session_end_name(s->pending_end), d);
        call_finish_later(c, r);
        return;
    }
    if (s->suspended) { /* thawed first */
        thaw_then_step(c);
        return;
    }
    call_step(c);
}

static void on_thawed(void *ud, bool ok)
{
    call *c = ud;
    sbx_psession *s = c->s;
    s->suspended = false;
    c->thawing = false;
    if (!ok) {
        sbx_result *r = refusal(c->job->kind, PLM_UNAVAILABLE, PLM_REFUSAL_ENVIRONMENT,
                                sbx_printf("the suspended sandbox could not be resumed; nothing ran"));
        schedule_tell(s, PLM_END_BOUNDARY_FAILED, "the sandbox could not be thawed");
        call_finish(c, r);
        return;
    }
    if (c->timed_out) { /* its deadline passed during the thaw */
        call_finish(c, deadline_refusal(c));
        return;
    }
    call_step(c);
}

static void thaw_then_step(call *c)
{
    c->thawing = true;
    sbx_box_freeze(c->box, false, on_thawed, c);
}

typedef struct suspend_op {
    sbx_psession *s;
    sbx_done_cb cb;
    void *ud;
    ev_timer later;
} suspend_op;

static void on_suspend_later(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    suspend_op *op = w->data;
    sbx_done_cb cb = op->cb;
    void *ud = op->ud;
    free(op);
    cb(ud);
}

static void on_frozen(void *ud, bool ok)
{
    suspend_op *op = ud;
    op->s->suspended = ok;
    if (ok)
        sbx_log("sandbox %s suspended (idle): frozen with its interpreters", sbx_box_id(op->s->box));
    else
        sbx_log("sandbox %s could not be suspended; retried after another idle period",
                sbx_box_id(op->s->box));
    sbx_done_cb cb = op->cb;
    void *cb_ud = op->ud;
    free(op);
    cb(cb_ud);
}

void sbx_real_session_suspend(sbx_psession *s, sbx_done_cb cb, void *ud)
{
    suspend_op *op = sbx_xcalloc(1, sizeof *op);
    op->s = s;
    op->cb = cb;
    op->ud = ud;
    if (s->suspended || s->sweeping || s->cur || !sbx_box_ready(s->box)) {
        ev_timer_init(&op->later, on_suspend_later, 0., 0.);
        op->later.data = op;
        ev_timer_start(s->p->loop, &op->later);
        return;
    }
    sbx_box_freeze(s->box, true, on_frozen, op);
}

/* ---------------------------------------------------------------- sessions: close */

static void on_session_box_closed(void *ud)
{
    sbx_psession *s = ud;
    sbx_done_cb cb = s->close_cb;
    void *cb_ud = s->close_ud;
    session_free(s);
    cb(cb_ud);
}

static void close_now(sbx_psession *s)
{
    /* A call or a sweep in flight completes first (the box fails them), then the box's
     * close callback ends the session. */
    sbx_box_close(s->box, on_session_box_closed, s);
}

static void on_close_thawed(void *ud, bool ok)
{
    (void)ok;
    sbx_psession *s = ud;
    s->suspended = false;
    close_now(s);
}

static void continue_close(sbx_psession *s)
{
    if (s->suspended) /* frozen processes do not die: thaw, then close */
        sbx_box_freeze(s->box, false, on_close_thawed, s);
    else
        close_now(s);
}

void sbx_real_session_close(sbx_psession *s, plm_session_end why, sbx_done_cb cb, void *ud)
{
    (void)why;
    s->closing = true;
    s->close_cb = cb;
    s->close_ud = ud;
    ev_timer_stop(s->p->loop, &s->tell);
    call *c = s->cur;
    if (c && !c->op_active) {
        /* Waiting for an interpreter or a thaw, or answered already: it runs nothing
         * now, and the close follows its answer. */
        s->close_after_call = true;
        if (!c->thawing && !c->pending) {
            c->waiting_interp = false;
            call_finish_later(c, refusal(c->job->kind, PLM_ABORTED, PLM_REFUSAL_CAPACITY,
                                         sbx_printf("the session ended before the code was "
                                                    "sent; nothing ran")));
        }
        return;
    }
    continue_close(s);
}

/* ---------------------------------------------------------------- single runs */

static void on_single_interp(void *ud, sbx_box *b, int lang, bool up, const char *text)
{
    (void)ud;
    (void)b;
    (void)lang;
    (void)up;
    (void)text;
}

static void on_single_dead(void *ud, sbx_box *b, const char *why)
{
    (void)ud;
    (void)b;
    (void)why; /* the snippet's own operation reports it */
}

static void on_single_ready(void *ud, sbx_box *b, const char *err)
{
    call *c = ud;
    (void)b;
    if (err) {
        call_finish(c, refusal(c->job->kind, PLM_UNAVAILABLE, PLM_REFUSAL_ENVIRONMENT,
                               sbx_printf("the sandbox could not be started (%s); nothing ran", err)));
        return;
    }
    ev_timer_set(&c->deadline, c->timeout_s, 0.);
    ev_timer_start(c->p->loop, &c->deadline);
    call_step(c);
}

static const sbx_box_events single_events = {on_single_ready, on_single_interp, on_single_dead};

void sbx_real_run(sbx_provider *p, const sbx_job *job, sbx_run_cb cb, void *ud)
{
    call *c = call_new(p, NULL, NULL, job, cb, ud);
    c->next = p->runs;
    if (p->runs)
        p->runs->prev = c;
    p->runs = c;
    if (job->kind == SBX_KIND_MODULE) {
        call_finish_later(c, refusal(job->kind, PLM_UNIMPLEMENTED, PLM_REFUSAL_UNSUPPORTED,
                                     sbx_printf("the %s provider runs no module payloads; "
                                                "nothing ran", p->be->name)));
        return;
    }
    c->box = sbx_real_new_box(p, &single_events, c);
}

/* ---------------------------------------------------------------- the pool */

static void member_unlink(member *m)
{
    sbx_provider *p = m->p;
    if (m->prev)
        m->prev->next = m->next;
    else if (p->members == m)
        p->members = m->next;
    if (m->next)
        m->next->prev = m->prev;
    m->prev = m->next = NULL;
    p->n_members--;
}

static void member_drop(member *m, const char *why)
{
    sbx_provider *p = m->p;
    if (why)
        sbx_log("warm pool: sandbox %s dropped (%s)", sbx_box_id(m->box), why);
    if (!m->ready)
        p->launching--;
    member_unlink(m);
    sbx_box_close(m->box, on_box_closed_free, NULL);
    free(m);
    sbx_real_stack_start_if_due(p);
}

static void on_member_ready(void *ud, sbx_box *b, const char *err)
{
    member *m = ud;
    sbx_provider *p = m->p;
    if (err) {
        member_drop(m, err);
        pool_retry_later(p); /* not in a tight loop */
        return;
    }
    m->ready = true;
    p->launching--;
    for (int l = 1; l <= 2; l++)
        if (p->langs & sbx_real_lang_bit(l))
            sbx_box_start(b, l);
    sbx_real_pool_fill(p);
}

static void on_member_interp(void *ud, sbx_box *b, int lang, bool up, const char *text)
{
    (void)b;
    member *m = ud;
    if (up) {
        m->up |= sbx_real_lang_bit(lang);
        if ((m->up & m->p->langs) == m->p->langs) {
            sbx_log("warm pool: sandbox %s is ready", sbx_box_id(b));
            sbx_real_stack_start_if_due(m->p);
        }
        return;
    }
    sbx_provider *p = m->p;
    char *why = sbx_printf("its %s interpreter ended: %s", sbx_real_lang_word(lang), text);
    member_drop(m, why);
    free(why);
    pool_retry_later(p);
}

static void on_member_dead(void *ud, sbx_box *b, const char *why)
{
    (void)b;
    member *m = ud;
    sbx_provider *p = m->p;
    member_drop(m, why);
    pool_retry_later(p);
}

static const sbx_box_events member_events = {on_member_ready, on_member_interp, on_member_dead};

void sbx_real_pool_fill(sbx_provider *p)
{
    if (!p->serving || ev_is_active(&p->pool_retry))
        return;
    while (p->n_members < (int)p->cfg->pool && p->launching < POOL_MAX_LAUNCHING) {
        member *m = sbx_xcalloc(1, sizeof *m);
        m->p = p;
        m->born = ev_now(p->loop);
        m->next = p->members;
        if (p->members)
            p->members->prev = m;
        p->members = m;
        p->n_members++;
        p->launching++;
        m->box = sbx_real_new_box(p, &member_events, m);
    }
}

/* A claim's replacement starts a little later: starting interpreters takes the CPU the
 * new session's first cell wants (two cores here). */
static void pool_refill_soon(sbx_provider *p)
{
    if (ev_is_active(&p->pool_retry) || ev_is_active(&p->pool_soon))
        return;
    /* Set again each time: a stopped libev timer restarts with its remaining time. */
    ev_timer_set(&p->pool_soon, POOL_REFILL_DELAY_S, 0.);
    ev_timer_start(p->loop, &p->pool_soon);
}

static void pool_retry_later(sbx_provider *p)
{
    if (ev_is_active(&p->pool_retry))
        return;
    ev_timer_set(&p->pool_retry, POOL_RETRY_S, 0.);
    ev_timer_start(p->loop, &p->pool_retry);
}

static void on_pool_retry(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    sbx_real_pool_fill(w->data);
}

static void on_pool_check(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)revents;
    sbx_provider *p = w->data;
    for (member *m = p->members, *next; m; m = next) {
        next = m->next;
        if (m->ready && ev_now(loop) - m->born > MEMBER_MAX_AGE_S)
            member_drop(m, "it waited 30 minutes");
    }
    sbx_real_pool_fill(p);
}

/* ---------------------------------------------------------------- what backends share */

int sbx_real_base_init(sbx_real_base *base, struct ev_loop *loop, const sbx_config *cfg,
                       const char *name, void (*reap)(const char *stale_dir, void *ud),
                       void *reap_ud, const char *without_cgroups, char **why)
{
    base->loop = loop;
    base->cfg = cfg;
    base->uids.lock_fd = -1;
    if (sbx_state_init(&base->st, cfg, name, reap, reap_ud, why) != 0)
        return -1;
    if (base->st.root && sbx_uids_init(&base->uids, (uid_t)cfg->sandbox_uid, sbx_uids_count(cfg),
                                       sbx_uids_need(cfg), why) != 0) {
        sbx_state_fini(&base->st);
        return -1;
    }
    char *cgwhy = NULL;
    base->cgroups = sbx_cgroup_init(&cgwhy);
    if (!base->cgroups) {
        sbx_log("%s provider: no cgroups (%s); %s", name, cgwhy, without_cgroups);
        free(cgwhy);
    }
    return 0;
}

void sbx_real_base_fini(sbx_real_base *base)
{
    sbx_state_fini(&base->st);
    sbx_uids_fini(&base->uids);
    if (base->cgroups)
        sbx_cgroup_fini();
}

bool sbx_real_interps_ok(const sbx_config *cfg, bool present, bool under_usr, char **why)
{
    if (present && !sbx_executable(cfg->python_path) && !sbx_executable(cfg->node_path)) {
        *why = sbx_printf("neither %s nor %s is there", cfg->python_path, cfg->node_path);
        return false;
    }
    if (under_usr &&
        (strncmp(cfg->python_path, "/usr/", 5) != 0 || strncmp(cfg->node_path, "/usr/", 5) != 0)) {
        *why = sbx_xstrdup("the interpreters must live under /usr (the only tree the sandbox sees)");
        return false;
    }
    return true;
}

/* ---------------------------------------------------------------- the provider */

sbx_provider *sbx_real_create(struct ev_loop *loop, const sbx_config *cfg,
                              const sbx_real_backend *be, char **why)
{
    sbx_backend *bk = be->create(loop, cfg, why);
    if (!bk)
        return NULL;
    sbx_provider *p = sbx_xcalloc(1, sizeof *p);
    p->loop = loop;
    p->cfg = cfg;
    p->be = be;
    p->bk = bk;
    struct utsname u;
    if (uname(&u) == 0)
        snprintf(p->host_release, sizeof p->host_release, "%s", u.release);
    ev_timer_init(&p->pool_check, on_pool_check, POOL_CHECK_S, POOL_CHECK_S);
    ev_timer_init(&p->pool_retry, on_pool_retry, POOL_RETRY_S, 0.);
    ev_timer_init(&p->pool_soon, on_pool_retry, POOL_REFILL_DELAY_S, 0.);
    p->pool_check.data = p->pool_retry.data = p->pool_soon.data = p;
    sbx_real_checks_init(p);
    sbx_facts *f = &p->facts;
    f->name = be->name;
    f->tier = be->tier;
    f->policy = "";
    f->supports_javascript = true;
    f->supports_sessions = cfg->max_sessions > 0;
    f->javascript = (sbx_env_facts){"", "", cfg->snippet_timeout_max_ms, SBX_LANG_JAVASCRIPT};
    f->project = (sbx_env_facts){"", "", cfg->cell_timeout_max_ms, 0};
    f->module = (sbx_env_facts){"", "", 0, 0};
    f->session = (sbx_env_facts){"", "", cfg->cell_timeout_max_ms,
                                 SBX_LANG_JAVASCRIPT | SBX_LANG_PYTHON};
    f->memory_mb = cfg->memory_mb;
    f->pids = cfg->pids;
    f->disk_mb = cfg->work_mb;
    f->cpus = cfg->cpus;
    return p;
}

void sbx_real_destroy(sbx_provider *p)
{
    ev_timer_stop(p->loop, &p->pool_check);
    ev_timer_stop(p->loop, &p->pool_retry);
    ev_timer_stop(p->loop, &p->pool_soon);
    sbx_real_checks_destroy(p);
    /* Normally only the pool is left; after a forced stop, everything goes now. */
    while (p->members) {
        member *m = p->members;
        member_unlink(m);
        sbx_box_destroy_sync(m->box);
        free(m);
    }
    while (p->sessions) {
        sbx_psession *s = p->sessions;
        if (s->cur)
            call_free(s->cur);
        if (s->after_sweep)
            call_free(s->after_sweep);
        sbx_box_destroy_sync(s->box);
        session_free(s);
    }
    while (p->runs) {
        call *c = p->runs;
        p->runs = c->next;
        if (c->box)
            sbx_box_destroy_sync(c->box);
        call_free(c);
    }
    if (p->smoke) {
        sbx_box_destroy_sync(p->smoke->box);
        ev_timer_stop(p->loop, &p->smoke->bound);
        free(p->smoke->why);
        free(p->smoke);
    }
    p->be->destroy(p->bk);
    free(p);
}

const sbx_facts *sbx_real_facts(const sbx_provider *p)
{
    return &p->facts;
}

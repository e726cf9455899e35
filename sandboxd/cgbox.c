/*
 * cgbox.c — see cgbox.h.
 */
#include "cgbox.h"

#include "log.h"
#include "proc.h"
#include "realprov.h"
#include "sbxstate.h"
#include "util.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CLEANUP_TRIES 300
#define CLEANUP_RETRY_S 0.01      /* 300 x 10 ms: killed tasks have 3 s to go */

/* The backend's struct sbx_backend begins with its sbx_real_base (cgbox.h). */
static const sbx_real_base *base_of(sbx_backend *bk)
{
    return (const sbx_real_base *)bk;
}

/* Attaches a new record to the box. */
static sbx_cgbox *cgbox_new(struct ev_loop *loop, sbx_box *b)
{
    sbx_cgbox *c = sbx_xcalloc(1, sizeof *c);
    c->loop = loop;
    c->box = b;
    sbx_box_set_backend_data(b, c);
    return c;
}

void sbx_cgbox_box_config(sbx_backend *bk, sbx_box_config *bc)
{
    const sbx_real_base *base = base_of(bk);
    if (base->st.root) {
        bc->uid = base->st.uid;
        bc->gid = base->st.gid;
    }
    if (!base->cgroups) { /* no group: the kernel's per-process limits instead */
        bc->nproc = base->cfg->pids;
        bc->as_mb = base->cfg->memory_mb;
    }
}

typedef struct launch_ctx {
    sbx_cgbox *c;
    const sbx_state *st;
} launch_ctx;

/* In the forked child: joins the box's cgroup, then drops to the sandbox uid. */
static int launch_preexec(void *ud)
{
    launch_ctx *l = ud;
    int e = l->c->has_cg ? sbx_cgroup_enter(&l->c->cg) : 0;
    return e ? e : sbx_state_drop_privileges(l->st);
}

pid_t sbx_cgbox_launch(sbx_backend *bk, sbx_box *b, const char *const *argv, const char *work,
                       int in, int out, int err, char **why)
{
    const sbx_real_base *base = base_of(bk);
    sbx_cgbox *c = cgbox_new(base->loop, b);
    if (work)
        c->work = sbx_xstrdup(work);
    if (base->cgroups) {
        sbx_cglimits lim = {(uint64_t)base->cfg->memory_mb << 20, base->cfg->pids,
                            base->cfg->cpus};
        if (sbx_cgroup_create(&c->cg, sbx_box_id(b), &lim, why) != 0)
            return -1;
        c->has_cg = true;
    }
    static const char *const env[] = {"PATH=/usr/local/bin:/usr/bin:/bin", NULL};
    launch_ctx l = {c, &base->st};
    sbx_spawn sp = {.argv = argv, .envp = env, .fd0 = in, .fd1 = out, .fd2 = err,
                    .new_session = true, .die_with_parent = true, .preexec = launch_preexec,
                    .preexec_ud = &l};
    c->pid = sbx_spawn_process(&sp);
    if (c->pid < 0)
        *why = sbx_printf("fork: %s", strerror(errno));
    return c->pid;
}

typedef struct freeze_ctx {
    sbx_box *b;
    bool ok;
    void (*cb)(sbx_box *b, bool ok);
} freeze_ctx;

static void freeze_done(void *arg)
{
    freeze_ctx *f = arg;
    f->cb(f->b, f->ok);
    free(f);
}

void sbx_cgbox_freeze(sbx_backend *bk, sbx_box *b, bool frozen, void (*cb)(sbx_box *b, bool ok))
{
    sbx_cgbox *c = sbx_box_backend_data(b);
    freeze_ctx *f = sbx_xcalloc(1, sizeof *f);
    f->b = b;
    f->cb = cb;
    if (c && c->has_cg)
        f->ok = sbx_cgroup_freeze(&c->cg, frozen) == 0;
    else
        f->ok = !frozen; /* nothing to freeze with; a thaw has nothing to do */
    sbx_defer(base_of(bk)->loop, freeze_done, f);
}

void sbx_cgbox_force_kill(sbx_backend *bk, sbx_box *b)
{
    sbx_cgbox *c = sbx_box_backend_data(b);
    if (!c)
        return;
    if (c->has_cg) {
        sbx_cgroup_freeze(&c->cg, false); /* frozen tasks do not die */
        sbx_cgroup_tasks(&c->cg, true);
    }
    if (c->pid > 0)
        kill(c->pid, SIGKILL);
}

static void cgbox_free(sbx_cgbox *c)
{
    if (c->work) {
        sbx_remove_tree(c->work);
        free(c->work);
    }
    free(c);
}

static void cleanup_step(void *arg);

static void on_retry(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    cleanup_step(w->data);
}

/* Until the group holds no task: bounded retries, 10 ms apart. */
static void cleanup_step(void *arg)
{
    sbx_cgbox *c = arg;
    if (c->has_cg) {
        sbx_cgroup_freeze(&c->cg, false);
        sbx_cgroup_tasks(&c->cg, true);
        if (sbx_cgroup_remove(&c->cg) != 0) {
            if (++c->tries < CLEANUP_TRIES) {
                ev_timer_init(&c->retry, on_retry, CLEANUP_RETRY_S, 0.);
                c->retry.data = c;
                ev_timer_start(c->loop, &c->retry);
                return;
            }
            sbx_log("sandbox %s: its cgroup would not go", sbx_box_id(c->box));
            sbx_cgroup_forget(&c->cg);
        }
    }
    sbx_box *b = c->box;
    void (*cb)(sbx_box *) = c->cleaned;
    sbx_box_set_backend_data(b, NULL);
    cgbox_free(c);
    cb(b);
}

void sbx_cgbox_cleanup(sbx_backend *bk, sbx_box *b, void (*cb)(sbx_box *b))
{
    struct ev_loop *loop = base_of(bk)->loop;
    sbx_cgbox *c = sbx_box_backend_data(b);
    if (!c) /* never launched: nothing on the host */
        c = cgbox_new(loop, b);
    c->cleaned = cb;
    sbx_defer(loop, cleanup_step, c);
}

void sbx_cgbox_cleanup_sync(sbx_backend *bk, sbx_box *b)
{
    sbx_cgbox *c = sbx_box_backend_data(b);
    if (!c)
        return;
    if (c->has_cg) {
        for (int i = 0; i < CLEANUP_TRIES; i++) {
            sbx_cgroup_freeze(&c->cg, false);
            sbx_cgroup_tasks(&c->cg, true);
            if (sbx_cgroup_remove(&c->cg) == 0)
                break;
            usleep((useconds_t)(CLEANUP_RETRY_S * 1e6)); /* bounded: killed tasks go */
        }
        sbx_cgroup_forget(&c->cg);
    }
    sbx_box_set_backend_data(b, NULL);
    cgbox_free(c);
}

uint64_t sbx_cgbox_oom_kills(sbx_backend *bk, sbx_box *b)
{
    sbx_cgbox *c = sbx_box_backend_data(b);
    return c && c->has_cg ? sbx_cgroup_oom_kills(&c->cg) : 0;
}

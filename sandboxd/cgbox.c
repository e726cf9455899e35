/*
 * cgbox.c — see cgbox.h.
 */
#include "cgbox.h"

#include "log.h"
#include "sbxstate.h"
#include "util.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#define CLEANUP_TRIES 300
#define CLEANUP_RETRY_S 0.01      /* 300 x 10 ms: killed tasks have 3 s to go */

sbx_cgbox *sbx_cgbox_new(struct ev_loop *loop, sbx_box *b)
{
    sbx_cgbox *c = sbx_xcalloc(1, sizeof *c);
    c->loop = loop;
    c->box = b;
    sbx_box_set_backend_data(b, c);
    return c;
}

int sbx_cgbox_enter(const sbx_cgbox *c)
{
    return c->has_cg ? sbx_cgroup_enter(&c->cg) : 0;
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

void sbx_cgbox_freeze(struct ev_loop *loop, sbx_box *b, bool frozen,
                      void (*cb)(sbx_box *b, bool ok))
{
    sbx_cgbox *c = sbx_box_backend_data(b);
    freeze_ctx *f = sbx_xcalloc(1, sizeof *f);
    f->b = b;
    f->cb = cb;
    if (c && c->has_cg)
        f->ok = sbx_cgroup_freeze(&c->cg, frozen) == 0;
    else
        f->ok = !frozen; /* nothing to freeze with; a thaw has nothing to do */
    sbx_defer(loop, freeze_done, f);
}

void sbx_cgbox_force_kill(sbx_box *b)
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

void sbx_cgbox_cleanup(struct ev_loop *loop, sbx_box *b, void (*cb)(sbx_box *b))
{
    sbx_cgbox *c = sbx_box_backend_data(b);
    if (!c) /* never launched: nothing on the host */
        c = sbx_cgbox_new(loop, b);
    c->cleaned = cb;
    sbx_defer(loop, cleanup_step, c);
}

void sbx_cgbox_cleanup_sync(sbx_box *b)
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

uint64_t sbx_cgbox_oom_kills(sbx_box *b)
{
    sbx_cgbox *c = sbx_box_backend_data(b);
    return c && c->has_cg ? sbx_cgroup_oom_kills(&c->cg) : 0;
}

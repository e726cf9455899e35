/*
 * host_box.c — see host_box.h.
 */
#include "host_box.h"

#include "log.h"
#include "proc.h"
#include "real_provider.h"
#include "state_dir.h"
#include "util.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define CLEANUP_TRIES 300
#define CLEANUP_RETRY_S 0.01      /* 300 x 10 ms: killed tasks have 3 s to go */

/* The backend's struct sbx_backend begins with its sbx_real_base (host_box.h). */
static sbx_real_base *base_of(sbx_backend *bk)
{
    return (sbx_real_base *)bk;
}

/* Attaches a new record to the box. */
static sbx_host_box *host_box_new(sbx_real_base *base, sbx_box *b)
{
    sbx_host_box *c = sbx_xcalloc(1, sizeof *c);
    c->base = base;
    c->loop = base->loop;
    c->box = b;
    sbx_box_set_backend_data(b, c);
    return c;
}

void sbx_host_box_box_config(sbx_backend *bk, sbx_box_config *bc)
{
    sbx_real_base *base = base_of(bk);
    if (base->st.root) { /* a uid of its own; none free: the launch fails */
        uid_t uid = sbx_uids_take(&base->uids, bc->id);
        bc->uid = uid;
        bc->gid = (gid_t)uid;
    }
    if (!base->cgroups) { /* no group: the kernel's per-process limits instead */
        bc->nproc = base->cfg->pids;
        bc->as_mb = base->cfg->memory_mb + SBX_ADDRESS_SPACE_HEADROOM_MB;
    }
}

uid_t sbx_host_box_uid(sbx_backend *bk, sbx_box *b, char **why)
{
    sbx_real_base *base = base_of(bk);
    if (!base->st.root)
        return base->st.uid;
    uid_t uid = sbx_uids_of(&base->uids, sbx_box_id(b));
    if (uid == (uid_t)-1)
        *why = sbx_printf("every uid of --uid-range (%u from %u) is in use by a sandbox",
                          base->uids.count, (unsigned)base->uids.first);
    return uid;
}

typedef struct launch_ctx {
    sbx_host_box *c;
    bool drop;                     /* to uid and gid (the daemon is root) */
    uid_t uid;
    rlim_t data;                   /* RLIMIT_DATA when there is no group, or 0 */
} launch_ctx;

/* In the child (proc.h: system calls only): joins the box's cgroup, then drops to the
 * sandbox's uid.  With no group, each process's private writable memory is capped
 * instead: Node's Buffers and ArrayBuffers live outside the V8 heap that
 * --max-old-space-size bounds, and an address-space limit would stop Node from
 * starting (its heap reservation). */
static int launch_preexec(void *ud)
{
    launch_ctx *l = ud;
    int e = l->c->has_cg ? sbx_cgroup_enter(&l->c->cg) : 0;
    if (e)
        return e;
    if (l->data) {
        struct rlimit rl = {l->data, l->data};
        if (setrlimit(RLIMIT_DATA, &rl) != 0)
            return errno;
    }
    if (l->drop && (syscall(SYS_setgroups, 0, NULL) != 0 ||
                    syscall(SYS_setresgid, l->uid, l->uid, l->uid) != 0 ||
                    syscall(SYS_setresuid, l->uid, l->uid, l->uid) != 0))
        return errno;
    return 0;
}

pid_t sbx_host_box_launch(sbx_backend *bk, sbx_box *b, const char *const *argv, const char *work,
                       int in, int out, int err, char **why)
{
    sbx_real_base *base = base_of(bk);
    sbx_host_box *c = host_box_new(base, b);
    if (work)
        c->work = sbx_xstrdup(work);
    uid_t uid = sbx_host_box_uid(bk, b, why);
    if (uid == (uid_t)-1)
        return -1;
    if (base->cgroups) {
        sbx_cglimits lim = {(uint64_t)base->cfg->memory_mb << 20, base->cfg->pids,
                            base->cfg->cpus};
        if (sbx_cgroup_create(&c->cg, sbx_box_id(b), &lim, why) != 0)
            return -1;
        c->has_cg = true;
    }
    static const char *const env[] = {"PATH=/usr/local/bin:/usr/bin:/bin", NULL};
    launch_ctx l = {c, base->st.root, uid,
                    base->cgroups ? 0 : (rlim_t)base->cfg->memory_mb << 20};
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

void sbx_host_box_freeze(sbx_backend *bk, sbx_box *b, bool frozen, void (*cb)(sbx_box *b, bool ok))
{
    sbx_host_box *c = sbx_box_backend_data(b);
    freeze_ctx *f = sbx_xcalloc(1, sizeof *f);
    f->b = b;
    f->cb = cb;
    if (c && c->has_cg)
        f->ok = sbx_cgroup_freeze(&c->cg, frozen) == 0;
    else
        f->ok = !frozen; /* nothing to freeze with; a thaw has nothing to do */
    sbx_defer(base_of(bk)->loop, freeze_done, f);
}

void sbx_host_box_force_kill(sbx_backend *bk, sbx_box *b)
{
    sbx_host_box *c = sbx_box_backend_data(b);
    if (!c)
        return;
    if (c->has_cg) {
        sbx_cgroup_freeze(&c->cg, false); /* frozen tasks do not die */
        sbx_cgroup_tasks(&c->cg, true);
    }
    if (c->pid > 0)
        kill(c->pid, SIGKILL);
}

/* The sandbox's processes are gone (or kept: keep_uid): its work directory goes, then
 * its uid may serve another sandbox. */
static void host_box_free(sbx_host_box *c)
{
    sbx_real_base *base = c->base;
    if (c->work) {
        sbx_remove_tree(c->work);
        free(c->work);
    }
    if (base->st.root && !c->keep_uid)
        sbx_uids_release(&base->uids, sbx_box_id(c->box));
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
    sbx_host_box *c = arg;
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
            sbx_log("sandbox %s: its cgroup would not go; its uid stays taken",
                    sbx_box_id(c->box));
            sbx_cgroup_forget(&c->cg);
            c->keep_uid = true;
        }
    }
    sbx_box *b = c->box;
    void (*cb)(sbx_box *) = c->cleaned;
    sbx_box_set_backend_data(b, NULL);
    host_box_free(c);
    cb(b);
}

void sbx_host_box_cleanup(sbx_backend *bk, sbx_box *b, void (*cb)(sbx_box *b))
{
    sbx_host_box *c = sbx_box_backend_data(b);
    if (!c) /* never launched: nothing on the host */
        c = host_box_new(base_of(bk), b);
    c->cleaned = cb;
    sbx_defer(c->loop, cleanup_step, c);
}

void sbx_host_box_cleanup_sync(sbx_backend *bk, sbx_box *b)
{
    sbx_host_box *c = sbx_box_backend_data(b);
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
    host_box_free(c);
}

uint64_t sbx_host_box_oom_kills(sbx_backend *bk, sbx_box *b)
{
    sbx_host_box *c = sbx_box_backend_data(b);
    return c && c->has_cg ? sbx_cgroup_oom_kills(&c->cg) : 0;
}

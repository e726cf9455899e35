/*
 * provider_process.c — the `process` provider, tier `process`: the supervisor and the
 * interpreters run as plain child processes in a private work directory, as the sandbox
 * uid when the daemon is root (--sandbox-uid), with limits from a cgroup v1 group when
 * the daemon is root (rlimits otherwise).  No namespaces and no filter: it is for
 * development, offered only when asked for (--provider process), never by auto.
 */
#include "cgbox.h"
#include "log.h"
#include "proc.h"
#include "realprov.h"
#include "sbxstate.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct sbx_backend {
    struct ev_loop *loop;
    const sbx_config *cfg;
    sbx_state st;
    bool cgroups;
    sbx_cglimits lim;
    char work[512], io[512];       /* scratch for box_config */
};

static sbx_backend *proc_create(struct ev_loop *loop, const sbx_config *cfg, char **why)
{
    if (!sbx_executable(cfg->python_path) && !sbx_executable(cfg->node_path)) {
        *why = sbx_printf("neither %s nor %s is there", cfg->python_path, cfg->node_path);
        return NULL;
    }
    sbx_backend *bk = sbx_xcalloc(1, sizeof *bk);
    bk->loop = loop;
    bk->cfg = cfg;
    if (sbx_state_init(&bk->st, cfg, "process", NULL, NULL, why) != 0) {
        free(bk);
        return NULL;
    }
    char *cgwhy = NULL;
    bk->cgroups = sbx_cgroup_init(&cgwhy);
    if (!bk->cgroups) {
        sbx_log("process provider: no cgroups (%s); limits by rlimits only", cgwhy);
        free(cgwhy);
    }
    bk->lim = (sbx_cglimits){(uint64_t)cfg->memory_mb << 20, cfg->pids, cfg->cpus};
    return bk;
}

static void proc_destroy(sbx_backend *bk)
{
    sbx_state_fini(&bk->st);
    if (bk->cgroups)
        sbx_cgroup_fini();
    free(bk);
}

static void proc_box_config(sbx_backend *bk, sbx_box_config *bc)
{
    snprintf(bk->work, sizeof bk->work, "%s/work-%s", bk->st.dir, bc->id);
    snprintf(bk->io, sizeof bk->io, "%s/io-%s", bk->st.dir, bc->id);
    bc->mode = "process";
    bc->work = bk->work;
    bc->io = bc->host_io = bk->io;
    bc->measure_disk = bk->cfg->disk_mb != 0; /* a host directory: no size of its own */
    if (bk->st.root) {
        bc->uid = bk->st.uid;
        bc->gid = bk->st.gid;
    }
    bc->supervisor_path = bk->st.supervisor;
    if (!bk->cgroups) { /* no group: the kernel's per-process limits instead */
        bc->nproc = bk->cfg->pids;
        bc->as_mb = bk->cfg->memory_mb;
    }
}

typedef struct launch_ctx {
    sbx_cgbox *c;
    const sbx_state *st;
} launch_ctx;

static int proc_preexec(void *ud)
{
    launch_ctx *l = ud;
    int e = sbx_cgbox_enter(l->c);
    return e ? e : sbx_state_drop_privileges(l->st);
}

static pid_t proc_launch(sbx_backend *bk, sbx_box *b, int in, int out, int err, char **why)
{
    sbx_cgbox *c = sbx_cgbox_new(bk->loop, b);
    const char *const *argv = sbx_box_supervisor_argv(b);
    const char *work = argv[3] + strlen("work=");
    if (mkdir(work, 0700) != 0 || (bk->st.root && chown(work, bk->st.uid, bk->st.gid) != 0)) {
        *why = sbx_printf("cannot create the work directory %s: %s", work, strerror(errno));
        return -1;
    }
    c->work = sbx_xstrdup(work);
    if (bk->cgroups) {
        if (sbx_cgroup_create(&c->cg, sbx_box_id(b), &bk->lim, why) != 0)
            return -1;
        c->has_cg = true;
    }
    static const char *const env[] = {"PATH=/usr/local/bin:/usr/bin:/bin", NULL};
    launch_ctx l = {c, &bk->st};
    sbx_spawn sp = {.argv = argv, .envp = env, .fd0 = in, .fd1 = out, .fd2 = err,
                    .new_session = true, .die_with_parent = true, .preexec = proc_preexec,
                    .preexec_ud = &l};
    c->pid = sbx_spawn_process(&sp);
    if (c->pid < 0)
        *why = sbx_printf("fork: %s", strerror(errno));
    return c->pid;
}

static void proc_freeze(sbx_backend *bk, sbx_box *b, bool frozen, void (*cb)(sbx_box *b, bool ok))
{
    sbx_cgbox_freeze(bk->loop, b, frozen, cb);
}

static void proc_force_kill(sbx_backend *bk, sbx_box *b)
{
    (void)bk;
    sbx_cgbox_force_kill(b);
}

static void proc_cleanup(sbx_backend *bk, sbx_box *b, void (*cb)(sbx_box *b))
{
    sbx_cgbox_cleanup(bk->loop, b, cb);
}

static void proc_cleanup_sync(sbx_backend *bk, sbx_box *b)
{
    (void)bk;
    sbx_cgbox_cleanup_sync(b);
}

static uint64_t proc_oom_kills(sbx_backend *bk, sbx_box *b)
{
    (void)bk;
    return sbx_cgbox_oom_kills(b);
}

static const sbx_backend_ops proc_box_ops = {
    .launch = proc_launch,
    .freeze = proc_freeze,
    .force_kill = proc_force_kill,
    .cleanup = proc_cleanup,
    .cleanup_sync = proc_cleanup_sync,
};

static const sbx_real_backend process_backend = {
    .name = "process",
    .tier = "process",
    .box_ops = &proc_box_ops,
    .create = proc_create,
    .destroy = proc_destroy,
    .box_config = proc_box_config,
    .oom_kills = proc_oom_kills,
    .sweep_on_hint = true, /* its sweep reads every process of the host */
};

static sbx_provider *process_create(struct ev_loop *loop, const sbx_config *cfg, char **why)
{
    return sbx_real_create(loop, cfg, &process_backend, why);
}

const sbx_provider_ops sbx_process_provider = SBX_REAL_PROVIDER_OPS("process", process_create);

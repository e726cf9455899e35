/*
 * process.c — the `process` provider, tier `process`: the supervisor and the
 * interpreters run as plain child processes in a private work directory, as a uid of the
 * sandbox's own when the daemon is root (--uid-range, uids.h: the only boundary between
 * two such sandboxes), with limits from a cgroup v1 group when the daemon is root
 * (rlimits otherwise).  The work directory is removed by descriptors, never by path
 * (sbx_remove_tree): the sandbox may swap links into it while it goes.  No namespaces and no filter: it is for
 * development, offered only when asked for (--provider process), never by auto.
 */
#include "host_box.h"
#include "real_provider.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct sbx_backend {
    sbx_real_base base;            /* first (host_box.h) */
    char work[512], io[512];       /* scratch for box_config */
};

static sbx_backend *proc_create(struct ev_loop *loop, const sbx_config *cfg, char **why)
{
    if (!sbx_real_interps_ok(cfg, true, false, why))
        return NULL;
    sbx_backend *bk = sbx_xcalloc(1, sizeof *bk);
    if (sbx_real_base_init(&bk->base, loop, cfg, "process", NULL, NULL,
                           "limits by rlimits only", why) != 0) {
        free(bk);
        return NULL;
    }
    return bk;
}

static void proc_destroy(sbx_backend *bk)
{
    sbx_real_base_fini(&bk->base);
    free(bk);
}

static void proc_box_config(sbx_backend *bk, sbx_box_config *bc)
{
    snprintf(bk->work, sizeof bk->work, "%s/work-%s", bk->base.st.dir, bc->id);
    snprintf(bk->io, sizeof bk->io, "%s/io-%s", bk->base.st.dir, bc->id);
    bc->mode = "process";
    bc->work = bk->work;
    bc->io = bc->host_io = bk->io;
    bc->measure_disk = bk->base.cfg->disk_mb != 0; /* a host directory: no size of its own */
    bc->supervisor_path = bk->base.st.supervisor;
    sbx_host_box_box_config(bk, bc);
}

/* The supervisor runs as it is, in a host work directory of its own. */
static pid_t proc_launch(sbx_backend *bk, sbx_box *b, int in, int out, int err, char **why)
{
    const sbx_state *st = &bk->base.st;
    const char *const *argv = sbx_box_supervisor_argv(b);
    const char *work = argv[3] + strlen("work=");
    uid_t uid = sbx_host_box_uid(bk, b, why);
    if (uid == (uid_t)-1)
        return -1;
    if (mkdir(work, 0700) != 0 || (st->root && chown(work, uid, (gid_t)uid) != 0)) {
        *why = sbx_printf("cannot create the work directory %s: %s", work, strerror(errno));
        return -1;
    }
    return sbx_host_box_launch(bk, b, argv, work, in, out, err, why);
}

static const sbx_backend_ops proc_box_ops = SBX_CGBOX_OPS(proc_launch);

static const sbx_real_backend process_backend = {
    .name = "process",
    .tier = "process",
    .box_ops = &proc_box_ops,
    .create = proc_create,
    .destroy = proc_destroy,
    .box_config = proc_box_config,
    .oom_kills = sbx_host_box_oom_kills,
    .sweep_on_hint = true, /* its sweep reads every process of the host */
};

static sbx_provider *process_create(struct ev_loop *loop, const sbx_config *cfg, char **why)
{
    return sbx_real_create(loop, cfg, &process_backend, why);
}

const sbx_provider_ops sbx_process_provider = SBX_REAL_PROVIDER_OPS("process", process_create);

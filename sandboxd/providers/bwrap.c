/*
 * bwrap.c — the `bwrap` provider, tier `container` (docs/daemon.md §4.2 and §8:
 * the container tier): bubblewrap with new user, PID, network (no interface
 * but a down loopback), IPC, UTS, cgroup and mount namespaces; a read-only root made
 * of read-only binds of /usr (and the /bin, /lib... links into it), a generated /etc
 * and the supervisor binary; /proc of the new PID namespace; a minimal /dev.
 *
 * bubblewrap runs as a uid of the sandbox's own (--uid-range, default 61000-61999, when
 * the daemon is root; uids.h), mapped to the same uid inside, and keeps its capabilities inside the new user
 * namespace only for the supervisor (PID 1), which then mounts the work directory,
 * /tmp and /dev/shm as sized tmpfs with noexec, nosuid and nodev, drops every
 * capability, sets no_new_privs, limits core size and open files, and installs the
 * seccomp filter (seccomp.c) before it starts anything.  Memory (no swap), pids and CPU
 * are a cgroup v1 group per sandbox when the daemon is root; without root, rlimits.
 */
#include "host_box.h"
#include "real_provider.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_ARGS 128

struct sbx_backend {
    sbx_real_base base;            /* first (host_box.h) */
    char *links[8][2];             /* host top-level links into /usr: {name, target} */
    char *binds[8];                /* host top-level directories bound read-only */
    size_t n_links, n_binds;
    char io[512];                  /* scratch for box_config */
};

static const char *const top_level[] = {"bin", "sbin", "lib", "lib32", "lib64", "libx32"};

static sbx_backend *bwrap_create(struct ev_loop *loop, const sbx_config *cfg, char **why)
{
    if (!sbx_executable(cfg->bwrap_path)) {
        *why = sbx_printf("bubblewrap is not at %s (--bwrap)", cfg->bwrap_path);
        return NULL;
    }
    if (!sbx_real_interps_ok(cfg, true, true, why))
        return NULL;
    sbx_backend *bk = sbx_xcalloc(1, sizeof *bk);
    if (sbx_real_base_init(&bk->base, loop, cfg, "bwrap", NULL, NULL,
                           "memory and pids limited by rlimits only", why) != 0) {
        free(bk);
        return NULL;
    }
    for (size_t i = 0; i < sizeof top_level / sizeof top_level[0]; i++) {
        char path[64], target[256];
        snprintf(path, sizeof path, "/%s", top_level[i]);
        ssize_t n = readlink(path, target, sizeof target - 1);
        struct stat st;
        if (n > 0) {
            target[n] = '\0';
            bk->links[bk->n_links][0] = sbx_xstrdup(path);
            bk->links[bk->n_links++][1] = sbx_xstrdup(target);
        } else if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
            bk->binds[bk->n_binds++] = sbx_xstrdup(path);
        }
    }
    return bk;
}

static void bwrap_destroy(sbx_backend *bk)
{
    for (size_t i = 0; i < bk->n_links; i++) {
        free(bk->links[i][0]);
        free(bk->links[i][1]);
    }
    for (size_t i = 0; i < bk->n_binds; i++)
        free(bk->binds[i]);
    sbx_real_base_fini(&bk->base);
    free(bk);
}

static void bwrap_box_config(sbx_backend *bk, sbx_box_config *bc)
{
    bc->mode = "bwrap";
    bc->work = "/work";
    bc->io = "/.berth/io";
    snprintf(bk->io, sizeof bk->io, "%s/io-%s", bk->base.st.dir, bc->id);
    bc->host_io = bk->io;
    bc->supervisor_path = "/.berth/supervisor";
    sbx_host_box_box_config(bk, bc);
}

/* The supervisor under bubblewrap, its view of the host made of read-only binds. */
static pid_t bwrap_launch(sbx_backend *bk, sbx_box *b, int in, int out, int err, char **why)
{
    const char *argv[MAX_ARGS];
    size_t n = 0;
    char uid[16]; /* the box's own (host_box.h), mapped to itself inside */
    uid_t u = sbx_host_box_uid(bk, b, why);
    if (u == (uid_t)-1)
        return -1;
    snprintf(uid, sizeof uid, "%u", (unsigned)u);
    const char *fixed[] = {
        bk->base.cfg->bwrap_path, "--unshare-user", "--unshare-pid", "--unshare-net",
        "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--uid", uid, "--gid",
        uid, "--hostname", "sandbox", "--die-with-parent", "--new-session", "--as-pid-1",
        "--cap-add", "ALL", "--ro-bind", "/usr", "/usr",
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        argv[n++] = fixed[i];
    for (size_t i = 0; i < bk->n_links; i++) {
        argv[n++] = "--symlink";
        argv[n++] = bk->links[i][1];
        argv[n++] = bk->links[i][0];
    }
    for (size_t i = 0; i < bk->n_binds; i++) {
        argv[n++] = "--ro-bind";
        argv[n++] = bk->binds[i];
        argv[n++] = bk->binds[i];
    }
    const char *rest[] = {
        "--ro-bind", bk->base.st.etc, "/etc",
        "--ro-bind", bk->base.st.supervisor, "/.berth/supervisor",
        "--ro-bind", sbx_box_host_io(b), "/.berth/io",
        "--proc", "/proc", "--dev", "/dev", "--dir", "/dev/shm", "--dir", "/work", "--dir",
        "/tmp", "--remount-ro", "/", "--chdir", "/", "--",
    };
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++)
        argv[n++] = rest[i];
    for (const char *const *a = sbx_box_supervisor_argv(b); *a && n < MAX_ARGS - 1; a++)
        argv[n++] = *a;
    argv[n] = NULL;
    return sbx_host_box_launch(bk, b, argv, NULL, in, out, err, why);
}

/* The limits of a live sandbox read back from its group (the reference's smoke test
 * reads back pids.max and refuses on a mismatch). */
static char *bwrap_verify(sbx_backend *bk, sbx_box *b)
{
    sbx_host_box *c = sbx_box_backend_data(b);
    const sbx_config *cfg = bk->base.cfg;
    if (!bk->base.cgroups || !c || !c->has_cg)
        return NULL;
    char *pids = sbx_cgroup_read(&c->cg, SBX_CG_PIDS, "pids.max");
    char *mem = sbx_cgroup_read(&c->cg, SBX_CG_MEMORY, "memory.limit_in_bytes");
    char *why = NULL;
    if (!pids || strtoul(pids, NULL, 10) != cfg->pids)
        why = sbx_printf("pids.max reads back %s, not %u", pids ? pids : "nothing", cfg->pids);
    else if (!mem || strtoull(mem, NULL, 10) != (unsigned long long)cfg->memory_mb << 20)
        why = sbx_printf("memory.limit_in_bytes reads back %s, not %u MiB", mem ? mem : "nothing",
                         cfg->memory_mb);
    free(pids);
    free(mem);
    return why;
}

static const sbx_backend_ops bwrap_box_ops = SBX_CGBOX_OPS(bwrap_launch);

static const sbx_real_backend bwrap_backend = {
    .name = "bwrap",
    .tier = "container",
    .box_ops = &bwrap_box_ops,
    .create = bwrap_create,
    .destroy = bwrap_destroy,
    .box_config = bwrap_box_config,
    .oom_kills = sbx_host_box_oom_kills,
    .verify = bwrap_verify,
    .want_isolation = true,
    .want_seccomp = true,
    .sweep_on_hint = true,
};

static sbx_provider *bwrap_provider_create(struct ev_loop *loop, const sbx_config *cfg, char **why)
{
    return sbx_real_create(loop, cfg, &bwrap_backend, why);
}

const sbx_provider_ops sbx_bwrap_provider = SBX_REAL_PROVIDER_OPS("bwrap", bwrap_provider_create);

/*
 * gvisor.c — the `gvisor` provider, tier `kernel`: each session is one gVisor
 * sandbox (`runsc run` of an OCI bundle, no Docker), whose user-space kernel stands
 * between the code and the host's.  The bundle (made per sandbox) has a read-only root
 * (an empty template with links into /usr), read-only binds of /usr, a generated /etc
 * and the supervisor binary, /work, /tmp and /dev/shm as sized tmpfs with noexec,
 * nosuid and nodev, no network (--network=none), a non-root uid, no capabilities,
 * no_new_privs, rlimits (core 0, open files, processes = --pids, enforced by gVisor's
 * kernel) and a host cgroup as a memory backstop for the whole sandbox (the sentry's
 * own threads live there, so pids are not limited on the host: gVisor's Go runtime
 * would die of it).  Inside, the supervisor caps the Python kernel's address space and
 * Node's heap at --memory-mb.  Platform: --runsc-platform (ptrace; this gVisor release
 * has no systrap and there is no KVM here).
 *
 * One `runsc run` per session, started once: the supervisor talks over its stdin and
 * stdout, so a warm cell costs no runsc process.  Idle suspend is `runsc pause`.
 */
#include "cgroup.h"
#include "log.h"
#include "proc.h"
#include "real_provider.h"
#include "state_dir.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define RUNSC_CMD_S 20.0
#define BACKSTOP_EXTRA_MB 256u
/* On the ptrace platform every guest process costs the host about 3 MiB (its stub
 * process and page tables; measured: 35 MiB idle, 526 MiB with 140 sleeping forks of
 * Python), so the backstop leaves room for --pids of them: a fork bomb then meets the
 * guest's process limit (EAGAIN) instead of ending the sandbox. */
#define BACKSTOP_MB_PER_TASK 4u

struct sbx_backend {
    sbx_real_base base;            /* first (real_provider.h) */
    char *runsc_root, *rootfs, *bundles;
    char platform[64];
    char io[512];                  /* scratch for box_config */
};

typedef struct gbox {
    sbx_backend *bk;
    sbx_box *box;
    char *id;                      /* the container id */
    char *bundle;
    pid_t pid;                     /* `runsc run` */
    void (*cleaned)(sbx_box *b);
    void (*frozen_cb)(sbx_box *b, bool ok);
} gbox;

static const char *const top_level[] = {"bin", "sbin", "lib", "lib32", "lib64", "libx32"};

static int make_rootfs(const char *rootfs)
{
    static const char *const dirs[] = {"usr", "etc", "work", "tmp", "proc", "dev", "sys", ".berth",
                                       ".berth/io"};
    if (mkdir(rootfs, 0755) != 0)
        return -1;
    chmod(rootfs, 0755); /* whatever the daemon's umask: the sandbox uid walks it */
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        char *p = sbx_printf("%s/%s", rootfs, dirs[i]);
        int rc = mkdir(p, 0755);
        if (rc == 0)
            rc = chmod(p, 0755);
        free(p);
        if (rc != 0)
            return -1;
    }
    for (size_t i = 0; i < sizeof top_level / sizeof top_level[0]; i++) {
        char host[64], target[256];
        snprintf(host, sizeof host, "/%s", top_level[i]);
        ssize_t n = readlink(host, target, sizeof target - 1);
        if (n <= 0)
            continue; /* a real directory is not bound: code needs only /usr */
        target[n] = '\0';
        char *p = sbx_printf("%s/%s", rootfs, top_level[i]);
        int rc = symlink(target, p);
        free(p);
        if (rc != 0)
            return -1;
    }
    /* Mount points for files: the supervisor and each FIFO. */
    static const char *const files[] = {"supervisor", "io/py-req", "io/py-rep", "io/py-out",
                                        "io/py-err", "io/js-req", "io/js-rep", "io/js-out",
                                        "io/js-err"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char *mp = sbx_printf("%s/.berth/%s", rootfs, files[i]);
        int fd = open(mp, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        free(mp);
        if (fd < 0)
            return -1;
        fchmod(fd, 0644);
        close(fd);
    }
    return 0;
}

/* Sandboxes a killed daemon left running (D55): every container under its runsc root
 * goes, before its state directory does. */
static void reap_containers(const char *stale_dir, void *ud)
{
    const sbx_config *cfg = ud;
    char *root = sbx_printf("%s/runsc", stale_dir);
    DIR *d = opendir(root);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        /* runsc keeps <root>/<id>_sandbox:<id>.state (newer) or <root>/<id>/ (older). */
        char id[256];
        if (strncmp(e->d_name, "berth-", 6) != 0)
            continue;
        snprintf(id, sizeof id, "%s", e->d_name);
        char *cut = strpbrk(id, "_.");
        if (cut)
            *cut = '\0';
        const char *argv[] = {cfg->runsc_path, "--root", root, "delete", "--force", id, NULL};
        char err[512];
        if (sbx_cmd_run_sync(argv, RUNSC_CMD_S, err, sizeof err) == 0)
            sbx_log("removed gVisor sandbox %s that a stopped sandboxd left", id);
    }
    if (d)
        closedir(d);
    free(root);
}

static sbx_backend *gvisor_create(struct ev_loop *loop, const sbx_config *cfg, char **why)
{
    if (!sbx_executable(cfg->runsc_path)) {
        *why = sbx_printf("gVisor's runsc is not at %s (--runsc)", cfg->runsc_path);
        return NULL;
    }
    if (geteuid() != 0) {
        *why = sbx_xstrdup("runsc needs root here (sandboxd runs as an ordinary user)");
        return NULL;
    }
    if (!sbx_real_interps_ok(cfg, false, true, why))
        return NULL;
    sbx_backend *bk = sbx_xcalloc(1, sizeof *bk);
    snprintf(bk->platform, sizeof bk->platform, "--platform=%s", cfg->runsc_platform);
    if (sbx_real_base_init(&bk->base, loop, cfg, "gvisor", reap_containers, (void *)cfg,
                           "no host memory backstop", why) != 0) {
        free(bk);
        return NULL;
    }
    const char *dir = bk->base.st.dir;
    bk->runsc_root = sbx_printf("%s/runsc", dir);
    bk->rootfs = sbx_printf("%s/rootfs", dir);
    bk->bundles = sbx_printf("%s/bundles", dir);
    if (mkdir(bk->runsc_root, 0700) != 0 || mkdir(bk->bundles, 0700) != 0 ||
        make_rootfs(bk->rootfs) != 0) {
        *why = sbx_printf("cannot prepare %s: %s", dir, strerror(errno));
        sbx_real_base_fini(&bk->base);
        free(bk->runsc_root);
        free(bk->rootfs);
        free(bk->bundles);
        free(bk);
        return NULL;
    }
    return bk;
}

static void gvisor_destroy(sbx_backend *bk)
{
    sbx_real_base_fini(&bk->base);
    free(bk->runsc_root);
    free(bk->rootfs);
    free(bk->bundles);
    free(bk);
}

static void gvisor_box_config(sbx_backend *bk, sbx_box_config *bc)
{
    bc->mode = "gvisor";
    bc->work = "/work";
    bc->io = "/.berth/io";
    snprintf(bk->io, sizeof bk->io, "%s/io-%s", bk->base.st.dir, bc->id);
    bc->host_io = bk->io;
    /* A uid of the box's own (uids.h): the cells run as it inside, and it owns the box's
     * FIFOs on the host, which gVisor's gofer checks against it.  None free: 0, and the
     * launch fails (the cells never run as root). */
    uid_t uid = sbx_uids_take(&bk->base.uids, bc->id);
    bc->uid = uid;
    bc->gid = (gid_t)uid;
    bc->run_as_uid = uid == (uid_t)-1 ? 0 : uid; /* the supervisor is root inside */
    bc->run_as_gid = bc->run_as_uid;
    bc->supervisor_path = "/.berth/supervisor";
    bc->nproc = bk->base.cfg->pids;       /* enforced by gVisor's kernel, per sandbox */
    bc->as_mb = bk->base.cfg->memory_mb + SBX_ADDRESS_SPACE_HEADROOM_MB; /* Python's */
}

static json_t *mount_json(const char *dest, const char *type, const char *source,
                          const char *const *options)
{
    json_t *opts = json_array();
    for (const char *const *o = options; *o; o++)
        json_array_append_new(opts, json_string(*o));
    return json_pack("{s:s, s:s, s:s, s:o}", "destination", dest, "type", type, "source", source,
                     "options", opts);
}

static json_t *rlimit_json(const char *type, uint64_t v)
{
    return json_pack("{s:s, s:I, s:I}", "type", type, "hard", (json_int_t)v, "soft", (json_int_t)v);
}

/* The OCI config.json of one sandbox. */
static json_t *bundle_config(sbx_backend *bk, sbx_box *b)
{
    const sbx_config *cfg = bk->base.cfg;
    json_t *args = json_array();
    for (const char *const *a = sbx_box_supervisor_argv(b); *a; a++)
        json_array_append_new(args, json_string(*a));
    /* The supervisor runs as root inside gVisor with three capabilities, which leave it
     * when it starts anything as the sandbox uid: set uids for its children, kill them,
     * nothing else.  The cells cannot signal it or read its /proc entries. */
    json_t *caps = json_pack("{s:[s,s,s], s:[s,s,s], s:[], s:[s,s,s], s:[]}", "bounding",
                             "CAP_SETUID", "CAP_SETGID", "CAP_KILL", "effective", "CAP_SETUID",
                             "CAP_SETGID", "CAP_KILL", "inheritable", "permitted", "CAP_SETUID",
                             "CAP_SETGID", "CAP_KILL", "ambient");
    json_t *rlimits = json_array();
    json_array_append_new(rlimits, rlimit_json("RLIMIT_NOFILE", 4096));
    json_array_append_new(rlimits, rlimit_json("RLIMIT_CORE", 0));
    json_t *process = json_pack(
        "{s:b, s:{s:I, s:I}, s:o, s:[s], s:s, s:o, s:b, s:o}", "terminal", 0, "user", "uid",
        (json_int_t)0, "gid", (json_int_t)0, "args", args, "env",
        "PATH=/usr/local/bin:/usr/bin:/bin", "cwd", "/", "capabilities", caps, "noNewPrivileges",
        1, "rlimits", rlimits);
    char work[64], small[64];
    snprintf(work, sizeof work, "size=%um", cfg->work_mb);
    snprintf(small, sizeof small, "size=%um", 16u);
    const char *ro[] = {"rbind", "ro", "nosuid", "nodev", NULL};
    const char *ro_file[] = {"bind", "ro", "nosuid", "nodev", NULL};
    const char *work_opts[] = {"nosuid", "noexec", "nodev", "mode=1777", work, NULL};
    const char *small_opts[] = {"nosuid", "noexec", "nodev", "mode=1777", small, NULL};
    const char *none[] = {NULL};
    json_t *mounts = json_array();
    json_array_append_new(mounts, mount_json("/proc", "proc", "proc", none));
    json_array_append_new(mounts, mount_json("/dev", "tmpfs", "tmpfs", none));
    json_array_append_new(mounts, mount_json("/usr", "bind", "/usr", ro));
    json_array_append_new(mounts, mount_json("/etc", "bind", bk->base.st.etc, ro));
    json_array_append_new(mounts, mount_json("/.berth/supervisor", "bind", bk->base.st.supervisor,
                                             ro_file));
    /* Each FIFO on its own (a FIFO opened for writing needs a writable mount in gVisor;
     * a bound file gives nothing else to write to). */
    const char *fifo_opts[] = {"bind", "nosuid", "nodev", "noexec", NULL};
    static const char *const fifos[] = {"py-req", "py-rep", "py-out", "py-err",
                                        "js-req", "js-rep", "js-out", "js-err"};
    for (size_t i = 0; i < sizeof fifos / sizeof fifos[0]; i++) {
        char *dest = sbx_printf("/.berth/io/%s", fifos[i]);
        char *src = sbx_printf("%s/%s", sbx_box_host_io(b), fifos[i]);
        json_array_append_new(mounts, mount_json(dest, "bind", src, fifo_opts));
        free(dest);
        free(src);
    }
    json_array_append_new(mounts, mount_json("/work", "tmpfs", "tmpfs", work_opts));
    json_array_append_new(mounts, mount_json("/tmp", "tmpfs", "tmpfs", small_opts));
    json_array_append_new(mounts, mount_json("/dev/shm", "tmpfs", "tmpfs", small_opts));
    json_t *namespaces = json_pack("[{s:s}, {s:s}, {s:s}, {s:s}, {s:s}]", "type", "pid", "type",
                                   "network", "type", "ipc", "type", "uts", "type", "mount");
    json_t *linux_ = json_pack("{s:o}", "namespaces", namespaces);
    if (bk->base.cgroups) {
        uint64_t backstop = ((uint64_t)cfg->memory_mb * 2 + BACKSTOP_EXTRA_MB +
                             (uint64_t)cfg->pids * BACKSTOP_MB_PER_TASK) << 20;
        json_t *res = json_pack("{s:{s:I, s:I}}", "memory", "limit", (json_int_t)backstop,
                                "swap", (json_int_t)backstop);
        if (cfg->cpus > 0)
            json_object_set_new(res, "cpu", json_pack("{s:I, s:I}", "quota",
                                                      (json_int_t)(cfg->cpus * 100000 + 0.5),
                                                      "period", (json_int_t)100000));
        json_object_set_new(linux_, "resources", res);
        char *path = sbx_printf("/berth/%s/%s", sbx_cgroup_daemon_tag(), sbx_box_id(b));
        json_object_set_new(linux_, "cgroupsPath", json_string(path));
        free(path);
    }
    return json_pack("{s:s, s:o, s:{s:s, s:b}, s:s, s:o, s:o}", "ociVersion", "1.0.0", "process",
                     process, "root", "path", bk->rootfs, "readonly", 1, "hostname", "sandbox",
                     "mounts", mounts, "linux", linux_);
}

static pid_t gvisor_launch(sbx_backend *bk, sbx_box *b, int in, int out, int err, char **why)
{
    gbox *g = sbx_xcalloc(1, sizeof *g);
    g->bk = bk;
    g->box = b;
    sbx_box_set_backend_data(b, g);
    /* The id names the daemon too, so the start-up reaper can tell whose it is. */
    g->id = sbx_printf("berth-%s-%s", sbx_cgroup_daemon_tag()[0] ? sbx_cgroup_daemon_tag() + 1
                                                                   : "x", sbx_box_id(b));
    g->bundle = sbx_printf("%s/%s", bk->bundles, sbx_box_id(b));
    if (sbx_uids_of(&bk->base.uids, sbx_box_id(b)) == (uid_t)-1) {
        *why = sbx_printf("every uid of --uid-range (%u from %u) is in use by a sandbox",
                          bk->base.uids.count, (unsigned)bk->base.uids.first);
        return -1;
    }
    if (mkdir(g->bundle, 0700) != 0) {
        *why = sbx_printf("cannot create %s: %s", g->bundle, strerror(errno));
        return -1;
    }
    json_t *config = bundle_config(bk, b);
    char *path = sbx_printf("%s/config.json", g->bundle);
    int rc = json_dump_file(config, path, JSON_COMPACT);
    free(path);
    json_decref(config);
    if (rc != 0) {
        *why = sbx_printf("cannot write the bundle of %s", g->id);
        return -1;
    }
    const char *argv[] = {bk->base.cfg->runsc_path, "--root", bk->runsc_root, bk->platform,
                          "--network=none", "--host-fifo=open", "run", "--bundle", g->bundle,
                          g->id, NULL};
    static const char *const env[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                      NULL};
    sbx_spawn sp = {.argv = argv, .envp = env, .fd0 = in, .fd1 = out, .fd2 = err,
                    .new_session = true, .die_with_parent = true};
    g->pid = sbx_spawn_process(&sp);
    if (g->pid < 0)
        *why = sbx_printf("fork: %s", strerror(errno));
    return g->pid;
}

static void on_paused(void *ud, int status, const char *err)
{
    gbox *g = ud;
    if (status != 0)
        sbx_log("sandbox %s: runsc pause/resume failed: %s", sbx_box_id(g->box), err);
    void (*cb)(sbx_box *, bool) = g->frozen_cb;
    g->frozen_cb = NULL;
    cb(g->box, status == 0);
}

static void gvisor_freeze(sbx_backend *bk, sbx_box *b, bool frozen, void (*cb)(sbx_box *b, bool ok))
{
    gbox *g = sbx_box_backend_data(b);
    g->frozen_cb = cb;
    const char *argv[] = {bk->base.cfg->runsc_path, "--root", bk->runsc_root,
                          frozen ? "pause" : "resume", g->id, NULL};
    sbx_cmd_run(bk->base.loop, argv, RUNSC_CMD_S, on_paused, g);
}

/* `runsc delete --force` of the sandbox, waited for (bounded). */
static void runsc_delete_sync(sbx_backend *bk, const gbox *g)
{
    char err[512];
    const char *argv[] = {bk->base.cfg->runsc_path, "--root", bk->runsc_root, "delete", "--force",
                          g->id, NULL};
    sbx_cmd_run_sync(argv, RUNSC_CMD_S, err, sizeof err);
}

static void gvisor_force_kill(sbx_backend *bk, sbx_box *b)
{
    gbox *g = sbx_box_backend_data(b);
    if (!g || !g->id)
        return;
    runsc_delete_sync(bk, g);
    if (g->pid > 0)
        kill(g->pid, SIGKILL);
}

static void gbox_free(gbox *g)
{
    if (g->bundle) {
        sbx_remove_tree(g->bundle);
        free(g->bundle);
    }
    /* What runsc may have left of the sandbox's cgroups. */
    if (g->bk->base.cgroups) {
        static const char *const ctl[] = {"memory", "pids", "cpu", "cpuacct", "cpuset",
                                          "freezer", "devices", "blkio", "net_cls", "perf_event",
                                          "hugetlb", "rdma", "misc", "net_prio", "systemd"};
        for (size_t i = 0; i < sizeof ctl / sizeof ctl[0]; i++) {
            char *d = sbx_printf("/sys/fs/cgroup/%s/berth/%s/%s", ctl[i], sbx_cgroup_daemon_tag(),
                                 sbx_box_id(g->box));
            rmdir(d);
            free(d);
        }
    }
    /* The sandbox is deleted: no process of it is left to run as its uid. */
    sbx_uids_release(&g->bk->base.uids, sbx_box_id(g->box));
    free(g->id);
    free(g);
}

static void on_deleted(void *ud, int status, const char *err)
{
    (void)status;
    (void)err; /* usually "does not exist": `runsc run` removed it on its way out */
    gbox *g = ud;
    sbx_box *b = g->box;
    void (*cb)(sbx_box *) = g->cleaned;
    sbx_box_set_backend_data(b, NULL);
    gbox_free(g);
    cb(b);
}

static void deleted_now(void *arg)
{
    on_deleted(arg, 0, "");
}

static void gvisor_cleanup(sbx_backend *bk, sbx_box *b, void (*cb)(sbx_box *b))
{
    gbox *g = sbx_box_backend_data(b);
    if (!g) {
        g = sbx_xcalloc(1, sizeof *g);
        g->bk = bk;
        g->box = b;
    }
    g->cleaned = cb;
    if (!g->id) {
        sbx_defer(bk->base.loop, deleted_now, g);
        return;
    }
    const char *argv[] = {bk->base.cfg->runsc_path, "--root", bk->runsc_root, "delete", "--force",
                          g->id, NULL};
    sbx_cmd_run(bk->base.loop, argv, RUNSC_CMD_S, on_deleted, g);
}

static void gvisor_cleanup_sync(sbx_backend *bk, sbx_box *b)
{
    gbox *g = sbx_box_backend_data(b);
    if (!g)
        return;
    if (g->id)
        runsc_delete_sync(bk, g);
    sbx_box_set_backend_data(b, NULL);
    gbox_free(g);
}

static const sbx_backend_ops gvisor_box_ops = {
    .launch = gvisor_launch,
    .freeze = gvisor_freeze,
    .force_kill = gvisor_force_kill,
    .cleanup = gvisor_cleanup,
    .cleanup_sync = gvisor_cleanup_sync,
};

static const sbx_real_backend gvisor_backend = {
    .name = "gvisor",
    .tier = "kernel",
    .box_ops = &gvisor_box_ops,
    .create = gvisor_create,
    .destroy = gvisor_destroy,
    .box_config = gvisor_box_config,
    .want_isolation = true,
    .want_other_kernel = true,
    .sweep_on_hint = true,
};

static sbx_provider *gvisor_provider_create(struct ev_loop *loop, const sbx_config *cfg, char **why)
{
    return sbx_real_create(loop, cfg, &gvisor_backend, why);
}

const sbx_provider_ops sbx_gvisor_provider = SBX_REAL_PROVIDER_OPS("gvisor", gvisor_provider_create);

/*
 * cgroup.c — cgroup v1 groups for sandboxes (see cgroup.h).
 */
#include "cgroup.h"

#include "log.h"
#include "proc.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define ROOT "/sys/fs/cgroup"
#define FREEZE_WAIT_MS 2000

static const char *const controllers[SBX_CG_N] = {"memory", "pids", "cpu", "freezer"};
static char daemon_tag[64];

const char *sbx_cgroup_daemon_tag(void)
{
    return daemon_tag;
}


/* A limit's write may be interrupted: setting memory.limit_in_bytes reclaims first, and
 * the kernel gives up with EINTR when a signal is pending (a child's SIGCHLD, here).
 * The write changed nothing then, so it is made again. */
#define WRITE_TRIES 20

static int write_file(const char *dir, const char *file, const char *value)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int fd;
    do
        fd = open(path, O_WRONLY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return errno;
    size_t len = strlen(value);
    ssize_t n = -1;
    for (int i = 0; i < WRITE_TRIES && (n = write(fd, value, len)) < 0 && errno == EINTR; i++)
        ;
    int e = n == (ssize_t)len ? 0 : (n < 0 ? errno : EIO);
    if (close(fd) != 0 && !e)
        e = errno;
    return e;
}

static char *read_path(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    size_t cap = 4096, len = 0;
    char *buf = sbx_xmalloc(cap + 1);
    for (;;) {
        ssize_t n = read(fd, buf + len, cap - len);
        if (n <= 0)
            break;
        len += (size_t)n;
        if (len == cap) {
            cap *= 2;
            buf = sbx_xrealloc(buf, cap + 1);
        }
    }
    close(fd);
    buf[len] = '\0';
    return buf;
}

/* Kills the tasks of one directory (and its subdirectories), then removes them. */
static int remove_tree(const char *dir, bool kill_tasks)
{
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? 0 : -1;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        if (e->d_type != DT_DIR || !strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char sub[512];
        snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name);
        if (remove_tree(sub, kill_tasks) != 0)
            rc = -1;
    }
    closedir(d);
    if (kill_tasks) {
        char path[600];
        snprintf(path, sizeof path, "%s/cgroup.procs", dir);
        char *procs = read_path(path);
        for (char *tok = procs ? strtok(procs, "\n") : NULL; tok; tok = strtok(NULL, "\n"))
            kill((pid_t)atoi(tok), SIGKILL);
        free(procs);
    }
    if (rmdir(dir) != 0 && errno != ENOENT)
        rc = -1;
    return rc;
}

/* Calls fn(hierarchy root, ud) for every cgroup v1 hierarchy mounted under ROOT, not only
 * the controllers sandboxd writes to: runsc makes the same berth/d<...> parents in every
 * hierarchy it finds (blkio, cpuacct, cpuset, devices, systemd here), and those must go
 * with the daemon too.  Links (cpu -> cpu,cpuacct elsewhere) are skipped: the directory
 * they name is visited under its own name. */
static void each_hierarchy(void (*fn)(const char *hier, void *ud), void *ud)
{
    DIR *d = opendir(ROOT);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_type != DT_DIR || e->d_name[0] == '.')
            continue;
        char hier[300];
        snprintf(hier, sizeof hier, ROOT "/%s", e->d_name);
        fn(hier, ud);
    }
    closedir(d);
}

/* Removes the groups of daemons that are gone in one hierarchy: berth/d<pid>-<start>
 * whose process is not running with that start time. */
static void reap_stale_in(const char *hier, void *ud)
{
    (void)ud;
    char base[400];
    snprintf(base, sizeof base, "%s/berth", hier);
    DIR *d = opendir(base);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        int pid;
        char start[32], now[32];
        if (e->d_name[0] != 'd' || sscanf(e->d_name, "d%d-%31s", &pid, start) != 2)
            continue;
        sbx_process_start_time(pid, now, sizeof now);
        if (*now && strcmp(now, start) == 0)
            continue; /* that daemon still runs */
        char dir[700];
        snprintf(dir, sizeof dir, "%s/%s", base, e->d_name);
        if (remove_tree(dir, true) == 0)
            sbx_log("removed the cgroups a stopped sandboxd left (%s)", dir + strlen(ROOT "/"));
    }
    closedir(d);
}

/* This daemon's parent group in one hierarchy, once its sandboxes' groups are gone. */
static void remove_own_in(const char *hier, void *ud)
{
    (void)ud;
    char path[400];
    snprintf(path, sizeof path, "%s/berth/%s", hier, daemon_tag);
    remove_tree(path, false);
}

bool sbx_cgroup_init(char **why)
{
    *why = NULL;
    if (geteuid() != 0) {
        *why = sbx_xstrdup("cgroups need root (sandboxd runs as an ordinary user)");
        return false;
    }
    for (int c = 0; c < SBX_CG_N; c++) {
        char path[256];
        snprintf(path, sizeof path, ROOT "/%s/cgroup.procs", controllers[c]);
        if (access(path, F_OK) != 0) {
            *why = sbx_printf("no cgroup v1 %s controller at " ROOT "/%s", controllers[c],
                              controllers[c]);
            return false;
        }
    }
    char start[32];
    sbx_process_start_time(getpid(), start, sizeof start);
    snprintf(daemon_tag, sizeof daemon_tag, "d%d-%s", (int)getpid(), start);
    each_hierarchy(reap_stale_in, NULL);
    for (int c = 0; c < SBX_CG_N; c++) {
        char path[256];
        snprintf(path, sizeof path, ROOT "/%s/berth", controllers[c]);
        if (mkdir(path, 0755) != 0 && errno != EEXIST) {
            *why = sbx_printf("cannot create %s: %s", path, strerror(errno));
            return false;
        }
        snprintf(path, sizeof path, ROOT "/%s/berth/%s", controllers[c], daemon_tag);
        if (mkdir(path, 0755) != 0 && errno != EEXIST) {
            *why = sbx_printf("cannot create %s: %s", path, strerror(errno));
            return false;
        }
    }
    return true;
}

void sbx_cgroup_fini(void)
{
    if (daemon_tag[0])
        each_hierarchy(remove_own_in, NULL);
}

int sbx_cgroup_create(sbx_cgroup *cg, const char *name, const sbx_cglimits *lim, char **why)
{
    memset(cg, 0, sizeof *cg);
    for (int c = 0; c < SBX_CG_N; c++) {
        cg->dir[c] = sbx_printf(ROOT "/%s/berth/%s/%s", controllers[c], daemon_tag, name);
        if (mkdir(cg->dir[c], 0755) != 0) {
            *why = sbx_printf("cannot create %s: %s", cg->dir[c], strerror(errno));
            sbx_cgroup_remove(cg);
            sbx_cgroup_forget(cg);
            return -1;
        }
    }
    char v[64];
    int e = 0;
    const char *what = "";
    if (lim->memory_bytes) {
        snprintf(v, sizeof v, "%llu", (unsigned long long)lim->memory_bytes);
        what = "memory.limit_in_bytes";
        e = write_file(cg->dir[SBX_CG_MEMORY], what, v);
        char sw[512];
        snprintf(sw, sizeof sw, "%s/memory.memsw.limit_in_bytes", cg->dir[SBX_CG_MEMORY]);
        if (!e && access(sw, F_OK) == 0) { /* swap counted with memory: no swap at all */
            what = "memory.memsw.limit_in_bytes";
            e = write_file(cg->dir[SBX_CG_MEMORY], what, v);
            cg->memsw = e == 0;
        }
        write_file(cg->dir[SBX_CG_MEMORY], "memory.swappiness", "0");
    }
    if (!e && lim->pids) {
        snprintf(v, sizeof v, "%u", lim->pids);
        what = "pids.max";
        e = write_file(cg->dir[SBX_CG_PIDS], what, v);
    }
    if (!e && lim->cpus > 0) {
        what = "cpu.cfs_period_us";
        e = write_file(cg->dir[SBX_CG_CPU], what, "100000");
        if (!e) {
            snprintf(v, sizeof v, "%lld", (long long)(lim->cpus * 100000.0 + 0.5));
            what = "cpu.cfs_quota_us";
            e = write_file(cg->dir[SBX_CG_CPU], what, v);
        }
    }
    if (e) {
        *why = sbx_printf("cannot set %s for a sandbox: %s", what, strerror(e));
        sbx_cgroup_remove(cg);
        sbx_cgroup_forget(cg);
        return -1;
    }
    return 0;
}

int sbx_cgroup_enter(const sbx_cgroup *cg)
{
    char pid[24];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    for (int c = 0; c < SBX_CG_N; c++) {
        if (!cg->dir[c])
            continue;
        int e = write_file(cg->dir[c], "cgroup.procs", pid);
        if (e)
            return e;
    }
    return 0;
}

int sbx_cgroup_freeze(const sbx_cgroup *cg, bool frozen)
{
    const char *dir = cg->dir[SBX_CG_FREEZER];
    if (!dir)
        return -1;
    if (write_file(dir, "freezer.state", frozen ? "FROZEN" : "THAWED") != 0)
        return -1;
    if (!frozen)
        return 0;
    char path[512];
    snprintf(path, sizeof path, "%s/freezer.state", dir);
    /* FREEZING -> FROZEN: a bounded wait on the observable state. */
    for (int ms = 0; ms < FREEZE_WAIT_MS; ms++) {
        char *s = read_path(path);
        bool done = s && strncmp(s, "FROZEN", 6) == 0;
        free(s);
        if (done)
            return 0;
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    write_file(dir, "freezer.state", "THAWED");
    return -1;
}

size_t sbx_cgroup_tasks(const sbx_cgroup *cg, bool kill_them)
{
    size_t n = 0;
    for (int c = 0; c < SBX_CG_N; c++) {
        if (!cg->dir[c])
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/cgroup.procs", cg->dir[c]);
        char *procs = read_path(path);
        for (char *tok = procs ? strtok(procs, "\n") : NULL; tok; tok = strtok(NULL, "\n")) {
            n++;
            if (kill_them)
                kill((pid_t)atoi(tok), SIGKILL);
        }
        free(procs);
    }
    return n;
}

uint64_t sbx_cgroup_oom_kills(sbx_cgroup *cg)
{
    if (!cg->dir[SBX_CG_MEMORY])
        return 0;
    if (!cg->oom_fd1) {
        char path[512];
        snprintf(path, sizeof path, "%s/memory.oom_control", cg->dir[SBX_CG_MEMORY]);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return 0;
        cg->oom_fd1 = fd + 1;
    }
    /* A cgroup file is made afresh by every read from offset 0. */
    char buf[512];
    ssize_t n = pread(cg->oom_fd1 - 1, buf, sizeof buf - 1, 0);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *at = strstr(buf, "oom_kill ");
    return at ? strtoull(at + 9, NULL, 10) : 0;
}

static void close_oom(sbx_cgroup *cg)
{
    if (cg->oom_fd1)
        close(cg->oom_fd1 - 1);
    cg->oom_fd1 = 0;
}

char *sbx_cgroup_read(const sbx_cgroup *cg, int controller, const char *file)
{
    if (controller < 0 || controller >= SBX_CG_N || !cg->dir[controller])
        return NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", cg->dir[controller], file);
    return read_path(path);
}

int sbx_cgroup_remove(sbx_cgroup *cg)
{
    int rc = 0;
    close_oom(cg);              /* (an open file does not keep the group from going) */
    for (int c = 0; c < SBX_CG_N; c++) {
        if (!cg->dir[c])
            continue;
        if (rmdir(cg->dir[c]) != 0 && errno != ENOENT) {
            rc = -1;
            continue;
        }
        free(cg->dir[c]);
        cg->dir[c] = NULL;
    }
    return rc;
}

void sbx_cgroup_forget(sbx_cgroup *cg)
{
    close_oom(cg);
    for (int c = 0; c < SBX_CG_N; c++) {
        free(cg->dir[c]);
        cg->dir[c] = NULL;
    }
}

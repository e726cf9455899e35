/*
 * sbxstate.c — the real providers' host-side state (see sbxstate.h).
 */
#include "sbxstate.h"

#include "log.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- small helpers */

typedef struct deferred {
    ev_timer t;
    void (*fn)(void *);
    void *arg;
} deferred;

static void on_deferred(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    deferred *d = w->data;
    void (*fn)(void *) = d->fn;
    void *arg = d->arg;
    free(d);
    fn(arg);
}

void sbx_defer(struct ev_loop *loop, void (*fn)(void *arg), void *arg)
{
    deferred *d = sbx_xcalloc(1, sizeof *d);
    d->fn = fn;
    d->arg = arg;
    ev_timer_init(&d->t, on_deferred, 0., 0.);
    d->t.data = d;
    ev_timer_start(loop, &d->t);
}

bool sbx_executable(const char *path)
{
    return path && path[0] == '/' && access(path, X_OK) == 0;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if (flag == FTW_DP || flag == FTW_D)
        rmdir(path);
    else
        unlink(path);
    return 0;
}

int sbx_remove_tree(const char *path)
{
    nftw(path, rm_one, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
    return access(path, F_OK) == 0 ? -1 : 0;
}

/* Field 22 of /proc/<pid>/stat, "" when the process is gone. */
static void start_time(pid_t pid, char *out, size_t n)
{
    out[0] = '\0';
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t len = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (len <= 0)
        return;
    buf[len] = '\0';
    char *p = strrchr(buf, ')');
    int field = 2;
    for (char *save = NULL, *tok = p ? strtok_r(p + 1, " ", &save) : NULL; tok;
         tok = strtok_r(NULL, " ", &save))
        if (++field == 22) {
            snprintf(out, n, "%s", tok);
            return;
        }
}

static int write_text(const char *path, const char *text, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd < 0)
        return -1;
    size_t len = strlen(text);
    ssize_t n = write(fd, text, len);
    fchmod(fd, mode);
    return close(fd) == 0 && n == (ssize_t)len ? 0 : -1;
}

static int copy_file(const char *from, const char *to, mode_t mode)
{
    int in = open(from, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return -1;
    int out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
    if (out < 0) {
        close(in);
        return -1;
    }
    char buf[1 << 16];
    ssize_t n;
    int rc = 0;
    while ((n = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)n) != n) {
            rc = -1;
            break;
        }
    if (n < 0)
        rc = -1;
    fchmod(out, mode);
    close(in);
    if (close(out) != 0)
        rc = -1;
    return rc;
}

/* Removes <base>/d<pid>-<start>-* of daemons that are gone. */
static void reap_stale(const char *base, const char *provider,
                       void (*reap)(const char *stale_dir, void *ud), void *reap_ud)
{
    DIR *d = opendir(base);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        int pid;
        char start[32], now[32];
        if (e->d_name[0] != 'd' || sscanf(e->d_name, "d%d-%31[0-9]", &pid, start) != 2)
            continue;
        start_time(pid, now, sizeof now);
        if (*now && strcmp(now, start) == 0)
            continue;
        char *path = sbx_printf("%s/%s", base, e->d_name);
        size_t nl = strlen(e->d_name), pl = strlen(provider);
        if (reap && nl > pl + 1 && e->d_name[nl - pl - 1] == '-' &&
            strcmp(e->d_name + nl - pl, provider) == 0)
            reap(path, reap_ud);
        if (sbx_remove_tree(path) == 0)
            sbx_log("removed the state a stopped sandboxd left (%s)", path);
        free(path);
    }
    closedir(d);
}

/* ---------------------------------------------------------------- the state */

int sbx_state_init(sbx_state *st, const sbx_config *cfg, const char *provider,
                   void (*reap)(const char *stale_dir, void *ud), void *reap_ud, char **why)
{
    memset(st, 0, sizeof *st);
    st->root = geteuid() == 0;
    st->uid = st->root ? (uid_t)cfg->sandbox_uid : geteuid();
    st->gid = st->root ? (gid_t)cfg->sandbox_uid : getegid();
    char *base;
    if (cfg->state_dir) {
        base = sbx_xstrdup(cfg->state_dir);
    } else if (st->root) {
        base = sbx_xstrdup("/run/berth-sandboxd");
    } else {
        const char *tmp = getenv("TMPDIR");
        base = sbx_printf("%s/berth-sandboxd-%u", tmp && *tmp ? tmp : "/tmp", (unsigned)geteuid());
    }
    if (mkdir(base, 0711) != 0 && errno != EEXIST) {
        *why = sbx_printf("cannot create the state directory %s: %s", base, strerror(errno));
        free(base);
        return -1;
    }
    chmod(base, 0711); /* the sandbox uid reaches the supervisor and etc below */
    reap_stale(base, provider, reap, reap_ud);
    char start[32];
    start_time(getpid(), start, sizeof start);
    st->dir = sbx_printf("%s/d%d-%s-%s", base, (int)getpid(), start, provider);
    free(base);
    sbx_remove_tree(st->dir);
    if (mkdir(st->dir, 0711) != 0) {
        *why = sbx_printf("cannot create %s: %s", st->dir, strerror(errno));
        sbx_state_fini(st);
        return -1;
    }
    chmod(st->dir, 0711);
    st->supervisor = sbx_printf("%s/supervisor", st->dir);
    if (copy_file("/proc/self/exe", st->supervisor, 0755) != 0) {
        *why = sbx_printf("cannot copy this binary to %s: %s", st->supervisor, strerror(errno));
        sbx_state_fini(st);
        return -1;
    }
    st->etc = sbx_printf("%s/etc", st->dir);
    char *passwd = sbx_printf("root:x:0:0:root:/root:/usr/sbin/nologin\n"
                              "sandbox:x:%u:%u:sandbox:/work:/bin/sh\n"
                              "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
                              (unsigned)cfg->sandbox_uid, (unsigned)cfg->sandbox_uid);
    char *group = sbx_printf("root:x:0:\nsandbox:x:%u:\nnogroup:x:65534:\n",
                             (unsigned)cfg->sandbox_uid);
    char *p1 = sbx_printf("%s/passwd", st->etc), *p2 = sbx_printf("%s/group", st->etc),
         *p3 = sbx_printf("%s/hosts", st->etc);
    int rc = mkdir(st->etc, 0755) == 0 && write_text(p1, passwd, 0644) == 0 &&
             write_text(p2, group, 0644) == 0 &&
             write_text(p3, "127.0.0.1 localhost sandbox\n::1 localhost\n", 0644) == 0
                 ? 0 : -1;
    if (rc == 0)
        chmod(st->etc, 0755);
    free(passwd);
    free(group);
    free(p1);
    free(p2);
    free(p3);
    if (rc != 0) {
        *why = sbx_printf("cannot write %s: %s", st->etc, strerror(errno));
        sbx_state_fini(st);
        return -1;
    }
    return 0;
}

void sbx_state_fini(sbx_state *st)
{
    if (st->dir)
        sbx_remove_tree(st->dir);
    free(st->dir);
    free(st->supervisor);
    free(st->etc);
    memset(st, 0, sizeof *st);
}

int sbx_state_drop_privileges(const sbx_state *st)
{
    if (!st->root)
        return 0;
    if (setgroups(0, NULL) != 0 || setresgid(st->gid, st->gid, st->gid) != 0 ||
        setresuid(st->uid, st->uid, st->uid) != 0)
        return errno;
    return 0;
}

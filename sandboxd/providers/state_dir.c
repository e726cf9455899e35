/*
 * state_dir.c — the real providers' host-side state (see state_dir.h).
 */
#include "state_dir.h"

#include "log.h"
#include "proc.h"
#include "uids.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
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

/* How deep the removal holds directories open; deeper ones are moved up (below). */
#define REMOVE_MAX_DEPTH 32

typedef struct remover {
    int top;                       /* the tree's root, open */
    dev_t dev;                     /* its file system: mount points are not crossed */
    unsigned moved;                /* directories moved up to `top` so far */
} remover;

/* Empties the directory open as `dfd` (and closes it).  Every step is relative to a
 * directory descriptor and nothing is followed: an entry that is not a directory is
 * unlinked (a symbolic link goes itself, never what it names), and a directory is
 * entered only through openat(O_NOFOLLOW | O_DIRECTORY), so whatever the sandbox swaps
 * in under a name while this runs, the walk never leaves the tree it started in.  A
 * directory deeper than REMOVE_MAX_DEPTH is moved up under the root (renameat between
 * two held descriptors) and emptied by the next pass: the descriptors held stay bounded
 * and ".." is never used. */
static void empty_dir(remover *rm, int dfd, int depth)
{
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *name = e->d_name;
        if (!strcmp(name, ".") || !strcmp(name, ".."))
            continue;
        if (unlinkat(dfd, name, 0) == 0 || errno != EISDIR)
            continue;
        if (depth >= REMOVE_MAX_DEPTH) {
            char up[32];
            snprintf(up, sizeof up, ".sbx-up-%u", rm->moved++);
            renameat2(dfd, name, rm->top, up, RENAME_NOREPLACE); /* the next pass's */
            continue;
        }
        int sub = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0)
            continue;
        struct stat st;
        if (fstat(sub, &st) != 0 || st.st_dev != rm->dev) { /* a mount point: leave it */
            close(sub);
            continue;
        }
        empty_dir(rm, sub, depth + 1);
        unlinkat(dfd, name, AT_REMOVEDIR);
    }
    closedir(d);
}

int sbx_remove_tree(const char *path)
{
    int top = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (top < 0) { /* gone, or no directory: a file or link goes itself */
        if (errno == ENOENT || unlink(path) == 0 || errno == ENOENT)
            return 0;
        return -1;
    }
    remover rm = {.top = top};
    struct stat st;
    int rc = -1;
    /* Passes until the root can go: one removes REMOVE_MAX_DEPTH levels of what was moved
     * up, or what a process still writing there renamed past the walk.  Bounded: a writer
     * that keeps adding wins only a tree that stays (logged by the caller's check). */
    for (int pass = 0; rc != 0 && pass < 1 + (1 << 16) / REMOVE_MAX_DEPTH; pass++) {
        if (fstat(top, &st) != 0)
            break;
        rm.dev = st.st_dev;
        int fd = openat(top, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* its own offset */
        if (fd < 0)
            break;
        empty_dir(&rm, fd, 1);
        if (rmdir(path) == 0 || errno == ENOENT)
            rc = 0;
        else if (errno != ENOTEMPTY && errno != EEXIST)
            break;
    }
    close(top);
    return rc;
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
        sbx_process_start_time(pid, now, sizeof now);
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

/* /etc/passwd and /etc/group of the sandboxes: every uid of the range is "sandbox" (each
 * sandbox runs as one of its own, uids.h). */
static void sandbox_ids(const sbx_config *cfg, char **passwd, char **group)
{
    uint32_t n = sbx_uids_count(cfg);
    if (n > 65536) /* the most --uid-range takes */
        n = 65536;
    size_t cap = 256 + (size_t)n * 64;
    char *p = sbx_xmalloc(cap), *g = sbx_xmalloc(cap);
    size_t pl = (size_t)snprintf(p, cap, "root:x:0:0:root:/root:/usr/sbin/nologin\n");
    size_t gl = (size_t)snprintf(g, cap, "root:x:0:\n");
    for (uint32_t i = 0; i < n; i++) {
        unsigned id = (unsigned)(cfg->sandbox_uid + i);
        pl += (size_t)snprintf(p + pl, cap - pl, "sandbox:x:%u:%u:sandbox:/work:/bin/sh\n", id, id);
        gl += (size_t)snprintf(g + gl, cap - gl, "sandbox:x:%u:\n", id);
    }
    snprintf(p + pl, cap - pl, "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
    snprintf(g + gl, cap - gl, "nogroup:x:65534:\n");
    *passwd = p;
    *group = g;
}

/* The sandboxes' /etc/alternatives: Debian reaches shared libraries through it (NumPy's
 * libblas.so.3 is /usr/lib/…/libblas.so.3 -> /etc/alternatives/… -> /usr/lib/…/blas/…),
 * so the synthetic /etc carries the same links, those that point into /usr only (the
 * sandboxes see /usr and nothing else of the host). */
static void copy_alternatives(const char *etc)
{
    char *dir = sbx_printf("%s/alternatives", etc);
    DIR *d = mkdir(dir, 0755) == 0 ? opendir("/etc/alternatives") : NULL;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char target[PATH_MAX], link[PATH_MAX];
        ssize_t n = readlinkat(dirfd(d), e->d_name, target, sizeof target - 1);
        if (n <= 0)
            continue;
        target[n] = '\0';
        if (strncmp(target, "/usr/", 5) != 0 || strstr(target, "/../"))
            continue;
        snprintf(link, sizeof link, "%s/%s", dir, e->d_name);
        if (symlink(target, link) != 0)
            continue; /* a name too long for the buffer: that alternative is not offered */
    }
    if (d)
        closedir(d);
    free(dir);
}

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
    sbx_process_start_time(getpid(), start, sizeof start);
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
    char *passwd, *group;
    sandbox_ids(cfg, &passwd, &group);
    char *p1 = sbx_printf("%s/passwd", st->etc), *p2 = sbx_printf("%s/group", st->etc),
         *p3 = sbx_printf("%s/hosts", st->etc);
    int rc = mkdir(st->etc, 0755) == 0 && write_text(p1, passwd, 0644) == 0 &&
             write_text(p2, group, 0644) == 0 &&
             write_text(p3, "127.0.0.1 localhost sandbox\n::1 localhost\n", 0644) == 0
                 ? 0 : -1;
    if (rc == 0) {
        copy_alternatives(st->etc);
        /* Debian's matplotlib keeps its defaults there, and will not import without. */
        char *rc_path = sbx_printf("%s/matplotlibrc", st->etc);
        if (access("/etc/matplotlibrc", R_OK) == 0)
            copy_file("/etc/matplotlibrc", rc_path, 0644);
        free(rc_path);
        chmod(st->etc, 0755);
    }
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

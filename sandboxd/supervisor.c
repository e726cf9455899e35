/*
 * supervisor.c — sandboxd's helper inside every sandbox (`sandboxd --berth-supervisor`).
 *
 * One per sandbox, started by the provider as the sandbox's first process: PID 1 of
 * its PID namespace under bubblewrap and gVisor (orphans are reparented to it, and
 * nothing inside can signal it), a child subreaper under the process provider.  It:
 *   - hardens the sandbox from the inside where the provider asks for it (bubblewrap:
 *     mounts the noexec, nosuid, sized tmpfs file systems, drops every capability,
 *     sets no_new_privs and installs the seccomp filter; everywhere: not dumpable,
 *     resource limits), then says HELLO;
 *   - starts one persistent interpreter per language on request, with the kernel
 *     passed in argv and four pipes (stdout, stderr, requests, replies), and relays
 *     a running cell's output to the daemon within its caps (prefix kept, the rest
 *     counted and dropped; output between cells is read and dropped);
 *   - writes a cell's files into the work directory, resolved without following links,
 *     before the code is sent;
 *   - kills an interpreter on request (the daemon's deadline), runs snippets in a fresh
 *     `node -`, and sweeps after every call: every process but itself and the live
 *     interpreters is killed, then the disk is measured.
 * Protocol: sup_proto.h.  One thread, one poll loop; writes to the daemon block
 * (the daemon always reads), writes to interpreters are queued (a wedged interpreter
 * cannot wedge the supervisor).  The daemon's EOF ends the sandbox: everything is
 * killed and the supervisor exits.
 */
#include "kernels.h"
#include "seccomp.h"
#include "sup_proto.h"

#include <dirent.h>
#include <sched.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define N_CHILDREN 4              /* indexed by SUP_LANG_*; 0 unused */
#define START_ERR_KEEP 2048
#define DRAIN_LIMIT (1u << 20)    /* bytes read from a pipe after a cell's end */
#define SWEEP_ROUNDS 50
#define WALK_LIMIT 200000

typedef struct opts {
    const char *mode;             /* bwrap, gvisor, process */
    const char *work;
    const char *python, *node;
    unsigned work_mb, tmp_mb, shm_mb, mem_mb, nofile, nproc, as_mb;
    bool mount_tmpfs, drop_caps, seccomp, subreaper, walk_disk;
} opts;

typedef struct outq {             /* bytes waiting for a non-blocking fd */
    unsigned char *data;
    size_t len, off;
    bool close_after;             /* a snippet's stdin: closed once written */
} outq;

typedef struct child {
    int lang;
    pid_t pid;                    /* 0: none */
    int phase;                    /* SUP_PHASE_*, or -1 when none */
    int in_w, ctl_r, out_r, err_r;
    outq inq;
    unsigned char *ctl;           /* frames from the kernel */
    size_t ctl_len, ctl_cap;
    char nonce[SUP_NONCE_LEN];
    uint32_t out_cap, err_cap;
    uint64_t out_n, err_n;
    char start_err[START_ERR_KEEP];
    size_t start_err_len;
    const char *broke;            /* why the supervisor killed it, or NULL */
} child;

static opts O;
static child kids[N_CHILDREN];
static int sigfd = -1;
static int workfd = -1;
static unsigned char *down;       /* frames from the daemon */
static size_t down_len, down_cap;

/* ---------------------------------------------------------------- small helpers */

static void die(const char *fmt, const char *arg)
{
    char line[512];
    int n = snprintf(line, sizeof line, "berth-supervisor: ");
    n += snprintf(line + n, sizeof line - (size_t)n, fmt, arg ? arg : "", strerror(errno));
    if (n > (int)sizeof line - 2)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    (void)!write(2, line, (size_t)n);
    _exit(3);
}

static void write_all(int fd, const void *data, size_t len)
{
    const unsigned char *p = data;
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            _exit(0); /* the daemon is gone: nothing left to serve */
        }
        p += n;
        len -= (size_t)n;
    }
}

/* One frame to the daemon: header and payload in one write where they fit. */
static void send_frame(int type, int lang, const void *payload, size_t len)
{
    unsigned char buf[8192];
    size_t total = 2 + len;
    sup_put32(buf, (uint32_t)total);
    buf[4] = (unsigned char)type;
    buf[5] = (unsigned char)lang;
    if (len <= sizeof buf - 6) {
        if (len)
            memcpy(buf + 6, payload, len);
        write_all(1, buf, 6 + len);
    } else {
        write_all(1, buf, 6);
        write_all(1, payload, len);
    }
}

static void set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static void outq_add(outq *q, const void *data, size_t len)
{
    if (q->off == q->len) {
        q->off = q->len = 0;
    }
    unsigned char *d = realloc(q->data, q->len + len);
    if (!d)
        die("out of memory%s", NULL);
    q->data = d;
    memcpy(q->data + q->len, data, len);
    q->len += len;
}

static void outq_clear(outq *q)
{
    free(q->data);
    memset(q, 0, sizeof *q);
}

static unsigned parse_uint(const char *s)
{
    return (unsigned)strtoul(s, NULL, 10);
}

/* ---------------------------------------------------------------- hardening */

static void mount_tmpfs(const char *where, unsigned mb)
{
    char data[64];
    snprintf(data, sizeof data, "size=%um,mode=1777", mb);
    if (mount("tmpfs", where, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, data) != 0)
        die("mount tmpfs on %s: %s", where);
}

static void drop_capabilities(void)
{
    int last = 40;
    FILE *f = fopen("/proc/sys/kernel/cap_last_cap", "r");
    if (f) {
        if (fscanf(f, "%d", &last) != 1)
            last = 40;
        fclose(f);
    }
    for (int c = 0; c <= last; c++)
        if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) != 0 && errno != EINVAL)
            die("dropping capability bounding set%s: %s", NULL);
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    memset(d, 0, sizeof d);
    if (syscall(SYS_capset, &h, d) != 0)
        die("capset%s: %s", NULL);
}

static void set_limit(int resource, rlim_t v)
{
    struct rlimit r = {v, v};
    setrlimit(resource, &r);
}

static void harden(void)
{
    if (O.mount_tmpfs) {
        /* bubblewrap's mount namespace belongs to the user namespace above ours (it
         * maps the uid in two steps): a namespace of our own, where our capabilities
         * count, takes the new mounts.  What bubblewrap mounted stays locked. */
        if (unshare(CLONE_NEWNS) != 0)
            die("unshare a mount namespace%s: %s", NULL);
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
            die("private mounts%s: %s", NULL);
        mount_tmpfs(O.work, O.work_mb);
        mount_tmpfs("/tmp", O.tmp_mb);
        mount_tmpfs("/dev/shm", O.shm_mb);
    }
    if (O.subreaper)
        prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    /* Not dumpable: processes of the same uid cannot ptrace the supervisor or open its
     * pipes to the daemon through /proc/1/fd. */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    set_limit(RLIMIT_CORE, 0);
    if (O.nofile)
        set_limit(RLIMIT_NOFILE, O.nofile);
    if (O.nproc)
        set_limit(RLIMIT_NPROC, O.nproc);
    if (O.drop_caps)
        drop_capabilities();
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        die("no_new_privs%s: %s", NULL);
    if (O.seccomp) {
        char why[256];
        if (sbx_seccomp_install(why, sizeof why) != 0) {
            errno = 0;
            die("%s", why);
        }
    }
    workfd = open(O.work, O.mount_tmpfs ? O_RDONLY | O_DIRECTORY | O_CLOEXEC
                                        : O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (workfd < 0 || fchdir(workfd) != 0)
        die("work directory %s: %s", O.work);
}

/* ---------------------------------------------------------------- children */

static void child_reset(child *k)
{
    close_fd(&k->in_w);
    close_fd(&k->ctl_r);
    close_fd(&k->out_r);
    close_fd(&k->err_r);
    outq_clear(&k->inq);
    free(k->ctl);
    int lang = k->lang;
    memset(k, 0, sizeof *k);
    k->lang = lang;
    k->phase = -1;
    k->in_w = k->ctl_r = k->out_r = k->err_r = -1;
}

static const char *const child_env[] = {
    "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "LC_ALL=C.UTF-8", "TMPDIR=/tmp",
    "PYTHONIOENCODING=utf-8", NULL, NULL,
};

/* Moves `fd` to at least 10 (close-on-exec), so dup2 onto 0..4 never meets itself. */
static int high(int fd)
{
    int h = fcntl(fd, F_DUPFD_CLOEXEC, 10);
    return h < 0 ? fd : h;
}

/* Starts argv with fd 0 = stdin_r (or /dev/null), 1/2 = pipes, 3/4 = ctl pipes when
 * ctl is set.  Returns 0 or -1 (errno). */
static int spawn(child *k, char *const argv[], bool ctl, bool with_stdin)
{
    int in[2] = {-1, -1}, req[2] = {-1, -1}, rep[2] = {-1, -1}, out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0)
        return -1;
    if (pipe2(err, O_CLOEXEC) != 0) {
        close(out[0]);
        close(out[1]);
        return -1;
    }
    if ((with_stdin && pipe2(in, O_CLOEXEC) != 0) ||
        (ctl && (pipe2(req, O_CLOEXEC) != 0 || pipe2(rep, O_CLOEXEC) != 0))) {
        int e = errno;
        int all[] = {out[0], out[1], err[0], err[1], in[0], in[1], req[0], req[1], rep[0], rep[1]};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            if (all[i] >= 0)
                close(all[i]);
        errno = e;
        return -1;
    }
    char home[600];
    snprintf(home, sizeof home, "HOME=%s", O.work);
    const char *env[sizeof child_env / sizeof child_env[0]];
    memcpy(env, child_env, sizeof env);
    env[5] = home;
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        int all[] = {out[0], out[1], err[0], err[1], in[0], in[1], req[0], req[1], rep[0], rep[1]};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            if (all[i] >= 0)
                close(all[i]);
        errno = e;
        return -1;
    }
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        setsid(); /* its own process group: a kill reaches what it started */
        int i0 = with_stdin ? high(in[0]) : open("/dev/null", O_RDONLY | O_CLOEXEC);
        int o1 = high(out[1]), e2 = high(err[1]);
        int r3 = ctl ? high(req[0]) : -1, w4 = ctl ? high(rep[1]) : -1;
        if (i0 < 0 || dup2(i0, 0) < 0 || dup2(o1, 1) < 0 || dup2(e2, 2) < 0 ||
            (ctl && (dup2(r3, 3) < 0 || dup2(w4, 4) < 0)))
            _exit(126);
        syscall(SYS_close_range, ctl ? 5 : 3, ~0u, 0);
        if (O.as_mb && k->lang == SUP_LANG_PY)
            set_limit(RLIMIT_AS, (rlim_t)O.as_mb << 20);
        execve(argv[0], argv, (char *const *)env);
        char msg[300];
        int n = snprintf(msg, sizeof msg, "cannot start %s: %s\n", argv[0], strerror(errno));
        (void)!write(2, msg, (size_t)n);
        _exit(127);
    }
    close(out[1]);
    close(err[1]);
    if (with_stdin)
        close(in[0]);
    if (ctl) {
        close(req[0]);
        close(rep[1]);
    }
    k->pid = pid;
    k->out_r = out[0];
    k->err_r = err[0];
    k->in_w = with_stdin ? in[1] : ctl ? req[1] : -1;
    k->ctl_r = ctl ? rep[0] : -1;
    set_nonblock(k->out_r);
    set_nonblock(k->err_r);
    if (k->in_w >= 0)
        set_nonblock(k->in_w);
    if (k->ctl_r >= 0)
        set_nonblock(k->ctl_r);
    return 0;
}

static void start_interpreter(int lang)
{
    child *k = &kids[lang];
    if (k->pid) { /* already there (the daemon asked twice): say so once it is ready */
        if (k->phase == SUP_PHASE_IDLE) {
            unsigned char p[4];
            sup_put32(p, (uint32_t)k->pid);
            send_frame(SUP_STARTED, lang, p, 4);
        }
        return;
    }
    child_reset(k);
    char heap[48];
    snprintf(heap, sizeof heap, "--max-old-space-size=%u", O.mem_mb ? O.mem_mb * 3 / 4 : 2048);
    char *py[] = {(char *)O.python, "-I", "-c", (char *)sbx_kernel_py, NULL};
    char *js[] = {(char *)O.node, "--expose-internals", "--experimental-vm-modules",
                  "--disable-warning=ExperimentalWarning", heap, "-e", (char *)sbx_kernel_js, NULL};
    if (spawn(k, lang == SUP_LANG_PY ? py : js, true, false) != 0) {
        unsigned char p[7 + 200];
        sup_put32(p, (uint32_t)(127 << 8));
        p[4] = SUP_PHASE_STARTING;
        p[5] = p[6] = 0;
        int n = snprintf((char *)p + 7, 200, "cannot start the interpreter: %s", strerror(errno));
        send_frame(SUP_EXITED, lang, p, 7 + (size_t)n);
        child_reset(k);
        return;
    }
    k->phase = SUP_PHASE_STARTING;
}

/* Forwards bytes of a running cell within its cap; counts the rest. */
static void relay(child *k, int type, const unsigned char *data, size_t n)
{
    uint64_t *count = type == SUP_OUT ? &k->out_n : &k->err_n;
    uint32_t cap = type == SUP_OUT ? k->out_cap : k->err_cap;
    if (k->phase != SUP_PHASE_RUNNING) {
        if (k->phase == SUP_PHASE_STARTING && type == SUP_ERR) { /* why it may not start */
            size_t room = START_ERR_KEEP - k->start_err_len;
            size_t take = n < room ? n : room;
            memcpy(k->start_err + k->start_err_len, data, take);
            k->start_err_len += take;
        }
        return; /* output between cells is dropped */
    }
    size_t fwd = 0;
    if (*count < cap)
        fwd = cap - *count < n ? (size_t)(cap - *count) : n;
    *count += n;
    if (fwd)
        send_frame(type, k->lang, data, fwd);
}

/* Reads what `fd` holds now (bounded), relaying it.  Returns false at EOF. */
static bool pump(child *k, int *fd, int type, size_t limit)
{
    static unsigned char buf[SUP_CHUNK];
    size_t got = 0;
    while (*fd >= 0 && got < limit) {
        ssize_t n = read(*fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return true; /* EAGAIN: nothing more now */
        if (n == 0) {
            close_fd(fd);
            return false;
        }
        got += (size_t)n;
        relay(k, type, buf, (size_t)n);
    }
    return true;
}

static void drain(child *k)
{
    pump(k, &k->out_r, SUP_OUT, DRAIN_LIMIT);
    pump(k, &k->err_r, SUP_ERR, DRAIN_LIMIT);
}

static void kill_child(child *k, const char *why)
{
    if (!k->pid)
        return;
    if (why && !k->broke)
        k->broke = why;
    kill(-k->pid, SIGKILL);
    kill(k->pid, SIGKILL);
}

static void on_exit_of(child *k, int status)
{
    drain(k);
    if (k->lang == SUP_LANG_EXEC) {
        unsigned char p[6];
        sup_put32(p, (uint32_t)status);
        p[4] = k->out_n > k->out_cap;
        p[5] = k->err_n > k->err_cap;
        send_frame(SUP_EXEC_DONE, SUP_LANG_EXEC, p, 6);
    } else {
        unsigned char p[7 + START_ERR_KEEP];
        sup_put32(p, (uint32_t)status);
        p[4] = (unsigned char)(k->phase < 0 ? SUP_PHASE_IDLE : k->phase);
        p[5] = k->out_n > k->out_cap;
        p[6] = k->err_n > k->err_cap;
        size_t n = 0;
        if (k->broke) {
            n = strlen(k->broke);
            memcpy(p + 7, k->broke, n);
        } else if (k->phase == SUP_PHASE_STARTING) {
            n = k->start_err_len;
            memcpy(p + 7, k->start_err, n);
        }
        send_frame(SUP_EXITED, k->lang, p, 7 + n);
    }
    /* Leftovers of its process group go too (the sweep would find them anyway). */
    kill(-k->pid, SIGKILL);
    child_reset(k);
}

static void reap(void)
{
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0)
            return;
        for (int l = 1; l < N_CHILDREN; l++)
            if (kids[l].pid == pid)
                on_exit_of(&kids[l], status);
    }
}

/* Frames from a kernel: "R" ready, "D" + status + nonce. */
static void on_kernel_frames(child *k)
{
    unsigned char buf[4096];
    for (;;) {
        ssize_t n = read(k->ctl_r, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0)
                close_fd(&k->ctl_r); /* it closed its replies: it is going; SIGCHLD tells */
            break;
        }
        if (k->ctl_len + (size_t)n > 4096) {
            kill_child(k, "the interpreter broke the frame protocol (oversized reply)");
            return;
        }
        if (k->ctl_cap < k->ctl_len + (size_t)n) {
            k->ctl_cap = 4096;
            unsigned char *c = realloc(k->ctl, k->ctl_cap);
            if (!c)
                die("out of memory%s", NULL);
            k->ctl = c;
        }
        memcpy(k->ctl + k->ctl_len, buf, (size_t)n);
        k->ctl_len += (size_t)n;
    }
    while (k->ctl_len >= 4) {
        uint32_t size = sup_get32(k->ctl);
        if (size == 0 || size > 64) {
            kill_child(k, "the interpreter broke the frame protocol (bad reply length)");
            return;
        }
        if (k->ctl_len < 4 + size)
            break;
        const unsigned char *body = k->ctl + 4;
        if (body[0] == 'R' && size == 1 && k->phase == SUP_PHASE_STARTING) {
            k->phase = SUP_PHASE_IDLE;
            unsigned char p[4];
            sup_put32(p, (uint32_t)k->pid);
            send_frame(SUP_STARTED, k->lang, p, 4);
        } else if (body[0] == 'D' && size == 2 + SUP_NONCE_LEN && k->phase == SUP_PHASE_RUNNING &&
                   (body[1] == '0' || body[1] == '1') &&
                   memcmp(body + 2, k->nonce, SUP_NONCE_LEN) == 0) {
            drain(k); /* what the cell wrote before its end is in the pipes now */
            unsigned char p[3] = {(unsigned char)(body[1] - '0'), k->out_n > k->out_cap,
                                  k->err_n > k->err_cap};
            k->phase = SUP_PHASE_IDLE;
            send_frame(SUP_DONE, k->lang, p, 3);
        } else {
            kill_child(k, "the interpreter broke the frame protocol (a reply out of turn)");
            return;
        }
        memmove(k->ctl, k->ctl + 4 + size, k->ctl_len - 4 - size);
        k->ctl_len -= 4 + size;
    }
}

static void flush_input(child *k);

/* ---------------------------------------------------------------- files */

static const char *errno_code(int e)
{
    switch (e) {
    case ENOSPC:
    case EDQUOT:
        return "ENOSPC";
    case ELOOP:
    case ENOTDIR:
    case EISDIR:
    case EXDEV:
    case ENAMETOOLONG:
    case EINVAL:
        return "EPATH";
    case EACCES:
    case EPERM:
    case EROFS:
        return "EACCES";
    case EMFILE:
    case ENFILE:
        return "EMFILE";
    default:
        return "EIO";
    }
}

/* Writes one file under the work directory: every component opened relative to its
 * parent with O_NOFOLLOW (a link planted by an earlier cell is refused, never
 * followed), directories created 0755, the file truncated and written 0644. */
static int write_file(const unsigned char *path, size_t plen, const unsigned char *data, size_t len)
{
    char p[1100];
    if (plen == 0 || plen >= sizeof p || memchr(path, 0, plen) || path[0] == '/')
        return EINVAL;
    memcpy(p, path, plen);
    p[plen] = '\0';
    int dir = dup(workfd);
    if (dir < 0)
        return errno;
    char *comp = p;
    for (;;) {
        char *slash = strchr(comp, '/');
        if (!slash)
            break;
        *slash = '\0';
        if (!*comp || !strcmp(comp, ".") || !strcmp(comp, "..")) {
            close(dir);
            return EINVAL;
        }
        int next = openat(dir, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (next < 0 && errno == ENOENT) {
            if (mkdirat(dir, comp, 0755) != 0 && errno != EEXIST) {
                int e = errno;
                close(dir);
                return e;
            }
            next = openat(dir, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        }
        int e = errno;
        close(dir);
        if (next < 0)
            return e;
        dir = next;
        comp = slash + 1;
    }
    if (!*comp || !strcmp(comp, ".") || !strcmp(comp, "..")) {
        close(dir);
        return EINVAL;
    }
    int fd = openat(dir, comp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    int e = errno;
    close(dir);
    if (fd < 0)
        return e;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return EINVAL;
    }
    fchmod(fd, 0644);
    while (len) {
        ssize_t n = write(fd, data, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            e = errno;
            close(fd);
            return e;
        }
        data += n;
        len -= (size_t)n;
    }
    if (close(fd) != 0)
        return errno;
    return 0;
}

/* ---------------------------------------------------------------- requests */

static void on_cell(int lang, const unsigned char *pl, size_t len)
{
    child *k = &kids[lang];
    sup_reader r = {pl, len, 1};
    uint32_t out_cap = sup_read32(&r), err_cap = sup_read32(&r);
    const unsigned char *nonce = sup_read_bytes(&r, SUP_NONCE_LEN);
    uint32_t n_files = sup_read32(&r);
    if (!r.ok || n_files > 10000) {
        errno = 0;
        die("a malformed cell frame%s", NULL);
    }
    if (k->phase != SUP_PHASE_IDLE) {
        unsigned char p[3] = {SUP_STATUS_NO_INTERPRETER, 0, 0};
        send_frame(SUP_DONE, lang, p, 3);
        return;
    }
    for (uint32_t i = 0; i < n_files; i++) {
        uint32_t plen = sup_read32(&r);
        const unsigned char *path = sup_read_bytes(&r, plen);
        uint32_t clen = sup_read32(&r);
        const unsigned char *content = sup_read_bytes(&r, clen);
        if (!r.ok) {
            errno = 0;
            die("a malformed cell frame%s", NULL);
        }
        int e = write_file(path, plen, content, clen);
        if (e) {
            const char *code = errno_code(e);
            unsigned char p[4 + 16];
            sup_put32(p, i);
            size_t cl = strlen(code);
            memcpy(p + 4, code, cl);
            send_frame(SUP_FILES_FAILED, lang, p, 4 + cl);
            return;
        }
    }
    /* The request to the kernel: length, nonce, code. */
    size_t code_len = r.left;
    unsigned char head[4];
    sup_put32(head, (uint32_t)(SUP_NONCE_LEN + code_len));
    outq_add(&k->inq, head, 4);
    outq_add(&k->inq, nonce, SUP_NONCE_LEN);
    if (code_len)
        outq_add(&k->inq, r.p, code_len);
    memcpy(k->nonce, nonce, SUP_NONCE_LEN);
    k->out_cap = out_cap;
    k->err_cap = err_cap;
    k->out_n = k->err_n = 0;
    k->phase = SUP_PHASE_RUNNING;
    flush_input(k);
}

static void on_exec(const unsigned char *pl, size_t len)
{
    child *k = &kids[SUP_LANG_EXEC];
    sup_reader r = {pl, len, 1};
    uint32_t out_cap = sup_read32(&r), err_cap = sup_read32(&r);
    if (!r.ok) {
        errno = 0;
        die("a malformed exec frame%s", NULL);
    }
    if (k->pid) {
        kill_child(k, NULL);
        return;
    }
    child_reset(k);
    char heap[48];
    snprintf(heap, sizeof heap, "--max-old-space-size=%u", O.mem_mb ? O.mem_mb * 3 / 4 : 2048);
    char *argv[] = {(char *)O.node, heap, "-", NULL};
    k->out_cap = out_cap;
    k->err_cap = err_cap;
    if (spawn(k, argv, false, true) != 0) {
        unsigned char p[6];
        sup_put32(p, (uint32_t)(127 << 8));
        p[4] = p[5] = 0;
        send_frame(SUP_EXEC_DONE, SUP_LANG_EXEC, p, 6);
        child_reset(k);
        return;
    }
    k->phase = SUP_PHASE_RUNNING;
    if (r.left)
        outq_add(&k->inq, r.p, r.left);
    k->inq.close_after = true;
    flush_input(k);
}

/* ---------------------------------------------------------------- sweep */

typedef struct proc_info {
    pid_t pid, ppid;
    char state;
} proc_info;

/* Every process of /proc, read now.  Returns how many (into *out, malloc'd). */
static size_t scan_proc(proc_info **out)
{
    size_t n = 0, cap = 64;
    proc_info *v = malloc(cap * sizeof *v);
    DIR *d = opendir("/proc");
    if (!v || !d) {
        free(v);
        if (d)
            closedir(d);
        *out = NULL;
        return (size_t)-1;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0)
            continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue; /* gone meanwhile */
        ssize_t len = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (len <= 0)
            continue;
        buf[len] = '\0';
        char *rp = strrchr(buf, ')');
        char st;
        long ppid;
        if (!rp || sscanf(rp + 1, " %c %ld", &st, &ppid) != 2)
            continue;
        if (n == cap) {
            cap *= 2;
            proc_info *w = realloc(v, cap * sizeof *v);
            if (!w)
                break;
            v = w;
        }
        v[n++] = (proc_info){(pid_t)pid, (pid_t)ppid, st};
    }
    closedir(d);
    *out = v;
    return n;
}

static bool is_kept(pid_t pid)
{
    for (int l = 1; l < N_CHILDREN; l++)
        if (kids[l].pid == pid && l != SUP_LANG_EXEC)
            return true;
    return false;
}

/* Kills every descendant of the supervisor but the live interpreters (their own
 * children included), until a scan finds none alive.  Returns how many were killed;
 * *clean tells whether the last scan proved them gone. */
static uint32_t sweep(bool *clean)
{
    uint32_t killed = 0;
    pid_t self = getpid();
    *clean = false;
    /* A snippet still running (the daemon gave up on it) goes first. */
    kill_child(&kids[SUP_LANG_EXEC], NULL);
    for (int round = 0; round < SWEEP_ROUNDS; round++) {
        reap();
        proc_info *v;
        size_t n = scan_proc(&v);
        if (n == (size_t)-1)
            return killed;
        /* Mark the descendants of self (a few passes over the parent links). */
        bool *desc = calloc(n ? n : 1, sizeof *desc);
        if (!desc) {
            free(v);
            return killed;
        }
        for (bool grew = true; grew;) {
            grew = false;
            for (size_t i = 0; i < n; i++) {
                if (desc[i] || v[i].pid == self)
                    continue;
                bool parent_in = v[i].ppid == self;
                for (size_t j = 0; j < n && !parent_in; j++)
                    parent_in = desc[j] && v[j].pid == v[i].ppid;
                if (parent_in)
                    desc[i] = grew = true;
            }
        }
        size_t strays = 0;
        for (size_t i = 0; i < n; i++) {
            if (!desc[i] || is_kept(v[i].pid) || v[i].state == 'Z' || v[i].state == 'X')
                continue;
            strays++;
            if (kill(v[i].pid, SIGKILL) == 0)
                killed++;
        }
        free(desc);
        free(v);
        if (strays == 0) {
            *clean = true;
            return killed;
        }
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return killed;
}

static uint64_t fs_used(const char *path)
{
    struct statfs s;
    if (statfs(path, &s) != 0)
        return 0;
    return (uint64_t)(s.f_blocks - s.f_bfree) * (uint64_t)s.f_bsize;
}

/* Bytes under a directory (lstat blocks), at most WALK_LIMIT entries; UINT64_MAX when
 * it cannot be measured. */
static uint64_t walk(int at, size_t *entries)
{
    int fd = dup(at);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return UINT64_MAX;
    }
    uint64_t sum = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (++*entries > WALK_LIMIT) {
            closedir(d);
            return UINT64_MAX;
        }
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        sum += (uint64_t)st.st_blocks * 512u;
        if (S_ISDIR(st.st_mode)) {
            int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0)
                continue;
            uint64_t s = walk(sub, entries);
            close(sub);
            if (s == UINT64_MAX) {
                closedir(d);
                return UINT64_MAX;
            }
            sum += s;
        }
    }
    closedir(d);
    return sum;
}

static void on_sweep(void)
{
    bool clean;
    uint32_t killed = sweep(&clean);
    uint64_t used;
    if (O.walk_disk) {
        size_t entries = 0;
        used = walk(workfd, &entries);
    } else {
        used = fs_used(O.work) + fs_used("/tmp") + fs_used("/dev/shm");
    }
    unsigned char p[13];
    sup_put32(p, killed);
    p[4] = clean;
    sup_put64(p + 5, used);
    send_frame(SUP_SWEPT, SUP_LANG_NONE, p, sizeof p);
}

/* ---------------------------------------------------------------- the loop */

static void shutdown_all(void)
{
    for (int l = 1; l < N_CHILDREN; l++)
        kill_child(&kids[l], NULL);
    if (getpid() == 1) {
        kill(-1, SIGKILL); /* PID 1: everything else in the namespace */
    } else {
        bool clean;
        sweep(&clean);
    }
    _exit(0);
}

static void on_frame(int type, int lang, const unsigned char *pl, size_t len)
{
    bool interp = lang == SUP_LANG_JS || lang == SUP_LANG_PY;
    switch (type) {
    case SUP_START:
        if (interp)
            start_interpreter(lang);
        break;
    case SUP_CELL:
        if (interp)
            on_cell(lang, pl, len);
        break;
    case SUP_KILL:
        if (interp || lang == SUP_LANG_EXEC)
            kill_child(&kids[lang], NULL);
        break;
    case SUP_SWEEP:
        on_sweep();
        break;
    case SUP_EXEC:
        on_exec(pl, len);
        break;
    default:
        errno = 0;
        die("an unknown frame from the daemon%s", NULL);
    }
}

static void on_daemon_input(void)
{
    if (down_cap - down_len < SUP_CHUNK) {
        size_t cap = down_cap ? down_cap * 2 : 2 * SUP_CHUNK;
        unsigned char *d = realloc(down, cap);
        if (!d)
            die("out of memory%s", NULL);
        down = d;
        down_cap = cap;
    }
    ssize_t n = read(0, down + down_len, down_cap - down_len);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n <= 0)
        shutdown_all(); /* the daemon closed the sandbox (or is gone) */
    down_len += (size_t)n;
    size_t at = 0;
    while (down_len - at >= 4) {
        uint32_t size = sup_get32(down + at);
        if (size < 2 || size > SUP_MAX_DOWN_FRAME) {
            errno = 0;
            die("a frame of a bad size from the daemon%s", NULL);
        }
        if (down_len - at < 4 + (size_t)size)
            break;
        on_frame(down[at + 4], down[at + 5], down + at + 6, size - 2);
        at += 4 + size;
    }
    memmove(down, down + at, down_len - at);
    down_len -= at;
}

static void flush_input(child *k)
{
    outq *q = &k->inq;
    while (k->in_w >= 0 && q->off < q->len) {
        ssize_t n = write(k->in_w, q->data + q->off, q->len - q->off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            if (errno != EAGAIN)
                close_fd(&k->in_w); /* it closed its input: it is going */
            return;
        }
        q->off += (size_t)n;
    }
    if (q->off == q->len) {
        q->off = q->len = 0;
        if (q->close_after)
            close_fd(&k->in_w);
    }
}

static void parse_opts(int argc, char **argv)
{
    O = (opts){.mode = "process", .work = "/work", .python = "/usr/bin/python3",
               .node = "/usr/bin/node", .work_mb = 128, .tmp_mb = 16, .shm_mb = 16,
               .mem_mb = 256, .nofile = 4096};
    for (int i = 0; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (!eq)
            continue;
        *eq = '\0';
        const char *k = argv[i], *v = eq + 1;
        if (!strcmp(k, "mode"))
            O.mode = v;
        else if (!strcmp(k, "work"))
            O.work = v;
        else if (!strcmp(k, "python"))
            O.python = v;
        else if (!strcmp(k, "node"))
            O.node = v;
        else if (!strcmp(k, "work_mb"))
            O.work_mb = parse_uint(v);
        else if (!strcmp(k, "tmp_mb"))
            O.tmp_mb = parse_uint(v);
        else if (!strcmp(k, "shm_mb"))
            O.shm_mb = parse_uint(v);
        else if (!strcmp(k, "mem_mb"))
            O.mem_mb = parse_uint(v);
        else if (!strcmp(k, "nofile"))
            O.nofile = parse_uint(v);
        else if (!strcmp(k, "nproc"))
            O.nproc = parse_uint(v);
        else if (!strcmp(k, "as_mb"))
            O.as_mb = parse_uint(v);
    }
    if (!strcmp(O.mode, "bwrap")) {
        O.mount_tmpfs = O.drop_caps = O.seccomp = true;
    } else if (!strcmp(O.mode, "process")) {
        O.subreaper = O.walk_disk = true;
    }
}

int sbx_supervisor_main(int argc, char **argv)
{
    parse_opts(argc, argv);
    for (int l = 0; l < N_CHILDREN; l++) {
        kids[l].lang = l;
        kids[l].in_w = kids[l].ctl_r = kids[l].out_r = kids[l].err_r = -1;
        child_reset(&kids[l]);
    }
    signal(SIGPIPE, SIG_IGN);
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    sigfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sigfd < 0)
        die("signalfd%s: %s", NULL);
    /* Never leak the daemon's pipes into what we start. */
    fcntl(0, F_SETFD, FD_CLOEXEC);
    fcntl(1, F_SETFD, FD_CLOEXEC);
    harden();
    unsigned char hello[4];
    sup_put32(hello, SUP_PROTOCOL);
    send_frame(SUP_HELLO, SUP_LANG_NONE, hello, 4);

    for (;;) {
        struct pollfd pf[2 + 4 * N_CHILDREN];
        child *owner[2 + 4 * N_CHILDREN];
        int what[2 + 4 * N_CHILDREN];
        nfds_t n = 0;
        pf[n] = (struct pollfd){0, POLLIN, 0};
        owner[n] = NULL;
        what[n++] = 0;
        pf[n] = (struct pollfd){sigfd, POLLIN, 0};
        owner[n] = NULL;
        what[n++] = 1;
        for (int l = 1; l < N_CHILDREN; l++) {
            child *k = &kids[l];
            if (!k->pid)
                continue;
            int fds[4] = {k->ctl_r, k->out_r, k->err_r, k->in_w};
            for (int i = 0; i < 4; i++) {
                if (fds[i] < 0)
                    continue;
                if (i == 3 && k->inq.off == k->inq.len)
                    continue;
                pf[n] = (struct pollfd){fds[i], (short)(i == 3 ? POLLOUT : POLLIN), 0};
                owner[n] = k;
                what[n++] = 2 + i;
            }
        }
        if (poll(pf, n, -1) < 0) {
            if (errno == EINTR)
                continue;
            die("poll%s: %s", NULL);
        }
        for (nfds_t i = 0; i < n; i++) {
            if (!pf[i].revents)
                continue;
            child *k = owner[i];
            if (k && !k->pid)
                continue; /* ended while handling an earlier fd */
            switch (what[i]) {
            case 0:
                on_daemon_input();
                break;
            case 1: {
                struct signalfd_siginfo si;
                while (read(sigfd, &si, sizeof si) == sizeof si) {
                }
                reap();
                break;
            }
            case 2:
                if (k->ctl_r >= 0)
                    on_kernel_frames(k);
                break;
            case 3:
                pump(k, &k->out_r, SUP_OUT, 4 * SUP_CHUNK);
                break;
            case 4:
                pump(k, &k->err_r, SUP_ERR, 4 * SUP_CHUNK);
                break;
            case 5:
                flush_input(k);
                break;
            }
        }
    }
}

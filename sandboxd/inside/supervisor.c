/*
 * supervisor.c — sandboxd's helper inside every sandbox (`sandboxd --berth-supervisor`).
 *
 * One per sandbox, started by the provider as the sandbox's first process: PID 1 of
 * its PID namespace under bubblewrap and gVisor (orphans are reparented to it, and
 * nothing inside can signal it), a child subreaper under the process provider.  It:
 *   - hardens the sandbox from the inside where the provider asks for it (bubblewrap:
 *     mounts the noexec, nosuid, sized tmpfs file systems in a mount namespace of its
 *     own and drops every capability; bubblewrap and gVisor: installs the seccomp
 *     filter, which gVisor's kernel enforces there; everywhere: no_new_privs, not
 *     dumpable, resource limits), then says HELLO;
 *   - starts one persistent kernel per language on request, with its stdout and stderr
 *     on the language's FIFOs (the kernel opens its request and reply FIFOs itself, so
 *     cells go from the daemon to the kernel and back without passing through here);
 *   - writes a cell's files into the work directory, resolved without following links;
 *   - kills a kernel on request (the daemon's deadline) and reports every kernel's end;
 *   - runs snippets in a fresh `node -` and project steps in `/bin/sh -c`, relaying
 *     their output within caps, and reads a project's artifacts back;
 *   - sweeps after every call: every process but itself and the live kernels is killed
 *     (proven gone by a scan of /proc), then the disk is measured; before a project in
 *     a session the kernels go too.
 * Protocol: sup_proto.h.  One thread, one poll loop; writes to the daemon block (the
 * daemon always reads), a snippet's stdin is fed without blocking.  The daemon's EOF
 * ends the sandbox: everything is killed and the supervisor exits.
 */
#include "frames.h"
#include "kernels.h"
#include "seccomp.h"
#include "sup_proto.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SWEEP_ROUNDS 50
#define WALK_LIMIT 200000

typedef struct opts {
    const char *mode;             /* bwrap, gvisor, process */
    const char *work, *io;
    const char *python, *node;
    unsigned work_mb, tmp_mb, shm_mb, mem_mb, nofile, nproc, as_mb;
    unsigned uid, gid;            /* when started as root: what everything it starts runs as */
    bool mount_tmpfs, drop_caps, seccomp, subreaper, walk_disk, count_tasks;
    bool watch_memory;            /* gvisor: the kernels' memory is watched from here */
} opts;

typedef struct snippet {          /* a `node -` run (SUP_EXEC) or a step (SUP_STEP) */
    pid_t pid;
    int in_w, out_r, err_r;
    unsigned char *in;            /* the code, fed to its stdin */
    size_t in_len, in_off;
    uint32_t cap[2];
    uint64_t n[2];
    unsigned char *kept[2];
    size_t kept_len[2];
} snippet;

static opts O;
static pid_t kernel[3];           /* by SUP_LANG_JS / SUP_LANG_PY; 0: none */
static snippet snip;
static int sigfd = -1;
static int workfd = -1;
static bool quiescing;            /* this sweep kills the kernels too */
static bool memory_killed[3];     /* the watch ended this kernel (by language) */
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

/* One frame to the daemon, in one write where it fits. */
static void send_frame(int type, int lang, const void *payload, size_t len)
{
    unsigned char buf[8192];
    sup_put32(buf, (uint32_t)(2 + len));
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

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static unsigned parse_uint(const char *s)
{
    return (unsigned)strtoul(s, NULL, 10);
}

static void set_limit(int resource, rlim_t v)
{
    struct rlimit r = {v, v};
    setrlimit(resource, &r);
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

/* ---------------------------------------------------------------- processes */

/* A sandbox has one CPU: numerical libraries run one thread.  (Debian's OpenBLAS
 * otherwise starts a thread per host core, each with its buffers, and a Python kernel
 * that imports SciPy then meets its address-space limit.) */
static const char *const child_env[] = {
    "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "LC_ALL=C.UTF-8", "TMPDIR=/tmp",
    "PYTHONIOENCODING=utf-8", "OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1",
    "MPLBACKEND=Agg", NULL, NULL, NULL,
};

/* Moves `fd` to at least 10 (close-on-exec), so dup2 onto 0..2 never meets itself. */
static int high(int fd)
{
    int h = fd < 0 ? -1 : fcntl(fd, F_DUPFD_CLOEXEC, 10);
    return h < 0 ? fd : h;
}

/* Forks and execs argv with fds 0, 1, 2 (-1: /dev/null) in a process group of its own,
 * `extra` (NULL or "NAME=value") added to its environment.  Returns the pid, or -1
 * (errno). */
static pid_t spawn(char *const argv[], int fd0, int fd1, int fd2, rlim_t as_limit,
                   const char *extra)
{
    char home[600];
    snprintf(home, sizeof home, "HOME=%s", O.work);
    const char *env[sizeof child_env / sizeof child_env[0]];
    memcpy(env, child_env, sizeof env);
    env[8] = home;
    env[9] = extra;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    setsid(); /* its own process group: a kill reaches what it started */
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    int f0 = high(fd0 >= 0 ? fd0 : null), f1 = high(fd1 >= 0 ? fd1 : null),
        f2 = high(fd2 >= 0 ? fd2 : null);
    if (f0 < 0 || f1 < 0 || f2 < 0 || dup2(f0, 0) < 0 || dup2(f1, 1) < 0 || dup2(f2, 2) < 0)
        _exit(126);
    syscall(SYS_close_range, 3, ~0u, 0);
    if (as_limit)
        set_limit(RLIMIT_AS, as_limit);
    if (O.nproc)
        set_limit(RLIMIT_NPROC, O.nproc);
    if (getuid() == 0 && O.uid && /* the supervisor's own uid stays out of the cell's reach */
        (setgroups(0, NULL) != 0 || setresgid(O.gid, O.gid, O.gid) != 0 ||
         setresuid(O.uid, O.uid, O.uid) != 0))
        _exit(126);
    /* Ends with the supervisor, however that one ends (killed by force while stopped,
     * with no group to kill the rest): set after the uid change, which clears it. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) /* it ended before that took hold */
        _exit(126);
    execve(argv[0], argv, (char *const *)env);
    char msg[300];
    int n = snprintf(msg, sizeof msg, "cannot start %s: %s\n", argv[0], strerror(errno));
    (void)!write(2, msg, (size_t)n);
    _exit(127);
}

/* While the supervisor (root of a gVisor sandbox, with only CAP_SETUID, CAP_SETGID and
 * CAP_KILL) touches what the cells own -- their FIFOs, their files -- it does so as
 * their uid: files are theirs, and it can reach nothing they could not. */
static void as_cells(bool on)
{
    if (getuid() != 0 || !O.uid)
        return;
    int e = errno;
    if (on) { /* the effective ids only: the real and saved ones stay 0 to come back */
        if (setresgid((gid_t)-1, O.gid, (gid_t)-1) != 0 || setresuid((uid_t)-1, O.uid, (uid_t)-1) != 0)
            die("cannot take the cells' uid%s: %s", NULL);
    } else if (setresuid((uid_t)-1, 0, (uid_t)-1) != 0 || setresgid((gid_t)-1, 0, (gid_t)-1) != 0) {
        die("cannot leave the cells' uid%s: %s", NULL);
    }
    errno = e;
}

static void report_exit(int lang, int status, const char *text)
{
    unsigned char p[4 + 256];
    sup_put32(p, (uint32_t)status);
    size_t n = text ? strlen(text) : 0;
    if (n > 256)
        n = 256;
    if (n)
        memcpy(p + 4, text, n);
    send_frame(SUP_EXITED, lang, p, 4 + n);
}

/* Opens a kernel's output FIFO for writing.  The daemon holds it open for reading, so
 * the open never waits; but the directory is the cells' (same uid), and a FIFO or link
 * a cell put in its place must not hold the supervisor: O_NONBLOCK and O_NOFOLLOW, the
 * type checked on the descriptor, then blocking again for the kernel's writes. */
static int open_output_fifo(const char *path)
{
    int fd = open(path, O_WRONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode) ||
                    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)) {
        close(fd);
        errno = EINVAL;
        return -1;
    }
    return fd;
}

static void start_kernel(int lang, const unsigned char *token, size_t len)
{
    if (len != SUP_TOKEN_LEN || kernel[lang])
        return; /* one kernel per language: the daemon knows */
    const char *l = lang == SUP_LANG_PY ? "py" : "js";
    char prefix[600], tok[SUP_TOKEN_LEN + 1], path[620];
    snprintf(prefix, sizeof prefix, "%s/%s", O.io, l);
    memcpy(tok, token, SUP_TOKEN_LEN);
    tok[SUP_TOKEN_LEN] = '\0';
    as_cells(true);
    snprintf(path, sizeof path, "%s-out", prefix);
    int out = open_output_fifo(path);
    snprintf(path, sizeof path, "%s-err", prefix);
    int err = open_output_fifo(path);
    as_cells(false);
    if (out < 0 || err < 0) {
        char why[300];
        snprintf(why, sizeof why, "cannot open the %s output FIFOs: %s", l, strerror(errno));
        if (out >= 0)
            close(out);
        if (err >= 0)
            close(err);
        report_exit(lang, 127 << 8, why);
        return;
    }
    char heap[48];
    snprintf(heap, sizeof heap, "--max-old-space-size=%u", O.mem_mb ? O.mem_mb * 3 / 4 : 2048);
    const char *argv[24];
    bool py = lang == SUP_LANG_PY;
    if (!sbx_kernel_argv(argv, sizeof argv / sizeof *argv, py, py ? O.python : O.node,
                         py ? NULL : heap, prefix, tok)) {
        close(out);
        close(err);
        report_exit(lang, 127 << 8, "the interpreter's command line is too long");
        return;
    }
    /* (execve's argv is char *const[] for C's history; nothing writes these strings) */
    pid_t pid = spawn((char *const *)argv, -1, out, err, py ? (rlim_t)O.as_mb << 20 : 0, NULL);
    int e = errno;
    close(out);
    close(err);
    if (pid < 0) {
        char why[300];
        snprintf(why, sizeof why, "cannot start the interpreter: %s", strerror(e));
        report_exit(lang, 127 << 8, why);
        return;
    }
    kernel[lang] = pid;
}

static void kill_group(pid_t pid)
{
    if (pid > 0) {
        kill(-pid, SIGKILL);
        kill(pid, SIGKILL);
    }
}

/* ---------------------------------------------------------------- snippets */

static void snippet_reset(void)
{
    close_fd(&snip.in_w);
    close_fd(&snip.out_r);
    close_fd(&snip.err_r);
    free(snip.in);
    free(snip.kept[0]);
    free(snip.kept[1]);
    memset(&snip, 0, sizeof snip);
    snip.in_w = snip.out_r = snip.err_r = -1;
}

static void feed_snippet(void)
{
    while (snip.in_w >= 0 && snip.in_off < snip.in_len) {
        ssize_t n = write(snip.in_w, snip.in + snip.in_off, snip.in_len - snip.in_off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            if (errno != EAGAIN)
                close_fd(&snip.in_w); /* it closed its stdin */
            return;
        }
        snip.in_off += (size_t)n;
    }
    close_fd(&snip.in_w); /* all of it: EOF */
}

/* Reads what a snippet's pipe holds now, keeping a prefix within the cap. */
static void pump_snippet(int i)
{
    int *fd = i == 0 ? &snip.out_r : &snip.err_r;
    unsigned char buf[SUP_CHUNK];
    for (int rounds = 0; *fd >= 0 && rounds < 64; rounds++) {
        ssize_t n = read(*fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return;
        if (n == 0) {
            close_fd(fd);
            return;
        }
        size_t take = 0;
        if (snip.n[i] < snip.cap[i])
            take = snip.cap[i] - snip.n[i] < (uint64_t)n ? (size_t)(snip.cap[i] - snip.n[i]) : (size_t)n;
        snip.n[i] += (uint64_t)n;
        if (take) {
            unsigned char *k = realloc(snip.kept[i], snip.kept_len[i] + take);
            if (!k)
                die("out of memory%s", NULL);
            memcpy(k + snip.kept_len[i], buf, take);
            snip.kept[i] = k;
            snip.kept_len[i] += take;
        }
    }
}

static void snippet_done(int status)
{
    pump_snippet(0);
    pump_snippet(1);
    for (int i = 0; i < 2; i++)
        for (size_t off = 0; off < snip.kept_len[i];) {
            size_t n = snip.kept_len[i] - off < SUP_CHUNK ? snip.kept_len[i] - off : SUP_CHUNK;
            send_frame(i == 0 ? SUP_OUT : SUP_ERR, SUP_LANG_EXEC, snip.kept[i] + off, n);
            off += n;
        }
    unsigned char p[6];
    sup_put32(p, (uint32_t)status);
    p[4] = snip.n[0] > snip.cap[0];
    p[5] = snip.n[1] > snip.cap[1];
    send_frame(SUP_EXEC_DONE, SUP_LANG_EXEC, p, 6);
    kill(-snip.pid, SIGKILL); /* what it left in its group goes too */
    snippet_reset();
}

/* A snippet (`node -`, the code on its stdin) or a project step (`/bin/sh -c STEP`,
 * stdin /dev/null: the step's own words, never fed).  A step's Node gets the heap limit
 * a snippet's has, through NODE_OPTIONS: an address-space limit would stop Node from
 * starting at all, so a step has none (the sandbox's memory limit holds). */
static void start_snippet(const unsigned char *pl, size_t len, bool step)
{
    sup_reader r = {pl, len, 1};
    uint32_t out_cap = sup_read32(&r), err_cap = sup_read32(&r);
    if (!r.ok) {
        errno = 0;
        die("a malformed exec frame%s", NULL);
    }
    if (snip.pid)
        return; /* one at a time: the daemon knows */
    snippet_reset();
    char *cmd = NULL;
    if (step) { /* the command as a C string: the daemon never sends a NUL in one */
        cmd = malloc(r.left + 1);
        if (!cmd)
            die("out of memory%s", NULL);
        memcpy(cmd, r.p, r.left);
        cmd[r.left] = '\0';
        r.left = 0;
    }
    int in[2], out[2], err[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
        unsigned char p[6] = {0, 127, 0, 0, 0, 0};
        send_frame(SUP_EXEC_DONE, SUP_LANG_EXEC, p, 6);
        free(cmd);
        return;
    }
    char heap[48], node_options[64];
    snprintf(heap, sizeof heap, "--max-old-space-size=%u", O.mem_mb ? O.mem_mb * 3 / 4 : 2048);
    snprintf(node_options, sizeof node_options, "NODE_OPTIONS=%s", heap);
    char *snippet_argv[] = {(char *)O.node, heap, "-", NULL};
    char *step_argv[] = {"/bin/sh", "-c", cmd, NULL};
    pid_t pid = step ? spawn(step_argv, -1, out[1], err[1], 0, node_options)
                     : spawn(snippet_argv, in[0], out[1], err[1], 0, NULL);
    free(cmd);
    close(in[0]);
    close(out[1]);
    close(err[1]);
    if (pid < 0) {
        close(in[1]);
        close(out[0]);
        close(err[0]);
        unsigned char p[6] = {0, 127, 0, 0, 0, 0};
        send_frame(SUP_EXEC_DONE, SUP_LANG_EXEC, p, 6);
        return;
    }
    snip.pid = pid;
    snip.in_w = in[1];
    snip.out_r = out[0];
    snip.err_r = err[0];
    fcntl(snip.in_w, F_SETFL, O_NONBLOCK);
    fcntl(snip.out_r, F_SETFL, O_NONBLOCK);
    fcntl(snip.err_r, F_SETFL, O_NONBLOCK);
    snip.cap[0] = out_cap;
    snip.cap[1] = err_cap;
    if (r.left) {
        snip.in = malloc(r.left);
        if (!snip.in)
            die("out of memory%s", NULL);
        memcpy(snip.in, r.p, r.left);
        snip.in_len = r.left;
    }
    feed_snippet();
}

/* ---------------------------------------------------------------- memory watch */

/* Under gVisor no host limit reaches Node's Buffers: gVisor ignores RLIMIT_DATA, an
 * address-space limit keeps V8 from starting, and the sandbox's host cgroup is sized
 * for --pids ptrace stubs.  So while a kernel lives the supervisor reads its resident
 * size every MEMORY_WATCH_MS and ends it once past the sandbox's --memory-mb; the cell
 * is told it ran out of memory.  (bwrap and process: one cgroup holds the sandbox to
 * that limit, and no watch runs.) */
#define MEMORY_WATCH_MS 50

/* Each kernel's statm is opened once and read again at offset 0, which makes procfs
 * write it anew: one system call a check instead of four (open, stat, read, close).
 * Under gVisor each is a ptrace stop, and an idle sandbox pays them every
 * MEMORY_WATCH_MS (docs/performance.md).  A kernel's fd goes when it is reaped, so a
 * new kernel with the old one's pid never reads the dead one's. */
static int statm_fd[3] = {-1, -1, -1};

static void forget_statm(int l)
{
    if (statm_fd[l] >= 0)
        close(statm_fd[l]);
    statm_fd[l] = -1;
}

static unsigned long resident_kb(int l)
{
    if (statm_fd[l] < 0) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/statm", (int)kernel[l]);
        statm_fd[l] = open(path, O_RDONLY | O_CLOEXEC);
        if (statm_fd[l] < 0)
            return 0;
    }
    char text[128];
    ssize_t n = pread(statm_fd[l], text, sizeof text - 1, 0);
    unsigned long size = 0, resident = 0;
    if (n <= 0)
        return 0;
    text[n] = '\0';
    if (sscanf(text, "%lu %lu", &size, &resident) != 2)
        return 0;
    return resident * (unsigned long)(sysconf(_SC_PAGESIZE) / 1024);
}

static bool a_kernel_lives(void)
{
    return kernel[SUP_LANG_JS] > 0 || kernel[SUP_LANG_PY] > 0;
}

static void watch_memory(void)
{
    for (int l = SUP_LANG_JS; l <= SUP_LANG_PY; l++)
        if (kernel[l] > 0 && !memory_killed[l] &&
            resident_kb(l) > (unsigned long)O.mem_mb * 1024) {
            memory_killed[l] = true;
            kill(-kernel[l], SIGKILL);
            kill(kernel[l], SIGKILL);
        }
}

static void reap(void)
{
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0)
            return;
        for (int l = SUP_LANG_JS; l <= SUP_LANG_PY; l++)
            if (kernel[l] == pid) {
                kernel[l] = 0;
                forget_statm(l);
                kill(-pid, SIGKILL); /* what it started goes with it */
                char why[160];
                snprintf(why, sizeof why, "out of memory: its resident memory passed the "
                                          "sandbox's limit of %u MiB", O.mem_mb);
                report_exit(l, status, memory_killed[l] ? why : NULL);
                memory_killed[l] = false;
            }
        if (snip.pid == pid)
            snippet_done(status);
    }
}

/* ---------------------------------------------------------------- files */

/* write_file's own refusal: the path names something other than a regular file (a
 * FIFO, a socket, a device), which is never opened for writing. */
#define E_NOT_REGULAR (-1)

static const char *errno_code(int e)
{
    switch (e) {
    case E_NOT_REGULAR:
        return "ENOTREG";
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

/* Opens the directory that holds `path` (relative to the work directory) and points
 * *leaf at its last component: every component opened relative to its parent with
 * O_NOFOLLOW (a link planted by an earlier cell is refused, never followed), missing
 * directories created 0755 when `create`.  Every open is O_NONBLOCK: a FIFO an earlier
 * cell made would otherwise hold the supervisor in open() (and with it every kill) until
 * someone reads it.  Returns 0 with *dir_out, or an errno. */
static int open_parent(char *p, bool create, int *dir_out, char **leaf)
{
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
        struct stat lst;
        if (fstatat(dir, comp, &lst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(lst.st_mode)) {
            close(dir); /* a link is never followed (every kernel says so the same way) */
            return ELOOP;
        }
        int next = openat(dir, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (next < 0 && errno == ENOENT && create) {
            if (mkdirat(dir, comp, 0755) != 0 && errno != EEXIST) {
                int e = errno;
                close(dir);
                return e;
            }
            next = openat(dir, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
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
    struct stat lst;
    if (fstatat(dir, comp, &lst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(lst.st_mode)) {
        close(dir);
        return ELOOP;
    }
    *dir_out = dir;
    *leaf = comp;
    return 0;
}

/* A path from a frame as a C string in `p` (size n); false when it cannot be one. */
static bool frame_path(const unsigned char *path, size_t plen, char *p, size_t n)
{
    if (plen == 0 || plen >= n || memchr(path, 0, plen) || path[0] == '/')
        return false;
    memcpy(p, path, plen);
    p[plen] = '\0';
    return true;
}

/* Writes one file under the work directory (see open_parent), the file truncated and
 * written 0644.  The type is checked on the descriptor, before anything is truncated
 * or written. */
static int write_file(const unsigned char *path, size_t plen, const unsigned char *data, size_t len)
{
    char p[1100], *comp;
    int dir;
    if (!frame_path(path, plen, p, sizeof p))
        return EINVAL;
    int e = open_parent(p, true, &dir, &comp);
    if (e)
        return e;
    struct stat lst;
    if (fstatat(dir, comp, &lst, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(lst.st_mode)) {
        close(dir); /* refused by name already; the descriptor's check below decides */
        return S_ISDIR(lst.st_mode) ? EISDIR : E_NOT_REGULAR;
    }
    int fd = openat(dir, comp, O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    e = errno;
    close(dir);
    if (fd < 0) /* ENXIO: a FIFO or a socket nobody reads, swapped in after the check */
        return e == ENXIO ? E_NOT_REGULAR : e;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return E_NOT_REGULAR;
    }
    if (ftruncate(fd, 0) != 0) {
        e = errno;
        close(fd);
        return e;
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

static void read_done(int status, uint64_t size)
{
    unsigned char p[9];
    p[0] = (unsigned char)status;
    sup_put64(p + 1, size);
    send_frame(SUP_READ_DONE, SUP_LANG_EXEC, p, sizeof p);
}

/* A project's artifact: a regular file under the work directory, reached without
 * following a link (a link a step planted cannot pull in a file from elsewhere), read
 * whole when it holds at most the bytes asked for, sent in chunks.  Anything else -- a
 * missing file, a link, a directory, a FIFO -- is skipped, as the reference's runner
 * skips it. */
static void read_artifact(const unsigned char *pl, size_t len)
{
    sup_reader r = {pl, len, 1};
    uint32_t max = sup_read32(&r);
    if (!r.ok) {
        errno = 0;
        die("a malformed read frame%s", NULL);
    }
    char p[1100], *comp;
    int dir = -1, fd = -1;
    if (!frame_path(r.p, r.left, p, sizeof p)) {
        read_done(SUP_READ_SKIPPED, 0);
        return;
    }
    as_cells(true);
    if (open_parent(p, false, &dir, &comp) == 0) {
        fd = openat(dir, comp, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        close(dir);
    }
    as_cells(false);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (fd >= 0)
            close(fd);
        read_done(SUP_READ_SKIPPED, 0);
        return;
    }
    if ((uint64_t)st.st_size > max) {
        close(fd);
        read_done(SUP_READ_OVER, (uint64_t)st.st_size);
        return;
    }
    /* Read whole before anything is sent: a file that grows past `max` meanwhile is
     * over, never half an artifact. */
    unsigned char *buf = malloc((size_t)max + 1);
    if (!buf)
        die("out of memory%s", NULL);
    size_t got = 0;
    while (got <= max) {
        ssize_t n = read(fd, buf + got, (size_t)max + 1 - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    if (got > max) {
        free(buf);
        read_done(SUP_READ_OVER, got);
        return;
    }
    for (size_t off = 0; off < got;) {
        size_t n = got - off < SUP_CHUNK ? got - off : SUP_CHUNK;
        send_frame(SUP_OUT, SUP_LANG_EXEC, buf + off, n);
        off += n;
    }
    free(buf);
    read_done(SUP_READ_OK, got);
}

/* ---------------------------------------------------------------- requests */

static void write_files(int lang, const unsigned char *pl, size_t len)
{
    sup_files fs;
    sup_file f;
    int got;
    if (!sup_files_begin(&fs, pl, len)) {
        errno = 0;
        die("a malformed files frame%s", NULL);
    }
    for (uint32_t i = 0; (got = sup_files_next(&fs, &f)) != 0; i++) {
        if (got < 0) {
            errno = 0;
            die("a malformed files frame%s", NULL);
        }
        as_cells(true);
        int e = write_file(f.path, f.path_len, f.content, f.content_len);
        as_cells(false);
        if (e) {
            const char *code = errno_code(e);
            unsigned char p[4 + 16];
            size_t cl = strlen(code);
            sup_put32(p, i);
            memcpy(p + 4, code, cl);
            send_frame(SUP_FILES_DONE, lang, p, 4 + cl); /* the rest is not written */
            return;
        }
    }
    unsigned char p[4];
    sup_put32(p, SUP_FILES_ALL_WRITTEN);
    send_frame(SUP_FILES_DONE, lang, p, 4);
}

/* ---------------------------------------------------------------- sweep */

static bool is_kept(pid_t pid)
{
    return !quiescing && pid > 0 && (pid == kernel[SUP_LANG_JS] || pid == kernel[SUP_LANG_PY]);
}

struct linux_dirent64 {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

/* The pids /proc lists now, or NULL.  /proc stays open between sweeps and is read
 * with getdents64 directly: under gVisor's ptrace platform every system call costs
 * tens of microseconds, and a sweep follows every call. */
static pid_t *list_pids(size_t *n)
{
    static int procfd = -1;
    static unsigned char buf[32768];
    if (procfd < 0)
        procfd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    size_t cap = 16;
    pid_t *v = malloc(cap * sizeof *v);
    *n = 0;
    if (!v || procfd < 0 || lseek(procfd, 0, SEEK_SET) != 0) {
        free(v);
        return NULL;
    }
    for (;;) {
        long got = syscall(SYS_getdents64, procfd, buf, sizeof buf);
        if (got < 0) {
            free(v);
            return NULL;
        }
        if (got == 0)
            return v;
        for (long at = 0; at < got;) {
            struct linux_dirent64 *e = (struct linux_dirent64 *)(buf + at);
            at += e->d_reclen;
            char *end;
            long pid = strtol(e->d_name, &end, 10);
            if (*end || pid <= 0)
                continue;
            if (*n == cap) {
                cap *= 2;
                pid_t *w = realloc(v, cap * sizeof *v);
                if (!w) {
                    free(v);
                    return NULL;
                }
                v = w;
            }
            v[(*n)++] = (pid_t)pid;
        }
    }
}

/* Parent and state of a process, from /proc/<pid>/stat; false when it is gone. */
static bool proc_stat(pid_t pid, pid_t *ppid, char *state)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t len = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (len <= 0)
        return false;
    buf[len] = '\0';
    char *rp = strrchr(buf, ')');
    long pp;
    if (!rp || sscanf(rp + 1, " %c %ld", state, &pp) != 2)
        return false;
    *ppid = (pid_t)pp;
    return true;
}

/* Kills every descendant of the supervisor but the live kernels (their own children
 * included), until a scan finds none alive.  In a PID namespace of its own (PID 1)
 * every other process is a descendant, and a scan that lists only the supervisor and
 * the kernels is the proof, without reading any of them.  Returns how many were
 * killed; *clean tells whether the last scan proved them gone. */
static uint32_t sweep(bool *clean)
{
    uint32_t killed = 0;
    pid_t self = getpid();
    bool pid1 = self == 1;
    *clean = false;
    kill_group(snip.pid); /* a snippet the daemon gave up on */
    for (int round = 0; round < SWEEP_ROUNDS; round++) {
        if (round)
            reap(); /* zombies show as such in the scan: no need before the first */
        size_t n;
        pid_t *v = list_pids(&n);
        if (!v)
            return killed;
        pid_t *ppid = calloc(n ? n : 1, sizeof *ppid);
        char *state = calloc(n ? n : 1, 1);
        bool *desc = calloc(n ? n : 1, sizeof *desc);
        if (!ppid || !state || !desc) {
            free(v);
            free(ppid);
            free(state);
            free(desc);
            return killed;
        }
        size_t strays = 0, ours = 0;
        for (size_t i = 0; i < n; i++) {
            if (v[i] == self)
                continue;
            if (pid1) { /* everyone here descends from PID 1 */
                desc[i] = !is_kept(v[i]);
            } else if (!proc_stat(v[i], &ppid[i], &state[i])) {
                continue; /* gone meanwhile */
            }
        }
        if (!pid1) { /* mark the descendants of self through the parent links */
            for (size_t i = 0; i < n; i++)
                desc[i] = v[i] != self && ppid[i] == self;
            for (bool grew = true; grew;) {
                grew = false;
                for (size_t i = 0; i < n; i++) {
                    if (desc[i] || v[i] == self)
                        continue;
                    for (size_t j = 0; j < n; j++)
                        if (desc[j] && v[j] == ppid[i]) {
                            desc[i] = grew = true;
                            break;
                        }
                }
            }
        }
        for (size_t i = 0; i < n; i++) {
            if (!desc[i] || is_kept(v[i]))
                continue;
            if (pid1 && !proc_stat(v[i], &ppid[i], &state[i]))
                continue; /* gone meanwhile */
            if (state[i] == 'Z' || state[i] == 'X') {
                /* Dead, not yet reaped by its parent.  When that is us (a killed
                 * interpreter, or what it started, handed to PID 1), it is reaped before
                 * the verdict (the next round's reap): a zombie still answers kill(pid,
                 * 0), so what runs next (a project's step) would take it for alive. */
                ours += ppid[i] == self;
                continue;
            }
            strays++;
            if (kill(v[i], SIGKILL) == 0)
                killed++;
        }
        free(v);
        free(ppid);
        free(state);
        free(desc);
        /* Our zombies wait for their last threads (a killed node's) to exit before
         * they can be reaped: look again shortly while rounds remain; dead, they never
         * make a sweep unclean. */
        if (strays == 0 && (ours == 0 || round == SWEEP_ROUNDS - 1)) {
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


/* Tasks (threads) in the sandbox, from sysinfo: under gVisor it counts the sandbox's
 * own, not the host's.  0 when unknown. */
static unsigned tasks_now(void)
{
    struct sysinfo si;
    return sysinfo(&si) == 0 ? si.procs : 0;
}

/* Bytes on the sandbox's writable file systems: the work directory walked when it is a
 * host directory (the process provider), else the three tmpfs' own counts. */
static uint64_t disk_used(void)
{
    if (O.walk_disk) {
        size_t entries = 0;
        return walk(workfd, &entries);
    }
    return fs_used(O.work) + fs_used("/tmp") + fs_used("/dev/shm");
}

/* SUP_SWEPT: processes killed, whether the strays are proven gone, bytes on disk. */
static void send_swept(uint32_t killed, bool clean, uint64_t used)
{
    unsigned char p[13];
    sup_put32(p, killed);
    p[4] = clean;
    sup_put64(p + 5, used);
    send_frame(SUP_SWEPT, SUP_LANG_NONE, p, sizeof p);
}

static void on_sweep(const unsigned char *pl, size_t len)
{
    /* gVisor: when the sandbox holds exactly as many tasks as right after the last
     * sweep that proved it clean, no process was left behind (one system call instead
     * of a scan).  A task gone while another came shows as equal -- a kernel's own
     * thread ending while its cell's child lives -- so a call that may have started a
     * process is always scanned; one that goes around the kernels' hint to hide a
     * leftover can, but only inside its own session, still within the sandbox's
     * limits. */
    static unsigned baseline;
    unsigned flags = len >= 1 ? pl[0] : 0;
    if (O.count_tasks && baseline && !(flags & (SUP_SWEEP_MEASURE | SUP_SWEEP_THOROUGH)) &&
        tasks_now() == baseline) {
        send_swept(0, true, 0);
        return;
    }
    /* The disk alone: the kernel said its cell started no process (docs/daemon.md
     * §5.4), and the daemon asks only for a budget the file systems' sizes do not hold.
     * Nothing was scanned, so the gVisor baseline stays as the last scan left it. */
    if ((flags & SUP_SWEEP_MEASURE) && !(flags & (SUP_SWEEP_THOROUGH | SUP_SWEEP_KERNELS))) {
        send_swept(0, true, disk_used());
        return;
    }
    bool clean;
    quiescing = (flags & SUP_SWEEP_KERNELS) != 0;
    if (quiescing)
        for (int l = SUP_LANG_JS; l <= SUP_LANG_PY; l++)
            kill_group(kernel[l]);
    uint32_t killed = sweep(&clean);
    if (quiescing) /* the kernels' ends are told before the verdict */
        reap();
    quiescing = false;
    baseline = clean && O.count_tasks ? tasks_now() : 0;
    send_swept(killed, clean, flags & SUP_SWEEP_MEASURE ? disk_used() : 0);
}

/* ---------------------------------------------------------------- the loop */

static void shutdown_all(void)
{
    for (int l = SUP_LANG_JS; l <= SUP_LANG_PY; l++)
        kill_group(kernel[l]);
    kill_group(snip.pid);
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
            start_kernel(lang, pl, len);
        return;
    case SUP_FILES:
        if (interp || lang == SUP_LANG_EXEC)
            write_files(lang, pl, len);
        return;
    case SUP_KILL:
        if (interp)
            kill_group(kernel[lang]);
        else if (lang == SUP_LANG_EXEC)
            kill_group(snip.pid);
        return;
    case SUP_SWEEP:
        on_sweep(pl, len);
        return;
    case SUP_EXEC:
    case SUP_STEP:
        start_snippet(pl, len, type == SUP_STEP);
        return;
    case SUP_READ:
        read_artifact(pl, len);
        return;
    case SUP_WAKE: /* reading it was the point: the daemon claimed this sandbox */
        return;
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
    for (;;) {
        sup_frame f;
        sup_split got = sup_frame_split(down + at, down_len - at, 2, SUP_MAX_DOWN_FRAME, &f);
        if (got == SUP_SPLIT_BAD) {
            errno = 0;
            die("a frame of a bad size from the daemon%s", NULL);
        }
        if (got == SUP_SPLIT_MORE)
            break;
        on_frame(f.body[0], f.body[1], f.body + 2, f.body_len - 2);
        at += f.used;
    }
    memmove(down, down + at, down_len - at);
    down_len -= at;
    if (down_cap > 4 * SUP_CHUNK && down_len < SUP_CHUNK) { /* give back a big buffer */
        down_cap = 2 * SUP_CHUNK;
        unsigned char *d = realloc(down, down_cap);
        if (d)
            down = d;
    }
}

static void parse_opts(int argc, char **argv)
{
    O = (opts){.mode = "process", .work = "/work", .io = "/.berth/io",
               .python = "/usr/bin/python3", .node = "/usr/bin/node", .work_mb = 128,
               .tmp_mb = 16, .shm_mb = 16, .mem_mb = 256, .nofile = 4096};
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
        else if (!strcmp(k, "io"))
            O.io = v;
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
        else if (!strcmp(k, "uid"))
            O.uid = parse_uint(v);
        else if (!strcmp(k, "gid"))
            O.gid = parse_uint(v);
    }
    O.watch_memory = !strcmp(O.mode, "gvisor") && O.mem_mb > 0;
    if (!strcmp(O.mode, "bwrap")) {
        O.mount_tmpfs = O.drop_caps = O.seccomp = true;
    } else if (!strcmp(O.mode, "process")) {
        O.subreaper = O.walk_disk = true;
    } else if (!strcmp(O.mode, "gvisor")) {
        O.count_tasks = O.seccomp = true;
    }
}

int sbx_supervisor_main(int argc, char **argv)
{
    parse_opts(argc, argv);
    umask(022); /* not the daemon's: what cells make is theirs to share as they like */
    snip.in_w = snip.out_r = snip.err_r = -1;
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
        struct pollfd pf[5] = {{0, POLLIN, 0}, {sigfd, POLLIN, 0}, {snip.out_r, POLLIN, 0},
                               {snip.err_r, POLLIN, 0}, {snip.in_w, POLLOUT, 0}};
        int wait_ms = O.watch_memory && a_kernel_lives() ? MEMORY_WATCH_MS : -1;
        if (poll(pf, 5, wait_ms) < 0) {
            if (errno == EINTR)
                continue;
            die("poll%s: %s", NULL);
        }
        if (O.watch_memory)
            watch_memory();
        if (pf[2].revents)
            pump_snippet(0);
        if (pf[3].revents)
            pump_snippet(1);
        if (pf[4].revents)
            feed_snippet();
        if (pf[1].revents) {
            struct signalfd_siginfo si;
            while (read(sigfd, &si, sizeof si) == sizeof si) {
            }
            reap();
        }
        if (pf[0].revents)
            on_daemon_input();
    }
}

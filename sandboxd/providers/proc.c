/*
 * proc.c — child processes on the loop (see proc.h).
 */
#include "proc.h"

#include "sanitizer.h" /* lib/ */
#include "util.h"

#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CMD_ERR_KEEP 4096

/* ---------------------------------------------------------------- spawning */

/* Moves fd to at least 3 (close-on-exec), so dup2 onto 0..2 never meets itself. */
static int lift(int fd)
{
    if (fd < 0 || fd > 2)
        return fd;
    int h = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    return h < 0 ? fd : h;
}

typedef struct spawn_ctx {
    const sbx_spawn *sp;
    pid_t parent;
} spawn_ctx;

/* The child's side, between the clone and the exec.  It shares the daemon's memory
 * (CLONE_VM) while the daemon waits (CLONE_VFORK): it runs on its own stack, allocates
 * nothing, and first sets back to the default every handler the daemon installed, so
 * that no signal runs the daemon's handlers on the daemon's memory from here. */
static _Noreturn int spawn_child(void *arg)
{
    static const char *const empty_env[] = {NULL};
    const spawn_ctx *c = arg;
    const sbx_spawn *sp = c->sp;
    for (int sig = 1; sig < NSIG; sig++) {
        struct sigaction sa;
        if (sigaction(sig, NULL, &sa) == 0 && sa.sa_handler != SIG_DFL &&
            sa.sa_handler != SIG_IGN) {
            sa.sa_handler = SIG_DFL;
            sa.sa_flags = 0;
            sigaction(sig, &sa, NULL);
        }
    }
    signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (sp->die_with_parent) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != c->parent)
            _exit(127);
    }
    if (sp->new_session)
        setsid();
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    int f0 = lift(sp->fd0 >= 0 ? sp->fd0 : null), f1 = lift(sp->fd1 >= 0 ? sp->fd1 : null),
        f2 = lift(sp->fd2 >= 0 ? sp->fd2 : null);
    if (f0 < 0 || f1 < 0 || f2 < 0 || dup2(f0, 0) < 0 || dup2(f1, 1) < 0 || dup2(f2, 2) < 0)
        _exit(127);
    syscall(SYS_close_range, 3, ~0u, 0);
    const char *what = "run";
    int e = 0;
    if (sp->preexec && (e = sp->preexec(sp->preexec_ud)) != 0) {
        what = "prepare";
    } else {
        execve(sp->argv[0], (char *const *)sp->argv,
               (char *const *)(sp->envp ? sp->envp : empty_env));
        e = errno;
    }
    char line[512];
    int n = snprintf(line, sizeof line, "sandboxd: cannot %s %s: %s\n", what, sp->argv[0],
                     strerrordesc_np(e) ? strerrordesc_np(e) : "unknown error");
    if (n > (int)sizeof line - 1)
        n = (int)sizeof line - 1;
    (void)!write(2, line, (size_t)n);
    _exit(127);
}

/* The child's stack: the daemon is suspended until the child has exec'd or exited, so
 * one serves every spawn. */
#define SPAWN_STACK (256u << 10)

/* Under AddressSanitizer the child would run instrumented code and interceptors on
 * the daemon's own memory and shadow: there (make check-asan) it is forked. */
#if defined(BUILT_WITH_ASAN) && !defined(SPAWN_BY_FORK)
#define SPAWN_BY_FORK 1
#endif

/* Not fork(): after a fork every page of the daemon is copy-on-write, and the first
 * write to each, once the child has exec'd, is a page fault.  On this VM kind a fault
 * costs about 17 us, and the open that follows a warm pool's refill took 21 of them
 * (a claim 1.19 -> 0.82 ms, p50, process provider).  A vfork-like clone shares the
 * daemon's memory instead, and the daemon waits until the exec. */
pid_t sbx_spawn_process(const sbx_spawn *sp)
{
#ifdef SPAWN_BY_FORK
    spawn_ctx fc = {sp, getpid()};
    pid_t child = fork();
    if (child == 0)
        spawn_child(&fc);     /* never returns */
    return child;
#else
    static char *stack;
    if (!stack) {
        void *m = mmap(NULL, SPAWN_STACK, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
        if (m == MAP_FAILED)
            return -1;
        stack = m;
    }
    spawn_ctx c = {sp, getpid()};
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, &old); /* no handler runs in the child before it resets */
    pid_t pid = clone(spawn_child, stack + SPAWN_STACK, CLONE_VM | CLONE_VFORK | SIGCHLD, &c);
    int e = errno;
    sigprocmask(SIG_SETMASK, &old, NULL);
    errno = e;
    return pid;
#endif
}

/* ---------------------------------------------------------------- watching */

/* libev's default loop (sandboxd's) reaps every child itself on SIGCHLD (waitpid(-1)):
 * an ev_child watcher is the one way to get a child's status on it. */
struct sbx_watch {
    struct ev_loop *loop;
    ev_child child;
    sbx_exit_cb cb;
    void *ud;
};

static void on_child(struct ev_loop *loop, ev_child *w, int revents)
{
    (void)revents;
    sbx_watch *sw = w->data;
    ev_child_stop(loop, w);
    int status = w->rstatus;
    sbx_exit_cb cb = sw->cb;
    void *ud = sw->ud;
    free(sw);
    cb(ud, status);
}

sbx_watch *sbx_watch_child(struct ev_loop *loop, pid_t pid, sbx_exit_cb cb, void *ud)
{
    sbx_watch *w = sbx_xcalloc(1, sizeof *w);
    w->loop = loop;
    w->cb = cb;
    w->ud = ud;
    ev_child_init(&w->child, on_child, pid, 0);
    w->child.data = w;
    ev_child_start(loop, &w->child);
    return w;
}

void sbx_watch_cancel(sbx_watch *w)
{
    if (!w)
        return;
    ev_child_stop(w->loop, &w->child);
    free(w);
}

/* ---------------------------------------------------------------- helper commands */

typedef struct cmd {
    struct ev_loop *loop;
    pid_t pid;
    int err_fd;
    ev_io err_io;
    ev_timer bound, later;
    sbx_watch *watch;
    char err[CMD_ERR_KEEP];
    size_t err_len;
    bool killed;
    int status;
    sbx_cmd_cb cb;
    void *ud;
} cmd;

static void cmd_read_err(cmd *c)
{
    while (c->err_fd >= 0) {
        char buf[1024];
        ssize_t n = read(c->err_fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0 || errno != EAGAIN) {
                ev_io_stop(c->loop, &c->err_io);
                close(c->err_fd);
                c->err_fd = -1;
            }
            return;
        }
        size_t room = CMD_ERR_KEEP - 1 - c->err_len;
        size_t take = (size_t)n < room ? (size_t)n : room;
        memcpy(c->err + c->err_len, buf, take);
        c->err_len += take;
    }
}

static void cmd_finish(cmd *c)
{
    cmd_read_err(c);
    if (c->err_fd >= 0) {
        ev_io_stop(c->loop, &c->err_io);
        close(c->err_fd);
    }
    ev_timer_stop(c->loop, &c->bound);
    ev_timer_stop(c->loop, &c->later);
    c->err[c->err_len] = '\0';
    sbx_cmd_cb cb = c->cb;
    void *ud = c->ud;
    int status = c->killed ? -1 : c->status;
    char err[CMD_ERR_KEEP];
    memcpy(err, c->err, c->err_len + 1);
    free(c);
    cb(ud, status, err);
}

static void on_cmd_err(struct ev_loop *loop, ev_io *io, int revents)
{
    (void)loop;
    (void)revents;
    cmd_read_err(io->data);
}

static void on_cmd_exit(void *ud, int status)
{
    cmd *c = ud;
    c->watch = NULL;
    c->status = status;
    cmd_finish(c);
}

static void on_cmd_bound(struct ev_loop *loop, ev_timer *t, int revents)
{
    (void)loop;
    (void)revents;
    cmd *c = t->data;
    c->killed = true;
    kill(c->pid, SIGKILL); /* the watch reports the exit */
}

static void on_cmd_later(struct ev_loop *loop, ev_timer *t, int revents)
{
    (void)loop;
    (void)revents;
    cmd *c = t->data;
    c->status = -1;
    cmd_finish(c);
}

void sbx_cmd_run(struct ev_loop *loop, const char *const *argv, double timeout_s, sbx_cmd_cb cb,
                 void *ud)
{
    cmd *c = sbx_xcalloc(1, sizeof *c);
    c->loop = loop;
    c->cb = cb;
    c->ud = ud;
    c->err_fd = -1;
    ev_timer_init(&c->bound, on_cmd_bound, timeout_s, 0.);
    ev_timer_init(&c->later, on_cmd_later, 0., 0.);
    c->bound.data = c->later.data = c;
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        snprintf(c->err, sizeof c->err, "pipe: %s", strerror(errno));
        c->err_len = strlen(c->err);
        ev_timer_start(loop, &c->later);
        return;
    }
    sbx_spawn sp = {.argv = argv, .fd0 = -1, .fd1 = -1, .fd2 = p[1], .die_with_parent = true};
    static const char *const env[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                      NULL};
    sp.envp = env;
    c->pid = sbx_spawn_process(&sp);
    close(p[1]);
    if (c->pid < 0) {
        close(p[0]);
        snprintf(c->err, sizeof c->err, "fork: %s", strerror(errno));
        c->err_len = strlen(c->err);
        ev_timer_start(loop, &c->later);
        return;
    }
    c->err_fd = p[0];
    fcntl(c->err_fd, F_SETFL, O_NONBLOCK);
    ev_io_init(&c->err_io, on_cmd_err, c->err_fd, EV_READ);
    c->err_io.data = c;
    ev_io_start(loop, &c->err_io);
    ev_timer_start(loop, &c->bound);
    c->watch = sbx_watch_child(loop, c->pid, on_cmd_exit, c);
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int sbx_wait_bounded(pid_t pid, double timeout_s)
{
    int status = -1;
    double deadline = mono_s() + timeout_s;
#ifdef SYS_pidfd_open
    int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pfd >= 0) {
        for (;;) {
            double left = deadline - mono_s();
            if (left <= 0)
                break;
            struct pollfd pf = {pfd, POLLIN, 0};
            int rc = poll(&pf, 1, (int)(left * 1000) + 1);
            if (rc < 0 && errno == EINTR)
                continue;
            break;
        }
        close(pfd);
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return status;
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        return -1;
    }
#endif
    while (mono_s() < deadline) { /* bounded polling of an observable exit */
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return status;
        if (r < 0)
            return -1;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

int sbx_cmd_run_sync(const char *const *argv, double timeout_s, char *err, size_t err_len)
{
    int p[2];
    if (err_len)
        err[0] = '\0';
    if (pipe2(p, O_CLOEXEC) != 0)
        return -1;
    static const char *const env[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                      NULL};
    sbx_spawn sp = {.argv = argv, .envp = env, .fd0 = -1, .fd1 = -1, .fd2 = p[1],
                    .die_with_parent = true};
    pid_t pid = sbx_spawn_process(&sp);
    close(p[1]);
    if (pid < 0) {
        close(p[0]);
        return -1;
    }
    /* Read stderr until EOF or the bound, then wait. */
    size_t got = 0;
    double deadline = mono_s() + timeout_s;
    for (;;) {
        double left = deadline - mono_s();
        if (left <= 0)
            break;
        struct pollfd pf = {p[0], POLLIN, 0};
        int rc = poll(&pf, 1, (int)(left * 1000) + 1);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0)
            break;
        char buf[1024];
        ssize_t n = read(p[0], buf, sizeof buf);
        if (n <= 0)
            break;
        if (err_len && got < err_len - 1) {
            size_t take = (size_t)n < err_len - 1 - got ? (size_t)n : err_len - 1 - got;
            memcpy(err + got, buf, take);
            got += take;
            err[got] = '\0';
        }
    }
    close(p[0]);
    double left = deadline - mono_s();
    return sbx_wait_bounded(pid, left > 0.1 ? left : 0.1);
}

void sbx_process_start_time(pid_t pid, char *out, size_t n)
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
    char *p = strrchr(buf, ')');   /* the command name may hold anything */
    if (!p)
        return;
    /* After ")": field 3 (state) is the first; the start time is field 22. */
    int field = 2;
    for (char *save = NULL, *tok = strtok_r(p + 1, " ", &save); tok;
         tok = strtok_r(NULL, " ", &save))
        if (++field == 22) {
            snprintf(out, n, "%s", tok);
            return;
        }
}

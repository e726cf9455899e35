/*
 * sbxproc.c — a real sandboxd as a child process for tests.
 *
 * Waiting is done on observable events only: the "listening" line through poll()
 * on the child's stdout, and the child's exit through a pidfd (with a bounded
 * waitpid loop as the fallback where pidfds are missing).
 */
#include "sbxproc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define START_TIMEOUT_MS 10000
#define STOP_TIMEOUT_MS 5000
#define MAX_ARGS 64

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int random_token(char out[SBX_TOKEN_SIZE])
{
    unsigned char raw[32];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(out + 2 * i, 3, "%02x", raw[i]);
    return 0;
}

static void log_path(const sbx_proc *p, char *out, size_t n)
{
    snprintf(out, n, "%s/%s", p->dir, SBX_LOG_NAME);
}

char *sbx_read_log(const sbx_proc *p)
{
    char path[320];
    log_path(p, path, sizeof path);
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while (buf && (n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len < 2) {
            char *bigger = realloc(buf, cap * 2);
            if (!bigger) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = bigger;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf)
        buf[len] = '\0';
    return buf;
}

static void print_log(const sbx_proc *p)
{
    char *log = sbx_read_log(p);
    if (log && *log)
        fprintf(stderr, "sbxproc: sandboxd's log:\n%s", log);
    free(log);
}

static int write_tokens(sbx_proc *p, char (*extra)[SBX_TOKEN_SIZE], size_t n_extra)
{
    if (random_token(p->token) != 0)
        return -1;
    for (size_t i = 0; i < n_extra; i++)
        if (random_token(extra[i]) != 0)
            return -1;
    int fd = open(p->token_file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        return -1;
    }
    fprintf(f, "# sbxproc test tokens\n%s\n", p->token);
    for (size_t i = 0; i < n_extra; i++)
        fprintf(f, "%s\n", extra[i]);
    return fclose(f) == 0 ? 0 : -1;
}

/* Reads the first stdout line within the deadline.  Returns 0 with the line. */
static int read_first_line(int fd, char *line, size_t cap)
{
    size_t len = 0;
    long long deadline = now_ms() + START_TIMEOUT_MS;
    while (len + 1 < cap) {
        long long left = deadline - now_ms();
        if (left <= 0) {
            fprintf(stderr, "sbxproc: sandboxd printed no listening line within %d ms\n",
                    START_TIMEOUT_MS);
            return -1;
        }
        struct pollfd pfd = {fd, POLLIN, 0};
        int rc = poll(&pfd, 1, (int)left);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0)
            continue;
        ssize_t n = read(fd, line + len, 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            fprintf(stderr, "sbxproc: sandboxd closed its stdout before listening\n");
            return -1;
        }
        if (line[len] == '\n') {
            line[len] = '\0';
            return 0;
        }
        len++;
    }
    fprintf(stderr, "sbxproc: sandboxd's first line is too long\n");
    return -1;
}

/* argv: [wrapper words...] $BUILD/sandboxd --listen ... extra... NULL; strings live in
 * `store` (wrapper words) and static literals. */
static int build_argv(const sbx_proc *p, const char *const *extra, char *exe, size_t exe_cap,
                      char *store, size_t store_cap, char **argv)
{
    size_t n = 0;
    const char *wrapper = getenv("SBX_WRAPPER");
    if (wrapper && *wrapper) {
        snprintf(store, store_cap, "%s", wrapper);
        for (char *save = NULL, *w = strtok_r(store, " \t", &save); w && n < MAX_ARGS / 2;
             w = strtok_r(NULL, " \t", &save))
            argv[n++] = w;
    }
    const char *build = getenv("BUILD");
    snprintf(exe, exe_cap, "%s/sandboxd", build && *build ? build : "build");
    argv[n++] = exe;
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--token-file";
    argv[n++] = (char *)p->token_file;
    argv[n++] = "--provider";
    argv[n++] = "echo";
    for (size_t i = 0; extra && extra[i]; i++) {
        if (n + 1 >= MAX_ARGS) {
            fprintf(stderr, "sbxproc: too many arguments\n");
            return -1;
        }
        argv[n++] = (char *)extra[i];
    }
    argv[n] = NULL;
    return 0;
}

static void remove_files(sbx_proc *p)
{
    if (!p->dir[0])
        return;
    char path[320];
    log_path(p, path, sizeof path);
    unlink(path);
    if (p->token_file[0])
        unlink(p->token_file);
    rmdir(p->dir);
    p->dir[0] = p->token_file[0] = '\0';
}

int sbx_start_tokens(sbx_proc *p, const char *const *extra_args,
                     char (*extra_tokens)[SBX_TOKEN_SIZE], size_t n_extra)
{
    memset(p, 0, sizeof *p);
    p->pid = -1;
    p->stdout_fd = -1;
    snprintf(p->dir, sizeof p->dir, "/tmp/sbxproc.XXXXXX");
    if (!mkdtemp(p->dir)) {
        fprintf(stderr, "sbxproc: mkdtemp: %s\n", strerror(errno));
        p->dir[0] = '\0';
        return -1;
    }
    int n = snprintf(p->token_file, sizeof p->token_file, "%s/tokens", p->dir);
    if (n < 0 || (size_t)n >= sizeof p->token_file || write_tokens(p, extra_tokens, n_extra) != 0) {
        fprintf(stderr, "sbxproc: cannot write the token file: %s\n", strerror(errno));
        remove_files(p);
        return -1;
    }
    char exe[300], store[1024], *argv[MAX_ARGS + 1];
    if (build_argv(p, extra_args, exe, sizeof exe, store, sizeof store, argv) != 0) {
        remove_files(p);
        return -1;
    }
    char log[320];
    log_path(p, log, sizeof log);
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        fprintf(stderr, "sbxproc: pipe: %s\n", strerror(errno));
        remove_files(p);
        return -1;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "sbxproc: fork: %s\n", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        remove_files(p);
        return -1;
    }
    if (pid == 0) { /* only async-signal-safe calls until exec */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int in = open("/dev/null", O_RDONLY);
        int err = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (in < 0 || err < 0 || dup2(in, 0) < 0 || dup2(fds[1], 1) < 0 || dup2(err, 2) < 0)
            _exit(127);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    p->pid = pid;
    p->stdout_fd = fds[0];
    char line[256];
    unsigned port;
    if (read_first_line(p->stdout_fd, line, sizeof line) != 0 ||
        sscanf(line, "listening http://127.0.0.1:%u", &port) != 1) {
        fprintf(stderr, "sbxproc: sandboxd did not start (%s)\n", argv[0]);
        print_log(p);
        sbx_stop_status(p);
        return -1;
    }
    snprintf(p->url, sizeof p->url, "http://127.0.0.1:%u", port);
    return 0;
}

int sbx_start(sbx_proc *p, const char *const *extra_args)
{
    return sbx_start_tokens(p, extra_args, NULL, 0);
}

/* Waits for the child up to `ms`; returns its status, or -1 on timeout. */
static int wait_exit(pid_t pid, int ms)
{
    int status;
#ifdef SYS_pidfd_open
    int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pfd >= 0) {
        struct pollfd pf = {pfd, POLLIN, 0};
        long long deadline = now_ms() + ms;
        int rc;
        do {
            long long left = deadline - now_ms();
            rc = poll(&pf, 1, left > 0 ? (int)left : 0);
        } while (rc < 0 && errno == EINTR);
        close(pfd);
        if (rc <= 0)
            return -1;
        return waitpid(pid, &status, 0) == pid ? status : -1;
    }
#endif
    /* No pidfd: a bounded poll of the observable exit. */
    for (long long deadline = now_ms() + ms; now_ms() < deadline;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return status;
        if (r < 0)
            return -1;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return -1;
}

int sbx_stop_status(sbx_proc *p)
{
    int status = -1;
    if (p->pid > 0) {
        kill(p->pid, SIGTERM);
        status = wait_exit(p->pid, STOP_TIMEOUT_MS);
        if (status == -1) {
            fprintf(stderr, "sbxproc: sandboxd did not stop within %d ms; killing it\n",
                    STOP_TIMEOUT_MS);
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &status, 0);
            status = -1;
        }
        p->pid = -1;
    }
    if (p->stdout_fd > 2) { /* never a zeroed struct's 0 (stdin) */
        close(p->stdout_fd);
        p->stdout_fd = -1;
    }
    remove_files(p);
    return status;
}

void sbx_stop(sbx_proc *p)
{
    (void)sbx_stop_status(p);
}

plm_error *sbx_client_new(const sbx_proc *p, plm_client **out)
{
    plm_client_options o;
    plm_client_options_init(&o);
    o.base_url = p->url;
    o.token = p->token;
    *out = NULL;
    return plm_client_new(NULL, &o, out);
}

/*
 * launch.c — start a server for a test and wait until it says where it listens.
 */
#include "launch.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

pid_t spawn_listening(char *const argv[], char *url, size_t url_len)
{
    int fds[2];
    if (pipe(fds) < 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a test that dies takes its servers along */
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        execvp(argv[0], argv);
        fprintf(stderr, "spawn: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    char line[512];
    size_t n = 0;
    long deadline = now_ms() + 10000;
    for (;;) {
        long left = deadline - now_ms();
        struct pollfd p = {fds[0], POLLIN, 0};
        if (left <= 0 || poll(&p, 1, (int)left) <= 0)
            break;
        ssize_t r = read(fds[0], line + n, 1);
        if (r <= 0)
            break;
        if (line[n] == '\n' || n + 2 >= sizeof line) {
            line[n] = '\0';
            if (strncmp(line, "listening ", 10) == 0) {
                snprintf(url, url_len, "%s", line + 10);
                /* Keep the pipe's read end open: a server that writes later must not die
                 * of SIGPIPE.  It is small, and closes with the test process. */
                return pid;
            }
            n = 0;
            continue;
        }
        n++;
    }
    fprintf(stderr, "spawn: %s did not report where it listens\n", argv[0]);
    close(fds[0]);
    spawn_stop(pid);
    return -1;
}

void spawn_stop(pid_t pid)
{
    if (pid <= 0)
        return;
    kill(pid, SIGTERM);
    long deadline = now_ms() + 5000;
    for (;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid || (r < 0 && errno == ECHILD))
            return;
        if (now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return;
        }
        struct timespec ts = {0, 10 * 1000000L}; /* reaping poll, not synchronisation */
        nanosleep(&ts, NULL);
    }
}

unsigned long proc_number(pid_t pid, const char *file, const char *label)
{
    char path[64], line[256];
    if (pid)
        snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, file);
    else
        snprintf(path, sizeof path, "/proc/self/%s", file);
    FILE *f = fopen(path, "r");
    unsigned long v = 0;
    size_t n = strlen(label);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, label, n) && sscanf(line + n, "%lu", &v) == 1)
            break;
    if (f)
        fclose(f);
    return v;
}

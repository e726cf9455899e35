/*
 * proc.h — child processes on the daemon's loop: start one with chosen stdio and a
 * set-up step run in the child, learn of its exit (an ev_child watcher: libev's default
 * loop reaps every child on SIGCHLD, so that is where statuses are), and run short helper
 * commands (runsc pause, runsc delete) with a time bound and their stderr kept.
 */
#ifndef SBX_PROC_H
#define SBX_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct ev_loop;

typedef struct sbx_watch sbx_watch;
/* `status` is waitpid's status. */
typedef void (*sbx_exit_cb)(void *ud, int status);

/* Runs in the child before exec, on the daemon's memory while the daemon waits (a
 * vfork-like clone, not a fork; see proc.c): system calls only -- nothing that
 * allocates, takes a lock or changes what the daemon keeps -- and credentials through
 * raw system calls, not glibc's wrappers (which would reach for the daemon's threads).
 * Returns 0, or an errno to report as the exec failure. */
typedef int (*sbx_preexec_fn)(void *ud);

typedef struct sbx_spawn {
    const char *const *argv;       /* argv[0] is an absolute path */
    const char *const *envp;       /* NULL: an empty environment */
    int fd0, fd1, fd2;             /* -1: /dev/null */
    bool new_session;              /* setsid() */
    bool die_with_parent;          /* PR_SET_PDEATHSIG SIGKILL */
    sbx_preexec_fn preexec;
    void *preexec_ud;
} sbx_spawn;

/* Starts argv as a child.  Returns the pid, or -1 with errno (and the child's own failure,
 * an exec or a preexec error, shows as exit status 127 with a line on fd2). */
pid_t sbx_spawn_process(const sbx_spawn *sp);

/* Watches `pid` (a child of ours, started in this loop iteration); `cb` runs once from
 * the loop with its status when it exited and was reaped.  The loop must be the
 * default loop. */
sbx_watch *sbx_watch_child(struct ev_loop *loop, pid_t pid, sbx_exit_cb cb, void *ud);
/* Stops watching without reaping (the caller takes over). */
void sbx_watch_cancel(sbx_watch *w);

/* Runs argv with stdin and stdout on /dev/null, waits at most `timeout_s` (then
 * SIGKILL), and calls `cb` with its wait status (-1 when it could not start or was
 * killed at the bound) and what it printed on stderr (at most 4 KiB, NUL-terminated). */
typedef void (*sbx_cmd_cb)(void *ud, int status, const char *err);
void sbx_cmd_run(struct ev_loop *loop, const char *const *argv, double timeout_s, sbx_cmd_cb cb,
                 void *ud);
/* The same, blocking (start-up checks and the final clean-up after the loop ended). */
int sbx_cmd_run_sync(const char *const *argv, double timeout_s, char *err, size_t err_len);

/* Blocking wait for a child with a bound; SIGKILL at the bound.  Returns the status
 * (only while the loop does not run: it would reap the child first). */
int sbx_wait_bounded(pid_t pid, double timeout_s);

/* Field 22 of /proc/<pid>/stat (its start time in clock ticks) as text in out, "" when
 * the process is gone: with the pid, what names one process across pid reuse. */
void sbx_process_start_time(pid_t pid, char *out, size_t n);

#endif

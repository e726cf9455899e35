/*
 * seccomp.c — the system-call filter of the bubblewrap sandbox (docs/daemon.md §8, docs/conformance.md
 * D51), built with libseccomp and installed by the in-sandbox supervisor on itself
 * before it starts anything, so every process of the sandbox inherits it.
 *
 * Deny by default with EPERM; the allowlist is modelled on the audited plimsoll
 * profile (itself close to Docker's default): everything an interpreter, a shell and
 * coreutils need, and not ptrace, process_vm_*, io_uring, userfaultfd, perf, bpf, the
 * keyring, new namespaces (unshare, setns, clone with any CLONE_NEW* flag, clone3 ->
 * ENOSYS so libc falls back to clone), mounts of any kind, handles, modify_ldt, module
 * and kexec loading, reboot, swap, clock setting, SysV IPC and accounting.  Sockets are
 * AF_UNIX only, mknod makes FIFOs only, personality takes the harmless values only.
 */
#include "seccomp.h"

#include <errno.h>
#include <seccomp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

static const char *const allowed[] = {
    "accept", "accept4", "access", "alarm", "arch_prctl", "bind", "brk", "cachestat",
    "capget", "capset", "chdir", "chmod", "chown", "clock_getres", "clock_gettime",
    "clock_nanosleep", "close", "close_range", "connect", "copy_file_range", "creat", "dup",
    "dup2", "dup3", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_pwait",
    "epoll_pwait2", "epoll_wait", "eventfd", "eventfd2", "execve", "execveat", "exit",
    "exit_group", "faccessat", "faccessat2", "fadvise64", "fallocate", "fchdir", "fchmod",
    "fchmodat", "fchmodat2", "fchown", "fchownat", "fcntl", "fdatasync", "fgetxattr",
    "flistxattr", "flock", "fork", "fremovexattr", "fsetxattr", "fstat", "fstatfs", "fsync",
    "ftruncate", "futex", "futex_requeue", "futex_wait", "futex_waitv", "futex_wake",
    "futimesat", "get_mempolicy", "get_robust_list", "get_thread_area", "getcpu", "getcwd",
    "getdents", "getdents64", "getegid", "geteuid", "getgid", "getgroups", "getitimer",
    "getpeername", "getpgid", "getpgrp", "getpid", "getppid", "getpriority", "getrandom",
    "getresgid", "getresuid", "getrlimit", "getrusage", "getsid", "getsockname",
    "getsockopt", "gettid", "gettimeofday", "getuid", "getxattr", "inotify_add_watch",
    "inotify_init", "inotify_init1", "inotify_rm_watch", "io_cancel", "io_destroy",
    "io_getevents", "io_pgetevents", "io_setup", "io_submit", "ioctl", "ioprio_get",
    "ioprio_set", "kill", "landlock_add_rule", "landlock_create_ruleset",
    "landlock_restrict_self", "lchown", "lgetxattr", "link", "linkat", "listen",
    "listxattr", "llistxattr", "lremovexattr", "lseek", "lsetxattr", "lstat", "madvise",
    "map_shadow_stack", "mbind", "membarrier", "memfd_create", "mincore", "mkdir",
    "mkdirat", "mlock", "mlock2", "mlockall", "mmap", "mprotect", "mq_getsetattr",
    "mq_notify", "mq_open", "mq_timedreceive", "mq_timedsend", "mq_unlink", "mremap",
    "mseal", "msync", "munlock", "munlockall", "munmap", "nanosleep", "newfstatat", "open",
    "openat", "openat2", "pause", "pidfd_open", "pidfd_send_signal", "pipe", "pipe2",
    "pkey_alloc", "pkey_free", "pkey_mprotect", "poll", "ppoll", "prctl", "pread64",
    "preadv", "preadv2", "prlimit64", "process_mrelease", "pselect6", "pwrite64", "pwritev",
    "pwritev2", "read", "readahead", "readlink", "readlinkat", "readv", "recvfrom",
    "recvmmsg", "recvmsg", "remap_file_pages", "removexattr", "rename", "renameat",
    "renameat2", "restart_syscall", "rmdir", "rseq", "rt_sigaction", "rt_sigpending",
    "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend",
    "rt_sigtimedwait", "rt_tgsigqueueinfo", "sched_get_priority_max",
    "sched_get_priority_min", "sched_getaffinity", "sched_getattr", "sched_getparam",
    "sched_getscheduler", "sched_rr_get_interval", "sched_setaffinity", "sched_setattr",
    "sched_setparam", "sched_setscheduler", "sched_yield", "seccomp", "select", "sendfile",
    "sendmmsg", "sendmsg", "sendto", "set_mempolicy", "set_robust_list", "set_thread_area",
    "set_tid_address", "setfsgid", "setfsuid", "setgid", "setgroups", "setitimer",
    "setpgid", "setpriority", "setregid", "setresgid", "setresuid", "setreuid",
    "setrlimit", "setsid", "setsockopt", "setuid", "setxattr", "shutdown", "sigaltstack",
    "signalfd", "signalfd4", "splice", "stat", "statfs", "statx", "symlink", "symlinkat",
    "sync", "sync_file_range", "syncfs", "sysinfo", "tee", "tgkill", "time", "timer_create",
    "timer_delete", "timer_getoverrun", "timer_gettime", "timer_settime", "timerfd_create",
    "timerfd_gettime", "timerfd_settime", "times", "tkill", "truncate", "umask", "uname",
    "unlink", "unlinkat", "utime", "utimensat", "utimes", "vfork", "vmsplice", "wait4",
    "waitid", "write", "writev",
};

#define CLONE_NEW_MASK 0x7E020000ull /* CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET */

int sbx_seccomp_install(char *why, size_t why_len)
{
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ERRNO(EPERM));
    if (!ctx) {
        snprintf(why, why_len, "seccomp_init failed");
        return -1;
    }
    int rc = 0;
    const char *at = "";
    for (size_t i = 0; i < sizeof allowed / sizeof allowed[0] && rc == 0; i++) {
        int nr = seccomp_syscall_resolve_name(allowed[i]);
        if (nr == __NR_SCMP_ERROR)
            continue; /* not a system call of this architecture or libseccomp */
        rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0);
        at = allowed[i];
    }
    /* clone without any CLONE_NEW* flag; clone3 says ENOSYS so libc uses clone. */
    if (rc == 0 && (rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(clone), 1,
                                          SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEW_MASK, 0))))
        at = "clone";
    if (rc == 0 && (rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0)))
        at = "clone3";
    /* AF_UNIX sockets only: no network, no AF_ALG, no netlink. */
    if (rc == 0 && (rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(socket), 1,
                                          SCMP_A0(SCMP_CMP_EQ, AF_UNIX, 0))))
        at = "socket";
    if (rc == 0 && (rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(socketpair), 1,
                                          SCMP_A0(SCMP_CMP_EQ, AF_UNIX, 0))))
        at = "socketpair";
    /* mknod for FIFOs only. */
    if (rc == 0 && (rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(mknod), 1,
                                          SCMP_A1(SCMP_CMP_MASKED_EQ, S_IFMT, S_IFIFO))))
        at = "mknod";
    if (rc == 0 && (rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(mknodat), 1,
                                          SCMP_A2(SCMP_CMP_MASKED_EQ, S_IFMT, S_IFIFO))))
        at = "mknodat";
    /* personality: query, PER_LINUX and the flags Docker allows. */
    static const unsigned long personas[] = {0x0, 0x8, 0x20000, 0x20008, 0xffffffff};
    for (size_t i = 0; i < sizeof personas / sizeof personas[0] && rc == 0; i++)
        if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(personality), 1,
                                   SCMP_A0(SCMP_CMP_EQ, personas[i], 0))))
            at = "personality";
    if (rc == 0 && (rc = seccomp_load(ctx)))
        at = "seccomp_load";
    seccomp_release(ctx);
    if (rc) {
        snprintf(why, why_len, "seccomp: %s: %s", at, rc < 0 ? strerror(-rc) : "failed");
        return -1;
    }
    return 0;
}

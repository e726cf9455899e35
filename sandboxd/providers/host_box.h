/*
 * host_box.h — the host side of a sandbox whose processes are ours on the host (the
 * process and bwrap providers, not gVisor): its cgroup (limits, freezer, OOM count,
 * kill), an optional host work directory, and their removal after the sandbox ended.
 * Stored as the box's backend data.
 *
 * The functions taking an sbx_backend are the box operations such a backend shares
 * (SBX_CGBOX_OPS): its struct sbx_backend begins with an sbx_real_base (real_provider.h).
 */
#ifndef SBX_CGBOX_H
#define SBX_CGBOX_H

#include "box.h"
#include "cgroup.h"

#include <ev.h>

struct ev_loop;
struct sbx_real_base;

typedef struct sbx_host_box {
    struct sbx_real_base *base;    /* the backend's (real_provider.h) */
    struct ev_loop *loop;
    sbx_box *box;
    sbx_cgroup cg;
    bool has_cg;
    char *work;                    /* a host directory removed at the end, or NULL */
    pid_t pid;                     /* the launched process */
    int tries;
    bool keep_uid;                 /* its processes could not be proven gone */
    ev_timer retry;                /* removal retries while killed tasks go */
    void (*cleaned)(sbx_box *b);
} sbx_host_box;

/* Fills what every such box shares: a uid (and gid) of the box's own from --uid-range
 * when the daemon is root (uids.h; released once its processes are gone), and without
 * cgroups the kernel's per-process limits instead. */
void sbx_host_box_box_config(sbx_backend *bk, sbx_box_config *bc);
/* The uid box `b` runs as; (uid_t)-1 with *why when it got none (the range is full). */
uid_t sbx_host_box_uid(sbx_backend *bk, sbx_box *b, char **why);
/* Starts argv (PATH the only environment) with in/out/err as its stdin, stdout and
 * stderr, in a new session, in the box's new cgroup when there are cgroups, as the
 * sandbox uid.  `work` (may be NULL) is a host directory removed with the box.
 * Returns the pid, or -1 with *why. */
pid_t sbx_host_box_launch(sbx_backend *bk, sbx_box *b, const char *const *argv, const char *work,
                       int in, int out, int err, char **why);
void sbx_host_box_freeze(sbx_backend *bk, sbx_box *b, bool frozen, void (*cb)(sbx_box *b, bool ok));
void sbx_host_box_force_kill(sbx_backend *bk, sbx_box *b);
void sbx_host_box_cleanup(sbx_backend *bk, sbx_box *b, void (*cb)(sbx_box *b));
void sbx_host_box_cleanup_sync(sbx_backend *bk, sbx_box *b);
/* OOM kills so far in the box's group (sbx_real_backend.oom_kills). */
uint64_t sbx_host_box_oom_kills(sbx_backend *bk, sbx_box *b);

/* The box operations of such a backend, with its own launch. */
#define SBX_CGBOX_OPS(LAUNCH)                                                                 \
    {                                                                                        \
        .launch = LAUNCH, .freeze = sbx_host_box_freeze, .force_kill = sbx_host_box_force_kill,    \
        .cleanup = sbx_host_box_cleanup, .cleanup_sync = sbx_host_box_cleanup_sync,                \
    }

#endif

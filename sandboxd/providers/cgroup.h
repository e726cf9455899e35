/*
 * cgroup.h — one cgroup v1 group per sandbox, under /sys/fs/cgroup/<controller>/berth/
 * (this machine mounts cgroup v1: memory, pids, cpu and freezer, each on its own).
 *
 * Layout: berth/d<daemon pid>-<daemon start time>/b<n>, one directory per controller.
 * A daemon removes its own groups when a sandbox ends, and at start-up the groups of
 * daemons that are gone (their tasks are killed first).
 */
#ifndef SBX_CGROUP_H
#define SBX_CGROUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

enum { SBX_CG_MEMORY, SBX_CG_PIDS, SBX_CG_CPU, SBX_CG_FREEZER, SBX_CG_N };

typedef struct sbx_cglimits {
    uint64_t memory_bytes;         /* 0: no limit */
    uint32_t pids;                 /* 0: no limit */
    double cpus;                   /* 0: no limit */
} sbx_cglimits;

typedef struct sbx_cgroup {
    char *dir[SBX_CG_N];           /* NULL for a controller we do not use */
    bool memsw;                    /* swap accounted and capped too */
    int oom_fd1;                   /* memory.oom_control kept open, fd + 1 (0: not yet) */
} sbx_cgroup;

/* Whether cgroup v1 groups can be made here (root, the controllers mounted); `why`
 * says what is missing.  Creates this daemon's parent directories and removes those
 * of daemons that are gone. */
bool sbx_cgroup_init(char **why);
/* Removes this daemon's (empty) directories: when the providers are gone. */
void sbx_cgroup_fini(void);
/* This daemon's part of the tree (`berth/d<pid>-<start>`), for names elsewhere. */
const char *sbx_cgroup_daemon_tag(void);
/* Creates group `name` with the limits.  Returns 0, or -1 with *why. */
int sbx_cgroup_create(sbx_cgroup *cg, const char *name, const sbx_cglimits *lim, char **why);
/* In a forked child: moves the calling process into every controller's group.
 * Returns 0 or an errno. */
int sbx_cgroup_enter(const sbx_cgroup *cg);
/* Freezes or thaws the group (waits, bounded, for FROZEN).  Returns 0 or -1. */
int sbx_cgroup_freeze(const sbx_cgroup *cg, bool frozen);
/* Number of tasks left (0 = empty); kills them when `kill_them`. */
size_t sbx_cgroup_tasks(const sbx_cgroup *cg, bool kill_them);
/* How many times the memory controller's OOM killer acted in the group.  Read before
 * every cell, so the file stays open (one pread a cell, not open, two reads and close). */
uint64_t sbx_cgroup_oom_kills(sbx_cgroup *cg);
/* Reads a controller file back (for the smoke test); malloc'd, or NULL. */
char *sbx_cgroup_read(const sbx_cgroup *cg, int controller, const char *file);
/* Removes the directories (after its tasks are gone).  Returns 0, or -1 when a group
 * still holds tasks (retry later).  Frees the paths on success. */
int sbx_cgroup_remove(sbx_cgroup *cg);
/* Forgets the paths without removing (after a failed final attempt). */
void sbx_cgroup_forget(sbx_cgroup *cg);

#endif

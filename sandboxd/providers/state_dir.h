/*
 * state_dir.h — what the real providers share on the host: this daemon's state directory
 * (a copy of the supervisor binary, a minimal /etc for the sandboxes, per-sandbox
 * files), the uid sandboxed code runs as, and a deferral helper for callbacks that
 * must come from the loop.
 *
 * Layout: <base>/d<pid>-<start>-<provider>/, where <base> is --state-dir, or
 * /run/berth-sandboxd as root, or $TMPDIR/berth-sandboxd-<uid>.  Directories of daemons
 * that are gone are removed at start-up; a daemon removes its own on exit.
 */
#ifndef SBX_SBXSTATE_H
#define SBX_SBXSTATE_H

#include "config.h"

#include <stdbool.h>
#include <sys/types.h>

struct ev_loop;

typedef struct sbx_state {
    char *dir;                     /* this daemon's, for one provider */
    char *supervisor;              /* <dir>/supervisor: this binary, copied at start-up */
    char *etc;                     /* <dir>/etc: passwd, group, hosts */
    bool root;                     /* the daemon runs as root */
    uid_t uid;                     /* not root: ours; root: the range's first (uids.h) */
    gid_t gid;
} sbx_state;

/* Returns 0, or -1 with *why.  `reap` (may be NULL) sees each stale directory of the same
 * provider before it is removed (gVisor: containers a killed daemon left running). */
int sbx_state_init(sbx_state *st, const sbx_config *cfg, const char *provider,
                   void (*reap)(const char *stale_dir, void *ud), void *reap_ud, char **why);
/* Removes the directory tree and frees. */
void sbx_state_fini(sbx_state *st);
/* rm -rf by directory descriptors (openat O_NOFOLLOW, unlinkat): safe against a sandbox
 * that swaps links into the tree while it goes, never leaving it or crossing a mount.
 * Returns 0 when it is gone. */
int sbx_remove_tree(const char *path);

/* In a forked child (preexec): drops to the sandbox uid when running as root. */
int sbx_state_drop_privileges(const sbx_state *st);

/* Calls fn(arg) from the loop, at the next iteration. */
void sbx_defer(struct ev_loop *loop, void (*fn)(void *arg), void *arg);

/* Whether an executable exists at path. */
bool sbx_executable(const char *path);

#endif

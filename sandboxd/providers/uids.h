/*
 * uids.h — one uid per sandbox (issue 11): sandboxd, when root, runs each sandbox's code
 * as a uid of its own from --uid-range, so no sandbox can signal, ptrace or read the
 * /proc/PID/mem or environ of another's processes, or open its files, whatever the
 * kernel's Yama setting.
 *
 * A uid is free when no sandbox of this daemon holds it, no other sandboxd on the host
 * holds it (each holds a one-byte OFD lock at offset uid of one shared file, which the
 * kernel drops when that daemon dies), and no process runs as it (a sandbox of a daemon
 * that was killed may outlive the lock until its group is reaped).  A sandbox's uid is
 * released only after its processes are all gone (the backends' cleanup); released
 * uids are reused last.
 */
#ifndef SBX_UIDS_H
#define SBX_UIDS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct sbx_config;

#define SBX_UIDS_LOCK_FILE "/run/berth-sandboxd-uids.lock"
#define SBX_UIDS_DEFAULT_COUNT 1000u

typedef struct sbx_uids {
    uid_t first;
    uint32_t count;
    char (*owner)[24];             /* the box id holding each uid, "" when free */
    uint32_t next;                 /* where the next search starts */
    int lock_fd;                   /* SBX_UIDS_LOCK_FILE, or -1 */
} sbx_uids;

/* How many sandboxes can be live at once: sessions, the pool and single runs. */
uint32_t sbx_uids_need(const struct sbx_config *cfg);
/* The range's size: --uid-range's, else SBX_UIDS_DEFAULT_COUNT or the need if more. */
uint32_t sbx_uids_count(const struct sbx_config *cfg);

/* The range [first, first + count); `need` is what can be live at once (refused
 * below it).  Returns 0, or -1 with *why. */
int sbx_uids_init(sbx_uids *u, uid_t first, uint32_t count, uint32_t need, char **why);
void sbx_uids_fini(sbx_uids *u);
/* Takes a free uid for box `owner`; (uid_t)-1 when none is free. */
uid_t sbx_uids_take(sbx_uids *u, const char *owner);
/* The uid box `owner` holds, or (uid_t)-1. */
uid_t sbx_uids_of(const sbx_uids *u, const char *owner);
/* Gives back the uid of box `owner` (its processes are gone). */
void sbx_uids_release(sbx_uids *u, const char *owner);

#endif

/*
 * cgbox.h — the host side of a sandbox whose processes are ours on the host (the
 * process and bwrap providers, not gVisor): its cgroup (limits, freezer, OOM count,
 * kill), an optional host work directory, and their removal after the sandbox ended.
 * Stored as the box's backend data.
 */
#ifndef SBX_CGBOX_H
#define SBX_CGBOX_H

#include "box.h"
#include "cgroup.h"

#include <ev.h>

struct ev_loop;

typedef struct sbx_cgbox {
    struct ev_loop *loop;
    sbx_box *box;
    sbx_cgroup cg;
    bool has_cg;
    char *work;                    /* a host directory removed at the end, or NULL */
    pid_t pid;                     /* the launched process */
    int tries;
    ev_timer retry;                /* removal retries while killed tasks go */
    void (*cleaned)(sbx_box *b);
} sbx_cgbox;

/* Attaches a new record to the box. */
sbx_cgbox *sbx_cgbox_new(struct ev_loop *loop, sbx_box *b);
void sbx_cgbox_freeze(struct ev_loop *loop, sbx_box *b, bool frozen,
                      void (*cb)(sbx_box *b, bool ok));
void sbx_cgbox_force_kill(sbx_box *b);
void sbx_cgbox_cleanup(struct ev_loop *loop, sbx_box *b, void (*cb)(sbx_box *b));
void sbx_cgbox_cleanup_sync(sbx_box *b);
uint64_t sbx_cgbox_oom_kills(sbx_box *b);
/* In a forked child: joins the box's cgroup (0 or an errno). */
int sbx_cgbox_enter(const sbx_cgbox *cb);

#endif

/*
 * box.h — one sandbox as the daemon sees it: its supervisor process (started by a
 * backend: bubblewrap, runsc or a plain child), the framed link to it (sup_proto.h) on
 * the loop, and per language the kernel's four FIFOs (requests, replies, stdout,
 * stderr), which the daemon makes in a host directory the backend binds into the
 * sandbox and holds open read-write for the sandbox's whole life.
 *
 * A box knows nothing of sessions: real_provider.c drives it (one call at a time) and the
 * pool keeps boxes warm.  Every operation completes through its callback from the loop,
 * never inside the call that started it.
 */
#ifndef SBX_BOX_H
#define SBX_BOX_H

#include "provider.h"
#include "sup_proto.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct ev_loop;

typedef struct sbx_box sbx_box;
typedef struct sbx_backend sbx_backend;

/* What a provider plugs in: how a sandbox is made, frozen and removed. */
typedef struct sbx_backend_ops {
    /* Starts the supervisor of `b` with in/out/err as its stdin, stdout and stderr
     * (argv from sbx_box_supervisor_argv).  Returns the pid to watch (its exit is the
     * sandbox's end), or -1 with *why. */
    pid_t (*launch)(sbx_backend *bk, sbx_box *b, int in, int out, int err, char **why);
    /* Freezes or thaws every process of the sandbox; `cb` from the loop. */
    void (*freeze)(sbx_backend *bk, sbx_box *b, bool frozen, void (*cb)(sbx_box *b, bool ok));
    /* The supervisor would not go: end the sandbox by force (blocking, bounded). */
    void (*force_kill)(sbx_backend *bk, sbx_box *b);
    /* After the launched process is gone: remove what the sandbox used; `cb` from the
     * loop once done (or given up, logged). */
    void (*cleanup)(sbx_backend *bk, sbx_box *b, void (*cb)(sbx_box *b));
    /* After the loop ended (daemon exit): the same, blocking. */
    void (*cleanup_sync)(sbx_backend *bk, sbx_box *b);
} sbx_backend_ops;

/* The owner's view of what happens in the box. */
typedef struct sbx_box_events {
    /* HELLO came (err NULL), or the sandbox failed before it. */
    void (*ready)(void *ud, sbx_box *b, const char *err);
    /* An interpreter became ready (up), or could not start / ended outside a cell. */
    void (*interp)(void *ud, sbx_box *b, int lang, bool up, const char *text);
    /* The sandbox ended on its own (not through sbx_box_close). */
    void (*dead)(void *ud, sbx_box *b, const char *why);
} sbx_box_events;

typedef enum sbx_interp_state {
    SBX_I_NONE = 0, SBX_I_STARTING, SBX_I_IDLE, SBX_I_RUNNING
} sbx_interp_state;

/* How a cell or a snippet ended. */
typedef enum sbx_cell_end {
    SBX_CELL_RAN,                  /* exit 0 */
    SBX_CELL_RAISED,               /* exit 1, traceback on stderr */
    SBX_CELL_DIED,                 /* the interpreter ended during the cell (or was killed) */
    SBX_CELL_FILES_FAILED,         /* nothing ran: file `file_index` failed with `errcode` */
    SBX_CELL_NOT_RUN,              /* nothing ran: no interpreter was listening */
    SBX_CELL_NO_NONCE,             /* nothing ran: no random bytes for the cell's nonce */
    SBX_CELL_SANDBOX_GONE,         /* the sandbox ended; may have run */
    SBX_CELL_EXITED,               /* a snippet's process exited: `wait_status` */
    SBX_CELL_WRITTEN,              /* a project's files are all written */
    SBX_CELL_READ,                 /* an artifact's read ended: `read_status`, `out` */
} sbx_cell_end;

typedef struct sbx_cell_result {
    sbx_cell_end end;
    sbx_buf out, err;              /* owned by the callback */
    bool out_truncated, err_truncated;
    int wait_status;               /* SBX_CELL_DIED / SBX_CELL_EXITED */
    uint32_t file_index;
    char errcode[16];
    char *text;                    /* the supervisor's word on a death, or NULL */
    bool spawned;                  /* RAN / RAISED: the kernel says the cell may have
                                      started a process (else it started none) */
    int read_status;               /* SBX_CELL_READ: SUP_READ_* */
    uint64_t size;                 /* SBX_CELL_READ: the file's size */
} sbx_cell_result;

typedef void (*sbx_cell_cb)(void *ud, sbx_cell_result *r);
typedef void (*sbx_sweep_cb)(void *ud, bool ok, bool clean, uint32_t killed, uint64_t disk_bytes);
typedef void (*sbx_box_done_cb)(void *ud);

typedef struct sbx_box_config {
    const char *id;                /* short name for logs and cgroups ("b12") */
    const char *supervisor_path;   /* the supervisor binary as seen inside the sandbox */
    const char *mode;              /* bwrap, gvisor, process */
    const char *work;              /* the work directory as seen inside */
    const char *io;                /* the FIFOs' directory as seen inside */
    const char *host_io;           /* the same on the host (created by the box, 0700) */
    uid_t uid;                     /* owner of host_io and the FIFOs; (uid_t)-1: ours */
    gid_t gid;
    bool measure_disk;             /* the sweep measures the disk (else it cannot be over) */
    const char *python, *node;
    unsigned work_mb, tmp_mb, shm_mb, mem_mb, nofile, nproc, as_mb;
    unsigned run_as_uid, run_as_gid; /* non-zero: the supervisor starts as root and runs
                                        what it starts as this uid (gVisor) */
} sbx_box_config;

/* Creates and launches a box; `ev.ready` follows from the loop. */
sbx_box *sbx_box_new(struct ev_loop *loop, const sbx_backend_ops *ops, sbx_backend *bk,
                     const sbx_box_config *cfg, const sbx_box_events *ev, void *ud);
/* Points the events elsewhere (the pool hands a box to a session). */
void sbx_box_set_events(sbx_box *b, const sbx_box_events *ev, void *ud);
/* The supervisor's argv (NULL-terminated, owned by the box). */
const char *const *sbx_box_supervisor_argv(const sbx_box *b);
const char *sbx_box_id(const sbx_box *b);
const char *sbx_box_host_io(const sbx_box *b);
bool sbx_box_ready(const sbx_box *b);
/* Sends the supervisor a frame it does nothing with, SUP_WAKE: when an open claims a
 * sandbox idle in the pool, the sandbox wakes while the open's answer goes to the
 * client and its first cell comes back, not when that cell is written (under gVisor,
 * the sentry's threads; docs/performance.md §4). */
void sbx_box_wake(sbx_box *b);
bool sbx_box_alive(const sbx_box *b);
sbx_interp_state sbx_box_interp(const sbx_box *b, int lang);
/* The backend's data for this box. */
void *sbx_box_backend_data(const sbx_box *b);
void sbx_box_set_backend_data(sbx_box *b, void *data);

/* Starts an interpreter (no-op when it is starting or up); `ev.interp` reports. */
void sbx_box_start(sbx_box *b, int lang);
/* Sends a cell to an idle interpreter.  `cb` gets its end. */
void sbx_box_cell(sbx_box *b, int lang, const sbx_job *job, uint32_t out_cap, uint32_t err_cap,
                  sbx_cell_cb cb, void *ud);
/* Whether the cell's code has left for the sandbox (a deadline after this is a 124). */
bool sbx_box_cell_sent(const sbx_box *b, int lang);
/* Runs a snippet in a fresh `node -`; `cb` gets SBX_CELL_EXITED (or GONE). */
void sbx_box_exec(sbx_box *b, const sbx_bytes *code, uint32_t out_cap, uint32_t err_cap,
                  sbx_cell_cb cb, void *ud);
/* The operations of a project, on the same lane as snippets (SUP_LANG_EXEC), one at a
 * time: its files (SBX_CELL_WRITTEN or SBX_CELL_FILES_FAILED), a step in a fresh
 * `/bin/sh -c` (SBX_CELL_EXITED), and an artifact of at most `max` bytes read back
 * into `out` (SBX_CELL_READ).  Each may end SBX_CELL_SANDBOX_GONE instead. */
void sbx_box_files(sbx_box *b, const sbx_file *files, size_t n, sbx_cell_cb cb, void *ud);
void sbx_box_step(sbx_box *b, const sbx_bytes *command, uint32_t out_cap, uint32_t err_cap,
                  sbx_cell_cb cb, void *ud);
void sbx_box_read(sbx_box *b, const sbx_bytes *path, uint32_t max, sbx_cell_cb cb, void *ud);
/* Kills an interpreter (a deadline) or the snippet (SUP_LANG_EXEC). */
void sbx_box_kill(sbx_box *b, int lang);
/* The owner of the cell (`lang`) or snippet (SUP_LANG_EXEC) in flight gives up on it:
 * its callback will never run and its job is no longer read (the owner may free both
 * now).  The box still follows the operation to its end (the lane stays busy until the
 * kernel reports it), and drops its result. */
void sbx_box_cancel(sbx_box *b, int lang);
/* Ends the sandbox at once by force, whatever runs in it (a supervisor that no longer
 * answers, a hostile guest): every process is killed, operations in flight complete
 * SBX_CELL_SANDBOX_GONE with `why` and the owner hears `dead` -- both before this
 * returns.  A box already dead or closing is left to that. */
void sbx_box_abort(sbx_box *b, const char *why);
/* Kills stray processes and measures the disk.  `thorough` when the last call may have
 * started a process: the supervisor then scans instead of trusting a task count.  Not
 * thorough on a box that measures its disk, the sweep only measures (the kernel said
 * its cell started no process). */
void sbx_box_sweep(sbx_box *b, bool thorough, sbx_sweep_cb cb, void *ud);
/* Whether its sweeps measure the disk (box.h sbx_box_config.measure_disk): a budget its
 * file systems' sizes do not already hold. */
bool sbx_box_measures_disk(const sbx_box *b);
/* A thorough sweep that kills the kernels too (before a project in a session): their
 * ends reach `ev.interp` before `cb` runs. */
void sbx_box_quiesce(sbx_box *b, sbx_sweep_cb cb, void *ud);
void sbx_box_freeze(sbx_box *b, bool frozen, void (*cb)(void *ud, bool ok), void *ud);
/* Ends the sandbox: operations in flight complete first (SBX_CELL_SANDBOX_GONE), then
 * the supervisor is told to go (EOF), forced after a bound, cleaned up, and `cb` runs;
 * the box is freed after it. */
void sbx_box_close(sbx_box *b, sbx_box_done_cb cb, void *ud);
/* After the loop ended: kill and clean up at once (blocking), free. */
void sbx_box_destroy_sync(sbx_box *b);

#endif

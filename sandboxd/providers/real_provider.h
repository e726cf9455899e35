/*
 * real_provider.h — the providers that run real code (process, bwrap, gvisor) share one
 * implementation of provider.h (real_provider.c: sessions, cells, deadlines, snippets, the
 * smoke test and the warm pool) over a backend that only knows how to make, freeze and
 * remove one sandbox (process.c, bwrap.c, gvisor.c).
 */
#ifndef SBX_REALPROV_H
#define SBX_REALPROV_H

/* A Python kernel's address-space limit is --memory-mb plus this: address space is not
 * memory (Debian's OpenBLAS reserves hundreds of MiB it never touches, and with less
 * it spins instead of failing), and what a kernel really holds is bounded elsewhere —
 * the sandbox's cgroup, the supervisor's watch under gVisor, RLIMIT_DATA without
 * cgroups. */
#define SBX_ADDRESS_SPACE_HEADROOM_MB 512u

#include "box.h"
#include "config.h"
#include "provider.h"
#include "state_dir.h"
#include "uids.h"

struct ev_loop;

/* What every backend begins with (the first member of its struct sbx_backend): the
 * loop, the options, its state directory and whether cgroups can be used. */
typedef struct sbx_real_base {
    struct ev_loop *loop;
    const sbx_config *cfg;
    sbx_state st;
    bool cgroups;
    sbx_uids uids;                 /* a uid per sandbox (daemon root), else unused */
} sbx_real_base;

/* The state directory of provider `name` (sbx_state_init, with `reap`), the uid range
 * (when root) and the cgroup hierarchy; without cgroups, logs why and `without_cgroups` (what that costs).
 * Returns 0, or -1 with *why. */
int sbx_real_base_init(sbx_real_base *base, struct ev_loop *loop, const sbx_config *cfg,
                       const char *name, void (*reap)(const char *stale_dir, void *ud),
                       void *reap_ud, const char *without_cgroups, char **why);
void sbx_real_base_fini(sbx_real_base *base);
/* The interpreters as a backend needs them: `present`, at least one exists; `under_usr`,
 * both live under /usr (the only tree its sandboxes see).  False with *why if not. */
bool sbx_real_interps_ok(const sbx_config *cfg, bool present, bool under_usr, char **why);

typedef struct sbx_real_backend {
    const char *name;              /* provider name: "bwrap" */
    const char *tier;              /* the tier it claims once its smoke test passed */
    const sbx_backend_ops *box_ops;
    /* Checks the tools and prepares what every sandbox shares; NULL and *why when the
     * provider cannot work here. */
    sbx_backend *(*create)(struct ev_loop *loop, const sbx_config *cfg, char **why);
    /* After every box is gone. */
    void (*destroy)(sbx_backend *bk);
    /* Fills what the backend decides for a new box (mode, paths, in-sandbox limits). */
    void (*box_config)(sbx_backend *bk, sbx_box_config *bc);
    /* OOM kills so far in the box's group (0 when unknown). */
    uint64_t (*oom_kills)(sbx_backend *bk, sbx_box *b);
    /* Extra start-up proof of the tier's promises, on a live smoke-test box (e.g. the
     * cgroup limits read back); NULL when fine, else a malloc'd reason. */
    char *(*verify)(sbx_backend *bk, sbx_box *b);
    /* What the smoke probe must find inside (see real_provider.c). */
    bool want_isolation;           /* no network, read-only root, writable work dir */
    bool want_seccomp;             /* Seccomp: 2, NoNewPrivs: 1, no capabilities */
    bool want_other_kernel;        /* a kernel release other than the host's (gVisor) */
    /* Sweeps cost enough here (gVisor: tens of microseconds per system call inside; the
     * process provider's scan reads the host's /proc; under bwrap the supervisor's two
     * wake-ups were a quarter of a warm cell) that a cell whose kernel says it started
     * no process is not swept after: only its disk is measured, where that is needed
     * (sbx_box_measures_disk). */
    bool sweep_on_hint;
} sbx_real_backend;

sbx_provider *sbx_real_create(struct ev_loop *loop, const sbx_config *cfg,
                              const sbx_real_backend *be, char **why);
void sbx_real_destroy(sbx_provider *p);
const sbx_facts *sbx_real_facts(const sbx_provider *p);
void sbx_real_smoke_test(sbx_provider *p, sbx_smoke_cb cb, void *ud);
void sbx_real_run(sbx_provider *p, const sbx_job *job, sbx_run_cb cb, void *ud);
void sbx_real_session_open(sbx_provider *p, const sbx_open_params *params, sbx_open_cb cb,
                           void *ud);
void sbx_real_session_run(sbx_psession *s, const sbx_job *job, sbx_run_cb cb, void *ud);
void sbx_real_session_suspend(sbx_psession *s, sbx_done_cb cb, void *ud);
void sbx_real_session_close(sbx_psession *s, plm_session_end why, sbx_done_cb cb, void *ud);
plm_session_end sbx_real_session_found_end(const sbx_psession *s, const char **detail);

#define SBX_REAL_PROVIDER_OPS(NAME, CREATE)                                                   \
    {                                                                                        \
        .name = NAME, .create = CREATE, .destroy = sbx_real_destroy, .facts = sbx_real_facts, \
        .smoke_test = sbx_real_smoke_test, .run = sbx_real_run,                               \
        .session_open = sbx_real_session_open, .session_run = sbx_real_session_run,           \
        .session_suspend = sbx_real_session_suspend, .session_close = sbx_real_session_close, \
        .session_found_end = sbx_real_session_found_end,                                      \
    }

#endif

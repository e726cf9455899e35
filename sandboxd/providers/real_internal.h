/*
 * real_internal.h — what real_provider.c (sessions, calls, projects, the pool) and
 * startup_checks.c (the software identity, the smoke test, the data stack check)
 * share: the provider's state and a few helpers.  Private to sandboxd/providers/.
 */
#ifndef SBX_REAL_INTERNAL_H
#define SBX_REAL_INTERNAL_H

#include "real_provider.h"

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>

#define OUTPUT_CAP 65536u              /* per stream (docs/daemon.md §7) */
#define CREATE_BOUND_S 60.0            /* a sandbox's start for a single run */
#define SMOKE_BOUND_S 90.0
#define STACK_WAIT_MAX_S 10.0          /* the data stack check waits for the pool at most */
#define N_STACK 4                      /* the data stack's packages (stack_names) */

typedef struct member member;
typedef struct smoke smoke;
typedef struct stack_check stack_check;

struct member {
    sbx_provider *p;
    sbx_box *box;
    bool ready;
    unsigned up;                   /* SBX_LANG_* running */
    ev_tstamp born;
    member *prev, *next;
};

struct smoke {
    sbx_provider *p;
    sbx_box *box;
    sbx_smoke_cb cb;
    void *ud;
    ev_timer bound;
    char *why;
    unsigned tried, up, ok;        /* languages */
    int waiting;                   /* interpreters not yet up or failed */
    sbx_job job;
    int step;
    bool finished;
};

struct stack_check {
    sbx_provider *p;
    sbx_box *box;
    ev_timer bound;
    ev_tstamp began;
    sbx_job job;
    bool finished;
};

struct sbx_provider {
    struct ev_loop *loop;
    const sbx_config *cfg;
    const sbx_real_backend *be;
    sbx_backend *bk;
    sbx_facts facts;
    unsigned langs;                /* proven by the smoke test */
    bool serving;                  /* smoke test passed: the pool may fill */
    uint64_t seq;
    member *members;
    int n_members, launching;
    ev_timer pool_check, pool_retry, pool_soon;
    sbx_psession *sessions;
    struct call *runs;             /* single runs in flight (real_provider.c) */
    smoke *smoke;
    /* the data stack check: due once serving, then running, then proven or not */
    bool stack_due;
    ev_timer stack_wait;
    stack_check *stack;
    sbx_package packages[N_STACK];
    char versions[N_STACK][33];
    char host_release[128];
    /* software identities (Describe, answers, records): see software_identity() */
    char ident_js[128], ident_session[128], ident_project[128];
};

/* real_provider.c */
unsigned sbx_real_lang_bit(int lang);           /* SUP_LANG_* to SBX_LANG_* */
const char *sbx_real_lang_word(int lang);       /* "python", "javascript", "shell" */
/* A new sandbox of the provider with these events (the backend's create). */
sbx_box *sbx_real_new_box(sbx_provider *p, const sbx_box_events *ev, void *ud);
/* How a process ended, from its wait status, in words ("killed by SIGKILL"). */
void sbx_real_describe_wait(int status, char *out, size_t n);
/* Starts pool members up to --pool. */
void sbx_real_pool_fill(sbx_provider *p);

/* startup_checks.c */
/* The data stack check's timer, at creation; its sandbox, at destruction. */
void sbx_real_checks_init(sbx_provider *p);
void sbx_real_checks_destroy(sbx_provider *p);
/* Starts the data stack check when it is due and no pool member is starting. */
void sbx_real_stack_start_if_due(sbx_provider *p);

#endif

/*
 * sbxproc.h — start and stop a real sandboxd for tests.
 *
 * The daemon runs from $BUILD/sandboxd (BUILD defaults to "build") with
 * --listen 127.0.0.1:0 --token-file <dir>/tokens --provider echo and the extra
 * arguments.  Its stderr goes to <dir>/sandboxd.log (SBX_LOG_NAME), which the tests may
 * read and which is printed when the start fails.  If the environment variable
 * SBX_WRAPPER is set, its words are put before the command (for instance
 * SBX_WRAPPER="valgrind --leak-check=full --log-file=/tmp/vg.%p").
 * The daemon gets SIGKILL if the test process dies.
 */
#ifndef SBXPROC_H
#define SBXPROC_H

#include <stddef.h>
#include <sys/types.h>

#include "plimsoll.h"

#define SBX_LOG_NAME "sandboxd.log"
#define SBX_TOKEN_SIZE 80

typedef struct sbx_proc {
    pid_t pid;
    char url[128];              /* http://127.0.0.1:PORT */
    char token[80];
    char token_file[256];
    char dir[256];
    int stdout_fd;
} sbx_proc;

/* Creates a temp dir with a token file holding one random token, starts $BUILD/sandboxd
 * (BUILD env, default "build") with --listen 127.0.0.1:0 --token-file FILE --provider
 * echo plus the NULL-terminated extra_args (may be NULL), waits for the "listening"
 * line (bounded by a 10 s poll timeout — no sleeps), fills url and token.  Returns 0,
 * or -1 with a message on stderr. */
int sbx_start(sbx_proc *p, const char *const *extra_args);

/* As sbx_start, and writes n_extra more random tokens to the token file, returned in
 * extra_tokens (for tests with several callers). */
int sbx_start_tokens(sbx_proc *p, const char *const *extra_args,
                     char (*extra_tokens)[SBX_TOKEN_SIZE], size_t n_extra);

/* SIGTERM, waitpid (SIGKILL after 5 s), remove temp files.  Safe after a failed start
 * and after an earlier stop. */
void sbx_stop(sbx_proc *p);

/* As sbx_stop, returning the daemon's wait status (-1 when it had to be killed or was
 * not running), so a test can check the drain ended with exit code 0. */
int sbx_stop_status(sbx_proc *p);

/* The daemon's log so far (malloc'd, NUL-terminated), or NULL. */
char *sbx_read_log(const sbx_proc *p);

/* A client of the daemon p runs: plm_client_new with its url and token and the default
 * options.  Returns plm_client_new's error (NULL on success); *out is the caller's, freed
 * with plm_client_free. */
plm_error *sbx_client_new(const sbx_proc *p, plm_client **out);

#endif

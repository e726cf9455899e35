/*
 * sandboxes_internal.h — the pieces of the per-conversation layer (sandboxes*.c,
 * tool.c) that its files share, and that its tests drive directly.  Not installed.
 */
#ifndef PLIMSOLL_SANDBOXES_INTERNAL_H
#define PLIMSOLL_SANDBOXES_INTERNAL_H

#include "plimsoll_sandboxes.h"

/* The most files one call takes: the daemon takes 200 project files, and a fresh run
 * adds its cell file and its runner (docs/client.md §7.1). */
#define PLM_MAX_CALL_FILES 198

/* ---- fresh runs (sandboxes_fresh.c), docs/client.md §6.8 */

/* How a fresh project runs one language: the code goes to `cell_path`, `source` to
 * `runner_path`, and the single step is `step`. */
typedef struct plm_runner {
    const char *language;
    const char *cell_path, *runner_path, *step;
    const char *source;
} plm_runner;

/* NULL for a language without a runner. */
const plm_runner *plm_runner_for(const char *language);
/* The files of a fresh project: `files`, then the cell, then the runner.  The array is
 * malloc'd (n + 2 entries); its strings are borrowed from the arguments and `r`. */
plm_file *plm_fresh_files(const plm_runner *r, const char *code, const plm_file *files,
                          size_t n, size_t *n_out);
/* The snippet a daemon without projects runs: `code` evaluated, its last value printed.
 * NULL when `code` is not well-formed UTF-8 (or memory ran out). */
char *plm_snippet_runner(const char *code);
/* "completed", "setup_failed", "timed_out", "protocol_error" or "unspecified". */
const char *plm_outcome_name(plm_outcome o);

/* ---- outputs (tool.c), docs/client.md §7.2 */

/* The byte length of the longest prefix of the UTF-8 text s[0..len) that holds at most
 * `max` UTF-16 code units and ends on a code point boundary; *cut says whether it is
 * shorter than the text. */
size_t plm_utf16_prefix(const char *s, size_t len, size_t max, bool *cut);
/* An output with its streams decoded (ill-formed UTF-8 as U+FFFD) and cut to `max`
 * units each; the state flags are left false for the caller. */
plm_code_output *plm_output_new(const char *language, int32_t exit_code, bool timed_out,
                                const plm_bytes *out, const plm_bytes *err,
                                bool daemon_truncated, size_t max, const char *isolation,
                                const char *record_sha256);
/* The output of a fresh run (a snippet, or a project's first step).  Takes `r`: a
 * project without a step report becomes an unmarked `unknown` error carrying it. */
plm_error *plm_fresh_output(plm_result *r, const char *language, size_t max,
                            plm_code_output **out);

/* ---- the instance's settings, for the tool's description (sandboxes.c) */
void plm_sandboxes_languages(const plm_sandboxes *sb, const char *const **langs, size_t *n);
plm_sessions_mode plm_sandboxes_mode(const plm_sandboxes *sb);

#endif

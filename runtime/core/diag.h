/*
 * diag.h — where the parts of berth that have no host's log at hand say what an
 * operator must see: the store's failures and recoveries, its WAL checkpoints, the
 * local sandboxd dying and coming back.  By default a line "berth: MESSAGE" on
 * stderr, as the command-line faces print; `berth serve` routes them into its own
 * log, so that with --log-format json every line of its stderr is a JSON record.
 *
 * Threads: berth_diag may be called from any thread (the SQLite checkpoint thread
 * is one); the sink must take that.  Set the sink once, before the parts that use it
 * start.
 */
#ifndef BERTH_DIAG_H
#define BERTH_DIAG_H

#include "berth.h"   /* berth_log_level */

/* The sink (NULL: the default line on stderr).  `ud` is passed back to it. */
void berth_diag_sink(berth_log_fn fn, void *ud);
/* Formats the message (printf) and hands it to the sink. */
void berth_diag(berth_log_level level, const char *fmt, ...)
  __attribute__((format(printf, 2, 3)));

#endif

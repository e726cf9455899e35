/*
 * diag.c — the sink of berth's diagnostics without a host (diag.h).
 */
#include "diag.h"

#include <stdarg.h>
#include <stdio.h>

static berth_log_fn sink;
static void *sink_ud;

void berth_diag_sink(berth_log_fn fn, void *ud)
{
  sink = fn;
  sink_ud = ud;
}

void berth_diag(berth_log_level level, const char *fmt, ...)
{
  char line[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (sink)
    sink(sink_ud, level, line);
  else
    fprintf(stderr, "berth: %s\n", line);   /* one call: one line, whole */
}

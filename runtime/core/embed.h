/*
 * embed.h — what every folder of runtime/ makes errors and times with (embed.c), apart
 * from runtime.h so that the store and the models need no Lua to include it.
 */
#ifndef BERTH_EMBED_H
#define BERTH_EMBED_H

#include "berth.h"

/* A berth_error (berth.h) with a stable code (a string literal: not copied) and a
 * formatted message; free it with berth_error_free. */
berth_error *berth_error_new(const char *code, const char *fmt, ...)
  __attribute__((format(printf, 2, 3)));
/* A monotonic clock in seconds (latencies). */
double berth_clock(void);

#endif

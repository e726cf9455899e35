/*
 * embed.c — small pieces of the embedding API (berth.h): error values, the clock
 * latencies are measured with, and error-value forms of the constructors.
 */
#include "runtime.h"
#include "xalloc.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

berth_error *berth_error_new(const char *code, const char *fmt, ...)
{
  berth_error *e = berth_xmalloc(sizeof *e);
  e->code = code;
  va_list ap;
  va_start(ap, fmt);
  if (vasprintf(&e->message, fmt, ap) < 0)
    e->message = NULL;
  va_end(ap);
  return e;
}

void berth_error_free(berth_error *e)
{
  if (!e)
    return;
  free(e->message);
  free(e);
}

double berth_clock(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static berth_error *from_text(const char *code, char *text)
{
  berth_error *e = berth_error_new(code, "%s", text ? text : "unknown error");
  free(text);
  return e;
}

berth_error *berth_host_open(const berth_options *o, berth_host **out)
{
  char *err = NULL;
  if (berth_host_new(o, out, &err) == 0)
    return NULL;
  return from_text("invalid_argument", err);
}

berth_error *berth_model_open(struct ev_loop *loop, const char *spec, berth_model **out)
{
  *out = NULL;
  if (!loop || !spec)
    return berth_error_new("invalid_argument", "berth_model_open needs a loop and a spec");
  berth_model_options mo = {loop, NULL, NULL, NULL};
  char *err = NULL;
  *out = berth_model_new(spec, &mo, &err);
  if (*out)
    return NULL;
  return from_text("unavailable", err);
}

/*
 * xalloc.c — berth's one out-of-memory policy (xalloc.h).
 */
#include "xalloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Noreturn void berth_oom(size_t n)
{
  fprintf(stderr, "berth: out of memory (%zu bytes); stopping\n", n);
  abort();
}

void *berth_xmalloc(size_t n)
{
  void *p = malloc(n ? n : 1);
  if (!p)
    berth_oom(n);
  return p;
}

void *berth_xcalloc(size_t count, size_t size)
{
  void *p = calloc(count ? count : 1, size ? size : 1);
  if (!p)
    berth_oom(count * size);
  return p;
}

void *berth_xrealloc(void *p, size_t n)
{
  void *q = realloc(p, n ? n : 1);
  if (!q)
    berth_oom(n);
  return q;
}

char *berth_xstrdup(const char *s)
{
  char *p = strdup(s);
  if (!p)
    berth_oom(strlen(s) + 1);
  return p;
}

char *berth_xstrndup(const char *s, size_t n)
{
  char *p = strndup(s, n);
  if (!p)
    berth_oom(n + 1);
  return p;
}

/*
 * xalloc.h — berth's one out-of-memory policy, for the C side of the host, the models,
 * the store and the faces: an allocation that fails prints what was asked for and
 * aborts the process, as Redis's zmalloc does.  A host that half-holds a conversation
 * after a failed allocation could lose or repeat what it was given; stopping at once
 * leaves the store (whose writes are transactions) as the last commit left it.
 *
 * Scripts are another matter: the Lua state's own allocations go through the host's
 * allocator with its memory cap (contain.c), where running out is an ordinary Lua
 * error the hook can see, and the host goes on.
 */
#ifndef BERTH_XALLOC_H
#define BERTH_XALLOC_H

#include <stddef.h>

/* Prints "berth: out of memory (N bytes)" on stderr and aborts. */
_Noreturn void berth_oom(size_t n);

/* As malloc, calloc, realloc, strdup and strndup, never returning NULL (a size of 0
 * gets a valid pointer). */
void *berth_xmalloc(size_t n);
void *berth_xcalloc(size_t count, size_t size);
void *berth_xrealloc(void *p, size_t n);
char *berth_xstrdup(const char *s);
char *berth_xstrndup(const char *s, size_t n);

#endif

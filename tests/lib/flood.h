/*
 * flood.h — a flood of idle TCP connections on loopback, for the tests that a server
 * keeps serving callers while strangers hold connections open (issue 11, item 9).
 *
 * Each connection either says nothing at all or sends the start of a request (a
 * request line and one header, never the blank line that ends the headers), the two
 * ways a client can hold a connection without ever completing a request.
 */
#ifndef TESTS_FLOOD_H
#define TESTS_FLOOD_H

#include <stddef.h>

typedef struct flood {
    int *fds;
    size_t n;
} flood;

/* Raises this process's descriptor soft limit to its hard one (the flood needs them). */
void flood_raise_fd_limit(void);
/* Opens n connections to 127.0.0.1:port; every other one sends a partial request.
 * Returns 0, or -1 with a message on stderr (what was opened is closed). */
int flood_open(flood *f, unsigned port, size_t n);
/* How many of the connections the server has closed (EOF or reset), waiting up to
 * `seconds` for all of them; a bounded poll, no sleep. */
size_t flood_closed(const flood *f, double seconds);
void flood_close(flood *f);

#endif

/*
 * head.h — how much of its connection's memory a request's head takes, so that a
 * server refuses a head it could not answer before it acts on the request.
 *
 * libmicrohttpd 0.9.75 keeps a request's head in the connection's memory pool
 * (MHD_OPTION_CONNECTION_MEMORY_LIMIT; both servers give it HTTPD_POOL_BYTES): the
 * lines as read, a copy of the cookies, and an entry for each header, cookie and query
 * argument.  It builds the answer's header in the same pool.  A head it cannot hold it
 * refuses itself (431).  But a head that fits with too little left over reaches the
 * handler, which may act on it (open a conversation, take a message, open a session),
 * and then the answer does not fit: MHD closes the connection with no answer at all.
 * A probe of heads of one growing cookie found that window 50 to 75 bytes wide, just
 * under 16 KiB, in both servers (docs/performance.md §8).  docs/daemon.md §1 and
 * berth(1) say what a caller sees.
 *
 * httpd_head_bytes counts the head as MHD lays it out, from what MHD parsed; a handler
 * that finds it over HTTPD_HEAD_MOST answers 431 at its first call, before anything
 * else, and the room left is enough for that answer.  The count errs high (an entry is
 * counted at the pool's rounding), so a head a little under MHD's own limit is refused
 * too: a clear answer instead of a silent close.
 *
 * Threads: MHD's (the access handler's), for the connection it is handling.
 */
#ifndef HTTPD_HEAD_H
#define HTTPD_HEAD_H

#include <microhttpd.h>
#include <stddef.h>

/* The memory pool of each connection: MHD's default, given explicitly so that the
 * count below and the server's pool are one number. */
#define HTTPD_POOL_BYTES ((size_t)32768)
/* What a head may take of it: the rest is for the answer's header (a 431's is about
 * 200 bytes). */
#define HTTPD_HEAD_MOST (HTTPD_POOL_BYTES - 2048)

/* The bytes of the connection's pool the request's head takes: its request line (method,
 * url without the query, version), its header lines, the copy of its cookies and an
 * entry for each header, cookie and query argument.  From the access handler. */
size_t httpd_head_bytes(struct MHD_Connection *conn, const char *method, const char *url,
                        const char *version);

#endif

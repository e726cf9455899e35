/*
 * connguard.h — bounds the connections of a libmicrohttpd server on a libev loop, so
 * that a flood of idle connections cannot lock callers out.  sandboxd (http.c) and
 * `berth serve` (runtime/faces/serve.c) both use it: httpd/ is what the two servers share.
 *
 * Every connection starts untrusted, with a deadline (the header timeout).  The server
 * trusts it once it sent a request the server accepted (an authenticated one); an
 * untrusted connection still open at its deadline is closed, however it trickles bytes.
 * Past the cap, the oldest untrusted connection is closed — the new one itself when
 * every other is trusted — so a caller always gets in while the flood is strangers',
 * and is turned away at once (never parked in the listen backlog) when it is not.  A
 * trusted connection is left to MHD's own idle timeout: its answers (a run, a stream
 * of events) may take minutes and are never cut here.
 *
 * Closing is shutdown(2) of the socket: MHD sees the end on its next read and frees
 * the connection the usual way, with its notices.  Use:
 *
 *   g = connguard_new(loop, max, header_timeout_s);
 *   MHD_start_daemon(..., MHD_OPTION_NOTIFY_CONNECTION, connguard_notify, g,
 *                    MHD_OPTION_CONNECTION_LIMIT, connguard_mhd_limit(g), ...);
 *   ... connguard_trust(conn) in the access handler once the caller is known ...
 *   MHD_stop_daemon(d); connguard_free(g);
 */
#ifndef CONNGUARD_H
#define CONNGUARD_H

#include <microhttpd.h>
#include <stddef.h>
#include <stdint.h>

struct ev_loop;

typedef struct connguard connguard;

/* `max_connections` (>= 1) open at once; `header_timeout_s` (> 0) for a connection to
 * be trusted. */
connguard *connguard_new(struct ev_loop *loop, unsigned max_connections,
                         double header_timeout_s);
/* After MHD_stop_daemon. */
void connguard_free(connguard *g);

/* For MHD_OPTION_NOTIFY_CONNECTION (cls = the guard). */
void connguard_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                      enum MHD_ConnectionNotificationCode code);
/* The connection sent an accepted request: from now on only MHD's timeout applies. */
void connguard_trust(struct MHD_Connection *conn);

/* What to give MHD_OPTION_CONNECTION_LIMIT: the cap plus room for connections already
 * shut down that MHD has not reaped yet. */
unsigned connguard_mhd_limit(const connguard *g);
/* Open connections not shut down by the guard. */
size_t connguard_open(const connguard *g);
/* Connections the guard shut down that MHD has not reaped yet (it does in MHD_run). */
size_t connguard_unreaped(const connguard *g);
/* Connections the guard shut down: at their deadline, and to make room past the cap. */
uint64_t connguard_closed_late(const connguard *g);
uint64_t connguard_closed_over_cap(const connguard *g);
/* A line for the log after the guard closed connections, at most one per 10 s. */
void connguard_on_notice(connguard *g, void (*cb)(void *ud, const char *line), void *ud);

/* Raises the soft RLIMIT_NOFILE to the hard one; returns the soft limit now. */
unsigned long connguard_raise_fd_limit(void);
/* The default cap for `fd_limit` descriptors: half of them (the rest are the server's
 * own: sandboxes, pipes, outgoing connections), between 16 and 4096. */
unsigned connguard_default_limit(unsigned long fd_limit);

#endif

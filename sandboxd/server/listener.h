/*
 * listener.h — the listening socket, accepted on the loop before libmicrohttpd sees a
 * connection.
 *
 * It exists for one reason MHD cannot serve: a client that speaks TLS to this
 * cleartext port must get a plain-text "HTTP/1.1 400" back (as Go's server gives),
 * so its TLS library reports a wrong version number (a proven "nothing was sent"
 * for plimsoll clients, docs/client.md §2.2 step 6) instead of a closed
 * connection.  MHD answers some such byte streams and silently drops others.  So the
 * first byte of every connection is peeked: 0x16 (a TLS handshake record) is turned
 * away here, anything else is handed to MHD untouched.  A connection that says
 * nothing for the header timeout is closed here, and past a number of silent ones the
 * oldest is (the rest of those bounds is MHD's side, connguard.h).
 */
#ifndef SBX_LISTENER_H
#define SBX_LISTENER_H

#include <sys/socket.h>

struct ev_loop;

typedef struct sbx_listener sbx_listener;

/* A connection for the HTTP server; the callee owns `fd`. */
typedef void (*sbx_accept_cb)(void *ud, int fd, const struct sockaddr *addr, socklen_t len);

/* Binds and listens on host:port (port "0" picks one).  Returns the socket, or -1 and
 * *why (malloc'd). */
int sbx_listen_bind(const char *host, const char *port, unsigned *bound_port, char **why);

/* Starts accepting on `listen_fd` (which it then owns); a connection that sends nothing
 * for `silent_s` seconds is closed, and so is the oldest silent one when there are
 * `max_silent` already. */
sbx_listener *sbx_listener_new(struct ev_loop *loop, int listen_fd, double silent_s,
                               size_t max_silent, sbx_accept_cb cb, void *ud);
/* Stops accepting and closes the listening socket; connections already accepted are
 * still handed over or turned away. */
void sbx_listener_stop(sbx_listener *l);
/* Closes everything, connections not yet handed over included. */
void sbx_listener_free(sbx_listener *l);

#endif

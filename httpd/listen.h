/*
 * listen.h — the listening socket of an HTTP server: sandboxd's and `berth serve`'s.
 *
 * httpd/ holds what both servers share (each runs libmicrohttpd on its libev loop):
 * this, and the connection guard (connguard.h).
 */
#ifndef HTTPD_LISTEN_H
#define HTTPD_LISTEN_H

/* A non-blocking, close-on-exec socket listening on host:port (numeric port; "0" for
 * any free one) with `backlog`, SO_REUSEADDR set; the first address getaddrinfo gives
 * that binds.  Returns the descriptor and the bound port in *bound_port, or -1 with a
 * malloc'd message a person can act on in *why (NULL when even that failed). */
int httpd_listen(const char *host, const char *port, int backlog, unsigned *bound_port,
                 char **why);

/* As httpd_listen, from "HOST:PORT" ("[::1]:8080" for IPv6); `flag` names the option
 * it came from in the message when it is not of that form. */
int httpd_listen_spec(const char *spec, const char *flag, int backlog, unsigned *bound_port,
                      char **why);

#endif

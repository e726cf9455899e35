/*
 * wiretap.h — a loopback TCP listener for tests that must see the exact bytes a client
 * sends: either a transparent relay to an upstream (it counts TCP connections and keeps
 * both directions' bytes), or a canned HTTP/1.1 responder (it answers every request on
 * a connection with one fixed answer, optionally echoing the request's
 * Plimsoll-Request-Id, and keeps the connection open).
 *
 * Runs on its own threads, so the client under test can use its blocking wrappers.
 * Ordering guarantees (no sleeps needed): a request's bytes are logged before they are
 * forwarded or answered, and an upstream answer's bytes are logged before they are
 * relayed, so once a call has completed its request (and, relayed, its answer) is in
 * the log; a connection is counted before any byte of it is relayed.
 */
#ifndef TESTS_WIRETAP_H
#define TESTS_WIRETAP_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#define WIRETAP_MAX_CONNS 64

typedef struct wiretap {
    int listen_fd;
    unsigned port;
    char url[64];               /* http://127.0.0.1:PORT */
    unsigned upstream_port;     /* 0: canned responder */
    /* canned answer */
    int status;
    char *extra_headers;        /* "Name: value\r\n..." or NULL */
    char *body;                 /* may be "" */
    bool echo_id;
    /* state */
    pthread_mutex_t mu;
    pthread_t acceptor;
    bool running;
    int conns;                  /* accepted TCP connections */
    int fds[2 * WIRETAP_MAX_CONNS];
    int n_fds;
    pthread_t workers[WIRETAP_MAX_CONNS];
    int n_workers;
    char *sent;                 /* client -> server bytes, NUL-terminated */
    size_t sent_len;
    char *answered;             /* server -> client bytes, NUL-terminated */
    size_t answered_len;
} wiretap;

/* A relay to http://127.0.0.1:upstream_port.  Returns 0 or -1. */
int wiretap_relay(wiretap *t, unsigned upstream_port);
/* A canned responder: every request gets `status`, the extra header lines (each ending
 * in \r\n, may be NULL), Content-Length and `body`; with echo_id the request's
 * Plimsoll-Request-Id value is sent back.  Returns 0 or -1. */
int wiretap_canned(wiretap *t, int status, const char *extra_headers, const char *body,
                   bool echo_id);
/* Replaces the canned answer (between calls). */
void wiretap_set_answer(wiretap *t, int status, const char *extra_headers, const char *body,
                        bool echo_id);
void wiretap_stop(wiretap *t);
/* Forgets the logs and the connection count (connections stay open). */
void wiretap_clear(wiretap *t);
int wiretap_connections(wiretap *t);
/* Copies of the logs so far (malloc'd). */
char *wiretap_sent(wiretap *t);
char *wiretap_answered(wiretap *t);
/* The port of an upstream URL "http://127.0.0.1:PORT", or 0. */
unsigned wiretap_port_of(const char *url);

#endif

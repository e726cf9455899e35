/*
 * pgtest.h — a private PostgreSQL cluster for a test: Debian's postgresql 15 binaries,
 * initdb into a temporary directory, the server listening only on a unix socket in
 * that directory (no TCP, no system service), removed again when the test ends — also
 * when the test process dies (a guard process notices its parent's death and stops the
 * server).
 *
 * As root the cluster runs as the `postgres` system user (or `nobody`); otherwise as
 * the caller.  Authentication is `trust` on the socket; the socket directory is the
 * only way in.
 */
#ifndef TESTS_PGTEST_H
#define TESTS_PGTEST_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct pgtest {
  char dir[64];                  /* the temporary directory: socket, data/, log */
  char user[32];                 /* the database superuser (the OS user it runs as) */
  char bin[128];                 /* where initdb, pg_ctl, pg_isready are */
  pid_t guard;                   /* stops the server and removes dir if we die */
  int guard_fd;                  /* our end of the guard's pipe */
  bool running;
  unsigned dbs;                  /* schemas made by pgtest_fresh_url so far */
  char shared_buffers[16];       /* the server's shared_buffers setting */
} pgtest;

/* True when the PostgreSQL server binaries are installed (else the reason in why). */
bool pgtest_available(char *why, size_t len);
/* initdb, start, wait until it accepts connections (bounded).  0, or -1 with the reason
 * on stderr.  The server is small (shared_buffers 16MB): a test's data is. */
int pgtest_start(pgtest *t);
/* The same with shared_buffers as given ("128MB": PostgreSQL's own default), for a
 * benchmark, whose cluster should be sized as a served one is. */
int pgtest_start_sized(pgtest *t, const char *shared_buffers);
/* A new empty place for a store: a schema tN of the cluster's database "berth" (a
 * schema, not a database: CREATE DATABASE costs a second with fsync on), its URL in url
 * (postgresql:///berth?host=DIR&user=USER&options=-csearch_path%3DtN).  0 or -1. */
int pgtest_fresh_url(pgtest *t, char *url, size_t len);
/* Runs one SQL text on database url (for a test's own setup); 0 or -1 with the
 * server's message on stderr. */
int pgtest_sql(const char *url, const char *sql);
/* Stops the server: pg_ctl stop -m fast (connections closed, a checkpoint), or with
 * crash -m immediate (as if it crashed: the next start recovers from the WAL).  0 or
 * -1. */
int pgtest_stop_server(pgtest *t, bool crash);
/* Starts it again on the same data and socket, waiting until it accepts; 0 or -1. */
int pgtest_restart_server(pgtest *t);
/* Stops the server and removes the directory. */
void pgtest_destroy(pgtest *t);

#endif

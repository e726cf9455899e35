/*
 * servetest.h — helpers for tests and benchmarks of `berth serve`: start and stop the
 * server as a child process (two caller tokens, a scripted model), plain HTTP calls,
 * event streams driven on a curl multi handle, and a parser for the server-sent
 * events it answers with.  Every wait is bounded and ends on an observable event
 * (a line on a pipe, a byte on a socket, a process exit), never on a fixed sleep.
 */
#ifndef TESTS_SERVETEST_H
#define TESTS_SERVETEST_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include <curl/curl.h>
#include <jansson.h>

typedef struct st_server {
  pid_t pid;
  int out_fd;                  /* its stdout (kept open) */
  int pidfd;                   /* for a bounded wait on its exit (-1: none) */
  char url[128];
  char metrics_url[128];       /* with --metrics-listen: "http://HOST:PORT/metrics" */
  char dir[64];                /* temporary: tokens, script */
  char token[2][65];           /* two callers */
  char log[160];               /* its stderr, dir/serve.log */
} st_server;

/* A scripted model (script_lua, .lua text) and `berth serve` from $BUILD (default
 * "build") on 127.0.0.1:0 with the two tokens, plus the NULL-terminated extra
 * arguments (daemon options, limits).  Waits (10 s at most) for its `listening` line.
 * Returns 0, or -1 with a message on stderr.  The child dies with the test process. */
int st_start(st_server *s, const char *script_lua, const char *const *extra);
/* As st_start, with the callers (tokens) of server `like`: another host for the same
 * callers (its own directory, script and log). */
int st_start_like(st_server *s, const st_server *like, const char *script_lua,
                  const char *const *extra);
/* Stops the server with signal `sig` (SIGTERM, SIGKILL), waits for it (20 s at most)
 * and starts it again on the same tokens, script and state directory (so the same
 * default store) with these extra arguments.  Returns the old server's exit status
 * (as st_wait_exit), or -1 if it did not exit or the new one did not start. */
int st_restart(st_server *s, int sig, const char *const *extra);
/* Waits up to `seconds` for the server to exit; its exit status (0..255), 128+signal,
 * or -1 if it did not exit in time. */
int st_wait_exit(st_server *s, double seconds);
/* SIGTERM, then st_wait_exit(20 s), SIGKILL if it hangs; removes the temporary files.
 * Returns what st_wait_exit returned. */
int st_stop(st_server *s);
/* Its stderr so far (malloc'd) or NULL. */
char *st_read_log(const st_server *s);

/* One request: method, url (full), bearer token (NULL: none), body (NULL: none; sent
 * as application/json unless `type` says otherwise).  Returns the HTTP status (0 on a
 * transport failure); *out (if given) gets the body, malloc'd. */
long st_call(const char *method, const char *url, const char *token, const char *body,
             char **out);
long st_call_type(const char *method, const char *url, const char *token, const char *body,
                  const char *type, char **out);
/* The same, with one more header line `extra` ("Name: value"; NULL: none). */
long st_call_extra(const char *method, const char *url, const char *token, const char *body,
                   const char *type, const char *extra, char **out);
/* The same, with a JSON answer parsed into *json (NULL if it is not JSON). */
long st_call_json(const char *method, const char *url, const char *token, const char *body,
                  json_t **json);

/* Parses an event stream's text: [{"event": name, "data": parsed JSON (or the
 * string when not JSON)}]. */
json_t *st_sse_parse(const char *text, size_t len);

/* A streamed request on a multi handle. */
typedef struct st_stream {
  CURL *easy;
  struct curl_slist *headers;
  char *buf;
  size_t len, cap;
  long status;
  bool done;
  CURLcode result;
  double started, ended;       /* monotonic seconds */
  void *ud;
} st_stream;

/* Starts POST url with body and the token on `multi`. */
void st_stream_start(st_stream *st, CURLM *multi, const char *url, const char *token,
                     const char *body);
/* Runs transfers until pred(ud) holds or `seconds` pass; completed transfers are
 * marked done (and removed from the multi handle).  Returns pred's last value. */
bool st_pump(CURLM *multi, bool (*pred)(void *ud), void *ud, double seconds);
/* A request's headers: the bearer token (NULL: none), the Content-Type (NULL: none) and
 * no "Expect: 100-continue".  Free with curl_slist_free_all. */
struct curl_slist *st_headers(const char *token, const char *type);
/* The streams' libcurl write callback (CURLOPT_WRITEDATA: the st_stream): appends to
 * buf, NUL-terminated. */
size_t st_stream_write(char *p, size_t size, size_t n, void *st);
/* Frees what the stream holds (removing it from the multi handle first). */
void st_stream_free(st_stream *st, CURLM *multi);
/* The events received so far. */
json_t *st_stream_events(const st_stream *st);

double st_now(void);

/* s->url followed by the printf-formatted path, in one of four rotating static buffers
 * (so a call may hold a few at once). */
char *st_url(const st_server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* st_pump predicates: the stream has received `what` (st_seen), or is done. */
typedef struct st_seen {
  st_stream *st;
  const char *what;
} st_seen;
bool st_saw(void *seen);
bool st_done(void *stream);

#endif

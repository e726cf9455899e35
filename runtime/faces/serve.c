/*
 * serve.c — `berth serve`: many conversations of one host over HTTP, with each turn
 * streamed back as server-sent events.  Everything runs on one libev loop: the host,
 * the daemon client, the model and libmicrohttpd.
 *
 *   POST   /v1/conversations                {"userId"?, "metadata"?} → 201 {"id"}
 *   POST   /v1/conversations/{id}/messages  {"content"} → 200 text/event-stream:
 *          delta, message, tool_call, tool_result, error, then turn_end (tool
 *          events carry `timing`: where the call's time went, runtime/README.md)
 *   GET    /v1/conversations/{id}           → {"id", "turns", "busy", "suspended"}
 *   DELETE /v1/conversations/{id}           completes (onComplete) → 200 when it ran
 *   GET    /healthz                         → {"status": "ok"} (no token needed)
 *   GET    /metrics                         → Prometheus text
 *   GET    /, /app.js, /style.css           → the page (web.c; no token needed)
 *
 * Callers are the bearer tokens of the token file; each is an owner.  A conversation
 * is visible only to the caller that opened it: to anyone else it does not exist
 * (404, exactly as an unknown id).  Ids are 128 random bits; log lines never hold an
 * id, a token or a session id (they name conversations by run id, "conv-<n>", and
 * callers by a short digest of their token).
 *
 * MHD runs on the loop as httpd/mhd_ev.h says (as sandboxd's does): after a resume
 * it is kicked, never run from inside an MHD callback.  A stream is a response whose content reader suspends its connection when it has
 * nothing to send; an event appends to its buffer and resumes it.  A DELETE waits
 * suspended until onComplete ran.
 *
 * Ownership: a stream is held by its conversation's queue (until its turn ends), by
 * its request (until MHD's completed notice) and by its response (until MHD frees
 * it); the last to let go frees it.
 */
#include "cli.h"
#include "xalloc.h"
#include "berth.h"
#include "plimsoll.h"
#include "diag.h"
#include "store/store.h"
#include "web.h"
#include "connguard.h"           /* httpd/: what serve shares with sandboxd */
#include "head.h"
#include "listen.h"
#include "mhd_ev.h"
#include "tokens.h"
#include "idmap.h"               /* lib/: the one id hash table */
#include "json_text.h"           /* lib/: the one compact JSON writer */

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <microhttpd.h>
#include <netdb.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ev.h>

#define DEFAULT_MAX_CONVERSATIONS 10000
/* With two or more callers, each may hold at most 1/DEFAULT_PER_CALLER_SHARE of
 * --max-conversations (rounded up), so that no caller can fill the server and lock the
 * others out. */
#define DEFAULT_PER_CALLER_SHARE 2
#define DEFAULT_MAX_TURNS 256
#define DEFAULT_MAX_QUEUED 4096
#define DEFAULT_MAX_BODY (1024 * 1024)
#define OWN_SANDBOXD_MAX_SANDBOXES 56   /* under sandboxd's default --max-sessions 64 */
#define FLUSH_LIMIT 5.0                 /* seconds to let streams flush at shutdown */
#define CALL_TIMEOUT_MS 30000
#define ID_LEN 32
/* Leases (many hosts on one store; docs/many-hosts.md) */
#define DEFAULT_LEASE_MS 10000
#define LEASE_WAIT_MAX 30.0             /* a message waits this long for another host */
#define LEASE_RETRY_FIRST 0.05          /* then 0.1, 0.2, … 1 s between tries */
#define LEASE_RETRY_MOST 1.0

static const char serve_usage[] =
  "usage: berth serve --listen HOST:PORT --callers FILE [options]\n"
  "\n"
  "Serves many conversations of one host over HTTP; each turn streams back as\n"
  "server-sent events (delta, message, tool_call, tool_result, error, turn_end).\n"
  "Port 0 picks a free port; the address is printed as `listening http://HOST:PORT`.\n"
  "\n"
  "  --listen HOST:PORT               address to serve on (loopback, cleartext)\n"
  "  --callers FILE                   callers' bearer tokens, one per line (# comments);\n"
  "                                   each caller sees only its own conversations\n"
  "                                   (--token-file is the old spelling)\n"
  "  --hooks FILE                     the hooks (default: the shipped code_chat.lua)\n"
  "  --model SPEC                     the model (required without --hooks):\n"
  "                                   openai[:NAME] or scripted:FILE (see berth(1))\n"
  "  --daemon URL                     a plimsoll daemon, with its token in\n"
  "  --daemon-token-file FILE         (first line; --token-file-daemon: old spelling)\n"
  "  --sandboxd PATH, --provider NAME start a local sandboxd instead (default\n"
  "                                   provider $BERTH_PROVIDER, else auto: the\n"
  "                                   strongest passing its smoke test, gvisor then\n"
  "                                   bwrap; echo runs no code).  Neither: $PLIMSOLL_URL\n"
  "                                   and $PLIMSOLL_TOKEN, else a local sandboxd\n"
  "  --max-conversations N            open conversations (default 10000)\n"
  "  --max-conversations-per-caller N conversations one caller may hold, those open in\n"
  "                                   a SQLite store from before a restart too; 0: no\n"
  "                                   cap (default: half of --max-conversations, rounded\n"
  "                                   up, with two or more callers; no cap with one)\n"
  "  --max-concurrent-turns N         turns running at once; more wait (default 256)\n"
  "  --max-queued-messages N          messages waiting for a turn (default 4096)\n"
  "  --max-sandboxes N                sandboxes held; idle ones closed LRU (default:\n"
  "                                   none, or 56 for a local sandboxd)\n"
  "  --max-body-bytes N               largest request body (default 1048576)\n"
  "  --max-connections N              open client connections (default: half the\n"
  "                                   descriptor limit, raised to its hard limit, at\n"
  "                                   most 4096); past it the oldest connection that has\n"
  "                                   not sent an authenticated request is closed\n"
  "  --header-timeout SECONDS         a connection that has not sent an authenticated\n"
  "                                   request this long after it opened is closed (10);\n"
  "                                   streams in progress are never cut\n"
  "  --idle-timeout SECONDS           idle time before a conversation suspends (30)\n"
  "  --store URL                      where conversations are kept: sqlite:PATH,\n"
  "                                   postgresql://... (many hosts) or memory (default\n"
  "                                   sqlite:berth.db in --state-dir)\n"
  "  --log-format text|json           one record a line: a timestamp, a level and the\n"
  "                                   message, or that as a JSON object (default text)\n"
  "  --metrics-listen HOST:PORT       serve GET /metrics there too, without a token (for\n"
  "                                   a scraper; printed as `metrics http://...`)\n"
  "  --lease-ms MS                    with a postgresql:// store shared by many hosts: a\n"
  "                                   conversation's lease lasts this long unrenewed\n"
  "                                   (10000; docs/many-hosts.md)\n"
  "  --state-dir DIR                  the directory of the default store (default: the\n"
  "                                   working directory)\n"
  "  --shutdown-grace SECONDS         on SIGTERM, time running turns get to finish\n"
  "                                   before they are cancelled (default 10)\n"
  "  --minimum-isolation TIER         the floor (default container for a daemon over\n"
  "                                   http on this machine, kernel over https)\n"
  "  --verbose, --help, --version\n"
  "\n"
  "SIGTERM or SIGINT: stop accepting, finish (or after the grace cancel) the running\n"
  "turns, dispose every sandbox, exit 0.  SIGHUP reloads the hooks and reads the\n"
  "token file again (callers added or removed without a restart).\n";

typedef struct server server;
typedef struct stream stream;
typedef struct sconv sconv;
typedef struct request request;

typedef struct caller {
  unsigned char hash[32];
  char label[12];                /* "k" + 8 hex digits of the token's SHA-256 */
  char digest[65];               /* all of it: the owner of its stored conversations */
  size_t convs;                  /* held here: created, or loaded from the store */
  size_t stored;                 /* open in the store, not loaded yet (a host alone on it) */
  bool revoked;                  /* gone from the token file (SIGHUP): not accepted */
} caller;

struct stream {
  int refs;
  server *s;
  struct MHD_Connection *conn;   /* NULL once MHD is done with the request */
  bool started, finished, suspended;
  char *buf;
  size_t len, off, cap;
  /* Bytes in all: put; of them, whose events are stored, so that they may be sent;
   * of them, sent and gone from buf (buf holds those after `dropped`). */
  uint64_t put, released, dropped;
  uint64_t upto;                 /* in the server's syncing list: what its sync covers */
  stream *syncing_next, *unsynced_next;
  bool unsynced;                 /* in that list (each list holds a reference) */
  stream *next;                  /* the conversation's queue, or its followers */
  request *waiting;              /* the POST waiting for its message to be stored */
  bool stored;                   /* (stored before berth_conv_message_durable returned) */
};

struct sconv {
  char id[ID_LEN + 1];
  size_t caller;
  berth_conv *conv;
  stream *head, *tail;           /* one per message, in order; head is the turn's */
  stream *followers;             /* GET …/events following the running turn */
  request *deleting;             /* the DELETE waiting for onComplete */
  double mark, call_at;          /* ev_time(): the turn's start or last tool result; the
                                    tool call (the timing of tool events) */
  plm_idmap_node node;           /* in s->convs, under id */
  server *s;
  /* the lease (a shared store): held while a turn of it runs or waits here */
  int lease;                     /* LEASE_NONE, LEASE_TAKING, LEASE_HELD */
  request *pend, *pend_tail;     /* messages waiting for it, in order */
  struct lease_wait *lw;         /* the take in flight */
  ev_timer retry;                /* the next take while another host holds it */
  double wait_until, backoff;
  bool want_suspend;             /* idle: suspend once the lease is taken (on_lease) */
  bool fenced;                   /* the store refused its writes: another host holds it */
  int64_t turn_started_ms;       /* the running turn's start (its turn_end says it) */
};

enum { LEASE_NONE, LEASE_TAKING, LEASE_HELD };

typedef enum route {
  R_NONE, R_HEALTH, R_READY, R_METRICS, R_CONVS, R_CONV, R_MESSAGES, R_EVENTS
} route;

struct request {
  server *s;
  struct MHD_Connection *conn;
  request *lnext;                /* in lease_sc's messages waiting for the lease */
  sconv *lease_sc;
  struct create_wait *cw;        /* a POST /v1/conversations waiting for its commit */
  route route;
  char id[ID_LEN + 1];
  size_t caller;
  bool dispatched, suspended, too_large, is_delete, is_get;
  bool answered;                 /* a response is queued: the rest is discarded */
  sconv *deleting;               /* the conversation this DELETE waits for */
  char *body;
  size_t len, cap, discarded;
  stream *stream;
  struct MHD_Response *response; /* ready, for a suspended request */
  unsigned status;
  char method[8];                /* for the access log */
  char path[128];
  double started;
};

typedef struct status_count {
  unsigned code;
  uint64_t n;
} status_count;

struct server {
  struct ev_loop *loop;
  berth_host *h;
  berth_store *store;            /* conversations outlive the process (store.h) */
  berth_model *model;
  struct MHD_Daemon *mhd;
  connguard *guard;              /* idle and surplus connections (connguard.h) */
  int listen_fd;
  httpd_mhd web;                 /* MHD on the loop (mhd_ev.h) */
  struct MHD_Daemon *metrics_mhd;   /* --metrics-listen: /metrics alone, no token */
  httpd_mhd metrics_web;
  ev_timer flush;
  ev_signal sigterm, sigint, sighup;
  const char *token_file;        /* read again on SIGHUP */
  caller *callers;
  size_t n_callers;
  sconv **table;
  plm_idmap convs;               /* sconv by public id (lib/idmap.h) */
  size_t max_per_caller, max_body, max_queued;
  size_t active;                 /* requests MHD holds */
  bool stopping, host_done, verbose;
  bool no_code_runs;             /* the daemon's provider is echo (its Describe says) */
  status_count statuses[24];
  size_t n_statuses;
  uint64_t streams_open;
  /* Streams with events not stored yet: those the sync in flight covers (up to each
   * one's `upto`; not empty while that sync is in flight), and those with events put
   * since it was asked for. */
  stream *syncing, *unsynced;
  /* leases: with a shared store (postgresql), one conversation's turns run on one host
   * at a time (docs/many-hosts.md); a host alone on its store (sqlite, memory) needs none */
  bool leases;
  char host_id[24];              /* this process in the leases: random at each start */
  int64_t lease_ms;
  size_t leases_held;
  ev_timer renew;                /* every lease_ms / 3 */
  bool renew_failing;
};

/* {====================================================== small things */

/* One log record is one line: a UTC timestamp, a level and the message (its newlines
 * folded, so a traceback stays one record), as text or, with --log-format json, as a
 * JSON object {"ts", "level", "msg"} an aggregator can read.  Records name callers by
 * label and conversations by their public id: never a token or a session id. */
static bool log_json;

static void log_record(const char *level, const char *message)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  char when[40];
  size_t n = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(when + n, sizeof when - n, ".%03ldZ", ts.tv_nsec / 1000000);
  if (log_json) {
    json_t *o = json_pack("{s:s, s:s, s:s}", "ts", when, "level", level, "msg", message);
    char *text = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    json_decref(o);
    if (text)
      fprintf(stderr, "%s\n", text);
    free(text);
    return;
  }
  /* One write a record: stderr is unbuffered, and a character at a time was a
   * system call each, about a hundred for every request's access record. */
  size_t len = strlen(message), cap = len + sizeof when + 16;
  char small[2304];
  char *line = cap <= sizeof small ? small : malloc(cap);
  if (!line)
    return;
  size_t at = (size_t)snprintf(line, cap, "%s %-5s ", when, level);
  for (const char *p = message; *p; p++)
    line[at++] = *p == '\n' ? ' ' : *p;
  line[at++] = '\n';
  fwrite(line, 1, at, stderr);
  if (line != small)
    free(line);
}

static void slog_at(const char *level, const char *fmt, va_list ap)
{
  char line[2048];
  vsnprintf(line, sizeof line, fmt, ap);
  log_record(level, line);
}

static void slog(server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void slog(server *s, const char *fmt, ...)
{
  (void)s;
  va_list ap;
  va_start(ap, fmt);
  slog_at("info", fmt, ap);
  va_end(ap);
}

static void slog_warn(server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void slog_warn(server *s, const char *fmt, ...)
{
  (void)s;
  va_list ap;
  va_start(ap, fmt);
  slog_at("warn", fmt, ap);
  va_end(ap);
}

/* The store's and the local sandboxd's own lines (diag.h), into the same log: from
 * any thread (the checkpoint thread's), so no server state is touched. */
static void diag_log(void *ud, berth_log_level level, const char *message)
{
  (void)ud;
  static const char *const names[] = {"debug", "info", "warn", "error"};
  log_record(names[level], message);
}

static void host_log(void *ud, berth_log_level level, const char *message)
{
  server *s = ud;
  if (level == BERTH_LOG_DEBUG && !s->verbose)
    return;
  diag_log(NULL, level, message);
}

static bool parse_count(const char *arg, size_t *out)
{
  char *end;
  errno = 0;
  unsigned long long v = strtoull(arg, &end, 10);
  if (errno || end == arg || *end || arg[0] == '-')
    return false;
  *out = (size_t)v;
  return true;
}

static bool parse_secs(const char *arg, double *out)
{
  char *end;
  errno = 0;
  double v = strtod(arg, &end);
  if (errno || end == arg || *end || !(v >= 0))
    return false;
  *out = v;
  return true;
}

/* Non-blank lines not starting with '#', trimmed.  Returns the count, -1 on error. */
static int read_lines(const char *path, char ***out)
{
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  char line[4096];
  int n = 0;
  *out = NULL;
  while (fgets(line, sizeof line, f)) {
    char *p = line;
    while (*p == ' ' || *p == '\t')
      p++;
    size_t len = strcspn(p, "\r\n");
    while (len && (p[len - 1] == ' ' || p[len - 1] == '\t'))
      len--;
    p[len] = '\0';
    if (!len || p[0] == '#')
      continue;
    *out = berth_xrealloc(*out, (size_t)(n + 1) * sizeof **out);
    (*out)[n++] = berth_xstrdup(p);
  }
  fclose(f);
  return n;
}

static void free_lines(char **v, int n)
{
  for (int i = 0; i < n; i++) {
    OPENSSL_cleanse(v[i], strlen(v[i]));
    free(v[i]);
  }
  free(v);
}

/* }====================================================== */

/* {====================================================== conversations table */

static void table_add(server *s, sconv *c)
{
  c->node.key = c->id;
  if (!plm_idmap_put(&s->convs, &c->node))
    berth_oom(sizeof c->node);
}

static void table_remove(server *s, sconv *c)
{
  plm_idmap_remove(&s->convs, &c->node);
}

/* The caller's conversation with this id, else NULL (another caller's too). */
static sconv *table_find(server *s, const char *id, size_t who)
{
  /* (The map compares keys only once their 64-bit hashes, seeded per map, are equal:
   * a guessed id learns nothing from the time a miss takes.) */
  plm_idmap_node *n = strlen(id) == ID_LEN ? plm_idmap_get(&s->convs, id) : NULL;
  sconv *c = n ? PLM_IDMAP_OWNER(n, sconv, node) : NULL;
  return c && c->caller == who ? c : NULL;
}

/* }====================================================== */

/* {====================================================== responses */

static void count_status(server *s, unsigned code)
{
  for (size_t i = 0; i < s->n_statuses; i++)
    if (s->statuses[i].code == code) {
      s->statuses[i].n++;
      return;
    }
  if (s->n_statuses < sizeof s->statuses / sizeof *s->statuses)
    s->statuses[s->n_statuses++] = (status_count){code, 1};
}

static struct MHD_Response *text_response(const char *type, char *text)
{
  struct MHD_Response *r =
    MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(text);
    return NULL;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  return r;
}

static struct MHD_Response *json_response(json_t *body)
{
  char *text = plm_json_write(body, NULL);
  json_decref(body);
  if (!text)
    text = berth_xstrdup("{}");
  return text_response("application/json", text);
}

static struct MHD_Response *error_response(const char *code, const char *fmt, ...)
  __attribute__((format(printf, 2, 3)));
static struct MHD_Response *error_response(const char *code, const char *fmt, ...)
{
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return json_response(json_pack("{s:{s:s, s:s}}", "error", "code", code, "message", msg));
}

static enum MHD_Result queue(request *q, unsigned status, struct MHD_Response *r)
{
  if (!r)
    return MHD_NO;
  q->answered = true;
  q->status = status;
  if (status == MHD_HTTP_UNAUTHORIZED)
    MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
  if (q->s->stopping)
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
  count_status(q->s, status);
  enum MHD_Result ok = MHD_queue_response(q->conn, status, r);
  MHD_destroy_response(r);
  return ok;
}

/* An answer ready for a suspended request: resume it; the access handler queues it. */
static void answer_later(request *q, unsigned status, struct MHD_Response *r)
{
  server *s = q->s;
  q->response = r;
  q->status = status;
  if (q->suspended) {
    q->suspended = false;
    MHD_resume_connection(q->conn);
    httpd_mhd_kick(&s->web);
  }
}

/* A refusal that is safe to retry says when. */
static struct MHD_Response *retry_later(struct MHD_Response *r, int seconds)
{
  char v[16];
  snprintf(v, sizeof v, "%d", seconds);
  if (r)
    MHD_add_response_header(r, "Retry-After", v);
  return r;
}

static const char *status_of(const berth_error *e, unsigned *status)
{
  if (!strcmp(e->code, "capacity"))
    *status = MHD_HTTP_TOO_MANY_REQUESTS;
  else if (!strcmp(e->code, "shutting_down"))
    *status = MHD_HTTP_SERVICE_UNAVAILABLE;
  else if (!strcmp(e->code, "completed"))
    *status = MHD_HTTP_CONFLICT;
  else if (!strcmp(e->code, "invalid_argument"))
    *status = MHD_HTTP_BAD_REQUEST;
  else if (!strcmp(e->code, "unavailable"))
    *status = MHD_HTTP_SERVICE_UNAVAILABLE;     /* the store cannot be written now */
  else
    *status = MHD_HTTP_INTERNAL_SERVER_ERROR;
  return e->code;
}

/* }====================================================== */

/* {====================================================== streams */

static void stream_unref(stream *st)
{
  if (--st->refs > 0)
    return;
  st->s->streams_open--;
  free(st->buf);
  free(st);
}

static void stream_wake(stream *st)
{
  if (st->suspended && st->conn) {
    st->suspended = false;
    MHD_resume_connection(st->conn);
    httpd_mhd_kick(&st->s->web);
  }
}

/* {------ an event is sent once it is stored
 * A client that saw an event may resume after it (Last-Event-ID), from the store,
 * and on another host if this one dies: so the event must be there, or the next one
 * stored (a turn marked interrupted) would take its number and the client would
 * skip it.  An event is recorded (queued in the store) before it is put in a
 * stream, and the stream sends it once a sync after it was answered.  One sync is in
 * flight for all streams at a time: events put meanwhile wait for the next one (at
 * most two commits).  A sync that failed releases its events too: the store said
 * why and keeps trying, and a stream does not wait for a store that may not come
 * back. */

static void ask_events_sync(server *s);

static void on_events_stored(void *ud, const berth_error *err)
{
  (void)err;
  server *s = ud;
  while (s->syncing) {
    stream *st = s->syncing;
    s->syncing = st->syncing_next;
    st->syncing_next = NULL;
    if (st->upto > st->released)
      st->released = st->upto;
    stream_wake(st);
    stream_unref(st);
  }
  if (s->unsynced)
    ask_events_sync(s);
}

/* The streams with events put since the last sync was asked for: a sync for them.
 * Called only while no sync is in flight, so the syncing list is empty and each
 * stream's reference moves from one list to the other. */
static void ask_events_sync(server *s)
{
  while (s->unsynced) {
    stream *st = s->unsynced;
    s->unsynced = st->unsynced_next;
    st->unsynced_next = NULL;
    st->unsynced = false;
    st->upto = st->put;
    st->syncing_next = s->syncing;
    s->syncing = st;
  }
  berth_store_sync(s->store, on_events_stored, s);
}

/* At exit: what waits for a sync is released, and the lists' references dropped. */
static void release_streams(server *s)
{
  while (s->syncing) {
    stream *st = s->syncing;
    s->syncing = st->syncing_next;
    stream_unref(st);
  }
  while (s->unsynced) {
    stream *st = s->unsynced;
    s->unsynced = st->unsynced_next;
    st->unsynced = false;
    stream_unref(st);
  }
}

/* One event, `id:` its number in the conversation (Last-Event-ID resumes after it):
 * `stored`, read from the store; else recorded just now, and sent once stored. */
static void stream_put(stream *st, uint64_t seq, const char *event, const char *text,
                       bool stored)
{
  if (st->finished || !st->conn)  /* (a client gone: the turn goes on unwatched) */
    return;
  size_t need = strlen(event) + strlen(text) + 64;
  if (st->len + need > st->cap) {
    st->cap = (st->len + need) * 2;
    st->buf = berth_xrealloc(st->buf, st->cap);
  }
  size_t n = (size_t)sprintf(st->buf + st->len, "id: %llu\nevent: %s\ndata: %s\n\n",
                             (unsigned long long)seq, event, text);
  st->len += n;
  st->put += n;
  if (stored) {
    st->released = st->put;
    stream_wake(st);
    return;
  }
  server *s = st->s;
  if (!st->unsynced) {
    st->unsynced = true;
    st->refs++;
    st->unsynced_next = s->unsynced;
    s->unsynced = st;
  }
  if (!s->syncing)              /* (no sync in flight) */
    ask_events_sync(s);
}

/* ------} */

static void stream_finish(stream *st)
{
  st->finished = true;
  stream_wake(st);
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
  (void)pos;
  stream *st = cls;
  size_t ready = (size_t)(st->released - st->dropped);  /* in buf, stored: may go */
  if (st->off < ready) {
    size_t n = ready - st->off < max ? ready - st->off : max;
    memcpy(buf, st->buf + st->off, n);
    st->off += n;
    if (st->off == st->len) {
      st->dropped += st->len;
      st->off = st->len = 0;
    }
    return (ssize_t)n;
  }
  if (st->finished && st->off == st->len)
    return MHD_CONTENT_READER_END_OF_STREAM;
  if (!st->conn)
    return MHD_CONTENT_READER_END_WITH_ERROR;
  /* Nothing to send yet: park the connection until the next event. */
  st->suspended = true;
  MHD_suspend_connection(st->conn);
  return 0;
}

static void sse_free(void *cls)
{
  stream_unref(cls);
}

/* The stream of the conversation's turn in progress (NULL outside a turn). */
static stream *turn_stream(sconv *sc)
{
  if (!sc->head || !sc->head->started)
    return NULL;
  return sc->head;
}

/* An event of the conversation's turn: numbered and stored (so GET …/events can
 * replay it), then sent to the turn's stream and to whoever follows the turn.  Steals
 * data. */
static void conv_event(berth_conv *c, const char *event, json_t *data)
{
  sconv *sc = berth_conv_userdata(c);
  if (!sc || !data) {
    json_decref(data);
    return;
  }
  /* One encoding for the store and the streams; compact JSON is one line. */
  char *text = plm_json_write(data, NULL);
  json_decref(data);
  if (!text)
    return;
  uint64_t seq = berth_conv_record_event_text(c, event, text);
  stream *st = turn_stream(sc);
  if (st)
    stream_put(st, seq, event, text, false);
  for (stream *f = sc->followers; f; f = f->next)
    stream_put(f, seq, event, text, false);
  free(text);
}

/* The followers of a turn are done when it ends. */
static void end_followers(sconv *sc)
{
  while (sc->followers) {
    stream *f = sc->followers;
    sc->followers = f->next;
    f->next = NULL;
    stream_finish(f);
    stream_unref(f);
  }
}

/* }====================================================== */

/* {====================================================== host callbacks */

static void on_turn_start(void *ud, berth_conv *c, const char *message)
{
  (void)ud;
  (void)message;
  sconv *sc = berth_conv_userdata(c);
  if (sc) {
    sc->mark = ev_time();
    sc->turn_started_ms = berth_store_now_ms();
  }
  if (sc && sc->head)
    sc->head->started = true;
}

static void on_delta(void *ud, berth_conv *c, const char *text, size_t len)
{
  (void)ud;
  conv_event(c, "delta", json_pack("{s:s%}", "text", text, len));
}

static void on_message(void *ud, berth_conv *c, const char *text, size_t len)
{
  (void)ud;
  conv_event(c, "message", json_pack("{s:s%}", "text", text, len));
}

static void on_tool_call(void *ud, berth_conv *c, const char *id, const char *name,
                         const char *arguments)
{
  (void)ud;
  sconv *sc = berth_conv_userdata(c);
  berth_cell_timing stale;
  berth_conv_take_cell_timing(c, &stale);  /* a cell before this call is not its own */
  double now = ev_time(), model_ms = sc && sc->mark ? (now - sc->mark) * 1e3 : 0;
  if (sc)
    sc->call_at = now;
  conv_event(c, "tool_call", json_pack("{s:s, s:s, s:s, s:{s:f}}", "id", id, "name", name,
                                       "arguments", arguments, "timing", "modelMs",
                                       model_ms));
}

/* Where a tool call's time went (runtime/README.md, "Timing of a tool call"). */
static json_t *call_timing(berth_conv *c, sconv *sc, double now)
{
  json_t *t = json_object();
  double total_ms = sc && sc->call_at ? (now - sc->call_at) * 1e3 : 0;
  berth_cell_timing ct;
  if (!berth_conv_take_cell_timing(c, &ct)) {   /* no executeCode ran (a hook answered) */
    json_object_set_new(t, "hookMs", json_real(total_ms));
    return t;
  }
  double hook = total_ms - ct.execute_ms, net = ct.call_ms - ct.check_ms - ct.daemon_ms;
  json_object_set_new(t, "hookMs", json_real(hook > 0 ? hook : 0));
  json_object_set_new(t, "executeMs", json_real(ct.execute_ms));
  if (ct.call_ms > 0) {          /* measured by the client (a session call) */
    json_object_set_new(t, "waitMs", json_real(ct.wait_ms));
    json_object_set_new(t, "callMs", json_real(ct.call_ms));
    json_object_set_new(t, "networkMs", json_real(net > 0 ? net : 0));
    json_object_set_new(t, "daemonMs", json_real(ct.daemon_ms));
    json_object_set_new(t, "checkMs", json_real(ct.check_ms));
  }
  return t;
}

static void on_tool_result(void *ud, berth_conv *c, const char *id, const json_t *result,
                           const berth_error *err)
{
  server *s = ud;
  sconv *sc = berth_conv_userdata(c);
  double now = ev_time();
  json_t *timing = call_timing(c, sc, now);
  if (sc)
    sc->mark = now;              /* the next call's model step starts here */
  if (result && s->no_code_runs) /* the echo provider: say it on every result */
    conv_event(c, "tool_result", json_pack("{s:s, s:O, s:o, s:b}", "id", id, "result",
                                           result, "timing", timing, "noCodeRan", 1));
  else if (result)
    conv_event(c, "tool_result", json_pack("{s:s, s:O, s:o}", "id", id, "result", result,
                                           "timing", timing));
  else
    conv_event(c, "tool_result", json_pack("{s:s, s:{s:s, s:s}, s:o}", "id", id, "error",
                                           "code", err->code, "message",
                                           err->message ? err->message : "", "timing",
                                           timing));
}

/* A hook's failure reaches the caller as an id to quote, never as the hook's own text
 * (its file, its lines, what it held): that goes to the log under the same id. */
static void on_error(void *ud, berth_conv *c, const berth_error *err)
{
  server *s = ud;
  if (err->code && !strcmp(err->code, "hook")) {
    unsigned char raw[4];
    char id[9];
    if (RAND_bytes(raw, sizeof raw) != 1)
      memset(raw, 0, sizeof raw);
    plm_hex_encode(raw, sizeof raw, id);
    id[8] = '\0';
    sconv *sc = berth_conv_userdata(c);
    slog_warn(s, "hook error %s in conversation %s: %s", id, sc ? sc->id : "-",
              err->message ? err->message : "");
    conv_event(c, "error", json_pack("{s:s, s:s, s:s}", "code", "hook", "errorId", id,
                                     "message", "the conversation's hook failed; quote "
                                                "this error id to the operator, whose log "
                                                "has the details"));
    return;
  }
  conv_event(c, "error", json_pack("{s:s, s:s}", "code", err->code, "message",
                                   err->message ? err->message : ""));
}

static void lease_release(sconv *sc);

static void on_turn_end(void *ud, berth_conv *c, const berth_turn_info *info)
{
  (void)ud;
  sconv *sc = berth_conv_userdata(c);
  if (!sc)
    return;
  json_t *end = json_pack("{s:i, s:b, s:f, s:i}", "turn", (json_int_t)info->turn, "ok",
                          info->ok, "seconds", info->seconds, "cells",
                          (json_int_t)info->cells);
  if (info->refused && end)     /* never taken: replay_message runs a retry of it */
    json_object_set_new(end, "refused", json_true());
  if (sc->s->leases && end)     /* where and when it ran: one host at a time, checkably */
    json_object_update_new(end, json_pack("{s:s, s:I, s:I}", "host", sc->s->host_id,
                                          "startedMs", (json_int_t)sc->turn_started_ms,
                                          "endedMs", (json_int_t)berth_store_now_ms()));
  conv_event(c, "turn_end", end);
  end_followers(sc);
  if (sc->s->leases && !berth_conv_busy(c))
    lease_release(sc);          /* queued after the turn's end */
  if (!sc->head)
    return;
  stream *st = sc->head;
  stream_finish(st);
  sc->head = st->next;
  if (!sc->head)
    sc->tail = NULL;
  st->next = NULL;
  stream_unref(st);
}

static void lease_forget(sconv *sc);

static void sconv_free(sconv *sc)
{
  server *s = sc->s;
  if (s->leases)
    lease_forget(sc);
  while (sc->head) {            /* (only at exit: turns end before a completion) */
    stream *st = sc->head;
    sc->head = st->next;
    stream_finish(st);
    stream_unref(st);
  }
  end_followers(sc);
  if (sc->caller < s->n_callers)
    s->callers[sc->caller].convs--;
  berth_conv_free(sc->conv);
  free(sc);
}

/* onComplete ran (DELETE): answer it, then let the conversation go. */
static void on_completed(void *ud, berth_conv *c)
{
  (void)c;
  sconv *sc = ud;
  request *q = sc->deleting;
  if (q) {
    q->deleting = NULL;
    answer_later(q, MHD_HTTP_OK,
                 json_response(json_pack("{s:s, s:b, s:i}", "id", sc->id, "completed", 1,
                                         "turns", (json_int_t)berth_conv_turns(c))));
  }
  sconv_free(sc);
}

/* }====================================================== */

/* {====================================================== routes */

/* The conversation's id from "/v1/conversations/<id>[/messages]"; the route. */
static route match(const char *url, char *id)
{
  static const char base[] = "/v1/conversations";
  if (!strcmp(url, "/healthz"))
    return R_HEALTH;
  if (!strcmp(url, "/readyz"))
    return R_READY;
  if (!strcmp(url, "/metrics"))
    return R_METRICS;
  if (strncmp(url, base, sizeof base - 1) != 0)
    return R_NONE;
  url += sizeof base - 1;
  if (!*url || !strcmp(url, "/"))
    return R_CONVS;
  if (*url++ != '/')
    return R_NONE;
  size_t n = strcspn(url, "/");
  if (n == 0 || n > ID_LEN)
    return R_NONE;
  memcpy(id, url, n);
  id[n] = '\0';
  url += n;
  if (!*url)
    return R_CONV;
  if (!strcmp(url, "/messages"))
    return R_MESSAGES;
  if (!strcmp(url, "/events"))
    return R_EVENTS;
  return R_NONE;
}

static const char *allowed(route r)
{
  switch (r) {
    case R_HEALTH: case R_READY: case R_METRICS: case R_EVENTS: return "GET";
    case R_CONVS: case R_MESSAGES: return "GET, POST";
    case R_CONV: return "GET, DELETE";
    default: return "";
  }
}

static bool method_ok(route r, const char *method)
{
  const char *a = allowed(r);
  size_t n = strlen(method);
  for (const char *p = a; (p = strstr(p, method)); p += n)
    if ((p == a || p[-1] == ' ') && (p[n] == '\0' || p[n] == ','))
      return true;
  return false;
}

/* Constant-time over every configured token; the caller's index, or -1. */
static long authenticate(server *s, struct MHD_Connection *conn)
{
  httpd_token_hash hash;
  if (!httpd_bearer_hash(MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_AUTHORIZATION), hash))
    return -1;
  long found = -1;
  for (size_t i = 0; i < s->n_callers; i++)
    if (CRYPTO_memcmp(hash, s->callers[i].hash, sizeof hash) == 0 && !s->callers[i].revoked)
      found = (long)i;
  OPENSSL_cleanse(hash, sizeof hash);
  return found;
}

static bool json_type_ok(struct MHD_Connection *conn)
{
  const char *ct = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                               MHD_HTTP_HEADER_CONTENT_TYPE);
  if (!ct)
    return true;
  while (*ct == ' ')
    ct++;
  return strncasecmp(ct, "application/json", 16) == 0 && (ct[16] == '\0' || ct[16] == ';' ||
                                                          ct[16] == ' ');
}

/* A reason for a refusal, made fit for the error body: jansson's parse errors quote
 * the bytes they stopped at and "%.64s" may cut a character, but the body is JSON,
 * which takes only UTF-8 (else the caller would get "{}"): ill-formed bytes become
 * '?'. */
static char *msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *msg(const char *fmt, ...)
{
  char *s = NULL;
  va_list ap;
  va_start(ap, fmt);
  if (vasprintf(&s, fmt, ap) < 0)
    s = NULL;
  va_end(ap);
  if (!s)
    return berth_xstrdup("?");
  unsigned char *p = (unsigned char *)s;
  for (size_t n = strlen(s), i = 0; i < n;) {
    size_t len = plm_utf8_sequence(p + i, n - i);
    if (len == 0) {
      p[i] = '?';
      len = 1;
    }
    i += len;
  }
  return s;
}

/* The body as a JSON object (an empty body is {} when `empty_ok`); NULL with *why. */
static json_t *parse_object(const char *body, size_t len, bool empty_ok, char **why)
{
  if (len == 0 && empty_ok)
    return json_object();
  json_error_t je;
  json_t *v = len ? json_loadb(body, len, JSON_REJECT_DUPLICATES, &je) : NULL;
  if (!v) {
    *why = len ? msg("the body is not valid JSON (%s at byte %d)", je.text, je.position)
               : msg("the body is empty; a JSON object is needed");
    return NULL;
  }
  if (!json_is_object(v)) {
    json_decref(v);
    *why = msg("the body must be a JSON object");
    return NULL;
  }
  return v;
}

/* The bodies are decoded apart from MHD and the host, so that tests/fuzz/fuzz_serve.c
 * reaches the very code that reads them (declared in cli.h). */
char *berth_serve_create_body(const char *body, size_t len, berth_serve_create *out)
{
  memset(out, 0, sizeof *out);
  char *why = NULL;
  json_t *v = parse_object(body, len, true, &why);
  if (!v)
    return why;
  const char *k;
  json_t *f;
  json_object_foreach(v, k, f)
    if (strcmp(k, "userId") && strcmp(k, "metadata")) {
      why = msg("unknown field \"%.64s\" (known: userId, metadata)", k);
      json_decref(v);
      return why;
    }
  const json_t *user = json_object_get(v, "userId");
  const json_t *meta = json_object_get(v, "metadata");
  if (user && (!json_is_string(user) || json_string_length(user) == 0 ||
               json_string_length(user) > 128 ||
               strlen(json_string_value(user)) != json_string_length(user)))
    why = msg("userId must be a string of 1 to 128 bytes");
  else if (meta && !json_is_object(meta))
    why = msg("metadata must be a JSON object");
  if (why) {
    json_decref(v);
    return why;
  }
  out->body = v;
  out->user = user ? json_string_value(user) : NULL;
  out->metadata = meta;
  return NULL;
}

/* A client's id for a message (messageId, or an Idempotency-Key): 1 to 128 bytes of
 * UTF-8 without NUL -- the store's index and a replay's "user" event hold it as text. */
static bool message_id_ok(const char *id, size_t len)
{
  return len >= 1 && len <= 128 && strlen(id) == len && plm_utf8_valid(id, len);
}

char *berth_serve_message_body(const char *body, size_t len, json_t **out,
                               const char **content)
{
  *out = NULL;
  *content = NULL;
  char *why = NULL;
  json_t *v = parse_object(body, len, false, &why);
  if (!v)
    return why;
  const json_t *c = json_object_get(v, "content");
  const json_t *mid = json_object_get(v, "messageId");
  if (!json_is_string(c) || json_object_size(v) != 1 + (mid != NULL) ||
      strlen(json_string_value(c)) != json_string_length(c)) {
    json_decref(v);
    return msg("the body must be {\"content\": \"<the message>\"} (a string without NUL "
               "bytes), with an optional \"messageId\"");
  }
  if (mid && (!json_is_string(mid) ||
              !message_id_ok(json_string_value(mid), json_string_length(mid)))) {
    json_decref(v);
    return msg("messageId must be a string of 1 to 128 bytes");
  }
  *out = v;
  *content = json_string_value(c);
  return NULL;
}

/* A created conversation's answer, waiting for its record's commit. */
typedef struct create_wait {
  request *q;                    /* NULL once its client left */
  char id[ID_LEN + 1];
} create_wait;

static void on_created(void *ud, const berth_error *err)
{
  create_wait *cw = ud;
  request *q = cw->q;
  if (q) {
    q->cw = NULL;
    if (err)
      answer_later(q, MHD_HTTP_SERVICE_UNAVAILABLE,
                   retry_later(error_response("unavailable", "the conversation could not "
                                                             "be stored: %s", err->message),
                               1));
    else
      answer_later(q, MHD_HTTP_CREATED, json_response(json_pack("{s:s}", "id", cw->id)));
  }
  free(cw);
}

static enum MHD_Result do_create(request *q)
{
  server *s = q->s;
  berth_serve_create body;
  char *why = berth_serve_create_body(q->body, q->len, &body);
  if (why) {
    struct MHD_Response *r = error_response("invalid_argument", "%s", why);
    free(why);
    return queue(q, MHD_HTTP_BAD_REQUEST, r);
  }
  const char *user = body.user;
  caller *cl = &s->callers[q->caller];
  if (s->max_per_caller && cl->convs + cl->stored >= s->max_per_caller) {
    json_decref(body.body);
    return queue(q, MHD_HTTP_TOO_MANY_REQUESTS,
                 error_response("capacity", "this caller holds its limit of %zu "
                                            "conversations; delete one first",
                                s->max_per_caller));
  }
  /* The owner the hooks see: the caller's label, and its user when it names one, so
   * that two callers' users never share an owner (nor its sandbox caps). */
  char owner[160];
  if (user)
    snprintf(owner, sizeof owner, "%s:%s", cl->label, user);
  sconv *sc = berth_xcalloc(1, sizeof *sc);
  sc->s = s;
  sc->caller = q->caller;
  unsigned char raw[ID_LEN / 2];
  if (RAND_bytes(raw, sizeof raw) != 1) {
    free(sc);
    json_decref(body.body);
    return queue(q, MHD_HTTP_INTERNAL_SERVER_ERROR,
                 error_response("internal", "no random bytes for an id"));
  }
  plm_hex_encode(raw, sizeof raw, sc->id);
  berth_conv_options co = {NULL, user ? owner : NULL, body.metadata, sc, sc->id, cl->digest};
  berth_error *e = berth_conv_open(s->h, &co, &sc->conv);
  json_decref(body.body);
  if (e) {
    unsigned status;
    const char *code = status_of(e, &status);
    struct MHD_Response *r = error_response(code, "%s", e->message);
    berth_error_free(e);
    free(sc);
    return queue(q, status, r);
  }
  cl->convs++;
  table_add(s, sc);
  if (s->verbose)
    slog(s, "caller %s opened %s", cl->label, berth_conv_run_id(sc->conv));
  if (s->leases) {
    /* Another host may get its next message: the record is committed first. */
    create_wait *cw = berth_xcalloc(1, sizeof *cw);
    cw->q = q;
    memcpy(cw->id, sc->id, sizeof cw->id);
    q->cw = cw;
    q->suspended = true;
    MHD_suspend_connection(q->conn);
    berth_store_sync(s->store, on_created, cw);
    return MHD_YES;
  }
  return queue(q, MHD_HTTP_CREATED, json_response(json_pack("{s:s}", "id", sc->id)));
}

static void sc_unqueue(sconv *sc, stream *st)
{
  stream **pp = &sc->head;
  sc->tail = NULL;
  while (*pp) {
    if (*pp == st)
      *pp = st->next;
    else {
      sc->tail = *pp;
      pp = &(*pp)->next;
    }
  }
  st->next = NULL;
}

static struct MHD_Response *sse_response(stream *st)
{
  struct MHD_Response *r =
    MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_read, st, sse_free);
  if (!r)
    return NULL;
  st->refs++;                   /* the response's */
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
  MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  MHD_add_response_header(r, "X-Accel-Buffering", "no");
  return r;
}

static void lease_maybe_release(sconv *sc);

/* The message is stored (its turn may start now) or could not be: answer its POST. */
static void on_stored(void *ud, berth_conv *c, const berth_error *err)
{
  stream *st = ud;
  request *q = st->waiting;
  st->waiting = NULL;
  if (!q) {                     /* answered already (no store), or its client left */
    st->stored = true;
    if (err && c && berth_conv_userdata(c)) {
      sconv *sc = berth_conv_userdata(c);
      sc_unqueue(sc, st);
      stream_unref(st);         /* the queue's */
      if (sc->s->leases)
        lease_maybe_release(sc);
    }
    return;
  }
  if (err) {
    if (c && berth_conv_userdata(c)) {
      sconv *sc = berth_conv_userdata(c);
      sc_unqueue(sc, st);
      stream_unref(st);         /* the queue's */
      if (sc->s->leases)
        lease_maybe_release(sc);
    }
    slog(q->s, "a message was refused: the store failed (%s)", err->message);
    answer_later(q, MHD_HTTP_SERVICE_UNAVAILABLE,
                 error_response("unavailable", "the message could not be stored, so it was "
                                               "not taken; retry later"));
    return;
  }
  answer_later(q, MHD_HTTP_OK, sse_response(st));
}

/* {====================================================== leases (many hosts) */

/*
 * With a shared store, a conversation's turns run on one host at a time: the host that
 * gets a message takes the conversation's lease (store.h) before it stores the
 * message, holds it while a turn of it runs or waits here, and gives it back once the
 * last turn's end is stored.  Taking it, a host learns whether another host ran turns
 * since its own copy (then it drops that copy and its sandbox and resumes from the
 * store, as after an idle suspend), or left a turn running and died (then that turn
 * is marked interrupted first).  A message for a conversation another live host holds
 * waits, as a message waits behind a running turn on one host, retrying the take;
 * after LEASE_WAIT_MAX it is answered 503 "busy" with Retry-After, nothing stored.
 */

typedef struct lease_wait {
  sconv *sc;                     /* NULL once the conversation is freed */
} lease_wait;

static void lease_take(sconv *sc);

static void pend_remove(request *q)
{
  sconv *sc = q->lease_sc;
  if (!sc)
    return;
  request **pp = &sc->pend;
  sc->pend_tail = NULL;
  while (*pp) {
    if (*pp == q)
      *pp = q->lnext;
    else {
      sc->pend_tail = *pp;
      pp = &(*pp)->lnext;
    }
  }
  q->lnext = NULL;
  q->lease_sc = NULL;
}

static request *pend_pop(sconv *sc)
{
  request *q = sc->pend;
  if (!q)
    return NULL;
  sc->pend = q->lnext;
  if (!sc->pend)
    sc->pend_tail = NULL;
  q->lnext = NULL;
  q->lease_sc = NULL;
  return q;
}

/* q (a message, or a DELETE) waits for the lease, in order (on_lease). */
static void pend_add(sconv *sc, request *q)
{
  q->lease_sc = sc;
  if (sc->pend_tail)
    sc->pend_tail->lnext = q;
  else
    sc->pend = q;
  sc->pend_tail = q;
  if (sc->lease == LEASE_NONE)
    lease_take(sc);
}

/* Every message waiting for the lease gets the same refusal (nothing was stored). */
static void pend_refuse(sconv *sc, unsigned status, const char *code, const char *why)
{
  request *q;
  while ((q = pend_pop(sc)))
    answer_later(q, status, retry_later(error_response(code, "%s", why), 1));
}

static void lease_release(sconv *sc)
{
  if (sc->lease != LEASE_HELD)
    return;
  sc->lease = LEASE_NONE;
  sc->s->leases_held--;
  /* queued after the turn's end: applied after it, in the same order */
  berth_store_lease_release(sc->s->store, sc->id, sc->s->host_id);
}

/* Nothing runs or waits here for the conversation: its lease goes back. */
static void lease_maybe_release(sconv *sc)
{
  if (sc->lease == LEASE_HELD && !sc->pend && !berth_conv_busy(sc->conv))
    lease_release(sc);
}

/* Another host ran turns since this host's copy, or died in one: the copy and its
 * sandbox are dropped, the turn left running is marked interrupted, and the
 * conversation is resumed from the store.  NULL, or why it could not be. */
static char *reload_conv(sconv *sc, bool interrupted)
{
  server *s = sc->s;
  if (interrupted) {
    bool marked = false;
    berth_error *e = berth_store_mark_interrupted_one(s->store, sc->id, &marked);
    if (e) {
      char *why = msg("the store cannot be read: %s", e->message);
      berth_error_free(e);
      return why;
    }
    if (marked)
      slog(s, "%s: a turn left running by a host that stopped is marked interrupted",
           berth_conv_run_id(sc->conv));
  }
  berth_conv_forget_sandbox(sc->conv);
  berth_conv_set_userdata(sc->conv, NULL);
  berth_conv_free(sc->conv);
  sc->conv = NULL;
  berth_conv_options co = {NULL, NULL, NULL, sc, sc->id, s->callers[sc->caller].digest};
  berth_error *e = berth_conv_open(s->h, &co, &sc->conv);
  if (e) {
    char *why = msg("the conversation cannot be resumed from the store: %s", e->message);
    berth_error_free(e);
    return why;
  }
  if (s->verbose)
    slog(s, "%s resumed from the store: another host ran it since",
         berth_conv_run_id(sc->conv));
  return NULL;
}

static struct MHD_Response *give_message(request *q, sconv *sc, unsigned *status);
static void sconv_gone(sconv *sc);
static void start_delete(request *q, sconv *sc);

static void on_lease_retry(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)loop;
  (void)revents;
  sconv *sc = w->data;
  if (sc->pend || sc->want_suspend)
    lease_take(sc);
  else
    sc->lease = LEASE_NONE;     /* every waiting client left */
}

/* The conversation ran on another host since this host's copy: the copy and its
 * sandbox go without a hook (that host suspends its own); its next message here
 * resumes it from the store.  Frees sc. */
static void drop_stale(sconv *sc)
{
  server *s = sc->s;
  if (s->verbose)
    slog(s, "%s: another host ran it since; this host's copy is dropped",
         berth_conv_run_id(sc->conv));
  berth_conv_forget_sandbox(sc->conv);
  sconv_gone(sc);
}

/* Whether another host ran turns of the conversation since this host's copy, or left
 * one running.  (The stored record may lag this host's own last events — the turn's
 * end is recorded after it — never lead them: a record ahead is another host's.) */
static bool stale_copy(const sconv *sc, const berth_store_lease *l)
{
  return l->running_turn || l->turns != berth_conv_turns(sc->conv) ||
         l->last_event > berth_conv_last_event(sc->conv);
}

/* The lease's answer for an idle conversation with no message waiting: suspended here
 * when this host's copy is the latest, dropped when another host ran it since or
 * holds it now.  May free sc. */
static void idle_answer(sconv *sc, const berth_store_lease *l)
{
  sc->want_suspend = false;
  if (!l->found || !l->taken) {
    drop_stale(sc);
    return;
  }
  sc->lease = LEASE_HELD;
  sc->s->leases_held++;
  if (stale_copy(sc, l)) {
    lease_release(sc);
    drop_stale(sc);
    return;
  }
  berth_conv_suspend(sc->conv);  /* the lease goes back once it is (on_suspended) */
  lease_maybe_release(sc);
}

static void on_lease(void *ud, const berth_error *err, const berth_store_lease *l)
{
  lease_wait *lw = ud;
  sconv *sc = lw->sc;
  free(lw);
  if (!sc)
    return;                     /* gone meanwhile (a lease taken expires by itself) */
  sc->lw = NULL;
  server *s = sc->s;
  if (err) {
    sc->lease = LEASE_NONE;
    sc->wait_until = 0;
    if (sc->pend)
      slog(s, "a message was refused: the store failed (%s)", err->message);
    pend_refuse(sc, MHD_HTTP_SERVICE_UNAVAILABLE, "unavailable",
                "the store cannot be reached, so the message was not taken; retry later");
    if (sc->want_suspend) {     /* the suspend waits for the store: tried again */
      sc->lease = LEASE_TAKING;
      ev_timer_init(&sc->retry, on_lease_retry, LEASE_RETRY_MOST, 0.);
      sc->retry.data = sc;
      ev_timer_start(s->loop, &sc->retry);
    }
    return;
  }
  if (!sc->pend && sc->want_suspend) {
    idle_answer(sc, l);
    return;
  }
  sc->want_suspend = false;     /* a message came: not idle any more */
  if (!l->found) {
    sc->lease = LEASE_NONE;
    pend_refuse(sc, MHD_HTTP_NOT_FOUND, "not_found", "no such conversation");
    return;
  }
  if (!l->taken) {
    double now = ev_now(s->loop);
    if (!sc->wait_until) {
      sc->wait_until = now + LEASE_WAIT_MAX;
      sc->backoff = 0;
    }
    if (now >= sc->wait_until || !sc->pend) {
      sc->lease = LEASE_NONE;
      sc->wait_until = 0;
      pend_refuse(sc, MHD_HTTP_SERVICE_UNAVAILABLE, "busy",
                  "another host is running a turn of this conversation; nothing was "
                  "stored: retry later");
      return;
    }
    sc->backoff = sc->backoff ? sc->backoff * 2 : LEASE_RETRY_FIRST;
    if (sc->backoff > LEASE_RETRY_MOST)
      sc->backoff = LEASE_RETRY_MOST;
    ev_timer_init(&sc->retry, on_lease_retry, sc->backoff, 0.);
    sc->retry.data = sc;
    ev_timer_start(s->loop, &sc->retry);
    return;
  }
  sc->wait_until = 0;
  sc->lease = LEASE_HELD;
  s->leases_held++;
  if (stale_copy(sc, l)) {
    char *why = reload_conv(sc, l->running_turn > 0);
    if (why) {
      slog(s, "a message was refused: %s", why);
      lease_release(sc);
      pend_refuse(sc, MHD_HTTP_SERVICE_UNAVAILABLE, "unavailable", why);
      free(why);
      if (!sc->conv)
        sconv_gone(sc);
      return;
    }
  }
  request *q;
  while ((q = pend_pop(sc))) {
    if (q->is_delete) {         /* (the messages before it were given: it comes last) */
      start_delete(q, sc);
      continue;
    }
    unsigned status = 0;
    struct MHD_Response *r = give_message(q, sc, &status);
    if (r)
      answer_later(q, status, r);
  }
  lease_maybe_release(sc);
}

static void lease_take(sconv *sc)
{
  lease_wait *lw = berth_xcalloc(1, sizeof *lw);
  lw->sc = sc;
  sc->lw = lw;
  sc->lease = LEASE_TAKING;
  berth_store_lease_take(sc->s->store, sc->id, sc->s->host_id, sc->s->lease_ms, on_lease,
                         lw);
}

/* Before the conversation is freed: nothing waits for its lease any more. */
static void lease_forget(sconv *sc)
{
  if (sc->lw)
    sc->lw->sc = NULL;
  sc->lw = NULL;
  if (ev_is_active(&sc->retry))
    ev_timer_stop(sc->s->loop, &sc->retry);
  pend_refuse(sc, MHD_HTTP_SERVICE_UNAVAILABLE, "unavailable",
              "the conversation was closed on this host; retry");
  lease_release(sc);
}

/* At exit (plm_idmap_each): every stream ends, so MHD can let its connection go. */
static void wake_streams(void *ud, plm_idmap_node *n)
{
  (void)ud;
  for (stream *st = PLM_IDMAP_OWNER(n, sconv, node)->head; st; st = st->next) {
    st->finished = true;
    st->released = st->put;     /* (the store's close stores what is queued) */
    stream_wake(st);
  }
}

static void drop_conv(void *ud, plm_idmap_node *n)
{
  sconv *sc = PLM_IDMAP_OWNER(n, sconv, node);
  plm_idmap_remove(&((server *)ud)->convs, n);
  sconv_free(sc);
}

static void sconv_gone(sconv *sc)
{
  table_remove(sc->s, sc);
  sconv_free(sc);
}

/* The idle timeout passed (berth_options.on_idle, with leases): the conversation is
 * suspended only once its lease is taken and this host's copy is found the latest;
 * otherwise the copy is dropped (idle_answer). */
static void on_idle(void *ud, berth_conv *c)
{
  (void)ud;
  sconv *sc = berth_conv_userdata(c);
  if (!sc || sc->lease == LEASE_HELD) {
    berth_conv_suspend(c);
    return;
  }
  sc->want_suspend = true;
  if (sc->lease == LEASE_NONE)
    lease_take(sc);
}

/* onSuspend ran: with leases, the lease taken for it goes back. */
static void on_suspended(void *ud, berth_conv *c)
{
  (void)ud;
  sconv *sc = berth_conv_userdata(c);
  if (sc && sc->s->leases)
    lease_maybe_release(sc);
}

/* The store refused a write of this host's (the fence): another host took the
 * conversation's lease, this host's renewals having failed past its expiry.  Said
 * once per conversation; its next message here resumes from the store. */
static void on_fenced(void *ud, const char *id)
{
  server *s = ud;
  plm_idmap_node *n = strlen(id) == ID_LEN ? plm_idmap_get(&s->convs, id) : NULL;
  sconv *sc = n ? PLM_IDMAP_OWNER(n, sconv, node) : NULL;
  if (sc && sc->fenced)
    return;
  if (sc)
    sc->fenced = true;
  slog_warn(s, "conversation %s: another host holds its lease now, so this host's "
               "writes for it were refused (its lease expired while the store could not "
               "be reached)", id);
}

static void on_renewed(void *ud, const berth_error *err)
{
  server *s = ud;
  if (err && !s->renew_failing)
    slog(s, "leases could not be renewed (%s): past their expiry other hosts may take "
            "them", err->message);
  else if (!err && s->renew_failing)
    slog(s, "leases renewed again");
  s->renew_failing = err != NULL;
}

static void on_renew(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)loop;
  (void)revents;
  server *s = w->data;
  if (s->leases_held)
    berth_store_lease_renew(s->store, s->host_id, s->lease_ms, on_renewed, s);
}

/* }====================================================== */

/* {====================================================== messages */

/* The client's id for the message: the body's messageId (checked with the body), else
 * an Idempotency-Key header, held to the same rule -- an id that were dropped would
 * let a retry run the message twice.  False (400) for a header that breaks it. */
static bool message_id_of(request *q, const json_t *body, const char **mid)
{
  const json_t *field = json_object_get(body, "messageId");
  *mid = NULL;
  if (json_is_string(field)) {
    *mid = json_string_value(field);
    return true;
  }
  const char *k = MHD_lookup_connection_value(q->conn, MHD_HEADER_KIND, "Idempotency-Key");
  if (!k)
    return true;
  if (!message_id_ok(k, strlen(k)))
    return false;
  *mid = k;
  return true;
}

/* A read of the store failed: 503, the store's reason (e freed). */
static struct MHD_Response *store_unreadable_response(berth_error *e)
{
  struct MHD_Response *r = error_response("unavailable", "the store cannot be read: %s",
                                          e->message);
  berth_error_free(e);
  return r;
}

static enum MHD_Result store_unreadable(request *q, berth_error *e)
{
  return queue(q, MHD_HTTP_SERVICE_UNAVAILABLE, store_unreadable_response(e));
}

/* How many events a replay reads at a time, from its message's "user" event on: its
 * turn's end is usually in the first page, and a retry of an old message reads no
 * further than that turn. */
#define REPLAY_PAGE 256

/* The stored events of conversation `id` from event `seq` (a "user" event) on, up to
 * the turn_end of its turn: *end is that turn_end's index in *ev, or *n when its turn
 * has not ended. */
static berth_error *read_turn(berth_store *store, const char *id, uint64_t seq,
                              berth_store_event **ev, size_t *n, size_t *end)
{
  *ev = NULL;
  *n = *end = 0;
  size_t cap = 0;
  for (;;) {
    berth_store_event *page;
    size_t got;
    uint64_t after = *n ? (*ev)[*n - 1].seq : seq - 1;
    berth_error *e = berth_store_read_events(store, id, after, REPLAY_PAGE, &page, &got);
    if (e) {
      berth_store_events_free(*ev, *n);
      *ev = NULL;
      *n = 0;
      return e;
    }
    if (got) {                  /* appended: the texts move over */
      if (*n + got > cap) {
        cap = 2 * (*n + got);
        *ev = berth_xrealloc(*ev, cap * sizeof **ev);
      }
      memcpy(*ev + *n, page, got * sizeof *page);
    }
    free(page);
    size_t j = *n ? *n : 1;
    *n += got;
    for (; j < *n; j++)
      if ((*ev)[j].turn == (*ev)[0].turn && !strcmp((*ev)[j].kind, "turn_end")) {
        *end = j;
        return NULL;
      }
    if (got < REPLAY_PAGE) {
      *end = *n;
      return NULL;
    }
  }
}

/* A message whose id is stored already is not run again: its turn's stored events are
 * the answer (a retry after a cut stream, or after its host died: then its turn ends
 * "interrupted").  NULL when it is not stored (or was refused: never taken), so it
 * runs; else the response.  The store finds the id through its index; only the
 * events of that message's turn are read. */
static struct MHD_Response *replay_message(request *q, sconv *sc, const char *mid,
                                           unsigned *status)
{
  server *s = q->s;
  berth_store_event *ev = NULL;
  size_t n = 0, end = 0;
  uint64_t before = 0;          /* the latest first, then (refused) the one before */
  for (;;) {
    uint64_t seq;
    bool found;
    berth_error *e = berth_store_find_message(s->store, sc->id, mid, before, &seq, &found);
    if (!e && found)
      e = read_turn(s->store, sc->id, seq, &ev, &n, &end);
    if (e) {
      *status = MHD_HTTP_SERVICE_UNAVAILABLE;
      return retry_later(store_unreadable_response(e), 1);
    }
    if (!found || !n || ev[0].seq != seq) {
      berth_store_events_free(ev, n);
      return NULL;              /* not stored: it runs */
    }
    if (end == n || !strstr(ev[end].data, "\"refused\":true"))
      break;
    berth_store_events_free(ev, n);   /* refused: it was never taken */
    ev = NULL;
    n = 0;
    before = seq;
  }
  struct MHD_Response *r = NULL;
  if (end == n) {
    *status = MHD_HTTP_SERVICE_UNAVAILABLE;
    r = retry_later(error_response("busy", "this message is being answered; its events "
                                           "are at GET /v1/conversations/%s/events", sc->id),
                    1);
  } else {
    stream *st = berth_xcalloc(1, sizeof *st);
    st->s = s;
    st->conn = q->conn;
    st->refs = 1;               /* the request's */
    s->streams_open++;
    for (size_t i = 0; i <= end; i++)
      if (ev[i].turn == ev[0].turn)
        stream_put(st, ev[i].seq, ev[i].kind, ev[i].data, true);
    st->finished = true;
    q->stream = st;
    *status = MHD_HTTP_OK;
    r = sse_response(st);
    if (r)
      MHD_add_response_header(r, "X-Berth-Replayed", "1");
  }
  berth_store_events_free(ev, n);
  return r;
}

/* Gives the message to the conversation (its lease held, or no leases): NULL when its
 * answer waits for the store (on_stored answers), else the response now (*status). */
static struct MHD_Response *give_message(request *q, sconv *sc, unsigned *status)
{
  server *s = q->s;
  json_t *body;
  const char *content;
  char *why = berth_serve_message_body(q->body, q->len, &body, &content);
  if (why) {
    struct MHD_Response *r = error_response("invalid_argument", "%s", why);
    free(why);
    *status = MHD_HTTP_BAD_REQUEST;
    return r;
  }
  const char *mid;
  if (!message_id_of(q, body, &mid)) {
    json_decref(body);
    *status = MHD_HTTP_BAD_REQUEST;
    return error_response("invalid_argument", "Idempotency-Key must be 1 to 128 bytes of "
                                              "UTF-8, as messageId");
  }
  if (mid && s->store) {
    struct MHD_Response *r = replay_message(q, sc, mid, status);
    if (r) {
      json_decref(body);
      return r;
    }
  }
  stream *st = berth_xcalloc(1, sizeof *st);
  st->s = s;
  st->conn = q->conn;
  st->refs = 2;                 /* the conversation's queue, the request */
  s->streams_open++;
  if (sc->tail)
    sc->tail->next = st;
  else
    sc->head = st;
  sc->tail = st;
  /* The turn starts once the message is stored (on_stored); so does the answer. */
  st->waiting = q;
  q->stream = st;
  berth_error *e = berth_conv_message_keyed(sc->conv, content, mid, on_stored, st);
  json_decref(body);
  if (e) {
    /* refused before anything started: take the stream back out (it is the tail) */
    q->stream = NULL;
    st->waiting = NULL;
    sc_unqueue(sc, st);
    st->refs = 1;
    stream_unref(st);
    const char *code = status_of(e, status);
    struct MHD_Response *r = error_response(code, "%s", e->message);
    if (*status == MHD_HTTP_SERVICE_UNAVAILABLE)
      r = retry_later(r, 1);
    berth_error_free(e);
    return r;
  }
  if (st->stored) {             /* no store: taken at once */
    st->waiting = NULL;
    *status = MHD_HTTP_OK;
    return sse_response(st);
  }
  return NULL;
}

static enum MHD_Result do_message(request *q, sconv *sc)
{
  server *s = q->s;
  json_t *body;
  const char *content;
  char *why = berth_serve_message_body(q->body, q->len, &body, &content);
  if (why) {
    struct MHD_Response *r = error_response("invalid_argument", "%s", why);
    free(why);
    return queue(q, MHD_HTTP_BAD_REQUEST, r);
  }
  json_decref(body);
  if (s->leases && sc->lease != LEASE_HELD) {
    /* waits for the lease, in order with the messages before it (on_lease) */
    q->suspended = true;
    MHD_suspend_connection(q->conn);
    pend_add(sc, q);
    return MHD_YES;
  }
  unsigned status = 0;
  struct MHD_Response *r = give_message(q, sc, &status);
  if (r) {
    if (s->leases)
      lease_maybe_release(sc);
    return queue(q, status, r);
  }
  q->suspended = true;
  MHD_suspend_connection(q->conn);
  return MHD_YES;
}

/* }====================================================== */

/* The caller's conversation with this id: open here, or resumed from the store as
 * after an idle suspend (history and state loaded; a fresh sandbox at its next
 * message).  NULL with *status 404 (unknown, another caller's or completed — all
 * alike), 429 or 503 and *why. */
static sconv *find_or_resume(request *q, unsigned *status, char **why)
{
  server *s = q->s;
  *status = MHD_HTTP_NOT_FOUND;
  *why = NULL;
  sconv *sc = table_find(s, q->id, q->caller);
  if (sc || !s->store || strlen(q->id) != ID_LEN)
    return sc;
  for (const char *p = q->id; *p; p++)
    if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
      return NULL;
  caller *cl = &s->callers[q->caller];
  berth_store_conv rec;
  bool found = false;
  berth_error *e = berth_store_get_conv(s->store, q->id, &rec, &found);
  if (e) {
    *status = MHD_HTTP_SERVICE_UNAVAILABLE;
    *why = msg("the store cannot be read: %s", e->message);
    berth_error_free(e);
    return NULL;
  }
  bool mine = found && rec.caller && strlen(rec.caller) == 64 &&
              CRYPTO_memcmp(rec.caller, cl->digest, 64) == 0;
  bool open = mine && rec.status != BERTH_STORE_COMPLETED;
  berth_store_conv_clear(&rec);
  if (!open)
    return NULL;
  sc = berth_xcalloc(1, sizeof *sc);
  sc->s = s;
  sc->caller = q->caller;
  memcpy(sc->id, q->id, ID_LEN + 1);
  berth_conv_options co = {NULL, NULL, NULL, sc, sc->id, cl->digest};
  e = berth_conv_open(s->h, &co, &sc->conv);
  if (e && !strcmp(e->code, "exists")) {
    /* open in the host and not in the table: a DELETE is completing it (start_delete),
     * and it is gone for every request from then on */
    berth_error_free(e);
    free(sc);
    return NULL;
  }
  if (e) {
    const char *code = status_of(e, status);
    *why = msg("%s: %s", code, e->message);
    berth_error_free(e);
    free(sc);
    return NULL;
  }
  cl->convs++;
  if (cl->stored)
    cl->stored--;               /* (held now, counted once) */
  table_add(s, sc);
  if (s->verbose)
    slog(s, "caller %s resumed %s from the store", cl->label, berth_conv_run_id(sc->conv));
  return sc;
}

/* Whether the caller may read this conversation's stored history (open here, or in
 * the store under its name, completed ones too). */
static bool readable(request *q, unsigned *status, char **why)
{
  server *s = q->s;
  *status = MHD_HTTP_NOT_FOUND;
  *why = NULL;
  if (table_find(s, q->id, q->caller))
    return true;
  if (!s->store || strlen(q->id) != ID_LEN)
    return false;
  berth_store_conv rec;
  bool found = false;
  berth_error *e = berth_store_get_conv(s->store, q->id, &rec, &found);
  if (e) {
    *status = MHD_HTTP_SERVICE_UNAVAILABLE;
    *why = msg("the store cannot be read: %s", e->message);
    berth_error_free(e);
    return false;
  }
  bool mine = found && rec.caller && strlen(rec.caller) == 64 &&
              CRYPTO_memcmp(rec.caller, s->callers[q->caller].digest, 64) == 0;
  berth_store_conv_clear(&rec);
  return mine;
}

static enum MHD_Result refuse(request *q, unsigned status, char *why)
{
  struct MHD_Response *r =
    why ? error_response(status == MHD_HTTP_NOT_FOUND ? "not_found"
                         : status == MHD_HTTP_TOO_MANY_REQUESTS ? "capacity" : "unavailable",
                         "%s", why)
        : error_response("not_found", "no such conversation");
  free(why);
  return queue(q, status, r);
}

static json_t *conv_json(const berth_store_conv *r)
{
  json_t *o = json_pack("{s:s, s:s, s:i, s:I, s:I}", "id", r->id, "status",
                        berth_store_status_name(r->status), "turns", (json_int_t)r->turns,
                        "createdAt", (json_int_t)r->created_ms, "updatedAt",
                        (json_int_t)r->updated_ms);
  const char *colon = r->owner ? strchr(r->owner, ':') : NULL;
  if (colon)                    /* "<caller label>:<userId>": the caller's userId back */
    json_object_set_new(o, "userId", json_string(colon + 1));
  json_t *meta = r->metadata ? json_loads(r->metadata, 0, NULL) : NULL;
  if (meta)
    json_object_set_new(o, "metadata", meta);
  return o;
}

static bool arg_count(request *q, const char *name, uint64_t *out)
{
  const char *v = MHD_lookup_connection_value(q->conn, MHD_GET_ARGUMENT_KIND, name);
  size_t n;
  if (!v)
    return true;
  if (!parse_count(v, &n))
    return false;
  *out = n;
  return true;
}

/* GET /v1/conversations?limit=N&cursor=C: the caller's own, newest first. */
static enum MHD_Result do_list(request *q)
{
  server *s = q->s;
  uint64_t limit = 50, cursor = 0;
  if (!arg_count(q, "limit", &limit) || !arg_count(q, "cursor", &cursor) || limit == 0 ||
      limit > 1000)
    return queue(q, MHD_HTTP_BAD_REQUEST,
                 error_response("invalid_argument", "limit must be 1 .. 1000 and cursor the "
                                                    "nextCursor of a previous page"));
  berth_store_conv *v = NULL;
  size_t n = 0;
  berth_error *e = berth_store_list_convs(s->store, s->callers[q->caller].digest, cursor,
                                          (size_t)limit, &v, &n);
  if (e) {
    return store_unreadable(q, e);
  }
  json_t *list = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(list, conv_json(&v[i]));
  json_t *next = json_null();
  if (n == limit) {
    char c[24];
    snprintf(c, sizeof c, "%llu", (unsigned long long)v[n - 1].order);
    next = json_string(c);
  }
  berth_store_convs_free(v, n);
  return queue(q, MHD_HTTP_OK, json_response(json_pack("{s:o, s:o}", "conversations", list,
                                                       "nextCursor", next)));
}

/* GET /v1/conversations/{id}/messages: the stored history (ctx.messages as of the last
 * turn's end). */
static enum MHD_Result do_history(request *q)
{
  server *s = q->s;
  unsigned status;
  char *why;
  if (!readable(q, &status, &why))
    return refuse(q, status, why);
  char **texts = NULL;
  size_t n = 0;
  berth_error *e = berth_store_load_messages(s->store, q->id, &texts, &n);
  if (e) {
    return store_unreadable(q, e);
  }
  json_t *list = json_array();
  for (size_t i = 0; i < n; i++) {
    json_t *m = json_loads(texts[i], JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    json_array_append_new(list, m ? m : json_null());
  }
  berth_store_texts_free(texts, n);
  return queue(q, MHD_HTTP_OK, json_response(json_pack("{s:s, s:o}", "id", q->id,
                                                       "messages", list)));
}

/* GET /v1/conversations/{id}/events (Last-Event-ID: N, or ?after=N): the stored events
 * after N, then, while a turn of the conversation runs here, its events as they come
 * until its turn_end. */
static enum MHD_Result do_events(request *q)
{
  server *s = q->s;
  unsigned status;
  char *why;
  if (!readable(q, &status, &why))
    return refuse(q, status, why);
  uint64_t after = 0;
  const char *last = MHD_lookup_connection_value(q->conn, MHD_HEADER_KIND, "Last-Event-ID");
  size_t n;
  if (last && *last) {
    if (!parse_count(last, &n))
      return queue(q, MHD_HTTP_BAD_REQUEST,
                   error_response("invalid_argument", "Last-Event-ID must be an event's "
                                                      "number"));
    after = n;
  } else if (!arg_count(q, "after", &after))
    return queue(q, MHD_HTTP_BAD_REQUEST,
                 error_response("invalid_argument", "after must be an event's number"));
  berth_store_event *ev = NULL;
  berth_error *e = berth_store_read_events(s->store, q->id, after, 0, &ev, &n);
  if (e) {
    return store_unreadable(q, e);
  }
  stream *st = berth_xcalloc(1, sizeof *st);
  st->s = s;
  st->conn = q->conn;
  st->refs = 1;                 /* the request's */
  s->streams_open++;
  for (size_t i = 0; i < n; i++)
    stream_put(st, ev[i].seq, ev[i].kind, ev[i].data, true);
  berth_store_events_free(ev, n);
  sconv *sc = table_find(s, q->id, q->caller);
  if (sc && berth_conv_busy(sc->conv)) {
    st->refs++;                 /* the followers' */
    st->next = sc->followers;
    sc->followers = st;
  } else
    st->finished = true;
  q->stream = st;
  return queue(q, MHD_HTTP_OK, sse_response(st));
}

/* onComplete runs (after the queued turns); on_completed answers q. */
static void start_delete(request *q, sconv *sc)
{
  server *s = q->s;
  if (s->verbose)
    slog(s, "caller %s deletes %s", s->callers[q->caller].label, berth_conv_run_id(sc->conv));
  table_remove(s, sc);          /* gone for every request from now on */
  sc->deleting = q;
  q->deleting = sc;
  berth_conv_complete(sc->conv, on_completed, sc);
}

static enum MHD_Result do_delete(request *q, sconv *sc)
{
  q->suspended = true;
  MHD_suspend_connection(q->conn);
  if (q->s->leases && sc->lease != LEASE_HELD) {
    /* onComplete runs on the latest copy, with the lease, after the messages that
     * wait for it (on_lease) */
    pend_add(sc, q);
    return MHD_YES;
  }
  start_delete(q, sc);
  return MHD_YES;
}

/* The process's own figures, as Prometheus names them (from /proc/self). */
static void put_process_metrics(FILE *f)
{
  long ticks = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
  unsigned long long utime = 0, stime = 0, vsize = 0;
  long rss = 0;
  FILE *st = fopen("/proc/self/stat", "re");
  char line[1024];
  if (st && fgets(line, sizeof line, st)) {
    const char *p = strrchr(line, ')');    /* the command name may hold spaces */
    if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d "
                           "%*d %*d %*d %*d %*u %llu %ld", &utime, &stime, &vsize,
                    &rss) != 4)
      utime = stime = 0;
  }
  if (st)
    fclose(st);
  size_t fds = 0;
  DIR *d = opendir("/proc/self/fd");
  for (struct dirent *e; d && (e = readdir(d));)
    fds += e->d_name[0] != '.';
  if (d)
    closedir(d);
  fprintf(f, "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %.2f\n"
             "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %lld\n"
             "# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes %llu\n"
             "# TYPE process_open_fds gauge\nprocess_open_fds %zu\n",
          ticks > 0 ? (double)(utime + stime) / (double)ticks : 0.0, (long long)rss * page,
          vsize, fds);
}

/* The Prometheus text of /metrics (malloc'd), or NULL. */
static char *render_metrics(server *s)
{
  char *text = berth_host_metrics(s->h);
  if (!text)
    return NULL;
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  fputs(text, f);
  free(text);
  fputs("# HELP berth_http_responses_total HTTP responses sent, by status.\n"
        "# TYPE berth_http_responses_total counter\n", f);
  for (size_t i = 0; i < s->n_statuses; i++)
    fprintf(f, "berth_http_responses_total{code=\"%u\"} %llu\n", s->statuses[i].code,
            (unsigned long long)s->statuses[i].n);
  fprintf(f, "# HELP berth_http_streams Event streams open.\n"
             "# TYPE berth_http_streams gauge\n"
             "berth_http_streams %llu\n", (unsigned long long)s->streams_open);
  fprintf(f, "# HELP berth_build_info The build serving, as labels.\n"
             "# TYPE berth_build_info gauge\n"
             "berth_build_info{version=\"%s\",store=\"%s\"} 1\n", BERTH_VERSION,
          s->store ? berth_store_engine_name(s->store) : "none");
  put_process_metrics(f);
  fclose(f);
  return buf;
}

#define METRICS_TYPE "text/plain; version=0.0.4; charset=utf-8"

static enum MHD_Result do_metrics(request *q)
{
  char *buf = render_metrics(q->s);
  if (!buf)
    return queue(q, MHD_HTTP_INTERNAL_SERVER_ERROR,
                 error_response("internal", "cannot render the metrics"));
  return queue(q, MHD_HTTP_OK, text_response(METRICS_TYPE, buf));
}

/* --metrics-listen: a listener of its own that answers GET /metrics alone, with no
 * token (a scraper holds none; the figures name no conversation, caller or token).
 * Each answer is ready at once: no suspension, no request state. */
static enum MHD_Result on_metrics_request(void *cls, struct MHD_Connection *conn,
                                          const char *url, const char *method,
                                          const char *version, const char *upload_data,
                                          size_t *upload_data_size, void **con_cls)
{
  (void)version;
  (void)upload_data;
  server *s = cls;
  if (!*con_cls) {              /* the head: answer once the (empty) body is read */
    *con_cls = s;
    return MHD_YES;
  }
  if (*upload_data_size) {
    *upload_data_size = 0;
    return MHD_YES;
  }
  unsigned status = MHD_HTTP_OK;
  struct MHD_Response *r;
  char *buf;
  if (strcmp(url, "/metrics") != 0) {
    status = MHD_HTTP_NOT_FOUND;
    r = error_response("not_found", "this listener serves /metrics alone");
  } else if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 &&
             strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
    status = MHD_HTTP_METHOD_NOT_ALLOWED;
    r = error_response("method_not_allowed", "/metrics takes GET, not %.16s", method);
    if (r)
      MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET");
  } else if (!(buf = render_metrics(s))) {
    status = MHD_HTTP_INTERNAL_SERVER_ERROR;
    r = error_response("internal", "cannot render the metrics");
  } else
    r = text_response(METRICS_TYPE, buf);
  if (!r)
    return MHD_NO;
  enum MHD_Result ok = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);
  return ok;
}

static void mhd_log(void *cls, const char *fmt, va_list ap);

static bool metrics_start(server *s, const char *spec)
{
  unsigned port = 0;
  char *why = NULL;
  int fd = httpd_listen_spec(spec, "--metrics-listen", 64, &port, &why);
  if (fd < 0) {
    slog(s, "%s", why ? why : "cannot listen for the metrics");
    free(why);
    return false;
  }
  s->metrics_mhd = MHD_start_daemon(
    MHD_USE_EPOLL | MHD_USE_ERROR_LOG, 0, NULL, NULL, on_metrics_request, s,
    MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
    MHD_OPTION_LISTEN_SOCKET, fd,
    MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)30,
    MHD_OPTION_CONNECTION_LIMIT, (unsigned int)64,
    MHD_OPTION_END);
  if (!httpd_mhd_attach(&s->metrics_web, s->loop, s->metrics_mhd, &why)) {
    slog(s, "--metrics-listen: %s", why);
    free(why);
    if (s->metrics_mhd) {
      MHD_stop_daemon(s->metrics_mhd);
      s->metrics_mhd = NULL;
    } else
      close(fd);
    return false;
  }
  const char *colon = strrchr(spec, ':');
  printf("metrics http://%.*s:%u/metrics\n", (int)(colon - spec), spec, port);
  fflush(stdout);
  return true;
}

static enum MHD_Result dispatch(request *q)
{
  server *s = q->s;
  switch (q->route) {
    case R_HEALTH:
      return queue(q, s->stopping ? MHD_HTTP_SERVICE_UNAVAILABLE : MHD_HTTP_OK,
                   json_response(json_pack("{s:s}", "status",
                                           s->stopping ? "shutting_down" : "ok")));
    case R_READY: {
      /* Ready to take a new message: not draining, and under the host's message bound
       * (a balancer sends elsewhere meanwhile; /healthz says whether it lives). */
      const char *why = s->stopping ? "shutting_down" : NULL;
      berth_stats hs;
      berth_host_stats(s->h, &hs);
      if (!why && s->max_queued && hs.messages_queued >= s->max_queued)
        why = "queue_full";
      return queue(q, why ? MHD_HTTP_SERVICE_UNAVAILABLE : MHD_HTTP_OK,
                   json_response(json_pack("{s:s}", "status", why ? why : "ready")));
    }
    case R_METRICS:
      return do_metrics(q);
    case R_CONVS:
      return q->is_get ? do_list(q) : do_create(q);
    case R_EVENTS:
      return do_events(q);
    case R_MESSAGES:
      if (q->is_get)
        return do_history(q);
      break;
    default:
      break;
  }
  unsigned status;
  char *why;
  sconv *sc = find_or_resume(q, &status, &why);
  if (!sc)
    return refuse(q, status, why);
  if (q->route == R_MESSAGES)
    return do_message(q, sc);
  /* R_CONV */
  if (q->is_delete)
    return do_delete(q, sc);
  return queue(q, MHD_HTTP_OK,
               json_response(json_pack("{s:s, s:i, s:b, s:b, s:s}", "id", sc->id, "turns",
                                       (json_int_t)berth_conv_turns(sc->conv), "busy",
                                       berth_conv_busy(sc->conv), "suspended",
                                       berth_conv_suspended(sc->conv), "status",
                                       berth_conv_suspended(sc->conv) ? "suspended"
                                                                      : "open")));
}

/* }====================================================== */

/* {====================================================== MHD callbacks */

static bool take_body(request *q, const char *data, size_t n)
{
  size_t max = q->s->max_body;
  if (!q->too_large && q->len + n > max) {
    q->too_large = true;
    q->discarded = q->len;
    free(q->body);
    q->body = NULL;
    q->len = q->cap = 0;
  }
  if (q->too_large) {
    q->discarded += n;
    return q->discarded <= 2 * max;  /* a sender that keeps going is cut off */
  }
  if (q->len + n > q->cap) {
    q->cap = q->len + n > 2 * q->cap ? q->len + n : 2 * q->cap;
    if (q->cap > max)
      q->cap = max;
    q->body = berth_xrealloc(q->body, q->cap + 1);
  }
  memcpy(q->body + q->len, data, n);
  q->len += n;
  return true;
}

/* Checks on the request line and headers, before the body. */
static enum MHD_Result check_head(request *q, const char *url, const char *method,
                                  const char *version)
{
  server *s = q->s;
  /* Before anything else: a head that would leave no room for the answer (head.h). */
  size_t head = httpd_head_bytes(q->conn, method, url, version);
  if (head > HTTPD_HEAD_MOST)
    return queue(q, MHD_HTTP_REQUEST_HEADER_FIELDS_TOO_LARGE,
                 error_response("headers_too_large", "the request's head takes %zu bytes "
                                "of a connection's memory, over this server's limit of %zu",
                                head, HTTPD_HEAD_MOST));
  unsigned page_status;         /* the page's own files (web.c): no token needed */
  struct MHD_Response *page = berth_web_response(q->conn, url, method, &page_status);
  if (page)
    return queue(q, page_status, page);
  q->route = match(url, q->id);
  if (q->route == R_NONE)
    return queue(q, MHD_HTTP_NOT_FOUND, error_response("not_found", "no such route"));
  if (!method_ok(q->route, method)) {
    struct MHD_Response *r = error_response("method_not_allowed",
                                            "this route takes %s, not %.16s",
                                            allowed(q->route), method);
    if (r)
      MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allowed(q->route));
    return queue(q, MHD_HTTP_METHOD_NOT_ALLOWED, r);
  }
  if (q->route != R_HEALTH && q->route != R_READY) {  /* probes need no token */
    long who = authenticate(s, q->conn);
    if (who < 0)
      return queue(q, MHD_HTTP_UNAUTHORIZED,
                   error_response("unauthenticated", "this server needs Authorization: "
                                                     "Bearer <token> with a token of its "
                                                     "token file"));
    q->caller = (size_t)who;
    connguard_trust(q->conn);   /* a known caller: only MHD's idle timeout from now on */
  }
  bool posts = !strcmp(method, MHD_HTTP_METHOD_POST);
  if (posts && !json_type_ok(q->conn))
    return queue(q, MHD_HTTP_UNSUPPORTED_MEDIA_TYPE,
                 error_response("invalid_argument", "the body must be application/json"));
  const char *cl = MHD_lookup_connection_value(q->conn, MHD_HEADER_KIND,
                                               MHD_HTTP_HEADER_CONTENT_LENGTH);
  if (cl) {
    char *end;
    errno = 0;
    unsigned long long n = strtoull(cl, &end, 10);
    if (!errno && *end == '\0' && n > s->max_body)
      return queue(q, MHD_HTTP_CONTENT_TOO_LARGE,
                   error_response("payload_too_large", "the body (%llu bytes) is over this "
                                                       "server's limit of %zu bytes",
                                  n, s->max_body));
  }
  if (s->stopping && (posts || !strcmp(method, MHD_HTTP_METHOD_DELETE)))
    return queue(q, MHD_HTTP_SERVICE_UNAVAILABLE,
                 error_response("shutting_down", "the server is shutting down"));
  return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
  server *s = cls;
  request *q = *con_cls;
  if (!q) {
    q = berth_xcalloc(1, sizeof *q);
    q->s = s;
    q->conn = conn;
    q->started = ev_time();
    snprintf(q->method, sizeof q->method, "%s", method);
    snprintf(q->path, sizeof q->path, "%s", url);  /* (no query string: MHD parsed it) */
    *con_cls = q;
    s->active++;
    return check_head(q, url, method, version);
  }
  if (q->response) {            /* answered while suspended */
    struct MHD_Response *r = q->response;
    q->response = NULL;
    return queue(q, q->status, r);
  }
  if (q->answered) {            /* refused early (401, 413, …): drop what still comes */
    *upload_data_size = 0;
    return MHD_YES;
  }
  if (*upload_data_size) {
    bool more = take_body(q, upload_data, *upload_data_size);
    *upload_data_size = 0;
    return more ? MHD_YES : MHD_NO;
  }
  if (q->suspended || q->stream || q->dispatched)
    return MHD_YES;             /* a spurious call while waiting */
  if (q->too_large)
    return queue(q, MHD_HTTP_CONTENT_TOO_LARGE,
                 error_response("payload_too_large", "the body is over this server's limit "
                                                     "of %zu bytes", s->max_body));
  if (s->stopping && q->route != R_HEALTH && q->route != R_METRICS &&
      strcmp(method, MHD_HTTP_METHOD_GET) != 0)
    return queue(q, MHD_HTTP_SERVICE_UNAVAILABLE,
                 error_response("shutting_down", "the server is shutting down"));
  q->is_delete = !strcmp(method, MHD_HTTP_METHOD_DELETE);
  q->is_get = !strcmp(method, MHD_HTTP_METHOD_GET);
  q->dispatched = true;
  return dispatch(q);
}

static void on_request_done(void *cls, struct MHD_Connection *conn, void **con_cls,
                            enum MHD_RequestTerminationCode toe)
{
  (void)conn;
  (void)toe;
  server *s = cls;
  request *q = *con_cls;
  *con_cls = NULL;
  if (!q)
    return;
  /* The access log: one record per request, after its answer (a stream's at its end). */
  if (q->route != R_HEALTH && q->route != R_READY)
    slog(s, "access %s %s %s %u %.1f ms%s", q->caller < s->n_callers && q->dispatched
                                               ? s->callers[q->caller].label : "-",
         q->method, q->path, q->status, (ev_time() - q->started) * 1000,
         toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (client gone)");
  if (q->stream) {
    q->stream->conn = NULL;
    q->stream->suspended = false;
    if (q->stream->waiting == q)
      q->stream->waiting = NULL;  /* its message is still taken once stored */
    stream_unref(q->stream);
  }
  /* A DELETE whose client went away: its completion answers nobody. */
  if (q->deleting)
    q->deleting->deleting = NULL;
  pend_remove(q);               /* a message that waited for a lease: never given */
  if (q->cw)
    q->cw->q = NULL;
  if (q->response)
    MHD_destroy_response(q->response);
  free(q->body);
  free(q);
  s->active--;
  if (s->host_done && s->active == 0)
    ev_break(s->loop, EVBREAK_ALL);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
  server *s = cls;
  if (!s->verbose)
    return;
  char line[512];
  vsnprintf(line, sizeof line, fmt, ap);
  line[strcspn(line, "\r\n")] = '\0';
  slog(s, "http: %s", line);
}

/* }====================================================== */

/* {====================================================== shutdown */

static void on_flush_limit(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)revents;
  server *s = w->data;
  slog(s, "%zu requests still open after %.0f s; closing them", s->active, FLUSH_LIMIT);
  ev_break(loop, EVBREAK_ALL);
}

static void on_host_stopped(void *ud)
{
  server *s = ud;
  s->host_done = true;
  /* Every turn ended, so every stream is finished; let the connections flush. */
  if (s->active == 0) {
    ev_break(s->loop, EVBREAK_ALL);
    return;
  }
  ev_timer_init(&s->flush, on_flush_limit, FLUSH_LIMIT, 0.);
  s->flush.data = s;
  ev_timer_start(s->loop, &s->flush);
}

static void on_stop_signal(struct ev_loop *loop, ev_signal *w, int revents)
{
  (void)loop;
  (void)revents;
  server *s = w->data;
  if (s->stopping) {
    slog(s, "already shutting down");
    return;
  }
  s->stopping = true;
  berth_stats st;
  berth_host_stats(s->h, &st);
  slog(s, "%s: shutting down (%llu turns running, %llu queued)",
       w->signum == SIGTERM ? "SIGTERM" : "SIGINT", (unsigned long long)st.turns_running,
       (unsigned long long)st.messages_queued);
  MHD_socket fd = MHD_quiesce_daemon(s->mhd);
  if (fd != MHD_INVALID_SOCKET)
    close(fd);                  /* after quiescing, the listening socket is ours */
  berth_host_shutdown(s->h, on_host_stopped, s);
}

/* }====================================================== */

/* {====================================================== the command */

enum {
  O_LISTEN = 256, O_TOKEN_FILE, O_HOOKS, O_MODEL, O_DAEMON, O_DAEMON_TOKEN, O_SANDBOXD,
  O_PROVIDER, O_MAX_CONVS, O_MAX_PER_CALLER, O_MAX_TURNS, O_MAX_QUEUED, O_MAX_SANDBOXES,
  O_MAX_BODY, O_IDLE, O_GRACE, O_MIN_ISO, O_VERBOSE, O_HELP, O_VERSION
};

/* Connection limits (issue 11). */
enum { O_MAX_CONNS = 512, O_HEADER_TIMEOUT };
/* The store (issue 13). */
enum { O_STORE = 600, O_STATE_DIR };
enum { O_LEASE_MS = 650 };      /* many hosts (docs/many-hosts.md) */
enum { O_LOG_FORMAT = 700 };
enum { O_METRICS_LISTEN = 750 };
#define DEFAULT_HEADER_TIMEOUT 10.0

static const struct option serve_opts[] = {
  {"max-connections", required_argument, NULL, O_MAX_CONNS},
  {"store", required_argument, NULL, O_STORE},
  {"lease-ms", required_argument, NULL, O_LEASE_MS},
  {"log-format", required_argument, NULL, O_LOG_FORMAT},
  {"metrics-listen", required_argument, NULL, O_METRICS_LISTEN},
  {"state-dir", required_argument, NULL, O_STATE_DIR},
  {"header-timeout", required_argument, NULL, O_HEADER_TIMEOUT},
  {"listen", required_argument, NULL, O_LISTEN},
  {"callers", required_argument, NULL, O_TOKEN_FILE},
  {"token-file", required_argument, NULL, O_TOKEN_FILE},           /* the old spelling */
  {"hooks", required_argument, NULL, O_HOOKS},
  {"model", required_argument, NULL, O_MODEL},
  {"daemon", required_argument, NULL, O_DAEMON},
  {"daemon-token-file", required_argument, NULL, O_DAEMON_TOKEN},
  {"token-file-daemon", required_argument, NULL, O_DAEMON_TOKEN},  /* the old spelling */
  {"sandboxd", required_argument, NULL, O_SANDBOXD},
  {"provider", required_argument, NULL, O_PROVIDER},
  {"max-conversations", required_argument, NULL, O_MAX_CONVS},
  {"max-conversations-per-caller", required_argument, NULL, O_MAX_PER_CALLER},
  {"max-concurrent-turns", required_argument, NULL, O_MAX_TURNS},
  {"max-queued-messages", required_argument, NULL, O_MAX_QUEUED},
  {"max-sandboxes", required_argument, NULL, O_MAX_SANDBOXES},
  {"max-body-bytes", required_argument, NULL, O_MAX_BODY},
  {"idle-timeout", required_argument, NULL, O_IDLE},
  {"shutdown-grace", required_argument, NULL, O_GRACE},
  {"minimum-isolation", required_argument, NULL, O_MIN_ISO},
  {"verbose", no_argument, NULL, O_VERBOSE},
  {"help", no_argument, NULL, O_HELP},
  {"version", no_argument, NULL, O_VERSION},
  {NULL, 0, NULL, 0}
};

typedef struct serve_args {
  const char *listen, *token_file, *hooks, *model, *daemon, *daemon_token, *sandboxd,
             *provider, *min_iso;
  size_t max_convs, max_per_caller, max_turns, max_queued, max_body, max_sandboxes;
  bool max_per_caller_set, max_sandboxes_set, grace_set;
  double idle, grace;
  bool verbose;
  size_t max_conns;             /* 0: connguard_default_limit */
  const char *store, *state_dir;
  size_t lease_ms;              /* 0: DEFAULT_LEASE_MS */
  double header_timeout;
  const char *metrics_listen;   /* NULL: /metrics on --listen only, with a token */
} serve_args;

/* Whether HOST:PORT names a loopback address (plm_loopback_host's rule). */
static bool listens_on_loopback(const char *spec)
{
  const char *colon = strrchr(spec, ':');
  size_t n = colon ? (size_t)(colon - spec) : strlen(spec);
  char host[256];
  snprintf(host, sizeof host, "%.*s", (int)n, spec);
  return plm_loopback_host(host);
}

static int usage_error(const char *fmt, const char *arg)
{
  fprintf(stderr, "berth serve: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n\n%s", serve_usage);
  return 2;
}

/* Returns -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv, serve_args *a)
{
  memset(a, 0, sizeof *a);
  a->max_convs = DEFAULT_MAX_CONVERSATIONS;
  a->max_turns = DEFAULT_MAX_TURNS;
  a->max_queued = DEFAULT_MAX_QUEUED;
  a->max_body = DEFAULT_MAX_BODY;
  a->header_timeout = DEFAULT_HEADER_TIMEOUT;
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, "+", serve_opts, NULL)) != -1) {
    size_t *count = NULL;
    double *secs = NULL;
    switch (c) {
      case O_LISTEN: a->listen = optarg; break;
      case O_TOKEN_FILE: a->token_file = optarg; break;
      case O_HOOKS: a->hooks = optarg; break;
      case O_MODEL: a->model = optarg; break;
      case O_DAEMON: a->daemon = optarg; break;
      case O_DAEMON_TOKEN: a->daemon_token = optarg; break;
      case O_SANDBOXD: a->sandboxd = optarg; break;
      case O_PROVIDER: a->provider = optarg; break;
      case O_MIN_ISO: a->min_iso = optarg; break;
      case O_MAX_CONVS: count = &a->max_convs; break;
      case O_MAX_PER_CALLER: count = &a->max_per_caller; a->max_per_caller_set = true; break;
      case O_MAX_TURNS: count = &a->max_turns; break;
      case O_MAX_QUEUED: count = &a->max_queued; break;
      case O_MAX_BODY: count = &a->max_body; break;
      case O_MAX_SANDBOXES: count = &a->max_sandboxes; a->max_sandboxes_set = true; break;
      case O_IDLE: secs = &a->idle; break;
      case O_GRACE: secs = &a->grace; a->grace_set = true; break;
      case O_VERBOSE: a->verbose = true; break;
      case O_MAX_CONNS: count = &a->max_conns; break;
      case O_STORE: a->store = optarg; break;
      case O_METRICS_LISTEN: a->metrics_listen = optarg; break;
      case O_LOG_FORMAT:
        if (strcmp(optarg, "text") && strcmp(optarg, "json"))
          return usage_error("--log-format takes text or json, not %s", optarg);
        log_json = !strcmp(optarg, "json");
        break;
      case O_LEASE_MS: count = &a->lease_ms; break;
      case O_STATE_DIR: a->state_dir = optarg; break;
      case O_HEADER_TIMEOUT: secs = &a->header_timeout; break;
      case O_HELP: fputs(serve_usage, stdout); return 0;
      case O_VERSION:
        printf("berth %s (libplimsoll %s, protocol %d)\n", BERTH_VERSION, PLIMSOLL_VERSION,
               PLIMSOLL_PROTOCOL);
        return 0;
      default:
        return usage_error("unknown option %s", argv[optind - 1]);
    }
    if (count && !parse_count(optarg, count))
      return usage_error("%s needs a whole number", argv[optind - 2]);
    if (secs && !parse_secs(optarg, secs))
      return usage_error("%s needs seconds >= 0", argv[optind - 2]);
  }
  if (optind != argc)
    return usage_error("unexpected argument %s", argv[optind]);
  if (!a->listen)
    return usage_error("%s", "give --listen HOST:PORT");
  if (!a->token_file)
    return usage_error("%s", "give --callers FILE (the callers' bearer tokens)");
  if (a->daemon && (a->sandboxd || a->provider))
    return usage_error("%s", "give either --daemon or --sandboxd/--provider, not both");
  if (a->max_body == 0 || a->max_body > (size_t)64 << 20)
    return usage_error("%s", "--max-body-bytes must be 1 .. 67108864");
  if (a->max_sandboxes > 1000000)
    return usage_error("%s", "--max-sandboxes is too large");
  if (a->max_conns > 1000000)
    return usage_error("%s", "--max-connections is too large");
  if (a->header_timeout < 0.1 || a->header_timeout > 600)
    return usage_error("%s", "--header-timeout must be 0.1 .. 600 seconds");
  return -1;
}

/* Half of the conversations (of the default's when they have no cap), rounded up; none
 * for a single caller, who can lock nobody out. */
static size_t default_per_caller(size_t max_convs, size_t n_callers)
{
  if (n_callers < 2)
    return 0;
  size_t total = max_convs ? max_convs : DEFAULT_MAX_CONVERSATIONS;
  return (total + DEFAULT_PER_CALLER_SHARE - 1) / DEFAULT_PER_CALLER_SHARE;
}

/* A host alone on its store counts, for the per-caller cap, the conversations each
 * caller holds there from before it started (callers[from..]): they are held though
 * not loaded, so a restart does not make room for more. */
static void count_stored(server *s, size_t from)
{
  if (!s->store || s->leases || !s->max_per_caller)
    return;
  for (size_t i = from; i < s->n_callers; i++) {
    size_t n = 0;
    berth_error *e = berth_store_count_open(s->store, s->callers[i].digest, &n);
    if (e) {
      slog_warn(s, "caller %s: its stored conversations could not be counted (%s); the cap "
                   "counts those it opens from now on", s->callers[i].label, e->message);
      berth_error_free(e);
      continue;
    }
    s->callers[i].stored = n;
  }
}

/* Reads the token file: at start, and again on SIGHUP.  Callers are kept by index
 * (conversations and requests name them so), so a reload never moves one: a token
 * that is gone is marked revoked (refused from now on, its open conversations left
 * as they are), a new one is appended, one that comes back is accepted again.  On
 * any error the callers stay as they were.  Logged by label, never by token. */
static int load_callers(server *s, const char *path)
{
  httpd_token_hash *hashes;
  char *why = NULL;
  int n = httpd_tokens_read(path, &hashes, &why);
  if (n < 0) {
    slog(s, "%s", why ? why : "cannot read the token file");
    free(why);
    return -1;
  }
  if (n == 0) {
    slog(s, "the token file %s holds no token (one per line; # starts a comment)", path);
    httpd_tokens_free(hashes, 0);
    return -1;
  }
  bool reload = s->callers != NULL;
  size_t old = s->n_callers;
  bool *kept = berth_xcalloc(old + 1, sizeof *kept);
  size_t added = 0, removed = 0;
  for (int i = 0; i < n; i++) {
    const unsigned char *hash = hashes[i];
    size_t k = 0;
    while (k < s->n_callers && memcmp(hash, s->callers[k].hash, sizeof s->callers[k].hash))
      k++;
    if (k == s->n_callers) {
      s->callers = berth_xrealloc(s->callers, (s->n_callers + 1) * sizeof *s->callers);
      caller *cl = &s->callers[s->n_callers++];
      memset(cl, 0, sizeof *cl);
      memcpy(cl->hash, hash, sizeof cl->hash);
      cl->label[0] = 'k';
      plm_hex_encode(cl->hash, 4, cl->label + 1);
      plm_hex_encode(cl->hash, 32, cl->digest);
      if (reload)
        slog(s, "token file: caller %s added", cl->label);
      added++;
    } else {
      if (s->callers[k].revoked) {
        slog(s, "token file: caller %s added again", s->callers[k].label);
        added++;
      }
      s->callers[k].revoked = false;
      if (k < old)
        kept[k] = true;
    }
  }
  for (size_t k = 0; reload && k < old; k++)
    if (!kept[k] && !s->callers[k].revoked) {
      s->callers[k].revoked = true;
      slog(s, "token file: caller %s removed (its requests are refused from now on)",
           s->callers[k].label);
      removed++;
    }
  free(kept);
  httpd_tokens_free(hashes, (size_t)n);
  count_stored(s, old);         /* (at start the store is not open yet: counted then) */
  if (reload)
    slog(s, "token file %s read again: %zu caller%s added, %zu removed", path, added,
         added == 1 ? "" : "s", removed);
  return 0;
}

static void on_sighup(struct ev_loop *loop, ev_signal *w, int revents)
{
  (void)loop;
  (void)revents;
  server *s = w->data;
  if (load_callers(s, s->token_file) != 0)
    slog(s, "the token file was not read again: the callers stay as they were");
}

static void guard_notice(void *ud, const char *line)
{
  slog(ud, "http: %s", line);
}

int berth_cmd_serve(int argc, char **argv)
{
  serve_args a;
  int rc = parse_args(argc, argv, &a);
  if (rc >= 0)
    return rc;
  if (!a.model && !a.hooks) {   /* every turn would fail: refused before anything starts */
    fprintf(stderr, "berth serve: no model: pass --model openai[:NAME] (an OpenAI-compatible "
                    "server: set BERTH_MODEL_URL, BERTH_API_KEY and BERTH_MODEL) or --model "
                    "scripted:FILE\n");
    return 2;
  }
  /* Every connection is a descriptor: take all the kernel allows, and size the table
   * for them before the store's threads start (berth.h says why). */
  unsigned long fds = connguard_raise_fd_limit();
  berth_reserve_descriptors();
  server srv;
  server *s = &srv;
  memset(s, 0, sizeof *s);
  berth_diag_sink(diag_log, NULL);   /* (before the store and the local sandboxd start) */
  plm_idmap_init(&s->convs);
  s->verbose = a.verbose;
  s->max_body = a.max_body;
  s->listen_fd = -1;
  if (load_callers(s, a.token_file) != 0)
    return 2;
  s->max_per_caller = a.max_per_caller_set ? a.max_per_caller
                      : default_per_caller(a.max_convs, s->n_callers);

  int status = 1;
  char *scripts = berth_find_scripts_dir();
  char hooks[4096];
  char *daemon_token = NULL;
  const char *daemon_url = NULL;
  berth_daemon local;
  bool own = false;
  memset(&local, 0, sizeof local);
  local.pid = -1;
  local.out_fd = -1;
  s->loop = ev_default_loop(0);
  if (a.hooks)
    snprintf(hooks, sizeof hooks, "%s", a.hooks);
  else if (scripts)
    snprintf(hooks, sizeof hooks, "%s/code_chat.lua", scripts);
  else {
    slog(s, "cannot find the shipped scripts (set BERTH_SCRIPTS, or give --hooks)");
    goto out;
  }
  if (a.daemon) {
    daemon_url = a.daemon;
    if (a.daemon_token) {
      char **lines;
      int n = read_lines(a.daemon_token, &lines);
      if (n <= 0) {
        slog(s, "cannot read a token from %s", a.daemon_token);
        if (n == 0)
          free(lines);
        goto out;
      }
      daemon_token = berth_xstrdup(lines[0]);
      free_lines(lines, n);
    }
  } else if (a.sandboxd || a.provider || !getenv("PLIMSOLL_URL") || !*getenv("PLIMSOLL_URL")) {
    /* No daemon given: a local one, with the strongest provider that works here (no
     * silent fakes: echo only when named). */
    const char *provider = a.provider;
    if (!provider)
      provider = getenv("BERTH_PROVIDER") && *getenv("BERTH_PROVIDER")
                 ? getenv("BERTH_PROVIDER") : "auto";
    if (berth_daemon_start(&local, a.sandboxd, provider, a.verbose) != 0)
      goto out;
    berth_daemon_watch(&local, s->loop);  /* started again if it dies (issue 11) */
    own = true;
    daemon_url = local.url;
    daemon_token = berth_xstrdup(local.token);
    if (!a.max_sandboxes_set)
      a.max_sandboxes = OWN_SANDBOXD_MAX_SANDBOXES;
  } else {
    daemon_url = getenv("PLIMSOLL_URL");
    if (getenv("PLIMSOLL_TOKEN"))
      daemon_token = berth_xstrdup(getenv("PLIMSOLL_TOKEN"));
  }
  if (a.model) {
    berth_error *e = berth_model_open(s->loop, a.model, &s->model);
    if (e) {
      slog(s, "%s", e->message);
      berth_error_free(e);
      goto out;
    }
  }

  {
    char def[4200];
    const char *url = a.store;
    if (!url) {
      snprintf(def, sizeof def, "sqlite:%s/berth.db", a.state_dir ? a.state_dir : ".");
      url = def;
    }
    berth_error *se = berth_store_open(s->loop, url, &s->store);
    if (se) {
      slog(s, "%s", se->message);
      berth_error_free(se);
      goto out;
    }
    /* A shared store (PostgreSQL) may serve other hosts now: no start-up recovery,
     * leases instead (a turn a dead host left is marked when its lease is taken over).
     * A host alone on its store marks every turn its predecessor left. */
    s->leases = !strcmp(berth_store_engine_name(s->store), "postgresql");
    size_t marked = 0;
    if (!s->leases && !(se = berth_store_claim(s->store)))
      se = berth_store_mark_interrupted(s->store, &marked);
    if (se) {
      slog(s, "%s", se->message);
      berth_error_free(se);
      goto out;
    }
    if (marked)
      slog(s, "%zu turn%s running when the last host stopped marked interrupted", marked,
           marked == 1 ? "" : "s");
    count_stored(s, 0);
    if (s->leases) {
      unsigned char raw[8];
      if (RAND_bytes(raw, sizeof raw) != 1) {
        slog(s, "no random bytes for a host id");
        goto out;
      }
      memcpy(s->host_id, "h-", 2);
      plm_hex_encode(raw, sizeof raw, s->host_id + 2);
      s->lease_ms = a.lease_ms ? (int64_t)a.lease_ms : DEFAULT_LEASE_MS;
      ev_timer_init(&s->renew, on_renew, s->lease_ms / 3000., s->lease_ms / 3000.);
      s->renew.data = s;
      ev_timer_start(s->loop, &s->renew);
      ev_unref(s->loop);        /* renewing alone keeps no loop alive */
      slog(s, "host %s: leases of %lld ms on the shared store", s->host_id,
           (long long)s->lease_ms);
      berth_store_fence(s->store, s->host_id);
      berth_store_on_fenced(s->store, on_fenced, s);
    }
  }

  if (daemon_url) {
    /* Where code runs, from the daemon itself: a daemon that does not answer now may
     * later (the host's calls say so then); one that runs no code is said so. */
    berth_daemon_facts df;
    if (berth_daemon_describe(s->loop, daemon_url, daemon_token, &df) != 0)
      slog_warn(s, "the daemon did not answer Describe; turns fail until it does");
    else {
      s->no_code_runs = df.sandbox && !strcmp(df.sandbox, "echo");
      if (s->no_code_runs)
        slog_warn(s, "the daemon's provider is echo, which runs no code: every tool "
                     "result is the code echoed back, marked \"noCodeRan\"");
      else if (s->verbose)
        slog(s, "code runs in %s (%s isolation)", df.sandbox ? df.sandbox : "?",
             df.isolation ? df.isolation : "?");
      berth_daemon_facts_clear(&df);
    }
  }

  berth_options ho;
  berth_options_init(&ho);
  ho.loop = s->loop;
  ho.store = s->store;
  ho.hooks_file = hooks;
  ho.lib_dir = scripts;
  if (a.idle > 0)
    ho.idle_timeout = a.idle;
  ho.daemon_url = daemon_url;
  ho.daemon_token = daemon_token;
  ho.minimum_isolation = a.min_iso ? a.min_iso : berth_default_floor(ho.daemon_url);
  ho.timeout_ms = CALL_TIMEOUT_MS;
  ho.model = s->model;
  ho.log = host_log;
  ho.log_ud = s;
  ho.handle_sighup = true;
  ho.max_conversations = a.max_convs;
  ho.max_concurrent_turns = a.max_turns;
  ho.max_queued_messages = a.max_queued;
  s->max_queued = a.max_queued;
  ho.max_sandboxes = (int)a.max_sandboxes;
  if (a.grace_set)
    ho.shutdown_grace = a.grace > 0 ? a.grace : -1;  /* 0: cancel at once */
  berth_callbacks cb = {on_turn_start, on_delta, on_message, on_tool_call, on_tool_result,
                        on_turn_end, on_suspended, NULL, on_error, s};
  if (s->leases) {
    ho.on_idle = on_idle;
    ho.idle_ud = s;
  }
  ho.callbacks = cb;
  berth_error *e = berth_host_open(&ho, &s->h);
  if (e) {
    slog(s, "%s", e->message);
    berth_error_free(e);
    goto out;
  }

  unsigned port = 0;
  char *why = NULL;
  s->listen_fd = httpd_listen_spec(a.listen, "--listen", 4096, &port, &why);
  if (s->listen_fd < 0) {
    slog(s, "%s", why ? why : "cannot listen");
    free(why);
    goto out;
  }
  /* A flood of idle connections must not lock callers out (connguard.h). */
  unsigned max_conns = a.max_conns ? (unsigned)a.max_conns : connguard_default_limit(fds);
  s->guard = connguard_new(s->loop, max_conns, a.header_timeout);
  connguard_on_notice(s->guard, guard_notice, s);
  if (s->verbose)
    slog(s, "at most %u connections (descriptor limit %lu), %.1f s to send an "
            "authenticated request", max_conns, fds, a.header_timeout);
  s->mhd = MHD_start_daemon(
    MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG, 0, NULL, NULL, on_request, s,
    MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
    MHD_OPTION_LISTEN_SOCKET, s->listen_fd,
    MHD_OPTION_NOTIFY_COMPLETED, on_request_done, s,
    MHD_OPTION_NOTIFY_CONNECTION, connguard_notify, s->guard,
    MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)120,
    MHD_OPTION_CONNECTION_LIMIT, connguard_mhd_limit(s->guard),
    MHD_OPTION_CONNECTION_MEMORY_LIMIT, HTTPD_POOL_BYTES,
    MHD_OPTION_END);
  if (!httpd_mhd_attach(&s->web, s->loop, s->mhd, &why)) {
    slog(s, "%s", why);
    free(why);
    goto out;
  }
  if (a.metrics_listen && !metrics_start(s, a.metrics_listen))
    goto out;
  ev_signal_init(&s->sigterm, on_stop_signal, SIGTERM);
  s->sigterm.data = s;
  ev_signal_start(s->loop, &s->sigterm);
  ev_signal_init(&s->sigint, on_stop_signal, SIGINT);
  s->sigint.data = s;
  ev_signal_start(s->loop, &s->sigint);
  s->token_file = a.token_file;
  ev_signal_init(&s->sighup, on_sighup, SIGHUP);  /* (the host reloads its hooks too) */
  s->sighup.data = s;
  ev_signal_start(s->loop, &s->sighup);

  {
    const char *colon = strrchr(a.listen, ':');
    printf("listening http://%.*s:%u\n", (int)(colon - a.listen), a.listen, port);
    fflush(stdout);
    if (!listens_on_loopback(a.listen))
      slog_warn(s, "listening on %s in cleartext: callers' tokens and conversations cross "
                   "the network unencrypted; put a TLS reverse proxy in front and listen on "
                   "127.0.0.1 (docs/many-hosts.md shows one)", a.listen);
    char per[48] = "";
    if (s->max_per_caller)
      snprintf(per, sizeof per, " (%zu per caller)", s->max_per_caller);
    slog(s, "%zu caller%s, daemon %s, model %s, limits: %zu conversations%s, %zu turns at "
            "once, %zu queued, %zu sandboxes", s->n_callers, s->n_callers == 1 ? "" : "s",
         daemon_url ? (own ? "started locally" : daemon_url) : "none",
         a.model ? a.model : "none", a.max_convs, per, a.max_turns, a.max_queued,
         a.max_sandboxes);
  }
  ev_run(s->loop, 0);
  status = s->host_done ? 0 : 1;
  {
    berth_stats st;
    berth_host_stats(s->h, &st);
    slog(s, "stopped: %llu conversations opened, %llu turns (%llu failed, %llu cancelled), "
            "%llu cells (%llu failed)", (unsigned long long)st.conversations_opened,
         (unsigned long long)st.turns_ended, (unsigned long long)st.turns_failed,
         (unsigned long long)st.turns_cancelled, (unsigned long long)st.cells,
         (unsigned long long)st.cell_errors);
  }

out:
  if (s->mhd) {
    /* Resume what is parked (MHD must not stop with suspended connections). */
    plm_idmap_each(&s->convs, wake_streams, NULL);
    httpd_mhd_detach(&s->web);
    ev_timer_stop(s->loop, &s->flush);
    ev_signal_stop(s->loop, &s->sigterm);
    ev_signal_stop(s->loop, &s->sigint);
    ev_signal_stop(s->loop, &s->sighup);
    MHD_run(s->mhd);
    MHD_stop_daemon(s->mhd);
  } else if (s->listen_fd >= 0)
    close(s->listen_fd);
  httpd_mhd_detach(&s->metrics_web);
  if (s->metrics_mhd)
    MHD_stop_daemon(s->metrics_mhd);
  connguard_free(s->guard);
  plm_idmap_each(&s->convs, drop_conv, s);
  plm_idmap_free(&s->convs);
  berth_host_free(s->h);
  if (ev_is_active(&s->renew)) {
    ev_ref(s->loop);
    ev_timer_stop(s->loop, &s->renew);
  }
  berth_store_free(s->store);   /* after the host: it flushes the last writes */
  release_streams(s);
  berth_model_free(s->model);
  if (own)
    berth_daemon_stop(&local);
  if (daemon_token) {
    OPENSSL_cleanse(daemon_token, strlen(daemon_token));
    free(daemon_token);
  }
  free(s->callers);
  free(scripts);
  ev_loop_destroy(s->loop);
  return status;
}

/* }====================================================== */

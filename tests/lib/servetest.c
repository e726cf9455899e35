/*
 * servetest.c — see servetest.h.
 */
#include "servetest.h"

#include "json_text.h"
#include "sse.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_ARGS 64

double st_now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int random_hex(char *out, size_t bytes)
{
  unsigned char raw[64];
  if (bytes > sizeof raw || getrandom(raw, bytes, 0) != (ssize_t)bytes)
    return -1;
  for (size_t i = 0; i < bytes; i++)
    snprintf(out + 2 * i, 3, "%02x", raw[i]);
  return 0;
}

static int write_file(const char *path, const char *text)
{
  FILE *f = fopen(path, "w");
  if (!f)
    return -1;
  fputs(text, f);
  return fclose(f);
}

static int spawn(st_server *s, const char *const *extra);

int st_start(st_server *s, const char *script_lua, const char *const *extra)
{
  memset(s, 0, sizeof *s);
  s->pid = -1;
  s->out_fd = -1;
  s->pidfd = -1;
  snprintf(s->dir, sizeof s->dir, "/tmp/berth-serve-XXXXXX");
  if (!mkdtemp(s->dir))
    return -1;
  if (random_hex(s->token[0], 32) || random_hex(s->token[1], 32))
    return -1;
  char tokens[128], script[128], text[256];
  snprintf(tokens, sizeof tokens, "%s/tokens", s->dir);
  snprintf(script, sizeof script, "%s/script.lua", s->dir);
  snprintf(s->log, sizeof s->log, "%s/serve.log", s->dir);
  snprintf(text, sizeof text, "# callers\n%s\n\n%s\n", s->token[0], s->token[1]);
  if (write_file(tokens, text) || write_file(script, script_lua)) {
    fprintf(stderr, "st_start: cannot write %s\n", s->dir);
    return -1;
  }
  return spawn(s, extra);
}

int st_start_like(st_server *s, const st_server *like, const char *script_lua,
                  const char *const *extra)
{
  memset(s, 0, sizeof *s);
  s->pid = -1;
  s->out_fd = -1;
  s->pidfd = -1;
  snprintf(s->dir, sizeof s->dir, "/tmp/berth-serve-XXXXXX");
  if (!mkdtemp(s->dir))
    return -1;
  memcpy(s->token, like->token, sizeof s->token);
  char tokens[128], script[128], text[256];
  snprintf(tokens, sizeof tokens, "%s/tokens", s->dir);
  snprintf(script, sizeof script, "%s/script.lua", s->dir);
  snprintf(s->log, sizeof s->log, "%s/serve.log", s->dir);
  snprintf(text, sizeof text, "# callers\n%s\n\n%s\n", s->token[0], s->token[1]);
  if (write_file(tokens, text) || write_file(script, script_lua)) {
    fprintf(stderr, "st_start_like: cannot write %s\n", s->dir);
    return -1;
  }
  return spawn(s, extra);
}

/* Starts berth serve on s->dir's tokens and script (its store in s->dir too, unless
 * the extra arguments name one) and waits for its `listening` line. */
static int spawn(st_server *s, const char *const *extra)
{
  char tokens[128], script[128];
  snprintf(tokens, sizeof tokens, "%s/tokens", s->dir);
  snprintf(script, sizeof script, "%s/script.lua", s->dir);
  const char *build = getenv("BUILD") && *getenv("BUILD") ? getenv("BUILD") : "build";
  char prog[256], model[160];
  snprintf(prog, sizeof prog, "%s/berth", build);
  snprintf(model, sizeof model, "scripted:%s", script);
  const char *argv[MAX_ARGS];
  int n = 0;
  const char *wrap = getenv("BERTH_SERVE_WRAPPER");  /* e.g. "valgrind --leak-check=full" */
  char wrapbuf[512];
  if (wrap && *wrap) {
    snprintf(wrapbuf, sizeof wrapbuf, "%s", wrap);
    for (char *tok = strtok(wrapbuf, " "); tok && n < 16; tok = strtok(NULL, " "))
      argv[n++] = tok;
  }
  argv[n++] = prog;
  argv[n++] = "serve";
  argv[n++] = "--listen";
  argv[n++] = "127.0.0.1:0";
  argv[n++] = "--callers";
  argv[n++] = tokens;
  argv[n++] = "--model";
  argv[n++] = model;
  argv[n++] = "--state-dir";    /* the default store, sqlite:<dir>/berth.db */
  argv[n++] = s->dir;
  for (int i = 0; extra && extra[i] && n < MAX_ARGS - 1; i++)
    argv[n++] = extra[i];
  argv[n] = NULL;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0)
    return -1;
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(1);
    dup2(fds[1], STDOUT_FILENO);
    int logfd = open(s->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (logfd >= 0)
      dup2(logfd, STDERR_FILENO);
    execvp(argv[0], (char *const *)argv);
    dprintf(STDERR_FILENO, "st_start: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  s->pid = pid;
  s->out_fd = fds[0];
  s->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
  char line[512];
  size_t len = 0;
  double deadline = st_now() + (wrap && *wrap ? 60 : 10);
  for (;;) {
    int left = (int)((deadline - st_now()) * 1000);
    struct pollfd p = {s->out_fd, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, left) <= 0)
      break;
    ssize_t r = read(s->out_fd, line + len, 1);
    if (r <= 0)
      break;
    if (line[len] == '\n' || len + 2 >= sizeof line) {
      line[len] = '\0';
      if (strncmp(line, "metrics ", 8) == 0)     /* --metrics-listen's, before it */
        snprintf(s->metrics_url, sizeof s->metrics_url, "%.120s", line + 8);
      if (strncmp(line, "listening ", 10) == 0) {
        snprintf(s->url, sizeof s->url, "%.120s", line + 10);
        return 0;
      }
      len = 0;
      continue;
    }
    len++;
  }
  char *log = st_read_log(s);
  fprintf(stderr, "st_start: berth serve did not report where it listens; its log:\n%s\n",
          log ? log : "(none)");
  free(log);
  st_stop(s);
  return -1;
}

int st_restart(st_server *s, int sig, const char *const *extra)
{
  int status = -1;
  if (s->pid > 0) {
    kill(s->pid, sig);
    status = st_wait_exit(s, 20);
    if (status < 0)
      return -1;
  }
  if (s->out_fd >= 0)
    close(s->out_fd);
  if (s->pidfd >= 0)
    close(s->pidfd);
  s->out_fd = s->pidfd = -1;
  if (spawn(s, extra) != 0)
    return -1;
  return status;
}

int st_wait_exit(st_server *s, double seconds)
{
  if (s->pid <= 0)
    return -1;
  double deadline = st_now() + seconds;
  for (;;) {
    int st;
    pid_t r = waitpid(s->pid, &st, WNOHANG);
    if (r == s->pid) {
      s->pid = -1;
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    if (r < 0)
      return -1;
    double left = deadline - st_now();
    if (left <= 0)
      return -1;
    if (s->pidfd >= 0) {        /* readable when the process exits */
      struct pollfd p = {s->pidfd, POLLIN, 0};
      poll(&p, 1, (int)(left * 1000) + 1);
    } else {
      struct timespec ts = {0, 10 * 1000000L};  /* a reaping poll, not synchronisation */
      nanosleep(&ts, NULL);
    }
  }
}

int st_stop(st_server *s)
{
  int status = -1;
  if (s->pid > 0) {
    kill(s->pid, SIGTERM);
    status = st_wait_exit(s, 20);
    if (status < 0 && s->pid > 0) {
      kill(s->pid, SIGKILL);
      waitpid(s->pid, NULL, 0);
      s->pid = -1;
    }
  }
  if (s->out_fd >= 0)
    close(s->out_fd);
  if (s->pidfd >= 0)
    close(s->pidfd);
  s->out_fd = s->pidfd = -1;
  if (s->dir[0]) {
    char path[192];
    static const char *const files[] = {"tokens", "script.lua", "serve.log", "berth.db",
                                        "berth.db-wal", "berth.db-shm"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
      snprintf(path, sizeof path, "%s/%s", s->dir, files[i]);
      unlink(path);
    }
    rmdir(s->dir);
    s->dir[0] = '\0';
  }
  return status;
}

char *st_read_log(const st_server *s)
{
  FILE *f = fopen(s->log, "r");
  if (!f)
    return NULL;
  char *buf = NULL;
  size_t cap = 0, len = 0, n;
  char chunk[4096];
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
    if (len + n + 1 > cap) {
      cap = (len + n + 1) * 2;
      buf = realloc(buf, cap);
    }
    memcpy(buf + len, chunk, n);
    len += n;
  }
  fclose(f);
  if (buf)
    buf[len] = '\0';
  return buf;
}

/* {====================================================== requests */

typedef struct sink {
  char *buf;
  size_t len, cap;
} sink;

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
  sink *k = ud;
  size_t add = size * n;
  if (k->len + add + 1 > k->cap) {
    k->cap = (k->len + add + 1) * 2;
    k->buf = realloc(k->buf, k->cap);
  }
  memcpy(k->buf + k->len, p, add);
  k->len += add;
  k->buf[k->len] = '\0';
  return add;
}

struct curl_slist *st_headers(const char *token, const char *type)
{
  struct curl_slist *h = NULL;
  char line[256];
  if (token) {
    snprintf(line, sizeof line, "Authorization: Bearer %s", token);
    h = curl_slist_append(h, line);
  }
  if (type) {
    snprintf(line, sizeof line, "Content-Type: %s", type);
    h = curl_slist_append(h, line);
  }
  h = curl_slist_append(h, "Expect:");
  return h;
}

long st_call_extra(const char *method, const char *url, const char *token, const char *body,
                   const char *type, const char *extra, char **out)
{
  CURL *e = curl_easy_init();
  sink k = {NULL, 0, 0};
  struct curl_slist *h = st_headers(token, body ? type : NULL);
  if (extra)
    h = curl_slist_append(h, extra);
  curl_easy_setopt(e, CURLOPT_URL, url);
  curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &k);
  curl_easy_setopt(e, CURLOPT_TIMEOUT, 30L);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  if (body) {
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
  }
  long status = 0;
  if (curl_easy_perform(e) == CURLE_OK)
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(e);
  curl_slist_free_all(h);
  if (out)
    *out = k.buf ? k.buf : strdup("");
  else
    free(k.buf);
  return status;
}

long st_call_type(const char *method, const char *url, const char *token, const char *body,
                  const char *type, char **out)
{
  return st_call_extra(method, url, token, body, type, NULL, out);
}

long st_call(const char *method, const char *url, const char *token, const char *body,
             char **out)
{
  return st_call_type(method, url, token, body, "application/json", out);
}

long st_call_json(const char *method, const char *url, const char *token, const char *body,
                  json_t **json)
{
  char *text = NULL;
  long status = st_call(method, url, token, body, &text);
  *json = json_loads(text, JSON_DECODE_ANY, NULL);
  free(text);
  return status;
}

/* }====================================================== */

/* {====================================================== event streams */

/* The events are split by the runtime's own parser (runtime/models/sse.h) and their
 * data read by libplimsoll's (json_text.h): the load of bench/serve_load reads five
 * events a turn this way, on the cores the server it measures runs on, and
 * json_loadb was 40 % of its instructions.  The reader needs PLM_JSON_PADDING
 * readable bytes after a text, so each event's data is copied into `pad`. */
typedef struct sse_parse {
  json_t *out;
  plm_json_reader *reader;
  char *pad;
  size_t pad_cap;
} sse_parse;

static int add_event(void *ud, const berth_sse_event *ev)
{
  sse_parse *p = ud;
  if (ev->len + PLM_JSON_PADDING > p->pad_cap) {
    p->pad_cap = 2 * (ev->len + PLM_JSON_PADDING);
    p->pad = realloc(p->pad, p->pad_cap);
  }
  memcpy(p->pad, ev->data, ev->len);
  memset(p->pad + ev->len, 0, PLM_JSON_PADDING);
  json_t *v = p->reader ? plm_json_read(p->reader, p->pad, ev->len, 0) : NULL;
  if (!v)
    v = json_stringn(ev->data, ev->len);
  json_t *e = json_object();
  json_object_set_new(e, "event", json_string(ev->type));
  json_object_set_new(e, "data", v ? v : json_null());
  json_array_append_new(p->out, e);
  return 0;
}

json_t *st_sse_parse(const char *text, size_t len)
{
  /* One reader for the process: it keeps its buffers between texts. */
  static plm_json_reader *reader;
  if (!reader)
    reader = plm_json_reader_new();
  sse_parse p = {json_array(), reader, NULL, 0};
  berth_sse sse;
  berth_sse_init(&sse, 0);
  berth_sse_feed(&sse, text, len, add_event, &p);
  berth_sse_free(&sse);         /* an unfinished line or event: not an event yet */
  free(p.pad);
  return p.out;
}

size_t st_stream_write(char *p, size_t size, size_t n, void *ud)
{
  st_stream *st = ud;
  size_t add = size * n;
  if (st->len + add + 1 > st->cap) {
    st->cap = (st->len + add + 1) * 2;
    st->buf = realloc(st->buf, st->cap);
  }
  memcpy(st->buf + st->len, p, add);
  st->len += add;
  st->buf[st->len] = '\0';
  return add;
}

void st_stream_start(st_stream *st, CURLM *multi, const char *url, const char *token,
                     const char *body)
{
  void *ud = st->ud;
  memset(st, 0, sizeof *st);
  st->ud = ud;
  st->easy = curl_easy_init();
  st->headers = st_headers(token, "application/json");
  curl_easy_setopt(st->easy, CURLOPT_URL, url);
  curl_easy_setopt(st->easy, CURLOPT_HTTPHEADER, st->headers);
  curl_easy_setopt(st->easy, CURLOPT_COPYPOSTFIELDS, body);
  curl_easy_setopt(st->easy, CURLOPT_WRITEFUNCTION, st_stream_write);
  curl_easy_setopt(st->easy, CURLOPT_WRITEDATA, st);
  curl_easy_setopt(st->easy, CURLOPT_PRIVATE, st);
  curl_easy_setopt(st->easy, CURLOPT_TIMEOUT, 120L);
  curl_easy_setopt(st->easy, CURLOPT_NOSIGNAL, 1L);
  st->started = st_now();
  curl_multi_add_handle(multi, st->easy);
}

bool st_pump(CURLM *multi, bool (*pred)(void *ud), void *ud, double seconds)
{
  double deadline = st_now() + seconds;
  for (;;) {
    int running = 0;
    curl_multi_perform(multi, &running);
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(multi, &left))) {
      if (m->msg != CURLMSG_DONE)
        continue;
      st_stream *st = NULL;
      curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&st);
      CURL *easy = m->easy_handle;
      CURLcode rc = m->data.result;
      curl_multi_remove_handle(multi, easy);
      if (st) {
        st->done = true;
        st->result = rc;
        st->ended = st_now();
        curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &st->status);
      }
    }
    if (pred(ud))
      return true;
    double rest = deadline - st_now();
    if (rest <= 0)
      return false;
    /* transfers pred just added get their sockets first, so the poll sees them */
    curl_multi_perform(multi, &running);
    /* waits for socket activity (or curl's own timeout), at most 50 ms */
    curl_multi_poll(multi, NULL, 0, rest < 0.05 ? (int)(rest * 1000) + 1 : 50, NULL);
  }
}

void st_stream_free(st_stream *st, CURLM *multi)
{
  if (st->easy) {
    if (!st->done)
      curl_multi_remove_handle(multi, st->easy);
    curl_easy_cleanup(st->easy);
  }
  curl_slist_free_all(st->headers);
  free(st->buf);
  st->easy = NULL;
  st->headers = NULL;
  st->buf = NULL;
}

json_t *st_stream_events(const st_stream *st)
{
  return st_sse_parse(st->buf ? st->buf : "", st->len);
}

/* }====================================================== */

char *st_url(const st_server *s, const char *fmt, ...)
{
  static char buf[4][256];
  static int k;
  char *b = buf[k++ % 4];
  int n = snprintf(b, 256, "%s", s->url);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b + n, (size_t)(256 - n), fmt, ap);
  va_end(ap);
  return b;
}

bool st_saw(void *seen)
{
  st_seen *w = seen;
  return w->st->buf && memmem(w->st->buf, w->st->len, w->what, strlen(w->what));
}

bool st_done(void *stream)
{
  return ((st_stream *)stream)->done;
}

/*
 * test_serve_store_faults.c — `berth serve` when its store is not what it should be,
 * and its token file read again on SIGHUP (issue 13): the real binary, its default
 * SQLite store, HTTP from libcurl, a scripted model (no code: no daemon needed).
 *
 *   - a corrupt store file, and one written by a newer berth: serve refuses to start,
 *     with a message naming the file and what to do, and leaves the file as it was;
 *   - a full disk (a 1 MiB tmpfs mounted for the test in a private mount namespace,
 *     then filled): new messages are refused 503 "unavailable", every message that was
 *     answered with its stream is in the store afterwards (after a restart too), the
 *     refused ones never ran, and once space returns messages are taken again;
 *   - SIGHUP: a token added to the file is accepted, one removed is refused, without a
 *     restart, and no token is logged.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <ev.h>
#include <jansson.h>
#include <sqlite3.h>

#include "berth.h"
#include "capability.h"
#include "servetest.h"

static const char script[] =
  "return { template = true, loop = true, turns = {\n"
  "  { user = '*', replies = { { say = 'got: {{user}}' } } } } }\n";

/* Each turn runs one cell (the message is its code: the echo provider sleeps on
 * "plimsoll-echo:sleep:MS"), then answers. */
static const char script_call[] =
  "return { template = true, loop = true, turns = {\n"
  "  { user = '*', replies = { { call = { code = '{{user}}' } }, { say = 'got: {{user}}' } } } "
  "} }\n";

static char *slurp(const char *path)
{
  FILE *f = fopen(path, "r");
  if (!f)
    return strdup("");
  char *buf = NULL;
  size_t cap = 0;
  ssize_t n = getdelim(&buf, &cap, '\0', f);
  fclose(f);
  if (n < 0) {
    free(buf);
    return strdup("");
  }
  return buf;
}

/* {====================================================== refusals at start */

/* Runs `berth serve` on the store URL until it exits (10 s at most): its exit status
 * (-1: it did not exit), *log its stderr (malloc'd). */
static int serve_until_exit(const char *dir, const char *store_url, char **log)
{
  char tokens[256], logpath[256], model[300], scr[256];
  assert_true(strlen(dir) < 200);
  snprintf(tokens, sizeof tokens, "%s/tokens", dir);
  snprintf(logpath, sizeof logpath, "%s/refused.log", dir);
  snprintf(scr, sizeof scr, "%s/script.lua", dir);
  snprintf(model, sizeof model, "scripted:%s", scr);
  FILE *f = fopen(tokens, "w");
  fputs("0123456789abcdef0123456789abcdef\n", f);
  fclose(f);
  f = fopen(scr, "w");
  fputs(script, f);
  fclose(f);
  const char *build = getenv("BUILD") && *getenv("BUILD") ? getenv("BUILD") : "build";
  char prog[256];
  snprintf(prog, sizeof prog, "%s/berth", build);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, STDERR_FILENO);
    int null = open("/dev/null", O_WRONLY);
    dup2(null, STDOUT_FILENO);
    execl(prog, prog, "serve", "--listen", "127.0.0.1:0", "--token-file", tokens, "--model",
          model, "--store", store_url, (char *)NULL);
    _exit(127);
  }
  int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
  struct pollfd p = {pidfd, POLLIN, 0};
  int status = -1;
  if (poll(&p, 1, 10000) == 1) {
    int st;
    if (waitpid(pid, &st, 0) == pid)
      status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  } else {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
  }
  close(pidfd);
  *log = slurp(logpath);
  return status;
}

static void sql_on_file(const char *path, const char *sql)
{
  sqlite3 *db;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(db);
}

static void make_store(const char *path)
{
  char u[300];
  snprintf(u, sizeof u, "sqlite:%s", path);
  berth_store *st = NULL;
  berth_error *e = berth_store_open(NULL, u, &st);
  assert_null(e);
  berth_store_free(st);
}

static void rm_dir(const char *dir)
{
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static void test_serve_refuses_a_corrupt_store_file(void **state)
{
  (void)state;
  char dir[] = "/tmp/berth-faults-XXXXXX", db[64], u[80];
  assert_non_null(mkdtemp(dir));
  snprintf(db, sizeof db, "%s/berth.db", dir);
  snprintf(u, sizeof u, "sqlite:%s", db);
  FILE *f = fopen(db, "w");
  for (int i = 0; i < 8192; i++)
    fputc("corrupt!"[i % 8], f);
  fclose(f);
  char *log = NULL;
  int status = serve_until_exit(dir, u, &log);
  print_message("%s", log);
  assert_int_not_equal(status, 0);
  assert_int_not_equal(status, -1);
  assert_non_null(strstr(log, db));
  assert_non_null(strstr(log, "not a readable berth database"));
  assert_null(strstr(log, "listening"));
  free(log);
  struct stat sb;                            /* untouched */
  assert_int_equal(stat(db, &sb), 0);
  assert_int_equal(sb.st_size, 8192);
  rm_dir(dir);
}

static void test_serve_refuses_a_store_of_a_newer_berth(void **state)
{
  (void)state;
  char dir[] = "/tmp/berth-faults-XXXXXX", db[64], u[80];
  assert_non_null(mkdtemp(dir));
  snprintf(db, sizeof db, "%s/berth.db", dir);
  snprintf(u, sizeof u, "sqlite:%s", db);
  make_store(db);
  sql_on_file(db, "UPDATE schema_version SET version = 99");
  char *log = NULL;
  int status = serve_until_exit(dir, u, &log);
  print_message("%s", log);
  assert_int_not_equal(status, 0);
  assert_int_not_equal(status, -1);
  assert_non_null(strstr(log, db));
  assert_non_null(strstr(log, "newer berth"));
  assert_non_null(strstr(log, "schema version 99"));
  free(log);
  sqlite3 *h;
  sqlite3_stmt *q;
  assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
  assert_int_equal(sqlite3_prepare_v2(h, "SELECT max(version) FROM schema_version", -1, &q,
                                      NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(q), SQLITE_ROW);
  assert_int_equal(sqlite3_column_int(q, 0), 99);   /* not migrated down or touched */
  sqlite3_finalize(q);
  sqlite3_close(h);
  rm_dir(dir);
}

/* }====================================================== */

/* {====================================================== a full disk */

static void create(st_server *s, char id[40])
{
  json_t *j = NULL;
  assert_int_equal(st_call_json("POST", st_url(s, "/v1/conversations"), s->token[0], "{}", &j),
                   201);
  snprintf(id, 40, "%s", json_string_value(json_object_get(j, "id")));
  json_decref(j);
}

/* One message; its HTTP status, *body (malloc'd) the answer. */
static long say(st_server *s, const char *id, const char *text, char **body)
{
  char msg[200];
  snprintf(msg, sizeof msg, "{\"content\": \"%s\"}", text);
  return st_call("POST", st_url(s, "/v1/conversations/%s/messages", id), s->token[0], msg, body);
}

/* The user messages of the stored history, joined by "|" ("|a|b|"). */
static char *user_history(st_server *s, const char *id)
{
  json_t *j = NULL;
  long st = st_call_json("GET", st_url(s, "/v1/conversations/%s/messages", id), s->token[0],
                         NULL, &j);
  if (st != 200) {
    char *log = st_read_log(s);
    fail_msg("GET messages: %ld; log:\n%s", st, log);
  }
  size_t cap = 1 << 16, len = 1;
  char *out = calloc(1, cap);
  out[0] = '|';
  size_t i;
  json_t *m;
  json_array_foreach(json_object_get(j, "messages"), i, m) {
    if (strcmp(json_string_value(json_object_get(m, "role")) ?: "", "user"))
      continue;
    const char *c = json_string_value(json_object_get(m, "content"));
    len += (size_t)snprintf(out + len, cap - len, "%s|", c ? c : "");
  }
  json_decref(j);
  return out;
}

/* Fills the file system of `dir` with `path` until it has no room; 0 when full. */
static int fill(const char *path)
{
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0)
    return -1;
  static char block[4096];
  memset(block, 'x', sizeof block);
  int err = 0;
  for (;;) {
    ssize_t n = write(fd, block, sizeof block);
    if (n < 0) {
      err = errno;
      break;
    }
  }
  /* what is left: less than a block */
  while (write(fd, block, 1) == 1)
    ;
  close(fd);
  return err == ENOSPC ? 0 : -1;
}

#define MESSAGES_WHILE_FULL 20

/* A sample from --metrics-listen (no token); 0 when there is no such sample yet. */
static double sample(st_server *s, const char *name)
{
  char *text = NULL, want[160];
  snprintf(want, sizeof want, "\n%s ", name);
  assert_int_equal(st_call("GET", s->metrics_url, NULL, NULL, &text), 200);
  const char *at = strstr(text, want);
  double n = at ? strtod(at + strlen(want), NULL) : 0;
  free(text);
  return n;
}

static double store_errors(st_server *s)
{
  return sample(s, "berth_errors_total{source=\"store\",class=\"unavailable\"}");
}

static void test_full_disk_refuses_messages_loses_nothing_acknowledged_and_recovers(void **state)
{
  (void)state;
  /* A private mount namespace: the tmpfs is this process's and its children's only. */
  if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
    skip_missing_capability("no private mount namespace (unshare -m needs root or a user "
                            "namespace): %s", strerror(errno));
  char dir[] = "/tmp/berth-fulldisk-XXXXXX";
  assert_non_null(mkdtemp(dir));
  if (mount("tmpfs", dir, "tmpfs", 0, "size=1m,mode=0700") != 0) {
    rmdir(dir);
    skip_missing_capability("cannot mount a tmpfs: %s", strerror(errno));
  }
  char store[300], filler[300];
  snprintf(store, sizeof store, "sqlite:%s/berth.db", dir);
  snprintf(filler, sizeof filler, "%s/filler", dir);
  const char *extra[] = {"--store", store, "--provider", "echo", "--metrics-listen",
                         "127.0.0.1:0", NULL};
  st_server *s = calloc(1, sizeof *s);
  assert_int_equal(st_start(s, script_call, extra), 0);
  char id[40];
  create(s, id);
  char *body = NULL;
  assert_int_equal(say(s, id, "before", &body), 200);
  /* the local sandboxd runs echo, as named: every result says no code ran */
  assert_non_null(strstr(body, "\"noCodeRan\":true"));
  free(body);
  assert_true(store_errors(s) == 0);

  /* A turn runs (acknowledged: its stream started) when the disk fills: what it
   * writes at its end fails, and must not be lost. */
  CURLM *m = curl_multi_init();
  st_stream running = {0};
  st_stream_start(&running, m, st_url(s, "/v1/conversations/%s/messages", id), s->token[0],
                  "{\"content\": \"plimsoll-echo:sleep:300\"}");
  st_seen w = {&running, "event: tool_call"};
  assert_true(st_pump(m, st_saw, &w, 20));
  assert_int_equal(fill(filler), 0);
  assert_true(st_pump(m, st_done, &running, 20));
  assert_int_equal(running.status, 200);
  assert_non_null(memmem(running.buf, running.len, "event: turn_end", 15));
  st_stream_free(&running, m);
  curl_multi_cleanup(m);

  /* The disk is full: messages are refused (none taken unstored), or taken if SQLite
   * still had room; every one taken is noted. */
  char taken[MESSAGES_WHILE_FULL][16];
  int n_taken = 0, n_refused = 0;
  char refused[MESSAGES_WHILE_FULL][16];
  double queued_first = 0;
  for (int i = 0; i < MESSAGES_WHILE_FULL; i++) {
    if (i == 1)                 /* the store is known to fail from here */
      queued_first = sample(s, "berth_store_queued_writes");
    char text[16];
    snprintf(text, sizeof text, "full-%d", i);
    long st = say(s, id, text, &body);
    if (st == 200) {
      assert_non_null(strstr(body, "event: turn_end"));
      snprintf(taken[n_taken++], 16, "%s", text);
    } else {
      assert_int_equal(st, 503);
      json_t *j = json_loads(body, 0, NULL);
      assert_non_null(j);
      json_t *err = json_object_get(j, "error");
      assert_string_equal(json_string_value(json_object_get(err, "code")), "unavailable");
      assert_non_null(strstr(json_string_value(json_object_get(err, "message")),
                             "not taken"));
      json_decref(j);
      snprintf(refused[n_refused++], 16, "%s", text);
    }
    free(body);
  }
  print_message("while full: %d taken, %d refused\n", n_taken, n_refused);
  /* the failures are errors of source "store" in the metrics */
  double failures = store_errors(s);
  print_message("store errors counted: %g\n", failures);
  assert_true(failures >= 1);
  /* ... and refused messages queue nothing: what waits for the disk stays bounded by
   * what was accepted before the store was known to fail */
  double queued_last = sample(s, "berth_store_queued_writes");
  print_message("writes waiting: %g after the first refusal, %g after %d\n", queued_first,
                queued_last, MESSAGES_WHILE_FULL);
  assert_true(sample(s, "berth_store_failing") == 1);
  if (queued_last > queued_first + 4)
    fail_msg("refused messages left %g writes waiting (%g after the first)", queued_last,
             queued_first);
  assert_true(n_refused >= MESSAGES_WHILE_FULL - 2);   /* the disk is full: refused */
  char *log = st_read_log(s);
  assert_non_null(strstr(log, "full"));                /* SQLite's "database or disk is full" */
  assert_null(strstr(log, s->token[0]));
  free(log);

  /* Space returns: taken again once the store's next retry (a second at most) has
   * applied what was kept; until then 503 with Retry-After, as a client retries. */
  assert_int_equal(unlink(filler), 0);
  long st;
  double until = st_now() + 10;
  while ((st = say(s, id, "after", &body)) == 503 && st_now() < until) {
    free(body);
    struct timespec ts = {0, 100 * 1000000L};   /* a client's pause between retries */
    nanosleep(&ts, NULL);
  }
  assert_int_equal(st, 200);
  assert_non_null(strstr(body, "got: after"));
  free(body);
  assert_true(sample(s, "berth_store_failing") == 0);

  for (int round = 0; round < 2; round++) {
    char *h = user_history(s, id);
    assert_non_null(strstr(h, "|before|"));
    if (!strstr(h, "|plimsoll-echo:sleep:300|"))
      fail_msg("the turn that ran as the disk filled is not in the store: %s", h);
    assert_non_null(strstr(h, "|after|"));
    for (int i = 0; i < n_taken; i++) {
      char want[40];
      snprintf(want, sizeof want, "|%.15s|", taken[i]);
      if (!strstr(h, want))
        fail_msg("an acknowledged message is not in the store: %s (history %s)", taken[i], h);
    }
    for (int i = 0; i < n_refused; i++) {
      char want[40];
      snprintf(want, sizeof want, "|%.15s|", refused[i]);
      if (strstr(h, want))
        fail_msg("a refused message ran: %s", refused[i]);
    }
    free(h);
    if (round == 0)             /* and on the file: after a restart */
      assert_int_equal(st_restart(s, SIGTERM, extra), 0);
  }
  assert_int_equal(st_stop(s), 0);
  free(s);
  umount2(dir, MNT_DETACH);
  rmdir(dir);
}

/* }====================================================== */

/* {====================================================== SIGHUP: the token file */

/* GET /v1/conversations with this token until it answers `want` (5 s at most): the
 * reload is asynchronous to the signal, so the test waits on what it changes. */
static bool answers(st_server *s, const char *token, long want)
{
  double deadline = st_now() + 5;
  for (;;) {
    long st = st_call("GET", st_url(s, "/v1/conversations"), token, NULL, NULL);
    if (st == want)
      return true;
    if (st_now() > deadline)
      return false;
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
  }
}

/* Waits (5 s at most) for `text` in the server's log. */
static bool logged(st_server *s, const char *text)
{
  double deadline = st_now() + 5;
  for (;;) {
    char *log = st_read_log(s);
    bool found = log && strstr(log, text);
    free(log);
    if (found)
      return true;
    if (st_now() > deadline)
      return false;
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
  }
}

static void test_sighup_reads_the_token_file_again(void **state)
{
  (void)state;
  st_server *s = calloc(1, sizeof *s);
  assert_int_equal(st_start(s, script, NULL), 0);
  const char *fresh = "f00dfeedf00dfeedf00dfeedf00dfeedf00dfeedf00dfeedf00dfeedf00dfeed";
  assert_int_equal(st_call("GET", st_url(s, "/v1/conversations"), fresh, NULL, NULL), 401);
  char id[40];
  create(s, id);                 /* caller 0's */

  /* caller 1 removed, a new caller added */
  char tokens[128];
  snprintf(tokens, sizeof tokens, "%s/tokens", s->dir);
  FILE *f = fopen(tokens, "w");
  fprintf(f, "# callers\n%s\n%s\n", s->token[0], fresh);
  fclose(f);
  assert_int_equal(kill(s->pid, SIGHUP), 0);
  assert_true(answers(s, fresh, 200));
  assert_true(answers(s, s->token[1], 401));
  /* caller 0 kept its conversation */
  assert_int_equal(st_call("GET", st_url(s, "/v1/conversations/%s", id), s->token[0], NULL,
                           NULL), 200);
  json_t *j = NULL;
  assert_int_equal(st_call_json("POST", st_url(s, "/v1/conversations"), fresh, "{}", &j), 201);
  json_decref(j);

  /* a file with no token changes nothing */
  f = fopen(tokens, "w");
  fclose(f);
  assert_int_equal(kill(s->pid, SIGHUP), 0);
  assert_true(logged(s, "the callers stay as they were"));
  assert_true(answers(s, fresh, 200));
  /* caller 1 back, as before it was removed */
  f = fopen(tokens, "w");
  fprintf(f, "%s\n%s\n%s\n", s->token[0], s->token[1], fresh);
  fclose(f);
  assert_int_equal(kill(s->pid, SIGHUP), 0);
  assert_true(answers(s, s->token[1], 200));
  assert_true(answers(s, fresh, 200));

  char *log = st_read_log(s);
  print_message("%s", log);
  assert_non_null(strstr(log, "holds no token"));
  assert_non_null(strstr(log, "the callers stay as they were"));
  assert_non_null(strstr(log, "1 caller added, 1 removed"));
  assert_null(strstr(log, s->token[0]));
  assert_null(strstr(log, s->token[1]));
  assert_null(strstr(log, fresh));
  free(log);
  assert_int_equal(st_stop(s), 0);
  free(s);
}

/* }====================================================== */

int main(void)
{
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_serve_refuses_a_corrupt_store_file),
    cmocka_unit_test(test_serve_refuses_a_store_of_a_newer_berth),
    cmocka_unit_test(test_sighup_reads_the_token_file_again),
    cmocka_unit_test(test_full_disk_refuses_messages_loses_nothing_acknowledged_and_recovers),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  curl_global_cleanup();
  return rc;
}

/*
 * test_httpd.c — libmicrohttpd on a libev loop (httpd/mhd_ev.h), alone: a real MHD
 * daemon on loopback, a real socket client in a thread.
 *
 * What it holds: a connection resumed and kicked from any callback of the loop — here
 * an ev_prepare watcher, as the store's answers resume `berth serve`'s streams — is
 * taken all the way, to its answer and through the keep-alive request behind it.  MHD
 * takes a connection one step per MHD_run; steps still due after a run must be
 * waited for by the loop's timer, whichever loop phase ran MHD.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <ev.h>
#include <microhttpd.h>

#include "listen.h"
#include "mhd_ev.h"

#define WAIT 10.0                /* seconds: a bound on each wait, never a sleep */
#define ROUNDS 40                /* request pairs per case */

typedef struct fixture {
  struct ev_loop *loop;
  struct MHD_Daemon *d;
  httpd_mhd m;
  uint16_t port;
  ev_prepare resumer;            /* resumes the parked connection when asked */
  ev_timer ask;                  /* asks for that, a moment after it parked */
  ev_async finished;             /* the client is done */
  ev_timer guard;                /* the bound on the whole run */
  struct MHD_Connection *parked;
  bool resume_wanted, ready, timed_out;
  /* the client's */
  int answers;                   /* whole answers read */
  char err[128];
} fixture;

static fixture *fx;              /* the one running case (MHD's callbacks reach it) */

/* GET /park is suspended until the prepare watcher resumes it, then answered "parked";
 * any other path is answered "next" at once. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **state)
{
  (void)cls;
  (void)method;
  (void)version;
  (void)upload;
  (void)upload_size;
  static int first;
  if (*state == NULL) {          /* the headers: nothing to do yet */
    *state = &first;
    return MHD_YES;
  }
  const char *text = "next";
  if (!strcmp(url, "/park")) {
    if (!fx->ready) {
      fx->parked = c;
      MHD_suspend_connection(c);
      ev_timer_set(&fx->ask, 0.001, 0.);
      ev_timer_start(fx->loop, &fx->ask);
      return MHD_YES;
    }
    fx->ready = false;
    text = "parked";
  }
  struct MHD_Response *r =
    MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
  enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return ok;
}

static void on_ask(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)loop;
  (void)w;
  (void)revents;
  fx->resume_wanted = true;     /* the prepare watcher does it, before the loop blocks */
}

static void on_resumer(struct ev_loop *loop, ev_prepare *w, int revents)
{
  (void)loop;
  (void)w;
  (void)revents;
  if (!fx->resume_wanted)
    return;
  fx->resume_wanted = false;
  fx->ready = true;
  MHD_resume_connection(fx->parked);
  httpd_mhd_kick(&fx->m);
}

static void on_finished(struct ev_loop *loop, ev_async *w, int revents)
{
  (void)w;
  (void)revents;
  ev_break(loop, EVBREAK_ALL);
}

static void on_guard(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)w;
  (void)revents;
  fx->timed_out = true;
  ev_break(loop, EVBREAK_ALL);
}

static double now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Reads until `want` answers (each ends with its 4- or 6-byte body) came whole, or the
 * bound: the number that came. */
static int read_answers(int fd, const char *const *bodies, int want, double deadline)
{
  char buf[4096];
  size_t len = 0;
  int got = 0;
  while (got < want) {
    double rest = deadline - now();
    if (rest <= 0)
      break;
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, (int)(rest * 1000) + 1) <= 0)
      continue;
    ssize_t n = recv(fd, buf + len, sizeof buf - 1 - len, 0);
    if (n <= 0)
      break;
    len += (size_t)n;
    buf[len] = '\0';
    /* an answer is whole once its body follows its blank line */
    for (;;) {
      char *end = strstr(buf, "\r\n\r\n");
      if (!end || strlen(end + 4) < strlen(bodies[got]))
        break;
      if (strncmp(end + 4, bodies[got], strlen(bodies[got])) != 0)
        return -1;
      size_t used = (size_t)(end + 4 - buf) + strlen(bodies[got]);
      memmove(buf, buf + used, len - used + 1);
      len -= used;
      got++;
      if (got == want)
        break;
    }
  }
  return got;
}

/* One keep-alive connection: ROUNDS times, GET /park (answered once the prepare
 * watcher resumed it) and GET /next on the same connection, either sent together or
 * the second as soon as the first is answered. */
static void *client(void *arg)
{
  fixture *f = arg;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(f->port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    snprintf(f->err, sizeof f->err, "connect failed");
    goto out;
  }
  static const char park[] = "GET /park HTTP/1.1\r\nHost: t\r\n\r\n";
  static const char next[] = "GET /next HTTP/1.1\r\nHost: t\r\n\r\n";
  static const char *const parked[] = {"parked"}, *const nexted[] = {"next"};
  double deadline = now() + WAIT;
  static const char *const both[] = {"parked", "next"};
  char two[sizeof park + sizeof next];
  snprintf(two, sizeof two, "%s%s", park, next);
  for (int i = 0; i < ROUNDS; i++) {
    /* one round sends both together (MHD reads the second with the first); the next
     * round's GET /park follows the answer at once */
    int got = 0;
    if (i % 2 == 0) {
      if (send(fd, two, strlen(two), MSG_NOSIGNAL) >= 0)
        got = read_answers(fd, both, 2, deadline);
    } else if (send(fd, park, sizeof park - 1, MSG_NOSIGNAL) >= 0 &&
               read_answers(fd, parked, 1, deadline) == 1 &&
               send(fd, next, sizeof next - 1, MSG_NOSIGNAL) >= 0)
      got = 1 + read_answers(fd, nexted, 1, deadline);
    f->answers += got > 0 ? got : 0;
    if (got != 2) {
      snprintf(f->err, sizeof f->err, "round %d: %d of its 2 answers", i, got);
      break;
    }
  }
out:
  close(fd);
  ev_async_send(f->loop, &f->finished);
  return NULL;
}

/* The case, with the resuming prepare watcher started before MHD's watchers
 * (`resumer_first`) or after them: libev runs prepare watchers in an order of its own,
 * and either must work. */
static void run_case(bool resumer_first)
{
  fixture f;
  memset(&f, 0, sizeof f);
  fx = &f;
  f.loop = ev_loop_new(EVFLAG_AUTO);
  ev_prepare_init(&f.resumer, on_resumer);
  ev_timer_init(&f.ask, on_ask, 0., 0.);
  ev_async_init(&f.finished, on_finished);
  ev_async_start(f.loop, &f.finished);
  ev_timer_init(&f.guard, on_guard, WAIT + 5, 0.);
  ev_timer_start(f.loop, &f.guard);
  if (resumer_first)
    ev_prepare_start(f.loop, &f.resumer);
  f.d = MHD_start_daemon(MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME, 0, NULL, NULL,
                         on_request, NULL, MHD_OPTION_END);
  assert_non_null(f.d);
  f.port = MHD_get_daemon_info(f.d, MHD_DAEMON_INFO_BIND_PORT)->port;
  char *why = NULL;
  assert_true(httpd_mhd_attach(&f.m, f.loop, f.d, &why));
  if (!resumer_first)
    ev_prepare_start(f.loop, &f.resumer);

  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, client, &f), 0);
  ev_run(f.loop, 0);
  pthread_join(t, NULL);

  ev_prepare_stop(f.loop, &f.resumer);
  ev_timer_stop(f.loop, &f.ask);
  ev_timer_stop(f.loop, &f.guard);
  ev_async_stop(f.loop, &f.finished);
  httpd_mhd_detach(&f.m);
  MHD_stop_daemon(f.d);
  ev_loop_destroy(f.loop);
  fx = NULL;
  if (f.err[0])
    fail_msg("%s (%d answers of %d)", f.err, f.answers, 2 * ROUNDS);
  assert_false(f.timed_out);
  assert_int_equal(f.answers, 2 * ROUNDS);
}

static void test_kick_from_a_prepare_watcher_started_before_mhds(void **state)
{
  (void)state;
  run_case(true);
}

static void test_kick_from_a_prepare_watcher_started_after_mhds(void **state)
{
  (void)state;
  run_case(false);
}

/* A port is 0 to 65535, written in decimal: getaddrinfo would keep the low 16 bits of
 * a larger one (65617 would be port 81) and take the rest as it parses. */
static void test_listen_takes_only_ports_it_can_bind(void **state)
{
  (void)state;
  static const char *const bad[] = {"65536", "65617", "99999999999", "-1", "abc", "80x", " 80",
                                    "+80", ""};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    unsigned port = 7;
    char *why = NULL;
    char spec[64];
    snprintf(spec, sizeof spec, "127.0.0.1:%s", bad[i]);
    assert_int_equal(httpd_listen_spec(spec, "--listen", 8, &port, &why), -1);
    assert_non_null(why);
    assert_true(strstr(why, "port must be a number from 0 to 65535") ||
                strstr(why, "needs HOST:PORT"));
    free(why);
    assert_int_equal(port, 7);
  }
  unsigned port = 0;
  char *why = NULL;
  int fd = httpd_listen_spec("127.0.0.1:0", "--listen", 8, &port, &why);
  assert_true(fd >= 0);
  assert_true(port > 0 && port <= 65535);
  close(fd);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_kick_from_a_prepare_watcher_started_before_mhds),
    cmocka_unit_test(test_kick_from_a_prepare_watcher_started_after_mhds),
    cmocka_unit_test(test_listen_takes_only_ports_it_can_bind),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * local_sandboxd.c — a local sandboxd for the faces (`berth chat`, `replay`, `serve`)
 * and for embedders (berth_sandboxd_*): a fresh random token in a private file, port
 * 0, and the daemon's own `listening URL` line (local_sandboxd.h).
 */
#include "local_sandboxd.h"
#include "diag.h"
#include "xalloc.h"
#include "runtime.h"  /* berth_error_new */

#include <stdio.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define START_LIMIT_MS 60000     /* a provider's smoke test (gVisor) can take seconds */
#define STOP_LIMIT_MS 15000      /* sandboxd drains for at most 10 s */

static long now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

/* The directory holding the running executable. */
static char *exe_dir(void)
{
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0)
    return NULL;
  buf[n] = '\0';
  char *slash = strrchr(buf, '/');
  if (!slash)
    return NULL;
  *slash = '\0';
  return berth_xstrdup(buf);
}

char *berth_find_scripts_dir(void)
{
  const char *env = getenv("BERTH_SCRIPTS");
  if (env && *env)
    return berth_xstrdup(env);
  char *dir = exe_dir();
  if (!dir)
    return NULL;
  static const char *const rel[] = {"../scripts", "../share/berth/scripts"};
  char path[PATH_MAX];
  for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) {
    snprintf(path, sizeof path, "%s/%s/code_chat.lua", dir, rel[i]);
    if (access(path, R_OK) == 0) {
      snprintf(path, sizeof path, "%s/%s", dir, rel[i]);
      free(dir);
      return realpath(path, NULL);
    }
  }
  free(dir);
  return NULL;
}

static char *find_sandboxd(const char *path)
{
  if (path)
    return berth_xstrdup(path);
  const char *env = getenv("BERTH_SANDBOXD");
  if (env && *env)
    return berth_xstrdup(env);
  char *dir = exe_dir();
  if (dir) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/sandboxd", dir);
    free(dir);
    if (access(p, X_OK) == 0)
      return berth_xstrdup(p);
  }
  return berth_xstrdup("sandboxd");    /* from PATH */
}

static int write_token(berth_daemon *d)
{
  unsigned char raw[24];
  if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
    return -1;
  for (size_t i = 0; i < sizeof raw; i++)
    snprintf(d->token + 2 * i, 3, "%02x", raw[i]);
  const char *tmp = getenv("TMPDIR");
  snprintf(d->token_file, sizeof d->token_file, "%s/berth-token-XXXXXX",
           tmp && *tmp && strlen(tmp) < 40 ? tmp : "/tmp");
  int fd = mkstemp(d->token_file);  /* mode 0600 */
  if (fd < 0)
    return -1;
  size_t n = strlen(d->token);
  bool ok = write(fd, d->token, n) == (ssize_t)n && write(fd, "\n", 1) == 1;
  close(fd);
  return ok ? 0 : -1;
}

/* Forks and execs sandboxd listening on `listen`, and reads its `listening URL` line
 * into d->url.  Returns 0, or -1 (the child, if any, stopped) with a message. */
static int spawn(berth_daemon *d, const char *listen)
{
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0)
    return -1;
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "berth: fork: %s\n", strerror(errno));
    close(fds[0]);
    close(fds[1]);
    return -1;
  }
  if (pid == 0) {
    /* The daemon must not outlive berth, even when berth is killed. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent)
      _exit(1);
    /* Its own process group: the terminal's Ctrl-C (SIGINT to the foreground group)
     * is berth's to handle, and must not take the daemon and its sandboxes down. */
    setpgid(0, 0);
    dup2(fds[1], STDOUT_FILENO);
    if (!d->verbose) {
      int null = open("/dev/null", O_WRONLY);
      if (null >= 0)
        dup2(null, STDERR_FILENO);
    }
    char *argv[] = {d->prog, "--listen", (char *)listen, "--token-file", d->token_file,
                    "--provider", d->provider, NULL};
    execvp(d->prog, argv);
    dprintf(STDERR_FILENO, "berth: cannot run %s: %s\n", d->prog, strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  setpgid(pid, pid);            /* (also here: whichever runs first) */
  d->pid = pid;
  d->out_fd = fds[0];
  /* Read its stdout until `listening URL`, within a bound; a daemon that exits or
   * stays silent is an error. */
  char line[sizeof d->url];
  size_t n = 0;
  long deadline = now_ms() + START_LIMIT_MS;
  for (;;) {
    long left = deadline - now_ms();
    struct pollfd p = {fds[0], POLLIN, 0};
    if (left <= 0 || poll(&p, 1, (int)left) <= 0)
      break;
    ssize_t r = read(fds[0], line + n, 1);
    if (r <= 0)
      break;
    if (line[n] == '\n' || n + 2 >= sizeof line) {
      line[n] = '\0';
      if (strncmp(line, "listening ", 10) == 0) {
        memcpy(d->url, line + 10, n - 10 + 1);
        return 0;
      }
      n = 0;
      continue;
    }
    n++;
  }
  if (strcmp(d->provider, "auto") == 0)
    fprintf(stderr, "berth: %s --provider auto did not start: no isolating provider "
                    "(gvisor, bwrap) passed its smoke test here (--verbose shows why).  "
                    "Pass --daemon URL for a daemon elsewhere, or --provider process "
                    "--minimum-isolation process to run code without isolation\n",
            d->prog);
  else
    fprintf(stderr, "berth: %s --provider %s did not start (run with --verbose to see its "
                    "log)\n", d->prog, d->provider);
  return -1;
}

/* Ends the child spawn started (SIGTERM, bounded wait, SIGKILL) and its pipe. */
static void reap(berth_daemon *d)
{
  if (d->pid > 0) {
    kill(d->pid, SIGTERM);
    long deadline = now_ms() + STOP_LIMIT_MS;
    for (;;) {
      int st;
      pid_t r = waitpid(d->pid, &st, WNOHANG);
      if (r == d->pid || (r < 0 && errno == ECHILD))
        break;
      if (now_ms() > deadline) {
        kill(d->pid, SIGKILL);
        waitpid(d->pid, &st, 0);
        break;
      }
      struct timespec ts = {0, 10 * 1000000L}; /* reaping poll, bounded above */
      nanosleep(&ts, NULL);
    }
    d->pid = -1;
  }
  if (d->out_fd >= 0) {
    close(d->out_fd);
    d->out_fd = -1;
  }
}

int berth_daemon_start(berth_daemon *d, const char *path, const char *provider, bool verbose)
{
  memset(d, 0, sizeof *d);
  d->pid = -1;
  d->out_fd = -1;
  if (write_token(d) != 0) {
    fprintf(stderr, "berth: cannot write a token file: %s\n", strerror(errno));
    return -1;
  }
  d->prog = find_sandboxd(path);
  d->provider = berth_xstrdup(provider);
  d->verbose = verbose;
  if (spawn(d, "127.0.0.1:0") == 0)
    return 0;
  berth_daemon_stop(d);
  return -1;
}

/* {====================================================== restarting */

#define RETRY_FIRST 1.0
#define RETRY_MAX 30.0

static void watch_child(berth_daemon *d)
{
  ev_child_set(&d->child, d->pid, 0);
  ev_child_start(d->loop, &d->child);
  ev_unref(d->loop);            /* the watch alone keeps no loop running */
}

/* Starts it again where it listened (its URL is http://127.0.0.1:PORT): the host's
 * client and token stay valid.  The loop waits meanwhile (a provider's start-up, a
 * fraction of a second for bwrap or process, seconds for gVisor). */
static void restart(berth_daemon *d)
{
  const char *hostport = strstr(d->url, "://");
  hostport = hostport ? hostport + 3 : d->url;
  char listen[sizeof d->url];
  snprintf(listen, sizeof listen, "%s", hostport);
  if (spawn(d, listen) == 0) {
    d->restarts++;
    d->retry_after = RETRY_FIRST;
    berth_diag(BERTH_LOG_INFO, "the local sandboxd is running again (pid %d, restart %u) "
                               "at %s; each conversation's next call gets a fresh sandbox",
               (int)d->pid, d->restarts, d->url);
    watch_child(d);
    return;
  }
  reap(d);
  berth_diag(BERTH_LOG_ERROR, "restarting the local sandboxd failed; trying again in %g s",
             d->retry_after);
  ev_timer_set(&d->retry, d->retry_after, 0.);
  ev_timer_start(d->loop, &d->retry);
  ev_unref(d->loop);
  d->retry_after = d->retry_after * 2 < RETRY_MAX ? d->retry_after * 2 : RETRY_MAX;
}

static void on_retry(struct ev_loop *loop, ev_timer *w, int revents)
{
  (void)revents;
  berth_daemon *d = w->data;
  ev_ref(loop);                 /* a stopped watcher gives its reference back */
  ev_timer_stop(loop, w);
  restart(d);
}

static void on_child(struct ev_loop *loop, ev_child *w, int revents)
{
  (void)revents;
  berth_daemon *d = w->data;
  ev_ref(loop);
  ev_child_stop(loop, w);
  int st = w->rstatus;
  d->pid = -1;                  /* reaped by libev */
  if (d->out_fd >= 0) {
    close(d->out_fd);
    d->out_fd = -1;
  }
  if (WIFSIGNALED(st))
    berth_diag(BERTH_LOG_WARN, "the local sandboxd (pid %d) was killed by signal %d; "
                               "starting it again", (int)w->rpid, WTERMSIG(st));
  else
    berth_diag(BERTH_LOG_WARN, "the local sandboxd (pid %d) exited with status %d; "
                               "starting it again", (int)w->rpid, WEXITSTATUS(st));
  restart(d);
}

void berth_daemon_watch(berth_daemon *d, struct ev_loop *loop)
{
  if (d->pid <= 0 || d->loop)
    return;
  d->loop = loop;
  d->retry_after = RETRY_FIRST;
  ev_child_init(&d->child, on_child, d->pid, 0);
  d->child.data = d;
  ev_timer_init(&d->retry, on_retry, 0., 0.);
  d->retry.data = d;
  watch_child(d);
}

static void unwatch(berth_daemon *d)
{
  if (!d->loop)
    return;
  if (ev_is_active(&d->child)) {
    ev_ref(d->loop);
    ev_child_stop(d->loop, &d->child);
  }
  if (ev_is_active(&d->retry)) {
    ev_ref(d->loop);
    ev_timer_stop(d->loop, &d->retry);
  }
  d->loop = NULL;
}

/* }====================================================== */

void berth_daemon_stop(berth_daemon *d)
{
  unwatch(d);
  reap(d);
  if (d->token_file[0]) {
    unlink(d->token_file);
    d->token_file[0] = '\0';
  }
  free(d->prog);
  free(d->provider);
  d->prog = d->provider = NULL;
}

const char *berth_default_floor(const char *daemon_url)
{
  return daemon_url && strncasecmp(daemon_url, "http://", 7) == 0 ? "container" : "kernel";
}

/* ---------------------------------------------------------------- public (berth.h) */

struct berth_sandboxd {
  berth_daemon d;
};

berth_error *berth_sandboxd_start(struct ev_loop *loop, const char *path,
                                  const char *provider, berth_sandboxd **out)
{
  *out = NULL;
  berth_sandboxd *s = berth_xcalloc(1, sizeof *s);
  if (berth_daemon_start(&s->d, path, provider ? provider : "auto", false) != 0) {
    free(s);
    return berth_error_new("unavailable", "sandboxd did not start (its messages are above)");
  }
  if (loop)
    berth_daemon_watch(&s->d, loop);
  *out = s;
  return NULL;
}

const char *berth_sandboxd_url(const berth_sandboxd *s) { return s->d.url; }
const char *berth_sandboxd_token(const berth_sandboxd *s) { return s->d.token; }

void berth_sandboxd_stop(berth_sandboxd *s)
{
  if (!s)
    return;
  berth_daemon_stop(&s->d);
  free(s);
}

char *berth_scripts_dir(void) { return berth_find_scripts_dir(); }

/*
 * daemon.c — a local sandboxd for `berth replay` and `berth chat`: a fresh random
 * token in a private file, port 0, and the daemon's own `listening URL` line.
 */
#include "cli.h"

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
  return strdup(buf);
}

char *berth_find_scripts_dir(void)
{
  const char *env = getenv("BERTH_SCRIPTS");
  if (env && *env)
    return strdup(env);
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
    return strdup(path);
  const char *env = getenv("BERTH_SANDBOXD");
  if (env && *env)
    return strdup(env);
  char *dir = exe_dir();
  if (dir) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/sandboxd", dir);
    free(dir);
    if (access(p, X_OK) == 0)
      return strdup(p);
  }
  return strdup("sandboxd");    /* from PATH */
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

int berth_daemon_start(berth_daemon *d, const char *path, const char *provider, bool verbose)
{
  memset(d, 0, sizeof *d);
  d->pid = -1;
  d->out_fd = -1;
  if (write_token(d) != 0) {
    fprintf(stderr, "berth: cannot write a token file: %s\n", strerror(errno));
    return -1;
  }
  char *prog = find_sandboxd(path);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    free(prog);
    return -1;
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "berth: fork: %s\n", strerror(errno));
    free(prog);
    return -1;
  }
  if (pid == 0) {
    /* The daemon must not outlive berth, even when berth is killed. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent)
      _exit(1);
    dup2(fds[1], STDOUT_FILENO);
    if (!verbose) {
      int null = open("/dev/null", O_WRONLY);
      if (null >= 0)
        dup2(null, STDERR_FILENO);
    }
    char *argv[] = {prog, "--listen", "127.0.0.1:0", "--token-file", d->token_file,
                    "--provider", (char *)provider, NULL};
    execvp(prog, argv);
    dprintf(STDERR_FILENO, "berth: cannot run %s: %s\n", prog, strerror(errno));
    _exit(127);
  }
  close(fds[1]);
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
        free(prog);
        return 0;
      }
      n = 0;
      continue;
    }
    n++;
  }
  fprintf(stderr, "berth: %s --provider %s did not start (run with --verbose to see its "
                  "log)\n", prog, provider);
  free(prog);
  berth_daemon_stop(d);
  return -1;
}

void berth_daemon_stop(berth_daemon *d)
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
  if (d->token_file[0]) {
    unlink(d->token_file);
    d->token_file[0] = '\0';
  }
}

const char *berth_default_floor(const char *daemon_url)
{
  return daemon_url && strncasecmp(daemon_url, "http://", 7) == 0 ? "container" : "kernel";
}

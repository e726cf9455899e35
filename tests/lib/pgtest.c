/*
 * pgtest.c — a private PostgreSQL cluster per test program (pgtest.h).
 *
 * The server outlives nothing: a guard process, forked first, holds the read end of a
 * pipe whose write end only this process has (close-on-exec, so no server or child
 * inherits it).  When the pipe reads end-of-file — pgtest_destroy closed it, or this
 * process died however it died — the guard stops the server (pg_ctl stop -m immediate)
 * and removes the directory.  One path for a clean end and a crash.
 */
#include "pgtest.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <libpq-fe.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *const pg_bins[] = {"/usr/lib/postgresql/15/bin",
                                      "/usr/lib/postgresql/16/bin", NULL};

static const char *find_bin(void)
{
  for (size_t i = 0; pg_bins[i]; i++) {
    char p[160];
    snprintf(p, sizeof p, "%s/pg_ctl", pg_bins[i]);
    if (access(p, X_OK) == 0)
      return pg_bins[i];
  }
  return NULL;
}

bool pgtest_available(char *why, size_t len)
{
  if (find_bin())
    return true;
  snprintf(why, len, "no PostgreSQL server binaries (Debian package postgresql)");
  return false;
}

/* The OS user the cluster runs as: ourselves, or (as root, which PostgreSQL refuses)
 * postgres, else nobody.  NULL pw: ourselves. */
static struct passwd *cluster_user(void)
{
  if (geteuid() != 0)
    return NULL;
  struct passwd *pw = getpwnam("postgres");
  return pw ? pw : getpwnam("nobody");
}

/* Runs argv (a program of t->bin, or an absolute path) as the cluster's user, output to
 * the log file; its exit status, or -1. */
static int run(pgtest *t, char *const argv[])
{
  struct passwd *pw = cluster_user();
  uid_t uid = pw ? pw->pw_uid : 0;
  gid_t gid = pw ? pw->pw_gid : 0;
  char prog[200], logp[100];
  if (argv[0][0] == '/')
    snprintf(prog, sizeof prog, "%s", argv[0]);
  else
    snprintf(prog, sizeof prog, "%s/%s", t->bin, argv[0]);
  snprintf(logp, sizeof logp, "%s/commands.log", t->dir);
  pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    int fd = open(logp, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0)
      dup2(null, STDIN_FILENO);
    if (pw && (setgroups(0, NULL) < 0 || setgid(gid) < 0 || setuid(uid) < 0))
      _exit(126);
    if (chdir(t->dir) < 0)
      _exit(126);
    /* argv[0] the full path: initdb finds postgres beside itself through it (a bare
     * name sends it searching PATH, which need not hold the server's directory). */
    ((char **)argv)[0] = prog;
    execv(prog, argv);
    _exit(127);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR)
      return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void show_log(pgtest *t, const char *name)
{
  char p[100], line[512];
  snprintf(p, sizeof p, "%s/%s", t->dir, name);
  FILE *in = fopen(p, "r");
  if (!in)
    return;
  while (fgets(line, sizeof line, in))
    fprintf(stderr, "pgtest: %s: %s", name, line);
  fclose(in);
}

/* The guard: waits for end-of-file on fd, then stops the server and removes dir. */
static void guard_main(pgtest *t, int fd)
{
  /* Hold nothing of the test's but the pipe (a socket kept open here would keep a
   * peer waiting for its end-of-file). */
  if (fd > 3)
    close_range(3, (unsigned)fd - 1, 0);
  close_range((unsigned)fd + 1, ~0U, 0);
  setsid();                     /* a Ctrl-C to the test's group leaves it to clean up */
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);
  for (;;) {
    char c;
    ssize_t r = read(fd, &c, 1);
    if (r == 0 || (r < 0 && errno != EINTR))
      break;
  }
  char data[100];
  snprintf(data, sizeof data, "%s/data", t->dir);
  char *stop[] = {"pg_ctl", "-D", data, "-m", "immediate", "-w", "-t", "20", "stop", NULL};
  char pid_file[120];
  snprintf(pid_file, sizeof pid_file, "%s/postmaster.pid", data);
  if (access(pid_file, F_OK) == 0)
    run(t, stop);
  char *rm[] = {"/bin/rm", "-rf", t->dir, NULL};
  pid_t pid = fork();
  if (pid == 0) {
    execv(rm[0], rm);
    _exit(127);
  }
  if (pid > 0)
    waitpid(pid, NULL, 0);
  _exit(0);
}

static int start_guard(pgtest *t)
{
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) < 0)
    return -1;
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return -1;
  }
  if (pid == 0) {
    close(fds[1]);
    guard_main(t, fds[0]);
  }
  close(fds[0]);
  t->guard = pid;
  t->guard_fd = fds[1];
  return 0;
}

/* Waits until the server accepts connections: pg_isready, bounded by its -t. */
static int wait_ready(pgtest *t)
{
  char *ready[] = {"pg_isready", "-q", "-h", t->dir, "-U", t->user, "-d", "postgres",
                   "-t", "20", NULL};
  return run(t, ready) == 0 ? 0 : -1;
}

static int server_start(pgtest *t)
{
  char data[100], logp[100], opts[300];
  snprintf(data, sizeof data, "%s/data", t->dir);
  snprintf(logp, sizeof logp, "%s/server.log", t->dir);
  /* A socket in dir only; fsync on (durability is what the tests are about); small,
   * unless the caller asked for more (pgtest_start_sized). */
  snprintf(opts, sizeof opts, "-c listen_addresses='' -c unix_socket_directories='%s' "
                              "-c fsync=on -c max_connections=40 -c shared_buffers=%s",
           t->dir, t->shared_buffers);
  char *start[] = {"pg_ctl", "-D", data, "-l", logp, "-w", "-t", "30", "-o", opts, "start",
                   NULL};
  if (run(t, start) != 0 || wait_ready(t) != 0) {
    fprintf(stderr, "pgtest: the server in %s did not start\n", t->dir);
    show_log(t, "commands.log");
    show_log(t, "server.log");
    return -1;
  }
  t->running = true;
  return 0;
}

int pgtest_start(pgtest *t)
{
  return pgtest_start_sized(t, "16MB");
}

int pgtest_start_sized(pgtest *t, const char *shared_buffers)
{
  memset(t, 0, sizeof *t);
  t->guard = -1;
  t->guard_fd = -1;
  snprintf(t->shared_buffers, sizeof t->shared_buffers, "%s", shared_buffers);
  const char *bin = find_bin();
  if (!bin) {
    fprintf(stderr, "pgtest: no PostgreSQL server binaries\n");
    return -1;
  }
  snprintf(t->bin, sizeof t->bin, "%s", bin);
  snprintf(t->user, sizeof t->user, "berth");
  snprintf(t->dir, sizeof t->dir, "/tmp/berth-pg-XXXXXX");
  if (!mkdtemp(t->dir)) {
    fprintf(stderr, "pgtest: mkdtemp: %s\n", strerror(errno));
    return -1;
  }
  struct passwd *pw = cluster_user();
  if (pw && chown(t->dir, pw->pw_uid, pw->pw_gid) < 0) {
    fprintf(stderr, "pgtest: chown %s: %s\n", t->dir, strerror(errno));
    rmdir(t->dir);
    return -1;
  }
  if (start_guard(t) < 0) {
    rmdir(t->dir);
    return -1;
  }
  char data[100];
  snprintf(data, sizeof data, "%s/data", t->dir);
  char *initdb[] = {"initdb", "-D", data, "-U", t->user, "--auth=trust", "-E", "UTF8",
                    "--no-locale", "--no-sync", NULL};
  if (run(t, initdb) != 0) {
    fprintf(stderr, "pgtest: initdb failed\n");
    show_log(t, "commands.log");
    pgtest_destroy(t);
    return -1;
  }
  if (server_start(t) != 0) {
    pgtest_destroy(t);
    return -1;
  }
  return 0;
}

int pgtest_sql(const char *url, const char *sql)
{
  PGconn *c = PQconnectdb(url);
  if (PQstatus(c) != CONNECTION_OK) {
    fprintf(stderr, "pgtest: connecting to %s: %s", url, PQerrorMessage(c));
    PQfinish(c);
    return -1;
  }
  PGresult *r = PQexec(c, sql);
  ExecStatusType st = PQresultStatus(r);
  int rc = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK ? 0 : -1;
  if (rc)
    fprintf(stderr, "pgtest: %s: %s", sql, PQerrorMessage(c));
  PQclear(r);
  PQfinish(c);
  return rc;
}

int pgtest_fresh_url(pgtest *t, char *url, size_t len)
{
  char base[200], sql[80];
  if (!t->dbs) {
    snprintf(base, sizeof base, "postgresql:///postgres?host=%s&user=%s", t->dir, t->user);
    if (pgtest_sql(base, "CREATE DATABASE berth") != 0)
      return -1;
  }
  unsigned n = ++t->dbs;
  snprintf(base, sizeof base, "postgresql:///berth?host=%s&user=%s", t->dir, t->user);
  snprintf(sql, sizeof sql, "CREATE SCHEMA t%u", n);
  if (pgtest_sql(base, sql) != 0)
    return -1;
  snprintf(url, len, "%s&options=-csearch_path%%3Dt%u", base, n);
  return 0;
}

int pgtest_stop_server(pgtest *t, bool crash)
{
  char data[100], mode[16];
  snprintf(data, sizeof data, "%s/data", t->dir);
  snprintf(mode, sizeof mode, "%s", crash ? "immediate" : "fast");
  char *stop[] = {"pg_ctl", "-D", data, "-m", mode, "-w", "-t", "30", "stop", NULL};
  if (run(t, stop) != 0) {
    show_log(t, "commands.log");
    return -1;
  }
  t->running = false;
  return 0;
}

int pgtest_restart_server(pgtest *t) { return server_start(t); }

void pgtest_destroy(pgtest *t)
{
  if (t->guard_fd >= 0)
    close(t->guard_fd);         /* the guard stops the server and removes the directory */
  t->guard_fd = -1;
  if (t->guard > 0) {
    int st;
    while (waitpid(t->guard, &st, 0) < 0 && errno == EINTR)
      ;
  }
  t->guard = -1;
  t->running = false;
}

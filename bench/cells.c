/*
 * bench/cells.c — what a cell costs in each provider that passes here, end to end
 * through the verified client (libplimsoll: HTTP, JSON, digests, chain checks):
 *   - warm Python and JavaScript trivial cells (`1`) in one session: p50 / p95, once
 *     reading the clock in its sandbox is no system call (gVisor's first second; see
 *     settle_clock);
 *   - the first cells of warm sessions after a pause of 10 s (between a conversation's
 *     turns), each session's first and the four after it;
 *   - open + first cell, cold (--pool 0) and from the warm pool;
 *   - what the pool's members use of a core while they wait (idle_cpu);
 *   - the floor: the same trivial cell sent straight to the same kernel, started as a
 *     sandbox's supervisor starts it (kernels.h: the kernels and flags sandboxd
 *     carries), over FIFOs, with no daemon, no HTTP and no sandbox; and the ratios to it.
 *   - the data stack (issue 16): in a fresh session from the warm pool, the first
 *     `import numpy` and the first import of NumPy, SciPy, pandas and matplotlib.pyplot
 *     (Agg), the Python kernel's VmRSS without them, after numpy and after all four, a
 *     trivial cell's latency with numpy imported and without, and the first numpy cell
 *     when an import cell was sent right after the open (a preloading pool's prototype);
 *     also the daemon's own start-up check of the data stack, from its log.
 * The daemons of the other figures run with --no-data-stack-check: its import in the
 * background would share the CPU with what they measure.
 * The echo provider comes last: it runs no code, so its figures are the protocol's own
 * cost (client, HTTP, records).  Run from the repository root (`make bench`).  BENCH_PROVIDERS=bwrap limits the run;
 * BENCH_WARM=N sets the warm samples per language (default 300).  BENCH_JSON=PATH also
 * writes every distribution there, samples and all (bench/benchjson.h).
 */
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "benchclock.h"
#include "benchjson.h"
#include "kernels.h"
#include "plimsoll.h"
#include "sbxproc.h"

#define WAIT_MS 60000
#define OPEN_SAMPLES 5                 /* cold: each starts a sandbox (0.06-0.7 s) */
#define POOLED_SAMPLES 16              /* a pooled p50 of 5 moved by 20-30 % run to run */
#define POOL_SIZE 2
#define STACK_SAMPLES 5
#define STACK_WARM 20                  /* trivial cells per session, with numpy or without */
#define PAUSE_SESSIONS 6
#define PAUSE_S 10                     /* past V8's memory reducer's 8 s (docs/performance.md §3) */
#define PAUSE_CELLS 5                  /* a session's cells after the pause, each language */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Percentile with linear interpolation over sorted samples. */
static double pct(double *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, cmp_double);
    double at = p * (double)(n - 1);
    size_t i = (size_t)at;
    double f = at - (double)i;
    return i + 1 < n ? v[i] * (1 - f) + v[i + 1] * f : v[i];
}

static void fatal(plm_error *e, const char *what)
{
    if (e) {
        fprintf(stderr, "bench/cells: %s: [%s] %s\n", what, plm_code_name(e->code), e->message);
        exit(1);
    }
}

static plm_client *client(const sbx_proc *d)
{
    plm_client *c = NULL;
    fatal(sbx_client_new(d, &c), "client");
    return c;
}

/* A cell that must run cleanly; its stdout (malloc'd). */
static char *cell_out(plm_session *s, const char *lang, const char *code)
{
    plm_cell cl = {lang, code, NULL, 0};
    plm_result *r = NULL;
    fatal(plm_session_run_cell_sync(s, &cl, NULL, &r), "cell");
    if (r->exit_code != 0) {
        fprintf(stderr, "bench/cells: a %s cell failed: %s\n", lang, r->stderr_text);
        exit(1);
    }
    char *out = strdup(r->stdout_text);
    plm_result_free(r);
    return out;
}

static void run_cell(plm_session *s, const char *lang, const char *code)
{
    free(cell_out(s, lang, code));
}

static void close_session(plm_session *s)
{
    plm_close_summary *sum = NULL;
    plm_error_free(plm_session_close_sync(s, &sum));
    plm_close_summary_free(sum);
    plm_session_free(s);
}

static size_t log_count(const sbx_proc *d, const char *needle)
{
    char *log = sbx_read_log(d);
    size_t n = 0;
    for (const char *at = log; at && (at = strstr(at, needle)); at += strlen(needle))
        n++;
    free(log);
    return n;
}

/* Bounded wait on the daemon's log: `needle` more than `than` times. */
static int wait_log(const sbx_proc *d, const char *needle, size_t than)
{
    for (double end = now_ms() + WAIT_MS; now_ms() < end;) {
        if (log_count(d, needle) > than)
            return 0;
        poll(NULL, 0, 10);
    }
    return -1;
}

/* ---------------------------------------------------------------- the floor */

/* n bytes from fd, waiting for them when the FIFO is non-blocking (Node makes its
 * stdout and stderr so, and these file descriptions are the ones it holds). */
static int read_full(int fd, unsigned char *p, size_t n)
{
    for (size_t got = 0; got < n;) {
        ssize_t k = read(fd, p + got, n - got);
        if (k < 0 && errno == EAGAIN) {
            struct pollfd pf = {fd, POLLIN, 0};
            if (poll(&pf, 1, 10000) <= 0)
                return -1;
            continue;
        }
        if (k <= 0)
            return -1;
        got += (size_t)k;
    }
    return 0;
}

static int read_frame(int fd, unsigned char *body, size_t cap, size_t *len)
{
    unsigned char head[4];
    if (read_full(fd, head, sizeof head) != 0)
        return -1;
    *len = (size_t)head[0] | (size_t)head[1] << 8 | (size_t)head[2] << 16 | (size_t)head[3] << 24;
    if (*len > cap)
        return -1;
    return read_full(fd, body, *len);
}

/* What a kernel's stdout and stderr hold now, dropped.  Through poll: the kernel makes
 * them blocking (kernel.py), and these FIFOs' file descriptions are the ones it holds. */
static void drain(int out, int err)
{
    char junk[256];
    struct pollfd pf[2] = {{out, POLLIN, 0}, {err, POLLIN, 0}};
    while (poll(pf, 2, 0) > 0)
        for (int k = 0; k < 2; k++)
            if (pf[k].revents && (!(pf[k].revents & POLLIN) ||
                                  read(pf[k].fd, junk, sizeof junk) <= 0))
                pf[k].fd = -1;
}

/* A cell's end on a kernel's stderr: its end mark (nothing else is there for a trivial
 * cell), then the end reply frame the kernel writes with it (docs/daemon.md §5.3). */
static int read_end(int fd, unsigned char *body, size_t cap, size_t *len)
{
    unsigned char mark[34];
    if (read_full(fd, mark, sizeof mark) != 0 || mark[0] != 0x1f || mark[sizeof mark - 1] != 0x1e)
        return -1;
    return read_frame(fd, body, cap, len);
}

/* p50 of a trivial cell sent straight to a bare kernel over FIFOs; 0 when unavailable.
 * *dist gets the samples' distribution (NULL when unavailable). */
static double floor_ms(const char *lang, int samples, json_t **dist)
{
    *dist = NULL;
    bool py = strcmp(lang, "python") == 0;
    char dir[] = "/tmp/bench-floor.XXXXXX";
    if (!mkdtemp(dir))
        return 0;
    char prefix[64], path[80];
    snprintf(prefix, sizeof prefix, "%s/k", dir);
    const char *token = "0123456789abcdef0123456789abcdef";
    const char *argv[24];
    /* the supervisor's command line (kernels.h), less Node's heap limit */
    if (!sbx_kernel_argv(argv, sizeof argv / sizeof *argv, py,
                         py ? "/usr/bin/python3" : "/usr/bin/node", NULL, prefix, token)) {
        rmdir(dir);
        return 0;
    }
    const char *names[] = {"req", "rep", "out", "err"};
    int fd[4];
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s-%s", prefix, names[i]);
        mkfifo(path, 0600);
        fd[i] = open(path, O_RDWR | O_CLOEXEC);
    }
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[2], 1);
        dup2(fd[3], 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    unsigned char body[128];
    size_t len;
    double result = 0;
    if (read_frame(fd[1], body, sizeof body, &len) == 0 && body[0] == 'R') {
        drain(fd[2], fd[3]);      /* what the start wrote (Node's warnings on stderr) */
        double *v = calloc((size_t)samples, sizeof *v);
        unsigned char req[4 + 32 + 1];
        req[0] = 33;
        req[1] = req[2] = req[3] = 0;
        memcpy(req + 4, token, 32);
        req[36] = '1';
        int good = 1;
        for (int i = 0; i < samples + samples / 5 && good; i++) {
            double t0 = now_ms();
            if (write(fd[0], req, sizeof req) != (ssize_t)sizeof req ||
                read_end(fd[3], body, sizeof body, &len) != 0 || body[0] != 'D') {
                good = 0;
                break;
            }
            drain(fd[2], fd[3]);
            if (i >= samples / 5) /* the first fifth warms the interpreter up */
                v[i - samples / 5] = now_ms() - t0;
        }
        if (good) {
            result = pct(v, (size_t)samples, 0.5);
            *dist = bj_dist(v, (size_t)samples, "ms", true);
        }
        free(v);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    for (int i = 0; i < 4; i++) {
        close(fd[i]);
        snprintf(path, sizeof path, "%s-%s", prefix, names[i]);
        unlink(path);
    }
    rmdir(dir);
    return result;
}

/* ---------------------------------------------------------------- one provider */

static int start(sbx_proc *d, const char *provider, const char *pool)
{
    const char *args[] = {"--provider", provider, "--pool", pool, "--max-sessions", "16",
                          "--no-data-stack-check", NULL};
    return sbx_start(d, args);
}

/* Prints the figures and sets lang[key] to the distribution. */
static void report(json_t *lang, const char *key, const char *what, double *v, size_t n,
                   double floor)
{
    double p50 = pct(v, n, 0.5), p95 = pct(v, n, 0.95);
    json_object_set_new(lang, key, bj_dist(v, n, "ms", true));
    if (floor > 0)
        bj_fig(lang, "warm_to_floor", p50 / floor, "x");
    printf("  %-36s p50 %8.3f  p95 %8.3f ms", what, p50, p95);
    if (floor > 0)
        printf("   floor %.3f ms, %.1fx", floor, p50 / floor);
    printf("   (n=%zu)\n", n);
}

/* ---------------------------------------------------------------- the data stack */

static const char stack_import[] =
    "import numpy, scipy, pandas, matplotlib\n"
    "matplotlib.use('Agg')\n"
    "import matplotlib.pyplot";
static const char rss_kb[] =
    "int(open('/proc/self/status').read().split('VmRSS:')[1].split()[0])";
static const char numpy_cell[] = "import numpy as np\nint(np.arange(10).sum())";

static double ms_of(plm_session *s, const char *code)
{
    double t0 = now_ms();
    run_cell(s, "python", code);
    return now_ms() - t0;
}

static double rss_mib(plm_session *s)
{
    char *out = cell_out(s, "python", rss_kb);
    double kb = atof(out);
    free(out);
    return kb / 1024;
}

/* A trivial cell's latency, STACK_WARM times, into v[at..]. */
static void trivial_cells(plm_session *s, double *v, size_t at)
{
    run_cell(s, "python", "1");
    for (int i = 0; i < STACK_WARM; i++)
        v[at + (size_t)i] = ms_of(s, "1");
}

/* Waits, in the session's sandbox, until reading its clock is no system call.  gVisor
 * calibrates its clock against the host's for about a second after its sentry starts
 * (two samples a second apart); until then its vDSO falls back to the system call, a
 * ptrace stop on this platform, and every clock read of a cell pays one: Python's
 * buffered streams read it when they flush, Node at each turn of its loop and each
 * compile.  A conversation's sandbox lives for minutes, so the warm figures are taken
 * after that second; the pooled ones keep it (a claimed member may be younger).
 * Bounded at 5 s.  Prints and records how long the wait was. */
static const char settle_code[] =
    "import time\n"
    "def per_read():\n"
    "    t = time.perf_counter_ns()\n"
    "    for _ in range(200):\n"
    "        time.monotonic_ns()\n"
    "    return (time.perf_counter_ns() - t) / 200\n"
    "t0, first = time.monotonic(), per_read()\n"
    "while per_read() > 2000 and time.monotonic() - t0 < 5:\n"
    "    time.sleep(0.05)\n"
    "print(int(per_read() <= 2000), time.monotonic() - t0, first)\n";

static void settle_clock(plm_session *s, json_t *out)
{
    double opened = now_ms();
    char *said = cell_out(s, "python", settle_code);
    int settled = 0;
    double waited = 0, first_ns = 0;
    sscanf(said, "%d %lf %lf", &settled, &waited, &first_ns);
    free(said);
    json_t *o = bj_obj(out, "clock_settle");
    json_object_set_new(o, "settled", json_boolean(settled));
    bj_fig(o, "waited", waited, "s");
    bj_fig(o, "first_clock_read", first_ns, "ns");
    printf("  the sandbox's clock: a read %.0f ns at first; %s after %.2f s more "
           "(%.2f s with the interpreter's start)\n", first_ns,
           settled ? "no system call" : "STILL A SYSTEM CALL", waited,
           (now_ms() - opened) / 1e3);
}

/* ---------------------------------------------------------------- idle sandboxes */

#define IDLE_SECONDS 5.0
#define MAX_TREE 4096

/* The processes below `root` (and root): /proc read once, each process's parent taken
 * from its stat line (after the command name's closing parenthesis). */
static size_t process_tree(pid_t root, pid_t *out, size_t cap)
{
    static pid_t pid[MAX_TREE], parent[MAX_TREE];
    size_t n = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d)) && n < MAX_TREE) {
        char path[300], line[512];
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t len = fread(line, 1, sizeof line - 1, f);
        fclose(f);
        line[len] = '\0';
        const char *close_paren = strrchr(line, ')');
        int ppid;
        if (close_paren && sscanf(close_paren + 2, "%*c %d", &ppid) == 1) {
            pid[n] = (pid_t)atoi(e->d_name);
            parent[n++] = (pid_t)ppid;
        }
    }
    if (d)
        closedir(d);
    size_t k = 0;
    out[k++] = root;
    for (size_t at = 0; at < k; at++) /* breadth first: children of out[at] */
        for (size_t i = 0; i < n && k < cap; i++)
            if (parent[i] == out[at])
                out[k++] = pid[i];
    return k;
}

/* What sandboxd and `members` idle pool members (their sandboxes, supervisors and
 * started kernels) use of a core, in %, over IDLE_SECONDS: each process's CPU from the
 * scheduler's count, for the processes there at both ends (none starts or ends while
 * all idle).  Held sandboxes are what a host with many conversations pays for. */
static void idle_cpu(json_t *out, const sbx_proc *d, size_t members)
{
    static pid_t tree[MAX_TREE];
    static double before[MAX_TREE];
    size_t n = process_tree(d->pid, tree, MAX_TREE);
    for (size_t i = 0; i < n; i++)
        before[i] = bh_cpu_of(tree[i]);
    struct timespec ts = {(time_t)IDLE_SECONDS, 0};
    nanosleep(&ts, NULL);
    double used = 0;
    for (size_t i = 0; i < n; i++) {
        double now = bh_cpu_of(tree[i]);
        if (now >= before[i])  /* false where either is NAN: gone */
            used += now - before[i];
    }
    double pct = 100 * used / IDLE_SECONDS;
    json_t *o = bj_obj(out, "idle");
    bj_fig(o, "sandboxes", (double)members, "sandboxes");
    bj_fig(o, "processes", (double)n, "processes");
    bj_fig(o, "cpu", pct, "% of a core");
    bj_fig(o, "cpu_per_sandbox", pct / (double)members, "% of a core");
    printf("  idle: sandboxd and %zu pool members (%zu processes) %.3f %% of a core over "
           "%.0f s, %.3f %% a sandbox\n", members, n, pct, IDLE_SECONDS, pct / (double)members);
}

/* A session from a full pool: waits (bounded, on the daemon's log) for `*ready` + POOL_SIZE
 * members to have become ready, so the open claims a warm sandbox. */
static plm_session *pooled(const sbx_proc *d, plm_client *c, size_t *ready)
{
    if (wait_log(d, "warm pool: sandbox", POOL_SIZE + *ready - 1) != 0) {
        fprintf(stderr, "bench/cells: the warm pool did not fill\n");
        exit(1);
    }
    (*ready)++;
    plm_session *s = NULL;
    fatal(plm_open_session_sync(c, NULL, &s), "open");
    return s;
}

/* The daemon's own check: "... in a sandbox in X s (Y s with the sandbox's start)". */
static void check_seconds(const sbx_proc *d, double *import_s, double *all_s)
{
    char *log = sbx_read_log(d);
    const char *at = log ? strstr(log, "imported in a sandbox in ") : NULL;
    *import_s = *all_s = 0;
    if (at)
        sscanf(at, "imported in a sandbox in %lf s (%lf s", import_s, all_s);
    free(log);
}

static void bench_data_stack(json_t *out, const char *name)
{
    sbx_proc d;
    const char *args[] = {"--provider", name, "--pool", "2", "--max-sessions", "16", NULL};
    if (sbx_start(&d, args) != 0)
        return;
    json_t *o = bj_obj(out, "data_stack");
    /* The start-up check first, alone: it would share the CPU with what follows. */
    if (wait_log(&d, "data stack", 0) != 0 || log_count(&d, "imported in a sandbox") == 0) {
        printf("  the daemon's data stack check did not pass: see its log\n");
        sbx_stop(&d);
        return;
    }
    double check_import, check_all;
    check_seconds(&d, &check_import, &check_all);
    bj_fig(o, "startup_check_import", check_import * 1000, "ms");
    bj_fig(o, "startup_check_with_sandbox", check_all * 1000, "ms");
    plm_client *c = client(&d);
    size_t ready = 0;
    double numpy_first[STACK_SAMPLES], stack_first[STACK_SAMPLES], preloaded[STACK_SAMPLES],
        preload[STACK_SAMPLES];
    double rss_none[STACK_SAMPLES], rss_numpy[STACK_SAMPLES], rss_stack[STACK_SAMPLES];
    double *warm_none = calloc(STACK_SAMPLES * STACK_WARM, sizeof(double));
    double *warm_numpy = calloc(STACK_SAMPLES * STACK_WARM, sizeof(double));
    for (int i = 0; i < STACK_SAMPLES; i++) {
        size_t at = (size_t)i * STACK_WARM;
        /* nothing imported: the kernel's size, trivial cells */
        plm_session *s = pooled(&d, c, &ready);
        rss_none[i] = rss_mib(s);
        trivial_cells(s, warm_none, at);
        close_session(s);
        /* the first `import numpy`, then the same with numpy in the kernel */
        s = pooled(&d, c, &ready);
        numpy_first[i] = ms_of(s, "import numpy");
        rss_numpy[i] = rss_mib(s);
        trivial_cells(s, warm_numpy, at);
        close_session(s);
        /* the whole stack */
        s = pooled(&d, c, &ready);
        stack_first[i] = ms_of(s, stack_import);
        rss_stack[i] = rss_mib(s);
        close_session(s);
        /* a preloading pool's prototype: the import right after the open, then the
         * session's first numpy cell */
        s = pooled(&d, c, &ready);
        preload[i] = ms_of(s, "import numpy");
        preloaded[i] = ms_of(s, numpy_cell);
        close_session(s);
    }
    plm_client_free(c);
    sbx_stop(&d);
    printf("  data stack: the daemon's start-up check imported it in %.0f ms (%.0f ms with "
           "its sandbox's start)\n", check_import * 1000, check_all * 1000);
    report(o, "first_import_numpy", "first `import numpy`, pooled session", numpy_first,
           STACK_SAMPLES, 0);
    report(o, "first_import_stack", "first import of all four", stack_first, STACK_SAMPLES, 0);
    report(o, "preload_import_numpy", "preload: `import numpy` after open", preload,
           STACK_SAMPLES, 0);
    report(o, "first_numpy_cell_preloaded", "first numpy cell, numpy preloaded", preloaded,
           STACK_SAMPLES, 0);
    report(o, "warm_cell_without_numpy", "trivial python cell, no numpy", warm_none,
           STACK_SAMPLES * STACK_WARM, 0);
    report(o, "warm_cell_with_numpy", "trivial python cell, numpy imported", warm_numpy,
           STACK_SAMPLES * STACK_WARM, 0);
    double none = pct(rss_none, STACK_SAMPLES, 0.5), numpy = pct(rss_numpy, STACK_SAMPLES, 0.5),
           stack = pct(rss_stack, STACK_SAMPLES, 0.5);
    bj_fig(o, "kernel_rss_none", none, "MiB");
    bj_fig(o, "kernel_rss_numpy", numpy, "MiB");
    bj_fig(o, "kernel_rss_stack", stack, "MiB");
    printf("  %-36s %.1f MiB, with numpy %.1f MiB (+%.1f), with all four %.1f MiB (+%.1f)\n",
           "python kernel VmRSS (p50)", none, numpy, numpy - none, stack, stack - none);
    free(warm_none);
    free(warm_numpy);
}

/* Between a conversation's turns its sandbox waits while the model thinks and the user
 * types: seconds to minutes.  Warm sessions, all paused at once, then each one's cells
 * of each language in turn: the first after the pause pays the machine's wake-up (§1 of
 * docs/performance.md), and what an interpreter does after a pause shows in the four
 * after it. */
static void bench_pause(json_t *lj[2], plm_client *c, const char *const langs[2])
{
    plm_session *s[PAUSE_SESSIONS];
    for (int i = 0; i < PAUSE_SESSIONS; i++) {
        fatal(plm_open_session_sync(c, NULL, &s[i]), "open");
        for (int l = 0; l < 2; l++)
            for (int k = 0; k < 20; k++)
                run_cell(s[i], langs[l], "1");
    }
    struct timespec pause = {PAUSE_S, 0};
    nanosleep(&pause, NULL);
    double first[2][PAUSE_SESSIONS], next[2][PAUSE_SESSIONS * (PAUSE_CELLS - 1)];
    for (int i = 0; i < PAUSE_SESSIONS; i++)
        for (int l = 0; l < 2; l++)
            for (int k = 0; k < PAUSE_CELLS; k++) {
                double t0 = now_ms();
                run_cell(s[i], langs[l], "1");
                double t = now_ms() - t0;
                if (k == 0)
                    first[l][i] = t;
                else
                    next[l][i * (PAUSE_CELLS - 1) + (size_t)k - 1] = t;
            }
    for (int i = 0; i < PAUSE_SESSIONS; i++)
        close_session(s[i]);
    for (int l = 0; l < 2; l++) {
        char what[64];
        snprintf(what, sizeof what, "first %s cell after a %d s pause", langs[l], PAUSE_S);
        report(lj[l], "paused_first", what, first[l], PAUSE_SESSIONS, 0);
        snprintf(what, sizeof what, "  the %d after it", PAUSE_CELLS - 1);
        report(lj[l], "paused_next", what, next[l], PAUSE_SESSIONS * (PAUSE_CELLS - 1), 0);
    }
}

static void bench_provider(json_t *providers, const char *name, int warm)
{
    sbx_proc d;
    json_t *out = bj_obj(providers, name);
    if (start(&d, name, "0") != 0) {
        printf("provider %s: not available here (its smoke test failed; see above)\n", name);
        json_object_set_new(out, "available", json_false());
        return;
    }
    plm_client *c = client(&d);
    plm_info *info = NULL;
    fatal(plm_describe_sync(c, &info), "describe");
    bool echo = strcmp(name, "echo") == 0;
    json_object_set_new(out, "available", json_true());
    json_object_set_new(out, "tier", json_string(info->isolation));
    json_object_set_new(out, "runs_code", json_boolean(!echo));
    printf("provider %s (tier %s)%s\n", name, info->isolation,
           echo ? ": runs no code, the protocol's own cost (client, HTTP, records)" : "");
    plm_info_free(info);
    const char *langs[] = {"python", "javascript"};
    json_t *lj[2] = {bj_obj(out, "python"), bj_obj(out, "javascript")};
    double floor[2] = {0, 0};
    for (int l = 0; l < 2 && !echo; l++) {
        json_t *fd = NULL;
        floor[l] = floor_ms(langs[l], warm, &fd);
        if (fd)
            json_object_set_new(lj[l], "floor", fd);
    }

    /* Warm trivial cells in one session. */
    plm_session *s = NULL;
    fatal(plm_open_session_sync(c, NULL, &s), "open");
    if (!echo)
        settle_clock(s, out);
    double *v = calloc((size_t)warm, sizeof *v);
    for (int l = 0; l < 2; l++) {
        for (int i = 0; i < warm / 5 + 5; i++) /* start and warm the interpreter up */
            run_cell(s, langs[l], "1");
        for (int i = 0; i < warm; i++) {
            double t0 = now_ms();
            run_cell(s, langs[l], "1");
            v[i] = now_ms() - t0;
        }
        char what[64];
        snprintf(what, sizeof what, "warm %s cell", langs[l]);
        report(lj[l], "warm", what, v, (size_t)warm, floor[l]);
    }
    close_session(s);
    if (!echo)
        bench_pause(lj, c, langs);

    /* Open + first cell with no pool: the sandbox and the interpreter start. */
    double cold[2][OPEN_SAMPLES];
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < OPEN_SAMPLES; i++) {
            double t0 = now_ms();
            fatal(plm_open_session_sync(c, NULL, &s), "open");
            run_cell(s, langs[l], "1");
            cold[l][i] = now_ms() - t0;
            close_session(s);
        }
    plm_client_free(c);
    sbx_stop(&d);

    /* The same from the warm pool: wait (bounded, on the daemon's log) for the pool to
     * be full before each sample, so every open claims a warm sandbox. */
    double pooled[2][POOLED_SAMPLES], pooled_open[2][POOLED_SAMPLES];
    int have_pool = !echo && start(&d, name, "2") == 0;
    if (have_pool) {
        c = client(&d);
        size_t ready = 0;
        for (int i = 0; i < POOLED_SAMPLES && have_pool; i++)
            for (int l = 0; l < 2 && have_pool; l++) {
                /* Members become ready: POOL_SIZE at start, one more after each claim. */
                size_t want = POOL_SIZE + ready;
                if (wait_log(&d, "warm pool: sandbox", want - 1) != 0) {
                    have_pool = 0;
                    break;
                }
                ready++;
                double t0 = now_ms();
                fatal(plm_open_session_sync(c, NULL, &s), "open");
                double t1 = now_ms();
                run_cell(s, langs[l], "1");
                pooled[l][i] = now_ms() - t0;
                pooled_open[l][i] = t1 - t0;
                close_session(s);
            }
        /* Then idle: the pool full again, the last member's start over (1 s). */
        if (have_pool && wait_log(&d, "warm pool: sandbox", POOL_SIZE + ready - 1) == 0) {
            struct timespec settle = {1, 0};
            nanosleep(&settle, NULL);
            idle_cpu(out, &d, POOL_SIZE);
        }
        plm_client_free(c);
        sbx_stop(&d);
    }
    for (int l = 0; l < 2; l++) {
        char what[64];
        snprintf(what, sizeof what, "open + first %s cell, cold", langs[l]);
        report(lj[l], "cold_open_first", what, cold[l], OPEN_SAMPLES, 0);
        if (have_pool) {
            snprintf(what, sizeof what, "open + first %s cell, pooled", langs[l]);
            report(lj[l], "pooled_open_first", what, pooled[l], POOLED_SAMPLES, 0);
            snprintf(what, sizeof what, "  of which the open (a claim)");
            report(lj[l], "pooled_claim", what, pooled_open[l], POOLED_SAMPLES, 0);
        }
    }
    free(v);
    if (!echo)
        bench_data_stack(lj[0], name);
}

static const char usage[] =
    "usage: cells [--help]\n"
    "Trivial cells end to end through the verified client, on each provider that works\n"
    "here: warm cells, cold and pooled opens, an idle pool's CPU, the data stack.\n"
    "  BENCH_PROVIDERS  the providers to run (a list: gvisor bwrap process echo)\n"
    "  BENCH_WARM       warm cells a language (more than 10; default 300)\n"
    "  BENCH_JSON       where to write the figures as JSON (bench/benchjson.h)\n";

int main(int argc, char **argv)
{
    if (argc > 1) {             /* no options but --help: a mistyped one must not run it */
        bool help = argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"));
        fputs(usage, help ? stdout : stderr);
        return help ? 0 : 2;
    }
    plm_global_init();
    signal(SIGPIPE, SIG_IGN);
    const char *only = getenv("BENCH_PROVIDERS");
    const char *w = getenv("BENCH_WARM");
    int warm = w && atoi(w) > 10 ? atoi(w) : 300;
    printf("bench/cells: trivial cells end to end through the verified client\n");
    json_t *out = bj_new("cells");
    bj_param(out, "warm_samples", json_integer(warm));
    bj_param(out, "open_samples", json_integer(OPEN_SAMPLES));
    bj_param(out, "pooled_samples", json_integer(POOLED_SAMPLES));
    bj_param(out, "pool", json_integer(POOL_SIZE));
    bj_param(out, "cell", json_string("1"));
    json_t *by = bj_obj(out, "providers");
    const char *providers[] = {"gvisor", "bwrap", "process", "echo"};
    for (size_t i = 0; i < sizeof providers / sizeof providers[0]; i++)
        if (!only || strstr(only, providers[i]))
            bench_provider(by, providers[i], warm);
    return bj_write(out) ? 1 : 0;
}

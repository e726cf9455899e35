/*
 * bench/cells.c — what a cell costs in each provider that passes here, end to end
 * through the verified client (libplimsoll: HTTP, JSON, digests, chain checks):
 *   - warm Python and JavaScript trivial cells (`1`) in one session: p50 / p95;
 *   - open + first cell, cold (--pool 0) and from the warm pool;
 *   - the floor: the same trivial cell sent straight to the same kernel
 *     (sandboxd/inside/kernels/kernel.py and kernel.js, read from the source tree) over FIFOs,
 *     with no daemon, no HTTP and no sandbox; and the ratios to it.
 * The echo provider comes last: it runs no code, so its figures are the protocol's own
 * cost (client, HTTP, records).  Run from the repository root (`make bench`).  BENCH_PROVIDERS=bwrap limits the run;
 * BENCH_WARM=N sets the warm samples per language (default 300).  BENCH_JSON=PATH also
 * writes every distribution there, samples and all (bench/benchjson.h).
 */
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

#include "benchjson.h"
#include "plimsoll.h"
#include "sbxproc.h"

#define WAIT_MS 60000
#define OPEN_SAMPLES 5
#define POOL_SIZE 2

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
    plm_client_options o;
    plm_client_options_init(&o);
    o.base_url = d->url;
    o.token = d->token;
    plm_client *c = NULL;
    fatal(plm_client_new(NULL, &o, &c), "client");
    return c;
}

static void run_cell(plm_session *s, const char *lang, const char *code)
{
    plm_cell cl = {lang, code, NULL, 0};
    plm_result *r = NULL;
    fatal(plm_session_run_cell_sync(s, &cl, NULL, &r), "cell");
    if (r->exit_code != 0) {
        fprintf(stderr, "bench/cells: a %s cell failed: %s\n", lang, r->stderr_text);
        exit(1);
    }
    plm_result_free(r);
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

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return NULL;
    }
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static int read_frame(int fd, unsigned char *body, size_t cap, size_t *len)
{
    unsigned char head[4];
    size_t got = 0;
    while (got < 4) {
        ssize_t n = read(fd, head + got, 4 - got);
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    *len = (size_t)head[0] | (size_t)head[1] << 8 | (size_t)head[2] << 16 | (size_t)head[3] << 24;
    if (*len > cap)
        return -1;
    for (got = 0; got < *len;) {
        ssize_t n = read(fd, body + got, *len - got);
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

/* p50 of a trivial cell sent straight to a bare kernel over FIFOs; 0 when unavailable.
 * *dist gets the samples' distribution (NULL when unavailable). */
static double floor_ms(const char *lang, int samples, json_t **dist)
{
    *dist = NULL;
    bool py = strcmp(lang, "python") == 0;
    char *kernel = slurp(py ? "sandboxd/inside/kernels/kernel.py" : "sandboxd/inside/kernels/kernel.js");
    if (!kernel)
        return 0;
    char dir[] = "/tmp/bench-floor.XXXXXX";
    if (!mkdtemp(dir)) {
        free(kernel);
        return 0;
    }
    char prefix[64], path[80];
    snprintf(prefix, sizeof prefix, "%s/k", dir);
    const char *names[] = {"req", "rep", "out", "err"};
    int fd[4];
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s-%s", prefix, names[i]);
        mkfifo(path, 0600);
        fd[i] = open(path, O_RDWR | O_CLOEXEC);
    }
    const char *token = "0123456789abcdef0123456789abcdef";
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[2], 1);
        dup2(fd[3], 2);
        if (py)
            execl("/usr/bin/python3", "python3", "-I", "-c", kernel, prefix, token, (char *)NULL);
        else
            execl("/usr/bin/node", "node", "--expose-internals", "--experimental-vm-modules",
                  "-e", kernel, prefix, token, (char *)NULL);
        _exit(127);
    }
    unsigned char body[128];
    size_t len;
    double result = 0;
    fcntl(fd[2], F_SETFL, O_NONBLOCK);
    if (read_frame(fd[1], body, sizeof body, &len) == 0 && body[0] == 'R') {
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
                read_frame(fd[1], body, sizeof body, &len) != 0 || body[0] != 'D') {
                good = 0;
                break;
            }
            char junk[256];
            while (read(fd[2], junk, sizeof junk) > 0) {
            }
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
    free(kernel);
    return result;
}

/* ---------------------------------------------------------------- one provider */

static int start(sbx_proc *d, const char *provider, const char *pool)
{
    const char *args[] = {"--provider", provider, "--pool", pool, "--max-sessions", "16", NULL};
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
    double pooled[2][OPEN_SAMPLES], pooled_open[2][OPEN_SAMPLES];
    int have_pool = !echo && start(&d, name, "2") == 0;
    if (have_pool) {
        c = client(&d);
        size_t ready = 0;
        for (int i = 0; i < OPEN_SAMPLES && have_pool; i++)
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
        plm_client_free(c);
        sbx_stop(&d);
    }
    for (int l = 0; l < 2; l++) {
        char what[64];
        snprintf(what, sizeof what, "open + first %s cell, cold", langs[l]);
        report(lj[l], "cold_open_first", what, cold[l], OPEN_SAMPLES, 0);
        if (have_pool) {
            snprintf(what, sizeof what, "open + first %s cell, pooled", langs[l]);
            report(lj[l], "pooled_open_first", what, pooled[l], OPEN_SAMPLES, 0);
            snprintf(what, sizeof what, "  of which the open (a claim)");
            report(lj[l], "pooled_claim", what, pooled_open[l], OPEN_SAMPLES, 0);
        }
    }
    free(v);
}

int main(void)
{
    plm_global_init();
    signal(SIGPIPE, SIG_IGN);
    const char *only = getenv("BENCH_PROVIDERS");
    const char *w = getenv("BENCH_WARM");
    int warm = w && atoi(w) > 10 ? atoi(w) : 300;
    printf("bench/cells: trivial cells end to end through the verified client\n");
    json_t *out = bj_new("cells");
    bj_param(out, "warm_samples", json_integer(warm));
    bj_param(out, "open_samples", json_integer(OPEN_SAMPLES));
    bj_param(out, "pool", json_integer(POOL_SIZE));
    bj_param(out, "cell", json_string("1"));
    json_t *by = bj_obj(out, "providers");
    const char *providers[] = {"gvisor", "bwrap", "process", "echo"};
    for (size_t i = 0; i < sizeof providers / sizeof providers[0]; i++)
        if (!only || strstr(only, providers[i]))
            bench_provider(by, providers[i], warm);
    return bj_write(out) ? 1 : 0;
}

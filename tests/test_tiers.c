/*
 * test_tiers.c — what each real provider promises about the host it shares (issue 11,
 * items 5, 6, 7 and 10), asserted with the attacks that broke it:
 *
 *   T05  removing a closed session's work directory follows no path a guest can change
 *        (process tier: another session swaps a directory of the tree for a link to a
 *        root-owned directory outside while it is removed; nothing outside goes);
 *   T06  no two live sandboxes share a uid, in one daemon or in two, and a cell cannot
 *        read another sandbox's secret through /proc/PID/mem or /proc/PID/environ;
 *   T07  every language meets --memory-mb: allocating far more ends out of memory (the
 *        record's stderr says so) and the sandbox's memory stays near the limit;
 *   T10  a daemon leaves no cgroup directory behind, after SIGTERM or after SIGKILL and
 *        the next start.
 *
 * Each provider's tests run in their own group against one daemon; a provider whose
 * start-up smoke test fails here is skipped with the reason.  BERTH_TEST_PROVIDERS and
 * TEST_FILTER work as in test_providers.c.  Needs root for the uid, cgroup and
 * root-owned-file assertions (sandboxd is root in make test).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "plimsoll.h"
#include "sbxproc.h"

#define MEMORY_MB 256u
#define UID_FIRST 61000u
#define UID_COUNT 1000u
/* gVisor's sentry, its per-task stubs and both interpreters' own pages come on top of
 * what one process may allocate (--memory-mb); bwrap and process are capped exactly. */
#define GVISOR_MARGIN_MB 160u

typedef struct provider {
    const char *name;
    sbx_proc d;
    bool up;
    char skip_why[512];
    plm_client *c;
    char tag[64];                /* d<pid>-<start>: the daemon's cgroups */
} provider;

static provider providers[] = {{.name = "gvisor"}, {.name = "bwrap"}, {.name = "process"}};
static provider *P;

/* ---------------------------------------------------------------- helpers */

static void print_log_tail(const sbx_proc *d)
{
    char *log = sbx_read_log(d);
    if (!log)
        return;
    size_t len = strlen(log);
    print_error("sandboxd's log ends:\n%s\n", len > 3000 ? log + len - 3000 : log);
    free(log);
}

static void ok(plm_error *e)
{
    if (e) {
        if (P && P->up)
            print_log_tail(&P->d);
        print_error("unexpected error [%s]: %s\n", plm_code_name(e->code), e->message);
        plm_error_free(e);
        fail();
    }
}

static void need(void)
{
    if (geteuid() != 0) {
        print_message("skipped: these promises hold when sandboxd is root\n");
        skip();
    }
    if (!P->up) {
        print_message("skipped: provider %s: %s\n", P->name, P->skip_why);
        skip();
    }
}

static plm_client *client_of(const sbx_proc *d)
{
    plm_client *c = NULL;
    ok(sbx_client_new(d, &c));
    return c;
}

static plm_session *open_on(plm_client *c)
{
    plm_session *s = NULL;
    ok(plm_open_session_sync(c, NULL, &s));
    assert_non_null(s);
    return s;
}

static void close_s(plm_session *s)
{
    plm_close_summary *sum = NULL;
    plm_error_free(plm_session_close_sync(s, &sum));
    plm_close_summary_free(sum);
    plm_session_free(s);
}

static plm_result *cell_t(plm_session *s, const char *lang, const char *code, int64_t timeout_ms)
{
    plm_cell cl = {lang, code, NULL, 0};
    plm_run_options o;
    memset(&o, 0, sizeof o);
    o.timeout_ms = timeout_ms;
    plm_result *r = NULL;
    ok(plm_session_run_cell_sync(s, &cl, &o, &r));
    assert_non_null(r);
    return r;
}

/* Runs a cell that must succeed; returns its stdout without the final newline (malloc'd). */
static char *cell_out(plm_session *s, const char *lang, const char *code)
{
    plm_result *r = cell_t(s, lang, code, 30000);
    if (r->exit_code != 0)
        fail_msg("%s cell failed (exit %d): %.800s", lang, r->exit_code, r->stderr_text);
    char *out = strdup(r->stdout_text);
    size_t n = strlen(out);
    if (n && out[n - 1] == '\n')
        out[n - 1] = '\0';
    plm_result_free(r);
    return out;
}

/* The daemon's tag (its cgroups' name): d<pid>-<start time>. */
static void daemon_tag(pid_t pid, char *out, size_t n)
{
    out[0] = '\0';
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f && fgets(buf, sizeof buf, f)) {
        char *rp = strrchr(buf, ')');
        int field = 2;
        for (char *tok = rp ? strtok(rp + 1, " ") : NULL; tok; tok = strtok(NULL, " "))
            if (++field == 22) {
                snprintf(out, n, "d%d-%s", (int)pid, tok);
                break;
            }
    }
    if (f)
        fclose(f);
}

/* ---------------------------------------------------------------- groups */

static int group_setup(void **state)
{
    (void)state;
    const char *args[] = {"--provider", P->name, "--pool", "0", "--max-sessions", "8",
                          "--memory-mb", "256", NULL};
    P->up = false;
    if (sbx_start(&P->d, args) != 0) {
        char *log = sbx_read_log(&P->d);
        const char *why = log ? strstr(log, "failed its smoke test") : NULL;
        if (!why && log)
            why = strstr(log, "would not start");
        snprintf(P->skip_why, sizeof P->skip_why, "%.300s", why ? why : "sandboxd did not start");
        char *nl = strchr(P->skip_why, '\n');
        if (nl)
            *nl = '\0';
        free(log);
        sbx_stop(&P->d);
        return why ? 0 : -1;
    }
    P->c = client_of(&P->d);
    daemon_tag(P->d.pid, P->tag, sizeof P->tag);
    P->up = true;
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    if (P->c)
        plm_client_free(P->c);
    P->c = NULL;
    sbx_stop(&P->d);
    return 0;
}

/* ---------------------------------------------------------------- T06: a uid each */

static unsigned uid_of(plm_session *s)
{
    char *out = cell_out(s, "python", "import os\nprint(os.getuid(), os.getgid())");
    unsigned uid = 0, gid = 0;
    assert_int_equal(sscanf(out, "%u %u", &uid, &gid), 2);
    assert_int_equal(uid, gid);
    free(out);
    if (uid < UID_FIRST || uid >= UID_FIRST + UID_COUNT)
        fail_msg("uid %u is outside the default range %u-%u", uid, UID_FIRST,
                 UID_FIRST + UID_COUNT - 1);
    return uid;
}

static void test_T06_two_live_sandboxes_never_share_a_uid(void **state)
{
    (void)state;
    need();
    plm_session *a = open_on(P->c), *b = open_on(P->c);
    unsigned ua = uid_of(a), ub = uid_of(b);
    if (ua == ub)
        fail_msg("two live sandboxes of %s both run as uid %u", P->name, ua);
    /* A second daemon on the same host (its own provider, the same default range) takes
     * neither: the uids are locked host-wide. */
    sbx_proc d2;
    const char *args[] = {"--provider", "process", "--pool", "0", "--max-sessions", "2", NULL};
    assert_int_equal(sbx_start(&d2, args), 0);
    plm_client *c2 = client_of(&d2);
    plm_session *other = open_on(c2);
    unsigned uo = uid_of(other);
    if (uo == ua || uo == ub)
        fail_msg("a sandbox of a second daemon runs as uid %u, as one of %s's", uo, P->name);
    close_s(other);
    plm_client_free(c2);
    sbx_stop(&d2);
    close_s(a);
    close_s(b);
}

static void test_T06_a_cell_cannot_read_another_sandboxs_memory_or_environ(void **state)
{
    (void)state;
    need();
    unsigned char raw[12];
    assert_int_equal(getrandom(raw, sizeof raw, 0), (ssize_t)sizeof raw);
    char secret[32], code[4096];
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(secret + 2 * i, 3, "%02x", raw[i]);
    plm_session *victim = open_on(P->c), *thief = open_on(P->c);
    /* The victim holds the secret in its interpreter's memory (a process it started
     * would not outlive the sweep after its cell). */
    snprintf(code, sizeof code, "secret = 'SeCrEt' + '%s'\nprint('held')", secret);
    free(cell_out(victim, "python", code));
    /* The thief looks for it in every process it can see: environ, and every writable
     * mapping through /proc/PID/mem (the needle is built at run time, so its own code
     * does not hold it; its own process is skipped). */
    char reversed[32];
    size_t n = strlen(secret);
    for (size_t i = 0; i < n; i++)
        reversed[i] = secret[n - 1 - i];
    reversed[n] = '\0';
    snprintf(code, sizeof code,
             "import os\nneedle = ('%s' + 'tErCeS')[::-1].encode()\n"
             "found, tried = [], 0\n"
             "for pid in os.listdir('/proc'):\n"
             "    if not pid.isdigit() or int(pid) == os.getpid():\n"
             "        continue\n"
             "    try:\n"
             "        if needle in open('/proc/%%s/environ' %% pid, 'rb').read():\n"
             "            found.append(('environ', pid))\n"
             "    except OSError:\n"
             "        pass\n"
             "    try:\n"
             "        maps = open('/proc/%%s/maps' %% pid).read().splitlines()\n"
             "        with open('/proc/%%s/mem' %% pid, 'rb', 0) as mem:\n"
             "            tried += 1\n"
             "            for line in maps:\n"
             "                span, perms = line.split()[:2]\n"
             "                lo, hi = (int(x, 16) for x in span.split('-'))\n"
             "                if 'rw' not in perms or hi - lo > (256 << 20):\n"
             "                    continue\n"
             "                try:\n"
             "                    mem.seek(lo)\n"
             "                    if needle in mem.read(hi - lo):\n"
             "                        found.append(('mem', pid))\n"
             "                        break\n"
             "                except (OSError, ValueError, OverflowError):\n"
             "                    pass\n"
             "    except OSError:\n"
             "        pass\n"
             "print(found)",
             reversed);
    char *out = cell_out(thief, "python", code);
    if (strcmp(out, "[]") != 0)
        fail_msg("a %s cell read another sandbox's secret: %s", P->name, out);
    free(out);
    close_s(thief);
    close_s(victim);
}

/* ---------------------------------------------------------------- T07: memory */

/* The highest peak of any sandbox group of the daemon since the last reset (bytes). */
static uint64_t peak_bytes(bool reset)
{
    char base[256];
    snprintf(base, sizeof base, "/sys/fs/cgroup/memory/berth/%s", P->tag);
    DIR *d = opendir(base);
    assert_non_null(d);
    uint64_t peak = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] != 'b')
            continue;
        char path[600];
        snprintf(path, sizeof path, "%s/%.200s/memory.max_usage_in_bytes", base, e->d_name);
        if (reset) {
            int fd = open(path, O_WRONLY);
            if (fd >= 0) {
                (void)!write(fd, "0", 1);
                close(fd);
            }
            continue;
        }
        FILE *f = fopen(path, "r");
        unsigned long long v = 0;
        if (f && fscanf(f, "%llu", &v) == 1 && v > peak)
            peak = v;
        if (f)
            fclose(f);
    }
    closedir(d);
    return peak;
}

static unsigned long daemon_rss_kb(void)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)P->d.pid);
    FILE *f = fopen(path, "r");
    unsigned long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %lu", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb;
}

/* The bomb `rounds` times in one session: each round in a fresh interpreter (the last
 * one ended), which must be held to the limit as the first was. */
static void memory_bomb(const char *lang, const char *code, int rounds)
{
    need();
    plm_session *s = open_on(P->c);
    for (int round = 1; round <= rounds; round++) {
        free(cell_out(s, lang, "1")); /* the interpreter up before the peak is reset */
        peak_bytes(true);
        plm_result *r = cell_t(s, lang, code, 60000);
        uint64_t peak = peak_bytes(false);
        unsigned long rss = daemon_rss_kb();
        print_message("%s %s, round %d: exit %d, ended %d, sandbox peak %llu MiB, daemon peak "
                      "RSS %lu MiB\n", P->name, lang, round, r->exit_code, r->interpreter_ended,
                      (unsigned long long)(peak >> 20), rss >> 10);
        if (r->exit_code != 1 || r->timed_out)
            fail_msg("round %d: the bomb ended with exit %d (timed out %d), stderr %.600s",
                     round, r->exit_code, r->timed_out, r->stderr_text);
        static const char *const said[] = {"out of memory", "MemoryError", "allocation failed",
                                           "Cannot allocate memory"};
        bool told = false;
        for (size_t i = 0; i < sizeof said / sizeof said[0]; i++)
            told = told || strstr(r->stderr_text, said[i]);
        if (!told)
            fail_msg("round %d: the record does not say out of memory: stderr %.600s", round,
                     r->stderr_text);
        plm_result_free(r);
        uint64_t bound = (uint64_t)(MEMORY_MB + (!strcmp(P->name, "gvisor") ? GVISOR_MARGIN_MB : 0))
                         << 20;
        if (peak > bound)
            fail_msg("round %d: the sandbox's memory reached %llu MiB against --memory-mb %u",
                     round, (unsigned long long)(peak >> 20), MEMORY_MB);
        if (rss > 128 * 1024)
            fail_msg("sandboxd's own peak RSS reached %lu MiB", rss >> 10);
    }
    /* The session goes on (a fresh interpreter when it ended). */
    char *out = cell_out(s, lang, "'after'");
    assert_string_equal(out, "'after'");
    free(out);
    close_s(s);
}

static void test_T07_python_over_the_memory_limit_ends_out_of_memory(void **state)
{
    (void)state;
    memory_bomb("python", "a = []\nwhile True:\n    a.append(bytearray(16 << 20))", 1);
}

static void test_T07_javascript_buffers_over_the_memory_limit_end_out_of_memory(void **state)
{
    (void)state;
    /* Under gVisor no host limit reaches Node's Buffers: the supervisor's memory watch
     * ends the kernel past --memory-mb (sandboxd/inside/supervisor.c).  Twice: the watch
     * reads the second interpreter's size, not the first's (it keeps each one's statm
     * open, and lets it go when that interpreter is reaped). */
    memory_bomb("javascript", "const keep = []; for (;;) keep.push(Buffer.alloc(32 << 20, 1))",
                2);
}

static void test_T07_javascript_heap_over_the_memory_limit_ends_out_of_memory(void **state)
{
    (void)state;
    memory_bomb("javascript", "const keep = []; for (;;) keep.push(new Array(1e6).fill(1.5))",
                1);
}

/* ---------------------------------------------------------------- T05: removal */

#define BAIT_FILES 2000

static size_t count_files(const char *dir)
{
    DIR *d = opendir(dir);
    size_t n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    if (d)
        closedir(d);
    return n;
}

static void test_T05_removing_a_closed_tree_follows_no_link_swapped_in(void **state)
{
    (void)state;
    need();
    if (strcmp(P->name, "process") != 0) {
        print_message("skipped for %s: its work directory is a tmpfs inside the sandbox, "
                      "never removed by path on the host\n", P->name);
        skip();
    }
    /* A root-owned directory outside every sandbox, with files in it. */
    char bait[] = "/tmp/berth-bait-XXXXXX";
    assert_non_null(mkdtemp(bait));
    chmod(bait, 0755);
    for (int i = 0; i < BAIT_FILES; i++) {
        char path[128];
        snprintf(path, sizeof path, "%s/f%d", bait, i);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
        assert_true(fd >= 0);
        close(fd);
    }
    plm_session *victim = open_on(P->c), *thief = open_on(P->c);
    /* The victim builds a tree others may write to (it owns it: its choice): directories
     * whose files bear the bait's names, and says where it is on the host. */
    char *work = cell_out(victim, "python",
                          "import os\nos.chmod('.', 0o777)\n"
                          "for i in range(20):\n"
                          "    d = 'd%d' % i\n"
                          "    os.mkdir(d)\n"
                          "    os.chmod(d, 0o777)\n"
                          "    for j in range(100):\n"
                          "        open(os.path.join(d, 'f%d' % (i * 100 + j)), 'w').close()\n"
                          "print(os.getcwd())");
    /* The thief swaps every directory of it for a link to the bait and back, over and
     * over, until the tree is gone: from a thread of its interpreter, which outlives the
     * cell (the sweep after a call ends other processes, not the interpreter). */
    char code[2048];
    snprintf(code, sizeof code,
             "import ctypes, os, threading\n"
             "libc = ctypes.CDLL(None, use_errno=True)\n"
             "def swap(top, bait):\n"
             "    names = [os.path.join(top, 'd%%d' %% i).encode() for i in range(20)]\n"
             "    for d in names:\n"
             "        os.symlink(bait, d + b'.l')\n"
             "    while os.path.isdir(top):\n"
             "        for d in names:  # renameat2(RENAME_EXCHANGE): a dir and a link trade\n"
             "            libc.renameat2(-100, d, -100, d + b'.l', 2)\n"
             "threading.Thread(target=swap, args=('%s', '%s'), daemon=True).start()\n"
             "print('swapping')",
             work, bait);
    free(cell_out(thief, "python", code));
    close_s(victim);
    /* The tree goes after the close's answer, with the sandbox: waited for (bounded). */
    struct stat st;
    for (int i = 0; i < 1000 && stat(work, &st) == 0; i++)
        poll(NULL, 0, 10);
    bool gone = stat(work, &st) != 0;
    close_s(thief);
    size_t left = count_files(bait);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", bait);
    assert_int_equal(system(cmd), 0);
    if (left != BAIT_FILES)
        fail_msg("removing the closed session's tree deleted %zu of %d root-owned files outside "
                 "it", (size_t)BAIT_FILES - left, BAIT_FILES);
    if (!gone) /* while the thief swapped; nothing else writes there now */
        fail_msg("the closed session's tree %s was not removed in 10 s", work);
    free(work);
}

/* ---------------------------------------------------------------- T10: cgroups */

/* Directories named after `tag` under every hierarchy's berth/. */
static size_t cgroup_dirs_of(const char *tag)
{
    size_t n = 0;
    DIR *root = opendir("/sys/fs/cgroup");
    struct dirent *h;
    while (root && (h = readdir(root))) {
        if (h->d_name[0] == '.')
            continue;
        char path[512];
        snprintf(path, sizeof path, "/sys/fs/cgroup/%s/berth/%s", h->d_name, tag);
        struct stat st;
        if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
            n++;
    }
    if (root)
        closedir(root);
    return n;
}

static const char *strongest_provider(void)
{
    return providers[0].up ? "gvisor" : "bwrap"; /* gVisor's runsc makes the most of them */
}

static void test_T10_a_stopped_daemon_leaves_no_cgroup_directory(void **state)
{
    (void)state;
    if (geteuid() != 0)
        skip();
    const char *args[] = {"--provider", strongest_provider(), "--pool", "1", "--max-sessions",
                          "2", NULL};
    sbx_proc d;
    assert_int_equal(sbx_start(&d, args), 0);
    char tag[64];
    daemon_tag(d.pid, tag, sizeof tag);
    plm_client *c = client_of(&d);
    plm_session *s = open_on(c); /* a sandbox of its own, besides the pool */
    free(cell_out(s, "python", "1"));
    size_t live = cgroup_dirs_of(tag);
    assert_true(live >= 4);
    plm_session_free(s);
    plm_client_free(c);
    int status = sbx_stop_status(&d); /* SIGTERM: the drain */
    assert_true(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    size_t left = cgroup_dirs_of(tag);
    if (left)
        fail_msg("%zu of the daemon's %zu cgroup directories are left after SIGTERM", left, live);
}

static void test_T10_the_next_start_reaps_a_killed_daemons_cgroups(void **state)
{
    (void)state;
    if (geteuid() != 0)
        skip();
    const char *args[] = {"--provider", strongest_provider(), "--pool", "1", "--max-sessions",
                          "2", NULL};
    sbx_proc d;
    assert_int_equal(sbx_start(&d, args), 0);
    char tag[64];
    daemon_tag(d.pid, tag, sizeof tag);
    kill(d.pid, SIGKILL);
    sbx_stop(&d);
    assert_true(cgroup_dirs_of(tag) >= 4); /* nothing removed them yet */
    sbx_proc next;
    assert_int_equal(sbx_start(&next, args), 0);
    size_t left = cgroup_dirs_of(tag);
    sbx_stop(&next);
    if (left)
        fail_msg("%zu cgroup directories of a killed daemon are left after the next start", left);
}

/* ---------------------------------------------------------------- main */

#define TIER_TESTS                                                                           \
    cmocka_unit_test(test_T06_two_live_sandboxes_never_share_a_uid),                         \
    cmocka_unit_test(test_T06_a_cell_cannot_read_another_sandboxs_memory_or_environ),        \
    cmocka_unit_test(test_T07_python_over_the_memory_limit_ends_out_of_memory),              \
    cmocka_unit_test(test_T07_javascript_buffers_over_the_memory_limit_end_out_of_memory),   \
    cmocka_unit_test(test_T07_javascript_heap_over_the_memory_limit_ends_out_of_memory),     \
    cmocka_unit_test(test_T05_removing_a_closed_tree_follows_no_link_swapped_in)

int main(void)
{
    plm_global_init();
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {TIER_TESTS};
    const struct CMUnitTest daemon[] = {
        cmocka_unit_test(test_T10_a_stopped_daemon_leaves_no_cgroup_directory),
        cmocka_unit_test(test_T10_the_next_start_reaps_a_killed_daemons_cgroups),
    };
    const char *only = getenv("BERTH_TEST_PROVIDERS");
    int failed = 0;
    for (size_t i = 0; i < sizeof providers / sizeof providers[0]; i++) {
        if (only && !strstr(only, providers[i].name))
            continue;
        char name[64];
        snprintf(name, sizeof name, "tier promises: %s", providers[i].name);
        P = &providers[i];
        failed += _cmocka_run_group_tests(name, tests, sizeof tests / sizeof tests[0],
                                          group_setup, group_teardown);
    }
    P = NULL;
    if (!only)
        failed += cmocka_run_group_tests_name("daemon cgroups", daemon, NULL, NULL);
    return failed;
}

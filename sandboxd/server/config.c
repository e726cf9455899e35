/*
 * config.c — command-line parsing and the token file.
 */
#include "config.h"
#include "tokens.h"             /* httpd/: what serve shares */

#include "log.h"
#include "util.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIN_LIFETIME_MS 1000u
#define MAX_LIFETIME_MS (12u * 3600u * 1000u)

static const char usage_text[] =
    "usage: sandboxd --listen HOST:PORT --token-file FILE [--provider NAME] [options]\n"
    "\n"
    "A local plimsoll daemon (protocol 3): Describe, Run, OpenSession, SessionRun and\n"
    "CloseSession over Connect JSON on HTTP/1.1.\n"
    "\n"
    "  --listen HOST:PORT             address to serve on; port 0 picks a free port and the\n"
    "                                 daemon prints `listening http://HOST:PORT` on stdout\n"
    "  --token-file FILE              bearer tokens, one per line (blank lines and lines\n"
    "                                 starting with # are ignored); every call needs one\n"
    "  --provider NAME                sandbox provider (default auto):\n"
    "                                   gvisor   tier kernel: gVisor (runsc), one sandbox per\n"
    "                                            session, no network, read-only root\n"
    "                                   bwrap    tier container: bubblewrap namespaces, no\n"
    "                                            capabilities, seccomp, cgroup limits\n"
    "                                   process  tier process: plain child processes (for\n"
    "                                            development; never chosen by auto)\n"
    "                                   echo     a test provider that runs no code and\n"
    "                                            answers with what it was sent\n"
    "                                   auto     the strongest of gvisor and bwrap whose\n"
    "                                            start-up smoke test passes here\n"
    "  --echo-tier TIER               tier the echo provider states: process, container,\n"
    "                                 kernel or vm (default container)\n"
    "  --max-sessions N               open sessions daemon-wide (default 64; 0 turns\n"
    "                                 sessions off).  Unlike plimsolld, which keeps sessions\n"
    "                                 off until SANDBOX_MAX_SESSIONS is set, sandboxd has\n"
    "                                 them on by default: it is the embedded default daemon\n"
    "                                 for chat agents.  As in plimsolld, a project call in\n"
    "                                 a session first kills every process of the session,\n"
    "                                 the interpreters included\n"
    "  --max-sessions-per-caller N    sessions one token may hold; 0 = no cap (default:\n"
    "                                 half of --max-sessions with two or more tokens, no\n"
    "                                 cap with one); past it an open is refused\n"
    "                                 resource_exhausted, not dispatched (capacity)\n"
    "  --max-sessions-per-owner N     sessions one owner of a token may hold; at the cap an\n"
    "                                 open replaces the owner's least recently used idle\n"
    "                                 session (default 0 = no cap)\n"
    "  --session-lifetime-ms N        absolute session lifetime, 1000 .. 43200000\n"
    "                                 (default 1800000 = 30 min)\n"
    "  --session-idle-ms N            idle timeout, 0 = never or 1000 .. 43200000 (default\n"
    "                                 300000 = 5 min); a session no request names by its\n"
    "                                 first idle timeout ends `unclaimed`\n"
    "  --max-concurrent-runs N        single runs (Run) executing at once; past it a Run\n"
    "                                 is refused resource_exhausted, not dispatched\n"
    "                                 (capacity) (default: half the machine's memory, or of\n"
    "                                 sandboxd's cgroup limit, over --memory-mb, less\n"
    "                                 --pool; 1 .. 64)\n"
    "  --max-concurrent-runs-per-caller N\n"
    "                                 of those, how many one token may run; 0 = no cap\n"
    "                                 (default: half with two or more tokens)\n"
    "  --max-connections N            open client connections (default: half the\n"
    "                                 descriptor limit, raised to its hard limit at start,\n"
    "                                 at most 4096); past it the oldest connection that\n"
    "                                 has not sent an authenticated request is closed\n"
    "  --header-timeout-ms N          a connection that has not sent an authenticated\n"
    "                                 request this long after it opened is closed (default\n"
    "                                 10000); calls in progress are never cut\n"
    "  --max-body-bytes N             largest request body (default 8388608 = 8 MiB)\n"
    "  --cell-timeout-ms N            a cell's default deadline (default 30000)\n"
    "  --cell-timeout-max-ms N        the longest a cell may ask for (default 120000)\n"
    "  --snippet-timeout-ms N         a snippet's default deadline (default 5000)\n"
    "  --snippet-timeout-max-ms N     the longest a snippet may ask for (default 30000)\n"
    "  --memory-mb N                  memory of one sandbox, no swap (default 256)\n"
    "  --pids N                       processes and threads of one sandbox (default 256)\n"
    "  --cpus X                       CPUs of one sandbox, e.g. 1 or 0.5 (default 1; 0 = no cap)\n"
    "  --work-mb N                    size of the /work tmpfs (default 128)\n"
    "  --session-disk-mb N            a session's files, measured after each call; over it\n"
    "                                 the session ends disk_exceeded (default 1024; 0 = off)\n"
    "  --pool N                       warm sandboxes with interpreters started (default 2)\n"
    "  --no-data-stack-check          skip the check, in the background after start-up,\n"
    "                                 that NumPy, SciPy, pandas and matplotlib import in a\n"
    "                                 sandbox (Describe then lists no pythonPackages)\n"
    "  --uid-range FIRST-LAST         uids (and gids) sandboxed code runs as when sandboxd\n"
    "                                 is root, one per sandbox, never two at once (default\n"
    "                                 61000 and on: 1000 uids, or what can be live at once if\n"
    "                                 more); sandboxd refuses to start with fewer\n"
    "  --sandbox-uid N                the first uid of that range (default 61000)\n"
    "  --state-dir DIR                where sandboxes' host files go (default\n"
    "                                 /run/berth-sandboxd as root, else $TMPDIR)\n"
    "  --record-key FILE              sign every answer's record with this Ed25519 key (PEM\n"
    "                                 PKCS #8: `openssl genpkey -algorithm ed25519 -out FILE`;\n"
    "                                 its public half: `openssl pkey -in FILE -pubout`)\n"
    "  --python PATH, --node PATH     the interpreters (default /usr/bin/python3,\n"
    "                                 /usr/bin/node)\n"
    "  --bwrap PATH, --runsc PATH     the sandbox tools (default /usr/bin/bwrap,\n"
    "                                 /usr/bin/runsc)\n"
    "  --runsc-platform NAME          gVisor platform (default ptrace; systrap or kvm where\n"
    "                                 the runsc release and the machine have them)\n"
    "  --test-endpoints               serve POST /test/end-sessions and POST\n"
    "                                 /test/wait-ended (for client test suites only)\n"
    "  --help                         this text\n"
    "  --version                      the daemon's and the protocol's version\n";

static void usage_error(const char *fmt, const char *arg)
{
    fputs("sandboxd: ", stderr);
    fprintf(stderr, fmt, arg);
    fputs("\n\n", stderr);
    fputs(usage_text, stderr);
}

/* The memory sandboxd may use: the machine's, or less when its own cgroup (v2) has
 * a lower memory.max.  0 when unknown. */
static uint64_t memory_budget_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t total = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    char line[4096], path[4200];
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f)
        return total;
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        found = strncmp(line, "0::", 3) == 0;
    fclose(f);
    if (!found)
        return total;
    line[strcspn(line, "\n")] = '\0';
    snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.max", line + 3);
    f = fopen(path, "r");
    if (!f)
        return total;
    unsigned long long max;
    if (fscanf(f, "%llu", &max) == 1 && max > 0 && (total == 0 || max < total))
        total = max;
    fclose(f);
    return total;
}

/* Single runs at once, by default: each may take --memory-mb (256 MiB when uncapped),
 * and together they may take half of the budget, less what the warm pool holds. */
static uint32_t default_max_runs(const sbx_config *c)
{
    uint64_t budget_mb = memory_budget_bytes() >> 20;
    uint64_t per_mb = c->memory_mb ? c->memory_mb : 256;
    if (budget_mb == 0)
        return 8; /* plimsolld's default */
    uint64_t n = budget_mb / 2 / per_mb;
    n = n > c->pool ? n - c->pool : 1;
    return n < 1 ? 1 : n > 64 ? 64 : (uint32_t)n;
}

/* Strict decimal: digits only, no sign, no spaces, within [min, max]. */
static bool parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
    if (!s || !*s)
        return false;
    for (const char *p = s; *p; p++)
        if (*p < '0' || *p > '9')
            return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < min || v > max)
        return false;
    *out = v;
    return true;
}

/* HOST:PORT, or [IPV6]:PORT. */
static bool parse_listen(sbx_config *c, const char *arg)
{
    const char *colon;
    const char *host = arg;
    size_t host_len;
    if (arg[0] == '[') {
        const char *close = strchr(arg, ']');
        if (!close || close[1] != ':')
            return false;
        host = arg + 1;
        host_len = (size_t)(close - host);
        colon = close + 1;
    } else {
        colon = strrchr(arg, ':');
        if (!colon || strchr(arg, ':') != colon)
            return false;
        host_len = (size_t)(colon - arg);
    }
    uint64_t port;
    if (host_len == 0 || !parse_u64(colon + 1, 0, 65535, &port))
        return false;
    free(c->listen_host);
    free(c->listen_port);
    c->listen_host = sbx_xstrndup(host, host_len);
    c->listen_port = sbx_xstrdup(colon + 1);
    return true;
}

static bool valid_tier(const char *t)
{
    return !strcmp(t, "process") || !strcmp(t, "container") || !strcmp(t, "kernel") ||
           !strcmp(t, "vm");
}

enum {
    OPT_LISTEN = 256, OPT_TOKEN_FILE, OPT_PROVIDER, OPT_ECHO_TIER, OPT_MAX_SESSIONS,
    OPT_PER_CALLER, OPT_PER_OWNER, OPT_LIFETIME, OPT_IDLE, OPT_MAX_BODY, OPT_TEST_ENDPOINTS,
    OPT_HELP, OPT_VERSION, OPT_CELL_T, OPT_CELL_TMAX, OPT_SNIP_T, OPT_SNIP_TMAX, OPT_MEMORY,
    OPT_PIDS, OPT_CPUS, OPT_WORK_MB, OPT_DISK_MB, OPT_POOL, OPT_UID, OPT_STATE_DIR, OPT_PYTHON,
    OPT_NODE, OPT_BWRAP, OPT_RUNSC, OPT_PLATFORM, OPT_UID_RANGE, OPT_RECORD_KEY,
    OPT_NO_STACK_CHECK,
};

/* Admission and connection limits (issue 11). */
enum {
    OPT_MAX_RUNS = 512, OPT_RUNS_PER_CALLER, OPT_MAX_CONNECTIONS, OPT_HEADER_TIMEOUT,
};

static const struct option long_options[] = {
    {"max-concurrent-runs", required_argument, NULL, OPT_MAX_RUNS},
    {"max-concurrent-runs-per-caller", required_argument, NULL, OPT_RUNS_PER_CALLER},
    {"max-connections", required_argument, NULL, OPT_MAX_CONNECTIONS},
    {"header-timeout-ms", required_argument, NULL, OPT_HEADER_TIMEOUT},
    {"listen", required_argument, NULL, OPT_LISTEN},
    {"token-file", required_argument, NULL, OPT_TOKEN_FILE},
    {"provider", required_argument, NULL, OPT_PROVIDER},
    {"echo-tier", required_argument, NULL, OPT_ECHO_TIER},
    {"max-sessions", required_argument, NULL, OPT_MAX_SESSIONS},
    {"max-sessions-per-caller", required_argument, NULL, OPT_PER_CALLER},
    {"max-sessions-per-owner", required_argument, NULL, OPT_PER_OWNER},
    {"session-lifetime-ms", required_argument, NULL, OPT_LIFETIME},
    {"session-idle-ms", required_argument, NULL, OPT_IDLE},
    {"max-body-bytes", required_argument, NULL, OPT_MAX_BODY},
    {"test-endpoints", no_argument, NULL, OPT_TEST_ENDPOINTS},
    {"cell-timeout-ms", required_argument, NULL, OPT_CELL_T},
    {"cell-timeout-max-ms", required_argument, NULL, OPT_CELL_TMAX},
    {"snippet-timeout-ms", required_argument, NULL, OPT_SNIP_T},
    {"snippet-timeout-max-ms", required_argument, NULL, OPT_SNIP_TMAX},
    {"memory-mb", required_argument, NULL, OPT_MEMORY},
    {"pids", required_argument, NULL, OPT_PIDS},
    {"cpus", required_argument, NULL, OPT_CPUS},
    {"work-mb", required_argument, NULL, OPT_WORK_MB},
    {"session-disk-mb", required_argument, NULL, OPT_DISK_MB},
    {"pool", required_argument, NULL, OPT_POOL},
    {"no-data-stack-check", no_argument, NULL, OPT_NO_STACK_CHECK},
    {"sandbox-uid", required_argument, NULL, OPT_UID},
    {"uid-range", required_argument, NULL, OPT_UID_RANGE},
    {"state-dir", required_argument, NULL, OPT_STATE_DIR},
    {"python", required_argument, NULL, OPT_PYTHON},
    {"node", required_argument, NULL, OPT_NODE},
    {"record-key", required_argument, NULL, OPT_RECORD_KEY},
    {"bwrap", required_argument, NULL, OPT_BWRAP},
    {"runsc", required_argument, NULL, OPT_RUNSC},
    {"runsc-platform", required_argument, NULL, OPT_PLATFORM},
    {"help", no_argument, NULL, OPT_HELP},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

/* A numeric flag into a uint32 field, with its allowed range. */
static bool set_u32(const char *name, const char *arg, uint64_t min, uint64_t max, uint32_t *out)
{
    uint64_t v;
    if (!parse_u64(arg, min, max, &v)) {
        char *msg = sbx_printf("--%s takes an integer in %llu..%llu, not \"%%s\"", name,
                               (unsigned long long)min, (unsigned long long)max);
        usage_error(msg, arg);
        free(msg);
        return false;
    }
    *out = (uint32_t)v;
    return true;
}

int sbx_config_parse(sbx_config *c, int argc, char **argv)
{
    memset(c, 0, sizeof *c);
    c->echo_tier = sbx_xstrdup("container");
    c->max_sessions = 64;
    c->lifetime_ms = 30u * 60u * 1000u;
    c->idle_ms = 5u * 60u * 1000u;
    c->max_body_bytes = 8u << 20;
    c->header_timeout_ms = 10000;
    c->cell_timeout_ms = 30000;
    c->cell_timeout_max_ms = 120000;
    c->snippet_timeout_ms = 5000;
    c->snippet_timeout_max_ms = 30000;
    c->memory_mb = 256;
    c->pids = 256;
    c->cpus = 1.0;
    c->work_mb = 128;
    c->disk_mb = 1024;
    c->pool = 2;
    c->data_stack_check = true;
    c->sandbox_uid = 61000;
    c->python_path = sbx_xstrdup("/usr/bin/python3");
    c->node_path = sbx_xstrdup("/usr/bin/node");
    c->bwrap_path = sbx_xstrdup("/usr/bin/bwrap");
    c->runsc_path = sbx_xstrdup("/usr/bin/runsc");
    c->runsc_platform = sbx_xstrdup("ptrace");

    opterr = 0; /* we print our own messages */
    optind = 1;
    int opt;
    uint64_t v;
    while ((opt = getopt_long(argc, argv, ":", long_options, NULL)) != -1) {
        switch (opt) {
        case OPT_LISTEN:
            if (!parse_listen(c, optarg)) {
                usage_error("--listen takes HOST:PORT (or [IPV6]:PORT), not \"%s\"", optarg);
                return 2;
            }
            break;
        case OPT_TOKEN_FILE:
            free(c->token_file);
            c->token_file = sbx_xstrdup(optarg);
            break;
        case OPT_PROVIDER:
            free(c->provider);
            c->provider = sbx_xstrdup(optarg);
            break;
        case OPT_ECHO_TIER:
            if (!valid_tier(optarg)) {
                usage_error("--echo-tier takes process, container, kernel or vm, not \"%s\"",
                            optarg);
                return 2;
            }
            free(c->echo_tier);
            c->echo_tier = sbx_xstrdup(optarg);
            break;
        case OPT_MAX_SESSIONS:
            if (!set_u32("max-sessions", optarg, 0, 1000000, &c->max_sessions))
                return 2;
            break;
        case OPT_PER_CALLER:
            if (!set_u32("max-sessions-per-caller", optarg, 0, 1000000, &c->max_per_caller))
                return 2;
            c->per_caller_set = true;
            break;
        case OPT_MAX_RUNS:
            if (!set_u32("max-concurrent-runs", optarg, 1, 100000, &c->max_runs))
                return 2;
            break;
        case OPT_RUNS_PER_CALLER:
            if (!set_u32("max-concurrent-runs-per-caller", optarg, 0, 100000,
                         &c->max_runs_per_caller))
                return 2;
            c->runs_per_caller_set = true;
            break;
        case OPT_MAX_CONNECTIONS:
            if (!set_u32("max-connections", optarg, 1, 1000000, &c->max_connections))
                return 2;
            break;
        case OPT_HEADER_TIMEOUT:
            if (!set_u32("header-timeout-ms", optarg, 100, 600000, &c->header_timeout_ms))
                return 2;
            break;
        case OPT_PER_OWNER:
            if (!set_u32("max-sessions-per-owner", optarg, 0, 1000000, &c->max_per_owner))
                return 2;
            break;
        case OPT_LIFETIME:
            if (!set_u32("session-lifetime-ms", optarg, MIN_LIFETIME_MS, MAX_LIFETIME_MS,
                         &c->lifetime_ms))
                return 2;
            break;
        case OPT_IDLE:
            if (!set_u32("session-idle-ms", optarg, 0, MAX_LIFETIME_MS, &c->idle_ms))
                return 2;
            if (c->idle_ms != 0 && c->idle_ms < 1000) {
                usage_error("--session-idle-ms takes 0 (never) or at least 1000, not \"%s\"",
                            optarg);
                return 2;
            }
            break;
        case OPT_MAX_BODY:
            if (!parse_u64(optarg, 64, 1u << 30, &v)) {
                usage_error("--max-body-bytes takes an integer in 64..1073741824, not \"%s\"",
                            optarg);
                return 2;
            }
            c->max_body_bytes = (size_t)v;
            break;
        case OPT_TEST_ENDPOINTS:
            c->test_endpoints = true;
            break;
        case OPT_NO_STACK_CHECK:
            c->data_stack_check = false;
            break;
        case OPT_CELL_T:
        case OPT_CELL_TMAX:
        case OPT_SNIP_T:
        case OPT_SNIP_TMAX: {
            static const char *const names[] = {"cell-timeout-ms", "cell-timeout-max-ms",
                                                "snippet-timeout-ms", "snippet-timeout-max-ms"};
            uint32_t *fields[] = {&c->cell_timeout_ms, &c->cell_timeout_max_ms,
                                  &c->snippet_timeout_ms, &c->snippet_timeout_max_ms};
            if (!set_u32(names[opt - OPT_CELL_T], optarg, 100, 300000, fields[opt - OPT_CELL_T]))
                return 2;
            break;
        }
        case OPT_MEMORY:
            if (!set_u32("memory-mb", optarg, 32, 1u << 20, &c->memory_mb))
                return 2;
            break;
        case OPT_PIDS:
            if (!set_u32("pids", optarg, 16, 1u << 20, &c->pids))
                return 2;
            break;
        case OPT_CPUS: {
            char *end;
            errno = 0;
            double cpus = strtod(optarg, &end);
            if (errno || *end || end == optarg || cpus < 0 || cpus > 1024) {
                usage_error("--cpus takes a number of CPUs in 0..1024 (0 = no cap), not \"%s\"",
                            optarg);
                return 2;
            }
            c->cpus = cpus;
            break;
        }
        case OPT_WORK_MB:
            if (!set_u32("work-mb", optarg, 1, 1u << 20, &c->work_mb))
                return 2;
            break;
        case OPT_DISK_MB:
            if (!set_u32("session-disk-mb", optarg, 0, 1u << 20, &c->disk_mb))
                return 2;
            break;
        case OPT_POOL:
            if (!set_u32("pool", optarg, 0, 64, &c->pool))
                return 2;
            break;
        case OPT_UID:
            if (!set_u32("sandbox-uid", optarg, 1, 4000000000u, &c->sandbox_uid))
                return 2;
            break;
        case OPT_UID_RANGE: { /* FIRST-LAST, inclusive, never uid 0, at most 65536 uids */
            uint64_t first, last;
            const char *dash = strchr(optarg, '-');
            char *head = dash ? sbx_xstrndup(optarg, (size_t)(dash - optarg)) : NULL;
            bool good = head && parse_u64(head, 1, 4000000000u, &first) &&
                        parse_u64(dash + 1, 1, 4000000000u, &last) && last >= first &&
                        last - first < 65536;
            free(head);
            if (!good) {
                usage_error("--uid-range takes FIRST-LAST (1 .. 4000000000, at most 65536 "
                            "uids), not \"%s\"", optarg);
                return 2;
            }
            c->sandbox_uid = (uint32_t)first;
            c->uid_count = (uint32_t)(last - first + 1);
            break;
        }
        case OPT_STATE_DIR:
        case OPT_PYTHON:
        case OPT_NODE:
        case OPT_BWRAP:
        case OPT_RUNSC:
        case OPT_PLATFORM: {
            char **fields[] = {&c->state_dir, &c->python_path, &c->node_path, &c->bwrap_path,
                               &c->runsc_path, &c->runsc_platform};
            char **field = fields[opt - OPT_STATE_DIR];
            if (!*optarg || (opt != OPT_PLATFORM && optarg[0] != '/')) {
                usage_error("%s takes an absolute path", argv[optind - 1]);
                return 2;
            }
            free(*field);
            *field = sbx_xstrdup(optarg);
            break;
        }
        case OPT_RECORD_KEY:
            free(c->record_key_path);
            c->record_key_path = sbx_xstrdup(optarg);
            break;
        case OPT_HELP:
            fputs(usage_text, stdout);
            return 1;
        case OPT_VERSION:
            printf("sandboxd %s (plimsoll protocol %u)\n", SBX_VERSION, SBX_PROTOCOL);
            return 1;
        case ':':
            usage_error("%s needs a value", argv[optind - 1]);
            return 2;
        default:
            usage_error("unknown option \"%s\"", argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc) {
        usage_error("unexpected argument \"%s\"", argv[optind]);
        return 2;
    }
    if (!c->listen_host) {
        usage_error("%s", "--listen HOST:PORT is required");
        return 2;
    }
    if (!c->token_file) {
        usage_error("%s", "--token-file FILE is required");
        return 2;
    }
    if (!c->provider)
        c->provider = sbx_xstrdup("auto");
    if (!c->max_runs)
        c->max_runs = default_max_runs(c);
    if (c->cell_timeout_ms > c->cell_timeout_max_ms ||
        c->snippet_timeout_ms > c->snippet_timeout_max_ms) {
        usage_error("%s", "a default timeout is over its maximum");
        return 2;
    }
    return 0;
}

/* Half, rounded down, but at least 1 of anything there is (0 stays 0). */
static uint32_t half_share(uint32_t total)
{
    return total == 0 ? 0 : total < 2 ? 1 : total / 2;
}

/* Trims spaces, tabs and a CR (files written on Windows) from both ends. */
int sbx_config_load_tokens(sbx_config *c)
{
    char *why = NULL;
    int n = httpd_tokens_read(c->token_file, &c->token_hashes, &why);
    if (n < 0) {
        sbx_log("%s", why ? why : "cannot read the token file");
        free(why);
        return -1;
    }
    c->n_tokens = (size_t)n;
    if (c->n_tokens == 0) {
        sbx_log("the token file %s holds no token (one per line; # starts a comment)",
                c->token_file);
        return -1;
    }
    /* With several callers, none may take more than half of what is shared. */
    if (c->n_tokens >= 2 && !c->per_caller_set)
        c->max_per_caller = half_share(c->max_sessions);
    if (c->n_tokens >= 2 && !c->runs_per_caller_set)
        c->max_runs_per_caller = half_share(c->max_runs);
    return 0;
}

void sbx_config_free(sbx_config *c)
{
    free(c->listen_host);
    free(c->listen_port);
    free(c->token_file);
    free(c->provider);
    free(c->echo_tier);
    free(c->state_dir);
    free(c->python_path);
    free(c->node_path);
    free(c->record_key_path);
    free(c->bwrap_path);
    free(c->runsc_path);
    free(c->runsc_platform);
    httpd_tokens_free(c->token_hashes, c->n_tokens);
    memset(c, 0, sizeof *c);
}

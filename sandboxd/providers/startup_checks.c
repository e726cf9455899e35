/*
 * startup_checks.c — what a real provider proves before and just after it serves
 * (real_internal.h): its software identity per environment (the manifest Describe,
 * answers and records state), the smoke test every start waits for (the probes of the
 * tier's promises, each language's interpreter), and the data stack check Describe's
 * pythonPackages come from, in the background once it serves.
 */
#include "real_internal.h"

#include "cgroup.h"
#include "kernels.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---------------------------------------------------------------- software identity */

/* What a sandbox executes, named the way plimsoll names an image's software
 * (`oci-manifest:linux/amd64@sha256:<hex>`, docs/wire.md §5.1): a kind, the platform and the
 * SHA-256 of a manifest.  sandboxd has no image: its manifest is a text listing, per
 * environment, every executable a run there starts and the SHA-256 of its content --
 * the supervisor (this binary), the interpreters (their real paths), the shell that
 * runs project steps and the kernels' sources -- so the identity changes exactly when
 * one of them does, and a software rule naming it pins them all. */

#define IDENT_KIND "berth-manifest"

static bool sha256_of_file(const char *path, plm_hex hex)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    bool ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1;
    static unsigned char buf[1 << 20];
    ssize_t n;
    while (ok && (n = read(fd, buf, sizeof buf)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        ok = n > 0 && EVP_DigestUpdate(ctx, buf, (size_t)n) == 1;
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    ok = ok && EVP_DigestFinal_ex(ctx, md, &len) == 1 && len == 32;
    EVP_MD_CTX_free(ctx);
    close(fd);
    for (unsigned i = 0; ok && i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    return ok;
}

/* Appends "<role> <real path> sha256:<hex>\n"; false when it cannot be read. */
static bool manifest_file(char **m, const char *role, const char *path)
{
    char real[PATH_MAX];
    plm_hex hex;
    if (!realpath(path, real) || !sha256_of_file(real, hex))
        return false;
    char *next = sbx_printf("%s%s %s sha256:%s\n", *m, role, real, hex);
    free(*m);
    *m = next;
    return true;
}

static void manifest_text(char **m, const char *role, const char *text)
{
    plm_hex hex;
    plm_sha256_hex(text, strlen(text), hex);
    char *next = sbx_printf("%s%s sha256:%s\n", *m, role, hex);
    free(*m);
    *m = next;
}

static const char *platform_arch(void)
{
    static struct utsname u;
    if (uname(&u) != 0)
        return "unknown";
    if (!strcmp(u.machine, "x86_64"))
        return "amd64";
    if (!strcmp(u.machine, "aarch64"))
        return "arm64";
    return u.machine;
}

/* The identity of an environment that runs `langs` (plus the shell when `shell`), into
 * `out`; "" when a part cannot be read (then no rule can be met, as before). */
static void software_identity(const sbx_provider *p, unsigned langs, bool kernels, bool shell,
                              char *out, size_t size)
{
    char *m = sbx_printf("berth sandbox software 1\nplatform linux/%s\nprovider %s\n",
                         platform_arch(), p->be->name);
    bool ok = manifest_file(&m, "supervisor", "/proc/self/exe");
    if (langs & SBX_LANG_JAVASCRIPT) {
        ok = ok && manifest_file(&m, "javascript", p->cfg->node_path);
        if (kernels)
            manifest_text(&m, "kernel.js", sbx_kernel_js);
    }
    if (langs & SBX_LANG_PYTHON) {
        ok = ok && manifest_file(&m, "python", p->cfg->python_path);
        if (kernels)
            manifest_text(&m, "kernel.py", sbx_kernel_py);
    }
    if (shell)
        ok = ok && manifest_file(&m, "shell", "/bin/sh");
    plm_hex hex;
    plm_sha256_hex(m, strlen(m), hex);
    free(m);
    if (ok)
        snprintf(out, size, IDENT_KIND ":linux/%s@sha256:%s", platform_arch(), hex);
    else
        out[0] = '\0';
}

/* Once the smoke test proved `langs`: what Describe, answers and records state. */
static void set_identities(sbx_provider *p, unsigned langs)
{
    software_identity(p, langs & SBX_LANG_JAVASCRIPT, false, false, p->ident_js,
                      sizeof p->ident_js);
    software_identity(p, langs, true, false, p->ident_session, sizeof p->ident_session);
    software_identity(p, langs, false, true, p->ident_project, sizeof p->ident_project);
    p->facts.javascript.software_identity = p->ident_js;
    p->facts.session.software_identity = p->ident_session;
    p->facts.project.software_identity = p->ident_project;
}

/* ---------------------------------------------------------------- smoke test */

static const char probe_py[] =
    "import json, os, socket\n"
    "r = {'uid': os.getuid(), 'release': os.uname().release}\n"
    "def can_write(p):\n"
    "    try:\n"
    "        with open(p, 'w') as f:\n"
    "            f.write('x')\n"
    "        os.unlink(p)\n"
    "        return True\n"
    "    except OSError:\n"
    "        return False\n"
    "r['work'] = can_write('berth-probe.txt')\n"
    "r['root'] = can_write('/berth-probe.txt')\n"
    "r['usr'] = can_write('/usr/berth-probe.txt')\n"
    "try:\n"
    "    socket.create_connection(('1.1.1.1', 53), timeout=2).close()\n"
    "    r['net'] = True\n"
    "except OSError:\n"
    "    r['net'] = False\n"
    "st = dict(l.split(':', 1) for l in open('/proc/self/status') if ':' in l)\n"
    "for k in ('NoNewPrivs', 'Seccomp', 'CapEff'):\n"
    "    r[k] = st.get(k, '').strip()\n"
    "print(json.dumps(r))";

static const char probe_js[] = "const answer = 6 * 7; answer";

static void smoke_finish(smoke *k, char *why);

static void on_smoke_box_closed(void *ud)
{
    smoke *k = ud;
    sbx_provider *p = k->p;
    p->smoke = NULL;
    ev_timer_stop(p->loop, &k->bound);
    char *why = k->why;
    if (!why && !k->ok)
        why = sbx_xstrdup("no interpreter passed");
    if (!why) {
        p->langs = k->ok;
        p->facts.session.languages = k->ok;
        p->facts.supports_javascript = (k->ok & SBX_LANG_JAVASCRIPT) != 0;
        p->facts.javascript.languages = k->ok & SBX_LANG_JAVASCRIPT;
        p->facts.supports_project = true; /* steps in /bin/sh: the languages proven */
        p->facts.project.languages = k->ok;
        set_identities(p, k->ok);
        p->serving = true;
    }
    sbx_smoke_cb cb = k->cb;
    void *ud2 = k->ud;
    free(k);
    cb(ud2, why);
    if (p->serving) {
        ev_timer_start(p->loop, &p->pool_check);
        sbx_real_pool_fill(p);
        if (!p->cfg->data_stack_check) {
            sbx_log("data stack check: off (--no-data-stack-check); Describe lists no Python "
                    "packages");
        } else if (p->langs & SBX_LANG_PYTHON) {
            p->stack_due = true;
            ev_timer_start(p->loop, &p->stack_wait);
            sbx_real_stack_start_if_due(p);
        }
    }
}

static void smoke_finish(smoke *k, char *why)
{
    if (k->finished) {
        free(why);
        return;
    }
    k->finished = true;
    k->why = why;
    ev_timer_stop(k->p->loop, &k->bound);
    sbx_box_close(k->box, on_smoke_box_closed, k);
}

static void smoke_next(smoke *k);

static char *check_probe(smoke *k, const char *out)
{
    const sbx_real_backend *be = k->p->be;
    json_error_t jerr;
    json_t *j = json_loads(out, 0, &jerr);
    if (!json_is_object(j)) {
        json_decref(j);
        return sbx_printf("the probe printed no verdict (%.200s)", out);
    }
    char *why = NULL;
    json_int_t uid = json_integer_value(json_object_get(j, "uid"));
    const char *release = json_string_value(json_object_get(j, "release"));
    const char *nnp = json_string_value(json_object_get(j, "NoNewPrivs"));
    const char *seccomp = json_string_value(json_object_get(j, "Seccomp"));
    const char *capeff = json_string_value(json_object_get(j, "CapEff"));
    if (!json_is_true(json_object_get(j, "work")))
        why = sbx_xstrdup("the work directory is not writable");
    else if (be->want_isolation && json_is_true(json_object_get(j, "net")))
        why = sbx_xstrdup("a TCP connection left the sandbox");
    else if (be->want_isolation && (json_is_true(json_object_get(j, "root")) ||
                                    json_is_true(json_object_get(j, "usr"))))
        why = sbx_xstrdup("the root file system is writable");
    else if (be->want_isolation && uid == 0)
        why = sbx_xstrdup("code runs as root inside");
    else if (be->want_seccomp && (!nnp || strcmp(nnp, "1") != 0))
        why = sbx_xstrdup("no_new_privs is not set");
    else if (be->want_seccomp && (!seccomp || strcmp(seccomp, "2") != 0))
        why = sbx_xstrdup("no seccomp filter is in force");
    else if (be->want_seccomp && (!capeff || strspn(capeff, "0") != strlen(capeff)))
        why = sbx_printf("capabilities are left (CapEff %s)", capeff ? capeff : "?");
    else if (be->want_other_kernel && (!release || strcmp(release, k->p->host_release) == 0))
        why = sbx_printf("the code sees the host's kernel (%s), not a sandbox kernel",
                         release ? release : "?");
    json_decref(j);
    return why;
}

static void on_smoke_cell(void *ud, sbx_cell_result *r)
{
    smoke *k = ud;
    int lang = k->step == 1 ? SUP_LANG_PY : SUP_LANG_JS;
    char *why = NULL;
    const char *out = r->out.data ? (const char *)r->out.data : "";
    if (r->end != SBX_CELL_RAN) {
        why = sbx_printf("the %s probe did not run cleanly (%.300s)", sbx_real_lang_word(lang),
                         r->err.data ? (const char *)r->err.data : r->text ? r->text : "no output");
    } else if (lang == SUP_LANG_PY) {
        why = check_probe(k, out);
    } else if (strcmp(out, "42\n") != 0) {
        why = sbx_printf("the javascript probe printed %.100s, not 42", out);
    }
    free(r->out.data);
    free(r->err.data);
    free(r->text);
    if (why) {
        sbx_log("smoke test: %s", why);
        if (lang == SUP_LANG_PY && k->p->be->want_isolation) {
            smoke_finish(k, why); /* an isolation promise broken: the tier fails */
            return;
        }
        free(why);
    } else {
        k->ok |= sbx_real_lang_bit(lang);
    }
    smoke_next(k);
}

static void on_smoke_swept(void *ud, bool ok, bool clean, uint32_t killed, uint64_t disk)
{
    (void)killed;
    (void)disk;
    smoke *k = ud;
    if (!ok || !clean)
        smoke_finish(k, sbx_xstrdup("the sweep could not prove the sandbox clean"));
    else
        smoke_finish(k, NULL);
}

static void smoke_next(smoke *k)
{
    k->step++;
    if (k->step == 1 || k->step == 2) {
        int lang = k->step == 1 ? SUP_LANG_PY : SUP_LANG_JS;
        if (!(k->up & sbx_real_lang_bit(lang))) {
            smoke_next(k);
            return;
        }
        memset(&k->job, 0, sizeof k->job);
        k->job.kind = SBX_KIND_CELL;
        k->job.language = sbx_real_lang_word(lang);
        k->job.code.data = lang == SUP_LANG_PY ? probe_py : probe_js;
        k->job.code.len = strlen(k->job.code.data);
        sbx_box_cell(k->box, lang, &k->job, OUTPUT_CAP, OUTPUT_CAP, on_smoke_cell, k);
        return;
    }
    if (k->step == 3) {
        if (!k->ok) {
            smoke_finish(k, sbx_xstrdup("no interpreter answered its probe"));
            return;
        }
        sbx_box_sweep(k->box, true, on_smoke_swept, k);
    }
}

static void on_smoke_interp(void *ud, sbx_box *b, int lang, bool up, const char *text)
{
    (void)b;
    smoke *k = ud;
    if (k->finished)
        return;
    if (up)
        k->up |= sbx_real_lang_bit(lang);
    else
        sbx_log("smoke test: the %s interpreter could not start: %s", sbx_real_lang_word(lang), text);
    if (--k->waiting == 0)
        smoke_next(k);
}

static void on_smoke_ready(void *ud, sbx_box *b, const char *err)
{
    smoke *k = ud;
    if (err) {
        smoke_finish(k, sbx_printf("the sandbox did not start: %s", err));
        return;
    }
    char *why = k->p->be->verify ? k->p->be->verify(k->p->bk, b) : NULL;
    if (why) {
        smoke_finish(k, why);
        return;
    }
    k->waiting = 2;
    sbx_box_start(b, SUP_LANG_PY);
    sbx_box_start(b, SUP_LANG_JS);
}

static void on_smoke_dead(void *ud, sbx_box *b, const char *why)
{
    (void)b;
    smoke *k = ud;
    smoke_finish(k, sbx_printf("the sandbox ended during the smoke test: %s", why));
}

static void on_smoke_bound(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    smoke *k = w->data;
    smoke_finish(k, sbx_printf("the smoke test did not finish within %.0f s", SMOKE_BOUND_S));
}

static const sbx_box_events smoke_events = {on_smoke_ready, on_smoke_interp, on_smoke_dead};

void sbx_real_smoke_test(sbx_provider *p, sbx_smoke_cb cb, void *ud)
{
    smoke *k = sbx_xcalloc(1, sizeof *k);
    k->p = p;
    k->cb = cb;
    k->ud = ud;
    p->smoke = k;
    ev_timer_init(&k->bound, on_smoke_bound, SMOKE_BOUND_S, 0.);
    k->bound.data = k;
    ev_timer_start(p->loop, &k->bound);
    k->box = sbx_real_new_box(p, &smoke_events, k);
}

/* ---------------------------------------------------------------- the data stack check */

/* Describe's pythonPackages (docs/daemon.md §4.7): once the smoke test passed, a sandbox
 * of its own -- made as every session's, so with the limits of every cell, and never
 * given to a session -- imports NumPy, SciPy, pandas and matplotlib (the Agg backend) in
 * a Python kernel and reads their versions.  Until it ends Describe lists none; if it
 * fails, none ever (the reason is logged).
 *
 * Why the real import and not importlib.metadata in the smoke probe, which costs ~0.1 s:
 * metadata says a distribution is installed, not that it imports in this sandbox --
 * under the kernel's address-space limit (OpenBLAS), the seccomp filter, gVisor's
 * system calls, the memory limit, a read-only /usr -- and Describe states what was
 * proven, so listing it would be a guess.  The real import costs ~1.5 s on the host and
 * more under gVisor, so it never holds the smoke test (every start waits for that): it
 * runs in the background, after the pool's members have started (they are what the
 * next open needs, and both want the CPU), or STACK_WAIT_MAX_S after serving at the
 * latest. */

static const char *const stack_names[N_STACK] = {"numpy", "scipy", "pandas", "matplotlib"};

static const char stack_py[] =
    "import json, time\n"
    "t0 = time.monotonic()\n"
    "import numpy, scipy.linalg, pandas, matplotlib\n"
    "matplotlib.use('Agg')\n"
    "import matplotlib.pyplot\n"
    "if matplotlib.get_backend().lower() != 'agg':\n"
    "    raise SystemError('matplotlib uses the %s backend, not Agg' % matplotlib.get_backend())\n"
    "print(json.dumps({'seconds': time.monotonic() - t0, 'numpy': numpy.__version__,\n"
    "                  'scipy': scipy.__version__, 'pandas': pandas.__version__,\n"
    "                  'matplotlib': matplotlib.__version__}))";

/* A version as a package states it ("1.24.2", "2.0.0rc1+git"): nothing else is listed. */
static bool plain_version(const char *v)
{
    size_t n = v ? strlen(v) : 0;
    return n > 0 && n < 33 && strspn(v, "0123456789abcdefghijklmnopqrstuvwxyz"
                                         "ABCDEFGHIJKLMNOPQRSTUVWXYZ.+-_") == n;
}

static void on_stack_box_closed(void *ud)
{
    stack_check *k = ud;
    k->p->stack = NULL;
    free(k);
}

static void stack_finish(stack_check *k, char *why)
{
    if (k->finished) {
        free(why);
        return;
    }
    k->finished = true;
    ev_timer_stop(k->p->loop, &k->bound);
    if (why) {
        sbx_log("data stack check failed after %.1f s: %s; Describe lists no Python packages",
                ev_time() - k->began, why);
        free(why);
    }
    sbx_box_close(k->box, on_stack_box_closed, k);
}

/* The check's verdict: the versions into the provider's facts, or why not. */
static char *stack_publish(stack_check *k, const char *out)
{
    sbx_provider *p = k->p;
    json_error_t jerr;
    json_t *j = json_loads(out, 0, &jerr);
    double seconds = json_number_value(json_object_get(j, "seconds"));
    for (int i = 0; i < N_STACK; i++) {
        const char *v = json_string_value(json_object_get(j, stack_names[i]));
        if (!plain_version(v)) {
            char *why = sbx_printf("it printed no plain version of %s (%.200s)", stack_names[i],
                                   out);
            json_decref(j);
            return why;
        }
        snprintf(p->versions[i], sizeof p->versions[i], "%s", v);
        p->packages[i] = (sbx_package){stack_names[i], p->versions[i]};
    }
    json_decref(j);
    /* Every environment whose sandboxes run Python: sessions' cells and projects' steps
     * (the python the smoke test proved for both). */
    p->facts.session.python_packages = p->facts.project.python_packages = p->packages;
    p->facts.session.n_python_packages = p->facts.project.n_python_packages = N_STACK;
    sbx_log("data stack: numpy %s, scipy %s, pandas %s, matplotlib %s (Agg) imported in a "
            "sandbox in %.1f s (%.1f s with the sandbox's start); Describe lists them",
            p->versions[0], p->versions[1], p->versions[2], p->versions[3], seconds,
            ev_time() - k->began);
    return NULL;
}

static void on_stack_cell(void *ud, sbx_cell_result *r)
{
    stack_check *k = ud;
    char *why = NULL;
    if (k->finished) {
        /* closed under it (its bound): already said */
    } else if (r->end == SBX_CELL_RAN) {
        why = stack_publish(k, r->out.data ? (const char *)r->out.data : "");
    } else if (r->end == SBX_CELL_DIED) {
        char how[64];
        sbx_real_describe_wait(r->wait_status, how, sizeof how);
        sbx_provider *p = k->p;
        bool oom = p->be->oom_kills && p->be->oom_kills(p->bk, k->box) > 0;
        why = sbx_printf("the python interpreter was %s during the import%s", how,
                         oom ? ": out of memory (the limit of every sandbox)" : "");
    } else {
        const char *err = r->err.data ? (const char *)r->err.data : r->text ? r->text : "";
        const char *last = err; /* a traceback's last line says what failed */
        for (const char *nl = strchr(err, '\n'); nl && nl[1]; nl = strchr(nl + 1, '\n'))
            last = nl + 1;
        why = sbx_printf("the import did not run cleanly (%.300s)", *last ? last : "no output");
    }
    free(r->out.data);
    free(r->err.data);
    free(r->text);
    if (!k->finished)
        stack_finish(k, why);
}

static void on_stack_ready(void *ud, sbx_box *b, const char *err)
{
    stack_check *k = ud;
    if (err) {
        stack_finish(k, sbx_printf("its sandbox did not start: %s", err));
        return;
    }
    sbx_box_start(b, SUP_LANG_PY);
}

static void on_stack_interp(void *ud, sbx_box *b, int lang, bool up, const char *text)
{
    stack_check *k = ud;
    if (k->finished || lang != SUP_LANG_PY)
        return;
    if (!up) {
        stack_finish(k, sbx_printf("the python interpreter could not start: %s", text));
        return;
    }
    /* From here the cell's own deadline, as any cell's. */
    ev_timer_stop(k->p->loop, &k->bound);
    ev_timer_set(&k->bound, k->p->cfg->cell_timeout_ms / 1000.0, 0.);
    ev_timer_start(k->p->loop, &k->bound);
    k->job = (sbx_job){.kind = SBX_KIND_CELL, .language = "python",
                       .code = {stack_py, sizeof stack_py - 1}};
    sbx_box_cell(b, SUP_LANG_PY, &k->job, OUTPUT_CAP, OUTPUT_CAP, on_stack_cell, k);
}

static void on_stack_dead(void *ud, sbx_box *b, const char *why)
{
    (void)b;
    stack_finish(ud, sbx_printf("its sandbox ended: %s", why));
}

static void on_stack_bound(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    stack_check *k = w->data;
    stack_finish(k, sbx_printf("it did not finish within %.0f s", ev_time() - k->began));
}

static const sbx_box_events stack_events = {on_stack_ready, on_stack_interp, on_stack_dead};

static void stack_start(sbx_provider *p)
{
    p->stack_due = false;
    ev_timer_stop(p->loop, &p->stack_wait);
    stack_check *k = sbx_xcalloc(1, sizeof *k);
    k->p = p;
    k->began = ev_time();
    ev_timer_init(&k->bound, on_stack_bound, CREATE_BOUND_S, 0.);
    k->bound.data = k;
    ev_timer_start(p->loop, &k->bound);
    p->stack = k;
    k->box = sbx_real_new_box(p, &stack_events, k);
}

/* Starts the check when it is due and no pool member is starting. */
void sbx_real_stack_start_if_due(sbx_provider *p)
{
    if (!p->stack_due)
        return;
    for (const member *m = p->members; m; m = m->next)
        if (!m->ready || (m->up & p->langs) != p->langs)
            return;
    stack_start(p);
}

static void on_stack_wait(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    sbx_provider *p = w->data;
    if (p->stack_due)
        stack_start(p);
}

void sbx_real_checks_init(sbx_provider *p)
{
    ev_timer_init(&p->stack_wait, on_stack_wait, STACK_WAIT_MAX_S, 0.);
    p->stack_wait.data = p;
}

void sbx_real_checks_destroy(sbx_provider *p)
{
    ev_timer_stop(p->loop, &p->stack_wait);
    if (p->stack) { /* a check still running (or closing) ends with the daemon */
        ev_timer_stop(p->loop, &p->stack->bound);
        sbx_box_destroy_sync(p->stack->box);
        free(p->stack);
        p->stack = NULL;
    }
}

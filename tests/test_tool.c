/*
 * test_tool.c — the executeCode tool without a daemon (conformance group T, and the X
 * items about what a fresh run sends): the output's cut and key order, a fresh run's
 * output, the description and the parameters' schema, and the fresh runners, run for
 * real with this machine's python3 and node the way a daemon runs a project's step.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "sandboxes_internal.h"

/* ---------------------------------------------------------------- helpers */

static plm_bytes bytes_of(const char *s)
{
    return (plm_bytes){(unsigned char *)s, strlen(s)};
}

static void contains(const char *hay, const char *needle)
{
    if (!hay || !strstr(hay, needle))
        fail_msg("\"%s\" does not contain \"%s\"", hay ? hay : "(null)", needle);
}

static const char *const js_only[] = {"javascript"};

/* A sandboxes instance that never connects: its client points at a closed port. */
static plm_sandboxes *offline(plm_client **c, plm_sessions_mode mode, bool js)
{
    plm_client_options co;
    plm_client_options_init(&co);
    co.base_url = "http://127.0.0.1:9";
    assert_null(plm_client_new(NULL, &co, c));
    plm_sandboxes_options o;
    plm_sandboxes_options_init(&o);
    o.client = *c;
    o.sessions = mode;
    if (js) {
        o.languages = js_only;
        o.n_languages = 1;
    }
    plm_sandboxes *sb = NULL;
    assert_null(plm_sandboxes_new(&o, &sb));
    return sb;
}

/* ---------------------------------------------------------------- the output */

static void test_T04_T05_utf16_prefix_never_splits_a_code_point(void **state)
{
    bool cut;
    /* "a" (1 unit), "é" (2 bytes, 1 unit), "€" (3 bytes, 1 unit), "😀" (4 bytes, 2 units) */
    const char *s = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80z";
    size_t len = strlen(s);
    assert_int_equal(plm_utf16_prefix(s, len, 100, &cut), len);
    assert_false(cut);
    assert_int_equal(plm_utf16_prefix(s, len, 6, &cut), len); /* exactly 6 units */
    assert_false(cut);
    assert_int_equal(plm_utf16_prefix(s, len, 5, &cut), 10);
    assert_true(cut);
    assert_int_equal(plm_utf16_prefix(s, len, 4, &cut), 6); /* the pair would straddle: cut before */
    assert_true(cut);
    assert_int_equal(plm_utf16_prefix(s, len, 3, &cut), 6);
    assert_int_equal(plm_utf16_prefix(s, len, 2, &cut), 3);
    assert_int_equal(plm_utf16_prefix(s, len, 0, &cut), 0);
    assert_true(cut);
    assert_int_equal(plm_utf16_prefix("", 0, 0, &cut), 0);
    assert_false(cut);
}

static void test_T04_output_cut_truncated_and_lossy_text(void **state)
{
    /* The reference case: maxOutputChars 11, the emoji at units 11-12. */
    plm_bytes out = bytes_of("python 1: \xF0\x9F\x98\x80!"), err = bytes_of("");
    plm_code_output *o = plm_output_new("python", 0, false, &out, &err, false, 11, "container",
                                        "ab");
    assert_string_equal(o->stdout_text, "python 1: ");
    assert_true(o->truncated);
    plm_code_output_free(o);
    /* Nothing cut, but the daemon said it truncated: still truncated. */
    o = plm_output_new("python", 0, false, &out, &err, true, 100, "container", "ab");
    assert_string_equal(o->stdout_text, "python 1: \xF0\x9F\x98\x80!");
    assert_true(o->truncated);
    plm_code_output_free(o);
    /* stderr alone being cut marks the output. */
    plm_bytes long_err = bytes_of("0123456789");
    o = plm_output_new("python", 1, false, &err, &long_err, false, 4, "container", "ab");
    assert_string_equal(o->stderr_text, "0123");
    assert_string_equal(o->stdout_text, "");
    assert_true(o->truncated);
    plm_code_output_free(o);
    /* Ill-formed UTF-8 and a NUL byte become U+FFFD (each one unit). */
    unsigned char raw[] = {'a', 0xFF, 'b', 0x00, 'c'};
    plm_bytes r = {raw, sizeof raw};
    o = plm_output_new("python", 0, false, &r, NULL, false, 100, "container", "ab");
    assert_string_equal(o->stdout_text, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD" "c");
    assert_string_equal(o->stderr_text, "");
    plm_code_output_free(o);
    o = plm_output_new("python", 0, false, &r, NULL, false, 4, "container", "ab");
    assert_string_equal(o->stdout_text, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
    assert_true(o->truncated);
    plm_code_output_free(o);
    plm_code_output_free(NULL);
}

static void test_T03_T07_json_keys_in_order_and_fresh_flags_only_when_true(void **state)
{
    plm_bytes out = bytes_of("hi"), err = bytes_of("");
    const char *sha = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    plm_code_output *o = plm_output_new("python", 3, true, &out, &err, false, 100, "kernel", sha);
    o->state_kept = false;
    o->files_persist = true;
    json_t *j = plm_code_output_to_json(o);
    char *text = json_dumps(j, JSON_COMPACT);
    assert_string_equal(text, "{\"language\":\"python\",\"exitCode\":3,\"timedOut\":true,"
                              "\"stdout\":\"hi\",\"stderr\":\"\",\"truncated\":false,"
                              "\"stateKept\":false,\"filesPersist\":true,\"isolation\":\"kernel\","
                              "\"recordSha256\":\"0123456789abcdef0123456789abcdef0123456789abcdef"
                              "0123456789abcdef\"}");
    free(text);
    json_decref(j);
    o->fresh_interpreter = o->fresh_sandbox = o->state_kept = true;
    j = plm_code_output_to_json(o);
    static const char *const order[] = {"language", "exitCode", "timedOut", "stdout", "stderr",
                                        "truncated", "stateKept", "freshInterpreter",
                                        "filesPersist", "freshSandbox", "isolation",
                                        "recordSha256"};
    size_t i = 0;
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v) {
        assert_true(i < sizeof order / sizeof order[0]);
        assert_string_equal(k, order[i++]);
    }
    assert_int_equal(i, 12);
    assert_true(json_is_true(json_object_get(j, "freshInterpreter")));
    assert_true(json_is_true(json_object_get(j, "freshSandbox")));
    json_decref(j);
    plm_code_output_free(o);
    assert_null(plm_code_output_to_json(NULL));
}

static plm_result *project_result(plm_outcome outcome, size_t steps)
{
    plm_result *r = calloc(1, sizeof *r);
    r->kind = PLM_KIND_PROJECT;
    r->isolation = strdup("container");
    r->record.record_sha256 = strdup("ff");
    r->outcome = outcome;
    r->outcome_detail = strdup("the relay lost its report");
    r->steps = calloc(steps ? steps : 1, sizeof *r->steps);
    r->n_steps = steps;
    for (size_t i = 0; i < steps; i++) {
        r->steps[i].command = strdup("python3 -I .plimsoll/run.py");
        r->steps[i].stdout_bytes.data = (unsigned char *)strdup(i ? "second" : "first\n");
        r->steps[i].stdout_bytes.len = strlen((char *)r->steps[i].stdout_bytes.data);
        r->steps[i].exit_code = (int32_t)i + 2;
    }
    return r;
}

static void test_X59_a_fresh_run_without_a_step_report_may_have_run(void **state)
{
    plm_code_output *out = NULL;
    plm_error *e = plm_fresh_output(project_result(PLM_OUTCOME_PROTOCOL_ERROR, 0), "python",
                                    100, &out);
    assert_null(out);
    assert_non_null(e);
    assert_int_equal(e->code, PLM_UNKNOWN);
    assert_int_equal(e->not_dispatched, PLM_REFUSAL_NONE);
    assert_string_equal(e->message, "plimsoll: the run ended protocol_error without a step report "
                                    "(the relay lost its report). It was not retried; running it "
                                    "again could repeat what it did.");
    assert_non_null(e->result);
    assert_int_equal(e->result->outcome, PLM_OUTCOME_PROTOCOL_ERROR);
    plm_error_free(e);
}

static void test_X60_a_fresh_output_comes_from_the_first_step(void **state)
{
    plm_code_output *out = NULL;
    plm_result *r = project_result(PLM_OUTCOME_TIMED_OUT, 2);
    assert_null(plm_fresh_output(r, "python", 100, &out));
    assert_string_equal(out->stdout_text, "first\n");
    assert_int_equal(out->exit_code, 2);
    assert_true(out->timed_out); /* the outcome says timed_out, the step does not */
    assert_false(out->state_kept || out->files_persist || out->fresh_interpreter ||
                 out->fresh_sandbox);
    assert_string_equal(out->isolation, "container");
    assert_string_equal(out->record_sha256, "ff");
    plm_code_output_free(out);
    r = project_result(PLM_OUTCOME_COMPLETED, 1);
    r->steps[0].timed_out = true;
    r->steps[0].stderr_truncated = true;
    assert_null(plm_fresh_output(r, "python", 100, &out));
    assert_true(out->timed_out);
    assert_true(out->truncated);
    plm_code_output_free(out);
}

/* ---------------------------------------------------------------- the description */

static void test_T09_T10_the_description_in_both_scopes(void **state)
{
    char *conv = plm_tool_description(NULL, false), *fresh = plm_tool_description(NULL, true);
    static const char lead[] = "Run Python or JavaScript (Node.js) in an isolated sandbox with "
                               "no network access (beyond any API the operator granted)";
    const char *order[] = {lead,
                           "exit code, stdout and stderr", "last expression",
                           "Within one conversation", "pass it in files rather than pasting",
                           "relative path", "isolation tier", "SHA-256 of the run record"};
    const char *at = conv;
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        const char *p = strstr(at, order[i]);
        if (!p)
            fail_msg("\"%s\" is missing or out of order in: %s", order[i], conv);
        at = p;
    }
    for (const char *w = "stateKept\0freshInterpreter\0freshSandbox\0filesPersist\0"; *w;
         w += strlen(w) + 1)
        contains(conv, w);
    contains(fresh, "Every call uses a fresh sandbox");
    contains(fresh, "stateKept and filesPersist are false");
    contains(fresh, "pass it in files rather than pasting");
    contains(fresh, "SHA-256 of the run record");
    assert_null(strstr(fresh, "can still be there"));
    assert_null(strstr(fresh, "filesPersist is true"));
    assert_null(strstr(fresh, "keeps an interpreter"));
    assert_null(strstr(fresh, "Within one conversation"));
    free(conv);
    free(fresh);
}

static void test_T10_T11_the_description_follows_the_instance_and_never_connects(void **state)
{
    plm_client *c;
    plm_sandboxes *sb = offline(&c, PLM_SESSIONS_NEVER, true);
    char *d = plm_tool_description(sb, false); /* never: fresh whatever is asked */
    contains(d, "Run JavaScript (Node.js) in an isolated sandbox");
    assert_null(strstr(d, "Python"));
    contains(d, "Every call uses a fresh sandbox");
    free(d);
    plm_sandboxes_free(sb);
    plm_client_free(c);
    sb = offline(&c, PLM_SESSIONS_AUTO, false);
    d = plm_tool_description(sb, false);
    contains(d, "Within one conversation");
    free(d);
    assert_int_equal(plm_sandboxes_count(sb), 0);
    plm_sandboxes_free(sb);
    plm_client_free(c);
}

/* ---------------------------------------------------------------- the parameters */

static void test_T01_T02_the_parameters_schema(void **state)
{
    json_t *p = plm_tool_parameters(NULL);
    assert_string_equal(json_string_value(json_object_get(p, "type")), "object");
    json_t *req = json_object_get(p, "required");
    assert_int_equal(json_array_size(req), 1);
    assert_string_equal(json_string_value(json_array_get(req, 0)), "code");
    json_t *props = json_object_get(p, "properties");
    json_t *code = json_object_get(props, "code");
    assert_string_equal(json_string_value(json_object_get(code, "type")), "string");
    assert_int_equal(json_integer_value(json_object_get(code, "minLength")), 1);
    json_t *lang = json_object_get(props, "language");
    json_t *choices = json_object_get(lang, "enum");
    assert_int_equal(json_array_size(choices), 2);
    assert_string_equal(json_string_value(json_array_get(choices, 0)), "python");
    assert_string_equal(json_string_value(json_array_get(choices, 1)), "javascript");
    assert_string_equal(json_string_value(json_object_get(lang, "default")), "python");
    json_t *files = json_object_get(props, "files");
    assert_string_equal(json_string_value(json_object_get(files, "type")), "array");
    assert_int_equal(json_integer_value(json_object_get(files, "maxItems")), 198);
    json_t *item = json_object_get(files, "items");
    json_t *path = json_object_get(json_object_get(item, "properties"), "path");
    json_t *content = json_object_get(json_object_get(item, "properties"), "content");
    assert_int_equal(json_integer_value(json_object_get(path, "minLength")), 1);
    assert_string_equal(json_string_value(json_object_get(content, "type")), "string");
    assert_null(json_object_get(content, "minLength"));
    assert_int_equal(json_array_size(json_object_get(item, "required")), 2);
    json_decref(p);

    plm_client *c;
    plm_sandboxes *sb = offline(&c, PLM_SESSIONS_AUTO, true);
    p = plm_tool_parameters(sb);
    lang = json_object_get(json_object_get(p, "properties"), "language");
    assert_int_equal(json_array_size(json_object_get(lang, "enum")), 1);
    assert_string_equal(json_string_value(json_object_get(lang, "default")), "javascript");
    contains(json_string_value(json_object_get(lang, "description")), "Default \"javascript\"");
    json_decref(p);
    plm_sandboxes_free(sb);
    plm_client_free(c);
}

static void test_options_are_checked(void **state)
{
    plm_client *c;
    plm_sandboxes_free(offline(&c, PLM_SESSIONS_AUTO, false));
    plm_sandboxes_options o;
    plm_sandboxes_options_init(&o);
    o.client = c;
    plm_sandboxes *sb = NULL;
    const char *const twice[] = {"python", "python"}, *const cobol[] = {"cobol"};
    o.languages = twice;
    o.n_languages = 2;
    plm_error *e = plm_sandboxes_new(&o, &sb);
    assert_non_null(e);
    plm_error_free(e);
    o.languages = cobol;
    o.n_languages = 1;
    e = plm_sandboxes_new(&o, &sb);
    assert_non_null(e);
    plm_error_free(e);
    o.n_languages = 0;
    o.minimum_isolation = "none";
    e = plm_sandboxes_new(&o, &sb);
    assert_non_null(e);
    plm_error_free(e);
    assert_null(sb);
    plm_client_free(c);
}

/* ---------------------------------------------------------------- the runners, for real */

typedef struct proc_out {
    int status;
    char out[4096], err[4096];
} proc_out;

static void read_all(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(fd, buf + n, cap - 1 - n)) > 0)
        n += (size_t)r;
    buf[n] = '\0';
}

/* Runs `sh -c cmd` in `dir` as a daemon runs a project step; stderr goes to a file so
 * neither pipe can fill while the other is read. */
static void sh_in(const char *dir, const char *cmd, proc_out *p)
{
    char err_path[512];
    snprintf(err_path, sizeof err_path, "%s/.stderr", dir);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int ef = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (chdir(dir) != 0 || ef < 0)
            _exit(126);
        dup2(fds[1], STDOUT_FILENO);
        dup2(ef, STDERR_FILENO);
        close(fds[0]);
        close(fds[1]);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    read_all(fds[0], p->out, sizeof p->out);
    close(fds[0]);
    waitpid(pid, &p->status, 0);
    int ef = open(err_path, O_RDONLY);
    read_all(ef, p->err, sizeof p->err);
    close(ef);
    unlink(err_path);
}

static void write_file(const char *dir, const char *path, const char *content)
{
    char full[512];
    snprintf(full, sizeof full, "%s/%s", dir, path);
    char *slash = strrchr(full, '/');
    *slash = '\0';
    mkdir(full, 0700);
    *slash = '/';
    FILE *f = fopen(full, "w");
    assert_non_null(f);
    fputs(content, f);
    fclose(f);
}

/* Writes a fresh project (the extra files, the cell, the runner) into a new directory
 * and runs its step there, with `env` (e.g. "LC_ALL=C ") before the step's command. */
static void run_fresh(const char *language, const char *code, const plm_file *extra, size_t n,
                      const char *env, proc_out *p)
{
    char dir[] = "/tmp/plm-runner-XXXXXX";
    assert_non_null(mkdtemp(dir));
    const plm_runner *r = plm_runner_for(language);
    assert_non_null(r);
    size_t total;
    plm_file *files = plm_fresh_files(r, code, extra, n, &total);
    assert_int_equal(total, n + 2);
    assert_string_equal(files[n].path, r->cell_path);
    assert_string_equal(files[n + 1].path, r->runner_path);
    for (size_t i = 0; i < total; i++)
        write_file(dir, files[i].path, files[i].content);
    free(files);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s%s", env ? env : "", r->step);
    sh_in(dir, cmd, p);
    char rm[600];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    assert_int_equal(system(rm), 0);
}

static void expect_stdout(const proc_out *p, const char *want)
{
    if (!WIFEXITED(p->status) || WEXITSTATUS(p->status) != 0 || strcmp(p->out, want) != 0)
        fail_msg("status %d, stdout \"%s\" (wanted \"%s\"), stderr: %s", p->status, p->out, want,
                 p->err);
}

static void test_X10_the_runners_steps_and_paths(void **state)
{
    const plm_runner *py = plm_runner_for("python"), *js = plm_runner_for("javascript");
    assert_string_equal(py->step, "python3 -I .plimsoll/run.py");
    assert_string_equal(py->cell_path, ".plimsoll/cell.py");
    assert_string_equal(py->runner_path, ".plimsoll/run.py");
    assert_string_equal(js->step, "node --expose-internals .plimsoll/run.cjs");
    assert_string_equal(js->cell_path, ".plimsoll/cell.js");
    assert_string_equal(js->runner_path, ".plimsoll/run.cjs");
    assert_null(plm_runner_for("cobol"));
    assert_null(plm_runner_for(NULL));
    assert_string_equal(plm_outcome_name(PLM_OUTCOME_SETUP_FAILED), "setup_failed");
}

static void test_X41_the_snippet_runner_prints_the_last_value_under_node(void **state)
{
    char *snippet = plm_snippet_runner("console.log(\"printed\"); 1 + 2 + 3");
    char dir[] = "/tmp/plm-snippet-XXXXXX";
    assert_non_null(mkdtemp(dir));
    write_file(dir, "snippet.js", snippet);
    free(snippet);
    proc_out p;
    sh_in(dir, "node -e \"$(cat snippet.js)\"", &p);
    expect_stdout(&p, "printed\n6\n");
    snippet = plm_snippet_runner("Promise.resolve({a: [1, {b: 2}]})"); /* awaited, inspected */
    write_file(dir, "snippet.js", snippet);
    free(snippet);
    sh_in(dir, "node -e \"$(cat snippet.js)\"", &p);
    expect_stdout(&p, "{ a: [ 1, { b: 2 } ] }\n");
    snippet = plm_snippet_runner("throw new Error('boom')");
    write_file(dir, "snippet.js", snippet);
    free(snippet);
    sh_in(dir, "node -e \"$(cat snippet.js)\"", &p);
    assert_true(WIFEXITED(p.status) && WEXITSTATUS(p.status) != 0);
    contains(p.err, "boom");
    char rm[600];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    assert_int_equal(system(rm), 0);
    assert_null(plm_snippet_runner("\xC3("));
}

static void test_X42_the_javascript_runner_runs_what_a_session_cell_runs(void **state)
{
    proc_out p;
    run_fresh("javascript", "console.log(\"printed\"); 1 + 2 + 3", NULL, 0, NULL, &p);
    expect_stdout(&p, "printed\n6\n");
    plm_file helper = {"helper.js", "module.exports = { three: 3 };\n"};
    run_fresh("javascript",
              "const h = require('./helper.js');\nconst v = await Promise.resolve(h.three);\nv + 3",
              &helper, 1, NULL, &p);
    expect_stdout(&p, "6\n");
    run_fresh("javascript",
              "`${typeof module} ${typeof exports} ${typeof require} ${__dirname} ${__filename}`",
              NULL, 0, NULL, &p);
    expect_stdout(&p, "'object object function . [eval]'\n");
    run_fresh("javascript", "let x = 1;", NULL, 0, NULL, &p); /* undefined prints nothing */
    expect_stdout(&p, "");
    run_fresh("javascript", "throw new Error('boom')", NULL, 0, NULL, &p);
    assert_true(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 1);
    contains(p.err, "boom");
}

static void test_X43_the_python_runner_runs_what_a_session_cell_runs(void **state)
{
    proc_out p;
    run_fresh("python", "print(\"printed\")\n1 + 2 + 3", NULL, 0, NULL, &p);
    expect_stdout(&p, "printed\n6\n");
    /* Work-directory files named like the runner's own modules replace none of them;
     * the cell's own imports find the work directory, as a session kernel's do. */
    static const char shadow[] = "raise SystemExit('the work directory shadowed a module')\n";
    plm_file files[] = {{"helper.py", "three = 3\n"}, {"json.py", shadow},
                        {"asyncio.py", shadow}, {"ast.py", shadow}, {"inspect.py", shadow},
                        {"linecache.py", shadow}};
    run_fresh("python", "import helper\nimport asyncio\nawait asyncio.sleep(0)\nhelper.three + 3",
              files, sizeof files / sizeof files[0], NULL, &p);
    expect_stdout(&p, "6\n");
    run_fresh("python",
              "import asyncio\n\nasync def main():\n    return 41\n\n"
              "if __name__ == '__main__':\n    x = asyncio.run(main())\nx + 1",
              NULL, 0, NULL, &p);
    expect_stdout(&p, "42\n");
    run_fresh("python", "x = None\nx", NULL, 0, NULL, &p); /* None prints nothing */
    expect_stdout(&p, "");
    run_fresh("python", "1 / 0", NULL, 0, NULL, &p);
    assert_true(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 1);
    contains(p.err, "ZeroDivisionError");
}

static void test_X43_the_python_runner_reads_utf8_under_a_c_locale(void **state)
{
    /* The step as the image runs it, with the locale and UTF-8 mode forced off. */
    char dir[] = "/tmp/plm-locale-XXXXXX";
    assert_non_null(mkdtemp(dir));
    const plm_runner *r = plm_runner_for("python");
    write_file(dir, r->cell_path, "len(\"h\xC3\xA9llo\")");
    write_file(dir, r->runner_path, r->source);
    proc_out p;
    sh_in(dir, "LC_ALL=C python3 -X utf8=0 -I .plimsoll/run.py", &p);
    expect_stdout(&p, "5\n");
    char rm[600];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    assert_int_equal(system(rm), 0);
}

/* ---------------------------------------------------------------- the owner digest */

static void test_X58_the_owner_digest_vectors(void **state)
{
    plm_hex h;
    plm_owner_digest("golden-token-0123456789abcdefghijklmnop", "alice@example.com", h);
    assert_string_equal(h, "a7305a43c4fad079f2784707cb25f3deee16b1c4d7da700ee664f5657084f80b");
    plm_owner_digest(NULL, "alice@example.com", h);
    assert_string_equal(h, "b261355cb5012097b8b4ca487cfe786bf9a7fcbc616c9c2fc38469a1c3e5bc8e");
    char token[97];
    memset(token, 'x', 96);
    token[96] = '\0';
    plm_owner_digest(token, "alice@example.com", h);
    assert_string_equal(h, "8ba693de695d11b0bc31a1f6d91c883f07cceca84910df18d7fbb918ee799c8f");
}

int main(void)
{
    plm_global_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_T04_T05_utf16_prefix_never_splits_a_code_point),
        cmocka_unit_test(test_T04_output_cut_truncated_and_lossy_text),
        cmocka_unit_test(test_T03_T07_json_keys_in_order_and_fresh_flags_only_when_true),
        cmocka_unit_test(test_X59_a_fresh_run_without_a_step_report_may_have_run),
        cmocka_unit_test(test_X60_a_fresh_output_comes_from_the_first_step),
        cmocka_unit_test(test_T09_T10_the_description_in_both_scopes),
        cmocka_unit_test(test_T10_T11_the_description_follows_the_instance_and_never_connects),
        cmocka_unit_test(test_T01_T02_the_parameters_schema),
        cmocka_unit_test(test_options_are_checked),
        cmocka_unit_test(test_X10_the_runners_steps_and_paths),
        cmocka_unit_test(test_X41_the_snippet_runner_prints_the_last_value_under_node),
        cmocka_unit_test(test_X42_the_javascript_runner_runs_what_a_session_cell_runs),
        cmocka_unit_test(test_X43_the_python_runner_runs_what_a_session_cell_runs),
        cmocka_unit_test(test_X43_the_python_runner_reads_utf8_under_a_c_locale),
        cmocka_unit_test(test_X58_the_owner_digest_vectors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

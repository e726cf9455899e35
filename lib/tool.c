/*
 * tool.c — the executeCode tool as a model sees it (docs/client.md §7): the output of one
 * call, cut to the model's budget and in the reference's key order; the description;
 * the JSON Schema of the parameters.
 */
#include "internal.h"
#include "sandboxes_internal.h"

#include <stdlib.h>
#include <string.h>

static const char *const default_languages[] = {"python", "javascript"};

/* ---------------------------------------------------------------- outputs */

size_t plm_utf16_prefix(const char *s, size_t len, size_t max, bool *cut)
{
    size_t units = 0, i = 0;
    while (i < len) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        if (k > len - i)
            k = len - i; /* not reached on well-formed text; never read past the end */
        /* A code point above U+FFFF is a surrogate pair in UTF-16: two units, kept whole. */
        size_t u = k == 4 ? 2 : 1;
        if (units + u > max) {
            *cut = true;
            return i;
        }
        units += u;
        i += k;
    }
    *cut = false;
    return len;
}

/* The stream as text: ill-formed UTF-8 as U+FFFD, like the reference's TextDecoder.  A
 * NUL byte cannot live in a C string, so it becomes U+FFFD as well; it still counts as
 * one unit, as U+0000 would. */
static char *stream_text(const plm_bytes *b)
{
    size_t nuls = 0, len = b && b->data ? b->len : 0;
    for (size_t i = 0; i < len; i++)
        nuls += b->data[i] == 0;
    if (!nuls)
        return plm_utf8_lossy(len ? b->data : (const unsigned char *)"", len, NULL);
    unsigned char *clean = malloc(len + 2 * nuls + 1);
    if (!clean)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if (b->data[i]) {
            clean[o++] = b->data[i];
        } else {
            memcpy(clean + o, "\xEF\xBF\xBD", 3);
            o += 3;
        }
    }
    char *text = plm_utf8_lossy(clean, o, NULL);
    free(clean);
    return text;
}

/* Cuts `text` in place to `max` units; returns whether it cut. */
static bool cut_to(char *text, size_t max)
{
    bool cut = false;
    if (text)
        text[plm_utf16_prefix(text, strlen(text), max, &cut)] = '\0';
    return cut;
}

plm_code_output *plm_output_new(const char *language, int32_t exit_code, bool timed_out,
                                const plm_bytes *out, const plm_bytes *err,
                                bool daemon_truncated, size_t max, const char *isolation,
                                const char *record_sha256)
{
    plm_code_output *o = calloc(1, sizeof *o);
    if (!o)
        return NULL;
    o->language = plm_strdup_or_empty(language);
    o->exit_code = exit_code;
    o->timed_out = timed_out;
    o->stdout_text = stream_text(out);
    o->stderr_text = stream_text(err);
    bool cut_out = cut_to(o->stdout_text, max);
    bool cut_err = cut_to(o->stderr_text, max);
    o->truncated = daemon_truncated || cut_out || cut_err;
    o->isolation = plm_strdup_or_empty(isolation);
    o->record_sha256 = plm_strdup_or_empty(record_sha256);
    if (!o->language || !o->stdout_text || !o->stderr_text || !o->isolation ||
        !o->record_sha256) {
        plm_code_output_free(o);
        return NULL;
    }
    return o;
}

plm_error *plm_fresh_output(plm_result *r, const char *language, size_t max,
                            plm_code_output **out)
{
    *out = NULL;
    if (r->kind == PLM_KIND_JAVASCRIPT) {
        *out = plm_output_new(language, r->exit_code, r->timed_out, &r->stdout_bytes,
                              &r->stderr_bytes, r->stdout_truncated || r->stderr_truncated,
                              max, r->isolation, r->record.record_sha256);
    } else if (r->n_steps == 0) {
        /* The outcome says what ended the run, not whether the code had started: there is
         * no exit code to give, and running it again could repeat what it did. */
        plm_error *e = plm_err_new(PLM_UNKNOWN, PLM_REFUSAL_NONE,
                                   "plimsoll: the run ended %s without a step report (%s). It "
                                   "was not retried; running it again could repeat what it did.",
                                   plm_outcome_name(r->outcome),
                                   r->outcome_detail ? r->outcome_detail : "");
        if (e)
            e->result = r;
        else
            plm_result_free(r);
        return e;
    } else {
        const plm_step *st = &r->steps[0];
        *out = plm_output_new(language, st->exit_code,
                              st->timed_out || r->outcome == PLM_OUTCOME_TIMED_OUT,
                              &st->stdout_bytes, &st->stderr_bytes,
                              st->stdout_truncated || st->stderr_truncated, max, r->isolation,
                              r->record.record_sha256);
    }
    plm_result_free(r);
    if (!*out)
        return plm_err_new(PLM_INTERNAL, PLM_REFUSAL_NONE, "plimsoll: out of memory");
    return NULL; /* fresh runs keep nothing: every state flag stays false */
}

void plm_code_output_free(plm_code_output *o)
{
    if (!o)
        return;
    free(o->language);
    free(o->stdout_text);
    free(o->stderr_text);
    free(o->isolation);
    free(o->record_sha256);
    free(o);
}

json_t *plm_code_output_to_json(const plm_code_output *o)
{
    if (!o)
        return NULL;
    /* jansson keeps insertion order: this is the order the model sees. */
    json_t *j = json_object();
    json_object_set_new(j, "language", json_string(o->language ? o->language : ""));
    json_object_set_new(j, "exitCode", json_integer(o->exit_code));
    json_object_set_new(j, "timedOut", json_boolean(o->timed_out));
    json_object_set_new(j, "stdout", json_string(o->stdout_text ? o->stdout_text : ""));
    json_object_set_new(j, "stderr", json_string(o->stderr_text ? o->stderr_text : ""));
    json_object_set_new(j, "truncated", json_boolean(o->truncated));
    json_object_set_new(j, "stateKept", json_boolean(o->state_kept));
    if (o->fresh_interpreter) /* said only when true: the output says what is new */
        json_object_set_new(j, "freshInterpreter", json_true());
    json_object_set_new(j, "filesPersist", json_boolean(o->files_persist));
    if (o->fresh_sandbox)
        json_object_set_new(j, "freshSandbox", json_true());
    json_object_set_new(j, "isolation", json_string(o->isolation ? o->isolation : ""));
    json_object_set_new(j, "recordSha256", json_string(o->record_sha256 ? o->record_sha256 : ""));
    return j;
}

/* ---------------------------------------------------------------- the description */

static void tool_languages(const plm_sandboxes *sb, const char *const **langs, size_t *n)
{
    if (sb) {
        plm_sandboxes_languages(sb, langs, n);
    } else {
        *langs = default_languages;
        *n = PLM_ARRAY_LEN(default_languages);
    }
}

static const char *display_name(const char *language)
{
    return strcmp(language, "javascript") == 0 ? "JavaScript (Node.js)" : "Python";
}

/* Appends `s` to the malloc'd *text; on failure *text becomes NULL. */
static void append(char **text, const char *s)
{
    if (!*text)
        return;
    char *t = plm_printf("%s%s", *text, s);
    free(*text);
    *text = t;
}

char *plm_tool_description(const plm_sandboxes *sb, bool fresh_scope)
{
    const char *const *langs;
    size_t n;
    tool_languages(sb, &langs, &n);
    /* A tool that never keeps a sandbox must not promise that state survives. */
    if (sb && plm_sandboxes_mode(sb) == PLM_SESSIONS_NEVER)
        fresh_scope = true;
    char *text = plm_strdup("Run ");
    for (size_t i = 0; i < n; i++) {
        append(&text, i ? " or " : "");
        append(&text, display_name(langs[i]));
    }
    append(&text,
           " in an isolated sandbox with no network access (beyond any API the operator "
           "granted) and get back its exit code, stdout and stderr. "
           "As in a notebook, the value of the code's last expression is printed, so the last "
           "line can simply name what you want to see. ");
    if (fresh_scope)
        append(&text,
               "Every call uses a fresh sandbox and a fresh interpreter: nothing from one call "
               "is there for the next, neither variables nor files, so stateKept and "
               "filesPersist are false. Send everything a call needs with that call. ");
    else
        append(&text,
               "Within one conversation the sandbox usually keeps one interpreter per "
               "language, so variables, functions, imports and loaded data from earlier calls "
               "persist. stateKept says whether this call's interpreter and sandbox were still "
               "running when it answered, so that what it defined can be used by the next call "
               "(false after a deadline ended the interpreter, or when the sandbox ended). "
               "freshInterpreter means this call's interpreter had just started: nothing that "
               "earlier calls defined in this language exists, so rebuild what you need. "
               "freshSandbox means this call ran in a newly opened sandbox: the files of "
               "earlier calls are gone as well. filesPersist says whether the files this call "
               "was given or wrote can still be read by the next call. ");
    append(&text,
           "To give the code data, such as another tool's output, pass it in files rather "
           "than pasting it into the code; the code reads each file by its relative path. "
           "The result reports the isolation tier the code ran behind and the SHA-256 of the "
           "run record that was checked before the result was returned.");
    return text;
}

/* ---------------------------------------------------------------- the parameters */

static json_t *string_schema(size_t min_length, const char *description)
{
    json_t *s = json_pack("{s:s}", "type", "string");
    if (min_length)
        json_object_set_new(s, "minLength", json_integer((json_int_t)min_length));
    json_object_set_new(s, "description", json_string(description));
    return s;
}

json_t *plm_tool_parameters(const plm_sandboxes *sb)
{
    const char *const *langs;
    size_t n;
    tool_languages(sb, &langs, &n);
    json_t *choices = json_array();
    char *choice_text = plm_strdup("");
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(choices, json_string(langs[i]));
        char *t = plm_printf("%s%s\"%s\"", choice_text ? choice_text : "", i ? " or " : "",
                             langs[i]);
        free(choice_text);
        choice_text = t;
    }
    char *language_text = plm_printf("The language of the code: %s. Default \"%s\".",
                                     choice_text ? choice_text : "", langs[0]);
    free(choice_text);

    json_t *language = json_pack("{s:s, s:o, s:s}", "type", "string", "enum", choices,
                                 "default", langs[0]);
    json_object_set_new(language, "description", json_string(language_text ? language_text : ""));
    free(language_text);

    json_t *file = json_pack(
        "{s:s, s:{s:o, s:o}, s:[s, s], s:b}", "type", "object", "properties",
        "path", string_schema(1, "A relative path, such as data/orders.csv."),
        "content", string_schema(0, "The file's text."),
        "required", "path", "content", "additionalProperties", 0);
    json_t *files = json_pack(
        "{s:s, s:o, s:i, s:s}", "type", "array", "items", file, "maxItems",
        PLM_MAX_CALL_FILES, "description",
        "Text files written into the working directory before the code runs, for data the "
        "code should read.");

    return json_pack(
        "{s:s, s:{s:o, s:o, s:o}, s:[s], s:b}", "type", "object", "properties",
        "code", string_schema(1, "The source code to run. Print what you need, or end with an "
                                 "expression to see its value."),
        "language", language, "files", files, "required", "code", "additionalProperties", 0);
}

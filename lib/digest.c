/*
 * digest.c — the byte-exact digest encoding of docs/records.md §2: SHA-256 over
 * length-prefixed values (8-byte big-endian length, then the bytes), the domain
 * first, then each field as its name and its content.  Requests and results are
 * digested from their proto3 JSON form exactly as sent or received; records from
 * their fields.  Also tiers, software rule ids and the owner digest.
 */
#include "internal.h"

#include <math.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct enc {
    EVP_MD_CTX *ctx;
    plm_error *err;             /* first failure; later writes are ignored */
    size_t used;
    unsigned char buf[2048];    /* small values are batched: one update per field costs
                                   more than hashing the field */
} enc;

static void flush(enc *e)
{
    if (e->used)
        EVP_DigestUpdate(e->ctx, e->buf, e->used);
    e->used = 0;
}

static void put_bytes(enc *e, const void *data, size_t len)
{
    if (e->used + len > sizeof e->buf) {
        flush(e);
        if (len > sizeof e->buf / 2) {
            EVP_DigestUpdate(e->ctx, data, len);
            return;
        }
    }
    memcpy(e->buf + e->used, data, len);
    e->used += len;
}

static void put_value(enc *e, const void *data, size_t len)
{
    unsigned char n[8];
    uint64_t l = len;
    for (int i = 7; i >= 0; i--, l >>= 8)
        n[i] = (unsigned char)(l & 0xff);
    put_bytes(e, n, sizeof n);
    if (len)
        put_bytes(e, data, len);
}

static void put_field(enc *e, const char *name, const void *data, size_t len)
{
    put_value(e, name, strlen(name));
    put_value(e, data, len);
}

static void put_str(enc *e, const char *name, const char *s, size_t len)
{
    if (!plm_utf8_valid(s, len) && !e->err)
        e->err = plm_err_new(PLM_DATA_LOSS, PLM_REFUSAL_NONE,
                             "plimsoll: the digest field %s is not well-formed UTF-8", name);
    put_field(e, name, s, len);
}

static void put_cstr(enc *e, const char *name, const char *s)
{
    put_str(e, name, s ? s : "", s ? strlen(s) : 0);
}

static void put_int(enc *e, const char *name, int64_t v)
{
    char b[PLM_INT_TEXT];
    put_field(e, name, b, plm_i64_text(b, v));
}

static void put_uint(enc *e, const char *name, uint64_t v)
{
    char b[PLM_INT_TEXT];
    put_field(e, name, b, plm_u64_text(b, v));
}

static void put_bool(enc *e, const char *name, bool v)
{
    put_field(e, name, v ? "true" : "false", v ? 4 : 5);
}

static void double_bits(double d, unsigned char out[8])
{
    uint64_t bits;
    if (isnan(d))
        bits = 0x7ff8000000000000ULL; /* the daemon sends every NaN as the quiet NaN */
    else
        memcpy(&bits, &d, sizeof bits);
    for (int i = 7; i >= 0; i--, bits >>= 8)
        out[i] = (unsigned char)(bits & 0xff);
}

/* SHA-256 fetched once.  EVP_sha256() makes OpenSSL 3 look the algorithm up again at
 * every EVP_DigestInit_ex (about 400 ns of a 600 ns small digest, under a lock), and a
 * verified call makes half a dozen digests.  Never freed: it lives as long as the
 * process, as OpenSSL's own table does. */
static EVP_MD *fetched_sha256;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;

static void fetch_sha256(void)
{
    fetched_sha256 = EVP_MD_fetch(NULL, "SHA2-256", NULL);
}

static const EVP_MD *sha256(void)
{
    pthread_once(&sha256_once, fetch_sha256);
    return fetched_sha256 ? fetched_sha256 : EVP_sha256();
}

static bool enc_begin(enc *e, const char *domain)
{
    e->err = NULL;
    e->used = 0;
    e->ctx = EVP_MD_CTX_new();
    if (!e->ctx || EVP_DigestInit_ex(e->ctx, sha256(), NULL) != 1) {
        EVP_MD_CTX_free(e->ctx);
        e->ctx = NULL;
        return false;
    }
    put_value(e, domain, strlen(domain));
    return true;
}

void plm_hex_encode(const void *data, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    const unsigned char *d = data;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[d[i] >> 4];
        out[2 * i + 1] = digits[d[i] & 15];
    }
    out[2 * n] = '\0';
}

unsigned char *plm_dsse_pae(const char *type, const void *payload, size_t len,
                            size_t *out_len)
{
    char head[160];
    int h = snprintf(head, sizeof head, "DSSEv1 %zu %s %zu ", strlen(type), type, len);
    if (h < 0 || (size_t)h >= sizeof head)
        return NULL;
    unsigned char *pae = malloc((size_t)h + len + 1);
    if (!pae)
        return NULL;
    memcpy(pae, head, (size_t)h);
    memcpy(pae + h, payload, len);
    *out_len = (size_t)h + len;
    return pae;
}

static plm_error *enc_end(enc *e, plm_hex hex)
{
    unsigned char md[32];
    unsigned int n = 0;
    flush(e);
    EVP_DigestFinal_ex(e->ctx, md, &n);
    EVP_MD_CTX_free(e->ctx);
    e->ctx = NULL;
    if (e->err) {
        hex[0] = '\0';
        return e->err;
    }
    plm_hex_encode(md, 32, hex);
    return NULL;
}

void plm_sha256_hex(const void *data, size_t len, plm_hex hex)
{
    unsigned char md[32];
    unsigned int n = 0;
    if (!hex)
        return;
    if (!data)
        len = 0;
    EVP_Digest(data, len, md, &n, sha256(), NULL);
    plm_hex_encode(md, 32, hex);
}

/* ---------------------------------------------------------------- JSON fields */

/* Each reader records the first malformed value in e->err and writes the zero value,
 * so the digest walk stays linear and the failure surfaces at the end. */
static void set_err(enc *e, plm_error *err);

static void jstr(enc *e, const json_t *obj, const char *camel, const char *snake,
                 const char *field)
{
    const char *s = "";
    plm_error *err = NULL;
    const json_t *v = plm_jget(obj, camel, snake);
    if (plm_jstring(v, field, &s, &err) < 0) {
        set_err(e, err);
        s = "";
    }
    put_str(e, field, s, json_is_string(v) ? json_string_length(v) : 0);
}

static void set_err(enc *e, plm_error *err)
{
    if (!e->err)
        e->err = err;
    else
        plm_error_free(err);
}

static int64_t jint(enc *e, const json_t *obj, const char *camel, const char *snake,
                    const char *what)
{
    int64_t v = 0;
    plm_error *err = NULL;
    if (plm_jint64(plm_jget(obj, camel, snake), what, &v, &err) < 0)
        set_err(e, err);
    return v;
}

static bool jbool(enc *e, const json_t *obj, const char *camel, const char *snake,
                  const char *what)
{
    bool v = false;
    plm_error *err = NULL;
    if (plm_jbool(plm_jget(obj, camel, snake), what, &v, &err) < 0)
        set_err(e, err);
    return v;
}

static void jbytes(enc *e, const json_t *obj, const char *camel, const char *field)
{
    plm_bytes b;
    plm_error *err = NULL;
    if (plm_jbytes(plm_jget(obj, camel, NULL), field, &b, &err) < 0) {
        set_err(e, err);
        put_field(e, field, "", 0);
        return;
    }
    put_field(e, field, b.data, b.len);
    free(b.data);
}

static size_t jlist(enc *e, const json_t *obj, const char *camel, const char *snake,
                    const json_t **arr)
{
    size_t n = 0;
    plm_error *err = NULL;
    if (plm_jarray(plm_jget(obj, camel, snake), camel, arr, &n, &err) < 0)
        set_err(e, err);
    return n;
}

/* A list of strings, each one field named `field`, preceded by the count. */
static void jstrings(enc *e, const json_t *obj, const char *camel, const char *snake,
                     const char *count_field, const char *field)
{
    const json_t *arr;
    size_t n = jlist(e, obj, camel, snake, &arr);
    put_uint(e, count_field, n);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(arr, i);
        const char *s = "";
        plm_error *err = NULL;
        if (plm_jstring(v, field, &s, &err) < 0)
            set_err(e, err);
        put_str(e, field, s, json_is_string(v) ? json_string_length(v) : 0);
    }
}

static void jfiles(enc *e, const json_t *payload)
{
    const json_t *arr;
    size_t n = jlist(e, payload, "files", NULL, &arr);
    put_uint(e, "files", n);
    for (size_t i = 0; i < n; i++) {
        const json_t *f = json_array_get(arr, i);
        if (!json_is_object(f))
            set_err(e, plm_err_malformed("a file is not an object"));
        jstr(e, f, "path", NULL, "file_path");
        jstr(e, f, "content", NULL, "file_content");
    }
}

static void jdoubles(enc *e, const json_t *arr_v, const char *field)
{
    const json_t *arr;
    size_t n = 0;
    plm_error *err = NULL;
    if (plm_jarray(arr_v, field, &arr, &n, &err) < 0)
        set_err(e, err);
    unsigned char *buf = calloc(n ? n : 1, 8);
    for (size_t i = 0; buf && i < n; i++) {
        double d = 0;
        if (plm_jdouble(json_array_get(arr, i), field, &d, &err) < 0)
            set_err(e, err);
        double_bits(d, buf + 8 * i);
    }
    put_field(e, field, buf, buf ? n * 8 : 0);
    free(buf);
}

static void jdouble1(enc *e, const json_t *obj, const char *camel, const char *snake,
                     const char *field)
{
    double d = 0;
    unsigned char b[8];
    plm_error *err = NULL;
    if (plm_jdouble(plm_jget(obj, camel, snake), field, &d, &err) < 0)
        set_err(e, err);
    double_bits(d, b);
    put_field(e, field, b, 8);
}

static const json_t *payload_of(const json_t *msg, const char *kind)
{
    const json_t *p = plm_jget(msg, kind, NULL);
    return (p && !json_is_null(p)) ? p : NULL;
}

/* ---------------------------------------------------------------- request digest */

static plm_error *null_arg(const char *what)
{
    return plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_NONE, "plimsoll: %s is required", what);
}

plm_error *plm_request_digest(const json_t *req, plm_hex hex)
{
    enc e;
    if (!req || !hex)
        return null_arg(req ? "the digest's output" : "the request");
    if (!json_is_object(req))
        return plm_err_malformed("the request is not a JSON object");
    int64_t protocol = 0;
    plm_error *err = NULL;
    if (plm_jint64(plm_jget(req, "protocol", NULL), "protocol", &protocol, &err) < 0)
        return err;
    if (!enc_begin(&e, protocol >= 2 ? "plimsoll.run-request.v2" : "plimsoll.run-request.v1"))
        return plm_err_new(PLM_INTERNAL, PLM_REFUSAL_NONE, "plimsoll: SHA-256 unavailable");
    put_int(&e, "protocol", protocol);
    jstr(&e, req, "minimumIsolation", "minimum_isolation", "minimum_isolation");
    put_int(&e, "timeout_ms", jint(&e, req, "timeoutMs", "timeout_ms", "timeoutMs"));
    if (protocol >= 2) {
        const json_t *rule = plm_jget(req, "softwareRule", "software_rule");
        if (rule && json_is_null(rule))
            rule = NULL;
        if (rule && !json_is_object(rule))
            set_err(&e, plm_err_malformed("softwareRule is not an object"));
        jstr(&e, rule, "mode", NULL, "software_mode");
        jstrings(&e, rule, "identities", NULL, "software_identities", "software_identity");
    }
    /* Precedence javascript, project, cell, module (docs/records.md §3). */
    const json_t *p;
    if ((p = payload_of(req, "javascript"))) {
        put_cstr(&e, "kind", "javascript");
        jstr(&e, p, "code", NULL, "code");
        jstr(&e, p, "grantProfile", "grant_profile", "grant_profile");
    } else if ((p = payload_of(req, "project"))) {
        put_cstr(&e, "kind", "project");
        jstr(&e, p, "grantProfile", "grant_profile", "grant_profile");
        jfiles(&e, p);
        jstrings(&e, p, "steps", NULL, "steps", "step_command");
        jstrings(&e, p, "artifacts", NULL, "artifacts", "artifact_path");
    } else if ((p = payload_of(req, "cell"))) {
        put_cstr(&e, "kind", "cell");
        jstr(&e, p, "language", NULL, "language");
        jstr(&e, p, "code", NULL, "code");
        jfiles(&e, p);
    } else if ((p = payload_of(req, "module"))) {
        put_cstr(&e, "kind", "module");
        jstr(&e, p, "model", NULL, "model");
        jdouble1(&e, p, "endTime", "end_time", "end_time");
        jdouble1(&e, p, "step", NULL, "step");
        const json_t *rows;
        size_t n = jlist(&e, p, "rows", NULL, &rows);
        put_uint(&e, "rows", n);
        for (size_t i = 0; i < n; i++)
            jdoubles(&e, plm_jget(json_array_get(rows, i), "values", NULL), "row_values");
    } else {
        put_cstr(&e, "kind", "");
    }
    return enc_end(&e, hex);
}

/* ---------------------------------------------------------------- result digest */

static const char *const outcome_names[] = {
    "PROJECT_OUTCOME_UNSPECIFIED", "PROJECT_OUTCOME_COMPLETED", "PROJECT_OUTCOME_SETUP_FAILED",
    "PROJECT_OUTCOME_TIMED_OUT", "PROJECT_OUTCOME_PROTOCOL_ERROR",
};

/* The ProjectOutcome number of a name or number; an unknown name is -1, which then
 * fails the digest check (as the TypeScript client hashes it). */
static int64_t outcome_number(enc *e, const json_t *v)
{
    if (!v || json_is_null(v))
        return 0;
    if (json_is_integer(v))
        return json_integer_value(v);
    if (json_is_string(v)) {
        for (size_t i = 0; i < PLM_ARRAY_LEN(outcome_names); i++) {
            if (strcmp(json_string_value(v), outcome_names[i]) == 0)
                return (int64_t)i;
        }
        return -1;
    }
    set_err(e, plm_err_malformed("outcome is not an enum"));
    return 0;
}

/* A run's or a project step's streams, under their canonical names (PREFIX "stdout"). */
#define STREAM_NAMES(prefix) \
    { prefix "stdout", prefix "stderr", prefix "stdout_truncated", prefix "stderr_truncated" }
static const char *const run_streams[4] = STREAM_NAMES("");
static const char *const step_streams[4] = STREAM_NAMES("step_");

static void stream_fields(enc *e, const json_t *r, const char *const name[4])
{
    jbytes(e, r, "stdout", name[0]);
    jbytes(e, r, "stderr", name[1]);
    put_bool(e, name[2], jbool(e, r, "stdoutTruncated", "stdout_truncated", "stdoutTruncated"));
    put_bool(e, name[3], jbool(e, r, "stderrTruncated", "stderr_truncated", "stderrTruncated"));
}

plm_error *plm_result_digest(const json_t *resp, plm_hex hex)
{
    enc e;
    if (!resp || !hex)
        return null_arg(resp ? "the digest's output" : "the response");
    if (!json_is_object(resp))
        return plm_err_malformed("the response is not a JSON object");
    if (!enc_begin(&e, "plimsoll.run-result.v1"))
        return plm_err_new(PLM_INTERNAL, PLM_REFUSAL_NONE, "plimsoll: SHA-256 unavailable");
    const json_t *r;
    if ((r = payload_of(resp, "javascript")) || (r = payload_of(resp, "cell"))) {
        /* javascript comes first; a cell is the javascript fields plus two flags */
        bool is_js = payload_of(resp, "javascript") != NULL;
        if (!is_js && payload_of(resp, "project"))
            r = NULL;
        if (r) {
            put_cstr(&e, "kind", is_js ? "javascript" : "cell");
            put_int(&e, "exit_code", jint(&e, r, "exitCode", "exit_code", "exitCode"));
            put_bool(&e, "timed_out", jbool(&e, r, "timedOut", "timed_out", "timedOut"));
            stream_fields(&e, r, run_streams);
            if (!is_js) {
                put_bool(&e, "interpreter_started",
                         jbool(&e, r, "interpreterStarted", "interpreter_started", "interpreterStarted"));
                put_bool(&e, "interpreter_ended",
                         jbool(&e, r, "interpreterEnded", "interpreter_ended", "interpreterEnded"));
            }
            return enc_end(&e, hex);
        }
    }
    if ((r = payload_of(resp, "project"))) {
        put_cstr(&e, "kind", "project");
        put_int(&e, "outcome", outcome_number(&e, plm_jget(r, "outcome", NULL)));
        jstr(&e, r, "outcomeDetail", "outcome_detail", "outcome_detail");
        put_bool(&e, "artifacts_truncated",
                 jbool(&e, r, "artifactsTruncated", "artifacts_truncated", "artifactsTruncated"));
        const json_t *steps;
        size_t n = jlist(&e, r, "steps", NULL, &steps);
        put_uint(&e, "steps", n);
        for (size_t i = 0; i < n; i++) {
            const json_t *s = json_array_get(steps, i);
            jstr(&e, s, "command", NULL, "step_command");
            put_int(&e, "step_exit_code", jint(&e, s, "exitCode", "exit_code", "step exitCode"));
            put_bool(&e, "step_timed_out", jbool(&e, s, "timedOut", "timed_out", "step timedOut"));
            stream_fields(&e, s, step_streams);
        }
        const json_t *arts;
        n = jlist(&e, r, "artifacts", NULL, &arts);
        put_uint(&e, "artifacts", n);
        for (size_t i = 0; i < n; i++) {
            const json_t *a = json_array_get(arts, i);
            jstr(&e, a, "path", NULL, "artifact_path");
            jbytes(&e, a, "content", "artifact_content");
        }
        return enc_end(&e, hex);
    }
    if ((r = payload_of(resp, "module"))) {
        put_cstr(&e, "kind", "module");
        put_int(&e, "outcome", outcome_number(&e, plm_jget(r, "outcome", NULL)));
        jstr(&e, r, "outcomeDetail", "outcome_detail", "outcome_detail");
        put_int(&e, "width", jint(&e, r, "width", NULL, "width"));
        jbytes(&e, r, "stdout", "stdout");
        jbytes(&e, r, "stderr", "stderr");
        const json_t *runs;
        size_t n = jlist(&e, r, "runs", NULL, &runs);
        put_uint(&e, "runs", n);
        for (size_t i = 0; i < n; i++) {
            const json_t *run = json_array_get(runs, i);
            put_int(&e, "run_status", jint(&e, run, "status", NULL, "run status"));
            jdoubles(&e, plm_jget(run, "outputs", NULL), "run_outputs");
        }
        return enc_end(&e, hex);
    }
    put_cstr(&e, "kind", "");
    return enc_end(&e, hex);
}

/* The same digest from a mapped javascript or cell result, whose streams are already
 * decoded: reading an answer decodes its output once, not once per use. */
plm_error *plm_result_digest_mapped(const plm_result *r, plm_hex hex)
{
    enc e;
    if (!r || (r->kind != PLM_KIND_JAVASCRIPT && r->kind != PLM_KIND_CELL))
        return plm_err_new(PLM_INTERNAL, PLM_REFUSAL_NONE, "plimsoll: not a stream result");
    if (!enc_begin(&e, "plimsoll.run-result.v1"))
        return plm_err_new(PLM_INTERNAL, PLM_REFUSAL_NONE, "plimsoll: SHA-256 unavailable");
    put_cstr(&e, "kind", r->kind == PLM_KIND_CELL ? "cell" : "javascript");
    put_int(&e, "exit_code", r->exit_code);
    put_bool(&e, "timed_out", r->timed_out);
    put_field(&e, "stdout", r->stdout_bytes.data, r->stdout_bytes.len);
    put_field(&e, "stderr", r->stderr_bytes.data, r->stderr_bytes.len);
    put_bool(&e, "stdout_truncated", r->stdout_truncated);
    put_bool(&e, "stderr_truncated", r->stderr_truncated);
    if (r->kind == PLM_KIND_CELL) {
        put_bool(&e, "interpreter_started", r->interpreter_started);
        put_bool(&e, "interpreter_ended", r->interpreter_ended);
    }
    return enc_end(&e, hex);
}

/* ---------------------------------------------------------------- record digest */

plm_error *plm_record_digest(const plm_record *r, plm_hex hex)
{
    enc e;
    static const char *const domain[4] = {
        NULL, "plimsoll.run-record.v1", "plimsoll.run-record.v2", "plimsoll.run-record.v3",
    };
    if (!r || !hex)
        return null_arg(r ? "the digest's output" : "the record");
    if (r->version < 1 || r->version > 3)
        return plm_err_new(PLM_DATA_LOSS, PLM_REFUSAL_NONE,
                           "plimsoll: the record's version %u is not 1, 2 or 3",
                           r ? r->version : 0);
    if (!enc_begin(&e, domain[r->version]))
        return plm_err_new(PLM_INTERNAL, PLM_REFUSAL_NONE, "plimsoll: SHA-256 unavailable");
    put_cstr(&e, "request_sha256", r->request_sha256);
    put_cstr(&e, "result_sha256", r->result_sha256);
    if (r->version >= 3)
        put_cstr(&e, "unanswered", r->unanswered);
    put_cstr(&e, "provider", r->provider);
    put_cstr(&e, "isolation", r->isolation);
    put_cstr(&e, "environment", r->environment);
    put_cstr(&e, "policy", r->policy);
    if (r->version >= 2) {
        put_cstr(&e, "software_identity", r->software_identity);
        put_cstr(&e, "software_rule_id", r->software_rule_id);
    }
    put_int(&e, "started_unix_ms", r->started_unix_ms);
    put_int(&e, "ended_unix_ms", r->ended_unix_ms);
    put_cstr(&e, "session", r->session);
    put_uint(&e, "sequence", r->sequence);
    put_cstr(&e, "previous_sha256", r->previous_sha256);
    return enc_end(&e, hex);
}

/* ---------------------------------------------------------------- rules, owners, tiers */

static int cmp_bytes(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b); /* bytewise, unsigned */
}

char *plm_software_rule_id(const json_t *rule)
{
    if (!rule || json_is_null(rule))
        return strdup("");
    if (!json_is_object(rule))
        return NULL;
    const json_t *mode = json_object_get(rule, "mode");
    if (!mode || json_is_null(mode) || (json_is_string(mode) && json_string_length(mode) == 0))
        return strdup("");
    const json_t *ids = json_object_get(rule, "identities");
    size_t n = json_array_size(ids);
    if (!json_is_array(ids) || n == 0)
        return NULL;
    const char **list = calloc(n, sizeof *list);
    if (!list)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        list[i] = json_string_value(json_array_get(ids, i));
        if (!list[i]) {
            free(list);
            return NULL;
        }
    }
    char *out;
    if (n == 1) {
        out = plm_printf("exact:%s", list[0]);
    } else {
        qsort(list, n, sizeof *list, cmp_bytes);
        EVP_MD_CTX *ctx = EVP_MD_CTX_new();
        unsigned char md[32];
        char hex[65];
        EVP_DigestInit_ex(ctx, sha256(), NULL);
        for (size_t i = 0; i < n; i++) {
            if (i)
                EVP_DigestUpdate(ctx, "", 1); /* one zero byte between identities */
            EVP_DigestUpdate(ctx, list[i], strlen(list[i]));
        }
        EVP_DigestFinal_ex(ctx, md, NULL);
        EVP_MD_CTX_free(ctx);
        plm_hex_encode(md, 32, hex);
        out = plm_printf("approved:sha256:%s", hex);
    }
    free(list);
    return out;
}

bool plm_software_rule_allows(const json_t *rule, const char *identity)
{
    if (!rule || json_is_null(rule))
        return true;
    const json_t *mode = json_object_get(rule, "mode");
    if (!mode || (json_is_string(mode) && json_string_length(mode) == 0))
        return true;
    if (!identity || !*identity)
        return false;
    size_t i;
    const json_t *v;
    json_array_foreach(json_object_get(rule, "identities"), i, v) {
        if (json_is_string(v) && strcmp(json_string_value(v), identity) == 0)
            return true;
    }
    return false;
}

void plm_owner_digest(const char *token, const char *owner, plm_hex hex)
{
    static const char key_prefix[] = "plimsoll session owner key v2\n";
    static const char msg_prefix[] = "plimsoll session owner v2\n";
    unsigned char key[32], mac[32];
    unsigned int n = 0;
    if (!hex)
        return;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    EVP_DigestInit_ex(ctx, sha256(), NULL);
    EVP_DigestUpdate(ctx, key_prefix, sizeof key_prefix - 1);
    if (token)
        EVP_DigestUpdate(ctx, token, strlen(token));
    EVP_DigestFinal_ex(ctx, key, NULL);
    EVP_MD_CTX_free(ctx);
    size_t olen = strlen(owner ? owner : "");
    unsigned char *msg = malloc(sizeof msg_prefix - 1 + olen);
    if (!msg) {
        hex[0] = '\0';
        return;
    }
    memcpy(msg, msg_prefix, sizeof msg_prefix - 1);
    memcpy(msg + sizeof msg_prefix - 1, owner ? owner : "", olen);
    HMAC(sha256(), key, sizeof key, msg, sizeof msg_prefix - 1 + olen, mac, &n);
    free(msg);
    plm_hex_encode(mac, 32, hex);
}

int plm_tier_rank(const char *tier)
{
    static const char *const tiers[] = {"none", "process", "container", "kernel", "vm"};
    if (!tier)
        return -1;
    for (int i = 0; i < 5; i++) {
        if (strcmp(tier, tiers[i]) == 0)
            return i;
    }
    return -1;
}

bool plm_valid_floor(const char *floor)
{
    return !floor || !*floor || plm_tier_rank(floor) >= 1;
}

bool plm_meets(const char *tier, const char *floor)
{
    int t = plm_tier_rank(tier);
    if (t < 0)
        return false;
    if (!floor || !*floor)
        return true;
    int f = plm_tier_rank(floor);
    return f >= 1 && t >= f;
}

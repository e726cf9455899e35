/*
 * test_daemon_http.c — sandboxd's daemon side, checked over loopback HTTP with raw
 * libcurl and jansson (not the plimsoll client): every refusal's status, Connect code,
 * NotDispatched reason (decoded from the binary detail), Plimsoll-Not-Dispatched
 * header and SessionEnded; the request-id echo; Describe; records and chains
 * (recomputed with libplimsoll's digest functions); sessions, caps and ends.
 *
 * Tests are named after the conformance items they check (docs/conformance.md).
 * Nothing waits on a fixed sleep: the daemon's own test endpoint or a bounded poll on
 * an observable condition stands in for synchronisation.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include "capability.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "flood.h"
#include "plimsoll.h"
#include "sbxproc.h"

#define SVC "/plimsoll.v1.SandboxService/"

/* The shared daemon: default flags, two tokens (two principals). */
static sbx_proc shared;
static char second_token[1][SBX_TOKEN_SIZE];

/* ---------------------------------------------------------------- small helpers */

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    char *s = NULL;
    assert_true(vasprintf(&s, f, ap) >= 0);
    va_end(ap);
    return s;
}

static void random_id(char out[33])
{
    unsigned char b[16];
    assert_int_equal(getrandom(b, sizeof b, 0), (ssize_t)sizeof b);
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static long long mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A short pause between the attempts of a bounded poll on an observable condition. */
static void poll_pause(void)
{
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

static void start_daemon(sbx_proc *p, const char *const *args)
{
    if (sbx_start(p, args) != 0)
        fail_msg("sandboxd did not start");
}

/* ---------------------------------------------------------------- HTTP by libcurl */

typedef struct answer {
    long status;
    char *raw;
    size_t len;
    json_t *body;          /* the body when it is a JSON object */
    int n_ids;             /* Plimsoll-Request-Id headers in the answer */
    char id[80];
    char nd[40];           /* Plimsoll-Not-Dispatched */
    char allow[40];
} answer;

typedef struct req_opts {
    const char *method;            /* NULL: POST */
    const char *content_type;      /* NULL: application/json; "": none */
    const char *token;             /* NULL: no Authorization */
    const char *authorization;     /* a whole Authorization value instead */
    const char *ids[3];            /* Plimsoll-Request-Id values to send (NULL-ended) */
    bool chunked;
} req_opts;

static void answer_free(answer *a)
{
    free(a->raw);
    json_decref(a->body);
    memset(a, 0, sizeof *a);
}

static size_t on_body(char *data, size_t size, size_t n, void *ud)
{
    answer *a = ud;
    size_t len = size * n;
    a->raw = realloc(a->raw, a->len + len + 1);
    assert_non_null(a->raw);
    memcpy(a->raw + a->len, data, len);
    a->len += len;
    a->raw[a->len] = '\0';
    return len;
}

/* "Name: value" into the answer (names case-insensitive). */
static void take_header(answer *a, const char *line, size_t len)
{
    const char *colon = memchr(line, ':', len);
    if (!colon)
        return;
    size_t nl = (size_t)(colon - line);
    const char *v = colon + 1;
    while (v < line + len && *v == ' ')
        v++;
    size_t vl = (size_t)(line + len - v);
    while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n'))
        vl--;
    char *dst = NULL;
    size_t cap = 0;
    if (nl == 19 && strncasecmp(line, "Plimsoll-Request-Id", nl) == 0) {
        a->n_ids++;
        dst = a->id, cap = sizeof a->id;
    } else if (nl == 23 && strncasecmp(line, "Plimsoll-Not-Dispatched", nl) == 0) {
        dst = a->nd, cap = sizeof a->nd;
    } else if (nl == 5 && strncasecmp(line, "Allow", nl) == 0) {
        dst = a->allow, cap = sizeof a->allow;
    }
    if (dst)
        snprintf(dst, cap, "%.*s", (int)vl, v);
}

static size_t on_header(char *data, size_t size, size_t n, void *ud)
{
    take_header(ud, data, size * n);
    return size * n;
}

static void parse_body(answer *a)
{
    if (a->raw && a->len) {
        json_t *j = json_loadb(a->raw, a->len, JSON_ALLOW_NUL, NULL);
        if (json_is_object(j))
            a->body = j;
        else
            json_decref(j);
    }
}

static void http_post(const char *url, const char *path, const req_opts *o, const char *body,
                      size_t len, answer *a)
{
    memset(a, 0, sizeof *a);
    CURL *c = curl_easy_init();
    assert_non_null(c);
    char *full = fmt("%s%s", url, path);
    struct curl_slist *h = NULL;
    const char *ct = o && o->content_type ? o->content_type : "application/json";
    char *line = fmt("Content-Type:%s%s", *ct ? " " : "", ct); /* "Content-Type:" drops it */
    h = curl_slist_append(h, line);
    free(line);
    h = curl_slist_append(h, "Connect-Protocol-Version: 1");
    h = curl_slist_append(h, "Expect:"); /* no 100-continue round trip */
    if (o && o->authorization) {
        h = curl_slist_append(h, line = fmt("Authorization: %s", o->authorization));
        free(line);
    } else if (o && o->token) {
        h = curl_slist_append(h, line = fmt("Authorization: Bearer %s", o->token));
        free(line);
    }
    for (int i = 0; o && i < 3 && o->ids[i]; i++) {
        h = curl_slist_append(h, line = fmt("Plimsoll-Request-Id: %s", o->ids[i]));
        free(line);
    }
    if (o && o->chunked)
        h = curl_slist_append(h, "Transfer-Encoding: chunked");
    curl_easy_setopt(c, CURLOPT_URL, full);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 20000L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, a);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, a);
    if (o && o->method && strcmp(o->method, "POST") != 0) {
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, o->method);
    } else {
        curl_easy_setopt(c, CURLOPT_POST, 1L);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body ? body : "");
        if (!(o && o->chunked))
            curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    CURLcode rc = curl_easy_perform(c);
    if (rc != CURLE_OK)
        fail_msg("POST %s: %s", path, curl_easy_strerror(rc));
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &a->status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    free(full);
    parse_body(a);
}

/* A call with `token` and a fresh request id; the id must come back, whatever the
 * outcome (docs/wire.md §1). */
static void call_as(const sbx_proc *p, const char *token, const char *method, const char *body,
                    answer *a)
{
    char id[33];
    random_id(id);
    req_opts o = {.token = token, .ids = {id, NULL}};
    char *path = fmt(SVC "%s", method);
    http_post(p->url, path, &o, body, strlen(body), a);
    free(path);
    assert_int_equal(a->n_ids, 1);
    assert_string_equal(a->id, id);
}

static void call(const sbx_proc *p, const char *method, const char *body, answer *a)
{
    call_as(p, p->token, method, body, a);
}

/* A successful call's body (owned by the caller). */
static json_t *call_ok_as(const sbx_proc *p, const char *token, const char *method,
                          const char *body)
{
    answer a;
    call_as(p, token, method, body, &a);
    if (a.status != 200)
        fail_msg("%s answered %ld: %s", method, a.status, a.raw ? a.raw : "");
    assert_non_null(a.body);
    json_t *b = json_incref(a.body);
    answer_free(&a);
    return b;
}

static json_t *call_ok(const sbx_proc *p, const char *method, const char *body)
{
    return call_ok_as(p, p->token, method, body);
}

static const char *jstr(const json_t *o, const char *name)
{
    const json_t *v = json_object_get(o, name);
    return json_is_string(v) ? json_string_value(v) : "";
}

/* ---------------------------------------------------------------- error details */

static unsigned char *b64_decode(const char *text, size_t *out_len)
{
    size_t n = strlen(text);
    size_t padded = (n + 3) / 4 * 4;
    char *tmp = calloc(padded + 1, 1);
    memcpy(tmp, text, n);
    memset(tmp + n, '=', padded - n);
    unsigned char *out = malloc(padded / 4 * 3 + 1);
    int got = EVP_DecodeBlock(out, (const unsigned char *)tmp, (int)padded);
    assert_true(got >= 0);
    size_t pads = 0;
    while (pads < padded && tmp[padded - 1 - pads] == '=')
        pads++;
    *out_len = (size_t)got - pads;
    free(tmp);
    return out;
}

typedef struct pbr {
    const unsigned char *p, *end;
} pbr;

static uint64_t pb_varint(pbr *r)
{
    uint64_t v = 0;
    for (int shift = 0; r->p < r->end && shift < 64; shift += 7) {
        unsigned char b = *r->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return v;
    }
    fail_msg("truncated varint in an error detail");
    return 0;
}

/* Walks fields: calls back for varints (wire 0) and length-delimited (wire 2). */
typedef void (*pb_field_cb)(void *ud, unsigned field, uint64_t v, const unsigned char *data,
                            size_t len);

static void pb_walk(const unsigned char *data, size_t len, pb_field_cb cb, void *ud)
{
    pbr r = {data, data + len};
    while (r.p < r.end) {
        uint64_t key = pb_varint(&r);
        unsigned field = (unsigned)(key >> 3), wire = (unsigned)(key & 7);
        if (wire == 0) {
            cb(ud, field, pb_varint(&r), NULL, 0);
        } else if (wire == 2) {
            uint64_t n = pb_varint(&r);
            assert_true(n <= (uint64_t)(r.end - r.p));
            cb(ud, field, 0, r.p, (size_t)n);
            r.p += n;
        } else {
            fail_msg("unexpected wire type %u in an error detail", wire);
        }
    }
}

typedef struct details {
    int n;
    bool has_nd, has_end, has_unanswered;
    int nd;                /* NotDispatchedReason */
    int end;               /* SessionEnd */
    char end_detail[512];
    plm_record *rec;       /* UnansweredCall's record */
} details;

static void on_nd(void *ud, unsigned f, uint64_t v, const unsigned char *d, size_t l)
{
    (void)d;
    (void)l;
    if (f == 1)
        ((details *)ud)->nd = (int)v;
}

static void on_end(void *ud, unsigned f, uint64_t v, const unsigned char *d, size_t l)
{
    details *x = ud;
    if (f == 1)
        x->end = (int)v;
    else if (f == 2)
        snprintf(x->end_detail, sizeof x->end_detail, "%.*s", (int)l, (const char *)d);
}

static char *dup_n(const unsigned char *d, size_t l)
{
    char *s = malloc(l + 1);
    memcpy(s, d, l);
    s[l] = '\0';
    return s;
}

static void on_record(void *ud, unsigned f, uint64_t v, const unsigned char *d, size_t l)
{
    plm_record *r = ud;
    char **slot = NULL;
    switch (f) {
    case 1: r->version = (uint32_t)v; return;
    case 2: slot = &r->request_sha256; break;
    case 3: slot = &r->result_sha256; break;
    case 4: slot = &r->provider; break;
    case 5: slot = &r->isolation; break;
    case 6: slot = &r->environment; break;
    case 7: slot = &r->policy; break;
    case 8: r->started_unix_ms = (int64_t)v; return;
    case 9: r->ended_unix_ms = (int64_t)v; return;
    case 10: slot = &r->session; break;
    case 11: r->sequence = v; return;
    case 12: slot = &r->previous_sha256; break;
    case 13: slot = &r->record_sha256; break;
    case 14: slot = &r->software_identity; break;
    case 15: slot = &r->software_rule_id; break;
    case 16: slot = &r->unanswered; break;
    default: return;
    }
    free(*slot);
    *slot = dup_n(d, l);
}

static void on_unanswered(void *ud, unsigned f, uint64_t v, const unsigned char *d, size_t l)
{
    (void)v;
    details *x = ud;
    if (f != 1)
        return;
    plm_record *r = calloc(1, sizeof *r);
    pb_walk(d, l, on_record, r);
    /* Absent strings are "" (proto3). */
    char **strs[] = {&r->request_sha256, &r->result_sha256, &r->provider, &r->isolation,
                     &r->environment, &r->policy, &r->session, &r->previous_sha256,
                     &r->record_sha256, &r->software_identity, &r->software_rule_id,
                     &r->unanswered};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
        if (!*strs[i])
            *strs[i] = strdup("");
    x->rec = r;
}

static void decode_details(const json_t *body, details *d)
{
    memset(d, 0, sizeof *d);
    d->nd = d->end = -1;
    const json_t *arr = json_object_get(body, "details");
    size_t i;
    const json_t *item;
    json_array_foreach(arr, i, item) {
        const char *type = jstr(item, "type");
        size_t len;
        unsigned char *bytes = b64_decode(jstr(item, "value"), &len);
        d->n++;
        if (strcmp(type, "plimsoll.v1.NotDispatched") == 0) {
            d->has_nd = true;
            d->nd = 0;
            pb_walk(bytes, len, on_nd, d);
        } else if (strcmp(type, "plimsoll.v1.SessionEnded") == 0) {
            d->has_end = true;
            d->end = 0;
            pb_walk(bytes, len, on_end, d);
        } else if (strcmp(type, "plimsoll.v1.UnansweredCall") == 0) {
            d->has_unanswered = true;
            pb_walk(bytes, len, on_unanswered, d);
        } else {
            fail_msg("unexpected detail type %s", type);
        }
        free(bytes);
    }
}

static void details_free(details *d)
{
    plm_record_free(d->rec);
    d->rec = NULL;
}

/* A refusal: status, Connect code, NotDispatched reason (-1: none) and the
 * Plimsoll-Not-Dispatched header (NULL: none). */
static void expect_refusal(answer *a, long status, const char *code, int reason, const char *header)
{
    if (a->status != status || !a->body || strcmp(jstr(a->body, "code"), code) != 0)
        fail_msg("expected %ld %s, got %ld: %s", status, code, a->status, a->raw ? a->raw : "");
    assert_true(strlen(jstr(a->body, "message")) > 0);
    details d;
    decode_details(a->body, &d);
    if (reason < 0)
        assert_false(d.has_nd);
    else if (!d.has_nd || d.nd != reason)
        fail_msg("expected NotDispatched reason %d, got %d: %s", reason, d.nd, a->raw);
    if (header)
        assert_string_equal(a->nd, header);
    else
        assert_string_equal(a->nd, "");
    details_free(&d);
}

/* A session-call refusal: not dispatched `request` plus SessionEnded{end}. */
static void expect_session_refusal(answer *a, long status, const char *code, int end,
                                   const char *detail_part)
{
    expect_refusal(a, status, code, PLM_REFUSAL_REQUEST, NULL);
    details d;
    decode_details(a->body, &d);
    assert_true(d.has_end);
    assert_int_equal(d.end, end);
    if (detail_part && !strstr(d.end_detail, detail_part))
        fail_msg("SessionEnded detail \"%s\" lacks \"%s\"", d.end_detail, detail_part);
    assert_false(d.has_unanswered);
    details_free(&d);
}

/* ---------------------------------------------------------------- records */

static void expect_digest_of_request(const char *body, const char *want)
{
    json_t *req = json_loads(body, JSON_ALLOW_NUL, NULL);
    assert_non_null(req);
    plm_hex hex;
    plm_error *e = plm_request_digest(req, hex);
    assert_null(e);
    assert_string_equal(want, hex);
    json_decref(req);
}

/* The record of an answered run: recomputes the request, result and record digests
 * and checks the chain fields.  Writes the record digest into `sha`. */
static void check_answered(const char *req_body, const json_t *run, const char *fp,
                           uint64_t seq, const char *previous, plm_hex sha)
{
    const json_t *rj = json_object_get(run, "record");
    assert_non_null(rj);
    plm_error *e = NULL;
    plm_record *rec = plm_record_from_json(rj, &e);
    assert_null(e);
    assert_non_null(rec);
    assert_int_equal(rec->version, 2);
    expect_digest_of_request(req_body, rec->request_sha256);
    plm_hex hex;
    assert_null(plm_result_digest(run, hex));
    assert_string_equal(rec->result_sha256, hex);
    assert_null(plm_record_digest(rec, hex));
    assert_string_equal(rec->record_sha256, hex);
    assert_string_equal(rec->provider, jstr(run, "sandbox"));
    assert_string_equal(rec->isolation, jstr(run, "isolation"));
    assert_string_equal(rec->environment, jstr(run, "environment"));
    assert_string_equal(rec->software_identity, jstr(run, "softwareIdentity"));
    assert_string_equal(rec->unanswered, "");
    assert_string_equal(rec->session, fp);
    assert_int_equal(rec->sequence, seq);
    assert_string_equal(rec->previous_sha256, previous);
    assert_true(rec->started_unix_ms > 1600000000000LL);
    assert_true(rec->ended_unix_ms >= rec->started_unix_ms);
    /* int64 and uint64 travel as decimal strings */
    assert_true(json_is_string(json_object_get(rj, "startedUnixMs")));
    if (seq)
        assert_true(json_is_string(json_object_get(rj, "sequence")));
    else
        assert_null(json_object_get(rj, "sequence"));
    memcpy(sha, rec->record_sha256, sizeof(plm_hex));
    plm_record_free(rec);
}

/* stdout of a result object, base64-decoded. */
static char *out_of(const json_t *result, const char *stream)
{
    const char *b64 = jstr(result, stream);
    size_t len;
    unsigned char *raw = b64_decode(b64, &len);
    char *s = dup_n(raw, len);
    free(raw);
    return s;
}

static void expect_stdout(const json_t *result, const char *want)
{
    char *got = out_of(result, "stdout");
    assert_string_equal(got, want);
    free(got);
}

/* ---------------------------------------------------------------- sessions */

typedef struct session {
    char id[33];
    char fp[65];
    uint64_t calls;
    plm_hex last;
} session;

static void open_as(const sbx_proc *p, const char *token, const char *extra, session *s)
{
    char *body = fmt("{\"protocol\": 3%s%s}", extra ? ", " : "", extra ? extra : "");
    json_t *o = call_ok_as(p, token, "OpenSession", body);
    free(body);
    memset(s, 0, sizeof *s);
    snprintf(s->id, sizeof s->id, "%s", jstr(o, "sessionId"));
    snprintf(s->fp, sizeof s->fp, "%s", jstr(o, "session"));
    assert_int_equal(strlen(s->id), 32);
    json_decref(o);
}

static void open_session(const sbx_proc *p, const char *extra, session *s)
{
    open_as(p, p->token, extra, s);
}

static char *cell_body(const session *s, const char *language, const char *code)
{
    json_t *b = json_pack("{s:i, s:s, s:{s:s, s:s, s:[]}}", "protocol", 3, "sessionId", s->id,
                          "cell", "language", language, "code", code, "files");
    char *text = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return text;
}

/* A session call that must be answered: checks its record and advances `s`. Returns
 * the SessionRunResponse. */
static json_t *session_call_ok_as(const sbx_proc *p, const char *token, session *s,
                                  const char *body)
{
    json_t *o = call_ok_as(p, token, "SessionRun", body);
    const json_t *run = json_object_get(o, "run");
    assert_non_null(run);
    plm_hex sha;
    check_answered(body, run, s->fp, s->calls + 1, s->calls ? s->last : "", sha);
    s->calls++;
    memcpy(s->last, sha, sizeof sha);
    return o;
}

static json_t *cell_ok(const sbx_proc *p, session *s, const char *language, const char *code)
{
    char *body = cell_body(s, language, code);
    json_t *o = session_call_ok_as(p, p->token, s, body);
    free(body);
    return o;
}

/* A call on the session that must be refused; returns the answer. */
static void cell_refused_as(const sbx_proc *p, const char *token, const session *s,
                            const char *language, const char *code, answer *a)
{
    char *body = cell_body(s, language, code);
    call_as(p, token, "SessionRun", body, a);
    free(body);
}

static json_t *close_ok(const sbx_proc *p, const session *s)
{
    char *body = fmt("{\"protocol\": 3, \"sessionId\": \"%s\"}", s->id);
    json_t *o = call_ok(p, "CloseSession", body);
    free(body);
    assert_string_equal(jstr(o, "session"), s->fp);
    return o;
}

/* Close must report the client's own count and last digest (docs/records.md §7.3). */
static void close_expect(const sbx_proc *p, const session *s, const char *ended)
{
    json_t *o = close_ok(p, s);
    char calls[24] = "";
    if (s->calls)
        snprintf(calls, sizeof calls, "%" PRIu64, s->calls);
    assert_string_equal(jstr(o, "calls"), calls);
    assert_string_equal(jstr(o, "lastRecordSha256"), s->calls ? s->last : "");
    assert_string_equal(jstr(o, "ended"), ended);
    json_decref(o);
}

static void close_refused(const sbx_proc *p, const char *token, const session *s, answer *a)
{
    char *body = fmt("{\"protocol\": 3, \"sessionId\": \"%s\"}", s->id);
    call_as(p, token, "CloseSession", body, a);
    free(body);
}

/* ---------------------------------------------------------------- raw sockets
 * For calls that must be in the daemon at the same time: the request is written in
 * full (so it is in the daemon's socket buffer) before the next one starts. */

static int raw_connect(const sbx_proc *p)
{
    unsigned port = 0;
    assert_int_equal(sscanf(p->url, "http://127.0.0.1:%u", &port), 1);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

static void raw_write(int fd, const char *data, size_t len)
{
    for (size_t sent = 0; sent < len;) {
        ssize_t n = send(fd, data + sent, len - sent, MSG_NOSIGNAL);
        assert_true(n > 0);
        sent += (size_t)n;
    }
}

static int raw_send(const sbx_proc *p, const char *method, const char *body)
{
    int fd = raw_connect(p);
    char *req = fmt("POST " SVC "%s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    "Authorization: Bearer %s\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n%s",
                    method, p->token, strlen(body), body);
    raw_write(fd, req, strlen(req));
    free(req);
    return fd;
}

/* What the daemon sends until it closes, bounded by 20 s (NUL-terminated, NULL for
 * nothing), and closes fd.  A reset ends it too when `reset_ends` (a daemon that closes
 * on bytes it did not read resets the connection); else it fails the test. */
static char *raw_read_to_end(int fd, bool reset_ends)
{
    char *buf = NULL;
    size_t len = 0;
    long long deadline = mono_ms() + 20000;
    for (;;) {
        struct pollfd pfd = {fd, POLLIN, 0};
        long long left = deadline - mono_ms();
        assert_true(left > 0);
        int rc = poll(&pfd, 1, (int)left);
        if (rc < 0 && errno == EINTR)
            continue;
        assert_true(rc > 0);
        char chunk[4096];
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n < 0 && reset_ends && errno == ECONNRESET)
            break;
        assert_true(n >= 0);
        if (n == 0)
            break;
        buf = realloc(buf, len + (size_t)n + 1);
        memcpy(buf + len, chunk, (size_t)n);
        len += (size_t)n;
        buf[len] = '\0';
    }
    close(fd);
    return buf;
}

/* Reads the whole answer (the daemon closes after it); bounded by 20 s. */
static void raw_read(int fd, answer *a)
{
    memset(a, 0, sizeof *a);
    char *buf = raw_read_to_end(fd, false);
    assert_non_null(buf);
    assert_int_equal(sscanf(buf, "HTTP/1.1 %ld", &a->status), 1);
    char *head_end = strstr(buf, "\r\n\r\n");
    assert_non_null(head_end);
    for (char *line = strstr(buf, "\r\n") + 2; line < head_end;) {
        char *eol = strstr(line, "\r\n");
        take_header(a, line, (size_t)(eol - line));
        line = eol + 2;
    }
    a->raw = strdup(head_end + 4);
    a->len = strlen(a->raw);
    free(buf);
    parse_body(a);
}

/* ================================================================ D: sessions */

/* Opens with `extra`, checks the answer's lifetime and idle timeout, closes. */
static void open_expect_limits(const char *extra, long long lifetime_ms, long long idle_ms)
{
    char *body = fmt("{\"protocol\": 3%s%s}", extra ? ", " : "", extra ? extra : "");
    long long before = (long long)time(NULL) * 1000;
    json_t *o = call_ok(&shared, "OpenSession", body);
    long long after = (long long)time(NULL) * 1000 + 1000;
    free(body);
    long long expires = strtoll(jstr(o, "expiresUnixMs"), NULL, 10);
    if (expires < before + lifetime_ms - 1000 || expires > after + lifetime_ms)
        fail_msg("%s: expires %lld ms from now, want %lld", extra ? extra : "{}",
                 expires - before, lifetime_ms);
    assert_int_equal(json_integer_value(json_object_get(o, "idleTimeoutMs")), idle_ms);
    session s = {.calls = 0};
    snprintf(s.id, sizeof s.id, "%s", jstr(o, "sessionId"));
    snprintf(s.fp, sizeof s.fp, "%s", jstr(o, "session"));
    json_decref(o);
    close_expect(&shared, &s, "SESSION_END_CLOSED");
}

/* The shared daemon keeps the defaults: lifetime 30 min, idle 5 min. */
static void test_D09_lifetime_and_idle_are_the_lesser_of_configured_and_requested(void **state)
{
    (void)state;
    open_expect_limits(NULL, 1800000, 300000);
    open_expect_limits("\"lifetimeMs\": 5000", 5000, 300000);
    open_expect_limits("\"lifetimeMs\": 43200000", 1800000, 300000);  /* 12 h asked */
    open_expect_limits("\"idleTimeoutMs\": 60000", 1800000, 60000);
    open_expect_limits("\"idleTimeoutMs\": 600000", 1800000, 300000);
    open_expect_limits("\"idleTimeoutMs\": 200", 1800000, 1000);       /* floored at 1 s */
}

static void test_D01_open_answers_a_capability_and_its_fingerprint_never_logged(void **state)
{
    (void)state;
    long long before = (long long)time(NULL) * 1000;
    json_t *o = call_ok(&shared, "OpenSession", "{\"protocol\": 3, \"lifetimeMs\": 60000}");
    const char *id = jstr(o, "sessionId");
    assert_int_equal(strlen(id), 32);
    assert_int_equal(strspn(id, "0123456789abcdef"), 32);
    /* The fingerprint is the plain SHA-256 of the id's bytes (docs/records.md §1). */
    unsigned char h[32];
    SHA256((const unsigned char *)id, 32, h);
    char fp[65];
    for (int i = 0; i < 32; i++)
        snprintf(fp + 2 * i, 3, "%02x", h[i]);
    assert_string_equal(jstr(o, "session"), fp);
    assert_string_equal(jstr(o, "sandbox"), "echo");
    assert_string_equal(jstr(o, "isolation"), "container");
    /* expiresUnixMs is an int64 as a decimal string: now + the requested lifetime. */
    const json_t *exp = json_object_get(o, "expiresUnixMs");
    assert_true(json_is_string(exp));
    long long expires = strtoll(json_string_value(exp), NULL, 10);
    assert_true(expires >= before + 60000 - 1000);
    assert_true(expires <= (long long)time(NULL) * 1000 + 60000 + 1000);
    assert_int_equal(json_integer_value(json_object_get(o, "idleTimeoutMs")), 300000);
    /* A second open gets another id. */
    session other;
    open_session(&shared, NULL, &other);
    assert_string_not_equal(other.id, id);
    session s;
    snprintf(s.id, sizeof s.id, "%s", id);
    snprintf(s.fp, sizeof s.fp, "%s", fp);
    s.calls = 0;
    json_decref(cell_ok(&shared, &s, "python", "x = 1"));
    close_expect(&shared, &s, "SESSION_END_CLOSED");
    close_expect(&shared, &other, "SESSION_END_CLOSED");
    /* The log names the session by its fingerprint, never by its id or the token. */
    char *log = sbx_read_log(&shared);
    assert_non_null(log);
    assert_null(strstr(log, s.id));
    assert_null(strstr(log, other.id));
    assert_null(strstr(log, shared.token));
    assert_null(strstr(log, second_token[0]));
    char prefix[13];
    snprintf(prefix, sizeof prefix, "%.12s", fp);
    assert_non_null(strstr(log, prefix));
    free(log);
    json_decref(o);
}

static void test_D02_protocol_missing_or_zero_is_invalid_argument(void **state)
{
    (void)state;
    static const char *const methods[] = {"Run", "OpenSession", "SessionRun", "CloseSession"};
    for (size_t i = 0; i < 4; i++) {
        answer a;
        call(&shared, methods[i], "{\"javascript\": {\"code\": \"1\"}}", &a);
        expect_refusal(&a, 400, "invalid_argument", PLM_REFUSAL_PROTOCOL, NULL);
        answer_free(&a);
        call(&shared, methods[i], "{\"protocol\": 0, \"javascript\": {\"code\": \"1\"}}", &a);
        expect_refusal(&a, 400, "invalid_argument", PLM_REFUSAL_PROTOCOL, NULL);
        answer_free(&a);
    }
}

static void test_D02_another_protocol_is_unimplemented_before_the_payload(void **state)
{
    (void)state;
    answer a;
    /* The payload is nonsense: a refusal that read it would say invalid_argument. */
    call(&shared, "Run", "{\"protocol\": 2, \"javascript\": 7, \"cell\": []}", &a);
    expect_refusal(&a, 501, "unimplemented", PLM_REFUSAL_PROTOCOL, NULL);
    assert_string_equal(jstr(a.body, "message"),
                        "this daemon serves protocol 3 and the request states 2; nothing ran");
    answer_free(&a);
    call(&shared, "SessionRun", "{\"protocol\": \"4\", \"sessionId\": 1}", &a);
    expect_refusal(&a, 501, "unimplemented", PLM_REFUSAL_PROTOCOL, NULL);
    assert_string_equal(jstr(a.body, "message"),
                        "this daemon serves protocol 3 and the request states 4; nothing ran");
    answer_free(&a);
    /* A decimal string is a valid protocol number (proto3 JSON). */
    json_decref(call_ok(&shared, "Run", "{\"protocol\": \"3\", \"javascript\": {\"code\": \"1\"}}"));
}

static void test_D03_run_with_a_cell_is_invalid_argument(void **state)
{
    (void)state;
    answer a;
    call(&shared, "Run", "{\"protocol\": 3, \"cell\": {\"language\": \"python\", \"code\": \"1\"}}",
         &a);
    expect_refusal(&a, 400, "invalid_argument", PLM_REFUSAL_REQUEST, NULL);
    answer_free(&a);
}

static void test_D03_open_without_sessions_is_unimplemented(void **state)
{
    (void)state;
    sbx_proc p;
    const char *args[] = {"--max-sessions", "0", NULL};
    start_daemon(&p, args);
    answer a;
    call(&p, "OpenSession", "{\"protocol\": 3}", &a);
    expect_refusal(&a, 501, "unimplemented", PLM_REFUSAL_UNSUPPORTED, NULL);
    answer_free(&a);
    json_t *d = call_ok(&p, "Describe", "{}");
    assert_null(json_object_get(d, "supportsSessions"));
    json_decref(d);
    /* Single runs still work. */
    json_decref(call_ok(&p, "Run", "{\"protocol\": 3, \"javascript\": {\"code\": \"1\"}}"));
    sbx_stop(&p);
}

static bool has_language(const json_t *env, const char *name)
{
    size_t i;
    const json_t *v;
    json_array_foreach(json_object_get(env, "languages"), i, v)
        if (json_is_string(v) && strcmp(json_string_value(v), name) == 0)
            return true;
    return false;
}

static void test_D04_D49_describe_states_provider_tier_and_session_facts(void **state)
{
    (void)state;
    json_t *d = call_ok(&shared, "Describe", "{}");
    assert_string_equal(jstr(d, "sandbox"), "echo");
    assert_string_equal(jstr(d, "isolation"), "container");
    assert_int_equal(json_integer_value(json_object_get(d, "protocol")), 3);
    assert_true(json_is_true(json_object_get(d, "supportsSessions")));
    assert_true(json_is_true(json_object_get(d, "supportsProject")));
    assert_null(json_object_get(d, "supportsModule"));
    assert_int_equal(json_integer_value(json_object_get(d, "sessionLifetimeMs")), 1800000);
    assert_int_equal(json_integer_value(json_object_get(d, "sessionIdleTimeoutMs")), 300000);
    /* zero values are omitted: no owner cap by default; with two tokens each caller
     * may hold half of the 64 sessions (issue 11) */
    assert_int_equal(json_integer_value(json_object_get(d, "maxSessionsPerCaller")), 32);
    assert_null(json_object_get(d, "maxSessionsPerOwner"));
    const json_t *env = json_object_get(d, "sessionEnvironment");
    assert_true(has_language(env, "python"));
    assert_true(has_language(env, "javascript"));
    json_decref(d);

    sbx_proc p;
    const char *args[] = {"--echo-tier", "kernel", "--max-sessions-per-caller", "3",
                          "--max-sessions-per-owner", "2", "--session-lifetime-ms", "60000",
                          "--session-idle-ms", "0", NULL};
    start_daemon(&p, args);
    d = call_ok(&p, "Describe", "{}");
    assert_string_equal(jstr(d, "isolation"), "kernel");
    assert_int_equal(json_integer_value(json_object_get(d, "maxSessionsPerCaller")), 3);
    assert_int_equal(json_integer_value(json_object_get(d, "maxSessionsPerOwner")), 2);
    assert_int_equal(json_integer_value(json_object_get(d, "sessionLifetimeMs")), 60000);
    assert_null(json_object_get(d, "sessionIdleTimeoutMs")); /* 0 = never */
    json_decref(d);
    /* The stated tier is the one runs report, and it meets a kernel floor. */
    json_t *r = call_ok(&p, "Run", "{\"protocol\": 3, \"minimumIsolation\": \"kernel\", "
                                   "\"javascript\": {\"code\": \"1\"}}");
    assert_string_equal(jstr(r, "isolation"), "kernel");
    json_decref(r);
    sbx_stop(&p);
}

static void test_D05_floor_above_the_tier_is_refused_isolation(void **state)
{
    (void)state;
    answer a;
    call(&shared, "Run", "{\"protocol\": 3, \"minimumIsolation\": \"kernel\", "
                         "\"javascript\": {\"code\": \"1\"}}", &a);
    expect_refusal(&a, 400, "failed_precondition", PLM_REFUSAL_ISOLATION, NULL);
    answer_free(&a);
    call(&shared, "OpenSession", "{\"protocol\": 3, \"minimumIsolation\": \"vm\"}", &a);
    expect_refusal(&a, 400, "failed_precondition", PLM_REFUSAL_ISOLATION, NULL);
    answer_free(&a);
    session s;
    open_session(&shared, "\"minimumIsolation\": \"container\"", &s);
    char *body = fmt("{\"protocol\": 3, \"minimumIsolation\": \"kernel\", \"sessionId\": \"%s\", "
                     "\"javascript\": {\"code\": \"1\"}}", s.id);
    call(&shared, "SessionRun", body, &a);
    free(body);
    expect_refusal(&a, 400, "failed_precondition", PLM_REFUSAL_ISOLATION, NULL);
    answer_free(&a);
    /* The refused call ran nothing: the next one is call 1, the snippet's first "x". */
    body = fmt("{\"protocol\": 3, \"minimumIsolation\": \"process\", \"sessionId\": \"%s\", "
               "\"javascript\": {\"code\": \"1\"}}", s.id);
    json_t *o = session_call_ok_as(&shared, shared.token, &s, body);
    free(body);
    expect_stdout(json_object_get(json_object_get(o, "run"), "javascript"), "x");
    json_decref(o);
    close_expect(&shared, &s, "SESSION_END_CLOSED");
}

static void test_D05_malformed_envelopes_and_payloads_are_invalid_argument(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "{\"protocol\": 3, \"minimumIsolation\": \"strong\", \"javascript\": {\"code\": \"1\"}}",
        "{\"protocol\": 3}",
        "{\"protocol\": 3, \"javascript\": {\"code\": \"1\"}, \"project\": {}}",
        "{\"protocol\": 3, \"javascript\": \"1\"}",
        "{\"protocol\": 3, \"javascript\": {\"code\": 1}}",
        "{\"protocol\": 3, \"timeoutMs\": \"soon\", \"javascript\": {\"code\": \"1\"}}",
        "{\"protocol\": 3, \"timeoutMs\": 3000000000, \"javascript\": {\"code\": \"1\"}}",
        /* software rules (docs/records.md §5.1) */
        "{\"protocol\": 3, \"softwareRule\": {\"mode\": \"exact\", \"identities\": [\"a\", \"b\"]},"
        " \"javascript\": {\"code\": \"1\"}}",
        "{\"protocol\": 3, \"softwareRule\": {\"mode\": \"approved\", \"identities\": []},"
        " \"javascript\": {\"code\": \"1\"}}",
        "{\"protocol\": 3, \"softwareRule\": {\"mode\": \"approved\", \"identities\": [\"a\", \"a\"]},"
        " \"javascript\": {\"code\": \"1\"}}",
        "{\"protocol\": 3, \"softwareRule\": {\"mode\": \"exact\", \"identities\": [\"a b\"]},"
        " \"javascript\": {\"code\": \"1\"}}",
        "{\"protocol\": 3, \"softwareRule\": {\"mode\": \"latest\", \"identities\": [\"a\"]},"
        " \"javascript\": {\"code\": \"1\"}}",
        "{\"protocol\": 3, \"softwareRule\": {\"identities\": [\"a\"]},"
        " \"javascript\": {\"code\": \"1\"}}",
        /* project limits */
        "{\"protocol\": 3, \"project\": {\"steps\": [\"\"]}}",
        "{\"protocol\": 3, \"project\": {\"files\": [{\"path\": \"../up\", \"content\": \"\"}]}}",
        "{\"protocol\": 3, \"project\": {\"artifacts\": [\"/etc/passwd\"]}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        answer a;
        call(&shared, "Run", bad[i], &a);
        if (a.status != 400)
            fail_msg("case %zu answered %ld: %s", i, a.status, a.raw);
        expect_refusal(&a, 400, "invalid_argument", PLM_REFUSAL_REQUEST, NULL);
        answer_free(&a);
    }
    /* 33 approved identities */
    char *ids = strdup("");
    for (int i = 0; i < 33; i++) {
        char *next = fmt("%s%s\"id-%d\"", ids, i ? ", " : "", i);
        free(ids);
        ids = next;
    }
    char *body = fmt("{\"protocol\": 3, \"softwareRule\": {\"mode\": \"approved\", \"identities\": "
                     "[%s]}, \"javascript\": {\"code\": \"1\"}}", ids);
    answer a;
    call(&shared, "Run", body, &a);
    expect_refusal(&a, 400, "invalid_argument", PLM_REFUSAL_REQUEST, NULL);
    answer_free(&a);
    free(body);
    free(ids);
    /* A well-formed rule is read, and echo states no software identity to meet it. */
    call(&shared, "Run", "{\"protocol\": 3, \"softwareRule\": {\"mode\": \"exact\", \"identities\":"
                         " [\"oci-manifest:linux/amd64@sha256:ab\"]}, \"javascript\": {\"code\": \"1\"}}",
         &a);
    expect_refusal(&a, 400, "failed_precondition", PLM_REFUSAL_ENVIRONMENT, NULL);
    answer_free(&a);
    /* A module is unsupported here; a grant profile is not allowed. */
    call(&shared, "Run", "{\"protocol\": 3, \"module\": {\"model\": \"m\"}}", &a);
    expect_refusal(&a, 501, "unimplemented", PLM_REFUSAL_UNSUPPORTED, NULL);
    answer_free(&a);
    call(&shared, "Run", "{\"protocol\": 3, \"javascript\": {\"code\": \"1\", \"grantProfile\": \"net\"}}",
         &a);
    expect_refusal(&a, 403, "permission_denied", PLM_REFUSAL_PERMISSION, NULL);
    answer_free(&a);
    /* A traceId outside [A-Za-z0-9._:-]{1,64} is dropped, not refused; snake_case
     * names are read too. */
    json_decref(call_ok(&shared, "Run", "{\"protocol\": 3, \"trace_id\": \"not ok!\", "
                                        "\"minimum_isolation\": \"container\", "
                                        "\"javascript\": {\"code\": \"1\"}}"));
}

/* A body must be one JSON object, each name once (lib/json_text.h reads it); what is
 * wrong is said, with where. */
static void test_D05_bodies_that_are_not_one_json_object_are_invalid_argument(void **state)
{
    (void)state;
    static const struct { const char *body; size_t len; const char *says; } bad[] = {
        {"{\"protocol\": 3, \"protocol\": 3, \"javascript\": {\"code\": \"1\"}}", 0,
         "duplicate object key"},
        {"{\"protocol\": 3, \"javascript\": {\"code\": \"1\"", 0, "not valid JSON"},
        {"{\"protocol\": 3, \"javascript\": {\"code\": \"\\ud800\"}}", 0, "not valid JSON"},
        {"[{\"protocol\": 3}]", 0, "not a JSON object"},
        /* jansson would take this one; a raw U+0000 is not JSON, and where it is is said */
        {"{\"protocol\": 3\0}", 16, "a raw U+0000 byte at byte 14"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char id[33];
        random_id(id);
        req_opts o = {.token = shared.token, .ids = {id, NULL}};
        answer a;
        http_post(shared.url, SVC "Run", &o, bad[i].body,
                  bad[i].len ? bad[i].len : strlen(bad[i].body), &a);
        expect_refusal(&a, 400, "invalid_argument", -1, "request"); /* (header, no detail) */
        if (!strstr(jstr(a.body, "message"), bad[i].says))
            fail_msg("case %zu: %s", i, jstr(a.body, "message"));
        answer_free(&a);
    }
    /* An escaped U+0000 is text: the daemon read the code with it (its record of the
     * request says so) and the echo gives it back. */
    const char *with_nul = "{\"protocol\": 3, \"javascript\": {\"code\": \"a\\u0000b\"}}";
    json_t *run = call_ok(&shared, "Run", with_nul);
    plm_hex sha;
    check_answered(with_nul, run, "", 0, "", sha);
    size_t n;
    unsigned char *out = b64_decode(jstr(json_object_get(run, "javascript"), "stdout"), &n);
    assert_non_null(out);
    assert_int_equal(n, strlen("javascript 1: ") + 3);
    assert_memory_equal(out, "javascript 1: a\0b", n);
    free(out);
    json_decref(run);
}

static void test_D06_language_hint_refuses_unknown_names(void **state)
{
    (void)state;
    answer a;
    call(&shared, "OpenSession", "{\"protocol\": 3, \"languages\": [\"python\", \"ruby\"]}", &a);
    expect_refusal(&a, 400, "invalid_argument", PLM_REFUSAL_REQUEST, NULL);
    answer_free(&a);
    session s;
    open_session(&shared, "\"languages\": [\"python\", \"javascript\"]", &s);
    close_expect(&shared, &s, "SESSION_END_CLOSED");
}

static void test_D07_owner_must_be_1_to_64_safe_characters(void **state)
{
    (void)state;
    char *long_owner = fmt("\"owner\": \"%065d\"", 0);
    const char *bad[] = {"\"owner\": \"a b\"", "\"owner\": \"ü\"", long_owner, "\"owner\": 7"};
    for (size_t i = 0; i < 4; i++) {
        char *body = fmt("{\"protocol\": 3, %s}", bad[i]);
        answer a;
        call(&shared, "OpenSession", body, &a);
        expect_refusal(&a, 400, "invalid_argument", PLM_REFUSAL_REQUEST, NULL);
        answer_free(&a);
        free(body);
    }
    free(long_owner);
    session s;
    char *ok = fmt("\"owner\": \"%064d\"", 7);
    open_session(&shared, ok, &s);
    free(ok);
    close_expect(&shared, &s, "SESSION_END_CLOSED");
}

static void test_D43_cell_files_over_limits_or_unsafe_are_refused(void **state)
{
    (void)state;
    session s;
    open_session(&shared, NULL, &s);
    static const struct { const char *files; const char *names; } cases[] = {
        {"[{\"path\": \"ok\"}, {\"path\": \"/abs\"}]", "files[1]"},
        {"[{\"path\": \"a/../../b\"}]", "files[0]"},
        {"[{\"path\": \"\"}]", "files[0]"},
        {"[{\"path\": \".plimsoll/cell.py\"}]", "files[0]"},
        {"[{\"path\": \"a\"}, {\"path\": \"b\"}, {\"path\": \"a\"}]", "files[2]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *body = fmt("{\"protocol\": 3, \"sessionId\": \"%s\", \"cell\": {\"language\": "
                         "\"python\", \"code\": \"1\", \"files\": %s}}", s.id, cases[i].files);
        answer a;
        call(&shared, "SessionRun", body, &a);
        expect_refusal(&a, 400, "invalid_argument", PLM_REFUSAL_REQUEST, NULL);
        if (!strstr(jstr(a.body, "message"), cases[i].names))
            fail_msg("message \"%s\" does not name %s", jstr(a.body, "message"), cases[i].names);
        answer_free(&a);
        free(body);
    }
    /* 201 files, and 4 MiB of content */
    json_t *files = json_array();
    for (int i = 0; i < 201; i++) {
        char name[16];
        snprintf(name, sizeof name, "f%d", i);
        json_array_append_new(files, json_pack("{s:s, s:s}", "path", name, "content", ""));
    }
    char *big = malloc((4u << 20) + 1);
    memset(big, 'a', 4u << 20);
    big[4u << 20] = '\0';
    json_t *bodies[2] = {
        json_pack("{s:i, s:s, s:{s:s, s:s, s:o}}", "protocol", 3, "sessionId", s.id, "cell",
                  "language", "python", "code", "1", "files", files),
        json_pack("{s:i, s:s, s:{s:s, s:s, s:[{s:s, s:s}]}}", "protocol", 3, "sessionId", s.id,
                  "cell", "language", "python", "code", "1", "files", "path", "big", "content",
                  big),
    };
    free(big);
    for (int i = 0; i < 2; i++) {
        char *text = json_dumps(bodies[i], JSON_COMPACT);
        answer a;
        call(&shared, "SessionRun", text, &a);
        expect_refusal(&a, 400, "invalid_argument", PLM_REFUSAL_REQUEST, NULL);
        answer_free(&a);
        free(text);
        json_decref(bodies[i]);
    }
    /* None of them ran: the session has no call yet. */
    close_expect(&shared, &s, "SESSION_END_CLOSED");
}

/* Session i's next echo cell (its code is i): echo says which of the session's calls it
 * is, and the record names the session (cell_ok checks it). */
static void echo_of_session(const sbx_proc *p, session *s, int i)
{
    char code[16], want[48];
    snprintf(code, sizeof code, "%d", i);
    json_t *o = cell_ok(p, s, "python", code);
    snprintf(want, sizeof want, "python %" PRIu64 ": %d", s->calls, i);
    expect_stdout(json_object_get(json_object_get(o, "run"), "cell"), want);
    json_decref(o);
}

/* Sessions are found by their ids however many are held (the registry's table of them
 * grows and shrinks): each call lands in its own session (its record names that
 * session, its count is that session's), and a closed one is forgotten while its
 * neighbours stay. */
static void test_D11_each_of_many_sessions_is_found_by_its_own_id(void **state)
{
    (void)state;
    enum { N = 300 };
    sbx_proc p;
    const char *args[] = {"--max-sessions", "300", "--max-sessions-per-caller", "300", NULL};
    assert_int_equal(sbx_start(&p, args), 0);
    session *s = calloc(N, sizeof *s);
    assert_non_null(s);
    for (int i = 0; i < N; i++)
        open_session(&p, NULL, &s[i]);
    for (int i = N - 1; i >= 0; i--)
        echo_of_session(&p, &s[i], i);
    for (int i = 0; i < N; i += 2)
        close_expect(&p, &s[i], "SESSION_END_CLOSED");
    for (int i = 0; i < N; i++) {
        if (i % 2) {
            echo_of_session(&p, &s[i], i);
            continue;
        }
        answer a;
        cell_refused_as(&p, p.token, &s[i], "python", "1", &a);
        expect_session_refusal(&a, 404, "not_found", PLM_END_NOT_FOUND, NULL);
        answer_free(&a);
    }
    for (int i = 1; i < N; i += 2)
        close_expect(&p, &s[i], "SESSION_END_CLOSED");
    free(s);
    sbx_stop(&p);
}

static void test_D08_daemon_and_caller_caps_refuse_capacity(void **state)
{
    (void)state;
    sbx_proc p;
    char extra[1][SBX_TOKEN_SIZE];
    const char *args[] = {"--max-sessions", "2", "--max-sessions-per-caller", "1", NULL};
    assert_int_equal(sbx_start_tokens(&p, args, extra, 1), 0);
    session a1, b1;
    open_as(&p, p.token, NULL, &a1);
    answer a;
    call(&p, "OpenSession", "{\"protocol\": 3}", &a); /* per caller: 1 */
    expect_refusal(&a, 429, "resource_exhausted", PLM_REFUSAL_CAPACITY, NULL);
    answer_free(&a);
    open_as(&p, extra[0], NULL, &b1); /* another caller still may */
    call(&p, "OpenSession", "{\"protocol\": 3}", &a); /* daemon-wide: 2 */
    expect_refusal(&a, 429, "resource_exhausted", PLM_REFUSAL_CAPACITY, NULL);
    answer_free(&a);
    close_expect(&p, &a1, "SESSION_END_CLOSED");
    session a2;
    open_as(&p, p.token, NULL, &a2); /* a closed session stops counting */
    close_expect(&p, &a2, "SESSION_END_CLOSED");
    sbx_stop(&p);
}

/* The caps count what is held as sessions open, end and close (sessions.c keeps the
 * counts rather than walking every session at each open): a session that ended by
 * itself stops counting before its close collects it, a refused open never counted,
 * and after a churn of opens and closes across two callers each cap still lets in
 * exactly as many as it says. */
static void test_D08_caps_count_what_is_held_through_ends_and_closes(void **state)
{
    (void)state;
    sbx_proc p;
    char extra[1][SBX_TOKEN_SIZE];
    const char *args[] = {"--max-sessions", "3", "--max-sessions-per-caller", "2", NULL};
    assert_int_equal(sbx_start_tokens(&p, args, extra, 1), 0);
    session a1, a2, a3;
    open_as(&p, p.token, NULL, &a1);
    open_as(&p, p.token, NULL, &a2);
    answer a;
    call(&p, "OpenSession", "{\"protocol\": 3}", &a); /* per caller: 2 */
    expect_refusal(&a, 429, "resource_exhausted", PLM_REFUSAL_CAPACITY, NULL);
    answer_free(&a);
    /* ended (a tombstone until closed): no longer held */
    json_t *o = cell_ok(&p, &a1, "python", "plimsoll-fake:ends-session");
    assert_string_equal(jstr(o, "ended"), "SESSION_END_DISK_EXCEEDED");
    json_decref(o);
    open_as(&p, p.token, NULL, &a3);
    call(&p, "OpenSession", "{\"protocol\": 3}", &a);
    expect_refusal(&a, 429, "resource_exhausted", PLM_REFUSAL_CAPACITY, NULL);
    answer_free(&a);
    close_expect(&p, &a1, "SESSION_END_DISK_EXCEEDED"); /* collecting it frees nothing more */
    call(&p, "OpenSession", "{\"protocol\": 3}", &a);
    expect_refusal(&a, 429, "resource_exhausted", PLM_REFUSAL_CAPACITY, NULL);
    answer_free(&a);
    /* churn: the other caller fills the daemon's last place again and again */
    sbx_proc other = p;         /* the same daemon, called with the other token */
    snprintf(other.token, sizeof other.token, "%s", extra[0]);
    for (int i = 0; i < 20; i++) {
        session b;
        open_session(&other, NULL, &b);
        call_as(&p, extra[0], "OpenSession", "{\"protocol\": 3}", &a); /* daemon-wide: 3 */
        expect_refusal(&a, 429, "resource_exhausted", PLM_REFUSAL_CAPACITY, NULL);
        answer_free(&a);
        if (i % 2)
            close_expect(&other, &b, "SESSION_END_CLOSED");
        else {
            json_decref(cell_ok(&other, &b, "javascript", "plimsoll-fake:ends-session"));
            close_expect(&other, &b, "SESSION_END_DISK_EXCEEDED");
        }
    }
    close_expect(&p, &a2, "SESSION_END_CLOSED");
    close_expect(&p, &a3, "SESSION_END_CLOSED");
    /* nothing held: each caller gets its 2 again, the daemon its 3 */
    session c[3];
    open_session(&p, NULL, &c[0]);
    open_session(&p, NULL, &c[1]);
    open_session(&other, NULL, &c[2]);
    call_as(&p, extra[0], "OpenSession", "{\"protocol\": 3}", &a);
    expect_refusal(&a, 429, "resource_exhausted", PLM_REFUSAL_CAPACITY, NULL);
    answer_free(&a);
    close_expect(&p, &c[0], "SESSION_END_CLOSED");
    close_expect(&p, &c[1], "SESSION_END_CLOSED");
    close_expect(&other, &c[2], "SESSION_END_CLOSED");
    sbx_stop(&p);
}

static void test_D11_unknown_and_foreign_session_ids_are_not_found(void **state)
{
    (void)state;
    session mine, unknown;
    open_session(&shared, NULL, &mine);
    unknown = mine;
    random_id(unknown.id);
    answer a;
    cell_refused_as(&shared, shared.token, &unknown, "python", "1", &a);
    expect_session_refusal(&a, 404, "not_found", PLM_END_NOT_FOUND, NULL);
    answer_free(&a);
    /* Another principal's id reads exactly like an unknown one. */
    cell_refused_as(&shared, second_token[0], &mine, "python", "1", &a);
    expect_session_refusal(&a, 404, "not_found", PLM_END_NOT_FOUND, NULL);
    answer_free(&a);
    close_refused(&shared, second_token[0], &mine, &a);
    expect_session_refusal(&a, 404, "not_found", PLM_END_NOT_FOUND, NULL);
    answer_free(&a);
    /* Nothing of that touched the owner's session. */
    json_t *o = cell_ok(&shared, &mine, "python", "1");
    expect_stdout(json_object_get(json_object_get(o, "run"), "cell"), "python 1: 1");
    json_decref(o);
    close_expect(&shared, &mine, "SESSION_END_CLOSED");
}

static void test_D12_D17_a_session_ending_in_a_call_is_reported_then_refused(void **state)
{
    (void)state;
    session s;
    open_session(&shared, NULL, &s);
    json_decref(cell_ok(&shared, &s, "python", "x = 1"));
    json_t *o = cell_ok(&shared, &s, "python", "plimsoll-fake:ends-session");
    /* answered normally, with the end in the same answer */
    expect_stdout(json_object_get(json_object_get(o, "run"), "cell"),
                  "python 2: plimsoll-fake:ends-session");
    assert_string_equal(jstr(o, "ended"), "SESSION_END_DISK_EXCEEDED");
    assert_true(strlen(jstr(o, "endDetail")) > 0);
    json_decref(o);
    answer a;
    cell_refused_as(&shared, shared.token, &s, "python", "y", &a);
    expect_session_refusal(&a, 400, "failed_precondition", PLM_END_DISK_EXCEEDED, "disk");
    answer_free(&a);
    /* The close collects the count and reports the earlier end. */
    close_expect(&shared, &s, "SESSION_END_DISK_EXCEEDED");
}

static void test_D13_a_bad_cell_language_is_refused_even_on_an_ended_session(void **state)
{
    (void)state;
    session s;
    open_session(&shared, NULL, &s);
    json_decref(cell_ok(&shared, &s, "javascript", "plimsoll-fake:ends-session"));
    answer a;
    cell_refused_as(&shared, shared.token, &s, "cobol", "1", &a);
    expect_refusal(&a, 400, "invalid_argument", PLM_REFUSAL_REQUEST, NULL);
    answer_free(&a);
    close_expect(&shared, &s, "SESSION_END_DISK_EXCEEDED");
}

static void test_D14_a_second_waiter_is_refused_capacity(void **state)
{
    (void)state;
    session s;
    open_session(&shared, NULL, &s);
    /* Three calls that each hold the turn 1.5 s, all in the daemon at once: one runs,
     * one waits, the third is refused at once. */
    char *body = cell_body(&s, "python", "plimsoll-echo:sleep:1500");
    int fds[3];
    for (int i = 0; i < 3; i++)
        fds[i] = raw_send(&shared, "SessionRun", body);
    int answered = 0, refused = 0;
    uint64_t seqs = 0;
    for (int i = 0; i < 3; i++) {
        answer a;
        raw_read(fds[i], &a);
        if (a.status == 200) {
            answered++;
            const json_t *rec = json_object_get(json_object_get(a.body, "run"), "record");
            seqs |= 1u << strtoul(jstr(rec, "sequence"), NULL, 10);
        } else {
            refused++;
            expect_refusal(&a, 429, "resource_exhausted", PLM_REFUSAL_CAPACITY, NULL);
        }
        answer_free(&a);
    }
    free(body);
    assert_int_equal(answered, 2);
    assert_int_equal(refused, 1);
    assert_int_equal(seqs, (1u << 1) | (1u << 2)); /* serialized: calls 1 and 2 */
    json_t *o = close_ok(&shared, &s);
    assert_string_equal(jstr(o, "calls"), "2");
    json_decref(o);
}

static void test_D15_D23_session_records_chain_and_close_collects_them(void **state)
{
    (void)state;
    session s;
    open_session(&shared, "\"languages\": [\"python\"]", &s);
    /* cell 1, a snippet (call 2: "xx"), cell 2 with files, all chained */
    json_t *o = cell_ok(&shared, &s, "python", "x = 41");
    const json_t *cell = json_object_get(json_object_get(o, "run"), "cell");
    expect_stdout(cell, "python 1: x = 41");
    assert_true(json_is_true(json_object_get(cell, "interpreterStarted")));
    assert_null(json_object_get(o, "ended"));
    json_decref(o);
    char *body = fmt("{\"protocol\": 3, \"sessionId\": \"%s\", \"timeoutMs\": 5000, "
                     "\"javascript\": {\"code\": \"6*7\"}}", s.id);
    o = session_call_ok_as(&shared, shared.token, &s, body);
    free(body);
    expect_stdout(json_object_get(json_object_get(o, "run"), "javascript"), "xx");
    json_decref(o);
    body = fmt("{\"protocol\": 3, \"sessionId\": \"%s\", \"cell\": {\"language\": \"python\", "
               "\"code\": \"x + 1\", \"files\": [{\"path\": \"in.txt\", \"content\": \"41\\n\"}, "
               "{\"path\": \"d/more.txt\", \"content\": \"\"}]}}", s.id);
    o = session_call_ok_as(&shared, shared.token, &s, body);
    free(body);
    cell = json_object_get(json_object_get(o, "run"), "cell");
    expect_stdout(cell, "python 2: x + 1");
    char *err = out_of(cell, "stderr");
    assert_string_equal(err, "in.txt\nd/more.txt\n");
    free(err);
    assert_null(json_object_get(cell, "interpreterStarted"));
    json_decref(o);
    assert_int_equal(s.calls, 3);
    close_expect(&shared, &s, "SESSION_END_CLOSED");
    /* The daemon forgot it: a second close and a later call are not_found. */
    answer a;
    close_refused(&shared, shared.token, &s, &a);
    expect_session_refusal(&a, 404, "not_found", PLM_END_NOT_FOUND, NULL);
    answer_free(&a);
    cell_refused_as(&shared, shared.token, &s, "python", "1", &a);
    expect_session_refusal(&a, 404, "not_found", PLM_END_NOT_FOUND, NULL);
    answer_free(&a);
}

static void test_D15_a_single_run_record_has_no_session_fields(void **state)
{
    (void)state;
    const char *js = "{\"protocol\": 3, \"minimumIsolation\": \"container\", \"timeoutMs\": 5000, "
                     "\"traceId\": \"t-1\", \"javascript\": {\"code\": \"console.log(6*7)\"}}";
    json_t *o = call_ok(&shared, "Run", js);
    plm_hex sha;
    check_answered(js, o, "", 0, "", sha);
    expect_stdout(json_object_get(o, "javascript"), "javascript 1: console.log(6*7)");
    assert_null(json_object_get(json_object_get(o, "record"), "session"));
    json_decref(o);
    const char *proj = "{\"protocol\": 3, \"project\": {\"files\": [{\"path\": \"a.txt\", "
                       "\"content\": \"hi\\u0000there\"}, {\"path\": \".plimsoll/run.py\", "
                       "\"content\": \"\"}], \"steps\": [\"ls\", \"cat a.txt\"], "
                       "\"artifacts\": [\"a.txt\", \"missing.txt\"]}}";
    o = call_ok(&shared, "Run", proj);
    check_answered(proj, o, "", 0, "", sha);
    const json_t *p = json_object_get(o, "project");
    assert_string_equal(jstr(p, "outcome"), "PROJECT_OUTCOME_COMPLETED");
    const json_t *steps = json_object_get(p, "steps");
    assert_int_equal(json_array_size(steps), 2);
    assert_string_equal(jstr(json_array_get(steps, 1), "command"), "cat a.txt");
    expect_stdout(json_array_get(steps, 1), "cat a.txt\n");
    const json_t *arts = json_object_get(p, "artifacts");
    assert_int_equal(json_array_size(arts), 1);
    size_t len;
    unsigned char *content = b64_decode(jstr(json_array_get(arts, 0), "content"), &len);
    assert_int_equal(len, 8);
    assert_memory_equal(content, "hi\0there", 8); /* NUL bytes survive */
    free(content);
    json_decref(o);
}

static void test_D16_an_unanswered_call_carries_a_chained_v3_record(void **state)
{
    (void)state;
    session s;
    open_session(&shared, NULL, &s);
    json_decref(cell_ok(&shared, &s, "python", "1"));
    char *body = cell_body(&s, "python", "plimsoll-echo:unanswered");
    answer a;
    call(&shared, "SessionRun", body, &a);
    expect_refusal(&a, 500, "unknown", -1, NULL); /* unmarked: it may have run */
    details d;
    decode_details(a.body, &d);
    assert_int_equal(d.n, 1);
    assert_true(d.has_unanswered);
    plm_record *r = d.rec;
    assert_int_equal(r->version, 3);
    assert_string_equal(r->result_sha256, "");
    assert_string_equal(r->unanswered, "unknown");
    assert_string_equal(r->provider, "echo");
    assert_string_equal(r->isolation, "container");
    assert_string_equal(r->session, s.fp);
    assert_int_equal(r->sequence, 2);
    assert_string_equal(r->previous_sha256, s.last);
    expect_digest_of_request(body, r->request_sha256);
    plm_hex hex;
    assert_null(plm_record_digest(r, hex));
    assert_string_equal(r->record_sha256, hex);
    /* the chain continues after it */
    s.calls = r->sequence;
    memcpy(s.last, r->record_sha256, sizeof s.last);
    details_free(&d);
    answer_free(&a);
    free(body);
    json_t *o = cell_ok(&shared, &s, "python", "3");
    expect_stdout(json_object_get(json_object_get(o, "run"), "cell"), "python 3: 3");
    json_decref(o);
    close_expect(&shared, &s, "SESSION_END_CLOSED");
}

/* Polls OpenSession until it is admitted (a capacity refusal meanwhile), bounded. */
static void open_when_admitted(const sbx_proc *p, session *s)
{
    long long deadline = mono_ms() + 10000;
    for (;;) {
        answer a;
        call(p, "OpenSession", "{\"protocol\": 3}", &a);
        if (a.status == 200) {
            memset(s, 0, sizeof *s);
            snprintf(s->id, sizeof s->id, "%s", jstr(a.body, "sessionId"));
            snprintf(s->fp, sizeof s->fp, "%s", jstr(a.body, "session"));
            answer_free(&a);
            return;
        }
        expect_refusal(&a, 429, "resource_exhausted", PLM_REFUSAL_CAPACITY, NULL);
        answer_free(&a);
        assert_true(mono_ms() < deadline);
        poll_pause();
    }
}

static void test_D21_S14_a_session_nobody_named_ends_unclaimed(void **state)
{
    (void)state;
    sbx_proc p;
    const char *args[] = {"--session-idle-ms", "1000", "--max-sessions", "2", "--test-endpoints",
                          NULL};
    start_daemon(&p, args);
    session named, unnamed, third;
    open_session(&p, NULL, &named);
    json_decref(cell_ok(&p, &named, "python", "1")); /* claimed */
    open_session(&p, NULL, &unnamed);
    /* The daemon is full until the unnamed session ends at its first idle timeout. */
    open_when_admitted(&p, &third);
    /* The named one went idle just as long and is still open (its suspend is a no-op). */
    json_t *o = cell_ok(&p, &named, "python", "2");
    expect_stdout(json_object_get(json_object_get(o, "run"), "cell"), "python 2: 2");
    json_decref(o);
    answer a;
    cell_refused_as(&p, p.token, &unnamed, "python", "1", &a);
    expect_session_refusal(&a, 400, "failed_precondition", PLM_END_UNCLAIMED, NULL);
    answer_free(&a);
    close_expect(&p, &unnamed, "SESSION_END_UNCLAIMED");
    close_expect(&p, &named, "SESSION_END_CLOSED");
    /* wait-ended answers once the last one ended (the third, unclaimed, in ~1 s) */
    req_opts none = {0};
    http_post(p.url, "/test/wait-ended", &none, "", 0, &a);
    assert_int_equal(a.status, 200);
    answer_free(&a);
    close_expect(&p, &third, "SESSION_END_UNCLAIMED");
    sbx_stop(&p);
}

static void test_D23_D59_an_ended_session_keeps_a_tombstone_for_its_close(void **state)
{
    (void)state;
    sbx_proc p;
    const char *args[] = {"--test-endpoints", NULL};
    start_daemon(&p, args);
    session s, t;
    open_session(&p, NULL, &s);
    open_session(&p, NULL, &t);
    json_decref(cell_ok(&p, &s, "javascript", "1"));
    json_decref(cell_ok(&p, &s, "javascript", "2"));
    close_expect(&p, &t, "SESSION_END_CLOSED");
    answer a;
    req_opts none = {0};
    http_post(p.url, "/test/end-sessions", &none, "", 0, &a);
    assert_int_equal(a.status, 200);
    assert_int_equal(a.len, 0);
    answer_free(&a);
    cell_refused_as(&p, p.token, &s, "javascript", "3", &a);
    expect_session_refusal(&a, 400, "failed_precondition", PLM_END_EXPIRED, NULL);
    answer_free(&a);
    http_post(p.url, "/test/wait-ended", &none, "", 0, &a);
    assert_int_equal(a.status, 200);
    answer_free(&a);
    close_expect(&p, &s, "SESSION_END_EXPIRED"); /* the count survived the end */
    close_refused(&p, p.token, &s, &a);
    expect_session_refusal(&a, 404, "not_found", PLM_END_NOT_FOUND, NULL);
    answer_free(&a);
    /* without --test-endpoints there is no such path */
    http_post(shared.url, "/test/end-sessions", &none, "", 0, &a);
    assert_int_equal(a.status, 404);
    answer_free(&a);
    sbx_stop(&p);
}

static void test_D45_D48_the_owner_cap_replaces_the_least_recently_used_idle_session(void **state)
{
    (void)state;
    sbx_proc p;
    char extra[1][SBX_TOKEN_SIZE];
    const char *args[] = {"--max-sessions-per-owner", "2", NULL};
    assert_int_equal(sbx_start_tokens(&p, args, extra, 1), 0);
    session a, b, c, other_owner, other_caller;
    open_session(&p, "\"owner\": \"alice\"", &a);
    open_session(&p, "\"owner\": \"alice\"", &b);
    open_session(&p, "\"owner\": \"bob\"", &other_owner);
    open_as(&p, extra[0], "\"owner\": \"alice\"", &other_caller); /* keyed by principal + owner */
    json_decref(cell_ok(&p, &a, "python", "1")); /* b is now the least recently used */
    open_session(&p, "\"owner\": \"alice\"", &c);
    answer r;
    cell_refused_as(&p, p.token, &b, "python", "1", &r);
    expect_session_refusal(&r, 400, "failed_precondition", PLM_END_REPLACED, NULL);
    answer_free(&r);
    json_decref(cell_ok(&p, &a, "python", "2"));
    json_decref(cell_ok(&p, &c, "python", "1"));
    json_decref(cell_ok(&p, &other_owner, "python", "1"));
    char *body = cell_body(&other_caller, "python", "1");
    json_decref(session_call_ok_as(&p, extra[0], &other_caller, body));
    free(body);
    close_expect(&p, &b, "SESSION_END_REPLACED");
    close_expect(&p, &a, "SESSION_END_CLOSED");
    close_expect(&p, &c, "SESSION_END_CLOSED");
    close_expect(&p, &other_owner, "SESSION_END_CLOSED");
    sbx_stop(&p);
}

static void test_D46_an_owner_cap_without_an_idle_session_is_refused_capacity(void **state)
{
    (void)state;
    sbx_proc p;
    const char *args[] = {"--max-sessions-per-owner", "1", NULL};
    start_daemon(&p, args);
    session a;
    open_session(&p, "\"owner\": \"alice\"", &a);
    /* a's turn is held for 2 s by a call; the open comes once the daemon's log shows
     * that call dispatched (a bounded poll on an observable condition). */
    char *body = cell_body(&a, "python", "plimsoll-echo:sleep:2000");
    int fd = raw_send(&p, "SessionRun", body);
    free(body);
    char *line = fmt("session %.12s call 1 dispatched", a.fp);
    long long deadline = mono_ms() + 10000;
    for (;;) {
        char *log = sbx_read_log(&p);
        bool seen = log && strstr(log, line);
        free(log);
        if (seen)
            break;
        assert_true(mono_ms() < deadline);
        poll_pause();
    }
    free(line);
    answer r;
    call(&p, "OpenSession", "{\"protocol\": 3, \"owner\": \"alice\"}", &r);
    expect_refusal(&r, 429, "resource_exhausted", PLM_REFUSAL_CAPACITY, NULL);
    answer_free(&r);
    raw_read(fd, &r);
    assert_int_equal(r.status, 200); /* untouched by the refused open */
    assert_null(json_object_get(r.body, "ended"));
    answer_free(&r);
    a.calls = 1;
    json_t *o = close_ok(&p, &a);
    assert_string_equal(jstr(o, "ended"), "SESSION_END_CLOSED");
    assert_string_equal(jstr(o, "calls"), "1");
    json_decref(o);
    sbx_stop(&p);
}

static void wait_for_log(const sbx_proc *p, const char *needle);

/* OpenSession with a cookie of `n` bytes on a connection of its own: the status (0: closed
 * with no answer), and the answer's Plimsoll-Not-Dispatched into `nd`. */
static long open_with_cookie(const sbx_proc *p, size_t n, char nd[40])
{
    const char *body = "{\"protocol\": 3}";
    char *req = fmt("POST " SVC "OpenSession HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    "Content-Type: application/json\r\nAuthorization: Bearer %s\r\n"
                    "Connection: close\r\nCookie: x=%0*d\r\nContent-Length: %zu\r\n\r\n%s",
                    p->token, (int)n, 0, strlen(body), body);
    int fd = raw_connect(p);
    raw_write(fd, req, strlen(req));
    free(req);
    char *buf = raw_read_to_end(fd, true);
    long status = 0;
    nd[0] = '\0';
    if (buf) {
        assert_int_equal(sscanf(buf, "HTTP/1.1 %ld", &status), 1);
        const char *h = strstr(buf, "\r\nPlimsoll-Not-Dispatched: ");
        if (h)
            sscanf(h + 27, "%39[^\r]", nd);
    }
    free(buf);
    return status;
}

/* A head that leaves libmicrohttpd too little of the connection's memory to answer
 * (httpd/head.h) is refused with 431 before anything runs: a scan of one cookie's size
 * across that edge (about 16 KB) opens a session only for a 200.  Without the guard,
 * sizes there opened one and the connection closed with no answer. */
static void test_431_a_head_too_large_to_answer_is_refused_before_anything_runs(void **state)
{
    (void)state;
    sbx_proc p;
    static const char *const args[] = {"--max-sessions", "1000", "--max-sessions-per-caller",
                                       "0", NULL};
    start_daemon(&p, args);
    int opened = 0, refused = 0;
    for (size_t n = 15000; n <= 16600; n += (n < 15800 ? 100 : 5)) {
        char nd[40];
        long status = open_with_cookie(&p, n, nd);
        if (status == 200)
            opened++;
        else if (status == 431 && nd[0]) { /* ours; libmicrohttpd's own has no header */
            refused++;
            assert_string_equal(nd, "request");
        } else if (status != 431 && status != 0) /* 0: libmicrohttpd's own edge */
            fail_msg("a cookie of %zu bytes: %ld", n, status);
    }
    session last;                   /* answered and logged after all the others */
    open_session(&p, NULL, &last);
    opened++;
    char *line = fmt("session %.12s opened", last.fp);
    wait_for_log(&p, line);
    free(line);
    char *log = sbx_read_log(&p);
    assert_non_null(log);
    int logged = 0;
    for (const char *at = log; (at = strstr(at, " opened for caller ")); at++)
        logged++;
    free(log);
    if (logged != opened)
        fail_msg("%d sessions opened for %d answered 200 (%d refused)", logged, opened,
                 refused);
    assert_true(refused > 0);
    sbx_stop(&p);
}

/* A quick cell is logged once, when answered (one write to stderr a cell, not two); a
 * cell still running a quarter of a second after its dispatch is logged then too, so
 * a call that never ends shows in the log.  Both lines name the fingerprint (D01). */
static void test_D01_log_a_quick_cell_once_a_slow_one_at_dispatch_too(void **state)
{
    (void)state;
    sbx_proc p;
    start_daemon(&p, NULL);
    session a;
    open_session(&p, NULL, &a);
    json_decref(cell_ok(&p, &a, "python", "1"));
    char *answered = fmt("session %.12s call 1 answered", a.fp);
    wait_for_log(&p, answered);
    free(answered);
    char *body = cell_body(&a, "python", "plimsoll-echo:sleep:1500");
    int fd = raw_send(&p, "SessionRun", body);
    free(body);
    char *running = fmt("session %.12s call 2 dispatched 250 ms ago, running", a.fp);
    wait_for_log(&p, running);          /* while it sleeps */
    free(running);
    answer r;
    raw_read(fd, &r);
    assert_int_equal(r.status, 200);
    answer_free(&r);
    answered = fmt("session %.12s call 2 answered", a.fp);
    wait_for_log(&p, answered);
    free(answered);
    char *log = sbx_read_log(&p);
    assert_non_null(log);
    assert_null(strstr(log, " call 1 dispatched"));
    assert_null(strstr(log, a.id));
    free(log);
    a.calls = 2;
    json_decref(close_ok(&p, &a));
    sbx_stop(&p);
}

static void test_D57_D58_echo_counters_and_magic_cells(void **state)
{
    (void)state;
    session s;
    open_session(&shared, NULL, &s);
    json_t *o = cell_ok(&shared, &s, "python", "a");
    expect_stdout(json_object_get(json_object_get(o, "run"), "cell"), "python 1: a");
    json_decref(o);
    o = cell_ok(&shared, &s, "javascript", "b");
    const json_t *cell = json_object_get(json_object_get(o, "run"), "cell");
    expect_stdout(cell, "javascript 1: b"); /* counted per language */
    assert_true(json_is_true(json_object_get(cell, "interpreterStarted")));
    json_decref(o);
    o = cell_ok(&shared, &s, "python", "plimsoll-fake:past-deadline");
    cell = json_object_get(json_object_get(o, "run"), "cell");
    assert_int_equal(json_integer_value(json_object_get(cell, "exitCode")), 124);
    assert_true(json_is_true(json_object_get(cell, "timedOut")));
    assert_true(json_is_true(json_object_get(cell, "interpreterEnded")));
    json_decref(o);
    o = cell_ok(&shared, &s, "python", "c"); /* a fresh interpreter */
    cell = json_object_get(json_object_get(o, "run"), "cell");
    expect_stdout(cell, "python 1: c");
    assert_true(json_is_true(json_object_get(cell, "interpreterStarted")));
    json_decref(o);
    o = cell_ok(&shared, &s, "javascript", "d"); /* the other language kept its count */
    expect_stdout(json_object_get(json_object_get(o, "run"), "cell"), "javascript 2: d");
    json_decref(o);
    /* a snippet's nth call: one counter shared with cells (this is call 6) */
    char *body = fmt("{\"protocol\": 3, \"sessionId\": \"%s\", \"javascript\": {\"code\": \"1\"}}",
                     s.id);
    o = session_call_ok_as(&shared, shared.token, &s, body);
    free(body);
    expect_stdout(json_object_get(json_object_get(o, "run"), "javascript"), "xxxxxx");
    json_decref(o);
    close_expect(&shared, &s, "SESSION_END_CLOSED");
}

/* ================================================================ the HTTP layer */

static void test_D60_E11_an_unknown_procedure_is_404_marked_unsupported(void **state)
{
    (void)state;
    answer a;
    call(&shared, "RunEverything", "{\"protocol\": 3}", &a);
    expect_refusal(&a, 404, "unimplemented", -1, "unsupported");
    answer_free(&a);
    req_opts o = {.token = shared.token};
    http_post(shared.url, "/", &o, "{}", 2, &a);
    expect_refusal(&a, 404, "unimplemented", -1, "unsupported");
    answer_free(&a);
}

static void test_D60_E10_an_oversized_body_is_refused_before_the_handler(void **state)
{
    (void)state;
    sbx_proc p;
    const char *args[] = {"--max-body-bytes", "256", NULL};
    start_daemon(&p, args);
    char code[400];
    memset(code, 'a', sizeof code - 1);
    code[sizeof code - 1] = '\0';
    char *body = fmt("{\"protocol\": 3, \"javascript\": {\"code\": \"%s\"}}", code);
    answer a;
    call(&p, "Run", body, &a); /* declared by Content-Length */
    expect_refusal(&a, 429, "resource_exhausted", -1, "request");
    answer_free(&a);
    char id[33];
    random_id(id);
    req_opts chunked = {.token = p.token, .chunked = true, .ids = {id, NULL}};
    http_post(p.url, SVC "Run", &chunked, body, strlen(body), &a); /* found while reading */
    expect_refusal(&a, 429, "resource_exhausted", -1, "request");
    assert_string_equal(a.id, id);
    answer_free(&a);
    free(body);
    /* under the cap, chunked or not, it runs */
    json_decref(call_ok(&p, "Run", "{\"protocol\": 3, \"javascript\": {\"code\": \"1\"}}"));
    const char *small = "{\"protocol\": 3, \"javascript\": {\"code\": \"2\"}}";
    http_post(p.url, SVC "Run", &chunked, small, strlen(small), &a);
    assert_int_equal(a.status, 200);
    answer_free(&a);
    sbx_stop(&p);
}

static void test_D60_a_wrong_method_type_or_body_is_refused_marked_request(void **state)
{
    (void)state;
    answer a;
    req_opts get = {.method = "GET", .token = shared.token};
    http_post(shared.url, SVC "Describe", &get, NULL, 0, &a);
    assert_int_equal(a.status, 405);
    assert_string_equal(a.allow, "POST");
    assert_string_equal(jstr(a.body, "code"), "unimplemented");
    assert_string_equal(a.nd, "request");
    answer_free(&a);
    static const char *const types[] = {"text/plain", "", "application/jsonl",
                                        "application/x-www-form-urlencoded"};
    for (size_t i = 0; i < 4; i++) {
        req_opts o = {.content_type = types[i], .token = shared.token};
        http_post(shared.url, SVC "Describe", &o, "{}", 2, &a);
        expect_refusal(&a, 415, "invalid_argument", -1, "request");
        answer_free(&a);
    }
    req_opts param = {.content_type = "Application/JSON; charset=utf-8", .token = shared.token};
    http_post(shared.url, SVC "Describe", &param, "{}", 2, &a);
    assert_int_equal(a.status, 200);
    answer_free(&a);
    static const char *const bodies[] = {"{\"protocol\": 3, \"javascript\": {\"code\": \"1\"",
                                         "[1, 2]", "\"text\"", "{\"protocol\": 3, \"protocol\": 3}",
                                         "{\"a\": \"\\ud800\"}"};
    for (size_t i = 0; i < 5; i++) {
        call(&shared, "Run", bodies[i], &a);
        expect_refusal(&a, 400, "invalid_argument", -1, "request");
        answer_free(&a);
    }
    /* An empty body is the empty message: here, a request without a protocol. */
    call(&shared, "Run", "", &a);
    expect_refusal(&a, 400, "invalid_argument", PLM_REFUSAL_PROTOCOL, NULL);
    answer_free(&a);
}

static void test_W14_a_tls_handshake_gets_a_cleartext_400(void **state)
{
    (void)state;
    /* The start of a TLS 1.x ClientHello record: what https:// sends to this port.  A
     * plain HTTP answer makes the client's TLS library report a wrong version number. */
    static const char hello[] = "\x16\x03\x01\x00\x30\x01\x00\x00\x2c\x03\x03\x0a\x20";
    int fd = raw_connect(&shared);
    raw_write(fd, hello, sizeof hello - 1);
    answer a;
    raw_read(fd, &a);
    assert_int_equal(a.status, 400);
    assert_non_null(strstr(a.raw, "http://"));
    answer_free(&a);
    /* the port still serves HTTP */
    json_decref(call_ok(&shared, "Describe", "{}"));
}

static void test_E20_a_missing_or_unknown_token_is_unauthenticated_marked_permission(void **state)
{
    (void)state;
    char wrong[80];
    snprintf(wrong, sizeof wrong, "%s", shared.token);
    wrong[0] = wrong[0] == 'a' ? 'b' : 'a';
    char *basic = fmt("Basic %s", shared.token);
    char *prefix = fmt("Bearer %.*s", (int)strlen(shared.token) - 1, shared.token);
    const char *auths[] = {NULL, "Bearer ", basic, prefix};
    for (size_t i = 0; i < 5; i++) {
        answer a;
        req_opts o = {.token = i == 4 ? wrong : NULL, .authorization = i < 4 ? auths[i] : NULL};
        http_post(shared.url, SVC "Describe", &o, "{}", 2, &a);
        expect_refusal(&a, 401, "unauthenticated", PLM_REFUSAL_PERMISSION, NULL);
        answer_free(&a);
    }
    free(basic);
    free(prefix);
    /* both tokens of the file are good */
    json_decref(call_ok_as(&shared, second_token[0], "Describe", "{}"));
}

static void test_E06_the_request_id_is_echoed_only_when_well_formed(void **state)
{
    (void)state;
    char id[33], id2[33];
    random_id(id);
    random_id(id2);
    char upper[33];
    for (int i = 0; i < 33; i++)
        upper[i] = (char)(id[i] >= 'a' && id[i] <= 'f' ? id[i] - 32 : id[i]);
    if (strcmp(upper, id) == 0)
        upper[0] = 'A';
    char shortid[33];
    snprintf(shortid, sizeof shortid, "%.31s", id);
    struct { const char *ids[3]; const char *echo; } cases[] = {
        {{id, NULL}, id},
        {{upper, NULL}, ""},
        {{shortid, NULL}, ""},
        {{id, id2, NULL}, ""},      /* two values: none echoed */
        {{id, id, NULL}, ""},
        {{NULL}, ""},
    };
    /* on success, on a handler's refusal, and on refusals before any handler */
    struct { const char *path; const char *token; const char *body; long status; } calls[] = {
        {SVC "Describe", shared.token, "{}", 200},
        {SVC "Run", shared.token, "{}", 400},
        {SVC "Describe", NULL, "{}", 401},
        {SVC "Nothing", shared.token, "{}", 404},
        {SVC "Run", shared.token, "{", 400},
    };
    for (size_t c = 0; c < sizeof calls / sizeof calls[0]; c++) {
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            req_opts o = {.token = calls[c].token};
            memcpy(o.ids, cases[i].ids, sizeof o.ids);
            answer a;
            http_post(shared.url, calls[c].path, &o, calls[c].body, strlen(calls[c].body), &a);
            assert_int_equal(a.status, calls[c].status);
            if (*cases[i].echo) {
                assert_int_equal(a.n_ids, 1);
                assert_string_equal(a.id, cases[i].echo);
            } else {
                assert_int_equal(a.n_ids, 0); /* never refused for it either */
            }
            answer_free(&a);
        }
    }
}

/* ================================================================ process */

/* Runs $BUILD/sandboxd with args; its stdout goes to `out` (up to cap - 1 bytes,
 * NUL-terminated) when out is not NULL, else with stderr to /dev/null.  Returns its
 * exit code. */
static int run_sandboxd_out(const char *const *args, char *out, size_t cap)
{
    const char *build = getenv("BUILD");
    char exe[300];
    snprintf(exe, sizeof exe, "%s/sandboxd", build && *build ? build : "build");
    char *argv[16] = {exe};
    int n = 1;
    for (; args[n - 1] && n < 15; n++)
        argv[n] = (char *)args[n - 1];
    argv[n] = NULL;
    int fds[2] = {-1, -1};
    if (out)
        assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        if (null < 0 || dup2(out ? fds[1] : null, 1) < 0 || dup2(null, 2) < 0)
            _exit(127);
        execv(exe, argv);
        _exit(127);
    }
    if (out) {
        close(fds[1]);
        size_t len = 0;
        ssize_t got;
        /* until the daemon exits and its end of the pipe closes */
        while (len < cap - 1 && (got = read(fds[0], out + len, cap - 1 - len)) > 0)
            len += (size_t)got;
        out[len] = '\0';
        close(fds[0]);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid); /* each of these exits at once */
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static int run_sandboxd(const char *const *args)
{
    return run_sandboxd_out(args, NULL, 0);
}

/* D10: a caller that hangs up while its sandbox is being made leaves no session
 * behind.  The request goes on a connection whose write side is shut at once (the
 * caller's FIN, as when it gives up), while the read side stays open to see what the
 * daemon does: it closes the new session unused and refuses, so the only slot
 * (--max-sessions 1) is free for the next open.  A real provider without a pool makes
 * the sandbox slowly enough (bubblewrap ~50 ms, gVisor ~0.5 s) for the FIN to be there
 * first. */
static void test_D10_an_open_whose_caller_hung_up_is_closed_unused(void **state)
{
    (void)state;
    static const char *const providers[] = {"bwrap", "gvisor"};
    sbx_proc p;
    size_t i;
    for (i = 0; i < sizeof providers / sizeof providers[0]; i++) {
        const char *args[] = {"--provider", providers[i], "--pool", "0", "--max-sessions", "1",
                              NULL};
        if (sbx_start(&p, args) == 0)
            break;
    }
    if (i == sizeof providers / sizeof providers[0]) {
        skip_missing_capability("skipped: neither bwrap nor gvisor passes its smoke test here\n");
    }
    int fd = raw_send(&p, "OpenSession", "{\"protocol\": 3}");
    assert_int_equal(shutdown(fd, SHUT_WR), 0);
    answer a;
    raw_read(fd, &a);
    close(fd);
    if (a.status == 200)
        fail_msg("the daemon opened a session for a caller that had hung up: %s", a.raw);
    assert_string_equal(jstr(a.body, "code"), "canceled");
    if (!strstr(jstr(a.body, "message"), "closed unused"))
        fail_msg("unexpected refusal: %s", a.raw);
    answer_free(&a);
    session s; /* the slot is free again */
    open_session(&p, NULL, &s);
    close_expect(&p, &s, "SESSION_END_CLOSED");
    char *log = sbx_read_log(&p);
    assert_non_null(log);
    assert_non_null(strstr(log, "the caller hung up while its sandbox was made"));
    free(log);
    sbx_stop(&p);
}

static void test_D19_cli_bad_flags_and_token_files_exit_2(void **state)
{
    (void)state;
    char dir[] = "/tmp/sbxcli.XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *empty = fmt("%s/empty", dir), *good = fmt("%s/good", dir);
    FILE *f = fopen(empty, "w");
    fputs("# only a comment\n\n", f);
    fclose(f);
    f = fopen(good, "w");
    fputs("token\n", f);
    fclose(f);
    const char *L = "127.0.0.1:0";
    const char *cases[][10] = {
        {"--listen", L, "--token-file", empty, "--provider", "echo", NULL},
        {"--listen", L, "--token-file", "/nonexistent/tokens", "--provider", "echo", NULL},
        {"--listen", L, "--token-file", good, "--provider", "docker", NULL},
        {"--listen", "nowhere", "--token-file", good, "--provider", "echo", NULL},
        {"--listen", L, "--token-file", good, "--provider", "echo", "--echo-tier", "none", NULL},
        {"--listen", L, "--token-file", good, "--provider", "echo", "--session-lifetime-ms", "5",
         NULL},
        {"--listen", L, "--token-file", good, "--provider", "echo", "--bogus", NULL},
        {"--token-file", good, "--provider", "echo", NULL},
        /* D19: no call may run longer than the daemon-wide ceiling of 5 minutes */
        {"--listen", L, "--token-file", good, "--provider", "echo", "--cell-timeout-max-ms",
         "300001", NULL},
        {"--listen", L, "--token-file", good, "--provider", "echo", "--snippet-timeout-max-ms",
         "300001", NULL},
        {"--listen", L, "--token-file", good, "--provider", "echo", "--cell-timeout-ms",
         "300001", NULL},
        /* issue 11: limits take sane values */
        {"--listen", L, "--token-file", good, "--provider", "echo", "--max-concurrent-runs",
         "0", NULL},
        {"--listen", L, "--token-file", good, "--provider", "echo", "--max-connections", "0",
         NULL},
        {"--listen", L, "--token-file", good, "--provider", "echo", "--header-timeout-ms",
         "50", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (run_sandboxd(cases[i]) != 2)
            fail_msg("case %zu did not exit 2", i);
    const char *help[] = {"--help", NULL};
    assert_int_equal(run_sandboxd(help), 0);
    unlink(empty);
    unlink(good);
    rmdir(dir);
    free(empty);
    free(good);
}

/* --version: exit 0 and one line on stdout, "sandboxd X.Y.Z (plimsoll protocol 3)". */
static void test_cli_version_exits_0_and_prints_the_version(void **state)
{
    (void)state;
    char out[512];
    const char *version[] = {"--version", NULL};
    assert_int_equal(run_sandboxd_out(version, out, sizeof out), 0);
    unsigned major, minor, patch, protocol;
    int end = -1;
    if (sscanf(out, "sandboxd %u.%u.%u (plimsoll protocol %u)\n%n", &major, &minor, &patch,
               &protocol, &end) != 4 || end != (int)strlen(out) || out[end - 1] != '\n')
        fail_msg("--version printed \"%s\"", out);
    assert_int_equal(protocol, 3); /* the protocol the daemon's Describe states */
    /* Nothing else runs with it: no listener, no token file needed. */
    const char *both[] = {"--version", "--provider", "echo", NULL};
    assert_int_equal(run_sandboxd_out(both, out, sizeof out), 0);
    assert_non_null(strstr(out, "sandboxd "));
}

static void test_D53_sigterm_ends_sessions_as_shutdown_and_exits_0(void **state)
{
    (void)state;
    sbx_proc p;
    start_daemon(&p, NULL);
    session s;
    open_session(&p, NULL, &s);
    json_decref(cell_ok(&p, &s, "python", "1"));
    /* Stopped by hand, because sbx_stop removes the log this test reads afterwards. */
    pid_t pid = p.pid;
    kill(pid, SIGTERM);
    int status;
    long long deadline = mono_ms() + 5000;
    pid_t r;
    while ((r = waitpid(pid, &status, WNOHANG)) == 0 && mono_ms() < deadline)
        poll_pause(); /* bounded poll on the daemon's exit */
    assert_int_equal(r, pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    char *log = sbx_read_log(&p);
    assert_non_null(log);
    char *line = fmt("session %.12s ended: shutdown", s.fp);
    assert_non_null(strstr(log, line));
    free(line);
    free(log);
    p.pid = -1; /* already reaped */
    sbx_stop(&p);
}

/* ================================================================ issue 11: limits */

static unsigned port_of(const sbx_proc *p)
{
    unsigned port = 0;
    assert_int_equal(sscanf(p->url, "http://127.0.0.1:%u", &port), 1);
    return port;
}

/* Waits (bounded) until the daemon's log holds `needle`. */
static void wait_for_log(const sbx_proc *p, const char *needle)
{
    long long deadline = mono_ms() + 10000;
    for (;;) {
        char *log = sbx_read_log(p);
        bool found = log && strstr(log, needle);
        free(log);
        if (found)
            return;
        if (mono_ms() > deadline)
            fail_msg("the daemon never logged \"%s\"", needle);
        poll_pause();
    }
}

/* A JavaScript run that holds its sandbox for `ms` ms. */
static char *sleeping_run(unsigned ms)
{
    /* (A timer, not top-level await: Debian 12's Node 18 runs a snippet as a script.) */
    return fmt("{\"protocol\": 3, \"javascript\": {\"code\": \"setTimeout(() => "
               "console.log('woke'), %u)\"}}", ms);
}

static int raw_send_as(const sbx_proc *p, const char *token, const char *method,
                       const char *body)
{
    int fd = raw_connect(p);
    char *req = fmt("POST " SVC "%s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    "Authorization: Bearer %s\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n%s",
                    method, token, strlen(body), body);
    raw_write(fd, req, strlen(req));
    free(req);
    return fd;
}

/* Reads the answers of `n` runs sent at once; counts the answered ones (checking
 * their output) and the refused ones (checking code, mark and message). */
static void count_runs(int *fds, size_t n, const char *refusal_part, int *answered,
                       int *refused)
{
    *answered = *refused = 0;
    for (size_t i = 0; i < n; i++) {
        answer a;
        raw_read(fds[i], &a);
        if (a.status == 200) {
            (*answered)++;
            expect_stdout(json_object_get(a.body, "javascript"), "woke\n");
        } else {
            (*refused)++;
            /* resource_exhausted, not dispatched (capacity), as a session cap */
            expect_refusal(&a, 429, "resource_exhausted", PLM_REFUSAL_CAPACITY, NULL);
            if (!strstr(jstr(a.body, "message"), refusal_part))
                fail_msg("refusal \"%s\" lacks \"%s\"", jstr(a.body, "message"), refusal_part);
        }
        answer_free(&a);
    }
}

/* Item 8: Run had no admission limit (80 concurrent runs of one token took 8.1 GiB).
 * With --max-concurrent-runs 2, three runs at once on a real provider: two run, the
 * third is refused at once, resource_exhausted marked not dispatched (capacity); once
 * they ended, runs are admitted again. */
static void test_I11_8_runs_past_the_admission_limit_are_refused_not_dispatched(void **state)
{
    (void)state;
    sbx_proc p;
    const char *args[] = {"--provider", "process", "--max-concurrent-runs", "2", NULL};
    start_daemon(&p, args);
    char *body = sleeping_run(2000);
    int fds[3];
    long long t0 = mono_ms();
    for (int i = 0; i < 3; i++)
        fds[i] = raw_send(&p, "Run", body);
    int answered, refused;
    count_runs(fds, 3, "its limit of 2 runs", &answered, &refused);
    assert_int_equal(answered, 2);
    assert_int_equal(refused, 1);
    assert_true(mono_ms() - t0 >= 2000); /* the two really ran side by side */
    free(body);
    json_t *r = call_ok(&p, "Run", "{\"protocol\": 3, \"javascript\": {\"code\": "
                                   "\"console.log('again')\"}}");
    expect_stdout(json_object_get(r, "javascript"), "again\n");
    json_decref(r);
    char *log = sbx_read_log(&p);
    assert_non_null(strstr(log, "2 runs at once"));
    free(log);
    sbx_stop(&p);
}

/* Item 8: with two tokens each caller may run half of --max-concurrent-runs by
 * default: one token's third run is refused while the other token's two still run. */
static void test_I11_8_one_token_cannot_take_every_run_slot(void **state)
{
    (void)state;
    sbx_proc p;
    char other[1][SBX_TOKEN_SIZE];
    const char *args[] = {"--provider", "process", "--max-concurrent-runs", "4", NULL};
    assert_int_equal(sbx_start_tokens(&p, args, other, 1), 0);
    char *body = sleeping_run(2000);
    int mine[3], theirs[2];
    for (int i = 0; i < 3; i++)
        mine[i] = raw_send_as(&p, p.token, "Run", body);
    for (int i = 0; i < 2; i++)
        theirs[i] = raw_send_as(&p, other[0], "Run", body);
    int answered, refused;
    count_runs(mine, 3, "its share of 2 runs", &answered, &refused);
    assert_int_equal(answered, 2);
    assert_int_equal(refused, 1);
    count_runs(theirs, 2, "", &answered, &refused);
    assert_int_equal(answered, 2);
    assert_int_equal(refused, 0);
    free(body);
    sbx_stop(&p);
}

/* Item 8: one token could hold all 64 sessions.  With two tokens and --max-sessions 4,
 * a caller may hold 2 by default (Describe says so): its third open is refused
 * resource_exhausted, not dispatched (capacity), while the other token still opens. */
static void test_I11_8_a_token_at_its_default_session_share_is_refused_others_open(void **state)
{
    (void)state;
    sbx_proc p;
    char other[1][SBX_TOKEN_SIZE];
    const char *args[] = {"--max-sessions", "4", NULL};
    assert_int_equal(sbx_start_tokens(&p, args, other, 1), 0);
    json_t *d = call_ok(&p, "Describe", "{}");
    assert_int_equal(json_integer_value(json_object_get(d, "maxSessionsPerCaller")), 2);
    json_decref(d);
    session a1, a2, b1, b2;
    open_as(&p, p.token, NULL, &a1);
    open_as(&p, p.token, NULL, &a2);
    answer a;
    call(&p, "OpenSession", "{\"protocol\": 3}", &a);
    expect_refusal(&a, 429, "resource_exhausted", PLM_REFUSAL_CAPACITY, NULL);
    assert_non_null(strstr(jstr(a.body, "message"), "this caller holds its cap of 2"));
    answer_free(&a);
    open_as(&p, other[0], NULL, &b1); /* the other caller is not locked out */
    open_as(&p, other[0], NULL, &b2);
    close_expect(&p, &a1, "SESSION_END_CLOSED");
    session a3; /* a closed session frees the caller's place */
    open_as(&p, p.token, NULL, &a3);
    close_expect(&p, &a3, "SESSION_END_CLOSED");
    close_expect(&p, &a2, "SESSION_END_CLOSED");
    sbx_stop(&p);
}

/* Item 9: 1 100 idle connections without a token made sandboxd reset new clients.
 * 2 000 of them (half silent, half with a request that never ends its headers):
 * a call in progress before the flood is answered, a new caller is served during it,
 * and every idle connection is closed soon after --header-timeout-ms. */
static void test_I11_9_an_idle_connection_flood_locks_no_caller_out(void **state)
{
    (void)state;
    flood_raise_fd_limit();
    sbx_proc p;
    const char *args[] = {"--header-timeout-ms", "1000", NULL};
    start_daemon(&p, args);
    session s;
    open_session(&p, NULL, &s);
    char *body = cell_body(&s, "python", "plimsoll-echo:sleep:2500");
    int in_flight = raw_send(&p, "SessionRun", body); /* outlasts the header timeout */
    free(body);
    wait_for_log(&p, " call 1 dispatched");
    flood f;
    long long t0 = mono_ms();
    assert_int_equal(flood_open(&f, port_of(&p), 2000), 0);
    json_t *d = call_ok(&p, "Describe", "{}"); /* a new caller, in the flood */
    json_decref(d);
    answer a;
    raw_read(in_flight, &a);
    if (a.status != 200)
        fail_msg("the call in progress was not answered: %ld %s", a.status, a.raw ? a.raw : "");
    answer_free(&a);
    s.calls = 1;
    size_t closed = flood_closed(&f, 8.0);
    long long took = mono_ms() - t0;
    if (closed != f.n)
        fail_msg("%zu of %zu idle connections still open %lld ms later", f.n - closed, f.n,
                 took);
    flood_close(&f);
    d = call_ok(&p, "Describe", "{}");
    json_decref(d);
    char *log = sbx_read_log(&p);
    assert_non_null(strstr(log, "past the header timeout"));
    assert_null(strstr(log, "detected connection closure")); /* no line per connection */
    free(log);
    sbx_stop(&p);
}

/* Item 9: past --max-connections the oldest connection without an accepted request is
 * closed for the newcomer: with a cap of 50 and 300 idle connections, a call in
 * progress (trusted) is answered, new callers are served, and all but 66 of the flood
 * (the cap, plus a quarter of it but at least 16 that have not said a byte yet) are
 * closed long before the header timeout (10 s). */
static void test_I11_9_past_the_connection_cap_the_oldest_stranger_makes_room(void **state)
{
    (void)state;
    flood_raise_fd_limit();
    sbx_proc p;
    const char *args[] = {"--max-connections", "50", NULL};
    start_daemon(&p, args);
    session s;
    open_session(&p, NULL, &s);
    char *body = cell_body(&s, "python", "plimsoll-echo:sleep:1500");
    int in_flight = raw_send(&p, "SessionRun", body);
    free(body);
    wait_for_log(&p, " call 1 dispatched"); /* in the daemon: an authenticated caller */
    flood f;
    assert_int_equal(flood_open(&f, port_of(&p), 300), 0);
    for (int i = 0; i < 3; i++) { /* new callers, one connection each */
        json_t *d = call_ok(&p, "Describe", "{}");
        json_decref(d);
    }
    answer a;
    raw_read(in_flight, &a);
    assert_int_equal(a.status, 200);
    answer_free(&a);
    size_t closed = flood_closed(&f, 3.0);
    if (closed < 300 - 50 - 16)
        fail_msg("only %zu of 300 idle connections were closed past a cap of 50", closed);
    flood_close(&f);
    char *log = sbx_read_log(&p);
    assert_non_null(strstr(log, "over the cap of 50"));
    free(log);
    sbx_stop(&p);
}

/* ================================================================ main */

static int setup(void **state)
{
    (void)state;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    return sbx_start_tokens(&shared, NULL, second_token, 1) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    int status = sbx_stop_status(&shared);
    curl_global_cleanup();
    /* the shared daemon drained and exited 0 */
    return status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_D01_open_answers_a_capability_and_its_fingerprint_never_logged),
        cmocka_unit_test(test_D02_protocol_missing_or_zero_is_invalid_argument),
        cmocka_unit_test(test_D02_another_protocol_is_unimplemented_before_the_payload),
        cmocka_unit_test(test_D03_run_with_a_cell_is_invalid_argument),
        cmocka_unit_test(test_D03_open_without_sessions_is_unimplemented),
        cmocka_unit_test(test_D04_D49_describe_states_provider_tier_and_session_facts),
        cmocka_unit_test(test_D05_floor_above_the_tier_is_refused_isolation),
        cmocka_unit_test(test_D05_malformed_envelopes_and_payloads_are_invalid_argument),
        cmocka_unit_test(test_D05_bodies_that_are_not_one_json_object_are_invalid_argument),
        cmocka_unit_test(test_D06_language_hint_refuses_unknown_names),
        cmocka_unit_test(test_D07_owner_must_be_1_to_64_safe_characters),
        cmocka_unit_test(test_D43_cell_files_over_limits_or_unsafe_are_refused),
        cmocka_unit_test(test_D08_daemon_and_caller_caps_refuse_capacity),
        cmocka_unit_test(test_D08_caps_count_what_is_held_through_ends_and_closes),
        cmocka_unit_test(test_D11_unknown_and_foreign_session_ids_are_not_found),
        cmocka_unit_test(test_D11_each_of_many_sessions_is_found_by_its_own_id),
        cmocka_unit_test(test_D12_D17_a_session_ending_in_a_call_is_reported_then_refused),
        cmocka_unit_test(test_D13_a_bad_cell_language_is_refused_even_on_an_ended_session),
        cmocka_unit_test(test_D14_a_second_waiter_is_refused_capacity),
        cmocka_unit_test(test_D15_D23_session_records_chain_and_close_collects_them),
        cmocka_unit_test(test_D15_a_single_run_record_has_no_session_fields),
        cmocka_unit_test(test_D16_an_unanswered_call_carries_a_chained_v3_record),
        cmocka_unit_test(test_D21_S14_a_session_nobody_named_ends_unclaimed),
        cmocka_unit_test(test_D23_D59_an_ended_session_keeps_a_tombstone_for_its_close),
        cmocka_unit_test(test_D09_lifetime_and_idle_are_the_lesser_of_configured_and_requested),
        cmocka_unit_test(test_D45_D48_the_owner_cap_replaces_the_least_recently_used_idle_session),
        cmocka_unit_test(test_D46_an_owner_cap_without_an_idle_session_is_refused_capacity),
        cmocka_unit_test(test_D01_log_a_quick_cell_once_a_slow_one_at_dispatch_too),
        cmocka_unit_test(test_431_a_head_too_large_to_answer_is_refused_before_anything_runs),
        cmocka_unit_test(test_D57_D58_echo_counters_and_magic_cells),
        cmocka_unit_test(test_D60_E11_an_unknown_procedure_is_404_marked_unsupported),
        cmocka_unit_test(test_D60_E10_an_oversized_body_is_refused_before_the_handler),
        cmocka_unit_test(test_D60_a_wrong_method_type_or_body_is_refused_marked_request),
        cmocka_unit_test(test_W14_a_tls_handshake_gets_a_cleartext_400),
        cmocka_unit_test(test_E20_a_missing_or_unknown_token_is_unauthenticated_marked_permission),
        cmocka_unit_test(test_E06_the_request_id_is_echoed_only_when_well_formed),
        cmocka_unit_test(test_D10_an_open_whose_caller_hung_up_is_closed_unused),
        cmocka_unit_test(test_D19_cli_bad_flags_and_token_files_exit_2),
        cmocka_unit_test(test_cli_version_exits_0_and_prints_the_version),
        cmocka_unit_test(test_D53_sigterm_ends_sessions_as_shutdown_and_exits_0),
        cmocka_unit_test(test_I11_8_runs_past_the_admission_limit_are_refused_not_dispatched),
        cmocka_unit_test(test_I11_8_one_token_cannot_take_every_run_slot),
        cmocka_unit_test(test_I11_8_a_token_at_its_default_session_share_is_refused_others_open),
        cmocka_unit_test(test_I11_9_an_idle_connection_flood_locks_no_caller_out),
        cmocka_unit_test(test_I11_9_past_the_connection_cap_the_oldest_stranger_makes_room),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/*
 * verify.c — `berth verify --pub KEY FILE...`: checks saved run records and their
 * signatures offline, one verdict per record, exit 1 when any fails.
 *
 * A signed record is the reference's format (plimsoll repository, attest/attest.go): a
 * DSSE envelope (payload type application/vnd.in-toto+json, Ed25519 signatures over
 * DSSE's pre-authentication encoding, each naming its key by the hex SHA-256 of the
 * key's PKIX DER) around an in-toto Statement v1 whose one subject, "run-record",
 * carries the record's own digest and whose predicate is the record.  A file holds JSON
 * documents, one per line or one in all, each of them:
 *   - an envelope ({"payloadType", "payload", "signatures"}), or a bundle entry of the
 *     reference ({"envelope": ..., "request": ..., "response": ...}, whose binary
 *     request and response are not decoded here; the envelope is checked);
 *   - a RunResponse as sandboxd answers with --record-key (its `record` and its
 *     `recordEnvelope`), or a SessionRunResponse (its `run`): the envelope must verify,
 *     name exactly the response's record, and the record's result digest must be the
 *     digest of the response itself, so an edited output fails too.
 * Every record's own digest is recomputed from its fields (docs/records.md §5).  A response
 * with no envelope is "not signed": a failure, since nothing vouches for it.
 */
#include "plimsoll.h"
#include "xalloc.h"

#include <jansson.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAYLOAD_TYPE "application/vnd.in-toto+json"
#define STATEMENT_TYPE "https://in-toto.io/Statement/v1"
#define RECORD_PREDICATE "https://plimsollmark.github.io/plimsoll/run-record/v1"
#define CLOSE_PREDICATE "https://plimsollmark.github.io/plimsoll/session-close/v1"

int berth_cmd_verify(int argc, char **argv);

typedef struct verifier {
    EVP_PKEY *key;
    char keyid[65];
} verifier;

static unsigned char *b64_decode(const char *text, size_t *len)
{
    size_t n = strlen(text);
    if (n % 4)
        return NULL;
    unsigned char *out = berth_xmalloc(n / 4 * 3 + 1);
    int got = out ? EVP_DecodeBlock(out, (const unsigned char *)text, (int)n) : -1;
    if (got < 0) {
        free(out);
        return NULL;
    }
    size_t pad = n >= 1 && text[n - 1] == '=' ? (n >= 2 && text[n - 2] == '=' ? 2 : 1) : 0;
    *len = (size_t)got - pad;
    out[*len] = '\0';
    return out;
}

static bool load_key(verifier *v, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        perror(path);
        return false;
    }
    v->key = PEM_read_PUBKEY(f, NULL, NULL, NULL);
    fclose(f);
    if (!v->key || EVP_PKEY_get_id(v->key) != EVP_PKEY_ED25519) {
        fprintf(stderr, "berth verify: %s is not a PEM Ed25519 public key\n", path);
        return false;
    }
    unsigned char *der = NULL;
    int n = i2d_PUBKEY(v->key, &der);
    if (n <= 0)
        return false;
    plm_sha256_hex(der, (size_t)n, v->keyid);
    OPENSSL_free(der);
    return true;
}

/* Whether some signature of the envelope by this key verifies over PAE(payload). */
static bool signature_ok(const verifier *v, const json_t *env, const unsigned char *payload,
                         size_t plen)
{
    size_t pae_len;
    unsigned char *pae = plm_dsse_pae(PAYLOAD_TYPE, payload, plen, &pae_len);
    if (!pae)
        berth_oom(plen);
    bool ok = false;
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(env, "signatures"), i, s) {
        const char *keyid = json_string_value(json_object_get(s, "keyid"));
        const char *sig64 = json_string_value(json_object_get(s, "sig"));
        if (!sig64 || (keyid && *keyid && strcmp(keyid, v->keyid) != 0))
            continue;
        size_t slen;
        unsigned char *sig = b64_decode(sig64, &slen);
        EVP_MD_CTX *ctx = EVP_MD_CTX_new();
        ok = sig && ctx && EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, v->key) == 1 &&
             EVP_DigestVerify(ctx, sig, slen, pae, pae_len) == 1;
        EVP_MD_CTX_free(ctx);
        free(sig);
        if (ok)
            break;
    }
    free(pae);
    return ok;
}

static const char *str_of(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

/* The record a statement's predicate states (snake_case names), or NULL. */
static plm_record *predicate_record(const json_t *p)
{
    static const char *const known[] = {
        "version", "request_sha256", "result_sha256", "provider", "isolation", "environment",
        "software_identity", "software_rule_id", "policy", "started_unix_ms", "ended_unix_ms",
        "session", "sequence", "previous_sha256", "unanswered", "record_sha256"};
    const char *k;
    json_t *val;
    json_object_foreach((json_t *)p, k, val) { /* as the reference: no unknown field */
        bool found = false;
        for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
            found = found || strcmp(k, known[i]) == 0;
        if (!found)
            return NULL;
    }
    if (!json_is_integer(json_object_get(p, "version")))
        return NULL;
    plm_record *r = berth_xcalloc(1, sizeof *r);
    r->version = (uint32_t)json_integer_value(json_object_get(p, "version"));
    r->request_sha256 = berth_xstrdup(str_of(p, "request_sha256"));
    r->result_sha256 = berth_xstrdup(str_of(p, "result_sha256"));
    r->provider = berth_xstrdup(str_of(p, "provider"));
    r->isolation = berth_xstrdup(str_of(p, "isolation"));
    r->environment = berth_xstrdup(str_of(p, "environment"));
    r->policy = berth_xstrdup(str_of(p, "policy"));
    r->software_identity = berth_xstrdup(str_of(p, "software_identity"));
    r->software_rule_id = berth_xstrdup(str_of(p, "software_rule_id"));
    r->unanswered = berth_xstrdup(str_of(p, "unanswered"));
    r->session = berth_xstrdup(str_of(p, "session"));
    r->previous_sha256 = berth_xstrdup(str_of(p, "previous_sha256"));
    r->record_sha256 = berth_xstrdup(str_of(p, "record_sha256"));
    r->started_unix_ms = json_integer_value(json_object_get(p, "started_unix_ms"));
    r->ended_unix_ms = json_integer_value(json_object_get(p, "ended_unix_ms"));
    r->sequence = (uint64_t)json_integer_value(json_object_get(p, "sequence"));
    return r;
}

static bool same(const char *a, const char *b)
{
    return strcmp(a ? a : "", b ? b : "") == 0;
}

static bool records_equal(const plm_record *a, const plm_record *b)
{
    return a->version == b->version && same(a->request_sha256, b->request_sha256) &&
           same(a->result_sha256, b->result_sha256) && same(a->provider, b->provider) &&
           same(a->isolation, b->isolation) && same(a->environment, b->environment) &&
           same(a->policy, b->policy) && same(a->software_identity, b->software_identity) &&
           same(a->software_rule_id, b->software_rule_id) && same(a->unanswered, b->unanswered) &&
           a->started_unix_ms == b->started_unix_ms && a->ended_unix_ms == b->ended_unix_ms &&
           same(a->session, b->session) && a->sequence == b->sequence &&
           same(a->previous_sha256, b->previous_sha256) && same(a->record_sha256, b->record_sha256);
}

/* Checks one envelope; on success *rec is its record (NULL for a session close) and
 * the return is NULL, else a reason. */
static const char *check_envelope(const verifier *v, const json_t *env, plm_record **rec,
                                  char *what, size_t what_size)
{
    *rec = NULL;
    if (!json_is_object(env) || strcmp(str_of(env, "payloadType"), PAYLOAD_TYPE) != 0)
        return "not a DSSE envelope of an in-toto statement";
    size_t plen;
    unsigned char *payload = b64_decode(str_of(env, "payload"), &plen);
    if (!payload)
        return "the envelope's payload is not base64";
    if (!signature_ok(v, env, payload, plen)) {
        free(payload);
        return "no signature by this key verifies (wrong key, or the payload was changed)";
    }
    json_error_t jerr;
    json_t *st = json_loadb((const char *)payload, plen, 0, &jerr);
    free(payload);
    const json_t *subj = json_array_get(json_object_get(st, "subject"), 0);
    const json_t *digest = json_object_get(subj, "digest");
    const char *ptype = str_of(st, "predicateType");
    const json_t *pred = json_object_get(st, "predicate");
    const char *why = NULL;
    if (!json_is_object(st) || strcmp(str_of(st, "_type"), STATEMENT_TYPE) != 0 ||
        json_array_size(json_object_get(st, "subject")) != 1 || json_object_size(digest) != 1 ||
        !json_is_object(pred)) {
        why = "the signed payload is not a run-record statement";
    } else if (strcmp(ptype, CLOSE_PREDICATE) == 0) {
        if (strcmp(str_of(subj, "name"), "session") != 0 ||
            strcmp(str_of(digest, "sha256"), str_of(pred, "session")) != 0)
            why = "the signed session close names another session than its subject";
        else
            snprintf(what, what_size, "session %.12s closed after %lld calls",
                     str_of(pred, "session"),
                     (long long)json_integer_value(json_object_get(pred, "calls")));
    } else if (strcmp(ptype, RECORD_PREDICATE) != 0 ||
               strcmp(str_of(subj, "name"), "run-record") != 0) {
        why = "the signed payload is not a run-record statement";
    } else {
        plm_record *r = predicate_record(pred);
        plm_hex hex;
        plm_error *e = r ? plm_record_digest(r, hex) : NULL;
        if (!r)
            why = "the signed record has fields a run record does not";
        else if (r->version < 1 || r->version > 3 || (r->version == 3) != (*r->unanswered != 0))
            why = "the signed record has a version this verifier does not know";
        else if (e || strcmp(hex, r->record_sha256) != 0)
            why = "the signed record's digest does not match its fields";
        else if (strcmp(str_of(digest, "sha256"), r->record_sha256) != 0)
            why = "the statement's subject is not the record's digest";
        plm_error_free(e);
        if (why) {
            plm_record_free(r);
        } else {
            *rec = r;
            if (*r->session)
                snprintf(what, what_size, "record %.16s (%s, %s; session %.12s call %llu)",
                         r->record_sha256, r->provider, r->isolation, r->session,
                         (unsigned long long)r->sequence);
            else
                snprintf(what, what_size, "record %.16s (%s, %s; single run)",
                         r->record_sha256, r->provider, r->isolation);
        }
    }
    json_decref(st);
    return why;
}

/* One saved document: prints its verdict, returns whether it passed. */
static bool verify_entry(const verifier *v, const char *where, const json_t *doc)
{
    char what[200] = "";
    const char *why = NULL;
    plm_record *signed_rec = NULL;
    const json_t *resp = json_object_get(doc, "run") ? json_object_get(doc, "run") : doc;
    if (!json_is_object(doc)) {
        why = "not a JSON object";
    } else if (json_object_get(doc, "payloadType")) {
        why = check_envelope(v, doc, &signed_rec, what, sizeof what);
    } else if (json_object_get(doc, "envelope")) {
        why = check_envelope(v, json_object_get(doc, "envelope"), &signed_rec, what, sizeof what);
    } else if (json_object_get(resp, "record")) {
        plm_error *e = NULL;
        plm_record *rec = plm_record_from_json(json_object_get(resp, "record"), &e);
        plm_hex result, own;
        plm_error *re = rec ? plm_result_digest(resp, result) : NULL;
        plm_error *de = rec ? plm_record_digest(rec, own) : NULL;
        if (!rec)
            why = "the response's record is malformed";
        else if (re || strcmp(result, rec->result_sha256) != 0)
            why = "the response does not match its record's result digest (edited output?)";
        else if (de || strcmp(own, rec->record_sha256) != 0)
            why = "the response's record digest does not match its fields";
        else if (!json_object_get(resp, "recordEnvelope"))
            why = "not signed: the response carries no recordEnvelope";
        else if (!(why = check_envelope(v, json_object_get(resp, "recordEnvelope"), &signed_rec,
                                        what, sizeof what)) &&
                 (!signed_rec || !records_equal(signed_rec, rec)))
            why = "the signature covers another record than the response's";
        plm_error_free(e);
        plm_error_free(re);
        plm_error_free(de);
        plm_record_free(rec);
    } else {
        why = "neither a signed record nor a response with a record";
    }
    plm_record_free(signed_rec);
    if (why)
        printf("%s: FAIL: %s\n", where, why);
    else
        printf("%s: ok: %s, signed by %.16s\n", where, what, v->keyid);
    return why == NULL;
}

static int verify_file(const verifier *v, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        printf("%s: FAIL: cannot be read\n", path);
        return 1;
    }
    json_error_t jerr;
    json_t *whole = json_loadf(f, JSON_DISABLE_EOF_CHECK, &jerr);
    int c;
    bool one = whole && fscanf(f, " ") == 0 && (c = fgetc(f)) == EOF;
    char where[600];
    int failed = 0;
    if (one) {
        snprintf(where, sizeof where, "%s", path);
        failed += !verify_entry(v, where, whole);
        json_decref(whole);
        fclose(f);
        return failed;
    }
    json_decref(whole);
    rewind(f);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int lineno = 0, entries = 0;
    while ((n = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (strspn(line, " \t\r\n") == (size_t)n)
            continue;
        entries++;
        snprintf(where, sizeof where, "%s:%d", path, lineno);
        json_t *doc = json_loadb(line, (size_t)n, 0, &jerr);
        if (!doc) {
            printf("%s: FAIL: not JSON (%s)\n", where, jerr.text);
            failed++;
            continue;
        }
        failed += !verify_entry(v, where, doc);
        json_decref(doc);
    }
    free(line);
    fclose(f);
    if (!entries) {
        printf("%s: FAIL: holds no record\n", path);
        failed++;
    }
    return failed;
}

int berth_cmd_verify(int argc, char **argv)
{
    const char *pub = NULL;
    int i = 1;
    for (; i < argc; i++) {
        if (!strcmp(argv[i], "--pub") && i + 1 < argc)
            pub = argv[++i];
        else if (!strncmp(argv[i], "--pub=", 6))
            pub = argv[i] + 6;
        else
            break;
    }
    if (!pub || i >= argc) {
        fputs("usage: berth verify --pub KEY.pub FILE...\n"
              "  checks saved run records and their Ed25519 (DSSE) signatures offline: one\n"
              "  verdict per record; exit 1 when any fails, 2 on a usage error\n", stderr);
        return 2;
    }
    verifier v = {0};
    if (!load_key(&v, pub)) {
        EVP_PKEY_free(v.key);
        return 2;
    }
    int failed = 0;
    for (; i < argc; i++)
        failed += verify_file(&v, argv[i]);
    EVP_PKEY_free(v.key);
    printf("%s\n", failed ? "verify: some records FAILED" : "verify: every record verified");
    return failed ? 1 : 0;
}

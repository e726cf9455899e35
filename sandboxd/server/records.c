/*
 * records.c — the JSON of results (proto3 mapping: zero values omitted, int64 as
 * decimal strings, bytes as padded base64, enums by name) and their records.
 */
#include "records.h"

#include "util.h"

#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void set_bytes(json_t *o, const char *name, const sbx_buf *b)
{
    if (!b->len)
        return;
    char *text = sbx_base64(b->data, b->len, true);
    /* base64 is ASCII: jansson's UTF-8 check of it was 6 % of an echo call (callgrind) */
    json_object_set_new(o, name, json_stringn_nocheck(text, strlen(text)));
    free(text);
}

static void set_bool(json_t *o, const char *name, bool v)
{
    if (v)
        json_object_set_new(o, name, json_true());
}

static void set_i32(json_t *o, const char *name, int32_t v)
{
    if (v)
        json_object_set_new(o, name, json_integer(v));
}

static void set_i64(json_t *o, const char *name, int64_t v)
{
    if (v) {
        char text[24];
        snprintf(text, sizeof text, "%" PRId64, v);
        json_object_set_new(o, name, json_string(text));
    }
}

static void set_str(json_t *o, const char *name, const char *v)
{
    if (v && *v)
        json_object_set_new(o, name, json_string(v));
}

static const char *outcome_name(int outcome)
{
    static const char *const names[] = {
        "PROJECT_OUTCOME_UNSPECIFIED", "PROJECT_OUTCOME_COMPLETED", "PROJECT_OUTCOME_SETUP_FAILED",
        "PROJECT_OUTCOME_TIMED_OUT", "PROJECT_OUTCOME_PROTOCOL_ERROR",
    };
    return outcome >= 0 && (size_t)outcome < SBX_ARRAY_LEN(names) ? names[outcome] : names[0];
}

static json_t *project_json(const sbx_result *r)
{
    json_t *p = json_object();
    if (r->n_steps) {
        json_t *steps = json_array();
        for (size_t i = 0; i < r->n_steps; i++) {
            const sbx_step_result *st = &r->steps[i];
            json_t *s = json_object();
            set_str(s, "command", st->command);
            set_bytes(s, "stdout", &st->out);
            set_bytes(s, "stderr", &st->err);
            set_i32(s, "exitCode", st->exit_code);
            set_bool(s, "timedOut", st->timed_out);
            set_i64(s, "durationMs", st->duration_ms);
            set_bool(s, "stdoutTruncated", st->out_truncated);
            set_bool(s, "stderrTruncated", st->err_truncated);
            json_array_append_new(steps, s);
        }
        json_object_set_new(p, "steps", steps);
    }
    if (r->outcome)
        json_object_set_new(p, "outcome", json_string(outcome_name(r->outcome)));
    if (r->n_artifacts) {
        json_t *arts = json_array();
        for (size_t i = 0; i < r->n_artifacts; i++) {
            json_t *a = json_object();
            set_str(a, "path", r->artifacts[i].path);
            set_bytes(a, "content", &r->artifacts[i].content);
            json_array_append_new(arts, a);
        }
        json_object_set_new(p, "artifacts", arts);
    }
    set_str(p, "outcomeDetail", r->outcome_detail);
    set_bool(p, "artifactsTruncated", r->artifacts_truncated);
    return p;
}

/* JavaScriptResult and CellResult share their first six fields. */
static json_t *streams_json(const sbx_result *r, bool cell)
{
    json_t *o = json_object();
    set_bytes(o, "stdout", &r->out);
    set_bytes(o, "stderr", &r->err);
    set_i32(o, "exitCode", r->exit_code);
    set_bool(o, "timedOut", r->timed_out);
    set_bool(o, "stdoutTruncated", r->out_truncated);
    set_bool(o, "stderrTruncated", r->err_truncated);
    if (cell) {
        set_bool(o, "interpreterStarted", r->interpreter_started);
        set_bool(o, "interpreterEnded", r->interpreter_ended);
    }
    return o;
}

static plm_record *record_new(const sbx_record_ctx *c, uint32_t version, const char *request_sha,
                              const char *result_sha, const char *unanswered, sbx_err **err)
{
    plm_record *rec = sbx_xcalloc(1, sizeof *rec);
    rec->version = version;
    rec->request_sha256 = sbx_xstrdup(request_sha);
    rec->result_sha256 = sbx_xstrdup(result_sha);
    rec->unanswered = sbx_xstrdup(unanswered);
    rec->provider = sbx_xstrdup(c->provider);
    rec->isolation = sbx_xstrdup(c->isolation);
    rec->environment = sbx_xstrdup(c->environment ? c->environment : "");
    rec->policy = sbx_xstrdup(c->policy ? c->policy : "");
    rec->software_identity = sbx_xstrdup(c->software_identity ? c->software_identity : "");
    rec->software_rule_id = sbx_xstrdup(c->software_rule_id ? c->software_rule_id : "");
    rec->started_unix_ms = c->started_ms;
    rec->ended_unix_ms = c->ended_ms;
    rec->session = sbx_xstrdup(c->session ? c->session : "");
    rec->sequence = c->sequence;
    rec->previous_sha256 = sbx_xstrdup(c->previous ? c->previous : "");
    plm_hex hex;
    plm_error *perr = plm_record_digest(rec, hex);
    if (perr) {
        *err = sbx_err_new(PLM_INTERNAL, PLM_REFUSAL_NONE, "cannot digest the run record: %s",
                           perr->message ? perr->message : "?");
        plm_error_free(perr);
        plm_record_free(rec);
        return NULL;
    }
    rec->record_sha256 = sbx_xstrdup(hex);
    return rec;
}

/* ---------------------------------------------------------------- signed records
 *
 * The reference signs a checked record as a DSSE envelope around an in-toto Statement
 * v1 (plimsoll repository, attest/attest.go): payload type
 * "application/vnd.in-toto+json"; one subject, "run-record", whose sha256 is the
 * record's own digest; predicate type .../run-record/v1, the record in snake_case
 * field names; an Ed25519 signature over DSSE's pre-authentication encoding; the key
 * named by the hex SHA-256 of its PKIX (SubjectPublicKeyInfo) DER.  sandboxd emits the
 * same envelope beside the record (`recordEnvelope`, a field clients that do not know
 * it ignore), so `berth verify` and the reference's verifier both check it. */

#define DSSE_PAYLOAD_TYPE "application/vnd.in-toto+json"
#define INTOTO_STATEMENT "https://in-toto.io/Statement/v1"
#define RUN_RECORD_PREDICATE "https://plimsollmark.github.io/plimsoll/run-record/v1"

static EVP_PKEY *sign_key;
static char sign_keyid[65];

const char *sbx_records_key_id(void)
{
    return sign_key ? sign_keyid : NULL;
}

int sbx_records_load_key(const char *path, char **why)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        *why = sbx_printf("cannot read the record key %s: %s", path, strerror(errno));
        return -1;
    }
    EVP_PKEY *k = PEM_read_PrivateKey(f, NULL, NULL, NULL);
    fclose(f);
    if (!k || EVP_PKEY_get_id(k) != EVP_PKEY_ED25519) {
        EVP_PKEY_free(k);
        *why = sbx_printf("%s is not a PEM (PKCS #8) Ed25519 private key (make one with "
                          "`openssl genpkey -algorithm ed25519 -out %s`)", path, path);
        return -1;
    }
    unsigned char *der = NULL;
    int n = i2d_PUBKEY(k, &der);
    if (n <= 0) {
        EVP_PKEY_free(k);
        *why = sbx_printf("cannot encode the public half of %s", path);
        return -1;
    }
    plm_sha256_hex(der, (size_t)n, sign_keyid);
    OPENSSL_free(der);
    EVP_PKEY_free(sign_key);
    sign_key = k;
    return 0;
}

void sbx_records_unload_key(void)
{
    EVP_PKEY_free(sign_key);
    sign_key = NULL;
}

/* The statement in the reference's field order (Go's encoding/json of its structs). */
static json_t *run_record_statement(const plm_record *r)
{
    json_t *pred = json_object();
    json_object_set_new(pred, "version", json_integer(r->version));
    json_object_set_new(pred, "request_sha256", json_string(r->request_sha256));
    json_object_set_new(pred, "result_sha256", json_string(r->result_sha256));
    json_object_set_new(pred, "provider", json_string(r->provider));
    json_object_set_new(pred, "isolation", json_string(r->isolation));
    json_object_set_new(pred, "environment", json_string(r->environment));
    if (*r->software_identity)
        json_object_set_new(pred, "software_identity", json_string(r->software_identity));
    if (*r->software_rule_id)
        json_object_set_new(pred, "software_rule_id", json_string(r->software_rule_id));
    json_object_set_new(pred, "policy", json_string(r->policy));
    json_object_set_new(pred, "started_unix_ms", json_integer(r->started_unix_ms));
    json_object_set_new(pred, "ended_unix_ms", json_integer(r->ended_unix_ms));
    json_object_set_new(pred, "session", json_string(r->session));
    json_object_set_new(pred, "sequence", json_integer((json_int_t)r->sequence));
    json_object_set_new(pred, "previous_sha256", json_string(r->previous_sha256));
    if (r->unanswered && *r->unanswered)
        json_object_set_new(pred, "unanswered", json_string(r->unanswered));
    json_object_set_new(pred, "record_sha256", json_string(r->record_sha256));
    json_t *st = json_object();
    json_object_set_new(st, "_type", json_string(INTOTO_STATEMENT));
    json_object_set_new(st, "subject",
                        json_pack("[{s:s, s:{s:s}}]", "name", "run-record", "digest", "sha256",
                                  r->record_sha256));
    json_object_set_new(st, "predicateType", json_string(RUN_RECORD_PREDICATE));
    json_object_set_new(st, "predicate", pred);
    return st;
}

json_t *sbx_record_envelope(const plm_record *rec)
{
    if (!sign_key)
        return NULL;
    json_t *st = run_record_statement(rec);
    char *payload = json_dumps(st, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(st);
    if (!payload)
        return NULL;
    size_t plen = strlen(payload), pae_len, sig_len = 64;
    unsigned char *pae = plm_dsse_pae(DSSE_PAYLOAD_TYPE, payload, plen, &pae_len), sig[64];
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    bool ok = ctx && EVP_DigestSignInit(ctx, NULL, NULL, NULL, sign_key) == 1 &&
              EVP_DigestSign(ctx, sig, &sig_len, pae, pae_len) == 1 && sig_len == 64;
    EVP_MD_CTX_free(ctx);
    free(pae);
    json_t *env = NULL;
    if (ok) {
        char *p64 = sbx_base64((const unsigned char *)payload, plen, true);
        char *s64 = sbx_base64(sig, sig_len, true);
        env = json_pack("{s:s, s:s, s:[{s:s, s:s}]}", "payloadType", DSSE_PAYLOAD_TYPE,
                        "payload", p64, "signatures", "keyid", sign_keyid, "sig", s64);
        free(p64);
        free(s64);
    }
    free(payload);
    return env;
}

json_t *sbx_answer(const sbx_record_ctx *ctx, const sbx_result *res, const char *request_sha256,
                   plm_record **record_out, sbx_err **err)
{
    *record_out = NULL;
    json_t *resp = json_object();
    set_str(resp, "sandbox", ctx->provider);
    set_str(resp, "isolation", ctx->isolation);
    set_i64(resp, "durationMs", ctx->ended_ms - ctx->started_ms);
    set_str(resp, "softwareIdentity", ctx->software_identity);
    set_str(resp, "environment", ctx->environment);
    switch (res->kind) {
    case SBX_KIND_JAVASCRIPT:
        json_object_set_new(resp, "javascript", streams_json(res, false));
        break;
    case SBX_KIND_PROJECT:
        json_object_set_new(resp, "project", project_json(res));
        break;
    case SBX_KIND_CELL:
        json_object_set_new(resp, "cell", streams_json(res, true));
        break;
    default:
        break;
    }
    plm_hex result_sha;
    plm_error *perr = plm_result_digest(resp, result_sha);
    if (perr) {
        *err = sbx_err_new(PLM_INTERNAL, PLM_REFUSAL_NONE, "cannot digest the result: %s",
                           perr->message ? perr->message : "?");
        plm_error_free(perr);
        json_decref(resp);
        return NULL;
    }
    plm_record *rec = record_new(ctx, 2, request_sha256, result_sha, "", err);
    if (!rec) {
        json_decref(resp);
        return NULL;
    }
    json_object_set_new(resp, "record", plm_record_to_json(rec));
    json_t *envelope = sbx_record_envelope(rec);
    if (envelope)
        json_object_set_new(resp, "recordEnvelope", envelope);
    *record_out = rec;
    return resp;
}

plm_record *sbx_unanswered_record(const sbx_record_ctx *ctx, const char *request_sha256,
                                  plm_code code, sbx_err **err)
{
    return record_new(ctx, 3, request_sha256, "", plm_code_name(code), err);
}

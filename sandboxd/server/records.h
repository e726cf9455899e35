/*
 * records.h — RunResponse JSON and run records (docs/records.md), built with libplimsoll's
 * digest functions so the daemon and every client hash exactly the same bytes.
 */
#ifndef SBX_RECORDS_H
#define SBX_RECORDS_H

#include "errors.h"
#include "provider.h"

#include <jansson.h>

/* What a record states besides its digests. */
typedef struct sbx_record_ctx {
    const char *provider, *isolation, *environment, *policy;
    const char *software_identity, *software_rule_id;
    int64_t started_ms, ended_ms;
    const char *session;           /* fingerprint, or "" for a single run */
    uint64_t sequence;             /* 0 for a single run */
    const char *previous;          /* "" for call 1 and single runs */
} sbx_record_ctx;

/* The RunResponse of an answered run, its record included (version 2):
 * resultSha256 is the digest of exactly the JSON returned (without its record). */
json_t *sbx_answer(const sbx_record_ctx *ctx, const sbx_result *res, const char *request_sha256,
                   plm_record **record_out, sbx_err **err);
/* The version 3 record of a session call that may have run, then failed with `code`. */
plm_record *sbx_unanswered_record(const sbx_record_ctx *ctx, const char *request_sha256,
                                  plm_code code, sbx_err **err);

/* Signed records (--record-key): loads a PEM PKCS #8 Ed25519 private key; from then on
 * every answer carries `recordEnvelope`, the reference's DSSE envelope over its record.
 * Returns 0, or -1 with *why. */
int sbx_records_load_key(const char *path, char **why);
void sbx_records_unload_key(void);
/* The loaded key's id (hex SHA-256 of its PKIX DER), or NULL when records are unsigned. */
const char *sbx_records_key_id(void);
/* The envelope over `rec`, or NULL when no key is loaded. */
json_t *sbx_record_envelope(const plm_record *rec);

#endif

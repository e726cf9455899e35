/*
 * verify.c — what a client checks on every answer before believing it
 * (docs/records.md §7, docs/client.md §2.5).  Every failure is data loss: the code
 * may have run, so it is never a signal to retry.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

static const char *const check_names[] = {
    "valid", "floor", "record", "version", "malformed", "request digest", "result digest",
    "provider or isolation", "environment", "software", "record digest",
    "session fields on a single run", "chain", "result count", "kind", "floor", "evidence",
};

const char *plm_check_name(plm_check c)
{
    return (size_t)c < PLM_ARRAY_LEN(check_names) ? check_names[c] : "unknown";
}

static plm_check fail(plm_error **err, plm_check c, const char *fmt, const char *a, const char *b)
{
    *err = plm_err_new(PLM_DATA_LOSS, PLM_REFUSAL_NONE, fmt, a ? a : "", b ? b : "");
    return c;
}

static const char *s_or_empty(const char *s)
{
    return s ? s : "";
}

static bool same(const char *a, const char *b)
{
    return strcmp(s_or_empty(a), s_or_empty(b)) == 0;
}

static const char *req_floor(const json_t *req)
{
    const char *f = json_string_value(plm_jget(req, "minimumIsolation", "minimum_isolation"));
    return f ? f : "";
}

static const json_t *req_rule(const json_t *req)
{
    const json_t *r = plm_jget(req, "softwareRule", "software_rule");
    return (r && !json_is_null(r)) ? r : NULL;
}

static const char *const kind_keys[] = {NULL, "javascript", "project", "cell", "module"};

plm_kind plm_request_kind(const json_t *req)
{
    for (int k = PLM_KIND_JAVASCRIPT; k <= PLM_KIND_MODULE; k++) {
        const json_t *p = plm_jget(req, kind_keys[k], NULL);
        if (p && !json_is_null(p))
            return (plm_kind)k;
    }
    return PLM_KIND_NONE;
}

int plm_result_kinds(const json_t *resp, plm_kind *first)
{
    int n = 0;
    *first = PLM_KIND_NONE;
    for (int k = PLM_KIND_JAVASCRIPT; k <= PLM_KIND_MODULE; k++) {
        const json_t *p = plm_jget(resp, kind_keys[k], NULL);
        if (p && !json_is_null(p)) {
            if (n++ == 0)
                *first = (plm_kind)k;
        }
    }
    return n;
}

/* Checks shared by answered and unanswered records: the request digest, the rule id
 * and the identity the rule allows, and the record's own digest. */
static plm_check check_digests(const json_t *req, const plm_record *rec, plm_error **err)
{
    plm_hex want;
    plm_error *e = plm_request_digest(req, want);
    if (e) {
        *err = e;
        return PLM_CHECK_REQUEST_DIGEST;
    }
    if (!same(rec->request_sha256, want))
        return fail(err, PLM_CHECK_REQUEST_DIGEST,
                    "the record's request digest %s does not match the request sent (%s)",
                    rec->request_sha256, want);
    return PLM_CHECK_OK;
}

static plm_check check_rule(const json_t *req, const plm_record *rec, plm_error **err)
{
    char *rule_id = plm_software_rule_id(req_rule(req));
    bool ok = rule_id && same(rec->software_rule_id, rule_id);
    free(rule_id);
    if (!ok)
        return fail(err, PLM_CHECK_SOFTWARE,
                    "the record's software rule id %s is not the request's rule%s",
                    rec->software_rule_id, "");
    if (!plm_software_rule_allows(req_rule(req), rec->software_identity))
        return fail(err, PLM_CHECK_SOFTWARE,
                    "the record's software identity %s is outside the request's software rule%s",
                    rec->software_identity, "");
    return PLM_CHECK_OK;
}

static plm_check check_own_digest(const plm_record *rec, plm_error **err)
{
    plm_hex want;
    plm_error *e = plm_record_digest(rec, want);
    if (e) {
        *err = e;
        return PLM_CHECK_RECORD_DIGEST;
    }
    if (!same(rec->record_sha256, want))
        return fail(err, PLM_CHECK_RECORD_DIGEST,
                    "the record digest %s does not recompute (%s)", rec->record_sha256, want);
    return PLM_CHECK_OK;
}

static plm_check check_chain(const plm_record *rec, const plm_chain *chain, plm_error **err)
{
    if (same(rec->session, chain->fingerprint) && rec->sequence == chain->last_sequence + 1 &&
        same(rec->previous_sha256, chain->last_sha256))
        return PLM_CHECK_OK;
    char seq[64];
    snprintf(seq, sizeof seq, "%llu, expected %llu", (unsigned long long)rec->sequence,
             (unsigned long long)chain->last_sequence + 1);
    return fail(err, PLM_CHECK_CHAIN,
                "the session's chain is broken (record sequence %s%s); another holder of the "
                "session may have made a call, or a record was dropped or replayed", seq, "");
}

plm_check plm_verify_answer(const json_t *req, const json_t *resp, const plm_chain *chain,
                            plm_record **out, plm_error **err)
{
    return plm_verify_mapped(req, resp, NULL, chain, out, err);
}

static plm_error *result_digest(const json_t *resp, const plm_result *mapped, plm_hex hex)
{
    if (mapped && (mapped->kind == PLM_KIND_JAVASCRIPT || mapped->kind == PLM_KIND_CELL))
        return plm_result_digest_mapped(mapped, hex);
    return plm_result_digest(resp, hex);
}

plm_check plm_verify_mapped(const json_t *req, const json_t *resp, const plm_result *mapped,
                            const plm_chain *chain, plm_record **out, plm_error **err)
{
    *out = NULL;
    *err = NULL;
    const char *floor = req_floor(req);
    if (!plm_valid_floor(floor))
        return fail(err, PLM_CHECK_FLOOR_INVALID,
                    "the request's minimumIsolation %s is not a tier%s", floor, "");
    const json_t *rj = plm_jget(resp, "record", NULL);
    if (!rj || json_is_null(rj))
        return fail(err, PLM_CHECK_NO_RECORD, "the response carries no run record%s%s", "", "");
    plm_error *e = NULL;
    plm_record *rec = plm_record_from_json(rj, &e);
    if (!rec) {
        *err = e;
        return PLM_CHECK_MALFORMED;
    }
    plm_check c = PLM_CHECK_OK;
    int64_t protocol = json_integer_value(plm_jget(req, "protocol", NULL));
    const char *s;
    plm_hex want;
    if (rec->version != 1 && rec->version != 2) {
        c = fail(err, PLM_CHECK_VERSION, "the record's version is not 1 or 2%s%s", "", "");
    } else if (protocol >= 2 && rec->version != 2) {
        c = fail(err, PLM_CHECK_VERSION, "a protocol 2+ answer carries a version 1 record%s%s", "", "");
    } else if (rec->version == 1 && (*rec->software_identity || *rec->software_rule_id)) {
        c = fail(err, PLM_CHECK_VERSION, "a version 1 record carries software fields%s%s", "", "");
    } else if (*rec->unanswered) {
        c = fail(err, PLM_CHECK_VERSION, "an answered record states unanswered %s%s",
                 rec->unanswered, "");
    } else if ((c = check_digests(req, rec, err)) != PLM_CHECK_OK) {
        /* reported */
    } else if ((e = result_digest(resp, mapped, want)) != NULL) {
        *err = e;
        c = PLM_CHECK_MALFORMED;
    } else if (!same(rec->result_sha256, want)) {
        c = fail(err, PLM_CHECK_RESULT_DIGEST,
                 "the record's result digest %s does not match the result received (%s)",
                 rec->result_sha256, want);
    } else if (!same(rec->provider, (s = json_string_value(plm_jget(resp, "sandbox", NULL)))) ||
               !same(rec->isolation, json_string_value(plm_jget(resp, "isolation", NULL)))) {
        c = fail(err, PLM_CHECK_PROVIDER,
                 "the record's provider or isolation (%s) differs from the answer's (%s)",
                 rec->provider, s);
    } else if (rec->version == 2 &&
               !same(rec->environment, json_string_value(plm_jget(resp, "environment", NULL)))) {
        c = fail(err, PLM_CHECK_ENVIRONMENT,
                 "the record's environment %s differs from the answer's%s", rec->environment, "");
    } else if (rec->version == 2 &&
               !same(rec->software_identity,
                     json_string_value(plm_jget(resp, "softwareIdentity", "software_identity")))) {
        c = fail(err, PLM_CHECK_SOFTWARE,
                 "the record's software identity %s differs from the answer's%s",
                 rec->software_identity, "");
    } else if (rec->version == 2 && (c = check_rule(req, rec, err)) != PLM_CHECK_OK) {
        /* reported */
    } else if ((c = check_own_digest(rec, err)) != PLM_CHECK_OK) {
        /* reported */
    } else if (!chain && (*rec->session || rec->sequence || *rec->previous_sha256)) {
        c = fail(err, PLM_CHECK_SESSION_FIELDS,
                 "a single run's record carries session fields%s%s", "", "");
    } else if (chain && (c = check_chain(rec, chain, err)) != PLM_CHECK_OK) {
        /* reported */
    } else {
        plm_kind first;
        int n = plm_result_kinds(resp, &first);
        if (n > 1) {
            char count[16];
            snprintf(count, sizeof count, "%d", n);
            c = fail(err, PLM_CHECK_RESULT_COUNT, "the answer holds %s results; a run has one%s",
                     count, "");
        } else if (first != plm_request_kind(req))
            c = fail(err, PLM_CHECK_KIND, "the daemon's result is not of the request's kind%s%s",
                     "", "");
        else if (*floor && !plm_meets(json_string_value(plm_jget(resp, "isolation", NULL)), floor))
            c = fail(err, PLM_CHECK_FLOOR,
                     "result isolation %s is below the requested %s; execution may have occurred",
                     json_string_value(plm_jget(resp, "isolation", NULL)), floor);
    }
    /* The late checks (count, kind, floor) fail on a record that checked and chained:
     * hand it back so a session can still advance its chain past it. */
    if (c != PLM_CHECK_OK && c != PLM_CHECK_RESULT_COUNT && c != PLM_CHECK_KIND &&
        c != PLM_CHECK_FLOOR) {
        plm_record_free(rec);
        return c;
    }
    *out = rec;
    return c;
}

static bool connect_code(const char *name)
{
    plm_code c;
    return plm_code_parse(name, &c);
}

plm_check plm_verify_unanswered(const json_t *req, const plm_record *rec, const plm_chain *chain,
                                plm_error **err)
{
    *err = NULL;
    const char *floor = req_floor(req);
    plm_check c;
    if (!plm_valid_floor(floor))
        return fail(err, PLM_CHECK_FLOOR_INVALID,
                    "the request's minimumIsolation %s is not a tier%s", floor, "");
    if (rec->version != 3)
        return fail(err, PLM_CHECK_VERSION, "the unanswered call's record is not version 3%s%s",
                    "", "");
    if (*s_or_empty(rec->result_sha256) || !connect_code(rec->unanswered))
        return fail(err, PLM_CHECK_VERSION,
                    "the unanswered record states a result or an unknown code (%s)%s",
                    rec->unanswered, "");
    if ((c = check_digests(req, rec, err)) != PLM_CHECK_OK ||
        (c = check_rule(req, rec, err)) != PLM_CHECK_OK ||
        (c = check_own_digest(rec, err)) != PLM_CHECK_OK)
        return c;
    if (*floor && !plm_meets(rec->isolation, floor))
        return fail(err, PLM_CHECK_FLOOR,
                    "the unanswered record's isolation %s is below the call's minimum %s; "
                    "execution may have occurred", rec->isolation, floor);
    return check_chain(rec, chain, err);
}

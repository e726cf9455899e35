/*
 * fuzz_answer.c — a daemon's answer, as arbitrary bytes, through plm_finish_answer:
 * the path every answer takes in the client (mapped, then checked: digests, record,
 * chain, count, kind, floor).  Nothing may crash, leak or read out of bounds, whatever
 * the daemon sends.
 *
 * The input is an exchange, {"request", "response", "chain"} as golden-vectors.json
 * has them (the seeds are its exchanges), or a bare answer ({"run": ...} or the run
 * itself) to a fixed cell request.  Each is checked as it came, then again with the
 * record's three digests made right for what the input holds: a mutation of the result
 * would otherwise end every run at the digest check, and the checks after it and the
 * mapping of what a checked answer holds would never see the fuzzer's values.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "internal.h"

static void finish(const json_t *req, json_t *resp, const plm_chain *chain)
{
    plm_error *err = NULL;
    plm_result *r = NULL;
    plm_record *checked = NULL;
    plm_finish_answer("SessionRun", req, resp, chain, &err, &r, &checked);
    plm_error_free(err);
    plm_result_free(r);
    plm_record_free(checked);
}

/* The record's requestSha256, resultSha256 and recordSha256 set to what the client
 * computes from req and resp; left as they are where a digest cannot be computed. */
static void fix_digests(const json_t *req, json_t *resp)
{
    json_t *rj = json_object_get(resp, "record");
    if (!json_is_object(rj))
        return;
    plm_hex hex;
    plm_error *e = plm_request_digest(req, hex);
    if (!e)
        json_object_set_new(rj, "requestSha256", json_string(hex));
    plm_error_free(e);
    plm_result *mapped = NULL;
    e = plm_map_result(resp, NULL, &mapped);
    if (!e && (mapped->kind == PLM_KIND_CELL || mapped->kind == PLM_KIND_JAVASCRIPT))
        e = plm_result_digest_mapped(mapped, hex);
    else if (!e)
        e = plm_result_digest(resp, hex);
    if (!e)
        json_object_set_new(rj, "resultSha256", json_string(hex));
    plm_error_free(e);
    plm_result_free(mapped);
    plm_record *rec = plm_record_from_json(rj, &e);
    if (rec && !(e = plm_record_digest(rec, hex)))
        json_object_set_new(rj, "recordSha256", json_string(hex));
    plm_error_free(e);
    plm_record_free(rec);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static json_t *cell_req;
    if (!cell_req)
        cell_req = json_pack("{s:i, s:s, s:{s:s, s:s, s:[]}}", "protocol", 3,
                             "minimumIsolation", "container", "cell", "language", "python",
                             "code", "x", "files");
    json_t *in = json_loadb((const char *)data, size, JSON_ALLOW_NUL | JSON_DECODE_ANY, NULL);
    if (!in)
        return 0;
    const json_t *req = json_object_get(in, "request");
    json_t *resp = json_object_get(in, "response");
    plm_chain chain = {"3eb1bd439947eb762998e566ccc2e099c791118b2f40579cc4f7da2b5061b7f9", 1, ""};
    const plm_chain *with = &chain;
    if (!req) {                     /* a bare answer to the cell request */
        req = cell_req;
        resp = json_is_object(json_object_get(in, "run")) ? json_object_get(in, "run") : in;
    } else {
        const json_t *cj = json_object_get(in, "chain");
        with = json_is_object(cj) ? &chain : NULL;
        const char *f = json_string_value(json_object_get(cj, "fingerprint"));
        const char *last = json_string_value(json_object_get(cj, "previousSha256"));
        const char *seq = json_string_value(json_object_get(cj, "previousSequence"));
        chain.fingerprint = f ? f : "";
        chain.last_sha256 = last ? last : "";
        chain.last_sequence = seq ? strtoull(seq, NULL, 10) : 0;
    }
    if (json_is_object(resp)) {
        finish(req, resp, with);
        json_t *fixed = json_deep_copy(resp);
        if (fixed) {
            fix_digests(req, fixed);
            finish(req, fixed, with);
            json_decref(fixed);
        }
    }
    plm_info *info = NULL;
    plm_error_free(plm_map_info(in, &info));
    plm_info_free(info);
    json_decref(in);
    return 0;
}

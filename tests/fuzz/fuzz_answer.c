/*
 * fuzz_answer.c — a daemon's answer to a session cell, as arbitrary bytes: parsed as
 * JSON, verified against a fixed request and chain, then mapped.  Nothing may crash,
 * leak or read out of bounds, whatever the daemon sends.
 */
#include <stddef.h>
#include <stdint.h>

#include "internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static json_t *req;
    if (!req)
        req = json_pack("{s:i, s:s, s:{s:s, s:s, s:[]}}", "protocol", 3, "minimumIsolation",
                        "container", "cell", "language", "python", "code", "x", "files");
    json_t *resp = json_loadb((const char *)data, size, JSON_ALLOW_NUL | JSON_DECODE_ANY, NULL);
    if (!resp)
        return 0;
    plm_chain chain = {"3eb1bd439947eb762998e566ccc2e099c791118b2f40579cc4f7da2b5061b7f9", 1, ""};
    plm_record *rec = NULL;
    plm_error *err = NULL;
    plm_verify_answer(req, json_is_object(resp) ? json_object_get(resp, "run") : NULL, &chain,
                      &rec, &err);
    plm_error_free(err);
    plm_result *r = NULL;
    plm_error_free(plm_map_result(resp, rec, &r));
    plm_result_free(r);
    plm_info *info = NULL;
    plm_error_free(plm_map_info(resp, &info));
    plm_info_free(info);
    json_decref(resp);
    return 0;
}

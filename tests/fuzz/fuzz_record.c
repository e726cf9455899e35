/*
 * fuzz_record.c — a run record in proto3 JSON form: read, digested, written back.
 */
#include <stddef.h>
#include <stdint.h>

#include "internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *j = json_loadb((const char *)data, size, JSON_ALLOW_NUL | JSON_DECODE_ANY, NULL);
    if (!j)
        return 0;
    plm_error *err = NULL;
    plm_record *rec = plm_record_from_json(j, &err);
    plm_error_free(err);
    if (rec) {
        plm_hex hex;
        plm_error_free(plm_record_digest(rec, hex));
        json_decref(plm_record_to_json(rec));
        plm_record_free(rec);
    }
    plm_hex h;
    plm_error_free(plm_request_digest(j, h));
    plm_error_free(plm_result_digest(j, h));
    json_decref(j);
    return 0;
}

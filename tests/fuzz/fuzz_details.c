/*
 * fuzz_details.c — Connect error details: base64 protobuf of NotDispatched,
 * SessionEnded and UnansweredCall, decoded by hand.  The input is the protobuf bytes;
 * the harness wraps them as each detail type in turn.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *b64 = plm_base64_encode(data, size, false);
    static const char *const types[] = {"plimsoll.v1.NotDispatched", "plimsoll.v1.SessionEnded",
                                        "plimsoll.v1.UnansweredCall"};
    for (int i = 0; i < 3; i++) {
        json_t *details = json_pack("[{s:s, s:s}]", "type", types[i], "value", b64);
        plm_details d;
        plm_details_parse(details, &d);
        if (d.unanswered) {
            plm_hex hex;
            plm_error_free(plm_record_digest(d.unanswered, hex));
        }
        plm_details_clear(&d);
        json_decref(details);
    }
    free(b64);
    return 0;
}

/*
 * fuzz_request.c — sandboxd's request decoding: any body a caller can send, read and
 * validated as each of the four RPCs that take one.  The daemon must refuse cleanly,
 * never crash, leak or read out of bounds.  (sandboxd's sources are included here
 * because `make fuzz` links harnesses with lib/ only.)
 */
#include <stddef.h>
#include <stdint.h>

#include "../../sandboxd/server/details.c"
#include "../../sandboxd/server/errors.c"
#include "../../sandboxd/server/request.c"
#include "../../sandboxd/server/util.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *body = json_loadb((const char *)data, size, JSON_ALLOW_NUL, NULL);
    if (!body)
        return 0;
    static const sbx_rpc rpcs[] = {SBX_RPC_RUN, SBX_RPC_OPEN, SBX_RPC_SESSION_RUN, SBX_RPC_CLOSE};
    for (size_t i = 0; i < sizeof rpcs / sizeof rpcs[0]; i++) {
        sbx_err *e = sbx_request_protocol(body, 3);
        if (!e) {
            sbx_request req;
            e = sbx_request_parse(&req, rpcs[i], body);
            if (!e)
                sbx_request_clear(&req);
        }
        if (e) {
            json_decref(sbx_err_body(e)); /* the error body a caller would get */
            sbx_err_free(e);
        }
    }
    json_decref(body);
    return 0;
}

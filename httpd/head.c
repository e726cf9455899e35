/*
 * head.c — see head.h.
 *
 * The layout counted is 0.9.75's: the read buffer holds the head's lines as they came
 * (parsed in place), each header, cookie and query argument gets a struct
 * MHD_HTTP_Header (seven words) from the pool's end, and the Cookie header's value is
 * copied before it is split.  Self-contained (MHD only) so that runtime/ can build it.
 */
#include "head.h"

#include <string.h>

/* A struct MHD_HTTP_Header (7 words) at the pool's rounding (2 words). */
#define ENTRY_BYTES 64

static enum MHD_Result count_entry(void *cls, enum MHD_ValueKind kind, const char *key,
                                   size_t key_size, const char *value, size_t value_size)
{
    size_t *n = cls;
    *n += ENTRY_BYTES + key_size + value_size;
    if (kind == MHD_HEADER_KIND)
        *n += 4;                   /* ": " and CRLF of its line */
    else
        *n += 2;                   /* a cookie's copy, a query argument: "=" and ";", "&" */
    return MHD_YES;
}

size_t httpd_head_bytes(struct MHD_Connection *conn, const char *method, const char *url,
                        const char *version)
{
    size_t n = strlen(method) + strlen(url) + strlen(version) + 6; /* 2 spaces, 2 CRLFs */
    MHD_get_connection_values_n(conn, MHD_HEADER_KIND | MHD_COOKIE_KIND |
                                          MHD_GET_ARGUMENT_KIND,
                                count_entry, &n);
    return n;
}

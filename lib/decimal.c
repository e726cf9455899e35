/*
 * decimal.c — integers as decimal text (json_text.h), two digits at a time.
 */
#include "json_text.h"

#include <string.h>

static const char pairs[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

size_t plm_u64_text(char *out, uint64_t v)
{
    char tmp[20];               /* UINT64_MAX has 20 digits */
    char *p = tmp + sizeof tmp;
    while (v >= 100) {
        const char *d = pairs + 2 * (v % 100);
        v /= 100;
        *--p = d[1];
        *--p = d[0];
    }
    if (v >= 10) {
        *--p = pairs[2 * v + 1];
        *--p = pairs[2 * v];
    } else {
        *--p = (char)('0' + v);
    }
    size_t n = (size_t)(tmp + sizeof tmp - p);
    memcpy(out, p, n);
    out[n] = '\0';
    return n;
}

size_t plm_i64_text(char *out, int64_t v)
{
    if (v >= 0)
        return plm_u64_text(out, (uint64_t)v);
    out[0] = '-';
    return 1 + plm_u64_text(out + 1, 0 - (uint64_t)v);  /* INT64_MIN's magnitude too */
}

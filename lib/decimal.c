/*
 * decimal.c — numbers as decimal text (json_text.h): integers two digits at a time, and
 * reals of everyday scale as "%.17g" writes them, without its multi-precision path.
 */
#include "json_text.h"

#include <math.h>
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

/* {====================================================== reals, as "%.17g" writes them */

/* The scale of the fast path: |x| in [1e-4, 1e15), where "%.17g" writes fixed notation
 * and |x| * 10^(16 - X) is exact in 128 bits (X its decimal exponent: a 53-bit
 * significand times 10^20 at most, shifted right by 66 bits at most). */
#define REAL_MIN_FAST 1e-4
#define REAL_MAX_FAST 1e15

static const uint64_t pow10_u64[] = {
    1ull, 10ull, 100ull, 1000ull, 10000ull, 100000ull, 1000000ull, 10000000ull,
    100000000ull, 1000000000ull, 10000000000ull, 100000000000ull, 1000000000000ull,
    10000000000000ull, 100000000000000ull, 1000000000000000ull, 10000000000000000ull,
    100000000000000000ull, 1000000000000000000ull, 10000000000000000000ull};

/* |x| * 10^s rounded to an integer, ties to even (printf's rounding), for x =
 * m * 2^e with e < 0 and 0 <= s <= 20. */
static uint64_t scaled(uint64_t m, int e, int s)
{
    unsigned __int128 n = (unsigned __int128)m * pow10_u64[s > 19 ? 19 : s];
    if (s > 19)
        n *= 10;
    int shift = -e;
    unsigned __int128 q = n >> shift, rest = n - (q << shift);
    unsigned __int128 half = (unsigned __int128)1 << (shift - 1);
    if (rest > half || (rest == half && (q & 1)))
        q++;
    return (uint64_t)q;
}

size_t plm_real17_text(char *out, double x)
{
    double a = x < 0 ? -x : x;
    if (!(a >= REAL_MIN_FAST && a < REAL_MAX_FAST))
        return 0;               /* (NaN too) */
    int e2;
    double f = frexp(a, &e2);   /* a = f * 2^e2, f in [0.5, 1) */
    uint64_t m = (uint64_t)ldexp(f, 53);
    int e = e2 - 53;            /* a = m * 2^e exactly; e < 0 in this range */
    /* X = floor(log10(a)) after the rounding to 17 digits, from an estimate that may
     * be one off either way (and is kept within the range's decades: 1e15's
     * neighbour below may read 15) */
    int X = (int)floor(log10(a));
    X = X < -4 ? -4 : X > 14 ? 14 : X;
    uint64_t d = 0;
    for (int tries = 0; tries < 3; tries++) {
        if (X < -4 || X > 14)
            return 0;
        d = scaled(m, e, 16 - X);
        if (d < pow10_u64[16])
            X--;
        else if (d >= pow10_u64[17])
            X++;
        else
            break;
    }
    if (d < pow10_u64[16] || d >= pow10_u64[17])
        return 0;
    char digits[PLM_INT_TEXT];
    plm_u64_text(digits, d);    /* 17 digits */
    int keep = 17;
    while (keep > X + 1 && keep > 1 && digits[keep - 1] == '0')
        keep--;                 /* "%g" drops the fraction's trailing zeros */
    char *p = out;
    if (x < 0)
        *p++ = '-';
    if (X >= 0) {
        memcpy(p, digits, (size_t)X + 1);
        p += X + 1;
        if (keep > X + 1) {
            *p++ = '.';
            memcpy(p, digits + X + 1, (size_t)(keep - X - 1));
            p += keep - X - 1;
        }
    } else {
        *p++ = '0';
        *p++ = '.';
        for (int z = -1; z > X; z--)
            *p++ = '0';
        memcpy(p, digits, (size_t)keep);
        p += keep;
    }
    *p = '\0';
    return (size_t)(p - out);
}

/* }====================================================== */

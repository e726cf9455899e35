/*
 * utf8.c — UTF-8 well-formedness (RFC 3629: no overlongs, no surrogates, nothing
 * above U+10FFFF) and a lossy copy that replaces ill-formed sequences with U+FFFD,
 * the way TextDecoder does for the reference's `stdout` text.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

size_t plm_utf8_sequence(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;      /* U+D800..U+DFFF are not text */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++) {
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    }
    return len;
}

/* Length of the run of ASCII bytes at s[0..n), 32 or eight at a time: program output
 * is mostly ASCII, and this is the hot loop of reading it. */
static size_t ascii_run(const unsigned char *s, size_t n)
{
    size_t i = 0;
#ifdef __SSE2__
    for (; i + 32 <= n; i += 32) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        if (_mm_movemask_epi8(_mm_or_si128(a, b)))
            break;
    }
#endif
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        if (w & 0x8080808080808080ULL)
            break;
    }
    while (i < n && s[i] < 0x80)
        i++;
    return i;
}

bool plm_utf8_valid(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    for (size_t i = 0; i < len;) {
        i += ascii_run(s + i, len - i);
        if (i == len)
            break;
        size_t k = plm_utf8_sequence(s + i, len - i);
        if (k == 0)
            return false;
        i += k;
    }
    return true;
}

/* Maximal-subpart replacement: one U+FFFD per ill-formed byte run start, as WHATWG. */
char *plm_utf8_lossy(const unsigned char *s, size_t len, size_t *out_len)
{
    if (plm_utf8_valid((const char *)s, len)) {
        char *copy = malloc(len + 1);
        if (copy) {
            memcpy(copy, s, len);
            copy[len] = '\0';
        }
        if (out_len)
            *out_len = len;
        return copy;
    }
    char *out = malloc(len * 3 + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t k = plm_utf8_sequence(s + i, len - i);
        if (k > 0) {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
            continue;
        }
        memcpy(out + o, "\xEF\xBF\xBD", 3);
        o += 3;
        /* Skip the lead byte and the continuation bytes that still formed a valid prefix. */
        size_t skip = 1;
        unsigned char c = s[i];
        size_t want = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 1;
        while (skip < want && i + skip < len && (s[i + skip] & 0xC0) == 0x80) {
            unsigned char lo = 0x80, hi = 0xBF;
            if (skip == 1) {
                if (c == 0xE0) lo = 0xA0;
                if (c == 0xED) hi = 0x9F;
                if (c == 0xF0) lo = 0x90;
                if (c == 0xF4) hi = 0x8F;
            }
            if (s[i + skip] < lo || s[i + skip] > hi)
                break;
            skip++;
        }
        i += skip;
    }
    out[o] = '\0';
    if (out_len)
        *out_len = o;
    return out;
}

/*
 * json_write.c — a body of the wire (a request in the client, an answer in sandboxd):
 * the text json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) gives, byte for byte,
 * written at memory speed.
 *
 * Why not json_dumps: jansson writes a string a code point at a time (a UTF-8 decode
 * and a callback each) and checks each object and array against its parents for
 * loops; a cell of 32 KiB of code cost 255 µs there, the larger part of the client's
 * CPU for the whole call, and costs 27 µs here (docs/wire.md §4): a string is copied
 * in runs between the bytes JSON must escape, found 16 at a time.
 *
 * What it relies on, and why that holds: every string in a body is well-formed
 * UTF-8 before it is put in (json_string checks; request.c checks before
 * json_stringn_nocheck, and sandboxd makes no string unchecked), so it is copied,
 * not checked again.  Reals are written as jansson writes them ("%.17g"): those of
 * everyday scale by decimal.c's exact integer path (berth serve writes eight a turn,
 * its timings), the others by snprintf.  Nesting deeper than 2048 levels is refused
 * (no reader here takes more), and so is a loop.  tests/test_json_read.c holds this to
 * json_dumps on the same values.
 */
#include "json_text.h"

#include <locale.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define MAX_DEPTH 2048

typedef plm_json_out out;

static bool reserve(out *o, size_t n)
{
    if (o->failed)
        return false;
    if (o->len + n <= o->cap)
        return true;
    size_t cap = o->cap ? o->cap : 256;
    while (cap < o->len + n)
        cap *= 2;
    char *p = realloc(o->p, cap);
    if (!p) {
        o->failed = true;
        return false;
    }
    o->p = p;
    o->cap = cap;
    return true;
}

static void put(out *o, const char *s, size_t n)
{
    if (reserve(o, n)) {
        memcpy(o->p + o->len, s, n);
        o->len += n;
    }
}

/* How many bytes from s on need no escape: not '"', '\\' or below 0x20. */
static size_t plain_run(const unsigned char *s, size_t n)
{
    size_t i = 0;
#ifdef __SSE2__
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'),
                  top_control = _mm_set1_epi8(0x1f);
    for (; i + 16 <= n; i += 16) {
        __m128i x = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, backslash)),
                                   _mm_cmpeq_epi8(_mm_min_epu8(x, top_control), x));
        int mask = _mm_movemask_epi8(hit);
        if (mask)
            return i + (size_t)__builtin_ctz((unsigned)mask);
    }
#endif
    for (; i < n; i++) {
        if (s[i] == '"' || s[i] == '\\' || s[i] < 0x20)
            return i;
    }
    return n;
}

/* JSON's two-character escapes, by byte; 'u' for the rest of the controls. */
static const char short_escape[0x5d] = {
    ['\b'] = 'b', ['\f'] = 'f', ['\n'] = 'n', ['\r'] = 'r', ['\t'] = 't',
    ['"'] = '"', ['\\'] = '\\',
};

static void put_string(out *o, const char *str, size_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    const unsigned char *s = (const unsigned char *)str;
    /* Room for the rest as it is, and grown only at an escape: the usual string
     * needs none, and each escape adds at most 5 bytes. */
    if (!reserve(o, n + 2))
        return;
    char *d = o->p + o->len;
    *d++ = '"';
    size_t i = 0;
    for (;;) {
        size_t run = plain_run(s + i, n - i);
        memcpy(d, s + i, run);
        d += run;
        i += run;
        if (i == n)
            break;
        o->len = (size_t)(d - o->p);
        if (!reserve(o, 6 + (n - i - 1) + 1))
            return;
        d = o->p + o->len;
        unsigned char c = s[i++];
        *d++ = '\\';
        if (c < sizeof short_escape && short_escape[c]) {
            *d++ = short_escape[c];
        } else { /* jansson's "\\u%04X" */
            *d++ = 'u';
            *d++ = '0';
            *d++ = '0';
            *d++ = hex[c >> 4];
            *d++ = hex[c & 15];
        }
    }
    *d++ = '"';
    o->len = (size_t)(d - o->p);
}

static void put_value(out *o, const json_t *v, int depth)
{
    if (depth > MAX_DEPTH) {
        o->failed = true;
        return;
    }
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *key;
        size_t klen;
        json_t *item;
        bool first = true;
        put(o, "{", 1);
        /* By length: a key may hold U+0000 (berth's json.encode makes one from a Lua
         * string; the reader refuses them on the wire), and json_dumps writes it whole. */
        json_object_keylen_foreach((json_t *)v, key, klen, item) {
            if (!first)
                put(o, ",", 1);
            first = false;
            put_string(o, key, klen);
            put(o, ":", 1);
            put_value(o, item, depth + 1);
        }
        put(o, "}", 1);
        return;
    }
    case JSON_ARRAY:
        put(o, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i)
                put(o, ",", 1);
            put_value(o, json_array_get(v, i), depth + 1);
        }
        put(o, "]", 1);
        return;
    case JSON_STRING:
        put_string(o, json_string_value(v), json_string_length(v));
        return;
    case JSON_INTEGER:
        plm_json_put_integer(o, json_integer_value(v));
        return;
    case JSON_REAL:
        plm_json_put_real(o, json_real_value(v));
        return;
    case JSON_TRUE:
        put(o, "true", 4);
        return;
    case JSON_FALSE:
        put(o, "false", 5);
        return;
    case JSON_NULL:
        put(o, "null", 4);
        return;
    }
}

void plm_json_put_raw(plm_json_out *o, const char *s, size_t n)
{
    put(o, s, n);
}

void plm_json_put_string(plm_json_out *o, const char *s, size_t n)
{
    put_string(o, s, n);
}

void plm_json_put_integer(plm_json_out *o, json_int_t i)
{
    char num[PLM_INT_TEXT];
    put(o, num, plm_i64_text(num, (int64_t)i));
}

/* "%.17g" by snprintf in the C locale: the locale's decimal point made '.', and the
 * exponent without its '+' or leading zeros; its length, or 0 when it does not fit
 * with the 3 bytes ".0" may add. */
static size_t printf_real(char *b, size_t cap, double x)
{
    int n = snprintf(b, cap, "%.17g", x);
    if (n <= 0 || (size_t)n + 3 > cap)
        return 0;
    const char *point = localeconv()->decimal_point;
    char *at;
    if (*point != '.' && (at = strchr(b, *point)))
        *at = '.';
    if ((at = strchr(b, 'e'))) {
        char *start = at + 1, *end = start + 1;
        if (*start == '-')
            start++;
        while (*end == '0')
            end++;
        if (end != start) {
            memmove(start, end, (size_t)(b + n - end) + 1);
            n -= (int)(end - start);
        }
    }
    return (size_t)n;
}

/* jansson's jsonp_dtostr at its default precision, so that the bytes are json_dumps's
 * (json_dumps itself costs a buffer and a copy a number): "%.17g" -- decimal.c's for
 * reals of everyday scale, snprintf's for the others -- and ".0" after a number that
 * would read back as an integer. */
void plm_json_put_real(plm_json_out *o, double x)
{
    char b[48];                 /* (PLM_REAL_TEXT + 3 fit) */
    size_t n = plm_real17_text(b, x);
    if (!n && !(n = printf_real(b, sizeof b, x))) {
        o->failed = true;
        return;
    }
    if (!memchr(b, '.', n) && !memchr(b, 'e', n)) {
        memcpy(b + n, ".0", 3);
        n += 2;
    }
    put(o, b, n);
}

char *plm_json_write(const json_t *v, size_t *len)
{
    out o = {0};
    if (v)
        put_value(&o, v, 1);
    else
        o.failed = true;
    if (!o.failed && reserve(&o, 1))
        o.p[o.len] = '\0';
    if (o.failed) {
        free(o.p);
        return NULL;
    }
    if (len)
        *len = o.len;
    return o.p;
}

/*
 * util.c — allocation, strings, time, randomness, hex and base64 helpers.
 */
#include "util.h"
#include "plimsoll.h"
#include "json_text.h" /* lib/: plm_base64_encode */
#include "random.h" /* lib/ */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void sbx_out_of_memory(void)
{
    fputs("sandboxd: out of memory\n", stderr);
    abort();
}

void *sbx_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        sbx_out_of_memory();
    return p;
}

void *sbx_xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        sbx_out_of_memory();
    return p;
}

void *sbx_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        sbx_out_of_memory();
    return q;
}

char *sbx_xstrdup(const char *s)
{
    return s ? sbx_xstrndup(s, strlen(s)) : NULL;
}

char *sbx_xstrndup(const char *s, size_t n)
{
    char *d = sbx_xmalloc(n + 1);
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

char *sbx_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        sbx_out_of_memory(); /* only an encoding error can get here; treat as fatal */
    char *s = sbx_xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

int64_t sbx_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

bool sbx_random_hex(size_t n, char *out)
{
    unsigned char buf[PLM_RANDOM_MAX];
    if (n > sizeof buf || !plm_random_bytes(buf, n))
        return false;
    plm_hex_encode(buf, n, out);
    return true;
}

char *sbx_base64(const unsigned char *data, size_t len, bool padded)
{
    char *out = plm_base64_encode(data, len, padded);  /* the wire's one encoder */
    if (!out)
        sbx_out_of_memory();
    return out;
}

bool sbx_charset_ok(const char *s, size_t len, size_t max, const char *extra)
{
    if (!s || len == 0 || len > max)
        return false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        if (!alnum && (c == '\0' || !strchr(extra, c)))
            return false;
    }
    return true;
}

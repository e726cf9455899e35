/*
 * base64.c — base64 through OpenSSL's EVP block codec.  proto3 JSON readers must
 * accept the URL-safe alphabet and missing padding, which EVP_DecodeBlock does not,
 * so the text is normalised first.
 */
#include "internal.h"

#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

/* The common case — standard alphabet, padded — decodes straight from the text. */
static int decode_padded(const char *text, size_t n, unsigned char **out, size_t *len)
{
    if (n == 0 || n % 4 != 0 || n > (size_t)INT32_MAX)
        return -1;
    size_t pad = text[n - 1] == '=' ? (text[n - 2] == '=' ? 2 : 1) : 0;
    unsigned char *buf = malloc(n / 4 * 3 + 1);
    if (!buf)
        return -1;
    int got = EVP_DecodeBlock(buf, (const unsigned char *)text, (int)n);
    if (got < 0 || (size_t)got < pad) {
        free(buf);
        return -1;
    }
    buf[got - pad] = '\0';
    *out = buf;
    *len = (size_t)got - pad;
    return 0;
}

int plm_base64_decode(const char *text, size_t n, unsigned char **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    /* EVP_DecodeBlock skips surrounding white space, which base64 in JSON never has. */
    if (n > 0 && text[0] != ' ' && text[n - 1] != ' ' && memchr(text, '-', n) == NULL &&
        memchr(text, '_', n) == NULL && decode_padded(text, n, out, len) == 0)
        return 0;
    while (n > 0 && text[n - 1] == '=')
        n--;
    if (n % 4 == 1)
        return -1;
    size_t padded = (n + 3) / 4 * 4;
    char *norm = malloc(padded + 1);
    unsigned char *buf = malloc(padded / 4 * 3 + 1);
    if (!norm || !buf) {
        free(norm);
        free(buf);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        char c = text[i];
        if (c == '-') c = '+';
        else if (c == '_') c = '/';
        else if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                   c == '+' || c == '/')) {
            free(norm);
            free(buf);
            return -1;
        }
        norm[i] = c;
    }
    for (size_t i = n; i < padded; i++)
        norm[i] = '=';
    norm[padded] = '\0';
    int got = padded ? EVP_DecodeBlock(buf, (const unsigned char *)norm, (int)padded) : 0;
    free(norm);
    if (got < 0) {
        free(buf);
        return -1;
    }
    /* EVP_DecodeBlock counts the zero bytes that padding stands for; drop them. */
    size_t real = (size_t)got - (padded - n);
    buf[real] = '\0';
    *out = buf;
    *len = real;
    return 0;
}

char *plm_base64_encode(const unsigned char *data, size_t len, bool padded)
{
    char *out = malloc(4 * ((len + 2) / 3) + 1);
    if (!out)
        return NULL;
    int n = EVP_EncodeBlock((unsigned char *)out, data, (int)len);
    if (!padded) {
        while (n > 0 && out[n - 1] == '=')
            out[--n] = '\0';
    }
    return out;
}

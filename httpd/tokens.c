/*
 * tokens.c — callers' bearer tokens (tokens.h).
 */
#include "tokens.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_TOKEN_FILE_BYTES (1u << 20)

static char *message(const char *fmt, const char *path, const char *what)
{
    size_t n = strlen(fmt) + strlen(path) + strlen(what) + 1;
    char *m = malloc(n);
    if (m)
        snprintf(m, n, fmt, path, what);
    return m;
}

static void trim(const char **start, const char **end)
{
    while (*start < *end && strchr(" \t\r", **start))
        (*start)++;
    while (*end > *start && strchr(" \t\r", (*end)[-1]))
        (*end)--;
}

int httpd_tokens_read(const char *path, httpd_token_hash **out, char **why)
{
    *out = NULL;
    *why = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        *why = message("cannot read the token file %s: %s", path, strerror(errno));
        return -1;
    }
    char *buf = malloc(MAX_TOKEN_FILE_BYTES + 1);
    size_t len = buf ? fread(buf, 1, MAX_TOKEN_FILE_BYTES + 1, f) : 0;
    bool failed = !buf || ferror(f) != 0;
    fclose(f);
    if (failed || len > MAX_TOKEN_FILE_BYTES) {
        *why = message("cannot read the token file %s: %s", path,
                       !buf ? "out of memory" : failed ? "read error" : "larger than 1 MiB");
        if (buf)
            OPENSSL_cleanse(buf, len);
        free(buf);
        return -1;
    }
    size_t n = 0, cap = 0;
    httpd_token_hash *v = NULL;
    for (const char *line = buf; line < buf + len;) {
        const char *nl = memchr(line, '\n', (size_t)(buf + len - line));
        const char *end = nl ? nl : buf + len;
        const char *next = nl ? nl + 1 : buf + len;
        trim(&line, &end);
        if (line < end && *line != '#') {
            if (n == cap) {
                cap = cap ? 2 * cap : 4;
                httpd_token_hash *w = realloc(v, cap * sizeof *v);
                if (!w) {
                    httpd_tokens_free(v, n);
                    OPENSSL_cleanse(buf, len);
                    free(buf);
                    *why = message("cannot read the token file %s: %s", path, "out of memory");
                    return -1;
                }
                v = w;
            }
            SHA256((const unsigned char *)line, (size_t)(end - line), v[n++]);
        }
        line = next;
    }
    OPENSSL_cleanse(buf, len); /* the plaintext tokens do not outlive reading them */
    free(buf);
    *out = v;
    return (int)n;
}

void httpd_tokens_free(httpd_token_hash *v, size_t n)
{
    if (v)
        OPENSSL_cleanse(v, n * sizeof *v);
    free(v);
}

bool httpd_bearer_hash(const char *authorization, httpd_token_hash out)
{
    if (!authorization || strncasecmp(authorization, "Bearer ", 7) != 0)
        return false;
    const char *token = authorization + 7, *end;
    end = token + strlen(token);
    trim(&token, &end);
    if (token == end)
        return false;
    SHA256((const unsigned char *)token, (size_t)(end - token), out);
    return true;
}

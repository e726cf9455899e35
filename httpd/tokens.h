/*
 * tokens.h — callers' bearer tokens, as sandboxd and `berth serve` both take them: a
 * token file (one token a line) and the token of an Authorization header, each kept
 * only as its SHA-256, so a server compares fixed-size hashes in constant time
 * (CRYPTO_memcmp) and holds no plaintext token past reading it.
 */
#ifndef HTTPD_TOKENS_H
#define HTTPD_TOKENS_H

#include <stdbool.h>
#include <stddef.h>

typedef unsigned char httpd_token_hash[32];

/* Reads a token file (at most 1 MiB): one token a line, spaces and tabs around it
 * trimmed, blank lines and lines starting with '#' skipped.  Returns how many tokens
 * (0 or more) with their hashes in *out (malloc'd; free with httpd_tokens_free), or -1
 * with a malloc'd message naming the file in *why.  The plaintext read is wiped. */
int httpd_tokens_read(const char *path, httpd_token_hash **out, char **why);
/* Wipes and frees what httpd_tokens_read gave (NULL is fine). */
void httpd_tokens_free(httpd_token_hash *v, size_t n);

/* The hash of the token of an Authorization header's value "Bearer <token>" (the
 * scheme in any case, spaces and tabs around the token ignored): false when the value
 * is NULL, names another scheme, or holds no token.  Wipe `out` after use. */
bool httpd_bearer_hash(const char *authorization, httpd_token_hash out);

#endif

/*
 * util.h — small helpers shared by sandboxd's files: allocation, strings, time,
 * randomness, hex and base64.
 *
 * Allocation failure aborts with a message: the daemon cannot answer anything
 * meaningful without memory, and checking every strdup would bury the logic.
 */
#ifndef SBX_UTIL_H
#define SBX_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SBX_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Says so on stderr and aborts (for allocations made elsewhere, plm_idmap_put's). */
void sbx_out_of_memory(void) __attribute__((noreturn));
void *sbx_xmalloc(size_t n);
void *sbx_xcalloc(size_t n, size_t size);
void *sbx_xrealloc(void *p, size_t n);
char *sbx_xstrdup(const char *s);                 /* NULL stays NULL */
char *sbx_xstrndup(const char *s, size_t n);
char *sbx_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Wall clock in Unix milliseconds (records carry these). */
int64_t sbx_now_ms(void);

/* n (<= 64) random bytes from OpenSSL's generator (lib/random.h: drawn a kilobyte at a
 * time) as 2n lowercase hex digits (plm_hex_encode: lowercase hex of bytes is
 * libplimsoll's); false when the generator fails. */
bool sbx_random_hex(size_t n, char *out);

/* Standard base64 of bytes (malloc'd); `padded` false drops the '=' (error details). */
char *sbx_base64(const unsigned char *data, size_t len, bool padded);

/* Whether s (length len) is 1..max characters, each a letter, a digit or in `extra`. */
bool sbx_charset_ok(const char *s, size_t len, size_t max, const char *extra);

#endif

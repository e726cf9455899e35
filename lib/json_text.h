/*
 * json_text.h — JSON text in and out of jansson values, at memory speed: the one
 * reader and writer of the plimsoll wire, for the client (lib/client.c) and sandboxd
 * (sandboxd/server/http.c).  Internal: not part of plimsoll.h, not installed;
 * exported from libplimsoll like idmap.h, so the project has one.
 *
 * Why not jansson's own: json_loadb and json_dumps take a character at a time.  On a
 * cell with 32 KiB of code they cost the client 600 µs and 255 µs of a call that now
 * costs under 300 µs in all (docs/wire.md §4).  jansson stays the values: only the
 * text is done here.
 *
 * The reader (json_read.cc) is simdjson.  It accepts exactly what json_loadb with
 * JSON_ALLOW_NUL | JSON_DECODE_ANY accepts, and gives equal values of the same types,
 * except that it refuses every text with a raw U+0000 byte (jansson takes one after a
 * number or a literal; that is not JSON).  The writer (json_write.c) gives the bytes
 * json_dumps(JSON_COMPACT | JSON_ENCODE_ANY) gives, for values whose strings are
 * well-formed UTF-8 (as json_string makes them; it does not check them again).
 * tests/test_json_read.c and tests/fuzz/fuzz_json.c hold both to jansson.
 *
 * Threads: a reader is used by one thread at a time; the writer has no state.
 * Errors: NULL, for text that is not JSON, for nesting past 2048 levels, and for
 * memory that ran out; nothing is printed.
 */
#ifndef PLIMSOLL_JSON_TEXT_H
#define PLIMSOLL_JSON_TEXT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Readable bytes a text must have after its end (of any content): the reader loads
 * 64 bytes at a time and never copies the text to pad it. */
#define PLM_JSON_PADDING 64
/* A key twice in one object refuses the text (json_loadb's JSON_REJECT_DUPLICATES);
 * without it the later value stands. */
#define PLM_JSON_REJECT_DUPLICATES 1

/* A reader keeps its parser's buffers between texts, up to 4 MiB of text (what a
 * text touched stays resident: about its size); a larger one is read with buffers of
 * its own, freed after. */
typedef struct plm_json_reader plm_json_reader;
plm_json_reader *plm_json_reader_new(void);   /* NULL: out of memory */
void plm_json_reader_free(plm_json_reader *r);
/* The value `text` holds (len bytes, then PLM_JSON_PADDING readable bytes), a new
 * reference; or NULL. */
json_t *plm_json_read(plm_json_reader *r, const char *text, size_t len, int flags);

/* A malloc'd NUL-terminated text, its length in *len when len is not NULL; or NULL. */
char *plm_json_write(const json_t *v, size_t *len);

/* The writer's pieces, for a caller that walks values of its own (Lua tables:
 * runtime/core/jsonlua.c) and must give the bytes plm_json_write gives for the same
 * values.  The text grows with realloc in `p` (not NUL-terminated; the caller frees
 * it); once memory ran out `failed` is set and every put does nothing. */
typedef struct plm_json_out {
    char *p;
    size_t len, cap;
    bool failed;
} plm_json_out;
void plm_json_put_raw(plm_json_out *o, const char *s, size_t n);
/* A string as a JSON string; s must be well-formed UTF-8 (copied, not checked). */
void plm_json_put_string(plm_json_out *o, const char *s, size_t n);
void plm_json_put_integer(plm_json_out *o, json_int_t i);
/* A real as json_dumps writes a json_real (17 significant digits); x must be finite,
 * as json_real requires. */
void plm_json_put_real(plm_json_out *o, double x);

/* Bytes as proto3 JSON writes them (base64.c): the standard alphabet, malloc'd and
 * NUL-terminated; `padded` false drops the '=' (Connect error details).  NULL when
 * memory ran out. */
char *plm_base64_encode(const unsigned char *data, size_t len, bool padded);

/* An integer as decimal text, as printf's %" PRIu64 "/%" PRId64 " writes it (decimal.c):
 * into out (PLM_INT_TEXT bytes: 20 digits, a sign and the NUL), NUL-terminated; returns
 * its length.  For the writer and the digests' canonical form, which write integers on
 * every call: snprintf costs ten times as much. */
#define PLM_INT_TEXT 22
size_t plm_u64_text(char *out, uint64_t v);
size_t plm_i64_text(char *out, int64_t v);
/* A real as printf's "%.17g" writes it in the C locale, byte for byte, when
 * 1e-4 <= |x| < 1e15 (fixed notation there): into out (PLM_REAL_TEXT bytes),
 * NUL-terminated; returns its length, or 0 for any other x (NaN, infinities, zeros,
 * tiny and huge ones), which the caller gives to snprintf.  snprintf takes a
 * multi-precision path for every real (about 3 900 instructions); this is exact
 * integer arithmetic on 128 bits.  tests/test_json_read.c holds the two to the same
 * bytes. */
#define PLM_REAL_TEXT 40
size_t plm_real17_text(char *out, double x);

#ifdef __cplusplus
}
#endif

#endif

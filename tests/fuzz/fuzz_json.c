/*
 * fuzz_json.c — the client's JSON reader and writer against jansson's, on arbitrary
 * bytes: lib/json_read.cc must refuse what json_loadb(JSON_ALLOW_NUL |
 * JSON_DECODE_ANY) refuses (and any text with a raw U+0000 byte, some of which jansson
 * takes) and read the rest to equal values of the same types, and
 * lib/json_write.c must write those values as json_dumps(JSON_COMPACT |
 * JSON_ENCODE_ANY) does.  A difference aborts (tests/test_json_read.c names cases).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* json_equal takes 1 and 1.0 for equal; the reader must give the same types too. */
static int same_types(const json_t *a, const json_t *b)
{
    if (json_typeof(a) != json_typeof(b))
        return 0;
    if (json_is_array(a)) {
        for (size_t i = 0; i < json_array_size(a); i++) {
            if (!same_types(json_array_get(a, i), json_array_get(b, i)))
                return 0;
        }
    } else if (json_is_object(a)) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)a, k, v) {
            if (!same_types(v, json_object_get(b, k)))
                return 0;
        }
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static plm_json_reader *reader;
    if (!reader)
        reader = plm_json_reader_new();
    char *padded = malloc(size + 1 + PLM_JSON_PADDING);
    if (!padded)
        return 0;
    memcpy(padded, data, size);
    memset(padded + size, 0, 1 + PLM_JSON_PADDING);
    json_t *want = json_loadb((const char *)data, size, JSON_ALLOW_NUL | JSON_DECODE_ANY, NULL);
    json_t *got = plm_json_read(reader, padded, size, 0);
    free(padded);
    /* A raw U+0000 byte is never JSON; jansson takes one right after a number or a
     * literal ("[1\0]"), the reader takes none (lib/json_read.cc). */
    if (memchr(data, 0, size)) {
        if (got)
            abort();
        json_decref(want);
        return 0;
    }
    if (!want != !got || (want && (!json_equal(want, got) || !same_types(want, got))))
        abort();
    if (want) {
        char *a = json_dumps(want, JSON_COMPACT | JSON_ENCODE_ANY);
        char *b = plm_json_write(want, NULL);
        if (!a != !b || (a && strcmp(a, b) != 0))
            abort();
        free(a);
        free(b);
    }
    json_decref(want);
    json_decref(got);
    return 0;
}

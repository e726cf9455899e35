/*
 * json.c — typed readers for proto3 JSON (docs/wire.md §4).  Absent and null read as the
 * zero value; 64-bit integers may be strings or numbers and are never routed through
 * a double; a value of the wrong JSON type is a malformed answer.
 */
#include "internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SAFE_INT ((json_int_t)9007199254740991LL) /* 2^53 - 1 */

const json_t *plm_jget(const json_t *obj, const char *camel, const char *snake)
{
    if (!json_is_object(obj))
        return NULL;
    const json_t *v = json_object_get(obj, camel);
    if (!v && snake)
        v = json_object_get(obj, snake);
    return v;
}

static int bad(plm_error **err, const char *what, const char *why)
{
    char *m = plm_printf("%s %s", what, why);
    *err = plm_err_malformed(m ? m : what);
    free(m);
    return -1;
}

int plm_jstring(const json_t *v, const char *what, const char **out, plm_error **err)
{
    if (!v || json_is_null(v)) {
        *out = "";
        return 0;
    }
    if (!json_is_string(v))
        return bad(err, what, "is not a string");
    *out = json_string_value(v);
    return 0;
}

int plm_jbool(const json_t *v, const char *what, bool *out, plm_error **err)
{
    if (!v || json_is_null(v)) {
        *out = false;
        return 0;
    }
    if (!json_is_boolean(v))
        return bad(err, what, "is not a boolean");
    *out = json_is_true(v);
    return 0;
}

/* Decimal text of at most 20 digits with an optional minus sign. */
static bool decimal_text(const char *s)
{
    if (*s == '-')
        s++;
    size_t n = strlen(s);
    if (n == 0 || n > 20)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
    }
    return true;
}

static int parse_signed(const json_t *v, int64_t *out, bool safe_only)
{
    if (json_is_integer(v)) {
        json_int_t n = json_integer_value(v);
        if (safe_only && (n > SAFE_INT || n < -SAFE_INT))
            return -1;
        *out = n;
        return 0;
    }
    if (json_is_string(v) && decimal_text(json_string_value(v))) {
        errno = 0;
        char *end;
        long long n = strtoll(json_string_value(v), &end, 10);
        if (errno || *end)
            return -1;
        *out = n;
        return 0;
    }
    return -1;
}

static int parse_unsigned(const json_t *v, uint64_t *out, bool safe_only)
{
    if (json_is_integer(v)) {
        json_int_t n = json_integer_value(v);
        if (n < 0 || (safe_only && n > SAFE_INT))
            return -1;
        *out = (uint64_t)n;
        return 0;
    }
    if (json_is_string(v) && decimal_text(json_string_value(v)) && json_string_value(v)[0] != '-') {
        errno = 0;
        char *end;
        unsigned long long n = strtoull(json_string_value(v), &end, 10);
        if (errno || *end)
            return -1;
        *out = n;
        return 0;
    }
    return -1;
}

int plm_jint64(const json_t *v, const char *what, int64_t *out, plm_error **err)
{
    *out = 0;
    if (!v || json_is_null(v))
        return 0;
    if (parse_signed(v, out, false) < 0)
        return bad(err, what, "is not an integer");
    return 0;
}

int plm_juint64(const json_t *v, const char *what, uint64_t *out, plm_error **err)
{
    *out = 0;
    if (!v || json_is_null(v))
        return 0;
    if (parse_unsigned(v, out, false) < 0)
        return bad(err, what, "is not an unsigned integer");
    return 0;
}

int plm_jint32(const json_t *v, const char *what, int32_t *out, plm_error **err)
{
    int64_t n;
    *out = 0;
    if (!v || json_is_null(v))
        return 0;
    if (parse_signed(v, &n, false) < 0 || n < INT32_MIN || n > INT32_MAX)
        return bad(err, what, "is not a 32-bit integer");
    *out = (int32_t)n;
    return 0;
}

int plm_juint32(const json_t *v, const char *what, uint32_t *out, plm_error **err)
{
    uint64_t n;
    *out = 0;
    if (!v || json_is_null(v))
        return 0;
    if (parse_unsigned(v, &n, false) < 0 || n > UINT32_MAX)
        return bad(err, what, "is not a 32-bit unsigned integer");
    *out = (uint32_t)n;
    return 0;
}

int plm_jdouble(const json_t *v, const char *what, double *out, plm_error **err)
{
    *out = 0;
    if (!v || json_is_null(v))
        return 0;
    if (json_is_number(v)) {
        *out = json_number_value(v);
        return 0;
    }
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (strcmp(s, "NaN") == 0) { *out = NAN; return 0; }
        if (strcmp(s, "Infinity") == 0) { *out = INFINITY; return 0; }
        if (strcmp(s, "-Infinity") == 0) { *out = -INFINITY; return 0; }
        char *end;
        errno = 0;
        double d = strtod(s, &end);
        if (*s && !*end && !errno) {
            *out = d;
            return 0;
        }
    }
    return bad(err, what, "is not a number");
}

int plm_jbytes(const json_t *v, const char *what, plm_bytes *out, plm_error **err)
{
    out->data = NULL;
    out->len = 0;
    if (!v || json_is_null(v)) {
        out->data = calloc(1, 1);
        return out->data ? 0 : bad(err, what, "could not be allocated");
    }
    if (!json_is_string(v))
        return bad(err, what, "is not base64 text");
    if (plm_base64_decode(json_string_value(v), json_string_length(v), &out->data, &out->len) < 0)
        return bad(err, what, "is not base64 text");
    return 0;
}

int plm_jarray(const json_t *v, const char *what, const json_t **arr, size_t *n, plm_error **err)
{
    *arr = NULL;
    *n = 0;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_array(v))
        return bad(err, what, "is not a list");
    *arr = v;
    *n = json_array_size(v);
    return 0;
}

int plm_jrecord_int(const json_t *v, const char *field, bool is_signed, int64_t *s, uint64_t *u,
                    plm_error **err)
{
    if (s) *s = 0;
    if (u) *u = 0;
    if (!v || json_is_null(v))
        return 0;
    int rc = is_signed ? parse_signed(v, s, true) : parse_unsigned(v, u, true);
    if (rc < 0) {
        *err = plm_err_new(PLM_DATA_LOSS, PLM_REFUSAL_NONE,
                           "plimsoll: the record's %s is not an integer", field);
        return -1;
    }
    return 0;
}

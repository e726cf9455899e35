/*
 * details.c — Connect error details, decoded by hand from base64 protobuf
 * (docs/wire.md §6.2): NotDispatched, SessionEnded and UnansweredCall.  A detail that does
 * not decode states nothing; in particular it never says that nothing ran.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct pb {
    const unsigned char *p, *end;
} pb;

static int varint(pb *b, uint64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (b->p >= b->end)
            return -1;
        unsigned char c = *b->p++;
        v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* One field: its number, wire type, and either the varint or the byte span. */
typedef struct pb_field {
    uint32_t num;
    int type;
    uint64_t v;
    const unsigned char *data;
    size_t len;
} pb_field;

/* Returns 1 for a field, 0 at the end, -1 when malformed.  Skips fixed32/fixed64. */
static int next_field(pb *b, pb_field *f)
{
    for (;;) {
        if (b->p == b->end)
            return 0;
        uint64_t key;
        if (varint(b, &key) < 0 || (key >> 3) == 0 || (key >> 3) > UINT32_MAX)
            return -1;
        f->num = (uint32_t)(key >> 3);
        f->type = (int)(key & 7);
        switch (f->type) {
        case 0:
            if (varint(b, &f->v) < 0)
                return -1;
            return 1;
        case 2:
            if (varint(b, &f->v) < 0 || f->v > (uint64_t)(b->end - b->p))
                return -1;
            f->data = b->p;
            f->len = (size_t)f->v;
            b->p += f->len;
            return 1;
        case 1:
            if (b->end - b->p < 8)
                return -1;
            b->p += 8;
            continue;
        case 5:
            if (b->end - b->p < 4)
                return -1;
            b->p += 4;
            continue;
        default:
            return -1;
        }
    }
}

static char *pb_string(const pb_field *f)
{
    if (f->type != 2 || !plm_utf8_valid((const char *)f->data, f->len))
        return NULL;
    char *s = malloc(f->len + 1);
    if (s) {
        memcpy(s, f->data, f->len);
        s[f->len] = '\0';
    }
    return s;
}

/* NotDispatched and SessionEnded share a layout: 1 reason, 2 detail. */
static int decode_reason(const unsigned char *d, size_t n, uint64_t *reason, char **detail)
{
    pb b = {d, d + n};
    pb_field f;
    int rc;
    *reason = 0;
    while ((rc = next_field(&b, &f)) == 1) {
        if (f.num == 1 && f.type == 0) {
            *reason = f.v;
        } else if (f.num == 2 && detail) {
            char *s = pb_string(&f);
            if (!s)
                return -1;
            free(*detail);
            *detail = s;
        }
    }
    return rc;
}

static plm_record *decode_record(const unsigned char *d, size_t n)
{
    plm_record *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    pb b = {d, d + n};
    pb_field f;
    int rc;
    char **strs[17] = {0};
    strs[2] = &r->request_sha256; strs[3] = &r->result_sha256; strs[4] = &r->provider;
    strs[5] = &r->isolation; strs[6] = &r->environment; strs[7] = &r->policy;
    strs[10] = &r->session; strs[12] = &r->previous_sha256; strs[13] = &r->record_sha256;
    strs[14] = &r->software_identity; strs[15] = &r->software_rule_id; strs[16] = &r->unanswered;
    while ((rc = next_field(&b, &f)) == 1) {
        if (f.num <= 16 && strs[f.num]) {
            char *s = pb_string(&f);
            if (!s)
                goto fail;
            free(*strs[f.num]);
            *strs[f.num] = s;
        } else if (f.type == 0) {
            switch (f.num) {
            case 1:
                if (f.v > UINT32_MAX)
                    goto fail;
                r->version = (uint32_t)f.v;
                break;
            case 8: r->started_unix_ms = (int64_t)f.v; break; /* two's complement */
            case 9: r->ended_unix_ms = (int64_t)f.v; break;
            case 11: r->sequence = f.v; break;
            default: break;
            }
        }
    }
    if (rc < 0)
        goto fail;
    for (int i = 0; i <= 16; i++) {
        if (strs[i] && !*strs[i] && !(*strs[i] = strdup("")))
            goto fail;
    }
    return r;
fail:
    plm_record_free(r);
    return NULL;
}

static plm_record *decode_unanswered(const unsigned char *d, size_t n)
{
    pb b = {d, d + n};
    pb_field f;
    int rc;
    plm_record *rec = NULL;
    while ((rc = next_field(&b, &f)) == 1) {
        if (f.num == 1 && f.type == 2) {
            plm_record_free(rec);
            rec = decode_record(f.data, f.len);
            if (!rec)
                return NULL;
        }
    }
    if (rc < 0) {
        plm_record_free(rec);
        return NULL;
    }
    return rec;
}

static plm_refusal refusal_of(uint64_t n)
{
    return n >= 1 && n <= 7 ? (plm_refusal)n : PLM_REFUSAL_UNKNOWN;
}

void plm_details_parse(const json_t *details, plm_details *out)
{
    memset(out, 0, sizeof *out);
    out->reason = PLM_REFUSAL_NONE;
    out->end = PLM_END_OPEN;
    if (!json_is_array(details))
        return;
    size_t i;
    const json_t *d;
    json_array_foreach(details, i, d) {
        const char *type = json_string_value(json_object_get(d, "type"));
        const char *value = json_string_value(json_object_get(d, "value"));
        if (!type || !value)
            continue;
        const char *slash = strrchr(type, '/');
        if (slash)
            type = slash + 1;
        unsigned char *bytes;
        size_t n;
        if (plm_base64_decode(value, strlen(value), &bytes, &n) < 0)
            continue;
        uint64_t reason;
        char *detail = NULL;
        if (strcmp(type, "plimsoll.v1.NotDispatched") == 0) {
            if (decode_reason(bytes, n, &reason, &detail) == 0) {
                out->has_not_dispatched = true;
                out->reason = refusal_of(reason);
            }
        } else if (strcmp(type, "plimsoll.v1.SessionEnded") == 0) {
            if (decode_reason(bytes, n, &reason, &detail) == 0) {
                out->has_session_ended = true;
                /* The detail itself says the session ended: "open" reads as unknown. */
                out->end = reason >= 1 && reason <= 10 ? (plm_session_end)reason : PLM_END_UNKNOWN;
                free(out->end_detail);
                out->end_detail = detail;
                detail = NULL;
            }
        } else if (strcmp(type, "plimsoll.v1.UnansweredCall") == 0) {
            plm_record *r = decode_unanswered(bytes, n);
            if (r) {
                plm_record_free(out->unanswered);
                out->unanswered = r;
            }
        }
        free(detail);
        free(bytes);
    }
}

void plm_details_clear(plm_details *d)
{
    free(d->end_detail);
    plm_record_free(d->unanswered);
    memset(d, 0, sizeof *d);
}

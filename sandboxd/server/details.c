/*
 * details.c — a minimal protobuf encoder for NotDispatched, SessionEnded and
 * UnansweredCall.  Only varints and length-delimited fields are needed, and proto3
 * omits every field at its zero value, so a zero is never written.
 */
#include "details.h"

#include "util.h"

#include <stdlib.h>
#include <string.h>

typedef struct pb {
    unsigned char *buf;
    size_t len, cap;
} pb;

static void pb_put(pb *b, const void *data, size_t n)
{
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 16;
        b->buf = sbx_xrealloc(b->buf, b->cap);
    }
    memcpy(b->buf + b->len, data, n);
    b->len += n;
}

static void pb_varint(pb *b, uint64_t v)
{
    unsigned char tmp[10];
    size_t n = 0;
    do {
        tmp[n] = (unsigned char)(v & 0x7f);
        v >>= 7;
        if (v)
            tmp[n] |= 0x80;
        n++;
    } while (v);
    pb_put(b, tmp, n);
}

/* Wire type 0.  Negative int64 values go out as their 64-bit two's complement (10
 * bytes), as protobuf requires. */
static void pb_field_varint(pb *b, unsigned field, uint64_t v)
{
    if (v == 0)
        return;
    pb_varint(b, (uint64_t)field << 3);
    pb_varint(b, v);
}

/* Wire type 2. */
static void pb_field_bytes(pb *b, unsigned field, const void *data, size_t n)
{
    if (n == 0)
        return;
    pb_varint(b, ((uint64_t)field << 3) | 2);
    pb_varint(b, n);
    pb_put(b, data, n);
}

static void pb_field_string(pb *b, unsigned field, const char *s)
{
    if (s)
        pb_field_bytes(b, field, s, strlen(s));
}

static char *pb_finish(pb *b)
{
    char *out = sbx_base64(b->buf ? b->buf : (const unsigned char *)"", b->len, false);
    free(b->buf);
    return out;
}

char *sbx_detail_not_dispatched(plm_refusal reason)
{
    pb b = {0};
    pb_field_varint(&b, 1, (uint64_t)(reason < 0 ? 0 : reason));
    return pb_finish(&b);
}

char *sbx_detail_session_ended(plm_session_end end, const char *detail)
{
    pb b = {0};
    pb_field_varint(&b, 1, (uint64_t)end);
    pb_field_string(&b, 2, detail);
    return pb_finish(&b);
}

/* RunRecord, numbered as in docs/wire.md §5.3. */
static void pb_record(pb *b, const plm_record *r)
{
    pb_field_varint(b, 1, r->version);
    pb_field_string(b, 2, r->request_sha256);
    pb_field_string(b, 3, r->result_sha256);
    pb_field_string(b, 4, r->provider);
    pb_field_string(b, 5, r->isolation);
    pb_field_string(b, 6, r->environment);
    pb_field_string(b, 7, r->policy);
    pb_field_varint(b, 8, (uint64_t)r->started_unix_ms);
    pb_field_varint(b, 9, (uint64_t)r->ended_unix_ms);
    pb_field_string(b, 10, r->session);
    pb_field_varint(b, 11, r->sequence);
    pb_field_string(b, 12, r->previous_sha256);
    pb_field_string(b, 13, r->record_sha256);
    pb_field_string(b, 14, r->software_identity);
    pb_field_string(b, 15, r->software_rule_id);
    pb_field_string(b, 16, r->unanswered);
}

char *sbx_detail_unanswered(const plm_record *rec)
{
    pb inner = {0}, outer = {0};
    pb_record(&inner, rec);
    /* An all-zero record still travels as a present (empty) field 1. */
    pb_varint(&outer, (1u << 3) | 2);
    pb_varint(&outer, inner.len);
    if (inner.len)
        pb_put(&outer, inner.buf, inner.len);
    free(inner.buf);
    return pb_finish(&outer);
}

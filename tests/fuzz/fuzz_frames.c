/*
 * fuzz_frames.c — the framing of sandboxd's links (sandboxd/inside/frames.c, sup_proto.h):
 * what a kernel writes on its reply FIFO (box.c: read_replies, on_reply), what the
 * supervisor sends the daemon (box.c: on_from) and what the daemon sends the
 * supervisor (supervisor.c: on_daemon_input, write_files).  Code in the sandbox writes
 * the first two, so any bytes may come.
 *
 * The input is a byte stream, read as each of the three links.  Checked:
 *   - nothing crashes or reads out of bounds;
 *   - the frames do not depend on how the stream was cut: a whole read and reads of
 *     1..64 bytes (chosen from a hash of the input) through a buffer kept the way
 *     box.c keeps it give the same frames and the same verdict;
 *   - each frame is its length and its bytes, in order (the frames rebuild the input);
 *   - a kernel reply is ready or done only in its exact shape, pointing into the body;
 *   - every file of a SUP_FILES payload lies inside the payload;
 *   - the end of a cell on a kernel's stream (sup_endmark): the bytes before the first
 *     end mark are kept, the reply frame right after it (on stderr) is found whole, and
 *     both come out the same read whole and in pieces of 1..64 bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../sandboxd/inside/frames.h"

typedef struct chan {
    uint32_t min, max;
    size_t buf_cap;                /* 0: grows as box.c's rq; else fixed, as a lane's rep */
} chan;

static uint64_t next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static uint64_t hash(const uint8_t *data, size_t size)
{
    uint64_t h = 1469598103934665603u;
    for (size_t i = 0; i < size; i++)
        h = (h ^ data[i]) * 1099511628211u;
    return h | 1;
}

static void check_reply(const unsigned char *body, size_t len)
{
    sup_reply r;
    sup_reply_parse(body, len, &r);
    switch (r.kind) {
    case SUP_REPLY_READY:
        if (len != 1 + SUP_TOKEN_LEN || body[0] != 'R' || r.token != body + 1 || r.nonce)
            abort();
        break;
    case SUP_REPLY_DONE:
        if (len != 3 + SUP_NONCE_LEN || body[0] != 'D' || r.nonce != body + 2 || r.token ||
            r.raised != (body[1] == '1') || r.spawned != (body[2 + SUP_NONCE_LEN] != '0'))
            abort();
        break;
    case SUP_REPLY_BAD:
        if (r.token || r.nonce)
            abort();
        break;
    default:
        abort();
    }
}

static void check_files(const unsigned char *pl, size_t len)
{
    sup_files fs;
    if (!sup_files_begin(&fs, pl, len))
        return;
    uint32_t n = fs.left;
    sup_file f;
    int got;
    uint32_t taken = 0;
    while ((got = sup_files_next(&fs, &f)) > 0) {
        if (f.path < pl || f.path + f.path_len > pl + len || f.content < f.path + f.path_len ||
            f.content + f.content_len > pl + len)
            abort();
        taken++;
    }
    if ((got == 0) != (taken == n) || taken > n)
        abort();
}

/* All frames of a whole buffer: their rebuilt bytes in *out; the verdict at the end. */
static sup_split split_whole(const chan *l, const uint8_t *data, size_t size, bool down,
                             unsigned char *out, size_t *out_len)
{
    size_t at = 0;
    sup_frame f;
    sup_split got;
    *out_len = 0;
    while ((got = sup_frame_split(data + at, size - at, l->min, l->max, &f)) ==
           SUP_SPLIT_FRAME) {
        if (f.body != data + at + 4 || f.used != 4 + f.body_len || f.used > size - at ||
            f.body_len < l->min || f.body_len > l->max)
            abort();
        sup_put32(out + *out_len, (uint32_t)f.body_len);
        memcpy(out + *out_len + 4, f.body, f.body_len);
        *out_len += f.used;
        if (l->buf_cap)
            check_reply(f.body, f.body_len);
        else if (down && f.body[0] == SUP_FILES)
            check_files(f.body + 2, f.body_len - 2);
        at += f.used;
    }
    if (memcmp(out, data, *out_len) != 0)
        abort();
    return got;
}

/* The same stream read in pieces, through a buffer kept as box.c keeps its own. */
static sup_split split_pieces(const chan *l, const uint8_t *data, size_t size, uint64_t seed,
                              unsigned char *out, size_t *out_len)
{
    size_t cap = l->buf_cap ? l->buf_cap : size + 1;
    unsigned char *buf = malloc(cap);
    size_t len = 0, in = 0;
    sup_split got = SUP_SPLIT_MORE;
    *out_len = 0;
    while (in < size && got != SUP_SPLIT_BAD) {
        size_t n = 1 + next(&seed) % 64;
        if (n > size - in)
            n = size - in;
        if (n > cap - len)
            n = cap - len;     /* a lane's buffer never takes more than it holds */
        if (n == 0)
            abort();           /* a full buffer always holds a whole frame or a bad one */
        memcpy(buf + len, data + in, n);
        len += n;
        in += n;
        size_t at = 0;
        sup_frame f;
        while ((got = sup_frame_split(buf + at, len - at, l->min, l->max, &f)) ==
               SUP_SPLIT_FRAME) {
            sup_put32(out + *out_len, (uint32_t)f.body_len);
            memcpy(out + *out_len + 4, f.body, f.body_len);
            *out_len += f.used;
            at += f.used;
        }
        memmove(buf, buf + at, len - at);
        len -= at;
    }
    free(buf);
    return got;
}

typedef struct sink {
    unsigned char *p;
    size_t len;
} sink;

static void keep_into(void *ud, const unsigned char *p, size_t n)
{
    sink *k = ud;
    memcpy(k->p + k->len, p, n);
    k->len += n;
}

/* The stream read by an endmark in one chunk or in pieces: what it kept in k, whether a
 * reply came (and how many times it said so: at most once). */
static int take_endmark(sup_endmark *e, const uint8_t *data, size_t size, uint64_t seed,
                        bool pieces, sink *k)
{
    int said = 0;
    for (size_t in = 0; in < size || (in == 0 && size == 0);) {
        size_t n = pieces ? 1 + next(&seed) % 64 : size;
        if (n > size - in)
            n = size - in;
        said += sup_endmark_take(e, data + in, n, keep_into, k);
        in += n;
        if (n == 0)
            break;
    }
    return said;
}

static void check_endmark(const uint8_t *data, size_t size, uint64_t seed)
{
    static const unsigned char nonce[SUP_NONCE_LEN + 1] = "0123456789abcdef0123456789abcdef";
    unsigned char mark[SUP_END_MARK_LEN];
    mark[0] = 0x1f;
    memcpy(mark + 1, nonce, SUP_NONCE_LEN);
    mark[SUP_END_MARK_LEN - 1] = 0x1e;
    const uint8_t *at = memmem(data, size, mark, sizeof mark);
    for (int want = 0; want < 2; want++) {
        sup_endmark w, p;
        sup_endmark_init(&w, nonce, want);
        sup_endmark_init(&p, nonce, want);
        sink kw = {malloc(size + 1), 0}, kp = {malloc(size + 1), 0};
        int sw = take_endmark(&w, data, size, seed, false, &kw);
        int sp = take_endmark(&p, data, size, seed, true, &kp);
        size_t lw = 0, lp = 0;
        const unsigned char *rw = sup_endmark_reply(&w, &lw), *rp = sup_endmark_reply(&p, &lp);
        if (sw > 1 || sp != sw || w.ended != p.ended || kw.len != kp.len ||
            memcmp(kw.p, kp.p, kw.len) != 0 || !rw != !rp || lw != lp ||
            (rw && memcmp(rw, rp, lw) != 0))
            abort();
        /* kept: everything before the first mark (less a partial mark at the end) */
        if (w.ended != (at != NULL) || (at && kw.len != (size_t)(at - data)) ||
            (!at && kw.len + w.matched != size) || memcmp(kw.p, data, kw.len) != 0)
            abort();
        /* the reply: the frame right after the mark, when its length is a reply's */
        const uint8_t *after = at ? at + sizeof mark : NULL;
        size_t left = at ? size - (size_t)(after - data) : 0;
        uint32_t len = left >= 4 ? sup_get32(after) : 0;
        bool whole = want && left >= 4 && len >= 1 && len <= SUP_KERNEL_MAX_REPLY &&
                     left - 4 >= len;
        if ((sw == 1) != whole || !rw != !whole ||
            (whole && (lw != len || memcmp(rw, after + 4, len) != 0)))
            abort();
        free(kw.p);
        free(kp.p);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const chan chans[] = {
        {1, SUP_KERNEL_MAX_REPLY, 4 + SUP_KERNEL_MAX_REPLY}, /* kernel -> daemon */
        {2, SUP_MAX_UP_FRAME, 0},                            /* supervisor -> daemon */
        {2, SUP_MAX_DOWN_FRAME, 0},                          /* daemon -> supervisor */
    };
    unsigned char *whole = malloc(size + 1), *pieces = malloc(size + 1);
    for (size_t i = 0; i < sizeof chans / sizeof chans[0]; i++) {
        size_t wl, pl;
        sup_split w = split_whole(&chans[i], data, size, i == 2, whole, &wl);
        sup_split p = split_pieces(&chans[i], data, size, hash(data, size), pieces, &pl);
        if (w != p || wl != pl ||
            memcmp(whole, pieces, wl) != 0)
            abort();
    }
    /* the payload of a files frame, as it is */
    check_files(data, size);
    check_endmark(data, size, hash(data, size));
    free(whole);
    free(pieces);
    return 0;
}

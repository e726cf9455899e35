/*
 * frames.c — decoding the frames of sup_proto.h (see frames.h).
 */
#include "frames.h"

#include <string.h>

sup_split sup_frame_split(const unsigned char *buf, size_t len, uint32_t min, uint32_t max,
                          sup_frame *f)
{
    if (len < 4)
        return SUP_SPLIT_MORE;
    uint32_t size = sup_get32(buf);
    if (size < min || size > max)
        return SUP_SPLIT_BAD;
    if (len - 4 < (size_t)size)
        return SUP_SPLIT_MORE;
    f->body = buf + 4;
    f->body_len = size;
    f->used = 4 + (size_t)size;
    return SUP_SPLIT_FRAME;
}

void sup_reply_parse(const unsigned char *body, size_t len, sup_reply *r)
{
    memset(r, 0, sizeof *r);
    if (len == 1 + SUP_TOKEN_LEN && body[0] == 'R') {
        r->kind = SUP_REPLY_READY;
        r->token = body + 1;
    } else if (len == 3 + SUP_NONCE_LEN && body[0] == 'D' && (body[1] == '0' || body[1] == '1')) {
        r->kind = SUP_REPLY_DONE;
        r->raised = body[1] == '1';
        r->nonce = body + 2;
        /* any byte but '0' counts as spawned: the safe side (the sweep then scans) */
        r->spawned = body[2 + SUP_NONCE_LEN] != '0';
    }
}

bool sup_files_begin(sup_files *fs, const unsigned char *payload, size_t len)
{
    fs->r = (sup_reader){payload, len, 1};
    fs->left = sup_read32(&fs->r);
    return fs->r.ok && fs->left <= SUP_FILES_MAX;
}

int sup_files_next(sup_files *fs, sup_file *f)
{
    if (!fs->left)
        return 0;
    f->path_len = sup_read32(&fs->r);
    f->path = sup_read_bytes(&fs->r, f->path_len);
    f->content_len = sup_read32(&fs->r);
    f->content = sup_read_bytes(&fs->r, f->content_len);
    if (!fs->r.ok)
        return -1;
    fs->left--;
    return 1;
}

void sup_endmark_init(sup_endmark *e, const unsigned char *nonce, bool want_reply)
{
    memset(e, 0, sizeof *e);
    e->mark[0] = 0x1f;
    memcpy(e->mark + 1, nonce, SUP_NONCE_LEN);
    e->mark[SUP_END_MARK_LEN - 1] = 0x1e;
    e->want_reply = want_reply;
}

/* The bytes after the mark, up to a whole reply frame: true when it just came whole. */
static bool take_reply(sup_endmark *e, const unsigned char *p, size_t n)
{
    if (!e->want_reply || e->reply_read)
        return false;
    size_t room = sizeof e->reply - e->reply_len;
    size_t take = n < room ? n : room;
    memcpy(e->reply + e->reply_len, p, take);
    e->reply_len += take;
    if (e->reply_len < 4)
        return false;
    uint32_t size = sup_get32(e->reply);
    if (size == 0 || size > SUP_KERNEL_MAX_REPLY) {
        e->reply_read = true;      /* no reply's length: none is here */
        e->reply_len = 0;
        return false;
    }
    if (e->reply_len < 4 + (size_t)size)
        return false;
    e->reply_read = true;
    return true;
}

bool sup_endmark_take(sup_endmark *e, const unsigned char *p, size_t n, sup_keep_fn keep,
                      void *ud)
{
    if (e->ended)
        return take_reply(e, p, n);
    size_t from = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == e->mark[e->matched]) {
            if (e->matched == 0 && i > from)
                keep(ud, p + from, i - from);
            from = i + 1;
            if (++e->matched == SUP_END_MARK_LEN) {
                e->ended = true;
                return take_reply(e, p + i + 1, n - i - 1);
            }
        } else if (e->matched > 0) {
            keep(ud, e->mark, e->matched); /* held back: it was not the mark */
            e->matched = 0;
            from = i;
            if (p[i] == e->mark[0]) {
                e->matched = 1;
                from = i + 1;
            }
        }
    }
    if (e->matched == 0 && n > from)
        keep(ud, p + from, n - from);
    return false;
}

const unsigned char *sup_endmark_reply(const sup_endmark *e, size_t *len)
{
    if (!e->reply_read || e->reply_len == 0)
        return NULL;               /* not whole yet, or no reply's length after the mark */
    *len = sup_get32(e->reply);
    return e->reply + 4;
}

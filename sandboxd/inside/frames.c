/*
 * frames.c — decoding the frames of sup_proto.h (see frames.h).
 */
#include "frames.h"

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

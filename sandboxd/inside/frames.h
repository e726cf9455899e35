/*
 * frames.h — the pure decoding steps of sandboxd's framed links (sup_proto.h): where a
 * frame ends in a buffer, what a kernel's reply says, the files of a SUP_FILES frame,
 * and where a cell's output ends on a kernel's stream (with the reply after it).
 * box.c and supervisor.c do the reading, the checks against their state and the acting;
 * these only look at bytes (which may come from hostile code in the sandbox), so a
 * fuzzer (tests/fuzz/fuzz_frames.c) reaches exactly the code the daemon runs.
 */
#ifndef SBX_FRAMES_H
#define SBX_FRAMES_H

#include "sup_proto.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum sup_split {
    SUP_SPLIT_MORE,                /* the frame is not all there yet */
    SUP_SPLIT_FRAME,               /* one whole frame: body, body_len, used */
    SUP_SPLIT_BAD,                 /* its length is outside [min, max]: the link is broken */
} sup_split;

typedef struct sup_frame {
    const unsigned char *body;     /* the N bytes after the length */
    size_t body_len;
    size_t used;                   /* 4 + N: where the next frame starts */
} sup_frame;

/* The frame at the start of buf[0..len): a 4-byte little-endian length N, then N bytes.
 * A bad length is known as soon as the four bytes are there, however little follows. */
sup_split sup_frame_split(const unsigned char *buf, size_t len, uint32_t min, uint32_t max,
                          sup_frame *f);

typedef enum sup_reply_kind {
    SUP_REPLY_BAD,                 /* neither shape: the kernel broke the protocol */
    SUP_REPLY_READY,               /* "R" + token */
    SUP_REPLY_DONE,                /* "D" + status + nonce + spawned */
} sup_reply_kind;

typedef struct sup_reply {
    sup_reply_kind kind;
    const unsigned char *token;    /* READY: SUP_TOKEN_LEN bytes, in the body */
    const unsigned char *nonce;    /* DONE: SUP_NONCE_LEN bytes, in the body */
    bool raised;                   /* DONE: status '1' (the cell raised), else '0' */
    bool spawned;                  /* DONE: the cell may have started a process */
} sup_reply;

/* What a kernel's reply frame body (kernels/kernel.py, kernel.js) says. */
void sup_reply_parse(const unsigned char *body, size_t len, sup_reply *r);

/* The payload of SUP_FILES, one file at a time. */
#define SUP_FILES_MAX 100000u      /* files in one frame, at most */

typedef struct sup_files {
    sup_reader r;
    uint32_t left;                 /* files not yet taken */
} sup_files;

typedef struct sup_file {
    const unsigned char *path, *content;   /* in the payload; not NUL-terminated */
    uint32_t path_len, content_len;
} sup_file;

/* false when the payload cannot be a files frame (no count, or too many files). */
bool sup_files_begin(sup_files *fs, const unsigned char *payload, size_t len);
/* 1 with the next file, 0 when all were taken, -1 when the payload ends inside one. */
int sup_files_next(sup_files *fs, sup_file *f);

/* The end of a cell on a kernel's stdout or stderr (docs/daemon.md §5.3): the end mark
 * -- 0x1f, the request's nonce, 0x1e -- found however the stream is cut into reads,
 * what came before it handed to the caller, and on stderr the end reply frame the
 * kernel writes right after the mark, in the same write.  What follows the mark (and
 * that frame) is output between cells: dropped. */
#define SUP_END_MARK_LEN (SUP_NONCE_LEN + 2)

typedef struct sup_endmark {
    unsigned char mark[SUP_END_MARK_LEN];
    size_t matched;                /* how much of the mark the stream has shown */
    bool ended;                    /* the mark came: the rest is between cells */
    bool want_reply;               /* stderr: a reply frame may follow the mark */
    bool reply_read;               /* the bytes after the mark are a whole frame, or none */
    unsigned char reply[4 + SUP_KERNEL_MAX_REPLY];
    size_t reply_len;
} sup_endmark;

void sup_endmark_init(sup_endmark *e, const unsigned char *nonce, bool want_reply);

/* The next chunk of the stream.  The cell's bytes before the mark go to keep(ud, p, n),
 * in order and maybe in several pieces (a partial mark at a chunk's end is held back
 * until the next shows whether it was one).  True once, when the reply frame after the
 * mark has come whole: sup_endmark_reply gives its body.  A length no reply has means
 * none is there (the kernel used its reply FIFO): nothing more is looked at. */
typedef void (*sup_keep_fn)(void *ud, const unsigned char *p, size_t n);
bool sup_endmark_take(sup_endmark *e, const unsigned char *p, size_t n, sup_keep_fn keep,
                      void *ud);

/* The reply frame's body after the mark (NULL until it came whole), *len its length. */
const unsigned char *sup_endmark_reply(const sup_endmark *e, size_t *len);

#endif

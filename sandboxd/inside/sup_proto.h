/*
 * sup_proto.h — the framed protocol between sandboxd and its in-sandbox supervisor.
 *
 * The supervisor (supervisor.c) is sandboxd's own binary started inside each sandbox
 * as `sandboxd --berth-supervisor KEY=VALUE...`.  It is the sandbox's PID 1 (bubblewrap
 * and gVisor) or a child subreaper (process provider).  The daemon writes frames to its
 * stdin and reads frames from its stdout; its stderr goes to the daemon's log.
 *
 * A frame is a 4-byte little-endian length N, then N bytes: a type byte, a language
 * byte (SUP_LANG_*) and the payload.  Integers in payloads are little-endian.
 *
 * Cells do not pass through the supervisor.  Each language has four FIFOs on the host
 * (made by the daemon, which holds them open read-write, and bound into the sandbox as
 * <io>/<py|js>-<req|rep|out|err>): the kernel reads requests from `req` and writes
 * replies to `rep` (kernels/kernel.py), its stdout and stderr are `out` and `err`.  So
 * a warm cell is one write by the daemon, one wake-up in the sandbox and the kernel's
 * own writes back; the cell's output never shares a channel with a frame, and nothing a
 * cell prints can look like one.  The daemon still treats every frame, from the
 * supervisor or a kernel, as untrusted input: code in the sandbox may be hostile.  A
 * kernel's reply FIFO is read a bounded amount per wake-up, and replies out of turn
 * beyond a few (stale tokens or nonces: someone else writes there) end the sandbox.
 *
 * Daemon -> supervisor:
 *   SUP_START lang                 token[32]: start that language's kernel (it answers
 *                                  "R" + token on its `rep` FIFO once ready)
 *   SUP_FILES lang                 u32 n_files, n_files x (u32 path_len, path, u32 len,
 *                                  content): write a cell's files into the work directory
 *   SUP_KILL lang                  SIGKILL the kernel (or the snippet: SUP_LANG_EXEC)
 *   SUP_SWEEP                      u8 flags (SUP_SWEEP_MEASURE, SUP_SWEEP_THOROUGH): kill
 *                                  every stray process, measure the disk
 *   SUP_EXEC                       u32 out_cap, u32 err_cap, then the snippet (stdin of a
 *                                  fresh `node -`, whose output the supervisor relays)
 *   SUP_STEP                       u32 out_cap, u32 err_cap, then a project step: run as
 *                                  `/bin/sh -c STEP` (stdin /dev/null), relayed as a snippet
 *   SUP_FILES (SUP_LANG_EXEC)      a project's files, as for a cell
 *   SUP_READ                       u32 max bytes, then a path under the work directory: an
 *                                  artifact, sent back as SUP_OUT chunks and SUP_READ_DONE
 *   SUP_SWEEP with SUP_SWEEP_KERNELS  the kernels are killed too (a project in a session)
 *   SUP_WAKE                       nothing: read and dropped.  Sent when an open claims
 *                                  a pooled sandbox, so that it wakes while the answer
 *                                  travels, not when the first cell is written
 * Supervisor -> daemon:
 *   SUP_HELLO                      u32 protocol version: hardened and serving
 *   SUP_EXITED lang                i32 wait status, text: the kernel ended (or could not
 *                                  start: the text says why)
 *   SUP_FILES_DONE lang            u32 failed file index (UINT32_MAX: all written), then
 *                                  an errno-style code ("EPATH"; "ENOTREG": the path is
 *                                  a FIFO, socket or device, never opened) when one failed
 *   SUP_SWEPT                      u32 processes killed, u8 clean (all strays proven
 *                                  gone), u64 bytes used on the sandbox's writable file
 *                                  systems (0 when not measured)
 *   SUP_OUT / SUP_ERR              (SUP_LANG_EXEC) the snippet's stdout / stderr, within caps
 *   SUP_EXEC_DONE                  i32 wait status, u8 stdout cut, u8 stderr cut (a
 *                                  snippet or a step)
 *   SUP_READ_DONE                  u8 SUP_READ_*, u64 the file's size: an artifact's end
 */
#ifndef SBX_SUP_PROTO_H
#define SBX_SUP_PROTO_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define SUP_PROTOCOL 4u  /* 4: SUP_WAKE */
#define SUP_NONCE_LEN 32
/* The largest frame each side accepts: a cell carries up to 4 MiB of files and a code
 * string bounded by the request body (--max-body-bytes, at most 1 GiB, default 8 MiB). */
#define SUP_MAX_DOWN_FRAME (64u << 20)
#define SUP_MAX_UP_FRAME (256u << 10)
#define SUP_TOKEN_LEN 32
#define SUP_CHUNK (64u << 10)          /* largest SUP_OUT / SUP_ERR payload */

enum { SUP_LANG_NONE = 0, SUP_LANG_JS = 1, SUP_LANG_PY = 2, SUP_LANG_EXEC = 3 };

enum {
    SUP_START = 1, SUP_FILES, SUP_KILL, SUP_SWEEP, SUP_EXEC, SUP_STEP, SUP_READ, SUP_WAKE,
    SUP_HELLO = 64, SUP_EXITED, SUP_FILES_DONE, SUP_SWEPT, SUP_OUT, SUP_ERR, SUP_EXEC_DONE,
    SUP_READ_DONE,
};

/* How an artifact's read ended (SUP_READ_DONE). */
enum {
    SUP_READ_OK = 0,     /* its bytes came before, as SUP_OUT chunks */
    SUP_READ_SKIPPED,    /* missing, a link, not a regular file: not an artifact */
    SUP_READ_OVER,       /* larger than the bytes asked for: nothing sent */
};

#define SUP_FILES_ALL_WRITTEN 0xFFFFFFFFu
#define SUP_SWEEP_MEASURE 1u         /* measure the disk too */
#define SUP_SWEEP_THOROUGH 2u        /* a process may have started: scan, never guess */
#define SUP_SWEEP_KERNELS 4u         /* the kernels go too (their ends are reported first) */
#define SUP_KERNEL_MAX_REPLY 64      /* a kernel's reply frame body is never longer */

static inline void sup_put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static inline uint32_t sup_get32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void sup_put64(unsigned char *p, uint64_t v)
{
    sup_put32(p, (uint32_t)v);
    sup_put32(p + 4, (uint32_t)(v >> 32));
}

static inline uint64_t sup_get64(const unsigned char *p)
{
    return (uint64_t)sup_get32(p) | (uint64_t)sup_get32(p + 4) << 32;
}

/* A reader over a frame's payload: every get fails (ok = 0) rather than run past it. */
typedef struct sup_reader {
    const unsigned char *p;
    size_t left;
    int ok;
} sup_reader;

static inline uint32_t sup_read32(sup_reader *r)
{
    if (!r->ok || r->left < 4) {
        r->ok = 0;
        return 0;
    }
    uint32_t v = sup_get32(r->p);
    r->p += 4;
    r->left -= 4;
    return v;
}

static inline const unsigned char *sup_read_bytes(sup_reader *r, size_t n)
{
    if (!r->ok || r->left < n) {
        r->ok = 0;
        return NULL;
    }
    const unsigned char *at = r->p;
    r->p += n;
    r->left -= n;
    return at;
}

/* Entry point of `sandboxd --berth-supervisor ...` (argv after that word). */
int sbx_supervisor_main(int argc, char **argv);

#endif

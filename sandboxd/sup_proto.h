/*
 * sup_proto.h — the framed protocol between sandboxd and its in-sandbox supervisor.
 *
 * The supervisor (supervisor.c) is sandboxd's own binary started inside each sandbox
 * as `sandboxd --berth-supervisor KEY=VALUE...`.  It is the sandbox's PID 1 (bubblewrap
 * and gVisor) or a child subreaper (process provider).  The daemon writes frames to its
 * stdin and reads frames from its stdout; its stderr goes to the daemon's log.
 *
 * A frame is a 4-byte little-endian length N, then N bytes: a type byte, a language
 * byte (SUP_LANG_*) and the payload.  Integers in payloads are little-endian.  The
 * cell's own stdout and stderr never share a channel with frames: each interpreter
 * has separate pipes for its stdout, its stderr, its requests and its replies, and the
 * supervisor copies the streams into SUP_OUT / SUP_ERR frames, so nothing a cell
 * prints can look like a frame.  The daemon still treats every frame as untrusted
 * input (sizes bounded, states checked): code in the sandbox may be hostile.
 *
 * Daemon -> supervisor:
 *   SUP_START lang                 start that language's interpreter
 *   SUP_CELL lang                  u32 out_cap, u32 err_cap, nonce[32], u32 n_files,
 *                                  n_files x (u32 path_len, path, u32 len, content),
 *                                  then the code (the rest)
 *   SUP_KILL lang                  SIGKILL the interpreter (or the snippet: SUP_LANG_EXEC)
 *   SUP_SWEEP                      kill every stray process, measure the disk
 *   SUP_EXEC                       u32 out_cap, u32 err_cap, then the snippet
 *                                  (stdin of a fresh `node -`)
 * Supervisor -> daemon:
 *   SUP_HELLO                      u32 protocol version: hardened and serving
 *   SUP_STARTED lang               u32 pid: the interpreter is ready
 *   SUP_OUT / SUP_ERR lang         a piece of the running cell's (snippet's) stdout /
 *                                  stderr, within its cap
 *   SUP_DONE lang                  u8 status (0 ran, 1 raised, 75 no interpreter), u8
 *                                  stdout cut, u8 stderr cut
 *   SUP_EXITED lang                i32 wait status, u8 phase (SUP_PHASE_*), u8 stdout
 *                                  cut, u8 stderr cut, text (why, or what it printed
 *                                  while starting)
 *   SUP_FILES_FAILED lang          u32 file index, errno-style code ("EPATH"): the code
 *                                  was not run
 *   SUP_SWEPT                      u32 processes killed, u8 clean (all strays proven
 *                                  gone), u64 bytes used on the sandbox's writable
 *                                  file systems
 *   SUP_EXEC_DONE                  i32 wait status, u8 stdout cut, u8 stderr cut
 */
#ifndef SBX_SUP_PROTO_H
#define SBX_SUP_PROTO_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define SUP_PROTOCOL 1u
#define SUP_NONCE_LEN 32
/* The largest frame each side accepts: a cell carries up to 4 MiB of files and a code
 * string bounded by the request body (--max-body-bytes, at most 1 GiB, default 8 MiB). */
#define SUP_MAX_DOWN_FRAME (64u << 20)
#define SUP_MAX_UP_FRAME (256u << 10)
#define SUP_CHUNK (64u << 10)          /* largest SUP_OUT / SUP_ERR payload */

enum { SUP_LANG_NONE = 0, SUP_LANG_JS = 1, SUP_LANG_PY = 2, SUP_LANG_EXEC = 3 };

enum {
    SUP_START = 1, SUP_CELL, SUP_KILL, SUP_SWEEP, SUP_EXEC,
    SUP_HELLO = 64, SUP_STARTED, SUP_OUT, SUP_ERR, SUP_DONE, SUP_EXITED, SUP_FILES_FAILED,
    SUP_SWEPT, SUP_EXEC_DONE,
};

/* Where an interpreter was when it ended. */
enum { SUP_PHASE_IDLE = 0, SUP_PHASE_STARTING = 1, SUP_PHASE_RUNNING = 2 };

/* Cell statuses in SUP_DONE. */
enum { SUP_STATUS_RAN = 0, SUP_STATUS_RAISED = 1, SUP_STATUS_NO_INTERPRETER = 75 };

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

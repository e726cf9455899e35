/*
 * box.c — a sandbox as the daemon sees it (see box.h, sup_proto.h): the supervisor's
 * link, and per language the four FIFOs of its kernel.
 */
#include "box.h"

#include "frames.h"
#include "log.h"
#include "proc.h"
#include "util.h"

#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define CLOSE_BOUND_S 5.0          /* the supervisor's own exit after EOF */
#define LOG_LINES_PER_BOX 40
#define START_ERR_KEEP 2048
#define READ_ROUND (1u << 20)      /* bytes read from one FIFO per wake-up, at most */
#define DRAIN_LIMIT (4u << 20)     /* bytes read after a cell's end, at most */
#define REPLY_ROUND 4096u          /* bytes read from a reply FIFO per wake-up, at most */
/* Replies out of turn (a stale token or nonce, a bad size) a lane may show between two
 * good ones.  A kernel killed while starting may leave one ready behind; a process in
 * the sandbox writing frames of its own (a flood) makes many, and ends the sandbox. */
#define STRAY_REPLIES_MAX 8

enum { F_REQ, F_REP, F_OUT, F_ERR, N_FIFOS };
static const char *const fifo_names[N_FIFOS] = {"req", "rep", "out", "err"};

/* A kernel ends each cell's output with a mark on stdout and on stderr (frames.h:
 * sup_endmark): what follows the mark on a stream is output between cells (a timer, a
 * thread, a child) and is dropped, however late the daemon reads it.  The end reply
 * comes in the same write as stderr's mark, right after it (one system call less a
 * cell: each is a stop of the sandbox under gVisor's ptrace platform), or on the reply
 * FIFO when stderr is closed. */

typedef struct op {
    bool active;
    bool cancelled;                /* its owner gave up (sbx_box_cancel): no callback */
    bool not_run;                  /* complete from the loop as SBX_CELL_NOT_RUN */
    bool no_nonce;                 /* ... as SBX_CELL_NO_NONCE: no random bytes */
    bool sent;                     /* the code left for the kernel */
    bool files_pending;            /* waiting for SUP_FILES_DONE */
    int done_type;                 /* exec lane: the frame that ends it (SUP_EXEC_DONE,
                                      SUP_FILES_DONE, SUP_READ_DONE) */
    sbx_cell_cb cb;
    void *ud;
    const sbx_job *job;            /* borrowed until cb */
    sbx_buf out, err;
    uint32_t out_cap, err_cap;
    bool out_cut, err_cut;
    char nonce[SUP_NONCE_LEN + 1];
    sup_endmark end[2];            /* stdout's and stderr's end of the cell */
    bool reply_ready;              /* the end reply after stderr's mark came, unhandled */
} op;

typedef struct lane {              /* one language's kernel */
    sbx_interp_state state;
    int fd[N_FIFOS];
    ev_io req_io, rep_io, out_io, err_io;
    unsigned char *wq;             /* the request on its way to `req` */
    size_t wq_len, wq_off;
    unsigned char rep[4 + SUP_KERNEL_MAX_REPLY];
    size_t rep_len;
    char token[SUP_TOKEN_LEN + 1];
    char start_err[START_ERR_KEEP];
    size_t start_err_len;
    const char *broke;             /* why we had it killed */
    unsigned strays;               /* replies out of turn since the last good one */
    op op;
} lane;

typedef enum box_state { B_LAUNCHING, B_READY, B_CLOSING } box_state;

struct sbx_box {
    struct ev_loop *loop;
    const sbx_backend_ops *ops;
    sbx_backend *bk;
    void *bkdata;
    sbx_box_events ev;
    void *ud;
    char *id;
    char **argv;
    char *host_io;                 /* the FIFOs' directory on the host */
    box_state state;
    pid_t pid;
    sbx_watch *watch;
    bool exited, dead, ready_reported;
    char *dead_why;
    int to_fd, from_fd, err_fd;
    ev_io to_io, from_io, err_io;
    unsigned char *wq;
    size_t wq_len, wq_off;
    unsigned char *rq;
    size_t rq_len, rq_cap;
    lane lane[3];                  /* by SUP_LANG_JS / SUP_LANG_PY */
    op snippet;
    bool sweeping, measure;
    sbx_sweep_cb sweep_cb;
    void *sweep_ud;
    void (*freeze_cb)(void *ud, bool ok);
    void *freeze_ud;
    bool freezing;
    ev_timer fail_now;             /* completes operations that cannot go on, from the loop */
    ev_timer close_bound;
    sbx_box_done_cb close_cb;
    void *close_ud;
    bool closing_started, cleaning;
    int log_lines;
    char line[400];
    size_t line_len;
};

static void on_from(struct ev_loop *loop, ev_io *w, int revents);
static void on_to(struct ev_loop *loop, ev_io *w, int revents);
static void on_err(struct ev_loop *loop, ev_io *w, int revents);
static void on_fifo(struct ev_loop *loop, ev_io *w, int revents);
static void on_req_writable(struct ev_loop *loop, ev_io *w, int revents);
static void on_exit_watch(void *ud, int status);
static void on_fail_now(struct ev_loop *loop, ev_timer *w, int revents);
static void on_close_bound(struct ev_loop *loop, ev_timer *w, int revents);
static void close_continue(sbx_box *b);

/* ---------------------------------------------------------------- accessors */

const char *const *sbx_box_supervisor_argv(const sbx_box *b) { return (const char *const *)b->argv; }
const char *sbx_box_id(const sbx_box *b) { return b->id; }
bool sbx_box_ready(const sbx_box *b) { return b->state == B_READY && !b->dead; }
bool sbx_box_alive(const sbx_box *b) { return !b->dead && b->state != B_CLOSING; }
bool sbx_box_measures_disk(const sbx_box *b) { return b->measure; }
void *sbx_box_backend_data(const sbx_box *b) { return b->bkdata; }
void sbx_box_set_backend_data(sbx_box *b, void *data) { b->bkdata = data; }
const char *sbx_box_host_io(const sbx_box *b) { return b->host_io; }

sbx_interp_state sbx_box_interp(const sbx_box *b, int lang)
{
    return lang == SUP_LANG_JS || lang == SUP_LANG_PY ? b->lane[lang].state : SBX_I_NONE;
}

void sbx_box_set_events(sbx_box *b, const sbx_box_events *ev, void *ud)
{
    b->ev = *ev;
    b->ud = ud;
}

static bool is_lang(int lang)
{
    return lang == SUP_LANG_JS || lang == SUP_LANG_PY;
}

/* ---------------------------------------------------------------- the supervisor link */

static void stop_link(sbx_box *b)
{
    if (b->to_fd >= 0) {
        ev_io_stop(b->loop, &b->to_io);
        close(b->to_fd);
        b->to_fd = -1;
    }
    if (b->from_fd >= 0) {
        ev_io_stop(b->loop, &b->from_io);
        close(b->from_fd);
        b->from_fd = -1;
    }
}

/* Writes what is queued without blocking; the rest waits for the fd. */
static void flush_queue(struct ev_loop *loop, int fd, ev_io *io, unsigned char **q, size_t *len,
                        size_t *off)
{
    while (fd >= 0 && *off < *len) {
        ssize_t n = write(fd, *q + *off, *len - *off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            if (errno == EAGAIN) {
                ev_io_start(loop, io);
                return;
            }
            break; /* the other side is gone: its end is reported elsewhere */
        }
        *off += (size_t)n;
    }
    ev_io_stop(loop, io);
    *off = *len = 0;
    if (*q) { /* a big request does not stay around */
        free(*q);
        *q = NULL;
    }
}

static void enqueue(unsigned char **q, size_t *len, size_t *off, const void *const *parts,
                    const size_t *lens, size_t n_parts, size_t total)
{
    if (*off == *len)
        *off = *len = 0;
    *q = sbx_xrealloc(*q, *len + total);
    for (size_t i = 0; i < n_parts; i++) {
        if (lens[i])
            memcpy(*q + *len, parts[i], lens[i]);
        *len += lens[i];
    }
}

static void send_parts(sbx_box *b, int type, int lang, const void *const *parts,
                       const size_t *lens, size_t n_parts)
{
    size_t body = 2;
    for (size_t i = 0; i < n_parts; i++)
        body += lens[i];
    unsigned char head[6];
    sup_put32(head, (uint32_t)body);
    head[4] = (unsigned char)type;
    head[5] = (unsigned char)lang;
    const void *hp[1] = {head};
    size_t hl[1] = {6};
    enqueue(&b->wq, &b->wq_len, &b->wq_off, hp, hl, 1, 6);
    if (n_parts)
        enqueue(&b->wq, &b->wq_len, &b->wq_off, parts, lens, n_parts, body - 2);
    flush_queue(b->loop, b->to_fd, &b->to_io, &b->wq, &b->wq_len, &b->wq_off);
}

static void send_simple(sbx_box *b, int type, int lang, const void *payload, size_t len)
{
    const void *parts[1] = {payload};
    size_t lens[1] = {len};
    send_parts(b, type, lang, parts, lens, len ? 1 : 0);
}

/* ---------------------------------------------------------------- completing */

static void op_complete(op *o, sbx_cell_result *r)
{
    if (!o->active || o->cancelled) { /* nobody waits for it: it only ends */
        free(r->out.data);
        free(r->err.data);
        free(r->text);
        if (o->active) {
            free(o->out.data);
            free(o->err.data);
            memset(o, 0, sizeof *o);
        }
        return;
    }
    r->out = o->out;
    r->err = o->err;
    r->out_truncated = r->out_truncated || o->out_cut;
    r->err_truncated = r->err_truncated || o->err_cut;
    sbx_cell_cb cb = o->cb;
    void *ud = o->ud;
    memset(o, 0, sizeof *o);
    cb(ud, r);
}

static void complete_end(op *o, sbx_cell_end end, const char *text)
{
    sbx_cell_result r;
    memset(&r, 0, sizeof r);
    r.end = end;
    r.text = text ? sbx_xstrdup(text) : NULL;
    op_complete(o, &r);
}

/* Completes what cannot go on: everything once the sandbox is gone, else the
 * operations marked not run. */
static void fail_all(sbx_box *b)
{
    const char *why = b->dead_why ? b->dead_why : "the sandbox ended";
    for (int l = SUP_LANG_JS; l <= SUP_LANG_PY; l++) {
        op *o = &b->lane[l].op;
        if (o->active && o->not_run)
            complete_end(o, o->no_nonce ? SBX_CELL_NO_NONCE : SBX_CELL_NOT_RUN, NULL);
        else if (o->active && b->dead)
            complete_end(o, SBX_CELL_SANDBOX_GONE, why);
    }
    if (b->snippet.active && (b->dead || b->snippet.not_run))
        complete_end(&b->snippet, b->dead ? SBX_CELL_SANDBOX_GONE : SBX_CELL_NOT_RUN, why);
    if (b->sweeping && b->dead) {
        b->sweeping = false;
        b->sweep_cb(b->sweep_ud, false, false, 0, 0);
    }
}

static void on_fail_now(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    sbx_box *b = w->data;
    fail_all(b);
    if (b->state == B_LAUNCHING && b->dead && !b->ready_reported) {
        b->ready_reported = true;
        if (b->ev.ready)
            b->ev.ready(b->ud, b, b->dead_why);
        return;
    }
    if (b->state == B_CLOSING)
        close_continue(b);
}

/* The sandbox is unusable from now on; the owner hears it once. */
static void mark_dead(sbx_box *b, const char *why)
{
    if (b->dead)
        return;
    b->dead = true;
    b->dead_why = sbx_xstrdup(why);
    for (int l = SUP_LANG_JS; l <= SUP_LANG_PY; l++)
        b->lane[l].state = SBX_I_NONE;
    box_state was = b->state;
    fail_all(b);
    if (was == B_LAUNCHING) {
        b->ready_reported = true;
        if (b->ev.ready)
            b->ev.ready(b->ud, b, why);
    } else if (was == B_READY) {
        if (b->ev.dead)
            b->ev.dead(b->ud, b, why);
    }
}

/* Ends the sandbox by force, whatever runs in it: the link is cut (nothing more it says
 * is read), every process killed, the owner told. */
static void end_by_force(sbx_box *b, const char *why)
{
    stop_link(b);
    if (!b->exited)
        b->ops->force_kill(b->bk, b);
    mark_dead(b, why);
}

/* The supervisor broke the protocol: nothing it says can be trusted any more. */
static void violation(sbx_box *b, const char *what)
{
    sbx_log("sandbox %s broke the supervisor protocol (%s); ending it", b->id, what);
    end_by_force(b, "the sandbox broke the supervisor protocol");
}

void sbx_box_abort(sbx_box *b, const char *why)
{
    if (b->dead)
        return; /* gone already, or being closed (which ends it) */
    sbx_log("sandbox %s: %s; ending it", b->id, why);
    end_by_force(b, why);
}

/* ---------------------------------------------------------------- the kernels' FIFOs */

static void keep(sbx_buf *buf, uint32_t cap, bool *cut, const unsigned char *data, size_t n)
{
    size_t room = buf->len < cap ? cap - buf->len : 0;
    size_t take = n < room ? n : room;
    if (take < n)
        *cut = true;
    if (!take)
        return;
    buf->data = sbx_xrealloc(buf->data, buf->len + take + 1);
    memcpy(buf->data + buf->len, data, take);
    buf->len += take;
    buf->data[buf->len] = '\0';
}

static void keep_stream(op *o, int which, const unsigned char *data, size_t n)
{
    if (which == F_OUT)
        keep(&o->out, o->out_cap, &o->out_cut, data, n);
    else
        keep(&o->err, o->err_cap, &o->err_cut, data, n);
}

typedef struct keep_to {
    op *o;
    int which;
} keep_to;

static void keep_piece(void *ud, const unsigned char *p, size_t n)
{
    keep_to *k = ud;
    keep_stream(k->o, k->which, p, n);
}

/* Keeps a chunk of the running cell's stream up to its end mark; on stderr, notes the
 * end reply that came whole after it. */
static void take_output(op *o, int which, const unsigned char *p, size_t n)
{
    keep_to k = {o, which};
    if (sup_endmark_take(&o->end[which - F_OUT], p, n, keep_piece, &k))
        o->reply_ready = true;
}

/* Reads a kernel's stdout or stderr: kept for the running cell, for a start's
 * diagnosis, or dropped (output between cells).  With `until_mark` it stops at the
 * running cell's end mark. */
static void read_stream(sbx_box *b, int lang, int which, size_t limit, bool until_mark)
{
    lane *ln = &b->lane[lang];
    unsigned char buf[1 << 16];
    size_t got = 0;
    op *o = &ln->op;
    while (ln->fd[which] >= 0 && got < limit) {
        if (until_mark && o->end[which - F_OUT].ended)
            return;
        ssize_t n = read(ln->fd[which], buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        got += (size_t)n;
        if (o->active && o->sent) {
            take_output(o, which, buf, (size_t)n);
        } else if (ln->state == SBX_I_STARTING && which == F_ERR) {
            size_t room = START_ERR_KEEP - 1 - ln->start_err_len;
            size_t take = (size_t)n < room ? (size_t)n : room;
            memcpy(ln->start_err + ln->start_err_len, buf, take);
            ln->start_err_len += take;
            ln->start_err[ln->start_err_len] = '\0';
        }
        /* A short read emptied the FIFO: the watcher (level-triggered) comes back for
         * what is written next, so asking again now would only fail with EAGAIN, a
         * system call per stream and cell.  After a cell's end, read on to its mark. */
        if (!until_mark && (size_t)n < sizeof buf)
            return;
    }
}

static void drain_fd(int fd)
{
    unsigned char buf[1 << 16];
    for (size_t got = 0; fd >= 0 && got < DRAIN_LIMIT;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0)
            return;
        got += (size_t)n;
    }
}

/* The kernel said something it must not: it is killed, its cell reports it. */
static void lane_broke(sbx_box *b, int lang, const char *why)
{
    lane *ln = &b->lane[lang];
    ln->rep_len = 0;
    if (ln->broke)
        return;
    ln->broke = why;
    sbx_log("sandbox %s: the %s kernel %s; killing it", b->id,
            lang == SUP_LANG_PY ? "python" : "javascript", why);
    send_simple(b, SUP_KILL, lang, NULL, 0);
}

/* A reply out of turn.  Few are a kernel's (a ready of an incarnation that is gone);
 * many are a process in the sandbox writing frames of its own, which would keep the
 * daemon reading them: the sandbox is ended as hostile.  True when it was. */
static bool stray_reply(sbx_box *b, int lang)
{
    lane *ln = &b->lane[lang];
    if (++ln->strays <= STRAY_REPLIES_MAX)
        return false;
    sbx_box_abort(b, lang == SUP_LANG_PY
                         ? "a process in the sandbox wrote frames no kernel sent (stale "
                           "tokens, a flood) into the python kernel's reply FIFO"
                         : "a process in the sandbox wrote frames no kernel sent (stale "
                           "tokens, a flood) into the javascript kernel's reply FIFO");
    return true;
}

static void on_reply(sbx_box *b, int lang, const unsigned char *body, size_t len)
{
    lane *ln = &b->lane[lang];
    sup_reply rep;
    sup_reply_parse(body, len, &rep);
    if (rep.kind == SUP_REPLY_READY) {
        if (ln->state != SBX_I_STARTING || memcmp(rep.token, ln->token, SUP_TOKEN_LEN) != 0) {
            stray_reply(b, lang); /* a ready of an incarnation that is gone, or forged */
            return;
        }
        ln->strays = 0;
        ln->state = SBX_I_IDLE;
        if (b->ev.interp)
            b->ev.interp(b->ud, b, lang, true, NULL);
        return;
    }
    op *o = &ln->op;
    if (rep.kind == SUP_REPLY_DONE && ln->state == SBX_I_RUNNING && o->active && o->sent &&
        !ln->broke && memcmp(rep.nonce, o->nonce, SUP_NONCE_LEN) == 0) {
        /* Everything the cell wrote before its end, and the end marks, are in the
         * FIFOs now (a kernel whose cell closed its stdout wrote no mark there: then
         * whatever is queued is taken). */
        read_stream(b, lang, F_OUT, DRAIN_LIMIT, true);
        read_stream(b, lang, F_ERR, DRAIN_LIMIT, true);
        /* Read to their marks here: what the streams' watchers were woken for is
         * taken, and their turns in this round would each find the FIFO empty.  More
         * written since wakes them again (level-triggered). */
        ev_clear_pending(b->loop, &ln->out_io);
        ev_clear_pending(b->loop, &ln->err_io);
        ln->strays = 0;
        ln->state = SBX_I_IDLE;
        sbx_cell_result r;
        memset(&r, 0, sizeof r);
        r.end = rep.raised ? SBX_CELL_RAISED : SBX_CELL_RAN;
        r.spawned = rep.spawned;
        op_complete(o, &r);
        return;
    }
    if (!stray_reply(b, lang))
        lane_broke(b, lang, "broke the frame protocol (a reply out of turn)");
}

/* One read of a kernel's reply FIFO per wake-up, REPLY_ROUND bytes at most: a FIFO
 * that never empties (a process in the sandbox may write to it as fast as it likes)
 * gets its turn like every other watcher and never holds the loop. */
static void read_replies(sbx_box *b, int lang)
{
    lane *ln = &b->lane[lang];
    unsigned char buf[sizeof ln->rep + REPLY_ROUND];
    size_t len = ln->rep_len;
    memcpy(buf, ln->rep, len); /* a frame begun in an earlier read */
    ssize_t n;
    do
        n = read(ln->fd[F_REP], buf + len, REPLY_ROUND);
    while (n < 0 && errno == EINTR);
    if (n <= 0)
        return;
    len += (size_t)n;
    ln->rep_len = 0;
    size_t at = 0;
    sup_frame f;
    sup_split got;
    while (!b->dead && (got = sup_frame_split(buf + at, len - at, 1, SUP_KERNEL_MAX_REPLY, &f)) ==
                           SUP_SPLIT_FRAME) {
        at += f.used;
        on_reply(b, lang, f.body, f.body_len);
    }
    if (b->dead)
        return; /* ended (a flood), or its end reported by a handler */
    if (got == SUP_SPLIT_BAD) { /* what follows cannot be framed: dropped */
        if (!stray_reply(b, lang))
            lane_broke(b, lang, "broke the frame protocol (a reply of a bad size)");
        return;
    }
    memcpy(ln->rep, buf + at, len - at); /* less than a frame */
    ln->rep_len = len - at;
}

/* The end reply that came after stderr's end mark, if a whole one did. */
static void reply_after_mark(sbx_box *b, int lang)
{
    op *o = &b->lane[lang].op;
    if (!o->reply_ready)
        return;
    o->reply_ready = false;
    unsigned char body[SUP_KERNEL_MAX_REPLY];
    size_t len = 0;
    const unsigned char *reply = sup_endmark_reply(&o->end[1], &len); /* whole: take said so */
    memcpy(body, reply, len);      /* the op is reset if its end starts the next */
    on_reply(b, lang, body, len);
}

static void on_fifo(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)revents;
    sbx_box *b = w->data;
    for (int l = SUP_LANG_JS; l <= SUP_LANG_PY; l++) {
        lane *ln = &b->lane[l];
        if (w == &ln->rep_io)
            read_replies(b, l);
        else if (w == &ln->out_io)
            read_stream(b, l, F_OUT, READ_ROUND, false);
        else if (w == &ln->err_io) {
            read_stream(b, l, F_ERR, READ_ROUND, false);
            reply_after_mark(b, l);
        }
    }
}

static void on_req_writable(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)revents;
    sbx_box *b = w->data;
    for (int l = SUP_LANG_JS; l <= SUP_LANG_PY; l++) {
        lane *ln = &b->lane[l];
        if (w == &ln->req_io)
            flush_queue(loop, ln->fd[F_REQ], &ln->req_io, &ln->wq, &ln->wq_len, &ln->wq_off);
    }
}

/* Makes the FIFOs of one language; the daemon holds each open read-write, so none ever
 * sees an end of file or blocks an open, whatever the kernel does. */
static int lane_open(sbx_box *b, int lang, uid_t uid, gid_t gid, char **why)
{
    lane *ln = &b->lane[lang];
    for (int f = 0; f < N_FIFOS; f++) {
        char *path = sbx_printf("%s/%s-%s", b->host_io, lang == SUP_LANG_PY ? "py" : "js",
                                fifo_names[f]);
        int rc = mkfifo(path, 0600);
        if (rc == 0 && uid != (uid_t)-1)
            rc = chown(path, uid, gid);
        if (rc == 0)
            ln->fd[f] = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
        if (rc != 0 || ln->fd[f] < 0) {
            *why = sbx_printf("cannot make the FIFO %s: %s", path, strerror(errno));
            free(path);
            return -1;
        }
        free(path);
    }
    ev_io_init(&ln->req_io, on_req_writable, ln->fd[F_REQ], EV_WRITE);
    ev_io_init(&ln->rep_io, on_fifo, ln->fd[F_REP], EV_READ);
    ev_io_init(&ln->out_io, on_fifo, ln->fd[F_OUT], EV_READ);
    ev_io_init(&ln->err_io, on_fifo, ln->fd[F_ERR], EV_READ);
    ln->req_io.data = ln->rep_io.data = ln->out_io.data = ln->err_io.data = b;
    ev_io_start(b->loop, &ln->rep_io);
    ev_io_start(b->loop, &ln->out_io);
    ev_io_start(b->loop, &ln->err_io);
    return 0;
}

static void lane_close(sbx_box *b, int lang)
{
    lane *ln = &b->lane[lang];
    ev_io_stop(b->loop, &ln->req_io);
    ev_io_stop(b->loop, &ln->rep_io);
    ev_io_stop(b->loop, &ln->out_io);
    ev_io_stop(b->loop, &ln->err_io);
    for (int f = 0; f < N_FIFOS; f++) {
        if (ln->fd[f] >= 0)
            close(ln->fd[f]);
        ln->fd[f] = -1;
        if (b->host_io) {
            char *path = sbx_printf("%s/%s-%s", b->host_io, lang == SUP_LANG_PY ? "py" : "js",
                                    fifo_names[f]);
            unlink(path);
            free(path);
        }
    }
    free(ln->wq);
    ln->wq = NULL;
    ln->wq_len = ln->wq_off = 0;
    free(ln->op.out.data);
    free(ln->op.err.data);
}

/* Sends the cell's request to its kernel: length, nonce, code. */
static void send_request(sbx_box *b, int lang)
{
    lane *ln = &b->lane[lang];
    op *o = &ln->op;
    unsigned char head[4];
    sup_put32(head, (uint32_t)(SUP_NONCE_LEN + o->job->code.len));
    const void *parts[3] = {head, o->nonce, o->job->code.data};
    size_t lens[3] = {4, SUP_NONCE_LEN, o->job->code.len};
    enqueue(&ln->wq, &ln->wq_len, &ln->wq_off, parts, lens, 3, lens[0] + lens[1] + lens[2]);
    o->sent = true;
    flush_queue(b->loop, ln->fd[F_REQ], &ln->req_io, &ln->wq, &ln->wq_len, &ln->wq_off);
}

void sbx_box_wake(sbx_box *b)
{
    send_simple(b, SUP_WAKE, SUP_LANG_NONE, NULL, 0);
}

/* ---------------------------------------------------------------- supervisor frames */

/* Copies an errno-style code from a frame, anything but A-Z shown as '?'. */
static void copy_errcode(char out[16], const unsigned char *p, size_t len)
{
    memset(out, 0, 16);
    memcpy(out, p, len < 15 ? len : 15);
    for (size_t i = 0; out[i]; i++)
        if (out[i] < 'A' || out[i] > 'Z')
            out[i] = '?';
}

/* A project's files (the exec lane) are written, or one of them failed. */
static void exec_files_done(sbx_box *b, const unsigned char *p, size_t len)
{
    op *o = &b->snippet;
    if (len < 4 || len > 4 + 15 || !o->active || o->done_type != SUP_FILES_DONE) {
        violation(b, "files done out of turn");
        return;
    }
    sbx_cell_result r;
    memset(&r, 0, sizeof r);
    r.file_index = sup_get32(p);
    r.end = r.file_index == SUP_FILES_ALL_WRITTEN ? SBX_CELL_WRITTEN : SBX_CELL_FILES_FAILED;
    if (r.end == SBX_CELL_FILES_FAILED)
        copy_errcode(r.errcode, p + 4, len - 4);
    op_complete(o, &r);
}

static void on_frame(sbx_box *b, int type, int lang, const unsigned char *p, size_t len)
{
    switch (type) {
    case SUP_HELLO:
        if (b->state != B_LAUNCHING || len != 4 || sup_get32(p) != SUP_PROTOCOL) {
            violation(b, "hello");
            return;
        }
        b->state = B_READY;
        b->ready_reported = true;
        if (b->ev.ready)
            b->ev.ready(b->ud, b, NULL);
        return;
    case SUP_EXITED: {
        if (!is_lang(lang) || len < 4 || b->lane[lang].state == SBX_I_NONE) {
            violation(b, "exited out of turn");
            return;
        }
        lane *ln = &b->lane[lang];
        sbx_interp_state was = ln->state;
        ln->state = SBX_I_NONE;
        char *text = len > 4 ? sbx_xstrndup((const char *)p + 4, len - 4) : NULL;
        const char *why = ln->broke ? ln->broke : text;
        if (ln->op.active && ln->op.sent) {
            read_stream(b, lang, F_OUT, DRAIN_LIMIT, false);
            read_stream(b, lang, F_ERR, DRAIN_LIMIT, false);
            sbx_cell_result r;
            memset(&r, 0, sizeof r);
            r.end = SBX_CELL_DIED;
            r.wait_status = (int)sup_get32(p);
            r.text = why ? sbx_xstrdup(why) : NULL;
            op_complete(&ln->op, &r);
        } else {
            if (ln->op.active) /* files were being written: nothing ran */
                complete_end(&ln->op, SBX_CELL_NOT_RUN, NULL);
            if (b->ev.interp)
                b->ev.interp(b->ud, b, lang, false,
                             was == SBX_I_STARTING && ln->start_err_len ? ln->start_err
                             : why ? why : "");
        }
        free(text);
        ln->broke = NULL;
        return;
    }
    case SUP_FILES_DONE: {
        if (lang == SUP_LANG_EXEC) {
            exec_files_done(b, p, len);
            return;
        }
        lane *ln = is_lang(lang) ? &b->lane[lang] : NULL;
        if (!ln || len < 4 || len > 4 + 15 || !ln->op.active || !ln->op.files_pending) {
            violation(b, "files done out of turn");
            return;
        }
        ln->op.files_pending = false;
        uint32_t index = sup_get32(p);
        if (index == SUP_FILES_ALL_WRITTEN && ln->op.cancelled) {
            /* its owner gave up while the files were written (the job is gone): the
             * code is never sent */
            if (ln->state == SBX_I_RUNNING)
                ln->state = SBX_I_IDLE;
            complete_end(&ln->op, SBX_CELL_NOT_RUN, NULL);
            return;
        }
        if (index == SUP_FILES_ALL_WRITTEN) {
            if (ln->state == SBX_I_RUNNING)
                send_request(b, lang);
            return;
        }
        sbx_cell_result r;
        memset(&r, 0, sizeof r);
        r.end = SBX_CELL_FILES_FAILED;
        r.file_index = index;
        copy_errcode(r.errcode, p + 4, len - 4);
        ln->state = SBX_I_IDLE;
        op_complete(&ln->op, &r);
        return;
    }
    case SUP_SWEPT:
        if (len != 13 || !b->sweeping) {
            violation(b, "swept out of turn");
            return;
        }
        b->sweeping = false;
        b->sweep_cb(b->sweep_ud, true, p[4] != 0, sup_get32(p), sup_get64(p + 5));
        return;
    case SUP_OUT:
    case SUP_ERR:
        if (lang != SUP_LANG_EXEC) {
            violation(b, "output of no one");
            return;
        }
        if (b->snippet.active) {
            op *o = &b->snippet;
            if (type == SUP_OUT)
                keep(&o->out, o->out_cap, &o->out_cut, p, len);
            else
                keep(&o->err, o->err_cap, &o->err_cut, p, len);
        }
        return;
    case SUP_READ_DONE: {
        if (len != 9 || !b->snippet.active || b->snippet.done_type != SUP_READ_DONE) {
            violation(b, "read done out of turn");
            return;
        }
        sbx_cell_result r;
        memset(&r, 0, sizeof r);
        r.end = SBX_CELL_READ;
        r.read_status = p[0];
        r.size = sup_get64(p + 1);
        op_complete(&b->snippet, &r);
        return;
    }
    case SUP_EXEC_DONE: {
        if (len != 6 || !b->snippet.active || b->snippet.done_type != SUP_EXEC_DONE) {
            violation(b, "exec done out of turn");
            return;
        }
        sbx_cell_result r;
        memset(&r, 0, sizeof r);
        r.end = SBX_CELL_EXITED;
        r.wait_status = (int)sup_get32(p);
        r.out_truncated = p[4] != 0;
        r.err_truncated = p[5] != 0;
        op_complete(&b->snippet, &r);
        return;
    }
    default:
        violation(b, "unknown frame");
    }
}

static void on_from(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)revents;
    sbx_box *b = w->data;
    if (b->rq_cap - b->rq_len < SUP_CHUNK + 64) {
        b->rq_cap = b->rq_cap ? b->rq_cap * 2 : 2 * (SUP_CHUNK + 64);
        b->rq = sbx_xrealloc(b->rq, b->rq_cap);
    }
    ssize_t n = read(b->from_fd, b->rq + b->rq_len, b->rq_cap - b->rq_len);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n <= 0) { /* the supervisor closed its side: the sandbox is ending */
        ev_io_stop(b->loop, &b->from_io);
        close(b->from_fd);
        b->from_fd = -1;
        if (b->state != B_CLOSING)
            mark_dead(b, b->state == B_LAUNCHING ? "the sandbox ended while starting"
                                                 : "the sandbox ended (its supervisor is gone)");
        return;
    }
    b->rq_len += (size_t)n;
    size_t at = 0;
    /* Frames one by one; a handler may end the link. */
    while (b->from_fd >= 0) {
        sup_frame f;
        sup_split got = sup_frame_split(b->rq + at, b->rq_len - at, 2, SUP_MAX_UP_FRAME, &f);
        if (got == SUP_SPLIT_BAD) {
            violation(b, "a frame of a bad size");
            return;
        }
        if (got == SUP_SPLIT_MORE)
            break;
        at += f.used;
        on_frame(b, f.body[0], f.body[1], f.body + 2, f.body_len - 2);
    }
    if (b->from_fd < 0) {
        b->rq_len = 0;
        return;
    }
    memmove(b->rq, b->rq + at, b->rq_len - at);
    b->rq_len -= at;
    if (b->rq_cap > 4 * (SUP_CHUNK + 64) && b->rq_len < SUP_CHUNK) {
        b->rq_cap = 2 * (SUP_CHUNK + 64);
        b->rq = sbx_xrealloc(b->rq, b->rq_cap);
    }
}

static void on_to(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)revents;
    sbx_box *b = w->data;
    flush_queue(loop, b->to_fd, &b->to_io, &b->wq, &b->wq_len, &b->wq_off);
}

/* The supervisor's (and the sandbox tool's) stderr: logged, a bounded number of lines. */
static void on_err(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)revents;
    sbx_box *b = w->data;
    char buf[1024];
    ssize_t n = read(b->err_fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n <= 0) {
        ev_io_stop(b->loop, &b->err_io);
        close(b->err_fd);
        b->err_fd = -1;
        return;
    }
    for (ssize_t i = 0; i < n; i++) {
        char c = buf[i];
        if (c == '\n' || b->line_len == sizeof b->line - 1) {
            b->line[b->line_len] = '\0';
            if (b->line_len && b->log_lines++ < LOG_LINES_PER_BOX)
                sbx_log("sandbox %s: %s", b->id, b->line);
            b->line_len = 0;
            if (c == '\n')
                continue;
        }
        b->line[b->line_len++] = (c >= 32 && c < 127) ? c : '?';
    }
}

/* ---------------------------------------------------------------- life */

static void on_exit_watch(void *ud, int status)
{
    sbx_box *b = ud;
    b->watch = NULL;
    b->exited = true;
    if (b->state == B_CLOSING) {
        close_continue(b);
        return;
    }
    char how[64], why[160];
    if (WIFEXITED(status))
        snprintf(how, sizeof how, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(how, sizeof how, "was killed by signal %d", WTERMSIG(status));
    else
        snprintf(how, sizeof how, "ended (status %d)", status);
    snprintf(why, sizeof why, "the sandbox %s", how);
    sbx_log("sandbox %s ended on its own: it %s", b->id, how);
    stop_link(b);
    mark_dead(b, why);
}

static void add_arg(char ***argv, size_t *n, char *arg)
{
    *argv = sbx_xrealloc(*argv, (*n + 2) * sizeof **argv);
    (*argv)[(*n)++] = arg;
    (*argv)[*n] = NULL;
}

sbx_box *sbx_box_new(struct ev_loop *loop, const sbx_backend_ops *ops, sbx_backend *bk,
                     const sbx_box_config *cfg, const sbx_box_events *ev, void *ud)
{
    sbx_box *b = sbx_xcalloc(1, sizeof *b);
    b->loop = loop;
    b->ops = ops;
    b->bk = bk;
    b->ev = *ev;
    b->ud = ud;
    b->id = sbx_xstrdup(cfg->id);
    b->to_fd = b->from_fd = b->err_fd = -1;
    for (int l = 0; l < 3; l++)
        for (int f = 0; f < N_FIFOS; f++)
            b->lane[l].fd[f] = -1;
    ev_timer_init(&b->fail_now, on_fail_now, 0., 0.);
    ev_timer_init(&b->close_bound, on_close_bound, CLOSE_BOUND_S, 0.);
    b->fail_now.data = b->close_bound.data = b;
    size_t n = 0;
    add_arg(&b->argv, &n, sbx_xstrdup(cfg->supervisor_path));
    add_arg(&b->argv, &n, sbx_xstrdup("--berth-supervisor"));
    add_arg(&b->argv, &n, sbx_printf("mode=%s", cfg->mode));
    add_arg(&b->argv, &n, sbx_printf("work=%s", cfg->work));
    add_arg(&b->argv, &n, sbx_printf("io=%s", cfg->io));
    add_arg(&b->argv, &n, sbx_printf("python=%s", cfg->python));
    add_arg(&b->argv, &n, sbx_printf("node=%s", cfg->node));
    add_arg(&b->argv, &n, sbx_printf("work_mb=%u", cfg->work_mb));
    add_arg(&b->argv, &n, sbx_printf("tmp_mb=%u", cfg->tmp_mb));
    add_arg(&b->argv, &n, sbx_printf("shm_mb=%u", cfg->shm_mb));
    add_arg(&b->argv, &n, sbx_printf("mem_mb=%u", cfg->mem_mb));
    add_arg(&b->argv, &n, sbx_printf("nofile=%u", cfg->nofile));
    add_arg(&b->argv, &n, sbx_printf("nproc=%u", cfg->nproc));
    add_arg(&b->argv, &n, sbx_printf("as_mb=%u", cfg->as_mb));
    if (cfg->run_as_uid) {
        add_arg(&b->argv, &n, sbx_printf("uid=%u", cfg->run_as_uid));
        add_arg(&b->argv, &n, sbx_printf("gid=%u", cfg->run_as_gid));
    }
    b->measure = cfg->measure_disk;

    char *why = NULL;
    b->host_io = sbx_xstrdup(cfg->host_io);
    if (mkdir(b->host_io, 0700) != 0 ||
        (cfg->uid != (uid_t)-1 && chown(b->host_io, cfg->uid, cfg->gid) != 0)) {
        why = sbx_printf("cannot create %s: %s", b->host_io, strerror(errno));
        free(b->host_io);
        b->host_io = NULL;
    }
    for (int l = SUP_LANG_JS; l <= SUP_LANG_PY && !why; l++)
        lane_open(b, l, cfg->uid, cfg->gid, &why);
    int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
    if (!why && (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 ||
                 pipe2(err, O_CLOEXEC) != 0))
        why = sbx_printf("pipe: %s", strerror(errno));
    if (!why) {
        b->pid = ops->launch(bk, b, in[0], out[1], err[1], &why);
        b->to_fd = in[1];
        b->from_fd = out[0];
        b->err_fd = err[0];
        in[1] = out[0] = err[0] = -1;
        fcntl(b->to_fd, F_SETFL, O_NONBLOCK);
        fcntl(b->from_fd, F_SETFL, O_NONBLOCK);
        fcntl(b->err_fd, F_SETFL, O_NONBLOCK);
        ev_io_init(&b->to_io, on_to, b->to_fd, EV_WRITE);
        ev_io_init(&b->from_io, on_from, b->from_fd, EV_READ);
        ev_io_init(&b->err_io, on_err, b->err_fd, EV_READ);
        b->to_io.data = b->from_io.data = b->err_io.data = b;
        ev_io_start(loop, &b->err_io);
        if (b->pid > 0) {
            ev_io_start(loop, &b->from_io);
            b->watch = sbx_watch_child(loop, b->pid, on_exit_watch, b);
        }
    }
    int ends[] = {in[0], in[1], out[0], out[1], err[0], err[1]};
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++)
        if (ends[i] >= 0)
            close(ends[i]);
    if (b->pid <= 0) {
        b->exited = true;
        stop_link(b);
        b->dead = true;
        b->dead_why = why ? why : sbx_xstrdup("the sandbox could not be started");
        sbx_log("sandbox %s could not be started: %s", b->id, b->dead_why);
        ev_timer_start(loop, &b->fail_now); /* `ready` with the error, from the loop */
        return b;
    }
    free(why);
    return b;
}

/* ---------------------------------------------------------------- operations */

static bool start_op(sbx_box *b, op *o, sbx_cell_cb cb, void *ud, uint32_t out_cap,
                     uint32_t err_cap)
{
    free(o->out.data);
    free(o->err.data);
    memset(o, 0, sizeof *o);
    o->active = true;
    o->cb = cb;
    o->ud = ud;
    o->out_cap = out_cap;
    o->err_cap = err_cap;
    if (b->dead || b->state != B_READY) {
        ev_timer_start(b->loop, &b->fail_now);
        return false;
    }
    return true;
}

void sbx_box_start(sbx_box *b, int lang)
{
    if (b->dead || b->state != B_READY || !is_lang(lang) || b->lane[lang].state != SBX_I_NONE)
        return;
    lane *ln = &b->lane[lang];
    /* Whatever an earlier incarnation left in the FIFOs goes. */
    for (int f = 0; f < N_FIFOS; f++)
        drain_fd(ln->fd[f]);
    ln->rep_len = 0;
    ln->start_err_len = 0;
    ln->start_err[0] = '\0';
    ln->broke = NULL;
    /* The token is what tells the kernel's replies from a guest's forgeries: without
     * random bytes there is none worth having, and the sandbox is ended instead. */
    if (!sbx_random_hex(SUP_TOKEN_LEN / 2, ln->token)) {
        sbx_box_abort(b, "no random bytes for an interpreter's start token");
        return;
    }
    ln->state = SBX_I_STARTING;
    send_simple(b, SUP_START, lang, ln->token, SUP_TOKEN_LEN);
}

/* SUP_FILES: the count, then per file its path and content, each after its length. */
static void send_files(sbx_box *b, int lang, const sbx_file *files, size_t n)
{
    size_t n_parts = 1 + 4 * n;
    const void **parts = sbx_xcalloc(n_parts, sizeof *parts);
    size_t *lens = sbx_xcalloc(n_parts, sizeof *lens);
    unsigned char *sizes = sbx_xcalloc(n * 8 + 4, 1);
    sup_put32(sizes, (uint32_t)n);
    size_t k = 0;
    parts[k] = sizes;
    lens[k++] = 4;
    for (size_t i = 0; i < n; i++) {
        unsigned char *s = sizes + 4 + 8 * i;
        sup_put32(s, (uint32_t)files[i].path.len);
        sup_put32(s + 4, (uint32_t)files[i].content.len);
        parts[k] = s;
        lens[k++] = 4;
        parts[k] = files[i].path.data;
        lens[k++] = files[i].path.len;
        parts[k] = s + 4;
        lens[k++] = 4;
        parts[k] = files[i].content.data;
        lens[k++] = files[i].content.len;
    }
    send_parts(b, SUP_FILES, lang, parts, lens, k);
    free(parts);
    free(lens);
    free(sizes);
}

void sbx_box_cell(sbx_box *b, int lang, const sbx_job *job, uint32_t out_cap, uint32_t err_cap,
                  sbx_cell_cb cb, void *ud)
{
    lane *ln = &b->lane[lang];
    op *o = &ln->op;
    if (!start_op(b, o, cb, ud, out_cap, err_cap))
        return;
    if (ln->state != SBX_I_IDLE) { /* nothing ran: reported from the loop */
        o->not_run = true;
        ev_timer_start(b->loop, &b->fail_now);
        return;
    }
    /* A fence the cell could guess would let it forge its own end: without random
     * bytes nothing runs. */
    if (!sbx_random_hex(SUP_NONCE_LEN / 2, o->nonce)) {
        o->not_run = o->no_nonce = true;
        ev_timer_start(b->loop, &b->fail_now);
        return;
    }
    o->job = job;
    sup_endmark_init(&o->end[0], (const unsigned char *)o->nonce, false); /* stdout */
    sup_endmark_init(&o->end[1], (const unsigned char *)o->nonce, true);  /* stderr */
    /* Output between cells was dropped as it came; what is queued now is not ours. */
    drain_fd(ln->fd[F_OUT]);
    drain_fd(ln->fd[F_ERR]);
    ln->state = SBX_I_RUNNING;
    if (job->n_files == 0) {
        send_request(b, lang);
        return;
    }
    /* Files first, through the supervisor; the code follows SUP_FILES_DONE. */
    o->files_pending = true;
    send_files(b, lang, job->files, job->n_files);
}

bool sbx_box_cell_sent(const sbx_box *b, int lang)
{
    return b->lane[lang].op.active && b->lane[lang].op.sent;
}

/* A run on the exec lane (a snippet, SUP_EXEC, or a project step, SUP_STEP): its output
 * caps, then its text; both end with SUP_EXEC_DONE. */
static void start_exec_lane(sbx_box *b, int type, const sbx_bytes *text, uint32_t out_cap,
                            uint32_t err_cap, sbx_cell_cb cb, void *ud)
{
    if (!start_op(b, &b->snippet, cb, ud, out_cap, err_cap))
        return;
    unsigned char caps[8];
    sup_put32(caps, out_cap);
    sup_put32(caps + 4, err_cap);
    const void *parts[2] = {caps, text->data};
    size_t lens[2] = {8, text->len};
    b->snippet.sent = true;
    b->snippet.done_type = SUP_EXEC_DONE;
    send_parts(b, type, SUP_LANG_EXEC, parts, lens, 2);
}

void sbx_box_exec(sbx_box *b, const sbx_bytes *code, uint32_t out_cap, uint32_t err_cap,
                  sbx_cell_cb cb, void *ud)
{
    start_exec_lane(b, SUP_EXEC, code, out_cap, err_cap, cb, ud);
}

void sbx_box_step(sbx_box *b, const sbx_bytes *command, uint32_t out_cap, uint32_t err_cap,
                  sbx_cell_cb cb, void *ud)
{
    start_exec_lane(b, SUP_STEP, command, out_cap, err_cap, cb, ud);
}

void sbx_box_read(sbx_box *b, const sbx_bytes *path, uint32_t max, sbx_cell_cb cb, void *ud)
{
    if (!start_op(b, &b->snippet, cb, ud, max, 0))
        return;
    unsigned char head[4];
    sup_put32(head, max);
    const void *parts[2] = {head, path->data};
    size_t lens[2] = {4, path->len};
    b->snippet.sent = true;
    b->snippet.done_type = SUP_READ_DONE;
    send_parts(b, SUP_READ, SUP_LANG_EXEC, parts, lens, 2);
}

void sbx_box_files(sbx_box *b, const sbx_file *files, size_t n, sbx_cell_cb cb, void *ud)
{
    if (!start_op(b, &b->snippet, cb, ud, 0, 0))
        return;
    b->snippet.sent = true;
    b->snippet.done_type = SUP_FILES_DONE;
    send_files(b, SUP_LANG_EXEC, files, n);
}

void sbx_box_cancel(sbx_box *b, int lang)
{
    op *o = lang == SUP_LANG_EXEC ? &b->snippet : is_lang(lang) ? &b->lane[lang].op : NULL;
    if (!o || !o->active)
        return;
    o->cancelled = true;
    o->cb = NULL;
    o->ud = NULL;
    o->job = NULL;
}

void sbx_box_kill(sbx_box *b, int lang)
{
    if (!b->dead && b->state == B_READY)
        send_simple(b, SUP_KILL, lang, NULL, 0);
}

static void sweep_with(sbx_box *b, unsigned char flags, sbx_sweep_cb cb, void *ud)
{
    b->sweeping = true;
    b->sweep_cb = cb;
    b->sweep_ud = ud;
    if (b->dead || b->state != B_READY) {
        ev_timer_start(b->loop, &b->fail_now);
        return;
    }
    send_simple(b, SUP_SWEEP, SUP_LANG_NONE, &flags, 1);
}

void sbx_box_sweep(sbx_box *b, bool thorough, sbx_sweep_cb cb, void *ud)
{
    sweep_with(b, (b->measure ? SUP_SWEEP_MEASURE : 0) | (thorough ? SUP_SWEEP_THOROUGH : 0), cb,
               ud);
}

void sbx_box_quiesce(sbx_box *b, sbx_sweep_cb cb, void *ud)
{
    sweep_with(b, SUP_SWEEP_THOROUGH | SUP_SWEEP_KERNELS, cb, ud);
}

static void on_frozen(sbx_box *b, bool ok)
{
    void (*cb)(void *, bool) = b->freeze_cb;
    b->freeze_cb = NULL;
    b->freezing = false;
    if (cb)
        cb(b->freeze_ud, ok);
    if (b->state == B_CLOSING)
        close_continue(b); /* a close waited for the freeze */
}

/* One freeze or thaw at a time per box (the session's turn serializes them). */
void sbx_box_freeze(sbx_box *b, bool frozen, void (*cb)(void *ud, bool ok), void *ud)
{
    b->freezing = true;
    b->freeze_cb = cb;
    b->freeze_ud = ud;
    b->ops->freeze(b->bk, b, frozen, on_frozen);
}

/* ---------------------------------------------------------------- closing */

static void box_free(sbx_box *b)
{
    ev_timer_stop(b->loop, &b->fail_now);
    ev_timer_stop(b->loop, &b->close_bound);
    stop_link(b);
    if (b->err_fd >= 0) {
        ev_io_stop(b->loop, &b->err_io);
        close(b->err_fd);
    }
    sbx_watch_cancel(b->watch);
    for (int l = SUP_LANG_JS; l <= SUP_LANG_PY; l++)
        lane_close(b, l);
    if (b->host_io) {
        rmdir(b->host_io);
        free(b->host_io);
    }
    free(b->snippet.out.data);
    free(b->snippet.err.data);
    for (char **a = b->argv; a && *a; a++)
        free(*a);
    free(b->argv);
    free(b->wq);
    free(b->rq);
    free(b->id);
    free(b->dead_why);
    free(b);
}

static void on_cleaned(sbx_box *b)
{
    sbx_box_done_cb cb = b->close_cb;
    void *ud = b->close_ud;
    box_free(b);
    if (cb)
        cb(ud);
}

/* Runs whenever something the close waits for happened. */
static void close_continue(sbx_box *b)
{
    for (int l = SUP_LANG_JS; l <= SUP_LANG_PY; l++)
        if (b->lane[l].op.active)
            return; /* fail_now completes them first */
    if (b->snippet.active || b->sweeping || b->freezing)
        return;
    if (!b->closing_started) {
        b->closing_started = true;
        stop_link(b); /* EOF: the supervisor kills everything and exits */
        if (!b->exited)
            ev_timer_start(b->loop, &b->close_bound);
    }
    if (!b->exited || b->cleaning)
        return;
    b->cleaning = true; /* once: several events may bring the close here */
    ev_timer_stop(b->loop, &b->close_bound);
    b->ops->cleanup(b->bk, b, on_cleaned);
}

static void on_close_bound(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    sbx_box *b = w->data;
    sbx_log("sandbox %s did not end within %.0f s of being closed; killing it", b->id,
            CLOSE_BOUND_S);
    b->ops->force_kill(b->bk, b); /* the watch reports the exit */
}

void sbx_box_close(sbx_box *b, sbx_box_done_cb cb, void *ud)
{
    b->close_cb = cb;
    b->close_ud = ud;
    b->state = B_CLOSING;
    if (!b->dead_why)
        b->dead_why = sbx_xstrdup("the session ended while the call ran");
    b->dead = true;
    ev_timer_start(b->loop, &b->fail_now); /* completes what is in flight, then goes on */
}

void sbx_box_destroy_sync(sbx_box *b)
{
    stop_link(b); /* EOF: the supervisor ends the sandbox; forced after a bound */
    if (!b->exited) {
        sbx_watch_cancel(b->watch);
        b->watch = NULL;
        if (sbx_wait_bounded(b->pid, 2.0) == -1)
            b->ops->force_kill(b->bk, b);
        b->exited = true;
    }
    b->ops->cleanup_sync(b->bk, b);
    box_free(b);
}

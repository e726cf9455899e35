/*
 * wiretap.c — see wiretap.h.  Blocking sockets, one thread per connection; stop wakes
 * every thread by shutting its sockets down (never a timeout).
 */
#include "wiretap.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct worker_arg {
    wiretap *t;
    int fd;
} worker_arg;

static void append(char **buf, size_t *len, const char *p, size_t n)
{
    char *nb = realloc(*buf, *len + n + 1);
    if (!nb)
        return;
    memcpy(nb + *len, p, n);
    *len += n;
    nb[*len] = '\0';
    *buf = nb;
}

static void log_bytes(wiretap *t, bool sent, const char *p, size_t n)
{
    pthread_mutex_lock(&t->mu);
    if (sent)
        append(&t->sent, &t->sent_len, p, n);
    else
        append(&t->answered, &t->answered_len, p, n);
    pthread_mutex_unlock(&t->mu);
}

static int track(wiretap *t, int fd)
{
    pthread_mutex_lock(&t->mu);
    int slot = -1;
    for (int i = 0; i < t->n_fds; i++)
        if (t->fds[i] < 0) {
            slot = i;
            break;
        }
    if (slot < 0 && t->n_fds < 2 * WIRETAP_MAX_CONNS)
        slot = t->n_fds++;
    if (slot >= 0)
        t->fds[slot] = fd;
    bool stopped = !t->running;
    pthread_mutex_unlock(&t->mu);
    if (stopped)
        shutdown(fd, SHUT_RDWR);
    return slot;
}

static void untrack_close(wiretap *t, int slot, int fd)
{
    pthread_mutex_lock(&t->mu);
    if (slot >= 0)
        t->fds[slot] = -1;
    pthread_mutex_unlock(&t->mu);
    close(fd);
}

static bool write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* The value of header `name` in a header block (up to `end`), copied into out. */
static bool header_value(const char *head, const char *end, const char *name, char *out,
                         size_t cap)
{
    size_t nl = strlen(name);
    for (const char *line = strstr(head, "\r\n"); line && line < end; line = strstr(line, "\r\n")) {
        line += 2;
        if ((size_t)(end - line) > nl && strncasecmp(line, name, nl) == 0 && line[nl] == ':') {
            const char *v = line + nl + 1;
            while (*v == ' ' || *v == '\t')
                v++;
            const char *e = strstr(v, "\r\n");
            size_t vl = e ? (size_t)(e - v) : strlen(v);
            if (vl >= cap)
                vl = cap - 1;
            memcpy(out, v, vl);
            out[vl] = '\0';
            return true;
        }
    }
    return false;
}

static void canned_conn(wiretap *t, int fd)
{
    char *buf = NULL;
    size_t len = 0;
    char chunk[16384];
    for (;;) {
        char *hend = buf ? strstr(buf, "\r\n\r\n") : NULL;
        if (hend) {
            char cl[32] = "0";
            header_value(buf, hend + 2, "Content-Length", cl, sizeof cl);
            size_t need = (size_t)(hend + 4 - buf) + (size_t)strtoul(cl, NULL, 10);
            if (len >= need) {
                log_bytes(t, true, buf, need);
                char id[80] = "";
                header_value(buf, hend + 2, "Plimsoll-Request-Id", id, sizeof id);
                pthread_mutex_lock(&t->mu);
                const char *body = t->body ? t->body : "";
                char *ans = NULL;
                size_t alen = 0;
                char line[256];
                int n = snprintf(line, sizeof line, "HTTP/1.1 %d X\r\nContent-Length: %zu\r\n",
                                 t->status, strlen(body));
                append(&ans, &alen, line, (size_t)n);
                if (t->echo_id && id[0]) {
                    n = snprintf(line, sizeof line, "Plimsoll-Request-Id: %s\r\n", id);
                    append(&ans, &alen, line, (size_t)n);
                }
                if (t->extra_headers)
                    append(&ans, &alen, t->extra_headers, strlen(t->extra_headers));
                append(&ans, &alen, "\r\n", 2);
                append(&ans, &alen, body, strlen(body));
                pthread_mutex_unlock(&t->mu);
                log_bytes(t, false, ans, alen);
                bool ok = write_all(fd, ans, alen);
                free(ans);
                if (!ok)
                    break;
                memmove(buf, buf + need, len - need);
                len -= need;
                buf[len] = '\0';
                continue;
            }
        }
        ssize_t r = recv(fd, chunk, sizeof chunk, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        append(&buf, &len, chunk, (size_t)r);
    }
    free(buf);
}

static void relay_conn(wiretap *t, int fd)
{
    int up = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)t->upstream_port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (up < 0)
        return;
    int slot = track(t, up);
    if (connect(up, (struct sockaddr *)&a, sizeof a) != 0) {
        untrack_close(t, slot, up);
        return;
    }
    char chunk[65536];
    for (;;) {
        struct pollfd p[2] = {{fd, POLLIN, 0}, {up, POLLIN, 0}};
        int rc = poll(p, 2, -1);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc < 0)
            break;
        bool done = false;
        for (int i = 0; i < 2 && !done; i++) {
            if (!p[i].revents)
                continue;
            ssize_t r = recv(p[i].fd, chunk, sizeof chunk, 0);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                done = true;
                break;
            }
            log_bytes(t, i == 0, chunk, (size_t)r);
            if (!write_all(i == 0 ? up : fd, chunk, (size_t)r))
                done = true;
        }
        if (done)
            break;
    }
    untrack_close(t, slot, up);
}

static void *worker(void *ud)
{
    worker_arg *w = ud;
    wiretap *t = w->t;
    int fd = w->fd;
    free(w);
    int slot = track(t, fd);
    if (t->upstream_port)
        relay_conn(t, fd);
    else
        canned_conn(t, fd);
    untrack_close(t, slot, fd);
    return NULL;
}

static void *acceptor(void *ud)
{
    wiretap *t = ud;
    for (;;) {
        int fd = accept4(t->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            break;
        }
        pthread_mutex_lock(&t->mu);
        bool room = t->running && t->n_workers < WIRETAP_MAX_CONNS;
        if (room)
            t->conns++;
        pthread_mutex_unlock(&t->mu);
        worker_arg *w = room ? malloc(sizeof *w) : NULL;
        if (!w) {
            close(fd);
            continue;
        }
        w->t = t;
        w->fd = fd;
        pthread_mutex_lock(&t->mu);
        if (pthread_create(&t->workers[t->n_workers], NULL, worker, w) == 0)
            t->n_workers++;
        else {
            close(fd);
            free(w);
        }
        pthread_mutex_unlock(&t->mu);
    }
    return NULL;
}

static int start(wiretap *t)
{
    pthread_mutex_init(&t->mu, NULL);
    t->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    if (t->listen_fd < 0 || bind(t->listen_fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(t->listen_fd, 64) != 0 ||
        getsockname(t->listen_fd, (struct sockaddr *)&a, &alen) != 0) {
        fprintf(stderr, "wiretap: cannot listen: %s\n", strerror(errno));
        if (t->listen_fd >= 0)
            close(t->listen_fd);
        t->listen_fd = -1;
        return -1;
    }
    t->port = ntohs(a.sin_port);
    snprintf(t->url, sizeof t->url, "http://127.0.0.1:%u", t->port);
    t->running = true;
    if (pthread_create(&t->acceptor, NULL, acceptor, t) != 0) {
        close(t->listen_fd);
        t->listen_fd = -1;
        t->running = false;
        return -1;
    }
    return 0;
}

int wiretap_relay(wiretap *t, unsigned upstream_port)
{
    memset(t, 0, sizeof *t);
    t->upstream_port = upstream_port;
    return start(t);
}

int wiretap_canned(wiretap *t, int status, const char *extra_headers, const char *body,
                   bool echo_id)
{
    memset(t, 0, sizeof *t);
    wiretap_set_answer(t, status, extra_headers, body, echo_id);
    return start(t);
}

void wiretap_set_answer(wiretap *t, int status, const char *extra_headers, const char *body,
                        bool echo_id)
{
    if (t->running)
        pthread_mutex_lock(&t->mu);
    free(t->extra_headers);
    free(t->body);
    t->status = status;
    t->extra_headers = extra_headers ? strdup(extra_headers) : NULL;
    t->body = strdup(body ? body : "");
    t->echo_id = echo_id;
    if (t->running)
        pthread_mutex_unlock(&t->mu);
}

void wiretap_stop(wiretap *t)
{
    if (t->listen_fd < 0 || !t->running)
        return;
    pthread_mutex_lock(&t->mu);
    t->running = false;
    pthread_mutex_unlock(&t->mu);
    shutdown(t->listen_fd, SHUT_RDWR); /* wakes accept() */
    pthread_join(t->acceptor, NULL);
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < t->n_fds; i++)
        if (t->fds[i] >= 0)
            shutdown(t->fds[i], SHUT_RDWR);
    pthread_mutex_unlock(&t->mu);
    for (int i = 0; i < t->n_workers; i++)
        pthread_join(t->workers[i], NULL);
    close(t->listen_fd);
    t->listen_fd = -1;
    pthread_mutex_destroy(&t->mu);
    free(t->extra_headers);
    free(t->body);
    free(t->sent);
    free(t->answered);
    t->extra_headers = t->body = t->sent = t->answered = NULL;
}

void wiretap_clear(wiretap *t)
{
    pthread_mutex_lock(&t->mu);
    free(t->sent);
    free(t->answered);
    t->sent = t->answered = NULL;
    t->sent_len = t->answered_len = 0;
    t->conns = 0;
    pthread_mutex_unlock(&t->mu);
}

int wiretap_connections(wiretap *t)
{
    pthread_mutex_lock(&t->mu);
    int n = t->conns;
    pthread_mutex_unlock(&t->mu);
    return n;
}

char *wiretap_sent(wiretap *t)
{
    pthread_mutex_lock(&t->mu);
    char *s = strdup(t->sent ? t->sent : "");
    pthread_mutex_unlock(&t->mu);
    return s;
}

char *wiretap_answered(wiretap *t)
{
    pthread_mutex_lock(&t->mu);
    char *s = strdup(t->answered ? t->answered : "");
    pthread_mutex_unlock(&t->mu);
    return s;
}

unsigned wiretap_port_of(const char *url)
{
    unsigned port = 0;
    if (sscanf(url, "http://127.0.0.1:%u", &port) != 1)
        return 0;
    return port;
}

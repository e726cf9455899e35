/*
 * flood.c — see flood.h.
 */
#include "flood.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static const char partial[] =
    "POST /plimsoll.v1.SandboxService/Describe HTTP/1.1\r\nHost: 127.0.0.1\r\n";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

void flood_raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

int flood_open(flood *f, unsigned port, size_t n)
{
    f->fds = calloc(n, sizeof *f->fds);
    f->n = 0;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (size_t i = 0; i < n; i++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
            fprintf(stderr, "flood: connection %zu of %zu: %s\n", i + 1, n, strerror(errno));
            if (fd >= 0)
                close(fd);
            flood_close(f);
            return -1;
        }
        if (i % 2 && send(fd, partial, sizeof partial - 1, MSG_NOSIGNAL) < 0) {
            fprintf(stderr, "flood: send on connection %zu: %s\n", i + 1, strerror(errno));
            close(fd);
            flood_close(f);
            return -1;
        }
        f->fds[f->n++] = fd;
    }
    return 0;
}

/* Closed by the server: EOF or an error (a reset) on read. */
static int server_closed(int fd)
{
    char buf[512];
    ssize_t r = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r == 0)
        return 1;
    if (r < 0)
        return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
    return 0; /* an answer (a refusal): not closed yet */
}

size_t flood_closed(const flood *f, double seconds)
{
    char *closed = calloc(f->n ? f->n : 1, 1);
    struct pollfd *p = calloc(f->n ? f->n : 1, sizeof *p);
    size_t n_closed = 0;
    double deadline = now_s() + seconds;
    for (;;) {
        size_t k = 0;
        for (size_t i = 0; i < f->n; i++)
            if (!closed[i])
                p[k++] = (struct pollfd){.fd = f->fds[i], .events = POLLIN | POLLRDHUP};
        double left = deadline - now_s();
        if (k == 0 || left <= 0)
            break;
        int rc = poll(p, k, (int)(left * 1000) + 1);
        if (rc < 0 && errno != EINTR)
            break;
        for (size_t i = 0, j = 0; i < f->n && rc > 0; i++) {
            if (closed[i])
                continue;
            if (p[j].revents && server_closed(f->fds[i])) {
                closed[i] = 1;
                n_closed++;
            }
            j++;
        }
    }
    free(p);
    free(closed);
    return n_closed;
}

void flood_close(flood *f)
{
    for (size_t i = 0; i < f->n; i++)
        close(f->fds[i]);
    free(f->fds);
    f->fds = NULL;
    f->n = 0;
}

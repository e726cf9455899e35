/*
 * listen.c — see listen.h.
 */
#include "listen.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void say(char **why, const char *fmt, const char *a, const char *b)
{
    if (asprintf(why, fmt, a, b) < 0)
        *why = NULL;
}

int httpd_listen(const char *host, const char *port, int backlog, unsigned *bound_port,
                 char **why)
{
    /* getaddrinfo takes any number and keeps its low 16 bits (65617 is port 81) */
    size_t digits = strspn(port, "0123456789");
    if (!digits || port[digits] || digits > 5 || atol(port) > 65535) {
        say(why, "cannot listen on %s:%s: the port must be a number from 0 to 65535", host,
            port);
        return -1;
    }
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0) {
        say(why, "cannot resolve %s: %s", host, gai_strerror(rc));
        return -1;
    }
    int fd = -1, last_errno = 0;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (fd < 0) {
            last_errno = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, backlog) != 0) {
            last_errno = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        char where[320];
        snprintf(where, sizeof where, "%s:%s", host, port);
        say(why, "cannot listen on %s: %s", where, strerror(last_errno));
        return -1;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    *bound_port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                 : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

int httpd_listen_spec(const char *spec, const char *flag, int backlog, unsigned *bound_port,
                      char **why)
{
    char host[256];
    const char *colon = strrchr(spec, ':');
    if (!colon || colon == spec || (size_t)(colon - spec) >= sizeof host || !colon[1]) {
        say(why, "%s needs HOST:PORT, not %s", flag, spec);
        return -1;
    }
    memcpy(host, spec, (size_t)(colon - spec));
    host[colon - spec] = '\0';
    size_t n = strlen(host);
    if (n >= 2 && host[0] == '[' && host[n - 1] == ']') {
        memmove(host, host + 1, n - 2);
        host[n - 2] = '\0';
    }
    return httpd_listen(host, colon + 1, backlog, bound_port, why);
}

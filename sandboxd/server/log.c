/*
 * log.c — timestamped log lines on stderr, each written with one call so lines from
 * one process never interleave mid-line.
 */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

void sbx_log(const char *fmt, ...)
{
    char line[1024];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(line, sizeof line, "%Y-%m-%dT%H:%M:%S", &tm);
    n += (size_t)snprintf(line + n, sizeof line - n, ".%03ldZ sandboxd: ", ts.tv_nsec / 1000000);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - n, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    n = (size_t)m + n >= sizeof line - 1 ? sizeof line - 2 : n + (size_t)m;
    line[n++] = '\n';
    fwrite(line, 1, n, stderr);
}

/*
 * launch.h — start a test server process and wait for its "listening URL" line; read
 * what /proc says of a process.
 */
#ifndef TESTS_LAUNCH_H
#define TESTS_LAUNCH_H

#include <stddef.h>
#include <sys/types.h>

/* Starts argv (argv[0] is the program), reads its stdout until a line
 * "listening <url>" (bounded by a 10 s poll, no sleeps), copies <url> into `url`.
 * Returns the pid, or -1 with a message on stderr. */
pid_t spawn_listening(char *const argv[], char *url, size_t url_len);
/* SIGTERM, then SIGKILL after 5 s; reaps the child. */
void spawn_stop(pid_t pid);
/* The number after `label` on its line of /proc/PID/FILE ("status", "limits"; pid 0:
 * this process), or 0 if there is none. */
unsigned long proc_number(pid_t pid, const char *file, const char *label);

#endif

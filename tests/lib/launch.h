/*
 * launch.h — start a test server process and wait for its "listening URL" line.
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

#endif

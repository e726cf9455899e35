/*
 * log.h — one line per event on stderr.
 *
 * Callers never pass a token or a session id: sessions are named by the first 12 hex
 * digits of their fingerprint, callers by the first 12 of their principal.
 */
#ifndef SBX_LOG_H
#define SBX_LOG_H

void sbx_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif

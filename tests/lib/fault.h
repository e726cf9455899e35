/*
 * fault.h — drive tests/faultproxy.py from C tests.
 */
#ifndef TESTS_FAULT_H
#define TESTS_FAULT_H

#include <sys/types.h>

typedef struct fault_proxy {
    pid_t pid;
    char url[128];
} fault_proxy;

/* Starts the proxy in front of `upstream`.  Returns 0 or -1. */
int fault_start(fault_proxy *p, const char *upstream);
/* The same proxy serving HTTPS with the given certificate and key files. */
int fault_start_tls(fault_proxy *p, const char *upstream, const char *cert, const char *key);
void fault_stop(fault_proxy *p);
/* Arms a fault: `spec` is the control JSON, e.g. {"mode":"drop_record","rpc":"Run"}. */
int fault_arm(fault_proxy *p, const char *spec);
int fault_reset(fault_proxy *p);
/* How many requests of `rpc` the proxy really forwarded to the daemon. */
long fault_forwarded(fault_proxy *p, const char *rpc);

/* A plain HTTP POST/GET helper: returns the status, body in *body (malloc'd). */
long http_call(const char *method, const char *url, const char *body, char **out);

#endif

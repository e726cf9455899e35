/*
 * seccomp.h — the bubblewrap sandbox's system-call filter (see seccomp.c).
 */
#ifndef SBX_SECCOMP_H
#define SBX_SECCOMP_H

#include <stddef.h>

/* Installs the filter on the calling process (inherited by its children; needs
 * no_new_privs or CAP_SYS_ADMIN).  Returns 0, or -1 with a reason in `why`. */
int sbx_seccomp_install(char *why, size_t why_len);

#endif

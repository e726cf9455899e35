/*
 * random.h — bytes from OpenSSL's generator for ids made per request: the client's
 * Plimsoll-Request-Id (docs/wire.md §2) and sandboxd's cell nonces.  Internal: not part
 * of plimsoll.h, not installed; exported from libplimsoll like idmap.h, so the project
 * has one.
 *
 * Why not RAND_bytes itself each time: a call of it costs about 9 000 instructions and a
 * getpid() system call (its check for a fork), a sixth of what the client spends on a
 * small verified cell besides hashing.  The bytes are drawn from RAND_bytes a kilobyte
 * at a time instead and handed out in order, each byte once.
 *
 * Fork: the pool lives in a page marked MADV_WIPEONFORK, so a child starts with it
 * empty and draws afresh from RAND_bytes, which reseeds in a new process: a parent and
 * its child never hand out the same bytes.  Where the kernel has no MADV_WIPEONFORK
 * (before Linux 4.14), every call goes to RAND_bytes.
 *
 * Threads: any; the pool is shared under a mutex kept in the same page.
 * Errors: false when OpenSSL's generator fails (then nothing is written), or n > 64.
 */
#ifndef PLIMSOLL_RANDOM_H
#define PLIMSOLL_RANDOM_H

#include <stdbool.h>
#include <stddef.h>

#define PLM_RANDOM_MAX 64          /* bytes one call may take */

bool plm_random_bytes(void *out, size_t n);

#endif

/*
 * random.c — OpenSSL's random bytes, drawn a kilobyte at a time (random.h says why).
 */
#include "random.h"

#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <openssl/rand.h>

#define POOL_BYTES 1024

/* Everything in one page that a fork hands to the child zeroed: the fill level 0 means
 * empty, and a zeroed mutex is an unlocked one, so a child never inherits a lock some
 * other thread of its parent held. */
typedef struct pool {
    pthread_mutex_t lock;
    size_t left;                  /* unused bytes at the end of bytes[] */
    unsigned char bytes[POOL_BYTES];
} pool;

static pool *shared;              /* NULL: no page that is wiped on fork; no pool */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void make_pool(void)
{
    long page = sysconf(_SC_PAGESIZE);
    if (page < (long)sizeof(pool))
        return;
    void *p = mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (p == MAP_FAILED)
        return;
#ifdef MADV_WIPEONFORK
    if (madvise(p, (size_t)page, MADV_WIPEONFORK) == 0) {
        shared = p;               /* mmap gave it zeroed: an empty pool, unlocked */
        return;
    }
#endif
    munmap(p, (size_t)page);
}

bool plm_random_bytes(void *out, size_t n)
{
    if (n > PLM_RANDOM_MAX)
        return false;
    pthread_once(&once, make_pool);
    pool *p = shared;
    if (!p)
        return RAND_bytes(out, (int)n) == 1;
    pthread_mutex_lock(&p->lock);
    if (p->left < n) {
        if (RAND_bytes(p->bytes, POOL_BYTES) != 1) {
            p->left = 0;
            pthread_mutex_unlock(&p->lock);
            return false;
        }
        p->left = POOL_BYTES;
    }
    unsigned char *at = p->bytes + POOL_BYTES - p->left;
    memcpy(out, at, n);
    memset(at, 0, n);             /* handed out: not kept where a later leak could show it */
    p->left -= n;
    pthread_mutex_unlock(&p->lock);
    return true;
}

/*
 * idmap.c — the one hash table for id lookups (idmap.h).
 */
#include "idmap.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define FIRST_SIZE 16

/* FNV-1a from a per-map seed, then a 64-bit finaliser (MurmurHash3's fmix64) so that
 * the low bits, which pick the bucket, depend on every byte. */
static uint64_t hash_key(uint64_t seed, const char *key)
{
    uint64_t h = seed ^ 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

void plm_idmap_init(plm_idmap *m)
{
    memset(m, 0, sizeof *m);
    /* A seed nobody outside knows; without the kernel's randomness, still a different
     * one per map (its address), which is weaker but never fails. */
    if (getrandom(&m->seed, sizeof m->seed, GRND_NONBLOCK) != sizeof m->seed)
        m->seed = (uint64_t)(uintptr_t)m * 0x9e3779b97f4a7c15ull;
}

void plm_idmap_free(plm_idmap *m)
{
    free(m->buckets);
    m->buckets = NULL;
    m->size = m->count = 0;
}

static bool resize(plm_idmap *m, size_t size)
{
    plm_idmap_node **b = calloc(size, sizeof *b);
    if (!b)
        return false;
    for (size_t i = 0; i < m->size; i++)
        for (plm_idmap_node *n = m->buckets[i], *next; n; n = next) {
            next = n->next;
            plm_idmap_node **slot = &b[n->hash & (size - 1)];
            n->next = *slot;
            *slot = n;
        }
    free(m->buckets);
    m->buckets = b;
    m->size = size;
    return true;
}

bool plm_idmap_put(plm_idmap *m, plm_idmap_node *n)
{
    if (m->count >= m->size && !resize(m, m->size ? 2 * m->size : FIRST_SIZE) && !m->size)
        return false;           /* (a failed doubling keeps the map as it is: still works) */
    n->hash = hash_key(m->seed, n->key);
    plm_idmap_node **slot = &m->buckets[n->hash & (m->size - 1)];
    n->next = *slot;
    *slot = n;
    m->count++;
    return true;
}

plm_idmap_node *plm_idmap_get(const plm_idmap *m, const char *key)
{
    if (!m->count)
        return NULL;
    uint64_t h = hash_key(m->seed, key);
    for (plm_idmap_node *n = m->buckets[h & (m->size - 1)]; n; n = n->next)
        if (n->hash == h && strcmp(n->key, key) == 0)
            return n;
    return NULL;
}

void plm_idmap_remove(plm_idmap *m, plm_idmap_node *n)
{
    for (plm_idmap_node **pp = &m->buckets[n->hash & (m->size - 1)]; *pp; pp = &(*pp)->next)
        if (*pp == n) {
            *pp = n->next;
            n->next = NULL;
            m->count--;
            return;
        }
}

void plm_idmap_each(plm_idmap *m, void (*fn)(void *ud, plm_idmap_node *n), void *ud)
{
    for (size_t i = 0; i < m->size; i++)
        for (plm_idmap_node *n = m->buckets[i], *next; n; n = next) {
            next = n->next;
            fn(ud, n);
        }
}

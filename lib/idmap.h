/*
 * idmap.h — the one hash table for id lookups: libplimsoll's sandbox map
 * (sandboxes.c), berth's conversations by public id (runtime/faces/serve.c) and by run
 * id (runtime/core/agent.c), and its owners by run id (runtime/core/natives.c).
 * Internal: not part of plimsoll.h, not installed; exported from libplimsoll like
 * curl_ev.h, so the project has one.
 *
 * Intrusive, as libev's watchers are: the caller embeds a plm_idmap_node in its own
 * struct, sets the node's key (a NUL-terminated string the struct owns, unchanged while
 * the node is in a map) and finds the struct again from the node (PLM_IDMAP_OWNER).
 * The map owns no entry and copies no key.  Keys are hashed with a seed drawn per map,
 * so ids a peer chooses (a caller's userId) cannot be picked to share a bucket without
 * knowing it; the table doubles past one entry per bucket, so chains stay short.
 *
 * Threads: none of its own; a map is used from one thread at a time.  Errors: only
 * out of memory, in plm_idmap_put (the map is then unchanged).
 */
#ifndef PLIMSOLL_IDMAP_H
#define PLIMSOLL_IDMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct plm_idmap_node {
    struct plm_idmap_node *next;   /* in its bucket */
    const char *key;               /* set by the caller before plm_idmap_put */
    uint64_t hash;
} plm_idmap_node;

typedef struct plm_idmap {
    plm_idmap_node **buckets;      /* NULL until the first put */
    size_t size;                   /* buckets: 0 or a power of two */
    size_t count;
    uint64_t seed;
} plm_idmap;

/* The struct of type `type` whose member `member` is the node `n`. */
#define PLM_IDMAP_OWNER(n, type, member) ((type *)(void *)((char *)(n) - offsetof(type, member)))

/* An empty map (no allocation yet). */
void plm_idmap_init(plm_idmap *m);
/* Frees the buckets, not the entries; the map is empty again. */
void plm_idmap_free(plm_idmap *m);
/* Adds the node under n->key.  A key may be added once: the caller looks it up first.
 * false (the map unchanged) when out of memory. */
bool plm_idmap_put(plm_idmap *m, plm_idmap_node *n);
/* The node whose key is `key`, or NULL. */
plm_idmap_node *plm_idmap_get(const plm_idmap *m, const char *key);
/* Removes a node that is in the map. */
void plm_idmap_remove(plm_idmap *m, plm_idmap_node *n);
/* Visits every node (in no order); fn may remove the node it is given, no other. */
void plm_idmap_each(plm_idmap *m, void (*fn)(void *ud, plm_idmap_node *n), void *ud);

#endif

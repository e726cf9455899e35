/*
 * store_memory.c — the "memory" engine: everything in this process, gone with it.
 * For tests and `berth replay`; the reference behaviour the SQL engines match
 * (tests/test_store.c runs the same cases against each).
 */
#include "store_engine.h"
#include "xalloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An event, with the message id of a "user" event beside it (the SQL engines' column). */
typedef struct mevent {
  berth_store_event e;
  char *message_id;              /* or NULL */
} mevent;

typedef struct mconv {
  struct mconv *hnext;
  bool has_record;               /* messages or events may come before the record */
  berth_store_conv r;             /* r.lease_holder, r.lease_expiry_ms: the lease */
  char **msgs;
  size_t n_msgs, cap_msgs;
  mevent *evs;
  size_t n_evs, cap_evs;
} mconv;

typedef struct mem {
  mconv **table;
  size_t size, count;
  uint64_t next_order;
} mem;

static size_t hash_id(const char *id)
{
  size_t h = 14695981039346656037ULL;
  for (; *id; id++)
    h = (h ^ (unsigned char)*id) * 1099511628211ULL;
  return h;
}

static mconv *find(mem *m, const char *id)
{
  for (mconv *c = m->table[hash_id(id) & (m->size - 1)]; c; c = c->hnext)
    if (!strcmp(c->r.id, id))
      return c;
  return NULL;
}

static void grow(mem *m)
{
  size_t size = m->size * 2;
  mconv **t = berth_xcalloc(size, sizeof *t);
  for (size_t i = 0; i < m->size; i++)
    for (mconv *c = m->table[i], *next; c; c = next) {
      next = c->hnext;
      size_t b = hash_id(c->r.id) & (size - 1);
      c->hnext = t[b];
      t[b] = c;
    }
  free(m->table);
  m->table = t;
  m->size = size;
}

static mconv *find_or_add(mem *m, const char *id)
{
  mconv *c = find(m, id);
  if (c)
    return c;
  if (m->count + 1 > m->size / 2)
    grow(m);
  c = berth_xcalloc(1, sizeof *c);
  c->r.id = berth_xstrdup(id);
  size_t b = hash_id(id) & (m->size - 1);
  c->hnext = m->table[b];
  m->table[b] = c;
  m->count++;
  return c;
}

static berth_error *mem_open(berth_store *s, const char *where)
{
  (void)where;
  mem *m = berth_xcalloc(1, sizeof *m);
  m->size = 256;
  m->table = berth_xcalloc(m->size, sizeof *m->table);
  s->engine = m;
  return NULL;
}

static void mem_close(berth_store *s)
{
  mem *m = s->engine;
  for (size_t i = 0; i < m->size; i++)
    for (mconv *c = m->table[i], *next; c; c = next) {
      next = c->hnext;
      berth_store_conv_clear(&c->r);
      berth_store_texts_free(c->msgs, c->n_msgs);
      for (size_t j = 0; j < c->n_evs; j++) {
        free(c->evs[j].e.kind);
        free(c->evs[j].e.data);
        free(c->evs[j].message_id);
      }
      free(c->evs);
      free(c);
    }
  free(m->table);
  free(m);
}

/* The fence (store.h): a stored conversation whose lease `fence` does not hold. */
static bool fenced_off(const mconv *c, const char *fence)
{
  return fence && c && c->has_record &&
         (!c->r.lease_holder || strcmp(c->r.lease_holder, fence) != 0);
}

/* false when not applied: older than the stored record, or fenced off */
static bool put_conv(mem *m, const berth_store_conv *r, const char *fence)
{
  mconv *c = find_or_add(m, r->id);
  if (c->has_record && (c->r.turns > r->turns || c->r.last_event > r->last_event))
    return false;               /* a record never goes back (store.h) */
  if (fenced_off(c, fence))
    return false;
  uint64_t order = c->has_record ? c->r.order : ++m->next_order;
  char *holder = c->r.lease_holder;      /* a record's write leaves the lease alone */
  int64_t expiry = c->r.lease_expiry_ms;
  c->r.lease_holder = NULL;
  berth_store_conv_clear(&c->r);
  berth_store_conv_copy(&c->r, r);
  free(c->r.lease_holder);
  c->r.lease_holder = holder;
  c->r.lease_expiry_ms = expiry;
  c->r.order = order;
  c->has_record = true;
  return true;
}

static bool put_messages(mem *m, const store_op *op, const char *fence)
{
  mconv *c = find_or_add(m, op->id);
  if (fenced_off(c, fence))
    return false;
  if (op->replace) {
    for (size_t i = 0; i < c->n_msgs; i++)
      free(c->msgs[i]);
    c->n_msgs = 0;
  }
  size_t end = op->first + op->n;
  if (end > c->cap_msgs) {
    c->cap_msgs = end * 2;
    c->msgs = berth_xrealloc(c->msgs, c->cap_msgs * sizeof *c->msgs);
  }
  for (size_t i = c->n_msgs; i < end; i++)
    c->msgs[i] = NULL;
  for (size_t i = 0; i < op->n; i++) {
    free(c->msgs[op->first + i]);
    c->msgs[op->first + i] = berth_xstrdup(op->texts[i]);
  }
  if (end > c->n_msgs)
    c->n_msgs = end;
  for (size_t i = 0; i < c->n_msgs; i++)   /* (no gaps: a missing one reads as null) */
    if (!c->msgs[i])
      c->msgs[i] = berth_xstrdup("null");
  return true;
}

static bool put_event(mem *m, const store_op *op, const char *fence)
{
  mconv *c = find_or_add(m, op->id);
  if (fenced_off(c, fence))
    return false;
  mevent *e = NULL;
  if (c->n_evs && c->evs[c->n_evs - 1].e.seq >= op->seq) {
    for (size_t i = 0; i < c->n_evs; i++)
      if (c->evs[i].e.seq == op->seq)
        e = &c->evs[i];
  }
  if (!e) {
    if (c->n_evs == c->cap_evs) {
      c->cap_evs = c->cap_evs ? 2 * c->cap_evs : 16;
      c->evs = berth_xrealloc(c->evs, c->cap_evs * sizeof *c->evs);
    }
    e = &c->evs[c->n_evs++];
    memset(e, 0, sizeof *e);
  }
  free(e->e.kind);
  free(e->e.data);
  free(e->message_id);          /* replaced whole, its id too */
  e->e.seq = op->seq;
  e->e.turn = op->turn;
  e->e.kind = berth_xstrdup(op->ev_kind);
  e->e.data = berth_xstrdup(op->data);
  e->message_id = op->message_id ? berth_xstrdup(op->message_id) : NULL;
  return true;
}

static void set_lease(mconv *c, const char *holder, int64_t expiry_ms)
{
  free(c->r.lease_holder);
  c->r.lease_holder = holder ? berth_xstrdup(holder) : NULL;
  c->r.lease_expiry_ms = expiry_ms;
}

static void lease_take(mem *m, store_op *op)
{
  mconv *c = find(m, op->id);
  berth_store_lease *l = &op->lease;
  memset(l, 0, sizeof *l);
  if (!c || !c->has_record)
    return;
  int64_t now = berth_store_now_ms();
  if (berth_lease_free_for(c->r.lease_holder, c->r.lease_expiry_ms, op->host, now))
    set_lease(c, op->host, now + op->ttl_ms);
  l->found = true;
  l->taken = c->r.lease_holder && !strcmp(c->r.lease_holder, op->host);
  snprintf(l->holder, sizeof l->holder, "%s", c->r.lease_holder ? c->r.lease_holder : "");
  l->expiry_ms = c->r.lease_expiry_ms;
  l->turns = c->r.turns;
  l->running_turn = c->r.running_turn;
  l->last_event = c->r.last_event;
}

/* Renew, release and clear: over every conversation (renew, clear) or one. */
static void lease_update(mem *m, const store_op *op)
{
  if (op->kind == OP_LEASE_RELEASE) {
    mconv *c = find(m, op->id);
    if (c && c->r.lease_holder && !strcmp(c->r.lease_holder, op->host))
      set_lease(c, NULL, 0);
    return;
  }
  int64_t now = berth_store_now_ms();
  for (size_t i = 0; i < m->size; i++)
    for (mconv *c = m->table[i]; c; c = c->hnext) {
      if (!c->r.lease_holder)
        continue;
      if (op->kind == OP_LEASE_CLEAR)
        set_lease(c, NULL, 0);
      else if (!strcmp(c->r.lease_holder, op->host))
        c->r.lease_expiry_ms = now + op->ttl_ms;
    }
}

static void mem_apply(berth_store *s, berth_store_batch *b)
{
  mem *m = s->engine;
  const char *fence = s->fence;
  for (store_op *op = b->ops; op; op = op->next)
    switch (op->kind) {
      case OP_PUT_CONV: op->fenced = !put_conv(m, &op->conv, fence) && fence; break;
      case OP_PUT_MESSAGES: op->fenced = !put_messages(m, op, fence); break;
      case OP_PUT_EVENT: op->fenced = !put_event(m, op, fence); break;
      case OP_LEASE_TAKE: lease_take(m, op); break;
      case OP_LEASE_RENEW:
      case OP_LEASE_RELEASE:
      case OP_LEASE_CLEAR: lease_update(m, op); break;
      case OP_SYNC: break;
    }
  berth_store_batch_done(b, NULL);
}

static berth_error *mem_get_conv(berth_store *s, const char *id, berth_store_conv *out,
                                 bool *found)
{
  mconv *c = find(s->engine, id);
  if (c && c->has_record) {
    berth_store_conv_copy(out, &c->r);
    *found = true;
  }
  return NULL;
}

static int by_order_desc(const void *a, const void *b)
{
  uint64_t x = ((const berth_store_conv *)a)->order, y = ((const berth_store_conv *)b)->order;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* Every record for which keep() holds, newest first. */
static berth_store_conv *collect(mem *m, bool (*keep)(const berth_store_conv *, const void *),
                                 const void *arg, size_t *n)
{
  berth_store_conv *v = NULL;
  size_t count = 0, cap = 0;
  for (size_t i = 0; i < m->size; i++)
    for (mconv *c = m->table[i]; c; c = c->hnext) {
      if (!c->has_record || !keep(&c->r, arg))
        continue;
      if (count == cap) {
        cap = cap ? 2 * cap : 16;
        v = berth_xrealloc(v, cap * sizeof *v);
      }
      berth_store_conv_copy(&v[count++], &c->r);
    }
  if (count)
    qsort(v, count, sizeof *v, by_order_desc);
  *n = count;
  return v;
}

typedef struct list_arg {
  const char *caller;
  uint64_t before;
} list_arg;

static bool keep_caller(const berth_store_conv *r, const void *arg)
{
  const list_arg *a = arg;
  return r->caller && !strcmp(r->caller, a->caller) && (!a->before || r->order < a->before);
}

static berth_error *mem_list_convs(berth_store *s, const char *caller, uint64_t before,
                                   size_t limit, berth_store_conv **out, size_t *n)
{
  list_arg a = {caller, before};
  size_t count;
  berth_store_conv *v = collect(s->engine, keep_caller, &a, &count);
  while (limit && count > limit)
    berth_store_conv_clear(&v[--count]);
  *out = v;
  *n = count;
  return NULL;
}

static bool keep_running(const berth_store_conv *r, const void *arg)
{
  (void)arg;
  return r->running_turn > 0;
}

static berth_error *mem_list_running(berth_store *s, berth_store_conv **out, size_t *n)
{
  *out = collect(s->engine, keep_running, NULL, n);
  return NULL;
}

static berth_error *mem_load_messages(berth_store *s, const char *id, char ***out, size_t *n)
{
  mconv *c = find(s->engine, id);
  if (!c || !c->n_msgs)
    return NULL;
  *out = berth_xmalloc(c->n_msgs * sizeof **out);
  for (size_t i = 0; i < c->n_msgs; i++)
    (*out)[i] = berth_xstrdup(c->msgs[i]);
  *n = c->n_msgs;
  return NULL;
}

static berth_error *mem_read_events(berth_store *s, const char *id, uint64_t after,
                                    size_t limit, berth_store_event **out, size_t *n)
{
  mconv *c = find(s->engine, id);
  if (!c)
    return NULL;
  size_t count = 0;
  berth_store_event *v = NULL;
  for (size_t i = 0; i < c->n_evs && (!limit || count < limit); i++) {
    const berth_store_event *e = &c->evs[i].e;
    if (e->seq <= after)
      continue;
    if (!v)
      v = berth_xcalloc(c->n_evs - i, sizeof *v);
    v[count].seq = e->seq;
    v[count].turn = e->turn;
    v[count].kind = berth_xstrdup(e->kind);
    v[count].data = berth_xstrdup(e->data);
    count++;
  }
  *out = v;
  *n = count;
  return NULL;
}

/* A pass over the conversation's events comparing ids only (no JSON): the reference
 * behaviour, not an index (memory holds tests and `berth replay`). */
static berth_error *mem_find_message(berth_store *s, const char *id, const char *message_id,
                                     uint64_t before, uint64_t *seq, bool *found)
{
  mconv *c = find(s->engine, id);
  for (size_t i = 0; c && i < c->n_evs; i++) {
    const mevent *e = &c->evs[i];
    if (e->message_id && !strcmp(e->message_id, message_id) &&
        (!before || e->e.seq < before) && e->e.seq > *seq) {
      *seq = e->e.seq;
      *found = true;
    }
  }
  return NULL;
}

const berth_store_vtable berth_store_memory = {
  "memory", mem_open, mem_close, mem_apply, mem_get_conv, mem_list_convs,
  mem_load_messages, mem_read_events, mem_find_message, mem_list_running,
};

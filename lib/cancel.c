/*
 * cancel.c — cancellation handles.  Operations register a listener; firing calls each
 * listener once.  Listeners only mark and schedule: completion runs later on the loop.
 */
#include "internal.h"

#include <stdlib.h>

struct plm_cancel {
    bool fired;
    plm_listener *head;
};

plm_cancel *plm_cancel_new(void)
{
    return calloc(1, sizeof(plm_cancel));
}

void plm_cancel_fire(plm_cancel *c)
{
    if (!c || c->fired)
        return;
    c->fired = true;
    while (c->head) {
        plm_listener *l = c->head;
        plm_cancel_unlisten(l);
        l->fn(l);
    }
}

bool plm_cancel_fired(const plm_cancel *c)
{
    return c && c->fired;
}

void plm_cancel_free(plm_cancel *c)
{
    if (!c)
        return;
    while (c->head)
        plm_cancel_unlisten(c->head);
    free(c);
}

void plm_cancel_listen(plm_cancel *c, plm_listener *l)
{
    l->owner = c;
    l->prev = NULL;
    l->next = c ? c->head : NULL;
    if (!c)
        return;
    if (c->head)
        c->head->prev = l;
    c->head = l;
}

void plm_cancel_unlisten(plm_listener *l)
{
    plm_cancel *c = l->owner;
    if (!c)
        return;
    if (l->prev)
        l->prev->next = l->next;
    else
        c->head = l->next;
    if (l->next)
        l->next->prev = l->prev;
    l->prev = l->next = NULL;
    l->owner = NULL;
}

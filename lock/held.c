/* held.c: the held table -- one entry per hold of a name by an owner,
 * shared by its reentrant handles -- and what happens to an entry when its
 * hold is lost: the mark, the reason, and the handles' on_lost callbacks,
 * run one at a time without the client's mutex. Every backend's holds live
 * here alike; a backend that learns of a loss on its own thread reports it
 * with lock_holds_lost. */
#include "lock/lock_int.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned entry_hash(const char *name, const char *owner) {
    unsigned h = 2166136261u;   /* FNV-1a over name, NUL, owner */
    for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 16777619u;
    h *= 16777619u;
    for (const char *p = owner; *p; p++) h = (h ^ (unsigned char)*p) * 16777619u;
    return h % LOCK_ENTRY_BUCKETS;
}

lock_entry *lock_table_find(lock_client *c, const char *name, const char *owner) {
    assert(lock_mu_holds(LOCK_RANK_CLIENT));
    for (lock_entry *e = c->buckets[entry_hash(name, owner)]; e; e = e->hnext)
        if (!e->released && !strcmp(e->name, name) && !strcmp(e->owner, owner)) return e;
    return NULL;
}

void lock_table_insert(lock_client *c, lock_entry *e) {
    assert(lock_mu_holds(LOCK_RANK_CLIENT));
    assert(!e->released && e->count == 1 && e->refs == 1);   /* a fresh hold, one handle */
    unsigned b = entry_hash(e->name, e->owner);
    e->hnext = c->buckets[b];
    c->buckets[b] = e;
    e->prev = NULL;
    e->next = c->all;
    if (c->all) c->all->prev = e;
    c->all = e;
}

void lock_table_remove(lock_client *c, lock_entry *e) {
    assert(lock_mu_holds(LOCK_RANK_CLIENT));
    assert(!e->released);                 /* out of the table once, for good */
    lock_entry **pp = &c->buckets[entry_hash(e->name, e->owner)];
    while (*pp && *pp != e) pp = &(*pp)->hnext;
    assert(*pp == e);
    *pp = e->hnext;
    if (e->prev) e->prev->next = e->next;
    else c->all = e->next;
    if (e->next) e->next->prev = e->prev;
    e->prev = e->next = e->hnext = NULL;
    e->released = 1;
}

/* Frees an entry that is out of the table. */
static void entry_free(lock_entry *e) {
    assert(lock_mu_holds(LOCK_RANK_CLIENT));  /* so hold_free does no I/O */
    if (e->hold) e->hold->be->hold_free(e->hold);
    free(e);
}

void lock_entry_unref(lock_entry *e) {
    assert(lock_mu_holds(LOCK_RANK_CLIENT));
    assert(e->refs > 0);
    if (--e->refs == 0) {
        assert(e->released && e->count == 0 && !e->handles);
        entry_free(e);
    }
}

void lock_handle_notify(lock_client *c, lock_handle *h) {
    assert(lock_mu_holds(LOCK_RANK_CLIENT));
    void (*fn)(lock_handle *, void *) = h->on_lost;
    h->notified = 1;
    h->in_cb = 1;
    h->cb_thread = pthread_self();
    lock_mu_drop(&c->mu, LOCK_RANK_CLIENT);
    fn(h, h->ud);
    lock_mu_take(&c->mu, LOCK_RANK_CLIENT);
    h->in_cb = 0;
    if (h->free_after_cb) free(h);
    pthread_cond_broadcast(&c->cb_cv);
}

void lock_entry_mark_lost(lock_client *c, lock_entry *e, lock_errcode code, const char *why) {
    assert(lock_mu_holds(LOCK_RANK_CLIENT) && e->refs > 0);  /* pinned */
    if (atomic_exchange(&e->lost, 1)) return;
    e->err = code;
    snprintf(e->errstr, sizeof e->errstr, "%s", why);
    atomic_fetch_add(&c->st.lost, 1);
    /* One at a time, from the head each time: a callback may release its own
     * or another handle of e, which changes the list. */
    for (;;) {
        lock_handle *h = e->handles;
        while (h && (!h->on_lost || h->notified)) h = h->next;
        if (!h) break;
        lock_handle_notify(c, h);
    }
}

int lock_holds_lost(lock_client *c, int (*match)(const lock_hold *h, void *arg), void *arg,
                    lock_errcode code, const char *why) {
    int n = 0;
    lock_mu_take(&c->mu, LOCK_RANK_CLIENT);
    /* From the head each time: callbacks run without c->mu and may
     * release entries; marked ones are skipped, so this ends. */
    for (;;) {
        lock_entry *e = c->all;
        while (e && (atomic_load(&e->lost) || !e->hold || !match(e->hold, arg))) e = e->next;
        if (!e) break;
        e->refs++;
        lock_entry_mark_lost(c, e, code, why);
        lock_entry_unref(e);
        n++;
    }
    lock_mu_drop(&c->mu, LOCK_RANK_CLIENT);
    return n;
}

/* ------------------------------------------------------------------ teardown */

void lock_entries_drop_all(lock_client *c) {
    lock_mu_take(&c->mu, LOCK_RANK_CLIENT);
    while (c->all) {
        lock_entry *e = c->all;
        lock_table_remove(c, e);
        lock_mu_drop(&c->mu, LOCK_RANK_CLIENT);
        char ignored[8];
        c->be->release(c, e->hold, ignored, sizeof ignored);
        lock_mu_take(&c->mu, LOCK_RANK_CLIENT);
        while (e->handles) {
            lock_handle *h = e->handles;
            e->handles = h->next;
            free(h);
        }
        e->count = 0;
        entry_free(e);
    }
    lock_mu_drop(&c->mu, LOCK_RANK_CLIENT);
}

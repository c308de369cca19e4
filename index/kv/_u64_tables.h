/* The prefix index's native tables: 64-bit block hashes kept inline in open-addressed arrays, so
 * finding a block is one probe sequence over plain memory rather than a dict's index, entry and key
 * object (see kvgate/index/kv/prefix_tables.py for what each table holds).
 *
 * - U64Map: hash -> a 64-bit value (a holder mask, or the one successor) or the map's `forked`
 *   marker. Linear probing, deletion by backward shift (no tombstones), at most half full.
 * - U64Lru: an ordered set of hashes (first = least recently used): the same probing, each slot
 *   linked to the one before and after it in the order, so moving a hash to the end and popping
 *   the first are O(1). A slot that moves in a backward shift takes its links along.
 *
 * The probe start is the hash's high bits after a multiply by an odd constant, so keys that share
 * their low bits (a holder shard's all do) still spread. Both tables grow at half full and shrink
 * below an eighth, each in one rehash.
 */
#ifndef KVGATE_U64_TABLES_H
#define KVGATE_U64_TABLES_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define U64_MIN_CAP 8
#define U64_FIB 0x9E3779B97F4A7C15ULL

enum { SLOT_EMPTY = 0, SLOT_VALUE = 1, SLOT_FORKED = 2 };

typedef struct {
    uint64_t key;
    uint64_t value;
    uint32_t state; /* SLOT_EMPTY, SLOT_VALUE or SLOT_FORKED */
} map_slot;

typedef struct {
    PyObject_HEAD
    map_slot *slots;
    Py_ssize_t cap; /* a power of two */
    Py_ssize_t used;
    int shift; /* 64 - log2(cap) */
    PyObject *forked; /* what a SLOT_FORKED value reads as; NULL: this map holds none */
} U64Map;

#define LRU_NIL 0xFFFFFFFFu   /* no slot: the ends of the order */
#define LRU_EMPTY 0xFFFFFFFEu /* in `prev`: the slot is free */

typedef struct {
    uint64_t key;
    uint32_t prev;
    uint32_t next;
} lru_slot;

typedef struct {
    PyObject_HEAD
    lru_slot *slots;
    Py_ssize_t cap;
    Py_ssize_t used;
    int shift;
    uint32_t head; /* least recently used */
    uint32_t tail; /* most recently used */
} U64Lru;

extern PyTypeObject U64Map_Type;
extern PyTypeObject U64Lru_Type;

int kvg_map_resize(U64Map *m, Py_ssize_t cap);
int kvg_lru_resize(U64Lru *l, Py_ssize_t cap);
int kvg_tables_ready(PyObject *module);

/* the loops over native tables (_native_loops.c); the caller has checked the tables' types */
PyObject *kvg_insert_native(PyObject *holders, PyObject *shards, Py_ssize_t smask, PyObject *bit, PyObject *seq);
int kvg_link_native(PyObject *successors, PyObject *seq, PyObject *forked);
PyObject *kvg_walk_native(PyObject *holders, PyObject *seq, Py_ssize_t start, PyObject *active);
PyObject *kvg_evict_native(PyObject *holders, PyObject *successors, U64Lru *lru, Py_ssize_t over, PyObject *keep);
int kvg_touch_native(PyObject *shards, Py_ssize_t smask, PyObject *seq, Py_ssize_t count);
PyObject *kvg_tally_native(U64Map *counts, PyObject *seq, int up);
int kvg_remove_native(PyObject *holders, PyObject *successors, PyObject *shards, Py_ssize_t smask, PyObject *seq,
                      PyObject *keep);

static inline Py_ssize_t u64_home(uint64_t key, int shift) { return (Py_ssize_t)((key * U64_FIB) >> shift); }

/* the smallest power of two >= U64_MIN_CAP holding `n` keys at most a quarter full */
static inline Py_ssize_t u64_cap_for(Py_ssize_t n) {
    Py_ssize_t cap = U64_MIN_CAP;
    while (cap < 4 * n) cap <<= 1;
    return cap;
}

/* -- U64Map ------------------------------------------------------------------------------------ */

/* the slot holding `key`, or -1 */
static inline Py_ssize_t map_find(const U64Map *m, uint64_t key) {
    Py_ssize_t mask = m->cap - 1, i = u64_home(key, m->shift);
    for (;;) {
        const map_slot *s = &m->slots[i];
        if (s->state == SLOT_EMPTY) return -1;
        if (s->key == key) return i;
        i = (i + 1) & mask;
    }
}

/* the slot of `key`, made (empty: state SLOT_EMPTY, the caller fills it) when absent; -1 with
 * MemoryError when the map could not grow */
static inline Py_ssize_t map_slot_for(U64Map *m, uint64_t key) {
    if ((m->used + 1) * 2 > m->cap && kvg_map_resize(m, m->cap * 2) < 0) return -1;
    Py_ssize_t mask = m->cap - 1, i = u64_home(key, m->shift);
    for (;;) {
        map_slot *s = &m->slots[i];
        if (s->state == SLOT_EMPTY) {
            s->key = key;
            return i;
        }
        if (s->key == key) return i;
        i = (i + 1) & mask;
    }
}

/* empties slot i, shifting back the slots after it that probed past it */
static inline void map_delete_at(U64Map *m, Py_ssize_t i) {
    Py_ssize_t mask = m->cap - 1, j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (m->slots[j].state == SLOT_EMPTY) break;
        Py_ssize_t k = u64_home(m->slots[j].key, m->shift);
        /* the slot at j stays where its home k lies cyclically in (i, j] */
        if (j > i ? (k <= i || k > j) : (k <= i && k > j)) {
            m->slots[i] = m->slots[j];
            i = j;
        }
    }
    m->slots[i].state = SLOT_EMPTY;
    m->used--;
    if (m->cap > U64_MIN_CAP && m->used * 8 < m->cap && kvg_map_resize(m, u64_cap_for(m->used)) < 0)
        PyErr_Clear(); /* a failed shrink keeps the larger table */
}

/* -- U64Lru ------------------------------------------------------------------------------------ */

static inline Py_ssize_t lru_find(const U64Lru *l, uint64_t key) {
    Py_ssize_t mask = l->cap - 1, i = u64_home(key, l->shift);
    for (;;) {
        const lru_slot *s = &l->slots[i];
        if (s->prev == LRU_EMPTY) return -1;
        if (s->key == key) return i;
        i = (i + 1) & mask;
    }
}

static inline void lru_unlink(U64Lru *l, uint32_t i) {
    lru_slot *s = &l->slots[i];
    if (s->prev == LRU_NIL) l->head = s->next; else l->slots[s->prev].next = s->next;
    if (s->next == LRU_NIL) l->tail = s->prev; else l->slots[s->next].prev = s->prev;
}

static inline void lru_link_last(U64Lru *l, uint32_t i) {
    lru_slot *s = &l->slots[i];
    s->prev = l->tail;
    s->next = LRU_NIL;
    if (l->tail == LRU_NIL) l->head = i; else l->slots[l->tail].next = i;
    l->tail = i;
}

static inline void lru_move_to_end(U64Lru *l, uint32_t i) {
    if (l->tail == i) return;
    lru_unlink(l, i);
    lru_link_last(l, i);
}

/* 1 when `key` was added at the end, 0 when it was there (left in place), -1 with MemoryError */
static inline int lru_add(U64Lru *l, uint64_t key, int touch) {
    if ((l->used + 1) * 2 > l->cap && kvg_lru_resize(l, l->cap * 2) < 0) return -1;
    Py_ssize_t mask = l->cap - 1, i = u64_home(key, l->shift);
    for (;;) {
        lru_slot *s = &l->slots[i];
        if (s->prev == LRU_EMPTY) {
            s->key = key;
            lru_link_last(l, (uint32_t)i);
            l->used++;
            return 1;
        }
        if (s->key == key) {
            if (touch) lru_move_to_end(l, (uint32_t)i);
            return 0;
        }
        i = (i + 1) & mask;
    }
}

/* unlinks and empties slot i, shifting back the slots after it (each taking its links along) */
static inline void lru_delete_at(U64Lru *l, Py_ssize_t i) {
    lru_unlink(l, (uint32_t)i);
    Py_ssize_t mask = l->cap - 1, j = i;
    for (;;) {
        j = (j + 1) & mask;
        lru_slot *s = &l->slots[j];
        if (s->prev == LRU_EMPTY) break;
        Py_ssize_t k = u64_home(s->key, l->shift);
        if (j > i ? (k <= i || k > j) : (k <= i && k > j)) {
            l->slots[i] = *s;
            if (s->prev == LRU_NIL) l->head = (uint32_t)i; else l->slots[s->prev].next = (uint32_t)i;
            if (s->next == LRU_NIL) l->tail = (uint32_t)i; else l->slots[s->next].prev = (uint32_t)i;
            i = j;
        }
    }
    l->slots[i].prev = LRU_EMPTY;
    l->used--;
    if (l->cap > U64_MIN_CAP && l->used * 8 < l->cap && kvg_lru_resize(l, u64_cap_for(l->used)) < 0)
        PyErr_Clear();
}

/* a 64-bit block hash from an int in [0, 2**64); -1 with TypeError or OverflowError else */
static inline int u64_key(PyObject *h, uint64_t *out) {
    if (!PyLong_Check(h)) {
        PyErr_Format(PyExc_TypeError, "a block hash must be an int, not %.100s", Py_TYPE(h)->tp_name);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(h);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = v;
    return 0;
}

#endif

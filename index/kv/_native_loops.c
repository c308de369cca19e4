/* The prefix index's loops over its native tables (U64Map holders and successors, U64Lru shards):
 * the same contracts as kvgate/index/kv/prefix_loops.py, the tables' layout included, with each
 * step a probe into plain memory. _prefix_loops.c checks the arguments and calls these when the
 * tables are native; masks there are 64-bit (an index of more replicas keeps dicts).
 */
#include "_u64_tables.h"

#define HOLDER_MASK 63

static U64Map *holder(PyObject *tables, uint64_t v) { return (U64Map *)PyList_GET_ITEM(tables, v & HOLDER_MASK); }

/* A chain's blocks are random slots of large tables, each a cache miss: the loops ask for the
 * slots a few blocks ahead while they work on this one, so the misses overlap. */
#define AHEAD 6

static inline uint64_t peek_key(PyObject *h) {
    return PyLong_Check(h) ? (uint64_t)PyLong_AsUnsignedLongLongMask(h) : 0;
}

static inline void prefetch_map(PyObject *tables, uint64_t v) {
    U64Map *m = holder(tables, v);
    __builtin_prefetch(&m->slots[u64_home(v, m->shift)]);
}

static inline void prefetch_lru(PyObject *shards, Py_ssize_t smask, uint64_t v) {
    U64Lru *l = (U64Lru *)PyList_GET_ITEM(shards, (Py_ssize_t)((v >> 6) & (uint64_t)smask));
    __builtin_prefetch(&l->slots[u64_home(v, l->shift)]);
}

static int mask_bits(PyObject *mask, uint64_t *out, const char *what) {
    if (!PyLong_Check(mask)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int", what);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(mask);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = v;
    return 0;
}

PyObject *kvg_insert_native(PyObject *holders, PyObject *shards, Py_ssize_t smask, PyObject *bit, PyObject *seq) {
    uint64_t b;
    if (mask_bits(bit, &b, "bit") < 0) return NULL;
    PyObject *grown = PySet_New(NULL);
    unsigned char *seen = PyMem_Calloc((size_t)smask + 1, 1);
    if (grown == NULL || seen == NULL) goto fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t k = n - 1; k >= 0; k--) {
        if (k >= AHEAD) {
            uint64_t w = peek_key(items[k - AHEAD]);
            prefetch_lru(shards, smask, w);
            prefetch_map(holders, w);
        }
        uint64_t v;
        if (u64_key(items[k], &v) < 0) goto fail;
        Py_ssize_t slot = (Py_ssize_t)((v >> 6) & (uint64_t)smask);
        int added = lru_add((U64Lru *)PyList_GET_ITEM(shards, slot), v, 1);
        if (added < 0) goto fail;
        if (!added) continue;
        if (!seen[slot]) {
            seen[slot] = 1;
            PyObject *s = PyLong_FromSsize_t(slot);
            if (s == NULL || PySet_Add(grown, s) < 0) {
                Py_XDECREF(s);
                goto fail;
            }
            Py_DECREF(s);
        }
        U64Map *table = holder(holders, v);
        Py_ssize_t i = map_slot_for(table, v);
        if (i < 0) goto fail;
        map_slot *s = &table->slots[i];
        if (s->state == SLOT_EMPTY) {
            table->used++;
            s->state = SLOT_VALUE;
            s->value = b;
        } else {
            s->value |= b;
        }
    }
    PyMem_Free(seen);
    return grown;
fail:
    PyMem_Free(seen);
    Py_XDECREF(grown);
    return NULL;
}

int kvg_link_native(PyObject *successors, PyObject *seq, PyObject *forked) {
    if (((U64Map *)PyList_GET_ITEM(successors, 0))->forked != forked) {
        PyErr_SetString(PyExc_ValueError, "link: the successor tables were made with another forked marker");
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    uint64_t prev = 0;
    if (n > 0 && u64_key(items[0], &prev) < 0) return -1;
    for (Py_ssize_t k = 1; k < n; k++) {
        if (k + AHEAD < n) prefetch_map(successors, peek_key(items[k + AHEAD]));
        uint64_t h;
        if (u64_key(items[k], &h) < 0) return -1;
        U64Map *table = holder(successors, prev);
        Py_ssize_t i = map_slot_for(table, prev);
        if (i < 0) return -1;
        map_slot *s = &table->slots[i];
        if (s->state == SLOT_EMPTY) {
            table->used++;
            s->state = SLOT_VALUE;
            s->value = h;
        } else if (s->state == SLOT_VALUE && s->value != h) {
            s->state = SLOT_FORKED;
        }
        prev = h;
    }
    return 0;
}

PyObject *kvg_walk_native(PyObject *holders, PyObject *seq, Py_ssize_t start, PyObject *active) {
    uint64_t a;
    if (mask_bits(active, &a, "active") < 0) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = start; i < n; i++) {
        if (i + AHEAD < n) prefetch_map(holders, peek_key(items[i + AHEAD]));
        uint64_t v;
        if (u64_key(items[i], &v) < 0) return NULL;
        U64Map *table = holder(holders, v);
        Py_ssize_t j = map_find(table, v);
        uint64_t still = (j < 0 ? 0 : table->slots[j].value) & a;
        if (still != a) return Py_BuildValue("(nK)", i, (unsigned long long)still);
    }
    return Py_BuildValue("(nO)", n, active);
}

/* clear the bits outside `kept` from the mask in slot i of `table` (v's); v leaves the holder
 * and successor tables when no holder is left */
static void unset_at(U64Map *table, Py_ssize_t i, PyObject *successors, uint64_t v, uint64_t kept) {
    uint64_t left = table->slots[i].value & kept;
    if (left) {
        table->slots[i].value = left;
        return;
    }
    map_delete_at(table, i);
    U64Map *next = holder(successors, v);
    Py_ssize_t j = map_find(next, v);
    if (j >= 0) map_delete_at(next, j);
}

PyObject *kvg_evict_native(PyObject *holders, PyObject *successors, U64Lru *lru, Py_ssize_t over, PyObject *keep) {
    if (!PyLong_Check(keep)) {
        PyErr_SetString(PyExc_TypeError, "keep must be an int");
        return NULL;
    }
    uint64_t kept = PyLong_AsUnsignedLongLongMask(keep); /* ~bit: negative, its low 64 bits */
    if (kept == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    for (Py_ssize_t k = 0; k < over; k++) {
        if (lru->used == 0) {
            PyErr_SetString(PyExc_KeyError, "evict: the LRU is empty");
            goto fail;
        }
        uint64_t v = lru->slots[lru->head].key;
        lru_delete_at(lru, lru->head);
        PyObject *h = PyLong_FromUnsignedLongLong(v);
        if (h == NULL) goto fail;
        int appended = PyList_Append(out, h);
        U64Map *table = holder(holders, v);
        Py_ssize_t i = map_find(table, v);
        if (appended < 0 || i < 0) {
            if (appended == 0) PyErr_SetObject(PyExc_KeyError, h);
            Py_DECREF(h);
            goto fail;
        }
        Py_DECREF(h);
        unset_at(table, i, successors, v, kept);
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

int kvg_touch_native(PyObject *shards, Py_ssize_t smask, PyObject *seq, Py_ssize_t count) {
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = count - 1; i >= 0; i--) {
        if (i >= AHEAD) prefetch_lru(shards, smask, peek_key(items[i - AHEAD]));
        uint64_t v;
        if (u64_key(items[i], &v) < 0) return -1;
        U64Lru *lru = (U64Lru *)PyList_GET_ITEM(shards, (Py_ssize_t)((v >> 6) & (uint64_t)smask));
        Py_ssize_t j = lru_find(lru, v);
        if (j < 0) {
            PyErr_SetObject(PyExc_KeyError, items[i]);
            return -1;
        }
        lru_move_to_end(lru, (uint32_t)j);
    }
    return 0;
}

int kvg_remove_native(PyObject *holders, PyObject *successors, PyObject *shards, Py_ssize_t smask, PyObject *seq,
                      PyObject *keep) {
    uint64_t kept = PyLong_AsUnsignedLongLongMask(keep);
    if (kept == (uint64_t)-1 && PyErr_Occurred()) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t k = 0; k < n; k++) {
        if (k + AHEAD < n) prefetch_lru(shards, smask, peek_key(items[k + AHEAD]));
        uint64_t v;
        if (!PyLong_Check(items[k])) {
            PyErr_Format(PyExc_TypeError, "a block hash must be an int, not %.100s", Py_TYPE(items[k])->tp_name);
            return -1;
        }
        if (u64_key(items[k], &v) < 0) { /* outside 64 bits: never stored, so not held */
            PyErr_Clear();
            continue;
        }
        U64Lru *lru = (U64Lru *)PyList_GET_ITEM(shards, (Py_ssize_t)((v >> 6) & (uint64_t)smask));
        Py_ssize_t i = lru_find(lru, v);
        if (i < 0) continue;
        lru_delete_at(lru, i);
        U64Map *table = holder(holders, v);
        Py_ssize_t j = map_find(table, v);
        if (j < 0) {
            PyErr_SetObject(PyExc_KeyError, items[k]);
            return -1;
        }
        unset_at(table, j, successors, v, kept);
    }
    return 0;
}

PyObject *kvg_tally_native(U64Map *counts, PyObject *seq, int up) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *gone = PyList_New(0);
    if (gone == NULL) return NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (k + AHEAD < n) {
            uint64_t w = peek_key(items[k + AHEAD]);
            __builtin_prefetch(&counts->slots[u64_home(w, counts->shift)]);
        }
        uint64_t v;
        if (u64_key(items[k], &v) < 0) goto fail;
        if (up) {
            Py_ssize_t i = map_slot_for(counts, v);
            if (i < 0) goto fail;
            map_slot *s = &counts->slots[i];
            if (s->state == SLOT_EMPTY) {
                counts->used++;
                s->state = SLOT_VALUE;
                s->value = 0;
            }
            s->value++;
            continue;
        }
        Py_ssize_t i = map_find(counts, v);
        if (i < 0) continue;
        if (counts->slots[i].value > 1) {
            counts->slots[i].value--;
            continue;
        }
        map_delete_at(counts, i);
        if (PyList_Append(gone, items[k]) < 0) goto fail;
    }
    return gone;
fail:
    Py_DECREF(gone);
    return NULL;
}

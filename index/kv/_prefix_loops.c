/* The prefix index's loops over one chain of block hashes, in C: the same names, arguments and
 * results as kvgate/index/kv/prefix_loops.py, whose docstrings are the contracts (the tables'
 * layout included). Two kinds of tables: this module's own U64Map and U64Lru (_u64_tables.c; the
 * loops over them are _native_loops.c), which the index uses while its masks fit 64 bits, and
 * dicts and OrderedDicts, read and changed here through the same operations the Python loops use
 * (an LRU shard is an OrderedDict: it is changed only through its own methods, never through
 * PyDict_SetItem, which would bypass its order). Callers hold the index's lock; with the GIL held
 * throughout, each call is one uninterrupted step for other threads too.
 */
#include "_u64_tables.h"

#define HOLDER_SHARDS 64
#define HOLDER_MASK (HOLDER_SHARDS - 1)

typedef struct {
    PyObject *move_to_end; /* interned method names */
    PyObject *popitem;
} loops_state;

static loops_state *state_of(PyObject *module) { return (loops_state *)PyModule_GetState(module); }

/* the low 64 bits of an int hash; -1 with an error set when it is not an int */
static int hash_bits(PyObject *h, unsigned long long *out) {
    unsigned long long v = PyLong_AsUnsignedLongLongMask(h);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = v;
    return 0;
}

/* 1: a list of HOLDER_SHARDS U64Maps, 0: of as many dicts, -1 with TypeError: anything else */
static int check_tables(PyObject *tables, const char *what) {
    if (!PyList_CheckExact(tables) || PyList_GET_SIZE(tables) != HOLDER_SHARDS) {
        PyErr_Format(PyExc_TypeError, "%s must be a list of %d dicts or U64Maps", what, HOLDER_SHARDS);
        return -1;
    }
    int native = Py_IS_TYPE(PyList_GET_ITEM(tables, 0), &U64Map_Type);
    for (Py_ssize_t i = 0; i < HOLDER_SHARDS; i++) {
        PyObject *t = PyList_GET_ITEM(tables, i);
        if (native ? !Py_IS_TYPE(t, &U64Map_Type) : !PyDict_CheckExact(t)) {
            PyErr_Format(PyExc_TypeError, "%s must be a list of %d dicts or U64Maps, not both", what, HOLDER_SHARDS);
            return -1;
        }
    }
    return native;
}

/* 1: every LRU shard is a U64Lru, 0: none is, -1 with TypeError: some are */
static int native_shards(PyObject *shards) {
    Py_ssize_t n = PyList_GET_SIZE(shards), count = 0;
    for (Py_ssize_t i = 0; i < n; i++) count += Py_IS_TYPE(PyList_GET_ITEM(shards, i), &U64Lru_Type);
    if (count != 0 && count != n) {
        PyErr_SetString(PyExc_TypeError, "shards must be all U64Lrus or none");
        return -1;
    }
    return count != 0;
}

/* the holder and LRU tables' kinds agree: 1 (native) or 0; -1 with TypeError */
static int same_kind(int tables, int shards) {
    if (tables < 0 || shards < 0) return -1;
    if (tables != shards) {
        PyErr_SetString(PyExc_TypeError, "the holder tables and the LRU shards must be both native or both dicts");
        return -1;
    }
    return tables;
}

/* len(shards) - 1 for a non-empty list whose length is a power of two; -1 with an error else */
static Py_ssize_t shard_mask(PyObject *shards) {
    if (!PyList_CheckExact(shards)) {
        PyErr_SetString(PyExc_TypeError, "shards must be a list");
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(shards);
    if (n <= 0 || (n & (n - 1)) != 0) {
        PyErr_SetString(PyExc_ValueError, "shards must be a power of two of LRUs");
        return -1;
    }
    return n - 1;
}

static PyObject *loops_insert(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "insert(holders, shards, bit, hashes)");
        return NULL;
    }
    PyObject *holders = args[0], *shards = args[1], *bit = args[2];
    int kind = check_tables(holders, "holders");
    if (kind < 0) return NULL;
    Py_ssize_t smask = shard_mask(shards);
    if (smask < 0 || (kind = same_kind(kind, native_shards(shards))) < 0) return NULL;
    PyObject *seq = PySequence_Fast(args[3], "hashes must be a sequence");
    if (seq == NULL) return NULL;
    if (kind) {
        PyObject *out = kvg_insert_native(holders, shards, smask, bit, seq);
        Py_DECREF(seq);
        return out;
    }
    PyObject *grown = PySet_New(NULL);
    unsigned char *seen = PyMem_Calloc((size_t)smask + 1, 1); /* shards already in `grown` */
    if (grown == NULL || seen == NULL) goto fail;
    PyObject *move_to_end = state_of(module)->move_to_end;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t k = n - 1; k >= 0; k--) {
        PyObject *h = items[k];
        unsigned long long v;
        if (hash_bits(h, &v) < 0) goto fail;
        Py_ssize_t slot = (Py_ssize_t)((v >> 6) & (unsigned long long)smask);
        PyObject *lru = PyList_GET_ITEM(shards, slot);
        int held = PySequence_Contains(lru, h);
        if (held < 0) goto fail;
        if (held) {
            PyObject *r = PyObject_CallMethodOneArg(lru, move_to_end, h);
            if (r == NULL) goto fail;
            Py_DECREF(r);
            continue;
        }
        if (PyObject_SetItem(lru, h, Py_None) < 0) goto fail;
        if (!seen[slot]) {
            seen[slot] = 1;
            PyObject *s = PyLong_FromSsize_t(slot);
            if (s == NULL) goto fail;
            int added = PySet_Add(grown, s);
            Py_DECREF(s);
            if (added < 0) goto fail;
        }
        /* one look-up for a block new to every replica (the usual case in a fresh chain): setdefault
         * stores `bit` when the hash is absent, which the table's growth tells apart from a present
         * mask that happens to be the same int */
        PyObject *table = PyList_GET_ITEM(holders, v & HOLDER_MASK);
        Py_ssize_t before = PyDict_GET_SIZE(table);
        PyObject *mask = PyDict_SetDefault(table, h, bit); /* borrowed */
        if (mask == NULL) goto fail;
        if (PyDict_GET_SIZE(table) != before) continue;
        PyObject *merged = PyNumber_Or(mask, bit);
        if (merged == NULL) goto fail;
        int set = PyDict_SetItem(table, h, merged);
        Py_DECREF(merged);
        if (set < 0) goto fail;
    }
    PyMem_Free(seen);
    Py_DECREF(seq);
    return grown;
fail:
    PyMem_Free(seen);
    Py_XDECREF(grown);
    Py_DECREF(seq);
    return NULL;
}

static PyObject *loops_link(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "link(successors, hashes, forked)");
        return NULL;
    }
    PyObject *successors = args[0], *forked = args[2];
    int kind = check_tables(successors, "successors");
    if (kind < 0) return NULL;
    PyObject *seq = PySequence_Fast(args[1], "hashes must be a sequence");
    if (seq == NULL) return NULL;
    if (kind) {
        int done = kvg_link_native(successors, seq, forked);
        Py_DECREF(seq);
        if (done < 0) return NULL;
        Py_RETURN_NONE;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t k = 1; k < n; k++) {
        PyObject *prev = items[k - 1], *h = items[k];
        unsigned long long v;
        if (hash_bits(prev, &v) < 0) goto fail;
        PyObject *table = PyList_GET_ITEM(successors, v & HOLDER_MASK);
        Py_ssize_t before = PyDict_GET_SIZE(table);
        PyObject *seen = PyDict_SetDefault(table, prev, h); /* borrowed; stores h when prev is new */
        if (seen == NULL) goto fail;
        if (PyDict_GET_SIZE(table) != before || seen == forked) continue;
        int differs = PyObject_RichCompareBool(seen, h, Py_NE);
        if (differs < 0) goto fail;
        if (differs && PyDict_SetItem(table, prev, forked) < 0) goto fail;
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    return NULL;
}

static PyObject *loops_walk(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "walk(holders, hashes, start, active)");
        return NULL;
    }
    PyObject *holders = args[0], *active = args[3];
    int kind = check_tables(holders, "holders");
    if (kind < 0) return NULL;
    Py_ssize_t start = PyLong_AsSsize_t(args[2]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    if (!PyLong_Check(active)) {
        PyErr_SetString(PyExc_TypeError, "active must be an int");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[1], "hashes must be a sequence");
    if (seq == NULL) return NULL;
    if (start < 0) start = 0;
    if (kind) {
        PyObject *out = kvg_walk_native(holders, seq, start, active);
        Py_DECREF(seq);
        return out;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    /* masks of up to 64 replicas in C integers; wider ones as Python ints */
    int overflow = 0;
    long long signed_active = PyLong_AsLongLongAndOverflow(active, &overflow);
    if (signed_active == -1 && PyErr_Occurred()) goto fail;
    int narrow = overflow == 0 && signed_active >= 0;
    unsigned long long a = (unsigned long long)signed_active;
    for (Py_ssize_t i = start; i < n; i++) {
        PyObject *h = items[i];
        unsigned long long v;
        if (hash_bits(h, &v) < 0) goto fail;
        PyObject *mask = PyDict_GetItemWithError(PyList_GET_ITEM(holders, v & HOLDER_MASK), h); /* borrowed */
        if (mask == NULL && PyErr_Occurred()) goto fail;
        if (narrow) {
            unsigned long long m = 0;
            if (mask != NULL && hash_bits(mask, &m) < 0) goto fail;
            unsigned long long still = m & a;
            if (still != a) {
                Py_DECREF(seq);
                return Py_BuildValue("(nK)", i, still);
            }
            continue;
        }
        PyObject *still = mask == NULL ? PyLong_FromLong(0) : PyNumber_And(mask, active);
        if (still == NULL) goto fail;
        int same = PyObject_RichCompareBool(still, active, Py_EQ);
        if (same < 0) {
            Py_DECREF(still);
            goto fail;
        }
        if (!same) {
            Py_DECREF(seq);
            PyObject *out = Py_BuildValue("(nO)", i, still);
            Py_DECREF(still);
            return out;
        }
        Py_DECREF(still);
    }
    Py_DECREF(seq);
    return Py_BuildValue("(nO)", n, active);
fail:
    Py_DECREF(seq);
    return NULL;
}

/* prefix_loops.unset over dict tables: clear the bits outside `keep` from h's holder mask (h must
 * be in `holders`: KeyError else); h leaves `holders` and `successors` when no holder is left */
static int unset_dict(PyObject *holders, PyObject *successors, PyObject *h, PyObject *keep) {
    unsigned long long v;
    if (hash_bits(h, &v) < 0) return -1;
    PyObject *table = PyList_GET_ITEM(holders, v & HOLDER_MASK);
    PyObject *mask = PyDict_GetItemWithError(table, h); /* borrowed */
    if (mask == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, h);
        return -1;
    }
    PyObject *left = PyNumber_And(mask, keep);
    if (left == NULL) return -1;
    int held = PyObject_IsTrue(left);
    int done = held < 0 ? -1 : held ? PyDict_SetItem(table, h, left) : PyDict_DelItem(table, h);
    Py_DECREF(left);
    if (done < 0 || held) return done;
    PyObject *next = PyList_GET_ITEM(successors, v & HOLDER_MASK);
    int linked = PyDict_Contains(next, h);
    return linked < 0 || (linked && PyDict_DelItem(next, h) < 0) ? -1 : 0;
}

static PyObject *loops_evict(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "evict(holders, successors, lru, over, keep)");
        return NULL;
    }
    PyObject *holders = args[0], *successors = args[1], *lru = args[2], *keep = args[4];
    int kind = check_tables(holders, "holders"), next_kind = check_tables(successors, "successors");
    if (kind < 0 || next_kind < 0 || (kind = same_kind(kind, next_kind)) < 0) return NULL;
    if ((kind = same_kind(kind, Py_IS_TYPE(lru, &U64Lru_Type))) < 0) return NULL;
    Py_ssize_t over = PyLong_AsSsize_t(args[3]);
    if (over == -1 && PyErr_Occurred()) return NULL;
    if (kind) return kvg_evict_native(holders, successors, (U64Lru *)lru, over, keep);
    if (!PyLong_Check(keep)) {
        PyErr_SetString(PyExc_TypeError, "keep must be an int");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    PyObject *popitem = state_of(module)->popitem;
    for (Py_ssize_t i = 0; i < over; i++) {
        PyObject *call[2] = {lru, Py_False}; /* popitem(last=False): the least recently used */
        PyObject *item = PyObject_VectorcallMethod(popitem, call, 2, NULL);
        if (item == NULL) goto fail;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            Py_DECREF(item);
            PyErr_SetString(PyExc_TypeError, "lru.popitem must give (key, value)");
            goto fail;
        }
        PyObject *h = Py_NewRef(PyTuple_GET_ITEM(item, 0));
        Py_DECREF(item);
        int appended = PyList_Append(out, h);
        Py_DECREF(h); /* `out` holds it */
        if (appended < 0) goto fail;
        if (unset_dict(holders, successors, h, keep) < 0) goto fail;
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static PyObject *loops_remove(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "remove(holders, successors, shards, hashes, keep)");
        return NULL;
    }
    PyObject *holders = args[0], *successors = args[1], *shards = args[2], *keep = args[4];
    int kind = check_tables(holders, "holders"), next_kind = check_tables(successors, "successors");
    if (kind < 0 || next_kind < 0 || (kind = same_kind(kind, next_kind)) < 0) return NULL;
    Py_ssize_t smask = shard_mask(shards);
    if (smask < 0 || (kind = same_kind(kind, native_shards(shards))) < 0) return NULL;
    if (!PyLong_Check(keep)) {
        PyErr_SetString(PyExc_TypeError, "keep must be an int");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[3], "hashes must be iterable");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    if (kind) {
        int done = kvg_remove_native(holders, successors, shards, smask, seq, keep);
        Py_DECREF(seq);
        if (done < 0) return NULL;
        Py_RETURN_NONE;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *h = items[k];
        unsigned long long v;
        if (hash_bits(h, &v) < 0) goto fail;
        PyObject *lru = PyList_GET_ITEM(shards, (Py_ssize_t)((v >> 6) & (unsigned long long)smask));
        int held = PySequence_Contains(lru, h);
        if (held < 0) goto fail;
        if (!held) continue;
        if (PyObject_DelItem(lru, h) < 0 || unset_dict(holders, successors, h, keep) < 0) goto fail;
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    return NULL;
}

static PyObject *loops_tally(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "tally(counts, hashes, up)");
        return NULL;
    }
    if (!Py_IS_TYPE(args[0], &U64Map_Type)) { /* the counts are this module's own table, always */
        PyErr_SetString(PyExc_TypeError, "counts must be a U64Map");
        return NULL;
    }
    int up = PyObject_IsTrue(args[2]);
    if (up < 0) return NULL;
    PyObject *seq = PySequence_Fast(args[1], "hashes must be a sequence");
    if (seq == NULL) return NULL;
    PyObject *out = kvg_tally_native((U64Map *)args[0], seq, up); /* empty when counting up */
    Py_DECREF(seq);
    return out;
}

static PyObject *loops_touch(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "touch(shards, hashes, n)");
        return NULL;
    }
    PyObject *shards = args[0];
    Py_ssize_t smask = shard_mask(shards);
    if (smask < 0) return NULL;
    int kind = native_shards(shards);
    if (kind < 0) return NULL;
    Py_ssize_t count = PyLong_AsSsize_t(args[2]);
    if (count == -1 && PyErr_Occurred()) return NULL;
    PyObject *seq = PySequence_Fast(args[1], "hashes must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (count > n) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_IndexError, "touch: n is longer than the chain");
        return NULL;
    }
    if (kind) {
        int done = kvg_touch_native(shards, smask, seq, count);
        Py_DECREF(seq);
        if (done < 0) return NULL;
        Py_RETURN_NONE;
    }
    PyObject *move_to_end = state_of(module)->move_to_end;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = count - 1; i >= 0; i--) {
        unsigned long long v;
        if (hash_bits(items[i], &v) < 0) goto fail;
        PyObject *lru = PyList_GET_ITEM(shards, (Py_ssize_t)((v >> 6) & (unsigned long long)smask));
        PyObject *r = PyObject_CallMethodOneArg(lru, move_to_end, items[i]);
        if (r == NULL) goto fail;
        Py_DECREF(r);
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef methods[] = {
    {"insert", (PyCFunction)(void (*)(void))loops_insert, METH_FASTCALL,
     "insert(holders, shards, bit, hashes) -> set of grown shards (see prefix_loops.insert)"},
    {"link", (PyCFunction)(void (*)(void))loops_link, METH_FASTCALL,
     "link(successors, hashes, forked) (see prefix_loops.link)"},
    {"walk", (PyCFunction)(void (*)(void))loops_walk, METH_FASTCALL,
     "walk(holders, hashes, start, active) -> (index, still) (see prefix_loops.walk)"},
    {"evict", (PyCFunction)(void (*)(void))loops_evict, METH_FASTCALL,
     "evict(holders, successors, lru, over, keep) -> evicted hashes (see prefix_loops.evict)"},
    {"remove", (PyCFunction)(void (*)(void))loops_remove, METH_FASTCALL,
     "remove(holders, successors, shards, hashes, keep) (see prefix_loops.remove)"},
    {"tally", (PyCFunction)(void (*)(void))loops_tally, METH_FASTCALL,
     "tally(counts, hashes, up) -> hashes counted down to 0 (see prefix_loops.tally)"},
    {"touch", (PyCFunction)(void (*)(void))loops_touch, METH_FASTCALL,
     "touch(shards, hashes, n) (see prefix_loops.touch)"},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *module) {
    loops_state *st = state_of(module);
    st->move_to_end = PyUnicode_InternFromString("move_to_end");
    if (st->move_to_end == NULL) return -1;
    st->popitem = PyUnicode_InternFromString("popitem");
    if (st->popitem == NULL) return -1;
    if (kvg_tables_ready(module) < 0) return -1;
    return PyModule_AddIntConstant(module, "HOLDER_SHARDS", HOLDER_SHARDS);
}

static int traverse(PyObject *module, visitproc visit, void *arg) {
    Py_VISIT(state_of(module)->move_to_end);
    Py_VISIT(state_of(module)->popitem);
    return 0;
}

static int clear(PyObject *module) {
    Py_CLEAR(state_of(module)->move_to_end);
    Py_CLEAR(state_of(module)->popitem);
    return 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvgate.index.kv._prefix_loops",
    .m_doc = "The prefix index's loops over a chain of block hashes, in C (kvgate.index.kv.prefix_loops).",
    .m_size = sizeof(loops_state),
    .m_methods = methods,
    .m_slots = slots,
    .m_traverse = traverse,
    .m_clear = clear,
};

PyMODINIT_FUNC PyInit__prefix_loops(void) { return PyModuleDef_Init(&module_def); }

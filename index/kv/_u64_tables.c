/* U64Map and U64Lru as Python types (_u64_tables.h says what they are). From Python they read
 * like the dict and OrderedDict they stand in for, as far as the prefix index uses them: the
 * Python loops of kvgate/index/kv/prefix_loops.py run on them unchanged, which is how the tests
 * hold the C loops to the Python ones. Iteration walks a snapshot, so changing a table while
 * iterating it is safe.
 */
#include "_u64_tables.h"

#include <string.h>

/* -- growth ------------------------------------------------------------------------------------ */

static int shift_of(Py_ssize_t cap) {
    int bits = 0;
    while (((Py_ssize_t)1 << bits) < cap) bits++;
    return 64 - bits;
}

int kvg_map_resize(U64Map *m, Py_ssize_t cap) {
    map_slot *old = m->slots, *slots = PyMem_Calloc((size_t)cap, sizeof(map_slot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t old_cap = m->cap;
    m->slots = slots;
    m->cap = cap;
    m->shift = shift_of(cap);
    for (Py_ssize_t i = 0; i < old_cap; i++) {
        if (old[i].state == SLOT_EMPTY) continue;
        Py_ssize_t j = u64_home(old[i].key, m->shift);
        while (slots[j].state != SLOT_EMPTY) j = (j + 1) & (cap - 1);
        slots[j] = old[i];
    }
    PyMem_Free(old);
    return 0;
}

int kvg_lru_resize(U64Lru *l, Py_ssize_t cap) {
    if (cap >= (Py_ssize_t)LRU_EMPTY) {
        PyErr_SetString(PyExc_OverflowError, "an LRU table of more than 2**31 slots");
        return -1;
    }
    lru_slot *old = l->slots, *slots = PyMem_Malloc((size_t)cap * sizeof(lru_slot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < cap; i++) slots[i].prev = LRU_EMPTY;
    uint32_t at = l->head;
    l->slots = slots;
    l->cap = cap;
    l->shift = shift_of(cap);
    l->head = l->tail = LRU_NIL;
    while (at != LRU_NIL) { /* oldest first, each appended: the order is kept */
        Py_ssize_t j = u64_home(old[at].key, l->shift);
        while (slots[j].prev != LRU_EMPTY) j = (j + 1) & (cap - 1);
        slots[j].key = old[at].key;
        lru_link_last(l, (uint32_t)j);
        at = old[at].next;
    }
    PyMem_Free(old);
    return 0;
}

/* -- U64Map ------------------------------------------------------------------------------------ */

static PyObject *map_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"forked", NULL};
    PyObject *forked = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:U64Map", kwlist, &forked)) return NULL;
    U64Map *m = (U64Map *)type->tp_alloc(type, 0);
    if (m == NULL) return NULL;
    m->slots = PyMem_Calloc(U64_MIN_CAP, sizeof(map_slot));
    if (m->slots == NULL) {
        Py_DECREF(m);
        return PyErr_NoMemory();
    }
    m->cap = U64_MIN_CAP;
    m->shift = shift_of(U64_MIN_CAP);
    m->forked = forked == Py_None ? NULL : Py_XNewRef(forked);
    return (PyObject *)m;
}

static void map_dealloc(U64Map *m) {
    PyMem_Free(m->slots);
    Py_XDECREF(m->forked);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

/* the slot of a key given from Python, or -1 (absent, or not a 64-bit hash: no error set) */
static Py_ssize_t map_lookup(U64Map *m, PyObject *key) {
    uint64_t k;
    if (u64_key(key, &k) < 0) {
        PyErr_Clear();
        return -1;
    }
    return map_find(m, k);
}

static PyObject *map_value(U64Map *m, Py_ssize_t i) {
    if (m->slots[i].state == SLOT_FORKED) return Py_NewRef(m->forked);
    return PyLong_FromUnsignedLongLong(m->slots[i].value);
}

static Py_ssize_t map_len(U64Map *m) { return m->used; }

static int map_contains(U64Map *m, PyObject *key) { return map_lookup(m, key) >= 0; }

static PyObject *map_getitem(U64Map *m, PyObject *key) {
    Py_ssize_t i = map_lookup(m, key);
    if (i < 0) {
        PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    return map_value(m, i);
}

static int map_setitem(U64Map *m, PyObject *key, PyObject *value) {
    if (value == NULL) {
        Py_ssize_t i = map_lookup(m, key);
        if (i < 0) {
            PyErr_SetObject(PyExc_KeyError, key);
            return -1;
        }
        map_delete_at(m, i);
        return 0;
    }
    uint64_t k, v = 0;
    if (u64_key(key, &k) < 0) return -1;
    int forked = m->forked != NULL && value == m->forked;
    if (!forked) {
        if (!PyLong_Check(value)) {
            PyErr_Format(PyExc_TypeError, "U64Map values are ints (or its forked marker), not %.100s",
                         Py_TYPE(value)->tp_name);
            return -1;
        }
        v = PyLong_AsUnsignedLongLong(value);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    }
    Py_ssize_t i = map_slot_for(m, k);
    if (i < 0) return -1;
    if (m->slots[i].state == SLOT_EMPTY) m->used++;
    m->slots[i].value = v;
    m->slots[i].state = forked ? SLOT_FORKED : SLOT_VALUE;
    return 0;
}

static PyObject *map_get(U64Map *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(key, default=None)");
        return NULL;
    }
    Py_ssize_t i = map_lookup(m, args[0]);
    if (i >= 0) return map_value(m, i);
    return Py_NewRef(nargs == 2 ? args[1] : Py_None);
}

static PyObject *map_pop(U64Map *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "pop(key[, default])");
        return NULL;
    }
    Py_ssize_t i = map_lookup(m, args[0]);
    if (i < 0) {
        if (nargs == 2) return Py_NewRef(args[1]);
        PyErr_SetObject(PyExc_KeyError, args[0]);
        return NULL;
    }
    PyObject *value = map_value(m, i);
    if (value != NULL) map_delete_at(m, i);
    return value;
}

static PyObject *map_items(U64Map *m, PyObject *unused) {
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < m->cap; i++) {
        if (m->slots[i].state == SLOT_EMPTY) continue;
        PyObject *item = Py_BuildValue("(KN)", (unsigned long long)m->slots[i].key, map_value(m, i));
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(item);
    }
    return out;
}

static PyObject *map_iter(U64Map *m) {
    PyObject *keys = PyList_New(0);
    if (keys == NULL) return NULL;
    for (Py_ssize_t i = 0; i < m->cap; i++) {
        if (m->slots[i].state == SLOT_EMPTY) continue;
        PyObject *k = PyLong_FromUnsignedLongLong(m->slots[i].key);
        if (k == NULL || PyList_Append(keys, k) < 0) {
            Py_XDECREF(k);
            Py_DECREF(keys);
            return NULL;
        }
        Py_DECREF(k);
    }
    PyObject *it = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return it;
}

static PyMethodDef map_methods[] = {
    {"get", (PyCFunction)(void (*)(void))map_get, METH_FASTCALL, "get(key, default=None)"},
    {"pop", (PyCFunction)(void (*)(void))map_pop, METH_FASTCALL, "pop(key[, default])"},
    {"items", (PyCFunction)map_items, METH_NOARGS, "a list of (key, value)"},
    {NULL, NULL, 0, NULL},
};

static PyMappingMethods map_mapping = {
    .mp_length = (lenfunc)map_len,
    .mp_subscript = (binaryfunc)map_getitem,
    .mp_ass_subscript = (objobjargproc)map_setitem,
};

static PySequenceMethods map_sequence = {.sq_contains = (objobjproc)map_contains};

PyTypeObject U64Map_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvgate.index.kv._prefix_loops.U64Map",
    .tp_doc = "U64Map(forked=None): 64-bit hash -> 64-bit int, or the `forked` marker",
    .tp_basicsize = sizeof(U64Map),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = map_new,
    .tp_dealloc = (destructor)map_dealloc,
    .tp_as_mapping = &map_mapping,
    .tp_as_sequence = &map_sequence,
    .tp_iter = (getiterfunc)map_iter,
    .tp_methods = map_methods,
};

/* -- U64Lru ------------------------------------------------------------------------------------ */

static PyObject *lru_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if ((kwds != NULL && PyDict_GET_SIZE(kwds) != 0) || !PyArg_ParseTuple(args, ":U64Lru")) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "U64Lru() takes no arguments");
        return NULL;
    }
    U64Lru *l = (U64Lru *)type->tp_alloc(type, 0);
    if (l == NULL) return NULL;
    l->slots = PyMem_Malloc(U64_MIN_CAP * sizeof(lru_slot));
    if (l->slots == NULL) {
        Py_DECREF(l);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < U64_MIN_CAP; i++) l->slots[i].prev = LRU_EMPTY;
    l->cap = U64_MIN_CAP;
    l->shift = shift_of(U64_MIN_CAP);
    l->head = l->tail = LRU_NIL;
    return (PyObject *)l;
}

static void lru_dealloc(U64Lru *l) {
    PyMem_Free(l->slots);
    Py_TYPE(l)->tp_free((PyObject *)l);
}

static Py_ssize_t lru_lookup(U64Lru *l, PyObject *key) {
    uint64_t k;
    if (u64_key(key, &k) < 0) {
        PyErr_Clear();
        return -1;
    }
    return lru_find(l, k);
}

static Py_ssize_t lru_len(U64Lru *l) { return l->used; }

static int lru_contains(U64Lru *l, PyObject *key) { return lru_lookup(l, key) >= 0; }

static PyObject *lru_getitem(U64Lru *l, PyObject *key) {
    if (lru_lookup(l, key) < 0) {
        PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* lru[h] = None adds h at the end (a present h keeps its place, as in an OrderedDict); del lru[h] */
static int lru_setitem(U64Lru *l, PyObject *key, PyObject *value) {
    if (value == NULL) {
        Py_ssize_t i = lru_lookup(l, key);
        if (i < 0) {
            PyErr_SetObject(PyExc_KeyError, key);
            return -1;
        }
        lru_delete_at(l, i);
        return 0;
    }
    if (value != Py_None) {
        PyErr_SetString(PyExc_TypeError, "U64Lru is an ordered set: its values are None");
        return -1;
    }
    uint64_t k;
    if (u64_key(key, &k) < 0) return -1;
    return lru_add(l, k, 0) < 0 ? -1 : 0;
}

static int last_flag(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, const char *what) {
    PyObject *last = NULL;
    if (nargs == 1 && kwnames == NULL) last = args[0];
    else if (nargs == 0 && kwnames != NULL && PyTuple_GET_SIZE(kwnames) == 1 &&
             PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "last") == 0)
        last = args[0];
    else if (nargs != 0 || kwnames != NULL) {
        PyErr_Format(PyExc_TypeError, "%s(last=True)", what);
        return -1;
    }
    return last == NULL ? 1 : PyObject_IsTrue(last);
}

static PyObject *lru_popitem(U64Lru *l, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    int last = last_flag(args, nargs, kwnames, "popitem");
    if (last < 0) return NULL;
    if (l->used == 0) {
        PyErr_SetString(PyExc_KeyError, "popitem(): the LRU is empty");
        return NULL;
    }
    uint32_t i = last ? l->tail : l->head;
    PyObject *item = Py_BuildValue("(KO)", (unsigned long long)l->slots[i].key, Py_None);
    if (item != NULL) lru_delete_at(l, i);
    return item;
}

static PyObject *lru_move(U64Lru *l, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "move_to_end(key, last=True)");
        return NULL;
    }
    int last = last_flag(args + 1, nargs - 1, kwnames, "move_to_end");
    if (last < 0) return NULL;
    if (!last) {
        PyErr_SetString(PyExc_ValueError, "U64Lru.move_to_end moves to the end only");
        return NULL;
    }
    Py_ssize_t i = lru_lookup(l, args[0]);
    if (i < 0) {
        PyErr_SetObject(PyExc_KeyError, args[0]);
        return NULL;
    }
    lru_move_to_end(l, (uint32_t)i);
    Py_RETURN_NONE;
}

static PyObject *lru_iter(U64Lru *l) {
    PyObject *keys = PyList_New(l->used);
    if (keys == NULL) return NULL;
    Py_ssize_t n = 0;
    for (uint32_t at = l->head; at != LRU_NIL; at = l->slots[at].next) {
        PyObject *k = PyLong_FromUnsignedLongLong(l->slots[at].key);
        if (k == NULL) {
            Py_DECREF(keys);
            return NULL;
        }
        PyList_SET_ITEM(keys, n++, k);
    }
    PyObject *it = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return it;
}

static PyMethodDef lru_methods[] = {
    {"popitem", (PyCFunction)(void (*)(void))lru_popitem, METH_FASTCALL | METH_KEYWORDS,
     "popitem(last=True) -> (key, None)"},
    {"move_to_end", (PyCFunction)(void (*)(void))lru_move, METH_FASTCALL | METH_KEYWORDS,
     "move_to_end(key, last=True): make key the most recently used"},
    {NULL, NULL, 0, NULL},
};

static PyMappingMethods lru_mapping = {
    .mp_length = (lenfunc)lru_len,
    .mp_subscript = (binaryfunc)lru_getitem,
    .mp_ass_subscript = (objobjargproc)lru_setitem,
};

static PySequenceMethods lru_sequence = {.sq_contains = (objobjproc)lru_contains};

PyTypeObject U64Lru_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvgate.index.kv._prefix_loops.U64Lru",
    .tp_doc = "U64Lru(): an ordered set of 64-bit hashes, first = least recently used",
    .tp_basicsize = sizeof(U64Lru),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = lru_new,
    .tp_dealloc = (destructor)lru_dealloc,
    .tp_as_mapping = &lru_mapping,
    .tp_as_sequence = &lru_sequence,
    .tp_iter = (getiterfunc)lru_iter,
    .tp_methods = lru_methods,
};

int kvg_tables_ready(PyObject *module) {
    if (PyType_Ready(&U64Map_Type) < 0 || PyType_Ready(&U64Lru_Type) < 0) return -1;
    if (PyModule_AddObjectRef(module, "U64Map", (PyObject *)&U64Map_Type) < 0) return -1;
    return PyModule_AddObjectRef(module, "U64Lru", (PyObject *)&U64Lru_Type);
}

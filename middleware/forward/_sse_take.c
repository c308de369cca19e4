/* A chat stream's usual events, taken in a run, in C: the twin of
 * kvgate/middleware/forward/sse_take.py (same name, same contract; read the docstrings there).
 * tests/test_wire_fast_paths.py holds the two to the relay's general path.
 *
 * The JSON of each event is read by the `loads` the caller passes (orjson's); this file only
 * walks the buffer and checks the shapes, so what it accepts is exactly what the Python twin
 * accepts: exact dict and list types, truthiness as Python defines it. */
#define _GNU_SOURCE  /* memmem */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static int is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\x0b' || c == '\x0c';
}

/* d.get(key) as a borrowed reference (NULL: absent); -1 in *err on an error. */
static PyObject *get(PyObject *d, PyObject *key, int *err) {
    PyObject *v = PyDict_GetItemWithError(d, key);
    if (v == NULL && PyErr_Occurred()) *err = 1;
    return v;
}

/* truthiness of a borrowed value that may be NULL (absent: false); -1 on an error. */
static int truthy(PyObject *v) { return v == NULL ? 0 : PyObject_IsTrue(v); }

/* the keys the shapes are read by, in this order; made once per module, kept in its state */
enum { ERROR, CHOICES, USAGE, LOGPROBS, DELTA, TOOL_CALLS, FUNCTION_CALL, CONTENT, FINISH_REASON, ID, ROLE, TEXT, NKEYS };
static const char *const NAMES[NKEYS] = {"error", "choices", "usage", "logprobs", "delta", "tool_calls",
                                         "function_call", "content", "finish_reason", "id", "role", "text"};

typedef struct {
    PyObject *key[NKEYS];
} Keys;

static void keys_clear(Keys *k) {
    for (int i = 0; i < NKEYS; i++) Py_CLEAR(k->key[i]);
}

static int keys_init(Keys *k) {
    memset(k, 0, sizeof(*k));
    for (int i = 0; i < NKEYS; i++) {
        if ((k->key[i] = PyUnicode_InternFromString(NAMES[i])) == NULL) {
            keys_clear(k);
            return -1;
        }
    }
    return 0;
}

/* One parsed event: 1 taken (facts folded into the outputs), 0 not of the usual shape, -1 error. */
static int fold(Keys *k, PyObject *chunk, PyObject **first_id, PyObject **finish, PyObject **role,
                int *seen, PyObject *pieces) {
    int err = 0, t;
    if (!PyDict_CheckExact(chunk)) return 0;
    if (get(chunk, k->key[ERROR], &err) != NULL) return 0;
    if (err) return -1;
    PyObject *choices = get(chunk, k->key[CHOICES], &err);
    if (err) return -1;
    if (choices == NULL || !PyList_CheckExact(choices) || PyList_GET_SIZE(choices) != 1) return 0;
    if ((t = truthy(get(chunk, k->key[USAGE], &err))) != 0 || err) return (t < 0 || err) ? -1 : 0;
    PyObject *first = PyList_GET_ITEM(choices, 0);
    if (!PyDict_CheckExact(first)) return 0;
    if ((t = truthy(get(first, k->key[LOGPROBS], &err))) != 0 || err) return (t < 0 || err) ? -1 : 0;
    PyObject *delta = get(first, k->key[DELTA], &err);
    if (err) return -1;
    if (delta == NULL || !PyDict_CheckExact(delta)) return 0;
    if ((t = truthy(get(delta, k->key[TOOL_CALLS], &err))) != 0 || err) return (t < 0 || err) ? -1 : 0;
    if ((t = truthy(get(delta, k->key[FUNCTION_CALL], &err))) != 0 || err) return (t < 0 || err) ? -1 : 0;

    /* taken: everything below only reads */
    PyObject *content = get(delta, k->key[CONTENT], &err);
    PyObject *reason = err ? NULL : get(first, k->key[FINISH_REASON], &err);
    PyObject *chunk_id = err ? NULL : get(chunk, k->key[ID], &err);
    if (err) return -1;
    if ((*first_id == NULL || *first_id == Py_None) && chunk_id != NULL && chunk_id != Py_None) {
        Py_INCREF(chunk_id);
        Py_XSETREF(*first_id, chunk_id);
    }
    if (content != NULL && PyUnicode_Check(content) && PyList_Append(pieces, content) < 0) return -1;
    int reason_true = truthy(reason);
    if (reason_true < 0) return -1;
    if (reason_true) {
        Py_INCREF(reason);
        Py_XSETREF(*finish, reason);
    }
    if (*role == NULL) {
        PyObject *r = get(delta, k->key[ROLE], &err);
        if (err) return -1;
        if ((t = truthy(r)) < 0) return -1;
        if (t) {
            Py_INCREF(r);
            *role = r;
        }
    }
    if (!*seen) {
        if ((t = truthy(content)) < 0) return -1;
        if (!t) t = reason_true;
        if (!t) {
            PyObject *text = get(first, k->key[TEXT], &err);
            if (err) return -1;
            if ((t = truthy(text)) < 0) return -1;
        }
        *seen = t;
    }
    return 1;
}

/* take(buffer, pos, end, sep, loads, wire) -> (pos, taken, first_id, finish, role, seen, pieces) */
static PyObject *take(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "take(buffer, pos, end, sep, loads, wire)");
        return NULL;
    }
    if (!PyBytes_Check(args[0]) || !PyBytes_Check(args[3]) || !PyList_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "buffer and sep must be bytes, wire a list");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    if (end == -1 && PyErr_Occurred()) return NULL;
    PyObject *buffer = args[0], *loads = args[4], *wire = args[5];
    const char *buf = PyBytes_AS_STRING(buffer);
    const char *sep = PyBytes_AS_STRING(args[3]);
    Py_ssize_t sep_len = PyBytes_GET_SIZE(args[3]);
    Py_ssize_t size = PyBytes_GET_SIZE(buffer);
    if (pos < 0) pos = 0;
    if (end > size) end = size;
    if (sep_len < 1) {
        PyErr_SetString(PyExc_ValueError, "sep must not be empty");
        return NULL;
    }
    Keys *k = (Keys *)PyModule_GetState(self);
    PyObject *pieces = PyList_New(0);
    PyObject *first_id = NULL, *finish = NULL, *role = NULL, *out = NULL;
    int seen = 0, failed = 0;
    Py_ssize_t taken = 0;
    if (pieces == NULL) failed = 1;
    while (!failed && pos < end) {
        const char *found = memmem(buf + pos, (size_t)(end - pos), sep, (size_t)sep_len);
        if (found == NULL) break;
        Py_ssize_t stop = found - buf;
        Py_ssize_t len = stop - pos;
        const char *body = buf + pos;
        if (len < 6 || memcmp(body, "data: ", 6) != 0 || memchr(body, '\n', (size_t)len) != NULL) break;
        Py_ssize_t a = pos + 6, b = stop;
        while (a < b && is_space(buf[a])) a++;
        while (b > a && is_space(buf[b - 1])) b--;
        if (b - a == 6 && memcmp(buf + a, "[DONE]", 6) == 0) break;
        PyObject *data = PyBytes_FromStringAndSize(buf + a, b - a);
        if (data == NULL) {
            failed = 1;
            break;
        }
        PyObject *chunk = PyObject_CallOneArg(loads, data);
        if (chunk == NULL) {  /* the general path reads it again and says what is wrong */
            PyErr_Clear();
            Py_DECREF(data);
            break;
        }
        int r = fold(k, chunk, &first_id, &finish, &role, &seen, pieces);
        Py_DECREF(chunk);
        if (r == 1 && PyList_Append(wire, data) < 0) r = -1;
        Py_DECREF(data);
        if (r < 0) failed = 1;
        if (r != 1) break;
        taken++;
        pos = stop + sep_len;
    }
    if (!failed) {
        out = Py_BuildValue("(nnOOOOO)", pos, taken, first_id ? first_id : Py_None, finish ? finish : Py_None,
                            role ? role : Py_None, seen ? Py_True : Py_False, pieces);
    }
    Py_XDECREF(pieces);
    Py_XDECREF(first_id);
    Py_XDECREF(finish);
    Py_XDECREF(role);
    return out;
}

static PyMethodDef methods[] = {
    {"take", (PyCFunction)(void (*)(void))take, METH_FASTCALL,
     "take(buffer, pos, end, sep, loads, wire) -> (pos, taken, first_id, finish, role, seen, pieces) "
     "(see kvgate.middleware.forward.sse_take.take)"},
    {NULL, NULL, 0, NULL},
};

/* the module state: its keys (above) */
static int exec_module(PyObject *module) { return keys_init((Keys *)PyModule_GetState(module)); }

static int traverse(PyObject *module, visitproc visit, void *arg) {
    (void)module; (void)visit; (void)arg;
    return 0;  /* interned strings only: no cycles to report */
}

static void free_module(void *module) {
    Keys *k = (Keys *)PyModule_GetState((PyObject *)module);
    if (k != NULL) keys_clear(k);
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvgate.middleware.forward._sse_take",
    .m_doc = "A chat stream's usual events, taken in a run, in C (kvgate.middleware.forward.sse_take).",
    .m_size = sizeof(Keys),
    .m_methods = methods,
    .m_slots = slots,
    .m_traverse = traverse,
    .m_free = free_module,
};

PyMODINIT_FUNC PyInit__sse_take(void) { return PyModuleDef_Init(&module_def); }

/* The prompt hasher's two SHA-256 loops, in C: the same names, arguments and results as
 * kvgate/index/kv/hash_loops.py, whose docstrings are the contracts. SHA-256 is OpenSSL's
 * (libcrypto, the library Python's hashlib uses), through its one-context interface: these loops
 * hash many short inputs, where a context on the stack costs nothing and the generic digest
 * interface's per-call set-up would be most of the work. Long runs of blocks are hashed without
 * the GIL, as hashlib does for long inputs.
 */
#define PY_SSIZE_T_CLEAN
#define OPENSSL_SUPPRESS_DEPRECATED
#include <Python.h>
#include <openssl/sha.h>
#include <string.h>

#define DIGEST 8             /* bytes of a block hash kept: the chain's truncated digest */
#define FREE_GIL_BLOCKS 256  /* from this many blocks on, a call lets other threads run meanwhile */

/* the bytes of a str (UTF-8, strict, as str.encode() gives them) or of a bytes object */
static int material_of(PyObject *item, const char **data, Py_ssize_t *size) {
    if (PyUnicode_Check(item)) {
        *data = PyUnicode_AsUTF8AndSize(item, size);
        return *data == NULL ? -1 : 0;
    }
    if (PyBytes_Check(item)) {
        *data = PyBytes_AS_STRING(item);
        *size = PyBytes_GET_SIZE(item);
        return 0;
    }
    PyErr_SetString(PyExc_TypeError, "a segment's material is a str or bytes");
    return -1;
}

static PyObject *segment_digests(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "segment_digests(root, materials)");
        return NULL;
    }
    if (!PyBytes_Check(args[0]) || PyBytes_GET_SIZE(args[0]) != SHA256_DIGEST_LENGTH) {
        PyErr_SetString(PyExc_ValueError, "root must be 32 bytes");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[1], "materials must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    unsigned char d[SHA256_DIGEST_LENGTH];
    memcpy(d, PyBytes_AS_STRING(args[0]), SHA256_DIGEST_LENGTH);
    for (Py_ssize_t k = 0; k < n; k++) {
        const char *data;
        Py_ssize_t size;
        if (material_of(PySequence_Fast_GET_ITEM(seq, k), &data, &size) < 0) goto fail;
        SHA256_CTX ctx;
        SHA256_Init(&ctx);
        SHA256_Update(&ctx, d, SHA256_DIGEST_LENGTH);
        SHA256_Update(&ctx, data, (size_t)size);
        SHA256_Final(d, &ctx);
        PyObject *digest = PyBytes_FromStringAndSize((const char *)d, SHA256_DIGEST_LENGTH);
        if (digest == NULL) goto fail;
        PyList_SET_ITEM(out, k, digest);
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_DECREF(seq);
    Py_DECREF(out);
    return NULL;
}

static void chain(const unsigned char *packed, Py_ssize_t blocks, Py_ssize_t step, const unsigned char *parent,
                  const unsigned char *prefix, Py_ssize_t prefix_size, unsigned char *out) {
    unsigned char full[SHA256_DIGEST_LENGTH];
    const unsigned char *h = parent;
    for (Py_ssize_t b = 0; b < blocks; b++) {
        SHA256_CTX ctx;
        SHA256_Init(&ctx);
        SHA256_Update(&ctx, h, DIGEST);
        SHA256_Update(&ctx, prefix, (size_t)prefix_size);
        SHA256_Update(&ctx, packed + b * step, (size_t)step);
        SHA256_Final(full, &ctx);
        memcpy(out + b * DIGEST, full, DIGEST);
        h = out + b * DIGEST;
    }
}

static PyObject *chain_digests(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "chain_digests(packed, step, parent, prefix)");
        return NULL;
    }
    Py_ssize_t step = PyLong_AsSsize_t(args[1]);
    if (step == -1 && PyErr_Occurred()) return NULL;
    if (step <= 0) {
        PyErr_SetString(PyExc_ValueError, "step must be positive");
        return NULL;
    }
    if (!PyBytes_Check(args[2]) || PyBytes_GET_SIZE(args[2]) != DIGEST) {
        PyErr_SetString(PyExc_ValueError, "parent must be 8 bytes");
        return NULL;
    }
    if (!PyBytes_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "prefix must be bytes");
        return NULL;
    }
    Py_buffer packed;
    if (PyObject_GetBuffer(args[0], &packed, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t blocks = packed.len / step;
    PyObject *out = PyBytes_FromStringAndSize(NULL, blocks * DIGEST);
    if (out != NULL && blocks > 0) {
        unsigned char parent[DIGEST];
        memcpy(parent, PyBytes_AS_STRING(args[2]), DIGEST);
        PyObject *prefix_obj = args[3];
        Py_INCREF(prefix_obj);  /* kept alive while the GIL may be let go */
        const unsigned char *prefix = (const unsigned char *)PyBytes_AS_STRING(prefix_obj);
        Py_ssize_t prefix_size = PyBytes_GET_SIZE(prefix_obj);
        unsigned char *dest = (unsigned char *)PyBytes_AS_STRING(out);
        if (blocks >= FREE_GIL_BLOCKS) {
            Py_BEGIN_ALLOW_THREADS
            chain((const unsigned char *)packed.buf, blocks, step, parent, prefix, prefix_size, dest);
            Py_END_ALLOW_THREADS
        } else {
            chain((const unsigned char *)packed.buf, blocks, step, parent, prefix, prefix_size, dest);
        }
        Py_DECREF(prefix_obj);
    }
    PyBuffer_Release(&packed);
    return out;
}

static PyMethodDef methods[] = {
    {"segment_digests", (PyCFunction)(void (*)(void))segment_digests, METH_FASTCALL,
     "segment_digests(root, materials) -> list of running digests (see hash_loops.segment_digests)"},
    {"chain_digests", (PyCFunction)(void (*)(void))chain_digests, METH_FASTCALL,
     "chain_digests(packed, step, parent, prefix) -> digests end to end (see hash_loops.chain_digests)"},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot slots[] = {
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvgate.index.kv._hash_loops",
    .m_doc = "The prompt hasher's SHA-256 loops, in C (kvgate.index.kv.hash_loops).",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC PyInit__hash_loops(void) { return PyModuleDef_Init(&module_def); }

/* The compiled decoder's field table (see _framec.h): the spec framecols.py derives from the pydantic
 * models, read once when a Decoder is made, into the Struct / Field the parser walks. */
#include "_framec.h"

#include <string.h>

void framec_free_struct(Struct *s) {
    if (s == NULL) return;
    for (int i = 0; i < s->n; i++) {
        Field *f = &s->fields[i];
        PyMem_Free(f->name);
        Py_XDECREF(f->options);
        Py_XDECREF(f->deflt);
        framec_free_struct(f->item);
    }
    PyMem_Free(s->fields);
    PyMem_Free(s);
}

/* A field: (name: bytes, kind, nullable, required, out, lo_mode, lo, hi_mode, hi, lo_i, hi_i, min_len,
 * max_len, pattern: (first: bytes[256], rest: bytes[256]) | None, options: tuple[str] | None,
 * item: struct spec | None, plane: bool, default) */
static int parse_field(Field *f, PyObject *t, int depth) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 18) {
        PyErr_SetString(PyExc_TypeError, "a field is an 18-tuple");
        return -1;
    }
    char *name;
    Py_ssize_t name_len;
    if (PyBytes_AsStringAndSize(PyTuple_GET_ITEM(t, 0), &name, &name_len) < 0) return -1;
    f->name = PyMem_Malloc(name_len + 1);
    if (f->name == NULL) { PyErr_NoMemory(); return -1; }
    memcpy(f->name, name, name_len + 1);
    f->name_len = name_len;
    f->kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(t, 1));
    f->nullable = PyObject_IsTrue(PyTuple_GET_ITEM(t, 2));
    f->required = PyObject_IsTrue(PyTuple_GET_ITEM(t, 3));
    f->out = (int)PyLong_AsLong(PyTuple_GET_ITEM(t, 4));
    f->lo_mode = (int)PyLong_AsLong(PyTuple_GET_ITEM(t, 5));
    f->lo = PyFloat_AsDouble(PyTuple_GET_ITEM(t, 6));
    f->hi_mode = (int)PyLong_AsLong(PyTuple_GET_ITEM(t, 7));
    f->hi = PyFloat_AsDouble(PyTuple_GET_ITEM(t, 8));
    f->lo_i = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 9));
    f->hi_i = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 10));
    f->min_len = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 11));
    f->max_len = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 12));
    if (PyErr_Occurred()) return -1;
    PyObject *pattern = PyTuple_GET_ITEM(t, 13);
    f->has_pattern = pattern != Py_None;
    if (f->has_pattern) {
        if (!PyTuple_Check(pattern) || PyTuple_GET_SIZE(pattern) != 2 ||
            !PyBytes_Check(PyTuple_GET_ITEM(pattern, 0)) || PyBytes_GET_SIZE(PyTuple_GET_ITEM(pattern, 0)) != 256 ||
            !PyBytes_Check(PyTuple_GET_ITEM(pattern, 1)) || PyBytes_GET_SIZE(PyTuple_GET_ITEM(pattern, 1)) != 256) {
            PyErr_SetString(PyExc_TypeError, "a pattern is two 256-byte tables");
            return -1;
        }
        memcpy(f->first, PyBytes_AS_STRING(PyTuple_GET_ITEM(pattern, 0)), 256);
        memcpy(f->rest, PyBytes_AS_STRING(PyTuple_GET_ITEM(pattern, 1)), 256);
    }
    PyObject *options = PyTuple_GET_ITEM(t, 14);
    if (options != Py_None) {
        if (!PyTuple_Check(options)) {
            PyErr_SetString(PyExc_TypeError, "options are a tuple of str");
            return -1;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(options); i++) {
            if (!PyUnicode_Check(PyTuple_GET_ITEM(options, i))) {
                PyErr_SetString(PyExc_TypeError, "options are a tuple of str");
                return -1;
            }
        }
        Py_INCREF(options);
        f->options = options;
    }
    PyObject *item = PyTuple_GET_ITEM(t, 15);
    if (item != Py_None) {
        f->item = framec_parse_struct(item, depth + 1);
        if (f->item == NULL) return -1;
    }
    f->plane = PyObject_IsTrue(PyTuple_GET_ITEM(t, 16));
    f->deflt = PyTuple_GET_ITEM(t, 17);
    Py_INCREF(f->deflt);
    if (f->kind < K_FLOAT || f->kind > K_LIST_STRUCT || (f->kind == K_LITERAL && f->options == NULL) ||
        (f->kind == K_LIST_STRUCT && f->item == NULL)) {
        PyErr_SetString(PyExc_TypeError, "a field's kind does not match its table");
        return -1;
    }
    return 0;
}

Struct *framec_parse_struct(PyObject *spec, int depth) {
    if (depth > MAX_DEPTH) {
        PyErr_SetString(PyExc_TypeError, "structs nest too deep");
        return NULL;
    }
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) > MAX_FIELDS) {
        PyErr_SetString(PyExc_TypeError, "a struct is a tuple of at most 128 fields");
        return NULL;
    }
    Struct *s = PyMem_Calloc(1, sizeof(Struct));
    if (s == NULL) { PyErr_NoMemory(); return NULL; }
    s->n = (int)PyTuple_GET_SIZE(spec);
    s->fields = PyMem_Calloc(s->n ? s->n : 1, sizeof(Field));
    if (s->fields == NULL) { PyMem_Free(s); PyErr_NoMemory(); return NULL; }
    for (int i = 0; i < s->n; i++) {
        if (parse_field(&s->fields[i], PyTuple_GET_ITEM(spec, i), depth) < 0) {
            s->n = i + 1;
            framec_free_struct(s);
            return NULL;
        }
    }
    return s;
}

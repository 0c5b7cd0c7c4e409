/* The controller's columnar frame decoder, compiled: a NodeFrame's JSON in, its GPU readings written as
 * float64 straight into a caller's preallocated plane, with no Python object per value.
 *
 * It is an accelerator of healer/schemas/framecols.py and never the judge of a document: it interprets
 * a field table that framecols.py derives from the pydantic models (names, kinds, bounds, lengths, the
 * node-name pattern as two byte tables), accepts only documents it can decide exactly (ASCII strings
 * without escapes, integers of at most 18 digits, each key once, known keys only) and returns None for
 * every other document, which then takes the pure-Python path (msgspec, then pydantic). So whatever it
 * accepts, msgspec's strict decoder accepts too with the same values, and every rejection and its reason
 * is decided by the same code as without it. tests/schemas/test_framecols.py runs both paths on the same
 * documents.
 *
 * Decoder(spec, plane_width, rows_max) -> object with decode(data, plane, row) -> tuple | None:
 *   spec: the top-level struct: a tuple of field tuples (see parse_field), plane_width: columns per row,
 *   rows_max: the rows a plane must have free from ``row`` (ValueError otherwise).
 *   data: bytes; plane: a writable C-contiguous float64 buffer; row: the first row to write.
 *   Returns the top-level outputs in slot order plus the number of plane rows written and the largest
 *   value of column 0 (the GPU index) over them (-1 with none), or None (not decided here).
 *
 * Only Python's stable C API and the buffer protocol are used: no numpy headers at build time.
 *
 * This file is the Decoder type and the module; the field table is _framec_table.c, the parser
 * _framec_parse.c, their shared declarations _framec.h.
 */
#include "_framec.h"

#include <string.h>

typedef struct {
    PyObject_HEAD
    Struct *top;
    int width;
    Py_ssize_t rows_max;
    int n_out;
} DecoderObject;

/* -- the type -------------------------------------------------------------------------------------- */

static int count_outs(const Struct *s) {
    int n = 0;
    for (int i = 0; i < s->n; i++) if (s->fields[i].out >= n) n = s->fields[i].out + 1;
    return n;
}

static PyObject *Decoder_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *spec;
    int width;
    Py_ssize_t rows_max;
    if (!PyArg_ParseTuple(args, "Oin", &spec, &width, &rows_max)) return NULL;
    if (width < 1) {
        PyErr_SetString(PyExc_ValueError, "the plane has at least one column");
        return NULL;
    }
    Struct *top = framec_parse_struct(spec, 0);
    if (top == NULL) return NULL;
    for (int i = 0; i < top->n; i++) {
        const Field *f = &top->fields[i];
        if (f->plane && f->item != NULL) {
            for (int j = 0; j < f->item->n; j++) {
                if (f->item->fields[j].out >= width) {
                    framec_free_struct(top);
                    PyErr_SetString(PyExc_ValueError, "a plane column is past the plane's width");
                    return NULL;
                }
            }
        }
    }
    DecoderObject *self = (DecoderObject *)type->tp_alloc(type, 0);
    if (self == NULL) { framec_free_struct(top); return NULL; }
    self->top = top;
    self->width = width;
    self->rows_max = rows_max;
    self->n_out = count_outs(top);
    return (PyObject *)self;
}

static void Decoder_dealloc(DecoderObject *self) {
    framec_free_struct(self->top);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Decoder_decode(DecoderObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "decode(data, plane, row)");
        return NULL;
    }
    Py_buffer data, plane;
    if (PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[1], &plane, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    PyObject *result = NULL;
    PyObject *outs[MAX_FIELDS];
    for (int i = 0; i < self->n_out; i++) outs[i] = NULL;
    Py_ssize_t row = PyLong_AsSsize_t(args[2]);
    if (row == -1 && PyErr_Occurred()) goto done;
    if (plane.itemsize != 8 || (plane.format != NULL && strcmp(plane.format, "d") != 0)) {
        PyErr_SetString(PyExc_TypeError, "the plane is float64");
        goto done;
    }
    Py_ssize_t rows_total = plane.len / 8 / self->width;
    if (row < 0 || rows_total - row < self->rows_max || plane.len != rows_total * 8 * self->width) {
        PyErr_Format(PyExc_ValueError, "a plane of %d columns with %zd rows free from row %zd is needed",
                     self->width, self->rows_max, row);
        goto done;
    }
    Cursor c = {
        .p = data.buf, .end = (const unsigned char *)data.buf + data.len, .plane = plane.buf,
        .rows_left = rows_total - row, .row_at = row, .width = self->width, .rows = 0, .max_key = -1.0,
        .outs = outs,
    };
    int r = framec_parse_document(&c, self->top);
    if (r == FAIL) goto done;
    if (r == DEFER) {
        if (PyErr_Occurred()) goto done;
        Py_INCREF(Py_None);
        result = Py_None;
        goto done;
    }
    result = PyTuple_New(self->n_out + 2);
    if (result == NULL) goto done;
    for (int i = 0; i < self->n_out; i++) {
        PyObject *v = outs[i];
        if (v == NULL) { v = Py_None; Py_INCREF(v); }
        PyTuple_SET_ITEM(result, i, v);
        outs[i] = NULL;
    }
    PyObject *rows = PyLong_FromSsize_t(c.rows);
    PyObject *key = PyLong_FromLongLong((long long)c.max_key);
    if (rows == NULL || key == NULL) {
        Py_XDECREF(rows);
        Py_XDECREF(key);
        Py_CLEAR(result);
        goto done;
    }
    PyTuple_SET_ITEM(result, self->n_out, rows);
    PyTuple_SET_ITEM(result, self->n_out + 1, key);
done:
    for (int i = 0; i < self->n_out; i++) Py_XDECREF(outs[i]);
    PyBuffer_Release(&plane);
    PyBuffer_Release(&data);
    return result;
}

static PyMethodDef Decoder_methods[] = {
    {"decode", (PyCFunction)(void (*)(void))Decoder_decode, METH_FASTCALL,
     "decode(data, plane, row) -> tuple | None: the frame's outputs, rows written and largest index; "
     "None when the pure-Python path must decide"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "healer.schemas._framec.Decoder",
    .tp_basicsize = sizeof(DecoderObject),
    .tp_dealloc = (destructor)Decoder_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Decoder(spec, plane_width, rows_max): a NodeFrame's GPU readings into a float64 plane",
    .tp_methods = Decoder_methods,
    .tp_new = Decoder_new,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_framec", "The columnar frame decoder (see healer/schemas/framecols.py).", -1, NULL,
};

PyMODINIT_FUNC PyInit__framec(void) {
    if (PyType_Ready(&DecoderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "VERSION", FRAMEC_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&DecoderType);
    if (PyModule_AddObject(m, "Decoder", (PyObject *)&DecoderType) < 0) {
        Py_DECREF(&DecoderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { K_FLOAT = 1, K_INT = 2, K_BOOL = 3, K_STR = 4, K_LITERAL = 5, K_LIST_STR = 6, K_LIST_STRUCT = 7 };
enum { B_NONE = 0, B_INCL = 1, B_EXCL = 2 };

#define FRAMEC_VERSION 1 /* framecols.py uses a built module only of the version it was written for */
#define MAX_FIELDS 128
#define MAX_DEPTH 4

typedef struct Struct Struct;

typedef struct {
    char *name;
    Py_ssize_t name_len;
    int kind;
    int nullable;
    int required;
    int out;                 /* top level: output slot; plane struct: column; -1: not output */
    int lo_mode, hi_mode;    /* floats: B_INCL (ge/le) or B_EXCL (gt/lt) against lo/hi */
    double lo, hi;
    long long lo_i, hi_i;    /* ints: inclusive bounds (framecols.py folds gt/lt into them) */
    Py_ssize_t min_len, max_len; /* strings: characters; lists: items; -1: none */
    unsigned char first[256], rest[256];
    int has_pattern;
    PyObject *options;       /* literals: a tuple of str (their UTF-8 is compared) */
    Struct *item;            /* list of struct: the items' struct */
    int plane;               /* list of struct: its items are the plane's rows */
    PyObject *deflt;         /* top level: the value of a missing optional field */
} Field;

struct Struct {
    Field *fields;
    int n;
};

typedef struct {
    PyObject_HEAD
    Struct *top;
    int width;
    Py_ssize_t rows_max;
    int n_out;
} DecoderObject;

/* -- the field table ---------------------------------------------------------------------------- */

static void free_struct(Struct *s) {
    if (s == NULL) return;
    for (int i = 0; i < s->n; i++) {
        Field *f = &s->fields[i];
        PyMem_Free(f->name);
        Py_XDECREF(f->options);
        Py_XDECREF(f->deflt);
        free_struct(f->item);
    }
    PyMem_Free(s->fields);
    PyMem_Free(s);
}

static Struct *parse_struct(PyObject *spec, int depth);

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
        f->item = parse_struct(item, depth + 1);
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

static Struct *parse_struct(PyObject *spec, int depth) {
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
            free_struct(s);
            return NULL;
        }
    }
    return s;
}

/* -- parsing --------------------------------------------------------------------------------------- */

typedef struct {
    const unsigned char *p, *end;
    double *plane;
    Py_ssize_t rows_left; /* plane rows available from row_at */
    Py_ssize_t row_at;
    int width;
    Py_ssize_t rows; /* rows written */
    double max_key;
    PyObject **outs;
} Cursor;

#define DEFER (-1) /* not decided here: the pure-Python path decides */
#define FAIL (-2)  /* a Python error is set (memory) */

static inline void skip_ws(Cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t')) c->p++;
}

/* Eight bytes at once: a byte below 0x20, a quote, a backslash or a byte past 0x7f among them. */
static inline int special8(uint64_t x) {
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    uint64_t q = x ^ (ones * '"'), b = x ^ (ones * '\\');
    uint64_t found = ((x - ones * 0x20) | (q - ones) | (b - ones)) & ~x & highs;
    return (found | (x & highs)) != 0;
}

/* A string without escapes, control or non-ASCII characters: its bytes, between the quotes. */
static inline int read_str(Cursor *c, const unsigned char **s, Py_ssize_t *n) {
    if (c->p >= c->end || *c->p != '"') return DEFER;
    const unsigned char *start = ++c->p;
    while (c->end - c->p >= 8) {
        uint64_t x;
        memcpy(&x, c->p, 8);
        if (special8(x)) break;
        c->p += 8;
    }
    while (c->p < c->end) {
        unsigned char ch = *c->p;
        if (ch == '"') {
            *s = start;
            *n = c->p - start;
            c->p++;
            return 0;
        }
        if (ch < 0x20 || ch == '\\' || ch >= 0x80) return DEFER;
        c->p++;
    }
    return DEFER;
}

/* The key at the cursor is exactly ``name`` (a field name: ASCII, no quote or backslash). */
static inline int key_is(const Cursor *c, const Field *f) {
    Py_ssize_t n = f->name_len;
    if (c->end - c->p < n + 2) return 0;
    const unsigned char *p = c->p + 1;
    const char *q = f->name;
    while (n >= 8) {
        uint64_t a, b;
        memcpy(&a, p, 8);
        memcpy(&b, q, 8);
        if (a != b) return 0;
        p += 8, q += 8, n -= 8;
    }
    while (n > 0) {
        if (*p != (unsigned char)*q) return 0;
        p++, q++, n--;
    }
    return *p == '"';
}

static inline int literal(Cursor *c, const char *word, Py_ssize_t n) {
    if (c->end - c->p < n || memcmp(c->p, word, n) != 0) return 0;
    c->p += n;
    return 1;
}

static const double POW10[] = {
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
};

#define TWO53 9007199254740992.0

/* A JSON number. *is_int: it has neither fraction nor exponent (then *iv holds it: at most 18 digits);
 * otherwise *dv holds it, correctly rounded, finite and normal (anything else defers). */
static int read_number(Cursor *c, int *is_int, long long *iv, double *dv) {
    const unsigned char *start = c->p;
    int neg = 0;
    if (c->p < c->end && *c->p == '-') { neg = 1; c->p++; }
    if (c->p >= c->end || *c->p < '0' || *c->p > '9') return DEFER;
    uint64_t m = 0;   /* the first 19 significant digits */
    int digits = 0;   /* significant digits in m */
    int dropped = 0;  /* significant digits past those 19 (m is then not exact) */
    int exp10 = 0;    /* the value is m * 10^exp10 (when nothing was dropped) */
    int int_digits = 0;
    if (*c->p == '0') {
        c->p++;
        if (c->p < c->end && *c->p >= '0' && *c->p <= '9') return DEFER; /* a leading zero: not JSON */
    } else {
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            if (digits < 19) { m = m * 10 + (uint64_t)(*c->p - '0'); digits++; }
            else { dropped++; exp10++; }
            int_digits++;
            c->p++;
        }
    }
    int is_float = 0;
    if (c->p < c->end && *c->p == '.') {
        is_float = 1;
        c->p++;
        if (c->p >= c->end || *c->p < '0' || *c->p > '9') return DEFER;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            if (m == 0 && *c->p == '0') exp10--; /* a leading zero of the fraction */
            else if (digits < 19) { m = m * 10 + (uint64_t)(*c->p - '0'); digits++; exp10--; }
            else dropped++;
            c->p++;
        }
    }
    if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
        is_float = 1;
        c->p++;
        int eneg = 0;
        if (c->p < c->end && (*c->p == '+' || *c->p == '-')) { eneg = *c->p == '-'; c->p++; }
        if (c->p >= c->end || *c->p < '0' || *c->p > '9') return DEFER;
        int e = 0;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            if (e < 100000) e = e * 10 + (*c->p - '0');
            c->p++;
        }
        exp10 += eneg ? -e : e;
    }
    if (!is_float) {
        *is_int = 1;
        if (int_digits > 18) return DEFER;
        *iv = neg ? -(long long)m : (long long)m;
        return 0;
    }
    *is_int = 0;
    double v;
    if (!dropped && m <= (uint64_t)TWO53 && exp10 >= -22 && exp10 <= 22) {
        /* Clinger's fast path: both operands exact, one rounding, so correctly rounded. */
        v = exp10 >= 0 ? (double)m * POW10[exp10] : (double)m / POW10[-exp10];
        if (neg) v = -v; /* -0.0 stays -0.0, as msgspec reads it */
    } else {
        /* Python's own correctly rounded conversion (dtoa.c), of the token as written (sign included). */
        char buf[80];
        Py_ssize_t len = c->p - start;
        if (len >= (Py_ssize_t)sizeof(buf)) return DEFER;
        memcpy(buf, start, len);
        buf[len] = '\0';
        char *stop = NULL;
        v = PyOS_string_to_double(buf, &stop, NULL);
        if (v == -1.0 && PyErr_Occurred()) { PyErr_Clear(); return DEFER; }
        if (stop != buf + len) return DEFER;
        if (v == 0.0 && m != 0) return DEFER; /* underflow */
    }
    if (!isfinite(v) || (v != 0.0 && fabs(v) < 2.2250738585072014e-308)) return DEFER; /* subnormal */
    *dv = v;
    return 0;
}

static int parse_struct_value(Cursor *c, const Struct *s, int is_top, int is_plane_row, int depth);

static inline int float_ok(const Field *f, double v) {
    if (f->lo_mode == B_INCL && !(v >= f->lo)) return 0;
    if (f->lo_mode == B_EXCL && !(v > f->lo)) return 0;
    if (f->hi_mode == B_INCL && !(v <= f->hi)) return 0;
    if (f->hi_mode == B_EXCL && !(v < f->hi)) return 0;
    return 1;
}

/* One field's value. ``slot``: where a top-level output goes (NULL: none); ``col``: the plane cell. */
static int parse_value(Cursor *c, const Field *f, PyObject **slot, double *col, int depth) {
    skip_ws(c);
    if (c->p >= c->end) return DEFER;
    if (*c->p == 'n') {
        if (!f->nullable || !literal(c, "null", 4)) return DEFER;
        if (slot) { Py_INCREF(Py_None); *slot = Py_None; }
        if (col) *col = NAN;
        return 0;
    }
    switch (f->kind) {
    case K_FLOAT: {
        int is_int; long long iv = 0; double dv = 0;
        int r = read_number(c, &is_int, &iv, &dv);
        if (r) return r;
        if (is_int) dv = (double)iv; /* msgspec reads an integer token as an int: -0 is 0.0 */
        if (!float_ok(f, dv)) return DEFER;
        if (col) *col = dv;
        if (slot && (*slot = PyFloat_FromDouble(dv)) == NULL) return FAIL;
        return 0;
    }
    case K_INT: {
        int is_int; long long iv = 0; double dv = 0;
        int r = read_number(c, &is_int, &iv, &dv);
        if (r) return r;
        if (!is_int || iv < f->lo_i || iv > f->hi_i) return DEFER;
        if (col) {
            if (iv > (long long)TWO53 || iv < -(long long)TWO53) return DEFER; /* float64 holds it exactly */
            *col = (double)iv;
        }
        if (slot && (*slot = PyLong_FromLongLong(iv)) == NULL) return FAIL;
        return 0;
    }
    case K_BOOL: {
        int v;
        if (literal(c, "true", 4)) v = 1;
        else if (literal(c, "false", 5)) v = 0;
        else return DEFER;
        if (col) *col = v ? 1.0 : 0.0;
        if (slot) { *slot = v ? Py_True : Py_False; Py_INCREF(*slot); }
        return 0;
    }
    case K_STR: {
        const unsigned char *s; Py_ssize_t n;
        int r = read_str(c, &s, &n);
        if (r) return r;
        if (n < f->min_len || (f->max_len >= 0 && n > f->max_len)) return DEFER;
        if (f->has_pattern) {
            if (n == 0 || !f->first[s[0]]) return DEFER;
            for (Py_ssize_t i = 1; i < n; i++) if (!f->rest[s[i]]) return DEFER;
        }
        if (col) return DEFER; /* strings have no plane cell */
        if (slot) {
            PyObject *str = PyUnicode_New(n, 127);
            if (str == NULL) return FAIL;
            memcpy(PyUnicode_DATA(str), s, n);
            *slot = str;
        }
        return 0;
    }
    case K_LITERAL: {
        const unsigned char *s; Py_ssize_t n;
        int r = read_str(c, &s, &n);
        if (r) return r;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(f->options); i++) {
            PyObject *opt = PyTuple_GET_ITEM(f->options, i);
            Py_ssize_t on;
            const char *os = PyUnicode_AsUTF8AndSize(opt, &on);
            if (os == NULL) return FAIL;
            if (on == n && memcmp(os, s, n) == 0) {
                if (slot) { Py_INCREF(opt); *slot = opt; }
                return 0;
            }
        }
        return DEFER;
    }
    case K_LIST_STR:
    case K_LIST_STRUCT: {
        if (*c->p != '[') return DEFER;
        c->p++;
        Py_ssize_t count = 0;
        skip_ws(c);
        if (c->p < c->end && *c->p == ']') {
            c->p++;
        } else {
            for (;;) {
                if (f->max_len >= 0 && count >= f->max_len) return DEFER;
                skip_ws(c);
                int r;
                if (f->kind == K_LIST_STR) {
                    const unsigned char *s; Py_ssize_t n;
                    r = read_str(c, &s, &n);
                } else {
                    r = parse_struct_value(c, f->item, 0, f->plane, depth + 1);
                }
                if (r) return r;
                count++;
                skip_ws(c);
                if (c->p >= c->end) return DEFER;
                if (*c->p == ',') { c->p++; continue; }
                if (*c->p == ']') { c->p++; break; }
                return DEFER;
            }
        }
        if (count < f->min_len) return DEFER;
        if (slot && (*slot = PyLong_FromSsize_t(count)) == NULL) return FAIL;
        return 0;
    }
    }
    return DEFER;
}

static inline int find_field(const Struct *s, const unsigned char *key, Py_ssize_t n, int guess) {
    if (guess < s->n) {
        const Field *f = &s->fields[guess];
        if (f->name_len == n && memcmp(f->name, key, n) == 0) return guess;
    }
    for (int i = 0; i < s->n; i++) {
        const Field *f = &s->fields[i];
        if (f->name_len == n && memcmp(f->name, key, n) == 0) return i;
    }
    return -1;
}

/* An object of struct ``s``: the top-level document (outputs into c->outs) or a plane row (cells into
 * the plane at the next row) or an item only validated. */
static int parse_struct_value(Cursor *c, const Struct *s, int is_top, int is_plane_row, int depth) {
    if (depth > MAX_DEPTH) return DEFER;
    skip_ws(c);
    if (c->p >= c->end || *c->p != '{') return DEFER;
    c->p++;
    double *row = NULL;
    if (is_plane_row) {
        if (c->rows >= c->rows_left) return DEFER;
        row = c->plane + (c->row_at + c->rows) * c->width;
        for (int i = 0; i < c->width; i++) row[i] = NAN;
    }
    unsigned char seen[MAX_FIELDS];
    memset(seen, 0, (size_t)s->n);
    int next = 0;
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
    } else {
        for (;;) {
            skip_ws(c);
            int i, r;
            if (next < s->n && c->p < c->end && *c->p == '"' && key_is(c, &s->fields[next])) {
                i = next; /* the usual order: the next field of the model */
                c->p += s->fields[next].name_len + 2;
            } else {
                const unsigned char *key; Py_ssize_t kn;
                r = read_str(c, &key, &kn);
                if (r) return r;
                i = find_field(s, key, kn, next);
            }
            if (i < 0 || seen[i]) return DEFER; /* an unknown field, or one given twice */
            seen[i] = 1;
            next = i + 1;
            skip_ws(c);
            if (c->p >= c->end || *c->p != ':') return DEFER;
            c->p++;
            const Field *f = &s->fields[i];
            PyObject **slot = is_top && f->out >= 0 ? &c->outs[f->out] : NULL;
            double *col = row != NULL && f->out >= 0 ? &row[f->out] : NULL;
            r = parse_value(c, f, slot, col, depth);
            if (r) return r;
            skip_ws(c);
            if (c->p >= c->end) return DEFER;
            if (*c->p == ',') { c->p++; continue; }
            if (*c->p == '}') { c->p++; break; }
            return DEFER;
        }
    }
    for (int i = 0; i < s->n; i++) {
        if (seen[i]) continue;
        const Field *f = &s->fields[i];
        if (f->required) return DEFER;
        if (is_top && f->out >= 0) {
            Py_INCREF(f->deflt);
            c->outs[f->out] = f->deflt;
        }
    }
    if (row != NULL) {
        if (row[0] > c->max_key) c->max_key = row[0];
        c->rows++;
    }
    return 0;
}

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
    Struct *top = parse_struct(spec, 0);
    if (top == NULL) return NULL;
    for (int i = 0; i < top->n; i++) {
        const Field *f = &top->fields[i];
        if (f->plane && f->item != NULL) {
            for (int j = 0; j < f->item->n; j++) {
                if (f->item->fields[j].out >= width) {
                    free_struct(top);
                    PyErr_SetString(PyExc_ValueError, "a plane column is past the plane's width");
                    return NULL;
                }
            }
        }
    }
    DecoderObject *self = (DecoderObject *)type->tp_alloc(type, 0);
    if (self == NULL) { free_struct(top); return NULL; }
    self->top = top;
    self->width = width;
    self->rows_max = rows_max;
    self->n_out = count_outs(top);
    return (PyObject *)self;
}

static void Decoder_dealloc(DecoderObject *self) {
    free_struct(self->top);
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
    int r = parse_struct_value(&c, self->top, 1, 0, 0);
    if (r == 0) {
        skip_ws(&c);
        if (c.p != c.end) r = DEFER; /* trailing characters */
    }
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

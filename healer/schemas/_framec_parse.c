/* The compiled decoder's parser (see _framec.h): one NodeFrame's JSON against the field table, decided
 * exactly or deferred. Strings without escapes, control or non-ASCII characters; numbers read as msgspec
 * reads them (correctly rounded, finite and normal); each key once, known keys only; values within the
 * table's bounds, lengths and patterns. Anything else is DEFER: the pure-Python path decides it. */
#include "_framec.h"

#include <math.h>
#include <string.h>

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

int framec_parse_document(Cursor *c, const Struct *top) {
    int r = parse_struct_value(c, top, 1, 0, 0);
    if (r == 0) {
        skip_ws(c);
        if (c->p != c->end) r = DEFER; /* trailing characters */
    }
    return r;
}

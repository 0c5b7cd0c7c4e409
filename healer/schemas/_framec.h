/* The compiled columnar frame decoder's shared declarations (healer/schemas/_framec.c and its parts).
 *
 * Three compilation units, one module (pyproject.toml's ext-modules builds them together):
 *   _framec_table.c  the field table: framecols.py's spec tuples read into Struct / Field;
 *   _framec_parse.c  parsing: one JSON document against a Struct, values into outputs and plane rows;
 *   _framec.c        the Decoder type and the module (what Python sees), and what the whole decoder is.
 * Functions shared between them are named framec_* and hidden from the module's symbol table.
 */
#ifndef HEALER_FRAMEC_H
#define HEALER_FRAMEC_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define FRAMEC_INTERNAL __attribute__((visibility("hidden")))
#else
#define FRAMEC_INTERNAL
#endif

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

/* One document being parsed: the bytes left, the plane rows being written, the top-level outputs. */
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

/* The field table (_framec_table.c): a struct spec (a tuple of field tuples) read, or NULL with a Python
 * error set; and freed. */
FRAMEC_INTERNAL Struct *framec_parse_struct(PyObject *spec, int depth);
FRAMEC_INTERNAL void framec_free_struct(Struct *s);

/* Parsing (_framec_parse.c): the whole document at the cursor as struct ``top``, outputs into c->outs
 * and plane rows from c->row_at; 0, DEFER (trailing characters included) or FAIL. */
FRAMEC_INTERNAL int framec_parse_document(Cursor *c, const Struct *top);

#endif

/* Kineto trace scanner: the JSON bytes of a trace -> column buffers, in one pass.
 *
 * Why it exists: building one Python object per event and field costs ~1.5 us per event, several
 * times what reading the bytes costs; HTA spends most of its time there. This scanner reads the
 * fields tracekit's ingest uses (ph, cat, name, pid, tid, ts, dur and, of args, stream,
 * correlation, "External id" and "Collective name") straight into typed arrays, interns the
 * few distinct texts once each, and records where each event's args object lies so that the
 * rare rows that need more of it (collective calls, thread names, memory events) are decoded
 * from those bytes later.
 *
 * It is a fast path, never the judge: on anything it is not certain to read exactly as the
 * msgspec path of tracekit/ingest/kineto_decode.py does (malformed JSON, a lone surrogate, a
 * duplicate or escaped key it uses, a field of an unusual type, numbers beyond int64, nesting
 * deeper than MAX_DEPTH) it returns None and the caller takes that path, which also words the
 * error. Everything it skips is still validated as JSON (including UTF-8), so it never accepts
 * a file the msgspec path refuses.
 *
 * scan(data: bytes | bytearray, stop: bytearray | None = None)
 *     -> None | (n, strings, (arrow_schema, arrow_array), top)
 *   n        number of rows: the events of traceEvents whose ph is X, M or i, in file order
 *   strings  list of str; strings[0] is None (the code of a missing or null field)
 *   columns  PyCapsules of one Arrow struct array with n rows (polars: pl.DataFrame of an
 *            object whose __arrow_c_array__ returns them):
 *            ph, cat, name, pid, tid, coll_name: uint32 codes into strings, null for code 0
 *              (pid/tid integers as their decimal text, like str(int));
 *            ts, dur: float64, NaN where missing or null;
 *            stream_arg, correlation, external_id: int64 or null;
 *            args_start, args_end: int64 byte offsets of the event's args object (0, 0: none)
 *   top      dict: distributedInfo / deviceProperties / baseTimeNanoseconds / host_name ->
 *            (start, end) byte offsets of that value
 *
 * Bounded and interruptible (issue #24). Texts are interned in a hash table keyed by
 * SipHash-1-3 (Aumasson & Bernstein, "SipHash: a fast short-input PRF", 2012; the variant
 * CPython and Rust use for their dicts) under a random key drawn once per process: a trace
 * cannot carry names built to collide, as it could under the unseeded FNV-1a used before (n^2
 * probes: 42 MB of such names took 2 min 42 s). A probe longer than MAX_PROBE, which a random
 * key makes vanishingly unlikely, declines the file all the same (the msgspec path, linear).
 * Every CHECK_BYTES of input the scan looks at ``stop`` (a byte another thread sets: the scan
 * returns None, and its caller, which set it, raises) and, in the main thread, lets Python run
 * its signal handlers (Ctrl-C raises KeyboardInterrupt out of scan()).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stddef.h>
#include <signal.h>
#include <unistd.h>

#define MAX_DEPTH 200
#define NULL_I64 INT64_MIN
#define MAX_PROBE 256             /* linear probes of one lookup; a random key keeps them short */
#define CHECK_BYTES (1 << 20)     /* input between two looks at ``stop`` and at signals */

/* The scan runs without the GIL (several ranks' files scan in parallel threads): it makes no
 * Python objects and raises nothing, except at a checkpoint of the main thread, which takes
 * the GIL back to run signal handlers (RAISED: their exception is set). Texts become str, and
 * the rare numbers beyond the exact fast path become doubles, once it is done and the GIL is
 * held again. */
enum { OK = 0, DECLINE = 1, NOMEM = 2, STOPPED = 3, RAISED = 4 };
#define TRY(x) do { int r_ = (x); if (r_ != OK) return r_; } while (0)

typedef struct {
    const unsigned char *s;   /* token bytes (between the quotes for strings) */
    uint32_t len, hash, code;
    int number;               /* an integer token (pid/tid), not a string */
    int escaped;
} Entry;

typedef struct {              /* a number the fast path could not convert exactly */
    const unsigned char *b, *e;
    int dur;                  /* which column: ts (0) or dur (1); not a pointer, since the */
    size_t row;               /* columns move when they grow */
} Deferred;

typedef struct {
    const unsigned char *base, *p, *end;
    size_t n, cap;
    uint32_t *ph, *cat, *name, *pid, *tid, *coll;
    double *ts, *dur;
    int64_t *stream, *corr, *ext, *a0, *a1;
    Entry *tab;               /* hash table of the distinct texts */
    size_t tab_cap, tab_n;
    Entry *texts;             /* the same, by code - 1 */
    size_t texts_cap;
    Deferred *deferred;
    size_t n_deferred, deferred_cap;
    Py_ssize_t top[4][2];
    const volatile unsigned char *stop;   /* nonzero: asked to stop (NULL: never asked) */
    const unsigned char *check_at;        /* where the next checkpoint is */
    PyThreadState *thread;                /* the main thread's state while the GIL is released */
} Scan;

/* Every CHECK_BYTES: stop when asked to; in the main thread, run Python's signal handlers
 * (only the main thread runs them, and a scan of a big trace takes seconds). */
static int checkpoint(Scan *s) {
    s->check_at = s->p + CHECK_BYTES;
    if (s->stop && *s->stop) return STOPPED;
    if (s->thread) {
        PyEval_RestoreThread(s->thread);
        int r = PyErr_CheckSignals();
        s->thread = PyEval_SaveThread();
        if (r < 0) return RAISED;
    }
    return OK;
}
#define CHECKPOINT(s) do { if ((s)->p >= (s)->check_at) TRY(checkpoint(s)); } while (0)

/* Append one item to a PyMem_Raw array of (pointer, count, capacity). */
static int append(void **items, size_t *n, size_t *cap, size_t size, const void *item) {
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        void *q = PyMem_RawRealloc(*items, c * size);
        if (!q) return NOMEM;
        *items = q;
        *cap = c;
    }
    memcpy((char *)*items + (*n)++ * size, item, size);
    return OK;
}

static const char *TOP_KEYS[4] = {"distributedInfo", "deviceProperties", "baseTimeNanoseconds",
                                  "host_name"};

/* ------------------------------------------------------------------ lexing */

/* 1 for bytes that may stand in a string as they are: printable ASCII but '"' and '\\'. */
static uint8_t PLAIN[256];

static void init_tables(void) {
    for (int c = 0x20; c < 0x80; c++) PLAIN[c] = c != '"' && c != '\\';
}

static inline void ws(Scan *s) {
    const unsigned char *p = s->p;
    while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
    s->p = p;
}

static inline int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int hex4(const unsigned char *p) {
    int v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(p[k]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

/* One UTF-8 sequence starting at p (first byte >= 0x80); its length, or 0 if invalid. */
static int utf8_len(const unsigned char *p) {
    unsigned char c = p[0];
    if (c >= 0xC2 && c <= 0xDF) return (p[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        unsigned char lo = (c == 0xE0) ? 0xA0 : 0x80, hi = (c == 0xED) ? 0x9F : 0xBF;
        return (p[1] >= lo && p[1] <= hi && (p[2] & 0xC0) == 0x80) ? 3 : 0;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        unsigned char lo = (c == 0xF0) ? 0x90 : 0x80, hi = (c == 0xF4) ? 0x8F : 0xBF;
        return (p[1] >= lo && p[1] <= hi && (p[2] & 0xC0) == 0x80 && (p[3] & 0xC0) == 0x80) ? 4 : 0;
    }
    return 0;
}

/* A string at s->p (a quote): validates it and gives its content span and whether it has
 * escapes. The data ends in a NUL (bytes objects do), which no valid string contains. */
static int string_tok(Scan *s, const unsigned char **start, uint32_t *len, int *escaped) {
    const unsigned char *p = s->p;
    if (*p != '"') return DECLINE;
    p++;
    const unsigned char *b = p;
    int esc = 0;
    for (;;) {
        while (PLAIN[*p]) p++;   /* the common bytes: one table lookup each */
        unsigned char c = *p;
        if (c == '"') break;
        if (c < 0x20) return DECLINE;           /* control character, or the end of the data */
        if (c == '\\') {
            esc = 1;
            unsigned char e = p[1];
            if (e == 'u') {
                int u = hex4(p + 2);
                if (u < 0) return DECLINE;
                p += 6;
                if (u >= 0xD800 && u <= 0xDBFF) {   /* a high surrogate needs its low half */
                    if (p[0] != '\\' || p[1] != 'u') return DECLINE;
                    int lo = hex4(p + 2);
                    if (lo < 0xDC00 || lo > 0xDFFF) return DECLINE;
                    p += 6;
                } else if (u >= 0xDC00 && u <= 0xDFFF) {
                    return DECLINE;
                }
                continue;
            }
            if (!strchr("\"\\/bfnrt", e) || e == 0) return DECLINE;
            p += 2;
            continue;
        }
        if (c >= 0x80) {
            int k = utf8_len(p);
            if (!k) return DECLINE;
            p += k;
            continue;
        }
        p++;
    }
    if (p - b > UINT32_MAX) return DECLINE;
    *start = b;
    *len = (uint32_t)(p - b);
    *escaped = esc;
    s->p = p + 1;
    return OK;
}

/* A number at s->p: validates the JSON grammar; its span and whether it is an integer. */
static int number_tok(Scan *s, const unsigned char **start, const unsigned char **stop, int *is_int) {
    const unsigned char *p = s->p, *b = p;
    int integer = 1;
    if (*p == '-') p++;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') while (*p >= '0' && *p <= '9') p++;
    else return DECLINE;
    if (*p == '.') {
        p++;
        if (!(*p >= '0' && *p <= '9')) return DECLINE;
        while (*p >= '0' && *p <= '9') p++;
        integer = 0;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') p++;
        if (!(*p >= '0' && *p <= '9')) return DECLINE;
        while (*p >= '0' && *p <= '9') p++;
        integer = 0;
    }
    *start = b;
    *stop = p;
    *is_int = integer;
    s->p = p;
    return OK;
}

static int literal(Scan *s, const char *word, size_t n) {
    for (size_t k = 0; k < n; k++)   /* byte by byte: never reads past the closing NUL */
        if (s->p[k] != (unsigned char)word[k]) return DECLINE;
    s->p += n;
    return OK;
}

static int skip_value(Scan *s, int depth);

static int skip_container(Scan *s, int depth, unsigned char close, int object) {
    if (depth > MAX_DEPTH) return DECLINE;
    s->p++;
    ws(s);
    if (*s->p == close) { s->p++; return OK; }
    for (;;) {
        CHECKPOINT(s);
        ws(s);
        if (object) {
            const unsigned char *k; uint32_t kl; int ke;
            TRY(string_tok(s, &k, &kl, &ke));
            ws(s);
            if (*s->p != ':') return DECLINE;
            s->p++;
            ws(s);
        }
        TRY(skip_value(s, depth + 1));
        ws(s);
        if (*s->p == ',') { s->p++; continue; }
        if (*s->p == close) { s->p++; return OK; }
        return DECLINE;
    }
}

/* Any JSON value, validated and passed over. */
static int skip_value(Scan *s, int depth) {
    const unsigned char *a, *b; uint32_t n; int f;
    switch (*s->p) {
    case '"': return string_tok(s, &a, &n, &f);
    case '{': return skip_container(s, depth, '}', 1);
    case '[': return skip_container(s, depth, ']', 0);
    case 't': return literal(s, "true", 4);
    case 'f': return literal(s, "false", 5);
    case 'n': return literal(s, "null", 4);
    default: return number_tok(s, &a, &b, &f);
    }
}

/* ------------------------------------------------------------------ values */

static const double POW10[23] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* The double nearest to a validated number token when the exact Clinger fast path applies
 * (mantissa <= 2^53, |exponent| <= 22: one correctly rounded operation): returns 1; else 0,
 * and the caller defers it to CPython's correctly rounded parser. */
static int fast_double(const unsigned char *b, double *out) {
    const unsigned char *p = b;
    int neg = 0, exp10 = 0;
    uint64_t m = 0;
    if (*p == '-') { neg = 1; p++; }
    for (; *p >= '0' && *p <= '9'; p++) {
        if (m > 100000000000000000ULL) return 0;
        m = m * 10 + (uint64_t)(*p - '0');
    }
    if (*p == '.') {
        for (p++; *p >= '0' && *p <= '9'; p++) {
            if (m > 100000000000000000ULL) return 0;
            m = m * 10 + (uint64_t)(*p - '0');
            exp10--;
        }
    }
    if (*p == 'e' || *p == 'E') {
        int sign = 1, x = 0;
        p++;
        if (*p == '-') { sign = -1; p++; } else if (*p == '+') p++;
        for (; *p >= '0' && *p <= '9'; p++) if (x < 100000) x = x * 10 + (*p - '0');
        exp10 += sign * x;
    }
    if (m > (1ULL << 53) || exp10 > 22 || exp10 < -22) return 0;
    double v = (double)m;
    v = exp10 >= 0 ? v * POW10[exp10] : v / POW10[-exp10];
    *out = neg ? -v : v;
    return 1;
}

/* With the GIL: a deferred number; non-finite results decline. */
static int slow_double(const Scan *s, const Deferred *d) {
    char buf[400];
    size_t n = (size_t)(d->e - d->b);
    if (n >= sizeof buf) return DECLINE;
    memcpy(buf, d->b, n);
    buf[n] = 0;
    char *end = NULL;
    double v = PyOS_string_to_double(buf, &end, NULL);
    if (v == -1.0 && PyErr_Occurred()) { PyErr_Clear(); return DECLINE; }
    if (end != buf + n || !isfinite(v)) return DECLINE;
    (d->dur ? s->dur : s->ts)[d->row] = v;
    return OK;
}

/* An integer token that fits int64 (INT64_MIN itself is the null marker: declined). */
static int to_int64(const unsigned char *b, const unsigned char *e, int64_t *out) {
    const unsigned char *p = b;
    int neg = 0;
    uint64_t m = 0;
    if (*p == '-') { neg = 1; p++; }
    for (; p < e; p++) {
        if (m > (UINT64_MAX - 9) / 10) return DECLINE;
        m = m * 10 + (uint64_t)(*p - '0');
    }
    if (!neg && m > (uint64_t)INT64_MAX) return DECLINE;
    if (neg && m > (uint64_t)INT64_MAX) return DECLINE;   /* would reach INT64_MIN */
    *out = neg ? -(int64_t)m : (int64_t)m;
    return OK;
}

/* ------------------------------------------------------------------ interning */

/* SipHash-1-3 (one compression round per 8-byte word, three finalisation rounds) of n bytes
 * under a 128-bit key. Words are loaded in the host's byte order: the same keyed function of
 * the bytes on every host of one byte order, which is all a hash table needs. */
#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND do {                                                          \
        v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32);             \
        v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                                 \
        v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                                 \
        v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32);             \
    } while (0)

static uint64_t siphash13(const uint64_t key[2], const unsigned char *in, size_t n) {
    uint64_t v0 = 0x736f6d6570736575ULL ^ key[0], v1 = 0x646f72616e646f6dULL ^ key[1];
    uint64_t v2 = 0x6c7967656e657261ULL ^ key[0], v3 = 0x7465646279746573ULL ^ key[1];
    uint64_t last = (uint64_t)n << 56;
    const unsigned char *words_end = in + (n & ~(size_t)7);
    for (; in != words_end; in += 8) {
        uint64_t m;
        memcpy(&m, in, 8);
        v3 ^= m; SIPROUND; v0 ^= m;
    }
    for (size_t k = 0; k < (n & 7); k++) last |= (uint64_t)in[k] << (8 * k);
    v3 ^= last; SIPROUND; v0 ^= last;
    v2 ^= 0xff; SIPROUND; SIPROUND; SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/* The hash keys, drawn from os.urandom when the module loads: one for texts, one for integer
 * tokens (pid "1" and pid 1 are different entries). Written once, before any scan; read only. */
static uint64_t KEYS[2][2];

static uint32_t text_hash(const unsigned char *s, uint32_t n, int number) {
    return (uint32_t)siphash13(KEYS[number != 0], s, n);
}

/* The text of a string token, escapes resolved (validated already by string_tok). */
static PyObject *unescaped(const unsigned char *s, uint32_t n) {
    char *buf = PyMem_Malloc(n ? n : 1);   /* escapes never grow: \uXXXX (6) -> <= 3 bytes */
    if (!buf) return PyErr_NoMemory();
    size_t o = 0;
    for (uint32_t k = 0; k < n;) {
        unsigned char c = s[k];
        if (c != '\\') { buf[o++] = (char)c; k++; continue; }
        unsigned char e = s[k + 1];
        if (e != 'u') {
            static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
            buf[o++] = to[strchr(from, e) - from];
            k += 2;
            continue;
        }
        uint32_t u = (uint32_t)hex4(s + k + 2);
        k += 6;
        if (u >= 0xD800 && u <= 0xDBFF) {
            u = 0x10000 + ((u - 0xD800) << 10) + ((uint32_t)hex4(s + k + 2) - 0xDC00);
            k += 6;
        }
        if (u < 0x80) buf[o++] = (char)u;
        else if (u < 0x800) { buf[o++] = (char)(0xC0 | (u >> 6)); buf[o++] = (char)(0x80 | (u & 0x3F)); }
        else if (u < 0x10000) {
            buf[o++] = (char)(0xE0 | (u >> 12)); buf[o++] = (char)(0x80 | ((u >> 6) & 0x3F));
            buf[o++] = (char)(0x80 | (u & 0x3F));
        } else {
            buf[o++] = (char)(0xF0 | (u >> 18)); buf[o++] = (char)(0x80 | ((u >> 12) & 0x3F));
            buf[o++] = (char)(0x80 | ((u >> 6) & 0x3F)); buf[o++] = (char)(0x80 | (u & 0x3F));
        }
    }
    PyObject *text = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)o, "strict");
    PyMem_Free(buf);
    return text;
}

static int grow_table(Scan *s) {
    size_t cap = s->tab_cap * 2;
    Entry *t = PyMem_RawCalloc(cap, sizeof(Entry));
    if (!t) return NOMEM;
    for (size_t k = 0; k < s->tab_cap; k++) {
        Entry *e = &s->tab[k];
        if (!e->s) continue;
        size_t at = e->hash & (cap - 1);
        for (int probes = 0; t[at].s; probes++) {
            if (probes == MAX_PROBE) { PyMem_RawFree(t); return DECLINE; }
            at = (at + 1) & (cap - 1);
        }
        t[at] = *e;
    }
    PyMem_RawFree(s->tab);
    s->tab = t;
    s->tab_cap = cap;
    return OK;
}

/* The code of a token's text (1, 2, ...; 0 is null), new codes in order of first sight. */
static int intern(Scan *s, const unsigned char *tok, uint32_t n, int number, int escaped,
                  uint32_t *code) {
    uint32_t h = text_hash(tok, n, number);
    size_t at = h & (s->tab_cap - 1);
    for (int probes = 0;; probes++) {
        Entry *e = &s->tab[at];
        if (!e->s) break;
        if (e->hash == h && e->len == n && e->number == number && memcmp(e->s, tok, n) == 0) {
            *code = e->code;
            return OK;
        }
        if (probes == MAX_PROBE) return DECLINE;   /* never with a random key: a planted table */
        at = (at + 1) & (s->tab_cap - 1);
    }
    Entry e = {tok, n, h, (uint32_t)s->tab_n + 1, number, escaped};
    TRY(append((void **)&s->texts, &s->tab_n, &s->texts_cap, sizeof e, &e));
    s->tab[at] = e;
    *code = e.code;
    if (s->tab_n * 2 > s->tab_cap) return grow_table(s);
    return OK;
}

/* With the GIL: the texts as a list of str, None first (code 0). */
static PyObject *texts_list(Scan *s) {
    PyObject *list = PyList_New((Py_ssize_t)s->tab_n + 1);
    if (!list) return NULL;
    Py_INCREF(Py_None);
    PyList_SET_ITEM(list, 0, Py_None);
    for (size_t k = 0; k < s->tab_n; k++) {
        const Entry *e = &s->texts[k];
        PyObject *text = e->escaped ? unescaped(e->s, e->len)
                                    : PyUnicode_DecodeUTF8((const char *)e->s, e->len, "strict");
        if (!text) { Py_DECREF(list); return NULL; }
        PyList_SET_ITEM(list, (Py_ssize_t)k + 1, text);
    }
    return list;
}

/* The values below mirror the msgspec path's column rules (kineto_decode.series / _text_series):
 * a value of another type becomes null there, unless polars' strict constructor would have
 * accepted it in some columns and not others (bools in number columns): those decline. */

static int is_bool(Scan *s) { return *s->p == 't' || *s->p == 'f'; }

/* A text field: a string; anything else is null (code 0). */
static int text_value(Scan *s, uint32_t *code) {
    if (*s->p != '"') { *code = 0; return skip_value(s, 2); }
    const unsigned char *t; uint32_t n; int esc;
    TRY(string_tok(s, &t, &n, &esc));
    return intern(s, t, n, 0, esc, code);
}

/* pid / tid: a string, an integer (as its decimal text, like str(int)), or null. */
static int id_value(Scan *s, uint32_t *code) {
    unsigned char c = *s->p;
    if (c == '"' || c == 'n') return text_value(s, code);
    const unsigned char *b, *e; int is_int;
    TRY(number_tok(s, &b, &e, &is_int));
    if (!is_int || (e - b == 2 && b[0] == '-' && b[1] == '0')) return DECLINE;   /* str(-0) is "0" */
    return intern(s, b, (uint32_t)(e - b), 1, 0, code);
}

/* ts / dur: a number; NaN when null or not a number. Integers must be exact doubles (|v| <=
 * 2^53: microsecond timestamps until the year 2255). */
static int time_value(Scan *s, int dur, size_t row) {
    double *out = &(dur ? s->dur : s->ts)[row];
    unsigned char c = *s->p;
    if (is_bool(s)) return DECLINE;
    if (c != '-' && !(c >= '0' && c <= '9')) { *out = NAN; return skip_value(s, 2); }
    const unsigned char *b, *e; int is_int;
    TRY(number_tok(s, &b, &e, &is_int));
    if (!is_int) {
        if (fast_double(b, out)) return OK;
        Deferred d = {b, e, dur, row};
        return append((void **)&s->deferred, &s->n_deferred, &s->deferred_cap, sizeof d, &d);
    }
    int64_t v;
    if (e - b > 17) return DECLINE;
    TRY(to_int64(b, e, &v));
    if (v > (1LL << 53) || v < -(1LL << 53)) return DECLINE;
    *out = (double)v;
    return OK;
}

/* stream / correlation / External id: an int64 integer; null when null or not an integer. */
static int int_value(Scan *s, int64_t *out) {
    unsigned char c = *s->p;
    if (is_bool(s)) return DECLINE;
    if (c != '-' && !(c >= '0' && c <= '9')) { *out = NULL_I64; return skip_value(s, 2); }
    const unsigned char *b, *e; int is_int;
    TRY(number_tok(s, &b, &e, &is_int));
    if (!is_int) { *out = NULL_I64; return OK; }
    return to_int64(b, e, out);
}

/* ------------------------------------------------------------------ structure */

#define KEY(lit) (kl == sizeof(lit) - 1 && memcmp(k, lit, sizeof(lit) - 1) == 0)

/* An object's next key: its bytes, and s->p past the colon. Escaped keys decline (one could
 * spell a key this scanner reads). */
static int object_key(Scan *s, const unsigned char **k, uint32_t *kl) {
    int esc;
    ws(s);
    TRY(string_tok(s, k, kl, &esc));
    if (esc) return DECLINE;
    ws(s);
    if (*s->p != ':') return DECLINE;
    s->p++;
    ws(s);
    return OK;
}

/* At an object's '{': past it, and *more = 0 when the object is empty. */
static int object_open(Scan *s, int *more) {
    if (*s->p != '{') return DECLINE;
    s->p++;
    ws(s);
    *more = *s->p != '}';
    if (!*more) s->p++;
    return OK;
}

/* After a member: 1 if another follows, 0 at the closing brace. */
static int next_member(Scan *s, int *more) {
    ws(s);
    if (*s->p == ',') { s->p++; *more = 1; return OK; }
    if (*s->p == '}') { s->p++; *more = 0; return OK; }
    return DECLINE;
}

static int once(unsigned *seen, unsigned bit) {
    if (*seen & bit) return DECLINE;   /* a duplicate key: which one wins is the careful path's call */
    *seen |= bit;
    return OK;
}

static int grow_rows(Scan *s) {
    size_t cap = s->cap ? s->cap * 2 : 4096;
#define GROW(f) do {                                          \
        void *q = PyMem_RawRealloc(s->f, cap * sizeof(*s->f)); \
        if (!q) return NOMEM;                                  \
        s->f = q;                                              \
    } while (0)
    GROW(ph); GROW(cat); GROW(name); GROW(pid); GROW(tid); GROW(coll);
    GROW(ts); GROW(dur); GROW(stream); GROW(corr); GROW(ext); GROW(a0); GROW(a1);
#undef GROW
    s->cap = cap;
    return OK;
}

/* The keys read from an object, and where each value goes. The order of a table is the bit of
 * its key in the duplicate check. */
typedef enum { F_TEXT, F_ID, F_TIME, F_INT, F_ARGS } FieldKind;
typedef struct {
    const char *key;
    uint32_t len;
    FieldKind kind;
    size_t column;   /* offsetof(Scan, the column) */
} Field;

#define FIELD(k, kind, col) {k, sizeof(k) - 1, kind, offsetof(Scan, col)}
#define COLUMN(T, s, f) (*(T **)((char *)(s) + (f)->column))

static const Field EVENT_FIELDS[] = {
    FIELD("ph", F_TEXT, ph), FIELD("cat", F_TEXT, cat), FIELD("name", F_TEXT, name),
    FIELD("pid", F_ID, pid), FIELD("tid", F_ID, tid), FIELD("ts", F_TIME, ts),
    FIELD("dur", F_TIME, dur), FIELD("args", F_ARGS, a0),
};
static const Field ARG_FIELDS[] = {
    FIELD("stream", F_INT, stream), FIELD("correlation", F_INT, corr),
    FIELD("External id", F_INT, ext), FIELD("Collective name", F_TEXT, coll),
};

static int scan_members(Scan *s, const Field *fields, int n_fields, size_t row, int depth);

static int scan_args(Scan *s, size_t row) {
    const unsigned char *open = s->p;
    TRY(scan_members(s, ARG_FIELDS, sizeof ARG_FIELDS / sizeof *ARG_FIELDS, row, 2));
    s->a0[row] = open - s->base;
    s->a1[row] = s->p - s->base;
    return OK;
}

static int field_value(Scan *s, const Field *f, size_t row) {
    switch (f->kind) {
    case F_TEXT: return text_value(s, &COLUMN(uint32_t, s, f)[row]);
    case F_ID: return id_value(s, &COLUMN(uint32_t, s, f)[row]);
    case F_TIME: return time_value(s, f->column == offsetof(Scan, dur), row);
    case F_INT: return int_value(s, &COLUMN(int64_t, s, f)[row]);
    case F_ARGS:   /* args of another type than object or null: the careful path says */
        return *s->p == '{' ? scan_args(s, row) : literal(s, "null", 4);
    }
    return DECLINE;
}

/* An object whose keys in ``fields`` fill row ``row``; other members are validated, skipped. */
static int scan_members(Scan *s, const Field *fields, int n_fields, size_t row, int depth) {
    unsigned seen = 0;
    int more;
    TRY(object_open(s, &more));
    while (more) {
        const unsigned char *k; uint32_t kl;
        TRY(object_key(s, &k, &kl));
        int f = 0;
        while (f < n_fields && !(kl == fields[f].len && memcmp(k, fields[f].key, kl) == 0)) f++;
        if (f < n_fields) {
            TRY(once(&seen, 1u << f));
            TRY(field_value(s, &fields[f], row));
        } else {
            TRY(skip_value(s, depth));
        }
        TRY(next_member(s, &more));
    }
    return OK;
}

/* Rows ingest reads: complete events (X), metadata (M: thread names) and instants (i: memory).
 * The rest (flows, counters, async spans: a third of a GPU trace) are validated and dropped. */
static int wanted_ph(const Scan *s, uint32_t code) {
    if (code == 0) return 0;
    const Entry *e = &s->texts[code - 1];
    if (e->escaped) return 1;   /* spelled with escapes: let the caller read the text */
    return e->len == 1 && !e->number && (e->s[0] == 'X' || e->s[0] == 'M' || e->s[0] == 'i');
}

static int scan_event(Scan *s) {
    if (s->n == s->cap) TRY(grow_rows(s));
    size_t r = s->n++;
    s->ph[r] = s->cat[r] = s->name[r] = s->pid[r] = s->tid[r] = s->coll[r] = 0;
    s->ts[r] = s->dur[r] = NAN;
    s->stream[r] = s->corr[r] = s->ext[r] = NULL_I64;
    s->a0[r] = s->a1[r] = 0;
    TRY(scan_members(s, EVENT_FIELDS, sizeof EVENT_FIELDS / sizeof *EVENT_FIELDS, r, 1));
    if (!wanted_ph(s, s->ph[r])) {   /* the row is reused by the next event */
        s->n--;
        while (s->n_deferred && s->deferred[s->n_deferred - 1].row == r) s->n_deferred--;
    }
    return OK;
}

static int scan_events(Scan *s) {
    if (*s->p != '[') return DECLINE;
    s->p++;
    ws(s);
    if (*s->p == ']') { s->p++; return OK; }
    for (;;) {
        CHECKPOINT(s);
        ws(s);
        TRY(scan_event(s));
        ws(s);
        if (*s->p == ',') { s->p++; continue; }
        if (*s->p == ']') { s->p++; return OK; }
        return DECLINE;
    }
}

static int scan_top(Scan *s) {
    unsigned seen = 0;
    int more;
    ws(s);
    TRY(object_open(s, &more));
    while (more) {
        const unsigned char *k; uint32_t kl;
        TRY(object_key(s, &k, &kl));
        int which = -1;
        for (int t = 0; t < 4; t++)
            if (kl == strlen(TOP_KEYS[t]) && memcmp(k, TOP_KEYS[t], kl) == 0) which = t;
        if (KEY("traceEvents")) { TRY(once(&seen, 16)); TRY(scan_events(s)); }
        else if (which >= 0) {
            TRY(once(&seen, 1u << which));
            s->top[which][0] = s->p - s->base;
            TRY(skip_value(s, 1));
            s->top[which][1] = s->p - s->base;
        }
        else TRY(skip_value(s, 1));
        TRY(next_member(s, &more));
    }
    ws(s);
    if (s->p != s->end || !(seen & 16)) return DECLINE;
    return OK;
}

/* ------------------------------------------------------------------ module */

static void release(Scan *s) {
    PyMem_RawFree(s->ph); PyMem_RawFree(s->cat); PyMem_RawFree(s->name); PyMem_RawFree(s->pid);
    PyMem_RawFree(s->tid); PyMem_RawFree(s->coll); PyMem_RawFree(s->ts); PyMem_RawFree(s->dur);
    PyMem_RawFree(s->stream); PyMem_RawFree(s->corr); PyMem_RawFree(s->ext); PyMem_RawFree(s->a0);
    PyMem_RawFree(s->a1); PyMem_RawFree(s->tab); PyMem_RawFree(s->texts);
    PyMem_RawFree(s->deferred);
}

/* ------------------------------------------------------------------ Arrow export
 * The columns leave as one Arrow struct array through the Arrow C data interface
 * (https://arrow.apache.org/docs/format/CDataInterface.html), which polars imports without
 * copying: no per-value conversion and no numpy. Memory is freed by the release callbacks,
 * which may run on any thread without the GIL: hence PyMem_Raw*. */

struct ArrowSchema {
    const char *format, *name, *metadata;
    int64_t flags, n_children;
    struct ArrowSchema **children, *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length, null_count, offset, n_buffers, n_children;
    const void **buffers;
    struct ArrowArray **children, *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

enum { NULL_NONE, NULL_CODE0, NULL_MIN };
typedef struct { const char *name, *format; void **data; int nulls; } ColumnSpec;
#define NCOLS 13

static void release_schema(struct ArrowSchema *sc) {
    for (int64_t k = 0; k < sc->n_children; k++) {
        struct ArrowSchema *ch = sc->children[k];
        if (ch->release) ch->release(ch);
        PyMem_RawFree(ch);
    }
    PyMem_RawFree(sc->children);
    sc->release = NULL;
}

static void release_leaf_schema(struct ArrowSchema *sc) { sc->release = NULL; }

static void release_column(struct ArrowArray *a) {
    PyMem_RawFree((void *)a->buffers[0]);
    PyMem_RawFree((void *)a->buffers[1]);
    PyMem_RawFree(a->buffers);
    a->release = NULL;
}

static void release_struct(struct ArrowArray *a) {
    for (int64_t k = 0; k < a->n_children; k++) {
        struct ArrowArray *ch = a->children[k];
        if (ch->release) ch->release(ch);
        PyMem_RawFree(ch);
    }
    PyMem_RawFree(a->children);
    PyMem_RawFree(a->buffers);
    a->release = NULL;
}

static void schema_capsule_free(PyObject *cap) {
    struct ArrowSchema *sc = PyCapsule_GetPointer(cap, "arrow_schema");
    if (sc) { if (sc->release) sc->release(sc); PyMem_RawFree(sc); }
}

static void array_capsule_free(PyObject *cap) {
    struct ArrowArray *a = PyCapsule_GetPointer(cap, "arrow_array");
    if (a) { if (a->release) a->release(a); PyMem_RawFree(a); }
}

/* A validity bitmap (bit set: a value) for a column whose nulls are code 0 or INT64_MIN;
 * NULL when there are none. */
static uint8_t *validity(const void *data, size_t n, int kind, int64_t *nulls) {
    size_t bad = 0;
    for (size_t k = 0; k < n; k++)
        bad += kind == NULL_CODE0 ? ((const uint32_t *)data)[k] == 0 : ((const int64_t *)data)[k] == NULL_I64;
    *nulls = (int64_t)bad;
    if (!bad) return NULL;
    uint8_t *bits = PyMem_RawCalloc((n + 7) / 8, 1);
    if (!bits) return NULL;
    for (size_t k = 0; k < n; k++) {
        int ok = kind == NULL_CODE0 ? ((const uint32_t *)data)[k] != 0 : ((const int64_t *)data)[k] != NULL_I64;
        if (ok) bits[k / 8] |= (uint8_t)(1u << (k % 8));
    }
    return bits;
}

/* The columns as (arrow_schema, arrow_array) capsules; they take over s's buffers. */
static PyObject *export_columns(Scan *s) {
    ColumnSpec cols[NCOLS] = {
        {"ph", "I", (void **)&s->ph, NULL_CODE0}, {"cat", "I", (void **)&s->cat, NULL_CODE0},
        {"name", "I", (void **)&s->name, NULL_CODE0}, {"pid", "I", (void **)&s->pid, NULL_CODE0},
        {"tid", "I", (void **)&s->tid, NULL_CODE0}, {"coll_name", "I", (void **)&s->coll, NULL_CODE0},
        {"ts", "g", (void **)&s->ts, NULL_NONE}, {"dur", "g", (void **)&s->dur, NULL_NONE},
        {"stream_arg", "l", (void **)&s->stream, NULL_MIN},
        {"correlation", "l", (void **)&s->corr, NULL_MIN},
        {"external_id", "l", (void **)&s->ext, NULL_MIN},
        {"args_start", "l", (void **)&s->a0, NULL_NONE}, {"args_end", "l", (void **)&s->a1, NULL_NONE},
    };
    struct ArrowSchema *sc = PyMem_RawCalloc(1, sizeof *sc);
    struct ArrowArray *ar = PyMem_RawCalloc(1, sizeof *ar);
    PyObject *sc_cap = NULL, *ar_cap = NULL;
    if (!sc || !ar) { PyMem_RawFree(sc); PyMem_RawFree(ar); return PyErr_NoMemory(); }
    sc->format = "+s"; sc->name = ""; sc->release = release_schema;
    ar->length = (int64_t)s->n; ar->n_buffers = 1; ar->release = release_struct;
    sc->children = PyMem_RawCalloc(NCOLS, sizeof(void *));
    ar->children = PyMem_RawCalloc(NCOLS, sizeof(void *));
    ar->buffers = PyMem_RawCalloc(1, sizeof(void *));
    /* capsules first: from here on a failure frees everything through the release callbacks */
    sc_cap = PyCapsule_New(sc, "arrow_schema", schema_capsule_free);
    if (!sc_cap) { release_schema(sc); PyMem_RawFree(sc); release_struct(ar); PyMem_RawFree(ar); return NULL; }
    ar_cap = PyCapsule_New(ar, "arrow_array", array_capsule_free);
    if (!ar_cap) { Py_DECREF(sc_cap); release_struct(ar); PyMem_RawFree(ar); return NULL; }
    if (!sc->children || !ar->children || !ar->buffers) goto oom;
    for (int k = 0; k < NCOLS; k++) {
        struct ArrowSchema *cs = PyMem_RawCalloc(1, sizeof *cs);
        struct ArrowArray *ca = PyMem_RawCalloc(1, sizeof *ca);
        const void **bufs = PyMem_RawCalloc(2, sizeof(void *));
        if (cs) { sc->children[sc->n_children++] = cs; }
        if (ca) { ar->children[ar->n_children++] = ca; }
        if (!cs || !ca || !bufs) { PyMem_RawFree(bufs); goto oom; }
        cs->format = cols[k].format; cs->name = cols[k].name; cs->release = release_leaf_schema;
        cs->flags = cols[k].nulls != NULL_NONE ? 2 : 0;   /* ARROW_FLAG_NULLABLE */
        ca->length = (int64_t)s->n; ca->n_buffers = 2; ca->buffers = bufs; ca->release = release_column;
        bufs[1] = *cols[k].data;       /* the array owns the column now */
        *cols[k].data = NULL;
        if (cols[k].nulls != NULL_NONE) {
            bufs[0] = validity(bufs[1], s->n, cols[k].nulls, &ca->null_count);
            if (ca->null_count && !bufs[0]) goto oom;
        }
    }
    return Py_BuildValue("(NN)", sc_cap, ar_cap);
oom:
    Py_DECREF(sc_cap);
    Py_DECREF(ar_cap);
    return PyErr_NoMemory();
}

static PyObject *scan(PyObject *Py_UNUSED(self), PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"data", "stop", NULL};
    PyObject *arg, *stop_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:scan", kwlist, &arg, &stop_obj))
        return NULL;
    /* both kinds keep a NUL after their last byte, which every loop here stops at */
    if (!PyBytes_CheckExact(arg) && !PyByteArray_CheckExact(arg)) {
        PyErr_SetString(PyExc_TypeError, "scan() takes bytes or bytearray");
        return NULL;
    }
    /* buffer exports pin both while the GIL is released: a bytearray cannot be resized (and
     * its memory moved) under the scan */
    Py_buffer data_view, stop_view = {0};
    if (PyObject_GetBuffer(arg, &data_view, PyBUF_SIMPLE) < 0) return NULL;
    if (stop_obj != Py_None) {
        if (!PyByteArray_CheckExact(stop_obj) || PyByteArray_GET_SIZE(stop_obj) < 1) {
            PyBuffer_Release(&data_view);
            PyErr_SetString(PyExc_TypeError, "scan(stop=...) takes a bytearray of at least 1 byte");
            return NULL;
        }
        if (PyObject_GetBuffer(stop_obj, &stop_view, PyBUF_SIMPLE) < 0) {
            PyBuffer_Release(&data_view);
            return NULL;
        }
    }
    const char *data = PyBytes_CheckExact(arg) ? PyBytes_AS_STRING(arg)
                                               : PyByteArray_AS_STRING(arg);   /* "" when empty */
    Py_ssize_t size = data_view.len;
    Scan s;
    memset(&s, 0, sizeof s);
    s.base = s.p = (const unsigned char *)data;
    s.end = s.base + size;
    s.stop = stop_view.buf;
    s.check_at = s.base + CHECK_BYTES;
    for (int t = 0; t < 4; t++) s.top[t][0] = s.top[t][1] = -1;
    s.tab_cap = 1024;
    s.tab = PyMem_RawCalloc(s.tab_cap, sizeof(Entry));
    int r = s.tab ? OK : NOMEM;
    if (r == OK) {
        int main_thread = _PyOS_IsMainThread();
        PyThreadState *released = PyEval_SaveThread();
        s.thread = main_thread ? released : NULL;
        r = scan_top(&s);
        if (r == OK && s.n > UINT32_MAX) r = DECLINE;
        if (r == OK && s.n == 0) r = grow_rows(&s);   /* Arrow buffers are never NULL */
        PyEval_RestoreThread(main_thread ? s.thread : released);
    }
    PyBuffer_Release(&data_view);
    if (stop_view.obj) PyBuffer_Release(&stop_view);
    for (size_t k = 0; r == OK && k < s.n_deferred; k++) r = slow_double(&s, &s.deferred[k]);
    if (r != OK) {
        release(&s);
        if (r == NOMEM) return PyErr_NoMemory();
        if (r == RAISED) return NULL;   /* a signal handler's exception (KeyboardInterrupt) */
        Py_RETURN_NONE;                 /* declined, or stopped: the caller knows which */
    }
    PyObject *strings = texts_list(&s);
    if (!strings) {
        release(&s);
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return NULL;
        PyErr_Clear();   /* not reachable after string_tok's checks; declined all the same */
        Py_RETURN_NONE;
    }
    PyObject *top = PyDict_New();
    for (int t = 0; top && t < 4; t++) {
        if (s.top[t][0] < 0) continue;
        PyObject *span = Py_BuildValue("(nn)", s.top[t][0], s.top[t][1]);
        if (!span || PyDict_SetItemString(top, TOP_KEYS[t], span) < 0) Py_CLEAR(top);
        Py_XDECREF(span);
    }
    PyObject *columns = top ? export_columns(&s) : NULL;
    PyObject *out = columns ? Py_BuildValue("(nNNN)", (Py_ssize_t)s.n, strings, columns, top) : NULL;
    if (!columns) { Py_XDECREF(top); Py_DECREF(strings); }
    release(&s);
    return out;
}

/* abort_line(line: bytes): from now on, when something in this process aborts (SIGABRT), write
 * LINE to stderr and exit with status 2 instead of dumping core with status 134 (issue #24).
 * What aborts in tracekit is a library's allocation failing under a memory limit: Rust's
 * allocation error handler (polars) prints "memory allocation of N bytes failed" and calls
 * abort(), which no Python handler can see (it runs after the C handler returns, and abort()
 * does not return). The handler does only what is async-signal-safe: write(2) and _exit(2). */
static char ABORT_LINE[4096];
static volatile size_t ABORT_LEN = 0;

static void on_abort(int sig) {
    (void)sig;
    if (ABORT_LEN) {
        ssize_t ignored = write(2, ABORT_LINE, ABORT_LEN);
        (void)ignored;
    }
    _exit(2);
}

static PyObject *abort_line(PyObject *self, PyObject *arg) {
    (void)self;
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "abort_line takes bytes");
        return NULL;
    }
    Py_ssize_t len = PyBytes_GET_SIZE(arg);
    if (len > (Py_ssize_t)sizeof ABORT_LINE) len = (Py_ssize_t)sizeof ABORT_LINE;
    ABORT_LEN = 0; /* a signal meanwhile writes nothing rather than half a line */
    memcpy(ABORT_LINE, PyBytes_AS_STRING(arg), (size_t)len);
    ABORT_LEN = (size_t)len;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_abort;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGABRT, &sa, NULL) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

/* split(data, start) -> (end, closed): where a run of whole elements of a JSON array ends
 * (tracekit.ingest.kineto_stream feeds a big trace's "traceEvents" to scan() in slices).
 * DATA[start:] begins between two elements of the array (nesting depth 0, outside strings).
 * END: just after the last element closed by '}' or ']' at depth 0, or START when none closes
 * within DATA (more is needed); CLOSED: True when the array's own ']' was found, at END.
 * Strings are skipped with their escapes, so brackets inside them do not count; anything
 * malformed is left for scan() to decline. */
static PyObject *split(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer view;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "y*n:split", &view, &start)) return NULL;
    if (start < 0 || start > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "split(): start out of range");
        return NULL;
    }
    const unsigned char *b = view.buf;
    Py_ssize_t n = view.len, end = start, depth = 0;
    int closed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = start; i < n; i++) {
        unsigned char c = b[i];
        if (c == '"') {   /* to the closing quote: one not preceded by an odd run of '\\' */
            for (;;) {
                const unsigned char *q = memchr(b + i + 1, '"', (size_t)(n - i - 1));
                if (!q) { i = n; break; }
                i = q - b;
                Py_ssize_t k = i;
                while (k > start && b[k - 1] == '\\') k--;
                if (((i - k) & 1) == 0) break;
            }
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (depth == 0) {   /* the array's own close */
                end = i;
                closed = 1;
                break;
            }
            if (--depth == 0) end = i + 1;
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return Py_BuildValue("(nO)", end, closed ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_VARARGS | METH_KEYWORDS,
     "scan(data: bytes, stop: bytearray | None = None) -> columns of a Kineto trace, or None "
     "(see tracekit/ingest/_kscan.c)"},
    {"abort_line", abort_line, METH_O,
     "abort_line(line: bytes) -> None: on SIGABRT, write LINE to stderr and exit with status 2"},
    {"split", split, METH_VARARGS,
     "split(data, start) -> (end, closed): where whole elements of a JSON array end"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kscan",
                                    "Kineto trace JSON -> column buffers (fast path of tracekit.ingest.kineto_decode).",
                                    -1, methods, NULL, NULL, NULL, NULL};

/* The hash keys: 32 bytes of os.urandom, once per process. */
static int draw_keys(void) {
    PyObject *os = PyImport_ImportModule("os");
    PyObject *bytes = os ? PyObject_CallMethod(os, "urandom", "n", (Py_ssize_t)sizeof KEYS) : NULL;
    Py_XDECREF(os);
    if (!bytes) return -1;
    if (!PyBytes_Check(bytes) || PyBytes_GET_SIZE(bytes) != (Py_ssize_t)sizeof KEYS) {
        Py_DECREF(bytes);
        PyErr_SetString(PyExc_RuntimeError, "os.urandom gave no key");
        return -1;
    }
    memcpy(KEYS, PyBytes_AS_STRING(bytes), sizeof KEYS);
    Py_DECREF(bytes);
    return 0;
}

PyMODINIT_FUNC PyInit__kscan(void) {
    init_tables();
    if (draw_keys() < 0) return NULL;
    return PyModule_Create(&module);
}

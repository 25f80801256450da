/*
 * How much of a JPEG scan its entropy-coded data really holds (converter/transform/jpeg.py).
 *
 * libjpeg (and so Pillow) fills the blocks of a scan whose data ends early (a file cut
 * and closed with an end-of-image marker, or a header claiming more rows than the data
 * holds) with flat grey, and only prints a warning. This module walks the Huffman codes of
 * one sequential scan, block by block, without decoding any pixel, and says how many MCUs
 * (minimum coded units) were complete before the data ran out.
 *
 * count_mcus(data, start, mcus, restart, blocks, tables) -> (done, end, status)
 *   data:    the whole file (bytes-like)
 *   start:   offset of the scan's first entropy-coded byte (after the SOS segment)
 *   mcus:    MCUs the frame needs in this scan
 *   restart: the restart interval (DRI) in MCUs, 0 for none
 *   blocks:  bytes, two per block of one MCU: (DC table slot 0-3, AC table slot 0-3)
 *   tables:  a tuple of 8 items (DC slots 0-3, AC slots 0-3): None or bytes holding the
 *            16 code-length counts then the symbols (a DHT table as stored)
 * done: complete MCUs; end: offset of the marker after the scan's data (or of the marker
 * that ended it early); status: 0 whole, 1 data ended early, 2 an invalid Huffman code or
 * a missing restart marker (corrupt). The GIL is released while the codes are walked.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define LOOK 10

typedef struct {
    int present;
    int32_t maxcode[18];  /* largest code of each length, -1: none */
    int32_t mincode[17];
    int32_t valptr[17];
    uint8_t look_len[1 << LOOK]; /* codes of LOOK bits or fewer: length (0: longer) and symbol */
    uint8_t look_sym[1 << LOOK];
    uint8_t vals[256];
    /* codes whose extra bits fit in LOOK too: total length << 8 | coefficients advanced
       (64: end of block; a DC table: 1), 0 where the slow path decides */
    uint16_t fast[1 << LOOK];
} huff;

typedef struct {
    const uint8_t *d;
    Py_ssize_t n, pos, marker_pos;
    uint64_t acc;
    int bits;
    int marker;
    int64_t padding; /* zero bits added past the data: consumed ones mean the data ended */
} reader;

static int build(huff *h, const uint8_t *t, Py_ssize_t len) {
    int l, i, k = 0, total = 0;
    int32_t code = 0;
    memset(h, 0, sizeof *h);
    if (len < 16) return -1;
    for (l = 0; l < 16; l++) total += t[l];
    if (total > 256 || len < 16 + total) return -1;
    memcpy(h->vals, t + 16, (size_t)total);
    for (l = 1; l <= 16; l++) {
        int count = t[l - 1];
        h->valptr[l] = k;
        h->mincode[l] = code;
        for (i = 0; i < count; i++, k++, code++) {
            if (l <= LOOK) {
                int first = code << (LOOK - l), span = 1 << (LOOK - l), j;
                if (first + span > (1 << LOOK)) return -1;
                for (j = 0; j < span; j++) {
                    h->look_len[first + j] = (uint8_t)l;
                    h->look_sym[first + j] = h->vals[k];
                }
            }
        }
        h->maxcode[l] = count ? code - 1 : -1;
        code <<= 1;
    }
    h->maxcode[17] = 0x7fffffff;
    h->present = 1;
    return 0;
}

static void build_fast(huff *h, int ac) {
    int top;
    for (top = 0; top < (1 << LOOK); top++) {
        int l = h->look_len[top], sym = h->look_sym[top], run = sym >> 4, size = sym & 15, adv;
        if (!l) continue;
        if (!ac) {
            size = sym;
            adv = 1;
        } else if (size) {
            adv = run + 1;
        } else {
            adv = run == 15 ? 16 : 64;
        }
        if (size > 16 || l + size > LOOK) continue;
        h->fast[top] = (uint16_t)((l + size) << 8 | adv);
    }
}

static void fill(reader *r) {
    while (r->bits <= 56) {
        uint8_t c = 0;
        int real = 0;
        if (!r->marker && r->pos >= r->n) { /* the file ends inside the data */
            r->marker = 1;
            r->marker_pos = r->n;
        }
        if (!r->marker) {
            c = r->d[r->pos];
            real = 1;
            if (c != 0xFF) {
                r->pos++;
            } else if (r->pos + 1 < r->n && r->d[r->pos + 1] == 0x00) {
                r->pos += 2; /* a stuffed 0xFF data byte */
            } else { /* a marker: the data stops here */
                r->marker = 1;
                r->marker_pos = r->pos;
                c = 0;
                real = 0;
            }
        }
        if (!real) r->padding += 8;
        r->acc |= (uint64_t)c << (56 - r->bits);
        r->bits += 8;
    }
}

static inline void skip(reader *r, int n) {
    r->acc <<= n;
    r->bits -= n;
}

static int decode(reader *r, const huff *h) {
    unsigned top;
    int l;
    if (r->bits < 32) fill(r);
    top = (unsigned)(r->acc >> (64 - LOOK));
    l = h->look_len[top];
    if (l) {
        skip(r, l);
        return h->look_sym[top];
    }
    for (l = LOOK + 1; l <= 16; l++) {
        int32_t code = (int32_t)(r->acc >> (64 - l));
        if (h->maxcode[l] >= 0 && code <= h->maxcode[l] && code >= h->mincode[l]) {
            skip(r, l);
            return h->vals[h->valptr[l] + code - h->mincode[l]];
        }
    }
    return -1;
}

/* One block: 0 fine, -1 an invalid code. */
static int block(reader *r, const huff *dc, const huff *ac) {
    int s, k;
    uint16_t f;
    if (r->bits < 32) fill(r);
    f = dc->fast[r->acc >> (64 - LOOK)];
    if (f) {
        skip(r, f >> 8);
    } else {
        s = decode(r, dc);
        if (s < 0 || s > 16) return -1;
        skip(r, s);
    }
    for (k = 1; k < 64;) {
        int rs, run, size;
        if (r->bits < 32) fill(r);
        f = ac->fast[r->acc >> (64 - LOOK)];
        if (f) {
            skip(r, f >> 8);
            k += f & 0xFF;
            continue;
        }
        rs = decode(r, ac);
        if (rs < 0) return -1;
        run = rs >> 4;
        size = rs & 15;
        if (size) {
            skip(r, size);
            k += run + 1;
        } else if (run == 15) {
            k += 16;
        } else {
            break;
        }
    }
    return 0;
}

static inline int overrun(const reader *r) { return r->padding > r->bits; }

static Py_ssize_t next_marker(const uint8_t *d, Py_ssize_t n, Py_ssize_t pos) {
    while (pos + 1 < n && !(d[pos] == 0xFF && d[pos + 1] != 0x00)) pos++;
    return pos < n ? pos : n;
}

static PyObject *count_mcus(PyObject *self, PyObject *args) {
    Py_buffer data, blocks;
    Py_ssize_t start, mcus, restart, done = 0, end, i;
    PyObject *tables;
    huff *h;
    int status = 0;
    reader r;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nnny*O!", &data, &start, &mcus, &restart, &blocks, &PyTuple_Type, &tables))
        return NULL;
    if (PyTuple_GET_SIZE(tables) != 8 || blocks.len % 2 || blocks.len == 0 || start < 0 || start > data.len) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&blocks);
        PyErr_SetString(PyExc_ValueError, "count_mcus: 8 tables, two bytes per block and a start inside the data");
        return NULL;
    }
    h = PyMem_Calloc(8, sizeof(huff));
    if (h == NULL) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&blocks);
        return PyErr_NoMemory();
    }
    for (i = 0; i < 8; i++) {
        PyObject *t = PyTuple_GET_ITEM(tables, i);
        if (t != Py_None && (!PyBytes_Check(t) || build(&h[i], (const uint8_t *)PyBytes_AS_STRING(t),
                                                         PyBytes_GET_SIZE(t)) != 0)) {
            status = 2;
        }
        if (h[i].present) build_fast(&h[i], i >= 4);
    }
    const uint8_t *b = (const uint8_t *)blocks.buf;
    for (i = 0; i < blocks.len; i += 2) {
        if (b[i] > 3 || b[i + 1] > 3 || !h[b[i]].present || !h[4 + b[i + 1]].present) status = 2;
    }
    memset(&r, 0, sizeof r);
    r.d = (const uint8_t *)data.buf;
    r.n = data.len;
    r.pos = start;
    if (status == 0) {
        Py_BEGIN_ALLOW_THREADS
        for (done = 0; done < mcus; done++) {
            if (restart > 0 && done > 0 && done % restart == 0) {
                /* the interval's data ends here: the next marker (bytes before it are skipped, as
                   libjpeg does with a warning) must be a restart marker */
                Py_ssize_t at = r.marker ? r.marker_pos : next_marker(r.d, r.n, r.pos);
                while (at + 1 < r.n && r.d[at + 1] == 0xFF) at++; /* fill bytes before a marker */
                if (at + 1 >= r.n) { status = 1; break; }
                uint8_t m = r.d[at + 1];
                r.marker_pos = at;
                if (m < 0xD0 || m > 0xD7) { status = 1; break; } /* another marker: the data ended */
                start = r.marker_pos + 2; /* a restart marker: the next interval starts after it */
                memset(&r, 0, sizeof r);
                r.d = (const uint8_t *)data.buf;
                r.n = data.len;
                r.pos = start;
            }
            for (i = 0; i < blocks.len; i += 2) {
                if (block(&r, &h[b[i]], &h[4 + b[i + 1]]) != 0) { status = 2; break; }
            }
            if (status) break;
            if (overrun(&r)) { status = 1; break; }
        }
        Py_END_ALLOW_THREADS
    }
    end = r.marker ? r.marker_pos : next_marker(r.d, r.n, r.pos);
    PyMem_Free(h);
    PyBuffer_Release(&data);
    PyBuffer_Release(&blocks);
    return Py_BuildValue("nni", done, end, status);
}

static PyMethodDef methods[] = {
    {"count_mcus", count_mcus, METH_VARARGS, "count_mcus(data, start, mcus, restart, blocks, tables) -> (done, end, status)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpegscan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__jpegscan(void) { return PyModule_Create(&module); }

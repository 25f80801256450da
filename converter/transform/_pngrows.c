/*
 * PNG scanline unfiltering for imgshard's fast PNG path (converter/transform/png.py).
 *
 * Python inflates the IDAT stream (ISA-L when installed); this module undoes the five
 * PNG row filters (None, Sub, Up, Average, Paeth) of an 8-bit, non-interlaced image
 * and writes each row straight in the layout the next stage wants, so no full-size
 * intermediate copy is made:
 *
 *   LAYOUT_RAW     rows as stored: (H, W, channels) bytes (greyscale, palette indices)
 *   LAYOUT_RGB     (H, W, 3) bytes: RGB images, alpha (if any) dropped
 *   LAYOUT_PACKED  (H, W) native uint32 0xRRGGBB: a colour mask's colour keys (alpha dropped)
 *   LAYOUT_CLASSES (H, W) native uint16 ~lut[0xRRGGBB]: a colour mask looked up in a class
 *                  table of 2**24 uint16 entries stored bitwise-inverted (so that a table
 *                  of untouched zero pages means "unknown" everywhere), without the
 *                  4-byte-per-pixel key array
 *   LAYOUT_SAMPLES (H, W) bytes from a 1-, 2- or 4-bit one-channel image (grey or palette
 *                  indices): each packed row is unfiltered byte by byte, then its samples
 *                  (first pixel in the high bits) are written one per byte, times `scale`
 *
 * unfilter(filtered, height, width, channels, layout, out, lut=None, flag_from=0, depth=8, scale=1) -> int
 *   filtered: bytes-like, exactly height * (1 + row bytes) bytes; row bytes = width * channels
 *             at 8 bits, ceil(width * depth / 8) for LAYOUT_SAMPLES
 *   out:      writable contiguous buffer of the layout's size
 *   lut:      LAYOUT_CLASSES only: 2**24 native uint16 entries, each value inverted (~v)
 *   depth, scale: LAYOUT_SAMPLES only: bits per sample (1, 2 or 4) and a factor for each
 *             sample (255 / (2**depth - 1) scales grey to 0..255, as PNG defines it)
 * Returns, for LAYOUT_CLASSES, how many pixels got a table value >= flag_from (the
 * caller's "unknown colour" marks), else 0. Raises ValueError for a wrong size or an
 * unknown filter type (a corrupt file). The GIL is released while rows are decoded.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { LAYOUT_RAW = 0, LAYOUT_RGB = 1, LAYOUT_PACKED = 2, LAYOUT_CLASSES = 3, LAYOUT_SAMPLES = 4 };
#define LUT_ENTRIES ((Py_ssize_t)1 << 24)

static inline uint8_t paeth(int a, int b, int c) {
    int pa = abs(b - c);
    int pb = abs(a - c);
    int pc = abs(a + b - 2 * c);
    if (pa <= pb && pa <= pc) return (uint8_t)a;
    if (pb <= pc) return (uint8_t)b;
    return (uint8_t)c;
}

/* Undo one row's filter: cur = unfiltered row, prev = previous unfiltered row (zeros for
 * the first row). bpp = bytes per pixel (1..4 at 8 bits per channel). */
static inline int unfilter_row(int type, const uint8_t *f, uint8_t *cur, const uint8_t *prev,
                               Py_ssize_t stride, int bpp) {
    Py_ssize_t i;
    switch (type) {
    case 0:
        memcpy(cur, f, (size_t)stride);
        return 0;
    case 1:
        for (i = 0; i < bpp && i < stride; i++) cur[i] = f[i];
        for (; i < stride; i++) cur[i] = (uint8_t)(f[i] + cur[i - bpp]);
        return 0;
    case 2:
        for (i = 0; i < stride; i++) cur[i] = (uint8_t)(f[i] + prev[i]);
        return 0;
    case 3:
        for (i = 0; i < bpp && i < stride; i++) cur[i] = (uint8_t)(f[i] + (prev[i] >> 1));
        for (; i < stride; i++) cur[i] = (uint8_t)(f[i] + ((cur[i - bpp] + prev[i]) >> 1));
        return 0;
    case 4:
        for (i = 0; i < bpp && i < stride; i++) cur[i] = (uint8_t)(f[i] + prev[i]); /* a = c = 0 */
        for (; i < stride; i++)
            cur[i] = (uint8_t)(f[i] + paeth(cur[i - bpp], prev[i], prev[i - bpp]));
        return 0;
    default:
        return -1;
    }
}

static void emit_rgb(const uint8_t *row, uint8_t *out, Py_ssize_t width) { /* from 4 channels */
    Py_ssize_t x;
    for (x = 0; x < width; x++, row += 4, out += 3) {
        out[0] = row[0];
        out[1] = row[1];
        out[2] = row[2];
    }
}

static void emit_packed(const uint8_t *row, uint32_t *out, Py_ssize_t width, int channels) {
    Py_ssize_t x;
    for (x = 0; x < width; x++, row += channels)
        out[x] = ((uint32_t)row[0] << 16) | ((uint32_t)row[1] << 8) | (uint32_t)row[2];
}

/* Masks are mostly runs of one colour: remember the last key and its class. */
static Py_ssize_t emit_classes(const uint8_t *row, uint16_t *out, Py_ssize_t width, int channels,
                               const uint16_t *lut, unsigned flag_from) {
    Py_ssize_t x, flagged = 0;
    uint32_t last_key = 0xFFFFFFFFu;
    uint16_t last = 0;
    for (x = 0; x < width; x++, row += channels) {
        const uint32_t key = ((uint32_t)row[0] << 16) | ((uint32_t)row[1] << 8) | (uint32_t)row[2];
        if (key != last_key) {
            last_key = key;
            last = (uint16_t)~lut[key];
        }
        out[x] = last;
        flagged += last >= flag_from;
    }
    return flagged;
}

/* One packed row of `depth`-bit samples (first pixel in the high bits) -> one byte each, times scale. */
static void emit_samples(const uint8_t *row, uint8_t *out, Py_ssize_t width, int depth, unsigned scale) {
    const int per_byte = 8 / depth;
    const unsigned mask = (1u << depth) - 1u;
    const Py_ssize_t full = width / per_byte;
    Py_ssize_t i, x;
    int k;
    switch (depth) {
    case 4:
        for (i = 0; i < full; i++) {
            out[2 * i] = (uint8_t)((row[i] >> 4) * scale);
            out[2 * i + 1] = (uint8_t)((row[i] & 15u) * scale);
        }
        break;
    case 2:
        for (i = 0; i < full; i++)
            for (k = 0; k < 4; k++) out[4 * i + k] = (uint8_t)(((row[i] >> (6 - 2 * k)) & 3u) * scale);
        break;
    default: /* 1 */
        for (i = 0; i < full; i++)
            for (k = 0; k < 8; k++) out[8 * i + k] = (uint8_t)(((row[i] >> (7 - k)) & 1u) * scale);
        break;
    }
    for (x = full * per_byte, k = 0; x < width; x++, k++) /* the last, partly used byte */
        out[x] = (uint8_t)(((row[full] >> (8 - depth * (k + 1))) & mask) * scale);
}

/* Bytes of one unfiltered row. */
static Py_ssize_t row_stride(Py_ssize_t width, int channels, int layout, int depth) {
    return layout == LAYOUT_SAMPLES ? (width * depth + 7) / 8 : width * channels;
}

/* Returns -1 on success, else the index of the row with an unknown filter type. */
static Py_ssize_t unfilter_image(const uint8_t *src, Py_ssize_t height, Py_ssize_t width, int channels,
                                 int layout, uint8_t *out, uint8_t *rows, const uint16_t *lut,
                                 unsigned flag_from, Py_ssize_t *flagged, int depth, unsigned scale) {
    const Py_ssize_t stride = row_stride(width, channels, layout, depth);
    uint8_t *prev = rows, *cur = rows + stride, *tmp;
    Py_ssize_t y;
    memset(prev, 0, (size_t)stride);
    for (y = 0; y < height; y++) {
        const uint8_t *line = src + y * (stride + 1);
        const int direct = layout == LAYOUT_RAW || (layout == LAYOUT_RGB && channels == 3);
        uint8_t *dst = direct ? out + y * stride : cur;
        if (unfilter_row(line[0], line + 1, dst, prev, stride, channels) != 0) return y;
        if (direct) {
            prev = dst;
            continue;
        }
        if (layout == LAYOUT_RGB)
            emit_rgb(cur, out + y * width * 3, width);
        else if (layout == LAYOUT_PACKED)
            emit_packed(cur, (uint32_t *)out + y * width, width, channels);
        else if (layout == LAYOUT_SAMPLES)
            emit_samples(cur, out + y * width, width, depth, scale);
        else
            *flagged += emit_classes(cur, (uint16_t *)out + y * width, width, channels, lut, flag_from);
        tmp = prev;
        prev = cur;
        cur = tmp;
    }
    return -1;
}

static PyObject *py_unfilter(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"filtered", "height", "width", "channels", "layout", "out", "lut", "flag_from",
                               "depth", "scale", NULL};
    Py_buffer src, out, lut = {0};
    Py_ssize_t height, width, flagged = 0, stride = 0;
    int channels, layout, depth = 8;
    unsigned flag_from = 0, scale = 1;
    PyObject *result = NULL;
    uint8_t *rows = NULL;
    Py_ssize_t bad_row = -1;
    (void)self;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*nnii" "w*|y*IiI", keywords, &src, &height, &width, &channels,
                                     &layout, &out, &lut, &flag_from, &depth, &scale))
        return NULL;
    if (height <= 0 || width <= 0 || channels < 1 || channels > 4) {
        PyErr_Format(PyExc_ValueError, "unfilter: height, width must be > 0 and channels 1..4. "
                     "Received: height=%zd, width=%zd, channels=%d", height, width, channels);
        goto done;
    }
    if (layout < LAYOUT_RAW || layout > LAYOUT_SAMPLES) {
        PyErr_Format(PyExc_ValueError, "unfilter: layout must be 0 (raw), 1 (rgb), 2 (packed), 3 (classes) or "
                     "4 (samples). Received: %d", layout);
        goto done;
    }
    if (layout == LAYOUT_SAMPLES ? (channels != 1 || (depth != 1 && depth != 2 && depth != 4) || scale < 1 || scale > 255)
                                 : depth != 8) {
        PyErr_Format(PyExc_ValueError, "unfilter: the samples layout needs channels=1, depth 1, 2 or 4 and scale "
                     "1..255; the others depth 8. Received: layout=%d, channels=%d, depth=%d, scale=%u",
                     layout, channels, depth, scale);
        goto done;
    }
    if (layout != LAYOUT_RAW && layout != LAYOUT_SAMPLES && channels < 3) {
        PyErr_Format(PyExc_ValueError, "unfilter: the rgb, packed and classes layouts need 3 or 4 channels. "
                     "Received: %d", channels);
        goto done;
    }
    if (layout == LAYOUT_CLASSES && lut.len != LUT_ENTRIES * 2) {
        PyErr_Format(PyExc_ValueError, "unfilter: the classes layout needs a lut of 2**24 uint16 entries "
                     "(%zd bytes). Received: %zd bytes", LUT_ENTRIES * 2, lut.buf ? lut.len : (Py_ssize_t)0);
        goto done;
    }
    if (width > PY_SSIZE_T_MAX / 4 / height || (width * channels + 1) > PY_SSIZE_T_MAX / height) {
        PyErr_Format(PyExc_ValueError, "unfilter: %zdx%zd is too large", width, height);
        goto done;
    }
    stride = row_stride(width, channels, layout, depth);
    {
        const Py_ssize_t need_src = height * (stride + 1);
        const Py_ssize_t per_pixel = layout == LAYOUT_RAW ? channels : layout == LAYOUT_RGB ? 3
                                     : layout == LAYOUT_PACKED ? 4 : layout == LAYOUT_SAMPLES ? 1 : 2;
        const Py_ssize_t need_out = height * width * per_pixel;
        if (src.len != need_src) {
            PyErr_Format(PyExc_ValueError, "unfilter: the image data holds %zd bytes, %zdx%zd with %d channels needs %zd",
                         src.len, width, height, channels, need_src);
            goto done;
        }
        if (out.len != need_out) {
            PyErr_Format(PyExc_ValueError, "unfilter: the output buffer holds %zd bytes, expected %zd", out.len, need_out);
            goto done;
        }
    }
    rows = (uint8_t *)malloc((size_t)(2 * stride));
    if (rows == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    bad_row = unfilter_image((const uint8_t *)src.buf, height, width, channels, layout, (uint8_t *)out.buf, rows,
                             (const uint16_t *)lut.buf, flag_from, &flagged, depth, scale);
    Py_END_ALLOW_THREADS
    if (bad_row >= 0) {
        PyErr_Format(PyExc_ValueError, "row %zd has filter type %d; PNG defines 0-4",
                     bad_row, (int)((const uint8_t *)src.buf)[bad_row * (stride + 1)]);
        goto done;
    }
    result = PyLong_FromSsize_t(flagged);
done:
    free(rows);
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    if (lut.obj != NULL) PyBuffer_Release(&lut);
    return result;
}

static PyMethodDef methods[] = {
    {"unfilter", (PyCFunction)(void (*)(void))py_unfilter, METH_VARARGS | METH_KEYWORDS,
     "unfilter(filtered, height, width, channels, layout, out, lut=None, flag_from=0, depth=8, scale=1) -> int\n"
     "Undo PNG row filters into `out`; for the classes layout (out = ~lut[colour]), return how many pixels got a value >= flag_from."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pngrows",
    "Undo PNG row filters (non-interlaced) straight into the layout the next stage wants.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__pngrows(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "LAYOUT_RAW", LAYOUT_RAW) < 0 ||
        PyModule_AddIntConstant(m, "LAYOUT_RGB", LAYOUT_RGB) < 0 ||
        PyModule_AddIntConstant(m, "LAYOUT_PACKED", LAYOUT_PACKED) < 0 ||
        PyModule_AddIntConstant(m, "LAYOUT_CLASSES", LAYOUT_CLASSES) < 0 ||
        PyModule_AddIntConstant(m, "LAYOUT_SAMPLES", LAYOUT_SAMPLES) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

/*
 * The host implementation of `readers.augment` for a whole batch: one pass per sample
 * from the stored uint8 image and mask to the final training tensors
 * (readers/augment_host.py is the Python side; docs/AUGMENT.md the conventions).
 *
 * Per sample, with the parameter row of `readers.augment.draw_params` (19 float32):
 *
 *   geometry  output pixel (x, y) (integer indices) comes from source position
 *               sx = a00 x + a01 y + t0,  sy = a10 x + a11 y + t1        (double)
 *             where source pixel centres sit at integers. It is *inside* when the nearest
 *             source pixel exists: -0.5 < sx < W - 0.5 and -0.5 < sy < H - 0.5.
 *             image: bilinear, x0 = floor(sx), fx = sx - x0, the two taps x0, x0 + 1
 *                    clamped to [0, W - 1] (edge replicated), rows blended first;
 *             mask:  nearest, floor(sx + 0.5) clamped, from the same (sx, sy), so image
 *                    and mask padding cover exactly the same pixels.
 *             Axis-aligned maps (a01 = a10 = 0: scale, flips, crop, 180 degrees) take a
 *             separable path: taps and weights per column once, per row the two source
 *             rows blended over the columns that the row reads, then one gather-and-blend
 *             per output value. Same arithmetic as the general path.
 *   colour    out = clip(c M x + M (delta + (1 - c) mean), 0, 255) per pixel (M: the 3x3
 *             colour matrix, c: the contrast factor, mean: per-channel mean of the resampled
 *             image over the inside pixels, needing a first pass over the sample);
 *             outside pixels get `fill`.
 *   output    float32 x / 255 (`normalize`), or uint8 rounded half to even (as tf.round);
 *             mask: class map or planes in the stored dtype (outside: `mask_fill` for a
 *             class map, all-zero planes), or, for a class map, float32 one-hot planes
 *             (1 at the class when class < classes and class != ignore; outside pixels
 *             are class `mask_fill`).
 *
 * warp(images, params, out_images, batch, height, width, out_height, out_width,
 *      fill_r, fill_g, fill_b, normalize, photometric, contrast,
 *      masks, out_masks, mask_itemsize, mask_planes, mask_fill, one_hot_classes, ignore)
 *   images:    uint8 (batch, height, width, 3), C-contiguous
 *   params:    float32 (batch, 19)
 *   out_images: writable, (batch, out_height, out_width, 3) float32 or uint8
 *   masks:     None, or (batch, height, width, mask_planes) of mask_itemsize (1 or 2) bytes
 *   out_masks: None, or writable: the masks' layout at the output size, or float32
 *              (..., one_hot_classes) when one_hot_classes > 0 (mask_planes must be 1)
 *   ignore:    the ignore index, or -1 for none (one-hot only)
 * Sizes are checked against the buffers (ValueError naming the argument). Plain C (the
 * compiler vectorises the row blends); the GIL is released while pixels are written.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NPARAMS 19

typedef struct {
    const uint8_t *images;
    const float *params;
    void *out_images;
    Py_ssize_t batch;
    int height, width, out_height, out_width;
    float fill[3];
    int normalize, photometric, contrast;
    const uint8_t *masks;
    void *out_masks;
    int mask_itemsize, mask_planes, mask_fill, classes, ignore;
} Job;

/* Per-sample scratch: the resampled image (float, 0-255) and where it is inside. */
typedef struct {
    float *rgb;       /* rows * out_width * 3 */
    uint8_t *valid;   /* rows * out_width */
    float *vrow;      /* width * 3: two source rows blended (separable path) */
    int *xa, *xb, *xn; /* out_width: bilinear taps and nearest column (separable path) */
    float *fx;
    uint8_t *vx;
} Scratch;

static inline int clampi(long v, int hi) { return v < 0 ? 0 : (v > hi ? hi : (int)v); }

/* floor() for the coordinates (|v| far below 2^63), without a libm call on baseline x86-64. */
static inline double floor_fast(double v) {
    double t = (double)(long)v;
    return t > v ? t - 1.0 : t;
}

/* Round half to even (as rintf / tf.round) for 0 <= v <= 255: adding 1.5 * 2^23 leaves no
 * fraction bits in float32, so the FPU's default rounding mode rounds. */
static inline uint8_t round_u8(float v) {
    const float big = 12582912.0f;
    return (uint8_t)(int)((v + big) - big);
}

/* One output row of the separable path: taps per column were computed in `s`. */
static void row_separable(const Job *job, const uint8_t *src, const float *p, int y, Scratch *s, float *rgb,
                          uint8_t *valid) {
    const int W = job->width, H = job->height, w = job->out_width;
    double sy = (double)p[4] * y + (double)p[5];
    int vy = sy > -0.5 && sy < H - 0.5;
    double fl = floor_fast(sy);
    float fy = (float)(sy - fl);
    int ya = clampi((long)fl, H - 1), yb = clampi((long)fl + 1, H - 1);
    if (!vy) {
        memset(valid, 0, (size_t)w);
        return;
    }
    /* Blend the two source rows over the columns this row reads. */
    int lo = W, hi = -1;
    for (int x = 0; x < w; x++) {
        if (!s->vx[x]) continue;
        if (s->xa[x] < lo) lo = s->xa[x];
        if (s->xb[x] > hi) hi = s->xb[x];
    }
    if (hi < lo) {
        memset(valid, 0, (size_t)w);
        return;
    }
    const uint8_t *top = src + (size_t)ya * W * 3, *bot = src + (size_t)yb * W * 3;
    for (int k = lo * 3; k < (hi + 1) * 3; k++) {
        float a = (float)top[k];
        s->vrow[k] = a + ((float)bot[k] - a) * fy;
    }
    const float *v = s->vrow;
    for (int x = 0; x < w; x++) {
        valid[x] = s->vx[x];
        if (!s->vx[x]) continue;
        const float *a = v + 3 * s->xa[x], *b = v + 3 * s->xb[x];
        float f = s->fx[x];
        rgb[3 * x] = a[0] + (b[0] - a[0]) * f;
        rgb[3 * x + 1] = a[1] + (b[1] - a[1]) * f;
        rgb[3 * x + 2] = a[2] + (b[2] - a[2]) * f;
    }
}

/* One output row of the general affine path. */
static void row_affine(const Job *job, const uint8_t *src, const float *p, int y, float *rgb, uint8_t *valid) {
    const int W = job->width, H = job->height, w = job->out_width;
    const double a00 = p[0], a01 = p[1], t0 = p[2], a10 = p[3], a11 = p[4], t1 = p[5];
    const double bx = a01 * y + t0, by = a11 * y + t1;
    for (int x = 0; x < w; x++) {
        double sx = a00 * x + bx, sy = a10 * x + by;
        int in = sx > -0.5 && sx < W - 0.5 && sy > -0.5 && sy < H - 0.5;
        valid[x] = (uint8_t)in;
        if (!in) continue;
        double flx = floor_fast(sx), fly = floor_fast(sy);
        float fx = (float)(sx - flx), fy = (float)(sy - fly);
        int xa = clampi((long)flx, W - 1), xb = clampi((long)flx + 1, W - 1);
        int ya = clampi((long)fly, H - 1), yb = clampi((long)fly + 1, H - 1);
        const uint8_t *r0 = src + (size_t)ya * W * 3, *r1 = src + (size_t)yb * W * 3;
        for (int k = 0; k < 3; k++) {
            float p00 = r0[3 * xa + k], p10 = r1[3 * xa + k], p01 = r0[3 * xb + k], p11 = r1[3 * xb + k];
            float left = p00 + (p10 - p00) * fy, right = p01 + (p11 - p01) * fy;
            rgb[3 * x + k] = left + (right - left) * fx;
        }
    }
}

/* Colour, fill and output conversion of one row. m: c * M (row-major), v: offset. */
static void row_finish(const Job *job, float *rgb, const uint8_t *valid, const float *m, const float *v,
                       Py_ssize_t n, int y) {
    const int w = job->out_width;
    size_t base = ((size_t)n * job->out_height + y) * (size_t)w * 3;
    if (job->photometric) {
        for (int x = 0; x < w; x++) {
            const float r = rgb[3 * x], g = rgb[3 * x + 1], b = rgb[3 * x + 2];
            for (int k = 0; k < 3; k++) {
                float o = m[3 * k] * r + m[3 * k + 1] * g + m[3 * k + 2] * b + v[k];
                rgb[3 * x + k] = o < 0.0f ? 0.0f : (o > 255.0f ? 255.0f : o);
            }
        }
    }
    for (int x = 0; x < w; x++) {
        if (!valid[x]) rgb[3 * x] = job->fill[0], rgb[3 * x + 1] = job->fill[1], rgb[3 * x + 2] = job->fill[2];
    }
    if (job->normalize) {
        float *of = (float *)job->out_images + base;
        const float scale = 1.0f / 255.0f;
        for (int k = 0; k < 3 * w; k++) of[k] = rgb[k] * scale;
    } else {
        uint8_t *ou = (uint8_t *)job->out_images + base;
        for (int k = 0; k < 3 * w; k++) {
            float o = rgb[k] < 0.0f ? 0.0f : (rgb[k] > 255.0f ? 255.0f : rgb[k]);
            ou[k] = round_u8(o);
        }
    }
}

static inline int mask_value(const Job *job, const uint8_t *src, size_t index) {
    return job->mask_itemsize == 1 ? src[index] : ((const uint16_t *)src)[index];
}

/* Nearest-neighbour mask of one sample, from the same source coordinates as the image. */
static void warp_mask(const Job *job, Py_ssize_t n, const float *p, const Scratch *s) {
    const int W = job->width, H = job->height, w = job->out_width, h = job->out_height, K = job->mask_planes;
    const size_t plane = (size_t)H * W * K;
    const uint8_t *src = job->masks + (size_t)n * plane * job->mask_itemsize;
    const double a00 = p[0], a01 = p[1], t0 = p[2], a10 = p[3], a11 = p[4], t1 = p[5];
    const int C = job->classes;
    for (int y = 0; y < h; y++) {
        const double bx = a01 * y + t0, by = a11 * y + t1;
        size_t row = ((size_t)n * h + y) * (size_t)w;
        const int vy = by > -0.5 && by < H - 0.5;
        const size_t ny = (size_t)clampi((long)floor_fast(by + 0.5), H - 1) * W;
        for (int x = 0; x < w; x++) {
            int in;
            size_t at;
            if (s) { /* separable: a10 = 0, so sy = by; columns precomputed */
                in = vy && s->vx[x];
                at = ny + s->xn[x];
            } else {
                double sx = a00 * x + bx, sy = a10 * x + by;
                in = sx > -0.5 && sx < W - 0.5 && sy > -0.5 && sy < H - 0.5;
                at = (size_t)clampi((long)floor_fast(sy + 0.5), H - 1) * W + clampi((long)floor_fast(sx + 0.5), W - 1);
            }
            if (C > 0) {
                float *o = (float *)job->out_masks + (row + x) * (size_t)C;
                int cls = in ? mask_value(job, src, at) : job->mask_fill;
                for (int k = 0; k < C; k++) o[k] = 0.0f;
                if (cls < C && cls != job->ignore) o[cls] = 1.0f;
            } else if (K == 1) {
                int cls = in ? mask_value(job, src, at) : job->mask_fill;
                if (job->mask_itemsize == 1)
                    ((uint8_t *)job->out_masks)[row + x] = (uint8_t)cls;
                else
                    ((uint16_t *)job->out_masks)[row + x] = (uint16_t)cls;
            } else {
                for (int k = 0; k < K; k++) {
                    int v = in ? mask_value(job, src, at * K + k) : 0;
                    if (job->mask_itemsize == 1)
                        ((uint8_t *)job->out_masks)[(row + x) * K + k] = (uint8_t)v;
                    else
                        ((uint16_t *)job->out_masks)[(row + x) * K + k] = (uint16_t)v;
                }
            }
        }
    }
}

static void warp_sample(const Job *job, Py_ssize_t n, Scratch *s) {
    const int W = job->width, H = job->height, w = job->out_width, h = job->out_height;
    const float *p = job->params + (size_t)n * NPARAMS;
    const uint8_t *src = job->images + (size_t)n * H * W * 3;
    const int separable = p[1] == 0.0f && p[3] == 0.0f;
    if (separable) {
        for (int x = 0; x < w; x++) {
            double sx = (double)p[0] * x + (double)p[2];
            double fl = floor_fast(sx);
            s->vx[x] = sx > -0.5 && sx < W - 0.5;
            s->xa[x] = clampi((long)fl, W - 1);
            s->xb[x] = clampi((long)fl + 1, W - 1);
            s->fx[x] = (float)(sx - fl);
            s->xn[x] = clampi((long)floor_fast(sx + 0.5), W - 1);
        }
    }
    /* The colour transform: c M and M (delta + (1 - c) mean) (the mean needs the whole sample first). */
    float m[9], v[3] = {0, 0, 0};
    const float c = p[18], delta = p[17];
    for (int k = 0; k < 9; k++) m[k] = p[8 + k] * c;
    int rows = job->contrast ? h : 1;
    if (!job->contrast)
        for (int k = 0; k < 3; k++) v[k] = p[8 + 3 * k] * delta + p[8 + 3 * k + 1] * delta + p[8 + 3 * k + 2] * delta;
    double sum[3] = {0, 0, 0};
    long count = 0;
    for (int y = 0; y < h; y++) {
        float *rgb = s->rgb + (size_t)(job->contrast ? y : 0) * w * 3;
        uint8_t *valid = s->valid + (size_t)(job->contrast ? y : 0) * w;
        if (separable)
            row_separable(job, src, p, y, s, rgb, valid);
        else
            row_affine(job, src, p, y, rgb, valid);
        if (job->contrast) {
            for (int x = 0; x < w; x++) {
                if (!valid[x]) continue;
                sum[0] += rgb[3 * x], sum[1] += rgb[3 * x + 1], sum[2] += rgb[3 * x + 2];
                count++;
            }
        } else {
            row_finish(job, rgb, valid, m, v, n, y);
        }
    }
    if (job->contrast) {
        float off[3];
        float cnt = (float)(count > 0 ? count : 1);
        for (int k = 0; k < 3; k++) off[k] = delta + (1.0f - c) * (float)(sum[k] / cnt);
        for (int k = 0; k < 3; k++)
            v[k] = p[8 + 3 * k] * off[0] + p[8 + 3 * k + 1] * off[1] + p[8 + 3 * k + 2] * off[2];
        for (int y = 0; y < rows; y++)
            row_finish(job, s->rgb + (size_t)y * w * 3, s->valid + (size_t)y * w, m, v, n, y);
    }
    if (job->masks) warp_mask(job, n, p, separable ? s : NULL);
}

static int run(const Job *job) {
    const int w = job->out_width, rows = job->contrast ? job->out_height : 1;
    Scratch s;
    s.rgb = malloc(sizeof(float) * (size_t)rows * w * 3);
    s.valid = malloc((size_t)rows * w);
    s.vrow = malloc(sizeof(float) * (size_t)job->width * 3);
    s.xa = malloc(sizeof(int) * (size_t)w * 3);
    s.fx = malloc(sizeof(float) * (size_t)w);
    s.vx = malloc((size_t)w);
    if (!s.rgb || !s.valid || !s.vrow || !s.xa || !s.fx || !s.vx) {
        free(s.rgb), free(s.valid), free(s.vrow), free(s.xa), free(s.fx), free(s.vx);
        return -1;
    }
    s.xb = s.xa + w;
    s.xn = s.xb + w;
    for (Py_ssize_t n = 0; n < job->batch; n++) warp_sample(job, n, &s);
    free(s.rgb), free(s.valid), free(s.vrow), free(s.xa), free(s.fx), free(s.vx);
    return 0;
}

static int check_size(Py_buffer *buf, size_t expected, const char *name) {
    if ((size_t)buf->len != expected) {
        PyErr_Format(PyExc_ValueError, "%s must hold %zu bytes for the given sizes. Received: %zd bytes", name,
                     expected, buf->len);
        return -1;
    }
    return 0;
}

static PyObject *warp(PyObject *self, PyObject *args) {
    Py_buffer images = {0}, params = {0}, out_images = {0}, masks = {0}, out_masks = {0};
    PyObject *masks_obj, *out_masks_obj, *result = NULL;
    Job job;
    int fill[3];
    memset(&job, 0, sizeof(job));
    if (!PyArg_ParseTuple(args, "y*y*w*niiiiiiipppOOiiiii", &images, &params, &out_images, &job.batch, &job.height,
                          &job.width, &job.out_height, &job.out_width, &fill[0], &fill[1], &fill[2], &job.normalize,
                          &job.photometric, &job.contrast, &masks_obj, &out_masks_obj, &job.mask_itemsize,
                          &job.mask_planes, &job.mask_fill, &job.classes, &job.ignore))
        return NULL;
    for (int k = 0; k < 3; k++) job.fill[k] = (float)fill[k];
    size_t B = (size_t)job.batch, out_pixels = B * job.out_height * job.out_width;
    if (job.batch < 0 || job.height < 1 || job.width < 1 || job.out_height < 1 || job.out_width < 1) {
        PyErr_SetString(PyExc_ValueError, "batch must be >= 0 and every size >= 1");
        goto done;
    }
    if (check_size(&images, B * job.height * job.width * 3, "images") ||
        check_size(&params, B * NPARAMS * sizeof(float), "params") ||
        check_size(&out_images, out_pixels * 3 * (job.normalize ? sizeof(float) : 1), "out_images"))
        goto done;
    if (masks_obj != Py_None) {
        if (job.mask_itemsize != 1 && job.mask_itemsize != 2) {
            PyErr_Format(PyExc_ValueError, "mask_itemsize must be 1 or 2. Received: %d", job.mask_itemsize);
            goto done;
        }
        if (job.mask_planes < 1 || (job.classes > 0 && job.mask_planes != 1)) {
            PyErr_Format(PyExc_ValueError, "mask_planes must be >= 1 (1 for one-hot output). Received: %d",
                         job.mask_planes);
            goto done;
        }
        if (PyObject_GetBuffer(masks_obj, &masks, PyBUF_SIMPLE) < 0 ||
            PyObject_GetBuffer(out_masks_obj, &out_masks, PyBUF_WRITABLE) < 0)
            goto done;
        size_t in_bytes = B * job.height * job.width * job.mask_planes * job.mask_itemsize;
        size_t out_bytes = job.classes > 0 ? out_pixels * job.classes * sizeof(float)
                                           : out_pixels * job.mask_planes * job.mask_itemsize;
        if (check_size(&masks, in_bytes, "masks") || check_size(&out_masks, out_bytes, "out_masks")) goto done;
        job.masks = masks.buf;
        job.out_masks = out_masks.buf;
    }
    job.images = images.buf;
    job.params = params.buf;
    job.out_images = out_images.buf;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = run(&job);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&images);
    PyBuffer_Release(&params);
    PyBuffer_Release(&out_images);
    if (masks.obj) PyBuffer_Release(&masks);
    if (out_masks.obj) PyBuffer_Release(&out_masks);
    return result;
}

static PyMethodDef methods[] = {
    {"warp", warp, METH_VARARGS,
     "warp(images, params, out_images, batch, height, width, out_height, out_width, fill_r, fill_g, fill_b, "
     "normalize, photometric, contrast, masks, out_masks, mask_itemsize, mask_planes, mask_fill, "
     "one_hot_classes, ignore): augment a uint8 batch into preallocated outputs (see readers/_warp.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_warp",
                                    "Fused batch augmentation: bilinear image + nearest mask + colour (C).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__warp(void) { return PyModule_Create(&module); }

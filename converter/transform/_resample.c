/*
 * Pillow's antialiased resampling for 8-bit images, bit for bit, without the detour through
 * a PIL image (converter/transform/resize.py).
 *
 * `Image.resize(size, filter, box=box, reducing_gap=None)` on an 8-bit L or RGB image runs
 * Pillow's libImaging/Resample.c: per axis, filter coefficients are computed in double
 * (`precompute_coeffs`), rounded to 22-bit fixed point (`normalize_coeffs_8bpc`), and each
 * output value is an int32 sum starting at 1 << 21, clipped to 0..255 after >> 22. The two
 * separable passes run in the order `ImagingResampleInner` picks (horizontal first unless the
 * height shrinks more than twice as much as the width), the first pass over only the rows
 * (or columns) the second one reads; each pass rounds to 8 bits. This module repeats that
 * arithmetic exactly: the coefficient code is Pillow's, with the same float/double steps
 * (the box arrives as float32, as through Pillow's "(ffff)" argument parsing), and since the
 * sums are integers the order of the multiply-adds does not change them, so the passes are
 * free to be vectorised:
 *
 *   vertical pass    each output row is a weighted sum of whole input rows with one
 *                    coefficient per row: contiguous, 8 int32 lanes at a time;
 *   horizontal pass  blocks of 8 rows are transposed (byte j of row r -> t[j * 8 + r]), so
 *                    one coefficient multiplies the same column of 8 rows at once; the
 *                    results are transposed back.
 *
 * The vectorised kernels use AVX2 and are chosen at run time (`__builtin_cpu_supports`);
 * the build needs no -march flag, and elsewhere (no AVX2, not x86, not GCC/Clang, or built
 * with -DIMGSHARD_PLAIN_C) plain C loops give the same bytes. Pillow takes the same short cut for an integer box of the
 * output's size (a crop), and so does this module.
 *
 * resample(src, height, width, channels, out, out_height, out_width, filter, box, simd=True)
 *   src:     bytes-like, height * width * channels bytes, rows of width * channels bytes
 *   out:     writable contiguous buffer of out_height * out_width * channels bytes
 *   filter:  one of the FILTER_* constants (Pillow's numbers: FILTER_BILINEAR is
 *            Image.Resampling.BILINEAR, ...)
 *   box:     (x0, y0, x1, y1) in source pixels, inside the image, x0 <= x1 and y0 <= y1
 *   simd:    False forces the plain C loops (tests compare both)
 * Raises ValueError naming the bad argument. The GIL is released while pixels are resampled.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(IMGSHARD_PLAIN_C)
#define HAVE_AVX2_KERNELS 1
#include <immintrin.h>
#else
#define HAVE_AVX2_KERNELS 0
#endif

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

/* Pillow's filter numbers (PIL.Image.Resampling). NEAREST (0) is not an antialiased filter. */
enum { FILTER_LANCZOS = 1, FILTER_BILINEAR = 2, FILTER_BICUBIC = 3, FILTER_BOX = 4, FILTER_HAMMING = 5 };

#define PRECISION_BITS (32 - 8 - 2)
#define HALF (1 << (PRECISION_BITS - 1))
#define ROWS 8 /* rows per transposed block of the vectorised horizontal pass */

/* -- Pillow's filters and coefficients, kept to its exact float/double steps -------------------- */

static double box_filter(double x) {
    if (x > -0.5 && x <= 0.5) return 1.0;
    return 0.0;
}

static double bilinear_filter(double x) {
    if (x < 0.0) x = -x;
    if (x < 1.0) return 1.0 - x;
    return 0.0;
}

static double hamming_filter(double x) {
    if (x < 0.0) x = -x;
    if (x == 0.0) return 1.0;
    if (x >= 1.0) return 0.0;
    x = x * M_PI;
    return sin(x) / x * (0.54f + 0.46f * cos(x));
}

static double bicubic_filter(double x) {
#define a -0.5
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
#undef a
}

static double sinc_filter(double x) {
    if (x == 0.0) return 1.0;
    x = x * M_PI;
    return sin(x) / x;
}

static double lanczos_filter(double x) {
    if (-3.0 <= x && x < 3.0) return sinc_filter(x) * sinc_filter(x / 3);
    return 0.0;
}

typedef struct {
    double (*fn)(double);
    double support;
} filter_t;

static const filter_t *lookup_filter(int filter) {
    static const filter_t box = {box_filter, 0.5}, bilinear = {bilinear_filter, 1.0},
                          hamming = {hamming_filter, 1.0}, bicubic = {bicubic_filter, 2.0},
                          lanczos = {lanczos_filter, 3.0};
    switch (filter) {
    case FILTER_BOX: return &box;
    case FILTER_BILINEAR: return &bilinear;
    case FILTER_HAMMING: return &hamming;
    case FILTER_BICUBIC: return &bicubic;
    case FILTER_LANCZOS: return &lanczos;
    default: return NULL;
    }
}

/* One axis: per output index, the first input index, the tap count and ksize fixed-point
 * coefficients (Pillow's precompute_coeffs + normalize_coeffs_8bpc). Returns 0 when out of memory. */
typedef struct {
    int ksize;
    int *bounds;  /* 2 per output: xmin, count */
    int32_t *kk;  /* ksize per output */
} coeffs_t;

static void free_coeffs(coeffs_t *c) {
    free(c->bounds);
    free(c->kk);
    c->bounds = NULL;
    c->kk = NULL;
}

static int precompute_coeffs(int in_size, float in0, float in1, int out_size, const filter_t *filterp,
                             coeffs_t *c) {
    double support, scale, filterscale;
    int xx, x, ksize, xmin, xmax;
    double *k;

    filterscale = scale = (double)(in1 - in0) / out_size;
    if (filterscale < 1.0) filterscale = 1.0;
    support = filterp->support * filterscale;
    ksize = (int)ceil(support) * 2 + 1;
    c->ksize = ksize;
    c->bounds = (int *)malloc((size_t)out_size * 2 * sizeof(int));
    c->kk = (int32_t *)malloc((size_t)out_size * (size_t)ksize * sizeof(int32_t));
    k = (double *)malloc((size_t)ksize * sizeof(double));
    if (c->bounds == NULL || c->kk == NULL || k == NULL) {
        free(k);
        free_coeffs(c);
        return 0;
    }
    double inv_filterscale = 1.0 / filterscale;
    for (xx = 0; xx < out_size; xx++) {
        double center = in0 + (xx + 0.5) * scale;
        double ww = 0.0;
        int32_t *kout = &c->kk[(size_t)xx * ksize];
        xmin = (int)(center - support + 0.5);
        if (xmin < 0) xmin = 0;
        xmax = (int)(center + support + 0.5);
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        for (x = 0; x < xmax; x++) {
            double w = filterp->fn((x + xmin - center + 0.5) * inv_filterscale);
            k[x] = w;
            ww += w;
        }
        if (ww != 0.0) {
            for (x = 0; x < xmax; x++) k[x] /= ww;
        }
        for (; x < ksize; x++) k[x] = 0;
        for (x = 0; x < ksize; x++) {
            if (k[x] < 0)
                kout[x] = (int)(-0.5 + k[x] * (1 << PRECISION_BITS));
            else
                kout[x] = (int)(0.5 + k[x] * (1 << PRECISION_BITS));
        }
        c->bounds[xx * 2 + 0] = xmin;
        c->bounds[xx * 2 + 1] = xmax < 0 ? 0 : xmax;
    }
    free(k);
    return 1;
}

static inline uint8_t clip8(int32_t ss) {
    int32_t v = ss >> PRECISION_BITS;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* -- plain C passes --------------------------------------------------------------------------- */

/* nrows rows: out[r][xx*ch + c] = sum_x in[r][(xmin + x)*ch + c] * k[xx][x] */
static void hpass_plain(const uint8_t *in, Py_ssize_t in_stride, uint8_t *out, Py_ssize_t out_stride, int nrows,
                        int xsize, int ch, const coeffs_t *c) {
    int r, xx, x;
    for (r = 0; r < nrows; r++) {
        const uint8_t *li = in + r * in_stride;
        uint8_t *lo = out + r * out_stride;
        for (xx = 0; xx < xsize; xx++) {
            const int xmin = c->bounds[xx * 2], xmax = c->bounds[xx * 2 + 1];
            const int32_t *k = &c->kk[(size_t)xx * c->ksize];
            if (ch == 1) {
                int32_t ss = HALF;
                for (x = 0; x < xmax; x++) ss += li[x + xmin] * k[x];
                lo[xx] = clip8(ss);
            } else {
                int32_t s0 = HALF, s1 = HALF, s2 = HALF;
                const uint8_t *p = li + (Py_ssize_t)xmin * 3;
                for (x = 0; x < xmax; x++, p += 3) {
                    s0 += p[0] * k[x];
                    s1 += p[1] * k[x];
                    s2 += p[2] * k[x];
                }
                lo[xx * 3 + 0] = clip8(s0);
                lo[xx * 3 + 1] = clip8(s1);
                lo[xx * 3 + 2] = clip8(s2);
            }
        }
    }
}

#define VCHUNK 1024

/* ysize rows of row_bytes: out[yy][j] = sum_y in[ymin + y][j] * k[yy][y] */
static void vpass_plain(const uint8_t *in, Py_ssize_t in_stride, uint8_t *out, Py_ssize_t out_stride, int ysize,
                        Py_ssize_t row_bytes, const coeffs_t *c) {
    int32_t acc[VCHUNK];
    int yy, y;
    Py_ssize_t j0, j, n;
    for (yy = 0; yy < ysize; yy++) {
        const int ymin = c->bounds[yy * 2], ymax = c->bounds[yy * 2 + 1];
        const int32_t *k = &c->kk[(size_t)yy * c->ksize];
        uint8_t *lo = out + yy * out_stride;
        for (j0 = 0; j0 < row_bytes; j0 += VCHUNK) {
            n = row_bytes - j0 < VCHUNK ? row_bytes - j0 : VCHUNK;
            for (j = 0; j < n; j++) acc[j] = HALF;
            for (y = 0; y < ymax; y++) {
                const uint8_t *li = in + (Py_ssize_t)(ymin + y) * in_stride + j0;
                const int32_t kv = k[y];
                for (j = 0; j < n; j++) acc[j] += li[j] * kv;
            }
            for (j = 0; j < n; j++) lo[j0 + j] = clip8(acc[j]);
        }
    }
}

/* -- AVX2 passes ------------------------------------------------------------------------------ */
#if HAVE_AVX2_KERNELS
#define AVX2 __attribute__((target("avx2")))

static AVX2 inline __m256i load8_epi32(const uint8_t *p) { /* 8 bytes -> 8 int32 */
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

static AVX2 inline __m128i clip8x8(__m256i acc) { /* 8 sums -> 8 bytes in the low half */
    __m256i v = _mm256_srai_epi32(acc, PRECISION_BITS);
    __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    return _mm_packus_epi16(w, w);
}

static AVX2 void vpass_avx2(const uint8_t *in, Py_ssize_t in_stride, uint8_t *out, Py_ssize_t out_stride,
                            int ysize, Py_ssize_t row_bytes, const coeffs_t *c) {
    const __m256i half = _mm256_set1_epi32(HALF);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    int yy, y;
    for (yy = 0; yy < ysize; yy++) {
        const int ymin = c->bounds[yy * 2], ymax = c->bounds[yy * 2 + 1];
        const int32_t *k = &c->kk[(size_t)yy * c->ksize];
        const uint8_t *base = in + (Py_ssize_t)ymin * in_stride;
        uint8_t *lo = out + yy * out_stride;
        Py_ssize_t j = 0;
        for (; j + 32 <= row_bytes; j += 32) {
            __m256i a0 = half, a1 = half, a2 = half, a3 = half;
            const uint8_t *p = base + j;
            for (y = 0; y < ymax; y++, p += in_stride) {
                const __m256i kv = _mm256_set1_epi32(k[y]);
                a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(load8_epi32(p), kv));
                a1 = _mm256_add_epi32(a1, _mm256_mullo_epi32(load8_epi32(p + 8), kv));
                a2 = _mm256_add_epi32(a2, _mm256_mullo_epi32(load8_epi32(p + 16), kv));
                a3 = _mm256_add_epi32(a3, _mm256_mullo_epi32(load8_epi32(p + 24), kv));
            }
            a0 = _mm256_srai_epi32(a0, PRECISION_BITS);
            a1 = _mm256_srai_epi32(a1, PRECISION_BITS);
            a2 = _mm256_srai_epi32(a2, PRECISION_BITS);
            a3 = _mm256_srai_epi32(a3, PRECISION_BITS);
            __m256i b = _mm256_packus_epi16(_mm256_packs_epi32(a0, a1), _mm256_packs_epi32(a2, a3));
            _mm256_storeu_si256((__m256i *)(lo + j), _mm256_permutevar8x32_epi32(b, order));
        }
        for (; j + 8 <= row_bytes; j += 8) {
            __m256i a0 = half;
            const uint8_t *p = base + j;
            for (y = 0; y < ymax; y++, p += in_stride)
                a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(load8_epi32(p), _mm256_set1_epi32(k[y])));
            _mm_storel_epi64((__m128i *)(lo + j), clip8x8(a0));
        }
        for (; j < row_bytes; j++) {
            int32_t ss = HALF;
            for (y = 0; y < ymax; y++) ss += base[(Py_ssize_t)y * in_stride + j] * k[y];
            lo[j] = clip8(ss);
        }
    }
}

/* t[j * 8 + r] = rows[r][j] for j in [j0, j1) */
static AVX2 void transpose_in(const uint8_t *const rows[ROWS], Py_ssize_t j0, Py_ssize_t j1, uint8_t *t) {
    Py_ssize_t j = j0;
    int r;
    for (; j + 16 <= j1; j += 16) {
        __m128i a0 = _mm_loadu_si128((const __m128i *)(rows[0] + j)), a1 = _mm_loadu_si128((const __m128i *)(rows[1] + j));
        __m128i a2 = _mm_loadu_si128((const __m128i *)(rows[2] + j)), a3 = _mm_loadu_si128((const __m128i *)(rows[3] + j));
        __m128i a4 = _mm_loadu_si128((const __m128i *)(rows[4] + j)), a5 = _mm_loadu_si128((const __m128i *)(rows[5] + j));
        __m128i a6 = _mm_loadu_si128((const __m128i *)(rows[6] + j)), a7 = _mm_loadu_si128((const __m128i *)(rows[7] + j));
        __m128i b0 = _mm_unpacklo_epi8(a0, a1), b1 = _mm_unpackhi_epi8(a0, a1);
        __m128i b2 = _mm_unpacklo_epi8(a2, a3), b3 = _mm_unpackhi_epi8(a2, a3);
        __m128i b4 = _mm_unpacklo_epi8(a4, a5), b5 = _mm_unpackhi_epi8(a4, a5);
        __m128i b6 = _mm_unpacklo_epi8(a6, a7), b7 = _mm_unpackhi_epi8(a6, a7);
        __m128i c0 = _mm_unpacklo_epi16(b0, b2), c1 = _mm_unpackhi_epi16(b0, b2);
        __m128i c2 = _mm_unpacklo_epi16(b1, b3), c3 = _mm_unpackhi_epi16(b1, b3);
        __m128i c4 = _mm_unpacklo_epi16(b4, b6), c5 = _mm_unpackhi_epi16(b4, b6);
        __m128i c6 = _mm_unpacklo_epi16(b5, b7), c7 = _mm_unpackhi_epi16(b5, b7);
        __m128i *d = (__m128i *)(t + (j - j0) * ROWS);
        _mm_storeu_si128(d + 0, _mm_unpacklo_epi32(c0, c4));
        _mm_storeu_si128(d + 1, _mm_unpackhi_epi32(c0, c4));
        _mm_storeu_si128(d + 2, _mm_unpacklo_epi32(c1, c5));
        _mm_storeu_si128(d + 3, _mm_unpackhi_epi32(c1, c5));
        _mm_storeu_si128(d + 4, _mm_unpacklo_epi32(c2, c6));
        _mm_storeu_si128(d + 5, _mm_unpackhi_epi32(c2, c6));
        _mm_storeu_si128(d + 6, _mm_unpacklo_epi32(c3, c7));
        _mm_storeu_si128(d + 7, _mm_unpackhi_epi32(c3, c7));
    }
    for (; j < j1; j++)
        for (r = 0; r < ROWS; r++) t[(j - j0) * ROWS + r] = rows[r][j];
}

/* rows[r][j] = t[j * 8 + r] for j in [0, n) */
static AVX2 void transpose_out(const uint8_t *t, Py_ssize_t n, uint8_t *const rows[ROWS]) {
    const __m128i pair = _mm_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    Py_ssize_t j = 0;
    int r;
    for (; j + 16 <= n; j += 16) {
        const __m128i *s = (const __m128i *)(t + j * ROWS);
        /* x_m: word r = (byte j + 2m, byte j + 2m + 1) of row r */
        __m128i x0 = _mm_shuffle_epi8(_mm_loadu_si128(s + 0), pair), x1 = _mm_shuffle_epi8(_mm_loadu_si128(s + 1), pair);
        __m128i x2 = _mm_shuffle_epi8(_mm_loadu_si128(s + 2), pair), x3 = _mm_shuffle_epi8(_mm_loadu_si128(s + 3), pair);
        __m128i x4 = _mm_shuffle_epi8(_mm_loadu_si128(s + 4), pair), x5 = _mm_shuffle_epi8(_mm_loadu_si128(s + 5), pair);
        __m128i x6 = _mm_shuffle_epi8(_mm_loadu_si128(s + 6), pair), x7 = _mm_shuffle_epi8(_mm_loadu_si128(s + 7), pair);
        __m128i s0 = _mm_unpacklo_epi16(x0, x1), s1 = _mm_unpackhi_epi16(x0, x1);
        __m128i s2 = _mm_unpacklo_epi16(x2, x3), s3 = _mm_unpackhi_epi16(x2, x3);
        __m128i s4 = _mm_unpacklo_epi16(x4, x5), s5 = _mm_unpackhi_epi16(x4, x5);
        __m128i s6 = _mm_unpacklo_epi16(x6, x7), s7 = _mm_unpackhi_epi16(x6, x7);
        __m128i u0 = _mm_unpacklo_epi32(s0, s2), u1 = _mm_unpackhi_epi32(s0, s2);
        __m128i u2 = _mm_unpacklo_epi32(s1, s3), u3 = _mm_unpackhi_epi32(s1, s3);
        __m128i u4 = _mm_unpacklo_epi32(s4, s6), u5 = _mm_unpackhi_epi32(s4, s6);
        __m128i u6 = _mm_unpacklo_epi32(s5, s7), u7 = _mm_unpackhi_epi32(s5, s7);
        _mm_storeu_si128((__m128i *)(rows[0] + j), _mm_unpacklo_epi64(u0, u4));
        _mm_storeu_si128((__m128i *)(rows[1] + j), _mm_unpackhi_epi64(u0, u4));
        _mm_storeu_si128((__m128i *)(rows[2] + j), _mm_unpacklo_epi64(u1, u5));
        _mm_storeu_si128((__m128i *)(rows[3] + j), _mm_unpackhi_epi64(u1, u5));
        _mm_storeu_si128((__m128i *)(rows[4] + j), _mm_unpacklo_epi64(u2, u6));
        _mm_storeu_si128((__m128i *)(rows[5] + j), _mm_unpackhi_epi64(u2, u6));
        _mm_storeu_si128((__m128i *)(rows[6] + j), _mm_unpacklo_epi64(u3, u7));
        _mm_storeu_si128((__m128i *)(rows[7] + j), _mm_unpackhi_epi64(u3, u7));
    }
    for (; j < n; j++)
        for (r = 0; r < ROWS; r++) rows[r][j] = t[j * ROWS + r];
}

/* One block of 8 transposed rows: tin holds columns from x_first on, tout gets xsize * ch columns. */
static AVX2 inline __attribute__((always_inline)) void hblock_avx2(const uint8_t *tin, uint8_t *tout, int x_first, int xsize, int ch,
                                    const coeffs_t *c) {
    const __m256i half = _mm256_set1_epi32(HALF);
    int xx, x;
    for (xx = 0; xx < xsize; xx++) {
        const int xmax = c->bounds[xx * 2 + 1];
        const int32_t *k = &c->kk[(size_t)xx * c->ksize];
        const uint8_t *p = tin + (Py_ssize_t)(c->bounds[xx * 2] - x_first) * ch * ROWS;
        if (ch == 1) {
            __m256i a0 = half;
            for (x = 0; x < xmax; x++, p += ROWS)
                a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(load8_epi32(p), _mm256_set1_epi32(k[x])));
            _mm_storel_epi64((__m128i *)(tout + (Py_ssize_t)xx * ROWS), clip8x8(a0));
        } else {
            __m256i a0 = half, a1 = half, a2 = half;
            for (x = 0; x < xmax; x++, p += 3 * ROWS) {
                const __m256i kv = _mm256_set1_epi32(k[x]);
                a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(load8_epi32(p), kv));
                a1 = _mm256_add_epi32(a1, _mm256_mullo_epi32(load8_epi32(p + ROWS), kv));
                a2 = _mm256_add_epi32(a2, _mm256_mullo_epi32(load8_epi32(p + 2 * ROWS), kv));
            }
            uint8_t *o = tout + (Py_ssize_t)xx * 3 * ROWS;
            _mm_storel_epi64((__m128i *)o, clip8x8(a0));
            _mm_storel_epi64((__m128i *)(o + ROWS), clip8x8(a1));
            _mm_storel_epi64((__m128i *)(o + 2 * ROWS), clip8x8(a2));
        }
    }
}

/* Same contract as hpass_plain; tin / tout: scratch of 8 * (columns used) * ch and 8 * xsize * ch bytes,
 * scratch_row: xsize * ch bytes for the rows past the last one of a short block. */
static AVX2 void hpass_avx2(const uint8_t *in, Py_ssize_t in_stride, uint8_t *out, Py_ssize_t out_stride,
                            int nrows, int xsize, int ch, const coeffs_t *c, int x_first, int x_last,
                            uint8_t *tin, uint8_t *tout, uint8_t *scratch_row) {
    const uint8_t *src[ROWS];
    uint8_t *dst[ROWS];
    int r0, r;
    for (r0 = 0; r0 < nrows; r0 += ROWS) {
        for (r = 0; r < ROWS; r++) {
            const int row = r0 + r < nrows ? r0 + r : nrows - 1;
            src[r] = in + (Py_ssize_t)row * in_stride;
            dst[r] = r0 + r < nrows ? out + (Py_ssize_t)(r0 + r) * out_stride : scratch_row;
        }
        transpose_in(src, (Py_ssize_t)x_first * ch, (Py_ssize_t)x_last * ch, tin);
        if (ch == 1)
            hblock_avx2(tin, tout, x_first, xsize, 1, c);
        else
            hblock_avx2(tin, tout, x_first, xsize, 3, c);
        transpose_out(tout, (Py_ssize_t)xsize * ch, dst);
    }
}

static int cpu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
}
#else
static int cpu_has_avx2(void) { return 0; }
#endif

static int have_avx2 = 0;

/* -- the two passes, in Pillow's order -------------------------------------------------------- */

typedef struct {
    const uint8_t *src;
    uint8_t *out;
    int height, width, ch, out_height, out_width;
    const filter_t *filterp;
    float box[4];
    int simd;
} job_t;

static void horizontal(const job_t *job, const uint8_t *in, Py_ssize_t in_stride, uint8_t *out,
                       Py_ssize_t out_stride, int nrows, const coeffs_t *c, int *failed) {
#if HAVE_AVX2_KERNELS
    if (job->simd && have_avx2) {
        const int xsize = job->out_width, ch = job->ch;
        int x_first = c->bounds[0], x_last = c->bounds[0], xx;
        for (xx = 0; xx < xsize; xx++) { /* the columns any output reads */
            const int start = c->bounds[xx * 2], end = start + c->bounds[xx * 2 + 1];
            if (start < x_first) x_first = start;
            if (end > x_last) x_last = end;
        }
        {
            const size_t cols = (size_t)(x_last - x_first) * ch;
            uint8_t *tin = (uint8_t *)malloc(cols * ROWS + 16);
            uint8_t *tout = (uint8_t *)malloc((size_t)xsize * ch * ROWS + 16);
            uint8_t *scratch = (uint8_t *)malloc((size_t)xsize * ch + 16);
            if (tin == NULL || tout == NULL || scratch == NULL) {
                *failed = 1;
            } else {
                hpass_avx2(in, in_stride, out, out_stride, nrows, xsize, ch, c, x_first, x_last, tin, tout,
                           scratch);
            }
            free(tin);
            free(tout);
            free(scratch);
        }
        return;
    }
#endif
    (void)failed;
    hpass_plain(in, in_stride, out, out_stride, nrows, job->out_width, job->ch, c);
}

static void vertical(const job_t *job, const uint8_t *in, Py_ssize_t in_stride, uint8_t *out, Py_ssize_t out_stride,
                     Py_ssize_t row_bytes, const coeffs_t *c) {
#if HAVE_AVX2_KERNELS
    if (job->simd && have_avx2) {
        vpass_avx2(in, in_stride, out, out_stride, job->out_height, row_bytes, c);
        return;
    }
#endif
    vpass_plain(in, in_stride, out, out_stride, job->out_height, row_bytes, c);
}

/* Pillow's ImagingResampleInner (and _resize's crop short cut). Returns 0, -1 when out of memory,
 * -2 if the rows a horizontal-only pass reads do not match the output (cannot happen: kept as a guard). */
static int run_job(const job_t *job) {
    const int xsize = job->out_width, ysize = job->out_height, ch = job->ch;
    const float *box = job->box;
    const Py_ssize_t in_stride = (Py_ssize_t)job->width * ch;
    const Py_ssize_t out_stride = (Py_ssize_t)xsize * ch;
    coeffs_t horiz = {0, NULL, NULL}, vert = {0, NULL, NULL};
    uint8_t *tmp = NULL;
    int failed = 0, i;

    if (box[0] - (int)box[0] == 0 && box[2] - box[0] == xsize && box[1] - (int)box[1] == 0 &&
        box[3] - box[1] == ysize) {
        const int x0 = (int)box[0], y0 = (int)box[1];
        for (i = 0; i < ysize; i++)
            memcpy(job->out + i * out_stride, job->src + (Py_ssize_t)(y0 + i) * in_stride + (Py_ssize_t)x0 * ch,
                   (size_t)out_stride);
        return 0;
    }

    const int need_horizontal = xsize != job->width || box[0] || box[2] != xsize;
    const int need_vertical = ysize != job->height || box[1] || box[3] != ysize;
    const int horizontal_first = !((job->height - ysize) > 0 && (job->height - ysize) > (job->width - xsize) * 2);
    int ybox_first = 0, ybox_last = 0;

    if ((need_horizontal && horizontal_first) || need_vertical) {
        if (!precompute_coeffs(job->height, box[1], box[3], ysize, job->filterp, &vert)) return -1;
    }
    if (need_horizontal) {
        if (horizontal_first) {
            ybox_first = vert.bounds[0];
            ybox_last = vert.bounds[ysize * 2 - 2] + vert.bounds[ysize * 2 - 1];
            for (i = 0; i < ysize; i++) vert.bounds[i * 2] -= ybox_first;
        }
        if (!precompute_coeffs(job->width, box[0], box[2], xsize, job->filterp, &horiz)) {
            free_coeffs(&vert);
            return -1;
        }
    }

    if (need_horizontal && need_vertical) {
        const int tmp_rows = horizontal_first ? ybox_last - ybox_first : ysize;
        const Py_ssize_t tmp_stride = horizontal_first ? out_stride : in_stride;
        tmp = (uint8_t *)malloc((size_t)tmp_rows * (size_t)tmp_stride + 1);
        if (tmp == NULL) {
            failed = 1;
        } else if (horizontal_first) {
            horizontal(job, job->src + (Py_ssize_t)ybox_first * in_stride, in_stride, tmp, tmp_stride, tmp_rows,
                       &horiz, &failed);
            if (!failed) vertical(job, tmp, tmp_stride, job->out, out_stride, out_stride, &vert);
        } else {
            vertical(job, job->src, in_stride, tmp, tmp_stride, in_stride, &vert);
            horizontal(job, tmp, tmp_stride, job->out, out_stride, ysize, &horiz, &failed);
        }
    } else if (need_horizontal) {
        /* the vertical coefficients of an untouched axis cover every row: ybox_last - ybox_first == ysize */
        if (ybox_first != 0 || ybox_last != ysize) {
            free_coeffs(&horiz);
            free_coeffs(&vert);
            return -2;
        }
        horizontal(job, job->src + (Py_ssize_t)ybox_first * in_stride, in_stride, job->out, out_stride, ysize,
                   &horiz, &failed);
    } else if (need_vertical) {
        vertical(job, job->src, in_stride, job->out, out_stride, in_stride, &vert);
    } else {
        memcpy(job->out, job->src, (size_t)ysize * (size_t)out_stride);
    }
    free(tmp);
    free_coeffs(&horiz);
    free_coeffs(&vert);
    return failed ? -1 : 0;
}

/* -- Python binding ---------------------------------------------------------------------------- */

static PyObject *py_resample(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"src", "height", "width", "channels", "out", "out_height", "out_width",
                               "filter", "box", "simd", NULL};
    Py_buffer src, out;
    job_t job;
    int rc = 0;
    PyObject *result = NULL;
    (void)self;

    memset(&job, 0, sizeof job);
    job.simd = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*iii" "w*iii(ffff)|p", keywords, &src, &job.height,
                                     &job.width, &job.ch, &out, &job.out_height, &job.out_width, &rc,
                                     &job.box[0], &job.box[1], &job.box[2], &job.box[3], &job.simd))
        return NULL;
    job.filterp = lookup_filter(rc);
    if (job.filterp == NULL) {
        PyErr_Format(PyExc_ValueError, "resample: filter must be FILTER_BOX (%d), FILTER_BILINEAR (%d), "
                     "FILTER_HAMMING (%d), FILTER_BICUBIC (%d) or FILTER_LANCZOS (%d). Received: filter=%d",
                     FILTER_BOX, FILTER_BILINEAR, FILTER_HAMMING, FILTER_BICUBIC, FILTER_LANCZOS, rc);
        goto done;
    }
    if (job.ch != 1 && job.ch != 3) {
        PyErr_Format(PyExc_ValueError, "resample: channels must be 1 (L) or 3 (RGB). Received: channels=%d", job.ch);
        goto done;
    }
    if (job.height <= 0 || job.width <= 0) {
        PyErr_Format(PyExc_ValueError, "resample: height and width must be > 0. Received: height=%d, width=%d",
                     job.height, job.width);
        goto done;
    }
    if (job.out_height <= 0 || job.out_width <= 0) {
        PyErr_Format(PyExc_ValueError, "resample: out_height and out_width must be > 0. "
                     "Received: out_height=%d, out_width=%d", job.out_height, job.out_width);
        goto done;
    }
    if (!(isfinite(job.box[0]) && isfinite(job.box[1]) && isfinite(job.box[2]) && isfinite(job.box[3])) ||
        job.box[0] < 0 || job.box[1] < 0 || job.box[2] > job.width || job.box[3] > job.height ||
        job.box[2] - job.box[0] < 0 || job.box[3] - job.box[1] < 0) {
        char text[160];
        snprintf(text, sizeof text, "(%.9g, %.9g, %.9g, %.9g)", (double)job.box[0], (double)job.box[1],
                 (double)job.box[2], (double)job.box[3]);
        PyErr_Format(PyExc_ValueError, "resample: box must lie inside the %dx%d image with x0 <= x1 and y0 <= y1. "
                     "Received: box=%s", job.width, job.height, text);
        goto done;
    }
    {
        const Py_ssize_t need_src = (Py_ssize_t)job.height * job.width * job.ch;
        const Py_ssize_t need_out = (Py_ssize_t)job.out_height * job.out_width * job.ch;
        if (src.len != need_src) {
            PyErr_Format(PyExc_ValueError, "resample: src must hold height * width * channels = %zd bytes. "
                         "Received: %zd bytes", need_src, src.len);
            goto done;
        }
        if (out.len != need_out) {
            PyErr_Format(PyExc_ValueError, "resample: out must hold out_height * out_width * channels = %zd bytes. "
                         "Received: %zd bytes", need_out, out.len);
            goto done;
        }
        if (out.readonly) {
            PyErr_SetString(PyExc_ValueError, "resample: out must be writable. Received: a read-only buffer");
            goto done;
        }
    }
    job.src = (const uint8_t *)src.buf;
    job.out = (uint8_t *)out.buf;
    Py_BEGIN_ALLOW_THREADS
    rc = run_job(&job);
    Py_END_ALLOW_THREADS
    if (rc == -2) {
        PyErr_SetString(PyExc_RuntimeError, "resample: internal error: the horizontal pass would not cover the output");
        goto done;
    }
    if (rc != 0) {
        PyErr_NoMemory();
        goto done;
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"resample", (PyCFunction)(void (*)(void))py_resample, METH_VARARGS | METH_KEYWORDS,
     "resample(src, height, width, channels, out, out_height, out_width, filter, box, simd=True) -> None\n"
     "Resample an 8-bit L (channels=1) or RGB (channels=3) image into `out`, bit for bit as Pillow's "
     "Image.resize((out_width, out_height), filter, box=box, reducing_gap=None)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_resample",
    "Pillow's antialiased resampling (BOX, BILINEAR, HAMMING, BICUBIC, LANCZOS) for 8-bit L and RGB, "
    "bit-identical and vectorised.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__resample(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    have_avx2 = cpu_has_avx2();
    if (PyModule_AddIntConstant(m, "FILTER_LANCZOS", FILTER_LANCZOS) < 0 ||
        PyModule_AddIntConstant(m, "FILTER_BILINEAR", FILTER_BILINEAR) < 0 ||
        PyModule_AddIntConstant(m, "FILTER_BICUBIC", FILTER_BICUBIC) < 0 ||
        PyModule_AddIntConstant(m, "FILTER_BOX", FILTER_BOX) < 0 ||
        PyModule_AddIntConstant(m, "FILTER_HAMMING", FILTER_HAMMING) < 0 ||
        PyModule_AddStringConstant(m, "KERNELS", have_avx2 ? "avx2" : "plain") < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

/*
 * The host implementation of `readers.augment` for a whole batch: one pass per sample
 * from the stored image and mask to the final training tensors
 * (readers/augment_host.py is the Python side; docs/AUGMENT.md the conventions).
 *
 * Images: uint8 or uint16, 1 to 16 channels (the colour jitter needs 3). Per sample, with
 * the parameter row of `readers.augment.draw_params` (19 float32):
 *
 *   geometry  output pixel (x, y) (integer indices) comes from source position
 *               sx = a00 x + a01 y + t0,  sy = a10 x + a11 y + t1
 *             where source pixel centres sit at integers. It is *inside* when the nearest
 *             source pixel exists: -0.5 < sx < W - 0.5 and -0.5 < sy < H - 0.5.
 *             Coordinates are fixed point with 32 fraction bits (int64), stepped along the
 *             output row: X(x) = round(2^32 (a01 y + t0)) + x round(2^32 a00) (same for Y).
 *             For parameters that are float32 (as draw_params gives them) of magnitude
 *             >= 2^-9 this is exactly the real coordinate, and so exactly what a float64
 *             reference computes (its products and sums are exact too); otherwise within
 *             2^-24 of a pixel over a 512-pixel row.
 *             image: bilinear, x0 = floor(sx), fx = the top 24 fraction bits, the two taps
 *                    x0, x0 + 1 clamped to [0, W - 1] (edge replicated), rows blended first:
 *                    left = p00 + (p10 - p00) fy, right = p01 + (p11 - p01) fy,
 *                    v = left + (right - left) fx  (float32, no fused multiply-add);
 *             mask:  nearest, floor(sx + 0.5) clamped, from the same (sx, sy), so image
 *                    and mask padding cover exactly the same pixels.
 *             Axis-aligned maps (a01 = a10 = 0: scale, flips, crop, 180 degrees) take a
 *             separable path: taps and weights per column once, per row the two source
 *             rows blended over the columns that the row reads, then one gather-and-blend
 *             per output value. General maps (rotation, shear) compute the taps of each
 *             output row from the stepped coordinates and gather the four taps (AVX2
 *             gathers for 3-channel uint8 where the CPU has AVX2, chosen at run time, 8
 *             pixels at a time with their coordinates in registers, the uint8 mask classes
 *             gathered in the same loop; plain C otherwise). Same coordinates and the same arithmetic in every path, so they
 *             give the same bits where more than one applies (tests/test_warp.py forces the
 *             general path on axis-aligned maps with `general=True`), except for the
 *             contrast mean, which the separable path sums in another order (within a level).
 *   colour    (3 channels) out = clip(c M x + M (s delta + (1 - c) mean), 0, max) per pixel
 *             (M: the 3x3 colour matrix, c: the contrast factor, s: max / 255, mean:
 *             per-channel mean of the resampled image over the inside pixels, needing a
 *             first pass over the sample); outside pixels get `fill`.
 *   output    float32 x / max (`normalize`; max = 255 or 65535), or the image's dtype
 *             rounded half to even (as tf.round); mask: class map or planes in the stored
 *             dtype (outside: `mask_fill` for a class map, all-zero planes), or, for a class
 *             map, float32 one-hot planes (1 at the class when class < classes and class !=
 *             ignore; outside pixels are class `mask_fill`).
 *
 * warp(images, params, out_images, batch, height, width, out_height, out_width, fill,
 *      normalize, photometric, contrast, masks, out_masks, mask_itemsize, mask_planes, mask_fill,
 *      one_hot_classes, ignore, zeroed=False, stream=False, channels=3, itemsize=1, general=False)
 *   images:    (batch, height, width, channels) of itemsize (1: uint8, 2: uint16) bytes, C-contiguous
 *   params:    float32 (batch, 19)
 *   out_images: writable, (batch, out_height, out_width, channels) float32 or the images' dtype
 *   fill:      float32 (channels,): the padding value per channel, in the images' scale
 *   masks:     None, or (batch, height, width, mask_planes) of mask_itemsize (1 or 2) bytes
 *   out_masks: None, or writable: the masks' layout at the output size, or float32
 *              (..., one_hot_classes) when one_hot_classes > 0 (mask_planes must be 1)
 *   ignore:    the ignore index, or -1 for none (one-hot only)
 *   stream:    float32 output rows (image, one-hot from a uint8 class map) are built in a
 *              cache-resident stage and written with non-temporal stores (large batches:
 *              see `readers.formats.expand.STREAM_MIN_BYTES`); same values; one sfence after the
 *              whole batch, not one per row (a fence waits for the write-combining buffers to
 *              drain to memory: per row, 1,024 waits per 512x512 float32 + one-hot sample cost
 *              0.2 CPU-ms of its ~1.6 in the kernel and of ~2.35 in the reader)
 *   zeroed:    out_masks is known to be all zeros (fresh calloc pages): one-hot output then
 *              writes only the ones instead of clearing every plane first
 *   general:   every sample through the general path (tests: same bits as the separable one)
 * Sizes are checked against the buffers (ValueError naming the argument); the GIL is
 * released while pixels are written.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NPARAMS 19
#define MAX_CHANNELS 16

typedef struct {
    const uint8_t *images;
    const float *params;
    void *out_images;
    Py_ssize_t batch;
    int height, width, out_height, out_width;
    int channels, itemsize; /* image: 1..16 channels of 1 (uint8) or 2 (uint16) bytes */
    float maxval;           /* 255 or 65535 */
    float fill[MAX_CHANNELS];
    int normalize, photometric, contrast, general;
    const uint8_t *masks;
    void *out_masks;
    int mask_itemsize, mask_planes, mask_fill, classes, ignore;
    int zeroed; /* out_masks is all zeros already (one-hot: only the ones are written) */
    int stream; /* float output rows built in `stage` and written with non-temporal stores */
    float *stage;
    const void *hot_vecs; /* one-hot output by the avx2 expand kernel: its table (NULL: plain C) */
    uint16_t *cls_row;    /* the classes of one output row (out_width) */
    int fused_mask;       /* uint8 class maps: the general AVX2 row gathers the classes into cls_row */
} Job;

/* `bytes` of `src` (a row built in cache) to `dst` with non-temporal stores where the CPU has
 * AVX2 (defined with the expand kernels below). */
static void stream_row(const float *src, void *dst, size_t bytes);
static int have_avx2(void);
/* use_simd(False) turns the hand-written AVX2 kernels off (the tests compare both ways). */
static int simd_off = 0;

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(IMGSHARD_PLAIN_C)
/* AVX2 and baseline clones of the row loops, picked at load time (no FMA: the results are the
 * same bits either way, since no multiply-add is contracted and no sum is reordered). */
#define HOT __attribute__((target_clones("avx2", "default")))
#else
#define HOT
#endif

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && !defined(IMGSHARD_PLAIN_C)
#define WARP_AVX2 1
#include <immintrin.h>
#else
#define WARP_AVX2 0
#endif

/* The taps of one output row (general path), or the columns of a sample (separable path). */
typedef struct {
    int32_t *i00, *i01, *i10, *i11; /* pixel index of the taps: (row a, col a), (a, b), (b, a), (b, b) */
    float *fx, *fy;
    int32_t *near;  /* pixel index of the nearest source pixel (the mask's) */
    uint8_t *valid; /* inside: the nearest source pixel exists */
} Taps;

/* Per-batch scratch. */
typedef struct {
    Taps t;
    float *planes;     /* one output row, planar: channels x out_width */
    float *vrow;       /* separable: width * channels, two source rows blended */
    float *colacc;     /* separable: width * channels, row-weighted column sums (contrast mean) */
    float *rw, *cw;    /* separable: height row weights, width column weights */
    int *xa, *xb, *xn; /* separable: out_width bilinear taps and nearest column */
    float *fx;
    uint8_t *vx;
} Scratch;

static inline int clampi(long v, int hi) { return v < 0 ? 0 : (v > hi ? hi : (int)v); }

/* Fixed point with 32 fraction bits, rounded to nearest; coordinates beyond +-2^30 pixels (and
 * NaN) are pinned there: far outside any image, so only the padding changes. */
static inline int64_t to_fixed(double v) {
    const double lim = 1073741824.0;
    if (!(v > -lim)) v = -lim;
    if (v > lim) v = lim;
    double t = v * 4294967296.0;
    int64_t i = (int64_t)t; /* toward zero; t - i is exact */
    double r = t - (double)i;
    return r >= 0.5 ? i + 1 : (r <= -0.5 ? i - 1 : i);
}

#define FIX_HALF ((int64_t)1 << 31)
#define FRAC_TO_FLOAT (1.0f / 16777216.0f)

/* The fraction of a fixed-point coordinate as float32: its top 24 bits (exact in float32). */
static inline float frac24(int64_t v) { return (float)((uint32_t)v >> 8) * FRAC_TO_FLOAT; }

/* Round half to even (as rintf / tf.round) for 0 <= v < 2^22: adding 1.5 * 2^23 leaves no
 * fraction bits in float32, so the FPU's default rounding mode rounds. */
static inline int round_int(float v) {
    const float big = 12582912.0f;
    return (int)((v + big) - big);
}

/* start + x step in wrapping (defined) arithmetic: hostile parameters give garbage coordinates,
 * which the clamped taps keep inside the image, never undefined behaviour. */
static inline int64_t step_at(int64_t start, long x, int64_t step) {
    return (int64_t)((uint64_t)start + (uint64_t)(int64_t)x * (uint64_t)step);
}

/* One output row's stepped coordinates: X(x) = x0 + x dx, Y(x) = y0 + x dy. */
typedef struct {
    int64_t x0, y0, dx, dy;
} RowMap;

static RowMap row_map(const float *p, int y) {
    RowMap m;
    m.x0 = to_fixed((double)p[1] * y + (double)p[2]);
    m.y0 = to_fixed((double)p[4] * y + (double)p[5]);
    m.dx = to_fixed((double)p[0]);
    m.dy = to_fixed((double)p[3]);
    return m;
}

/* The taps of output pixels [from, w) of one row of the general path; returns the number of
 * inside pixels among them. */
HOT static int row_taps(const RowMap *m, int W, int H, int from, int w, const Taps *t) {
    int inside = 0;
    for (int x = from; x < w; x++) {
        const int64_t X = step_at(m->x0, x, m->dx), Y = step_at(m->y0, x, m->dy);
        const int64_t NX = (int64_t)((uint64_t)X + (uint64_t)FIX_HALF), NY = (int64_t)((uint64_t)Y + (uint64_t)FIX_HALF);
        const int xi = (int)(X >> 32), yi = (int)(Y >> 32), nx = (int)(NX >> 32), ny = (int)(NY >> 32);
        const int in = NX > 0 && NY > 0 && nx < W && ny < H;
        const int xa = xi < 0 ? 0 : (xi > W - 1 ? W - 1 : xi), xb = xi + 1 < 0 ? 0 : (xi + 1 > W - 1 ? W - 1 : xi + 1);
        const int ya = yi < 0 ? 0 : (yi > H - 1 ? H - 1 : yi), yb = yi + 1 < 0 ? 0 : (yi + 1 > H - 1 ? H - 1 : yi + 1);
        const int cx = nx < 0 ? 0 : (nx > W - 1 ? W - 1 : nx), cy = ny < 0 ? 0 : (ny > H - 1 ? H - 1 : ny);
        t->i00[x] = ya * W + xa;
        t->i01[x] = ya * W + xb;
        t->i10[x] = yb * W + xa;
        t->i11[x] = yb * W + xb;
        t->fx[x] = frac24(X);
        t->fy[x] = frac24(Y);
        t->near[x] = cy * W + cx;
        t->valid[x] = (uint8_t)in;
        inside += in;
    }
    return inside;
}

/* Bilinear values of `count` pixels from their taps, planar (plane k at planes + k * stride). */
#define INTERP_GENERIC(NAME, T)                                                                            \
    HOT static void NAME(const T *src, int C, const Taps *t, int from, int count, float *planes, int stride) { \
        for (int x = from; x < count; x++) {                                                               \
            const T *q00 = src + (size_t)t->i00[x] * C, *q01 = src + (size_t)t->i01[x] * C;                \
            const T *q10 = src + (size_t)t->i10[x] * C, *q11 = src + (size_t)t->i11[x] * C;                \
            const float fx = t->fx[x], fy = t->fy[x];                                                      \
            for (int k = 0; k < C; k++) {                                                                  \
                float p00 = q00[k], p10 = q10[k], p01 = q01[k], p11 = q11[k];                              \
                float left = p00 + (p10 - p00) * fy, right = p01 + (p11 - p01) * fy;                       \
                planes[(size_t)k * stride + x] = left + (right - left) * fx;                               \
            }                                                                                              \
        }                                                                                                  \
    }
INTERP_GENERIC(interp_u8, uint8_t)
INTERP_GENERIC(interp_u16, uint16_t)

#if WARP_AVX2
/* The expand section's avx2 one-hot kernel (below), run on each output row's classes. */
__attribute__((target("avx2"))) static void one_hot_blocks(const uint8_t *src, int itemsize, size_t blocks,
                                                           int classes, const __m256i *vecs, float *dst,
                                                           int stream_stores);
static void one_hot_scatter(const uint8_t *src, int itemsize, size_t count, int classes, int ignore, float *dst);
static void *one_hot_table_avx2(int classes, int ignore);

/* 3-channel uint8, 8 output pixels at a time: the stepped coordinates as 32-bit integer and
 * fraction halves (added with carry), the taps, and each tap one 32-bit gather (r, g, b and
 * the next byte). `last` is the index of the buffer's last pixel (its gather would read one
 * byte past the end: those lanes read one byte earlier and shift), or -1. */
__attribute__((target("avx2"))) static inline __m256i gather_rgb(const uint8_t *src, __m256i idx, __m256i last) {
    const __m256i edge = _mm256_cmpeq_epi32(idx, last); /* -1 where idx is the last pixel */
    const __m256i off = _mm256_add_epi32(_mm256_add_epi32(idx, _mm256_add_epi32(idx, idx)), edge);
    const __m256i g = _mm256_i32gather_epi32((const int *)src, off, 1);
    return _mm256_srlv_epi32(g, _mm256_and_si256(edge, _mm256_set1_epi32(8)));
}

__attribute__((target("avx2"))) static inline __m256 channel(__m256i g, int k) {
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(g, 8 * k), _mm256_set1_epi32(0xFF)));
}

/* One axis of 8 lanes of fixed-point coordinates: integer part `hi`, fraction `lo`. */
typedef struct {
    __m256i hi, lo, dhi, dlo;
} Lanes;

__attribute__((target("avx2"))) static Lanes lanes_at(int64_t start, int64_t step) {
    int32_t hi[8], lo[8];
    for (int l = 0; l < 8; l++) {
        const int64_t v = step_at(start, l, step);
        hi[l] = (int32_t)(v >> 32);
        lo[l] = (int32_t)(uint32_t)v;
    }
    const int64_t jump = step_at(0, 8, step);
    Lanes a = {_mm256_loadu_si256((const __m256i *)hi), _mm256_loadu_si256((const __m256i *)lo),
               _mm256_set1_epi32((int32_t)(jump >> 32)), _mm256_set1_epi32((int32_t)(uint32_t)jump)};
    return a;
}

__attribute__((target("avx2"))) static inline void lanes_step(Lanes *a) {
    const __m256i sign = _mm256_set1_epi32(INT32_MIN);
    const __m256i lo = _mm256_add_epi32(a->lo, a->dlo);
    const __m256i carry = _mm256_cmpgt_epi32(_mm256_xor_si256(a->lo, sign), _mm256_xor_si256(lo, sign));
    a->hi = _mm256_sub_epi32(_mm256_add_epi32(a->hi, a->dhi), carry);
    a->lo = lo;
}

/* Nearest index floor(s + 0.5) of the lanes, and whether it lies in [0, size) with s > -0.5. */
__attribute__((target("avx2"))) static inline __m256i nearest(const Lanes *a, int size, __m256i *in) {
    const __m256i sign = _mm256_set1_epi32(INT32_MIN);
    const __m256i n = _mm256_add_epi32(a->hi, _mm256_srli_epi32(a->lo, 31));
    const __m256i exact = _mm256_and_si256(_mm256_cmpeq_epi32(n, _mm256_setzero_si256()),
                                           _mm256_cmpeq_epi32(a->lo, sign));
    *in = _mm256_andnot_si256(exact, _mm256_and_si256(_mm256_cmpgt_epi32(n, _mm256_set1_epi32(-1)),
                                                      _mm256_cmpgt_epi32(_mm256_set1_epi32(size), n)));
    return n;
}

__attribute__((target("avx2"))) static inline __m256i clamp8(__m256i v, __m256i hi) {
    return _mm256_min_epi32(_mm256_max_epi32(v, _mm256_setzero_si256()), hi);
}

__attribute__((target("avx2"))) static inline __m256 frac8(__m256i lo) {
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(lo, 8)), _mm256_set1_ps(FRAC_TO_FLOAT));
}

/* Output pixels [0, done) of a row of the general path, 3-channel uint8: planes, the mask's
 * nearest index and validity. Returns done (a multiple of 8); *inside counts the inside ones. */
__attribute__((target("avx2"))) static int row_rgb8_avx2(const uint8_t *src, const RowMap *m, int W, int H, int w,
                                                         int last, float *planes, const Taps *t, int *inside,
                                                         const uint8_t *mask, int mask_lim, int mask_fill,
                                                         uint16_t *cls) {
    const __m256i mlim = _mm256_set1_epi32(mask_lim), mfill = _mm256_set1_epi32(mask_fill);
    Lanes X = lanes_at(m->x0, m->dx), Y = lanes_at(m->y0, m->dy);
    const __m256i lastv = _mm256_set1_epi32(last), one = _mm256_set1_epi32(1);
    const __m256i wmax = _mm256_set1_epi32(W - 1), hmax = _mm256_set1_epi32(H - 1), width = _mm256_set1_epi32(W);
    int x = 0, count = 0;
    for (; x + 8 <= w; x += 8, lanes_step(&X), lanes_step(&Y)) {
        __m256i inx, iny;
        const __m256i nx = nearest(&X, W, &inx), ny = nearest(&Y, H, &iny);
        const __m256i in = _mm256_and_si256(inx, iny);
        const __m256i nidx = _mm256_add_epi32(_mm256_mullo_epi32(clamp8(ny, hmax), width), clamp8(nx, wmax));
        _mm256_storeu_si256((__m256i *)(t->near + x), nidx);
        if (mask) { /* the uint8 class of each pixel (or the fill), gathered here: no second pass over near */
            const __m256i at = _mm256_min_epi32(nidx, mlim); /* within 4 bytes of the buffer's end: read earlier */
            __m256i c = _mm256_i32gather_epi32((const int *)mask, at, 1);
            c = _mm256_srlv_epi32(c, _mm256_slli_epi32(_mm256_sub_epi32(nidx, at), 3));
            c = _mm256_blendv_epi8(mfill, _mm256_and_si256(c, _mm256_set1_epi32(0xFF)), in);
            c = _mm256_permute4x64_epi64(_mm256_packus_epi32(c, c), 0x08);
            _mm_storeu_si128((__m128i *)(cls + x), _mm256_castsi256_si128(c));
        }
        const int bits = _mm256_movemask_ps(_mm256_castsi256_ps(in));
        for (int l = 0; l < 8; l++) t->valid[x + l] = (uint8_t)((bits >> l) & 1);
        count += __builtin_popcount((unsigned)bits);
        const __m256i xa = clamp8(X.hi, wmax), xb = clamp8(_mm256_add_epi32(X.hi, one), wmax);
        const __m256i ra = _mm256_mullo_epi32(clamp8(Y.hi, hmax), width);
        const __m256i rb = _mm256_mullo_epi32(clamp8(_mm256_add_epi32(Y.hi, one), hmax), width);
        const __m256i g00 = gather_rgb(src, _mm256_add_epi32(ra, xa), lastv);
        const __m256i g01 = gather_rgb(src, _mm256_add_epi32(ra, xb), lastv);
        const __m256i g10 = gather_rgb(src, _mm256_add_epi32(rb, xa), lastv);
        const __m256i g11 = gather_rgb(src, _mm256_add_epi32(rb, xb), lastv);
        const __m256 fx = frac8(X.lo), fy = frac8(Y.lo);
        for (int k = 0; k < 3; k++) {
            const __m256 p00 = channel(g00, k), p01 = channel(g01, k), p10 = channel(g10, k), p11 = channel(g11, k);
            const __m256 left = _mm256_add_ps(p00, _mm256_mul_ps(_mm256_sub_ps(p10, p00), fy));
            const __m256 right = _mm256_add_ps(p01, _mm256_mul_ps(_mm256_sub_ps(p11, p01), fy));
            _mm256_storeu_ps(planes + (size_t)k * w + x,
                             _mm256_add_ps(left, _mm256_mul_ps(_mm256_sub_ps(right, left), fx)));
        }
    }
    *inside = count;
    return x;
}

/* r, g, b planes * scale, interleaved and written with non-temporal stores straight to `o`
 * (32-byte aligned), 8 pixels (3 vectors) at a time: the same multiply as store_float3. */
__attribute__((target("avx2"))) static int stream_float3_avx2(const float *r, const float *g, const float *b,
                                                              int count, float scale, float *o) {
    const __m256 s = _mm256_set1_ps(scale);
    const __m256i i0 = _mm256_setr_epi32(0, 0, 0, 1, 1, 1, 2, 2), i1 = _mm256_setr_epi32(2, 3, 3, 3, 4, 4, 4, 5);
    const __m256i i2 = _mm256_setr_epi32(5, 5, 6, 6, 6, 7, 7, 7);
    int x = 0;
    for (; x + 8 <= count; x += 8) {
        const __m256 R = _mm256_mul_ps(_mm256_loadu_ps(r + x), s), G = _mm256_mul_ps(_mm256_loadu_ps(g + x), s);
        const __m256 B = _mm256_mul_ps(_mm256_loadu_ps(b + x), s);
        /* lanes: out0 r g b r g b r g, out1 b r g b r g b r, out2 g b r g b r g b */
        const __m256 o0 = _mm256_blend_ps(_mm256_blend_ps(_mm256_permutevar8x32_ps(R, i0), _mm256_permutevar8x32_ps(G, i0), 0x92),
                                          _mm256_permutevar8x32_ps(B, i0), 0x24);
        const __m256 o1 = _mm256_blend_ps(_mm256_blend_ps(_mm256_permutevar8x32_ps(R, i1), _mm256_permutevar8x32_ps(G, i1), 0x24),
                                          _mm256_permutevar8x32_ps(B, i1), 0x49);
        const __m256 o2 = _mm256_blend_ps(_mm256_blend_ps(_mm256_permutevar8x32_ps(R, i2), _mm256_permutevar8x32_ps(G, i2), 0x49),
                                          _mm256_permutevar8x32_ps(B, i2), 0x92);
        float *d = o + 3 * (size_t)x;
        _mm256_stream_ps(d, o0);
        _mm256_stream_ps(d + 8, o1);
        _mm256_stream_ps(d + 16, o2);
    }
    return x; /* no fence per row: `run` fences once after the batch */
}

/* Rounded, clamped uint8 r, g, b interleaved, 8 pixels at a time while 2 more follow (the
 * second 16-byte store runs 4 bytes past the block). Returns the pixels done. */
__attribute__((target("avx2"))) static int store_u8_3_avx2(const float *r, const float *g, const float *b, int count,
                                                           uint8_t *o) {
    const __m256 zero = _mm256_setzero_ps(), top = _mm256_set1_ps(255.0f);
    const __m256i pick = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,
                                          0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    int x = 0;
    for (; x + 10 <= count; x += 8) {
        const __m256i R = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(r + x), zero), top));
        const __m256i G = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(g + x), zero), top));
        const __m256i B = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(b + x), zero), top));
        __m256i v = _mm256_or_si256(R, _mm256_or_si256(_mm256_slli_epi32(G, 8), _mm256_slli_epi32(B, 16)));
        v = _mm256_shuffle_epi8(v, pick);
        _mm_storeu_si128((__m128i *)(o + 3 * (size_t)x), _mm256_castsi256_si128(v));
        _mm_storeu_si128((__m128i *)(o + 3 * (size_t)x + 12), _mm256_extracti128_si256(v, 1));
    }
    return x;
}
#endif

#if WARP_AVX2
/* Whether every coordinate of the row keeps its integer part within 32 bits (the AVX2 lanes
 * hold it so); hostile parameters take the plain path. */
static int row_fits(const RowMap *m, int w) {
    const int64_t lim = (int64_t)1 << 61, step = (int64_t)1 << 40; /* < 256 source pixels per output pixel */
    if (w > (1 << 20) || m->dx >= step || m->dx <= -step || m->dy >= step || m->dy <= -step) return 0;
    const int64_t ends[4] = {m->x0, step_at(m->x0, w - 1, m->dx), m->y0, step_at(m->y0, w - 1, m->dy)};
    for (int k = 0; k < 4; k++)
        if (ends[k] >= lim || ends[k] <= -lim) return 0;
    return 1;
}
#endif

/* The taps and image row of the general path into `t` and `planes`; returns the number of
 * inside pixels. */
static int image_row(const Job *job, const uint8_t *src, int last, const RowMap *rm, const Taps *t, float *planes,
                     const uint8_t *mask, int *cls_done) {
    const int W = job->width, H = job->height, w = job->out_width, C = job->channels;
    int done = 0, inside = 0;
    *cls_done = 0;
#if WARP_AVX2
    if (C == 3 && job->itemsize == 1 && have_avx2() && row_fits(rm, w)) {
        const int fused = job->fused_mask && mask;
        /* the mask gather reads 4 bytes: in the batch's last sample, never past its last byte */
        const int lim = last >= 0 ? H * W - 4 : INT32_MAX;
        done = row_rgb8_avx2(src, rm, W, H, w, last, planes, t, &inside, fused ? mask : NULL, lim, job->mask_fill,
                             job->cls_row);
        if (fused) *cls_done = done;
    }
#else
    (void)last, (void)mask;
#endif
    if (done == w) return inside;
    inside += row_taps(rm, W, H, done, w, t);
    if (job->itemsize == 1)
        interp_u8(src, C, t, done, w, planes, w);
    else
        interp_u16((const uint16_t *)src, C, t, done, w, planes, w);
    return inside;
}

/* The colour transform: m = c M, v = M (s delta + (1 - c) mean), s = max / 255. */
static void colour_params(const Job *job, const float *p, const double *mean, float *m, float *v) {
    const float c = p[18], delta = p[17] * (job->maxval / 255.0f);
    float off[3];
    for (int k = 0; k < 9; k++) m[k] = p[8 + k] * c;
    for (int k = 0; k < 3; k++) off[k] = mean ? delta + (1.0f - c) * (float)mean[k] : delta;
    for (int k = 0; k < 3; k++) v[k] = p[8 + 3 * k] * off[0] + p[8 + 3 * k + 1] * off[1] + p[8 + 3 * k + 2] * off[2];
}

HOT static void colour_planes(float *r, float *g, float *b, int count, const float *m, const float *v, float top) {
    for (int x = 0; x < count; x++) {
        float o0 = m[0] * r[x] + m[1] * g[x] + m[2] * b[x] + v[0];
        float o1 = m[3] * r[x] + m[4] * g[x] + m[5] * b[x] + v[1];
        float o2 = m[6] * r[x] + m[7] * g[x] + m[8] * b[x] + v[2];
        r[x] = o0 < 0.0f ? 0.0f : (o0 > top ? top : o0);
        g[x] = o1 < 0.0f ? 0.0f : (o1 > top ? top : o1);
        b[x] = o2 < 0.0f ? 0.0f : (o2 > top ? top : o2);
    }
}

HOT static void fill_plane(float *plane, const uint8_t *valid, int count, float fill) {
    for (int x = 0; x < count; x++) plane[x] = valid[x] ? plane[x] : fill;
}

HOT static void store_float3(const float *r, const float *g, const float *b, int count, float scale, float *o) {
    for (int x = 0; x < count; x++) {
        o[3 * x] = r[x] * scale;
        o[3 * x + 1] = g[x] * scale;
        o[3 * x + 2] = b[x] * scale;
    }
}

HOT static void store_u8_3(const float *r, const float *g, const float *b, int count, uint8_t *o) {
    for (int x = 0; x < count; x++) {
        o[3 * x] = (uint8_t)round_int(r[x] < 0.0f ? 0.0f : (r[x] > 255.0f ? 255.0f : r[x]));
        o[3 * x + 1] = (uint8_t)round_int(g[x] < 0.0f ? 0.0f : (g[x] > 255.0f ? 255.0f : g[x]));
        o[3 * x + 2] = (uint8_t)round_int(b[x] < 0.0f ? 0.0f : (b[x] > 255.0f ? 255.0f : b[x]));
    }
}

/* Any channel count and dtype: interleave the planes into the output row. */
static void store_generic(const Job *job, const float *planes, int count, void *out) {
    const int C = job->channels;
    const float top = job->maxval, scale = 1.0f / job->maxval;
    for (int k = 0; k < C; k++) {
        const float *pl = planes + (size_t)k * count;
        if (job->normalize) {
            float *o = (float *)out + k;
            for (int x = 0; x < count; x++) o[(size_t)x * C] = pl[x] * scale;
        } else if (job->itemsize == 1) {
            uint8_t *o = (uint8_t *)out + k;
            for (int x = 0; x < count; x++)
                o[(size_t)x * C] = (uint8_t)round_int(pl[x] < 0.0f ? 0.0f : (pl[x] > top ? top : pl[x]));
        } else {
            uint16_t *o = (uint16_t *)out + k;
            for (int x = 0; x < count; x++)
                o[(size_t)x * C] = (uint16_t)round_int(pl[x] < 0.0f ? 0.0f : (pl[x] > top ? top : pl[x]));
        }
    }
}

/* Colour, fill and output conversion of one row held planar (channels x count); valid: NULL
 * for all inside; m, v: the colour transform (photometric, 3 channels). `out` is the row's
 * first value (float32 or the image dtype, interleaved). */
static void finish_row(const Job *job, float *planes, const uint8_t *valid, int count, const float *m,
                       const float *v, void *out) {
    const int C = job->channels;
    if (job->photometric) colour_planes(planes, planes + count, planes + 2 * (size_t)count, count, m, v, job->maxval);
    if (valid)
        for (int k = 0; k < C; k++) fill_plane(planes + (size_t)k * count, valid, count, job->fill[k]);
    if (C == 3 && job->itemsize == 1) {
        const float *r = planes, *g = r + count, *b = g + count;
        if (!job->normalize) {
            int done = 0;
#if WARP_AVX2
            if (have_avx2()) done = store_u8_3_avx2(r, g, b, count, (uint8_t *)out);
#endif
            store_u8_3(r + done, g + done, b + done, count - done, (uint8_t *)out + 3 * (size_t)done);
        } else if (job->stream) {
            int done = 0;
#if WARP_AVX2
            if (have_avx2() && !((uintptr_t)out & 31)) done = stream_float3_avx2(r, g, b, count, 1.0f / 255.0f, (float *)out);
#endif
            if (done < count) {
                store_float3(r + done, g + done, b + done, count - done, 1.0f / 255.0f, job->stage);
                stream_row(job->stage, (float *)out + 3 * (size_t)done, sizeof(float) * 3 * (size_t)(count - done));
            }
        } else {
            store_float3(r, g, b, count, 1.0f / 255.0f, (float *)out);
        }
        return;
    }
    if (job->normalize && job->stream) {
        store_generic(job, planes, count, job->stage);
        stream_row(job->stage, out, sizeof(float) * C * (size_t)count);
    } else {
        store_generic(job, planes, count, out);
    }
}

/* A row wholly outside the source: the fill, no colour. */
static void fill_row(const Job *job, float *planes, int count, void *out) {
    for (int k = 0; k < job->channels; k++)
        for (int x = 0; x < count; x++) planes[(size_t)k * count + x] = job->fill[k];
    Job plain = *job;
    plain.photometric = 0;
    finish_row(&plain, planes, NULL, count, NULL, NULL, out);
}

#if WARP_AVX2
/* The classes of one output row: the nearest source value where inside, else `fill`. */
HOT static void classes_u8(const uint8_t *src, const int32_t *near, const uint8_t *valid, int fill, uint16_t *cls,
                           int count) {
    for (int x = 0; x < count; x++) cls[x] = (uint16_t)(valid[x] ? src[near[x]] : fill);
}

HOT static void classes_u16(const uint16_t *src, const int32_t *near, const uint8_t *valid, int fill, uint16_t *cls,
                            int count) {
    for (int x = 0; x < count; x++) cls[x] = (uint16_t)(valid[x] ? src[near[x]] : fill);
}
#endif

HOT static void narrow_u16(const uint16_t *src, uint8_t *dst, int count) {
    for (int x = 0; x < count; x++) dst[x] = (uint8_t)src[x];
}

HOT static void class_map_u8(const uint8_t *src, const int32_t *near, const uint8_t *valid, uint8_t fill, uint8_t *o,
                             int count) {
    for (int x = 0; x < count; x++) o[x] = valid[x] ? src[near[x]] : fill;
}

static inline int mask_value(const Job *job, const uint8_t *src, size_t index) {
    return job->mask_itemsize == 1 ? src[index] : ((const uint16_t *)src)[index];
}

/* One output row of the mask: the nearest source pixel of each output pixel (`near`), or the
 * padding where it is outside (`valid`). */
static void mask_row(const Job *job, Py_ssize_t n, int y, const int32_t *near, const uint8_t *valid, int cls_done) {
    const int w = job->out_width, K = job->mask_planes, C = job->classes;
    const size_t plane = (size_t)job->height * job->width * K;
    const uint8_t *src = job->masks + (size_t)n * plane * job->mask_itemsize;
    const size_t row = ((size_t)n * job->out_height + y) * (size_t)w;
#if WARP_AVX2
    if (C > 0 && job->hot_vecs) { /* the row's classes, then 8 pixels -> C vectors, each byte stored once */
        float *hot = (float *)job->out_masks + row * (size_t)C;
        uint16_t *cls = job->cls_row; /* [0, cls_done) gathered by the image row already */
        if (job->mask_itemsize == 1)
            classes_u8(src, near + cls_done, valid + cls_done, job->mask_fill, cls + cls_done, w - cls_done);
        else
            classes_u16((const uint16_t *)src, near + cls_done, valid + cls_done, job->mask_fill, cls + cls_done,
                        w - cls_done);
        const size_t blocks = (size_t)w / 8;
        one_hot_blocks((const uint8_t *)cls, 2, blocks, C, (const __m256i *)job->hot_vecs, hot, job->stream);
        one_hot_scatter((const uint8_t *)(cls + 8 * blocks), 2, (size_t)w - 8 * blocks, C, job->ignore,
                        hot + 8 * blocks * (size_t)C);
        return;
    }
#endif
    if (C > 0) {
        float *hot = (float *)job->out_masks + row * (size_t)C;
        const int staged = job->stream && job->mask_itemsize == 1;
        float *o = staged ? job->stage : hot;
        if (staged || !job->zeroed) memset(o, 0, sizeof(float) * (size_t)w * C);
        for (int x = 0; x < w; x++) {
            int cls = valid[x] ? mask_value(job, src, near[x]) : job->mask_fill;
            if (cls < C && cls != job->ignore) o[(size_t)x * C + cls] = 1.0f;
        }
        if (staged) stream_row(o, hot, sizeof(float) * (size_t)w * C);
        return;
    }
    if (K == 1 && job->mask_itemsize == 1) {
        uint8_t *o = (uint8_t *)job->out_masks + row;
        narrow_u16(job->cls_row, o, cls_done); /* gathered by the image row already */
        class_map_u8(src, near + cls_done, valid + cls_done, (uint8_t)job->mask_fill, o + cls_done, w - cls_done);
        return;
    }
    for (int x = 0; x < w; x++) {
        const int in = valid[x];
        if (K == 1) {
            const int cls = in ? mask_value(job, src, near[x]) : job->mask_fill;
            ((uint16_t *)job->out_masks)[row + x] = (uint16_t)cls;
            continue;
        }
        for (int k = 0; k < K; k++) {
            const int val = in ? mask_value(job, src, (size_t)near[x] * K + k) : 0;
            if (job->mask_itemsize == 1)
                ((uint8_t *)job->out_masks)[(row + x) * K + k] = (uint8_t)val;
            else
                ((uint16_t *)job->out_masks)[(row + x) * K + k] = (uint16_t)val;
        }
    }
}

/* ---- the separable (axis-aligned) path ---- */

#define BLEND_ROWS(NAME, T)                                                                    \
    HOT static void NAME(const T *top, const T *bot, float fy, float *out, int count) {      \
        for (int k = 0; k < count; k++) {                                                     \
            float a = (float)top[k];                                                          \
            out[k] = a + ((float)bot[k] - a) * fy;                                            \
        }                                                                                     \
    }
BLEND_ROWS(blend_rows_u8, uint8_t)
BLEND_ROWS(blend_rows_u16, uint16_t)

#define AXPY_ROW(NAME, T)                                                                 \
    HOT static void NAME(const T *src, float weight, float *acc, int count) {            \
        for (int k = 0; k < count; k++) acc[k] += weight * (float)src[k];                \
    }
AXPY_ROW(axpy_row_u8, uint8_t)
AXPY_ROW(axpy_row_u16, uint16_t)

HOT static void gather_rgb_row(const float *v, const int *xa, const int *xb, const float *fx, float *r, float *g,
                               float *b, int count) {
    for (int x = 0; x < count; x++) {
        const float *p = v + 3 * xa[x], *q = v + 3 * xb[x];
        float f = fx[x];
        r[x] = p[0] + (q[0] - p[0]) * f;
        g[x] = p[1] + (q[1] - p[1]) * f;
        b[x] = p[2] + (q[2] - p[2]) * f;
    }
}

static void gather_row(const Job *job, const Scratch *s, float *planes) {
    const int w = job->out_width, C = job->channels;
    if (C == 3) {
        gather_rgb_row(s->vrow, s->xa, s->xb, s->fx, planes, planes + w, planes + 2 * (size_t)w, w);
        return;
    }
    for (int x = 0; x < w; x++) {
        const float *p = s->vrow + (size_t)C * s->xa[x], *q = s->vrow + (size_t)C * s->xb[x];
        const float f = s->fx[x];
        for (int k = 0; k < C; k++) planes[(size_t)k * w + x] = p[k] + (q[k] - p[k]) * f;
    }
}

static const uint8_t *pixel_at(const Job *job, const uint8_t *src, size_t index) {
    return src + index * (size_t)job->channels * job->itemsize;
}

/* Per-channel mean of the resampled sample over its inside pixels, for axis-aligned maps: the
 * sum over inside outputs of the bilinear value equals sum_r sum_c rw[r] cw[c] src[r, c]. */
static void separable_mean(const Job *job, const uint8_t *src, const float *p, Scratch *s, int lo, int span,
                           int inside_x, double *mean) {
    const int W = job->width, H = job->height, w = job->out_width, h = job->out_height, C = job->channels;
    long inside_y = 0;
    memset(s->rw, 0, sizeof(float) * (size_t)H);
    memset(s->cw, 0, sizeof(float) * (size_t)W);
    memset(s->colacc, 0, sizeof(float) * (size_t)span * C);
    for (int y = 0; y < h; y++) {
        const int64_t Y = to_fixed((double)p[4] * y + (double)p[5]), NY = Y + FIX_HALF;
        if (!(NY > 0 && (NY >> 32) < H)) continue;
        const float fy = frac24(Y);
        const long yi = (long)(Y >> 32);
        s->rw[clampi(yi, H - 1)] += 1.0f - fy;
        s->rw[clampi(yi + 1, H - 1)] += fy;
        inside_y++;
    }
    for (int x = 0; x < w; x++) {
        if (!s->vx[x]) continue;
        s->cw[s->xa[x]] += 1.0f - s->fx[x];
        s->cw[s->xb[x]] += s->fx[x];
    }
    for (int r = 0; r < H; r++) {
        if (s->rw[r] == 0.0f) continue;
        const uint8_t *row = pixel_at(job, src, (size_t)r * W + lo);
        if (job->itemsize == 1)
            axpy_row_u8(row, s->rw[r], s->colacc, span * C);
        else
            axpy_row_u16((const uint16_t *)row, s->rw[r], s->colacc, span * C);
    }
    for (int k = 0; k < C; k++) mean[k] = 0.0;
    for (int c = 0; c < span; c++)
        for (int k = 0; k < C; k++) mean[k] += (double)s->cw[c] * s->colacc[(size_t)C * c + k];
    const double count = (double)inside_y * inside_x;
    for (int k = 0; k < C; k++) mean[k] /= count > 0 ? count : 1.0;
}

/* Separable (axis-aligned) sample: per column taps once, every output row in one pass. */
static void sample_separable(const Job *job, Py_ssize_t n, const float *p, Scratch *s) {
    const int W = job->width, H = job->height, w = job->out_width, h = job->out_height, C = job->channels;
    const uint8_t *src = job->images + (size_t)n * H * W * C * job->itemsize;
    const RowMap cols = row_map(p, 0); /* a01 = 0: the same x0 for every row */
    int lo = W, hi = 0, inside_x = 0;
    for (int x = 0; x < w; x++) {
        const int64_t X = step_at(cols.x0, x, cols.dx), NX = (int64_t)((uint64_t)X + (uint64_t)FIX_HALF);
        const long xi = (long)(X >> 32), nx = (long)(NX >> 32);
        s->vx[x] = NX > 0 && nx < W;
        inside_x += s->vx[x];
        s->xa[x] = clampi(xi, W - 1);
        s->xb[x] = clampi(xi + 1, W - 1);
        s->fx[x] = frac24(X);
        s->xn[x] = clampi(nx, W - 1);
        if (s->xa[x] < lo) lo = s->xa[x];
        if (s->xb[x] > hi) hi = s->xb[x];
    }
    const int span = hi - lo + 1;
    for (int x = 0; x < w; x++) s->xa[x] -= lo, s->xb[x] -= lo;
    float m[9], v[3];
    if (job->photometric) {
        double mean[MAX_CHANNELS];
        if (job->contrast) separable_mean(job, src, p, s, lo, span, inside_x, mean);
        colour_params(job, p, job->contrast ? mean : NULL, m, v);
    }
    const size_t row_values = (size_t)w * C, item = job->normalize ? sizeof(float) : (size_t)job->itemsize;
    char *out = (char *)job->out_images + (size_t)n * h * row_values * item;
    for (int y = 0; y < h; y++) {
        const int64_t Y = to_fixed((double)p[4] * y + (double)p[5]), NY = Y + FIX_HALF;
        const int vy = NY > 0 && (NY >> 32) < H;
        void *dst = out + (size_t)y * row_values * item;
        if (!vy) {
            fill_row(job, s->planes, w, dst);
        } else {
            const float fy = frac24(Y);
            const long yi = (long)(Y >> 32);
            const uint8_t *ra = pixel_at(job, src, (size_t)clampi(yi, H - 1) * W + lo);
            const uint8_t *rb = pixel_at(job, src, (size_t)clampi(yi + 1, H - 1) * W + lo);
            if (job->itemsize == 1)
                blend_rows_u8(ra, rb, fy, s->vrow, span * C);
            else
                blend_rows_u16((const uint16_t *)ra, (const uint16_t *)rb, fy, s->vrow, span * C);
            gather_row(job, s, s->planes);
            finish_row(job, s->planes, inside_x == w ? NULL : s->vx, w, m, v, dst);
        }
        if (job->masks) {
            const int ny = clampi((long)(NY >> 32), H - 1);
            for (int x = 0; x < w; x++) {
                s->t.near[x] = ny * W + s->xn[x];
                s->t.valid[x] = (uint8_t)(vy && s->vx[x]);
            }
            mask_row(job, n, y, s->t.near, s->t.valid, 0);
        }
    }
}

/* ---- the general affine path ---- */

/* Per-channel mean of the resampled sample over its inside pixels (a first pass over it). */
static void general_mean(const Job *job, const uint8_t *src, int last, const float *p, Scratch *s, double *mean) {
    const int w = job->out_width, h = job->out_height, C = job->channels;
    long count = 0;
    for (int k = 0; k < C; k++) mean[k] = 0.0;
    for (int y = 0; y < h; y++) {
        const RowMap rm = row_map(p, y);
        int cls_done;
        if (!image_row(job, src, last, &rm, &s->t, s->planes, NULL, &cls_done)) continue;
        for (int k = 0; k < C; k++) {
            const float *pl = s->planes + (size_t)k * w;
            double sum = 0.0;
            for (int x = 0; x < w; x++) sum += s->t.valid[x] ? pl[x] : 0.0f;
            mean[k] += sum;
        }
        for (int x = 0; x < w; x++) count += s->t.valid[x];
    }
    for (int k = 0; k < C; k++) mean[k] /= count > 0 ? (double)count : 1.0;
}

/* The general affine sample: per output row the taps, the image row and the mask row. */
static void sample_affine(const Job *job, Py_ssize_t n, const float *p, Scratch *s) {
    const int W = job->width, H = job->height, w = job->out_width, h = job->out_height, C = job->channels;
    const uint8_t *src = job->images + (size_t)n * H * W * C * job->itemsize;
    const int last = n == job->batch - 1 ? H * W - 1 : -1; /* the buffer's last pixel: no read past it */
    const uint8_t *mask = job->masks ? job->masks + (size_t)n * H * W * job->mask_planes * job->mask_itemsize : NULL;
    float m[9], v[3];
    if (job->photometric) {
        double mean[MAX_CHANNELS];
        if (job->contrast) general_mean(job, src, last, p, s, mean);
        colour_params(job, p, job->contrast ? mean : NULL, m, v);
    }
    const size_t row_values = (size_t)w * C, item = job->normalize ? sizeof(float) : (size_t)job->itemsize;
    char *out = (char *)job->out_images + (size_t)n * h * row_values * item;
    for (int y = 0; y < h; y++) {
        const RowMap rm = row_map(p, y);
        int cls_done;
        const int inside = image_row(job, src, last, &rm, &s->t, s->planes, mask, &cls_done);
        void *dst = out + (size_t)y * row_values * item;
        if (!inside) {
            fill_row(job, s->planes, w, dst);
        } else {
            finish_row(job, s->planes, inside == w ? NULL : s->t.valid, w, m, v, dst);
        }
        if (job->masks) mask_row(job, n, y, s->t.near, s->t.valid, cls_done);
    }
}

static int run(const Job *job) {
    const int W = job->width, H = job->height, w = job->out_width, C = job->channels;
    Scratch s;
    memset(&s, 0, sizeof(s));
    const size_t floats = (size_t)C * w + 2 * (size_t)W * C + (size_t)H + (size_t)W + 3 * (size_t)w + w;
    float *fbuf = malloc(sizeof(float) * floats);
    int32_t *ibuf = malloc(sizeof(int32_t) * 8 * (size_t)w);
    uint8_t *bbuf = malloc(2 * (size_t)w);
    Job staged = *job; /* stream: output rows built in a cache-resident stage */
    float *stage = NULL;
    if (job->stream) {
        size_t n = (size_t)w * (job->classes > C ? (size_t)job->classes : (size_t)C);
        stage = malloc(sizeof(float) * n + 32);
        staged.stage = stage ? (float *)(((uintptr_t)stage + 31) & ~(uintptr_t)31) : NULL;
    }
    void *vecs = NULL;
    if (job->masks) staged.cls_row = malloc(sizeof(uint16_t) * (size_t)w + 16);
#if WARP_AVX2
    if (job->masks && job->classes > 0 && job->mask_fill >= 0 && job->mask_fill < 65536) {
        vecs = one_hot_table_avx2(job->classes, job->ignore); /* NULL: the plain kernel is the pick */
        staged.hot_vecs = staged.cls_row ? vecs : NULL;
    }
    /* uint8 class maps, to a class map or (by the avx2 one-hot kernel) one-hot rows; the gather
     * reads 4 bytes, so the last sample needs 4 */
    staged.fused_mask = staged.cls_row && job->mask_itemsize == 1 && job->mask_planes == 1 &&
                        (job->classes == 0 || staged.hot_vecs) && job->mask_fill >= 0 &&
                        job->mask_fill < (job->classes > 0 ? 65536 : 256) && (size_t)H * W >= 4;
#endif
    (void)vecs;
    if (!fbuf || !ibuf || !bbuf || (job->stream && !stage) || (job->masks && !staged.cls_row)) {
        free(fbuf), free(ibuf), free(bbuf), free(stage), free(staged.cls_row);
#if WARP_AVX2
        if (vecs) _mm_free(vecs);
#endif
        return -1;
    }
    job = &staged;
    s.planes = fbuf;
    s.vrow = s.planes + (size_t)C * w;
    s.colacc = s.vrow + (size_t)W * C;
    s.rw = s.colacc + (size_t)W * C;
    s.cw = s.rw + H;
    s.t.fx = s.cw + W;
    s.t.fy = s.t.fx + w;
    s.fx = s.t.fy + w;
    s.t.i00 = ibuf;
    s.t.i01 = s.t.i00 + w;
    s.t.i10 = s.t.i01 + w;
    s.t.i11 = s.t.i10 + w;
    s.t.near = s.t.i11 + w;
    s.xa = s.t.near + w;
    s.xb = s.xa + w;
    s.xn = s.xb + w;
    s.t.valid = bbuf;
    s.vx = bbuf + w;
    for (Py_ssize_t n = 0; n < job->batch; n++) {
        const float *p = job->params + (size_t)n * NPARAMS;
        if (p[1] == 0.0f && p[3] == 0.0f && !job->general)
            sample_separable(job, n, p, &s);
        else
            sample_affine(job, n, p, &s);
    }
    free(fbuf), free(ibuf), free(bbuf), free(stage), free(staged.cls_row);
#if WARP_AVX2
    if (vecs) _mm_free(vecs);
    if (job->stream) _mm_sfence(); /* the batch's non-temporal stores, ordered once before the caller sees it */
#endif
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

/* The image arguments: channels, itemsize, fill and photometric checked together. */
static int check_image(Job *job, Py_buffer *fill) {
    if (job->channels < 1 || job->channels > MAX_CHANNELS || (job->itemsize != 1 && job->itemsize != 2)) {
        PyErr_Format(PyExc_ValueError, "channels must be 1-%d and itemsize 1 (uint8) or 2 (uint16). "
                     "Received: channels=%d, itemsize=%d", MAX_CHANNELS, job->channels, job->itemsize);
        return -1;
    }
    if (job->photometric && job->channels != 3) {
        PyErr_Format(PyExc_ValueError, "photometric (colour jitter) needs 3 channels. Received: channels=%d",
                     job->channels);
        return -1;
    }
    if (check_size(fill, sizeof(float) * (size_t)job->channels, "fill")) return -1;
    memcpy(job->fill, fill->buf, sizeof(float) * (size_t)job->channels);
    job->maxval = job->itemsize == 1 ? 255.0f : 65535.0f;
    return 0;
}

/* The mask arguments and buffers. */
static int check_masks(Job *job, PyObject *masks_obj, PyObject *out_masks_obj, Py_buffer *masks, Py_buffer *out_masks,
                       size_t out_pixels) {
    if (job->mask_itemsize != 1 && job->mask_itemsize != 2) {
        PyErr_Format(PyExc_ValueError, "mask_itemsize must be 1 or 2. Received: %d", job->mask_itemsize);
        return -1;
    }
    if (job->mask_planes < 1 || (job->classes > 0 && job->mask_planes != 1)) {
        PyErr_Format(PyExc_ValueError, "mask_planes must be >= 1 (1 for one-hot output). Received: %d",
                     job->mask_planes);
        return -1;
    }
    if (PyObject_GetBuffer(masks_obj, masks, PyBUF_SIMPLE) < 0 ||
        PyObject_GetBuffer(out_masks_obj, out_masks, PyBUF_WRITABLE) < 0)
        return -1;
    size_t in_bytes = (size_t)job->batch * job->height * job->width * job->mask_planes * job->mask_itemsize;
    size_t out_bytes = job->classes > 0 ? out_pixels * job->classes * sizeof(float)
                                        : out_pixels * job->mask_planes * job->mask_itemsize;
    if (check_size(masks, in_bytes, "masks") || check_size(out_masks, out_bytes, "out_masks")) return -1;
    job->masks = masks->buf;
    job->out_masks = out_masks->buf;
    return 0;
}

static PyObject *warp(PyObject *self, PyObject *args) {
    Py_buffer images = {0}, params = {0}, out_images = {0}, fill = {0}, masks = {0}, out_masks = {0};
    PyObject *masks_obj, *out_masks_obj, *result = NULL;
    Job job;
    memset(&job, 0, sizeof(job));
    job.channels = 3;
    job.itemsize = 1;
    if (!PyArg_ParseTuple(args, "y*y*w*niiiiy*pppOOiiiii|ppiip", &images, &params, &out_images, &job.batch,
                          &job.height, &job.width, &job.out_height, &job.out_width, &fill, &job.normalize,
                          &job.photometric, &job.contrast, &masks_obj, &out_masks_obj, &job.mask_itemsize,
                          &job.mask_planes, &job.mask_fill, &job.classes, &job.ignore, &job.zeroed, &job.stream,
                          &job.channels, &job.itemsize, &job.general))
        return NULL;
    size_t B = (size_t)job.batch, out_pixels = B * job.out_height * job.out_width;
    if (job.batch < 0 || job.height < 1 || job.width < 1 || job.out_height < 1 || job.out_width < 1) {
        PyErr_SetString(PyExc_ValueError, "batch must be >= 0 and every size >= 1");
        goto done;
    }
    if ((size_t)job.height * job.width >= ((size_t)1 << 31) / MAX_CHANNELS) {
        PyErr_Format(PyExc_ValueError, "images must have fewer than 2^27 pixels. Received: %d x %d", job.height,
                     job.width);
        goto done;
    }
    if (check_image(&job, &fill)) goto done;
    const size_t item = (size_t)job.itemsize, values = (size_t)job.channels;
    if (check_size(&images, B * job.height * job.width * values * item, "images") ||
        check_size(&params, B * NPARAMS * sizeof(float), "params") ||
        check_size(&out_images, out_pixels * values * (job.normalize ? sizeof(float) : item), "out_images"))
        goto done;
    if (masks_obj != Py_None && check_masks(&job, masks_obj, out_masks_obj, &masks, &out_masks, out_pixels)) goto done;
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
    if (fill.obj) PyBuffer_Release(&fill);
    if (masks.obj) PyBuffer_Release(&masks);
    if (out_masks.obj) PyBuffer_Release(&out_masks);
    return result;
}

/* ---- expand: one pass from a stored record to the training tensors (no augmentation) ----
 *
 * to_float(src, dst, scale): dst[i] = (float)src[i] * scale for uint8 src (scale =
 *   float32(1 / 255): the image; 1: stored one-hot planes), the same float32 multiply as
 *   NumPy's `np.multiply(x, np.float32(1 / 255), dtype=np.float32)`.
 * one_hot(src, dst, classes, ignore, itemsize, path="auto"): dst (n, classes) float32 from
 *   the n class indices in src (uint8 or uint16): 1 at the class when class < classes and
 *   class != ignore (-1: none), else an all-zero row (as `np.take` of an identity table).
 *   `path` picks the kernel (the tests run each; one_hot_paths() lists those built here):
 *     "avx2"    blocks of 8 pixels -> exactly `classes` vectors of 8 floats: output vector j
 *               lane l is flat value 8j + l, i.e. pixel (8j + l) / classes, class
 *               (8j + l) % classes; per j a lane permutation of the 8 zero-extended indices,
 *               a compare with the class vector (-1 where the class is the ignore index:
 *               never equal), AND with 1.0f, one unaligned store straight into dst. Each
 *               output byte is written once, by a full vector store, with no branch and no
 *               table per index value; the 2 x classes vectors sit in a malloc'd table.
 *               The last count % 8 pixels take the scatter path.
 *     "scatter" dst cleared in 16 KiB pieces (memset), then per pixel one store into L1: 1.0
 *               at a valid class, 0 at the row's start otherwise (no branch): few
 *               instructions per byte when rows are long.
 *     "table"   the portable row-table kernel: each pixel's padded row copied into an L1
 *               stage, the stage copied out with memcpy (every byte written twice).
 *     "auto"    avx2 when the CPU has it and classes <= ONE_HOT_AVX2_MAX_CLASSES, else
 *               scatter (the choice measured below).
 * The GIL is released while they run.
 *
 * Measured with scripts/one_hot_bench.py (issue 19; 2-core VM shared with two other jobs, so
 * noisy: medians of 7 interleaved rounds after a warm-up, CPU time of one thread): 512x512
 * samples, class maps with smooth regions, noisy boundaries and ignored (255 / 65535)
 * boundary pixels, written one sample at a time into a touched batch buffer. GB written per
 * CPU-second, uint8 maps (uint16 within 4%), and the share of to_float's rate:
 *   memory-bound: each kernel writes through 192 MiB (the reader's pooled batches: a 512x512
 *   batch of 8 is 42 MB of one-hot at 5 classes, 160 MB at 19):
 *     C     table (before)   scatter        avx2           to_float
 *     2     4.22  0.59x      4.85  0.68x    7.23  1.01x    7.17
 *     5     6.31  0.84x      6.80  0.90x    7.35  0.98x    7.52
 *     12    7.33  1.00x      8.60  1.18x    7.75  1.06x    7.31
 *     19    7.68  1.03x      9.23  1.24x    7.84  1.05x    7.43
 *     21    7.92  1.03x      9.38  1.22x    7.88  1.03x    7.67
 *     150   8.08  1.09x      9.58  1.29x    7.81  1.05x    7.42
 *   cache-resident: 24 MiB written through, 4 passes per timing (to_float swung 9-21 GB/s):
 *     2     6.61             8.13           23.86          12.00
 *     5     12.79            14.52          26.51          10.18
 *     12    16.35            21.89          27.54          10.20
 *     19    17.39            25.49          27.82          10.03
 *     21    18.21            26.33          27.75          10.63
 *     150   8.10             9.68           7.79           11.34
 * So "auto" takes avx2 up to 8 classes (in cache 1.5-2.9x scatter; memory-bound as fast at
 * 2-5 classes, scatter 0-7% ahead at 8) and scatter above (memory-bound 8-13% ahead at 10
 * classes, 11-24% from 12 on, where a batch of 8 512x512 samples is 100 MB and more; in cache
 * 5-37% behind avx2 at 10-21 classes, 24% ahead at 150). Memory-bound, one-hot wrote
 * 0.58-0.84x to_float's bytes per CPU-second at 2 and 5 classes before (table) and 0.96-1.03x
 * now (auto); 1.00-1.09x before and 1.14-1.30x now from 12 classes on. Tried and dropped:
 * clearing each 16 KiB piece with memset before the avx2 stores (+5% memory-bound at 5
 * classes, 1.4x the time in cache).
 *
 * stream=True (to_float and the avx2 one-hot kernel; 32-byte aligned rows): non-temporal
 * stores. One thread writing alone, they ran at the same rate as plain stores memory-bound
 * and 1.2-1.4x slower in cache; but in the reader, with both cores writing batches that
 * the caches cannot hold, plain stores first read every output line (write-allocate) and
 * the memory bus, not the CPU, was the limit: streaming halved the CPU time per 512x512
 * float32 + one-hot sample (1.28 -> 0.58 ms) and doubled the samples/s. The reader streams
 * batches of `readers.formats.expand.STREAM_MIN_BYTES` or more.
 */
#define STAGE_FLOATS 4096
#define SCATTER_FLOATS 4096 /* floats cleared per piece before the ones are stored (16 KiB) */

HOT static void u8_to_float(const uint8_t *src, float *dst, size_t count, float scale) {
    for (size_t i = 0; i < count; i++) dst[i] = (float)src[i] * scale;
}

static inline size_t index_at(const uint8_t *src, int itemsize, size_t i) {
    return itemsize == 1 ? src[i] : ((const uint16_t *)src)[i];
}

/* One-hot rows by table: row r of `table` (padded to `pad` floats, a multiple of 8) is the
 * output row of class r (r == classes: the all-zero row of an ignored or out-of-range
 * index). Each pixel copies its whole padded row in 32-byte pieces; the next pixel's row
 * overwrites the padding, so `out` needs `pad - classes` floats of slack at its end. */
HOT static void one_hot_rows(const uint8_t *src, int itemsize, size_t count, int classes, const int *rows,
                             const float *table, int pad, float *out) {
    for (size_t i = 0; i < count; i++) {
        const float *row = table + (size_t)rows[index_at(src, itemsize, i)];
        float *o = out + i * (size_t)classes;
        for (int q = 0; q < pad; q += 8) memcpy(o + q, row + q, 8 * sizeof(float));
    }
}

/* The "table" path: blocks of pixels are built in a cache-resident stage (the table rows'
 * padding needs slack) and copied out; no branch per pixel (`rows` maps every index value
 * to its row). */
static int one_hot_table(const uint8_t *src, int itemsize, size_t count, int classes, int ignore, float *dst) {
    const int pad = (classes + 7) / 8 * 8;
    size_t per = STAGE_FLOATS / (size_t)classes; /* pixels per block staged in cache */
    if (per == 0) per = 1;
    const size_t values = itemsize == 1 ? 256 : 65536;
    float *table = calloc((size_t)(classes + 1) * pad, sizeof(float));
    float *stage = malloc(sizeof(float) * (per * (size_t)classes + (size_t)pad));
    int *rows = malloc(sizeof(int) * values); /* index value -> offset of its row in `table` */
    if (!table || !stage || !rows) {
        free(table), free(stage), free(rows);
        return -1;
    }
    for (int c = 0; c < classes; c++) table[(size_t)c * pad + c] = c == ignore ? 0.0f : 1.0f;
    for (size_t v = 0; v < values; v++) rows[v] = (int)(v < (size_t)classes ? v : (size_t)classes) * pad;
    for (size_t at = 0; at < count; at += per) {
        size_t step = count - at < per ? count - at : per;
        one_hot_rows(src + at * itemsize, itemsize, step, classes, rows, table, pad, stage);
        memcpy(dst + at * classes, stage, sizeof(float) * step * classes);
    }
    free(table), free(stage), free(rows);
    return 0;
}

/* The "scatter" path (also the tail of the avx2 path): rows cleared a piece at a time, then
 * the ones stored (into L1, where the piece just went). */
static void one_hot_scatter(const uint8_t *src, int itemsize, size_t count, int classes, int ignore, float *dst) {
    size_t per = SCATTER_FLOATS / (size_t)classes;
    if (per == 0) per = 1;
    for (size_t at = 0; at < count; at += per) {
        size_t step = count - at < per ? count - at : per;
        float *out = dst + at * (size_t)classes;
        memset(out, 0, sizeof(float) * step * (size_t)classes);
        for (size_t i = 0; i < step; i++) { /* no branch: an invalid index stores 0 at its row's start */
            size_t v = index_at(src, itemsize, at + i);
            int ok = (v < (size_t)classes) & (v != (size_t)ignore);
            out[i * (size_t)classes + (ok ? v : 0)] = (float)ok;
        }
    }
}

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && !defined(IMGSHARD_PLAIN_C)
#define ONE_HOT_AVX2 1
#include <immintrin.h>

/* Above this many classes "auto" takes the scatter path (see the measurements above). */
#define ONE_HOT_AVX2_MAX_CLASSES 8

static int have_avx2(void) {
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2") ? 1 : 0;
    }
    return known && !simd_off;
}

/* to_float with non-temporal (streaming) stores: same values, written around the caches. */
__attribute__((target("avx2"))) static void u8_to_float_stream(const uint8_t *src, float *dst, size_t count,
                                                               float scale) {
    size_t i = 0;
    for (; i < count && ((uintptr_t)(dst + i) & 31); i++) dst[i] = (float)src[i] * scale;
    const __m256 s = _mm256_set1_ps(scale);
    for (; i + 8 <= count; i += 8) {
        __m256i w = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(src + i)));
        _mm256_stream_ps(dst + i, _mm256_mul_ps(_mm256_cvtepi32_ps(w), s));
    }
    for (; i < count; i++) dst[i] = (float)src[i] * scale;
    _mm_sfence();
}

/* The 8 indices of one block as int32 lanes. */
__attribute__((target("avx2"))) static inline __m256i load8(const uint8_t *src, int itemsize, size_t i) {
    if (itemsize == 1) return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(src + i)));
    return _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + 2 * i)));
}

/* `vecs` holds per output vector j of a block the lane permutation (vecs[2j]) and the
 * classes to compare with (vecs[2j + 1]). */
__attribute__((target("avx2"))) static void one_hot_blocks(const uint8_t *src, int itemsize, size_t blocks,
                                                           int classes, const __m256i *vecs, float *dst,
                                                           int stream_stores) {
    const __m256i one = _mm256_castps_si256(_mm256_set1_ps(1.0f));
    const int stream = stream_stores && !((uintptr_t)dst & 31);
    for (size_t b = 0; b < blocks; b++) {
        const __m256i idx = load8(src, itemsize, 8 * b);
        float *out = dst + 8 * b * (size_t)classes;
        for (int j = 0; j < classes; j++) {
            __m256i v = _mm256_permutevar8x32_epi32(idx, _mm256_load_si256(vecs + 2 * j));
            v = _mm256_and_si256(_mm256_cmpeq_epi32(v, _mm256_load_si256(vecs + 2 * j + 1)), one);
            if (stream)
                _mm256_stream_si256((__m256i *)(out + 8 * j), v);
            else
                _mm256_storeu_si256((__m256i *)(out + 8 * j), v);
        }
    }
}

/* The avx2 kernel's table for `classes` (see one_hot_blocks; _mm_free it), or NULL. */
static int32_t *one_hot_vecs(int classes, int ignore) {
    int32_t *vecs = _mm_malloc(sizeof(int32_t) * 16 * (size_t)classes, 32);
    if (!vecs) return NULL;
    for (int j = 0; j < classes; j++)
        for (int l = 0; l < 8; l++) {
            int flat = 8 * j + l, c = flat % classes;
            vecs[16 * j + l] = flat / classes;
            vecs[16 * j + 8 + l] = c == ignore ? -1 : c;
        }
    return vecs;
}

static int one_hot_avx2(const uint8_t *src, int itemsize, size_t count, int classes, int ignore, float *dst,
                        int stream) {
    int32_t *vecs = one_hot_vecs(classes, ignore);
    if (!vecs) return -1;
    size_t blocks = count / 8;
    one_hot_blocks(src, itemsize, blocks, classes, (const __m256i *)vecs, dst, stream);
    one_hot_scatter(src + 8 * blocks * itemsize, itemsize, count - 8 * blocks, classes, ignore,
                    dst + 8 * blocks * (size_t)classes);
    if (stream) _mm_sfence();
    _mm_free(vecs);
    return 0;
}
__attribute__((target("avx2"))) static void stream_row_avx2(const float *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i < n && ((uintptr_t)(dst + i) & 31); i++) dst[i] = src[i];
    for (; i + 8 <= n; i += 8) _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
    for (; i < n; i++) dst[i] = src[i];
}

static void stream_row(const float *src, void *dst, size_t bytes) {
    if (have_avx2())
        stream_row_avx2(src, (float *)dst, bytes / sizeof(float));
    else
        memcpy(dst, src, bytes);
}
#else
#define ONE_HOT_AVX2 0
static int have_avx2(void) { return 0; }
static void stream_row(const float *src, void *dst, size_t bytes) { memcpy(dst, src, bytes); }
#endif

/* The kernel names of one_hot(path=...); "auto" is resolved by one_hot_pick. */
enum { PATH_AUTO, PATH_TABLE, PATH_SCATTER, PATH_AVX2, PATH_UNKNOWN };
static const char *const PATH_NAMES[] = {"auto", "table", "scatter", "avx2"};

static int one_hot_pick(int classes) {
#if ONE_HOT_AVX2
    if (have_avx2() && classes <= ONE_HOT_AVX2_MAX_CLASSES) return PATH_AVX2;
#endif
    (void)classes;
    return PATH_SCATTER;
}

#if ONE_HOT_AVX2
/* The warp kernel's one-hot rows: the avx2 table where "auto" picks avx2 for `classes`, else NULL. */
static void *one_hot_table_avx2(int classes, int ignore) {
    return one_hot_pick(classes) == PATH_AVX2 ? one_hot_vecs(classes, ignore) : NULL;
}
#endif

static int one_hot_run(int path, const uint8_t *src, int itemsize, size_t count, int classes, int ignore,
                       float *dst, int stream) {
    if (path == PATH_AUTO) path = one_hot_pick(classes);
#if ONE_HOT_AVX2
    if (path == PATH_AVX2) return one_hot_avx2(src, itemsize, count, classes, ignore, dst, stream);
#endif
    if (path == PATH_TABLE) return one_hot_table(src, itemsize, count, classes, ignore, dst);
    one_hot_scatter(src, itemsize, count, classes, ignore, dst);
    return 0;
}

static PyObject *to_float(PyObject *self, PyObject *args) {
    Py_buffer src = {0}, dst = {0};
    float scale;
    int stream = 0;
    if (!PyArg_ParseTuple(args, "y*w*f|p", &src, &dst, &scale, &stream)) return NULL;
    PyObject *result = NULL;
    if ((size_t)dst.len != (size_t)src.len * sizeof(float)) {
        PyErr_Format(PyExc_ValueError, "dst must hold 4 bytes (one float32) per byte of src (%zd bytes). "
                     "Received: %zd bytes", src.len, dst.len);
    } else if ((uintptr_t)dst.buf & 3) {
        PyErr_SetString(PyExc_ValueError, "dst must be aligned for float32");
    } else {
        Py_BEGIN_ALLOW_THREADS
#if ONE_HOT_AVX2
        if (stream && have_avx2())
            u8_to_float_stream(src.buf, dst.buf, (size_t)src.len, scale);
        else
#endif
            u8_to_float(src.buf, dst.buf, (size_t)src.len, scale);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

static PyObject *one_hot(PyObject *self, PyObject *args) {
    Py_buffer src = {0}, dst = {0};
    int classes, ignore, itemsize, path = PATH_AUTO, stream = 0;
    const char *name = "auto";
    if (!PyArg_ParseTuple(args, "y*w*iii|sp", &src, &dst, &classes, &ignore, &itemsize, &name, &stream)) return NULL;
    while (path < PATH_UNKNOWN && strcmp(name, PATH_NAMES[path])) path++;
    PyObject *result = NULL;
    size_t count = itemsize > 0 ? (size_t)src.len / (size_t)itemsize : 0;
    if (path == PATH_UNKNOWN || (path == PATH_AVX2 && !have_avx2())) {
        PyErr_Format(PyExc_ValueError, "path must be \"auto\" or one of one_hot_paths() on this machine. "
                     "Received: path=\"%s\"", name);
    } else if (classes < 1 || (itemsize != 1 && itemsize != 2) || (size_t)src.len % (size_t)itemsize) {
        PyErr_Format(PyExc_ValueError, "classes must be >= 1 and itemsize 1 or 2 (dividing src). Received: "
                     "classes=%d, itemsize=%d, %zd bytes", classes, itemsize, src.len);
    } else if ((size_t)dst.len != count * (size_t)classes * sizeof(float)) {
        PyErr_Format(PyExc_ValueError, "dst must hold %zu float32 (%zu indices x %d classes). Received: %zd bytes",
                     count * (size_t)classes, count, classes, dst.len);
    } else if (((uintptr_t)dst.buf & 3) || (itemsize == 2 && ((uintptr_t)src.buf & 1))) {
        PyErr_SetString(PyExc_ValueError, "dst must be aligned for float32 and a uint16 src for uint16");
    } else {
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = one_hot_run(path, src.buf, itemsize, count, classes, ignore, dst.buf, stream);
        Py_END_ALLOW_THREADS
        result = rc < 0 ? PyErr_NoMemory() : Py_NewRef(Py_None);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

/* one_hot_paths(): the kernels one_hot(path=...) can run here, and the one "auto" takes
 * for `classes` (one_hot_paths(classes) -> (names, picked)). */
static PyObject *one_hot_paths(PyObject *self, PyObject *args) {
    int classes = 0;
    if (!PyArg_ParseTuple(args, "|i", &classes)) return NULL;
    PyObject *names = have_avx2() ? Py_BuildValue("(sss)", "table", "scatter", "avx2")
                                  : Py_BuildValue("(ss)", "table", "scatter");
    if (!names || classes < 1) return names;
    return Py_BuildValue("(Ns)", names, PATH_NAMES[one_hot_pick(classes)]);
}

/* ---- read_rows: a compact batch's records read from their shard files (pread) ----
 *
 * read_rows(fds, offsets, out, row_bytes): row i of `out` (row_bytes bytes each) is read
 *   from file descriptor fds[i] (int32) at offsets[i] (int64) with pread, straight from the
 *   page cache into the batch; the GIL is released once for the whole batch (a pread per
 *   record from Python released and took it back twice per record, and with the batch
 *   threads, the generator and tf.data's threads all wanting it, every take-back was a
 *   sleep and a wake-up). Returns (-1, 0), or (i, bytes read) for the first row that came
 *   short (the file shrank). A read error raises OSError.
 */
static PyObject *read_rows(PyObject *self, PyObject *args) {
    Py_buffer fds = {0}, offsets = {0}, out = {0};
    Py_ssize_t row_bytes;
    if (!PyArg_ParseTuple(args, "y*y*w*n", &fds, &offsets, &out, &row_bytes)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = fds.len / (Py_ssize_t)sizeof(int32_t);
    if (row_bytes < 0 || fds.len % (Py_ssize_t)sizeof(int32_t) || offsets.len != n * (Py_ssize_t)sizeof(int64_t)
        || out.len != n * row_bytes) {
        PyErr_Format(PyExc_ValueError, "read_rows needs n int32 descriptors, n int64 offsets and n x row_bytes "
                     "bytes of output. Received: %zd, %zd and %zd bytes, row_bytes=%zd", fds.len, offsets.len,
                     out.len, row_bytes);
        goto done;
    }
    Py_ssize_t bad = -1, got = 0;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n && bad < 0 && !err; i++) {
        char *dst = (char *)out.buf + i * row_bytes;
        int fd = ((const int32_t *)fds.buf)[i];
        int64_t at = ((const int64_t *)offsets.buf)[i];
        Py_ssize_t done = 0;
        while (done < row_bytes) {
            ssize_t r = pread(fd, dst + done, (size_t)(row_bytes - done), (off_t)(at + done));
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) err = errno;
            if (r <= 0) break;
            done += r;
        }
        if (!err && done < row_bytes) bad = i, got = done;
    }
    Py_END_ALLOW_THREADS
    if (err) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
    } else {
        result = Py_BuildValue("(nn)", bad, got);
    }
done:
    PyBuffer_Release(&fds);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&out);
    return result;
}

/* use_simd(enabled): whether the hand-written AVX2 kernels may run (when the CPU has AVX2);
 * returns the previous setting. Not thread-safe: for tests and benchmarks. */
static PyObject *use_simd(PyObject *self, PyObject *args) {
    int enabled;
    if (!PyArg_ParseTuple(args, "p", &enabled)) return NULL;
    PyObject *before = PyBool_FromLong(!simd_off);
    simd_off = !enabled;
    return before;
}

static PyMethodDef methods[] = {
    {"use_simd", use_simd, METH_VARARGS,
     "use_simd(enabled): allow (True) or forbid the hand-written AVX2 kernels; returns the previous setting."},
    {"warp", warp, METH_VARARGS,
     "warp(images, params, out_images, batch, height, width, out_height, out_width, fill, normalize, "
     "photometric, contrast, masks, out_masks, mask_itemsize, mask_planes, mask_fill, one_hot_classes, ignore, "
     "zeroed=False, stream=False, channels=3, itemsize=1, general=False): augment a uint8/uint16 batch into "
     "preallocated outputs (see readers/_warp.c)."},
    {"to_float", to_float, METH_VARARGS,
     "to_float(src, dst, scale, stream=False): dst = float32(uint8 src) * scale, one pass; stream: "
     "non-temporal stores (see readers/_warp.c)."},
    {"one_hot", one_hot, METH_VARARGS,
     "one_hot(src, dst, classes, ignore, itemsize, path=\"auto\", stream=False): float32 one-hot rows of "
     "class indices; stream: non-temporal stores (the avx2 kernel)."},
    {"read_rows", read_rows, METH_VARARGS,
     "read_rows(fds, offsets, out, row_bytes): row i of out read with pread from fds[i] at offsets[i]; "
     "(-1, 0) or (first short row, bytes read)."},
    {"one_hot_paths", one_hot_paths, METH_VARARGS,
     "one_hot_paths(classes=0): the one_hot kernels built for this CPU; with classes, (paths, auto's pick)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_warp",
                                    "Fused batch augmentation (bilinear image + nearest mask + colour) and one-pass expansion (C).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__warp(void) { return PyModule_Create(&module); }

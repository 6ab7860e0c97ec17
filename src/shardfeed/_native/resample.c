/* Convolution resize of 8-bit interleaved images (see resample.h).
 *
 * The arithmetic follows Pillow's resampling so that results are equal value for value:
 * per output sample, a window [lo, lo + n) of input samples around the centre
 * (x + 0.5) * scale, weights filter((i - centre + 0.5) / max(scale, 1)) normalised to sum
 * 1 and rounded to 22-bit fixed point, sums started at one half and clamped to 0..255 after
 * the shift. The horizontal pass runs first (over only the rows the vertical pass reads),
 * and each pass runs only when that side changes size. Integer sums do not depend on
 * their order, so the vector paths give the same values as the scalar ones. */
#include "resample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifndef _WIN32
#include <pthread.h>
#define SF_RESAMPLE_PTHREAD 1
#endif

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define SF_RESAMPLE_X86 1
#endif

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

#define PREC 22 /* fixed-point bits of a weight: 8 bits of result and 2 of headroom in 32 */
#define HALF (1 << (PREC - 1))

static double w_box(double x) { return (x > -0.5 && x <= 0.5) ? 1.0 : 0.0; }

static double w_bilinear(double x) {
    x = x < 0.0 ? -x : x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

static double w_hamming(double x) {
    x = x < 0.0 ? -x : x;
    if (x == 0.0) return 1.0;
    if (x >= 1.0) return 0.0;
    x = x * M_PI;
    return sin(x) / x * (0.54f + 0.46f * cos(x)); /* float constants, as the reference */
}

static double w_bicubic(double x) {
    const double a = -0.5;
    x = x < 0.0 ? -x : x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

static double sinc(double x) {
    if (x == 0.0) return 1.0;
    x = x * M_PI;
    return sin(x) / x;
}

static double w_lanczos(double x) { return (-3.0 <= x && x < 3.0) ? sinc(x) * sinc(x / 3) : 0.0; }

typedef struct {
    int ksize;    /* weights stored per output sample */
    int *lo;      /* first input sample of each output sample's window */
    int *n;       /* window length */
    int32_t *k;   /* out_size x ksize fixed-point weights */
} weights;

static void weights_free(weights *w) {
    free(w->lo);
    free(w->n);
    free(w->k);
}

/* Weights for one (in, out, filter), kept by a thread between calls (weights_cached). */
typedef struct {
    int valid, in, out, filter;
    weights w;
} weights_slot;

/* The tables hpass4_vnni runs from, for one horizontal resize (the weights' sizes and
 * filter, the window left/tw); rc 1 where that pass does not apply. Kept by a thread between
 * calls: building them costs about a tenth of a 500x375 -> 224x224 resize. */
typedef struct {
    int valid, rc, sw, scaled_w, filter, left, tw;
    int C, groups;
    int32_t *ix;
    int8_t *kw;
    int *base, *first;
} vnni_plan;

static void vnni_plan_free(vnni_plan *p) {
    free(p->ix);
    free(p->kw);
    free(p->base);
    free(p->first);
    memset(p, 0, sizeof(*p));
}

/* Weights for in_size -> out_size samples; 0, or -1 for a bad filter, -2 out of memory. */
static int weights_make(int in_size, int out_size, int filter, weights *w) {
    double (*fn)(double);
    double support;
    switch (filter) {
        case SF_FILTER_BOX: fn = w_box; support = 0.5; break;
        case SF_FILTER_BILINEAR: fn = w_bilinear; support = 1.0; break;
        case SF_FILTER_HAMMING: fn = w_hamming; support = 1.0; break;
        case SF_FILTER_BICUBIC: fn = w_bicubic; support = 2.0; break;
        case SF_FILTER_LANCZOS: fn = w_lanczos; support = 3.0; break;
        default: return -1;
    }
    double scale = (double)(float)in_size / out_size;
    double fscale = scale < 1.0 ? 1.0 : scale;
    support *= fscale;
    int ksize = (int)ceil(support) * 2 + 1;
    memset(w, 0, sizeof(*w));
    w->ksize = ksize;
    w->lo = malloc(sizeof(int) * (size_t)out_size);
    w->n = malloc(sizeof(int) * (size_t)out_size);
    w->k = calloc((size_t)out_size * (size_t)ksize, sizeof(int32_t));
    double *d = malloc(sizeof(double) * (size_t)ksize);
    if (!w->lo || !w->n || !w->k || !d) {
        free(d);
        weights_free(w);
        return -2;
    }
    double inv = 1.0 / fscale;
    for (int o = 0; o < out_size; o++) {
        double centre = 0.0 + (o + 0.5) * scale;
        int lo = (int)(centre - support + 0.5);
        int hi = (int)(centre + support + 0.5);
        if (lo < 0) lo = 0;
        if (hi > in_size) hi = in_size;
        int n = hi - lo;
        if (n > ksize) n = ksize; /* cannot happen; keeps the writes below in bounds */
        double sum = 0.0;
        for (int i = 0; i < n; i++) {
            d[i] = fn((i + lo - centre + 0.5) * inv);
            sum += d[i];
        }
        int32_t *k = w->k + (size_t)o * ksize;
        for (int i = 0; i < n; i++) {
            double v = sum != 0.0 ? d[i] / sum : d[i];
            k[i] = v < 0 ? (int32_t)(-0.5 + v * (1 << PREC)) : (int32_t)(0.5 + v * (1 << PREC));
        }
        w->lo[o] = lo;
        w->n[o] = n < 0 ? 0 : n;
    }
    free(d);
    return 0;
}

static inline uint8_t clip8(int32_t s) {
    s >>= PREC;
    return s < 0 ? 0 : s > 255 ? 255 : (uint8_t)s;
}

/* Horizontal pass, scalar: rows [y0, y1) of src (sw pixels of c channels), output columns
 * [left, left + tw) into tmp (tw pixels of oc <= c channels per row: the first oc kept). */
static void hpass_scalar(const uint8_t *src, int sw, int c, int y0, int y1, const weights *w, int left, int tw,
                         uint8_t *tmp, int oc) {
    for (int y = y0; y < y1; y++) {
        const uint8_t *row = src + (size_t)y * sw * c;
        uint8_t *o = tmp + (size_t)(y - y0) * tw * oc;
        for (int j = 0; j < tw; j++) {
            const int32_t *k = w->k + (size_t)(left + j) * w->ksize;
            const uint8_t *p = row + (size_t)w->lo[left + j] * c;
            int n = w->n[left + j];
            for (int ch = 0; ch < oc; ch++) {
                int32_t s = HALF;
                for (int t = 0; t < n; t++) s += p[t * c + ch] * k[t];
                o[j * oc + ch] = clip8(s);
            }
        }
    }
}

#ifdef SF_RESAMPLE_X86
/* Horizontal pass for 4-byte pixels (RGBX), one pixel's samples per 128-bit vector; writes
 * oc = 4 or 3 bytes a pixel (3: each 4-byte store overlaps the next pixel's first byte, so
 * tmp needs one byte of slack after its last row). */
__attribute__((target("sse4.1"))) static void hpass4_sse41(const uint8_t *src, int sw, int y0, int y1,
                                                          const weights *w, int left, int tw, uint8_t *tmp, int oc) {
    for (int y = y0; y < y1; y++) {
        const uint8_t *row = src + (size_t)y * sw * 4;
        uint8_t *o = tmp + (size_t)(y - y0) * tw * oc;
        for (int j = 0; j < tw; j++) {
            const int32_t *k = w->k + (size_t)(left + j) * w->ksize;
            const uint8_t *p = row + (size_t)w->lo[left + j] * 4;
            int n = w->n[left + j], t = 0;
            __m128i acc = _mm_set1_epi32(HALF), acc2 = _mm_setzero_si128();
            for (; t + 1 < n; t += 2) {
                __m128i two = _mm_loadl_epi64((const __m128i *)(p + 4 * t));
                acc = _mm_add_epi32(acc, _mm_mullo_epi32(_mm_cvtepu8_epi32(two), _mm_set1_epi32(k[t])));
                acc2 = _mm_add_epi32(acc2, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_srli_si128(two, 4)),
                                                           _mm_set1_epi32(k[t + 1])));
            }
            if (t < n) {
                int32_t v;
                memcpy(&v, p + 4 * t, 4);
                acc = _mm_add_epi32(acc, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(v)),
                                                         _mm_set1_epi32(k[t])));
            }
            acc = _mm_srai_epi32(_mm_add_epi32(acc, acc2), PREC);
            acc = _mm_packus_epi16(_mm_packs_epi32(acc, acc), acc);
            int32_t px = _mm_cvtsi128_si32(acc);
            memcpy(o + oc * j, &px, 4);
        }
    }
}

/* The same for AVX2, two taps per 256-bit multiply. Every window is padded with zero
 * weights to one even length P (the widest window of the pass) and shifted left where it
 * would run past the row's end, so each output pixel runs the same branch-free loop
 * (windows of varying length mispredict a branch nearly every pixel). The weights are laid
 * out four copies per tap. Returns 1 when the row is narrower than P (the caller uses the
 * 128-bit pass), -2 when out of memory. */
__attribute__((target("avx2"))) static int hpass4_avx2(const uint8_t *src, int sw, int y0, int y1,
                                                      const weights *w, int left, int tw, uint8_t *tmp, int oc) {
    int P = 2;
    for (int j = 0; j < tw; j++)
        if (w->n[left + j] > P) P = w->n[left + j];
    P = (P + 1) & ~1;
    if (P > sw) return 1;
    int32_t *kx = calloc((size_t)tw * P * 4, sizeof(int32_t));
    int *start = malloc(sizeof(int) * (size_t)tw);
    if (!kx || !start) {
        free(kx);
        free(start);
        return -2;
    }
    for (int j = 0; j < tw; j++) {
        const int32_t *k = w->k + (size_t)(left + j) * w->ksize;
        int n = w->n[left + j], lo = w->lo[left + j];
        int s = lo + P > sw ? sw - P : lo;
        start[j] = s;
        for (int t = 0; t < n; t++)
            for (int c = 0; c < 4; c++) kx[((size_t)j * P + (lo - s) + t) * 4 + c] = k[t];
    }
    const __m256i half = _mm256_set1_epi32(HALF);
    const __m256i first = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
    int pairs = P / 2;
    for (int y = y0; y < y1; y++) {
        const uint8_t *row = src + (size_t)y * sw * 4;
        uint8_t *o = tmp + (size_t)(y - y0) * tw * oc;
        int j = 0;
        for (; j + 1 < tw; j += 2) { /* two output pixels, reduced and packed together */
            const uint8_t *p = row + (size_t)start[j] * 4, *p1 = row + (size_t)start[j + 1] * 4;
            const int32_t *K = kx + (size_t)j * P * 4, *K1 = K + P * 4;
            __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
            for (int q = 0; q < pairs; q++) {
                a = _mm256_add_epi32(a, _mm256_mullo_epi32(
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8 * q))),
                    _mm256_loadu_si256((const __m256i *)(K + 8 * q))));
                b = _mm256_add_epi32(b, _mm256_mullo_epi32(
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p1 + 8 * q))),
                    _mm256_loadu_si256((const __m256i *)(K1 + 8 * q))));
            }
            __m256i v = _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
            v = _mm256_srai_epi32(_mm256_add_epi32(v, half), PREC);
            v = _mm256_packus_epi16(_mm256_packs_epi32(v, v), v);
            v = _mm256_permutevar8x32_epi32(v, first);
            int64_t two = _mm_cvtsi128_si64(_mm256_castsi256_si128(v));
            if (oc == 4) {
                memcpy(o + 4 * j, &two, 8);
            } else {
                int32_t px0 = (int32_t)two, px1 = (int32_t)(two >> 32);
                memcpy(o + 3 * j, &px0, 4);
                memcpy(o + 3 * j + 3, &px1, 4);
            }
        }
        for (; j < tw; j++) {
            const uint8_t *p = row + (size_t)start[j] * 4;
            const int32_t *K = kx + (size_t)j * P * 4;
            __m256i a = _mm256_setzero_si256();
            for (int q = 0; q < pairs; q++)
                a = _mm256_add_epi32(a, _mm256_mullo_epi32(
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8 * q))),
                    _mm256_loadu_si256((const __m256i *)(K + 8 * q))));
            __m128i v = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
            v = _mm_srai_epi32(_mm_add_epi32(v, _mm_set1_epi32(HALF)), PREC);
            v = _mm_packus_epi16(_mm_packs_epi32(v, v), v);
            int32_t px = _mm_cvtsi128_si32(v);
            memcpy(o + oc * j, &px, 4);
        }
    }
    free(kx);
    free(start);
    return 0;
}

/* The same with AVX-512: four taps per 512-bit multiply (windows padded to a multiple of
 * four), two output pixels reduced and packed together as in the AVX2 pass. */
__attribute__((target("avx512f,avx2"))) static int hpass4_avx512(const uint8_t *src, int sw, int y0, int y1,
                                                                const weights *w, int left, int tw, uint8_t *tmp,
                                                                int oc) {
    int P = 4;
    for (int j = 0; j < tw; j++)
        if (w->n[left + j] > P) P = w->n[left + j];
    P = (P + 3) & ~3;
    if (P > sw) return 1;
    int32_t *kx = calloc((size_t)tw * P * 4, sizeof(int32_t));
    int *start = malloc(sizeof(int) * (size_t)tw);
    if (!kx || !start) {
        free(kx);
        free(start);
        return -2;
    }
    for (int j = 0; j < tw; j++) {
        const int32_t *k = w->k + (size_t)(left + j) * w->ksize;
        int n = w->n[left + j], lo = w->lo[left + j];
        int s = lo + P > sw ? sw - P : lo;
        start[j] = s;
        for (int t = 0; t < n; t++)
            for (int c = 0; c < 4; c++) kx[((size_t)j * P + (lo - s) + t) * 4 + c] = k[t];
    }
    const __m256i half = _mm256_set1_epi32(HALF);
    const __m256i first = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
    int quads = P / 4;
    for (int y = y0; y < y1; y++) {
        const uint8_t *row = src + (size_t)y * sw * 4;
        uint8_t *o = tmp + (size_t)(y - y0) * tw * oc;
        int j = 0;
        for (; j + 1 < tw; j += 2) {
            const uint8_t *p = row + (size_t)start[j] * 4, *p1 = row + (size_t)start[j + 1] * 4;
            const int32_t *K = kx + (size_t)j * P * 4, *K1 = K + P * 4;
            __m512i a = _mm512_setzero_si512(), b = _mm512_setzero_si512();
            for (int q = 0; q < quads; q++) {
                a = _mm512_add_epi32(a, _mm512_mullo_epi32(
                    _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 16 * q))),
                    _mm512_loadu_si512((const void *)(K + 16 * q))));
                b = _mm512_add_epi32(b, _mm512_mullo_epi32(
                    _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p1 + 16 * q))),
                    _mm512_loadu_si512((const void *)(K1 + 16 * q))));
            }
            __m256i ya = _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
            __m256i yb = _mm256_add_epi32(_mm512_castsi512_si256(b), _mm512_extracti64x4_epi64(b, 1));
            __m256i v = _mm256_add_epi32(_mm256_permute2x128_si256(ya, yb, 0x20),
                                         _mm256_permute2x128_si256(ya, yb, 0x31));
            v = _mm256_srai_epi32(_mm256_add_epi32(v, half), PREC);
            v = _mm256_packus_epi16(_mm256_packs_epi32(v, v), v);
            v = _mm256_permutevar8x32_epi32(v, first);
            int64_t two = _mm_cvtsi128_si64(_mm256_castsi256_si128(v));
            if (oc == 4) {
                memcpy(o + 4 * j, &two, 8);
            } else {
                int32_t px0 = (int32_t)two, px1 = (int32_t)(two >> 32);
                memcpy(o + 3 * j, &px0, 4);
                memcpy(o + 3 * j + 3, &px1, 4);
            }
        }
        for (; j < tw; j++) {
            const uint8_t *p = row + (size_t)start[j] * 4;
            const int32_t *K = kx + (size_t)j * P * 4;
            __m512i a = _mm512_setzero_si512();
            for (int q = 0; q < quads; q++)
                a = _mm512_add_epi32(a, _mm512_mullo_epi32(
                    _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 16 * q))),
                    _mm512_loadu_si512((const void *)(K + 16 * q))));
            __m256i ya = _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
            __m128i v = _mm_add_epi32(_mm256_castsi256_si128(ya), _mm256_extracti128_si256(ya, 1));
            v = _mm_srai_epi32(_mm_add_epi32(v, _mm_set1_epi32(HALF)), PREC);
            v = _mm_packus_epi16(_mm_packs_epi32(v, v), v);
            int32_t px = _mm_cvtsi128_si32(v);
            memcpy(o + oc * j, &px, 4);
        }
    }
    free(kx);
    free(start);
    return 0;
}

/* AVX-512, across output pixels: four neighbouring output pixels at a time. Their windows
 * (padded to one length P) lie within 16 source pixels, loaded as one 512-bit vector; for
 * each tap a permute gathers the four pixels that tap reads, widened to 16 int32 lanes
 * (4 pixels x 4 samples) and multiplied by their four weights. No horizontal sums are
 * needed, and a multiply serves four outputs. Returns 1 where the windows do not fit (the
 * caller uses the per-pixel passes), -2 when out of memory. */
/* Four output pixels (RGBX bytes in `bytes`) stored from pixel j of the row o: 16 bytes as they
 * are, or 12 with each fourth byte dropped for 3-channel output. */
__attribute__((target("sse4.1"), always_inline)) static inline void store4px(uint8_t *o, size_t j, __m128i bytes,
                                                                            int oc) {
    if (oc == 4) {
        _mm_storeu_si128((__m128i *)(o + 4 * j), bytes);
        return;
    }
    o += 3 * j;
    __m128i packed = _mm_shuffle_epi8(bytes, _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1));
    int64_t lo8 = _mm_cvtsi128_si64(packed);
    int32_t hi4 = _mm_extract_epi32(packed, 2);
    memcpy(o, &lo8, 8);
    memcpy(o + 8, &hi4, 4);
}

__attribute__((target("avx512f,avx2"))) static int hpass4_gather512(const uint8_t *src, int sw, int y0, int y1,
                                                                   const weights *w, int left, int tw,
                                                                   uint8_t *tmp, int oc) {
    if (tw < 4 || sw < 16) return 1;
    int P = 1;
    for (int j = 0; j < tw; j++)
        if (w->n[left + j] > P) P = w->n[left + j];
    int groups = (tw + 3) / 4;
    int32_t *kx = calloc((size_t)groups * P * 16, sizeof(int32_t));
    int32_t *ix = calloc((size_t)groups * P * 4, sizeof(int32_t));
    int *base = malloc(sizeof(int) * (size_t)groups), *first = malloc(sizeof(int) * (size_t)groups);
    int rc = 0;
    if (!kx || !ix || !base || !first) {
        rc = -2;
        goto out;
    }
    for (int g = 0; g < groups; g++) {
        int j0 = g * 4 < tw - 4 ? g * 4 : tw - 4; /* the last group overlaps the one before */
        first[g] = j0;
        int b = w->lo[left + j0];
        if (b > sw - 16) b = sw - 16;
        base[g] = b;
        for (int i = 0; i < 4; i++) {
            int j = left + j0 + i, lo = w->lo[j], n = w->n[j];
            const int32_t *k = w->k + (size_t)j * w->ksize;
            for (int t = 0; t < P; t++) {
                int off = lo + (t < n ? t : 0) - b; /* padded taps read a real pixel, weight 0 */
                if (off < 0 || off >= 16) {
                    rc = 1;
                    goto out;
                }
                ix[((size_t)g * P + t) * 4 + i] = off;
                for (int c = 0; c < 4; c++) kx[((size_t)g * P + t) * 16 + i * 4 + c] = t < n ? k[t] : 0;
            }
        }
    }
    const __m512i half = _mm512_set1_epi32(HALF), zero = _mm512_setzero_si512();
    for (int y = y0; y < y1; y++) {
        const uint8_t *row = src + (size_t)y * sw * 4;
        uint8_t *o = tmp + (size_t)(y - y0) * tw * oc;
        for (int g = 0; g < groups; g++) {
            __m512i px16 = _mm512_loadu_si512((const void *)(row + (size_t)base[g] * 4));
            const int32_t *K = kx + (size_t)g * P * 16, *I = ix + (size_t)g * P * 4;
            __m512i acc = half, acc2 = zero;
            int t = 0;
            for (; t + 1 < P; t += 2) {
                __m512i s0 = _mm512_permutexvar_epi32(_mm512_zextsi128_si512(_mm_loadu_si128((const __m128i *)(I + 4 * t))), px16);
                __m512i s1 = _mm512_permutexvar_epi32(
                    _mm512_zextsi128_si512(_mm_loadu_si128((const __m128i *)(I + 4 * t + 4))), px16);
                acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(_mm512_cvtepu8_epi32(_mm512_castsi512_si128(s0)),
                                                               _mm512_loadu_si512((const void *)(K + 16 * t))));
                acc2 = _mm512_add_epi32(acc2, _mm512_mullo_epi32(_mm512_cvtepu8_epi32(_mm512_castsi512_si128(s1)),
                                                                 _mm512_loadu_si512((const void *)(K + 16 * t + 16))));
            }
            if (t < P) {
                __m512i s0 = _mm512_permutexvar_epi32(_mm512_zextsi128_si512(_mm_loadu_si128((const __m128i *)(I + 4 * t))), px16);
                acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(_mm512_cvtepu8_epi32(_mm512_castsi512_si128(s0)),
                                                               _mm512_loadu_si512((const void *)(K + 16 * t))));
            }
            acc = _mm512_max_epi32(_mm512_srai_epi32(_mm512_add_epi32(acc, acc2), PREC), zero);
            __m128i bytes = _mm512_cvtusepi32_epi8(acc); /* 0..255 after the max; above 255 saturates */
            store4px(o, (size_t)first[g], bytes, oc);
        }
    }
out:
    free(kx);
    free(ix);
    free(base);
    free(first);
    return rc;
}

/* The weight k in three balanced base-256 digits, k = d2 * 65536 + d1 * 256 + d0, each in
 * [-128, 127] (so |k| < 2^23 fits: 22-bit weights with room), for vpdpbusd, which multiplies
 * four unsigned bytes by four signed bytes and adds the four products to an int32 lane:
 * sum(p * k) = (sum(p * d2) << 16) + (sum(p * d1) << 8) + sum(p * d0), exactly, mod 2^32 as
 * the 32-bit multiplies wrap. */
static int digits3(int32_t k, int8_t d[3]) {
    if (k >= (1 << 23) - (1 << 15) || k <= -(1 << 23) + (1 << 15)) return -1;
    for (int i = 0; i < 3; i++) {
        int32_t r = ((k + 128) & 255) - 128;
        d[i] = (int8_t)r;
        k = (k - r) / 256;
    }
    return 0;
}

/* The tables of hpass4_vnni (below) for weights w, output columns [left, left + tw) of a row
 * of sw pixels: 0, 1 where the pass does not apply (windows wider than 16 source pixels
 * for a group of four, a weight that does not fit three digits, a row too narrow), -2 out
 * of memory. */
static int vnni_plan_make(const weights *w, int sw, int left, int tw, vnni_plan *pl) {
    if (tw < 4 || sw < 16) return 1;
    int P = 4;
    for (int j = 0; j < tw; j++)
        if (w->n[left + j] > P) P = w->n[left + j];
    P = (P + 3) & ~3;
    if (P > 16) return 1;
    int C = P / 4, groups = (tw + 3) / 4;
    pl->C = C;
    pl->groups = groups;
    pl->ix = malloc(sizeof(int32_t) * 16 * (size_t)groups * C);
    pl->kw = malloc(192 * (size_t)groups * C); /* per chunk: digit 0, 1, 2, 64 bytes each */
    pl->base = malloc(sizeof(int) * (size_t)groups);
    pl->first = malloc(sizeof(int) * (size_t)groups);
    if (!pl->ix || !pl->kw || !pl->base || !pl->first) return -2;
    for (int g = 0; g < groups; g++) {
        int j0 = g * 4 < tw - 4 ? g * 4 : tw - 4; /* the last group overlaps the one before */
        int s[4], b = sw;
        pl->first[g] = j0;
        for (int i = 0; i < 4; i++) {
            int lo = w->lo[left + j0 + i];
            s[i] = lo + P > sw ? sw - P : lo;
            if (s[i] < b) b = s[i];
        }
        if (b > sw - 16) b = sw - 16;
        pl->base[g] = b;
        for (int i = 0; i < 4; i++) {
            if (s[i] < b || s[i] - b + P > 16) return 1;
            int j = left + j0 + i, lo = w->lo[j], n = w->n[j];
            const int32_t *k = w->k + (size_t)j * w->ksize;
            for (int c = 0; c < C; c++) {
                int8_t *D = pl->kw + ((size_t)g * C + c) * 192;
                for (int e = 0; e < 4; e++) {
                    pl->ix[((size_t)g * C + c) * 16 + i * 4 + e] = s[i] - b + 4 * c + e;
                    int t = 4 * c + e - (lo - s[i]);
                    int8_t d[3];
                    if (digits3(t >= 0 && t < n ? k[t] : 0, d) != 0) return 1;
                    for (int ch = 0; ch < 4; ch++)
                        for (int dd = 0; dd < 3; dd++) D[dd * 64 + i * 16 + ch * 4 + e] = d[dd];
                }
            }
        }
    }
    return 0;
}

/* Horizontal pass for 4-byte pixels with AVX-512 VNNI: four neighbouring output pixels per
 * 512-bit vector, one per 128-bit lane, as hpass4_gather512, but four taps at a time: a
 * vpermd puts each lane's next four source pixels in its lane, one vpshufb transposes them to
 * four taps per channel, and three vpdpbusd (one per weight digit) multiply and accumulate
 * them. Windows are padded to a multiple of four taps. Runs from the tables of
 * vnni_plan_make. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2"))) static void hpass4_vnni(
    const uint8_t *src, int sw, int y0, int y1, const vnni_plan *pl, int tw, uint8_t *tmp, int oc) {
    int C = pl->C, groups = pl->groups;
    const int *base = pl->base, *first = pl->first;
    /* in-lane bytes p0 p1 p2 p3 (RGBX each) -> per channel, its four pixels' bytes */
    const __m512i transpose = _mm512_broadcast_i32x4(
        _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    const __m512i half = _mm512_set1_epi32(HALF), zero = _mm512_setzero_si512();
    for (int y = y0; y < y1; y++) {
        const uint8_t *row = src + (size_t)y * sw * 4;
        uint8_t *o = tmp + (size_t)(y - y0) * tw * oc;
        for (int g = 0; g < groups; g++) {
            __m512i px16 = _mm512_loadu_si512((const void *)(row + (size_t)base[g] * 4));
            const int32_t *I = pl->ix + (size_t)g * C * 16;
            const int8_t *K = pl->kw + (size_t)g * C * 192;
            __m512i a0 = zero, a1 = zero, a2 = zero;
            for (int c = 0; c < C; c++) {
                __m512i v = _mm512_permutexvar_epi32(_mm512_loadu_si512((const void *)(I + 16 * c)), px16);
                v = _mm512_shuffle_epi8(v, transpose);
                a0 = _mm512_dpbusd_epi32(a0, v, _mm512_loadu_si512((const void *)(K + 192 * c)));
                a1 = _mm512_dpbusd_epi32(a1, v, _mm512_loadu_si512((const void *)(K + 192 * c + 64)));
                a2 = _mm512_dpbusd_epi32(a2, v, _mm512_loadu_si512((const void *)(K + 192 * c + 128)));
            }
            __m512i acc = _mm512_add_epi32(_mm512_slli_epi32(a2, 16), _mm512_slli_epi32(a1, 8));
            acc = _mm512_add_epi32(_mm512_add_epi32(acc, a0), half);
            acc = _mm512_max_epi32(_mm512_srai_epi32(acc, PREC), zero);
            __m128i bytes = _mm512_cvtusepi32_epi8(acc); /* 0..255 after the max; above 255 saturates */
            store4px(o, (size_t)first[g], bytes, oc);
        }
    }
}

/* Vertical pass, AVX-512BW: the same integer sums from 16-bit multiplies. A weight k (22-bit
 * fixed point, |k| <= 2^22 or a little more) is split as k = kh * 2^11 + kl with kl in [0, 2^11),
 * both fitting int16; vpmaddwd multiplies a pair of taps' samples by their kh (or kl) and
 * adds them, exactly, and (sum_h << 11) + sum_l is the same 32-bit sum the 32-bit multiplies
 * give (two's complement wraps alike), so the results are Pillow's bit for bit. A 512-bit
 * vpmaddwd does 32 multiplies in one micro-op where vpmulld does 16 in two. */
#define SPLIT_HI(k) ((int16_t)((k) >> 11))
#define SPLIT_LO(k) ((int16_t)((k) & 2047))

/* 32 samples of an output row at a time, input rows taken in pairs (interleaved to int16
 * pairs, two vpmaddwd per pair: kh, kl); the row's end by masked loads and stores. Returns 1
 * when a weight does not split into int16 halves (the caller uses the AVX2 pass), -2 when out
 * of memory. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx2"))) static int vpass_bw(const uint8_t *in, size_t stride, int len,
                                                                   int base, const weights *w, int top, int th,
                                                                   uint8_t *out, size_t out_stride) {
    for (size_t i = 0; i < (size_t)(top + th) * w->ksize; i++)
        if (w->k[i] >= (1 << 25) || w->k[i] <= -(1 << 25)) return 1;
    int Q = (w->ksize + 1) / 2;
    int32_t *kp = malloc(sizeof(int32_t) * 2 * (size_t)Q); /* per pair: (kh0, kh1), (kl0, kl1) as int16 pairs */
    if (!kp) return -2;
    const __m512i half = _mm512_set1_epi32(HALF), zero = _mm512_setzero_si512();
    for (int i = 0; i < th; i++) {
        const int32_t *k = w->k + (size_t)(top + i) * w->ksize;
        const uint8_t *r0 = in + (size_t)(w->lo[top + i] - base) * stride;
        int n = w->n[top + i], pairs = (n + 1) / 2;
        for (int q = 0; q < pairs; q++) {
            int32_t k0 = k[2 * q], k1 = 2 * q + 1 < n ? k[2 * q + 1] : 0;
            kp[2 * q] = (int32_t)(((uint32_t)(uint16_t)SPLIT_HI(k1) << 16) | (uint16_t)SPLIT_HI(k0));
            kp[2 * q + 1] = (int32_t)(((uint32_t)(uint16_t)SPLIT_LO(k1) << 16) | (uint16_t)SPLIT_LO(k0));
        }
        uint8_t *o = out + (size_t)i * out_stride;
        for (int x = 0; x < len; x += 32) {
            __mmask32 m = len - x >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << (len - x)) - 1);
            __m512i hl = zero, hh = zero, ll = zero, lh = zero;
            for (int q = 0; q < pairs; q++) {
                const uint8_t *ra = r0 + (size_t)(2 * q) * stride + x;
                const uint8_t *rb = 2 * q + 1 < n ? ra + stride : ra; /* an odd last tap: weight 0 */
                __m512i A = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(m, ra));
                __m512i B = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(m, rb));
                __m512i lo = _mm512_unpacklo_epi16(A, B), hi = _mm512_unpackhi_epi16(A, B);
                __m512i KH = _mm512_set1_epi32(kp[2 * q]), KL = _mm512_set1_epi32(kp[2 * q + 1]);
                hl = _mm512_add_epi32(hl, _mm512_madd_epi16(lo, KH));
                hh = _mm512_add_epi32(hh, _mm512_madd_epi16(hi, KH));
                ll = _mm512_add_epi32(ll, _mm512_madd_epi16(lo, KL));
                lh = _mm512_add_epi32(lh, _mm512_madd_epi16(hi, KL));
            }
            __m512i vl = _mm512_srai_epi32(_mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(hl, 11), ll), half), PREC);
            __m512i vh = _mm512_srai_epi32(_mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(hh, 11), lh), half), PREC);
            __m512i v = _mm512_max_epi16(_mm512_packs_epi32(vl, vh), zero); /* in order: unpack and pack both in-lane */
            _mm256_mask_storeu_epi8(o + x, m, _mm512_cvtusepi16_epi8(v));
        }
    }
    free(kp);
    return 0;
}

/* Vertical pass, AVX2: 16 samples of an output row at a time, the sums kept in registers
 * across the taps. */
__attribute__((target("avx2"))) static void vpass_avx2(const uint8_t *in, size_t stride, int len, int base,
                                                      const weights *w, int top, int th, uint8_t *out,
                                                      size_t out_stride) {
    const __m256i half = _mm256_set1_epi32(HALF);
    for (int i = 0; i < th; i++) {
        const int32_t *k = w->k + (size_t)(top + i) * w->ksize;
        const uint8_t *r0 = in + (size_t)(w->lo[top + i] - base) * stride;
        int n = w->n[top + i], x = 0;
        uint8_t *o = out + (size_t)i * out_stride;
        for (; x + 16 <= len; x += 16) {
            __m256i a = half, b = half;
            for (int t = 0; t < n; t++) {
                const uint8_t *r = r0 + (size_t)t * stride + x;
                __m256i kt = _mm256_set1_epi32(k[t]);
                a = _mm256_add_epi32(a, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)r)), kt));
                b = _mm256_add_epi32(b, _mm256_mullo_epi32(
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(r + 8))), kt));
            }
            a = _mm256_srai_epi32(a, PREC);
            b = _mm256_srai_epi32(b, PREC);
            __m256i v = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xd8); /* 16 int16 in order */
            __m128i bytes = _mm_packus_epi16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
            _mm_storeu_si128((__m128i *)(o + x), bytes);
        }
        for (; x < len; x++) {
            int32_t s = HALF;
            for (int t = 0; t < n; t++) s += r0[(size_t)t * stride + x] * k[t];
            o[x] = clip8(s);
        }
    }
}
#endif

/* Vertical pass over rows of `len` samples (stride `stride`): output row i takes rows
 * [lo[top + i] - base, + n) of `in`; acc holds len sums. */
static void vpass_scalar(const uint8_t *restrict in, size_t stride, int len, int base, const weights *w, int top,
                         int th, int32_t *restrict acc, uint8_t *restrict out, size_t out_stride) {
    for (int i = 0; i < th; i++) {
        const int32_t *k = w->k + (size_t)(top + i) * w->ksize;
        const uint8_t *r0 = in + (size_t)(w->lo[top + i] - base) * stride;
        int n = w->n[top + i];
        for (int x = 0; x < len; x++) acc[x] = HALF;
        for (int t = 0; t < n; t++) {
            const uint8_t *r = r0 + (size_t)t * stride;
            int32_t kt = k[t];
            for (int x = 0; x < len; x++) acc[x] += r[x] * kt;
        }
        uint8_t *o = out + (size_t)i * out_stride;
        for (int x = 0; x < len; x++) o[x] = clip8(acc[x]);
    }
}

/* Copy rows of `w` pixels from c channels to dc channels (dc <= c: the first dc kept). */
static void pack_rows(const uint8_t *in, size_t stride, int c, int h, int w, uint8_t *dst, int dc) {
    for (int y = 0; y < h; y++) {
        const uint8_t *r = in + (size_t)y * stride;
        uint8_t *o = dst + (size_t)y * w * dc;
        if (c == dc) {
            memcpy(o, r, (size_t)w * c);
            continue;
        }
        for (int x = 0; x < w; x++)
            for (int ch = 0; ch < dc; ch++) o[x * dc + ch] = r[x * c + ch];
    }
}

/* Per-thread scratch memory for the intermediate rows, kept between calls: a fresh
 * allocation of a few hundred KB per image is a fresh mapping, and its page faults cost as
 * much as the resize itself. Beside it, the last weights of each side and the last VNNI
 * tables (a batch's images mostly share their sizes). Freed when the thread ends. */
#ifdef SF_RESAMPLE_PTHREAD
typedef struct {
    uint8_t *p;
    size_t cap;
    weights_slot wv, wh;
    vnni_plan plan;
} scratch_t;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_ok = 0;

static void scratch_free(void *v) {
    scratch_t *s = v;
    if (s) {
        free(s->p);
        weights_free(&s->wv.w);
        weights_free(&s->wh.w);
        vnni_plan_free(&s->plan);
    }
    free(s);
}

static void scratch_init(void) { scratch_ok = pthread_key_create(&scratch_key, scratch_free) == 0; }
#endif

#define SCRATCH_KEEP ((size_t)64 << 20) /* larger needs are allocated and freed per call */

#ifdef SF_RESAMPLE_PTHREAD
/* This thread's scratch_t, made on first use; NULL when that fails. */
static scratch_t *thread_scratch(void) {
    pthread_once(&scratch_once, scratch_init);
    if (!scratch_ok) return NULL;
    scratch_t *s = pthread_getspecific(scratch_key);
    if (!s) {
        s = calloc(1, sizeof(*s));
        if (!s) return NULL;
        if (pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    return s;
}
#endif

/* Weights for in -> out with filter: the slot's when it holds them, else made into the slot
 * (slot NULL: into *own, which the caller frees). *w points at them. 0, -1 bad filter, -2. */
static int weights_cached(weights_slot *slot, int in, int out, int filter, weights *own, const weights **w) {
    if (!slot) {
        *w = own;
        return weights_make(in, out, filter, own);
    }
    if (!(slot->valid && slot->in == in && slot->out == out && slot->filter == filter)) {
        if (slot->valid) weights_free(&slot->w);
        slot->valid = 0;
        int rc = weights_make(in, out, filter, &slot->w);
        if (rc != 0) return rc;
        slot->valid = 1;
        slot->in = in;
        slot->out = out;
        slot->filter = filter;
    }
    *w = &slot->w;
    return 0;
}

/* `len` bytes of scratch; *owned is set when the caller must free the result. */
static uint8_t *scratch_get(size_t len, int *owned) {
    *owned = 0;
#ifdef SF_RESAMPLE_PTHREAD
    scratch_t *s = len <= SCRATCH_KEEP ? thread_scratch() : NULL;
    if (s) {
        if (s->cap < len) {
            size_t cap = len < ((size_t)1 << 20) ? ((size_t)1 << 20) : len;
            uint8_t *p = malloc(cap);
            if (!p) return NULL;
            free(s->p);
            s->p = p;
            s->cap = cap;
        }
        return s->p;
    }
#endif
    *owned = 1;
    return malloc(len);
}

/* The widest vector path this CPU has: 4 AVX-512 with BW, VL and VNNI, 3 AVX-512F, 2 AVX2, 1 SSE4.1, 0 scalar;
 * lowered by the environment variable SHARDFEED_RESAMPLE_ISA ("avx512vnni", "avx512", "avx2",
 * "sse4.1" or "scalar"),
 * read once, so tests can run every path on one machine. */
static int isa_level(void) {
    static int level = -1;
    if (level >= 0) return level;
    int have = 0;
#ifdef SF_RESAMPLE_X86
    have = __builtin_cpu_supports("avx2") ? 2 : __builtin_cpu_supports("sse4.1") ? 1 : 0;
    if (have == 2 && __builtin_cpu_supports("avx512f")) have = 3;
    if (have == 3 && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512vnni"))
        have = 4;
#endif
    const char *want = getenv("SHARDFEED_RESAMPLE_ISA");
    if (want && strcmp(want, "scalar") == 0) have = 0;
    else if (want && strcmp(want, "sse4.1") == 0 && have > 1) have = 1;
    else if (want && strcmp(want, "avx2") == 0 && have > 2) have = 2;
    else if (want && strcmp(want, "avx512") == 0 && have > 3) have = 3;
    level = have; /* a benign race: every thread computes the same value */
    return level;
}

const char *sf_resample_backend(void) {
    static const char *names[] = {"scalar", "sse4.1", "avx2", "avx512", "avx512vnni"};
    return names[isa_level()];
}

int sf_resample(const uint8_t *src, int sh, int sw, int sc, uint8_t *dst, int th, int tw, int dc, int scaled_h,
                int scaled_w, int top, int left, int filter) {
    /* top > scaled_h - th, not top + th > scaled_h: an offset near INT_MAX would overflow */
    if (sh <= 0 || sw <= 0 || th <= 0 || tw <= 0 || scaled_h <= 0 || scaled_w <= 0 || top < 0 || left < 0 ||
        top > scaled_h - th || left > scaled_w - tw || !(sc == 1 || sc == 3 || sc == 4) ||
        !(dc == sc || (dc == 3 && sc == 4)) || filter < SF_FILTER_BOX || filter > SF_FILTER_LANCZOS)
        return -1;
    int need_h = scaled_w != sw, need_v = scaled_h != sh;
    weights wv = {0}, wh = {0}; /* made here when this thread keeps none */
    const weights *pwv = &wv, *pwh = &wh;
    weights_slot *slot_v = NULL, *slot_h = NULL;
    vnni_plan own_plan = {0}, *plan = &own_plan;
#ifdef SF_RESAMPLE_PTHREAD
    scratch_t *ts = thread_scratch();
    if (ts) {
        slot_v = &ts->wv;
        slot_h = &ts->wh;
        plan = &ts->plan;
    }
#endif
    uint8_t *tmp = NULL, *rows = NULL;
    int32_t *acc = NULL;
    int rc = 0, tmp_owned = 0;
    const uint8_t *mid = src + (size_t)left * sc; /* the horizontally resized rows, or src itself */
    size_t mid_stride = (size_t)sw * sc;
    int mc = sc;      /* channels of mid */
    int mid_base = 0; /* the source row mid's first row stands for */
    if (!need_h && !need_v) {
        pack_rows(src + ((size_t)top * sw + left) * sc, mid_stride, sc, th, tw, dst, dc);
        return 0;
    }
    if (need_v && (rc = weights_cached(slot_v, sh, scaled_h, filter, &wv, &pwv)) != 0) return rc;
    if (need_h) {
        int y0 = top, y1 = top + th;
        if (need_v) {
            y0 = pwv->lo[top];
            y1 = pwv->lo[top + th - 1] + pwv->n[top + th - 1];
        }
        if ((rc = weights_cached(slot_h, sw, scaled_w, filter, &wh, &pwh)) != 0) goto done;
        mc = dc; /* the horizontal pass already drops the padding byte */
        tmp = scratch_get((size_t)(y1 - y0 > 0 ? y1 - y0 : 1) * tw * mc + 1, &tmp_owned);
        if (!tmp) {
            rc = -2;
            goto done;
        }
        int wide = 1, isa = isa_level();
        (void)isa; /* only the x86 paths look at it */
#ifdef SF_RESAMPLE_X86
        if (sc == 4 && isa >= 4) {
            if (!(plan->valid && plan->sw == sw && plan->scaled_w == scaled_w && plan->filter == filter &&
                  plan->left == left && plan->tw == tw)) {
                vnni_plan_free(plan);
                int prc = vnni_plan_make(pwh, sw, left, tw, plan);
                if (prc < 0) {
                    rc = prc;
                    goto done;
                }
                plan->rc = prc;
                plan->sw = sw;
                plan->scaled_w = scaled_w;
                plan->filter = filter;
                plan->left = left;
                plan->tw = tw;
                plan->valid = 1;
            }
            if (plan->rc == 0) {
                hpass4_vnni(src, sw, y0, y1, plan, tw, tmp, mc);
                wide = 0;
            }
        }
        if (wide > 0 && sc == 4 && isa >= 3) wide = hpass4_gather512(src, sw, y0, y1, pwh, left, tw, tmp, mc);
        if (wide > 0 && sc == 4 && isa >= 3) wide = hpass4_avx512(src, sw, y0, y1, pwh, left, tw, tmp, mc);
        if (wide > 0 && sc == 4 && isa >= 2) wide = hpass4_avx2(src, sw, y0, y1, pwh, left, tw, tmp, mc);
        if (wide < 0) {
            rc = wide;
            goto done;
        }
        if (wide && sc == 4 && isa >= 1) {
            hpass4_sse41(src, sw, y0, y1, pwh, left, tw, tmp, mc);
            wide = 0;
        }
#endif
        if (wide) hpass_scalar(src, sw, sc, y0, y1, pwh, left, tw, tmp, mc);
        mid = tmp;
        mid_stride = (size_t)tw * mc;
        mid_base = y0;
    }
    if (need_v) {
        uint8_t *vout = dst;
        if (mc != dc) { /* only without a horizontal pass (tmp unused): RGBX source rows */
            rows = malloc((size_t)th * tw * mc);
            if (!rows) {
                rc = -2;
                goto done;
            }
            vout = rows;
        }
        int narrow = 1; /* still to do by the scalar pass */
#ifdef SF_RESAMPLE_X86
        if (isa_level() >= 4 &&
            (narrow = vpass_bw(mid, mid_stride, tw * mc, mid_base, pwv, top, th, vout, (size_t)tw * mc)) < 0) {
            rc = narrow;
            goto done;
        }
        if (narrow && isa_level() >= 2) {
            vpass_avx2(mid, mid_stride, tw * mc, mid_base, pwv, top, th, vout, (size_t)tw * mc);
            narrow = 0;
        }
#endif
        if (narrow) {
            acc = malloc(sizeof(int32_t) * (size_t)tw * mc);
            if (!acc) {
                rc = -2;
                goto done;
            }
            vpass_scalar(mid, mid_stride, tw * mc, mid_base, pwv, top, th, acc, vout, (size_t)tw * mc);
        }
        if (rows) pack_rows(rows, (size_t)tw * mc, mc, th, tw, dst, dc);
    } else {
        pack_rows(mid, mid_stride, mc, th, tw, dst, dc); /* rows [top, top + th) were resized into tmp */
    }
done:
    free(acc);
    free(rows);
    if (tmp_owned) free(tmp);
    weights_free(&wv);
    weights_free(&wh);
    if (plan == &own_plan) vnni_plan_free(&own_plan);
    return rc;
}

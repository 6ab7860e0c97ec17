/* libFuzzer harness for resample.c (sf_resample): every ISA path the CPU has (scalar,
 * SSE4.1, AVX2, AVX-512, AVX-512 VNNI; resample_isa.c builds one copy of resample.c per level) on one
 * input, checked to give identical bytes, to write nothing outside the destination (guard
 * bytes on both sides) and, under AddressSanitizer, to read nothing outside the source (an
 * exact-size allocation). Arguments the binding (module.c py_resample) passes on but that are
 * out of range (windows past the resized image, offsets near INT_MAX, bad channels or filter)
 * must be refused with -1 and leave the destination untouched. (Hostile scaled sizes are
 * non-positive only: a valid window of a huge resized image is accepted and its weights,
 * made for the whole resized side, would need gigabytes.)
 *
 * Input: byte 0: filter (bits 0-2, taken mod 5), channel layout (bits 3-4: 1->1, 3->3, 4->4,
 * 4->3); bytes 1-2: source height and width (1..64); bytes 3-4: resized height and width
 * (1..128, so both down- and upscaling); bytes 5-8: window height, width, top and left
 * within the resized image (edge windows and the whole image included); byte 9: when its
 * top bits are set, one argument is replaced by a hostile value (see hostile()); rest: the
 * source pixels (repeated when short). */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "resample.h"

int sf_resample_isa0(const uint8_t *, int, int, int, uint8_t *, int, int, int, int, int, int, int, int);
int sf_resample_isa1(const uint8_t *, int, int, int, uint8_t *, int, int, int, int, int, int, int, int);
int sf_resample_isa2(const uint8_t *, int, int, int, uint8_t *, int, int, int, int, int, int, int, int);
int sf_resample_isa3(const uint8_t *, int, int, int, uint8_t *, int, int, int, int, int, int, int, int);
int sf_resample_isa4(const uint8_t *, int, int, int, uint8_t *, int, int, int, int, int, int, int, int);
const char *sf_resample_backend_isa0(void);
const char *sf_resample_backend_isa1(void);
const char *sf_resample_backend_isa2(void);
const char *sf_resample_backend_isa3(void);
const char *sf_resample_backend_isa4(void);

typedef int (*resample_fn)(const uint8_t *, int, int, int, uint8_t *, int, int, int, int, int, int, int, int);
static const resample_fn FNS[5] = {sf_resample_isa0, sf_resample_isa1, sf_resample_isa2, sf_resample_isa3,
                                   sf_resample_isa4};
static const char *(*const BACKENDS[5])(void) = {sf_resample_backend_isa0, sf_resample_backend_isa1,
                                                 sf_resample_backend_isa2, sf_resample_backend_isa3,
                                                 sf_resample_backend_isa4};
static const char *const NAMES[5] = {"scalar", "sse4.1", "avx2", "avx512", "avx512vnni"};

#define GUARD 64
#define GUARD_BYTE 0xA5

static void fail(const char *what, const char *isa, int sh, int sw, int sc, int th, int tw, int dc, int scaled_h,
                 int scaled_w, int top, int left, int filter) {
    fprintf(stderr,
            "fuzz_resample: %s (%s): src %dx%dx%d -> resized %dx%d, window %dx%d at (%d, %d), dc %d, filter %d\n",
            what, isa, sh, sw, sc, scaled_h, scaled_w, th, tw, top, left, dc, filter);
    abort();
}

/* Replace one of the window/size/format arguments by a value the binding passes through to
 * sf_resample (it checks only positive sizes and the buffer lengths). */
static void hostile(uint8_t sel, int *sc, int *dc, int *scaled_h, int *scaled_w, int *th, int *tw, int *top,
                    int *left, int *filter) {
    static const int big[] = {INT_MAX, INT_MAX - 1, INT_MAX - 63, INT_MIN, -1, 0};
    int v = big[(sel >> 3) % 6];
    switch (sel & 7) {
        case 0: *top = v; break;
        case 1: *left = v; break;
        case 2: *top = *scaled_h - *th + 1; break; /* one row past the end */
        case 3: *left = *scaled_w - *tw + 1; break;
        case 4: *scaled_h = (sel >> 3) & 1 ? (v > 0 ? -v : v) : *top + *th - 1; break;
        case 5: *scaled_w = (sel >> 3) & 1 ? (v > 0 ? -v : v) : *left + *tw - 1; break;
        case 6: *filter = (sel >> 3) % 2 ? 0 : 6 + (sel >> 4); break;
        default: /* channel layouts no caller has: 2, 5 channels, 1 -> 3, 3 -> 1, 4 -> 4 with dc 1 */
            switch ((sel >> 3) % 5) {
                case 0: *sc = 2; *dc = 2; break;
                case 1: *sc = 5; *dc = 3; break;
                case 2: *sc = 1; *dc = 3; break;
                case 3: *sc = 3; *dc = 1; break;
                default: *dc = 1; *sc = 4; break;
            }
    }
}

/* What sf_resample must accept, worked out in 64-bit arithmetic. */
static int valid(int sc, int dc, int scaled_h, int scaled_w, int th, int tw, int top, int left, int filter) {
    if (th <= 0 || tw <= 0 || scaled_h <= 0 || scaled_w <= 0 || top < 0 || left < 0) return 0;
    if ((int64_t)top + th > scaled_h || (int64_t)left + tw > scaled_w) return 0;
    if (!(sc == 1 || sc == 3 || sc == 4) || !(dc == sc || (dc == 3 && sc == 4))) return 0;
    return filter >= SF_FILTER_BOX && filter <= SF_FILTER_LANCZOS;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 10) return 0;
    static const int layouts[4][2] = {{1, 1}, {3, 3}, {4, 4}, {4, 3}};
    int filter = 1 + (data[0] & 7) % 5;
    int sc = layouts[(data[0] >> 3) & 3][0], dc = layouts[(data[0] >> 3) & 3][1];
    int sh = 1 + data[1] % 64, sw = 1 + data[2] % 64;
    int scaled_h = 1 + data[3] % 128, scaled_w = 1 + data[4] % 128;
    int th = 1 + data[5] % scaled_h, tw = 1 + data[6] % scaled_w;
    int top = data[7] % (scaled_h - th + 1), left = data[8] % (scaled_w - tw + 1);
    int hostile_arg = data[9] >= 0xE0; /* 1 in 8 inputs */
    if (hostile_arg) hostile(data[9] * 37 + data[0], &sc, &dc, &scaled_h, &scaled_w, &th, &tw, &top, &left, &filter);
    /* the binding refuses non-positive sizes and buffers shorter than their sizes say, so the
     * buffers here are exactly sh*sw*sc and th*tw*dc (sizes above stay small unless refused) */
    int ok = valid(sc, dc, scaled_h, scaled_w, th, tw, top, left, filter);
    size_t slen = (size_t)sh * sw * sc, dlen = (size_t)th * tw * dc; /* th, tw 1..128; sc, dc 1..5 */
    uint8_t *src = malloc(slen);
    const uint8_t *pix = data + 10;
    size_t npix = size - 10;
    for (size_t i = 0; i < slen; i++) src[i] = npix ? pix[i % npix] : (uint8_t)(i * 131);
    uint8_t *ref = NULL;
    int ran = 0;
    for (int isa = 0; isa < 5; isa++) {
        const char *backend = BACKENDS[isa]();
        if (strcmp(backend, NAMES[isa]) != 0) continue; /* the CPU lacks it: already ran as a lower level */
        uint8_t *buf = malloc(dlen + 2 * GUARD);
        memset(buf, GUARD_BYTE, dlen + 2 * GUARD);
        int rc = FNS[isa](src, sh, sw, sc, buf + GUARD, th, tw, dc, scaled_h, scaled_w, top, left, filter);
        for (size_t i = 0; i < GUARD; i++)
            if (buf[i] != GUARD_BYTE || buf[GUARD + dlen + i] != GUARD_BYTE)
                fail("wrote outside the destination", backend, sh, sw, sc, th, tw, dc, scaled_h, scaled_w, top, left,
                     filter);
        if (!ok) {
            if (rc != -1)
                fail("accepted bad arguments", backend, sh, sw, sc, th, tw, dc, scaled_h, scaled_w, top, left, filter);
            for (size_t i = 0; i < dlen; i++)
                if (buf[GUARD + i] != GUARD_BYTE)
                    fail("refused but wrote", backend, sh, sw, sc, th, tw, dc, scaled_h, scaled_w, top, left, filter);
            free(buf);
            continue;
        }
        if (rc != 0) fail("refused good arguments", backend, sh, sw, sc, th, tw, dc, scaled_h, scaled_w, top, left, filter);
        if (!ref) {
            ref = buf;
        } else {
            if (memcmp(ref + GUARD, buf + GUARD, dlen) != 0)
                fail("differs from the scalar path", backend, sh, sw, sc, th, tw, dc, scaled_h, scaled_w, top, left,
                     filter);
            free(buf);
        }
        ran++;
    }
    if (ok && !hostile_arg && ran == 0) fail("no path ran", "-", sh, sw, sc, th, tw, dc, scaled_h, scaled_w, top, left, filter);
    free(ref);
    free(src);
    return 0;
}

/* Convolution resize of 8-bit interleaved images, value for value what Pillow's
 * Image.resize gives with its box, bilinear, hamming, bicubic and lanczos filters (same
 * coefficients, same 22-bit fixed point, same order of passes: horizontal, then vertical),
 * with an optional crop of the resized image; plain C, no Python. */
#ifndef SHARDFEED_RESAMPLE_H
#define SHARDFEED_RESAMPLE_H

#include <stddef.h>
#include <stdint.h>

#define SF_FILTER_BOX 1
#define SF_FILTER_BILINEAR 2
#define SF_FILTER_HAMMING 3
#define SF_FILTER_BICUBIC 4
#define SF_FILTER_LANCZOS 5

/* Resize src (sh x sw pixels of sc channels, rows contiguous) to scaled_h x scaled_w and
 * write the window rows [top, top + th) x columns [left, left + tw) of that result to dst
 * (th x tw pixels of dc channels, rows contiguous). sc is 1, 3 or 4 (4: the fourth byte is
 * padding, as libjpeg-turbo's RGBX); dc is 1 with sc 1, or 3 with sc 3 or 4. Returns 0,
 * -1 on bad arguments, -2 when out of memory. */
int sf_resample(const uint8_t *src, int sh, int sw, int sc, uint8_t *dst, int th, int tw, int dc,
                int scaled_h, int scaled_w, int top, int left, int filter);

/* "avx512vnni", "avx512", "avx2", "sse4.1" or "scalar": which horizontal pass sf_resample uses for 4-channel sources. */
const char *sf_resample_backend(void);

#endif

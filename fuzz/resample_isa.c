/* resample.c built with its ISA level fixed, for fuzz_resample.c: compile this file once per
 * level with -DSF_FUZZ_ISA=0 (scalar), 1 (sse4.1), 2 (avx2), 3 (avx512) or 4 (avx512vnni); each copy exports
 * sf_resample_isaN / sf_resample_backend_isaN (a CPU without the level runs the widest it has,
 * and the backend name says which ran). The per-thread scratch buffer is left out
 * (_WIN32 path): every intermediate buffer is its own exact-size malloc, so AddressSanitizer
 * sees an access past the horizontal pass's rows too. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#endif

#ifndef SF_FUZZ_ISA
#error "define SF_FUZZ_ISA (0..4)"
#endif

static const char *const sf_fuzz_isa_names[] = {"scalar", "sse4.1", "avx2", "avx512", "avx512vnni"};

static char *sf_fuzz_getenv(const char *name) {
    if (strcmp(name, "SHARDFEED_RESAMPLE_ISA") == 0) return (char *)sf_fuzz_isa_names[SF_FUZZ_ISA];
    return getenv(name);
}

#define SF_FUZZ_CAT2(a, b) a##b
#define SF_FUZZ_CAT(a, b) SF_FUZZ_CAT2(a, b)
#define getenv sf_fuzz_getenv
#define sf_resample SF_FUZZ_CAT(sf_resample_isa, SF_FUZZ_ISA)
#define sf_resample_backend SF_FUZZ_CAT(sf_resample_backend_isa, SF_FUZZ_ISA)
#ifndef _WIN32
#define _WIN32 1 /* no pthread scratch: exact-size buffers */
#endif
#include "resample.c"

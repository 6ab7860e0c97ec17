/* A main() for the libFuzzer harnesses where clang has no libFuzzer runtime (build with gcc
 * -fsanitize=address,undefined): runs every file named (or every file in a folder named),
 * then -runs=N inputs (default 100000) made by mutating those files (bit flips, byte sets,
 * inserted and removed bytes, a splice of two) or, without files, random bytes; -seed=S,
 * -max_len=L (default 4096) and -max_total_time=SECONDS (stop early; 0: no limit). A crash aborts with the sanitizer's report; the input being
 * run is written to ./crash-standalone (-artifact=PATH to change) when a sanitizer reports
 * or the harness aborts. Prints the count of inputs run. */
#include <dirent.h>
#include <sanitizer/common_interface_defs.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint8_t **seeds;
static size_t *seed_len, nseeds, seeds_cap;

static void add_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) n = 0;
    fclose(f);
    if (nseeds == seeds_cap) {
        seeds_cap = seeds_cap ? 2 * seeds_cap : 64;
        seeds = realloc(seeds, seeds_cap * sizeof(*seeds));
        seed_len = realloc(seed_len, seeds_cap * sizeof(*seed_len));
    }
    seeds[nseeds] = buf;
    seed_len[nseeds++] = (size_t)n;
}

static void add_path(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return;
    if (!S_ISDIR(st.st_mode)) {
        add_file(path);
        return;
    }
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char full[4096];
        snprintf(full, sizeof(full), "%s/%s", path, e->d_name);
        add_path(full);
    }
    if (d) closedir(d);
}

static uint64_t rng_state;
static uint64_t rnd(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* UBSan's reports end in abort(), caught below to keep the input (its death callback is not run) */
const char *__ubsan_default_options(void) { return "abort_on_error=1:print_stacktrace=1"; }

static const char *artifact = "crash-standalone";

static const uint8_t *current;
static size_t current_len;

static void save_current(void) {
    FILE *f = fopen(artifact, "wb");
    if (f) {
        fwrite(current, 1, current_len, f);
        fclose(f);
        fprintf(stderr, "standalone_driver: the input is in %s\n", artifact);
    }
}

static void on_abort(int sig) {
    save_current();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void run(const uint8_t *data, size_t n) {
    current = data;
    current_len = n;
    uint8_t *copy = malloc(n ? n : 1); /* exact size, so the harness's over-reads are caught */
    memcpy(copy, data, n);
    LLVMFuzzerTestOneInput(copy, n);
    free(copy);
}

int main(int argc, char **argv) {
    long runs = 100000;
    size_t max_len = 4096;
    double max_time = 0;
    rng_state = 1;
    __sanitizer_set_death_callback(save_current);
    signal(SIGABRT, on_abort);
    signal(SIGSEGV, on_abort);
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "-runs=", 6) == 0) runs = atol(argv[i] + 6);
        else if (strncmp(argv[i], "-seed=", 6) == 0) rng_state = strtoull(argv[i] + 6, NULL, 10);
        else if (strncmp(argv[i], "-max_len=", 9) == 0) max_len = (size_t)atol(argv[i] + 9);
        else if (strncmp(argv[i], "-artifact=", 10) == 0) artifact = argv[i] + 10;
        else if (strncmp(argv[i], "-max_total_time=", 16) == 0) max_time = atof(argv[i] + 16);
        else add_path(argv[i]);
    }
    long done = 0, generated = 0;
    time_t start = time(NULL);
    for (size_t i = 0; i < nseeds; i++, done++) run(seeds[i], seed_len[i]);
    uint8_t *buf = malloc(max_len + 1);
    for (long r = 0; r < runs; r++, done++, generated++) {
        if (max_time > 0 && (r & 255) == 0 && difftime(time(NULL), start) >= max_time) break;
        size_t n;
        if (!nseeds || rnd() % 8 == 0) { /* fresh random bytes */
            n = (size_t)(rnd() % (max_len + 1));
            for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)rnd();
        } else {
            size_t s = (size_t)(rnd() % nseeds);
            n = seed_len[s] < max_len ? seed_len[s] : max_len;
            memcpy(buf, seeds[s], n);
            int edits = 1 + (int)(rnd() % 8);
            for (int e = 0; e < edits; e++) {
                switch (rnd() % 5) {
                    case 0: if (n) buf[rnd() % n] ^= (uint8_t)(1u << (rnd() % 8)); break;
                    case 1: if (n) buf[rnd() % n] = (uint8_t)rnd(); break;
                    case 2: if (n < max_len) { size_t at = (size_t)(rnd() % (n + 1));
                            memmove(buf + at + 1, buf + at, n - at); buf[at] = (uint8_t)rnd(); n++; } break;
                    case 3: if (n) { size_t at = (size_t)(rnd() % n); memmove(buf + at, buf + at + 1, n - at - 1); n--; }
                            break;
                    default: { /* splice: the tail of another seed */
                        size_t o = (size_t)(rnd() % nseeds), at = n ? (size_t)(rnd() % n) : 0;
                        size_t from = seed_len[o] ? (size_t)(rnd() % seed_len[o]) : 0, k = seed_len[o] - from;
                        if (at + k > max_len) k = max_len - at;
                        memcpy(buf + at, seeds[o] + from, k);
                        n = at + k;
                    }
                }
            }
        }
        run(buf, n);
    }
    printf("standalone_driver: %ld inputs run (%zu files, %ld generated), no crash\n", done, nseeds, generated);
    return 0;
}

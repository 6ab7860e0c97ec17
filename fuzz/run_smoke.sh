#!/usr/bin/env bash
# Build the libFuzzer harnesses (AddressSanitizer + UndefinedBehaviorSanitizer) against the
# native core's C sources and run each for FUZZ_SECONDS (default 30) from the seed corpus.
# Where clang has no libFuzzer runtime (Debian's clang 14 without libclang-rt-dev), the same
# harnesses are built with gcc -fsanitize=address,undefined and standalone_driver.c (seed
# corpus, then mutations of it for FUZZ_SECONDS). Exits non-zero when a harness finds a crash
# (the input is kept under $FUZZ_OUT); exits 0 with a SKIP line when neither can be built.
set -euo pipefail
cd "$(dirname "$0")"
SECS="${FUZZ_SECONDS:-30}"
OUT="${FUZZ_OUT:-$(mktemp -d -t shardfeed-fuzz.XXXXXX)}"
SRC=../src/shardfeed/_native
NAMES=(frames crcfuse example resample imgcheck imgrows permute gatherframes indextext)

if ! command -v clang >/dev/null 2>&1; then
  echo "clang not found; trying to install it with apt-get"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang) >/dev/null 2>&1 || true
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && command -v apt-get >/dev/null 2>&1; then
    (sudo -n apt-get update -qq && sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang) >/dev/null 2>&1 || true
  fi
fi

# build CC FLAGS... DRIVER: the harnesses into $OUT/fuzz_NAME (DRIVER: extra source with main, or "")
build() {
  local cc=$1 driver=$2
  shift 2
  "$cc" "$@" fuzz_frames.c $driver "$SRC/frames.c" "$SRC/crc32c.c" -o "$OUT/fuzz_frames"
  "$cc" "$@" fuzz_crcfuse.c $driver "$SRC/crcfuse.c" "$SRC/crc32c.c" -o "$OUT/fuzz_crcfuse"
  "$cc" "$@" fuzz_example.c $driver "$SRC/example_parse.c" -o "$OUT/fuzz_example"
  "$cc" "$@" fuzz_imgcheck.c $driver "$SRC/imgcheck.c" -o "$OUT/fuzz_imgcheck"
  "$cc" "$@" fuzz_imgrows.c $driver "$SRC/imgrows.c" "$SRC/imgcheck.c" "$SRC/crc32c.c" "$SRC/frames.c" \
    "$SRC/example_parse.c" -o "$OUT/fuzz_imgrows"
  "$cc" "$@" -DSF_PERMUTE_NO_PYTHON fuzz_permute.c $driver "$SRC/permute.c" -o "$OUT/fuzz_permute"
  "$cc" "$@" -DSF_GATHER_NO_PYTHON fuzz_gatherframes.c $driver "$SRC/gatherframes.c" "$SRC/crc32c.c" \
    -o "$OUT/fuzz_gatherframes"
  "$cc" "$@" -DSF_INDEXTEXT_NO_PYTHON fuzz_indextext.c $driver "$SRC/indextext.c" -o "$OUT/fuzz_indextext"
  for isa in 0 1 2 3 4; do # resample.c once per ISA level (resample_isa.c)
    "$cc" "$@" -c -DSF_FUZZ_ISA=$isa resample_isa.c -o "$OUT/resample_isa$isa.o"
  done
  "$cc" "$@" fuzz_resample.c $driver "$OUT"/resample_isa[0-4].o -lm -o "$OUT/fuzz_resample"
}

MODE=""
CFLAGS=(-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I"$SRC")
if command -v clang >/dev/null 2>&1 && echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' \
    | clang "${CFLAGS[@]}" -x c - -o "$OUT/probe" >/dev/null 2>&1; then
  MODE=libfuzzer
  build clang "" "${CFLAGS[@]}"
else
  GFLAGS=(-g -O1 -fsanitize=address,undefined -fno-sanitize-recover=undefined -I"$SRC")
  if command -v gcc >/dev/null 2>&1 && echo 'int main(void) { return 0; }' \
      | gcc "${GFLAGS[@]}" -x c - -o "$OUT/probe" >/dev/null 2>&1; then
    echo "clang has no libFuzzer runtime here: gcc ASan/UBSan with standalone_driver.c instead"
    MODE=standalone
    build gcc standalone_driver.c "${GFLAGS[@]}"
  else
    echo "SKIP: neither clang with libFuzzer nor gcc with AddressSanitizer is available; fuzzers not run"
    exit 0
  fi
fi

status=0
for name in "${NAMES[@]}"; do
  mkdir -p "$OUT/corpus-$name" "$OUT/crashes-$name"
  echo "== fuzz_$name for ${SECS}s, $MODE (artifacts in $OUT/crashes-$name)"
  if [ "$MODE" = libfuzzer ]; then
    cmd=("$OUT/fuzz_$name" -max_total_time="$SECS" -max_len=4096 -print_final_stats=1
         -artifact_prefix="$OUT/crashes-$name/" "$OUT/corpus-$name" "corpus/$name")
  else
    cmd=("$OUT/fuzz_$name" -max_total_time="$SECS" -runs=100000000 -max_len=4096
         -artifact="$OUT/crashes-$name/crash" "corpus/$name")
  fi
  if ! "${cmd[@]}" >"$OUT/fuzz_$name.log" 2>&1; then
    echo "FAIL: fuzz_$name found a crash:"
    grep -E "ERROR|SUMMARY|runtime error|fuzz_resample:|Test unit written|input is in" "$OUT/fuzz_$name.log" | head -20
    status=1
  else
    grep -E "stat::number_of_executed_units|Done|inputs run" "$OUT/fuzz_$name.log" | head -2
  fi
done
exit $status

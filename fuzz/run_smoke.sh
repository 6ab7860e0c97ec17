#!/usr/bin/env bash
# Build the libFuzzer harnesses (AddressSanitizer + UndefinedBehaviorSanitizer) against the
# native core's C sources and run each for FUZZ_SECONDS (default 30) from the seed corpus.
# Exits non-zero when a fuzzer finds a crash (the input is kept under $FUZZ_OUT); exits 0
# with a SKIP line when clang/libFuzzer is not available and cannot be installed.
set -euo pipefail
cd "$(dirname "$0")"
SECS="${FUZZ_SECONDS:-30}"
OUT="${FUZZ_OUT:-$(mktemp -d -t shardfeed-fuzz.XXXXXX)}"
SRC=../src/shardfeed/_native

if ! command -v clang >/dev/null 2>&1; then
  echo "clang not found; trying to install it with apt-get"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang) >/dev/null 2>&1 || true
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && command -v apt-get >/dev/null 2>&1; then
    (sudo -n apt-get update -qq && sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang) >/dev/null 2>&1 || true
  fi
fi
if ! command -v clang >/dev/null 2>&1; then
  echo "SKIP: clang is not available and could not be installed; fuzzers not run"
  exit 0
fi

CFLAGS=(-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I"$SRC")
if ! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' \
    | clang "${CFLAGS[@]}" -x c - -o "$OUT/probe" >/dev/null 2>&1; then
  echo "SKIP: this clang has no libFuzzer/ASan runtime; fuzzers not run"
  exit 0
fi

clang "${CFLAGS[@]}" fuzz_frames.c "$SRC/frames.c" "$SRC/crc32c.c" -o "$OUT/fuzz_frames"
clang "${CFLAGS[@]}" fuzz_example.c "$SRC/example_parse.c" -o "$OUT/fuzz_example"

status=0
for name in frames example; do
  mkdir -p "$OUT/corpus-$name" "$OUT/crashes-$name"
  echo "== fuzz_$name for ${SECS}s (artifacts in $OUT/crashes-$name)"
  if ! "$OUT/fuzz_$name" -max_total_time="$SECS" -max_len=4096 -print_final_stats=1 \
      -artifact_prefix="$OUT/crashes-$name/" "$OUT/corpus-$name" "corpus/$name" \
      >"$OUT/fuzz_$name.log" 2>&1; then
    echo "FAIL: fuzz_$name found a crash:"
    grep -E "ERROR|SUMMARY|Test unit written" "$OUT/fuzz_$name.log" | head -20
    status=1
  else
    grep -E "stat::number_of_executed_units|Done" "$OUT/fuzz_$name.log" | head -2
  fi
done
exit $status

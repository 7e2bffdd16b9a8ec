#!/usr/bin/env bash
# The `fuzz` test of ctest: the ELF/CFI reading of users' files (tests/fuzz/elf_exercise.h)
# under libFuzzer with AddressSanitizer and UndefinedBehaviorSanitizer, from the seed corpus
# the unit suite writes, for SECONDS (default 60). A crash, a leak, a timeout of 10 s on one
# input or more than 1 GiB of memory fails it; the input that did is kept in
# BUILD_DIR/fuzz/crashes/. A longer run: bash tests/fuzz.sh SOURCE_DIR BUILD_DIR 3600.
#   bash tests/fuzz.sh SOURCE_DIR BUILD_DIR [SECONDS]
set -euo pipefail
src=${1:?usage: tests/fuzz.sh SOURCE_DIR BUILD_DIR [SECONDS]}
main=${2:?usage: tests/fuzz.sh SOURCE_DIR BUILD_DIR [SECONDS]}
seconds=${3:-60}
work=$main/fuzz
rm -rf "$work/corpus" "$work/found"
mkdir -p "$work/corpus" "$work/found" "$work/crashes"
EMD_WRITE_ELF_CORPUS=$work/corpus "$main/tests/unit_tests" "[corpus]" >/dev/null
clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -I"$src/src/profile/include" -I"$src/bpf" -I"$src/tests/fuzz" \
  "$src/tests/fuzz/elf_fuzz.cpp" "$src/src/profile/symbols/elf_file.cpp" \
  "$src/src/profile/symbols/symbol_index.cpp" "$src/src/profile/tables/unwind_table.cpp" \
  -ldw -lelf -o "$work/elf_fuzz"
echo "seeds: $(ls "$work/corpus" | wc -l); fuzzing for $seconds s"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export LSAN_OPTIONS=suppressions=$src/tests/fuzz/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
"$work/elf_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=1024 \
  -artifact_prefix="$work/crashes/" -print_final_stats=1 "$work/found" "$work/corpus" \
  >"$work/fuzz.log" 2>&1 || status=$?
if ((status != 0)); then
  tail -n 60 "$work/fuzz.log"
  echo "fuzzing failed ($status); the input is in $work/crashes/"
else
  grep -E '^(#[0-9]+[[:space:]]+DONE|stat::average_exec_per_sec|stat::peak_rss_mb)' "$work/fuzz.log"
fi
exit "$status"

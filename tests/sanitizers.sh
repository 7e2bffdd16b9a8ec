#!/usr/bin/env bash
# The `sanitizers` test of ctest: the daemon and the unit suite built again with
# AddressSanitizer and UndefinedBehaviorSanitizer at -O1 (in BUILD_DIR/sanitizers), then the
# unit suite run under them, and the e2e cases tagged [sanitize] run (from BUILD_DIR) against
# that daemon. Any report ends the process with an error, so a finding fails the test.
# docs/testing.md says which timing and memory assertions are scaled or skipped under them,
# and why.
# The main build compiles the tree beforehand (`--build-only`, the `sanitizer_tree` target),
# so that here it is found up to date.
#   bash tests/sanitizers.sh [--build-only] SOURCE_DIR BUILD_DIR
set -euo pipefail
build_only=0
if [[ ${1:-} == --build-only ]]; then
  build_only=1
  shift
fi
src=${1:?usage: tests/sanitizers.sh [--build-only] SOURCE_DIR BUILD_DIR}
main=${2:?usage: tests/sanitizers.sh [--build-only] SOURCE_DIR BUILD_DIR}
build=$main/sanitizers
start=$SECONDS
# Warnings are not errors here: the main build (GCC) holds that line. The tree is built by
# clang, whose sanitizers are those of the fuzz stage, and which compiles it in less time
# than GCC: a second compiler's view of the code, too. The daemon's libraries are
# compiled as unity builds, 16 files a unit (the tracers, the generated protobuf code and the
# tests as files of their own). Line tables (-g1) are what the sanitizers' reports print.
# At -O1, as AddressSanitizer advises: the tree compiled alone in 267 s on 2 cores, and the
# unit suite ran in 56 s against 108 s at -O0, the e2e cases in 41 s against 72 s, measured
# in one session on one machine.
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=None -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_FLAGS="-O1 -g1" \
  -DCMAKE_CXX_FLAGS="-O1 -g1" -DEBPF_METRICSD_SANITIZE=address,undefined \
  -DEBPF_METRICSD_WERROR=OFF -DEBPF_METRICSD_BUILD_BENCH=OFF -DCMAKE_UNITY_BUILD=ON \
  -DCMAKE_UNITY_BUILD_BATCH_SIZE=16 >"$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j"$(nproc)" --target ebpf-metricsd unit_tests >"$build.build.log" 2>&1 ||
  { tail -n 100 "$build.build.log"; exit 1; }
echo "built with sanitizers in $((SECONDS - start)) s"
((build_only)) && exit 0
# Leaks too (LeakSanitizer, at exit); every report is fatal.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The unit suite as two processes at once: the config mutations (tagged [mutations], half of
# the suite's time here) beside the rest. Each fails when it matches no test (-w NoTests).
t=$SECONDS
status=0
"$build/tests/unit_tests" -w NoTests "[mutations]" >"$build.mutations.log" 2>&1 &
mutations=$!
"$build/tests/unit_tests" -w NoTests "~[mutations]~[.]" || status=$?
wait $mutations || status=$?
cat "$build.mutations.log"
echo "unit suite under the sanitizers: $((SECONDS - t)) s"
((status == 0)) || exit $status
t=$SECONDS
EBPF_METRICSD_DAEMON=$build/ebpf-metricsd EBPF_METRICSD_SANITIZED=1 \
  "$main/tests/e2e_tests" "[sanitize]" || status=$?
echo "e2e [sanitize] under the sanitizers: $((SECONDS - t)) s"
exit $status

#!/usr/bin/env bash
# What the suite enforces beyond behaviour (the `hygiene` test of ctest):
#  - every C++ file of the project is formatted as .clang-format says (bpf/ keeps the
#    kernel's style and is not checked);
#  - clang-tidy, with the project's .clang-tidy, finds nothing in the daemon's sources.
# Run from the repository root with a build directory that has compile_commands.json.
#   bash tests/hygiene.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: tests/hygiene.sh BUILD_DIR}
for tool in clang-format clang-tidy; do
  command -v "$tool" >/dev/null || { echo "$tool is not installed (install-deps.sh --with-tests)" >&2; exit 1; }
done

mapfile -t cxx < <(find src tests bench \( -name '*.cpp' -o -name '*.h' \) | sort)
unformatted=()
for f in "${cxx[@]}"; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || unformatted+=("$f")
done
if ((${#unformatted[@]})); then
  echo "not formatted as .clang-format says (fix with clang-format -i):" >&2
  printf '  %s\n' "${unformatted[@]}" >&2
  exit 1
fi
echo "clang-format: ${#cxx[@]} files as .clang-format says"

[[ -f $build/compile_commands.json ]] || { echo "$build/compile_commands.json is missing" >&2; exit 1; }
# Largest first, two at a time, a file each, so that no file waits at the end behind
# another's batch: the checks parse each file with all its headers. Not reported: what the
# compiler flags allow but clang would warn about in libbpf's option macros (statement
# expressions, compound literals) and in the generated skeletons (their object as one long
# string), and gcc's warning options clang does not know.
mapfile -t sources < <(find src -name '*.cpp' -printf '%s %p\n' | sort -rn | cut -d' ' -f2)
if ! printf '%s\n' "${sources[@]}" |
    xargs -P 2 -n 1 clang-tidy -p "$build" --quiet --warnings-as-errors='*' \
      --extra-arg=-Wno-unknown-warning-option --extra-arg=-Wno-gnu-statement-expression \
      --extra-arg=-Wno-c99-extensions --extra-arg=-Wno-overlength-strings \
      >"$build/clang-tidy.log" 2>&1; then
  grep -E "warning:|error:" "$build/clang-tidy.log" >&2 || cat "$build/clang-tidy.log" >&2
  echo "clang-tidy found the above (.clang-tidy; full log in $build/clang-tidy.log)" >&2
  exit 1
fi
echo "clang-tidy: ${#sources[@]} source files clean"

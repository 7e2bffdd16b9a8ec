#!/usr/bin/env bash
# Prints command N (1: run the daemon, 2: run every test) of the two that README.md starts
# with, so that .ci/run and tests/repeat.sh run exactly what the README says.
set -euo pipefail
readme="$(cd "$(dirname "$0")/.." && pwd)/README.md"
n=${1:?usage: readme-command.sh 1|2}
awk -v n="$n" '/^```sh$/ && !open { open = 1; next } open && /^```$/ { exit }
  open { if (++i == n) { print; found = 1 } } END { if (!found) exit 1 }' "$readme"

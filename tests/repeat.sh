#!/usr/bin/env bash
# Runs the README's test command on a fresh clone of this checkout's HEAD, N times, and
# reports each run's result, wall time and per-suite times: the check that the suite is
# green on any machine, not only once on the one that wrote the change.
#
#   tests/repeat.sh [--busy] [N]      (N defaults to 3)
#
# --busy keeps one CPU busy (stress-ng --cpu 1) for the whole of each run, as another build
# or job beside it would. Run as root, as CI does (EBPF_METRICSD_REQUIRE_PRIVILEGED=1: the
# privileged suites must run). Logs stay in /var/tmp/emd-repeat-*/run-<i>.log.
set -uo pipefail
busy=0
n=3
for arg in "$@"; do
  case $arg in
  --busy) busy=1 ;;
  *[!0-9]* | "")
    echo "usage: tests/repeat.sh [--busy] [N]" >&2
    exit 2
    ;;
  *) n=$arg ;;
  esac
done
if ((EUID != 0)); then
  echo "tests/repeat.sh: run as root, as CI does (the privileged suites must run)" >&2
  exit 2
fi
src=$(cd "$(dirname "$0")/.." && pwd)
command=$(bash "$src/tests/readme-command.sh" 2) || exit 2
work=$(mktemp -d /var/tmp/emd-repeat-XXXXXX)
echo "README test command: $command"
echo "head: $(git -C "$src" log -1 --format='%h %s')"
echo "busy core: $([[ $busy == 1 ]] && echo "yes (stress-ng --cpu 1)" || echo no); logs in $work"

passed=0
for i in $(seq 1 "$n"); do
  clone=$work/clone-$i
  git clone -q "$src" "$clone" || exit 2
  stress=
  if ((busy)); then
    stress-ng --cpu 1 --timeout 0 >/dev/null 2>&1 &
    stress=$!
  fi
  t0=$(date +%s)
  (cd "$clone" && export EBPF_METRICSD_REQUIRE_PRIVILEGED=1 && eval "$command") \
    >"$work/run-$i.log" 2>&1
  rc=$?
  t1=$(date +%s)
  [[ -n $stress ]] && kill "$stress" 2>/dev/null && wait "$stress" 2>/dev/null
  ((rc == 0)) && passed=$((passed + 1))
  # ctest's lines: "1/8 Test #1: unit .....   Passed    3.21 sec"
  suites=$(awk '/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: / {
      status = $(NF - 2); gsub(/^[.*]+/, "", status)
      printf "%s%s %s %ss", (n++ ? ", " : ""), $4, status, $(NF - 1) }' "$work/run-$i.log")
  echo "run $i: $([[ $rc == 0 ]] && echo PASS || echo "FAIL (exit $rc)"), $((t1 - t0)) s; $suites"
  rm -rf "$clone/build"
done
echo "$passed of $n runs passed"
((passed == n))

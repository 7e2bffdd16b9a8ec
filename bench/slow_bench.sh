#!/usr/bin/env bash
# What slow-event capture costs, with `perf bench sched pipe` (two tasks reading from pipes in
# turn on CPU 0; every read blocks, so each takes more than 1 us and each round trip is two
# blocking context switches at any machine speed); rounds interleaved, medians. Root; run
# from the repository root after building.
#  1. A recorded slow event: the daemon's syscall_latency (include: [read]) with `slow` at
#     1us and max_per_second 1 (all but one a second refused by the kernel-side limit) and
#     1000 (a thousand a second recorded: stack, ring record, symbolization, exemplar). The
#     workload's time and the daemon's CPU time both count; their difference over the events
#     recorded is the cost of one.
#  2. offcpu_time below the threshold: the same workload under offcpu_time without `slow`
#     and with `slow: {threshold: 1h}` (every wait below it: the user stack taken at each
#     blocking switch, with raw_tp the kernel stack too; one comparison when the wait ends),
#     per blocking switch, with hook auto (tp_btf here) and raw_tp.
#   bash bench/slow_bench.sh [rounds] ["sections"]   (e.g. 3 2; both by default)
set -euo pipefail
rounds=${1:-5}
sections=${2:-1 2}
want() { [[ " $sections " == *" $1 "* ]]; }
command -v perf >/dev/null || { echo "perf is not installed (install-deps.sh --with-tests)" >&2; exit 2; }
. "$(dirname "$0")/daemon.sh"
config() {  # config FILE MAX_PER_SECOND (syscall_latency)
  cat >"$1" <<YAML
web:
  listen_address: "127.0.0.1:$port"
tracers:
  syscall_latency:
    enabled: true
    include: [read]
    slow: {threshold: 1us, max_per_second: $2}
YAML
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
hz=$(getconf CLK_TCK)
loops=300000
config "$dir/one.yaml" 1
config "$dir/many.yaml" 1000
: >"$dir/one"; : >"$dir/many"
# One run: prints "seconds_of_workload_and_daemon seconds_of_wall".
run() {
  start_daemon "$1"
  sleep 1
  local c0 c1 out total
  c0=$(cpu_ticks "$pid")
  out=$(taskset -c 0 perf bench sched pipe -l "$loops" 2>/dev/null)
  c1=$(cpu_ticks "$pid")
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
  total=$(awk '/Total time:/ {print $3}' <<<"$out")
  # Both tasks run on CPU 0 and keep it busy: the wall time is their CPU time.
  echo "$(echo "$total + ($c1 - $c0) / $hz" | bc -l) $total"
}
if want 1; then
for _ in $(seq "$rounds"); do
  run "$dir/one.yaml" >>"$dir/one"
  run "$dir/many.yaml" >>"$dir/many"
done
one=$(awk '{print $1}' "$dir/one" | median)
many=$(awk '{print $1}' "$dir/many" | median)
wall=$(awk '{print $2}' "$dir/many" | median)
events=$(echo "1000 * $wall" | bc -l)
echo "perf bench sched pipe -l $loops on CPU 0 (median of $rounds; workload plus daemon CPU seconds):"
printf '  slow, 1 a second recorded       %.3f s\n' "$one"
printf '  slow, 1000 a second recorded    %.3f s  (about %.0f events in %.2f s)\n' "$many" "$events" "$wall"
printf '  a recorded slow event costs     %.1f us\n' "$(echo "($many - $one) * 1000000 / $events" | bc -l)"
fi

# 2. offcpu_time below the threshold, per blocking switch, with each hook kind.
if want 2; then
offcpu_config() {  # offcpu_config FILE HOOK [SLOW]
  cat >"$1" <<YAML
web:
  listen_address: "127.0.0.1:$port"
tracers:
  offcpu_time:
    enabled: true
    hook: $2
${3:+    slow: $3}
YAML
}
pipe_usecs() {  # usecs per round trip, both tasks on CPU 0
  taskset -c 0 perf bench sched pipe -l "$loops" 2>/dev/null | awk '/usecs\/op/ {print $1}'
}
modes="auto auto_slow auto_slowfp raw_tp raw_tp_slow raw_tp_slowfp"
for m in $modes; do
  case $m in
    *_slowfp) offcpu_config "$dir/$m.yaml" "${m%_slowfp}" '{threshold: 1h, unwind: frame_pointers}' ;;
    *_slow) offcpu_config "$dir/$m.yaml" "${m%_slow}" '{threshold: 1h}' ;;
    *) offcpu_config "$dir/$m.yaml" "$m" ;;
  esac
  : >"$dir/$m"
done
: >"$dir/base"
for _ in $(seq "$rounds"); do
  pipe_usecs >>"$dir/base"
  for m in $modes; do
    start_daemon "$dir/$m.yaml"; pipe_usecs >>"$dir/$m"
    kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
  done
done
base=$(median <"$dir/base")
echo "offcpu_time, perf bench sched pipe -l $loops (median of $rounds; two blocking switches a round trip):"
printf '  no daemon                           %.3f us a round trip\n' "$base"
for m in $modes; do
  v=$(median <"$dir/$m")
  label="hook ${m%_slow*}"
  [[ $m == *_slow ]] && label+=", slow below it (cfi)"
  [[ $m == *_slowfp ]] && label+=", slow below it (fp)"
  printf '  %-35s %.3f us  (%+.0f ns a switch)\n' "$label" "$v" "$(echo "($v - $base) * 1000 / 2" | bc -l)"
done
fi

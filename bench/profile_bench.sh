#!/usr/bin/env bash
# What the profile tracer costs, side by side in one run (rounds interleaved, medians):
#  1. throughput of a CPU-bound workload (tests/profile_workload without frame pointers, no
#     blocking) with no daemon, with the daemon profiling at 19 Hz and at 99 Hz; the daemon's
#     own CPU time during each run is added to the run's cost;
#  2. the off-CPU path per context switch: `perf bench sched pipe` (two tasks blocking on
#     each other, two blocking switches per round trip) with nothing, with the daemon
#     (on_cpu: false; the waits are below offcpu_min, so each costs the user stack taken at
#     switch-out and one comparison), with the daemon running offcpu_time beside the profile
#     (each keeps off-CPU state of its own), with the daemon walking frame pointers only
#     (`unwind: frame_pointers`: the user stack taken at every blocking switch, no sys_exit),
#     and with libbpf-tools' offcputime;
#  3. what every system call on the host pays for the sys_exit hook of `unwind: cfi`:
#     `perf bench syscall basic` (getppid) with nothing, with the profile (on_cpu: false)
#     under `unwind: cfi` and under `unwind: frame_pointers`;
#  4. the daemon's RSS under process churn: thousands of short-lived processes run from 200
#     distinct copies of the workload binary (a file each: its own ELF to open and name).
# Root; run from the repository root after building.
#   bash bench/profile_bench.sh [rounds]
set -euo pipefail
rounds=${1:-5}
build=${BUILD:-build}
workload=$build/tests/profile_workload_nofp
for tool in perf /usr/sbin/offcputime; do
  command -v "$tool" >/dev/null || { echo "$tool is not installed (install-deps.sh --with-tests)" >&2; exit 2; }
done
[[ -x $workload ]] || { echo "$workload is missing: build the tests first" >&2; exit 2; }
. "$(dirname "$0")/daemon.sh"

config() {  # config FILE FREQUENCY ON_CPU OFF_CPU [UNWIND]
  cat >"$1" <<EOF
web:
  listen_address: "127.0.0.1:$port"
tracers:
  profile:
    enabled: true
    frequency: $2
    on_cpu: $3
    off_cpu: $4
    unwind: ${5:-cfi}
EOF
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
stop_daemon() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
hz=$(getconf CLK_TCK)

# 1. CPU-bound throughput: rounds of the workload's loop per second of its CPU time (the
#    sampling interrupts are charged to it), less the daemon's CPU time in the same run.
work() {  # prints "rounds cpu_seconds" of 3 s of CPU on CPU 0
  local out
  out=$(taskset -c 0 "$workload" 3000 0)
  echo "$(awk '/^rounds/ {print $2}' <<<"$out") 3"
}
for f in 19 99; do config "$dir/p$f.yaml" "$f" true true; done
: >"$dir/off"; : >"$dir/on19"; : >"$dir/on99"
for _ in $(seq "$rounds"); do
  read -r n cpu < <(work)
  echo "$n / $cpu" | bc -l >>"$dir/off"
  for f in 19 99; do
    start_daemon "$dir/p$f.yaml"
    # Past its start: the kernel symbol table is read at the first stack the daemon names,
    # a one-time cost that is not the profile's rate.
    sleep 1
    curl -s "$url" >/dev/null
    taskset -c 0 "$workload" 200 0 >/dev/null
    sleep 2
    c0=$(cpu_ticks "$pid")
    read -r n cpu < <(work)
    c1=$(cpu_ticks "$pid")
    stop_daemon
    # Throughput with the daemon's CPU time counted against it.
    echo "$n / ($cpu + ($c1 - $c0) / $hz)" | bc -l >>"$dir/on$f"
  done
done
off=$(median <"$dir/off")
echo "CPU-bound workload (median of $rounds; rounds per CPU second, the daemon's CPU counted):"
printf '  no profile   %.1f rounds/s\n' "$off"
for f in 19 99; do
  on=$(median <"$dir/on$f")
  printf '  %3d Hz       %.1f rounds/s  (%+.2f%%)\n' "$f" "$on" "$(echo "($on / $off - 1) * 100" | bc -l)"
done

# 2. The off-CPU path, per blocking context switch.
loops=200000
pipe_usecs() {  # usecs per round trip of perf bench sched pipe, both tasks on CPU 0
  taskset -c 0 perf bench sched pipe -l "$loops" 2>/dev/null | awk '/usecs\/op/ {print $1}'
}
config "$dir/off.yaml" 19 false true
config "$dir/both.yaml" 19 false true
printf '  offcpu_time:\n    enabled: true\n' >>"$dir/both.yaml"
config "$dir/fp.yaml" 19 false true frame_pointers
: >"$dir/base"; : >"$dir/ours"; : >"$dir/both"; : >"$dir/fp"; : >"$dir/theirs"
for _ in $(seq "$rounds"); do
  pipe_usecs >>"$dir/base"
  start_daemon "$dir/off.yaml"
  pipe_usecs >>"$dir/ours"
  stop_daemon
  start_daemon "$dir/both.yaml"
  pipe_usecs >>"$dir/both"
  stop_daemon
  start_daemon "$dir/fp.yaml"
  pipe_usecs >>"$dir/fp"
  stop_daemon
  /usr/sbin/offcputime -m 1000 30 >/dev/null 2>&1 &
  oc=$!
  sleep 2  # its programs attached
  pipe_usecs >>"$dir/theirs"
  kill -INT "$oc"; wait "$oc" 2>/dev/null || true
done
base=$(median <"$dir/base"); ours=$(median <"$dir/ours"); both=$(median <"$dir/both")
fp=$(median <"$dir/fp"); theirs=$(median <"$dir/theirs")
echo "Off-CPU path (perf bench sched pipe, median of $rounds; two blocking switches a round trip):"
printf '  nothing      %.3f us a round trip\n' "$base"
printf '  profile      %.3f us  (%+.0f ns a switch)\n' "$ours" "$(echo "($ours - $base) * 1000 / 2" | bc -l)"
printf '  + offcpu_time %.3f us  (%+.0f ns a switch)\n' "$both" "$(echo "($both - $base) * 1000 / 2" | bc -l)"
printf '  frame ptrs   %.3f us  (%+.0f ns a switch)\n' "$fp" "$(echo "($fp - $base) * 1000 / 2" | bc -l)"
printf '  offcputime   %.3f us  (%+.0f ns a switch)\n' "$theirs" "$(echo "($theirs - $base) * 1000 / 2" | bc -l)"

# 3. The sys_exit hook, per system call.
syscall_ns() {  # ns per getppid() on CPU 0
  taskset -c 0 perf bench syscall basic -l 2000000 2>/dev/null | awk '/usecs\/op/ {print $1 * 1000}'
}
: >"$dir/sc_base"; : >"$dir/sc_cfi"; : >"$dir/sc_fp"
for _ in $(seq "$rounds"); do
  syscall_ns >>"$dir/sc_base"
  start_daemon "$dir/off.yaml"
  syscall_ns >>"$dir/sc_cfi"
  stop_daemon
  start_daemon "$dir/fp.yaml"
  syscall_ns >>"$dir/sc_fp"
  stop_daemon
done
sc_base=$(median <"$dir/sc_base"); sc_cfi=$(median <"$dir/sc_cfi"); sc_fp=$(median <"$dir/sc_fp")
echo "System calls (perf bench syscall basic, median of $rounds):"
printf '  nothing         %.0f ns a call\n' "$sc_base"
printf '  unwind: cfi     %.0f ns  (%+.0f ns a call)\n' "$sc_cfi" "$(echo "$sc_cfi - $sc_base" | bc -l)"
printf '  frame pointers  %.0f ns  (%+.0f ns a call)\n' "$sc_fp" "$(echo "$sc_fp - $sc_base" | bc -l)"

# 4. RSS under process churn.
config "$dir/churn.yaml" 99 true true
mkdir "$dir/bins"
for i in $(seq 200); do cp "$workload" "$dir/bins/w$i"; done
start_daemon "$dir/churn.yaml"
sleep 2
rss() { awk '/VmRSS/ {print $2}' "/proc/$pid/status"; }
rss0=$(rss)
peak=$rss0
for pass in $(seq 10); do
  for i in $(seq 200); do "$dir/bins/w$i" 20 1 >/dev/null & done  # 20 ms of CPU each
  wait $(jobs -p | grep -v "^$pid$") 2>/dev/null || true
  now=$(rss)
  ((now > peak)) && peak=$now
done
sleep 12  # two drains
echo "Daemon RSS, 2,000 processes from 200 distinct binaries at 99 Hz:"
echo "  before ${rss0} KiB, peak ${peak} KiB, after $(rss) KiB"
curl -s "$url" | grep -E '^ebpf_metricsd_profile_cache_entries' | sed 's/^/  /'

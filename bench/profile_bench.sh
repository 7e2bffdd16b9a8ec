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
#     distinct copies of the workload binary (a file each: its own ELF to open and name);
#  5. kernel time per on-CPU sample, from the kernel's BPF statistics
#     (kernel.bpf_stats_enabled): the profile's perf-event program at 99 Hz under
#     `unwind: cfi` (the walk with the unwind tables, tail calls included: the kernel counts
#     them in the program that started the run) and `frame_pointers` (bpf_get_stack's walk),
#     both counted in the kernel, against bpftrace's `profile:hz:99` probe counting user and
#     kernel stacks; the CPU-bound workload on every CPU (no sample of an idle CPU, which
#     the programs leave at once, in the figures). With it, the daemon's CPU per on-CPU
#     sample in the steady state (its CPU time over the sample program's runs), at 99 and
#     997 Hz; and, as each machine's noise moves both alike, the walk and bpftrace's probe
#     sampling the same workload at once: the ratio of their times, per pass;
#  6. the read of every thread at each cut (the task iterator profile_threads: the threads'
#     accounting and the waits in progress): kernel time per thread visited, and the daemon's
#     CPU time a second (one cut every 5 s drain) with the host's threads alone and with
#     10,000 idle threads more;
#  7. every sample walked at 997 Hz on every CPU (the rate of 64 CPUs at 31 Hz): one
#     CPU-bound workload per CPU for 20 s, the walks by how they ended and the samples the
#     kernel side dropped, by reason.
# Root; run from the repository root after building. BASELINE=/path/to/ebpf-metricsd (another
# build, e.g. of the commit before a change) adds it to sections 2 and 3, same run, same
# config, interleaved: what a change costs a switch and a system call, measured beside it.
#   bash bench/profile_bench.sh [rounds] ["sections"]   (e.g. 3 "1 5"; all seven by default)
set -euo pipefail
rounds=${1:-5}
sections=${2:-1 2 3 4 5 6 7}
want() { [[ " $sections " == *" $1 "* ]]; }
build=${BUILD:-build}
workload=$build/tests/profile_workload_nofp
for tool in perf /usr/sbin/offcputime bpftrace bpftool; do
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
daemon_cpu() {  # daemon_total: all its threads' CPU time, in ns (builtins alone: no process)
  local f ns
  daemon_total=0
  for f in /proc/"$pid"/task/*/schedstat; do
    read -r ns _ 2>/dev/null <"$f" && daemon_total=$((daemon_total + ns))
  done
  return 0
}
prog_fdinfo() {  # prog_fdinfo PID NAME: a /proc/PID/fdinfo file of each program named NAME
                # (a NAME ending in *: each whose name begins so)
  local ids f key val seen=" "
  ids=" $(bpftool prog show | awk -v want="$2" '/^[0-9]+:/ {
    n = ""
    for (i = 2; i < NF; i++) if ($i == "name") n = $(i + 1)
    if (n == want || (want ~ /\*$/ && index(n, substr(want, 1, length(want) - 1)) == 1))
      printf "%d ", $1
  }') "
  for f in /proc/"$1"/fdinfo/*; do
    while read -r key val; do
      [[ $key == prog_id: && $ids == *" $val "* && $seen != *" $val "* ]] || continue
      echo "$f"
      seen+="$val "
    done 2>/dev/null <"$f" || true  # a descriptor closed meanwhile
  done
}
fdinfo_runs() {  # fdinfo_runs FILE...: run_ns and run_cnt, summed (builtins alone)
  local f key val
  run_ns=0; run_cnt=0
  for f in "$@"; do
    while read -r key val; do
      case $key in
        run_time_ns:) run_ns=$((run_ns + val)) ;;
        run_cnt:) run_cnt=$((run_cnt + val)) ;;
      esac
    done 2>/dev/null <"$f" || true
  done
}
stop_daemon() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""; }
baseline=${BASELINE:-}
if [[ -n $baseline && ! -x $baseline ]]; then echo "BASELINE=$baseline is not a program" >&2; exit 2; fi
start_baseline() { local ours=$bin; bin=$baseline; start_daemon "$1"; bin=$ours; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
hz=$(getconf CLK_TCK)

if want 1; then
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
fi

# Sections 2 and 3: the profile off-CPU only, with offcpu_time beside it, frame pointers only.
config "$dir/off.yaml" 19 false true
config "$dir/both.yaml" 19 false true
printf '  offcpu_time:\n    enabled: true\n' >>"$dir/both.yaml"
config "$dir/fp.yaml" 19 false true frame_pointers
if want 2; then
# 2. The off-CPU path, per blocking context switch.
loops=200000
pipe_usecs() {  # usecs per round trip of perf bench sched pipe, both tasks on CPU 0
  taskset -c 0 perf bench sched pipe -l "$loops" 2>/dev/null | awk '/usecs\/op/ {print $1}'
}
: >"$dir/base"; : >"$dir/ours"; : >"$dir/both"; : >"$dir/fp"; : >"$dir/theirs"; : >"$dir/before"
for _ in $(seq "$rounds"); do
  pipe_usecs >>"$dir/base"
  start_daemon "$dir/off.yaml"
  pipe_usecs >>"$dir/ours"
  stop_daemon
  if [[ -n $baseline ]]; then
    start_baseline "$dir/off.yaml"
    pipe_usecs >>"$dir/before"
    stop_daemon
  fi
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
if [[ -n $baseline ]]; then
  before=$(median <"$dir/before")
  printf '  baseline     %.3f us  (%+.0f ns a switch; %s)\n' "$before" "$(echo "($before - $base) * 1000 / 2" | bc -l)" "$baseline"
fi
fi

if want 3; then
# 3. The sys_exit hook, per system call.
syscall_ns() {  # ns per getppid() on CPU 0
  taskset -c 0 perf bench syscall basic -l 2000000 2>/dev/null | awk '/usecs\/op/ {print $1 * 1000}'
}
: >"$dir/sc_base"; : >"$dir/sc_cfi"; : >"$dir/sc_fp"; : >"$dir/sc_before"
for _ in $(seq "$rounds"); do
  syscall_ns >>"$dir/sc_base"
  start_daemon "$dir/off.yaml"
  syscall_ns >>"$dir/sc_cfi"
  stop_daemon
  if [[ -n $baseline ]]; then
    start_baseline "$dir/off.yaml"
    syscall_ns >>"$dir/sc_before"
    stop_daemon
  fi
  start_daemon "$dir/fp.yaml"
  syscall_ns >>"$dir/sc_fp"
  stop_daemon
done
sc_base=$(median <"$dir/sc_base"); sc_cfi=$(median <"$dir/sc_cfi"); sc_fp=$(median <"$dir/sc_fp")
echo "System calls (perf bench syscall basic, median of $rounds):"
printf '  nothing         %.0f ns a call\n' "$sc_base"
printf '  unwind: cfi     %.0f ns  (%+.0f ns a call)\n' "$sc_cfi" "$(echo "$sc_cfi - $sc_base" | bc -l)"
printf '  frame pointers  %.0f ns  (%+.0f ns a call)\n' "$sc_fp" "$(echo "$sc_fp - $sc_base" | bc -l)"
if [[ -n $baseline ]]; then
  sc_before=$(median <"$dir/sc_before")
  printf '  baseline        %.0f ns  (%+.0f ns a call; %s)\n' "$sc_before" "$(echo "$sc_before - $sc_base" | bc -l)" "$baseline"
fi
fi

if want 4; then
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
fi

stats_before=$(sysctl -n kernel.bpf_stats_enabled)
bt=""  # bpftrace, while it runs
trap 'sysctl -q kernel.bpf_stats_enabled='"$stats_before"'; if [[ -n $pid ]]; then kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; fi; if [[ -n $bt ]]; then kill -KILL "$bt" 2>/dev/null; wait "$bt" 2>/dev/null; fi; rm -rf "$dir"' EXIT
cpus=$(nproc)
busy_ws=()
busy_start() {  # busy_start MS [DEPTH]: the workload on every CPU for MS ms of its CPU, its loop
                # DEPTH frames deeper (its stack DEPTH + 6 frames): no CPU idle, so every
                # sample the programs take is of work
  local c
  busy_ws=()
  for c in $(seq 0 $((cpus - 1))); do
    if [[ -n ${2:-} ]]; then
      PROFILE_WORKLOAD_DEPTH=$2 taskset -c "$c" "$workload" "$1" 0 >/dev/null &
    else
      taskset -c "$c" "$workload" "$1" 0 >/dev/null &
    fi
    busy_ws+=($!)
  done
}
busy_stop() { kill "${busy_ws[@]}" 2>/dev/null || true; busy_wait; }
busy_wait() { wait "${busy_ws[@]}" 2>/dev/null || true; busy_ws=(); }

if want 5; then
# 5. Kernel ns per on-CPU sample, ours against bpftrace's profile:hz.
metric_sum() { curl -s "$url" | awk -v m="$1" 'index($0, m) == 1 {s += $NF} END {print s + 0}'; }
prog_files() {  # prog_files PID NAME: prog_fdinfo's files in $files, once PID has loaded its
                # programs (a daemon answers before its tracers are up)
  files=()
  for _ in $(seq 100); do
    mapfile -t files < <(prog_fdinfo "$1" "$2")
    ((${#files[@]})) && return 0
    sleep 0.1
  done
  echo "process $1 has no program named $2" >&2
  return 1
}
per_sample() {  # per_sample PID NAME [DEPTH]: ns per run of process PID's programs named NAME
               # over 3 s of the workload's CPU on every CPU (read from PID's descriptors,
               # with builtins: no process of the bench's is sampled in the window)
  local files=() a0 c0
  prog_files "$1" "$2"
  fdinfo_runs "${files[@]}"; a0=$run_ns; c0=$run_cnt
  busy_start 3000 "${3:-}"
  busy_wait
  fdinfo_runs "${files[@]}"
  echo "($run_ns - $a0) / ($run_cnt - $c0)" | bc -l
}
daemon_per_sample() {  # ns of the daemon's CPU per on-CPU sample over 10 s, the workload on
                      # every CPU; read without starting a process, 17 s after the last one
                      # the bench started (the daemon keeps a gone process's files up to 15 s):
                      # the daemon's steady state, its drains and cuts included
  local files=() t0 c0
  prog_files "$pid" on_cpu_sample
  busy_start 40000
  sleep 17
  daemon_cpu; t0=$daemon_total; fdinfo_runs "${files[@]}"; c0=$run_cnt
  sleep 10
  daemon_cpu; fdinfo_runs "${files[@]}"
  busy_stop
  echo "($daemon_total - $t0) / ($run_cnt - $c0)" | bc -l
}
stop_bpftrace() {  # at once: on SIGINT it would print (and first name) every stack it counted
  kill -KILL "$bt"; wait "$bt" 2>/dev/null || true
  bt=""
}
start_bpftrace() {  # bpftrace's probe, once its program runs
  bpftrace -e 'profile:hz:99 { @[kstack, ustack, pid] = count(); }' >/dev/null 2>&1 &
  bt=$!
  local files=()
  for _ in $(seq 100); do
    mapfile -t files < <(prog_fdinfo "$bt" 99)
    ((${#files[@]})) && fdinfo_runs "${files[@]}" && ((run_cnt > 0)) && break
    sleep 0.1
  done
}
sysctl -q kernel.bpf_stats_enabled=1
config "$dir/s_cfi.yaml" 99 true false cfi
config "$dir/s_fast.yaml" 997 true false cfi
config "$dir/s_fp.yaml" 99 true false frame_pointers
: >"$dir/s_cfi"; : >"$dir/s_fp"; : >"$dir/s_bt"; : >"$dir/s_daemon"; : >"$dir/s_cfi20"
: >"$dir/s_daemon997"
: >"$dir/s_bt20"
for _ in $(seq "$rounds"); do
  start_daemon "$dir/s_cfi.yaml"
  per_sample "$pid" on_cpu_sample >/dev/null  # the workload's tables loaded
  per_sample "$pid" on_cpu_sample >>"$dir/s_cfi"
  per_sample "$pid" on_cpu_sample 20 >>"$dir/s_cfi20"
  # The daemon's CPU per on-CPU sample, in the steady state: a workload already named (its
  # files read and its tables loaded at its first samples), over 10 s, the samples counted
  # by the kernel (the sample program's runs: no process is started to read them).
  daemon_per_sample >>"$dir/s_daemon"
  stop_daemon
  start_daemon "$dir/s_fast.yaml"
  daemon_per_sample >>"$dir/s_daemon997"
  stop_daemon
  start_daemon "$dir/s_fp.yaml"
  per_sample "$pid" on_cpu_sample >/dev/null  # as for cfi: a warm pass first
  per_sample "$pid" on_cpu_sample >>"$dir/s_fp"
  stop_daemon
  start_bpftrace
  per_sample "$bt" 99 >/dev/null
  per_sample "$bt" 99 >>"$dir/s_bt"
  per_sample "$bt" 99 20 >>"$dir/s_bt20"
  stop_bpftrace
done
# The walk and bpftrace's probe sampling the same workload at once: "ours bpftrace" ns a
# sample, both read at the same moments.
pair_per_sample() {  # pair_per_sample [DEPTH]
  local a0 c0 b0 d0
  fdinfo_runs "${ours[@]}"; a0=$run_ns; c0=$run_cnt
  fdinfo_runs "${theirs[@]}"; b0=$run_ns; d0=$run_cnt
  busy_start 3000 "${1:-}"
  busy_wait
  fdinfo_runs "${ours[@]}"
  echo "($run_ns - $a0) / ($run_cnt - $c0)" | bc -l | tr '\n' ' '
  fdinfo_runs "${theirs[@]}"
  echo "($run_ns - $b0) / ($run_cnt - $d0)" | bc -l
}
: >"$dir/s_pair"; : >"$dir/s_pair20"
for _ in $(seq "$rounds"); do
  start_daemon "$dir/s_cfi.yaml"
  start_bpftrace
  per_sample "$pid" on_cpu_sample >/dev/null  # the workload's tables loaded
  mapfile -t ours < <(prog_fdinfo "$pid" on_cpu_sample)
  mapfile -t theirs < <(prog_fdinfo "$bt" 99)
  pair_per_sample >>"$dir/s_pair"
  pair_per_sample >>"$dir/s_pair"
  pair_per_sample 20 >>"$dir/s_pair20"
  pair_per_sample 20 >>"$dir/s_pair20"
  stop_bpftrace
  stop_daemon
done
echo "Kernel time per on-CPU sample at 99 Hz (kernel.bpf_stats_enabled, median of $rounds; a warm workload on every CPU):"
printf '  profile, unwind: cfi             %.0f ns  (the walk with the unwind tables, counted in the kernel)\n' "$(median <"$dir/s_cfi")"
printf '    stack of 26 frames             %.0f ns\n' "$(median <"$dir/s_cfi20")"
printf '  profile, unwind: frame_pointers  %.0f ns  (bpf_get_stack, counted in the kernel)\n' "$(median <"$dir/s_fp")"
printf '  bpftrace profile:hz:99           %.0f ns  (@[kstack, ustack, pid] = count(), frame pointers)\n' "$(median <"$dir/s_bt")"
printf '    stack of 26 frames             %.0f ns  (its frame-pointer walk ends early in code without them)\n' "$(median <"$dir/s_bt20")"
printf '  daemon CPU per on-CPU sample     %.0f ns  (cfi at 99 Hz; names cached; the daemon'"'"'s costs a second count too)\n' "$(median <"$dir/s_daemon")"
printf '    at 997 Hz                      %.0f ns\n' "$(median <"$dir/s_daemon997")"
pair_line() {  # pair_line FILE LABEL
  printf '    %s: %s\n' "$2" "$(awk '{printf "%s%.0f/%.0f=%.2f", (NR > 1 ? " " : ""), $1, $2, $1 / $2}' "$1")"
  printf '    median ratio %.2f\n' "$(awk '{print $1 / $2}' "$1" | median)"
}
echo "  cfi walk and bpftrace sampling the same workload at once (ns ours/bpftrace, per pass):"
pair_line "$dir/s_pair" "workload"
pair_line "$dir/s_pair20" "26 frames"
fi

if want 6; then
# 6. The threads read at each cut: kernel ns per thread visited by the iterator (it runs once
#    a thread), and the daemon's CPU a second over 30 s (six drains), without and with 10,000
#    idle threads more (a Python process whose threads wait on one event).
sysctl -q kernel.bpf_stats_enabled=1
config "$dir/threads.yaml" 19 true true
threads_run() {  # prints "daemon_ns_per_s iterator_ns_per_thread threads_on_host"
  start_daemon "$dir/threads.yaml"
  sleep 6
  local files=() a0 c0 d0
  mapfile -t files < <(prog_fdinfo "$pid" 'profile_threads*')
  fdinfo_runs "${files[@]}"; a0=$run_ns; c0=$run_cnt
  daemon_cpu; d0=$daemon_total
  sleep 30
  fdinfo_runs "${files[@]}"
  daemon_cpu
  stop_daemon
  echo "$(( (daemon_total - d0) / 30 )) $(echo "($run_ns - $a0) / ($run_cnt - $c0)" | bc -l) $(ls -d /proc/[0-9]*/task/[0-9]* | wc -l)"
}
: >"$dir/t_base"; : >"$dir/t_many"
for _ in $(seq "$rounds"); do
  threads_run >>"$dir/t_base"
  /usr/bin/python3 -c '
import threading
threading.stack_size(32768)
e = threading.Event()
for _ in range(10000):
    threading.Thread(target=e.wait, daemon=True).start()
print("ready", flush=True)
e.wait()' >"$dir/idle.out" &
  idle=$!
  for _ in $(seq 600); do grep -q ready "$dir/idle.out" 2>/dev/null && break; sleep 0.1; done
  threads_run >>"$dir/t_many"
  kill "$idle"; wait "$idle" 2>/dev/null || true
done
col() { awk -v c="$1" '{print $c}' | median; }
echo "Threads read at each cut (median of $rounds, 30 s each):"
printf '  host alone         %s threads, iterator %.0f ns a thread, daemon %.2f ms of CPU a second\n' \
  "$(col 3 <"$dir/t_base")" "$(col 2 <"$dir/t_base")" "$(echo "$(col 1 <"$dir/t_base") / 1000000" | bc -l)"
printf '  + 10,000 threads   %s threads, iterator %.0f ns a thread, daemon %.2f ms of CPU a second\n' \
  "$(col 3 <"$dir/t_many")" "$(col 2 <"$dir/t_many")" "$(echo "$(col 1 <"$dir/t_many") / 1000000" | bc -l)"
fi

if want 7; then
# 7. Every sample walked at 997 Hz on every CPU.
config "$dir/fast.yaml" 997 true false cfi
start_daemon "$dir/fast.yaml"
# The workloads' files read and tables loaded first (their first samples wait for them).
busy_start 1000
busy_wait
sleep 6  # a drain
before=$(curl -s "$url")
busy_start 20000
busy_wait
sleep 6
after=$(curl -s "$url")
stop_daemon
python3 - "$before" "$after" "$cpus" <<'PY'
import re, sys
def series(text):
    out = {}
    for line in text.splitlines():
        m = re.match(r'(ebpf_metricsd_(?:profile_unwinds_total|dropped_events_total|profile_samples_total))\{([^}]*)\} (\S+)', line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out
b, a = series(sys.argv[1]), series(sys.argv[2])
d = {k: a[k] - b.get(k, 0) for k in a}
walks = {k[1]: v for k, v in d.items() if k[0].endswith("unwinds_total") and v}
total = sum(walks.values())
samples = sum(v for k, v in d.items() if k[0].endswith("samples_total") and 'on_cpu' in k[1])
print(f"Every sample walked at 997 Hz on {sys.argv[3]} CPUs, 20 s of one CPU-bound workload a CPU:")
print(f"  on-CPU samples {samples:.0f}, walks {total:.0f}")
for labels, v in sorted(walks.items(), key=lambda kv: -kv[1]):
    print(f"    {labels:40s} {v:8.0f}  {100 * v / total if total else 0:6.2f}%")
# Stacks cut (reason="unwind_*") are the walks above; these are samples or waits lost.
drops = {k[1]: v for k, v in d.items() if k[0].endswith("dropped_events_total")
         and 'tracer="profile"' in k[1] and 'reason="unwind_' not in k[1] and v}
print(f"  lost by the profile's kernel side: {sum(drops.values()):.0f}"
      f" ({100 * sum(drops.values()) / samples if samples else 0:.2f}% of the samples)")
for labels, v in sorted(drops.items(), key=lambda kv: -kv[1]):
    print(f"    {labels:40s} {v:8.0f}")
PY
fi

#!/usr/bin/env bash
# block_io against the disk's own counters: runs the daemon with block_io alone, drives
# `fio` (4 KiB direct random reads and writes, an fsync every 8 writes) on a file of the
# disk that holds /var/tmp for SECONDS, and prints, for the window, what
# /sys/block/<disk>/stat counted, what the tracer counted, and the requests missing from
# the tracer's counts (sysfs minus counted, the flush sequences' own requests taken out:
# the kernel counts an fsync's empty flush write among the writes) beside complete_unseen
# and the in-flight gauge. With PERF=1, `perf stat` listens on block_rq_issue and
# block_rq_complete during the window (a second user of the tracepoints).
#
#   bench/block_io_accounting.sh BUILD_DIR [SECONDS]
set -euo pipefail
build=${1:?usage: bench/block_io_accounting.sh BUILD_DIR [SECONDS]}
seconds=${2:-20}
daemon=$(realpath "$build/ebpf-metricsd")
disk=$(lsblk -no PKNAME "$(findmnt -no SOURCE --target /var/tmp)" 2>/dev/null | head -1)
[[ -n $disk ]] || disk=$(basename "$(findmnt -no SOURCE --target /var/tmp)")
port=9899
work=$(mktemp -d /var/tmp/emd-blockio-bench-XXXXXX)
trap 'kill "$pid" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
cat >"$work/config.yaml" <<YAML
web:
  listen_address: "127.0.0.1:$port"
drain_interval: 1s
tracers:
  block_io:
    enabled: true
YAML
"$daemon" --config "$work/config.yaml" >"$work/daemon.log" 2>&1 &
pid=$!
for _ in $(seq 50); do curl -sf "127.0.0.1:$port/metrics" >/dev/null && break; sleep 0.2; done

snap() {
  local stat m
  read -r -a stat <"/sys/block/$disk/stat"
  m=$(curl -sf "127.0.0.1:$port/metrics")
  metric() { echo "$m" | awk -v k="$1" 'index($0, k) == 1 { v = $2 } END { print v + 0 }'; }
  echo "${stat[0]} ${stat[4]} ${stat[11]:-0} ${stat[15]:-0}" \
    "$(metric "ebpf_block_io_latency_seconds_count{device=\"$disk\",op=\"read\"}")" \
    "$(metric "ebpf_block_io_latency_seconds_count{device=\"$disk\",op=\"write\"}")" \
    "$(metric "ebpf_block_io_latency_seconds_count{device=\"$disk\",op=\"discard\"}")" \
    "$(metric "ebpf_block_io_latency_seconds_count{device=\"$disk\",op=\"flush\"}")" \
    "$(metric 'ebpf_metricsd_dropped_events_total{tracer="block_io",reason="complete_unseen"}')" \
    "$(metric 'ebpf_metricsd_dropped_events_total{tracer="block_io",reason="issue_unseen"}')" \
    "$(metric "ebpf_block_io_requests_in_flight{device=\"$disk\"}")"
}

sleep 1
before=$(snap)
if [[ ${PERF:-0} == 1 ]]; then
  perf stat -e block:block_rq_issue,block:block_rq_complete -a sleep "$((seconds + 1))" \
    >"$work/perf.txt" 2>&1 &
fi
fio --name=accounting --filename="$work/fio.data" --size=256M --rw=randrw --bs=4k --direct=1 \
  --iodepth=32 --ioengine=libaio --numjobs=2 --runtime="$seconds" --time_based --fsync=8 \
  --group_reporting >"$work/fio.out"
sleep 3
after=$(snap)
python3 - "$disk" "$before" "$after" <<'PY'
import sys
disk = sys.argv[1]
a = [float(x) for x in sys.argv[2].split()]
b = [float(x) for x in sys.argv[3].split()]
(sr, sw, sd, sf, cr, cw, cd, cf, unseen, issue_unseen, held) = [y - x for x, y in zip(a, b)]
missing = (sr - cr) + (sw - sf - cw) + (sd - cd) + (sf - cf)
print(f"disk {disk}: sysfs reads {sr:.0f} writes {sw:.0f} discards {sd:.0f} flushes {sf:.0f}")
print(f"  tracer   reads {cr:.0f} writes {cw:.0f} discards {cd:.0f} flushes {cf:.0f}")
print(f"  missing from the tracer's counts: {missing:.0f} of {sr + sw - sf + sd + sf:.0f}"
      f"; complete_unseen {unseen:.0f}, in flight {held:+.0f}, issue_unseen {issue_unseen:.0f}"
      " (drops of every disk)")
PY

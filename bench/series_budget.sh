#!/usr/bin/env bash
# Series budget of the shipped configuration: starts the daemon with config/ebpf-metricsd.yaml
# (on a free local port), runs ~60 s of stress-ng's "os" class one stressor after another,
# then prints what one scrape of /metrics costs: samples and bytes in the text format, and
# series as a Prometheus with native histograms stores them (one per histogram). Root; run
# from the repository root after building.
#   bash bench/series_budget.sh [seconds]
set -euo pipefail
secs=${1:-60}
. "$(dirname "$0")/daemon.sh"
sed "s/listen_address: \":9810\"/listen_address: \"127.0.0.1:$port\"/" config/ebpf-metricsd.yaml \
  >"$dir/config.yaml"
grep -q "127.0.0.1:$port" "$dir/config.yaml"
start_daemon "$dir/config.yaml"
# Stressors that take the machine's CPUs or memory away, or need hardware, are left out.
skip=cpu-online,memhotplug,reboot,swap,oom-pipe,bigheap,brk,kvm,numa,pci,rtc,efivar,watchdog,mlockmany,vm,vm-addr,tlb-shootdown,pageswap,physpage,klog,sysfs,procfs,binderfs,apparmor,dev,smi
(cd "$dir" && timeout --signal=INT "$secs" stress-ng --class os --sequential 1 --timeout 1 \
  --exclude "$skip" --temp-path "$dir" >/dev/null 2>&1) || true
sleep 6  # one more drain after the last stressor
curl -s "$url" >"$dir/text"
bytes=$(wc -c <"$dir/text")
gzbytes=$(curl -s -H 'Accept-Encoding: gzip' "$url" | wc -c)
awk -v bytes="$bytes" -v gz="$gzbytes" '
  /^# TYPE / { type[$3] = $4; next }
  /^#/ { next }
  {
    samples++
    name = $1; sub(/\{.*/, "", name)
    base = name; sub(/_(bucket|sum|count)$/, "", base)
    if (type[base] == "histogram") {
      if (name ~ /_count$/) { native++; hist[base]++ }
    } else native++
    if (base == "ebpf_syscall_latency_seconds" && name ~ /_count$/) syscalls++
  }
  END {
    printf "text: %d samples, %d bytes (%d gzip); native: %d series; syscalls seen: %d\n",
      samples, bytes, gz, native, syscalls
    for (h in hist) printf "  %-45s %4d histogram series\n", h, hist[h]
  }' "$dir/text"

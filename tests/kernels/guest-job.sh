#!/bin/bash
# Runs inside a kernel-matrix guest, chrooted in the host's root (read-only, with the
# guest's /proc, /sys, /dev, /tmp, /run and a scratch disk at /var/tmp), after the stall job:
# at the ends of the kernel range (BTF_PATH_RUN=1) a short run of the daemon with every tracer
# enabled and the kernel's BTF hidden, then the privileged BPF tests. Everything the host reads
# goes to the second serial port between EMD-* markers.
set -u
. /tmp/emd-matrix.env
exec 3>/dev/ttyS1
say() { echo "$*" >&3; }
say "EMD-KERNEL $(uname -r)"
say "EMD-POSSIBLE-CPUS $(cat /sys/devices/system/cpu/possible)"

# The daemon with the shipped config, every tracer enabled, draining every second; its
# tracer_up and drain_errors_total lines go to the report as section $1. Further arguments
# are a command that runs the daemon (a mount namespace).
run_daemon() {
  local section=$1 config=$2
  shift 2
  "$@" "$BUILD_DIR/ebpf-metricsd" --config "$config" --web.listen-address 127.0.0.1:9810 \
    >/tmp/daemon-$section.log 2>&1 &
  local daemon=$! up_lines=""
  for _ in $(seq 1 120); do
    sleep 1
    kill -0 $daemon 2>/dev/null || break
    up_lines=$(curl -sf http://127.0.0.1:9810/metrics | grep '^ebpf_metricsd_tracer_up{')
    # Two drains after every tracer reported: the drains work, not only the attach.
    if [[ $(grep -c . <<<"$up_lines") -ge $TRACER_COUNT ]]; then
      sleep 2
      up_lines=$(curl -sf http://127.0.0.1:9810/metrics |
        grep -E '^ebpf_metricsd_(tracer_up|drain_errors_total)\{')
      break
    fi
  done
  kill -TERM $daemon 2>/dev/null
  wait $daemon
  say "EMD-DAEMON-EXIT-$section $?"
  say "EMD-BEGIN $section"
  [[ -n $up_lines ]] && echo "$up_lines" >&3
  say "EMD-END $section"
  say "EMD-BEGIN $section-log"
  grep -v ' debug' /tmp/daemon-$section.log | grep -E '^[0-9]{4}-' | tail -n 60 >&3
  say "EMD-END $section-log"
}


# The stall job (stall-job.sh, before this) ran the daemon with every tracer and label on;
# its tracer_up lines are the matrix's hooks. Here, at the ends of the range (BTF_PATH_RUN),
# the shipped config with every tracer enabled runs with the kernel's BTF hidden, as on a
# kernel built without it, and a copy of it named by btf_path.
if [ "$BTF_PATH_RUN" = 1 ]; then
  sed -e 's/enabled: false/enabled: true/' -e 's/^drain_interval:.*/drain_interval: 1s/' \
    "$SOURCE_DIR/config/ebpf-metricsd.yaml" >/tmp/all-tracers.yaml
  cp /sys/kernel/btf/vmlinux /tmp/guest-vmlinux.btf
  : >/tmp/empty
  sed -e 's|^btf_path:.*|btf_path: /tmp/guest-vmlinux.btf|' /tmp/all-tracers.yaml >/tmp/btf-path.yaml
  grep -q '^btf_path: /tmp/guest-vmlinux.btf' /tmp/btf-path.yaml ||
    echo "btf_path: /tmp/guest-vmlinux.btf" >>/tmp/btf-path.yaml
  run_daemon btf-path /tmp/btf-path.yaml unshare -m --propagation private /bin/sh -c \
    'mount --bind /tmp/empty /sys/kernel/btf/vmlinux && exec "$@"' sh
fi

cd /tmp
# Inside TCG the libbpf-tools oracles lose events: the exact oracles decide here.
export EBPF_METRICSD_NO_EXTERNAL_ORACLES=1
# Emulated, a sample (its walk in the kernel, its naming in the daemon) costs 20 to 50 times
# more: the profile tests sample at 97 Hz instead of 997, for the guest to keep up.
export EBPF_METRICSD_PROFILE_TEST_HZ=97
# The slow-event tests through the C library run their workload built without frame pointers
# alone: the build with them runs the same programs over the same kernel events (the host runs
# both), and each costs 10 to 45 guest seconds.
export EBPF_METRICSD_ONE_WORKLOAD_BUILD=1
"$BUILD_DIR/tests/bpf_tests" -r xml -d yes -o /tmp/bpf.xml ${BPF_TEST_ARGS:+"$BPF_TEST_ARGS"} >/tmp/bpf.out 2>&1
say "EMD-BPF-EXIT $?"
say "EMD-BEGIN bpf-xml"
cat /tmp/bpf.xml >&3
say "EMD-END bpf-xml"
say "EMD-BEGIN bpf-out"
tail -n 200 /tmp/bpf.out >&3
say "EMD-END bpf-out"

#!/bin/busybox sh
# A kernel-matrix guest's stall job, run by guest-init.sh from the initramfs itself (busybox,
# the daemon and its libraries; no host root needed, so kernels without 9p run it too): the
# daemon with every tracer and every optional label on (kmalloc with its per-cache counts where the kernel has them),
# and a workload that fires every hook, each round in a new cgroup so that the labelled maps
# keep inserting: syscalls, wakeups, forks and exits, blocking sleeps, page faults, loopback
# TCP (accepted and refused) and its packets, writes and direct reads on the scratch disk,
# page cache hits and misses, kmalloc/kfree, and an OOM kill in a memory-limited cgroup
# every few rounds. Every command has a timeout, so a stuck command is a stall of the guest,
# not of the job; the host watches the heartbeat (guest-init.sh) and reports a stall with
# the CPUs' stacks.
#
# Reports on the second serial port: EMD-STALL-STARTED, EMD-STALL-ROUNDS,
# EMD-DAEMON-EXIT-stall, the tracer_up lines (section stall) and the daemon's log
# (stall-log).
. /matrix.env
say() { echo "$*" >/dev/ttyS1; }
# busybox's wget faults here; nc speaks HTTP/1.0 well enough.
get() { printf 'GET %s HTTP/1.0\r\nHost: guest\r\n\r\n' "$1" | timeout 15 nc 127.0.0.1 9810 2>/dev/null; }
metrics() { get /metrics; }

# Slow-event capture on every tracer that has it, with thresholds the workload crosses
# (syscall and off-CPU waits of 10 ms, connects and block requests of 1 ms), and the
# profile at 99 Hz: every program the daemon has, the CFI copies at sys_exit included.
sed -e 's/enabled: false/enabled: true/' -e 's/cgroup: false/cgroup: true/' \
  -e 's/comm: false/comm: true/' -e "s/caches: false/caches: $KMALLOC_CACHES/" \
  -e 's/^drain_interval:.*/drain_interval: 1s/' \
  -e 's/^    frequency: 19$/    frequency: 99/' \
  -e 's/^    # slow: {threshold: 10ms,/    slow: {threshold: 10ms,/' \
  -e 's/^    # slow: {threshold: 50ms,/    slow: {threshold: 1ms,/' \
  -e '/^  offcpu_time:/,/^  [a-z_]*:$/s/^    # slow: {threshold: 100ms,/    slow: {threshold: 10ms,/' \
  -e '/^  tcp_connect_latency:/,/^  [a-z_]*:$/s/^    # slow: {threshold: 100ms,/    slow: {threshold: 1ms,/' \
  /ebpf-metricsd.yaml >/tmp/stall.yaml
# The shipped config's comments are what the edits above match: say so when they no longer do.
n=$(grep -c '^    slow: ' /tmp/stall.yaml)
grep -q '^    frequency: 99$' /tmp/stall.yaml || n=0
[ "$n" -eq 4 ] || say "EMD-GUEST-ERROR the stall job's config has $n of 4 slow captures or no 99 Hz profile"

cg=/sys/fs/cgroup
echo "+memory +io +pids" >$cg/cgroup.subtree_control 2>/dev/null
data=/scratch/stall.dat

# One round of the workload, in a new cgroup: every hook fires in it.
round() {
  w=$cg/emd-stall-$1
  mkdir $w
  sh -c "echo \$\$ >$w/cgroup.procs
    printf 'GET /metrics HTTP/1.0\r\n\r\n' | timeout 15 nc 127.0.0.1 9810 >/dev/null 2>&1
    timeout 5 nc 127.0.0.1 1 </dev/null >/dev/null 2>&1 # refused
    timeout 20 dd if=/dev/urandom of=$data bs=1M count=4 conv=fsync 2>/dev/null
    timeout 20 dd if=$data of=/dev/null bs=64k iflag=direct 2>/dev/null
    timeout 10 cat $data >/dev/null
    echo 1 >/proc/sys/vm/drop_caches
    timeout 10 cat $data >/dev/null
    for j in 1 2 3 4 5; do timeout 5 true; done
    timeout 5 sleep 0.2"
  if [ $(($1 % 4)) -eq 0 ]; then
    o=$cg/emd-stall-oom
    mkdir -p $o
    echo 16M >$o/memory.max
    echo 0 >$o/memory.swap.max 2>/dev/null
    sh -c "echo \$\$ >$o/cgroup.procs && exec timeout 20 dd if=/dev/zero of=/dev/null bs=64M count=1" 2>/dev/null
  fi
  rmdir $w 2>/dev/null
}

# The workload runs from before the daemon starts until /tmp/stall.stop: programs are
# attached, maps made and the first reads done while every hook fires, as on a busy host.
rm -f /tmp/stall.stop /tmp/stall.rounds
(n=0
while [ ! -e /tmp/stall.stop ]; do
  n=$((n + 1))
  round $n
  echo $n >/tmp/stall.rounds
done) &
workload=$!

/ebpf-metricsd --config /tmp/stall.yaml --web.listen-address 127.0.0.1:9810 --log.level debug \
  >/tmp/daemon-stall.log 2>&1 &
daemon=$!

# Started when every tracer has reported (up or not). Meanwhile the kernel stacks of the
# loading daemon's threads are read, as an operator's tools do.
i=0
while [ $i -lt 300 ] && kill -0 $daemon 2>/dev/null; do
  sleep 1
  i=$((i + 1))
  cat /proc/$daemon/task/*/stack >/dev/null 2>&1
  n=$(metrics | grep -c '^ebpf_metricsd_tracer_up{')
  [ "$n" -ge "$TRACER_COUNT" ] && break
done
say "EMD-STALL-STARTED $(cut -d' ' -f1 /proc/uptime) after $i s"
say "EMD-POSSIBLE-CPUS $(cat /sys/devices/system/cpu/possible)"

end=$(($(cut -d. -f1 /proc/uptime) + STALL_SECONDS))
while [ "$(cut -d. -f1 /proc/uptime)" -lt $end ] && kill -0 $daemon 2>/dev/null; do
  sleep 1
done
touch /tmp/stall.stop
wait $workload
say "EMD-STALL-ROUNDS $(cat /tmp/stall.rounds 2>/dev/null || echo 0)"

lines=$(metrics | grep -E '^ebpf_metricsd_(tracer_up|drain_errors_total|dropped_events_total)\{')
kill -TERM $daemon 2>/dev/null
# A daemon that does not stop within a minute is a failure of its own, not a stall.
i=0
while kill -0 $daemon 2>/dev/null && [ $i -lt 60 ]; do sleep 1; i=$((i + 1)); done
if kill -0 $daemon 2>/dev/null; then
  say "EMD-DAEMON-EXIT-stall did not stop on SIGTERM within 60 s"
  kill -KILL $daemon
else
  wait $daemon
  say "EMD-DAEMON-EXIT-stall $?"
fi
say "EMD-BEGIN stall"
[ -n "$lines" ] && echo "$lines" >/dev/ttyS1
say "EMD-END stall"
say "EMD-BEGIN stall-log"
awk '!/ debug / || /stopped in/' /tmp/daemon-stall.log | grep -E '^[0-9]{4}-' | tail -n 60 >/dev/ttyS1
say "EMD-END stall-log"

# Leave the cgroup tree as the boot found it, for the oracle tests of a full boot.
for d in $cg/emd-stall-*; do [ -d "$d" ] && rmdir "$d" 2>/dev/null; done
echo "-memory -io -pids" >$cg/cgroup.subtree_control 2>/dev/null
rm -f $data

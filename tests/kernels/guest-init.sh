#!/bin/busybox sh
# PID 1 of a kernel-matrix guest. Loads the modules that reach the host's root (9p over
# virtio), mounts it read-only at /host with the guest's own /proc, /sys, /dev, a tmpfs /tmp
# and /run and an ext4 scratch disk at /var/tmp (page cache and loop devices need a real
# disk), then runs /job.sh chrooted there. The job reports on the second serial port;
# the first one carries the kernel's console. Settings come from /matrix.env.
/bin/busybox --install -s /bin
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
. /matrix.env

# The guest's progress, once a second on the third serial port: the host takes a gap as a
# stall and asks the kernel and qemu what the CPUs are doing.
(while :; do
  echo "EMD-BEAT $(cut -d' ' -f1 /proc/uptime) $(cut -d' ' -f1-3 /proc/loadavg)"
  sleep 1
done) >/dev/ttyS2 2>/dev/null &
# Where the kernel can see a stall itself (hung task, soft lockup), it says so on the console
# without panicking, so that the host can still look at the CPUs; the host's NMI then makes
# it panic, which prints every task's state and stack (panic_print=1 on the command line).
echo 10 >/proc/sys/kernel/hung_task_timeout_secs 2>/dev/null

fail() {
  echo "EMD-GUEST-ERROR $*" >/dev/ttyS1
  poweroff -f
}

for m in $(cat /modules/order); do
  insmod "/modules/$m" || fail "insmod $m"
done

# The stall job, from the initramfs alone: /tmp, cgroup v2, the scratch disk at /scratch.
mkdir -p /tmp /scratch
mount -t tmpfs tmpfs /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t bpf bpf /sys/fs/bpf
mdev -s 2>/dev/null
i=0
while [ ! -b /dev/vda ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
mount -t ext4 /dev/vda /scratch || fail "mount scratch disk"
# The kernel's symbols, for the host to name the addresses on a stalled CPU's stack.
cat /proc/kallsyms >/scratch/kallsyms
sync
ip link set lo up
/stall-job.sh
[ "$JOB" = full ] || {
  echo "EMD-GUEST-DONE" >/dev/ttyS1
  sync
  poweroff -f
}

mkdir -p /host
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 hostroot /host ||
  fail "mount 9p host root"
# The host's root once more, without the guest's mounts over /tmp, /run and /var/tmp below,
# so that a build or kernel cache under one of those can be put back in place.
mkdir -p /host-as-is
mount -o bind /host /host-as-is || fail "bind the host root"
mount -t proc proc /host/proc
mount -t sysfs sysfs /host/sys
mount -t devtmpfs devtmpfs /host/dev
mkdir -p /host/dev/pts /host/dev/shm 2>/dev/null
mount -t devpts devpts /host/dev/pts
mount -t tmpfs tmpfs /host/dev/shm
mount -t tmpfs tmpfs /host/tmp
mount -t tmpfs tmpfs /host/run
mount -t bpf bpf /host/sys/fs/bpf
mount -t cgroup2 cgroup2 /host/sys/fs/cgroup
mount -t debugfs debugfs /host/sys/kernel/debug 2>/dev/null
mount -t tracefs tracefs /host/sys/kernel/tracing 2>/dev/null

# Modules the kernel asks for later (loop, veth, qdiscs) come from the kernel's own package,
# through the host's modprobe.
cat >/sbin/emd-modprobe <<EOF
#!/bin/sh
exec chroot /host /sbin/modprobe -d "$KERNEL_ROOT" "\$@"
EOF
chmod +x /sbin/emd-modprobe
echo /sbin/emd-modprobe >/proc/sys/kernel/modprobe
chroot /host /sbin/modprobe -d "$KERNEL_ROOT" -a loop || fail "modprobe loop"
rm -f /scratch/stall.dat
mount -o bind /scratch /host/var/tmp || fail "bind the scratch disk"

# The build, the sources and the kernel package, if under a directory the guest covers.
for d in "$BUILD_DIR" "$SOURCE_DIR" "$KERNEL_ROOT"; do
  case "$d" in
  /tmp/* | /run/* | /var/tmp/*)
    mkdir -p "/host$d"
    mount -o bind "/host-as-is$d" "/host$d" || fail "bind $d"
    ;;
  esac
done

cp /job.sh /host/tmp/emd-job.sh
cp /matrix.env /host/tmp/emd-matrix.env
chroot /host /bin/bash /tmp/emd-job.sh
echo "EMD-GUEST-DONE" >/dev/ttyS1
sync
poweroff -f

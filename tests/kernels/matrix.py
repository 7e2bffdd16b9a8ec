#!/usr/bin/env python3
"""The kernel matrix: boots Debian's kernel packages under qemu and, in each, runs the built
daemon with every tracer enabled and the privileged BPF tests (every tracer against its
oracle) from the host's root, shared read-only over 9p. Prints a table kernel x tracer:
the hook the daemon chose, whether it is up, whether its oracle tests passed.

    matrix.py --build BUILD_DIR [--kernels 5.10,6.1,6.12,newest] [--cache DIR]
              [--tests CATCH_SPEC] [--keep DIR]

Exit status: 0 every tracer up and every test passed on every kernel, 1 otherwise, 77 when
qemu or the kernel packages cannot be had here (reported as skipped by ctest).
"""

import argparse
import concurrent.futures
import bisect
import gzip
import lzma
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(os.path.dirname(HERE))
SKIP = 77

# Debian's kernels (tests/kernels/fetch-kernels.sh names them), the ones whose first boot
# also runs the oracle tests, and how often each is booted. Each boot is watched for stalls;
# a stall that happens in one boot of n escapes k boots with odds ((n - 1) / n) ** k, so
# repeated boots find rarer ones, at a boot's cost each: the kernel without the allocators
# that keep BPF programs off the scheduler's locks (5.10: docs/host-safety.md) boots twice,
# its cloud flavour once (three 5.10 boots a run).
ALL_KERNELS = ["5.10", "5.10-cloud", "6.1", "6.1-cloud", "6.1-rt", "6.12", "newest"]
FULL_KERNELS = ["5.10", "6.1", "6.12", "newest"]
DEFAULT_BOOTS = "5.10=2,*=1"
# The kernel whose boots have 64 possible CPUs (2 online): per-CPU maps and everything
# sized by the possible CPUs are sized for them, as on a large host. 6.1, as kernels before
# 6.9 take possible_cpus= as the count; later ones take it as a limit and count only the
# CPUs qemu's ACPI table (revision 1) lists as present.
MANY_CPUS_KERNEL = "6.1"

# What a full boot's bpf_tests run (a Catch2 test spec). The ends of the supported range run
# every test but the comparisons with external tools, which lose events under TCG. The
# kernels between them run every tracer's oracle tests and, of the profiler's checks of its
# user-space work (CPU shares, thread times, windows, stacks walked through the C library:
# 250 guest seconds of the two boots, the same programs as at the ends), two: the known
# workload's shares and stacks (with and without frame pointers, walked and not), and one
# (workloads by cgroup) that proves its programs load, attach and count per cgroup.
TESTS_ALL = "~[external]"
TESTS_BETWEEN = ("~[external]~[profile]~[unwind],[cgroup][profile],"
                 "profile: a known workload's CPU shares*")
BETWEEN_KERNELS = {"6.1", "6.12"}
# The full boots at the ends also run the daemon with the kernel's BTF hidden and a copy of
# it named by btf_path (its CO-RE relocations made against the file): the same code path on
# every kernel, proven where the kernels' types differ most, and not again between them
# (about 50 s of guest time each, the daemon loading every tracer under emulation).


def btf_path_run(name):
    return name not in BETWEEN_KERNELS


# Kernels whose kmalloc tracer refuses `caches: true` (kmem_cache_alloc has no cache argument
# before 6.1): their stall job runs it without, so that its programs are loaded there too.
# Every tracer must be up in the stall job.
NO_KMALLOC_CACHES = {"5.10", "5.10-cloud"}


def default_jobs():
    """Guests at once: the CPUs this process may use, and 2.5 GiB of available memory each
    (a guest has 2 GiB)."""
    cpus = len(os.sched_getaffinity(0))
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(l.split()[1]) for l in f if l.startswith("MemAvailable:"))
        cpus = min(cpus, max(1, avail // (2560 * 1024)))
    except (OSError, StopIteration, ValueError):
        pass
    return max(1, cpus)

# The modules a guest loads from its initramfs to reach the host's root; the rest come
# from the chrooted modprobe.
BOOT_MODULES = ["virtio_pci", "virtio_blk", "ext4", "9pnet_virtio", "9p"]

# Which tracers each BPF test file proves: tests/bpf/<tracer>_test.cpp proves <tracer>, and
# these files prove the tracers named.
TEST_FILE_TRACERS = {}
# Test files whose cases each prove the tracers their name begins with
# ("syscall_latency by cgroup: ...", "runqueue_latency and offcpu_time by cgroup: ...").
TEST_CASE_NAMES_TRACERS = {"cgroup_labels_test.cpp"}


def case_tracers(fname, case_name, tracers):
    if fname in TEST_CASE_NAMES_TRACERS:
        head = case_name.split(" by ")[0]
        return [t for t in tracers if t in head.replace(",", " ").split()]
    if fname in TEST_FILE_TRACERS:
        return TEST_FILE_TRACERS[fname]
    return [t for t in tracers if fname == t + "_test.cpp"]


def tracer_names(build_dir):
    """The registry's tracer names, as the daemon lists them."""
    out = subprocess.run([os.path.join(build_dir, "ebpf-metricsd"), "--list-tracers"],
                         capture_output=True, text=True, check=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def skip(reason):
    print(f"SKIP: kernel matrix: {reason}")
    if os.environ.get("EBPF_METRICSD_REQUIRE_PRIVILEGED") == "1":
        print("FAIL: the kernel matrix is required here (EBPF_METRICSD_REQUIRE_PRIVILEGED=1)")
        sys.exit(1)
    sys.exit(SKIP)


def fetch_kernels(cache, wanted):
    proc = subprocess.run(["bash", os.path.join(HERE, "fetch-kernels.sh"), cache],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        skip("Debian's kernel packages could not be fetched: " + proc.stderr.strip()[-400:])
    kernels = {}
    for line in proc.stdout.splitlines():
        name, root = line.split("\t")
        kernels[name] = root
    missing = [k for k in wanted if k not in kernels]
    if missing:
        sys.exit(f"unknown kernels {missing}; fetch-kernels.sh knows {sorted(kernels)}")
    return [(k, kernels[k]) for k in wanted]


def module_files(root, version, names):
    """insmod order (dependencies first) of the modules `names`, skipping built-in ones."""
    order = []
    for name in names:
        out = subprocess.run(["modprobe", "-d", root, "-S", version, "--show-depends", name],
                             capture_output=True, text=True)
        if out.returncode != 0:
            # Packages without modules.builtin (7.x) cannot say a module is built in; one
            # that is neither a file nor listed is taken as built in, and the guest's mount
            # of the host's root fails loudly if it is not.
            if "not found" in out.stderr:
                continue
            raise RuntimeError(f"{name}: {out.stderr.strip()}")
        for line in out.stdout.splitlines():
            parts = line.split()
            if parts and parts[0] == "insmod" and parts[1] not in order:
                order.append(parts[1])
    return order


def read_module(path):
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".xz"):
        return lzma.decompress(data)
    if path.endswith(".zst"):
        return subprocess.run(["zstd", "-dc", path], capture_output=True, check=True).stdout
    if path.endswith(".gz"):
        return gzip.decompress(data)
    return data


def make_initramfs(workdir, kernel_root, version, env):
    tree = os.path.join(workdir, "initramfs")
    for d in ("bin", "sbin", "proc", "sys", "dev", "modules", "host"):
        os.makedirs(os.path.join(tree, d), exist_ok=True)
    shutil.copy("/bin/busybox", os.path.join(tree, "bin/busybox"))
    shutil.copy(os.path.join(HERE, "guest-init.sh"), os.path.join(tree, "init"))
    os.chmod(os.path.join(tree, "init"), 0o755)
    shutil.copy(os.path.join(HERE, "guest-job.sh"), os.path.join(tree, "job.sh"))
    shutil.copy(os.path.join(HERE, "stall-job.sh"), os.path.join(tree, "stall-job.sh"))
    os.chmod(os.path.join(tree, "stall-job.sh"), 0o755)
    shutil.copy(os.path.join(SOURCE_DIR, "config", "ebpf-metricsd.yaml"),
                os.path.join(tree, "ebpf-metricsd.yaml"))
    # The daemon and the shared libraries it loads, at their own paths.
    daemon = os.path.join(env["BUILD_DIR"], "ebpf-metricsd")
    shutil.copy(daemon, os.path.join(tree, "ebpf-metricsd"))
    ldd = subprocess.run(["ldd", daemon], capture_output=True, text=True, check=True).stdout
    for lib in re.findall(r"(/\S+) \(0x", ldd):
        dest = os.path.join(tree, lib.lstrip("/"))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy(os.path.realpath(lib), dest)
    with open(os.path.join(tree, "matrix.env"), "w") as f:
        for k, v in env.items():
            f.write(f"{k}={shlex.quote(v)}\n")
    names = []
    for i, path in enumerate(module_files(kernel_root, version, BOOT_MODULES)):
        name = f"{i:02d}-" + re.sub(r"\.ko.*$", ".ko", os.path.basename(path))
        with open(os.path.join(tree, "modules", name), "wb") as f:
            f.write(read_module(path))
        names.append(name)
    with open(os.path.join(tree, "modules/order"), "w") as f:
        f.write("\n".join(names) + "\n")
    image = os.path.join(workdir, "initramfs.cpio.gz")
    files = subprocess.run(["find", "."], cwd=tree, capture_output=True, check=True).stdout
    cpio = subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"], cwd=tree, input=files,
                          capture_output=True, check=True).stdout
    with open(image, "wb") as f:
        f.write(gzip.compress(cpio, 1))
    return image


def make_scratch_disk(workdir):
    path = os.path.join(workdir, "scratch.img")
    with open(path, "wb") as f:
        f.truncate(1 << 30)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "root_owner=0:0", path], check=True)
    return path


def sections(text):
    """EMD-BEGIN name ... EMD-END name blocks and EMD-KEY value lines of the report."""
    blocks, values = {}, {}
    current = None
    for line in text.splitlines():
        line = line.rstrip("\r")
        m = re.match(r"^EMD-BEGIN (\S+)$", line)
        if m:
            current = m.group(1)
            blocks[current] = []
            continue
        if current and line == f"EMD-END {current}":
            current = None
            continue
        if current:
            blocks[current].append(line)
            continue
        m = re.match(r"^(EMD-[A-Za-z-]+)\s*(.*)$", line)
        if m:
            values[m.group(1)] = m.group(2)
    return {k: "\n".join(v) for k, v in blocks.items()}, values


class KernelSymbols:
    """Kernel text addresses to names, from the guest's /proc/kallsyms, which the guest
    copies to its scratch disk at boot (Debian's System.map is a stub). The guest boots with
    nokaslr, so the addresses hold for the whole run."""

    def __init__(self, disk):
        self.addrs, self.names = [], []
        text = subprocess.run(["debugfs", "-R", "cat /kallsyms", disk], capture_output=True,
                              text=True).stdout
        entries = []
        for line in text.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[1] in "TtWw":
                entries.append((int(parts[0], 16), parts[2]))
        entries.sort()
        self.addrs = [a for a, _ in entries]
        self.names = [n for _, n in entries]

    def name(self, addr):
        if not self.addrs or addr < self.addrs[0] or addr >= 0xffffffffff000000:
            return None
        i = bisect.bisect_right(self.addrs, addr) - 1
        if i < 0 or addr - self.addrs[i] > 0x10000:
            return None
        return f"{self.names[i]}+{addr - self.addrs[i]:#x}"


class Monitor:
    """qemu's human monitor on a unix socket."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(path)
        self._until_prompt()

    def _until_prompt(self):
        data = b""
        while not data.endswith(b"(qemu) "):
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return data.decode(errors="replace")

    def cmd(self, line):
        self.sock.sendall(line.encode() + b"\n")
        out = self._until_prompt()
        # The monitor echoes the command (with terminal escapes) on the first line.
        return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", out).split("\n", 1)[-1].rsplit("(qemu)", 1)[0]


KERNEL_CS, KERNEL_SS, INT3 = 0x10, 0x18, 0xCC


def trap_frames(words):
    """The interrupted kernel instruction pointers of the exception and interrupt frames on a
    stack scan, innermost first: the words ip, cs, flags, sp, ss the CPU pushed, kernel cs and
    ss."""
    return [words[i] for i in range(len(words) - 4)
            if words[i] >= 0xffff800000000000 and words[i + 1] == KERNEL_CS
            and words[i + 4] == KERNEL_SS]


class Cpu:
    """One vCPU of a stalled guest as the monitor saw it."""

    def __init__(self, index, rip, irqs, words, trapped_byte=None, error=""):
        self.index, self.rip, self.irqs, self.words = index, rip, irqs, words
        # The byte in memory now where the innermost trap frame's ip says an int3 was taken.
        self.trapped_byte = trapped_byte
        self.error = error


def cpu_state(monitor_path, nmi):
    """What each vCPU of a stalled guest is doing: its registers, a raw scan of its kernel
    stack (innermost first), and the byte in memory now before the innermost trap frame's ip
    (where an int3 it took would be). Then, with `nmi`, an NMI to every CPU, which the guest's
    kernel (unknown_nmi_panic) answers with a panic that prints the stack of the CPU that
    takes it and every task's state (panic_print=1)."""
    cpus = []
    try:
        mon = Monitor(monitor_path)
        regs = mon.cmd("info registers -a")
        for block in re.split(r"\n(?=CPU#\d+)", "\n" + regs):
            m = re.search(r"CPU#(\d+)", block)
            rip = re.search(r"RIP=([0-9a-f]+)", block)
            rsp = re.search(r"RSP=([0-9a-f]+)", block)
            efl = re.search(r"RFL=([0-9a-f]+)", block)
            if not (m and rip and rsp):
                continue
            cpu, rip, rsp = int(m.group(1)), int(rip.group(1), 16), int(rsp.group(1), 16)
            words, trapped_byte = [], None
            if rip >= 0xffff800000000000:
                mon.cmd(f"cpu {cpu}")
                dump = mon.cmd(f"x /512gx {rsp:#x}")
                words = [int(w, 16) for w in re.findall(r"0x([0-9a-f]{16})", dump)]
                frames = trap_frames(words)
                if frames:
                    byte = re.search(r":\s*0x([0-9a-f]{2})", mon.cmd(f"x /1bx {frames[0] - 1:#x}"))
                    trapped_byte = int(byte.group(1), 16) if byte else None
            cpus.append(Cpu(cpu, rip, bool(efl and int(efl.group(1), 16) & 0x200), words,
                            trapped_byte))
        if nmi:
            mon.cmd("nmi")
    except OSError as e:
        cpus.append(Cpu(-1, 0, False, [], error=f"qemu monitor: {e}"))
    return cpus


def in_int3_handler(cpu, symbols):
    """Whether the CPU is in the kernel's int3 handler (its entry, or called from it)."""
    names = [symbols.name(cpu.rip) or ""] + [symbols.name(w) or "" for w in cpu.words[:64]]
    return any(n.startswith(("asm_exc_int3+", "exc_int3+", "poke_int3_handler+",
                             "do_int3+", "kprobe_int3_handler+")) for n in names)


def stale_int3(cpus, symbols):
    """The verdict on a stall where a vCPU is in the int3 handler for an int3 that memory no
    longer holds, or None. The kernel patches code (a tracepoint's static key, an ftrace call
    site) by writing an int3 first and the new instruction last; a CPU that took the int3
    meanwhile is sent back to run what is there now. A real CPU then runs the new bytes (iret
    serializes it); qemu's multi-threaded TCG has been seen to run its stale translation of
    the int3 instead, forever. That is the emulator's stop, not the kernel's
    (docs/host-safety.md, "The second 5.10 stop")."""
    for cpu in cpus:
        if cpu.index < 0 or cpu.trapped_byte is None or cpu.trapped_byte == INT3:
            continue
        if not in_int3_handler(cpu, symbols):
            continue
        site = trap_frames(cpu.words)[0] - 1
        return (f"cpu {cpu.index} is in the int3 handler for an int3 at "
                f"{symbols.name(site) or hex(site)}, where memory holds {cpu.trapped_byte:#04x} "
                "now: the emulator runs code the kernel has replaced (multi-threaded TCG), "
                "a stop no real CPU makes")
    return None


def watch_cpus(monitor_path, disk):
    """The vCPUs of a stalled guest, the kernel's symbols, and the verdict of stale_int3:
    up to five looks a few tenths of a second apart (a CPU that loops through the int3
    handler is seen in it sooner or later), then the NMI."""
    symbols = KernelSymbols(disk)
    for _ in range(4):
        cpus = cpu_state(monitor_path, nmi=False)
        verdict = stale_int3(cpus, symbols)
        if verdict:
            break
        time.sleep(0.3)
    cpus = cpu_state(monitor_path, nmi=True)
    return cpus, symbols, verdict or stale_int3(cpus, symbols)


def describe_cpus(cpus, symbols):
    lines = []
    for cpu in cpus:
        if cpu.index < 0:
            lines.append(cpu.error)
            continue
        lines.append(f"cpu {cpu.index}: at {symbols.name(cpu.rip) or hex(cpu.rip)}, "
                     f"interrupts {'on' if cpu.irqs else 'off'}; kernel text on its stack:")
        frames = []
        for w in cpu.words:
            name = symbols.name(w)
            if name and (not frames or frames[-1] != name):
                frames.append(name)
        lines += ["    " + f for f in frames[:40]]
    return lines


def guest_accel():
    """qemu's -accel for the guests: one host thread for both vCPUs. qemu's default TCG for
    two vCPUs is multi-threaded, which runs code the guest's kernel has already replaced when
    the kernel patches itself (a tracepoint's static key, an ftrace call site): it stops 5.10
    guests and oopses newer ones with nothing of ours loaded (docs/host-safety.md, "The
    second 5.10 stop"). The jobs mostly wait, so a single thread costs no time.
    EBPF_METRICSD_KERNEL_ACCEL overrides it, to show that."""
    return os.environ.get("EBPF_METRICSD_KERNEL_ACCEL", "tcg,thread=single")


def boot(name, kernel_root, build_dir, tracers, job, tests, keep, timeout, stall_after,
         stall_seconds, possible_cpus):
    """One guest run. Returns (version, seconds, qemu_error, report, console, stall) where
    stall is None or the lines that describe a guest that stopped making progress."""
    version = open(os.path.join(kernel_root, ".version")).read().strip()
    workdir = tempfile.mkdtemp(prefix=f"emd-kernel-{name}-")
    try:
        env = {
            "KERNEL_ROOT": kernel_root,
            "BUILD_DIR": os.path.abspath(build_dir),
            "SOURCE_DIR": SOURCE_DIR,
            "TRACER_COUNT": str(len(tracers)),
            "BPF_TEST_ARGS": tests,
            "JOB": job,
            "STALL_SECONDS": str(stall_seconds),
            "KMALLOC_CACHES": "false" if name in NO_KMALLOC_CACHES else "true",
            "BTF_PATH_RUN": "1" if btf_path_run(name) else "0",
        }
        initrd = make_initramfs(workdir, kernel_root, version, env)
        disk = make_scratch_disk(workdir)
        console = os.path.join(workdir, "console.log")
        report = os.path.join(workdir, "report.log")
        beats = os.path.join(workdir, "beats.log")
        monitor = os.path.join(workdir, "monitor.sock")
        accel = guest_accel()
        cmdline = ("console=ttyS0 panic=-1 loglevel=7 mitigations=off nokaslr "
                   "softlockup_panic=0 watchdog_thresh=5 hung_task_panic=0 "
                   "unknown_nmi_panic=1 panic_print=1 sysrq_always_enabled "
                   f"possible_cpus={possible_cpus}")
        cmd = [
            "qemu-system-x86_64", "-accel", accel, "-cpu", "max",
            "-smp", f"2,maxcpus={possible_cpus}", "-m", "2G",
            "-nodefaults", "-no-reboot", "-display", "none",
            "-kernel", os.path.join(kernel_root, "boot", f"vmlinuz-{version}"),
            "-initrd", initrd,
            "-append", cmdline,
            "-serial", f"file:{console}", "-serial", f"file:{report}",
            "-serial", f"file:{beats}",
            "-monitor", f"unix:{monitor},server=on,wait=off",
            "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,"
                       "multidevs=remap",
            "-drive", f"file={disk},if=virtio,format=raw,cache=unsafe",
        ]
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
        qemu_error, stall = "", None
        last_size, last_progress = 0, start
        while True:
            try:
                proc.wait(timeout=1)
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            size = os.path.getsize(beats) if os.path.exists(beats) else 0
            if size != last_size:
                last_size, last_progress = size, now
            elif size and now - last_progress > stall_after:
                with open(beats, errors="replace") as f:
                    last = (f.read().strip().splitlines() or ["-"])[-1]
                stall = [f"no progress for {stall_after} s (the guest's last heartbeat: {last})"]
                cpus, symbols, verdict = watch_cpus(monitor, disk)
                time.sleep(20)  # the guest's panic output, if it still can
                break
            if now - start > timeout:
                qemu_error = f"timed out after {timeout} s"
                stall = [f"the boot took more than {timeout} s"]
                cpus, symbols, verdict = watch_cpus(monitor, disk)
                time.sleep(20)
                break
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        elif proc.returncode != 0:
            qemu_error = proc.stderr.read().strip()
        seconds = time.monotonic() - start
        if stall:
            if verdict:
                stall[0] += "; " + verdict
            stall += describe_cpus(cpus, symbols)
        text = open(report, errors="replace").read() if os.path.exists(report) else ""
        console_text = open(console, errors="replace").read() if os.path.exists(console) else ""
        if keep:
            dest = os.path.join(keep, name)
            os.makedirs(dest, exist_ok=True)
            for f in (console, report, beats):
                if os.path.exists(f):
                    shutil.copy(f, dest)
        return version, seconds, qemu_error, text, console_text, stall
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def failure_text(case):
    """The failed assertions and exceptions of a Catch2 XML test case, indented."""
    lines = []
    infos = []  # Catch2 writes a failed assertion's INFO messages just before it
    for e in case.iter():
        if e.tag == "Info":
            infos.append(" ".join((e.text or "").split()))
        elif e.tag == "Expression":
            if e.get("success") == "false":
                orig = (e.findtext("Original") or "").strip()
                expanded = (e.findtext("Expanded") or "").strip()
                where = f"{os.path.basename(e.get('filename', ''))}:{e.get('line', '')}"
                lines.append(f"{where}: {orig}  with  {expanded}")
                lines.extend("  info: " + i[:2000] for i in infos)
            infos = []
        elif e.tag in ("Exception", "FatalErrorCondition", "Failure"):
            where = f"{os.path.basename(e.get('filename', ''))}:{e.get('line', '')}"
            lines.append(f"{where}: {e.tag}: {(e.text or '').strip()}")
    return "\n".join("        " + l for l in lines[:24])


def tracer_up(block):
    """tracer -> (hook, up) from a daemon run's tracer_up lines."""
    up = {}
    for line in block.splitlines():
        m = re.match(r'^ebpf_metricsd_tracer_up\{(.*)\} (\S+)$', line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            up[labels.get("tracer")] = (labels.get("hook", "-"), float(m.group(2)) == 1)
    return up


def drain_errors(block):
    errors = {}
    for line in block.splitlines():
        m = re.match(r'^ebpf_metricsd_drain_errors_total\{tracer="([^"]*)"\} (\S+)$', line)
        if m and float(m.group(2)) > 0:
            errors[m.group(1)] = float(m.group(2))
    return errors


def parse_result(tracers, text):
    blocks, values = sections(text)
    result = {t: {"hook": "-", "up": False, "tests": [], "failed": [], "btf_path": None}
              for t in tracers}
    # The hooks are the stall job's (every tracer and label on; its drain errors are
    # stall_problems'); the btf_path run's are the second column.
    for t, (hook, up) in tracer_up(blocks.get("stall", "")).items():
        if t in result:
            result[t]["hook"], result[t]["up"] = hook, up
    for t, (hook, up) in tracer_up(blocks.get("btf-path", "")).items():
        if t in result:
            result[t]["btf_path"] = (hook, up)
    errors = {f"{t} (btf_path run)": n
              for t, n in drain_errors(blocks.get("btf-path", "")).items()}
    xml = blocks.get("bpf-xml", "")
    if xml:
        try:
            root = ET.fromstring(xml)
            durations = []
            for case in root.iter("TestCase"):
                fname = os.path.basename(case.get("filename", ""))
                outcome = case.find("OverallResult")
                ok = outcome is not None and outcome.get("success") == "true"
                if outcome is not None and outcome.get("durationInSeconds"):
                    durations.append((float(outcome.get("durationInSeconds")), case.get("name")))
                why = "" if ok else failure_text(case)
                for t in case_tracers(fname, case.get("name", ""), tracers):
                    if t in result:
                        result[t]["tests"].append(case.get("name"))
                        if not ok:
                            result[t]["failed"].append(f"{case.get('name')}\n{why}")
            # Where the guest's time goes: its slowest tests, for the suite's time budget.
            durations.sort(reverse=True)
            values["EMD-SLOWEST"] = "; ".join(f"{d:.0f} s {n[:60]}" for d, n in durations[:5])
        except ET.ParseError as e:
            values["EMD-XML-ERROR"] = str(e)
    return result, errors, blocks, values


def parse_boots(spec, kernels):
    """"5.10=5,*=3" -> {kernel: boots}."""
    counts = {}
    for item in spec.split(","):
        k, _, n = item.partition("=")
        if not n.strip().isdigit():
            sys.exit(f"--boots: {item!r} is not KERNEL=COUNT")
        counts[k.strip()] = int(n)
    return {k: counts.get(k, counts.get("*", 1)) for k in kernels}


def stall_problems(tracers, blocks, values):
    """What the stall job (every tracer and label on, a workload on every hook) reports."""
    problems = []
    if "EMD-STALL-ROUNDS" not in values:
        problems.append("the stall job did not finish")
        return problems
    rounds = values["EMD-STALL-ROUNDS"].strip()
    if not rounds.isdigit() or int(rounds) < 1:
        problems.append("the stall job ran no workload round")
    status = values.get("EMD-DAEMON-EXIT-stall", "?")
    if status != "0":
        problems.append(f"daemon (stall run, every label on) exit status {status}")
    up = tracer_up(blocks.get("stall", ""))
    for t in tracers:
        if t not in up:
            problems.append(f"{t}: no tracer_up with every label on")
        elif not up[t][1]:
            problems.append(f"{t}: not up with every label on")
    for t, n in drain_errors(blocks.get("stall", "")).items():
        problems.append(f"{t}: {n:.0f} failed drains with every label on")
    return problems


def full_problems(tracers, result, drain_errors, values, btf_path_run):
    problems = []
    status = values.get("EMD-DAEMON-EXIT-btf-path", "?")
    if btf_path_run and status != "0":
        problems.append(f"daemon (btf-path run) exit status {status}")
    if not btf_path_run and status != "?":
        problems.append("the daemon ran with btf_path where it was not asked to")
    if values.get("EMD-BPF-EXIT") != "0":
        problems.append(f"bpf_tests exit status {values.get('EMD-BPF-EXIT', '?')}")
    for t, n in drain_errors.items():
        problems.append(f"{t}: {n:.0f} failed drains")
    for t, r in result.items():
        if not r["up"]:
            problems.append(f"{t}: not up")
        if btf_path_run and (not r["btf_path"] or not r["btf_path"][1]):
            problems.append(f"{t}: not up with btf_path and the kernel's BTF hidden")
        if not r["tests"]:
            problems.append(f"{t}: no oracle test ran")
        for f in r["failed"]:
            problems.append(f"{t}: failed test: {f}")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--kernels", default=",".join(ALL_KERNELS))
    ap.add_argument("--full", default=",".join(FULL_KERNELS),
                    help="kernels whose first boot also runs the oracle tests")
    ap.add_argument("--boots", default=DEFAULT_BOOTS,
                    help="boots per kernel, e.g. '5.10=5,*=3' (each runs the stall job)")
    ap.add_argument("--jobs", type=int, default=default_jobs(),
                    help="guests at once (each keeps one host CPU busy)")
    ap.add_argument("--stall-seconds", type=int, default=10,
                    help="seconds of workload in each boot's stall job")
    ap.add_argument("--stall-after", type=int, default=30,
                    help="seconds without a guest heartbeat that make a stall")
    ap.add_argument("--cache", default=os.environ.get("EBPF_METRICSD_KERNEL_CACHE",
                                                      "/var/cache/ebpf-metricsd/kernels"))
    ap.add_argument("--tests", default="",
                    help="Catch2 test spec for bpf_tests on every kernel (default: "
                         f"'{TESTS_ALL}' on 5.10 and the newest, '{TESTS_BETWEEN}' between)")
    ap.add_argument("--keep", default="", help="copy each guest's console and report here")
    # A stopped guest is found by its heartbeat (--stall-after); this only ends one that runs
    # on without finishing. A full boot takes 260 to 390 s of a quiet 2-CPU host and twice
    # that with one of its CPUs busy (beside stress-ng --cpu 1: 622 s and still going), so
    # the limit leaves room for a host several times slower.
    ap.add_argument("--timeout", type=int, default=2400, help="seconds per boot")
    ap.add_argument("--many-cpus", default=MANY_CPUS_KERNEL,
                    help="the kernel whose boots have 64 possible CPUs (2 online)")
    args = ap.parse_args()

    if os.geteuid() != 0:
        skip("needs root (9p export of the host's root, loop devices in the guest)")
    for tool in ("qemu-system-x86_64", "busybox", "cpio", "modprobe", "mkfs.ext4", "curl"):
        if not shutil.which(tool):
            skip(f"{tool} is not installed (packaging/install-deps.sh --with-tests)")
    tracers = tracer_names(args.build)
    if "thread=single" not in guest_accel():
        print(f"NOTE: guests run with -accel {guest_accel()}: multi-threaded TCG stops guests "
              "that patch their own code; such stops are named as the emulator's", flush=True)
    wanted = [k for k in args.kernels.split(",") if k]
    full = {k for k in args.full.split(",") if k}
    boots = parse_boots(args.boots, wanted)
    t0 = time.monotonic()
    kernels = fetch_kernels(args.cache, wanted)
    fetch_seconds = time.monotonic() - t0

    # Every boot of the plan, longest first, run `jobs` at a time (one single-threaded TCG
    # guest keeps one host CPU busy): the full boots that run every test (5.10 and the
    # newest, 390 to 450 s), then the full boots between them (240 to 260 s), then the
    # stall boots (80 to 110 s), so that the short ones fill the lanes at the end.
    plan = []
    for name, root in kernels:
        for n in range(boots[name]):
            plan.append((name, root, n, "full" if n == 0 and name in full else "stall"))
    plan.sort(key=lambda p: (p[3] != "full", p[0] in BETWEEN_KERNELS))

    cpus_of = {(name, n): 64 if name == args.many_cpus else 2
               for name, _, n, job in plan}

    def run(item):
        name, root, n, job = item
        try:
            cpus = cpus_of[(name, n)]
            tests = args.tests or (TESTS_BETWEEN if name in BETWEEN_KERNELS else TESTS_ALL)
            return boot(name, root, args.build, tracers, job, tests,
                        os.path.join(args.keep, f"boot{n + 1}") if args.keep else "",
                        args.timeout, args.stall_after, args.stall_seconds, cpus)
        except Exception as e:  # one boot's failure to set up is that boot's problem
            return "?", 0.0, f"the boot could not be set up: {e!r}", "", "", None

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run, item) for item in plan]
        outcomes = {}
        for item, fut in zip(plan, futures):
            outcomes[item[:3]] = (item[3], fut.result())

    rows, summary, ok = [], [], True
    for name, root in kernels:
        passed, seconds_all = 0, []
        for n in range(boots[name]):
            job, (version, seconds, qemu_error, text, console, stall) = outcomes[(name, root, n)]
            label = f"{name} boot {n + 1}/{boots[name]} ({job})"
            seconds_all.append(seconds)
            result, drain_errs, blocks, values = parse_result(tracers, text)
            problems = []
            if stall:
                problems.append("STALL: " + stall[0])
            if qemu_error:
                problems.append(f"qemu: {qemu_error[-300:]}")
            if "EMD-GUEST-ERROR" in values:
                problems.append("guest: " + values["EMD-GUEST-ERROR"])
            if "EMD-GUEST-DONE" not in text:
                problems.append("the guest did not finish its job")
                crash = re.search(r"^.*(Kernel panic|Oops|BUG:|soft lockup|blocked for more).*$",
                                  console, re.M)
                if crash:
                    problems.append("guest kernel: " + crash.group(0).strip())
                    if "int3" in crash.group(0) and "thread=single" not in guest_accel():
                        problems.append("an int3 oops under multi-threaded TCG is the "
                                        "emulator's (see the NOTE above)")
            problems += stall_problems(tracers, blocks, values)
            if job == "full":
                rows.append((name, version, seconds, result))
                problems += full_problems(tracers, result, drain_errs, values,
                                          btf_path_run(name))
            possible = values.get("EMD-POSSIBLE-CPUS", "?").strip()
            want = f"0-{cpus_of[(name, n)] - 1}"
            if possible != want:
                problems.append(f"possible CPUs {possible}, booted for {want}")
            print(f"== {label} ({version}): {seconds:.0f} s, possible CPUs {possible}, "
                  f"{values.get('EMD-STALL-ROUNDS', '0')} workload rounds"
                  + (", ok" if not problems else ""), flush=True)
            if values.get("EMD-SLOWEST"):
                print(f"   slowest tests: {values['EMD-SLOWEST']}")
            if not problems:
                passed += 1
                continue
            ok = False
            for p in problems:
                print(f"   problem: {p}")
            if stall:
                print("   the CPUs when the guest stopped:\n      " + "\n      ".join(stall[1:]))
            for run_name in ("stall", "btf-path"):
                log = blocks.get(f"{run_name}-log", "").strip()
                if log:
                    print(f"   daemon log ({run_name} run):\n      "
                          + log.replace("\n", "\n      "))
            out = blocks.get("bpf-out", "").strip()
            if out and values.get("EMD-BPF-EXIT") != "0":
                print("   bpf_tests:\n      " + out.replace("\n", "\n      "))
            if "EMD-GUEST-DONE" not in text:
                tail = console.strip().splitlines()[-150 if stall else -30:]
                print("   console tail:\n      " + "\n      ".join(tail))
        summary.append((name, passed, boots[name], sum(seconds_all)))

    def cell(name, r):
        status = "up" if r["up"] else "DOWN"
        oracle = "-" if not r["tests"] else ("FAIL" if r["failed"] else "pass")
        btf_path = ("DOWN" if not r["btf_path"] or not r["btf_path"][1] else r["btf_path"][0])
        if not btf_path_run(name):
            btf_path = "not run"
        return f"{r['hook']} {status} {oracle} / {btf_path}"

    print()
    print("boots (each: every tracer and label on under a workload on every hook, "
          "watched for stalls):")
    for name, passed, total, secs in summary:
        print(f"  {name}: {passed}/{total} boots passed, {secs:.0f} s")
    if rows:
        print()
        print("kernel matrix: hook chosen, up, oracle tests / hook with btf_path and no kernel BTF")
        header = ["tracer"] + [f"{n} ({v})" for n, v, _, _ in rows]
        table = [header] + [[t] + [cell(n, r[t]) for n, _, _, r in rows] for t in tracers]
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        for i, row in enumerate(table):
            print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
            if i == 0:
                print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    total = time.monotonic() - t0
    print(f"\nwall time {total:.0f} s with {args.jobs} guests at once (fetch "
          f"{fetch_seconds:.0f} s; guest seconds: "
          + ", ".join(f"{n} {s:.0f} s" for n, _, _, s in summary) + ")")
    print("kernel matrix: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

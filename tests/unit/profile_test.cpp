// The profile's user-space half without the kernel: symbols (a kallsyms file written here,
// this test binary's own ELF symbols), the store's windows and bounds, pprof and the flame
// graph's data, and the routes' answers to bad parameters.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "ebpf_metricsd/base/clock.h"
#include "ebpf_metricsd/base/syscall_names.h"
#include "ebpf_metricsd/profile/flame_graph.h"
#include "ebpf_metricsd/profile/pprof.h"
#include "ebpf_metricsd/profile/profile_routes.h"
#include "ebpf_metricsd/profile/profile_store.h"
#include "ebpf_metricsd/profile/profiles.h"
#include "ebpf_metricsd/profile/symbols.h"
#include "profile.pb.h"

using namespace ebpf_metricsd;
using namespace ebpf_metricsd::profiling;

namespace {

std::string temp_file(const std::string& name, const std::string& text) {
  const std::string dir = "/tmp/emd-profile-unit-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

Frame frame(const std::string& fn, bool kernel = false) {
  Frame f;
  f.function = fn;
  f.module = kernel ? "[kernel]" : "/usr/bin/app";
  f.kernel = kernel;
  f.address = std::hash<std::string>{}(fn)&0xffff;
  return f;
}

Sample sample(std::uint32_t stack, SampleKind kind, std::uint64_t ns, std::uint32_t pid = 10) {
  Sample s;
  s.pid = pid;
  s.tid = pid;
  s.comm = "app";
  s.kind = kind;
  s.count = 1;
  s.ns = ns;
  s.stack = stack;
  return s;
}

}  // namespace

// A function of this binary with a name to look for.
extern "C" __attribute__((noinline, used)) int emd_profile_unit_marker(int x) { return x * 3 + 1; }

TEST_CASE("kernel symbols: text symbols of the kernel, modules and BPF programs by address") {
  const std::string kallsyms = temp_file("kallsyms",
                                         "ffffffff81000000 T _stext\n"
                                         "ffffffff81000100 t do_one\n"
                                         "ffffffff81000200 D some_data\n"
                                         "ffffffff81000300 T do_two\n"
                                         "ffffffffc0001000 t ext4_read\t[ext4]\n"
                                         "ffffffffc0002000 t bpf_prog_abc_handler\t[bpf]\n"
                                         "0000000000000000 T zeroed\n");
  const std::string modules = temp_file("modules", "ext4 1 0 - Live 0x0\n");
  KernelSymbols k(kallsyms, modules);
  k.refresh();
  CHECK(k.symbols() == 5);  // text only, no zero addresses
  CHECK(k.resolve(0xffffffff81000150, false).function == "do_one");
  // Data between two functions belongs to the one before: text symbols only.
  CHECK(k.resolve(0xffffffff81000250, false).function == "do_one");
  // A return address just past a function's last call is still that function.
  CHECK(k.resolve(0xffffffff81000300, true).function == "do_one");
  CHECK(k.resolve(0xffffffff81000300, false).function == "do_two");
  const Frame m = k.resolve(0xffffffffc0001010, false);
  CHECK(m.function == "ext4_read");
  CHECK(m.module == "[ext4]");
  CHECK(m.kernel);
  CHECK(k.resolve(0xffffffffc0002004, false).module == "[bpf]");
  CHECK(k.resolve(0x1000, false).function == "[kernel]+0x1000");
}

TEST_CASE("user symbols: this process's own functions, by file offset and build-id") {
  UserSymbols u;
  u.capture(getpid());
  CHECK(u.processes() == 1);
  CHECK(u.modules() > 0);
  const auto address = reinterpret_cast<std::uint64_t>(&emd_profile_unit_marker);
  const Frame f = u.resolve(getpid(), address + 2, false);
  CHECK(f.function == "emd_profile_unit_marker");
  CHECK(f.module == std::filesystem::read_symlink("/proc/self/exe").string());
  CHECK(f.build_id.size() >= 16);  // the linker's build-id note
  CHECK_FALSE(f.kernel);
  // A C++ name comes demangled (a libstdc++ function this binary calls).
  CHECK(demangle("_ZNSt6vectorIiSaIiEE9push_backERKi") ==
        "std::vector<int, std::allocator<int> >::push_back(int const&)");
  // An address no mapping covers, and an unknown process: module+offset, no crash.
  CHECK(u.resolve(getpid(), 8, false).function == "[unknown]+0x8");
  CHECK(u.resolve(999999999, address, false).module == "[unknown]");

  // A process that exits is forgotten at the second call after it is gone (its last stacks
  // are symbolized between the two).
  const pid_t child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  u.capture(child);
  CHECK(u.processes() == 2);
  u.forget_exited();
  CHECK(u.processes() == 2);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  u.forget_exited();
  CHECK(u.processes() == 2);  // seen gone: its stacks of the last read are still to come
  CHECK(u.resolve(child, address, false).function == "emd_profile_unit_marker");
  u.forget_exited();
  CHECK(u.processes() == 1);
}

TEST_CASE("user symbols: code mapped after the mappings were read is named at once") {
  const std::string kallsyms = temp_file("kallsyms-mapped", "ffffffff81000000 T _stext\n");
  const std::string modules = temp_file("modules-mapped", "");
  Symbolizer sym({}, kallsyms, modules);
  const auto marker = reinterpret_cast<std::uint64_t>(&emd_profile_unit_marker);
  // A copy of this binary, mapped after the mappings were read (as a library is by dlopen,
  // or by the dynamic loader just after an exec): the marker at its file offset in it.
  std::uint64_t file_offset = 0;
  {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) {
      unsigned long long start = 0, end = 0, offset = 0;
      if (std::sscanf(line.c_str(), "%llx-%llx %*s %llx", &start, &end, &offset) == 3 &&
          marker >= start && marker < end) {
        file_offset = marker - start + offset;
      }
    }
  }
  REQUIRE(file_offset != 0);
  const std::string copy = temp_file("mapped-later", "");
  std::filesystem::copy_file("/proc/self/exe", copy,
                             std::filesystem::copy_options::overwrite_existing);
  const int fd = open(copy.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  const auto size = static_cast<std::size_t>(lseek(fd, 0, SEEK_END));
  const std::uint64_t before_read = monotonic_ns();
  REQUIRE(sym.user_frames(getpid(), std::vector<std::uint64_t>{marker + 1}).size() == 1);
  void* map = mmap(nullptr, size, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
  close(fd);
  REQUIRE(map != MAP_FAILED);
  const std::vector<std::uint64_t> later = {reinterpret_cast<std::uint64_t>(map) + file_offset + 1};
  // A stack taken before the mappings were read cannot be in what was mapped since: not a
  // reason to read them again.
  CHECK(sym.user_frames(getpid(), later, false, before_read).empty());
  // One taken since is, with no pause after the first read (the writes of a program the
  // daemon first saw while its dynamic loader ran come within milliseconds).
  const auto named = sym.user_frames(getpid(), later, false, monotonic_ns());
  REQUIRE(named.size() == 1);
  CHECK(named[0].function == "emd_profile_unit_marker");
  CHECK(named[0].module == copy);
  munmap(map, size);
  std::filesystem::remove(copy);
}

// A function whose line the test below looks for: the line of its body.
extern "C" __attribute__((noinline, used)) int emd_profile_unit_lined(int x) {
  return emd_profile_unit_marker(x) * 5; /* emd_profile_unit_lined's line */
}

TEST_CASE("user symbols: source lines from this binary's DWARF, within the DWARF budget") {
  const auto address = reinterpret_cast<std::uint64_t>(&emd_profile_unit_lined);
  int line = 0;
  {
    std::ifstream src(__FILE__);
    std::string text;
    for (int n = 1; std::getline(src, text); ++n) {
      if (line == 0 && text.find("/* emd_profile_unit_lined's line */") != std::string::npos)
        line = n;  // the first: the function's (this line holds the marker too)
    }
  }
  REQUIRE(line > 0);
  {
    // This binary's DWARF is larger than the default budget takes.
    UserSymbols::Limits large;
    large.max_dwarf_bytes = std::uint64_t{1} << 30;
    UserSymbols u(large);
    u.capture(getpid());
    // Without lines asked for, none, and no DWARF read.
    CHECK(u.resolve(getpid(), address, false).lines.empty());
    CHECK(u.held().dwarf_bytes == 0);
    const Frame f = u.resolve(getpid(), address, false, true);
    CHECK(f.function == "emd_profile_unit_lined");
    REQUIRE_FALSE(f.lines.empty());
    // Its own function last, by the frame's name, at a line of its body.
    CHECK(f.lines.back().function == "emd_profile_unit_lined");
    CHECK_THAT(f.lines.back().file, Catch::Matchers::EndsWith("profile_test.cpp"));
    CHECK(f.lines.back().line >= static_cast<std::uint32_t>(line - 1));
    CHECK(f.lines.back().line <= static_cast<std::uint32_t>(line));
    CHECK(u.held().dwarf_bytes > 0);
    CHECK(u.held().lines_over_budget == 0);
    CHECK(u.held().name_bytes > 0);
  }
  {
    // A budget smaller than this binary's DWARF: names, no lines, and the lookup counted.
    UserSymbols::Limits small;
    small.max_dwarf_bytes = 4096;
    UserSymbols u(small);
    u.capture(getpid());
    const Frame f = u.resolve(getpid(), address, false, true);
    CHECK(f.function == "emd_profile_unit_lined");
    CHECK(f.lines.empty());
    CHECK(u.held().dwarf_bytes == 0);
    CHECK(u.held().lines_over_budget == 1);
  }
}

TEST_CASE("JIT code: named from the process's perf map, read as hostile input") {
  void* code =
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(code != MAP_FAILED);
  const auto base = reinterpret_cast<std::uint64_t>(code);
  const std::string map = "/tmp/perf-" + std::to_string(getpid()) + ".map";
  const auto write_map = [&] {
    std::ofstream out(map);
    // Out of order; an entry written again later for the same code wins; a range past the
    // top of the address space and an empty one are skipped; a long name is cut.
    out << "not an entry\n"
        << std::hex << base + 0x40 << " 40 LazyCompile:*hot app.js:12\n"
        << base << " 40 jit_old\n"
        << base << " 40 jit_first\n"
        << "zz 10 bad\nffffffffffffffff 10 overflow\n"
        << base + 0x80 << " 0 empty\n"
        << base + 0xc0 << " 40 " << std::string(300, 'n') << "\n";
  };
  write_map();
  {
    UserSymbols u;
    u.capture(getpid());
    const Frame f = u.resolve(getpid(), base + 4, false);
    CHECK(f.function == "jit_first");
    CHECK(f.module == "[jit]");
    CHECK(u.resolve(getpid(), base + 0x44, false).function == "LazyCompile:*hot app.js:12");
    // No entry covers it (the empty one covers nothing): the anonymous memory's offset.
    const Frame none = u.resolve(getpid(), base + 0x80, false);
    CHECK(none.module == "[anon]");
    CHECK(none.function.rfind("[anon]+0x", 0) == 0);
    CHECK(u.resolve(getpid(), base + 0xc4, false).function == std::string(256, 'n'));
    CHECK(u.held().jit_bytes > 0);
    CHECK(u.held().jit_maps_refused == 0);
  }
  {
    // A map larger than the cap, a FIFO (never waited on) and a symlink (never followed) are
    // not read; the first two are counted.
    UserSymbols::Limits small;
    small.max_jit_map_file = 16;
    UserSymbols u(small);
    u.capture(getpid());
    CHECK(u.resolve(getpid(), base + 4, false).module == "[anon]");
    CHECK(u.held().jit_maps_refused == 1);
    std::filesystem::remove(map);
    REQUIRE(mkfifo(map.c_str(), 0600) == 0);
    UserSymbols fifo;
    fifo.capture(getpid());
    CHECK(fifo.resolve(getpid(), base + 4, false).module == "[anon]");
    CHECK(fifo.held().jit_maps_refused == 1);
    std::filesystem::remove(map);
    const std::string real = map + ".real";
    write_map();
    std::filesystem::rename(map, real);
    std::filesystem::create_symlink(real, map);
    UserSymbols link;
    link.capture(getpid());
    CHECK(link.resolve(getpid(), base + 4, false).module == "[anon]");
    std::filesystem::remove(real);
  }
  std::filesystem::remove(map);
  munmap(code, 4096);
}

// A caller of the marker, whose return address a stack holds.
extern "C" __attribute__((noinline, used)) int emd_profile_unit_caller(int x) {
  return emd_profile_unit_marker(x) + 1;
}

TEST_CASE("user symbols: a stack of a process gone before its mappings were read, counted") {
  const std::string kallsyms = temp_file("kallsyms-gone", "ffffffff81000000 T _stext\n");
  const std::string modules = temp_file("modules-gone", "");
  Symbolizer sym({}, kallsyms, modules);
  const std::uint32_t gone = 4194400;  // above PID_MAX_LIMIT (4194304): no process has it
  CHECK(sym.sizes().stacks_without_mappings == 0);
  const auto frames = sym.user_frames(gone, std::vector<std::uint64_t>{0x401000, 0x401100});
  REQUIRE(frames.size() == 1);
  CHECK(frames[0].function == "[mappings not read]");
  CHECK(sym.sizes().stacks_without_mappings == 1);
  // A process whose mappings were read: none counted.
  const auto marker = reinterpret_cast<std::uint64_t>(&emd_profile_unit_marker);
  CHECK(sym.user_frames(getpid(), std::vector<std::uint64_t>{marker + 1}).size() == 1);
  CHECK(sym.sizes().stacks_without_mappings == 1);
}

TEST_CASE("one symbolizer, one set of rules, for a slow event and a profile sample alike") {
  const std::string kallsyms = temp_file("kallsyms-rules",
                                         "ffffffff81000000 T _stext\n"
                                         "ffffffff81000100 T pipe_read\n"
                                         "ffffffff81000200 T vfs_read\n"
                                         "ffffffff81000300 T __schedule\n"
                                         "ffffffff81000400 T __traceiter_sched_switch\n"
                                         "ffffffff81000500 T bpf_trace_run4\n"
                                         "ffffffffc0002000 t bpf_prog_abc_on_switch\t[bpf]\n");
  const std::string modules = temp_file("modules-rules", "");
  Symbolizer sym({}, kallsyms, modules);
  // A tracing program's stack: its machinery's frames at the top go, and every frame is a
  // return address, looked up one byte before (0xffffffff81000300, __schedule's first byte,
  // returns to a call at the end of vfs_read).
  const std::vector<std::uint64_t> taken_in_program = {0xffffffffc0002010, 0xffffffff81000510,
                                                       0xffffffff81000410, 0xffffffff81000300,
                                                       0xffffffff81000150};
  const auto call = sym.kernel_frames(taken_in_program, StackOrigin::Call);
  REQUIRE(call.size() == 2);
  CHECK(call[0].function == "vfs_read");  // 0x...300 - 1: the call at vfs_read's end
  CHECK(call[1].function == "pipe_read");
  // An interrupted stack: the innermost frame is where the thread was, and a BPF program's
  // frame is CPU time spent there.
  const auto interrupted = sym.kernel_frames(taken_in_program, StackOrigin::Interrupt);
  REQUIRE(interrupted.size() == 5);
  CHECK(interrupted[0].function == "bpf_prog_abc_on_switch");
  CHECK(interrupted[3].function == "vfs_read");

  // The same user stack, as a slow event and as a profile sample would have it: the same
  // frames. An address outside every mapping ends it (frame-pointer walking gone astray).
  const auto marker = reinterpret_cast<std::uint64_t>(&emd_profile_unit_marker);
  const auto caller = reinterpret_cast<std::uint64_t>(&emd_profile_unit_caller);
  const std::vector<std::uint64_t> user = {marker + 1, caller + 5, 0x10, caller + 5};
  const auto as_event = sym.frames(getpid(), {}, user, StackOrigin::Call);
  const auto as_sample = sym.user_frames(getpid(), user);
  REQUIRE(as_event.size() == 2);
  CHECK(as_event == as_sample);
  CHECK(as_event[0].function == "emd_profile_unit_marker");
  CHECK(as_event[1].function == "emd_profile_unit_caller");
  // A process whose mappings were never read: one frame that says so, no addresses.
  const auto gone = sym.user_frames(999999999, user);
  REQUIRE(gone.size() == 1);
  CHECK(gone[0].function == "[mappings not read]");
}

TEST_CASE("profile store: windows, retention and the sample bound") {
  ProfileStore::Limits limits;
  limits.retention = std::chrono::seconds(10);
  limits.max_samples = 100;
  ProfileStore store(limits);
  const auto t0 = Clock::now();
  const std::vector<Frame> a = {frame("leaf_a"), frame("main")};
  const std::vector<Frame> b = {frame("leaf_b"), frame("main")};
  store.add_batch(t0 + std::chrono::seconds(1), {sample(0, SampleKind::OnCpu, 30)}, {a});
  store.add_batch(t0 + std::chrono::seconds(2), {sample(1, SampleKind::OffCpu, 70)}, {a, b});
  CHECK(store.frames_kept() == 3);  // leaf_a, main, leaf_b: each frame once
  // Batches that ended after `from` and by `to`.
  const ProfileWindow w =
      store.window(t0 + std::chrono::milliseconds(1500), t0 + std::chrono::seconds(2));
  REQUIRE(w.samples.size() == 1);
  CHECK(w.frames[w.stacks[w.samples[0].stack][0]].function == "leaf_b");
  CHECK(store.window(t0, t0 + std::chrono::seconds(3)).samples.size() == 2);
  // A batch 20 s later: the first two are past the retention and go, with their stacks.
  store.add_batch(t0 + std::chrono::seconds(22), {sample(0, SampleKind::OnCpu, 5)},
                  {{frame("leaf_c")}});
  CHECK(store.samples_kept() == 1);
  CHECK(store.frames_kept() == 1);
  const ProfileWindow later = store.window(t0, t0 + std::chrono::seconds(30));
  REQUIRE(later.samples.size() == 1);
  CHECK(later.frames[later.stacks[later.samples[0].stack][0]].function == "leaf_c");
  // A batch larger than max_samples keeps max_samples and counts the rest; the oldest
  // batches make room.
  std::vector<Sample> many(150, sample(0, SampleKind::OnCpu, 1));
  store.add_batch(t0 + std::chrono::seconds(23), std::move(many), {{frame("leaf_d")}});
  CHECK(store.dropped_samples() == 50);
  CHECK(store.samples_kept() == 100);
  // A sample whose stack was not given is refused, nothing added.
  CHECK_THROWS(store.add_batch(t0 + std::chrono::seconds(24), {sample(3, SampleKind::OnCpu, 1)},
                               {{frame("x")}}));
}

TEST_CASE("profile store: a stack given in parts is the stack given whole") {
  ProfileStore store;
  const auto t0 = Clock::now();
  const std::vector<Frame> kernel = {frame("schedule"), frame("do_read")};
  const std::vector<Frame> user = {frame("read"), frame("main")};
  std::vector<Frame> whole = kernel;
  whole.insert(whole.end(), user.begin(), user.end());
  store.add_batch(t0 + std::chrono::seconds(1), {sample(0, SampleKind::OffCpu, 10)}, {whole});
  REQUIRE(store.frames_kept() == 4);
  // The same frames viewed in two parts, and a stack that shares its user part: nothing is
  // copied twice, and the first stack is the same stack.
  StackView split;
  split.parts = {std::span<const Frame>(kernel), std::span<const Frame>(user)};
  StackView user_only;
  user_only.parts[1] = user;
  store.add_viewed_batch(t0 + std::chrono::seconds(2),
                         {sample(0, SampleKind::OffCpu, 20), sample(1, SampleKind::OnCpu, 5)},
                         {split, user_only});
  CHECK(store.frames_kept() == 4);
  const ProfileWindow w = store.window(t0, t0 + std::chrono::seconds(3));
  REQUIRE(w.samples.size() == 3);
  CHECK(w.samples[0].stack == w.samples[1].stack);
  const auto& shared = w.stacks[w.samples[2].stack];
  REQUIRE(shared.size() == 2);
  CHECK(w.frames[shared[0]].function == "read");
  CHECK(w.frames[shared[1]].function == "main");
}

TEST_CASE("profile store: new limits keep what is held, within them") {
  ProfileStore store({std::chrono::seconds(600), 1000});
  const auto t0 = Clock::now();
  for (int i = 1; i <= 10; ++i) {
    store.add_batch(t0 + std::chrono::seconds(60 * i), {sample(0, SampleKind::OnCpu, 1)},
                    {{frame("f")}});
  }
  // Ten batches a minute apart; a reload keeps them all with a longer retention...
  store.set_limits({std::chrono::seconds(3600), 1000});
  CHECK(store.samples_kept() == 10);
  CHECK(store.limits().retention == std::chrono::seconds(3600));
  // ...and a window of all of them answers.
  CHECK(store.window(t0, t0 + std::chrono::seconds(600)).samples.size() == 10);
  // A smaller budget keeps the newest (the set_limits time is now, before the batches'
  // ends: the retention takes none); the newest batch always stays.
  store.set_limits({std::chrono::seconds(3600), 4});
  CHECK(store.samples_kept() == 4);
  CHECK(store.window(t0, t0 + std::chrono::seconds(600)).samples.size() == 4);
  store.set_limits({std::chrono::seconds(3600), 1});
  CHECK(store.samples_kept() == 1);
  // The slow events' store likewise.
  SlowEventStore slow({std::chrono::seconds(3600), 100, 1000});
  for (int i = 0; i < 5; ++i) {
    SlowEvent e;
    e.metric = "m";
    e.when = std::chrono::system_clock::now() - std::chrono::minutes((4 - i) * 10);
    slow.keep(e, {frame("g")});
  }
  slow.set_limits({std::chrono::seconds(1300), 100, 1000});
  CHECK(slow.events_kept() == 3);  // 20, 10 and 0 minutes old
  slow.set_limits({std::chrono::seconds(1300), 1, 1000});
  CHECK(slow.events_kept() == 1);
}

namespace {

// A window's off-CPU time and waits.
std::pair<std::uint64_t, std::uint64_t> off_cpu_in(const ProfileWindow& w) {
  std::uint64_t ns = 0, count = 0;
  for (const Sample& s : w.samples) {
    if (s.kind != SampleKind::OffCpu) continue;
    ns += s.ns;
    count += s.count;
  }
  return {ns, count};
}

}  // namespace

TEST_CASE("profile store: a wait spanning batches gives each window its part, none more") {
  ProfileStore::Limits limits;
  limits.retention = std::chrono::seconds(30);
  ProfileStore store(limits);
  const auto t0 = Clock::now();
  const auto at = [&](int ms) { return t0 + std::chrono::milliseconds(ms); };
  // Batches of 1 s: [t0-ish, 1 s], [1 s, 2 s] (empty), [2 s, 3 s], then one to 4 s with a
  // wait that began at 0.5 s and ended at 3.5 s: 3 s blocked, shared 0.5 / 1 / 1 / 0.5.
  store.add_batch(at(1000), {sample(0, SampleKind::OnCpu, 10)}, {{frame("run")}});
  store.add_batch(at(2000), {}, {});
  store.add_batch(at(3000), {sample(0, SampleKind::OnCpu, 10)}, {{frame("run")}});
  Sample wait = sample(0, SampleKind::OffCpu, 3000000000ULL);
  wait.began = at(500);
  wait.ended = at(3500);
  store.add_batch(at(4000), {wait}, {{frame("read"), frame("main")}});
  const auto off = [&](int from_ms, int to_ms) {
    return off_cpu_in(store.window(at(from_ms), at(to_ms)));
  };
  // The first batch began when the store was made, a moment before t0: its part of the
  // wait is from 0.5 s to 1 s.
  CHECK(off(0, 1000).first == 500000000ULL);
  CHECK(off(1000, 2000).first == 1000000000ULL);  // the empty batch has its part too
  CHECK(off(2000, 3000).first == 1000000000ULL);
  CHECK(off(3000, 4000) == std::pair<std::uint64_t, std::uint64_t>{500000000ULL, 1});
  CHECK(off(0, 4000) == std::pair<std::uint64_t, std::uint64_t>{3000000000ULL, 1});
  // Several waits of one call sent as one span (2 s blocked over a 4 s span, 3 s to 7 s):
  // each batch its share of the span, the kept ones in proportion.
  Sample waits = sample(0, SampleKind::OffCpu, 2000000000ULL);
  waits.count = 2;
  waits.began = at(3000);
  waits.ended = at(7000);
  store.add_batch(at(7000), {waits}, {{frame("poll"), frame("main")}});
  CHECK(off(3000, 4000).first == 500000000ULL + 500000000ULL);
  CHECK(off(4000, 7000) == std::pair<std::uint64_t, std::uint64_t>{1500000000ULL, 2});
  // A wait that began before the oldest kept batch: that part goes with it.
  Sample old = sample(0, SampleKind::OffCpu, 60000000000ULL);
  old.began = at(-50000);
  old.ended = at(10000);
  store.add_batch(at(10000), {old}, {{frame("sleep"), frame("main")}});
  const auto last = off(7000, 10000);
  CHECK(last.first == 3000000000ULL);  // 7 s to 10 s: its length, no more
  CHECK(last.second == 1);
  // A wait that ended after its batch did (while the maps were being swapped): the part
  // after goes to the next batch.
  Sample late = sample(0, SampleKind::OffCpu, 1000000000ULL);
  late.began = at(10500);
  late.ended = at(11500);
  store.add_batch(at(11000), {late}, {{frame("read"), frame("main")}});
  CHECK(off(10000, 11000) == std::pair<std::uint64_t, std::uint64_t>{500000000ULL, 1});
  store.add_batch(at(12000), {}, {});
  CHECK(off(11000, 12000) == std::pair<std::uint64_t, std::uint64_t>{500000000ULL, 0});
  // Each wait is kept once, however many batches it spans: 4 waits and 2 on-CPU samples.
  CHECK(store.samples_kept() == 6);
  // Of its 60 s, what the kept batches span: from the first's start (a moment before t0).
  const auto kept_since = store.window(at(-60000), at(1000)).begin;
  CHECK(off(-60000, 10000).first == 3000000000ULL + 2000000000ULL + 10000000000ULL +
                                        static_cast<std::uint64_t>((at(0) - kept_since).count()));
}

TEST_CASE("profile store: waits in progress count up to the newest batch, then as they end") {
  ProfileStore store;
  const auto t0 = Clock::now();
  const auto at = [&](int ms) { return t0 + std::chrono::milliseconds(ms); };
  const auto off = [&](int from_ms, int to_ms) {
    return off_cpu_in(store.window(at(from_ms), at(to_ms)));
  };
  // A thread blocked since 0.5 s, seen so at the reads of 1 s and 2 s (a moment after each).
  const auto in_progress = [&](int seen_ms) {
    Sample w = sample(0, SampleKind::OffCpu, static_cast<std::uint64_t>(seen_ms - 500) * 1000000);
    w.count = 0;
    w.began = at(500);
    w.ended = at(seen_ms);
    return w;
  };
  store.add_batch(at(1000), {}, {{frame("pipe_read", true), frame("read")}}, std::nullopt,
                  {in_progress(1001)});
  CHECK(off(0, 1000) == std::pair<std::uint64_t, std::uint64_t>{500000000ULL, 0});
  store.add_batch(at(2000), {}, {{frame("pipe_read", true), frame("read")}}, std::nullopt,
                  {in_progress(2001)});
  // The newest read replaced the one before: counted once, up to the window's end.
  CHECK(off(0, 2000) == std::pair<std::uint64_t, std::uint64_t>{1500000000ULL, 0});
  CHECK(off(1000, 2000) == std::pair<std::uint64_t, std::uint64_t>{1000000000ULL, 0});
  // It ends at 2.5 s: kept whole with the batch of its end, counted once; nothing in progress.
  Sample ended = in_progress(2500);
  ended.count = 1;
  store.add_batch(at(3000), {ended}, {{frame("pipe_read", true), frame("read")}});
  CHECK(off(0, 3000) == std::pair<std::uint64_t, std::uint64_t>{2000000000ULL, 1});
  CHECK(off(1000, 2000) == std::pair<std::uint64_t, std::uint64_t>{1000000000ULL, 0});
  CHECK(store.samples_kept() == 1);
}

TEST_CASE("profile store: the threads' accounting adds up by thread over a window's batches") {
  ProfileStore store;
  const auto t0 = Clock::now();
  const auto at = [&](int ms) { return t0 + std::chrono::milliseconds(ms); };
  const auto time = [](std::uint32_t pid, std::uint32_t tid, std::uint64_t on, std::uint64_t q) {
    ThreadTime t;
    t.pid = pid;
    t.tid = tid;
    t.comm = "worker";
    t.on_cpu_ns = on;
    t.run_delay_ns = q;
    return t;
  };
  store.add_batch(at(1000), {}, {}, std::vector<ThreadTime>{time(7, 7, 100, 1), time(7, 8, 50, 2)});
  store.add_batch(at(2000), {}, {}, std::vector<ThreadTime>{time(7, 7, 300, 4), time(9, 9, 10, 0)});
  const ProfileWindow all = store.window(at(0), at(2000));
  CHECK(all.accounted);
  REQUIRE(all.threads.size() == 3);
  CHECK(all.threads[0].tid == 7);
  CHECK(all.threads[0].on_cpu_ns == 400);
  CHECK(all.threads[0].run_delay_ns == 5);
  CHECK(all.threads[1].on_cpu_ns == 50);
  CHECK(all.threads[2].pid == 9);
  // Narrowed to one process, and to the second batch.
  SampleFilter one;
  one.pid = 7;
  CHECK(store.window(at(0), at(2000), one).threads.size() == 2);
  const ProfileWindow second = store.window(at(1000), at(2000));
  REQUIRE(second.threads.size() == 2);
  CHECK(second.threads[0].on_cpu_ns == 300);
  // Each entry is kept as a sample is, within max_samples.
  CHECK(store.samples_kept() == 4);
  // A batch without accounting (no task iterator): a window with it says so.
  store.add_batch(at(3000), {}, {});
  CHECK_FALSE(store.window(at(0), at(3000)).accounted);
  CHECK(store.window(at(0), at(2000)).accounted);
}

TEST_CASE("profile store: names, frames and stacks survive the tables' rebuild") {
  // 40 batches a second apart, each of its own process, command, workload and stack of 50
  // frames (2,000 frames in all: the sets grow and rehash); a retention of 10 s expires the
  // older three quarters, and the tables are rebuilt from what is left.
  ProfileStore::Limits limits;
  limits.retention = std::chrono::seconds(10);
  ProfileStore store(limits);
  const auto t0 = Clock::now();
  const auto name = [](const char* what, int i) { return std::string(what) + std::to_string(i); };
  for (int i = 0; i < 40; ++i) {
    Sample s = sample(0, SampleKind::OnCpu, 10, 100 + static_cast<std::uint32_t>(i));
    s.comm = name("comm-", i);
    s.workload.cgroup = name("/workload.slice/unit-", i) + ".service";
    s.workload.pod = name("pod-", i);
    std::vector<Frame> stack;
    for (int d = 0; d < 50; ++d) stack.push_back(frame(name("f", i) + name("_", d)));
    store.add_batch(t0 + std::chrono::seconds(i + 1), {s}, {stack});
  }
  CHECK(store.samples_kept() == 11);  // the newest and the 10 s before it
  const std::size_t frames = store.frames_kept();
  CHECK(frames < 40 * 50);  // rebuilt (when half of the stacks were unused)
  CHECK(frames >= 11 * 50);
  const ProfileWindow w = store.window(t0, t0 + std::chrono::seconds(41));
  REQUIRE(w.samples.size() == 11);
  for (const Sample& s : w.samples) {
    const int i = static_cast<int>(s.pid) - 100;
    INFO("sample of batch " << i);
    CHECK(i >= 29);
    CHECK(s.comm == name("comm-", i));
    CHECK(s.workload.cgroup == name("/workload.slice/unit-", i) + ".service");
    CHECK(s.workload.pod == name("pod-", i));
    REQUIRE(w.stacks[s.stack].size() == 50);
    for (int d = 0; d < 50; ++d) {
      CHECK(w.frames[w.stacks[s.stack][static_cast<std::size_t>(d)]].function ==
            name("f", i) + name("_", d));
    }
  }
  // The same names again are found, not added.
  Sample again = sample(0, SampleKind::OnCpu, 10, 139);
  again.comm = "comm-39";
  again.workload.cgroup = "/workload.slice/unit-39.service";
  again.workload.pod = "pod-39";
  std::vector<Frame> stack;
  for (int d = 0; d < 50; ++d) stack.push_back(frame(name("f", 39) + name("_", d)));
  store.add_batch(t0 + std::chrono::seconds(42), {again}, {stack});
  CHECK(store.frames_kept() <= frames);  // none added (an older batch may have gone)
  const ProfileWindow last =
      store.window(t0 + std::chrono::seconds(41), t0 + std::chrono::seconds(42));
  REQUIRE(last.samples.size() == 1);
  CHECK(last.samples[0].comm == "comm-39");
  CHECK(last.samples[0].workload.pod == "pod-39");
}

TEST_CASE("profile store: the bytes it reports follow the frames it keeps, rebuilt or not") {
  ProfileStore::Limits limits;
  limits.retention = std::chrono::seconds(10);
  ProfileStore store(limits);
  CHECK(store.bytes().frames == 0);
  CHECK(store.bytes().stacks == 0);
  const auto t0 = Clock::now();
  // Two frames whose names the heap holds (100 characters each, 101 bytes with the NUL).
  const std::vector<Frame> stack = {frame(std::string(100, 'a')), frame(std::string(100, 'b'))};
  store.add_batch(t0 + std::chrono::seconds(1), {sample(0, SampleKind::OnCpu, 10)}, {stack});
  const ProfileStore::Bytes first = store.bytes();
  CHECK(first.frames >= 2 * (sizeof(std::uint64_t) + 101));
  CHECK(first.stacks >= 2 * sizeof(std::uint32_t));
  // The same stack again adds no frame.
  store.add_batch(t0 + std::chrono::seconds(2), {sample(0, SampleKind::OnCpu, 10)}, {stack});
  CHECK(store.bytes().frames == first.frames);
  // A minute later the two batches have expired; the tables are rebuilt with the one new
  // frame, whose short name is inline: the long names are no longer counted.
  store.add_batch(t0 + std::chrono::seconds(60), {sample(0, SampleKind::OnCpu, 10)},
                  {{frame("f")}});
  REQUIRE(store.frames_kept() == 1);
  CHECK(store.bytes().frames + 2 * 101 < first.frames);
}

TEST_CASE("profile store: frames keep each name once, and come back whole") {
  ProfileStore store;
  const auto t0 = Clock::now();
  // 1,000 frames of one file, its path and build ID 64 and 40 characters long: kept once.
  std::vector<Frame> stack;
  for (int i = 0; i < 1000; ++i) {
    Frame f = frame("function_" + std::to_string(i % 10));
    f.module = "/opt/service/lib/" + std::string(47, 'm');
    f.build_id = std::string(40, 'b');
    f.address = 0x1000 + static_cast<std::uint64_t>(i);
    stack.push_back(f);
  }
  store.add_batch(t0 + std::chrono::seconds(1), {sample(0, SampleKind::OnCpu, 10)}, {stack});
  REQUIRE(store.frames_kept() == 1000);
  // A frame as a Frame holds it would be at least sizeof(Frame) and its two long strings.
  CHECK(store.bytes().frames < 1000 * (sizeof(Frame) + 65 + 41) / 2);
  const ProfileWindow w = store.window(t0, t0 + std::chrono::seconds(1));
  REQUIRE(w.stacks.size() == 1);
  REQUIRE(w.stacks[0].size() == 1000);
  for (std::size_t i = 0; i < 1000; ++i) CHECK(w.frames[w.stacks[0][i]] == stack[i]);
}

TEST_CASE("profile store: a window of one process, thread, command or workload") {
  ProfileStore store;
  const auto t0 = Clock::now();
  Sample web = sample(0, SampleKind::OnCpu, 30, 100);
  web.comm = "nginx";
  web.workload.cgroup = "nginx.service";
  Sample worker = web;
  worker.tid = 101;
  worker.stack = 1;
  worker.kind = SampleKind::OffCpu;
  Sample db = sample(2, SampleKind::OnCpu, 50, 200);
  db.comm = "postgres";
  db.workload.cgroup = "postgresql.service";
  store.add_batch(t0 + std::chrono::seconds(1), {web, worker, db},
                  {{frame("serve"), frame("main")},
                   {frame("wait"), frame("main")},
                   {frame("query"), frame("main")}});
  const auto to = t0 + std::chrono::seconds(2);
  const auto functions = [](const ProfileWindow& w) {
    std::set<std::string> names;
    for (const Sample& s : w.samples) {
      for (std::uint32_t f : w.stacks[s.stack]) names.insert(w.frames[f].function);
    }
    return names;
  };
  CHECK(store.window(t0, to).samples.size() == 3);
  SampleFilter pid;
  pid.pid = 100;
  ProfileWindow w = store.window(t0, to, pid);
  CHECK(w.samples.size() == 2);
  CHECK(functions(w) == std::set<std::string>{"serve", "wait", "main"});
  // Only the frames the kept samples use are in the window.
  CHECK(w.frames.size() == 3);
  SampleFilter tid;
  tid.tid = 101;
  w = store.window(t0, to, tid);
  REQUIRE(w.samples.size() == 1);
  CHECK(w.samples[0].kind == SampleKind::OffCpu);
  SampleFilter comm;
  comm.comm = "postgres";
  CHECK(functions(store.window(t0, to, comm)) == std::set<std::string>{"query", "main"});
  SampleFilter workload;
  workload.workload = "nginx.service";
  CHECK(store.window(t0, to, workload).samples.size() == 2);
  // All given: each must hold.
  SampleFilter both = pid;
  both.comm = "postgres";
  w = store.window(t0, to, both);
  CHECK(w.samples.empty());
  // An empty window still spans its batch (from when the store was made).
  CHECK(w.begin <= t0);
  CHECK(w.end == t0 + std::chrono::seconds(1));
}

TEST_CASE("pprof: string table, ids, sample types and labels as the format wants them") {
  ProfileStore store;
  store.set_frequency(19);
  const auto t0 = Clock::now();
  Sample on = sample(1, SampleKind::OnCpu, 52631578);
  on.workload.cgroup = "app.service";
  store.add_batch(t0 + std::chrono::seconds(1),
                  {sample(0, SampleKind::OffCpu, 5000), on, sample(0, SampleKind::OffCpu, 7000)},
                  {{frame("schedule", true), frame("leaf_a"), frame("main")},
                   {frame("leaf_b"), frame("main")}});
  const ProfileWindow w = store.window(t0, t0 + std::chrono::seconds(1));
  perftools::profiles::Profile p;
  REQUIRE(p.ParseFromString(pprof_profile(w)));
  REQUIRE(p.string_table_size() > 0);
  CHECK(p.string_table(0).empty());
  const auto str = [&](std::int64_t i) { return p.string_table(static_cast<int>(i)); };
  REQUIRE(p.sample_type_size() == 3);
  CHECK(str(p.sample_type(0).type()) == "samples");
  CHECK(str(p.sample_type(0).unit()) == "count");
  CHECK(str(p.sample_type(1).type()) == "cpu");
  CHECK(str(p.sample_type(2).type()) == "off_cpu");
  CHECK(str(p.sample_type(2).unit()) == "nanoseconds");
  CHECK(p.period() == 1000000000 / 19);
  CHECK(str(p.default_sample_type()) == "cpu");
  // The two off-CPU samples of the same thread and stack are one, their values added.
  REQUIRE(p.sample_size() == 2);
  std::set<std::uint64_t> ids;
  for (const auto& l : p.location()) {
    CHECK(l.id() != 0);
    CHECK(ids.insert(l.id()).second);
    CHECK(l.mapping_id() != 0);
  }
  for (const auto& m : p.mapping()) CHECK(m.id() != 0);
  bool off_found = false, on_found = false;
  for (const auto& s : p.sample()) {
    REQUIRE(s.value_size() == 3);
    std::map<std::string, std::string> labels;
    for (const auto& l : s.label()) {
      labels[str(l.key())] = l.str() ? str(l.str()) : std::to_string(l.num());
    }
    CHECK(labels["pid"] == "10");
    CHECK(labels["comm"] == "app");
    if (labels["state"] == "off_cpu") {
      off_found = true;
      CHECK(s.value(0) == 2);
      CHECK(s.value(1) == 0);
      CHECK(s.value(2) == 12000);
      REQUIRE(s.location_id_size() == 3);  // innermost first: schedule, leaf_a, main
    } else {
      on_found = true;
      CHECK(s.value(1) == 52631578);
      CHECK(labels["cgroup"] == "app.service");
    }
  }
  CHECK(off_found);
  CHECK(on_found);
  // Sample type names without "-" (Pyroscope refuses them).
  for (const auto& t : p.sample_type()) CHECK(str(t.type()).find('-') == std::string::npos);
}

TEST_CASE("source lines: a pprof Line per inlined function, a flame graph node each") {
  ProfileStore store;
  store.set_frequency(19);
  const auto t0 = Clock::now();
  Frame lined = frame("hot_three");
  lined.lines = {{"spin_three", "/src/w.c", 70}, {"hot_three", "/src/w.c", 73}};
  store.add_batch(t0 + std::chrono::seconds(1), {sample(0, SampleKind::OnCpu, 300)},
                  {{lined, frame("main")}});
  const ProfileWindow w = store.window(t0, t0 + std::chrono::seconds(1));
  perftools::profiles::Profile p;
  REQUIRE(p.ParseFromString(pprof_profile(w)));
  const auto str = [&](std::int64_t i) { return p.string_table(static_cast<int>(i)); };
  std::map<std::uint64_t, const perftools::profiles::Function*> functions;
  for (const auto& f : p.function()) functions[f.id()] = &f;
  REQUIRE(p.location_size() == 2);
  const auto& loc = p.location(0);
  REQUIRE(loc.line_size() == 2);  // innermost first, as pprof orders them
  CHECK(str(functions.at(loc.line(0).function_id())->name()) == "spin_three");
  CHECK(str(functions.at(loc.line(0).function_id())->filename()) == "/src/w.c");
  CHECK(loc.line(0).line() == 70);
  CHECK(str(functions.at(loc.line(1).function_id())->name()) == "hot_three");
  CHECK(loc.line(1).line() == 73);
  // A frame without lines: its function alone, no line number.
  REQUIRE(p.location(1).line_size() == 1);
  CHECK(p.location(1).line(0).line() == 0);
  const auto& m = p.mapping(static_cast<int>(loc.mapping_id() - 1));
  CHECK(m.has_line_numbers());
  CHECK(m.has_inline_frames());
  // The flame graph: main, hot_three, then spin_three as a node of its own; with lines,
  // named function:line.
  const auto j = nlohmann::json::parse(flame_graph_json(w, FlameGrouping::None, 100));
  CHECK(j["root"]["c"][0]["n"] == "main");
  CHECK(j["root"]["c"][0]["c"][0]["n"] == "hot_three");
  CHECK(j["root"]["c"][0]["c"][0]["c"][0]["n"] == "spin_three");
  const auto l = nlohmann::json::parse(flame_graph_json(w, FlameGrouping::None, 100, {}, true));
  CHECK(l["root"]["c"][0]["n"] == "main");
  CHECK(l["root"]["c"][0]["c"][0]["n"] == "hot_three:73");
  CHECK(l["root"]["c"][0]["c"][0]["c"][0]["n"] == "spin_three:70");
}

TEST_CASE("flame graph data: a tree root first, on and off CPU apart, bounded") {
  ProfileStore store;
  const auto t0 = Clock::now();
  store.add_batch(t0 + std::chrono::seconds(1),
                  {sample(0, SampleKind::OnCpu, 300), sample(1, SampleKind::OnCpu, 100),
                   sample(2, SampleKind::OffCpu, 1000, 11)},
                  {{frame("hot_three"), frame("main")},
                   {frame("hot_one"), frame("main")},
                   {frame("pipe_read", true), frame("wait_on_pipe")}});
  const ProfileWindow w = store.window(t0, t0 + std::chrono::seconds(1));
  const auto j = nlohmann::json::parse(flame_graph_json(w, FlameGrouping::Process, 1000));
  CHECK(j["root"]["on"] == 400);
  CHECK(j["root"]["off"] == 1000);
  REQUIRE(j["root"]["c"].size() == 2);  // two processes
  const auto& app = j["root"]["c"][0];
  CHECK(app["n"] == "app (10)");
  REQUIRE(app["c"].size() == 1);
  CHECK(app["c"][0]["n"] == "main");
  CHECK(app["c"][0]["c"][0]["n"] == "hot_one");
  CHECK(app["c"][0]["c"][0]["on"] == 100);
  CHECK(app["c"][0]["c"][1]["on"] == 300);
  const auto& waiter = j["root"]["c"][1];
  CHECK(waiter["c"][0]["n"] == "wait_on_pipe");
  CHECK(waiter["c"][0]["c"][0]["n"] == "pipe_read");
  CHECK(waiter["c"][0]["c"][0]["off"] == 1000);
  // Bounded: the heaviest nodes stay (wait_on_pipe and pipe_read, 1000 ns, before main, 400
  // ns), the rest fold into their callers.
  const auto small = nlohmann::json::parse(flame_graph_json(w, FlameGrouping::None, 3));
  CHECK(small["nodes"] == 3);
  CHECK(small["pruned"] == 3);
  REQUIRE(small["root"]["c"].size() == 1);
  CHECK(small["root"]["c"][0]["n"] == "wait_on_pipe");
  CHECK(small["root"]["on"] == 400);  // the folded time stays in the root
  // Names with any bytes stay valid JSON.
  store.add_batch(t0 + std::chrono::seconds(2), {sample(0, SampleKind::OnCpu, 1)},
                  {{frame(std::string("bad\xff\"name\n"))}});
  CHECK_NOTHROW(nlohmann::json::parse(
      flame_graph_json(store.window(t0, t0 + std::chrono::seconds(2)), FlameGrouping::None, 100)));
}

TEST_CASE("flame graph views: on-CPU, off-CPU or both; idle waits set apart by their rule") {
  ProfileStore store;
  const auto t0 = Clock::now();
  const auto wait = [](std::uint32_t stack, std::uint64_t ns, std::uint32_t pid, const char* call) {
    Sample s = sample(stack, SampleKind::OffCpu, ns, pid);
    s.syscall = call ? *syscall_number(call) : -1;
    return s;
  };
  Sample worker = sample(0, SampleKind::OnCpu, 50, 10);
  worker.tid = 12;
  store.add_batch(t0 + std::chrono::seconds(1),
                  {sample(0, SampleKind::OnCpu, 300), worker,
                   wait(1, 1000, 11, "read"),        // delay: a read blocked on a pipe
                   wait(2, 7000, 11, "epoll_wait"),  // idle: an event loop
                   wait(3, 9000, 2, nullptr),        // idle: a kernel thread
                   wait(4, 20, 10, nullptr)},        // delay: a page fault of a process
                  {{frame("hot_three"), frame("main")},
                   {frame("pipe_read", true), frame("wait_on_pipe")},
                   {frame("ep_poll", true), frame("event_loop")},
                   {frame("worker_thread", true), frame("kthread", true)},
                   {frame("filemap_fault", true), frame("touch")}});
  const ProfileWindow w = store.window(t0, t0 + std::chrono::seconds(1));
  const auto json = [&](FlameView view, bool idle, FlameGrouping g = FlameGrouping::Process) {
    return nlohmann::json::parse(
        flame_graph_json(w, g, 1000, {}, false, FlameSelection{view, idle}));
  };
  // On-CPU: the CPU time alone; the processes by it, most first.
  const auto on = json(FlameView::OnCpu, false);
  CHECK(on["view"] == "on");
  CHECK(on["root"]["on"] == 350);
  CHECK(on["root"]["off"] == 0);
  REQUIRE(on["processes"].size() == 1);
  CHECK(on["processes"][0]["pid"] == 10);
  CHECK(on["processes"][0]["on"] == 350);
  // Off-CPU for the whole host: the idle waits set apart, their total said.
  const auto off = json(FlameView::OffCpu, false);
  CHECK(off["root"]["on"] == 0);
  CHECK(off["root"]["off"] == 1020);
  CHECK(off["idle"]["shown"] == false);
  CHECK(off["idle"]["ns"] == 16000);
  CHECK(off["idle"]["waits"] == 2);
  CHECK(off["idle"]["syscalls"].size() == idle_syscalls().size());
  CHECK(off.dump().find("event_loop") == std::string::npos);
  CHECK(off.dump().find("kthread") == std::string::npos);
  REQUIRE(off["processes"].size() == 2);
  CHECK(off["processes"][0]["pid"] == 11);
  // Shown: all of it.
  const auto shown = json(FlameView::OffCpu, true);
  CHECK(shown["root"]["off"] == 17020);
  CHECK(shown["idle"]["ns"] == 16000);
  CHECK(shown["processes"][0]["pid"] == 2);
  // Wall-clock: both, in proportion.
  const auto wall = json(FlameView::Wall, false);
  CHECK(wall["root"]["on"] == 350);
  CHECK(wall["root"]["off"] == 1020);
  // By thread: a node per thread, and every thread's time whatever the view.
  const auto threads = json(FlameView::OnCpu, false, FlameGrouping::Thread);
  CHECK(threads["root"]["c"][0]["n"] == "app (10)");
  CHECK(threads["root"]["c"][1]["n"] == "app (12)");
  REQUIRE(threads["threads"].size() == 4);
  CHECK(threads["threads"][0]["tid"] == 2);
  CHECK(threads["threads"][0]["off"] == 9000);
  CHECK(threads["threads"][1]["tid"] == 11);
  CHECK(threads["threads"][1]["off"] == 8000);
  CHECK(threads["threads"][2]["tid"] == 10);
  CHECK(threads["threads"][2]["on"] == 300);
  CHECK(threads["threads"][2]["off"] == 20);
  CHECK(threads["threads"][3]["tid"] == 12);
  CHECK(threads["threads"][3]["pid"] == 10);
  // Compared with a window before: each node's time there ("b"), by the same view; a
  // function only the base has stays, of no width.
  store.add_batch(t0 + std::chrono::seconds(2),
                  {sample(0, SampleKind::OnCpu, 100), sample(1, SampleKind::OnCpu, 900)},
                  {{frame("hot_three"), frame("main")}, {frame("new_code"), frame("main")}});
  const ProfileWindow later =
      store.window(t0 + std::chrono::seconds(1), t0 + std::chrono::seconds(2));
  const auto diff = nlohmann::json::parse(flame_graph_json(
      later, FlameGrouping::None, 1000, {}, false, FlameSelection{FlameView::Wall, false, &w}));
  CHECK(diff["base"]["seconds"].get<double>() == Approx(1.0).epsilon(0.01));
  CHECK(diff["root"]["on"] == 1000);
  CHECK(diff["root"]["b"] == 350 + 1020);  // the idle waits apart in both
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& c : diff["root"]["c"]) by_name[c["n"]] = c;
  REQUIRE(by_name.size() == 3);
  CHECK(by_name["main"]["on"] == 1000);
  CHECK(by_name["main"]["b"] == 350);
  CHECK(by_name["wait_on_pipe"]["off"] == 0);  // only the base has it: no width
  CHECK(by_name["wait_on_pipe"]["b"] == 1000);
  CHECK(by_name["touch"]["b"] == 20);
  std::map<std::string, std::pair<int, int>> in_main;
  for (const auto& c : by_name["main"]["c"]) in_main[c["n"]] = {c["on"], c["b"]};
  CHECK(in_main["hot_three"] == std::make_pair(100, 350));
  CHECK(in_main["new_code"] == std::make_pair(900, 0));
  // Slow events (no selection): none of it.
  const auto plain = nlohmann::json::parse(flame_graph_json(w, FlameGrouping::None, 1000));
  CHECK_FALSE(plain.contains("view"));
  CHECK(plain["root"]["off"] == 17020);
}

TEST_CASE("profile routes: bad parameters are a 400 that says why, no tracer a 503") {
  auto profiles = std::make_shared<Profiles>();
  const auto routes = profile_routes(profiles);
  const auto find = [&](const std::string& path) -> const Route& {
    for (const auto& r : routes) {
      if (r.path == path) return r;
    }
    FAIL("no route " << path);
    throw std::logic_error("unreachable");
  };
  const Route& profile = find("/debug/pprof/profile");
  REQUIRE(profile.deferred);
  CHECK(profile.max_deferred == kMaxProfileRequests);
  const auto ask = [&](std::vector<std::pair<std::string, std::string>> query) {
    HttpRequest req{"GET", "/debug/pprof/profile", {}, std::move(query)};
    const auto r = profile.deferred(req);
    REQUIRE(std::holds_alternative<HttpResponse>(r));
    return std::get<HttpResponse>(r);
  };
  const std::vector<std::pair<std::vector<std::pair<std::string, std::string>>, std::string>> bad =
      {
          {{}, "seconds is missing"},
          {{{"seconds", "0"}}, "at least 1"},
          {{{"seconds", "-5"}}, "at least 1"},
          {{{"seconds", "301"}}, "at most 300"},
          {{{"seconds", "99999999999999999999"}}, "at most 300"},
          {{{"seconds", "abc"}}, "not a whole number"},
          {{{"seconds", "1.5"}}, "not a whole number"},
          {{{"seconds", ""}}, "seconds is empty"},
          {{{"seconds", "5"}, {"seconds", "6"}}, "more than once"},
          {{{"seconds", "5"}, {"pid", "0"}}, "pid is not a process or thread ID"},
          {{{"seconds", "5"}, {"pid", "4194305"}}, "pid is not a process or thread ID"},
          {{{"seconds", "5"}, {"pid", "12ab"}}, "pid is not a process or thread ID"},
          {{{"seconds", "5"}, {"tid", "-1"}}, "tid is not a process or thread ID"},
          {{{"seconds", "5"}, {"pid", "1"}, {"pid", "2"}}, "pid is given more than once"},
          {{{"seconds", "5"}, {"comm", ""}}, "comm is empty"},
          {{{"seconds", "5"}, {"comm", "sixteen-chars-xx"}}, "longer than the kernel's 15"},
          {{{"seconds", "5"}, {"workload", ""}}, "workload is empty"},
          {{{"seconds", "5"}, {"workload", std::string(4097, 'a')}}, "longer than a cgroup path"},
      };
  for (const auto& [query, why] : bad) {
    const HttpResponse r = ask(query);
    INFO(r.body);
    CHECK(r.status == 400);
    CHECK_THAT(r.body, Catch::Contains(why));
  }
  // A good request, but no profile tracer runs: 503 at once, no wait.
  const HttpResponse none = ask({{"seconds", "5"}});
  CHECK(none.status == 503);
  CHECK_THAT(none.body, Catch::Contains("enable tracers.profile"));

  const Route& data = find("/profile/data");
  REQUIRE(data.deferred);
  CHECK(data.max_deferred == kMaxFlameGraphRequests);
  const auto ask_data = [&](std::vector<std::pair<std::string, std::string>> query) {
    const auto r = data.deferred(HttpRequest{"GET", "/profile/data", {}, std::move(query)});
    REQUIRE(std::holds_alternative<HttpResponse>(r));
    return std::get<HttpResponse>(r);
  };
  CHECK(ask_data({{"group", "colour"}}).status == 400);
  CHECK_THAT(ask_data({{"view", "cpu"}}).body, Catch::Contains("view must be on, off or wall"));
  CHECK_THAT(ask_data({{"idle", "yes"}}).body, Catch::Contains("idle must be 0 or 1"));
  CHECK_THAT(ask_data({{"idle", "1"}, {"idle", "0"}}).body,
             Catch::Contains("idle is given more than once"));
  CHECK(ask_data({{"view", "wall"}, {"idle", "1"}, {"group", "thread"}}).status == 503);
  // A range: from= and to=, Unix milliseconds, together, in order, at most a year apart.
  CHECK_THAT(ask_data({{"from", "1000"}}).body, Catch::Contains("from and to go together"));
  CHECK_THAT(ask_data({{"from", "x"}, {"to", "1000"}}).body,
             Catch::Contains("from is not a Unix time in milliseconds"));
  CHECK_THAT(ask_data({{"from", "2000"}, {"to", "1000"}}).body,
             Catch::Contains("to must be after from"));
  CHECK_THAT(ask_data({{"from", "1000"}, {"to", "40000000000"}}).body,
             Catch::Contains("at most a year apart"));
  CHECK_THAT(ask_data({{"from", "1000"}, {"to", "2000"}, {"seconds", "5"}}).body,
             Catch::Contains("give seconds, or from and to"));
  CHECK_THAT(ask_data({{"compare", "yesterday"}}).body, Catch::Contains("compare must be before"));
  // A kept range needs no running tracer: what is kept (nothing here) is answered.
  const auto kept = data.deferred(HttpRequest{
      "GET", "/profile/data", {}, {{"from", "1000"}, {"to", "2000"}, {"compare", "before"}}});
  REQUIRE(std::holds_alternative<DeferredResponse>(kept));
  const auto empty = nlohmann::json::parse(std::get<DeferredResponse>(kept).answer().body);
  CHECK(empty["root"]["on"] == 0);
  CHECK(empty["root"]["b"] == 0);
  CHECK(ask_data({{"seconds", "x"}}).status == 400);
  CHECK_THAT(ask_data({{"seconds", "601"}}).body, Catch::Contains("at most 600"));
  CHECK(ask_data({}).status == 503);  // a good request, but no tracer runs
  CHECK_THAT(ask_data({{"pid", "x"}}).body, Catch::Contains("pid is not a process"));
  CHECK(
      ask_data({{"pid", "1"}, {"tid", "1"}, {"comm", "init"}, {"workload", "init.scope"}}).status ==
      503);  // good filters
  const HttpResponse page = find("/profile").handler(HttpRequest{"GET", "/profile", {}, {}});
  CHECK(page.status == 200);
  CHECK_THAT(page.body, Catch::Contains("/profile/data?"));
  CHECK(page.body.find("<script src") == std::string::npos);  // self-contained
}

// User frames: the ELF files a process maps, its mappings as read from /proc.
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <gelf.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include "ebpf_metricsd/base/clock.h"
#include "ebpf_metricsd/profile/proc_files.h"
#include "ebpf_metricsd/profile/symbols.h"
#include "elf_module.h"
#include "text.h"

namespace ebpf_metricsd::profiling {

using text::base_name;
using text::hex;

namespace {
constexpr std::chrono::seconds kIdleModule{10};
}  // namespace

UserSymbols::UserSymbols(Limits limits) : limits_(limits) {
  held_.max_dwarf_bytes = limits.max_dwarf_bytes;
}
UserSymbols::~UserSymbols() = default;

std::uint64_t UserSymbols::table_bytes() const {
  std::uint64_t n = 0;
  for (const auto& m : modules_) n += m->table_bytes();
  return n;
}

std::size_t UserSymbols::names() const {
  std::size_t n = 0;
  for (const auto& m : modules_) n += m->names();
  return n;
}

void UserSymbols::forget(pid_t tgid) {
  auto it = processes_.find(tgid);
  if (it == processes_.end()) return;
  erase(it);
}

std::map<pid_t, UserSymbols::Process>::iterator UserSymbols::erase(
    std::map<pid_t, Process>::iterator it) {
  process_lru_.erase(it->second.lru);
  held_.jit_bytes -= it->second.jit_bytes;
  return processes_.erase(it);
}

void UserSymbols::forget_exited() {
  for (auto it = processes_.begin(); it != processes_.end();) {
    if (it->second.exited) {
      it = erase(it);
      continue;
    }
    it->second.exited = process_start_time(it->first) != it->second.start_time;
    ++it;
  }
  // Files no known process maps any more are closed (opened again if one maps them later),
  // once unused for kIdleModule: the next run of a short-lived program (a compiler, a
  // shell's commands) finds its files open and their names known.
  std::set<const ElfModule*> mapped;
  for (const auto& [tgid, p] : processes_) {
    for (const Mapping& m : p.mappings) {
      if (auto elf = m.elf.lock()) mapped.insert(elf.get());
    }
  }
  const auto now = std::chrono::steady_clock::now();
  modules_.remove_if([&](const std::shared_ptr<ElfModule>& e) {
    return !mapped.contains(e.get()) && now - e->used_at() >= kIdleModule;
  });
  std::erase_if(by_inode_, [](const auto& kv) { return kv.second.expired(); });
}

struct UserSymbols::Snapshot {
  pid_t tgid = 0;
  std::uint64_t start_time = 0;  // 0: gone
  std::uint64_t read_ns = 0;     // CLOCK_MONOTONIC, before the mappings were read
  std::vector<Mapping> mappings;
  std::map<std::pair<std::uint64_t, std::uint64_t>, int> files;  // by (dev, inode)
  Snapshot() = default;
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;
  ~Snapshot() {
    for (const auto& [key, fd] : files) {
      if (fd >= 0) close(fd);
    }
  }
};

std::shared_ptr<UserSymbols::Snapshot> UserSymbols::snapshot(pid_t tgid) {
  auto snap = std::make_shared<Snapshot>();
  snap->tgid = tgid;
  snap->read_ns = monotonic_ns();
  snap->start_time = process_start_time(tgid);
  if (snap->start_time == 0) return snap;
  for (const MapsLine& line : read_maps(tgid)) {
    if (!line.exec) continue;
    Mapping m{line.start, line.end, line.offset, line.path, line.dev, line.inode, {}};
    if (m.inode != 0) {
      const auto key = std::make_pair(m.dev, m.inode);
      if (!snap->files.contains(key)) snap->files[key] = open_mapped_file(tgid, line);
    }
    snap->mappings.push_back(std::move(m));
  }
  return snap;
}

void UserSymbols::capture(pid_t tgid, bool again) {
  auto known = processes_.find(tgid);
  if (known != processes_.end() && !again) {
    const std::uint64_t started = process_start_time(tgid);
    if (started == 0 || started == known->second.start_time) {
      process_lru_.splice(process_lru_.begin(), process_lru_, known->second.lru);
      return;  // known (or gone: keep what was captured)
    }
  }
  install(*snapshot(tgid), again);
}

void UserSymbols::install(Snapshot& snap, bool again) {
  const pid_t tgid = snap.tgid;
  const std::uint64_t started = snap.start_time;
  auto known = processes_.find(tgid);
  if (known != processes_.end()) {
    if (started == 0 || (started == known->second.start_time && !again)) {
      process_lru_.splice(process_lru_.begin(), process_lru_, known->second.lru);
      return;  // known (or gone: keep what was captured)
    }
  }
  if (started == 0) return;
  Process p;
  p.start_time = started;
  p.read_ns = snap.read_ns;
  p.mappings = std::move(snap.mappings);
  for (Mapping& m : p.mappings) {
    if (m.inode == 0) continue;
    int& fd = snap.files[std::make_pair(m.dev, m.inode)];
    m.elf = open_module(tgid, m, std::exchange(fd, -1));
  }
  if (known != processes_.end()) {
    // Read again: a process that has exited since (a zombie maps nothing any more) keeps
    // what was captured while it lived; one whose pid was reused, or that mapped more, has
    // its new mappings.
    if (p.mappings.empty() && started == known->second.start_time) return;
    if (started == known->second.start_time) {
      // The same process: what its perf map said stays (and stays counted).
      Process& old = known->second;
      p.jit = std::move(old.jit);
      p.jit_bytes = std::exchange(old.jit_bytes, 0);
      p.jit_read = old.jit_read;
      p.jit_read_at = old.jit_read_at;
      p.jit_refused = old.jit_refused;
    }
    forget(tgid);
  }
  process_lru_.push_front(tgid);
  p.lru = process_lru_.begin();
  processes_.emplace(tgid, std::move(p));
  while (processes_.size() > limits_.max_processes) erase(processes_.find(process_lru_.back()));
}

void UserSymbols::refresh(pid_t tgid, std::uint64_t taken_by_ns) {
  auto it = processes_.find(tgid);
  if (it == processes_.end()) return capture(tgid);
  if (taken_by_ns != 0 && taken_by_ns < it->second.read_ns) return;  // read after the stack
  const auto pause = it->second.refresh_pause;
  const std::uint64_t now = monotonic_ns();
  if (now - it->second.read_ns <
      static_cast<std::uint64_t>(std::chrono::nanoseconds(pause).count())) {
    return;
  }
  const std::size_t before = it->second.mappings.size();
  capture(tgid, true);
  it = processes_.find(tgid);
  if (it == processes_.end()) return;
  it->second.read_ns = std::max(it->second.read_ns, now);  // a process gone keeps its mappings
  it->second.refresh_pause =
      it->second.mappings.size() == before
          ? std::clamp<std::chrono::milliseconds>(2 * pause, std::chrono::milliseconds(10),
                                                  std::chrono::seconds(10))
          : std::chrono::milliseconds(0);
}

std::shared_ptr<ElfModule> UserSymbols::open_module(pid_t tgid, const Mapping& m, int fd) {
  const auto key = std::make_pair(m.dev, m.inode);
  if (auto it = by_inode_.find(key); it != by_inode_.end()) {
    if (auto elf = it->second.lock()) {
      if (fd >= 0) close(fd);
      return elf;
    }
  }
  if (fd < 0) {
    MapsLine line;
    line.start = m.start;
    line.end = m.end;
    line.inode = m.inode;
    line.path = m.path;
    fd = open_mapped_file(tgid, line);
  }
  return open_module(m.dev, m.inode, m.path, fd);
}

std::shared_ptr<ElfModule> UserSymbols::open_module(std::uint64_t dev, std::uint64_t inode,
                                                    std::string path, int fd) {
  const auto key = std::make_pair(dev, inode);
  if (auto it = by_inode_.find(key); it != by_inode_.end()) {
    if (auto elf = it->second.lock()) {
      if (fd >= 0) close(fd);
      return elf;
    }
  }
  if (const auto deleted = path.rfind(" (deleted)");
      deleted != std::string::npos && deleted + 10 == path.size()) {
    path.erase(deleted);
  }
  if (refused_files_.contains(key)) {
    if (fd >= 0) close(fd);
    return nullptr;
  }
  const bool opened = fd >= 0;
  ElfRefusal why{};
  std::shared_ptr<ElfModule> elf = ElfModule::open(fd, path, limits_.files, held_, why);
  if (!elf) {
    if (opened) {  // not a process gone before its file could be opened
      ++refused_[static_cast<std::size_t>(why)];
      if (refused_files_.size() >= 4 * limits_.max_modules) refused_files_.clear();
      refused_files_.insert(key);
    }
    return nullptr;
  }
  by_inode_[key] = elf;
  modules_.push_front(elf);
  while (modules_.size() > limits_.max_modules) modules_.pop_back();
  // Drop weak entries of closed modules now and then.
  if (by_inode_.size() > 2 * limits_.max_modules) {
    std::erase_if(by_inode_, [](const auto& kv) { return kv.second.expired(); });
  }
  return elf;
}

Frame UserSymbols::resolve(pid_t tgid, std::uint64_t address, bool return_address, bool lines) {
  Frame f;
  f.address = address;
  auto it = processes_.find(tgid);
  const Mapping* hit = nullptr;
  if (it != processes_.end()) {
    for (const Mapping& m : it->second.mappings) {
      if (address >= m.start && address < m.end) {
        hit = &m;
        break;
      }
    }
  }
  if (!hit) {
    f.module = "[unknown]";
    f.function = "[unknown]+" + hex(address);
    return f;
  }
  const std::uint64_t offset = address - hit->start + hit->offset;
  f.address = offset;
  f.module = hit->path.empty() ? "[anon]" : hit->path;
  if (hit->path.empty() || hit->path.rfind("[anon:", 0) == 0 ||
      hit->path.rfind("/memfd:", 0) == 0) {
    // Anonymous executable memory (or a memfd, which runtimes map twice): JIT code, named by
    // the process's perf map if it has one.
    f.function = jit_name(tgid, it->second, address);
    if (!f.function.empty()) {
      f.module = "[jit]";
      f.address = address;
      return f;
    }
  }
  std::shared_ptr<ElfModule> elf = hit->elf.lock();
  if (!elf && hit->inode != 0) elf = open_module(tgid, *hit);
  return name_in(elf, std::move(f), offset, return_address, lines);
}

Frame UserSymbols::resolve_file(MappedFileRef file, std::uint64_t offset, bool return_address,
                                bool lines) {
  Frame f;
  f.address = offset;
  f.module = file.path;
  std::shared_ptr<ElfModule> elf =
      open_module(file.dev, file.inode, std::move(file.path), std::exchange(file.fd, -1));
  return name_in(elf, std::move(f), offset, return_address, lines);
}

Frame UserSymbols::name_in(const std::shared_ptr<ElfModule>& elf, Frame f, std::uint64_t offset,
                           bool return_address, bool lines) {
  if (elf) {
    // Most recently used first: the least used file is closed first.
    for (auto m = modules_.begin(); m != modules_.end(); ++m) {
      if (*m == elf) {
        modules_.splice(modules_.begin(), modules_, m);
        break;
      }
    }
    elf->used();
    f.build_id = elf->build_id();
    const std::uint64_t at = return_address && offset > 0 ? offset - 1 : offset;
    const ElfModule::Named& named = elf->at(at, lines);
    f.function = named.name;
    if (f.function.empty()) f.function = base_name(f.module) + "+" + hex(offset);
    if (lines) {
      f.lines = named.lines;
      // The outermost line is the symbol's function, by the name the frame has.
      if (!f.lines.empty()) f.lines.back().function = f.function;
    }
    if (held_.name_bytes > limits_.max_name_bytes) {
      for (const auto& m : modules_) m->clear_names();
    }
    return f;
  }
  f.function = base_name(f.module) + "+" + hex(offset);
  return f;
}

}  // namespace ebpf_metricsd::profiling

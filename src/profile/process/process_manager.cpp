#include "ebpf_metricsd/profile/process_manager.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <gelf.h>
#include <spdlog/spdlog.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "ebpf_metricsd/bpf/bpf_support.h"
#include "ebpf_metricsd/bpf/drop_accounting.h"
#include "ebpf_metricsd/profile/proc_files.h"

namespace ebpf_metricsd::profiling {

std::string_view table_result_name(TableResult r) {
  switch (r) {
    case TableResult::Loaded:
      return "loaded";
    case TableResult::NoCfi:
      return "no_cfi";
    case TableResult::BadCfi:
      return "bad_cfi";
    case TableResult::TooLarge:
      return "too_large";
    case TableResult::TooSlow:
      return "too_slow";
    case TableResult::Unreadable:
      return "unreadable";
    case TableResult::RowsFull:
      return "rows_full";
    case TableResult::RulesFull:
      return "rules_full";
    case TableResult::PagesFull:
      return "pages_full";
  }
  return "?";
}

namespace {

constexpr std::chrono::milliseconds kFirstPause{10};
constexpr std::chrono::milliseconds kLongestPause{10000};

TableResult result_of(UnwindTableRefusal why) {
  switch (why) {
    case UnwindTableRefusal::NoCfi:
      return TableResult::NoCfi;
    case UnwindTableRefusal::BadCfi:
      return TableResult::BadCfi;
    case UnwindTableRefusal::TooLarge:
      return TableResult::TooLarge;
    case UnwindTableRefusal::TooSlow:
      return TableResult::TooSlow;
  }
  return TableResult::BadCfi;
}

TableResult result_of(UnwindMaps::Loaded loaded) {
  switch (loaded) {
    case UnwindMaps::Loaded::Ok:
      return TableResult::Loaded;
    case UnwindMaps::Loaded::RowsFull:
      return TableResult::RowsFull;
    case UnwindMaps::Loaded::RulesFull:
      return TableResult::RulesFull;
    case UnwindMaps::Loaded::PagesFull:
      return TableResult::PagesFull;
  }
  return TableResult::RowsFull;
}

}  // namespace

ProcessManager::ProcessManager(Options options) : options_(options), maps_(options_.maps) {
  // The ring first: it can throw, and a throw must not leave threads running. An ask that
  // comes before the threads start waits in the queue.
  wants_ = RingReader(
      maps_.wants_fd(),
      [this](std::span<const std::byte> record) {
        emd_unwind_want want{};
        if (record.size() < sizeof want) return;
        std::memcpy(&want, record.data(), sizeof want);
        on_want(want);
      },
      "the walker's asks");
  process_thread_ = std::thread([this] { process_loop(); });
  table_thread_ = std::thread([this] { table_loop(); });
}

ProcessManager::~ProcessManager() {
  wants_.stop();
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_process_.notify_all();
  wake_table_.notify_all();
  process_thread_.join();
  table_thread_.join();
  for (auto& [id, f] : files_) {
    if (f.fd >= 0) close(f.fd);
  }
}

std::uint32_t ProcessManager::new_id() {
  if (next_id_ < EMD_UNWIND_MAX_FILES) return next_id_++;
  const auto now = std::chrono::steady_clock::now();
  if (!retired_ids_.empty() && now - retired_ids_.front().second >= kIdGrace) {
    const std::uint32_t id = retired_ids_.front().first;
    retired_ids_.pop_front();
    return id;
  }
  return 0;
}

std::optional<MappedFileRef> ProcessManager::file(std::uint32_t id) const {
  std::lock_guard lock(mutex_);
  auto it = files_.find(id);
  if (it == files_.end() || it->second.fd < 0) return std::nullopt;
  const int fd = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  return MappedFileRef{it->second.dev, it->second.inode, it->second.path, fd};
}

void ProcessManager::on_want(const emd_unwind_want& want) {
  {
    std::lock_guard lock(mutex_);
    ++asks_;
    if (want.file != 0) {
      // A walk waits for this file: its table next.
      auto it = std::find(queued_.begin(), queued_.end(), want.file);
      if (it != queued_.end() && it != queued_.begin()) {
        queued_.erase(it);
        queued_.push_front(want.file);
      }
      ++answered_;
      return;
    }
    const auto tgid = static_cast<pid_t>(want.tgid);
    if (want.why == EMD_UNWIND_WANT_EXITED) {
      exited_.push_back(tgid);
      wake_process_.notify_one();
      return;
    }
    // New code mapped: read again at once, whenever it was read last.
    if (want.why == EMD_UNWIND_WANT_MAPPED) {
      if (auto it = processes_.find(tgid); it != processes_.end())
        it->second.pause = std::chrono::milliseconds(0);
    }
    if (wanted_set_.insert(tgid).second)
      wanted_.push_back(tgid);
    else
      ++answered_;  // already waiting to be read
  }
  wake_process_.notify_one();
}

void ProcessManager::process_loop() {
  auto next_forget = std::chrono::steady_clock::now() + options_.forget_every;
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    wake_process_.wait_until(lock, next_forget,
                             [&] { return stopping_ || !wanted_.empty() || !exited_.empty(); });
    if (stopping_) break;
    while (!exited_.empty()) {
      const pid_t tgid = exited_.front();
      exited_.pop_front();
      lock.unlock();
      forget_if_gone(tgid);
      lock.lock();
      ++answered_;
    }
    if (std::chrono::steady_clock::now() >= next_forget) {
      lock.unlock();
      forget_exited();
      lock.lock();
      next_forget = std::chrono::steady_clock::now() + options_.forget_every;
    }
    while (!wanted_.empty() && !stopping_) {
      const pid_t tgid = wanted_.front();
      wanted_.pop_front();
      wanted_set_.erase(tgid);
      lock.unlock();
      read_process(tgid);
      lock.lock();
      ++answered_;
      idle_.notify_all();
    }
  }
}

void ProcessManager::read_process(pid_t tgid) {
  const auto tg = static_cast<std::uint32_t>(tgid);
  emd_unwind_proc p{};
  if (!maps_.proc(tg, p)) return;  // no walk has met it (or it was forgotten)
  const std::uint64_t started = process_start_time(tgid);
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(mutex_);
    auto known = processes_.find(tgid);
    if (started == 0) {
      // Gone before it was read: the kernel's record goes now (one that was read is
      // forgotten with its mappings at the next pass).
      if (known == processes_.end()) maps_.forget(tg);
      return;
    }
    if (known != processes_.end() && known->second.start_time == started && known->second.settled &&
        known->second.settled_gen == p.gen && now - known->second.read_at < known->second.pause)
      return;  // read lately, nothing changed since: a walk in code of no file asks again
  }
  // A read under way: from now on, the kernel bumps the generation at any unmapping.
  emd_unwind_settled reading{p.mm, p.start, p.exec, p.gen - 1, 1, 0};
  maps_.settle(tg, reading);
  if (!maps_.proc(tg, p)) return;
  const std::vector<MapsLine> lines = read_maps(tgid);
  std::vector<MappedRange> ranges;
  std::set<std::uint32_t> files;
  // The files it maps code of: their other mappings (headers, data) are kept too, so that
  // the unmapping of a library (its whole span, from its first mapping) is seen; the files
  // it maps only as data are not (a database's thousands of segments would fill the trie).
  std::set<std::pair<std::uint64_t, std::uint64_t>> code_files;
  for (const MapsLine& m : lines) {
    if (m.exec && m.inode != 0) code_files.emplace(m.dev, m.inode);
  }
  for (const MapsLine& m : lines) {
    if (m.inode == 0 ? !m.vdso : !code_files.contains({m.dev, m.inode})) continue;
    MappedRange r{m.start, m.end, 0, 0, m.start - m.offset};
    if (m.vdso) {
      // The vDSO: the kernel's one image, which every process maps (vdso_file()).
      r.file = vdso_file();
      r.bias = r.off_bias = m.start;
    } else if (m.exec) {
      r.file = file_for(tgid, m, r.bias);
      if (r.file != 0) files.insert(r.file);
    }
    ranges.push_back(r);
  }
  std::vector<MappedRange> before;
  std::set<std::uint32_t> old_files;
  std::uint64_t epoch = 0;  // a new one, unless nothing it maps changed
  bool rewrite = false;
  {
    std::lock_guard lock(mutex_);
    Process& known = processes_[tgid];
    // One reference a file it maps now.
    for (std::uint32_t id : files) {
      if (auto f = files_.find(id); f != files_.end()) ++f->second.refs;
    }
    const bool same = known.start_time == started && known.ranges == ranges;
    // The same files at the same places: what the walks cached of it holds still (a process
    // with code of no file, a JIT's, is read again every time a walk meets that code).
    rewrite = known.short_write;
    if (same && known.settled && !rewrite) {
      epoch = known.epoch;
      ++counts_.reads_unchanged;
    }
    known.pause = same ? std::clamp(known.pause * 2, kFirstPause, kLongestPause) : kFirstPause;
    known.start_time = started;
    before = std::move(known.ranges);
    known.ranges = ranges;
    old_files = std::move(known.files);
    known.files = files;
    known.read_at = now;
    known.settled = true;
    known.settled_gen = p.gen;
    ++counts_.processes_read;
  }
  const bool written = maps_.write_mappings(tg, before, ranges, rewrite);
  {
    std::lock_guard lock(mutex_);
    if (!written) ++counts_.mappings_full;
    if (auto known = processes_.find(tgid); known != processes_.end())
      known->second.short_write = !written;
  }
  // The files of the read before give theirs back.
  for (std::uint32_t id : old_files) unref(id);
  epoch = maps_.settle(tg, emd_unwind_settled{p.mm, p.start, p.exec, p.gen, 0, 0}, epoch);
  std::lock_guard lock(mutex_);
  if (auto known = processes_.find(tgid); known != processes_.end()) known->second.epoch = epoch;
}

std::uint32_t ProcessManager::file_for(pid_t tgid, const MapsLine& m, std::uint64_t& bias) {
  const std::uint64_t start = m.start, offset = m.offset;
  int fd = open_mapped_file(tgid, m);
  if (fd < 0) return 0;
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    close(fd);
    return 0;
  }
  const std::string inode_key = "i:" + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) +
                                ":" + std::to_string(st.st_size) + ":" +
                                std::to_string(st.st_mtim.tv_sec) + "." +
                                std::to_string(st.st_mtim.tv_nsec);
  const auto bias_of = [&](const File& f) {
    if (f.fixed) return std::uint64_t{0};
    // The load bias: where the segment holding `offset` lands, less its address in the file.
    for (const Load& l : f.loads) {
      if ((l.offset & ~std::uint64_t{0xfff}) <= offset &&
          offset < l.offset + std::max<std::uint64_t>(l.filesz, 1))
        return start - offset - (l.vaddr - l.offset);
    }
    return start - offset;
  };
  {
    std::lock_guard lock(mutex_);
    if (auto it = by_inode_.find(inode_key); it != by_inode_.end()) {
      close(fd);
      const File& f = files_.at(it->second);
      bias = bias_of(f);
      return f.id;
    }
  }
  // One descriptor for the symbolizer, kept while the file is known; the other is the
  // checked file's.
  const int kept = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  ElfRefusal why{};
  std::shared_ptr<ElfFile> elf = ElfFile::open(fd, options_.files, why);
  File f;
  f.dev = st.st_dev;
  f.inode = st.st_ino;
  f.path = m.path;
  f.fd = elf ? kept : -1;
  if (!elf && kept >= 0) close(kept);
  f.key = elf && !elf->build_id().empty() ? "b:" + elf->build_id() : inode_key;
  if (elf) {
    Elf* e = elf->elf();
    GElf_Ehdr eh;
    f.fixed = gelf_getehdr(e, &eh) && eh.e_type == ET_EXEC;
    std::size_t n = 0;
    if (elf_getphdrnum(e, &n) == 0) {
      for (std::size_t i = 0; i < n; ++i) {
        GElf_Phdr ph;
        if (gelf_getphdr(e, static_cast<int>(i), &ph) && ph.p_type == PT_LOAD)
          f.loads.push_back({ph.p_offset, ph.p_vaddr, ph.p_filesz});
      }
    }
  }
  std::lock_guard lock(mutex_);
  if (auto it = by_key_.find(f.key); it != by_key_.end()) {
    // The same build under another path (or opened meanwhile).
    by_inode_[inode_key] = it->second;
    const File& known = files_.at(it->second);
    bias = bias_of(known);
    if (f.fd >= 0) close(f.fd);
    return known.id;
  }
  // No room: its code is in no file the walk knows (counted by the walks that end there).
  f.id = files_.size() < options_.maps.files ? new_id() : 0;
  if (f.id == 0) {
    if (f.fd >= 0) close(f.fd);
    return 0;
  }
  f.refs = 0;  // the reads that map it take theirs
  f.unused_since = std::chrono::steady_clock::now();
  bias = bias_of(f);
  const std::uint32_t id = f.id;
  if (elf) {
    f.elf = std::move(elf);
    maps_.set_state(id, EMD_UNWIND_FILE_LOADING);
    queued_.push_back(id);
    wake_table_.notify_one();
  } else {
    maps_.set_state(id, EMD_UNWIND_FILE_REFUSED);
    ++counts_.tables[static_cast<std::size_t>(TableResult::Unreadable)];
  }
  by_key_[f.key] = id;
  by_inode_[inode_key] = id;
  files_.emplace(id, std::move(f));
  return id;
}

std::uint32_t ProcessManager::vdso_file() {
  std::lock_guard lock(mutex_);
  if (vdso_tried_) return vdso_id_;
  vdso_tried_ = true;
  // The daemon's own vDSO is the image every process maps (one per kernel for 64-bit
  // processes): copied into a memory file, checked and compiled as any file.
  // NOLINTNEXTLINE(performance-no-int-to-ptr): the auxiliary vector gives it as an integer.
  const auto* image = reinterpret_cast<const unsigned char*>(getauxval(AT_SYSINFO_EHDR));
  std::uint64_t size = 0;
  if (image) {
    for (const MapsLine& m : read_maps(getpid())) {
      if (m.vdso && m.start == reinterpret_cast<std::uintptr_t>(image)) size = m.end - m.start;
    }
  }
  const int fd = size ? memfd_create("vdso", MFD_CLOEXEC) : -1;
  if (fd < 0 || write(fd, image, size) != static_cast<ssize_t>(size)) {
    if (fd >= 0) close(fd);
    return 0;
  }
  const int kept = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  ElfRefusal why{};
  std::shared_ptr<ElfFile> elf = ElfFile::open(fd, options_.files, why);
  if (!elf || kept < 0 || (vdso_id_ = new_id()) == 0) {
    if (kept >= 0) close(kept);
    return vdso_id_ = 0;
  }
  File f;
  f.id = vdso_id_;
  f.key = "vdso";
  f.path = "[vdso]";
  f.fd = kept;
  f.elf = std::move(elf);
  f.refs = 1;  // never dropped
  maps_.set_state(f.id, EMD_UNWIND_FILE_LOADING);
  queued_.push_front(f.id);
  wake_table_.notify_one();
  files_.emplace(f.id, std::move(f));
  return vdso_id_;
}

void ProcessManager::unref(std::uint32_t id) {
  std::lock_guard lock(mutex_);
  auto it = files_.find(id);
  if (it == files_.end() || it->second.refs == 0) return;
  if (--it->second.refs == 0) it->second.unused_since = std::chrono::steady_clock::now();
}

void ProcessManager::table_loop() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    wake_table_.wait(lock, [&] { return stopping_ || !queued_.empty(); });
    if (stopping_) break;
    const std::uint32_t id = queued_.front();
    queued_.pop_front();
    auto it = files_.find(id);
    if (it == files_.end() || !it->second.elf) continue;
    std::shared_ptr<ElfFile> elf = std::move(it->second.elf);
    building_ = id;
    lock.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    UnwindTableRefusal why{};
    const auto table = build_unwind_table(*elf, options_.tables, why);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    TableResult result = table ? result_of(maps_.load(id, *table)) : result_of(why);
    if (result != TableResult::Loaded) maps_.set_state(id, EMD_UNWIND_FILE_REFUSED);
    elf.reset();  // its descriptor and what libelf read of it
    lock.lock();
    building_ = 0;
    counts_.build_seconds += seconds;
    ++counts_.tables[static_cast<std::size_t>(result)];
    idle_.notify_all();
  }
}

void ProcessManager::forget_if_gone(pid_t tgid) {
  // A zombie is gone too: its leader has exited, and nothing it maps runs any more.
  const std::uint64_t started = live_process_start_time(tgid);
  Process gone;
  {
    std::lock_guard lock(mutex_);
    auto it = processes_.find(tgid);
    if (it == processes_.end()) {
      if (started != 0) return;  // not read yet, and running: it is read when asked
      // Gone before it was read: only the kernel's record of it is left.
    } else {
      // Still the process that was read (another thread of it exits last).
      if (started == it->second.start_time) return;
      gone = std::move(it->second);
      processes_.erase(it);
    }
  }
  maps_.write_mappings(static_cast<std::uint32_t>(tgid), gone.ranges, {});
  maps_.forget(static_cast<std::uint32_t>(tgid));
  for (std::uint32_t id : gone.files) unref(id);
}

void ProcessManager::forget_exited() {
  std::vector<pid_t> known;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [tgid, p] : processes_) known.push_back(tgid);
  }
  for (pid_t tgid : known) forget_if_gone(tgid);
  // Tables no process has mapped for a while.
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::uint32_t> dropped;
  {
    std::lock_guard lock(mutex_);
    for (auto it = files_.begin(); it != files_.end();) {
      const File& f = it->second;
      if (f.refs == 0 && f.id != building_ && now - f.unused_since >= options_.keep_unused) {
        dropped.push_back(f.id);
        by_key_.erase(f.key);
        for (auto a = by_inode_.begin(); a != by_inode_.end();) {
          a = a->second == f.id ? by_inode_.erase(a) : std::next(a);
        }
        queued_.erase(std::remove(queued_.begin(), queued_.end(), f.id), queued_.end());
        if (f.fd >= 0) close(f.fd);
        retired_ids_.emplace_back(f.id, now);
        it = files_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (std::uint32_t id : dropped) maps_.unload(id);
}

ProcessManager::Counts ProcessManager::counts() const {
  Counts c;
  {
    std::lock_guard lock(mutex_);
    c = counts_;
    c.processes = processes_.size();
    c.files = files_.size();
  }
  c.usage = maps_.usage();
  c.kernel_bytes = maps_.kernel_bytes();
  return c;
}

bool ProcessManager::settle(std::chrono::milliseconds timeout) {
  wants_.catch_up();
  std::unique_lock lock(mutex_);
  return idle_.wait_for(lock, timeout, [&] {
    return answered_ >= asks_ && wanted_.empty() && queued_.empty() && building_ == 0;
  });
}

void Walker::set_rows(std::uint32_t rows) {
  std::lock_guard lock(mutex_);
  if (rows == options_.maps.rows) return;
  if (manager_)
    spdlog::warn("profiles.unwind_table_rows: {} from the next start (the tables hold {} rows now)",
                 rows, options_.maps.rows);
  else
    options_.maps.rows = rows;
}

ProcessManager& Walker::get() {
  std::lock_guard lock(mutex_);
  if (!manager_) manager_ = std::make_unique<ProcessManager>(options_);
  return *manager_;
}

void set_walker(bpf_map* walkers, bpf_program* prog) {
  const int fd = bpf_program__fd(prog);
  if (fd < 0) return;
  const __u32 zero = 0;
  if (bpf_map_update_elem(bpf_map__fd(walkers), &zero, &fd, BPF_ANY) != 0)
    throw BpfError(bpf_error_text(std::string("the walker of ") + bpf_map__name(walkers), errno));
}

WalkEnds walk_ends_since(const bpf_map* ends, WalkEnds& seen) {
  WalkEnds out{};
  const int fd = bpf_map__fd(ends);
  const int cpus = libbpf_num_possible_cpus();
  if (fd < 0 || cpus <= 0) return out;
  std::vector<__u64> values(static_cast<std::size_t>(cpus));
  for (__u32 e = 0; e < EMD_UNWIND_END__COUNT; ++e) {
    if (bpf_map_lookup_elem(fd, &e, values.data()) != 0) continue;
    std::uint64_t total = 0;
    for (__u64 v : values) total += v;
    out[e] = total - seen[e];
    seen[e] = total;
  }
  return out;
}

std::string_view walk_end_name(std::uint32_t end) {
  switch (end) {
    case EMD_UNWIND_END_COMPLETE:
      return "complete";
    case EMD_UNWIND_END_NOT_READ:
      return "not_read";
    case EMD_UNWIND_END_NO_MAPPING:
      return "no_mapping";
    case EMD_UNWIND_END_NOT_LOADED:
      return "not_loaded";
    case EMD_UNWIND_END_NO_TABLE:
      return "no_table";
    case EMD_UNWIND_END_NO_CFI:
      return "no_cfi";
    case EMD_UNWIND_END_UNSUPPORTED:
      return "unsupported";
    case EMD_UNWIND_END_UNREADABLE:
      return "unreadable";
    case EMD_UNWIND_END_DEPTH:
      return "depth";
    case EMD_UNWIND_END_BAD_FRAME:
      return "bad_frame";
    case EMD_UNWIND_END_NO_WALKER:
      return "no_walker";
    case EMD_UNWIND_END_PREEMPTED:
      return "preempted";
    case EMD_UNWIND_END_NO_USER:
      return "no_user";
    default:
      return "?";
  }
}

namespace {
// The walks' ends as drop reasons (bpf/common/unwind.bpf.h's emd_unwind_ends): every end
// but the stack's own is a stack cut, its frames kept.
std::vector<std::string> walk_end_reasons() {
  std::vector<std::string> out(EMD_UNWIND_END__COUNT);
  for (std::uint32_t end = EMD_UNWIND_END_COMPLETE + 1; end < EMD_UNWIND_END__COUNT; ++end)
    out[end] = "unwind_" + std::string(walk_end_name(end));
  return out;
}
const SharedDrops walk_end_drops("emd_unwind_ends", walk_end_reasons());
}  // namespace

}  // namespace ebpf_metricsd::profiling

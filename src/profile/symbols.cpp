#include "ebpf_metricsd/profile/symbols.h"

#include <bpf/bpf.h>
#include <cxxabi.h>
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>

#include "ebpf_metricsd/base/clock.h"

namespace ebpf_metricsd::profiling {

namespace {

std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string base_name(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::size_t string_heap_bytes(const std::string& s) {
  // Past libstdc++'s inline buffer of 15 characters, the heap holds capacity + 1.
  return s.capacity() > 15 ? s.capacity() + 1 : 0;
}

}  // namespace

std::size_t frame_heap_bytes(const Frame& f) {
  std::size_t n = string_heap_bytes(f.function) + string_heap_bytes(f.module) +
                  string_heap_bytes(f.build_id) + f.lines.capacity() * sizeof(SourceLine);
  for (const SourceLine& l : f.lines)
    n += string_heap_bytes(l.function) + string_heap_bytes(l.file);
  return n;
}

std::size_t frames_bytes(const std::vector<Frame>& frames) {
  std::size_t n = frames.capacity() * sizeof(Frame);
  for (const Frame& f : frames) n += frame_heap_bytes(f);
  return n;
}

// --- kernel ---------------------------------------------------------------------------

KernelSymbols::KernelSymbols(std::string kallsyms, std::string modules)
    : kallsyms_(std::move(kallsyms)), modules_(std::move(modules)) {}

std::string KernelSymbols::signature() const {
  // Modules as the kernel lists them, and the ids of the BPF programs loaded: either
  // changes the text symbols (a BPF program's symbol is bpf_prog_<tag>_<name> [bpf]).
  std::string sig = read_file(modules_);
  std::uint32_t id = 0;
  while (bpf_prog_get_next_id(id, &id) == 0) sig += ":" + std::to_string(id);
  return sig;
}

void KernelSymbols::refresh() {
  std::string sig = signature();
  if (loaded_ && sig == signature_) return;
  signature_ = std::move(sig);
  load();
  loaded_ = true;
}

void KernelSymbols::load() {
  struct Sym {
    std::uint64_t start;
    std::uint32_t name;
  };
  std::vector<Sym> syms;
  std::string arena;
  // Sized as the table read last, which goes first: two tables at once (and vectors grown
  // by doubling) would add their size to the daemon's peak memory at every reread.
  syms.reserve(starts_.size() + 4096);
  arena.reserve(arena_.size() + 256 * 1024);
  std::vector<std::uint64_t>().swap(starts_);
  std::vector<std::uint32_t>().swap(names_);
  std::string().swap(arena_);
  std::ifstream in(kallsyms_);
  std::string line;
  while (std::getline(in, line)) {
    // "ffffffff81000000 T _stext" or "ffffffffc0a01000 t ext4_foo\t[ext4]"
    char* end = nullptr;
    const std::uint64_t addr = std::strtoull(line.c_str(), &end, 16);
    if (end == line.c_str() || addr == 0 || *end != ' ') continue;
    const char type = end[1];
    if (type != 't' && type != 'T' && type != 'w' && type != 'W') continue;
    std::string_view rest(end + 2);
    if (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    std::string_view name = rest, module = "kernel";
    if (const auto tab = rest.find('\t'); tab != std::string_view::npos) {
      name = rest.substr(0, tab);
      module = rest.substr(tab + 1);
      if (module.size() >= 2 && module.front() == '[' && module.back() == ']') {
        module = module.substr(1, module.size() - 2);
      }
    }
    syms.push_back({addr, static_cast<std::uint32_t>(arena.size())});
    arena.append(name);
    arena.push_back('\0');
    arena.append(module);
    arena.push_back('\0');
  }
  std::stable_sort(syms.begin(), syms.end(),
                   [](const Sym& a, const Sym& b) { return a.start < b.start; });
  starts_.reserve(syms.size());
  names_.reserve(syms.size());
  for (const Sym& s : syms) {
    starts_.push_back(s.start);
    names_.push_back(s.name);
  }
  arena_ = std::move(arena);
  arena_.shrink_to_fit();
}

Frame KernelSymbols::resolve(std::uint64_t address, bool return_address) const {
  Frame f;
  f.kernel = true;
  f.address = address;
  f.module = "[kernel]";
  const std::uint64_t at = return_address && address > 0 ? address - 1 : address;
  auto it = std::upper_bound(starts_.begin(), starts_.end(), at);
  if (it == starts_.begin()) {
    f.function = "[kernel]+" + hex(address);
    return f;
  }
  const std::size_t i = static_cast<std::size_t>(it - starts_.begin()) - 1;
  const char* name = arena_.data() + names_[i];
  const char* module = name + std::strlen(name) + 1;
  f.function = name;
  if (std::strcmp(module, "kernel") != 0) f.module = std::string("[") + module + "]";
  return f;
}

// --- user ------------------------------------------------------------------------------

class ElfModule {
 public:
  // The file open as `fd` (taken), which the process maps as `path`. nullptr, with `why`
  // set, when it is refused (elf_file.h) or libdwfl cannot read it.
  static std::shared_ptr<ElfModule> open(int fd, const std::string& path, const ElfLimits& limits,
                                         UserSymbols::Held& held, ElfRefusal& why) {
    std::shared_ptr<ElfFile> file = ElfFile::open(fd, limits, why);
    if (!file) return nullptr;
    why = ElfRefusal::NotElf;
    auto m = std::shared_ptr<ElfModule>(new ElfModule(path, std::move(file), held));
    m->dwfl_ = dwfl_begin(&dwfl_callbacks(true));
    if (!m->dwfl_) return nullptr;
    // At bias 0: the module sits at its link-time addresses, so a file offset maps to an
    // address through the program headers alone.
    dwfl_report_begin(m->dwfl_);
    m->mod_ = m->file_->report(m->dwfl_, base_name(path));
    dwfl_report_end(m->dwfl_, nullptr, nullptr);
    if (!m->mod_) return nullptr;
    GElf_Addr bias = 0;
    Elf* elf = dwfl_module_getelf(m->mod_, &bias);
    if (!elf) return nullptr;
    m->bias_ = bias;
    GElf_Ehdr ehdr;
    m->fixed_ = gelf_getehdr(elf, &ehdr) && ehdr.e_type == ET_EXEC;
    std::size_t n = 0;
    if (elf_getphdrnum(elf, &n) == 0) {
      for (std::size_t i = 0; i < n; ++i) {
        GElf_Phdr ph;
        if (gelf_getphdr(elf, static_cast<int>(i), &ph) && ph.p_type == PT_LOAD) {
          m->loads_.push_back({ph.p_offset, ph.p_filesz, ph.p_vaddr});
        }
      }
    }
    return m;
  }

  ~ElfModule() {
    if (dwfl_) dwfl_end(dwfl_);
    held_.dwarf_bytes -= dwarf_granted_;
    held_.name_bytes -= name_bytes_;
  }
  ElfModule(const ElfModule&) = delete;
  ElfModule& operator=(const ElfModule&) = delete;

  const std::string& path() const { return path_; }
  const std::string& build_id() const { return file_->build_id(); }
  std::size_t names() const { return names_.size(); }
  std::size_t name_bytes() const { return name_bytes_; }
  const ElfFile& file() const { return *file_; }
  void clear_names() {
    names_.clear();
    held_.name_bytes -= name_bytes_;
    name_bytes_ = 0;
  }

  // The file as the unwinder sees it where a process maps it at `start` from file offset
  // `offset`; false when no loaded segment holds that offset.
  bool mapped_at(std::uint64_t start, std::uint64_t offset, MappedFile& out) const {
    for (const Load& l : loads_) {
      if (offset < l.offset || offset >= l.offset + std::max<std::uint64_t>(l.size, 1)) continue;
      out = {start, offset, base_name(path_), file_, fixed_, l.offset, l.vaddr};
      return true;
    }
    return false;
  }

  // What is known of file offset `offset`: its function ("" when no symbol covers it) and,
  // once asked for with lines, its source lines.
  struct Named {
    std::string name;
    std::vector<SourceLine> lines;
    bool lines_read = false;
  };

  // The function at file offset `offset`, with its lines when `lines` (and DWARF is here
  // and fits in the budget).
  const Named& at(std::uint64_t offset, bool lines) {
    auto [it, fresh] = names_.try_emplace(offset);
    Named& n = it->second;
    GElf_Addr addr = 0;
    bool loaded = false;
    for (const Load& l : loads_) {
      if (offset < l.offset || offset >= l.offset + l.size) continue;
      addr = offset - l.offset + l.vaddr + bias_;
      loaded = true;
      break;
    }
    const std::size_t before = name_bytes_;
    if (fresh) {
      name_bytes_ += kEntryBytes;
      if (loaded) {
        GElf_Off off = 0;
        GElf_Sym sym;
        if (const char* name =
                dwfl_module_addrinfo(mod_, addr, &off, &sym, nullptr, nullptr, nullptr)) {
          // "clock_nanosleep@GLIBC_2.2.5": the symbol's version is not part of its name.
          std::string s(name);
          if (const auto v = s.find('@'); v != std::string::npos && v > 0) s.erase(v);
          n.name = demangle(s);
          name_bytes_ += n.name.size();
        }
      }
    }
    if (lines && !n.lines_read && loaded && !dwarf_broken_ && dwarf_granted()) {
      n.lines_read = true;
      if (auto found = source_lines(mod_, addr, n.name)) {
        n.lines = std::move(*found);
      } else {
        dwarf_broken_ = true;
        ++held_.dwarf_broken;
      }
      for (const SourceLine& l : n.lines)
        name_bytes_ += sizeof l + l.function.size() + l.file.size();
    }
    held_.name_bytes += name_bytes_ - before;
    return n;
  }

 private:
  ElfModule(std::string path, std::shared_ptr<ElfFile> file, UserSymbols::Held& held)
      : path_(std::move(path)), file_(std::move(file)), held_(held) {}

  // What libdw holds for a file whose DWARF it reads, beyond twice the DWARF.
  static constexpr std::uint64_t kDwarfFileBytes = 32 << 10;
  // What one cached name costs beyond its strings: the hash node and its bookkeeping.
  static constexpr std::size_t kEntryBytes = 96;

  // Whether this file's DWARF may be read: the first time, its size (in the file, or in its
  // debug file) is taken from the budget if it fits. A file with no DWARF takes nothing.
  bool dwarf_granted() {
    if (dwarf_granted_ > 0) return true;
    if (over_budget_) return false;
    // libdwfl reads the file's own DWARF where it has any (then 0 when it is not to be read,
    // elf_file.h), else its debug file's.
    std::uint64_t bytes = 0;
    if (file_->has_dwarf()) {
      bytes = file_->dwarf_bytes();
    } else if (const auto debug = file_->debug_file()) {
      bytes = debug->dwarf_bytes();
    }
    if (bytes == 0) return false;
    // What libdw builds beside the sections: 45 KiB a file was measured for 13 KiB of DWARF.
    const std::uint64_t cost = 2 * bytes + kDwarfFileBytes;
    if (cost > held_.max_dwarf_bytes || held_.dwarf_bytes > held_.max_dwarf_bytes - cost) {
      // Counted once a file; asked again only when it is opened again.
      over_budget_ = true;
      ++held_.lines_over_budget;
      return false;
    }
    held_.dwarf_bytes += cost;
    dwarf_granted_ = cost;
    return true;
  }

  struct Load {
    std::uint64_t offset, size, vaddr;
  };
  std::string path_;
  std::shared_ptr<ElfFile> file_;
  bool fixed_ = false;  // ET_EXEC
  Dwfl* dwfl_ = nullptr;
  Dwfl_Module* mod_ = nullptr;
  GElf_Addr bias_ = 0;
  std::vector<Load> loads_;
  std::unordered_map<std::uint64_t, Named> names_;
  std::size_t name_bytes_ = 0;
  std::uint64_t dwarf_granted_ = 0;
  bool dwarf_broken_ = false;  // a line table could not be read: no more lines from it
  bool over_budget_ = false;   // its DWARF did not fit
  UserSymbols::Held& held_;    // what its names and DWARF count in, given back when closed
};

UserSymbols::UserSymbols(Limits limits) : limits_(limits) {
  held_.max_dwarf_bytes = limits.max_dwarf_bytes;
}
UserSymbols::~UserSymbols() = default;

std::uint64_t UserSymbols::table_bytes() const {
  std::uint64_t n = 0;
  for (const auto& m : modules_) n += m->file().table_bytes();
  return n;
}

std::size_t UserSymbols::names() const {
  std::size_t n = 0;
  for (const auto& m : modules_) n += m->names();
  return n;
}

namespace {

// Field 22 of /proc/PID/stat, the start time in clock ticks since boot; 0 when gone.
std::uint64_t start_time(pid_t tgid) {
  const std::string stat = read_file("/proc/" + std::to_string(tgid) + "/stat");
  const auto paren = stat.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream in(stat.substr(paren + 2));
  std::string field;
  for (int i = 3; i <= 22 && in >> field; ++i) {
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  }
  return 0;
}

}  // namespace

namespace {

// The pid of `tgid` in its own pid namespace (the NSpid line of /proc/PID/status), which the
// perf map's name uses; `tgid` itself where there is none.
pid_t namespace_pid(pid_t tgid) {
  std::istringstream in(read_file("/proc/" + std::to_string(tgid) + "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("NSpid:", 0) != 0) continue;
    const auto last = line.find_last_of(" \t");
    const long n = std::strtol(line.c_str() + last + 1, nullptr, 10);
    return n > 0 ? static_cast<pid_t>(n) : tgid;
  }
  return tgid;
}

}  // namespace

// A perf map is a file its process's user writes, read as hostile input: only a regular file
// (not followed through a symlink, opened non-blocking) owned by the process's owner or root,
// at most max_jit_map_file; lines "START SIZE name" in hex, others skipped; names cut at 256
// bytes.
std::string UserSymbols::jit_name(pid_t tgid, Process& p, std::uint64_t address) {
  const auto find = [&]() -> std::string {
    auto at = std::upper_bound(p.jit.begin(), p.jit.end(), address,
                               [](std::uint64_t a, const JitSymbol& j) { return a < j.start; });
    // An entry that covers it, among the nearest below.
    for (int back = 0; at != p.jit.begin() && back < 64; ++back) {
      --at;
      if (address < at->end) return at->name;
    }
    return "";
  };
  if (std::string name = find(); !name.empty()) return name;
  const auto now = std::chrono::steady_clock::now();
  if (p.jit_read && now - p.jit_read_at < std::chrono::seconds(1)) return "";
  p.jit_read = true;
  p.jit_read_at = now;
  // Opened below the process's root as if it were /, never through a symlink (openat2):
  // a process can make its /tmp anything, in a mount namespace of its own.
  const std::string proc = "/proc/" + std::to_string(tgid);
  const int root = ::open((proc + "/root").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (root < 0) return "";
  const std::string path = "tmp/perf-" + std::to_string(namespace_pid(tgid)) + ".map";
  open_how how{};
  how.flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  const int fd = static_cast<int>(syscall(SYS_openat2, root, path.c_str(), &how, sizeof how));
  close(root);
  if (fd < 0) return "";
  struct stat st {
  }, owner{};
  const bool regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  // A map refused before is not read again until it changes.
  const JitStamp stamp{static_cast<std::uint64_t>(st.st_size),
                       static_cast<std::uint64_t>(st.st_mtim.tv_sec) * 1000000000u +
                           static_cast<std::uint64_t>(st.st_mtim.tv_nsec)};
  if (regular && p.jit_refused == stamp) {
    close(fd);
    return "";
  }
  const bool ok = regular && static_cast<std::uint64_t>(st.st_size) <= limits_.max_jit_map_file &&
                  ::stat(proc.c_str(), &owner) == 0 && st.st_uid == owner.st_uid;
  std::string text;
  if (ok) {
    text.resize(static_cast<std::size_t>(st.st_size));
    std::size_t got = 0;
    while (got < text.size()) {
      const ssize_t n = pread(fd, text.data() + got, text.size() - got, static_cast<off_t>(got));
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    text.resize(got);
  }
  close(fd);
  held_.jit_bytes -= p.jit_bytes;
  p.jit.clear();
  p.jit_bytes = 0;
  const auto refuse = [&] {
    if (regular) p.jit_refused = stamp;
    ++held_.jit_maps_refused;
    return std::string();
  };
  if (!ok) return refuse();
  // Lines "START SIZE name", hex; others skipped. Parsing stops where the entries would not
  // fit in what the budget has left.
  const std::size_t room =
      limits_.max_jit_bytes > held_.jit_bytes ? limits_.max_jit_bytes - held_.jit_bytes : 0;
  std::vector<JitSymbol> jit;
  std::size_t bytes = 0;
  std::string_view rest(text);
  while (!rest.empty()) {
    const std::size_t nl = rest.find('\n');
    const std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    std::uint64_t start = 0, size = 0;
    const char* at = line.data();
    const char* end = line.data() + line.size();
    auto r1 = std::from_chars(at, end, start, 16);
    if (r1.ec != std::errc() || r1.ptr == end || *r1.ptr != ' ') continue;
    auto r2 = std::from_chars(r1.ptr + 1, end, size, 16);
    if (r2.ec != std::errc() || r2.ptr == end || *r2.ptr != ' ') continue;
    if (size == 0 || start + size < start) continue;
    const std::string_view name =
        line.substr(static_cast<std::size_t>(r2.ptr + 1 - line.data()), 256);
    if (name.empty()) continue;
    bytes += sizeof(JitSymbol) + name.size();
    if (bytes > room) return refuse();
    jit.push_back({start, start + size, std::string(name)});
  }
  std::stable_sort(jit.begin(), jit.end(),
                   [](const JitSymbol& a, const JitSymbol& b) { return a.start < b.start; });
  p.jit = std::move(jit);
  p.jit_bytes = bytes;
  held_.jit_bytes += bytes;
  return find();
}

void UserSymbols::forget(pid_t tgid) {
  auto it = processes_.find(tgid);
  if (it == processes_.end()) return;
  erase(it);
}

std::map<pid_t, UserSymbols::Process>::iterator UserSymbols::erase(
    std::map<pid_t, Process>::iterator it) {
  process_lru_.erase(it->second.lru);
  if (it->second.space) space_lru_.erase(it->second.space_lru);
  held_.jit_bytes -= it->second.jit_bytes;
  return processes_.erase(it);
}

void UserSymbols::forget_exited() {
  for (auto it = processes_.begin(); it != processes_.end();) {
    if (it->second.exited) {
      it = erase(it);
      continue;
    }
    it->second.exited = start_time(it->first) != it->second.start_time;
    ++it;
  }
  // Files no known process maps any more are closed (opened again if one maps them later).
  std::set<const ElfModule*> mapped;
  for (const auto& [tgid, p] : processes_) {
    for (const Mapping& m : p.mappings) {
      if (auto elf = m.elf.lock()) mapped.insert(elf.get());
    }
  }
  modules_.remove_if(
      [&](const std::shared_ptr<ElfModule>& e) { return !mapped.contains(e.get()); });
  std::erase_if(by_inode_, [](const auto& kv) { return kv.second.expired(); });
}

namespace {

// A descriptor of the file a process maps at [start, end) (its /proc/PID/maps path `path`):
// /proc/PID/map_files/ opens exactly what the process maps, also when the file was deleted
// or replaced since, or lives in another mount namespace (a container); else the path in
// the process's root. -1 when neither opens (the process is gone). Non-blocking: a FIFO or
// a device a user maps does not hold the reader.
int open_mapped_file(pid_t tgid, std::uint64_t start, std::uint64_t end, std::string path) {
  char range[64];
  std::snprintf(range, sizeof range, "%llx-%llx", static_cast<unsigned long long>(start),
                static_cast<unsigned long long>(end));
  const std::string proc = "/proc/" + std::to_string(tgid);
  constexpr int kFlags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
  int fd = ::open((proc + "/map_files/" + range).c_str(), kFlags);
  if (fd >= 0) return fd;
  if (const auto deleted = path.rfind(" (deleted)");
      deleted != std::string::npos && deleted + 10 == path.size()) {
    path.erase(deleted);
  }
  if (path.empty() || path.front() != '/') return -1;
  return ::open((proc + "/root" + path).c_str(), kFlags);
}

}  // namespace

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
  snap->start_time = start_time(tgid);
  if (snap->start_time == 0) return snap;
  std::ifstream maps("/proc/" + std::to_string(tgid) + "/maps");
  std::string line;
  while (std::getline(maps, line)) {
    // start-end perms offset dev inode path
    unsigned long long start = 0, end = 0, offset = 0, inode = 0;
    unsigned major = 0, minor = 0;
    char perms[8] = {};
    int path_at = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %x:%x %llu %n", &start, &end, perms, &offset,
                    &major, &minor, &inode, &path_at) < 7) {
      continue;
    }
    if (perms[2] != 'x') continue;
    Mapping m{start,
              end,
              offset,
              path_at > 0 ? line.substr(static_cast<std::size_t>(path_at)) : std::string(),
              (static_cast<std::uint64_t>(major) << 32) | minor,
              inode,
              {}};
    if (inode != 0) {
      const auto key = std::make_pair(m.dev, m.inode);
      if (!snap->files.contains(key)) snap->files[key] = open_mapped_file(tgid, start, end, m.path);
    }
    snap->mappings.push_back(std::move(m));
  }
  return snap;
}

void UserSymbols::capture(pid_t tgid, bool again) {
  auto known = processes_.find(tgid);
  if (known != processes_.end() && !again) {
    const std::uint64_t started = start_time(tgid);
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
  if (fd < 0) fd = open_mapped_file(tgid, m.start, m.end, m.path);
  std::string path = m.path;
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

Unwound UserSymbols::unwind(pid_t tgid, pid_t tid, const UserStackCopy& copy,
                            std::size_t max_depth) {
  auto it = processes_.find(tgid);
  if (it == processes_.end()) return {{}, UnwindEnd::NoModule};
  Process& p = it->second;
  if (!p.space) {
    std::vector<MappedFile> files;
    std::set<const ElfModule*> reported;
    for (const Mapping& m : p.mappings) {
      std::shared_ptr<ElfModule> elf = m.elf.lock();
      if (!elf && m.inode != 0) elf = open_module(tgid, m);
      MappedFile f;
      // One module a file: its first executable mapping places it.
      if (elf && !reported.count(elf.get()) && elf->mapped_at(m.start, m.offset, f)) {
        reported.insert(elf.get());
        files.push_back(f);
      }
    }
    p.space = AddressSpace::build(tgid, files);
    if (!p.space) return {{}, UnwindEnd::NoModule};
    space_lru_.push_front(tgid);
    p.space_lru = space_lru_.begin();
    while (space_lru_.size() > limits_.max_address_spaces) {
      const pid_t oldest = space_lru_.back();
      space_lru_.pop_back();
      if (auto o = processes_.find(oldest); o != processes_.end()) o->second.space.reset();
    }
  } else {
    space_lru_.splice(space_lru_.begin(), space_lru_, p.space_lru);
  }
  return p.space->unwind(tid, copy, max_depth);
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
  if (elf) {
    // Most recently used first: the least used file is closed first.
    for (auto m = modules_.begin(); m != modules_.end(); ++m) {
      if (*m == elf) {
        modules_.splice(modules_.begin(), modules_, m);
        break;
      }
    }
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

// --- the rules --------------------------------------------------------------------------

namespace {

// The one frame of a user stack whose process's mappings were never read.
Frame mappings_not_read() {
  Frame f;
  f.function = "[mappings not read]";
  f.module = "[unknown]";
  return f;
}

bool tracing_frame(const std::string& fn) {
  static constexpr std::array<std::string_view, 6> prefixes = {
      "bpf_prog_", "bpf_trace_run", "__bpf_trace_", "__traceiter_", "bpf_get_stack", "perf_trace_"};
  for (auto p : prefixes) {
    if (fn.rfind(p, 0) == 0) return true;
  }
  return false;
}

}  // namespace

Symbolizer::Symbolizer(UserSymbols::Limits limits, std::string kallsyms, std::string modules)
    : kernel_(std::move(kallsyms), std::move(modules)), user_(limits) {}

void Symbolizer::refresh_kernel() {
  // Modules and BPF programs come and go: the table is read again when they changed, looked
  // at once a second at most.
  const auto now = std::chrono::steady_clock::now();
  if (now - kernel_read_ < std::chrono::seconds(1)) return;
  kernel_.refresh();
  kernel_read_ = now;
}

std::vector<Frame> Symbolizer::kernel_frames(std::span<const std::uint64_t> ips,
                                             StackOrigin origin) {
  std::vector<Frame> frames;
  if (ips.empty()) return frames;
  frames.reserve(ips.size());
  std::lock_guard lock(mutex_);
  refresh_kernel();
  const bool call = origin == StackOrigin::Call;
  bool machinery = call;
  for (std::size_t i = 0; i < ips.size(); ++i) {
    Frame f = kernel_.resolve(ips[i], call || i > 0);
    if (machinery && tracing_frame(f.function)) continue;
    machinery = false;
    frames.push_back(std::move(f));
  }
  frames.shrink_to_fit();  // the tracing machinery's frames left room
  return frames;
}

std::vector<Frame> Symbolizer::user_frames(std::uint32_t pid_number,
                                           std::span<const std::uint64_t> ips, bool lines,
                                           std::uint64_t taken_by_ns) {
  // Not reserved for all of `ips`: a walk without frame pointers ends early, and callers
  // keep what is returned.
  std::vector<Frame> frames;
  if (ips.empty()) return frames;
  const auto pid = static_cast<pid_t>(pid_number);
  std::lock_guard lock(mutex_);
  install_captured();
  user_.capture(pid);
  if (!user_.knows(pid)) {
    ++stacks_without_mappings_;
    return {mappings_not_read()};
  }
  for (std::size_t i = 0; i < ips.size(); ++i) {
    Frame f = user_.resolve(pid, ips[i], i > 0, lines);
    if (f.module == "[unknown]" && i == 0) {
      // Where the thread was is mapped since the mappings were read (dlopen): read them
      // again. (An unknown caller is a walk gone astray, not a new mapping.)
      user_.refresh(pid, taken_by_ns);
      f = user_.resolve(pid, ips[i], false, lines);
    }
    if (f.module == "[unknown]") break;
    frames.push_back(std::move(f));
  }
  return frames;
}

std::vector<Frame> Symbolizer::user_frames(std::uint32_t pid_number, std::uint32_t tid,
                                           const UserStackCopy& copy, std::size_t max_depth,
                                           UnwindEnd& end, bool lines) {
  const auto pid = static_cast<pid_t>(pid_number);
  std::lock_guard lock(mutex_);
  install_captured();
  user_.capture(pid);
  if (!user_.knows(pid)) {
    end = UnwindEnd::NoModule;
    ++stacks_without_mappings_;
    return {mappings_not_read()};
  }
  Unwound u = user_.unwind(pid, static_cast<pid_t>(tid), copy, max_depth);
  if ((u.frames.empty() && u.end == UnwindEnd::NoModule) ||
      (!u.frames.empty() &&
       user_.resolve(pid, u.frames.front().pc, !u.frames.front().activation).module ==
           "[unknown]")) {
    // Where the thread was is mapped since the mappings were read (dlopen, or an exec not
    // yet announced): read them again and start over. (An unknown caller further up is an
    // unwind gone astray, not a new mapping.)
    user_.refresh(pid);
    u = user_.unwind(pid, static_cast<pid_t>(tid), copy, max_depth);
  }
  end = u.end;
  std::vector<Frame> frames;
  frames.reserve(u.frames.size());
  for (std::size_t i = 0; i < u.frames.size(); ++i) {
    const UnwoundFrame& uf = u.frames[i];
    Frame f = user_.resolve(pid, uf.pc, !uf.activation, lines);
    if (f.module == "[unknown]") {
      end = UnwindEnd::NoModule;
      break;
    }
    frames.push_back(std::move(f));
  }
  return frames;
}

std::vector<Frame> Symbolizer::frames(std::uint32_t pid,
                                      std::span<const std::uint64_t> kernel_stack,
                                      std::span<const std::uint64_t> user_stack, StackOrigin origin,
                                      bool lines, std::uint64_t taken_by_ns) {
  std::vector<Frame> out = kernel_frames(kernel_stack, origin);
  std::vector<Frame> user = user_frames(pid, user_stack, lines, taken_by_ns);
  out.insert(out.end(), std::make_move_iterator(user.begin()), std::make_move_iterator(user.end()));
  return out;
}

void Symbolizer::capture(std::uint32_t pid, bool execed) {
  auto snapshot = UserSymbols::snapshot(static_cast<pid_t>(pid));
  std::lock_guard lock(captured_mutex_);
  captured_.emplace_back(std::move(snapshot), execed);
}

void Symbolizer::install_captured() {
  std::vector<std::pair<std::shared_ptr<UserSymbols::Snapshot>, bool>> captured;
  {
    std::lock_guard lock(captured_mutex_);
    captured.swap(captured_);
  }
  for (auto& [snapshot, execed] : captured) user_.install(*snapshot, execed);
}

void Symbolizer::end_round() {
  std::lock_guard lock(mutex_);
  install_captured();
  user_.forget_exited();
}

Symbolizer::Sizes Symbolizer::sizes() {
  std::lock_guard lock(mutex_);
  Sizes s{};
  s.elf_files = user_.modules();
  s.processes = user_.processes();
  s.names = user_.names();
  s.kernel_symbols = kernel_.symbols();
  s.address_spaces = user_.address_spaces();
  s.kernel_symbol_bytes = kernel_.bytes();
  s.refused = user_.refused();
  s.held = user_.held();
  s.table_bytes = user_.table_bytes();
  s.stacks_without_mappings = stacks_without_mappings_;
  return s;
}

}  // namespace ebpf_metricsd::profiling

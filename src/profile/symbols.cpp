#include "ebpf_metricsd/profile/symbols.h"

#include <bpf/bpf.h>
#include <cxxabi.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <gelf.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string_view>

namespace ebpf_metricsd::profiling {

std::string demangle(const std::string& name) {
  if (name.rfind("_Z", 0) != 0) return name;
  int status = 0;
  char* out = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  if (status != 0 || out == nullptr) {
    std::free(out);
    return name;
  }
  std::string s(out);
  std::free(out);
  return s;
}

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

}  // namespace

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
  starts_.clear();
  names_.clear();
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
  // Opens `open_path` (what to read) for the file the process maps as `path`. nullptr when
  // it is not an ELF file libdw can read.
  static std::shared_ptr<ElfModule> open(const std::string& open_path, const std::string& path) {
    const int fd = ::open(open_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return nullptr;
    auto m = std::shared_ptr<ElfModule>(new ElfModule(path));
    m->dwfl_ = dwfl_begin(&callbacks());
    if (!m->dwfl_) {
      close(fd);
      return nullptr;
    }
    dwfl_report_begin(m->dwfl_);
    // base 0 with the first segment's address added: the module sits at its link-time
    // addresses, so a file offset maps to an address through the program headers alone.
    m->mod_ = dwfl_report_elf(m->dwfl_, base_name(path).c_str(), open_path.c_str(), fd, 0, true);
    dwfl_report_end(m->dwfl_, nullptr, nullptr);
    if (!m->mod_) {
      close(fd);  // libdwfl keeps the descriptor only of a module it made
      return nullptr;
    }
    GElf_Addr bias = 0;
    Elf* elf = dwfl_module_getelf(m->mod_, &bias);
    if (!elf) return nullptr;
    m->bias_ = bias;
    std::size_t n = 0;
    if (elf_getphdrnum(elf, &n) == 0) {
      for (std::size_t i = 0; i < n; ++i) {
        GElf_Phdr ph;
        if (gelf_getphdr(elf, static_cast<int>(i), &ph) && ph.p_type == PT_LOAD) {
          m->loads_.push_back({ph.p_offset, ph.p_filesz, ph.p_vaddr});
        }
      }
    }
    const unsigned char* bits = nullptr;
    GElf_Addr vaddr = 0;
    const int len = dwfl_module_build_id(m->mod_, &bits, &vaddr);
    for (int i = 0; i < len; ++i) {
      char b[3];
      std::snprintf(b, sizeof b, "%02x", bits[i]);
      m->build_id_ += b;
    }
    return m;
  }

  ~ElfModule() {
    if (dwfl_) dwfl_end(dwfl_);
  }
  ElfModule(const ElfModule&) = delete;
  ElfModule& operator=(const ElfModule&) = delete;

  const std::string& path() const { return path_; }
  const std::string& build_id() const { return build_id_; }
  std::size_t names() const { return names_.size(); }
  void clear_names() { names_.clear(); }

  // The function at file offset `offset` ("" when no symbol covers it).
  const std::string& name_at(std::uint64_t offset) {
    auto [it, fresh] = names_.try_emplace(offset);
    if (!fresh) return it->second;
    for (const Load& l : loads_) {
      if (offset < l.offset || offset >= l.offset + l.size) continue;
      const GElf_Addr addr = offset - l.offset + l.vaddr + bias_;
      GElf_Off off = 0;
      GElf_Sym sym;
      const char* name = dwfl_module_addrinfo(mod_, addr, &off, &sym, nullptr, nullptr, nullptr);
      if (name) {
        // "clock_nanosleep@GLIBC_2.2.5": the symbol's version is not part of its name.
        std::string n(name);
        if (const auto at = n.find('@'); at != std::string::npos && at > 0) n.erase(at);
        it->second = demangle(n);
      }
      break;
    }
    return it->second;
  }

 private:
  explicit ElfModule(std::string path) : path_(std::move(path)) {}

  static const Dwfl_Callbacks& callbacks() {
    // Debug files by build-id and .gnu_debuglink under the default path (the file's own
    // directory, .debug/ beside it, /usr/lib/debug). debuginfod is asked only when
    // DEBUGINFOD_URLS is set, which the daemon clears at start.
    static char* debuginfo_path = nullptr;
    static const Dwfl_Callbacks cb = {dwfl_build_id_find_elf, dwfl_standard_find_debuginfo,
                                      dwfl_offline_section_address, &debuginfo_path};
    return cb;
  }

  struct Load {
    std::uint64_t offset, size, vaddr;
  };
  std::string path_;
  std::string build_id_;
  Dwfl* dwfl_ = nullptr;
  Dwfl_Module* mod_ = nullptr;
  GElf_Addr bias_ = 0;
  std::vector<Load> loads_;
  std::unordered_map<std::uint64_t, std::string> names_;
};

UserSymbols::UserSymbols(Limits limits) : limits_(limits) { elf_version(EV_CURRENT); }
UserSymbols::~UserSymbols() = default;

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

void UserSymbols::forget(pid_t tgid) {
  auto it = processes_.find(tgid);
  if (it == processes_.end()) return;
  process_lru_.erase(it->second.lru);
  processes_.erase(it);
}

void UserSymbols::forget_exited() {
  for (auto it = processes_.begin(); it != processes_.end();) {
    if (it->second.exited) {
      process_lru_.erase(it->second.lru);
      it = processes_.erase(it);
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

void UserSymbols::capture(pid_t tgid, bool again) {
  const std::uint64_t started = start_time(tgid);
  if (auto it = processes_.find(tgid); it != processes_.end()) {
    if (started == 0 || (started == it->second.start_time && !again)) {
      process_lru_.splice(process_lru_.begin(), process_lru_, it->second.lru);
      return;  // known (or gone: keep what was captured)
    }
    forget(tgid);  // the pid was reused, or asked again
  }
  if (started == 0) return;
  Process p;
  p.start_time = started;
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
    if (inode != 0) m.elf = open_module(tgid, m, m.dev, m.inode);
    p.mappings.push_back(std::move(m));
  }
  process_lru_.push_front(tgid);
  p.lru = process_lru_.begin();
  processes_.emplace(tgid, std::move(p));
  while (processes_.size() > limits_.max_processes) {
    const pid_t oldest = process_lru_.back();
    process_lru_.pop_back();
    processes_.erase(oldest);
  }
}

std::shared_ptr<ElfModule> UserSymbols::open_module(pid_t tgid, const Mapping& m, std::uint64_t dev,
                                                    std::uint64_t inode) {
  const auto key = std::make_pair(dev, inode);
  if (auto it = by_inode_.find(key); it != by_inode_.end()) {
    if (auto elf = it->second.lock()) return elf;
  }
  // /proc/PID/map_files/ opens exactly what the process maps, also when the file was
  // deleted or replaced since, or lives in another mount namespace (a container).
  char range[64];
  std::snprintf(range, sizeof range, "%llx-%llx", static_cast<unsigned long long>(m.start),
                static_cast<unsigned long long>(m.end));
  const std::string proc = "/proc/" + std::to_string(tgid);
  std::string path = m.path;
  if (const auto deleted = path.rfind(" (deleted)");
      deleted != std::string::npos && deleted + 10 == path.size()) {
    path.erase(deleted);
  }
  std::shared_ptr<ElfModule> elf = ElfModule::open(proc + "/map_files/" + range, path);
  if (!elf && !path.empty() && path.front() == '/')
    elf = ElfModule::open(proc + "/root" + path, path);
  if (!elf) return nullptr;
  by_inode_[key] = elf;
  modules_.push_front(elf);
  while (modules_.size() > limits_.max_modules) modules_.pop_back();
  // Drop weak entries of closed modules now and then.
  if (by_inode_.size() > 2 * limits_.max_modules) {
    std::erase_if(by_inode_, [](const auto& kv) { return kv.second.expired(); });
  }
  return elf;
}

Frame UserSymbols::resolve(pid_t tgid, std::uint64_t address, bool return_address) {
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
  std::shared_ptr<ElfModule> elf = hit->elf.lock();
  if (!elf && hit->inode != 0) elf = open_module(tgid, *hit, hit->dev, hit->inode);
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
    const std::string& name = elf->name_at(at);
    if (!name.empty()) f.function = name;
    if (names() > limits_.max_names) {
      for (const auto& m : modules_) m->clear_names();
    }
  }
  if (f.function.empty()) f.function = base_name(f.module) + "+" + hex(offset);
  return f;
}

// --- the rules --------------------------------------------------------------------------

namespace {

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
  bool machinery = origin == StackOrigin::Tracepoint;
  for (std::size_t i = 0; i < ips.size(); ++i) {
    Frame f = kernel_.resolve(ips[i], i > 0);
    if (machinery && tracing_frame(f.function)) continue;
    machinery = false;
    frames.push_back(std::move(f));
  }
  return frames;
}

std::vector<Frame> Symbolizer::user_frames(std::uint32_t pid_number,
                                           std::span<const std::uint64_t> ips) {
  std::vector<Frame> frames;
  if (ips.empty()) return frames;
  frames.reserve(ips.size());
  const auto pid = static_cast<pid_t>(pid_number);
  std::lock_guard lock(mutex_);
  user_.capture(pid);
  for (std::size_t i = 0; i < ips.size(); ++i) {
    Frame f = user_.resolve(pid, ips[i], i > 0);
    if (f.module == "[unknown]" && i == 0) {
      // Where the thread was is mapped since the mappings were read (dlopen): read them
      // again. (An unknown caller is a walk gone astray, not a new mapping.)
      user_.capture(pid, true);
      f = user_.resolve(pid, ips[i], false);
    }
    if (f.module == "[unknown]") break;
    frames.push_back(std::move(f));
  }
  return frames;
}

std::vector<Frame> Symbolizer::frames(std::uint32_t pid,
                                      std::span<const std::uint64_t> kernel_stack,
                                      std::span<const std::uint64_t> user_stack,
                                      StackOrigin origin) {
  std::vector<Frame> out = kernel_frames(kernel_stack, origin);
  std::vector<Frame> user = user_frames(pid, user_stack);
  out.insert(out.end(), std::make_move_iterator(user.begin()), std::make_move_iterator(user.end()));
  return out;
}

void Symbolizer::capture(std::uint32_t pid) {
  std::lock_guard lock(mutex_);
  user_.capture(static_cast<pid_t>(pid), true);
}

void Symbolizer::end_round() {
  std::lock_guard lock(mutex_);
  user_.forget_exited();
}

Symbolizer::Sizes Symbolizer::sizes() {
  std::lock_guard lock(mutex_);
  return {user_.modules(), user_.processes(), user_.names(), kernel_.symbols()};
}

}  // namespace ebpf_metricsd::profiling

#include "ebpf_metricsd/bpf/bpf_support.h"
#include "ebpf_metricsd/bpf/map_reader.h"
#include "ebpf_metricsd/bpf/skeleton.h"

#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <linux/perf_event.h>
#include <spdlog/spdlog.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

namespace ebpf_metricsd {

std::string bpf_error_text(const std::string& what, int err) {
  if (err < 0) err = -err;
  return what + ": " + std::strerror(err) + " (errno " + std::to_string(err) + ")";
}

BpfLink attach_program(bpf_program* prog) {
  bpf_link* link = bpf_program__attach(prog);
  if (!link) {
    const int err = errno;
    throw BpfError(bpf_error_text(std::string("attach ") + bpf_program__name(prog), err));
  }
  return BpfLink(link);
}

std::vector<BpfLink> load_and_attach(const std::vector<ProgramChoice>& programs,
                                     const std::function<int()>& load, const std::string& name) {
  for (const auto& p : programs) bpf_program__set_autoload(p.prog, p.wanted);
  if (kernel_stand_in()) return {};  // set up, and nothing of it in the kernel
  if (int err = load()) throw BpfError(bpf_error_text("load " + name, err));
  std::vector<BpfLink> links;
  for (const auto& p : programs) {
    if (p.wanted && p.attach) links.push_back(attach_program(p.prog));
  }
  return links;
}

BpfLink attach_perf_event(bpf_program* prog, const perf_event_attr& attr, int cpu) {
  if (kernel_stand_in()) return {};
  const int fd =
      static_cast<int>(syscall(SYS_perf_event_open, &attr, -1, cpu, -1, PERF_FLAG_FD_CLOEXEC));
  if (fd < 0) {
    throw BpfError(bpf_error_text("perf_event_open on CPU " + std::to_string(cpu), errno));
  }
  bpf_link* link = bpf_program__attach_perf_event(prog, fd);
  if (!link) {
    const int err = errno;
    close(fd);
    throw BpfError(bpf_error_text(
        std::string("attach ") + bpf_program__name(prog) + " on CPU " + std::to_string(cpu), err));
  }
  return BpfLink(link);
}

BpfLink attach_perf_sw_event(bpf_program* prog, std::uint64_t config, int cpu) {
  perf_event_attr attr{};
  attr.type = PERF_TYPE_SOFTWARE;
  attr.size = sizeof attr;
  attr.config = config;
  attr.sample_period = 1;
  return attach_perf_event(prog, attr, cpu);
}

namespace {

int libbpf_print(enum libbpf_print_level level, const char* fmt, va_list args) {
  // Verifier logs run to many kilobytes: size the buffer to the message.
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  if (n <= 0) return n;
  std::string msg(static_cast<std::size_t>(n) + 1, '\0');
  std::vsnprintf(msg.data(), msg.size(), fmt, args);
  msg.resize(static_cast<std::size_t>(n));
  while (!msg.empty() && msg.back() == '\n') msg.pop_back();
  switch (level) {
    case LIBBPF_WARN:
      spdlog::warn("libbpf: {}", msg);
      break;
    case LIBBPF_INFO:
      spdlog::debug("libbpf: {}", msg);
      break;
    case LIBBPF_DEBUG:
      spdlog::trace("libbpf: {}", msg);
      break;
  }
  return n;
}

}  // namespace

namespace {
std::mutex g_btf_mutex;
std::string g_btf_path;
}  // namespace

void set_kernel_btf_path(std::string path) {
  std::lock_guard lock(g_btf_mutex);
  g_btf_path = std::move(path);
}

std::string kernel_btf_path() {
  std::lock_guard lock(g_btf_mutex);
  return g_btf_path;
}

namespace {

// Parsed BTF by path ("" = the running kernel's), kept while a KernelBtfHold lives.
struct BtfCache {
  std::mutex mutex;
  int holds = 0;
  std::map<std::string, std::shared_ptr<const btf>> parsed;
};

BtfCache& btf_cache() {
  static BtfCache cache;
  return cache;
}

std::shared_ptr<const btf> shared_btf(const std::string& path) {
  BtfCache& cache = btf_cache();
  std::lock_guard lock(cache.mutex);
  if (auto it = cache.parsed.find(path); it != cache.parsed.end()) return it->second;
  btf* parsed = path.empty() ? btf__load_vmlinux_btf() : btf__parse(path.c_str(), nullptr);
  if (!parsed) return nullptr;  // errno says why
  std::shared_ptr<const btf> shared(parsed, [](const btf* b) { btf__free(const_cast<btf*>(b)); });
  if (cache.holds > 0) cache.parsed.emplace(path, shared);
  return shared;
}

}  // namespace

KernelBtfHold::KernelBtfHold() {
  std::lock_guard lock(btf_cache().mutex);
  ++btf_cache().holds;
}

KernelBtfHold::~KernelBtfHold() {
  std::lock_guard lock(btf_cache().mutex);
  if (--btf_cache().holds == 0) btf_cache().parsed.clear();
}

std::shared_ptr<const btf> kernel_btf() { return shared_btf(kernel_btf_path()); }

std::shared_ptr<const btf> running_kernel_btf() { return shared_btf(""); }

int running_kernel_btf_id(const std::string& name, enum bpf_attach_type attach) {
  const auto vmlinux = running_kernel_btf();
  if (!vmlinux) return errno ? -errno : -ENOENT;
  std::string prefix;
  __u32 kind = BTF_KIND_FUNC;
  if (attach == BPF_TRACE_RAW_TP) {
    prefix = "btf_trace_";
    kind = BTF_KIND_TYPEDEF;
  } else if (attach == BPF_TRACE_ITER) {
    prefix = "bpf_iter_";
  }
  const int id = btf__find_by_name_kind(vmlinux.get(), (prefix + name).c_str(), kind);
  return id < 0 ? -ENOENT : id;
}

bpf_object_open_opts skeleton_open_opts(std::string& storage) {
  storage = kernel_btf_path();
  LIBBPF_OPTS(bpf_object_open_opts, opts);
  if (!storage.empty()) opts.btf_custom_path = storage.c_str();
  return opts;
}

void route_libbpf_logs() { libbpf_set_print(libbpf_print); }

int possible_cpus() {
  static const int n = libbpf_num_possible_cpus();
  if (n <= 0) throw BpfError(bpf_error_text("libbpf_num_possible_cpus", n));
  return n;
}

std::uint32_t lru_map_entries(std::uint32_t wanted) {
  const auto reserve =
      std::min<std::uint64_t>(256ULL * static_cast<std::uint64_t>(possible_cpus()), 65536);
  return std::max<std::uint32_t>(wanted, static_cast<std::uint32_t>(reserve));
}

std::vector<int> online_cpus() {
  std::ifstream in("/sys/devices/system/cpu/online");
  std::string list;
  if (!std::getline(in, list)) throw BpfError("cannot read /sys/devices/system/cpu/online");
  std::vector<int> cpus;
  std::stringstream ss(list);
  std::string range;
  while (std::getline(ss, range, ',')) {
    const auto dash = range.find('-');
    const int lo = std::stoi(range.substr(0, dash));
    const int hi = dash == std::string::npos ? lo : std::stoi(range.substr(dash + 1));
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
  }
  return cpus;
}

std::vector<std::uint8_t> read_percpu_array_bytes(int map_fd, std::uint32_t entries,
                                                  std::size_t value_size, BatchReads& batch) {
  const std::size_t cpus = static_cast<std::size_t>(possible_cpus());
  const std::size_t stride = (value_size + 7) / 8 * 8;
  std::vector<std::uint8_t> values(entries * cpus * stride);
  std::vector<std::uint32_t> keys(entries);

  // One syscall for the whole array where the kernel has batch ops for the map type. Where
  // it has none (5.10 for per-CPU arrays) it answers ENOTSUPP (524, its internal errno) or
  // EINVAL, and the map is read key by key from then on.
  if (batch != BatchReads::Unsupported) {
    std::uint32_t out_batch = 0;
    std::uint32_t count = entries;
    LIBBPF_OPTS(bpf_map_batch_opts, opts);
    const int err = bpf_map_lookup_batch(map_fd, nullptr, &out_batch, keys.data(), values.data(),
                                         &count, &opts);
    if ((err == 0 || errno == ENOENT) && count == entries) {
      batch = BatchReads::Supported;
      return values;  // array keys come back in order 0..entries-1
    }
    constexpr int kKernelEnotsupp = 524;
    if (err != 0 && (errno == EINVAL || errno == ENOTSUP || errno == kKernelEnotsupp)) {
      if (batch == BatchReads::Supported)
        throw BpfError(bpf_error_text("bpf_map_lookup_batch", errno));
      batch = BatchReads::Unsupported;
    } else if (err != 0 && errno != ENOENT) {
      throw BpfError(bpf_error_text("bpf_map_lookup_batch", errno));
    }
  }
  for (std::uint32_t k = 0; k < entries; ++k) {
    if (bpf_map_lookup_elem(map_fd, &k, values.data() + k * cpus * stride) != 0) {
      throw BpfError(bpf_error_text("bpf_map_lookup_elem", errno));
    }
  }
  return values;
}

std::vector<ProgramChoice> programs_of(std::span<const HookTwin> twins, HookKind kind) {
  const bool btf = kind == HookKind::TpBtf;
  std::vector<ProgramChoice> programs;
  for (const HookTwin& t : twins) {
    bpf_program* used = btf ? t.btf : t.raw;
    bpf_program* other = btf ? t.raw : t.btf;
    if (used) programs.push_back({used, t.wanted, t.attach});
    if (other && other != used) programs.push_back({other, false});
  }
  return programs;
}

}  // namespace ebpf_metricsd

#pragma once

#include <bpf/libbpf.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

struct perf_event_attr;

namespace ebpf_metricsd {

// A kernel object could not be loaded or attached; the message carries the kernel's reason.
class BpfError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "what: strerror (errno)" for a negative libbpf return code or errno value.
std::string bpf_error_text(const std::string& what, int err);

struct BpfLinkDeleter {
  void operator()(bpf_link* link) const { bpf_link__destroy(link); }
};
using BpfLink = std::unique_ptr<bpf_link, BpfLinkDeleter>;

// Owns a bpftool skeleton: Skeleton::open()/destroy() are the generated functions.
template <typename Skel, void (*Destroy)(Skel*)>
struct SkeletonDeleter {
  void operator()(Skel* s) const { Destroy(s); }
};
template <typename Skel, void (*Destroy)(Skel*)>
using SkeletonPtr = std::unique_ptr<Skel, SkeletonDeleter<Skel, Destroy>>;

// The kernel's BTF comes from /sys/kernel/btf/vmlinux, or, for kernels built without it,
// from the file the config's `btf_path` names (a BTF or an ELF with a .BTF section, such
// as one of the BTFHub files). Set once at start and on reload, before tracers start.
void set_kernel_btf_path(std::string path);
std::string kernel_btf_path();
// The kernel's BTF for its types (from kernel_btf_path() when set); nullptr with errno set
// when there is none.
std::shared_ptr<const struct btf> kernel_btf();
// The running kernel's own BTF (/sys/kernel/btf/vmlinux, whatever btf_path says): the ids
// programs attach by; nullptr with errno set when the kernel has none.
std::shared_ptr<const struct btf> running_kernel_btf();
// The id in running_kernel_btf() of what a program of `attach` type attaches to, as
// libbpf_find_vmlinux_btf_id answers it (a tracepoint's btf_trace_ typedef, a function, an
// iterator's bpf_iter_ function); a negative errno when there is none.
int running_kernel_btf_id(const std::string& name, enum bpf_attach_type attach);

// While one lives, the BTF above is read and parsed once and shared, not once per question:
// the kernel's BTF is 5 to 7 MB, and starting the tracers asks of it about forty times (hook
// probes, argument types, allocators), which costs most of their start under emulation.
// Held around starting tracers; the parsed copy (about twice the file in memory) goes when
// the last hold does.
class KernelBtfHold {
 public:
  KernelBtfHold();
  ~KernelBtfHold();
  KernelBtfHold(const KernelBtfHold&) = delete;
  KernelBtfHold& operator=(const KernelBtfHold&) = delete;
};
// Options for opening a skeleton: CO-RE relocations against kernel_btf_path() when set.
// `storage` keeps the path alive as long as the options.
bpf_object_open_opts skeleton_open_opts(std::string& storage);

// Attaches a program and returns the owning link; throws BpfError with the kernel's reason.
BpfLink attach_program(bpf_program* prog);

// A program of a skeleton and whether this start uses it; `attach`: whether
// load_and_attach attaches it (false for programs the tracer attaches itself, as to perf
// events).
struct ProgramChoice {
  bpf_program* prog;
  bool wanted;
  bool attach = true;
};

// Sets autoload on exactly the wanted programs, loads the object with `load` (the
// skeleton's __load, returning 0 or a negative error), then attaches the wanted programs in
// the given order. Throws BpfError naming `name` and the kernel's reason.
std::vector<BpfLink> load_and_attach(const std::vector<ProgramChoice>& programs,
                                     const std::function<int()>& load, const std::string& name);

// Opens the perf event `attr` on `cpu` (every task) and attaches `prog` to it; the link
// owns the perf event fd.
BpfLink attach_perf_event(bpf_program* prog, const perf_event_attr& attr, int cpu);
// attach_perf_event of software event `config` (PERF_COUNT_SW_*) with sample_period 1: the
// program runs on every event.
BpfLink attach_perf_sw_event(bpf_program* prog, std::uint64_t config, int cpu);

// Sends libbpf's own messages to the daemon's log (debug level for its chatter).
void route_libbpf_logs();

// A NUL-padded fixed-size name from a BPF map (comm, disk, interface) as a string.
template <std::size_t N>
std::string fixed_name(const char (&buf)[N]) {
  return std::string(buf, strnlen(buf, N));
}

int possible_cpus();
// The entries of an LRU hash that is to hold `wanted`: at least 256 per possible CPU, as the
// kernel's LRU keeps up to 128 free entries per CPU in reserve, which would starve a small
// map; at most 65536 for that reserve (about 64 MiB of stacks), what a very large host gets.
std::uint32_t lru_map_entries(std::uint32_t wanted);
// The CPUs online now, from /sys/devices/system/cpu/online.
std::vector<int> online_cpus();

// Whether a map can be read with one batch lookup: learned on its first read and kept, so
// a kernel without batch ops for the map type costs one failed call per map, not per read.
enum class BatchReads { Unknown, Supported, Unsupported };

// Reads a whole BPF_MAP_TYPE_PERCPU_ARRAY as the kernel lays it out: for each key, one
// value per possible CPU, each padded to 8 bytes. `batch` is the map's own state.
std::vector<std::uint8_t> read_percpu_array_bytes(int map_fd, std::uint32_t entries,
                                                  std::size_t value_size, BatchReads& batch);

}  // namespace ebpf_metricsd

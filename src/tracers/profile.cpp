// profile: where CPU time and blocked time go, as symbolized stacks (bpf/profile.bpf.c), kept
// in the daemon's ProfileStore for /debug/pprof/profile and the flame graph page.
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <malloc.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "ebpf_metricsd/base/cgroup_names.h"
#include "ebpf_metricsd/base/yaml_reader.h"
#include "ebpf_metricsd/bpf/bpf_support.h"
#include "ebpf_metricsd/bpf/drop_accounting.h"
#include "ebpf_metricsd/bpf/ring_reader.h"
#include "ebpf_metricsd/bpf/skeleton.h"
#include "ebpf_metricsd/metrics/metric_scope.h"
#include "ebpf_metricsd/profile/profile_store.h"
#include "ebpf_metricsd/profile/symbols.h"
#include "ebpf_metricsd/tracers/registry.h"
#include "user_stack.h"

// clang-format off
#include <linux/types.h>
#include "common/stacks.h"
#include "profile.h"
#include "profile.skel.h"
// clang-format on

namespace ebpf_metricsd {

namespace {

using profiling::Frame;
using profiling::Sample;
using profiling::SampleKind;

struct ProfileOptions {
  std::uint32_t frequency = 19;
  std::chrono::milliseconds offcpu_min{1};
  bool on_cpu = true;
  bool off_cpu = true;
  bool cgroup = false;
  std::vector<std::string> workloads;  // cgroup paths or unit names; empty = everything
  std::uint32_t max_stacks = 8192;
  std::uint32_t max_aggregates = 16384;
  // How user stacks are walked: copied and unwound with CFI, or by frame pointer.
  bool unwind_cfi = true;
  // User stacks copied a second, over all CPUs; past it, frame pointers.
  std::uint32_t stack_copies_per_second = 500;
  // User frames with their source lines and inlined functions, where DWARF is on the host.
  bool lines = false;
};

ProfileOptions read_options(YamlMapReader& r) {
  ProfileOptions o;
  o.frequency = static_cast<std::uint32_t>(r.get_int("frequency", o.frequency, 1, 1000));
  o.offcpu_min = r.get_duration("offcpu_min", o.offcpu_min, std::chrono::milliseconds(0),
                                std::chrono::seconds(60));
  o.on_cpu = r.get_bool("on_cpu", o.on_cpu);
  o.off_cpu = r.get_bool("off_cpu", o.off_cpu);
  if (!o.on_cpu && !o.off_cpu)
    r.fail("off_cpu", "on_cpu and off_cpu are both false: nothing to profile");
  o.cgroup = r.get_bool("cgroup", o.cgroup);
  o.workloads = r.get_string_list("workloads");
  if (o.workloads.size() > PROFILE_MAX_WORKLOADS) {
    r.fail("workloads", "at most " + std::to_string(PROFILE_MAX_WORKLOADS) + " workloads");
  }
  for (const auto& w : o.workloads) {
    if (w.empty()) r.fail("workloads", "an empty workload name");
  }
  // max_stacks: at most 64 MiB (the kernel keeps lru_map_entries() of them, at least 256 a
  // possible CPU up to 64 MiB); 2 x 32 MiB of aggregates at most, preallocated in the kernel.
  o.max_stacks = static_cast<std::uint32_t>(r.get_int("max_stacks", o.max_stacks, 64, 65536));
  o.max_aggregates =
      static_cast<std::uint32_t>(r.get_int("max_aggregates", o.max_aggregates, 64, 262144));
  const std::string unwind = r.get_string("unwind", "cfi");
  if (unwind != "cfi" && unwind != "frame_pointers")
    r.fail("unwind", "expected cfi or frame_pointers, got " + quoted_excerpt(unwind));
  o.unwind_cfi = unwind == "cfi";
  o.stack_copies_per_second = static_cast<std::uint32_t>(
      r.get_int("stack_copies_per_second", o.stack_copies_per_second, 1, 100000));
  o.lines = r.get_bool("lines", o.lines);
  return o;
}

// The cgroup directory a workload names: a path below the cgroup2 mount ("/system.slice/x"),
// or a unit or directory name found anywhere in the tree ("nginx.service"). "" when there
// is none now.
std::string workload_directory(const std::string& root, const std::string& name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (name.front() == '/') {
    const fs::path p = fs::path(root) / name.substr(1);
    return fs::is_directory(p, ec) ? p.string() : "";
  }
  for (auto it = fs::recursive_directory_iterator(
           root, fs::directory_options::skip_permission_denied, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    if (it->is_directory(ec) && it->path().filename() == name) return it->path().string();
  }
  return "";
}

// The calling thread's CPU time so far.
std::uint64_t thread_cpu_ns() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<std::uint64_t>(t.tv_sec) * 1000000000ULL +
         static_cast<std::uint64_t>(t.tv_nsec);
}

// The keys of BPF hash map `fd` as they are now.
template <class Key>
std::vector<Key> map_keys(int fd) {
  std::vector<Key> keys;
  Key key{}, next_key{};
  const void* prev = nullptr;
  while (bpf_map_get_next_key(fd, prev, &next_key) == 0) {
    keys.push_back(next_key);
    key = next_key;
    prev = &key;
  }
  return keys;
}

class ProfileTracer final : public Tracer {
 public:
  using Options = ProfileOptions;
  ProfileTracer(MetricScope& scope, ProfileOptions options, const TracerContext& context)
      : scope_(scope),
        options_(std::move(options)),
        drops_(scope,
               drop_reasons<PROFILE_DROP__COUNT>(
                   {"map_full", "thread_state", "announce_full", "syscall_mismatch", "syscall_exec",
                    "syscall_exited", "syscall_kstack", "stopped", "wake_missed", "thread_end"})),
        caches_(scope.declare({"ebpf_metricsd_profile_cache_entries",
                               "Entries of the profile's symbolization caches and tables: "
                               "ELF files open, processes whose mappings are kept, names "
                               "cached, kernel symbols, frames and samples kept.",
                               MetricType::Gauge,
                               {"cache"}})),
        memory_(scope.declare({"ebpf_metricsd_profile_memory_bytes",
                               "What the profile holds, by part: names and lines cached, "
                               "DWARF read for lines (its sections, counted twice), the symbol "
                               "and CFI tables of the open files, JIT perf maps, the ring of "
                               "copied stacks, the kernel's symbol table, the samples kept, "
                               "the stacks and the frames they use, and the freed memory the "
                               "allocator keeps (allocator_free).",
                               MetricType::Gauge,
                               {"part"}})),
        refused_(scope.declare({"ebpf_metricsd_profile_files_refused_total",
                                "Files processes map that the symbolizer refused to read, by "
                                "why: not a regular file, too large, not an x86-64 ELF file, "
                                "tables outside the file, too many symbols, unreadable; "
                                "perf_map: a JIT's perf map not read.",
                                MetricType::Counter,
                                {"reason"}})),
        no_lines_(scope.declare({"ebpf_metricsd_profile_files_without_lines_total",
                                 "Files with DWARF whose source lines were not read (with "
                                 "lines: true), by why: over_budget (its DWARF did not fit in "
                                 "the DWARF budget), bad_line_table (libdw could not read a "
                                 "line table of it). Their frames keep their names.",
                                 MetricType::Counter,
                                 {"reason"}})),
        no_mappings_(scope.declare(
            {"ebpf_metricsd_profile_stacks_without_mappings_total",
             "User stacks (of samples, waits and slow events) whose process exited before "
             "the daemon read its mappings: their user part is the one frame "
             "[mappings not read].",
             MetricType::Counter,
             {}})),
        samples_(scope.declare({"ebpf_metricsd_profile_samples_total",
                                "On-CPU samples and off-CPU waits the profile recorded.",
                                MetricType::Counter,
                                {"state"}})),
        unwinds_metric_(scope.declare({"ebpf_metricsd_profile_unwinds_total",
                                       "Copied user stacks unwound with CFI, by how the unwind "
                                       "ended: complete, or cut (the frames found are kept).",
                                       MetricType::Counter,
                                       {"result"}})),
        unwind_cpu_(scope.declare({"ebpf_metricsd_profile_unwind_cpu_seconds_total",
                                   "CPU time the daemon spent unwinding copied user stacks "
                                   "(divide by the unwinds for the cost of one).",
                                   MetricType::Counter,
                                   {},
                                   {},
                                   1e9})),
        store_(context.profiles) {
    if (!store_) throw std::runtime_error("profile: this process keeps no profiles");
  }

  ~ProfileTracer() override {
    if (started_) store_->set_source(nullptr);
    records_.stop();
    announcements_.stop();
  }

  void start(HookProber& prober, HookPreference preference) override {
    // `kind`: the off-CPU hooks' (none without off_cpu).
    auto setup = [&](profile* s, std::optional<HookKind> kind) {
      s->rodata->on_cpu_on = options_.on_cpu;
      s->rodata->off_cpu_on = options_.off_cpu;
      s->rodata->offcpu_min_ns =
          static_cast<__u64>(std::chrono::nanoseconds(options_.offcpu_min).count());
      s->rodata->nr_workloads = static_cast<__u32>(options_.workloads.size());
      s->rodata->emd_by_cgroup = options_.cgroup;
      s->rodata->unwind_cfi = options_.unwind_cfi;
      s->rodata->waits_at_sys_exit = waits_at_sys_exit();
      configure_user_stacks(s, options_.stack_copies_per_second);
      // About a quarter of a second of copies at the limit (samples_ring_bytes): the
      // reader empties it as records arrive.
      bpf_map__set_max_entries(s->maps.samples, options_.unwind_cfi ? samples_ring_bytes() : 4096);
      bpf_map__set_max_entries(s->maps.emd_stacks, kept_stacks());
      bpf_map__set_max_entries(s->maps.counts_a, options_.max_aggregates);
      bpf_map__set_max_entries(s->maps.counts_b, options_.max_aggregates);
      const bool off = kind.has_value();
      configure_task_state(s->maps.emd_offcpu_task, s->maps.emd_offcpu_by_tid,
                           kind.value_or(HookKind::RawTp), off);
      auto& p = s->progs;
      std::vector<HookTwin> hooks = {
          {p.on_cpu_sample, p.on_cpu_sample, options_.on_cpu, /*attach=*/false}};
      for (const HookTwin& t : EBPF_METRICSD_SCHED_SWITCH_TWINS(p, offcpu_switch, off))
        hooks.push_back(t);
      hooks.push_back({nullptr, p.emd_offcpu_free, off});
      hooks.push_back({p.profile_exec, p.profile_exec});
      const bool at_exit = off && waits_at_sys_exit();
      hooks.push_back({p.profile_sys_exit_btf, p.profile_sys_exit_raw, at_exit});
      hooks.push_back({p.profile_thread_exit_btf, p.profile_thread_exit_raw, at_exit});
      // The threads now (an iterator each cut runs) and as they exit. The iterator reads
      // the off-CPU state where the switch programs keep it: task storage with tp_btf.
      // An iterator attaches by the kernel's BTF: a kernel without it (btf_path) has none.
      const bool storage = off && kind == HookKind::TpBtf;
      const bool iterate = running_kernel_btf_id("task", BPF_TRACE_ITER) >= 0;
      hooks.push_back({p.profile_threads_btf, p.profile_threads_btf, iterate && storage, false});
      hooks.push_back({p.profile_threads_raw, p.profile_threads_raw, iterate && !storage, false});
      hooks.push_back({p.profile_thread_end, p.profile_thread_end, iterate});
      return hooks;
    };
    if (options_.off_cpu) {
      static const std::array<std::string, 4> tracepoints = {"sched_switch", "sched_process_free",
                                                             "sys_exit", "sched_process_exit"};
      skel_ = Skeleton::load_probed("profile", drops_, prober, tracepoints, preference,
                                    [&](profile* s, HookKind k) { return setup(s, k); });
    } else {
      skel_ = Skeleton::load(
          "profile", drops_,
          [&](profile* s) { return programs_of(setup(s, std::nullopt), HookKind::TpBtf); },
          "perf_event");
    }
    if (options_.on_cpu) {
      perf_event_attr attr{};
      attr.type = PERF_TYPE_SOFTWARE;
      attr.size = sizeof attr;
      attr.config = PERF_COUNT_SW_CPU_CLOCK;
      attr.freq = 1;
      attr.sample_freq = options_.frequency;
      for (int cpu : online_cpus())
        perf_links_.push_back(attach_perf_event(skel_->progs.on_cpu_sample, attr, cpu));
    }
    slot_fd_ = bpf_map__fd(skel_->maps.counts_slot);
    counts_fd_[0] = bpf_map__fd(skel_->maps.counts_a);
    counts_fd_[1] = bpf_map__fd(skel_->maps.counts_b);
    stacks_fd_ = bpf_map__fd(skel_->maps.emd_stacks);
    resolve_workloads();
    announcements_ = RingReader(
        skel_->maps.new_processes,
        [this](std::span<const std::byte> record) { on_announce(record); },
        "profile: process announcements");
    if (options_.unwind_cfi) {
      records_ = RingReader(
          skel_->maps.samples, [this](std::span<const std::byte> record) { on_record(record); },
          "profile: samples with user stacks");
    }
    attach_thread_iterator();
    store_->set_frequency(options_.on_cpu ? options_.frequency : 0);
    store_->set_source([this] { cut(); });
    started_ = true;
  }

  std::string hook() const override { return skel_.hook(); }

  // At the daemon's exit: the records still in the rings are not unwound, and a cut in
  // progress ends after reading them (under emulation, unwinding a drain's records took
  // longer than the rest of the daemon's stop).
  void abandon() override { abandoned_ = true; }

  void drain() override {
    cut();
    if (abandoned_) return;
    drops_.drain();
    publish();
    if (profiling::Clock::now() - workloads_resolved_ >= kWorkloadRescan) resolve_workloads();
  }

 private:
  using Skeleton = EBPF_METRICSD_SKELETON(profile);
  static constexpr std::size_t kMaxUserFrames = 128;

  // Whether the user stacks of long waits inside system calls are copied when the call
  // returns (sys_exit), for the CFI unwinder.
  bool waits_at_sys_exit() const { return options_.unwind_cfi && options_.off_cpu; }

  // About a quarter of a second of copies at the limit, a power of two (the nearer below
  // where that is within a few records of it: the daemon maps the ring twice, so each byte of
  // it costs three in memory, two of them in its RSS).
  std::uint32_t samples_ring_bytes() const {
    const std::uint64_t want =
        std::uint64_t{options_.stack_copies_per_second} * sizeof(profile_record) / 4;
    const std::uint64_t below = std::bit_floor(std::max<std::uint64_t>(want, 1));
    const std::uint64_t bytes =
        want - below <= 8 * sizeof(profile_record) ? below : std::bit_ceil(want);
    return static_cast<std::uint32_t>(std::clamp<std::uint64_t>(bytes, 1u << 20, 16u << 20));
  }

  // A sample or wait with a copy of its user stack: unwound now (the copy is not kept),
  // then aggregated until the next cut.
  void on_record(std::span<const std::byte> data) {
    constexpr std::size_t header = offsetof(profile_record, ustack.data);
    if (data.size() < header || abandoned_) return;
    // The record without the stack bytes, which are read in place.
    profile_record r;
    std::memcpy(&r, data.data(), header);
    profiling::UserStackCopy copy;
    std::copy(std::begin(r.ustack.regs), std::end(r.ustack.regs), copy.regs.begin());
    copy.base = r.ustack.base;
    copy.bytes = {reinterpret_cast<const std::uint8_t*>(data.data()) + header,
                  std::min<std::size_t>(r.ustack.len, data.size() - header)};
    const std::size_t kn =
        r.kstack_len > 0
            ? std::min<std::size_t>(static_cast<std::size_t>(r.kstack_len) / 8, EMD_STACK_MAX_DEPTH)
            : 0;
    const SampleKind kind = r.kind == PROFILE_OFF_CPU ? SampleKind::OffCpu : SampleKind::OnCpu;
    try {
      profiling::Symbolizer& sym = store_->symbolizer();
      std::vector<Frame> frames =
          sym.kernel_frames({reinterpret_cast<const std::uint64_t*>(r.kstack), kn},
                            kind == SampleKind::OffCpu ? profiling::StackOrigin::Call
                                                       : profiling::StackOrigin::Interrupt);
      profiling::UnwindEnd end = profiling::UnwindEnd::Complete;
      const std::uint64_t cpu0 = thread_cpu_ns();
      std::vector<Frame> user =
          sym.user_frames(r.tgid, r.tid, copy, kMaxUserFrames, end, options_.lines);
      const std::uint64_t cpu = thread_cpu_ns() - cpu0;
      frames.insert(frames.end(), std::make_move_iterator(user.begin()),
                    std::make_move_iterator(user.end()));
      std::lock_guard lock(records_mutex_);
      ++unwinds_[static_cast<std::size_t>(end)];
      unwind_ns_ += cpu;
      // A wait that began in this batch ends in it (the record is of the next batch once
      // the cut that ends this one has taken the records): it adds up with others of its
      // stack; one that began before keeps when (windows take their part).
      const std::uint64_t began = r.began && monotonic(r.began) < batch_begun_ ? r.began : 0;
      RecordKey key{r.tgid,    r.tid, fixed_name(r.comm), r.cgroup, kind,
                    r.syscall, began, std::move(frames)};
      records_pending_[std::move(key)].add({r.count, r.ns, r.ended});
    } catch (const std::exception& e) {
      spdlog::warn("profile: a sample of process {} not unwound: {}", r.tgid, e.what());
    }
  }

  // Stacks the kernel side keeps between reads.
  std::uint32_t kept_stacks() const { return lru_map_entries(options_.max_stacks); }

  // A process seen for the first time (or since it exec'd): its mappings are read now,
  // while it lives, so that its stacks can be symbolized after it has exited.
  void on_announce(std::span<const std::byte> record) {
    profile_announcement a{};
    if (record.size() < sizeof a) return;
    std::memcpy(&a, record.data(), sizeof a);
    try {
      store_->symbolizer().capture(a.tgid, a.again != 0);
    } catch (const std::exception& e) {
      spdlog::warn("profile: mappings of process {}: {}", a.tgid, e.what());
    }
  }
  struct RawStack {
    std::vector<std::uint64_t> ips;
    std::uint64_t check = 0;  // the kernel side's second hash (common/stacks.h)
    profiling::Clock::time_point seen;
  };
  // Counts made by cuts, published by the drain.
  struct Pending {
    std::uint64_t on_cpu = 0, off_cpu = 0, stacks_expired = 0, collisions = 0;
  };
  static constexpr std::chrono::minutes kRawStackLife{10};
  static constexpr std::chrono::seconds kWorkloadRescan{30};
  struct Cached {
    std::vector<Frame> frames;
    std::uint64_t seen = 0;
  };

  // Points each workload's slot at its cgroup directory as it is now (a restarted unit gets
  // a new one).
  void resolve_workloads() {
    if (options_.workloads.empty()) return;
    const int map_fd = bpf_map__fd(skel_->maps.workloads);
    const std::string root = cgroup2_mount();
    for (std::size_t i = 0; i < options_.workloads.size(); ++i) {
      const std::string dir = root.empty() ? "" : workload_directory(root, options_.workloads[i]);
      const __u32 key = static_cast<__u32>(i);
      // Not found now (not started, or removed as the tree was walked): the slot keeps the
      // cgroup it had, which runs nothing once removed.
      if (dir.empty()) continue;
      const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (fd < 0) continue;
      __u32 value = static_cast<__u32>(fd);
      if (bpf_map_update_elem(map_fd, &key, &value, BPF_ANY) != 0) {
        spdlog::warn("profile: cannot watch workload {} ({}): {}", options_.workloads[i], dir,
                     std::strerror(errno));
      }
      close(fd);
    }
    workloads_resolved_ = profiling::Clock::now();
  }

  // Reads everything the kernel side aggregated since the last cut into one batch of the
  // store.
  void cut() {
    std::lock_guard lock(cut_mutex_);
    // Processes announced and samples sent until now, handed over if their readers fell
    // behind (a slow host): a cut holds everything taken before it.
    announcements_.catch_up();
    records_.catch_up();
    if (abandoned_) return;
    // The batch ends now, and the next begins. The samples and waits whose user stacks
    // were copied, unwound as they arrived, until now: a record that arrives from now on
    // is of the next batch.
    profiling::Clock::time_point end, begun;
    std::map<RecordKey, Aggregate> records;
    {
      std::lock_guard records_lock(records_mutex_);
      end = profiling::Clock::now();
      begun = std::exchange(batch_begun_, end);
      records.swap(records_pending_);
    }
    // A wait that ends from now on and began before, or ends while the maps are swapped,
    // is marked so (profile_key.began). Then point the programs at the empty map; the
    // update returns once no program runs with the other one any more, so it is complete.
    auto* bss = skel_->bss;
    const __u64 previous_begin = bss->batch_begin_ns;
    __atomic_store_n(&bss->batch_begin_ns, ns_of(end), __ATOMIC_RELEASE);
    __atomic_store_n(&bss->batch_swapping, 1, __ATOMIC_SEQ_CST);
    const __u32 zero = 0;
    const int full = counts_fd_[active_];
    active_ ^= 1;
    int next = counts_fd_[active_];
    const int swapped = bpf_map_update_elem(slot_fd_, &zero, &next, BPF_ANY);
    const int swap_errno = errno;
    __atomic_store_n(&bss->batch_swapping, 0, __ATOMIC_RELEASE);
    if (swapped != 0) {
      active_ ^= 1;
      __atomic_store_n(&bss->batch_begin_ns, previous_begin, __ATOMIC_RELEASE);
      std::lock_guard records_lock(records_mutex_);
      batch_begun_ = begun;
      for (auto& [k, a] : records) records_pending_[k].add(a);
      throw BpfError(bpf_error_text("profile: swap the aggregate maps", swap_errno));
    }
    ++generation_;
    // A wait from `began` to `ended`: within this batch, or spanning batches, whose
    // windows each take their part (Sample::began).
    const auto span = [&](Sample& s, std::uint64_t began, std::uint64_t ended) {
      if (began == 0 || (monotonic(began) >= begun && monotonic(ended) <= end)) return;
      s.began = monotonic(began);
      s.ended = monotonic(ended);
    };

    std::vector<std::pair<profile_key, profile_value>> entries;
    profile_key key{}, next_key{};
    const void* prev = nullptr;
    while (bpf_map_get_next_key(full, prev, &next_key) == 0) {
      profile_value v{};
      if (bpf_map_lookup_elem(full, &next_key, &v) == 0) entries.emplace_back(next_key, v);
      key = next_key;
      prev = &key;
    }
    for (const auto& e : entries) bpf_map_delete_elem(full, &e.first);
    // The threads now: before the stacks are read, for the kernel stacks of their waits.
    std::vector<profile_thread> now = threads_now();
    read_stacks(end);

    std::vector<Sample> samples;
    samples.reserve(entries.size());
    // The stacks of the batch, viewing the cached frames (kernel_frames, user_frames, the
    // records); what no cache holds is kept in `owned` until the batch is added.
    std::vector<profiling::StackView> stacks;
    std::deque<std::vector<Frame>> owned;
    std::map<std::tuple<std::uint32_t, __u64, __u64, __u32>, std::uint32_t> stack_index;
    std::vector<bool> expired;  // by stack index
    if (options_.cgroup) names_.begin_pass();
    std::uint64_t on = 0, off = 0;
    for (const auto& [k, v] : entries) {
      Sample s;
      s.pid = k.tgid;
      s.tid = k.tid;
      s.comm = fixed_name(k.comm);
      s.kind = k.kind == PROFILE_OFF_CPU ? SampleKind::OffCpu : SampleKind::OnCpu;
      s.syscall = k.syscall;
      s.count = v.count;
      s.ns = v.ns;
      span(s, k.began, v.ended);
      (s.kind == SampleKind::OnCpu ? on : off) += v.count;
      if (options_.cgroup) s.workload = names_.label(k.cgroup);
      const auto [at, fresh] = stack_index.try_emplace({k.tgid, k.kstack, k.ustack, k.kind},
                                                       static_cast<std::uint32_t>(stacks.size()));
      if (fresh) {
        const std::vector<Frame>* kernel = kernel_frames(k.kstack, s.kind);
        const std::vector<Frame>* user = user_frames(k.tgid, k.ustack);
        // A stack the kernel side kept whose frames the daemon no longer has: a wait longer
        // than stacks are kept, or more stacks than max_stacks * 4 since. (One it did not
        // keep, EMD_STACK_NOT_KEPT, was counted where it was taken.)
        expired.push_back((!kernel && k.kstack != EMD_STACK_NOT_KEPT) ||
                          (!user && k.ustack != EMD_STACK_NOT_KEPT));
        profiling::StackView view;
        if (kernel) view.parts[0] = *kernel;
        if (user) view.parts[1] = *user;
        if (view.parts[0].empty() && view.parts[1].empty())
          view.parts[0] = kernel && user ? no_stack() : not_kept();
        stacks.push_back(view);
      }
      s.stack = at->second;
      if (expired[at->second]) pending_.stacks_expired += v.count;
      samples.push_back(std::move(s));
    }
    for (auto& [k, a] : records) {
      Sample s;
      s.pid = k.tgid;
      s.tid = k.tid;
      s.comm = k.comm;
      s.kind = k.kind;
      s.syscall = k.syscall;
      s.count = a.count;
      s.ns = a.ns;
      span(s, k.began, a.ended);
      (s.kind == SampleKind::OnCpu ? on : off) += a.count;
      if (options_.cgroup) s.workload = names_.label(k.cgroup);
      s.stack = static_cast<std::uint32_t>(stacks.size());
      profiling::StackView view;
      view.parts[0] = k.frames.empty() ? no_stack() : std::span<const Frame>(k.frames);
      stacks.push_back(view);
      samples.push_back(std::move(s));
    }
    std::optional<std::vector<profiling::ThreadTime>> accounting;
    std::vector<Sample> waiting;
    if (threads_link_) accounting = account(now, waiting, stacks, owned);
    store_->add_viewed_batch(end, std::move(samples), stacks, std::move(accounting),
                             std::move(waiting));
    pending_.on_cpu += on;
    pending_.off_cpu += off;
    forget_unused();
  }

  // The iterator of the threads now (profile_threads_*), where the kernel has task iterators
  // (5.8): without it, windows have no accounting of threads and no waits in progress.
  void attach_thread_iterator() {
    threads_seen_at_ = ns_of(profiling::Clock::now());
    bpf_program* iterator = nullptr;
    for (bpf_program* p : {skel_->progs.profile_threads_btf, skel_->progs.profile_threads_raw}) {
      if (bpf_program__autoload(p)) iterator = p;
    }
    if (iterator) threads_link_.reset(bpf_program__attach_iter(iterator, nullptr));
    if (!threads_link_) {
      spdlog::warn(
          "profile: no task iterator ({}): threads' time comes from samples, and waits count "
          "once they end",
          iterator ? std::strerror(errno) : "the kernel's own BTF is not available");
      return;
    }
    // Every thread's counts now, for the first cut to count from: the time threads ran
    // before the profile started is not the first window's.
    const std::vector<profile_thread> now = threads_now();
    for (std::size_t i = 0; i < exited_from_; ++i)
      threads_seen_[now[i].tid] = {now[i].start, now[i].on_cpu, now[i].run_delay};
    if (!now.empty()) threads_seen_at_ = now.front().now;
  }

  // Every thread's accounting and wait now (the iterator), then those that exited since the
  // last cut (thread_ends, emptied).
  std::vector<profile_thread> threads_now() {
    std::vector<profile_thread> out;
    if (!threads_link_) return out;
    const int fd = bpf_iter_create(bpf_link__fd(threads_link_.get()));
    if (fd < 0) {
      spdlog::warn("profile: read the threads: {}", std::strerror(errno));
      return out;
    }
    std::vector<std::byte> bytes;
    std::array<std::byte, 64 * 1024> buf;
    for (;;) {
      const ssize_t n = read(fd, buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) spdlog::warn("profile: read the threads: {}", std::strerror(errno));
      if (n <= 0) break;
      bytes.insert(bytes.end(), buf.begin(), buf.begin() + n);
    }
    close(fd);
    out.resize(bytes.size() / sizeof(profile_thread));
    std::memcpy(out.data(), bytes.data(), out.size() * sizeof(profile_thread));
    const std::size_t alive = out.size();
    const int ends = bpf_map__fd(skel_->maps.thread_ends);
    for (__u32 tid : map_keys<__u32>(ends)) {
      profile_thread t{};
      if (bpf_map_lookup_and_delete_elem(ends, &tid, &t) == 0 ||
          (bpf_map_lookup_elem(ends, &tid, &t) == 0 && bpf_map_delete_elem(ends, &tid) == 0)) {
        t.blocked = 0;  // exited: its waits are over
        out.push_back(t);
      }
    }
    exited_from_ = alive;
    return out;
  }

  // The threads' time since the last cut, by the kernel's accounting (each thread's from
  // when it was last seen, or from its start when it began since), and the waits in
  // progress now, with their stacks appended to `stacks`.
  std::vector<profiling::ThreadTime> account(const std::vector<profile_thread>& now,
                                             std::vector<Sample>& waiting,
                                             std::vector<profiling::StackView>& stacks,
                                             std::deque<std::vector<Frame>>& owned) {
    std::vector<profiling::ThreadTime> out;
    const __u64 since = threads_seen_at_;
    std::unordered_map<__u32, SeenThread> seen;
    seen.reserve(exited_from_);
    for (std::size_t i = 0; i < now.size(); ++i) {
      const profile_thread& t = now[i];
      const bool exited = i >= exited_from_;
      // Its values when last seen: by this pass (a thread that exited since), or the last;
      // none for a thread that began since (all its time counts); else from now on.
      SeenThread before{};
      const auto last = [&](const std::unordered_map<__u32, SeenThread>& m) {
        const auto it = m.find(t.tid);
        if (it == m.end() || it->second.start != t.start) return false;
        before = it->second;
        return true;
      };
      if (!last(seen) && !last(threads_seen_) && t.start < since)
        before = {t.start, t.on_cpu, t.run_delay};
      if (!exited) {
        seen[t.tid] = {t.start, t.on_cpu, t.run_delay};
      } else if (auto it = seen.find(t.tid); it != seen.end() && it->second.start == t.start) {
        seen.erase(it);  // not another thread that has its id since
      }
      const __u64 on = t.on_cpu > before.on_cpu ? t.on_cpu - before.on_cpu : 0;
      const __u64 delay = t.run_delay > before.run_delay ? t.run_delay - before.run_delay : 0;
      if (on || delay) {
        profiling::ThreadTime x;
        x.pid = t.tgid;
        x.tid = t.tid;
        x.comm = fixed_name(t.comm);
        if (options_.cgroup) x.workload = names_.label(t.cgroup);
        x.on_cpu_ns = on;
        x.run_delay_ns = delay;
        out.push_back(std::move(x));
      }
      if (exited || t.blocked == 0 || t.now <= t.blocked) continue;
      Sample w;
      w.pid = t.tgid;
      w.tid = t.tid;
      w.comm = fixed_name(t.comm);
      if (options_.cgroup) w.workload = names_.label(t.cgroup);
      w.kind = SampleKind::OffCpu;
      w.syscall = t.syscall;
      w.count = 0;  // counted when it ends
      w.ns = t.now - t.blocked;
      w.began = monotonic(t.blocked);
      w.ended = monotonic(t.now);
      w.stack = static_cast<std::uint32_t>(stacks.size());
      stacks.push_back(waiting_stack(t, owned));
      waiting.push_back(std::move(w));
    }
    threads_seen_ = std::move(seen);
    if (!now.empty()) threads_seen_at_ = now.front().now;
    return out;
  }

  // The stack of a wait in progress: where it sleeps in the kernel, and its user stack as
  // far as known now. Inside a system call with `unwind: cfi` that is taken when the call
  // returns: until then, the function the call returns to, under a frame that says so.
  // Frames no cache holds (the leaf of a wait) go to `owned`, kept until the batch is added.
  profiling::StackView waiting_stack(const profile_thread& t,
                                     std::deque<std::vector<Frame>>& owned) {
    profiling::StackView view;
    if (const std::vector<Frame>* k = kernel_frames(t.kstack, SampleKind::OffCpu))
      view.parts[0] = *k;
    if (t.ustack != 0) {
      if (const std::vector<Frame>* u = user_frames(t.tgid, t.ustack)) view.parts[1] = *u;
    } else if (t.ip != 0 && !t.kernel) {
      const std::vector<std::uint64_t> ip = {t.ip};
      std::vector<Frame>& leaf =
          owned.emplace_back(store_->symbolizer().user_frames(t.tgid, ip, options_.lines));
      Frame callers;
      callers.function = "[waiting: callers known when the call returns]";
      callers.module = "[unknown]";
      leaf.push_back(std::move(callers));
      view.parts[1] = leaf;
    }
    if (view.parts[0].empty() && view.parts[1].empty()) view.parts[0] = no_stack();
    return view;
  }

  // A bpf_ktime_get_ns() time on the daemon's clock (both are CLOCK_MONOTONIC), and back.
  static profiling::Clock::time_point monotonic(std::uint64_t ns) {
    return profiling::Clock::time_point(std::chrono::nanoseconds(ns));
  }
  static __u64 ns_of(profiling::Clock::time_point t) {
    return static_cast<__u64>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
  }

  // A stack of one frame that says why there is none: no stack at all, or one the daemon
  // no longer has.
  static std::span<const Frame> no_stack() {
    static const Frame none = marker("[no stack]");
    return {&none, 1};
  }
  static std::span<const Frame> not_kept() {
    static const Frame gone = marker("[stack not kept]");
    return {&gone, 1};
  }
  static Frame marker(const char* why) {
    Frame f;
    f.function = why;
    f.module = "[unknown]";
    return f;
  }

  // The self-metrics, from the drain only: a cut made for a profile request takes no lock
  // of the metric store.
  void publish() {
    {
      std::array<std::uint64_t, std::size(profiling::kUnwindEnds)> unwinds{};
      std::uint64_t unwind_ns = 0;
      {
        std::lock_guard lock(records_mutex_);
        unwinds = std::exchange(unwinds_, {});
        unwind_ns = std::exchange(unwind_ns_, 0);
      }
      for (profiling::UnwindEnd e : profiling::kUnwindEnds) {
        scope_.add(unwinds_metric_, {std::string(profiling::unwind_end_name(e))},
                   unwinds[static_cast<std::size_t>(e)]);
      }
      scope_.add(unwind_cpu_, {}, unwind_ns);
    }
    Pending p;
    {
      std::lock_guard lock(cut_mutex_);
      p = std::exchange(pending_, Pending{});
    }
    scope_.add(samples_, {"on_cpu"}, p.on_cpu);
    scope_.add(samples_, {"off_cpu"}, p.off_cpu);
    scope_.add_dropped("stack_expired", p.stacks_expired);
    scope_.add_dropped("stack_collision", p.collisions);
    const std::uint64_t store_dropped = store_->dropped_samples();
    scope_.add_dropped("store_full", store_dropped - store_dropped_);
    store_dropped_ = store_dropped;
    const auto sizes = store_->symbolizer().sizes();
    scope_.set(caches_, {"elf_files"}, static_cast<double>(sizes.elf_files));
    scope_.set(caches_, {"address_spaces"}, static_cast<double>(sizes.address_spaces));
    scope_.set(caches_, {"processes"}, static_cast<double>(sizes.processes));
    scope_.set(caches_, {"names"}, static_cast<double>(sizes.names));
    scope_.set(caches_, {"kernel_symbols"}, static_cast<double>(sizes.kernel_symbols));
    scope_.set(memory_, {"names"}, static_cast<double>(sizes.held.name_bytes));
    scope_.set(memory_, {"dwarf"}, static_cast<double>(sizes.held.dwarf_bytes));
    scope_.set(memory_, {"elf_tables"}, static_cast<double>(sizes.table_bytes));
    scope_.set(memory_, {"jit_maps"}, static_cast<double>(sizes.held.jit_bytes));
    scope_.set(memory_, {"stack_ring"},
               options_.unwind_cfi ? static_cast<double>(samples_ring_bytes()) : 0.0);
    scope_.add(no_lines_, {"over_budget"}, sizes.held.lines_over_budget - lines_over_budget_seen_);
    lines_over_budget_seen_ = sizes.held.lines_over_budget;
    scope_.add(no_lines_, {"bad_line_table"}, sizes.held.dwarf_broken - dwarf_broken_seen_);
    dwarf_broken_seen_ = sizes.held.dwarf_broken;
    scope_.add(refused_, {"perf_map"}, sizes.held.jit_maps_refused - jit_refused_seen_);
    jit_refused_seen_ = sizes.held.jit_maps_refused;
    scope_.add(no_mappings_, {}, sizes.stacks_without_mappings - no_mappings_seen_);
    no_mappings_seen_ = sizes.stacks_without_mappings;
    for (profiling::ElfRefusal why : profiling::kElfRefusals) {
      const auto i = static_cast<std::size_t>(why);
      scope_.add(refused_, {std::string(profiling::elf_refusal_name(why))},
                 sizes.refused[i] - refused_seen_[i]);
    }
    refused_seen_ = sizes.refused;
    // The stacks the daemon holds: the store's table and the kernel stacks read from the
    // kernel side (raw_); the frames: the store's and the symbolized stacks the tracer
    // caches for the next cuts and the unwound records not yet cut.
    const profiling::ProfileStore::Bytes kept = store_->bytes();
    // A std::map's node holding `key` and `value`: four pointers and the colour beside the
    // entry, and the heap of the symbolized frames it keeps.
    const auto map_node_bytes = [](const auto& key, const auto& value,
                                   const std::vector<profiling::Frame>& frames) {
      return sizeof(key) + sizeof(value) + 5 * sizeof(void*) + profiling::frames_bytes(frames);
    };
    std::size_t stack_bytes = kept.stacks, frame_bytes = kept.frames;
    {
      std::lock_guard lock(cut_mutex_);
      scope_.set(caches_, {"stacks"}, static_cast<double>(raw_.size()));
      // An unordered_map's node and bucket: three pointers beside the entry.
      stack_bytes += raw_.size() * (sizeof(RawStack) + sizeof(__u64) + 3 * sizeof(void*));
      for (const auto& [hash, r] : raw_) stack_bytes += r.ips.capacity() * sizeof(std::uint64_t);
      for (const auto& [key, c] : kernel_cache_) frame_bytes += map_node_bytes(key, c, c.frames);
      for (const auto& [key, c] : user_cache_) frame_bytes += map_node_bytes(key, c, c.frames);
    }
    {
      std::lock_guard lock(records_mutex_);
      for (const auto& [k, a] : records_pending_) frame_bytes += map_node_bytes(k, a, k.frames);
    }
    scope_.set(memory_, {"kernel_symbols"}, static_cast<double>(sizes.kernel_symbol_bytes));
    scope_.set(memory_, {"samples"}, static_cast<double>(kept.samples));
    scope_.set(memory_, {"stacks"}, static_cast<double>(stack_bytes));
    scope_.set(memory_, {"frames"}, static_cast<double>(frame_bytes));
    // What the allocator keeps of freed memory (in its arenas, not given back): resident
    // where it was touched.
    scope_.set(memory_, {"allocator_free"}, static_cast<double>(mallinfo2().fordblks));
    scope_.set(caches_, {"frames"}, static_cast<double>(store_->frames_kept()));
    scope_.set(caches_, {"samples"}, static_cast<double>(store_->samples_kept()));
  }

  // Copies every stack of the kernel's stack map and empties it: a stack recorded once is
  // found here later too, also when a program found it in the map just before it was
  // deleted.
  void read_stacks(profiling::Clock::time_point now) {
    for (__u64 k : map_keys<__u64>(stacks_fd_)) {
      emd_stack s{};
      if (bpf_map_lookup_elem(stacks_fd_, &k, &s) == 0) {
        auto [at, fresh] = raw_.try_emplace(k);
        RawStack& r = at->second;
        // Another stack under a hash read before (the kernel side compares within what it
        // holds, which each read empties): the newer is what samples from now on mean.
        if (!fresh && r.check != s.check) {
          ++pending_.collisions;
          // Before the batch takes views of the caches (cut() reads the stacks first).
          std::erase_if(kernel_cache_, [k](const auto& kv) { return kv.first.first == k; });
          std::erase_if(user_cache_, [k](const auto& kv) { return kv.first.second == k; });
        }
        r.ips.assign(s.ips, s.ips + std::min<__u32>(s.nr, EMD_STACK_MAX_DEPTH));
        r.check = s.check;
        r.seen = now;
      }
      bpf_map_delete_elem(stacks_fd_, &k);
    }
  }

  const RawStack* raw_stack(__u64 hash) {
    auto it = raw_.find(hash);
    if (it == raw_.end()) return nullptr;
    it->second.seen = profiling::Clock::now();
    return &it->second;
  }

  // The frames of a kept stack: none for hash 0 (no stack), nullptr where its bytes are not
  // here (not kept by the kernel side, or no longer by the daemon).
  const std::vector<Frame>* kernel_frames(__u64 hash, SampleKind kind) {
    static const std::vector<Frame> none;
    if (hash == 0) return &none;
    const auto key = std::make_pair(hash, kind == SampleKind::OffCpu);
    auto it = kernel_cache_.find(key);
    if (it == kernel_cache_.end()) {
      const RawStack* r = raw_stack(hash);
      if (!r) return nullptr;
      // An on-CPU sample's stack is where the thread was interrupted; an off-CPU one was
      // taken by the sched_switch program (raw_tp) or where the thread sleeps (tp_btf).
      it = kernel_cache_
               .emplace(key, Cached{store_->symbolizer().kernel_frames(
                                        r->ips, kind == SampleKind::OffCpu
                                                    ? profiling::StackOrigin::Call
                                                    : profiling::StackOrigin::Interrupt),
                                    0})
               .first;
    }
    it->second.seen = generation_;
    return &it->second.frames;
  }

  const std::vector<Frame>* user_frames(std::uint32_t tgid, __u64 hash) {
    static const std::vector<Frame> none;
    if (hash == 0) return &none;
    const auto key = std::make_pair(tgid, hash);
    auto it = user_cache_.find(key);
    if (it == user_cache_.end()) {
      const RawStack* r = raw_stack(hash);
      if (!r) return nullptr;
      it = user_cache_
               .emplace(key,
                        Cached{store_->symbolizer().user_frames(tgid, r->ips, options_.lines), 0})
               .first;
    }
    it->second.seen = generation_;
    return &it->second.frames;
  }

  // Symbolized stacks not used in the last few cuts go. Raw stacks stay as long as a
  // profile is kept, since a thread that blocked with one may wake much later; past
  // max_stacks * 4 of them, the least recently used go first.
  // Called once the batch was added: the store no longer views the caches' frames.
  void forget_unused() {
    const std::uint64_t keep_from = generation_ > 3 ? generation_ - 3 : 0;
    std::erase_if(kernel_cache_, [&](const auto& kv) { return kv.second.seen < keep_from; });
    std::erase_if(user_cache_, [&](const auto& kv) { return kv.second.seen < keep_from; });
    const auto too_old = profiling::Clock::now() - kRawStackLife;
    std::erase_if(raw_, [&](const auto& kv) { return kv.second.seen < too_old; });
    const std::size_t cap = std::size_t{options_.max_stacks} * 4;
    if (raw_.size() > cap) {
      std::vector<profiling::Clock::time_point> seen;
      seen.reserve(raw_.size());
      for (const auto& [hash, r] : raw_) seen.push_back(r.seen);
      auto nth = seen.begin() + static_cast<std::ptrdiff_t>(raw_.size() - cap);
      std::nth_element(seen.begin(), nth, seen.end());
      const auto cutoff = *nth;
      std::erase_if(raw_, [&](const auto& kv) { return kv.second.seen < cutoff; });
    }
  }

  MetricScope& scope_;
  ProfileOptions options_;
  DropAccounting drops_;
  MetricScope::Metric caches_, memory_, refused_, no_lines_, no_mappings_, samples_,
      unwinds_metric_, unwind_cpu_;
  std::uint64_t lines_over_budget_seen_ = 0, dwarf_broken_seen_ = 0, jit_refused_seen_ = 0,
                no_mappings_seen_ = 0;
  profiling::ProfileStore* store_;
  profiling::UserSymbols::Refusals refused_seen_{};
  Skeleton skel_;
  std::vector<BpfLink> perf_links_;
  // The threads' accounting: the iterator, each thread's values when last seen, when that
  // was, and where the exited threads begin in what threads_now() returned.
  BpfLink threads_link_;
  struct SeenThread {
    __u64 start = 0, on_cpu = 0, run_delay = 0;
  };
  std::unordered_map<__u32, SeenThread> threads_seen_;
  __u64 threads_seen_at_ = 0;
  std::size_t exited_from_ = 0;
  bool started_ = false;
  std::atomic<bool> abandoned_{false};

  std::mutex cut_mutex_;  // one cut at a time: the drain's and a reader's
  int slot_fd_ = -1, stacks_fd_ = -1;
  std::array<int, 2> counts_fd_{-1, -1};
  int active_ = 0;
  std::uint64_t generation_ = 0;
  Pending pending_;
  std::uint64_t store_dropped_ = 0;
  profiling::Clock::time_point workloads_resolved_{};
  std::unordered_map<__u64, RawStack> raw_;
  std::map<std::pair<__u64, bool>, Cached> kernel_cache_;  // by (hash, off-CPU)
  std::map<std::pair<std::uint32_t, __u64>, Cached> user_cache_;
  CgroupNames names_;
  // Samples and waits with copied user stacks, aggregated between cuts.
  struct RecordKey {
    std::uint32_t tgid, tid;
    std::string comm;
    std::uint64_t cgroup;
    SampleKind kind;
    std::int32_t syscall;
    std::uint64_t began;  // a wait that began before its batch: when (profile_key.began)
    std::vector<Frame> frames;
    // NOLINTNEXTLINE(modernize-use-nullptr): clang-tidy 14 misreads a defaulted operator<=>.
    auto operator<=>(const RecordKey&) const = default;
  };
  struct Aggregate {
    std::uint64_t count = 0, ns = 0;
    std::uint64_t ended = 0;  // with RecordKey::began
    void add(const Aggregate& other) {
      count += other.count;
      ns += other.ns;
      ended = std::max(ended, other.ended);
    }
  };
  std::mutex records_mutex_;
  std::map<RecordKey, Aggregate> records_pending_;
  // When the batch records_pending_ is of began: the last cut (by records_mutex_).
  profiling::Clock::time_point batch_begun_{};
  std::array<std::uint64_t, std::size(profiling::kUnwindEnds)> unwinds_{};
  std::uint64_t unwind_ns_ = 0;  // CPU time the unwinds took
  RingReader announcements_;     // last two: stop first
  RingReader records_;
};

}  // namespace

TracerDescriptor profile_descriptor() {
  return declare_tracer<ProfileTracer>(
      "profile", "On-CPU samples and off-CPU waits as stacks (pprof, flame graph)", &read_options);
}

}  // namespace ebpf_metricsd

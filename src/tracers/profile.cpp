// profile: where CPU time and blocked time go, as symbolized stacks (bpf/profile.bpf.c), kept
// in the daemon's ProfileStore for /debug/pprof/profile and the flame graph page.
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
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
  // At most 64 MiB of stacks and 2 x 32 MiB of aggregates, preallocated in the kernel.
  o.max_stacks = static_cast<std::uint32_t>(r.get_int("max_stacks", o.max_stacks, 64, 65536));
  o.max_aggregates =
      static_cast<std::uint32_t>(r.get_int("max_aggregates", o.max_aggregates, 64, 262144));
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

class ProfileTracer final : public Tracer {
 public:
  using Options = ProfileOptions;
  ProfileTracer(MetricScope& scope, ProfileOptions options, const TracerContext& context)
      : scope_(scope),
        options_(std::move(options)),
        drops_(scope,
               drop_reasons<PROFILE_DROP__COUNT>({"map_full", "thread_state", "announce_full"})),
        caches_(scope.declare({"ebpf_metricsd_profile_cache_entries",
                               "Entries of the profile's symbolization caches and tables: "
                               "ELF files open, processes whose mappings are kept, names "
                               "cached, kernel symbols, frames and samples kept.",
                               MetricType::Gauge,
                               {"cache"}})),
        samples_(scope.declare({"ebpf_metricsd_profile_samples_total",
                                "On-CPU samples and off-CPU waits the profile recorded.",
                                MetricType::Counter,
                                {"state"}})),
        store_(context.profiles) {
    if (!store_) throw std::runtime_error("profile: this process keeps no profiles");
  }

  ~ProfileTracer() override {
    if (started_) store_->set_source(nullptr);
    announcements_.stop();
  }

  void start(HookProber& prober, HookPreference preference) override {
    const bool three_args = tracepoint_arg_count("sched_switch").value_or(4) == 3;
    // `kind`: the off-CPU hooks' (none without off_cpu).
    auto setup = [&](profile* s, std::optional<HookKind> kind) {
      s->rodata->on_cpu_on = options_.on_cpu;
      s->rodata->off_cpu_on = options_.off_cpu;
      s->rodata->offcpu_min_ns =
          static_cast<__u64>(std::chrono::nanoseconds(options_.offcpu_min).count());
      s->rodata->nr_workloads = static_cast<__u32>(options_.workloads.size());
      s->rodata->emd_by_cgroup = options_.cgroup;
      bpf_map__set_max_entries(s->maps.emd_stacks, kept_stacks());
      bpf_map__set_max_entries(s->maps.counts_a, options_.max_aggregates);
      bpf_map__set_max_entries(s->maps.counts_b, options_.max_aggregates);
      const bool off = kind.has_value();
      configure_task_state(s->maps.emd_offcpu_task, s->maps.emd_offcpu_by_tid,
                           kind.value_or(HookKind::RawTp), off);
      auto& p = s->progs;
      return std::vector<HookTwin>{
          {p.on_cpu_sample, p.on_cpu_sample, options_.on_cpu, /*attach=*/false},
          {p.offcpu_switch_btf, p.offcpu_switch_raw, off && !three_args},
          {p.offcpu_switch_3arg_btf, p.offcpu_switch_3arg_raw, off && three_args},
          {nullptr, p.emd_offcpu_free, off},
          {p.profile_exec, p.profile_exec},
      };
    };
    if (options_.off_cpu) {
      static const std::array<std::string, 2> tracepoints = {"sched_switch", "sched_process_free"};
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
    store_->set_frequency(options_.on_cpu ? options_.frequency : 0);
    store_->set_source([this] { cut(); });
    started_ = true;
  }

  std::string hook() const override { return skel_.hook(); }

  void drain() override {
    cut();
    drops_.drain();
    publish();
    if (profiling::Clock::now() - workloads_resolved_ >= kWorkloadRescan) resolve_workloads();
  }

 private:
  using Skeleton = EBPF_METRICSD_SKELETON(profile);

  // Stacks the kernel side keeps between reads (LRU): max_stacks, or 256 per possible CPU
  // where that is more (the kernel's LRU keeps free entries per CPU in reserve).
  std::uint32_t kept_stacks() const {
    return std::max<std::uint32_t>(options_.max_stacks,
                                   256 * static_cast<std::uint32_t>(std::max(possible_cpus(), 1)));
  }

  // A process seen for the first time (or since it exec'd): its mappings are read now,
  // while it lives, so that its stacks can be symbolized after it has exited.
  void on_announce(std::span<const std::byte> record) {
    if (record.size() < sizeof(__u32)) return;
    __u32 tgid = 0;
    std::memcpy(&tgid, record.data(), sizeof tgid);
    try {
      store_->symbolizer().capture(tgid);
    } catch (const std::exception& e) {
      spdlog::warn("profile: mappings of process {}: {}", tgid, e.what());
    }
  }
  struct RawStack {
    std::vector<std::uint64_t> ips;
    profiling::Clock::time_point seen;
  };
  // Counts made by cuts, published by the drain.
  struct Pending {
    std::uint64_t on_cpu = 0, off_cpu = 0, stacks_expired = 0;
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
    // Point the programs at the empty map; the update returns once no program runs with
    // the other one any more, so it is complete.
    const __u32 zero = 0;
    const int full = counts_fd_[active_];
    active_ ^= 1;
    int next = counts_fd_[active_];
    if (bpf_map_update_elem(slot_fd_, &zero, &next, BPF_ANY) != 0) {
      active_ ^= 1;
      throw BpfError(bpf_error_text("profile: swap the aggregate maps", errno));
    }
    const auto end = profiling::Clock::now();
    ++generation_;

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
    read_stacks(end);

    std::vector<Sample> samples;
    samples.reserve(entries.size());
    std::vector<std::vector<Frame>> stacks;
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
      s.count = v.count;
      s.ns = v.ns;
      (s.kind == SampleKind::OnCpu ? on : off) += v.count;
      if (options_.cgroup) s.workload = names_.label(k.cgroup);
      const auto [at, fresh] = stack_index.try_emplace({k.tgid, k.kstack, k.ustack, k.kind},
                                                       static_cast<std::uint32_t>(stacks.size()));
      if (fresh) {
        std::vector<Frame> frames = kernel_frames(k.kstack, s.kind);
        const std::vector<Frame>& user = user_frames(k.tgid, k.ustack);
        // A stack hash whose frames were read once but are no longer kept: a wait longer
        // than stacks are kept, or more stacks than max_stacks * 4 since.
        expired.push_back((k.kstack && frames.empty()) || (k.ustack && user.empty()));
        frames.insert(frames.end(), user.begin(), user.end());
        if (frames.empty()) {
          Frame none;
          none.function = k.kstack == 0 && k.ustack == 0 ? "[no stack]" : "[stack not kept]";
          none.module = "[unknown]";
          frames.push_back(none);
        }

        stacks.push_back(std::move(frames));
      }
      s.stack = at->second;
      if (expired[at->second]) pending_.stacks_expired += v.count;
      samples.push_back(std::move(s));
    }
    store_->add_batch(end, std::move(samples), stacks);
    pending_.on_cpu += on;
    pending_.off_cpu += off;
    forget_unused();
  }

  // The self-metrics, from the drain only: a cut made for a profile request takes no lock
  // of the metric store.
  void publish() {
    Pending p;
    {
      std::lock_guard lock(cut_mutex_);
      p = std::exchange(pending_, Pending{});
    }
    scope_.add(samples_, {"on_cpu"}, p.on_cpu);
    scope_.add(samples_, {"off_cpu"}, p.off_cpu);
    scope_.add_dropped("stack_expired", p.stacks_expired);
    const std::uint64_t store_dropped = store_->dropped_samples();
    scope_.add_dropped("store_full", store_dropped - store_dropped_);
    store_dropped_ = store_dropped;
    const auto sizes = store_->symbolizer().sizes();
    scope_.set(caches_, {"elf_files"}, static_cast<double>(sizes.elf_files));
    scope_.set(caches_, {"processes"}, static_cast<double>(sizes.processes));
    scope_.set(caches_, {"names"}, static_cast<double>(sizes.names));
    scope_.set(caches_, {"kernel_symbols"}, static_cast<double>(sizes.kernel_symbols));
    {
      std::lock_guard lock(cut_mutex_);
      scope_.set(caches_, {"stacks"}, static_cast<double>(raw_.size()));
    }
    scope_.set(caches_, {"frames"}, static_cast<double>(store_->frames_kept()));
    scope_.set(caches_, {"samples"}, static_cast<double>(store_->samples_kept()));
  }

  // Copies every stack of the kernel's stack map and empties it: a stack recorded once is
  // found here later too, also when a program found it in the map just before it was
  // deleted.
  void read_stacks(profiling::Clock::time_point now) {
    std::vector<__u64> keys;
    __u64 key = 0, next_key = 0;
    const void* prev = nullptr;
    while (bpf_map_get_next_key(stacks_fd_, prev, &next_key) == 0) {
      keys.push_back(next_key);
      key = next_key;
      prev = &key;
    }
    for (__u64 k : keys) {
      emd_stack s{};
      if (bpf_map_lookup_elem(stacks_fd_, &k, &s) == 0) {
        RawStack& r = raw_[k];
        r.ips.assign(s.ips, s.ips + std::min<__u32>(s.nr, EMD_STACK_MAX_DEPTH));
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

  std::vector<Frame> kernel_frames(__u64 hash, SampleKind kind) {
    if (hash == 0) return {};
    const auto key = std::make_pair(hash, kind == SampleKind::OffCpu);
    auto it = kernel_cache_.find(key);
    if (it == kernel_cache_.end()) {
      const RawStack* r = raw_stack(hash);
      if (!r) return {};
      // An on-CPU sample's stack is where the thread was interrupted; an off-CPU one was
      // taken by the sched_switch program (raw_tp) or where the thread sleeps (tp_btf).
      it = kernel_cache_
               .emplace(key, Cached{store_->symbolizer().kernel_frames(
                                        r->ips, kind == SampleKind::OffCpu
                                                    ? profiling::StackOrigin::Tracepoint
                                                    : profiling::StackOrigin::Thread),
                                    0})
               .first;
    }
    it->second.seen = generation_;
    return it->second.frames;
  }

  const std::vector<Frame>& user_frames(std::uint32_t tgid, __u64 hash) {
    static const std::vector<Frame> none;
    if (hash == 0) return none;
    const auto key = std::make_pair(tgid, hash);
    auto it = user_cache_.find(key);
    if (it == user_cache_.end()) {
      const RawStack* r = raw_stack(hash);
      if (!r) return none;
      it =
          user_cache_.emplace(key, Cached{store_->symbolizer().user_frames(tgid, r->ips), 0}).first;
    }
    it->second.seen = generation_;
    return it->second.frames;
  }

  // Symbolized stacks not used in the last few cuts go. Raw stacks stay as long as a
  // profile is kept, since a thread that blocked with one may wake much later; past
  // max_stacks * 4 of them, the least recently used go first.
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
  MetricScope::Metric caches_, samples_;
  profiling::ProfileStore* store_;
  Skeleton skel_;
  std::vector<BpfLink> perf_links_;
  bool started_ = false;

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
  RingReader announcements_;  // last: stops first
};

}  // namespace

TracerDescriptor profile_descriptor() {
  return declare_tracer<ProfileTracer>(
      "profile", "On-CPU samples and off-CPU waits as stacks (pprof, flame graph)", &read_options);
}

}  // namespace ebpf_metricsd

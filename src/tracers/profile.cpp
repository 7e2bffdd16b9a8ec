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
#include <set>
#include <stop_token>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "ebpf_metricsd/bpf_support.h"
#include "ebpf_metricsd/cgroup_names.h"
#include "ebpf_metricsd/drop_accounting.h"
#include "ebpf_metricsd/host_safety.h"
#include "ebpf_metricsd/metric_scope.h"
#include "ebpf_metricsd/profile/profile_store.h"
#include "ebpf_metricsd/profile/symbols.h"
#include "ebpf_metricsd/skeleton.h"
#include "ebpf_metricsd/tracer.h"
#include "ebpf_metricsd/yaml_reader.h"

// clang-format off
#include <linux/types.h>
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

// Frames of the tracing machinery itself, innermost in an off-CPU kernel stack taken from
// the sched_switch hook: not where the thread waits.
bool tracing_frame(const std::string& fn) {
  static constexpr std::array<std::string_view, 6> prefixes = {
      "bpf_prog_", "bpf_trace_run", "__bpf_trace_", "__traceiter_", "bpf_get_stack", "perf_trace_"};
  for (auto p : prefixes) {
    if (fn.rfind(p, 0) == 0) return true;
  }
  return false;
}

class ProfileTracer final : public Tracer {
 public:
  using Options = ProfileOptions;
  ProfileTracer(MetricScope& scope, ProfileOptions options)
      : scope_(scope),
        options_(std::move(options)),
        drops_(scope, drop_reasons<PROFILE_DROP__COUNT>(
                          {"map_full", "stack_map_full", "stack_collision", "stack_truncated",
                           "stack_error", "thread_state", "announce_full"})),
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
        store_(scope.profiles()) {
    if (!store_) throw std::runtime_error("profile: this process keeps no profiles");
  }

  ~ProfileTracer() override {
    if (started_) store_->set_source(nullptr);
    announce_thread_ = {};  // joins before the ring buffer goes
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
      bpf_map__set_max_entries(s->maps.stacks, options_.max_stacks);
      bpf_map__set_max_entries(s->maps.counts_a, options_.max_aggregates);
      bpf_map__set_max_entries(s->maps.counts_b, options_.max_aggregates);
      const bool raw = kind == HookKind::RawTp, off = kind.has_value();
      bpf_map__set_max_entries(s->maps.offcpu_by_tid, raw ? 65536 : 1);
      // No task storage for tracing before 5.11.
      bpf_map__set_autocreate(s->maps.offcpu_task, off && !raw);
      auto& p = s->progs;
      return std::vector<HookTwin>{
          {p.on_cpu_sample, p.on_cpu_sample, options_.on_cpu, /*attach=*/false},
          {p.offcpu_switch_btf, p.offcpu_switch_raw, off && !three_args},
          {p.offcpu_switch_3arg_btf, p.offcpu_switch_3arg_raw, off && three_args},
          {nullptr, p.offcpu_free_raw, raw},
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
    stacks_fd_ = bpf_map__fd(skel_->maps.stacks);
    resolve_workloads();
    announcements_.reset(ring_buffer__new(bpf_map__fd(skel_->maps.new_processes),
                                          &ProfileTracer::on_announce, this, nullptr));
    if (!announcements_) throw BpfError(bpf_error_text("profile: ring buffer", errno));
    announce_thread_ = std::jthread([this](const std::stop_token& stop) {
      while (!stop.stop_requested()) ring_buffer__poll(announcements_.get(), 100);
    });
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
  struct RingBufferDeleter {
    void operator()(ring_buffer* r) const { ring_buffer__free(r); }
  };

  // A process seen for the first time (or since it exec'd): its mappings are read now,
  // while it lives, so that its stacks can be symbolized after it has exited.
  static int on_announce(void* ctx, void* data, std::size_t size) {
    auto* self = static_cast<ProfileTracer*>(ctx);
    if (size < sizeof(__u32)) return 0;
    __u32 tgid = 0;
    std::memcpy(&tgid, data, sizeof tgid);
    try {
      std::lock_guard lock(self->symbols_mutex_);
      self->user_.capture(static_cast<pid_t>(tgid), true);
    } catch (const std::exception& e) {
      spdlog::warn("profile: mappings of process {}: {}", tgid, e.what());
    }
    return 0;  // never an exception through libbpf's C
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
    kernel_.refresh();  // modules or BPF programs may have come or gone

    std::vector<Sample> samples;
    samples.reserve(entries.size());
    std::vector<std::vector<Frame>> stacks;
    std::map<std::tuple<std::uint32_t, __u64, __u64, __u32>, std::uint32_t> stack_index;
    std::vector<bool> expired;  // by stack index
    std::set<std::uint32_t> recaptured;
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
        const std::vector<Frame>& user = user_frames(k.tgid, k.ustack, recaptured);
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
    std::lock_guard symbols(symbols_mutex_);
    user_.forget_exited();
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
    {
      std::lock_guard symbols(symbols_mutex_);
      scope_.set(caches_, {"elf_files"}, static_cast<double>(user_.modules()));
      scope_.set(caches_, {"processes"}, static_cast<double>(user_.processes()));
      scope_.set(caches_, {"names"}, static_cast<double>(user_.names()));
    }
    {
      std::lock_guard lock(cut_mutex_);
      scope_.set(caches_, {"kernel_symbols"}, static_cast<double>(kernel_.symbols()));
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
      profile_stack s{};
      if (bpf_map_lookup_elem(stacks_fd_, &k, &s) == 0) {
        RawStack& r = raw_[k];
        r.ips.assign(s.ips, s.ips + std::min<__u32>(s.nr, PROFILE_MAX_DEPTH));
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
      std::vector<Frame> frames;
      bool plumbing = kind == SampleKind::OffCpu;
      for (std::size_t i = 0; i < r->ips.size(); ++i) {
        Frame f = kernel_.resolve(r->ips[i], i > 0 || kind == SampleKind::OffCpu);
        if (plumbing && tracing_frame(f.function)) continue;
        plumbing = false;
        frames.push_back(std::move(f));
      }
      it = kernel_cache_.emplace(key, Cached{std::move(frames), 0}).first;
    }
    it->second.seen = generation_;
    return it->second.frames;
  }

  const std::vector<Frame>& user_frames(std::uint32_t tgid, __u64 hash,
                                        std::set<std::uint32_t>& recaptured) {
    static const std::vector<Frame> none;
    if (hash == 0) return none;
    const auto key = std::make_pair(tgid, hash);
    auto it = user_cache_.find(key);
    if (it == user_cache_.end()) {
      const RawStack* r = raw_stack(hash);
      if (!r) return none;
      std::lock_guard symbols(symbols_mutex_);
      user_.capture(static_cast<pid_t>(tgid));
      std::vector<Frame> frames;
      for (std::size_t i = 0; i < r->ips.size(); ++i) {
        Frame f = user_.resolve(static_cast<pid_t>(tgid), r->ips[i], i > 0);
        if (i == 0 && f.module == "[unknown]" && recaptured.insert(tgid).second) {
          // The innermost frame is mapped since the capture (dlopen): read the mappings
          // again, once per cut. (Callers outside every mapping are unwinding gone astray.)
          user_.capture(static_cast<pid_t>(tgid), true);
          f = user_.resolve(static_cast<pid_t>(tgid), r->ips[i], i > 0);
        }
        // A caller outside every mapping is where frame-pointer unwinding went astray in
        // code built without them: it and what follows are not frames.
        if (i > 0 && f.module == "[unknown]") break;
        frames.push_back(std::move(f));
      }
      it = user_cache_.emplace(key, Cached{std::move(frames), 0}).first;
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
  profiling::KernelSymbols kernel_;
  std::mutex symbols_mutex_;  // guards user_: the cut and the announcements use it
  profiling::UserSymbols user_;
  CgroupNames names_;
  std::unique_ptr<ring_buffer, RingBufferDeleter> announcements_;
  std::jthread announce_thread_;  // last: stops first
};

}  // namespace

TracerDescriptor profile_descriptor() {
  return declare_tracer<ProfileTracer>(
      "profile", "On-CPU samples and off-CPU waits as stacks (pprof, flame graph)", &read_options);
}

}  // namespace ebpf_metricsd

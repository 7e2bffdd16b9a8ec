// profile: where CPU time and blocked time go, as symbolized stacks (bpf/profile.bpf.c), kept
// in the daemon's ProfileStore for /debug/pprof/profile and the flame graph page.
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <utility>

#include "ebpf_metricsd/base/cgroup_names.h"
#include "ebpf_metricsd/base/yaml_reader.h"
#include "ebpf_metricsd/bpf/bpf_support.h"
#include "ebpf_metricsd/bpf/drop_accounting.h"
#include "ebpf_metricsd/bpf/ring_reader.h"
#include "ebpf_metricsd/bpf/skeleton.h"
#include "ebpf_metricsd/metrics/metric_scope.h"
#include "ebpf_metricsd/profile/process_manager.h"
#include "ebpf_metricsd/profile/profile_capture.h"
#include "ebpf_metricsd/profile/profile_metrics.h"
#include "ebpf_metricsd/profile/profiles.h"
#include "ebpf_metricsd/profile/symbols.h"
#include "ebpf_metricsd/tracers/registry.h"
#include "user_stack.h"

// clang-format off
#include <linux/types.h>
#include "common/unwind.h"
#include "profile.h"
#include "profile.skel.h"
// clang-format on

namespace ebpf_metricsd {

namespace {

struct ProfileOptions {
  std::uint32_t frequency = 19;
  std::chrono::milliseconds offcpu_min{1};
  bool on_cpu = true;
  bool off_cpu = true;
  bool cgroup = false;
  std::vector<std::string> workloads;  // cgroup paths or unit names; empty = everything
  std::uint32_t max_stacks = 8192;
  std::uint32_t max_aggregates = 16384;
  // How user stacks are walked: in the kernel with tables compiled from each file's CFI, or
  // by frame pointer.
  bool unwind_cfi = true;
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
  // Read and checked as before, never used: every sample is walked in the kernel now.
  if (r.has("stack_copies_per_second")) {
    r.get_int("stack_copies_per_second", 500, 1, 100000);
    spdlog::warn(
        "{}: stack_copies_per_second is no longer used: every user stack is walked in "
        "the kernel, without a budget",
        r.key_path("stack_copies_per_second"));
  }
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

class ProfileTracer final : public Tracer {
 public:
  using Options = ProfileOptions;
  ProfileTracer(MetricScope& scope, ProfileOptions options, const TracerContext& context)
      : options_(std::move(options)),
        drops_(scope,
               drop_reasons<PROFILE_DROP__COUNT>(
                   {"map_full", "thread_state", "announce_full", "syscall_mismatch", "syscall_exec",
                    "syscall_exited", "syscall_kstack", "stopped", "wake_missed", "thread_end"})),
        metrics_(scope),
        profiles_(context.profiles),
        walker_(context.walker) {
    if (!profiles_) throw std::runtime_error("profile: this process keeps no profiles");
  }

  ~ProfileTracer() override {
    if (started_) profiles_->set_source(nullptr);
    if (own_walker_) profiles_->symbolizer().set_file_source(nullptr);
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
      // Both modes read a wait's system call from the registers it saved.
      s->rodata->emd_ptregs_offset = user_regs_offset();
      // The walker's maps are the daemon's (process_manager.h).
      if (options_.unwind_cfi) walker().share(s->obj);
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
      // sys_exit: where waits inside a system call take their user stack, and where the walk
      // learns that a process's code changed (with `unwind: cfi`, also without off_cpu).
      hooks.push_back({p.profile_sys_exit_btf, p.profile_sys_exit_raw,
                       options_.unwind_cfi || waits_at_sys_exit()});
      hooks.push_back(
          {p.profile_thread_exit_btf, p.profile_thread_exit_raw, off && waits_at_sys_exit()});
      // The walkers, loaded and not attached: tail-called by the programs above.
      hooks.push_back({p.profile_sample_walk, p.profile_sample_walk,
                       options_.on_cpu && options_.unwind_cfi, false});
      hooks.push_back({p.profile_exit_walk_btf, p.profile_exit_walk_raw,
                       options_.unwind_cfi && waits_at_sys_exit(), false});
      hooks.push_back({p.profile_walk_exit, p.profile_walk_exit, options_.unwind_cfi});
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
    // The walkers before the first sample (the hooks of waits are attached with the load:
    // their first walks, if any come before this, end as no_walker, counted).
    if (options_.unwind_cfi) {
      // Frames the walk keeps by file are named from the files the walk knows.
      profiles_->symbolizer().set_file_source(
          [manager = &walker()](std::uint32_t id) { return manager->file(id); });
      profiling::set_walker(skel_->maps.sample_walkers, skel_->progs.profile_sample_walk);
      profiling::set_walker(skel_->maps.exit_walkers_btf, skel_->progs.profile_exit_walk_btf);
      profiling::set_walker(skel_->maps.exit_walkers_raw, skel_->progs.profile_exit_walk_raw);
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
    profiling::ProfileObject object;
    object.counts[0] = skel_->maps.counts_a;
    object.counts[1] = skel_->maps.counts_b;
    object.slot = skel_->maps.counts_slot;
    object.stacks = skel_->maps.emd_stacks;
    object.thread_ends = skel_->maps.thread_ends;
    object.batch_begin_ns = &skel_->bss->batch_begin_ns;
    object.batch_swapping = &skel_->bss->batch_swapping;
    // The threads now (an iterator each cut runs), where one loads.
    for (bpf_program* p : {skel_->progs.profile_threads_btf, skel_->progs.profile_threads_raw}) {
      if (bpf_program__autoload(p)) object.iterator = p;
    }
    capture_ = std::make_unique<profiling::ProfileCapture>(
        *profiles_, object,
        profiling::ProfileCapture::Options{options_.cgroup, options_.lines, options_.max_stacks},
        abandoned_);
    resolve_workloads();
    announcements_ = RingReader(
        skel_->maps.new_processes,
        [this](std::span<const std::byte> record) { on_announce(record); },
        "profile: process announcements");
    capture_->start();
    profiles_->store().set_frequency(options_.on_cpu ? options_.frequency : 0);
    profiles_->set_source([this] { cut(); });
    started_ = true;
  }

  std::string hook() const override { return skel_.hook(); }

  // At the daemon's exit: a cut in progress ends after reading the kernel side.
  void abandon() override { abandoned_ = true; }

  void drain() override {
    cut();
    if (abandoned_) return;
    drops_.drain();
    metrics_.publish(*profiles_, *capture_, options_.unwind_cfi ? &walker() : nullptr,
                     options_.unwind_cfi ? skel_->maps.emd_unwind_ends : nullptr);
    if (profiling::Clock::now() - workloads_resolved_ >= kWorkloadRescan) resolve_workloads();
  }

 private:
  using Skeleton = EBPF_METRICSD_SKELETON(profile);
  static constexpr std::chrono::seconds kWorkloadRescan{30};

  // Whether the user stacks of long waits inside system calls are walked when the call
  // returns (sys_exit), with the unwind tables.
  bool waits_at_sys_exit() const { return options_.unwind_cfi && options_.off_cpu; }

  // The walk's maps and processes: the daemon's (one for every tracer that walks), else one
  // of this tracer's own (a tracer built alone, in tests).
  profiling::ProcessManager& walker() {
    if (walker_) return walker_->get();
    if (!own_walker_) own_walker_ = std::make_unique<profiling::Walker>();
    return own_walker_->get();
  }

  // Stacks the kernel side keeps between reads.
  std::uint32_t kept_stacks() const { return lru_map_entries(options_.max_stacks); }

  // Processes announced until now are handed over first, if their reader fell behind (a
  // slow host): a cut holds everything taken before it.
  void cut() {
    announcements_.catch_up();
    capture_->cut();
  }

  // A process seen for the first time (or since it exec'd): its mappings are read now,
  // while it lives, so that its stacks can be symbolized after it has exited.
  void on_announce(std::span<const std::byte> record) {
    profile_announcement a{};
    if (record.size() < sizeof a) return;
    std::memcpy(&a, record.data(), sizeof a);
    try {
      profiles_->symbolizer().capture(a.tgid, a.again != 0);
    } catch (const std::exception& e) {
      spdlog::warn("profile: mappings of process {}: {}", a.tgid, e.what());
    }
  }

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

  ProfileOptions options_;
  DropAccounting drops_;
  profiling::ProfileMetrics metrics_;
  profiling::Profiles* profiles_;
  profiling::Walker* walker_;
  std::unique_ptr<profiling::Walker> own_walker_;
  Skeleton skel_;
  std::vector<BpfLink> perf_links_;
  std::atomic<bool> abandoned_{false};  // before capture_, which reads it
  std::unique_ptr<profiling::ProfileCapture> capture_;
  bool started_ = false;
  profiling::Clock::time_point workloads_resolved_{};
  RingReader announcements_;  // last: stops first
};

}  // namespace

TracerDescriptor profile_descriptor() {
  return declare_tracer<ProfileTracer>(
      "profile", "On-CPU samples and off-CPU waits as stacks (pprof, flame graph)", &read_options);
}

}  // namespace ebpf_metricsd

#include "ebpf_metricsd/daemon/daemon.h"

#include <malloc.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <systemd/sd-daemon.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "ebpf_metricsd/base/clock.h"
#include "ebpf_metricsd/bpf/bpf_support.h"
#include "ebpf_metricsd/core/drain_loop.h"
#include "ebpf_metricsd/core/tracer_set.h"
#include "ebpf_metricsd/daemon/config.h"
#include "ebpf_metricsd/daemon/exposition.h"
#include "ebpf_metricsd/http/server.h"
#include "ebpf_metricsd/http/web_config.h"
#include "ebpf_metricsd/metrics/metric_store.h"
#include "ebpf_metricsd/profile/process_manager.h"
#include "ebpf_metricsd/profile/profile_routes.h"
#include "ebpf_metricsd/profile/profiles.h"
#include "ebpf_metricsd/tracers/registry.h"

namespace ebpf_metricsd {

namespace {

// What a burst freed (the buffers of a hundred connections, the parse of a refused config)
// the allocator keeps for reuse, and RSS stays at the burst's peak. Once the free memory it
// holds has grown by more than 1 MiB since the last trim, it goes back to the kernel.
void release_free_memory() {
  constexpr std::size_t kSlack = 1 << 20;
  static std::mutex mutex;  // the drain thread and a reload on the main thread
  static std::size_t after_last_trim = 0;
  const std::lock_guard lock(mutex);
  const std::size_t free_now = mallinfo2().fordblks;
  if (free_now < after_last_trim) after_last_trim = free_now;  // reused since: the new floor
  if (free_now > after_last_trim + kSlack) {
    malloc_trim(0);
    after_last_trim = mallinfo2().fordblks;
  }
}

// Sets every thread of the daemon to nice value `nice`: those there are now, and (as they
// inherit it) those they start. Where lowering it is not permitted (no CAP_SYS_NICE and no
// RLIMIT_NICE room: the unit sets Nice= and LimitNICE=), the threads keep theirs, with a
// warning. A thread that exits meanwhile is no failure.
void set_nice(int nice) {
  int why = 0;
  std::error_code ec;
  std::filesystem::directory_iterator task("/proc/self/task", ec);
  for (; !ec && task != std::filesystem::directory_iterator(); task.increment(ec)) {
    const auto tid = static_cast<id_t>(std::stoul(task->path().filename().string()));
    if (setpriority(PRIO_PROCESS, tid, nice) != 0 && errno != ESRCH && why == 0) why = errno;
  }
  if (ec) why = ec.value();
  if (why != 0) {
    spdlog::warn("nice {}: {}; the daemon's threads keep their nice value", nice,
                 std::strerror(why));
  }
}

sigset_t handled_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  return set;
}

}  // namespace

void block_daemon_signals() {
  const sigset_t signals = handled_signals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // A peer that closes a socket we write to must cost that connection, never the process.
  signal(SIGPIPE, SIG_IGN);
}

namespace {

std::string status_line(std::size_t up, std::size_t enabled, std::size_t series) {
  return std::to_string(up) + "/" + std::to_string(enabled) + " tracers up, " +
         std::to_string(series) + " series";
}

class Daemon {
 public:
  explicit Daemon(const DaemonOptions& options) : options_(options) {}
  int run();

 private:
  // Reads the config file and the web config file into one Config; throws ConfigError.
  Config read_configs() const;
  // Brings the tracers in line with cfg. False when a tracer failed to start and --strict
  // is set.
  bool reconcile(const Config& cfg);
  // Re-reads the configuration and applies what changed; false when the daemon must exit
  // (--strict and a tracer down, or no web server could be had).
  bool reload();
  // The `profiles` section: what the profile and the slow events keep (what they hold stays).
  void keep_profiles(const Config::Profiles& kept);
  // Brings the web server to `wanted`: a new server where settings changed (the old one
  // back where the new one cannot start), else the TLS files read again. False when that
  // did not take; throws std::runtime_error when no server can be had at all.
  bool reload_web(const WebSettings& wanted);
  void notify_ready();
  std::unique_ptr<WebServer> make_web(const WebSettings& settings);

  DaemonOptions options_;
  Config cfg_;
  std::shared_ptr<MetricStore> store_ = std::make_shared<MetricStore>();
  std::shared_ptr<profiling::Profiles> profiles_ = std::make_shared<profiling::Profiles>();
  // The walk of user stacks in the kernel, for every tracer that walks (made when the first
  // starts).
  profiling::Walker walker_;
  MetricStore::MetricId reload_ok_ = 0, reload_time_ = 0;
  KernelHookProber prober_;
  // Destroyed in reverse: the web server first, then the drain loop, then the tracers.
  std::shared_ptr<TracerSet> tracers_;
  std::shared_ptr<DrainLoop> drain_;
  std::unique_ptr<WebServer> web_;
};

Config Daemon::read_configs() const {
  Config cfg = load_config(options_.config_path);
  if (options_.listen_address) {
    if (auto err = validate_listen_address(*options_.listen_address); !err.empty()) {
      throw ConfigError("--web.listen-address " + *options_.listen_address + ": " + err);
    }
    cfg.web.listen_address = *options_.listen_address;
  }
  if (!options_.web_config_path.empty()) {
    cfg.web.security = load_web_config(options_.web_config_path);
  }
  return cfg;
}

bool Daemon::reconcile(const Config& cfg) {
  const auto failed = tracers_->apply(cfg.tracers);
  if (!failed.empty() && options_.strict) {
    spdlog::error("--strict: exiting because tracer {} is not up", failed.front());
    return false;
  }
  return true;
}

void Daemon::notify_ready() {
  const std::string status =
      status_line(tracers_->running(), tracers_->enabled(), store_->series_count());
  sd_notifyf(0, "READY=1\nSTATUS=%s", status.c_str());
}

std::unique_ptr<WebServer> Daemon::make_web(const WebSettings& settings) {
  std::vector<Route> routes =
      exporter_routes([store = store_](ExpositionFormat format) { return render(*store, format); },
                      [tracers = std::weak_ptr<TracerSet>(tracers_)] {
                        const auto t = tracers.lock();
                        return landing_page(t ? t->statuses() : std::vector<TracerStatus>());
                      },
                      [drain = std::weak_ptr<DrainLoop>(drain_)] {
                        const auto d = drain.lock();
                        return d && d->healthy();
                      });
  for (Route& r : profiling::profile_routes(profiles_)) routes.push_back(std::move(r));
  return std::make_unique<WebServer>(settings, std::move(routes));
}

bool Daemon::reload_web(const WebSettings& wanted) {
  const WebSettings& have = web_->settings();
  if (wanted == have) {
    if (!wanted.security.tls) return true;
    // Same settings, but certificate files may have been rotated in place.
    try {
      web_->reload_tls();
      return true;
    } catch (const std::exception& e) {
      spdlog::error("reload: {}; keeping the loaded certificates", e.what());
      return false;
    }
  }
  // One server at a time: the new one may need the same port.
  const WebSettings previous = have;
  web_.reset();
  try {
    web_ = make_web(wanted);
    spdlog::info("web server restarted on {}{}", wanted.listen_address,
                 wanted.security.tls ? " with TLS" : "");
    return true;
  } catch (const std::exception& e) {
    spdlog::error("reload: {}; keeping the previous web settings", e.what());
  }
  try {
    web_ = make_web(previous);
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot serve metrics any more: " + std::string(e.what()));
  }
  return false;
}

void Daemon::keep_profiles(const Config::Profiles& kept) {
  profiles_->store().set_limits({kept.retention, kept.max_samples});
  walker_.set_rows(kept.unwind_table_rows);
  profiling::SlowEventStore::Limits slow;
  slow.retention = kept.retention;
  slow.max_events = kept.max_slow_events;
  profiles_->slow_events().set_limits(slow);
}

bool Daemon::reload() {
  sd_notifyf(0, "RELOADING=1\nMONOTONIC_USEC=%llu\nSTATUS=reloading %s",
             static_cast<unsigned long long>(monotonic_ns() / 1000), options_.config_path.c_str());
  spdlog::info("SIGHUP: reloading {}", options_.config_path);
  Config cfg;
  try {
    cfg = read_configs();
  } catch (const ConfigError& e) {
    spdlog::error("reload failed, keeping the running configuration: {}", e.what());
    store_->set(reload_ok_, {}, 0);
    release_free_memory();
    notify_ready();
    return true;
  }
  bool ok = true;
  try {
    ok = reload_web(cfg.web);
  } catch (const std::exception& e) {
    spdlog::critical("{}", e.what());
    return false;
  }
  set_kernel_btf_path(cfg.btf_path);
  if (!reconcile(cfg)) return false;
  drain_->set_interval(cfg.drain_interval);
  // Against the value in effect: one refused before is tried again.
  if (getpriority(PRIO_PROCESS, 0) != cfg.nice) set_nice(cfg.nice);
  store_->set_series_limit(cfg.max_series);
  keep_profiles(cfg.profiles);
  cfg_ = std::move(cfg);
  store_->set(reload_ok_, {}, ok ? 1 : 0);
  if (ok) {
    store_->set(reload_time_, {}, static_cast<double>(std::time(nullptr)));
    spdlog::info("reload done: {}",
                 status_line(tracers_->running(), tracers_->enabled(), store_->series_count()));
  }
  notify_ready();
  return true;
}

int Daemon::run() {
  try {
    cfg_ = read_configs();
  } catch (const ConfigError& e) {
    spdlog::error("invalid configuration: {}", e.what());
    return kExitConfigError;
  }

  // Signals are taken synchronously by this thread; main() blocked them before anything
  // else (block_daemon_signals), and every thread inherits the blocked mask. Blocking again
  // costs nothing and keeps run_daemon() safe when called from elsewhere (tests).
  block_daemon_signals();
  // Before any thread starts: each inherits it.
  set_nice(cfg_.nice);

  route_libbpf_logs();
  store_->set_series_limit(cfg_.max_series);
  keep_profiles(cfg_.profiles);
  const auto build_info = store_->declare({"ebpf_metricsd_build_info",
                                           "Build of ebpf-metricsd; the value is always 1.",
                                           MetricType::Gauge,
                                           {"version"}});
  store_->set(build_info, {EBPF_METRICSD_VERSION}, 1);
  reload_ok_ = store_->declare({"ebpf_metricsd_config_last_reload_successful",
                                "Whether the last configuration reload succeeded.",
                                MetricType::Gauge,
                                {}});
  reload_time_ = store_->declare({"ebpf_metricsd_config_last_reload_success_timestamp_seconds",
                                  "When the configuration was last loaded successfully.",
                                  MetricType::Gauge,
                                  {}});
  store_->set(reload_ok_, {}, 1);
  store_->set(reload_time_, {}, static_cast<double>(std::time(nullptr)));

  // The profile and the slow events plug in here: the tracers that take stacks get the
  // store through the context they are built with.
  tracers_ =
      std::make_shared<TracerSet>(*store_, [this](const TracerConfig& config, MetricScope& scope) {
        return build_tracer(config, scope, prober_, TracerContext{profiles_.get(), &walker_});
      });
  drain_ = std::make_shared<DrainLoop>(
      [tracers = tracers_.get(), profiles = profiles_.get()] {
        const bool ok = tracers->drain();
        // Every tracer that takes stacks has read what it holds: processes that had exited
        // by the previous round have no stacks left to symbolize.
        profiles->symbolizer().end_round();
        release_free_memory();
        return ok;
      },
      cfg_.drain_interval);
  try {
    web_ = make_web(cfg_.web);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  spdlog::info("ebpf-metricsd {} listening on {}{} (config {})", EBPF_METRICSD_VERSION,
               cfg_.web.listen_address, cfg_.web.security.tls ? " with TLS" : "", cfg_.file);

  set_kernel_btf_path(cfg_.btf_path);
  if (!cfg_.btf_path.empty()) spdlog::info("kernel BTF from {}", cfg_.btf_path);
  if (!reconcile(cfg_)) return 1;
  notify_ready();
  drain_->start();
  spdlog::info("{}, draining every {} ms",
               status_line(tracers_->running(), tracers_->enabled(), store_->series_count()),
               cfg_.drain_interval.count());

  int exit_code = 0;
  for (;;) {
    int sig = 0;
    const sigset_t signals = handled_signals();
    if (sigwait(&signals, &sig) != 0) continue;
    if (sig == SIGHUP) {
      if (reload()) continue;
      exit_code = 1;
      break;
    }
    spdlog::info("received {}, shutting down", strsignal(sig));
    break;
  }
  sd_notify(0, "STOPPING=1\nSTATUS=stopping");
  tracers_->begin_exit();  // the drain round in progress ends at its current tracer
  const std::uint64_t t0 = monotonic_ns();
  drain_->stop();
  spdlog::debug("drain loop stopped in {} ms", (monotonic_ns() - t0) / 1'000'000);
  tracers_->stop_all();  // detach and unload every BPF object
  web_.reset();          // ends the connections in progress at once
  spdlog::info("stopped: all tracers detached");
  spdlog::shutdown();
  return exit_code;
}

}  // namespace

int run_daemon(const DaemonOptions& options) {
  Daemon daemon(options);
  return daemon.run();
}

}  // namespace ebpf_metricsd

#include "ebpf_metricsd/daemon.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <systemd/sd-daemon.h>

#include <memory>
#include <mutex>
#include <vector>

#include "ebpf_metricsd/bpf_support.h"
#include "ebpf_metricsd/config.h"
#include "ebpf_metricsd/drain.h"
#include "ebpf_metricsd/metric_store.h"
#include "ebpf_metricsd/tracer.h"
#include "ebpf_metricsd/web.h"

namespace ebpf_metricsd {

namespace {

struct TracerState {
  std::string name;
  std::string summary;
  bool enabled = false;
  bool up = false;
  std::string hook;
  std::string error;
};

std::string landing_page(const std::vector<TracerState>& states) {
  std::string rows;
  for (const auto& s : states) {
    const std::string state = !s.enabled ? "disabled" : s.up ? "up" : "failed";
    rows += "<tr><td>" + html_escape(s.name) + "</td><td>" + html_escape(s.summary) +
            "</td><td class=\"" + state + "\">" + state + "</td><td>" + html_escape(s.hook) +
            "</td><td>" + html_escape(s.error) + "</td></tr>\n";
  }
  return "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>ebpf-metricsd</title>"
         "<style>body{font-family:sans-serif;margin:2em}td,th{padding:.3em .8em;"
         "text-align:left;border-bottom:1px solid #ddd}.up{color:#080}.failed{color:#b00}"
         ".disabled{color:#888}</style></head><body>\n<h1>ebpf-metricsd</h1>\n"
         "<p>Version " EBPF_METRICSD_VERSION
         ". Metrics: <a href=\"/metrics\">/metrics</a></p>\n"
         "<table><tr><th>tracer</th><th>measures</th><th>state</th><th>hook</th>"
         "<th>error</th></tr>\n" +
         rows + "</table>\n</body></html>\n";
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

int run_daemon(const DaemonOptions& options) {
  Config cfg;
  try {
    cfg = load_config(options.config_path);
  } catch (const ConfigError& e) {
    spdlog::error("invalid configuration: {}", e.what());
    return 1;
  }
  if (options.listen_address) {
    if (auto err = validate_listen_address(*options.listen_address); !err.empty()) {
      spdlog::error("--web.listen-address {}: {}", *options.listen_address, err);
      return 1;
    }
    cfg.listen_address = *options.listen_address;
  }

  // Signals are taken synchronously by this thread; every thread started below inherits
  // the blocked mask.
  const sigset_t signals = handled_signals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  route_libbpf_logs();
  auto store = std::make_shared<MetricStore>();
  const auto build_info = store->declare({"ebpf_metricsd_build_info",
                                          "Build of ebpf-metricsd; the value is always 1.",
                                          MetricType::Gauge,
                                          {"version"}});
  store->set(build_info, {EBPF_METRICSD_VERSION}, 1);
  const auto tracer_up = store->declare(
      {"ebpf_metricsd_tracer_up",
       "1 when the tracer is attached, 0 when it failed; hook is the attach type in use.",
       MetricType::Gauge,
       {"tracer", "hook"}});

  // Shared with the web server's threads, which may outlive this frame (see shutdown).
  struct States {
    std::mutex mutex;
    std::vector<TracerState> list;
  };
  auto states = std::make_shared<States>();
  for (const auto& tc : cfg.tracers) {
    states->list.push_back({tc.name, find_tracer(tc.name)->summary, tc.enabled, false, "", ""});
  }

  std::unique_ptr<WebServer> web;
  try {
    web = std::make_unique<WebServer>(cfg.listen_address, store, [states] {
      std::lock_guard lock(states->mutex);
      return landing_page(states->list);
    });
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  spdlog::info("ebpf-metricsd {} listening on {} (config {})", EBPF_METRICSD_VERSION,
               cfg.listen_address, cfg.file);

  KernelHookProber prober;
  std::vector<std::unique_ptr<Tracer>> tracers;
  DrainLoop drain(*store, cfg.drain_interval);
  for (std::size_t i = 0; i < cfg.tracers.size(); ++i) {
    const TracerConfig& tc = cfg.tracers[i];
    if (!tc.enabled) continue;
    auto tracer = find_tracer(tc.name)->create(*store, tc.options);
    std::string hook = "none", error;
    try {
      tracer->start(prober, tc.hook);
      hook = tracer->hook();
    } catch (const std::exception& e) {
      error = e.what();
    }
    {
      std::lock_guard lock(states->mutex);
      TracerState& st = states->list[i];
      st.up = error.empty();
      st.hook = hook;
      st.error = error;
    }
    store->set(tracer_up, {tc.name, hook}, error.empty() ? 1 : 0);
    if (!error.empty()) {
      spdlog::error("tracer {} failed to start: {}", tc.name, error);
      if (options.strict) {
        spdlog::error("--strict: exiting because tracer {} is not up", tc.name);
        return 1;
      }
      continue;
    }
    spdlog::info("tracer {} attached via {}", tc.name, hook);
    drain.add(tc.name, tracer.get());
    tracers.push_back(std::move(tracer));
  }
  drain.start();
  sd_notifyf(0, "READY=1\nSTATUS=%zu tracer(s) up", tracers.size());
  spdlog::info("{} tracer(s) up, draining every {} ms", tracers.size(), cfg.drain_interval.count());

  for (;;) {
    int sig = 0;
    if (sigwait(&signals, &sig) != 0) continue;
    if (sig == SIGHUP) {
      spdlog::warn("SIGHUP: configuration reload is not supported yet; restart to apply changes");
      continue;
    }
    spdlog::info("received {}, shutting down", strsignal(sig));
    break;
  }
  sd_notify(0, "STOPPING=1");
  drain.stop();
  tracers.clear();  // detach and unload every BPF object
  // civetweb's orderly stop waits up to a second for its listener's poll to time out. The
  // kernel objects are gone and the process is about to exit, which closes the sockets, so
  // the server is left to the exit instead of making shutdown slow.
  (void)web.release();
  spdlog::info("stopped: all tracers detached");
  spdlog::shutdown();
  return 0;
}

}  // namespace ebpf_metricsd

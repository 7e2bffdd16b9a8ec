// ebpf-metricsd: exports what eBPF tracers see in the kernel as Prometheus metrics.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <string_view>

#include "ebpf_metricsd/config.h"
#include "ebpf_metricsd/daemon.h"

namespace {

constexpr const char* kUsage = R"(usage: ebpf-metricsd [flags]

Loads eBPF tracers into the kernel and exports what they measure as Prometheus metrics.

Flags:
  --config PATH               configuration file (default /etc/ebpf-metricsd/config.yaml)
  --check-config              parse and validate the configuration, then exit 0 (valid) or 1
  --web.listen-address ADDR   address to serve /metrics on, overrides the config (e.g. :9810)
  --log.level LEVEL           debug, info, warn or error (default info)
  --strict                    exit when any enabled tracer fails to attach
  --version                   print the version and exit
  --help                      print this help and exit
)";

bool take_value(int argc, char** argv, int& i, std::string_view flag, std::string& out) {
  const std::string_view arg = argv[i];
  if (arg == flag) {
    if (i + 1 >= argc) {
      std::cerr << "ebpf-metricsd: " << flag << " needs a value\n";
      std::exit(2);
    }
    out = argv[++i];
    return true;
  }
  if (arg.size() > flag.size() && arg.substr(0, flag.size()) == flag && arg[flag.size()] == '=') {
    out = std::string(arg.substr(flag.size() + 1));
    return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  ebpf_metricsd::DaemonOptions options;
  bool check_config = false;
  std::string log_level = "info";
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    std::string value;
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (arg == "--version") {
      std::cout << "ebpf-metricsd " EBPF_METRICSD_VERSION "\n";
      return 0;
    } else if (arg == "--check-config") {
      check_config = true;
    } else if (arg == "--strict") {
      options.strict = true;
    } else if (take_value(argc, argv, i, "--config", value)) {
      options.config_path = value;
    } else if (take_value(argc, argv, i, "--web.listen-address", value)) {
      options.listen_address = value;
    } else if (take_value(argc, argv, i, "--log.level", value)) {
      log_level = value;
    } else {
      std::cerr << "ebpf-metricsd: unknown flag " << arg << "\n" << kUsage;
      return 2;
    }
  }

  auto logger = spdlog::stderr_color_mt("ebpf-metricsd");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e%z %^%l%$ %v");
  const auto level = spdlog::level::from_str(log_level);
  if (level == spdlog::level::off && log_level != "off") {
    std::cerr << "ebpf-metricsd: invalid --log.level '" << log_level
              << "' (debug, info, warn, error)\n";
    return 2;
  }
  spdlog::set_level(level);

  if (check_config) {
    try {
      ebpf_metricsd::load_config(options.config_path);
    } catch (const ebpf_metricsd::ConfigError& e) {
      std::cerr << e.what() << "\n";
      return 1;
    }
    std::cout << options.config_path << ": configuration is valid\n";
    return 0;
  }
  return ebpf_metricsd::run_daemon(options);
}

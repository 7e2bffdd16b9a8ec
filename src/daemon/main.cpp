// ebpf-metricsd: exports what eBPF tracers see in the kernel as Prometheus metrics.
#include <malloc.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <string_view>

#include "ebpf_metricsd/daemon/config.h"
#include "ebpf_metricsd/daemon/daemon.h"
#include "ebpf_metricsd/http/web_config.h"
#include "ebpf_metricsd/tracers/registry.h"

namespace {

constexpr const char* kUsage = R"(usage: ebpf-metricsd [flags]

Loads eBPF tracers into the kernel and exports what they measure as Prometheus metrics.

Flags:
  --config PATH               configuration file (default /etc/ebpf-metricsd/config.yaml)
  --check-config              parse and validate the configuration, then exit 0 (valid) or 1
  --web.listen-address ADDR   address to serve /metrics on, overrides the config (e.g. :9810)
  --web.config.file PATH      TLS and basic auth, in the Prometheus exporters' web config
                              format (tls_server_config, basic_auth_users)
  --log.level LEVEL           debug, info, warn or error (default info)
  --strict                    exit when any enabled tracer fails to attach
  --list-tracers              print the tracers this build ships, one per line, and exit
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

// The syslog priority of a log level, for journald (sd-daemon(3)).
class SyslogPriorityFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const char digit = [&] {
      switch (msg.level) {
        case spdlog::level::critical:
          return '2';
        case spdlog::level::err:
          return '3';
        case spdlog::level::warn:
          return '4';
        case spdlog::level::info:
          return '6';
        default:
          return '7';
      }
    }();
    dest.push_back(digit);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<SyslogPriorityFlag>();
  }
};

// systemd sets JOURNAL_STREAM to "device:inode" of the stream it connected to stderr.
bool stderr_is_journal() {
  const char* env = std::getenv("JOURNAL_STREAM");
  if (!env) return false;
  struct stat st {};
  if (fstat(STDERR_FILENO, &st) != 0) return false;
  unsigned long long dev = 0, ino = 0;
  if (std::sscanf(env, "%llu:%llu", &dev, &ino) != 2) return false;
  return dev == st.st_dev && ino == st.st_ino;
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything else: a SIGHUP (reload) or SIGPIPE in the first instant must not end
  // the process.
  ebpf_metricsd::block_daemon_signals();
  // Symbolization reads local files only: elfutils would ask a debuginfod server named here.
  unsetenv("DEBUGINFOD_URLS");
  // glibc gives every thread that allocates an arena of its own and keeps them: after a burst
  // of scrapes on many connections the daemon would hold their memory for good (measured with
  // bench/load_bench.sh, 100 connections: RSS 11 -> 30 MB and staying, 15 -> 19 MB with two
  // arenas). One arena serves a daemon of a few threads, and what one thread frees another
  // reuses: the profile's threads (tables, processes, reads) each kept a heap's worth apart,
  // 20 MiB more at the peak of the memory-budget test with two.
  mallopt(M_ARENA_MAX, 1);
  // A scrape's body is a block of 100 KB and more. glibc would serve such blocks from an
  // mmap of their own until the first is freed, then raise its threshold and keep later ones
  // in the arenas, where a burst of scrapes leaves them resident. Fixed thresholds keep every
  // large block mapped on its own (returned whole when freed) and the arenas' tops trimmed.
  mallopt(M_MMAP_THRESHOLD, 64 * 1024);
  mallopt(M_TRIM_THRESHOLD, 256 * 1024);
  ebpf_metricsd::DaemonOptions options;
  bool check_config = false;
  std::string log_level = "info";
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    std::string value;
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (arg == "--version") {
      std::cout << "ebpf-metricsd " EBPF_METRICSD_VERSION "\n";
      return 0;
    }
    if (arg == "--list-tracers") {
      for (const auto& d : ebpf_metricsd::tracer_registry()) std::cout << d.name << "\n";
      return 0;
    }
    if (arg == "--check-config") {
      check_config = true;
    } else if (arg == "--strict") {
      options.strict = true;
    } else if (take_value(argc, argv, i, "--config", value)) {
      options.config_path = value;
    } else if (take_value(argc, argv, i, "--web.config.file", value)) {
      options.web_config_path = value;
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
  if (stderr_is_journal()) {
    // journald reads the "<N>" prefix as the line's syslog priority and stamps the time.
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<SyslogPriorityFlag>('*').set_pattern("<%*>%v");
    spdlog::set_formatter(std::move(formatter));
  } else {
    spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e%z %^%l%$ %v");
  }
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
      if (!options.web_config_path.empty()) {
        ebpf_metricsd::load_web_config(options.web_config_path);
      }
    } catch (const ebpf_metricsd::ConfigError& e) {
      std::cerr << e.what() << "\n";
      return 1;
    }
    std::cout << options.config_path << ": configuration is valid\n";
    return 0;
  }
  return ebpf_metricsd::run_daemon(options);
}

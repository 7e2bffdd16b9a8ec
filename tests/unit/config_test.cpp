#include <unistd.h>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "ebpf_metricsd/base/yaml_reader.h"
#include "ebpf_metricsd/daemon/config.h"
#include "ebpf_metricsd/http/server.h"
#include "ebpf_metricsd/tracers/registry.h"

using namespace ebpf_metricsd;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

std::string error_of(const std::string& yaml) {
  try {
    parse_config(yaml, "test.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

const TracerConfig& tracer(const Config& c, const std::string& name) {
  for (const auto& t : c.tracers) {
    if (t.name == name) return t;
  }
  throw std::runtime_error("no tracer " + name);
}

}  // namespace

TEST_CASE("empty config gives the documented defaults") {
  const Config c = parse_config("", "test.yaml");
  CHECK(c.web.listen_address == ":9810");
  CHECK(c.drain_interval == std::chrono::seconds(5));
  CHECK(c.nice == -10);
  REQUIRE(!c.tracers.empty());
  for (const auto& t : c.tracers) CHECK_FALSE(t.enabled);
}

TEST_CASE("a full valid config is read") {
  const Config c = parse_config(R"(
web:
  listen_address: "127.0.0.1:9999"
drain_interval: 1m30s
tracers:
  syscall_latency:
    enabled: true
    hook: raw_tp
    include: [read, write]
    exclude: [write]
)",
                                "test.yaml");
  CHECK(c.web.listen_address == "127.0.0.1:9999");
  CHECK(c.drain_interval == std::chrono::seconds(90));
  const auto& t = tracer(c, "syscall_latency");
  CHECK(t.enabled);
  CHECK(t.hook == HookPreference::RawTp);
}

TEST_CASE("the shipped config is valid and enables syscall_latency") {
  const Config c = load_config(SOURCE_DIR "/config/ebpf-metricsd.yaml");
  CHECK(c.web.listen_address == ":9810");
  CHECK(tracer(c, "syscall_latency").enabled);
}

TEST_CASE("profiles: how long and how much the profile and the slow events keep") {
  const Config defaults = parse_config("", "test.yaml");
  CHECK(defaults.profiles.retention == std::chrono::seconds(600));
  CHECK(defaults.profiles.max_samples == 100000);
  CHECK(defaults.profiles.max_slow_events == 100000);
  const Config c = parse_config(
      "profiles:\n  retention: 30m\n  max_samples: 20000\n  max_slow_events: 500\n", "test.yaml");
  CHECK(c.profiles.retention == std::chrono::minutes(30));
  CHECK(c.profiles.max_samples == 20000);
  CHECK(c.profiles.max_slow_events == 500);
  CHECK_THAT(error_of("profiles:\n  retention: 2h\n"),
             Catch::Contains("test.yaml:2:14: profiles.retention"));
  CHECK_THAT(error_of("profiles:\n  retention: 30s\n"), Catch::Contains("profiles.retention"));
  CHECK_THAT(error_of("profiles:\n  retention: 90500ms\n"),
             Catch::Contains("is not a whole number of seconds"));
  CHECK_THAT(error_of("profiles:\n  max_samples: 10\n"), Catch::Contains("profiles.max_samples"));
  CHECK_THAT(error_of("profiles:\n  keep: 1h\n"), Catch::Contains("profiles.keep"));
}

TEST_CASE("config errors name file, line, column and key") {
  SECTION("invalid YAML") {
    CHECK_THAT(error_of("web: [unclosed\n"), StartsWith("test.yaml:") && Contains("invalid YAML"));
  }
  SECTION("top level is not a mapping") {
    CHECK_THAT(error_of("- a\n- b\n"),
               StartsWith("test.yaml:1:1:") && Contains("expected a mapping"));
  }
  SECTION("unknown top-level key") {
    CHECK(error_of("drain_interval: 5s\nfrobnicate: 1\n") ==
          "test.yaml:2:1: frobnicate: unknown key");
  }
  SECTION("unknown key in web") {
    CHECK(error_of("web:\n  listen_adress: ':1'\n") ==
          "test.yaml:2:3: web.listen_adress: unknown key");
  }
  SECTION("web is not a mapping") {
    CHECK_THAT(error_of("web: 5\n"), StartsWith("test.yaml:1:6: web: expected a mapping"));
  }
  SECTION("invalid listen address") {
    CHECK_THAT(error_of("web:\n  listen_address: 'nope'\n"),
               StartsWith("test.yaml:2:19: web.listen_address: expected host:port"));
    CHECK_THAT(error_of("web:\n  listen_address: ':99999'\n"),
               Contains("web.listen_address: invalid port"));
    CHECK_THAT(error_of("web:\n  listen_address: 'example.com:80'\n"),
               Contains("web.listen_address: invalid IP address"));
    CHECK_THAT(error_of("web:\n  listen_address: '[::1:80'\n"),
               Contains("web.listen_address: unbalanced ["));
  }
  SECTION("listen address of the wrong type") {
    CHECK_THAT(error_of("web:\n  listen_address: [1]\n"),
               StartsWith("test.yaml:2:19: web.listen_address: expected a string, got a list"));
  }
  SECTION("invalid drain interval") {
    CHECK_THAT(error_of("drain_interval: 5 seconds\n"),
               StartsWith("test.yaml:1:17: drain_interval: invalid duration"));
    CHECK_THAT(error_of("drain_interval: 5\n"), Contains("expected a unit"));
    CHECK_THAT(error_of("drain_interval: {a: 1}\n"),
               Contains("expected a duration, got a mapping"));
  }
  SECTION("nice out of range or not a number") {
    CHECK_THAT(error_of("nice: -21\n"), StartsWith("test.yaml:1:7: nice:"));
    CHECK_THAT(error_of("nice: 20\n"), StartsWith("test.yaml:1:7: nice:"));
    CHECK_THAT(error_of("nice: low\n"), StartsWith("test.yaml:1:7: nice:"));
    CHECK(parse_config("nice: 19\n", "test.yaml").nice == 19);
    CHECK(parse_config("nice: -20\n", "test.yaml").nice == -20);
  }
  SECTION("drain interval out of range") {
    CHECK(error_of("drain_interval: 10ms\n") ==
          "test.yaml:1:17: drain_interval: duration 10ms is out of range [100ms, 1h]");
    CHECK_THAT(error_of("drain_interval: 2h\n"), Contains("out of range"));
  }
  SECTION("unknown tracer") {
    CHECK_THAT(error_of("tracers:\n  syscal_latency: {enabled: true}\n"),
               StartsWith("test.yaml:2:3: tracers.syscal_latency: unknown tracer (known: "));
  }
  SECTION("tracers is not a mapping") {
    CHECK_THAT(error_of("tracers: [syscall_latency]\n"), Contains("tracers: expected a mapping"));
  }
  SECTION("unknown key in a tracer") {
    CHECK(error_of("tracers:\n  syscall_latency:\n    enabled: true\n    inclde: [read]\n") ==
          "test.yaml:4:5: tracers.syscall_latency.inclde: unknown key");
  }
  SECTION("enabled is not a boolean") {
    CHECK(error_of("tracers:\n  syscall_latency:\n    enabled: yes please\n") ==
          "test.yaml:3:14: tracers.syscall_latency.enabled: expected true or false, got 'yes "
          "please'");
  }
  SECTION("invalid hook") {
    CHECK_THAT(
        error_of("tracers:\n  syscall_latency:\n    hook: kprobe\n"),
        StartsWith(
            "test.yaml:3:11: tracers.syscall_latency.hook: expected auto, tp_btf or raw_tp"));
  }
  SECTION("hook on a tracer with a single hook kind") {
    CHECK(error_of("tracers:\n  page_faults:\n    hook: tp_btf\n") ==
          "test.yaml:3:11: tracers.page_faults.hook: page_faults has a single hook kind "
          "(perf_event); only auto is accepted");
  }
  SECTION("option of another tracer") {
    CHECK(error_of("tracers:\n  page_faults:\n    comm: true\n") ==
          "test.yaml:3:5: tracers.page_faults.comm: unknown key");
    CHECK_THAT(error_of("tracers:\n  runqueue_latency:\n    cgroup: maybe\n"),
               Contains("tracers.runqueue_latency.cgroup: expected true or false"));
  }
  SECTION("unknown syscall name") {
    CHECK(error_of("tracers:\n  syscall_latency:\n    include: [read, frobnicate]\n") ==
          "test.yaml:3:14: tracers.syscall_latency.include: unknown syscall 'frobnicate'");
  }
  SECTION("include is not a list") {
    CHECK_THAT(
        error_of("tracers:\n  syscall_latency:\n    exclude: read\n"),
        StartsWith(
            "test.yaml:3:14: tracers.syscall_latency.exclude: expected a list, got a scalar"));
  }
  SECTION("list item is not a string") {
    CHECK_THAT(error_of("tracers:\n  syscall_latency:\n    include: [[read]]\n"),
               Contains("tracers.syscall_latency.include: list items must be strings"));
  }
  SECTION("missing file") {
    CHECK_THROWS_WITH(load_config("/nonexistent/ebpf-metricsd.yaml"),
                      "/nonexistent/ebpf-metricsd.yaml: No such file or directory");
  }
  SECTION("a directory instead of a file") {
    CHECK_THROWS_WITH(load_config("/tmp"), "/tmp: not a regular file");
  }
}

TEST_CASE("durations parse like Prometheus durations") {
  CHECK(parse_duration("250ms") == std::chrono::milliseconds(250));
  CHECK(parse_duration("5s") == std::chrono::seconds(5));
  CHECK(parse_duration("1h30m") == std::chrono::minutes(90));
  CHECK(parse_duration("1d") == std::chrono::hours(24));
  CHECK_THROWS_AS(parse_duration(""), std::invalid_argument);
  CHECK_THROWS_AS(parse_duration("-5s"), std::invalid_argument);
  CHECK_THROWS_AS(parse_duration("5x"), std::invalid_argument);
  CHECK_THROWS_AS(parse_duration("99999999999999999999s"), std::invalid_argument);
  CHECK(format_duration(std::chrono::milliseconds(100)) == "100ms");
  CHECK(format_duration(std::chrono::hours(1)) == "1h");
}

TEST_CASE("btf_path must name a readable BTF file") {
  CHECK(parse_config("", "test.yaml").btf_path.empty());
  CHECK_THAT(error_of("btf_path: vmlinux.btf\n"),
             StartsWith("test.yaml:1:") && Contains("btf_path: must be an absolute path"));
  CHECK_THAT(error_of("btf_path: /nonexistent/vmlinux.btf\n"),
             Contains("btf_path: cannot read BTF from /nonexistent/vmlinux.btf"));
  CHECK_THAT(error_of("btf_path: /etc/hostname\n"), Contains("btf_path: cannot read BTF"));
  if (access("/sys/kernel/btf/vmlinux", R_OK) == 0) {
    CHECK(parse_config("btf_path: /sys/kernel/btf/vmlinux\n", "test.yaml").btf_path ==
          "/sys/kernel/btf/vmlinux");
  }
}

TEST_CASE("duplicate keys and further documents are errors naming both places") {
  CHECK(error_of("drain_interval: 5s\nmax_series: 10\ndrain_interval: 1s\n") ==
        "test.yaml:3:1: drain_interval: duplicate key (first at line 1)");
  CHECK(error_of("tracers:\n  kmalloc:\n    enabled: true\n    enabled: false\n") ==
        "test.yaml:4:5: tracers.kmalloc.enabled: duplicate key (first at line 3)");
  // The shipped config with a second tracers: section appended.
  std::ifstream in(SOURCE_DIR "/config/ebpf-metricsd.yaml");
  const std::string shipped((std::istreambuf_iterator<char>(in)), {});
  REQUIRE_FALSE(shipped.empty());
  CHECK_THAT(error_of(shipped + "tracers:\n  kmalloc: {enabled: true}\n"),
             Contains(": tracers: duplicate key (first at line"));
  CHECK_THAT(error_of("max_series: 10\n---\nmax_series: 20\n"),
             StartsWith("test.yaml:3:") && Contains("a second YAML document"));
  CHECK_NOTHROW(parse_config("---\nmax_series: 10\n", "test.yaml"));
  // A trailing "---" (or one followed by comments only) starts no second document.
  CHECK_NOTHROW(parse_config("max_series: 10\n---\n", "test.yaml"));
  CHECK_NOTHROW(parse_config("max_series: 10\n---\n# nothing more\n", "test.yaml"));
}

TEST_CASE("durations and integers that overflow are errors, never wrapped") {
  CHECK_THAT(error_of("drain_interval: 9223372036854775807d\n"), Contains("too large"));
  CHECK_THAT(error_of("drain_interval: 106751991167d106751991167d\n"), Contains("too large"));
  CHECK_THAT(error_of("drain_interval: 99999999999999999999ms\n"), Contains("too large"));
  CHECK_THAT(error_of("max_series: 99999999999999999999\n"),
             Contains("max_series: expected an integer"));
}

TEST_CASE("nesting too deep is named as such") {
  std::string deep = "web: ";
  for (int i = 0; i < 40; ++i) deep += "[";
  for (int i = 0; i < 40; ++i) deep += "]";
  CHECK_THAT(error_of(deep + "\n"), Contains("nesting deeper than 32 levels"));
  std::string very_deep = "web: ";
  for (int i = 0; i < 5000; ++i) very_deep += "[";
  CHECK_THAT(error_of(very_deep + "\n"), Contains("nesting"));
}

namespace {

// A "billion laughs" file of about 1 KiB: ten levels of anchors, each a list (or mapping) of
// ten aliases of the one above, 10^10 values by reference. `indent` puts it under a key.
std::string alias_bomb(const std::string& prefix, bool mappings) {
  std::string out = prefix;
  for (int level = 0; level < 10; ++level) {
    out += "l" + std::to_string(level) + ": &l" + std::to_string(level) + (mappings ? " {" : " [");
    for (int i = 0; i < 10; ++i) {
      if (i) out += ", ";
      if (mappings) out += "k" + std::to_string(i) + ": ";
      out += level == 0 ? "read" : "*l" + std::to_string(level - 1);
    }
    out += mappings ? "}\n" : "]\n";
  }
  return out;
}

}  // namespace

TEST_CASE("anchors and aliases are refused at the first one, with file, line and key") {
  // At the top level, as lists and as mappings: refused at the first anchor, line 1, before
  // any of the 10^10 values is reached.
  CHECK(error_of(alias_bomb("", false)) ==
        "test.yaml:1:5: l0: a YAML anchor (&name); anchors and aliases are not accepted in this "
        "config (no setting needs them): write the value out");
  CHECK_THAT(error_of(alias_bomb("", true)), StartsWith("test.yaml:1:5: l0: a YAML anchor"));
  // Inside a tracer's include list.
  CHECK(error_of("tracers:\n  syscall_latency:\n    enabled: true\n    include: &x [read]\n"
                 "  kmalloc:\n    include: *x\n") ==
        "test.yaml:4:14: tracers.syscall_latency.include: a YAML anchor (&name); anchors and "
        "aliases are not accepted in this config (no setting needs them): write the value out");
  // An alias of an anchor defined nowhere, a merge key, an anchor on an empty value.
  CHECK_THAT(error_of("max_series: *nowhere\n"), StartsWith("test.yaml:1:13: "));
  CHECK_THAT(error_of("web: &w\n  listen_address: :9810\ntracers:\n  <<: *w\n"),
             StartsWith("test.yaml:1:6: web: a YAML anchor"));
  CHECK_THAT(error_of("tracers: &t\n"), StartsWith("test.yaml:1:10: tracers: a YAML anchor"));
  // The key path stays right past empty values, empty keys and complex keys.
  CHECK_THAT(error_of("web:\ntracers:\n  kmalloc:\n  page_faults:\n    include: &i [a]\n"),
             StartsWith("test.yaml:5:14: tracers.page_faults.include: a YAML anchor"));
  CHECK_THAT(error_of("? [a, b]\n: x\nc: &c 1\n"), StartsWith("test.yaml:3:4: c: a YAML anchor"));
  CHECK_THAT(error_of("~: x\nc: &c 1\n"), StartsWith("test.yaml:2:4: c: a YAML anchor"));
  // A key that is long or holds control characters: quoted as an excerpt, one line.
  const std::string odd = error_of("\"k\\nk" + std::string(200, 'k') + "\": &c 1\n");
  CHECK(odd.find('\n') == std::string::npos);
  CHECK(odd.size() < 300);
  // A bomb in a second document is bounded the same way.
  CHECK_THAT(error_of("max_series: 10\n---\n" + alias_bomb("", false)),
             StartsWith("test.yaml:3:5: l0: a YAML anchor"));
}

TEST_CASE("values are bounded in number, and error messages quote a short excerpt") {
  std::string many = "x: [";
  for (int i = 0; i < 30000; ++i) many += i ? ",1" : "1";
  CHECK_THAT(error_of(many + "]\n"),
             Contains("x: more than 20000 values in one file, the most a config file may have"));
  // One 20,000-byte duration: the message quotes 48 bytes of it and says how long it was.
  const std::string message = error_of("drain_interval: " + std::string(20000, '9') + "s\n");
  CHECK(message == "test.yaml:1:17: drain_interval: duration '" + std::string(48, '9') +
                       "'... (20001 bytes) is too large");
  // A long unknown key, a long boolean, control characters: short, one line.
  const std::string key = error_of(std::string(1000, 'k') + ": 1\n");
  CHECK(key.size() < 200);
  CHECK_THAT(key, Contains("... (1000 bytes): unknown key"));
  const std::string flag =
      error_of("tracers:\n  kmalloc:\n    enabled: \"" + std::string(3000, 'y') + "\\n\"\n");
  CHECK(flag.size() < 200);
  CHECK(flag.find('\n') == std::string::npos);
  CHECK_THAT(error_of("tracers:\n  syscall_latency:\n    include: [\"a\\x01b\"]\n"),
             Contains("unknown syscall 'a\\x01b'"));
  CHECK(quoted_excerpt("\xc3\xa9\xc3\xa9", 3) == "'\xc3\xa9'... (4 bytes)");  // not mid-character
}

TEST_CASE("config files: size limit before parsing, symlink loops named") {
  char dir_template[] = "/tmp/emd-config-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const std::string big = dir + "/big.yaml";
  {
    std::ofstream out(big);
    out << "tracers:\n  syscall_latency:\n    include:\n";
    for (int i = 0; i < 40000; ++i) out << "      - read\n";
  }
  CHECK_THROWS_WITH(load_config(big),
                    big + ": larger than 256 KiB, the most a config file may have");
  REQUIRE(symlink((dir + "/b").c_str(), (dir + "/a").c_str()) == 0);
  REQUIRE(symlink((dir + "/a").c_str(), (dir + "/b").c_str()) == 0);
  CHECK_THROWS_WITH(load_config(dir + "/a"), dir + "/a: Too many levels of symbolic links");
  CHECK_THROWS_WITH(load_config(dir + "/none.yaml"), dir + "/none.yaml: No such file or directory");
  std::filesystem::remove_all(dir);
}

TEST_CASE("web limits stay within the unit's TasksMax and LimitNOFILE") {
  CHECK(parse_config("web:\n  max_requests: 200\n", "test.yaml").web.max_requests == 200);
  CHECK_THAT(error_of("web:\n  max_requests: 300\n"),
             Contains("web.max_requests: value 300 is out of range [1, 200]"));
  const Config c = parse_config(
      "web:\n  max_connections: 60000\n  max_connections_per_address: 5\n", "test.yaml");
  CHECK(c.web.max_connections == 60000);
  CHECK(c.web.max_connections_per_address == 5);
  CHECK_THAT(error_of("web:\n  max_connections: 60001\n"),
             Contains("web.max_connections: value 60001 is out of range [1, 60000]"));
  CHECK_THAT(error_of("web:\n  max_connections: 0\n"), Contains("web.max_connections: value 0"));
  CHECK_THAT(error_of("web:\n  max_connections: 10\n  max_connections_per_address: 11\n"),
             Contains("test.yaml:3:32: web.max_connections_per_address: is above "
                      "max_connections (10)"));
  // The unit's limits the ceilings are made for. The web server's threads do not grow with
  // load or limits; with the drain, main and library threads they stay far below TasksMax.
  std::ifstream unit(SOURCE_DIR "/systemd/ebpf-metricsd.service");
  const std::string text((std::istreambuf_iterator<char>(unit)), {});
  CHECK_THAT(text, Contains("\nTasksMax=256\n"));
  // 2..8 event loops, 1..8 workers each for two queues, two more: on any machine.
  for (unsigned cores : {1u, 2u, 8u, 64u, 4096u}) {
    INFO(cores << " cores");
    CHECK(web_server_threads(cores) <= kMaxWebServerThreads);
  }
  CHECK(web_server_threads(1) == 2 + 2 + 2);
  CHECK(web_server_threads(64) == kMaxWebServerThreads);
  CHECK(kMaxWebServerThreads + 32 < 256);  // main, drain, ring readers, libraries' own
  CHECK_THAT(text, Contains("\nLimitNOFILE=65536\n"));
  static_assert(Config::kMaxConnections + kDescriptorsForTheRest <= 65536);
}

TEST_CASE("a tracer's slow option: threshold required, bounded, no unknown keys") {
  const std::string head = "tracers:\n  syscall_latency:\n    slow:\n";
  CHECK(error_of(head + "      threshold: 10ms\n      max_per_second: 100\n") == "<no error>");
  CHECK_THAT(error_of(head + "      max_per_second: 100\n"),
             StartsWith("test.yaml:4:") && Contains("slow needs a threshold"));
  CHECK_THAT(error_of(head + "      threshold: 0s\n"),
             StartsWith("test.yaml:4:") && Contains("tracers.syscall_latency.slow.threshold"));
  CHECK_THAT(error_of(head + "      threshold: 10ms\n      max_per_second: 0\n"),
             StartsWith("test.yaml:5:") && Contains("max_per_second"));
  CHECK_THAT(error_of(head + "      threshold: 10ms\n      limit: 5\n"),
             StartsWith("test.yaml:5:") && Contains("limit: unknown key"));
  // `unwind`, for every tracer with `slow`.
  for (const char* name : {"syscall_latency", "block_io", "tcp_connect_latency", "offcpu_time"}) {
    INFO(name);
    const std::string slow = std::string("tracers:\n  ") + name + ":\n    slow:\n";
    CHECK(error_of(slow + "      threshold: 10ms\n      unwind: frame_pointers\n") == "<no error>");
    CHECK_THAT(error_of(slow + "      threshold: 10ms\n      unwind: dwarf\n"),
               StartsWith("test.yaml:5:") && Contains("must be cfi or frame_pointers"));
  }
}

TEST_CASE(
    "runqueue_latency and offcpu_time are independent: a change to one's section restarts "
    "that one alone, and each chooses its own hook") {
  const auto parse = [](const std::string& offcpu) {
    return parse_config(
        "tracers:\n  runqueue_latency:\n    enabled: true\n  offcpu_time:\n" + offcpu, "test.yaml");
  };
  const Config a = parse("    enabled: true\n    comm: true\n");
  const Config b = parse("    enabled: true\n    comm: true\n    label_map_entries: 64\n");
  CHECK(tracer(b, "offcpu_time").fingerprint != tracer(a, "offcpu_time").fingerprint);
  CHECK(tracer(b, "runqueue_latency").fingerprint == tracer(a, "runqueue_latency").fingerprint);
  CHECK(error_of("tracers:\n  runqueue_latency:\n    enabled: true\n    hook: tp_btf\n"
                 "  offcpu_time:\n    enabled: true\n    hook: raw_tp\n") == "<no error>");
}

TEST_CASE("`cgroup` is an option only of tracers whose events have an owner") {
  CHECK(error_of("tracers:\n  kmalloc:\n    cgroup: true\n") ==
        "test.yaml:3:13: tracers.kmalloc.cgroup: kmalloc's events have no owner to label by "
        "cgroup");
  CHECK(error_of("tracers:\n  oom_kills:\n    cgroup: false\n") ==
        "test.yaml:3:13: tracers.oom_kills.cgroup: oom_kills is always labelled by cgroup");
  for (const auto& d : tracer_registry()) {
    INFO(d.name);
    const std::string yaml = "tracers:\n  " + d.name + ":\n    cgroup: true\n";
    if (d.traits.owner == EventOwner::Task) {
      CHECK(error_of(yaml) == "<no error>");
    } else {
      CHECK_THAT(error_of(yaml), StartsWith("test.yaml:3:13: tracers." + d.name + ".cgroup: "));
    }
  }
}

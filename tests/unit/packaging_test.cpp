// The shipped deployment files agree with each other and with the daemon.
#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>
#include <regex>

#include <catch2/catch.hpp>
#include <fstream>
#include <set>
#include <sstream>

#include "ebpf_metricsd/daemon/config.h"

using namespace ebpf_metricsd;

namespace {

YAML::Node load(const std::string& rel) { return YAML::LoadFile(SOURCE_DIR "/" + rel); }

std::string unit_file(const std::string& name = "ebpf-metricsd.service") {
  std::ifstream in(SOURCE_DIR "/systemd/" + name);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// "CAP_BPF CAP_PERFMON" from a unit line "Key=..." as {"BPF", "PERFMON"}.
std::set<std::string> unit_caps(const std::string& key,
                                const std::string& name = "ebpf-metricsd.service") {
  std::istringstream in(unit_file(name));
  std::string line;
  std::set<std::string> caps;
  while (std::getline(in, line)) {
    if (line.rfind(key + "=", 0) != 0) continue;
    std::istringstream words(line.substr(key.size() + 1));
    std::string w;
    while (words >> w) caps.insert(w.substr(4));  // drop "CAP_"
  }
  return caps;
}

}  // namespace

TEST_CASE("Kubernetes DaemonSet: the unit's capabilities only, read-only, BTF and cgroup mounts") {
  const YAML::Node ds = load("packaging/kubernetes/daemonset.yaml");
  REQUIRE(ds["kind"].as<std::string>() == "DaemonSet");
  const YAML::Node pod = ds["spec"]["template"]["spec"];
  CHECK_FALSE(pod["hostNetwork"].as<bool>());
  const YAML::Node c = pod["containers"][0];
  const YAML::Node sc = c["securityContext"];
  CHECK_FALSE(sc["privileged"].as<bool>());
  CHECK_FALSE(sc["allowPrivilegeEscalation"].as<bool>());
  CHECK(sc["readOnlyRootFilesystem"].as<bool>());
  CHECK(sc["capabilities"]["drop"].as<std::vector<std::string>>() ==
        std::vector<std::string>{"ALL"});
  const auto added = sc["capabilities"]["add"].as<std::vector<std::string>>();
  const std::set<std::string> add(added.begin(), added.end());
  CHECK(add == unit_caps("AmbientCapabilities"));
  CHECK(add == unit_caps("CapabilityBoundingSet"));
  CHECK(add == std::set<std::string>{"BPF", "PERFMON"});
  std::set<std::string> mounts;
  for (const auto& m : c["volumeMounts"]) {
    mounts.insert(m["mountPath"].as<std::string>());
    CHECK(m["readOnly"].as<bool>());
  }
  CHECK(mounts.count("/sys/kernel/btf"));
  CHECK(mounts.count("/sys/fs/cgroup"));
  CHECK(mounts.count("/etc/ebpf-metricsd"));
  CHECK(c["ports"][0]["name"].as<std::string>() == "metrics");
  CHECK(c["ports"][0]["containerPort"].as<int>() == 9810);
}

TEST_CASE(
    "Kubernetes profiling patch: the DaemonSet's container, host PIDs, the capabilities "
    "of the unit and its profile drop-in") {
  const YAML::Node ds = load("packaging/kubernetes/daemonset.yaml");
  const YAML::Node patch = load("packaging/kubernetes/profiling/daemonset-patch.yaml");
  const YAML::Node pod = patch["spec"]["template"]["spec"];
  CHECK(pod["hostPID"].as<bool>());
  REQUIRE(pod["containers"].size() == 1);
  // A strategic merge patch merges containers by name: the name must be the DaemonSet's.
  CHECK(pod["containers"][0]["name"].as<std::string>() ==
        ds["spec"]["template"]["spec"]["containers"][0]["name"].as<std::string>());
  const auto added =
      pod["containers"][0]["securityContext"]["capabilities"]["add"].as<std::vector<std::string>>();
  const std::set<std::string> add(added.begin(), added.end());
  std::set<std::string> both = unit_caps("AmbientCapabilities");
  for (const std::string& c : unit_caps("AmbientCapabilities", "profile.conf")) both.insert(c);
  CHECK(add == both);
  CHECK(unit_caps("CapabilityBoundingSet", "profile.conf") ==
        unit_caps("AmbientCapabilities", "profile.conf"));
  CHECK(add == std::set<std::string>{"BPF", "PERFMON", "SYS_PTRACE", "CHECKPOINT_RESTORE",
                                     "DAC_READ_SEARCH", "SYSLOG"});
}

TEST_CASE("Kubernetes Service and PodMonitor select the DaemonSet's pods on its port") {
  const YAML::Node ds = load("packaging/kubernetes/daemonset.yaml");
  const auto pod_labels =
      ds["spec"]["template"]["metadata"]["labels"].as<std::map<std::string, std::string>>();
  const YAML::Node svc = load("packaging/kubernetes/service.yaml");
  const YAML::Node pm = load("packaging/kubernetes/podmonitor.yaml");
  for (const auto& [k, v] : svc["spec"]["selector"].as<std::map<std::string, std::string>>()) {
    CHECK(pod_labels.at(k) == v);
  }
  for (const auto& [k, v] :
       pm["spec"]["selector"]["matchLabels"].as<std::map<std::string, std::string>>()) {
    CHECK(pod_labels.at(k) == v);
  }
  CHECK(svc["spec"]["ports"][0]["targetPort"].as<std::string>() == "metrics");
  CHECK(pm["spec"]["podMetricsEndpoints"][0]["port"].as<std::string>() == "metrics");
  CHECK(pm["apiVersion"].as<std::string>() == "monitoring.coreos.com/v1");
  for (const auto* f : {"daemonset.yaml", "service.yaml", "podmonitor.yaml", "configmap.yaml"}) {
    CHECK(
        load(std::string("packaging/kubernetes/") + f)["metadata"]["namespace"].as<std::string>() ==
        "ebpf-metricsd");
  }
}

TEST_CASE("the ConfigMap's config and the shipped config are valid configs") {
  const YAML::Node cm = load("packaging/kubernetes/configmap.yaml");
  const Config cfg = parse_config(cm["data"]["config.yaml"].as<std::string>(), "configmap.yaml");
  CHECK(cfg.web.listen_address == ":9810");
  std::ifstream in(SOURCE_DIR "/config/ebpf-metricsd.yaml");
  std::stringstream ss;
  ss << in.rdbuf();
  CHECK_NOTHROW(parse_config(ss.str(), "ebpf-metricsd.yaml"));
}

TEST_CASE("the dashboard: data source variable, instance filter, rows, heatmaps, recorded series") {
  using nlohmann::json;
  std::ifstream in(SOURCE_DIR "/dashboards/ebpf-metricsd.json");
  const json dash = json::parse(in);
  CHECK(dash["schemaVersion"].get<int>() >= 36);
  std::map<std::string, json> vars;
  for (const auto& v : dash["templating"]["list"]) vars[v["name"]] = v;
  REQUIRE(vars.count("datasource"));
  CHECK(vars["datasource"]["type"] == "datasource");
  CHECK(vars["datasource"]["query"] == "prometheus");
  REQUIRE(vars.count("instance"));
  CHECK(vars["instance"]["datasource"]["uid"] == "${datasource}");
  // The workload variable lists the cgroups of labelled series; "All" matches only those.
  REQUIRE(vars.count("workload"));
  CHECK_THAT(vars["workload"]["query"]["query"].get<std::string>(),
             Catch::Matchers::Contains(", cgroup)"));
  CHECK(vars["workload"]["allValue"] == ".+");
  REQUIRE(vars.count("scheme"));
  CHECK(vars["scheme"]["query"] == "http,https");

  // Recorded series the rules define.
  std::set<std::string> recorded;
  const YAML::Node rules = load("packaging/prometheus/rules.yml");
  for (const auto& g : rules["groups"]) {
    for (const auto& r : g["rules"]) {
      if (r["record"]) recorded.insert(r["record"].as<std::string>());
    }
  }
  std::set<std::string> rows, heatmapped, native_heatmapped, daemon_links;
  std::size_t workload_panels = 0;
  const std::regex recorded_name(R"([a-z_]+:[a-z_]+:[a-z0-9_]+)");
  for (const auto& p : dash["panels"]) {
    if (p["type"] == "row") {
      rows.insert(p["title"]);
      continue;
    }
    INFO(p["title"]);
    CHECK(p["datasource"]["uid"] == "${datasource}");  // never a hard-coded uid
    for (const auto& o : p["fieldConfig"]["overrides"]) {
      for (const auto& prop : o["properties"]) {
        if (prop["id"] != "links") continue;
        for (const auto& l : prop["value"]) daemon_links.insert(l["url"].get<std::string>());
      }
    }
    for (const auto& t : p["targets"]) {
      const std::string expr = t["expr"];
      INFO(expr);
      CHECK(t["datasource"]["uid"] == "${datasource}");
      CHECK(expr.find("instance=~\"$instance\"") != std::string::npos);
      if (expr.find("cgroup=~\"$workload\"") != std::string::npos) ++workload_panels;
      for (std::sregex_iterator m(expr.begin(), expr.end(), recorded_name), end; m != end; ++m) {
        CHECK(recorded.count(m->str()) == 1);
      }
      if (p["type"] == "heatmap") {
        // A: classic buckets by le; B: the native histogram of the same metric.
        CHECK(t["format"] == "heatmap");
        const auto start = expr.find("(rate(") + 6;
        const std::string metric = expr.substr(start, expr.find('{', start) - start);
        if (t["refId"] == "A") {
          // Latency heatmaps show the slow events' exemplars.
          CHECK(t.value("exemplar", false) ==
                (metric.find("_seconds_bucket") != std::string::npos));
          CHECK(metric.size() > 7);
          CHECK(metric.substr(metric.size() - 7) == "_bucket");
          CHECK_THAT(expr, Catch::Matchers::Contains("by (le)"));
          heatmapped.insert(metric.substr(0, metric.size() - 7));
        } else {
          CHECK(t["refId"] == "B");
          native_heatmapped.insert(metric);
        }
      }
    }
  }
  CHECK(rows == std::set<std::string>{"Status", "Syscalls", "TCP connect", "Network transmit",
                                      "Scheduler", "Memory", "Page cache", "Block I/O",
                                      "Workloads"});
  CHECK(native_heatmapped == heatmapped);
  // The flame graph page and the pprof endpoint of each instance, as the daemon serves them.
  CHECK(daemon_links ==
        std::set<std::string>{
            "${scheme}://${__data.fields.instance}/profile",
            "${scheme}://${__data.fields.instance}/debug/pprof/profile?seconds=30"});
  CHECK(workload_panels == 8);
  CHECK(heatmapped ==
        std::set<std::string>{"ebpf_syscall_latency_seconds", "ebpf_tcp_connect_latency_seconds",
                              "ebpf_net_xmit_queue_latency_seconds",
                              "ebpf_runqueue_latency_seconds", "ebpf_offcpu_seconds",
                              "ebpf_kmalloc_size_bytes", "ebpf_block_io_latency_seconds"});
}

// Every file that lists the tracers lists every tracer of the registry (what
// `ebpf-metricsd --list-tracers` prints): a tracer added to the registry and not to one of
// them fails here, naming the place.
#include <yaml-cpp/yaml.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ebpf_metricsd/tracers/registry.h"

using namespace ebpf_metricsd;

namespace {

std::string read_file(const std::string& rel) {
  std::ifstream in(SOURCE_DIR "/" + rel);
  REQUIRE(in);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::set<std::string> registry_names() {
  std::set<std::string> names;
  for (const auto& d : tracer_registry()) names.insert(d.name);
  return names;
}

std::set<std::string> keys(const YAML::Node& map) {
  std::set<std::string> out;
  for (const auto& kv : map) out.insert(kv.first.as<std::string>());
  return out;
}

// The tracers named in the first column of the Markdown table whose header row begins with
// `header` ("| `name` |", or several: "| `a`, `b` |").
std::set<std::string> table_tracers(const std::string& markdown, const std::string& header) {
  std::set<std::string> out;
  std::istringstream in(markdown);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (!inside) {
      inside = line.rfind(header, 0) == 0;
      continue;
    }
    if (line.empty() || line[0] != '|') break;
    const std::string first = line.substr(1, line.find('|', 1) - 1);
    for (std::size_t at = first.find('`'); at != std::string::npos;) {
      const std::size_t end = first.find('`', at + 1);
      if (end == std::string::npos) break;
      out.insert(first.substr(at + 1, end - at - 1));
      at = first.find('`', end + 1);
    }
  }
  return out;
}

// Registry tracers that `listed` lacks, as text ("" when none).
std::string missing(const std::set<std::string>& listed) {
  std::string out;
  for (const auto& name : registry_names()) {
    if (!listed.count(name)) out += (out.empty() ? "" : ", ") + name;
  }
  return out;
}

// Registry tracers not named as a whole word in `text`.
std::set<std::string> named_in(const std::string& text) {
  std::set<std::string> out;
  const auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (const auto& name : registry_names()) {
    for (std::size_t at = text.find(name); at != std::string::npos; at = text.find(name, at + 1)) {
      const bool before = at == 0 || !word(text[at - 1]);
      const bool after = at + name.size() == text.size() || !word(text[at + name.size()]);
      if (before && after) {
        out.insert(name);
        break;
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("every tracer of the registry is listed wherever tracers are listed") {
  REQUIRE(registry_names().size() >= 10);

  SECTION("the shipped config documents every tracer") {
    INFO("config/ebpf-metricsd.yaml lacks: ");
    CHECK(missing(keys(YAML::LoadFile(SOURCE_DIR "/config/ebpf-metricsd.yaml")["tracers"])) == "");
  }
  SECTION("the Kubernetes ConfigMap's config names every tracer") {
    const YAML::Node cm = YAML::LoadFile(SOURCE_DIR "/packaging/kubernetes/configmap.yaml");
    const YAML::Node config = YAML::Load(cm["data"]["config.yaml"].as<std::string>());
    INFO("packaging/kubernetes/configmap.yaml lacks: ");
    CHECK(missing(keys(config["tracers"])) == "");
  }
  SECTION("README's tables of tracers have a row for every tracer") {
    const std::string readme = read_file("README.md");
    for (const std::string header : {"| tracer | what it measures |", "| tracer | 5.10"}) {
      INFO("README.md, the table headed \"" << header << "\", lacks: ");
      CHECK(missing(table_tracers(readme, header)) == "");
    }
  }
  SECTION("the package description is made from the registry's table") {
    // cmake/Package.cmake reads the "TracerDescriptor <name>_descriptor();" lines (the e2e
    // package test checks the built package's description).
    const std::string registry = read_file("src/tracers/registry.cpp");
    std::set<std::string> declared;
    for (const std::string& t : registry_names()) {
      if (registry.find("\nTracerDescriptor " + t + "_descriptor();\n") != std::string::npos)
        declared.insert(t);
    }
    INFO("src/tracers/registry.cpp lacks the declaration line cmake/Package.cmake reads for: ");
    CHECK(missing(declared) == "");
  }
  SECTION("the kernel matrix knows a test file for every tracer") {
    // tests/bpf/<tracer>_test.cpp, or a file its TEST_FILE_TRACERS names the tracer for.
    const std::string matrix = read_file("tests/kernels/matrix.py");
    const auto at = matrix.find("TEST_FILE_TRACERS = {");
    REQUIRE(at != std::string::npos);
    std::set<std::string> proven = named_in(matrix.substr(at, matrix.find('}', at) - at));
    for (const std::string& t : registry_names()) {
      if (std::filesystem::exists(SOURCE_DIR "/tests/bpf/" + t + "_test.cpp")) proven.insert(t);
    }
    INFO(
        "no tests/bpf/<tracer>_test.cpp and no entry in tests/kernels/matrix.py's "
        "TEST_FILE_TRACERS for: ");
    CHECK(missing(proven) == "");
  }
}

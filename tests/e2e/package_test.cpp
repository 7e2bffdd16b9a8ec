// The Debian package: built with cpack, installed with dpkg, checked, removed and purged.
#include <catch2/catch.hpp>

#include "daemon_process.h"
#include "ebpf_metricsd/tracers/registry.h"

using namespace ebpf_metricsd::test;
using Catch::Matchers::Contains;

TEST_CASE("cpack builds a .deb that installs, checks its config, and removes cleanly") {
  if (run_command("dpkg-query -W -f='${Status}' ebpf-metricsd 2>/dev/null | grep -q installed") ==
      0) {
    FAIL("ebpf-metricsd is already installed on this machine; this test installs and removes it");
  }
  const std::string dir = temp_dir();
  REQUIRE(run_command("cd " BINARY_DIR " && cpack -G DEB -B " + dir + " >" + dir +
                      "/cpack.log 2>&1") == 0);
  const std::string deb = run_capture("ls " + dir + "/ebpf-metricsd_*.deb | tr -d '\\n'");
  REQUIRE_FALSE(deb.empty());
  const std::string control = run_capture("dpkg-deb -f " + deb + " Depends");
  CHECK_THAT(control, Contains("libbpf1"));
  // The description names every tracer (made from the registry at configure time).
  const std::string description = run_capture("dpkg-deb -f " + deb + " Description");
  for (const auto& t : ebpf_metricsd::tracer_registry()) {
    INFO("the package description: " << description);
    CHECK((description.find(" " + t.name + ",") != std::string::npos ||
           description.find(" " + t.name + ".") != std::string::npos));
  }

  REQUIRE(run_command("dpkg -i " + deb + " >" + dir + "/dpkg.log 2>&1") == 0);
  const std::string files = run_capture("dpkg -L ebpf-metricsd");
  for (const char* f :
       {"/usr/bin/ebpf-metricsd", "/etc/ebpf-metricsd/config.yaml",
        "/lib/systemd/system/ebpf-metricsd.service",
        "/usr/share/ebpf-metricsd/systemd/profile.conf",
        "/usr/share/ebpf-metricsd/dashboards/ebpf-metricsd.json",
        "/usr/share/ebpf-metricsd/prometheus/rules.yml", "/usr/share/doc/ebpf-metricsd/README.md",
        "/usr/share/doc/ebpf-metricsd/docs/architecture.md"}) {
    INFO(f);
    CHECK_THAT(files, Contains(std::string(f) + "\n"));
  }
  CHECK_THAT(run_capture("dpkg-query -W -f='${Conffiles}' ebpf-metricsd"),
             Contains("/etc/ebpf-metricsd/config.yaml"));
  CHECK(run_capture("/usr/bin/ebpf-metricsd --check-config --config "
                    "/etc/ebpf-metricsd/config.yaml 2>&1") ==
        "/etc/ebpf-metricsd/config.yaml: configuration is valid\n");
  CHECK(
      run_capture("systemd-analyze verify /lib/systemd/system/ebpf-metricsd.service 2>&1").empty());
  // The profile's drop-in, installed as its comment says, verifies with the unit.
  const std::string dropin_dir = "/etc/systemd/system/ebpf-metricsd.service.d";
  REQUIRE(run_command("install -D -m 644 /usr/share/ebpf-metricsd/systemd/profile.conf " +
                      dropin_dir + "/profile.conf") == 0);
  const std::string with_dropin =
      run_capture("systemd-analyze verify /lib/systemd/system/ebpf-metricsd.service 2>&1");
  run_command("rm -rf " + dropin_dir);
  CHECK(with_dropin.empty());

  // Remove: everything but the conffile goes; purge takes the conffile too.
  REQUIRE(run_command("dpkg -r ebpf-metricsd >>" + dir + "/dpkg.log 2>&1") == 0);
  CHECK(access("/usr/bin/ebpf-metricsd", F_OK) != 0);
  CHECK(access("/lib/systemd/system/ebpf-metricsd.service", F_OK) != 0);
  CHECK(access("/usr/share/ebpf-metricsd", F_OK) != 0);
  CHECK(access("/etc/ebpf-metricsd/config.yaml", F_OK) == 0);
  REQUIRE(run_command("dpkg -P ebpf-metricsd >>" + dir + "/dpkg.log 2>&1") == 0);
  CHECK(access("/etc/ebpf-metricsd", F_OK) != 0);
  CHECK(run_command("dpkg-query -W ebpf-metricsd >/dev/null 2>&1") != 0);
  run_command("rm -rf " + dir);
}

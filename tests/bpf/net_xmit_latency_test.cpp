// net_xmit_latency on the real kernel: UDP datagrams the test sends over a veth pair into a
// network namespace it creates, against the interface's counters in /proc/net/dev.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "../metrics_lookup.h"
#include "tracer_fixture.h"

using namespace ebpf_metricsd;

namespace {

int sh(const std::string& cmd) {
  const int st = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::string capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[256];
  while (p && fgets(buf, sizeof buf, p)) out += buf;
  if (p) pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// A veth pair: `host` in this namespace, its peer in a namespace of its own. Link-local
// addresses, a permanent neighbour entry (no ARP) and IPv6 off (no router solicitations,
// no DAD): the test's datagrams are the only packets it sends.
class VethPair {
 public:
  VethPair() {
    const std::string id = std::to_string(getpid() % 100000);
    ns_ = "emdtest" + id;
    host_ = "emdv" + id;
    peer_ = "emdp" + id;
    REQUIRE(sh("ip netns add " + ns_) == 0);
    REQUIRE(sh("ip link add " + host_ + " type veth peer name " + peer_ + " netns " + ns_) == 0);
    sh("sysctl -w net.ipv6.conf." + host_ + ".disable_ipv6=1");
    sh("ip netns exec " + ns_ + " sysctl -w net.ipv6.conf." + peer_ + ".disable_ipv6=1");
    REQUIRE(sh("ip addr add 169.254.77.1/24 dev " + host_) == 0);
    REQUIRE(sh("ip netns exec " + ns_ + " ip addr add 169.254.77.2/24 dev " + peer_) == 0);
    const std::string mac =
        capture("ip netns exec " + ns_ + " cat /sys/class/net/" + peer_ + "/address");
    REQUIRE(sh("ip neigh replace 169.254.77.2 lladdr " + mac + " dev " + host_ + " nud permanent") == 0);
    // The peer answers each datagram (ICMP port unreachable) and must not ARP for us either.
    const std::string host_mac = capture("cat /sys/class/net/" + host_ + "/address");
    REQUIRE(sh("ip netns exec " + ns_ + " ip neigh replace 169.254.77.1 lladdr " + host_mac +
               " dev " + peer_ + " nud permanent") == 0);
    REQUIRE(sh("ip netns exec " + ns_ + " ip link set " + peer_ + " up") == 0);
    REQUIRE(sh("ip link set " + host_ + " up") == 0);
  }
  ~VethPair() {
    sh("ip link del " + host_);
    sh("ip netns del " + ns_);
  }
  const std::string& host() const { return host_; }
  const std::string& ns() const { return ns_; }

  // tx packets and bytes of the host end, from /proc/net/dev.
  std::pair<std::uint64_t, std::uint64_t> tx() const {
    std::ifstream in("/proc/net/dev");
    std::string line;
    while (std::getline(in, line)) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      name.erase(0, name.find_first_not_of(' '));
      if (name != host_) continue;
      std::istringstream f(line.substr(colon + 1));
      std::uint64_t v[16] = {};
      for (auto& x : v) f >> x;
      return {v[9], v[8]};  // tx packets, tx bytes
    }
    FAIL("no " << host_ << " in /proc/net/dev");
    return {};
  }

 private:
  std::string ns_, host_, peer_;
};

}  // namespace

TEST_CASE("UDP datagrams over a veth pair: packets, bytes and latency per interface",
          "[net_xmit]") {
  const std::string hook = GENERATE(std::string("auto"), std::string("raw_tp"));
  INFO("hook " << hook);
  VethPair veth;
  MetricStore store;
  auto tracer = test::start_tracer(store, "net_xmit_latency", "    hook: " + hook + "\n");
  // Let anything the link sends when it comes up go out before the window opens.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));

  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(9);  // discard
  REQUIRE(inet_pton(AF_INET, "169.254.77.2", &to.sin_addr) == 1);
  constexpr int kPackets = 300;
  constexpr std::size_t kPayload = 100;
  const char payload[kPayload] = {};

  const test::Labels iface = {{"interface", veth.host()}};
  const auto tx0 = veth.tx();
  tracer->drain();
  const double p0 = test::counter_value(store, "ebpf_net_xmit_packets_total", iface);
  const double b0 = test::counter_value(store, "ebpf_net_xmit_bytes_total", iface);
  const std::uint64_t h0 = test::histogram_count(store, "ebpf_net_xmit_queue_latency_seconds", iface);
  for (int i = 0; i < kPackets; ++i) {
    REQUIRE(sendto(fd, payload, kPayload, 0, reinterpret_cast<sockaddr*>(&to), sizeof to) ==
            static_cast<ssize_t>(kPayload));
  }
  tracer->drain();
  const auto tx1 = veth.tx();
  close(fd);

  const double packets = test::counter_value(store, "ebpf_net_xmit_packets_total", iface) - p0;
  const double bytes = test::counter_value(store, "ebpf_net_xmit_bytes_total", iface) - b0;
  const std::uint64_t timed =
      test::histogram_count(store, "ebpf_net_xmit_queue_latency_seconds", iface) - h0;
  INFO("packets " << packets << " bytes " << bytes << " timed " << timed << " | /proc/net/dev tx "
                  << tx1.first - tx0.first << " packets " << tx1.second - tx0.second << " bytes");
  constexpr double kFrame = 14 + 20 + 8 + kPayload;  // Ethernet + IPv4 + UDP + payload
  CHECK(packets == kPackets);
  CHECK(bytes == kPackets * kFrame);
  CHECK(timed == static_cast<std::uint64_t>(kPackets));  // every one was queued and sent
  CHECK(static_cast<double>(tx1.first - tx0.first) == packets);
  CHECK(static_cast<double>(tx1.second - tx0.second) == bytes);
}

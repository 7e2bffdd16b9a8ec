#include <arpa/inet.h>

#include <catch2/catch.hpp>

#include "ebpf_metricsd/base/syscall_names.h"
#include "ebpf_metricsd/daemon/exposition.h"
#include "ebpf_metricsd/http/server.h"

using namespace ebpf_metricsd;

TEST_CASE("listen addresses resolve to the socket address to bind") {
  auto v4 = [](const std::string& a) {
    const sockaddr_storage ss = resolve_listen_address(a, true);
    REQUIRE(ss.ss_family == AF_INET);
    const auto* s4 = reinterpret_cast<const sockaddr_in*>(&ss);
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &s4->sin_addr, buf, sizeof buf);
    return std::string(buf) + ":" + std::to_string(ntohs(s4->sin_port));
  };
  CHECK(v4("127.0.0.1:9810") == "127.0.0.1:9810");
  CHECK(v4("localhost:1") == "127.0.0.1:1");
  // Every interface: dual-stack IPv6 where the kernel has it, else IPv4.
  CHECK(resolve_listen_address(":9810", true).ss_family == AF_INET6);
  CHECK(resolve_listen_address(":9810", false).ss_family == AF_INET);
  const sockaddr_storage v6 = resolve_listen_address("[::1]:9810", true);
  REQUIRE(v6.ss_family == AF_INET6);
  CHECK(IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&v6)->sin6_addr));
  CHECK(validate_listen_address("0.0.0.0:0").empty());
  CHECK_FALSE(validate_listen_address("9810").empty());
  CHECK_FALSE(validate_listen_address(":").empty());
  CHECK_FALSE(validate_listen_address("1.2.3:80").empty());
  CHECK_FALSE(validate_listen_address("[::1:80").empty());
  CHECK_THROWS_AS(resolve_listen_address("bad", true), std::invalid_argument);
}

TEST_CASE("html escaping of tracer errors on the landing page") {
  CHECK(html_escape("<a href=\"x\">&'") == "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
}

TEST_CASE("syscall names come from libseccomp") {
  const auto nr = syscall_number("getppid");
  REQUIRE(nr.has_value());
  CHECK(syscall_name(*nr) == "getppid");
  CHECK_FALSE(syscall_number("frobnicate").has_value());
  CHECK(syscall_name(100000) == "syscall_100000");
}

#include <catch2/catch.hpp>

#include "ebpf_metricsd/syscall_names.h"
#include "ebpf_metricsd/web.h"

using namespace ebpf_metricsd;

TEST_CASE("listen addresses map to civetweb's syntax") {
  CHECK(civetweb_listen_spec(":9810") == (web_server_has_ipv6() ? "+9810" : "0.0.0.0:9810"));
  CHECK(civetweb_listen_spec("127.0.0.1:9810") == "127.0.0.1:9810");
  CHECK(civetweb_listen_spec("localhost:1") == "127.0.0.1:1");
  if (web_server_has_ipv6()) {
    CHECK(civetweb_listen_spec("[::1]:9810") == "[::1]:9810");
  } else {
    CHECK_THAT(validate_listen_address("[::1]:9810"), Catch::Matchers::Contains("no IPv6"));
  }
  CHECK(validate_listen_address("0.0.0.0:0").empty());
  CHECK_FALSE(validate_listen_address("9810").empty());
  CHECK_FALSE(validate_listen_address(":").empty());
  CHECK_FALSE(validate_listen_address("1.2.3:80").empty());
  CHECK_THROWS_AS(civetweb_listen_spec("bad"), std::invalid_argument);
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

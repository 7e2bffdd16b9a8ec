#!/usr/bin/env bash
# Installs every Debian 12 package that building, running and testing ebpf-metricsd needs.
# Idempotent: packages already present are left alone. Run as root.
set -euo pipefail

BUILD_PKGS=(
  build-essential cmake pkg-config git
  clang llvm                         # BPF objects are compiled by clang -target bpf
  bpftool                            # vmlinux.h and skeleton generation at build time
  libbpf-dev libelf-dev zlib1g-dev
  libprotobuf-dev protobuf-compiler  # the protobuf exposition (proto/metrics.proto)
  libcrypt-dev                       # bcrypt for basic auth
  libdw-dev                          # profiles: ELF symbols and debug files (elfutils)
  libmicrohttpd-dev libgnutls28-dev    # the web server: HTTP on libmicrohttpd, TLS on GnuTLS
  libspdlog-dev libfmt-dev libyaml-cpp-dev libsystemd-dev libseccomp-dev
  nlohmann-json3-dev                 # JSON: the flame graph's data (and, in tests, Grafana's and Prometheus's)
  catch2                             # the tests
  python3                            # the kernel matrix's driver (tests/kernels/matrix.py)
)
TEST_PKGS=(
  prometheus                         # promtool check metrics, and the server for e2e tests
  bpftrace libbpf-tools              # independent oracles
  stress-ng fio iproute2 curl procps util-linux openssl wrk  # openssl: test certificates; wrk: bench/load_bench.sh
  systemd                            # systemd-analyze verify and security on the unit
  dpkg-dev file                      # cpack -G DEB with dpkg-shlibdeps
  qemu-system-x86 busybox-static cpio kmod e2fsprogs  # the kernel matrix: guests under qemu
  golang-go linux-perf chromium     # profiles: go tool pprof reads them, perf agrees, the page in a browser
  python3-websocket                  # the page driven key by key over the DevTools protocol
  libc6-dbg                          # profiles: the C library's debug file, found by build ID
  libclang-rt-14-dev                 # tests/fuzz.sh: libFuzzer
  clang-format clang-tidy            # tests/hygiene.sh
)

want=("${BUILD_PKGS[@]}")
if [[ "${1:-}" == "--with-tests" ]]; then
  want+=("${TEST_PKGS[@]}")
fi

missing=()
for p in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

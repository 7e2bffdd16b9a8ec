// Scrape cost of /metrics by the number of series: a store filled like a busy host's
// (histograms with the default 25 classic buckets, and counters), served by the daemon's own
// web server and routes on a local port, scraped over one kept-alive connection as
// Prometheus does. Prints p50/p99 per format (text, protobuf; plain and gzip) at each size.
// "Series" counts what a classic Prometheus stores (text samples: each histogram is 28 of
// them); a Prometheus with native histograms stores one per histogram.
//   ./build/bench/exposition_bench [scrapes per case]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ebpf_metricsd/daemon/exposition.h"
#include "ebpf_metricsd/http/server.h"
#include "ebpf_metricsd/metrics/metric_store.h"

using namespace ebpf_metricsd;
using Clock = std::chrono::steady_clock;

namespace {

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// One kept-alive HTTP/1.1 connection; get() returns the body size (0 on any failure).
class Client {
 public:
  explicit Client(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) std::perror("connect");
    const int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~Client() { close(fd_); }

  std::size_t get(const std::string& headers) {
    const std::string req = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers + "\r\n";
    if (send(fd_, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size()))
      return 0;
    std::string buf;
    std::size_t head_end = std::string::npos;
    char chunk[65536];
    while (head_end == std::string::npos) {
      const ssize_t n = recv(fd_, chunk, sizeof chunk, 0);
      if (n <= 0) return 0;
      buf.append(chunk, static_cast<std::size_t>(n));
      head_end = buf.find("\r\n\r\n");
    }
    const auto cl = buf.find("Content-Length: ");
    if (cl == std::string::npos || buf.compare(9, 3, "200") != 0) return 0;
    const std::size_t length = std::stoul(buf.substr(cl + 16));
    std::size_t have = buf.size() - head_end - 4;
    while (have < length) {
      const ssize_t n = recv(fd_, chunk, sizeof chunk, 0);
      if (n <= 0) return 0;
      have += static_cast<std::size_t>(n);
    }
    return length;
  }

 private:
  int fd_;
};

// Histograms with values spread over ~12 slots, and counters: `series` text samples.
void fill(MetricStore& store, std::size_t series) {
  const auto hist = store.declare({"bench_latency_seconds",
                                   "Latency.",
                                   MetricType::Histogram,
                                   {"syscall", "cgroup"},
                                   Log2Layout::seconds(-20, 4)});
  const auto counter =
      store.declare({"bench_events_total", "Events.", MetricType::Counter, {"device", "op"}});
  std::mt19937_64 rng(1);
  const std::size_t histograms = series * 3 / 4 / 28;  // three quarters in histograms
  std::vector<std::uint64_t> slots(Log2Layout::kSlots);
  for (std::size_t i = 0; i < histograms; ++i) {
    for (std::size_t k = 0; k < slots.size(); ++k)
      slots[k] = (k >= 8 && k < 20) ? rng() % 100000 : 0;
    store.add_slots(
        hist, {"syscall_" + std::to_string(i % 400), "unit" + std::to_string(i / 400) + ".service"},
        slots, rng() % 1000000000000ULL);
  }
  for (std::size_t i = 0; i + histograms * 28 < series; ++i) {
    store.add(counter, {"dev" + std::to_string(i / 5), std::to_string(i % 5)}, rng() % 1000000);
  }
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  const int scrapes = argc > 1 ? std::atoi(argv[1]) : 300;
  std::printf("%-7s %-9s %-5s %9s %8s %9s %9s\n", "series", "format", "gzip", "native", "bytes",
              "p50 ms", "p99 ms");
  for (const std::size_t series : {2000, 10000}) {
    MetricStore store;
    store.set_series_limit(0);
    fill(store, series);
    const int port = free_port();
    WebSettings settings;
    settings.listen_address = "127.0.0.1:" + std::to_string(port);
    WebServer server(settings,
                     exporter_routes([&store](ExpositionFormat f) { return render(store, f); },
                                     [] { return std::string(); }));
    const std::size_t native_series = store.series_count();
    struct Case {
      const char* format;
      bool gzip;
      std::string headers;
    };
    const std::string proto =
        "Accept: application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
        "encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3\r\n";
    const Case cases[] = {{"text", false, ""},
                          {"text", true, "Accept-Encoding: gzip\r\n"},
                          {"protobuf", false, proto},
                          {"protobuf", true, proto + "Accept-Encoding: gzip\r\n"}};
    for (const auto& c : cases) {
      Client client(port);
      std::vector<double> ms;
      std::size_t bytes = 0;
      for (int i = 0; i < scrapes + 10; ++i) {
        const auto t0 = Clock::now();
        bytes = client.get(c.headers);
        const double took = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        if (bytes == 0) {
          std::fprintf(stderr, "scrape failed\n");
          return 1;
        }
        if (i >= 10) ms.push_back(took);  // the first ones warm up
      }
      std::printf("%-7zu %-9s %-5s %9zu %8zu %9.2f %9.2f\n", series, c.format,
                  c.gzip ? "yes" : "no", native_series, bytes, percentile(ms, 0.5),
                  percentile(ms, 0.99));
    }
  }
}

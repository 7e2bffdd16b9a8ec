#pragma once

#include <pthread.h>

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "ebpf_metricsd/metrics/log2_histogram.h"

namespace ebpf_metricsd {

enum class MetricType { Counter, Gauge, Histogram };

// A metric declared as data: the shared drain code and the store do the rest.
struct MetricSpec {
  std::string name;
  std::string help;
  MetricType type = MetricType::Counter;
  std::vector<std::string> labels;
  Log2Layout buckets{};         // histograms
  double units_per_base = 1.0;  // counters: raw units per exported unit
};

// Sees every exported series of a store, family by family, in declaration order; the
// series of a family in the order of their label values. Families without series are left
// out. Serializers (exposition_format.h) are visitors.
class MetricVisitor {
 public:
  virtual ~MetricVisitor() = default;
  virtual void family(const MetricSpec& spec) = 0;
  virtual void counter(const std::vector<std::string>& labels, double value) = 0;
  virtual void gauge(const std::vector<std::string>& labels, double value) = 0;
  virtual void histogram(const std::vector<std::string>& labels,
                         const Log2HistogramState& state) = 0;
};

// A read-write lock that lets no new reader in while a writer waits. glibc's default (and so
// std::shared_mutex) prefers readers: with scrapes rendering back to back there is nearly
// always one holding the lock, and the drain's updates would wait indefinitely.
class WriterPreferringLock {
 public:
  WriterPreferringLock();
  ~WriterPreferringLock();
  WriterPreferringLock(const WriterPreferringLock&) = delete;
  WriterPreferringLock& operator=(const WriterPreferringLock&) = delete;
  void lock() { pthread_rwlock_wrlock(&lock_); }
  void unlock() { pthread_rwlock_unlock(&lock_); }
  void lock_shared() { pthread_rwlock_rdlock(&lock_); }
  void unlock_shared() { pthread_rwlock_unlock(&lock_); }

 private:
  pthread_rwlock_t lock_;
};

// All series the daemon exports, kept as exact integers until they are serialized.
// Counters and histograms only ever grow; the drain adds deltas to them.
class MetricStore {
 public:
  MetricStore();
  using MetricId = std::size_t;
  using LabelValues = std::vector<std::string>;

  // Declares a metric owned by `owner` (a tracer's name, or "core"); declaring the same
  // spec again returns the same id and keeps its series. Throws std::invalid_argument for an
  // invalid name or a conflicting redeclaration, unless the metric has no owner left
  // (release_owner), in which case the new spec replaces it.
  MetricId declare(const MetricSpec& spec, const std::string& owner = "core");

  // The owner gives up its metrics; their series stay until drop_unowned(), so a restarted
  // owner that declares them again carries on counting.
  void release_owner(const std::string& owner);
  // Deletes the series of metrics nobody owns any more.
  void drop_unowned();
  // Deletes every series whose label `label` has `value` (e.g. tracer="kmalloc"), in all
  // metrics or only in `id`.
  void erase_series_with(const std::string& label, const std::string& value);
  void erase_series_with(MetricId id, const std::string& label, const std::string& value);

  // At most this many series per metric (0 = no limit). A new label set past it is not
  // created; ebpf_metricsd_series_limited_total{metric} counts each value refused.
  void set_series_limit(std::size_t max_series);

  void add(MetricId id, const LabelValues& labels, std::uint64_t delta);
  void set(MetricId id, const LabelValues& labels, double value);
  // Adds per-slot deltas of a kernel log2 histogram and the raw sum delta.
  void add_slots(MetricId id, const LabelValues& labels, std::span<const std::uint64_t> slots,
                 std::uint64_t sum_delta);

  // Makes `exemplar` the latest of slot `slot` of a histogram series that exists (labels
  // over the OpenMetrics limit of 128 characters are cut from the last).
  void set_exemplar(MetricId id, const LabelValues& labels, std::size_t slot, Exemplar exemplar);

  // Visits every series; scrapes visit at once, updates wait until they are done.
  void visit(MetricVisitor& visitor) const;

  std::size_t series_count() const;

 private:
  using Series = std::variant<std::uint64_t, double, Log2HistogramState>;
  struct Metric {
    MetricSpec spec;
    std::map<LabelValues, Series> series;
    std::set<std::string> owners;
    bool limited = true;  // subject to the series limit
  };
  MetricId declare_locked(const MetricSpec& spec, bool limited, const std::string& owner);
  // nullptr when the label set is new and the metric is at its limit (counted).
  Series* series_for(Metric& m, const LabelValues& labels);

  mutable WriterPreferringLock mutex_;
  std::vector<Metric> metrics_;
  std::size_t series_limit_ = 0;
  MetricId limited_metric_ = 0;
};

// Replaces bytes that are not valid UTF-8 with U+FFFD, so label values taken from the
// kernel (a comm cut mid-character, a device name) always serialize validly.
std::string sanitize_utf8(std::string_view in);

}  // namespace ebpf_metricsd

#include "ebpf_metricsd/metrics/metric_store.h"

#include <algorithm>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>
#include <utility>

namespace ebpf_metricsd {

namespace {

// Prometheus' metric and label name syntax; label names starting "__" are reserved.
bool valid_name(const std::string& name, bool metric) {
  if (name.empty()) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                    (metric && c == ':') || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return metric || name.rfind("__", 0) != 0;
}

}  // namespace

WriterPreferringLock::WriterPreferringLock() {
  pthread_rwlockattr_t attr;
  pthread_rwlockattr_init(&attr);
  pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(&lock_, &attr);
  pthread_rwlockattr_destroy(&attr);
}

WriterPreferringLock::~WriterPreferringLock() { pthread_rwlock_destroy(&lock_); }

MetricStore::MetricStore() {
  limited_metric_ = declare_locked({"ebpf_metricsd_series_limited_total",
                                    "Label sets not created because their metric had reached "
                                    "the max_series limit; each refused update counts.",
                                    MetricType::Counter,
                                    {"metric"}},
                                   /*limited=*/false, "core");
}

MetricStore::MetricId MetricStore::declare(const MetricSpec& spec, const std::string& owner) {
  std::unique_lock lock(mutex_);
  return declare_locked(spec, true, owner);
}

MetricStore::MetricId MetricStore::declare_locked(const MetricSpec& spec, bool limited,
                                                  const std::string& owner) {
  if (!valid_name(spec.name, true)) {
    throw std::invalid_argument("invalid metric name: " + spec.name);
  }
  for (const auto& l : spec.labels) {
    if (!valid_name(l, false) || l == "le") {
      throw std::invalid_argument("invalid label name '" + l + "' on " + spec.name);
    }
  }
  if (spec.type == MetricType::Histogram &&
      (spec.buckets.max_exp < spec.buckets.min_exp || spec.buckets.units_per_base <= 0 ||
       spec.buckets.min_exp <= spec.buckets.zero_exp ||
       spec.buckets.max_exp >= spec.buckets.zero_exp + static_cast<int>(Log2Layout::kSlots))) {
    throw std::invalid_argument("invalid bucket layout on " + spec.name);
  }
  for (std::size_t i = 0; i < metrics_.size(); ++i) {
    Metric& m = metrics_[i];
    if (m.spec.name != spec.name) continue;
    const bool same = m.spec.type == spec.type && m.spec.labels == spec.labels &&
                      m.spec.help == spec.help && m.spec.buckets == spec.buckets &&
                      m.spec.units_per_base == spec.units_per_base;
    if (!same) {
      if (!m.owners.empty()) {
        throw std::invalid_argument("metric " + spec.name + " declared twice, differently");
      }
      m.spec = spec;  // released by its owner, now declared anew
      m.series.clear();
    }
    m.owners.insert(owner);
    return i;
  }
  metrics_.push_back(Metric{spec, {}, {owner}, limited});
  return metrics_.size() - 1;
}

void MetricStore::release_owner(const std::string& owner) {
  std::unique_lock lock(mutex_);
  for (auto& m : metrics_) m.owners.erase(owner);
}

void MetricStore::drop_unowned() {
  std::unique_lock lock(mutex_);
  for (auto& m : metrics_) {
    if (m.owners.empty()) m.series.clear();
  }
}

namespace {
template <typename M>
void erase_in(M& m, const std::string& label, const std::string& value) {
  const auto it = std::find(m.spec.labels.begin(), m.spec.labels.end(), label);
  if (it == m.spec.labels.end()) return;
  const auto pos = static_cast<std::size_t>(it - m.spec.labels.begin());
  std::erase_if(m.series, [&](const auto& kv) { return kv.first[pos] == value; });
}
}  // namespace

void MetricStore::erase_series_with(const std::string& label, const std::string& value) {
  std::unique_lock lock(mutex_);
  for (auto& m : metrics_) erase_in(m, label, value);
}

void MetricStore::erase_series_with(MetricId id, const std::string& label,
                                    const std::string& value) {
  std::unique_lock lock(mutex_);
  erase_in(metrics_.at(id), label, value);
}

void MetricStore::set_series_limit(std::size_t max_series) {
  std::unique_lock lock(mutex_);
  series_limit_ = max_series;
}

MetricStore::Series* MetricStore::series_for(Metric& m, const LabelValues& labels) {
  if (labels.size() != m.spec.labels.size()) {
    throw std::invalid_argument("wrong number of label values for " + m.spec.name);
  }
  auto it = m.series.find(labels);
  if (it != m.series.end()) return &it->second;
  LabelValues clean;
  clean.reserve(labels.size());
  for (const auto& v : labels) clean.push_back(sanitize_utf8(v));
  it = m.series.find(clean);
  if (it != m.series.end()) return &it->second;
  if (m.limited && series_limit_ != 0 && m.series.size() >= series_limit_) {
    Metric& limited = metrics_[limited_metric_];
    ++std::get<std::uint64_t>(limited.series[{m.spec.name}]);
    return nullptr;
  }
  Series fresh;
  switch (m.spec.type) {
    case MetricType::Counter:
      fresh = std::uint64_t{0};
      break;
    case MetricType::Gauge:
      fresh = 0.0;
      break;
    case MetricType::Histogram: {
      Log2HistogramState h;
      h.slots.assign(Log2Layout::kSlots, 0);
      fresh = std::move(h);
      break;
    }
  }
  return &m.series.emplace(std::move(clean), std::move(fresh)).first->second;
}

void MetricStore::add(MetricId id, const LabelValues& labels, std::uint64_t delta) {
  std::unique_lock lock(mutex_);
  Metric& m = metrics_.at(id);
  if (m.spec.type != MetricType::Counter) throw std::logic_error(m.spec.name + " is no counter");
  if (Series* s = series_for(m, labels)) std::get<std::uint64_t>(*s) += delta;
}

void MetricStore::set(MetricId id, const LabelValues& labels, double value) {
  std::unique_lock lock(mutex_);
  Metric& m = metrics_.at(id);
  if (m.spec.type != MetricType::Gauge) throw std::logic_error(m.spec.name + " is no gauge");
  if (Series* s = series_for(m, labels)) std::get<double>(*s) = value;
}

void MetricStore::add_slots(MetricId id, const LabelValues& labels,
                            std::span<const std::uint64_t> slots, std::uint64_t sum_delta) {
  std::unique_lock lock(mutex_);
  Metric& m = metrics_.at(id);
  if (m.spec.type != MetricType::Histogram) {
    throw std::logic_error(m.spec.name + " is no histogram");
  }
  Series* s = series_for(m, labels);
  if (!s) return;
  if (slots.size() > Log2Layout::kSlots) {
    throw std::logic_error(m.spec.name + ": more kernel slots than the layout has");
  }
  auto& h = std::get<Log2HistogramState>(*s);
  for (std::size_t k = 0; k < slots.size(); ++k) h.slots[k] += slots[k];
  h.sum_raw += sum_delta;
}

void MetricStore::set_exemplar(MetricId id, const LabelValues& labels, std::size_t slot,
                               Exemplar exemplar) {
  if (slot >= Log2Layout::kSlots) throw std::logic_error("exemplar slot out of range");
  std::size_t chars = 0;
  std::size_t keep = 0;
  for (auto& [name, value] : exemplar.labels) {
    value = sanitize_utf8(value);
    if (chars + name.size() + value.size() > Exemplar::kMaxExemplarLabelChars) break;
    chars += name.size() + value.size();
    ++keep;
  }
  exemplar.labels.resize(keep);
  std::unique_lock lock(mutex_);
  Metric& m = metrics_.at(id);
  if (m.spec.type != MetricType::Histogram) {
    throw std::logic_error(m.spec.name + " is no histogram");
  }
  // Only a series that exists: an exemplar never makes one (its event is counted first).
  auto it = m.series.find(labels);
  if (it == m.series.end()) {
    LabelValues clean;
    for (const auto& v : labels) clean.push_back(sanitize_utf8(v));
    it = m.series.find(clean);
  }
  if (it != m.series.end()) {
    std::get<Log2HistogramState>(it->second).exemplars[slot] = std::move(exemplar);
  }
}

std::size_t MetricStore::series_count() const {
  std::shared_lock lock(mutex_);
  std::size_t n = 0;
  for (const auto& m : metrics_) n += m.series.size();
  return n;
}

void MetricStore::visit(MetricVisitor& visitor) const {
  std::shared_lock lock(mutex_);
  for (const auto& m : metrics_) {
    if (m.series.empty()) continue;
    visitor.family(m.spec);
    for (const auto& [labels, series] : m.series) {
      if (const auto* c = std::get_if<std::uint64_t>(&series)) {
        visitor.counter(labels, static_cast<double>(*c) / m.spec.units_per_base);
      } else if (const auto* g = std::get_if<double>(&series)) {
        visitor.gauge(labels, *g);
      } else {
        visitor.histogram(labels, std::get<Log2HistogramState>(series));
      }
    }
  }
}

std::string sanitize_utf8(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  const auto* s = reinterpret_cast<const unsigned char*>(in.data());
  const std::size_t n = in.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    std::size_t len = 0;
    std::uint32_t cp = 0;
    if (c < 0x80) {
      len = 1;
      cp = c;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    }
    bool ok = len > 0 && i + len <= n;
    for (std::size_t k = 1; ok && k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80)
        ok = false;
      else
        cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    // Reject overlong forms, surrogates and code points past U+10FFFF.
    static const std::uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (ok && (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))) ok = false;
    if (ok) {
      out.append(in.substr(i, len));
      i += len;
    } else {
      out.append("\xEF\xBF\xBD");
      ++i;
    }
  }
  return out;
}

}  // namespace ebpf_metricsd

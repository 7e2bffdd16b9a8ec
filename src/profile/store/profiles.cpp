#include "ebpf_metricsd/profile/profiles.h"

#include <utility>

namespace ebpf_metricsd::profiling {

void Profiles::set_source(std::function<void()> cut) {
  std::lock_guard lock(source_mutex_);
  running_ = static_cast<bool>(cut);
  source_ = std::move(cut);
}

bool Profiles::cut() {
  std::lock_guard lock(source_mutex_);
  if (!source_) return false;
  source_();
  return true;
}

}  // namespace ebpf_metricsd::profiling

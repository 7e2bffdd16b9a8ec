#pragma once

#include <optional>
#include <string>

namespace ebpf_metricsd {

// `in` as a gzip stream (RFC 1952) at zlib level `level`; nullopt when zlib fails.
std::optional<std::string> gzip(const std::string& in, int level);

}  // namespace ebpf_metricsd

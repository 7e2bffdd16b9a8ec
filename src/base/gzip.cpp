#include "ebpf_metricsd/base/gzip.h"

#include <zlib.h>

namespace ebpf_metricsd {

std::optional<std::string> gzip(const std::string& in, int level) {
  z_stream zs{};
  if (deflateInit2(&zs, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    return std::nullopt;
  }
  std::string out(deflateBound(&zs, in.size()), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  const int r = deflate(&zs, Z_FINISH);
  deflateEnd(&zs);
  if (r != Z_STREAM_END) return std::nullopt;
  out.resize(zs.total_out);
  return out;
}

}  // namespace ebpf_metricsd

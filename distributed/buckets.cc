// Bucket assignment (see buckets.h).
#include "distributed/buckets.h"

#include <cstdint>
#include <map>
#include <utility>

namespace ampgrad::distributed {

std::vector<std::vector<size_t>> assign_buckets(const std::vector<BucketParam>& params, int64_t first_cap_bytes,
                                                int64_t cap_bytes) {
  struct Open {
    size_t bucket;  // index into `buckets`
    int64_t bytes = 0;
    bool first = true;  // the kind's first bucket, with the smaller cap
  };
  std::vector<std::vector<size_t>> buckets;
  std::map<std::pair<DType, Device>, Open> open;  // per (dtype, device): the bucket being filled
  for (size_t k = params.size(); k-- > 0;) {
    const BucketParam& p = params[k];
    const auto key = std::make_pair(p.dtype, p.device);
    auto it = open.find(key);
    if (it == open.end() || it->second.bucket == SIZE_MAX) {
      const bool first = it == open.end();
      buckets.emplace_back();
      it = open.insert_or_assign(key, Open{.bucket = buckets.size() - 1, .bytes = 0, .first = first}).first;
    }
    Open& o = it->second;
    buckets[o.bucket].push_back(k);
    o.bytes += p.bytes;
    if (o.bytes >= (o.first ? first_cap_bytes : cap_bytes)) o.bucket = SIZE_MAX;  // closed
  }
  return buckets;
}

}  // namespace ampgrad::distributed

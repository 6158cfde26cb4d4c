// Autocast: per-thread state, the cast policies, and the cast cache for FP32 leaves.
#include "framework/autocast.h"

#include <array>
#include <functional>
#include <unordered_map>
#include <vector>

#include "framework/autograd.h"
#include "framework/error.h"
#include "framework/tensor_impl.h"

namespace ampgrad::autocast {

namespace {

struct CacheEntry {
  Tensor source;     // keeps the leaf alive, so its address cannot be reused by another tensor
  // The storage the copy was made from: set_data swaps a leaf's storage, and the new storage's
  // version counter may equal the old one's, so the version alone cannot tell. Holding it also
  // keeps its address from being reused.
  std::shared_ptr<Storage> storage;
  uint64_t version;  // the source's storage version when the copy was made
  Tensor copy;
};

// A cached copy is keyed by its source and its dtype: nested guards of different dtypes (float16
// inside bfloat16) keep one copy of each, and a lookup can only find a copy of the dtype asked for.
struct CacheKey {
  const TensorImpl* source;
  DType dtype;
  bool operator==(const CacheKey&) const = default;
};
struct CacheKeyHash {
  size_t operator()(const CacheKey& key) const {
    return std::hash<const TensorImpl*>()(key.source) ^ static_cast<size_t>(key.dtype);
  }
};

using Cache = std::unordered_map<CacheKey, CacheEntry, CacheKeyHash>;

struct ThreadState {
  std::array<State, kNumDevices> per_device;
  size_t depth = 0;
  Cache cache;
  std::vector<Cache> outer_caches;  // set aside by IsolatedCastCache, innermost last
};

thread_local ThreadState tls;

// The autocast copy of `t` in `dtype`. FP32 leaves that require grad (parameters) are cast once
// per region and reused; a cached copy is used only if the leaf has not changed since (version)
// and, when recording, only if the copy carries grad history (a copy made under NoGradGuard has none).
Tensor cached_cast(const Tensor& t, DType dtype) {
  const bool cacheable = tls.depth > 0 && t.is_leaf() && t.requires_grad() && t.dtype() == DType::kFloat32;
  if (!cacheable) return t.to(dtype);
  const CacheKey key{t.impl(), dtype};
  auto it = tls.cache.find(key);
  if (it != tls.cache.end()) {
    const CacheEntry& entry = it->second;
    const bool fresh = entry.storage == t.impl()->storage && entry.version == t.version();
    const bool has_history = entry.copy.grad_fn() != nullptr || !GradMode::is_enabled();
    if (fresh && has_history) return entry.copy;
  }
  Tensor copy = t.to(dtype);
  tls.cache.insert_or_assign(key, CacheEntry{t, t.impl()->storage, t.version(), copy});
  return copy;
}

}  // namespace

State state(Device device) { return tls.per_device[device_index(device)]; }
void set_state(Device device, State state) { tls.per_device[device_index(device)] = state; }

void enter_region() { ++tls.depth; }
void exit_region() {
  AG_CHECK(tls.depth > 0, "internal: autocast region exited more often than entered");
  if (--tls.depth == 0) tls.cache.clear();
}
size_t cache_size() { return tls.cache.size(); }

IsolatedCastCache::IsolatedCastCache() {
  tls.outer_caches.push_back(std::move(tls.cache));
  tls.cache = Cache{};
}
IsolatedCastCache::~IsolatedCastCache() {
  tls.cache = std::move(tls.outer_caches.back());
  tls.outer_caches.pop_back();
}

DType float32_result_dtype(const Tensor& input) {
  return is_low_precision(input.dtype()) && state(input.device()).enabled ? DType::kFloat32 : input.dtype();
}

void cast_inputs(const OpInfo& info, std::span<Tensor> inputs) {
  const Tensor* first = nullptr;
  for (const Tensor& t : inputs) {
    if (t.defined()) {
      first = &t;
      break;
    }
  }
  if (first == nullptr || info.cast_policy == CastPolicy::kNone || info.cast_policy == CastPolicy::kFloat32InKernel) {
    return;
  }

  if (info.cast_policy == CastPolicy::kPromote) {
    DType widest = first->dtype();
    for (const Tensor& t : inputs) {
      if (t.defined()) widest = promote_types(widest, t.dtype());
    }
    for (Tensor& t : inputs) {
      if (t.defined() && t.dtype() != widest) t = t.to(widest);
    }
    return;
  }

  const State s = state(first->device());
  if (!s.enabled) return;
  for (Tensor& t : inputs) {
    // float64 and integer tensors are never autocast (as in PyTorch); a device mismatch is left for
    // the op's check to report.
    const bool eligible = t.defined() && dtype_info(t.dtype()).is_floating && t.dtype() != DType::kFloat64;
    if (!eligible || t.device() != first->device()) continue;
    if (info.cast_policy == CastPolicy::kLowerPrecision && t.dtype() != s.dtype) {
      t = cached_cast(t, s.dtype);
    } else if (info.cast_policy == CastPolicy::kFloat32 && is_low_precision(t.dtype())) {
      t = t.to(DType::kFloat32);
    }
  }
}

}  // namespace ampgrad::autocast

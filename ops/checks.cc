// Shared input checks for ops.
#include "ops/checks.h"

namespace ampgrad::ops {

std::string describe(std::initializer_list<std::pair<const char*, const Tensor*>> named) {
  std::string text;
  for (const auto& [name, tensor] : named) {
    if (!text.empty()) text += ", ";
    text += std::string(name) + ": " + tensor->to_string();
  }
  return text;
}

void check_same_device(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> named) {
  const Tensor* first = nullptr;
  for (const auto& [name, tensor] : named) {
    AG_CHECK(tensor->defined(), op, ": input ", name, " is undefined (", describe(named), ")");
    if (first == nullptr) first = tensor;
    AG_CHECK(tensor->device() == first->device(), op, ": inputs are on different devices (", describe(named),
             "); hint: move them to one device with .to(Device::...) or model.to(...)");
  }
}

void check_same_dtype(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> named) {
  const Tensor* first = nullptr;
  for (const auto& [name, tensor] : named) {
    if (!tensor->defined()) continue;
    if (first == nullptr) first = tensor;
    AG_CHECK(tensor->dtype() == first->dtype(), op, ": inputs have different dtypes (", describe(named),
             "); hint: cast with .to(DType::...), or run the op under amp::AutocastGuard");
  }
}

void check_rank(const char* op, const char* name, const Tensor& t, int64_t rank) {
  AG_CHECK(t.defined(), op, ": input ", name, " is undefined");
  AG_CHECK(t.dim() == rank, op, ": ", name, " must have ", rank, " dimensions, got ", t.to_string());
}

}  // namespace ampgrad::ops

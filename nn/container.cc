// ModuleList indexing and Sequential's forward.
#include "nn/container.h"

namespace ampgrad::nn {

std::shared_ptr<Module> ModuleList::ptr(size_t index) const {
  const Named<std::shared_ptr<Module>>& children = named_children();
  AG_CHECK(index < children.size(), type_name(), "[", index, "]: out of range for ", children.size(), " modules");
  return children[index].second;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (const auto& [name, module] : named_children()) h = (*module)(h);  // with its forward hooks
  return h;
}

}  // namespace ampgrad::nn

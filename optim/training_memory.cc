#include "optim/training_memory.h"

#include <cstdio>
#include <unordered_set>

#include "framework/allocator.h"
#include "framework/dtype.h"
#include "framework/tensor_impl.h"

namespace ampgrad::optim {
namespace {

// Adds the bytes of a tensor's allocation to `total` once per allocation (a flat buffer and the
// tensors that alias into it count once), and only for tensors on the device counted.
class StorageCounter {
 public:
  explicit StorageCounter(Device device) : device_(device) {}
  void add(const Tensor& t, int64_t& total) {
    if (!t.defined() || t.device() != device_ || t.numel() == 0) return;
    const Storage& allocation = allocation_of(t);
    if (!seen_.insert(&allocation).second) return;
    total += static_cast<int64_t>(allocation.nbytes);
  }

 private:
  Device device_;
  std::unordered_set<const Storage*> seen_;
};

}  // namespace

std::string TrainingMemory::to_string() const {
  const auto field = [&](const char* name, int64_t bytes) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s %.1f MiB (%.2f B/param)", name, static_cast<double>(bytes) / (1 << 20),
                  per_parameter(bytes));
    return std::string(buf);
  };
  return field("params", parameters) + ", " + field("grads", gradients) + ", " + field("masters", masters) + ", " +
         field("optimizer", optimizer_state) + ", " + field("state", training_state()) + ", " +
         field("activations", activations) + ", " + field("peak", peak);
}

TrainingMemory training_state_bytes(const std::vector<Tensor>& model_parameters, const Optimizer& optimizer,
                                    Device device) {
  TrainingMemory m;
  StorageCounter counter(device);
  // Parameters first, so a float32 parameter that the state lists as its own master counts as a parameter.
  for (const Tensor& p : model_parameters) {
    counter.add(p, m.parameters);
    if (p.device() == device) m.num_parameters += p.numel();
  }
  for (const Tensor& p : optimizer.parameters()) counter.add(p, m.parameters);
  for (const std::vector<Tensor>* list : {&model_parameters, &optimizer.parameters()}) {
    for (const Tensor& p : *list) {
      counter.add(p.grad(), m.gradients);
      if (p.master().defined()) counter.add(p.master().grad(), m.gradients);
    }
  }
  for (const ParamState& s : optimizer.state()) {
    for (const auto& [key, t] : s.tensors) counter.add(t, key == "master" ? m.masters : m.optimizer_state);
  }
  for (const Tensor& p : optimizer.parameters()) counter.add(p.master(), m.masters);  // a master not in state()
  return m;
}

MemoryMeter::MemoryMeter(Device device) : device_(device) {
  Allocator& allocator = allocator_for(device);
  peak_before_ = allocator.stats().peak_bytes;
  allocator.reset_peak();
  held_at_start_ = allocator.stats().current_bytes;
}

// raise_peak keeps the larger of the two, so a read() before this changes nothing here.
MemoryMeter::~MemoryMeter() { allocator_for(device_).raise_peak(peak_before_); }

void MemoryMeter::forward_done() { activations_ = memory_stats(device_).current_bytes - held_at_start_; }

TrainingMemory MemoryMeter::read(const std::vector<Tensor>& model_parameters, const Optimizer& optimizer) {
  TrainingMemory m = training_state_bytes(model_parameters, optimizer, device_);
  m.activations = activations_;
  m.peak = memory_stats(device_).peak_bytes;
  allocator_for(device_).raise_peak(peak_before_);
  return m;
}

}  // namespace ampgrad::optim

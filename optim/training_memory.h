// Where a training step's memory goes: the bytes of training state per kind (parameters,
// gradients, FP32 masters, optimizer state), the activations the forward pass keeps for the
// backward, and the step's peak, on one device. These are what decide how large a model fits, and
// what mixed precision, stochastic rounding and ZeRO each cut.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "framework/device.h"
#include "framework/tensor.h"
#include "optim/optimizer.h"

namespace ampgrad::optim {

/// The bytes of a training step on one device, by what holds them (see MemoryMeter). A storage
/// shared by several tensors (a float32 parameter that is its own master) counts once.
struct TrainingMemory {
  int64_t parameters = 0;  ///< the model's parameters, and any the optimizer steps in their place (ZeRO's shards)
  /// Their gradients, and FP32 gradients GradScaler::unscale_ put on masters where they still are
  /// (the step drops those: read after it, they show in the peak only).
  int64_t gradients = 0;
  int64_t masters = 0;  ///< FP32 master copies of 16-bit parameters
  int64_t optimizer_state = 0;  ///< moments and momentum buffers
  /// What the forward pass left held for the backward: the device's bytes when the loss was
  /// computed beyond those held before the forward (saved activations, the logits, the loss).
  int64_t activations = 0;
  /// The most the device held at once during the step (memory_stats' peak over it).
  int64_t peak = 0;
  /// The number of elements of the model's parameters: what "per parameter" divides by.
  int64_t num_parameters = 0;

  /// parameters + gradients + masters + optimizer_state.
  int64_t training_state() const { return parameters + gradients + masters + optimizer_state; }
  /// `bytes` per element of the model's parameters (0 when there are none).
  double per_parameter(int64_t bytes) const {
    return num_parameters > 0 ? static_cast<double>(bytes) / static_cast<double>(num_parameters) : 0.0;
  }
  /// One line: each kind in MiB and in bytes per parameter, e.g. "params 1.6 MiB (2.0 B/param), ...".
  std::string to_string() const;
};

/// Counts the training state on `device`: the model's parameters and their gradients, and what
/// `optimizer` holds (its own parameters where they are not the model's, their gradients, and
/// its state()). Activations and peak are left 0 (MemoryMeter measures them).
TrainingMemory training_state_bytes(const std::vector<Tensor>& model_parameters, const Optimizer& optimizer,
                                    Device device);

/// Measures one training step's memory on a device:
///
///     optimizer.zero_grad();
///     optim::MemoryMeter meter(Device::kCPU);   // after zero_grad, before the forward pass
///     Tensor loss = loss_of(model(x), y);
///     meter.forward_done();                     // the activations kept for the backward
///     loss.backward();
///     optimizer.step();
///     optim::TrainingMemory m = meter.read(model.parameters(), optimizer);
///
/// The figures come from the device's allocator (memory_stats), so they include everything the
/// process allocates there, as PyTorch's torch.cuda.max_memory_allocated does; meter one step at
/// a time. The meter starts the device's peak over (process-wide) and read() raises it back to
/// the peak before, so memory_stats' peak reads as if it had not been reset.
class MemoryMeter {
 public:
  /// Starts the device's peak over and records what is held now (and the peak so far).
  explicit MemoryMeter(Device device);
  /// Gives the device its earlier peak back if read() did not (a step that threw, say), so that
  /// memory_stats' peak never loses a high-water mark it had.
  ~MemoryMeter();
  MemoryMeter(const MemoryMeter&) = delete;
  MemoryMeter& operator=(const MemoryMeter&) = delete;
  /// Records the activations: call right after the loss is computed, before backward().
  void forward_done();
  /// The step's breakdown: training_state_bytes, with the activations (0 if forward_done was not
  /// called) and the peak since construction; then gives the device its earlier peak back.
  TrainingMemory read(const std::vector<Tensor>& model_parameters, const Optimizer& optimizer);

 private:
  Device device_;
  int64_t held_at_start_ = 0;
  int64_t peak_before_ = 0;
  int64_t activations_ = 0;
};

}  // namespace ampgrad::optim

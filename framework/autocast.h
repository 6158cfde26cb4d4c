// Autocast state and cast policies, read by the op dispatcher before anything is recorded.
// The user-facing guard is amp::AutocastGuard; this is the machinery under it.
#pragma once

#include <cstdint>
#include <span>

#include "framework/tensor.h"

namespace ampgrad {

/// How autocast treats an op's floating-point inputs (each op states one in its declaration).
enum class CastPolicy : uint8_t {
  kNone,            // run in the inputs' dtype (relu, cast)
  kLowerPrecision,  // under autocast: cast to the autocast dtype (linear, matmul)
  kFloat32,         // under autocast: cast lower-precision inputs to float32 (losses, reductions)
  kPromote,         // always: cast every input to the widest input dtype (add, sub, mul)
  kFloat32InKernel, // under autocast: as kFloat32, but the kernel reads FP16/BF16 inputs as they
                    // are and widens them itself, so no float32 copy is made (cross_entropy's
                    // [N, V] logits); the op returns float32_result_dtype's dtype
};

/// The static description every op carries: its name (for errors and the tape), its autocast
/// policy, and which inputs may be integer tensors (bit i: input i; by default every input must be
/// floating, and the dispatcher refuses an int64 tensor with a clear error).
struct OpInfo {
  const char* name;
  CastPolicy cast_policy;
  uint32_t integer_inputs = 0;
};
/// For OpInfo::integer_inputs: every input may be an integer tensor (shape ops, casts).
inline constexpr uint32_t kAnyInputMayBeInteger = ~uint32_t{0};

namespace autocast {

struct State {
  bool enabled = false;
  DType dtype = DType::kFloat16;
};

/// This thread's autocast state for `device` (each device has its own, as in PyTorch).
State state(Device device);
void set_state(Device device, State state);

/// Region nesting: the cast cache lives until the outermost region exits.
void enter_region();
void exit_region();
size_t cache_size();  // number of cached casts (for tests)

/// While it lives, this thread's cast cache is a fresh, empty one: the casts made meanwhile are
/// dropped when it ends and the outer cache comes back. Activation checkpointing runs its function
/// so, in the forward and in the recompute, so that the function makes its own casts both times
/// (the same graph twice) and none of them outlives it.
class IsolatedCastCache {
 public:
  IsolatedCastCache();
  ~IsolatedCastCache();
  IsolatedCastCache(const IsolatedCastCache&) = delete;
  IsolatedCastCache& operator=(const IsolatedCastCache&) = delete;
};

/// Applies `info.cast_policy` to an op's inputs in place (undefined inputs are left alone).
/// Casts are ordinary differentiable ops, so gradients flow back in the source dtype.
void cast_inputs(const OpInfo& info, std::span<Tensor> inputs);

/// What a kFloat32InKernel op returns for `input`: float32 for an FP16/BF16 input under autocast
/// on its device (what a kFloat32 op would), else the input's dtype.
DType float32_result_dtype(const Tensor& input);

}  // namespace autocast
}  // namespace ampgrad

// Activation checkpointing (PyTorch's torch.utils.checkpoint, non-reentrant): trade compute for
// memory by keeping a function's inputs instead of everything its ops save for backward.
#pragma once

#include <functional>
#include <vector>

#include "framework/tensor.h"

namespace ampgrad::utils {

/// A function of tensors that checkpoint() may run twice.
using CheckpointFn = std::function<Tensor(const std::vector<Tensor>&)>;

/// fn(inputs), keeping for the backward only `inputs` (not the activations fn's ops save). The
/// backward runs fn again, on the same input values, with the forward's autocast state, attention
/// backend and random generator state (so dropout draws the same masks), and backpropagates
/// through that recomputation. The gradients of the inputs and of every tensor fn reads
/// (parameters, and tensors with a graph of their own, whose nodes then run once in the outer
/// backward) are those of fn without checkpointing: bit for bit when each parameter's gradient
/// starts empty or fn uses it once (otherwise the same sum, added in another order). They reach
/// the parameters in the outer backward, one gradient per parameter per call, so GradScaler,
/// gradient hooks and data parallel see them as usual. fn's autocast casts are its own (made inside
/// it both times, never cached past it). The random generator is left as it would be without
/// checkpointing.
///
/// fn must compute the same graph both times: no control flow on values that change between the
/// forward and the backward, and no change to the modules' train()/eval() mode in between (forward
/// hooks run again in the recompute). An input modified in place (by fn, or before the backward),
/// a parameter modified before the backward, or a recomputation that reaches other tensors than
/// the forward is an Error. The random generator is process-wide: a checkpointed fn that draws
/// (dropout) must not run while another thread draws. Without grad mode, or when nothing fn
/// touches requires grad, it is just fn(inputs).
Tensor checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs);

}  // namespace ampgrad::utils

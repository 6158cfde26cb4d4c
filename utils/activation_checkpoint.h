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
/// backward runs fn again, on the same input values, with the autocast state and the random
/// generator's state of the forward (so dropout draws the same masks), and backpropagates through
/// that recomputation: the gradients of the inputs and of every tensor fn reaches (parameters) are
/// bit for bit those of fn without checkpointing. They reach the parameters in the outer backward,
/// as one gradient per parameter per call, so GradScaler, gradient hooks and data parallel see
/// them as usual. The random generator is left as it would be without checkpointing.
///
/// fn must compute the same graph both times (no control flow on values that change between the
/// forward and the backward); an input modified in place in between, or a recomputation that
/// reaches other tensors than the forward, is an Error. Without grad mode, or when nothing fn
/// touches requires grad, it is just fn(inputs).
Tensor checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs);

}  // namespace ampgrad::utils

// nn::Embedding: a lookup table of num_embeddings vectors of embedding_dim values.
#pragma once

#include "nn/module.h"

namespace ampgrad::nn {

/// ids int64 [...] -> [..., embedding_dim]; weight [num_embeddings, embedding_dim] ~ N(0, 1)
/// (PyTorch's init).
class Embedding : public Module {
 public:
  /// A table of num_embeddings rows of embedding_dim values.
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  Tensor forward(const Tensor& ids) override;

  Tensor& weight;  ///< [num_embeddings, embedding_dim]
};

}  // namespace ampgrad::nn

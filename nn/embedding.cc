// nn::Embedding over ops::embedding.
#include "nn/embedding.h"

#include "framework/error.h"
#include "ops/ops.h"

namespace ampgrad::nn {

namespace {

Tensor init_normal(int64_t num_embeddings, int64_t embedding_dim) {
  AG_CHECK(num_embeddings > 0 && embedding_dim > 0, "nn::Embedding(", num_embeddings, ", ", embedding_dim,
           "): sizes must be positive");
  return randn({num_embeddings, embedding_dim});
}

}  // namespace

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim)
    : weight(register_parameter("weight", init_normal(num_embeddings, embedding_dim))) {}

Tensor Embedding::forward(const Tensor& ids) { return ops::embedding(ids, weight); }

}  // namespace ampgrad::nn

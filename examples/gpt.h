// A small GPT (llm.c's layer list, nanoGPT's names): token + position embeddings, pre-norm blocks
// of causal self-attention and a GELU MLP, a final layer norm and an LM head tied to the token
// embedding. Parameter names match nanoGPT's state_dict, so a checkpoint loads in PyTorch.
#pragma once

#include "ampgrad.h"

namespace gpt {

namespace ag = ampgrad;

struct Config {
  int64_t vocab_size = 96;
  int64_t block_size = 64;  // the longest context
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  /// Dropout in training on the embeddings, the attention probabilities and the residual branches
  /// (nanoGPT's). On the CPU the attention's runs inside the fused kernel; CUDA's fused kernels have
  /// none, so there attention with dropout runs the composed path and keeps its [T, T] scores.
  double dropout = 0.0;
  /// Recompute each block in the backward instead of keeping its activations
  /// (utils::checkpoint per block): about a block's activations of memory for a second forward.
  bool checkpoint_activations = false;
};

/// x [B, T, C] -> [B, T, C]: multi-head attention that may not look ahead.
class CausalSelfAttention : public ag::nn::Module {
 public:
  explicit CausalSelfAttention(const Config& config);
  ag::Tensor forward(const ag::Tensor& x) override;

  ag::nn::Linear c_attn;  // C -> 3C: q, k and v of every head
  ag::nn::Linear c_proj;  // C -> C
  ag::nn::Dropout resid_dropout;
  int64_t n_head;
  double attn_dropout;  // on the attention probabilities in training (Config::dropout)
};

/// x [B, T, C] -> [B, T, C]: Linear(C, 4C), GELU (tanh approximation), Linear(4C, C).
class MLP : public ag::nn::Module {
 public:
  explicit MLP(const Config& config);
  ag::Tensor forward(const ag::Tensor& x) override;

  ag::nn::Linear c_fc;
  ag::nn::GELU gelu;
  ag::nn::Linear c_proj;
  ag::nn::Dropout dropout;
};

/// x + attn(ln_1(x)), then + mlp(ln_2(x)).
class Block : public ag::nn::Module {
 public:
  explicit Block(const Config& config);
  ag::Tensor forward(const ag::Tensor& x) override;

  ag::nn::LayerNorm ln_1;
  CausalSelfAttention attn;
  ag::nn::LayerNorm ln_2;
  MLP mlp;
};

/// The embeddings, the blocks and the final norm (nanoGPT's `transformer` ModuleDict).
class Transformer : public ag::nn::Module {
 public:
  explicit Transformer(const Config& config);

  ag::nn::Embedding wte;  // [vocab, C]
  ag::nn::Embedding wpe;  // [block_size, C]
  ag::nn::Dropout drop;
  ag::nn::ModuleList h;
  ag::nn::LayerNorm ln_f;
};

/// ids int64 [B, T] -> logits [B, T, vocab].
class GPT : public ag::nn::Module {
 public:
  explicit GPT(const Config& config);
  ag::Tensor forward(const ag::Tensor& ids) override;
  /// Parameters split for AdamW: matrices and embeddings decay, biases and norm scales do not.
  std::pair<std::vector<ag::Tensor>, std::vector<ag::Tensor>> decay_groups() const;

  Config config;
  Transformer transformer;
  ag::nn::Linear lm_head;  // no bias; its weight is transformer.wte.weight
};

}  // namespace gpt

// The GPT model: GPT-2's initialisation (N(0, 0.02), residual projections scaled by
// 1/sqrt(2 n_layer), zero biases) and its forward.
#include "examples/gpt.h"

#include <cmath>

namespace gpt {

namespace {

// Replaces a parameter's values with N(0, std) samples, keeping its identity.
void normal_(ag::Tensor& p, double std) {
  ag::NoGradGuard no_grad;
  p.set_data(ag::randn(p.shape()) * static_cast<float>(std));
}

void zero_(ag::Tensor& p) { p.set_data(ag::zeros(p.shape())); }

void init_linear(ag::nn::Linear& lin, double std) {
  normal_(lin.weight, std);
  if (lin.bias.defined()) zero_(lin.bias);
}

}  // namespace

CausalSelfAttention::CausalSelfAttention(const Config& c)
    : c_attn(register_module("c_attn", ag::nn::Linear(c.n_embd, 3 * c.n_embd))),
      c_proj(register_module("c_proj", ag::nn::Linear(c.n_embd, c.n_embd))),
      resid_dropout(register_module("resid_dropout", ag::nn::Dropout(c.dropout))),
      n_head(c.n_head),
      attn_dropout(c.dropout) {
  AG_CHECK(c.n_embd % c.n_head == 0, "gpt: n_embd ", c.n_embd, " is not a multiple of n_head ", c.n_head);
  init_linear(c_attn, 0.02);
  init_linear(c_proj, 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer)));
}

ag::Tensor CausalSelfAttention::forward(const ag::Tensor& x) {
  // c_attn's [B, T, 3C] holds q, k and v, each n_head heads wide: attention reads them there and
  // writes its [B, T, C] output with the heads merged (no split, transpose or merge copies). In
  // training its probabilities are dropped as nanoGPT's (scaled_dot_product_attention's dropout_p).
  const ag::ops::AttentionOptions options{.dropout_p = is_training() ? attn_dropout : 0.0, .is_causal = true};
  return resid_dropout(c_proj(ag::ops::self_attention(c_attn(x), n_head, options)));
}

MLP::MLP(const Config& c)
    : c_fc(register_module("c_fc", ag::nn::Linear(c.n_embd, 4 * c.n_embd))),
      gelu(register_module("gelu", ag::nn::GELU(ag::ops::GeluApproximation::kTanh))),
      c_proj(register_module("c_proj", ag::nn::Linear(4 * c.n_embd, c.n_embd))),
      dropout(register_module("dropout", ag::nn::Dropout(c.dropout))) {
  init_linear(c_fc, 0.02);
  init_linear(c_proj, 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer)));
}

ag::Tensor MLP::forward(const ag::Tensor& x) { return dropout(c_proj(gelu(c_fc(x)))); }

Block::Block(const Config& c)
    : ln_1(register_module("ln_1", ag::nn::LayerNorm(c.n_embd))),
      attn(register_module("attn", CausalSelfAttention(c))),
      ln_2(register_module("ln_2", ag::nn::LayerNorm(c.n_embd))),
      mlp(register_module("mlp", MLP(c))) {}

ag::Tensor Block::forward(const ag::Tensor& x) {
  const ag::Tensor h = x + attn(ln_1(x));
  return h + mlp(ln_2(h));
}

Transformer::Transformer(const Config& c)
    : wte(register_module("wte", ag::nn::Embedding(c.vocab_size, c.n_embd))),
      wpe(register_module("wpe", ag::nn::Embedding(c.block_size, c.n_embd))),
      drop(register_module("drop", ag::nn::Dropout(c.dropout))),
      h(register_module("h", ag::nn::ModuleList())),
      ln_f(register_module("ln_f", ag::nn::LayerNorm(c.n_embd))) {
  normal_(wte.weight, 0.02);
  normal_(wpe.weight, 0.02);
  for (int64_t i = 0; i < c.n_layer; ++i) h.push_back(Block(c));
}

GPT::GPT(const Config& c)
    : config(c),
      transformer(register_module("transformer", Transformer(c))),
      lm_head(register_module("lm_head", ag::nn::Linear(c.n_embd, c.vocab_size, ag::nn::Bias::kNo))) {
  lm_head.weight = transformer.wte.weight;  // tied, as GPT-2
}

ag::Tensor GPT::forward(const ag::Tensor& ids) {
  const int64_t t = ids.size(1);
  AG_CHECK(t <= config.block_size, "gpt: a context of ", t, " tokens is longer than block_size ", config.block_size);
  // The embeddings of positions 0 .. T-1 are wpe's first T rows: a narrow gives the same values and
  // gradient as a lookup, without uploading positions or checking ids (each a wait on CUDA).
  const ag::Tensor pos = ag::ops::narrow(transformer.wpe.weight, 0, 0, t);
  ag::Tensor x = transformer.drop(transformer.wte(ids) + pos);  // [B, T, C] + [T, C]
  for (size_t i = 0; i < transformer.h.size(); ++i) {
    ag::nn::Module& block = transformer.h[i];
    if (config.checkpoint_activations && is_training()) {
      x = ag::utils::checkpoint([&block](const std::vector<ag::Tensor>& in) { return block(in[0]); }, {x});
    } else {
      x = block(x);
    }
  }
  return lm_head(transformer.ln_f(x));
}

std::pair<std::vector<ag::Tensor>, std::vector<ag::Tensor>> GPT::decay_groups() const {
  std::vector<ag::Tensor> decay, no_decay;
  for (const ag::Tensor& p : parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  return {decay, no_decay};
}

}  // namespace gpt

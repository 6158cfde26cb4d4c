// Character-level GPT training: a text corpus as int64 ids, batches drawn reproducibly from
// (seed, step), AdamW with parameter groups, cosine schedule with warmup, gradient clipping, FP32,
// FP16 autocast with a GradScaler or BF16 autocast without one, on the CPU or a CUDA GPU,
// evaluation, checkpoints that resume bit-exactly, sampling.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "examples/gpt.h"

namespace char_gpt {

namespace ag = ampgrad;

/// A text as character ids: the vocabulary is the sorted set of bytes it uses.
struct Corpus {
  std::string vocab;                // id -> byte
  std::vector<int64_t> train, val;  // the first 90% and the last 10% of the text
};

/// Reads a text file, or every regular file of a folder (sorted by name, skipping fortune's .dat
/// indexes), into a Corpus. Throws an ampgrad::Error that says how to get the default data when a
/// path is missing or the text is too short.
Corpus load_corpus(const std::string& path, int64_t block_size);

/// kFloat16Amp: FP16 autocast with a GradScaler; kBFloat16Amp: BF16 autocast without one (BF16
/// has FP32's exponent range, so its gradients need no loss scaling); kFp8: FP8 linears in BF16
/// autocast; kBf16Params: the model stored in BF16, no scaler, its updates kept by FP32 masters or
/// stochastic rounding (TrainOptions::master_weights).
enum class Precision { kFloat32, kFloat16Amp, kBFloat16Amp, kFp8, kBf16Params };

/// The autocast dtype of an AMP precision (float32 for kFloat32: no autocast).
ag::DType autocast_dtype(Precision precision);
/// Whether `precision` trains with a GradScaler (FP16 autocast only).
bool uses_grad_scaler(Precision precision);
/// "FP32", "FP16 AMP", "BF16 AMP", "FP8 linears in BF16 AMP", "BF16 params".
const char* precision_name(Precision precision);

struct TrainOptions {
  gpt::Config model;
  int64_t batch_size = 16;
  int64_t steps = 2000;
  double lr = 1e-3;
  double weight_decay = 0.1;
  int64_t warmup_steps = 100;
  double grad_clip = 1.0;
  Precision precision = Precision::kFloat32;
  // How kBf16Params updates its BF16 parameters (the other precisions train FP32 parameters).
  ag::optim::MasterWeights master_weights = ag::optim::MasterWeights::kFp32;
  ag::Device device = ag::Device::kCPU;  // where the model trains (batches are built on the CPU and moved)
  int64_t eval_every = 100;   // steps between validation losses (and at the last step)
  int64_t eval_batches = 8;   // fixed validation batches
  uint64_t seed = 1337;       // the model's initialisation and the batches
  std::string save_path;      // a checkpoint written at the end (empty: none)
  std::string resume_path;    // a checkpoint to continue from (empty: start afresh)
  int64_t stop_after = -1;    // stop (and save) after this many steps of the schedule; -1: run it all
};

struct TrainResult {
  std::vector<double> train_loss;                     // per step taken in this run
  std::vector<std::pair<int64_t, double>> val_loss;   // (step, loss)
  std::vector<double> scale;                          // the loss scale after each step (1 in FP32)
  int64_t skipped = 0;                                // steps the scaler skipped
  int64_t first_step = 0;                             // the step this run started at (after a resume)
  int64_t parameters = 0;
  double unigram_loss = 0;                            // the validation loss of the unigram model
  // Where one step's memory went, on options.device: the first step of the run after the
  // optimizer stepped (so its state exists), else the run's last.
  ag::optim::TrainingMemory memory;
  int64_t memory_step = 0;                            // the step it was measured at (1-based; 0: none ran)
};

/// Called after each step with (step, loss, scale, val_loss or NaN).
using StepCallback = std::function<void(int64_t step, double loss, double scale, double val_loss)>;

/// Throws an ampgrad::Error naming --device=cuda and CUDA's reason when options.device is
/// kCUDA and no usable GPU is present (or the build has no CUDA), before anything is built.
void check_device(const TrainOptions& options);

/// The optimizer train() uses: AdamW (betas 0.9, 0.95, eps 1e-8) with weight decay on the
/// matrices only, as nanoGPT.
ag::optim::AdamW make_optimizer(gpt::GPT& model, const TrainOptions& options);

/// The batch of `step`: x int64 [batch_size, block_size] drawn from (seed, step), y [batch_size *
/// block_size] the next characters; on the CPU (to_device moves them).
std::pair<ag::Tensor, ag::Tensor> batch_for_step(const std::vector<int64_t>& ids, const TrainOptions& options,
                                                 int64_t step);

/// A CPU batch on `device`: on CUDA copied from page-locked memory without waiting for the GPU.
std::pair<ag::Tensor, ag::Tensor> to_device(const std::pair<ag::Tensor, ag::Tensor>& batch, ag::Device device);

/// One training step on (x, y), which are on the model's device: zero_grad, the loss (under
/// autocast in AMP), scaled backward, unscale_, clip_grad_norm_, scaler.step and update. Returns the
/// loss (not read back: on CUDA the host does not wait for it); `stepped` says whether the
/// optimizer stepped (the scaler skips steps with inf/NaN gradients). With a `meter` (made before
/// the call), it marks the end of the forward pass on it.
ag::Tensor train_step(gpt::GPT& model, ag::optim::AdamW& opt, ag::amp::GradScaler& scaler, const ag::Tensor& x,
                      const ag::Tensor& y, const TrainOptions& options, bool& stepped,
                      ag::optim::MemoryMeter* meter = nullptr);

/// Moves the model to options.device and trains it; with resume_path set, continues from that
/// checkpoint (the model, optimizer, scaler, schedule and step), bit for bit as an uninterrupted
/// run, resumed on the device that saved it. On CUDA the losses are read back once per evaluation, so
/// on_step is called for the steps in between at the evaluation, in order.
TrainResult train(const Corpus& corpus, const TrainOptions& options, gpt::GPT& model, const StepCallback& on_step = {});

/// `length` characters sampled from the model (on its device) after `prompt` (temperature 1;
/// seeded).
std::string sample(gpt::GPT& model, const Corpus& corpus, const std::string& prompt, int64_t length, uint64_t seed);

}  // namespace char_gpt

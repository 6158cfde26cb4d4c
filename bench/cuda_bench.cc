// CUDA benchmarks, one table: FP16, BF16 and FP32 GEMM TFLOP/s next to cuBLAS alone on the same
// shapes, the seed step and a 4096-wide MLP step in FP32, FP16 AMP and BF16 AMP, device memory
// peaks, and host syncs per AMP step. Plain main (no benchmark library) so the binary runs on a GPU machine as it is.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "ampgrad.h"

namespace ag = ampgrad;

namespace {

// Seconds per call of fn, after `warmup` calls, averaged over `iters` calls.
double time_per_call(const std::function<void()>& fn, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) fn();
  ag::synchronize(ag::Device::kCUDA);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) fn();
  ag::synchronize(ag::Device::kCUDA);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
}

#define CHECK_CUDA(call) \
  if ((call) != 0) { std::fprintf(stderr, "%s failed\n", #call); std::exit(1); }

// out[n,n] = x[n,n] @ w[n,n]^T through cuBLAS alone: the same GEMM ampgrad's linear issues.
double raw_cublas_seconds(int n, ag::DType dtype) {
  cublasHandle_t handle;
  CHECK_CUDA(cublasCreate(&handle));
  const size_t bytes = static_cast<size_t>(n) * n * ag::element_size(dtype);
  void *x, *w, *out;
  CHECK_CUDA(cudaMalloc(&x, bytes));
  CHECK_CUDA(cudaMalloc(&w, bytes));
  CHECK_CUDA(cudaMalloc(&out, bytes));
  CHECK_CUDA(cudaMemset(x, 0, bytes));
  CHECK_CUDA(cudaMemset(w, 0, bytes));
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType type = dtype == ag::DType::kFloat16    ? CUDA_R_16F
                            : dtype == ag::DType::kBFloat16 ? CUDA_R_16BF
                                                            : CUDA_R_32F;
  // Row-major out = x w^T is column-major out^T = (w^T)^T x^T: op(w) = T, op(x) = N.
  auto gemm = [&] {
    CHECK_CUDA(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, w, type, n, x, type, n, &beta, out,
                            type, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  const double seconds = time_per_call(gemm, 3, 10);
  cudaFree(x);
  cudaFree(w);
  cudaFree(out);
  cublasDestroy(handle);
  return seconds;
}

double ampgrad_linear_seconds(int n, ag::DType dtype) {
  ag::manual_seed(0);
  const ag::Tensor x = ag::randn({n, n}, dtype, ag::Device::kCUDA);
  const ag::Tensor w = ag::randn({n, n}, dtype, ag::Device::kCUDA);
  return time_per_call([&] { ag::ops::linear(x, w); }, 3, 10);
}

struct StepResult {
  double seconds = 0;
  double syncs_per_step = 0;
  double peak_mib = 0;
};

enum class Mode { kFp32, kAmp, kBf16 };

// zero_grad, forward, loss, backward, step with Adam; kAmp = autocast FP16 + GradScaler, kBf16 =
// autocast BF16 without a scaler.
StepResult train_step(ag::nn::Sequential& model, const ag::Tensor& x, const ag::Tensor& y, Mode mode, int iters) {
  ag::optim::Adam opt(model.parameters(), {.lr = 1e-4});
  ag::amp::GradScaler scaler({.enabled = mode == Mode::kAmp});
  const ag::DType autocast_dtype = mode == Mode::kBf16 ? ag::DType::kBFloat16 : ag::DType::kFloat16;
  auto step = [&] {
    opt.zero_grad();
    ag::Tensor loss;
    {
      ag::amp::AutocastGuard autocast(ag::Device::kCUDA, autocast_dtype, mode != Mode::kFp32);
      loss = ag::ops::mse_loss(model(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
  };
  ag::allocator_for(ag::Device::kCUDA).reset_peak();
  StepResult r;
  const int64_t syncs_before = ag::cuda_host_sync_count();
  r.seconds = time_per_call(step, 3, iters);
  // time_per_call itself synchronises twice.
  r.syncs_per_step = static_cast<double>(ag::cuda_host_sync_count() - syncs_before - 2) / (iters + 3);
  r.peak_mib = static_cast<double>(ag::memory_stats(ag::Device::kCUDA).peak_bytes) / (1 << 20);
  return r;
}

}  // namespace

int main() {
  if (!ag::cuda_is_available()) {
    std::printf("no CUDA device: nothing to benchmark\n");
    return 0;
  }
  std::printf("%-34s %12s %12s %10s\n", "GEMM out = x w^T (n x n x n)", "ampgrad", "cuBLAS", "ratio");
  double ratio_8192_fp16 = 0;
  for (int n : {1024, 4096, 8192}) {
    for (ag::DType dtype : {ag::DType::kFloat16, ag::DType::kBFloat16, ag::DType::kFloat32}) {
      const double flop = 2.0 * n * n * static_cast<double>(n);
      const double ours = flop / ampgrad_linear_seconds(n, dtype) / 1e12;
      const double raw = flop / raw_cublas_seconds(n, dtype) / 1e12;
      if (dtype == ag::DType::kFloat16 && n == 8192) ratio_8192_fp16 = ours / raw;
      std::printf("  %-8s n=%-21d %8.1f TF/s %8.1f TF/s %9.2f\n", std::string(ag::dtype_name(dtype)).c_str(), n, ours,
                  raw, ours / raw);
    }
  }

  ag::manual_seed(0);
  ag::nn::Sequential seed{ag::nn::Linear(10, 1)};
  seed.to(ag::Device::kCUDA);
  const ag::Tensor sx = ag::randn({64, 10}, ag::DType::kFloat32, ag::Device::kCUDA);
  const ag::Tensor sy = ag::randn({64, 1}, ag::DType::kFloat32, ag::Device::kCUDA);
  const StepResult seed32 = train_step(seed, sx, sy, Mode::kFp32, 200);
  const StepResult seed_amp = train_step(seed, sx, sy, Mode::kAmp, 200);
  const StepResult seed_bf16 = train_step(seed, sx, sy, Mode::kBf16, 200);

  ag::nn::Sequential mlp{ag::nn::Linear(4096, 4096), ag::nn::ReLU(), ag::nn::Linear(4096, 4096), ag::nn::ReLU(),
                         ag::nn::Linear(4096, 4096)};
  mlp.to(ag::Device::kCUDA);
  const ag::Tensor mx = ag::randn({4096, 4096}, ag::DType::kFloat32, ag::Device::kCUDA);
  const ag::Tensor my = ag::randn({4096, 4096}, ag::DType::kFloat32, ag::Device::kCUDA);
  const StepResult mlp32 = train_step(mlp, mx, my, Mode::kFp32, 10);
  const StepResult mlp_amp = train_step(mlp, mx, my, Mode::kAmp, 10);
  const StepResult mlp_bf16 = train_step(mlp, mx, my, Mode::kBf16, 10);

  std::printf("\n%-34s %12s %12s %12s %10s %10s\n", "training step (Adam)", "fp32", "amp (fp16)", "bf16",
              "fp32/amp", "fp32/bf16");
  std::printf("  %-32s %9.1f us %9.1f us %9.1f us %10.2f %10.2f\n", "seed Linear(10,1), batch 64", seed32.seconds * 1e6,
              seed_amp.seconds * 1e6, seed_bf16.seconds * 1e6, seed32.seconds / seed_amp.seconds,
              seed32.seconds / seed_bf16.seconds);
  std::printf("  %-32s %9.2f ms %9.2f ms %9.2f ms %10.2f %10.2f\n", "mlp 3x4096, batch 4096", mlp32.seconds * 1e3,
              mlp_amp.seconds * 1e3, mlp_bf16.seconds * 1e3, mlp32.seconds / mlp_amp.seconds,
              mlp32.seconds / mlp_bf16.seconds);
  std::printf("  %-32s %8.0f MiB %8.0f MiB %8.0f MiB\n", "mlp device memory peak", mlp32.peak_mib, mlp_amp.peak_mib,
              mlp_bf16.peak_mib);
  std::printf("  %-32s %12.2f %12.2f %12.2f\n", "host syncs per step", mlp32.syncs_per_step, mlp_amp.syncs_per_step,
              mlp_bf16.syncs_per_step);

  std::printf("\ntargets: fp16 linear at 8192^3 >= 0.70 of cuBLAS: %.2f %s;  AMP mlp >= 2x fp32: %.2fx %s;  "
              "AMP host syncs per step <= 1: %.2f %s\n",
              ratio_8192_fp16, ratio_8192_fp16 >= 0.7 ? "MET" : "MISSED", mlp32.seconds / mlp_amp.seconds,
              mlp32.seconds / mlp_amp.seconds >= 2.0 ? "MET" : "MISSED", mlp_amp.syncs_per_step,
              mlp_amp.syncs_per_step <= 1.0 ? "MET" : "MISSED");
  return 0;
}

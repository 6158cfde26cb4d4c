// CUDA benchmarks, one table: FP16, BF16 and FP32 GEMM TFLOP/s next to cuBLAS alone (the same random data,
// the same math mode and compute type, its own handle), each large result checked against cuBLAS
// alone and against float64 at sampled entries; the seed step and a 4096-wide MLP step in FP32 vs
// FP16 AMP (and the MLP in BF16 AMP), their losses checked; device memory peak and reserved; host
// syncs per step; examples/char_gpt's training step at its own size and at a larger one
// (bench/workloads.h GptWorkload) in FP32, FP16 AMP and BF16 AMP; conv2d forward + backward at
// the Fashion CNN's and a ResNet stage's shapes (also in FP8), its float32 forward checked against
// the CPU; the Fashion CNN's training step in FP32, FP16 AMP, BF16 and FP8; the FP8 GEMM (ours,
// and the whole FP8 linear with its casts) against cuBLASLt's FP8 matmul alone and BF16 cuBLAS, and GPT-2
// small's step with FP8 linears. Plain main (no benchmark
// library) so the binary runs on a GPU machine as it is. Exit status 1 when a check fails.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "ampgrad.h"
#include "bench/workloads.h"
#include "framework/cuda_check.h"
#include "framework/device_cuda.h"
#include "framework/launch_profile.h"
#include "ops/linear/cublas.h"
#include "ops/linear/cublaslt.h"
#include "ops/linear/linear_float8_kernels.h"

namespace ag = ampgrad;
namespace agc = ampgrad::kernels::cuda;

namespace {

bool all_checks_passed = true;

// Seconds per call of fn, after `warmup` calls, averaged over `iters` calls.
double time_per_call(const std::function<void()>& fn, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) fn();
  ag::synchronize(ag::Device::kCUDA);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) fn();
  ag::synchronize(ag::Device::kCUDA);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
}

// out[n,n] = x[n,n] @ w[n,n]^T through cuBLAS alone, with the settings ampgrad's linear uses: FP32
// compute (tensor cores for FP16, no TF32 for FP32), no reduced-precision split-K reduction, the
// default algorithm, the legacy stream. Row-major out = x w^T is column-major out^T = w x^T.
class RawGemm {
 public:
  RawGemm() {
    AG_CUBLAS_CHECK(agc::cublas().create(&handle_));
    AG_CUBLAS_CHECK(agc::cublas().set_stream(handle_, cudaStreamLegacy));
    AG_CUBLAS_CHECK(agc::cublas().set_math_mode(
        handle_, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  }
  ~RawGemm() { agc::cublas().destroy(handle_); }
  void operator()(const ag::Tensor& x, const ag::Tensor& w, ag::Tensor& out) const {
    const int n = static_cast<int>(x.size(0));
    const float alpha = 1.0f, beta = 0.0f;
    const cudaDataType type = x.dtype() == ag::DType::kFloat16    ? CUDA_R_16F
                              : x.dtype() == ag::DType::kBFloat16 ? CUDA_R_16BF
                                                                  : CUDA_R_32F;
    AG_CUBLAS_CHECK(agc::cublas().gemm_ex(handle_, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, w.data_ptr(), type, n,
                                          x.data_ptr(), type, n, &beta, out.data_ptr(), type, n, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT));
  }

 private:
  cublasHandle_t handle_ = nullptr;
};

// out[n,n] = xq[n,n] wq[n,n]^T (E4M3, float32 out) through cuBLASLt's FP8 matmul alone: the TN
// layout, FP32 compute without fast accumulation, unit scales, a 32 MiB workspace, descriptors and
// algorithm chosen once (ampgrad's wrapper sets them up per call, and allocates its workspace).
class RawFp8Gemm {
 public:
  explicit RawFp8Gemm(int64_t n) {
    const agc::CublasLtApi& lt = agc::cublaslt();
    AG_CUBLASLT_CHECK(lt.matmul_desc_create(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
    AG_CUBLASLT_CHECK(lt.matmul_desc_set_attribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    AG_CUBLASLT_CHECK(lt.matmul_desc_set_attribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt));
    const auto u = static_cast<uint64_t>(n);
    AG_CUBLASLT_CHECK(lt.matrix_layout_create(&operand_, CUDA_R_8F_E4M3, u, u, n));
    AG_CUBLASLT_CHECK(lt.matrix_layout_create(&result_, CUDA_R_32F, u, u, n));
    AG_CUBLASLT_CHECK(lt.preference_create(&preference_));
    const uint64_t bytes = kWorkspaceBytes;
    AG_CUBLASLT_CHECK(lt.preference_set_attribute(preference_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes,
                                                  sizeof bytes));
    int found = 0;
    AG_CUBLASLT_CHECK(lt.algo_get_heuristic(agc::cublaslt_handle(), desc_, operand_, operand_, result_, result_,
                                            preference_, 1, &heuristic_, &found));
    AG_CHECK(found == 1, "cuBLASLt offers no FP8 algorithm for ", n, "^3");
  }
  ~RawFp8Gemm() {
    const agc::CublasLtApi& lt = agc::cublaslt();
    lt.preference_destroy(preference_);
    lt.matrix_layout_destroy(result_);
    lt.matrix_layout_destroy(operand_);
    lt.matmul_desc_destroy(desc_);
  }
  void operator()(const ag::Tensor& xq, const ag::Tensor& wq, ag::Tensor& out) {
    const float alpha = 1.0f, beta = 0.0f;
    AG_CUBLASLT_CHECK(agc::cublaslt().matmul(agc::cublaslt_handle(), desc_, &alpha, wq.data_ptr(), operand_,
                                             xq.data_ptr(), operand_, &beta, out.data_ptr(), result_, out.data_ptr(),
                                             result_, &heuristic_.algo, workspace_.data_ptr(), kWorkspaceBytes,
                                             cudaStreamLegacy));
  }

 private:
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t operand_ = nullptr, result_ = nullptr;
  cublasLtMatmulPreference_t preference_ = nullptr;
  cublasLtMatmulHeuristicResult_t heuristic_{};
  ag::Tensor workspace_ = ag::Tensor::empty({static_cast<int64_t>(kWorkspaceBytes / 4)}, ag::DType::kFloat32,
                                            ag::Device::kCUDA);
};

// Checks ours against cuBLAS alone (every entry) and against float64 (256 sampled entries). FP32
// accumulation over n terms of size ~1 is off by up to ~eps32 * n; FP16 output adds its rounding.
std::string check_gemm(const ag::Tensor& x, const ag::Tensor& w, const ag::Tensor& ours, const ag::Tensor& raw) {
  const int64_t n = x.size(0);
  const std::vector<float> xs = x.to_vector(), ws = w.to_vector(), o = ours.to_vector(), r = raw.to_vector();
  const double eps_out = ag::dtype_info(x.dtype()).eps;
  const auto tol = [&](double ref) { return eps_out * std::abs(ref) + 4 * 0x1p-23 * static_cast<double>(n); };
  double worst_raw = 0, worst_ref = 0;
  bool ok = true;
  for (size_t i = 0; i < o.size(); ++i) {
    const double d = std::abs(static_cast<double>(o[i]) - r[i]);
    worst_raw = std::max(worst_raw, d);
    ok = ok && d <= 2 * tol(r[i]);  // NaN fails too
  }
  uint64_t state = 12345;
  for (int s = 0; s < 256; ++s) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    const int64_t i = static_cast<int64_t>((state >> 33) % static_cast<uint64_t>(n));
    const int64_t j = static_cast<int64_t>((state >> 13) % static_cast<uint64_t>(n));
    double ref = 0;
    for (int64_t k = 0; k < n; ++k) ref += static_cast<double>(xs[i * n + k]) * ws[j * n + k];
    const double d = std::abs(o[i * n + j] - ref);
    worst_ref = std::max(worst_ref, d);
    ok = ok && d <= tol(ref);
  }
  char text[96];
  std::snprintf(text, sizeof text, "%s (max |diff| %.1e vs cuBLAS, %.1e vs fp64)", ok ? "ok" : "WRONG", worst_raw,
                worst_ref);
  if (!ok) all_checks_passed = false;
  return text;
}

struct StepResult {
  double seconds = 0;
  double syncs_per_step = 0;
  double peak_mib = 0;
  double reserved_mib = 0;
  float first_loss = 0, last_loss = 0;
  // Where a step's time goes, each phase timed alone (the GPU drained before and after it):
  // forward (zero_grad, forward, loss), backward, optimizer (unscale, step, update).
  std::array<double, 3> phase_ms{};
  // With AMPGRAD_CUDA_PROFILE=1: 10 steps' launches, per kernel.
  std::vector<ag::cuda::LaunchTime> launches;
};

// Times `step` over `iters` calls after one untimed call (whose loss is the first) and two warm-up
// calls; counts the host syncs per step; with AMPGRAD_CUDA_PROFILE=1 records 10 more steps' launches.
StepResult time_steps(const std::function<void()>& step, const std::function<float()>& loss, int iters) {
  ag::allocator_for(ag::Device::kCUDA).reset_peak();
  StepResult r;
  step();
  r.first_loss = loss();
  const int64_t syncs_before = ag::cuda_host_sync_count();
  r.seconds = time_per_call(step, 2, iters);
  // time_per_call itself synchronises twice.
  r.syncs_per_step = static_cast<double>(ag::cuda_host_sync_count() - syncs_before - 2) / (iters + 2);
  r.last_loss = loss();
  if (ag::cuda::launch_profile_enabled()) {
    (void)ag::cuda::take_launch_profile();
    for (int i = 0; i < 10; ++i) step();
    r.launches = ag::cuda::take_launch_profile();
  }
  const ag::MemoryStats mem = ag::memory_stats(ag::Device::kCUDA);
  r.peak_mib = static_cast<double>(mem.peak_bytes) / (1 << 20);
  r.reserved_mib = static_cast<double>(mem.reserved_bytes) / (1 << 20);
  return r;
}

// zero_grad, forward, loss, backward, step with Adam; AMP = autocast FP16 + GradScaler. `init` is a
// stack of Linear layers with ReLU between; each run starts from a copy of its weights, so the FP32
// and AMP losses can be compared.
// compute: kFloat32 (no autocast), kFloat16 (autocast + GradScaler) or kBFloat16 (autocast, no scaler).
StepResult train_step(const ag::nn::Sequential& init, const ag::Tensor& x, const ag::Tensor& y, ag::DType compute,
                      int iters) {
  const bool amp = compute != ag::DType::kFloat32;
  // The cache starts empty, so reserved_mib is what this run alone made the allocator hold.
  ag::empty_cache(ag::Device::kCUDA);
  std::vector<ag::Tensor> params;
  for (const ag::Tensor& p : init.parameters()) {
    ag::Tensor copy = p.detach().to(ag::DType::kFloat64).to(p.dtype());  // a new tensor with the same values
    copy.set_requires_grad(true);
    params.push_back(copy);
  }
  ag::optim::Adam opt(params, {.lr = 1e-4});
  ag::amp::GradScaler scaler({.enabled = compute == ag::DType::kFloat16});
  ag::Tensor loss;
  const std::array<std::function<void()>, 3> phases{
      [&] {
        opt.zero_grad();
        ag::amp::AutocastGuard autocast(ag::Device::kCUDA, amp ? compute : ag::DType::kFloat16, amp);
        ag::Tensor h = x;
        for (size_t i = 0; i < params.size(); i += 2) {
          h = ag::ops::linear(h, params[i], params[i + 1]);
          if (i + 2 < params.size()) h = ag::ops::relu(h);
        }
        loss = ag::ops::mse_loss(h, y);
      },
      [&] { scaler.scale(loss).backward(); },
      [&] {
        scaler.step(opt);
        scaler.update();
      }};
  auto step = [&] {
    for (const auto& phase : phases) phase();
  };
  StepResult r = time_steps(step, [&] { return loss.item(); }, iters);
  for (int i = 0; i < std::min(iters, 10); ++i) {
    for (size_t p = 0; p < phases.size(); ++p) r.phase_ms[p] += time_per_call(phases[p], 0, 1) * 1e3 / std::min(iters, 10);
  }
  return r;
}

// examples/char_gpt's training step on the GPU (bench/workloads.h GptWorkload) at `shape`, in FP32
// (kFp32), FP16 AMP with a GradScaler (kAmp), BF16 autocast (kAmpBf16) or FP8 linears inside BF16
// autocast (kFp8: a Float8Guard, delayed scaling; the example's --amp=fp8).
StepResult gpt_step(const ag::bench::GptShape& shape, ag::bench::Precision precision, int iters) {
  ag::bench::GptWorkload w(precision, shape, ag::Device::kCUDA);
  return time_steps([&] { w.step(); }, [&] { return w.loss.item(); }, iters);
}

// With AMPGRAD_CUDA_PROFILE=1, where a step's GPU time went, per kernel (10 steps).
void print_launch_profile(const std::string& what, const StepResult& r) {
  if (r.launches.empty()) return;  // AMPGRAD_CUDA_PROFILE unset
  std::printf("  %s step, per kernel (AMPGRAD_CUDA_PROFILE=1, 10 steps):\n", what.c_str());
  double total = 0;
  for (const ag::cuda::LaunchTime& t : r.launches) total += t.milliseconds;
  for (const ag::cuda::LaunchTime& t : r.launches) {
    std::printf("    %-40s %5.1f launches/step %8.3f ms/step %5.1f%%\n", t.kernel.c_str(), t.launches / 10.0,
                t.milliseconds / 10, 100 * t.milliseconds / total);
  }
}

// Finite losses that went down, and AMP's first loss (same weights and data) within FP16's reach of FP32's.
std::string check_losses(const StepResult& fp32, const StepResult& amp, double rtol = 1e-2) {
  const bool finite = std::isfinite(fp32.first_loss) && std::isfinite(fp32.last_loss) &&
                      std::isfinite(amp.first_loss) && std::isfinite(amp.last_loss);
  const bool down = fp32.last_loss < fp32.first_loss && amp.last_loss < amp.first_loss;
  const bool close = std::abs(amp.first_loss - fp32.first_loss) <= rtol * std::abs(fp32.first_loss);
  const bool ok = finite && down && close;
  if (!ok) all_checks_passed = false;
  char text[128];
  std::snprintf(text, sizeof text, "%s (fp32 %.4g -> %.4g, amp %.4g -> %.4g)", ok ? "ok" : "WRONG", fp32.first_loss,
                fp32.last_loss, amp.first_loss, amp.last_loss);
  return text;
}

// FP8 GEMM rows at n^3: ampgrad's FP8 GEMM (kernels::gemm on E4M3 operands: the cuBLASLt wrapper,
// no casts) against cuBLASLt's FP8 matmul alone and against BF16 cuBLAS alone on the same data,
// and the whole FP8 linear forward (amaxes, casts with their copies back, GEMM, descale; current
// scaling). The wrapper's result is checked against the raw matmul's (the same products, maybe
// summed in another order).
void float8_gemm_rows(const RawGemm& raw_gemm) {
  int device = 0, major = 0, minor = 0;
  AG_CUDA_CHECK(cudaGetDevice(&device));
  AG_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  AG_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  std::printf("\n%-30s %12s %12s %12s %8s %9s %12s  %s\n", "FP8 GEMM out = x w^T", "fp8 gemm", "Lt alone",
              "bf16 cuBLAS", "gemm/Lt", "gemm/bf16", "fp8 linear", "check");
  if (major * 10 + minor < 89) {
    std::printf("  skipped: compute capability %d.%d has no FP8 tensor cores\n", major, minor);
    return;
  }
  for (int n : {4096, 8192}) {
    ag::manual_seed(static_cast<uint64_t>(n) + 8);
    const ag::Tensor x = ag::randn({n, n}, ag::DType::kBFloat16, ag::Device::kCUDA);
    const ag::Tensor w = ag::randn({n, n}, ag::DType::kBFloat16, ag::Device::kCUDA);
    ag::Tensor xq = ag::Tensor::empty({n, n}, ag::DType::kFloat8E4M3, ag::Device::kCUDA);
    ag::Tensor wq = ag::Tensor::empty({n, n}, ag::DType::kFloat8E4M3, ag::Device::kCUDA);
    ag::kernels::quantize_float8(x, 448.0f / 6.0f, xq);
    ag::kernels::quantize_float8(w, 448.0f / 6.0f, wq);
    ag::Tensor ours = ag::Tensor::empty({n, n}, ag::DType::kFloat32, ag::Device::kCUDA);
    ag::Tensor raw = ag::Tensor::empty({n, n}, ag::DType::kFloat32, ag::Device::kCUDA);
    ag::Tensor y, bf16 = ag::Tensor::empty({n, n}, ag::DType::kBFloat16, ag::Device::kCUDA);
    RawFp8Gemm raw_fp8(n);
    const int iters = n >= 8192 ? 10 : 20;
    const double flop = 2.0 * n * n * static_cast<double>(n);
    const auto tflops = [&](const std::function<void()>& fn) { return flop / time_per_call(fn, 3, iters) / 1e12; };
    const double gemm_tf = tflops([&] {
      ag::kernels::gemm(xq, ag::kernels::Transpose::kNo, wq, ag::kernels::Transpose::kYes, ag::Tensor(), ours);
    });
    const double lt_tf = tflops([&] { raw_fp8(xq, wq, raw); });
    const double linear_tf = tflops([&] {
      ag::amp::Float8Guard fp8(ag::Device::kCUDA, {.scaling = ag::amp::Float8Scaling::kCurrent});
      y = ag::ops::linear(x, w);
    });
    const double bf16_tf = tflops([&] { raw_gemm(x, w, bf16); });
    const std::vector<float> o = ours.to_vector(), r = raw.to_vector();
    double worst = 0, scale = 0;
    bool finite = true;
    for (size_t i = 0; i < o.size(); ++i) {
      finite = finite && std::isfinite(o[i]) && std::isfinite(r[i]);
      worst = std::max(worst, std::abs(static_cast<double>(o[i]) - r[i]));
      scale = std::max(scale, std::abs(static_cast<double>(r[i])));
    }
    const bool ok = finite && worst <= 4 * 0x1p-23 * n * scale;  // FP32 summation order over n terms
    if (!ok) all_checks_passed = false;
    std::printf("  e4m3     n=%-19d %7.1f TF/s %7.1f TF/s %7.1f TF/s %8.2f %9.2f %7.1f TF/s  %s (max |diff| %.1e)\n",
                n, gemm_tf, lt_tf, bf16_tf, gemm_tf / lt_tf, gemm_tf / bf16_tf, linear_tf, ok ? "ok" : "WRONG", worst);
  }
}

// conv2d forward + backward (dx and dw), 3x3, padding 1, into 64 channels from x of `shape`:
// TFLOP/s (3 x the forward's 2 N O L C 9) per dtype, FP8 (a Float8Guard, current scaling, in BF16
// autocast over float32 x and w: the casts and the descale count in its time), and the float32
// forward against the CPU's.
void conv_rows() {
  std::printf("\n%-44s %10s %10s %10s %10s  %s\n", "conv2d fwd+bwd, 3x3 pad 1 -> 64 channels", "fp32", "fp16", "bf16",
              "fp8", "fp32 forward vs CPU");
  for (const ag::Shape& shape : {ag::Shape{128, 32, 14, 14}, ag::Shape{32, 64, 56, 56}}) {
    ag::manual_seed(3);
    const ag::Tensor x_cpu = ag::randn(shape), w_cpu = ag::randn({64, shape[1], 3, 3});
    const double flop = 3.0 * 2 * static_cast<double>(shape[0] * 64 * shape[2] * shape[3] * shape[1] * 9);
    std::array<double, 4> tflops{};
    int column = 0;
    for (ag::DType dtype : {ag::DType::kFloat32, ag::DType::kFloat16, ag::DType::kBFloat16, ag::DType::kFloat8E4M3}) {
      const bool fp8 = dtype == ag::DType::kFloat8E4M3;
      const ag::DType stored = fp8 ? ag::DType::kFloat32 : dtype;
      ag::Tensor x = x_cpu.to(stored).to(ag::Device::kCUDA), w = w_cpu.to(stored).to(ag::Device::kCUDA);
      x.set_requires_grad(true);
      w.set_requires_grad(true);
      const double seconds = time_per_call(
          [&] {
            ag::Tensor y;
            {
              ag::amp::AutocastGuard autocast(ag::Device::kCUDA, ag::DType::kBFloat16, /*enabled=*/fp8);
              ag::amp::Float8Guard guard(ag::Device::kCUDA, {.scaling = ag::amp::Float8Scaling::kCurrent}, fp8);
              y = ag::ops::conv2d(x, w, ag::Tensor(), {.padding = {1, 1}});
            }
            ag::ops::sum(y).backward();
            x.set_grad(ag::Tensor());
            w.set_grad(ag::Tensor());
          },
          2, 10);
      tflops[static_cast<size_t>(column++)] = flop / seconds / 1e12;
    }
    // The forward in float32 (no TF32) against the CPU's: the same sums in another order.
    const std::vector<float> gpu = ag::ops::conv2d(x_cpu.to(ag::Device::kCUDA), w_cpu.to(ag::Device::kCUDA),
                                                   ag::Tensor(), {.padding = {1, 1}})
                                       .to_vector();
    const std::vector<float> cpu = ag::ops::conv2d(x_cpu, w_cpu, ag::Tensor(), {.padding = {1, 1}}).to_vector();
    double worst = 0, scale = 0;
    for (size_t i = 0; i < cpu.size(); ++i) {
      worst = std::max(worst, std::isnan(gpu[i]) ? INFINITY : std::abs(static_cast<double>(gpu[i]) - cpu[i]));
      scale = std::max(scale, std::abs(static_cast<double>(cpu[i])));
    }
    const bool ok = worst <= 1e-5 * scale;
    if (!ok) all_checks_passed = false;
    char name[64];
    std::snprintf(name, sizeof name, "x [%lld, %lld, %lld, %lld]", static_cast<long long>(shape[0]),
                  static_cast<long long>(shape[1]), static_cast<long long>(shape[2]), static_cast<long long>(shape[3]));
    std::printf("  %-42s %5.1f TF/s %5.1f TF/s %5.1f TF/s %5.1f TF/s  %s (max |diff| %.1e of %.1e)\n", name, tflops[0],
                tflops[1], tflops[2], tflops[3], ok ? "ok" : "WRONG", worst, scale);
  }
}

// examples/fashion_mnist's CNN training step (--model=cnn: two conv-BN-ReLU-pool stages, Adam;
// bench/workloads.h fashion_workload) on the GPU, batch 128 of one fixed random batch, in FP32,
// FP16 AMP, BF16 autocast and FP8 (a Float8Guard in BF16 autocast: the convolutions' and
// linears' GEMMs). Checks: every loss finite and going down, and the first FP32 loss the CPU's
// (the same weights and data) to FP32 summation order.
void cnn_rows() {
  using ag::bench::Precision;
  std::printf("\n%-44s %10s %10s %10s %10s\n", "fashion CNN training step, batch 128", "fp32", "fp16 amp", "bf16",
              "fp8");
  std::array<StepResult, 4> r{};
  constexpr std::array<Precision, 4> kPrecisions{Precision::kFp32, Precision::kAmp, Precision::kAmpBf16,
                                                 Precision::kFp8};
  for (size_t i = 0; i < kPrecisions.size(); ++i) {
    ag::bench::Workload w = ag::bench::fashion_workload(kPrecisions[i], ag::fashion::Model::kCnn, ag::Device::kCUDA);
    r[i] = time_steps([&] { w.step(); }, [&] { return w.loss.item(); }, 20);
  }
  ag::bench::Workload cpu = ag::bench::fashion_workload(Precision::kFp32, ag::fashion::Model::kCnn);
  cpu.step();
  const double cpu_loss = cpu.loss.item();
  bool ok = std::abs(r[0].first_loss - cpu_loss) <= 1e-4 * std::abs(cpu_loss);
  for (const StepResult& s : r) {
    ok = ok && std::isfinite(s.first_loss) && std::isfinite(s.last_loss) && s.last_loss < s.first_loss;
  }
  if (!ok) all_checks_passed = false;
  std::printf("  %-42s %7.2f ms %7.2f ms %7.2f ms %7.2f ms\n", "step", r[0].seconds * 1e3, r[1].seconds * 1e3,
              r[2].seconds * 1e3, r[3].seconds * 1e3);
  std::printf("  %-42s %7.0f MiB %6.0f MiB %6.0f MiB %6.0f MiB\n", "device memory peak (tensors)", r[0].peak_mib,
              r[1].peak_mib, r[2].peak_mib, r[3].peak_mib);
  std::printf("  %-42s %s (first fp32 loss %.6g, the CPU's %.6g; last losses %.4g %.4g %.4g %.4g)\n", "losses",
              ok ? "ok" : "WRONG", r[0].first_loss, cpu_loss, r[0].last_loss, r[1].last_loss, r[2].last_loss,
              r[3].last_loss);
  const std::array<const char*, 4> names{"fp32", "fp16 amp", "bf16", "fp8"};
  for (size_t i = 0; i < r.size(); ++i) print_launch_profile(std::string("cnn ") + names[i], r[i]);
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each row reaches the log as it is measured, also when a timeout ends the run
  if (!ag::cuda_is_available()) {
    const char* required = std::getenv("AMPGRAD_REQUIRE_CUDA");
    const bool fail = required != nullptr && std::string(required) == "1";
    std::printf("no CUDA device: %s%s\n", ag::cuda::unavailable_reason().c_str(),
                fail ? " (FAILED: AMPGRAD_REQUIRE_CUDA=1)" : "; nothing to benchmark");
    return fail ? 1 : 0;
  }
  std::printf("%-30s %12s %12s %7s  %s\n", "GEMM out = x w^T (n x n x n)", "ampgrad", "cuBLAS", "ratio", "check");
  double ratio_8192_fp16 = 0;
  const RawGemm raw_gemm;
  for (int n : {1024, 4096, 8192}) {
    for (ag::DType dtype : {ag::DType::kFloat16, ag::DType::kBFloat16, ag::DType::kFloat32}) {
      ag::manual_seed(static_cast<uint64_t>(n));
      const ag::Tensor x = ag::randn({n, n}, dtype, ag::Device::kCUDA);
      const ag::Tensor w = ag::randn({n, n}, dtype, ag::Device::kCUDA);
      ag::Tensor ours, raw = ag::Tensor::empty({n, n}, dtype, ag::Device::kCUDA);
      const int iters = n >= 8192 ? 10 : 20;
      const double flop = 2.0 * n * n * static_cast<double>(n);
      const double ours_tf = flop / time_per_call([&] { ours = ag::ops::linear(x, w); }, 3, iters) / 1e12;
      const double raw_tf = flop / time_per_call([&] { raw_gemm(x, w, raw); }, 3, iters) / 1e12;
      if (dtype == ag::DType::kFloat16 && n == 8192) ratio_8192_fp16 = ours_tf / raw_tf;
      const std::string check = n >= 4096 ? check_gemm(x, w, ours, raw) : "-";
      std::printf("  %-8s n=%-19d %7.1f TF/s %7.1f TF/s %7.2f  %s\n", std::string(ag::dtype_name(dtype)).c_str(), n, ours_tf, raw_tf,
                  ours_tf / raw_tf, check.c_str());
    }
  }

  float8_gemm_rows(raw_gemm);

  ag::manual_seed(0);
  ag::nn::Sequential seed{ag::nn::Linear(10, 1)};
  seed.to(ag::Device::kCUDA);
  const ag::Tensor sx = ag::randn({64, 10}, ag::DType::kFloat32, ag::Device::kCUDA);
  const ag::Tensor sy = ag::randn({64, 1}, ag::DType::kFloat32, ag::Device::kCUDA);
  const StepResult seed32 = train_step(seed, sx, sy, ag::DType::kFloat32, 200);
  const StepResult seed_amp = train_step(seed, sx, sy, ag::DType::kFloat16, 200);

  ag::nn::Sequential mlp{ag::nn::Linear(4096, 4096), ag::nn::ReLU(), ag::nn::Linear(4096, 4096), ag::nn::ReLU(),
                         ag::nn::Linear(4096, 4096)};
  mlp.to(ag::Device::kCUDA);
  const ag::Tensor mx = ag::randn({4096, 4096}, ag::DType::kFloat32, ag::Device::kCUDA);
  const ag::Tensor my = ag::randn({4096, 4096}, ag::DType::kFloat32, ag::Device::kCUDA);
  const StepResult mlp32 = train_step(mlp, mx, my, ag::DType::kFloat32, 10);
  const StepResult mlp_amp = train_step(mlp, mx, my, ag::DType::kFloat16, 10);
  const StepResult mlp_bf16 = train_step(mlp, mx, my, ag::DType::kBFloat16, 10);

  std::printf("\n%-34s %12s %12s %10s\n", "training step (Adam)", "fp32", "amp", "fp32/amp");
  std::printf("  %-32s %9.1f us %9.1f us %9.2f\n", "seed Linear(10,1), batch 64", seed32.seconds * 1e6,
              seed_amp.seconds * 1e6, seed32.seconds / seed_amp.seconds);
  std::printf("  %-32s %9.2f ms %9.2f ms %9.2f\n", "mlp 3x4096, batch 4096", mlp32.seconds * 1e3,
              mlp_amp.seconds * 1e3, mlp32.seconds / mlp_amp.seconds);
  std::printf("  %-32s %8.0f MiB %8.0f MiB\n", "mlp device memory peak (tensors)", mlp32.peak_mib, mlp_amp.peak_mib);
  std::printf("  %-32s %8.0f MiB %8.0f MiB\n", "mlp reserved (this run alone)", mlp32.reserved_mib,
              mlp_amp.reserved_mib);
  std::printf("  %-32s %12.2f %12.2f\n", "seed host syncs per step", seed32.syncs_per_step, seed_amp.syncs_per_step);
  std::printf("  %-32s %12.2f %12.2f\n", "mlp host syncs per step", mlp32.syncs_per_step, mlp_amp.syncs_per_step);
  std::printf("  %-32s %s\n", "seed losses", check_losses(seed32, seed_amp).c_str());
  std::printf("  %-32s %s\n", "mlp losses", check_losses(mlp32, mlp_amp).c_str());
  std::printf("  %-32s %9.2f ms (fp32/bf16 %.2f, host syncs per step %.2f, peak %.0f MiB)\n", "mlp step in BF16 AMP",
              mlp_bf16.seconds * 1e3, mlp32.seconds / mlp_bf16.seconds, mlp_bf16.syncs_per_step, mlp_bf16.peak_mib);
  std::printf("  %-32s %s\n", "mlp losses, BF16", check_losses(mlp32, mlp_bf16, 4e-2).c_str());
  const std::array<std::pair<const char*, const StepResult*>, 3> mlp_runs{
      {{"fp32", &mlp32}, {"fp16 amp", &mlp_amp}, {"bf16 amp", &mlp_bf16}}};
  std::printf("  %-32s %26s\n", "mlp phases, each timed alone", "forward  backward optimizer");
  for (const auto& [name, r] : mlp_runs) {
    std::printf("    %-30s %6.2f ms %6.2f ms %6.2f ms\n", name, r->phase_ms[0], r->phase_ms[1], r->phase_ms[2]);
  }
  for (const auto& [name, r] : mlp_runs) print_launch_profile(std::string("mlp ") + name, *r);

  // char_gpt's step at the example's size, at kGptLarge's (nanoGPT's Shakespeare-char model), and
  // at GPT-2 small's (124M parameters, vocabulary 50304) with T = 1024 and batch 8.
  struct GptRow {
    std::string name, tag;
    ag::bench::GptShape shape;
    int iters;
    std::array<StepResult, 3> r;  // fp32, fp16 amp, bf16 amp
  };
  ag::bench::GptShape gpt2 = ag::bench::kGpt2Small;
  gpt2.block_size = 1024;
  gpt2.batch = 8;
  std::array<GptRow, 3> gpt_rows{GptRow{"gpt 4x128, T 64, batch 16", "gpt 4x128", {}, 50, {}},
                                 GptRow{"gpt 6x384, T 256, batch 64", "gpt 6x384", ag::bench::kGptLarge, 20, {}},
                                 GptRow{"gpt2 124M, T 1024, batch 8", "gpt2 124M", gpt2, 10, {}}};
  using ag::bench::Precision;
  constexpr std::array<Precision, 3> kGptPrecisions{Precision::kFp32, Precision::kAmp, Precision::kAmpBf16};
  for (GptRow& row : gpt_rows) {
    for (size_t i = 0; i < kGptPrecisions.size(); ++i) row.r[i] = gpt_step(row.shape, kGptPrecisions[i], row.iters);
  }
  std::printf("\n%-34s %12s %12s %12s %10s %10s\n", "training step (AdamW, clipping)", "fp32", "fp16 amp", "bf16 amp",
              "fp32/fp16", "fp32/bf16");
  for (const GptRow& row : gpt_rows) {
    std::printf("  %-32s %9.2f ms %9.2f ms %9.2f ms %10.2f %10.2f\n", row.name.c_str(), row.r[0].seconds * 1e3,
                row.r[1].seconds * 1e3, row.r[2].seconds * 1e3, row.r[0].seconds / row.r[1].seconds,
                row.r[0].seconds / row.r[2].seconds);
  }
  for (const GptRow& row : gpt_rows) {
    std::printf("  %-32s %8.0f MiB %8.0f MiB %8.0f MiB\n", (row.tag + " peak (tensors)").c_str(),
                row.r[0].peak_mib, row.r[1].peak_mib, row.r[2].peak_mib);
  }
  for (const GptRow& row : gpt_rows) {
    std::printf("  %-32s %12.2f %12.2f %12.2f\n", (row.tag + " host syncs per step").c_str(),
                row.r[0].syncs_per_step, row.r[1].syncs_per_step, row.r[2].syncs_per_step);
  }
  std::printf("  %-32s %s\n", "", "(embedding's and cross_entropy's id checks wait once each; FP16 AMP's found-inf once more)");
  for (const GptRow& row : gpt_rows) {
    std::printf("  %-32s %s\n", (row.tag + " losses, FP16").c_str(),
                check_losses(row.r[0], row.r[1]).c_str());
    std::printf("  %-32s %s\n", (row.tag + " losses, BF16").c_str(),
                check_losses(row.r[0], row.r[2], 4e-2).c_str());
  }
  {
    // Tokens/s and model FLOP utilisation of the GPT-2 row: 6 N + 6 L T C FLOP per token (the
    // matrices' forward and backward, and causal attention's), against 989 TFLOP/s, an H100's or
    // H200's dense BF16 peak.
    const GptRow& row = gpt_rows.back();
    const double tokens = static_cast<double>(row.shape.batch * row.shape.block_size);
    const double c = static_cast<double>(row.shape.n_embd), l = static_cast<double>(row.shape.n_layer);
    const double params = l * 12 * c * c + static_cast<double>(row.shape.vocab_size) * c;
    const double flop_per_token = 6 * params + 6 * l * static_cast<double>(row.shape.block_size) * c;
    std::printf("  %-32s", (row.tag + " tokens/s (MFU)").c_str());
    for (const StepResult& r : row.r) {
      std::printf(" %9.0f (%4.1f%%)", tokens / r.seconds, 100 * tokens / r.seconds * flop_per_token / 989e12);
    }
    std::printf("\n");
  }
  {
    // GPT-2 small with its linears' GEMMs in FP8 (the rest in BF16), beside the BF16 AMP step.
    const GptRow& row = gpt_rows.back();
    const StepResult fp8 = gpt_step(row.shape, Precision::kFp8, row.iters);
    std::printf("  %-32s %9.2f ms (bf16 amp %.2f ms, bf16/fp8 %.2f, host syncs per step %.2f, peak %.0f MiB)\n",
                (row.tag + " step, FP8 linears").c_str(), fp8.seconds * 1e3, row.r[2].seconds * 1e3,
                row.r[2].seconds / fp8.seconds, fp8.syncs_per_step, fp8.peak_mib);
    std::printf("  %-32s %s\n", (row.tag + " losses, FP8").c_str(), check_losses(row.r[0], fp8, 6e-2).c_str());
    print_launch_profile(row.tag + " fp8", fp8);
  }
  for (const GptRow* row : {&gpt_rows[1], &gpt_rows.back()}) {
    for (size_t i = 0; i < kGptPrecisions.size(); ++i) {
      print_launch_profile(row->tag + " " + std::array{"fp32", "fp16 amp", "bf16 amp"}[i], row->r[i]);
    }
  }

  conv_rows();
  cnn_rows();

  const double speedup = mlp32.seconds / mlp_amp.seconds;
  std::printf("\ntargets: fp16 linear at 8192^3 >= 0.70 of cuBLAS: %.2f %s;  AMP mlp step <= 0.5x fp32: %.2fx %s;  "
              "AMP host syncs per step <= 1: %.2f %s\n",
              ratio_8192_fp16, ratio_8192_fp16 >= 0.7 ? "MET" : "MISSED", 1.0 / speedup,
              speedup >= 2.0 ? "MET" : "MISSED", mlp_amp.syncs_per_step, mlp_amp.syncs_per_step <= 1.0 ? "MET" : "MISSED");
  std::printf("checks: %s\n", all_checks_passed ? "all ok" : "FAILED");
  return all_checks_passed ? 0 : 1;
}

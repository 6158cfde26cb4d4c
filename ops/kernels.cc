// Backend selection for kernels: one small switch per kernel, no registries.
#include "ops/kernels.h"

#include "framework/error.h"
#include "ops/cpu/kernels_cpu.h"

#if defined(AMPGRAD_WITH_CUDA)
#include "ops/cuda/kernels_cuda.h"
#define AG_BACKEND(device, call)                         \
  do {                                                   \
    if ((device) == Device::kCUDA) {                     \
      cuda::call;                                        \
    } else {                                             \
      cpu::call;                                         \
    }                                                    \
  } while (false)
#else
#define AG_BACKEND(device, call)                                                                \
  do {                                                                                          \
    AG_CHECK((device) == Device::kCPU, "this build of ampgrad has no CUDA backend; hint: keep ", \
             "tensors on Device::kCPU");                                                        \
    cpu::call;                                                                                  \
  } while (false)
#endif

namespace ampgrad::kernels {

void gemm(const Tensor& a, Transpose trans_a, const Tensor& b, Transpose trans_b, const Tensor& bias, Tensor& out) {
  AG_BACKEND(out.device(), gemm(a, trans_a, b, trans_b, bias, out));
}
void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  AG_BACKEND(out.device(), binary(op, a, b, out));
}
void affine(const Tensor& src, double alpha, double beta, Tensor& out) {
  AG_BACKEND(out.device(), affine(src, alpha, beta, out));
}
void sum_to(const Tensor& x, double alpha, Tensor& out) { AG_BACKEND(out.device(), sum_to(x, alpha, out)); }
void relu(const Tensor& x, Tensor& y) { AG_BACKEND(y.device(), relu(x, y)); }
void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) { AG_BACKEND(dx.device(), relu_backward(x, dy, dx)); }
void mse_forward(const Tensor& pred, const Tensor& target, Tensor& loss) {
  AG_BACKEND(loss.device(), mse_forward(pred, target, loss));
}
void mse_backward(const Tensor& pred, const Tensor& target, const Tensor& dloss, Tensor& dpred, Tensor& dtarget) {
  AG_BACKEND(dpred.device(), mse_backward(pred, target, dloss, dpred, dtarget));
}

}  // namespace ampgrad::kernels

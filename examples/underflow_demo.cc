// Why loss scaling matters, made visible: the same training run in FP32, and in FP16 autocast
// without scaling, with a static scale and with the dynamic GradScaler.
#include <cstdio>

#include "examples/underflow.h"

int main() {
  using underflow::Mode;
  underflow::Config config;
  std::printf("Teacher-student MLP 32-64-1, Adam lr 1e-3, %lld steps, loss weighted by %.0e\n",
              static_cast<long long>(config.steps), config.loss_weight);
  const underflow::Result fp32 = underflow::train(Mode::kFp32, config);
  std::printf("median |true gradient| at step 0: %.2e (FP16's smallest subnormal is 6.0e-08)\n\n",
              fp32.median_abs_fp32_grad);
  std::printf("%-26s %12s %12s %10s %12s\n", "mode", "final loss", "zero grads", "skipped", "final scale");
  for (Mode mode : {Mode::kFp32, Mode::kFp16NoScaling, Mode::kFp16StaticScale, Mode::kFp16DynamicScale}) {
    const underflow::Result r = mode == Mode::kFp32 ? fp32 : underflow::train(mode, config);
    std::printf("%-26s %12.4e %11.1f%% %10lld %12.0f\n", underflow::mode_name(mode).c_str(), r.final_loss,
                100.0 * r.zero_grad_fraction, static_cast<long long>(r.skipped_steps), r.final_scale);
  }
  return 0;
}

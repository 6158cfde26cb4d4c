// Bad input at every public entry point: each row calls one with wrong shapes, ranks, dtypes,
// devices, undefined/empty tensors, overflowing shapes, NaN/inf or invalid options, and states the
// outcome: an ampgrad::Error whose message names the problem, or a documented correct result.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "ampgrad.h"
#include "framework/dispatch.h"

namespace ag = ampgrad;
using ag::DType;
using ag::Device;
using ag::Tensor;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kHuge = int64_t{1} << 40;  // two of these overflow any element count
constexpr int64_t kUnmappable = int64_t{1} << 56;  // a valid count whose doubles exceed any address space

// One call and the substrings its Error message must contain.
struct ErrorRow {
  const char* name;
  std::function<void()> call;
  std::vector<std::string> expected;
};

Tensor t(const ag::Shape& shape, DType dtype = DType::kFloat32) {
  ag::manual_seed(7);
  return ag::randn(shape, dtype);
}

void run_rows(const std::vector<ErrorRow>& rows) {
  for (const ErrorRow& row : rows) {
    SCOPED_TRACE(row.name);
    try {
      row.call();
      ADD_FAILURE() << row.name << ": no Error was thrown";
    } catch (const ag::Error& e) {
      const std::string message = e.what();
      for (const std::string& part : row.expected) {
        EXPECT_NE(message.find(part), std::string::npos) << row.name << ": '" << part << "' not in: " << message;
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << row.name << ": threw a non-ampgrad exception: " << e.what();
    }
  }
}

TEST(BadInput, TensorCreation) {
  run_rows({
      {"from_vector count", [] { Tensor::from_vector(std::vector<float>{1, 2, 3}, {2, 2}); }, {"from_vector", "[2, 2]"}},
      {"from_vector negative", [] { Tensor::from_vector(std::vector<float>{1}, {-1}); }, {"[-1]", "negative"}},
      {"zeros negative", [] { ag::zeros({-2, 3}); }, {"[-2, 3]", "negative"}},
      {"zeros overflow", [] { ag::zeros({kHuge, kHuge}); }, {"[1099511627776, 1099511627776]", "too many"}},
      {"full overflow", [] { ag::full({std::numeric_limits<int64_t>::max(), 2}, 1.0); }, {"too many"}},
      {"randn overflow", [] { ag::randn({kHuge, kHuge}, DType::kFloat16); }, {"too many"}},
      {"uniform overflow", [] { ag::uniform({kHuge, 1, kHuge}, 0, 1); }, {"too many"}},
      {"empty overflow", [] { Tensor::empty({kHuge, kHuge}); }, {"too many"}},
      // 2^60 bytes: a valid count that no allocator can satisfy.
      {"empty out of memory", [] { Tensor::empty({int64_t{1} << 58}); }, {"out of CPU memory"}},
      // Host temporaries are tensors too: randn/uniform draw 2^56 doubles (2^59 bytes) through the
      // allocator, not into a std::vector that would throw std::bad_alloc.
      {"randn out of memory", [] { ag::randn({kUnmappable}); }, {"out of CPU memory"}},
      {"uniform out of memory", [] { ag::uniform({kUnmappable}, 0, 1, DType::kFloat16); }, {"out of CPU memory"}},
      {"Linear out of memory", [] { ag::nn::Linear l(int64_t{1} << 28, int64_t{1} << 28); }, {"out of CPU memory"}},
      {"uniform low > high", [] { ag::uniform({2}, 1.0, 0.0); }, {"uniform", "low"}},
      {"uniform NaN bound", [] { ag::uniform({2}, kNaN, 1.0); }, {"uniform", "finite", "nan"}},
      {"uniform inf bound", [] { ag::uniform({2}, 0.0, kInf); }, {"uniform", "inf"}},
      {"zeros on CUDA", [] { ag::zeros({2, 2}, DType::kFloat32, Device::kCUDA); }, {"CUDA"}},
      {"from_vector on CUDA",
       [] { Tensor::from_vector(std::vector<float>{1}, {1}, DType::kFloat32, Device::kCUDA); }, {"CUDA"}},
      {"to(CUDA)", [] { t({2}).to(Device::kCUDA); }, {"CUDA"}},
      {"item of many", [] { t({2, 3}).item(); }, {"item()", "[2, 3]"}},
      {"size out of range", [] { t({2, 3}).size(2); }, {"size(2)", "[2, 3]"}},
      {"undefined shape", [] { Tensor().shape(); }, {"undefined"}},
      {"undefined to_vector", [] { Tensor().to_vector(); }, {"undefined"}},
      {"undefined to", [] { Tensor().to(DType::kFloat16); }, {"undefined"}},
      {"undefined pin_memory", [] { Tensor().pin_memory(); }, {"pin_memory", "undefined"}},
      {"undefined is_pinned", [] { (void)Tensor().is_pinned(); }, {"is_pinned", "undefined"}},
      {"set_grad shape", [] { Tensor p = t({2, 3}); p.set_grad(t({3, 2})); }, {"set_grad", "[3, 2]", "[2, 3]"}},
      {"set_master dtype",
       [] { Tensor p = t({2}, DType::kFloat16); p.set_master(t({2}, DType::kFloat16)); }, {"set_master", "float16"}},
      {"backward non-scalar", [] { Tensor p = t({2, 3}); p.set_requires_grad(true); (p * 2.0f).backward(); }, {"[2, 3]"}},
      {"backward wrong grad",
       [] { Tensor p = t({2, 3}); p.set_requires_grad(true); (p * 2.0f).backward(t({3, 2})); }, {"[3, 2]"}},
  });
}

TEST(BadInput, Ops) {
  using namespace ag::ops;
  run_rows({
      {"linear inner dims", [] { linear(t({4, 3}), t({5, 4})); }, {"linear", "[4, 3]", "[5, 4]"}},
      {"linear x rank", [] { linear(t({}), t({5, 4})); }, {"linear", "[]"}},
      {"linear w rank", [] { linear(t({2, 4}), t({5, 4, 1})); }, {"linear", "[5, 4, 1]"}},
      {"linear bias shape", [] { linear(t({2, 4}), t({5, 4}), t({3})); }, {"linear", "[3]"}},
      {"linear dtypes", [] { linear(t({2, 4}, DType::kFloat16), t({5, 4})); }, {"linear", "float16", "float32"}},
      {"linear undefined", [] { linear(Tensor(), t({5, 4})); }, {"linear", "undefined"}},
      {"linear undefined w", [] { linear(t({2, 4}), Tensor()); }, {"linear", "undefined"}},
      {"matmul inner dims", [] { matmul(t({2, 3}), t({4, 5})); }, {"matmul", "[2, 3]", "[4, 5]"}},
      {"matmul rank", [] { matmul(t({}), t({4, 5})); }, {"matmul", "rank >= 1"}},
      {"matmul batch", [] { matmul(t({2, 3, 4}), t({3, 4, 5})); }, {"matmul", "[2]", "[3]"}},
      {"matmul dtypes", [] { matmul(t({2, 3}), t({3, 5}, DType::kFloat64)); }, {"matmul", "float64"}},
      {"add shapes", [] { add(t({2, 3}), t({4, 3})); }, {"add", "[2, 3]", "[4, 3]"}},
      {"sub shapes", [] { sub(t({2, 3}), t({2})); }, {"sub", "[2, 3]", "[2]"}},
      {"mul shapes", [] { mul(t({3, 2}), t({2, 3})); }, {"mul", "[3, 2]", "[2, 3]"}},
      {"add undefined", [] { add(t({2}), Tensor()); }, {"add", "undefined"}},
      {"operator+ shapes", [] { (void)(t({2, 3}) + t({3, 3})); }, {"add", "[2, 3]", "[3, 3]"}},
      {"operator- shapes", [] { (void)(t({5}) - t({4})); }, {"sub", "[5]", "[4]"}},
      {"operator* shapes", [] { (void)(t({5}) * t({4})); }, {"mul", "[5]", "[4]"}},
      {"operator* undefined", [] { (void)(Tensor() * 2.0f); }, {"undefined"}},
      {"negate undefined", [] { (void)(-Tensor()); }, {"undefined"}},
      {"relu undefined", [] { relu(Tensor()); }, {"relu", "undefined"}},
      {"sum undefined", [] { sum(Tensor()); }, {"sum", "undefined"}},
      {"mean undefined", [] { mean(Tensor()); }, {"mean", "undefined"}},
      {"mse_loss shapes", [] { mse_loss(t({4, 1}), t({4})); }, {"mse_loss", "[4, 1]", "[4]"}},
      {"mse_loss undefined", [] { mse_loss(t({4}), Tensor()); }, {"mse_loss", "undefined"}},
      {"scale undefined", [] { scale(Tensor(), 2.0); }, {"ops::scale", "undefined"}},
      {"cast undefined", [] { cast(Tensor(), DType::kFloat16); }, {"undefined"}},
      {"set_num_threads 0", [] { ag::set_num_threads(0); }, {"set_num_threads", "0"}},
  });
}

TEST(BadInput, ModulesOptimizersScalerAutocast) {
  namespace nn = ag::nn;
  namespace optim = ag::optim;
  namespace amp = ag::amp;
  auto params = [] { Tensor p = t({3}); p.set_requires_grad(true); return std::vector<Tensor>{p}; };
  run_rows({
      {"Linear(0, 3)", [] { nn::Linear(0, 3); }, {"nn::Linear(0, 3)"}},
      {"Linear(-1, 3)", [] { nn::Linear(-1, 3); }, {"nn::Linear(-1, 3)"}},
      {"Linear overflow", [] { nn::Linear(kHuge, kHuge); }, {"too many"}},
      {"Linear forward shape", [] { nn::Linear l(3, 2); l(t({4, 5})); }, {"linear", "[4, 5]", "[2, 3]"}},
      {"Linear forward dtype", [] { nn::Linear l(3, 2); l(t({4, 3}, DType::kFloat64)); }, {"linear", "float64"}},
      {"Linear to CUDA", [] { nn::Linear l(3, 2); l.to(Device::kCUDA); }, {"CUDA"}},
      {"Sequential shapes",
       [] { nn::Sequential m{nn::Linear(3, 4), nn::ReLU(), nn::Linear(5, 1)}; m(t({2, 3})); }, {"linear", "[2, 4]", "[1, 5]"}},
      {"Sequential index", [] { nn::Sequential m{nn::ReLU()}; m[3]; }, {"Sequential", "3"}},
      {"SGD lr", [&] { optim::SGD(params(), {.lr = -1}); }, {"learning rate", "-1"}},
      {"SGD lr NaN", [&] { optim::SGD(params(), {.lr = kNaN}); }, {"learning rate", "nan"}},
      {"SGD momentum", [&] { optim::SGD(params(), {.momentum = -0.5}); }, {"SGD", "momentum"}},
      {"SGD nesterov", [&] { optim::SGD(params(), {.nesterov = true}); }, {"SGD", "nesterov"}},
      {"SGD weight_decay inf", [&] { optim::SGD(params(), {.weight_decay = kInf}); }, {"SGD", "weight_decay"}},
      {"SGD undefined param", [] { optim::SGD({Tensor()}, {}); }, {"parameter 0", "undefined"}},
      {"SGD non-leaf param", [&] { optim::SGD({params()[0] * 2.0f}, {}); }, {"parameter 0", "[3]"}},
      {"SGD float64 param", [] { optim::SGD({t({2}, DType::kFloat64)}, {}); }, {"parameter 0", "float64"}},
      {"SGD duplicate param", [&] { auto p = params(); optim::SGD({p[0], p[0]}, {}); }, {"same tensor"}},
      {"Adam beta1", [&] { optim::Adam(params(), {.beta1 = 1.0}); }, {"Adam", "beta1"}},
      {"Adam beta2 NaN", [&] { optim::Adam(params(), {.beta2 = kNaN}); }, {"Adam", "beta2"}},
      {"Adam eps", [&] { optim::Adam(params(), {.eps = -1e-8}); }, {"Adam", "eps"}},
      {"Adam lr inf", [&] { optim::Adam(params(), {.lr = kInf}); }, {"learning rate", "inf"}},
      {"AdamW weight_decay", [&] { optim::AdamW(params(), {.weight_decay = -1}); }, {"AdamW", "weight_decay"}},
      {"set_lr NaN", [&] { optim::SGD opt(params(), {}); opt.set_lr(kNaN); }, {"learning rate"}},
      {"load_state count", [&] { optim::Adam opt(params(), {}); opt.load_state({}); }, {"Adam::load_state", "0"}},
      {"load_state missing",
       [&] { optim::Adam opt(params(), {}); opt.load_state({optim::ParamState{}}); }, {"Adam::load_state", "parameter 0"}},
      {"load_state shape",
       [&] {
         optim::SGD opt(params(), {.momentum = 0.9});
         optim::ParamState s;
         s.tensors["momentum_buffer"] = t({4});
         opt.load_state({s});
       },
       {"SGD::load_state", "[4]"}},
      {"load_state kind",
       [&] {
         optim::SGD sgd(params(), {.momentum = 0.9});
         optim::ParamState s;
         s.tensors["momentum_buffer"] = t({3});
         sgd.load_state({s});
         optim::Adam adam(params(), {});
         adam.load_state(sgd.state());
       },
       {"Adam::load_state"}},
      {"scaler init_scale 0", [] { amp::GradScaler({.init_scale = 0}); }, {"init_scale"}},
      {"scaler init_scale NaN", [] { amp::GradScaler({.init_scale = kNaN}); }, {"init_scale", "nan"}},
      {"scaler growth_factor", [] { amp::GradScaler({.growth_factor = 1.0}); }, {"growth_factor"}},
      {"scaler backoff_factor", [] { amp::GradScaler({.backoff_factor = 1.5}); }, {"backoff_factor", "1.5"}},
      {"scaler growth_interval", [] { amp::GradScaler({.growth_interval = 0}); }, {"growth_interval"}},
      {"scaler min > max", [] { amp::GradScaler({.min_scale = 4, .max_scale = 2}); }, {"GradScaler"}},
      {"scaler update(0)", [] { amp::GradScaler s; s.update(0.0); }, {"update", "0"}},
      {"scaler update(inf)", [] { amp::GradScaler s; s.update(kInf); }, {"update", "inf"}},
      {"scaler scale undefined", [] { amp::GradScaler s; s.scale(Tensor()); }, {"scale", "undefined"}},
      {"scaler step before scale", [&] { amp::GradScaler s; optim::SGD o(params(), {}); s.step(o); }, {"step"}},
      {"scaler update before scale", [] { amp::GradScaler s; s.update(); }, {"update"}},
      {"scaler load_state tracker",
       [] { amp::GradScaler s; amp::GradScalerState st; st.growth_tracker = 5000; s.load_state(st); }, {"growth_tracker"}},
      {"autocast float64", [] { amp::AutocastGuard g(Device::kCPU, DType::kFloat64); }, {"AutocastGuard", "float64"}},
      {"autocast float32", [] { amp::AutocastGuard g(Device::kCPU, DType::kFloat32); }, {"AutocastGuard", "float32"}},
      {"clip max_norm", [&] { ag::nn::utils::clip_grad_norm_(params(), -1); }, {"clip_grad_norm_", "-1"}},
      {"clip tensor norm_type",
       [&] { ag::nn::utils::clip_grad_norm_tensor_(params(), 1, {.norm_type = -2}); }, {"norm_type", "-2"}},
  });
}

TEST(BadInput, CheckpointIO) {
  namespace ck = ag::checkpoint;
  const std::string dir = testing::TempDir();
  run_rows({
      {"load missing", [] { ck::load_safetensors("/nonexistent/x.safetensors"); }, {"/nonexistent/x.safetensors", "open"}},
      {"load a folder", [&] { ck::load_safetensors(dir); }, {dir, "regular file"}},
      {"parse empty", [] { ck::parse_safetensors("", "mem"); }, {"mem", "truncated"}},
      {"parse huge header", [] { ck::parse_safetensors(std::string("\xff\xff\xff\xff\xff\xff\xff\xff", 8), "mem"); },
       {"mem", "header length"}},
      {"parse not JSON", [] { ck::parse_safetensors(std::string("\x02\0\0\0\0\0\0\0{x", 10), "mem"); }, {"mem", "JSON"}},
      {"save to missing folder", [] { ck::save_safetensors("/nonexistent/x.safetensors", {}); }, {"/nonexistent/x"}},
      {"save undefined tensor",
       [&] { ck::save_safetensors(dir + "/u.safetensors", {.tensors = {{"w", Tensor()}}}); }, {"'w'", "undefined"}},
      {"save duplicate name",
       [&] { ck::save_safetensors(dir + "/d.safetensors", {.tensors = {{"w", t({1})}, {"w", t({1})}}}); }, {"'w'"}},
      {"save_model to missing folder",
       [] { ag::nn::Linear l(2, 1); ck::save_model("/nonexistent/m.safetensors", l); }, {"/nonexistent/m"}},
      {"load_model missing", [] { ag::nn::Linear l(2, 1); ck::load_model("/nonexistent/m.safetensors", l); },
       {"/nonexistent/m.safetensors"}},
      {"load_model architecture",
       [&] {
         ag::nn::Linear small(2, 1), big(3, 1);
         ck::save_model(dir + "/m.safetensors", small);
         ck::load_model(dir + "/m.safetensors", big);
       },
       {"m.safetensors", "weight", "[1, 2]", "[1, 3]"}},
      {"save_checkpoint no model", [&] { ck::save_checkpoint(dir + "/c.safetensors", {}); }, {"model"}},
      {"load_checkpoint missing",
       [] { ag::nn::Linear l(2, 1); ck::TrainingState s{.model = &l}; ck::load_checkpoint("/nonexistent/c", s); },
       {"/nonexistent/c"}},
  });
}

// An op whose kernel runs out of host memory for its scratch, in the forward or the backward.
struct HungryOp {
  static constexpr ag::OpInfo kInfo{"hungry", ag::CastPolicy::kNone};
  bool in_forward;
  void check(const Tensor&) const {}
  Tensor forward(ag::SavedTensors&, const Tensor& x) const {
    if (in_forward) throw std::bad_alloc();
    return x.detach();
  }
  std::vector<Tensor> backward(const ag::SavedTensors&, const Tensor&) const { throw std::bad_alloc(); }
};

TEST(BadInput, KernelScratchOutOfMemoryIsAnError) {
  Tensor x = ag::ones({2, 3});
  x.set_requires_grad(true);
  run_rows({
      {"forward", [&] { ag::dispatch(HungryOp{.in_forward = true}, x); }, {"hungry", "out of host memory", "[2, 3]"}},
      {"backward", [&] { ag::ops::sum(ag::dispatch(HungryOp{.in_forward = false}, x)).backward(); },
       {"backward of hungry", "out of host memory"}},
  });
}

// Documented results rather than errors: empty tensors reduce as PyTorch does, NaN/inf propagate.
TEST(BadInput, DocumentedResults) {
  using namespace ag::ops;
  const Tensor empty = ag::zeros({0, 3});
  EXPECT_EQ(sum(empty).item(), 0.0f);
  EXPECT_TRUE(std::isnan(mean(empty).item()));
  EXPECT_TRUE(std::isnan(mse_loss(empty, empty).item()));
  EXPECT_EQ(relu(empty).shape(), (ag::Shape{0, 3}));
  EXPECT_EQ((empty + empty).numel(), 0);
  EXPECT_EQ(linear(empty, t({5, 3})).shape(), (ag::Shape{0, 5}));
  // A zero-length inner dimension sums nothing: the result is all zeros (plus the bias).
  EXPECT_EQ(matmul(ag::zeros({2, 0}), ag::zeros({0, 4})).to_vector(), std::vector<float>(8, 0.0f));
  EXPECT_EQ(linear(ag::zeros({2, 0}), ag::zeros({3, 0}), ag::full({3}, 1.5)).to_vector(),
            std::vector<float>(6, 1.5f));

  const Tensor bad = Tensor::from_vector(std::vector<float>{1, static_cast<float>(kNaN), 3}, {3});
  EXPECT_TRUE(std::isnan(sum(bad).item()));
  EXPECT_TRUE(std::isnan(mean(bad).item()));
  EXPECT_TRUE(std::isnan(relu(bad).to_vector()[1]));  // as PyTorch: relu does not hide a NaN
  EXPECT_TRUE(std::isnan((bad * 2.0f).to_vector()[1]));
  const Tensor infs = Tensor::from_vector(std::vector<float>{static_cast<float>(kInf), -static_cast<float>(kInf)}, {2});
  EXPECT_TRUE(std::isnan(sum(infs).item()));
  EXPECT_TRUE(std::isinf(mse_loss(infs, ag::zeros({2})).item()));
  // Out-of-range values round to inf in float16, as IEEE says.
  EXPECT_TRUE(std::isinf(Tensor::from_vector(std::vector<float>{1e5f}, {1}, DType::kFloat16).item()));
  // Autocast for CUDA is only per-thread state: legal without a GPU, and CPU ops ignore it.
  {
    ag::amp::AutocastGuard cuda_autocast(Device::kCUDA);
    EXPECT_TRUE(ag::amp::is_autocast_enabled(Device::kCUDA));
    EXPECT_EQ(linear(t({2, 3}), t({4, 3})).dtype(), DType::kFloat32);
  }
  EXPECT_FALSE(ag::amp::is_autocast_enabled(Device::kCUDA));
  // A disabled scaler is a pass-through: scale 1, the loss unchanged.
  ag::amp::GradScaler disabled({.enabled = false});
  EXPECT_EQ(disabled.get_scale(), 1.0);
  EXPECT_EQ(disabled.scale(ag::full({}, 3.0)).item(), 3.0f);
  // A NaN learning signal reaches the parameters under a plain optimizer (the scaler is what skips).
  Tensor p = ag::zeros({2});
  p.set_requires_grad(true);
  ag::optim::SGD opt({p}, {.lr = 0.1});
  sum(mul(p, ag::full({2}, kNaN))).backward();
  opt.step();
  EXPECT_TRUE(std::isnan(p.to_vector()[0]));
}

}  // namespace

// The 8-bit floats against PyTorch 2.x bit for bit (tests/data/float8_reference.safetensors, from
// tests/data/make_float8_reference.py): every code widened, float32 and float64 inputs around every
// rounding boundary and past the range, every float16 and bfloat16 bit pattern, the saturating
// cast; then what a tensor of them can do (casts, views, copies, gradients through casts, files)
// and the clear error of every op that computes.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "ampgrad.h"
#include "checkpoint/safetensors.h"
#include "ops/linear/linear_float8_kernels.h"
#include "test_util.h"

namespace ag = ampgrad;
namespace ck = ampgrad::checkpoint;
using ag::DType;
using ag::Tensor;

namespace {

constexpr const char* kReferenceFile = "tests/data/float8_reference.safetensors";

const ck::NamedTensors& reference() {
  static const ck::NamedTensors file = ck::load_safetensors(kReferenceFile);
  return file;
}

const Tensor& named(const std::string& name) {
  for (const auto& [n, t] : reference().tensors) {
    if (n == name) return t;
  }
  ADD_FAILURE() << "no tensor " << name << " in " << kReferenceFile;
  static const Tensor none;
  return none;
}

// The reference's U8 codes (read into int64) as bytes.
std::vector<uint8_t> codes_named(const std::string& name) {
  std::vector<uint8_t> out;
  for (int64_t c : named(name).to_vector<int64_t>()) out.push_back(static_cast<uint8_t>(c));
  return out;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  EXPECT_TRUE(ag::is_float8(t.dtype())) << t.to_string();
  const Tensor cpu = t.to(ag::Device::kCPU);
  const auto* p = static_cast<const uint8_t*>(cpu.data_ptr());
  return std::vector<uint8_t>(p, p + cpu.numel());
}

Tensor from_bytes(const std::vector<uint8_t>& bytes, DType dtype) {
  Tensor t = Tensor::empty({static_cast<int64_t>(bytes.size())}, dtype);
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

std::string prefix(DType dtype) { return dtype == DType::kFloat8E4M3 ? "e4m3" : "e5m2"; }

// Counts mismatches and reports the first few with their inputs.
template <typename In>
void expect_codes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, const std::vector<In>& inputs,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int wrong = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    if (++wrong <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: input " << static_cast<double>(inputs[i]) << " gave 0x" << std::hex
                    << int{got[i]} << ", PyTorch 0x" << int{want[i]};
    }
  }
  EXPECT_EQ(wrong, 0) << what << ": " << wrong << " of " << got.size() << " codes differ";
}

class Float8 : public ::testing::TestWithParam<DType> {};

TEST_P(Float8, WidensEveryCodeAsPyTorch) {
  const DType dtype = GetParam();
  std::vector<uint8_t> every(256);
  for (int c = 0; c < 256; ++c) every[static_cast<size_t>(c)] = static_cast<uint8_t>(c);
  const std::vector<float> want = named(prefix(dtype) + ".decode").to_vector();
  const std::vector<float> got = from_bytes(every, dtype).to(DType::kFloat32).to_vector();
  ASSERT_EQ(got.size(), 256u);
  for (int c = 0; c < 256; ++c) {
    EXPECT_EQ(std::bit_cast<uint32_t>(got[c]), std::bit_cast<uint32_t>(want[c])) << "code 0x" << std::hex << c;
  }
  // Every value that is not NaN holds in bfloat16 and float16 exactly (the CPU FP8 GEMM packs
  // them as bfloat16), and narrows back to its own code.
  for (int c = 0; c < 256; ++c) {
    if (std::isnan(want[c])) continue;
    EXPECT_EQ(ag::bfloat16_to_float(ag::float_to_bfloat16(want[c])), want[c]) << c;
    EXPECT_EQ(ag::half_to_float(ag::float_to_half(want[c])), want[c]) << c;
  }
  // NaN has several codes and narrows to one (checked against PyTorch in the narrowing tests).
  const std::vector<uint8_t> back = bytes_of(Tensor::from_vector(want, {256}).to(dtype));
  for (int c = 0; c < 256; ++c) {
    if (std::isnan(want[c])) continue;
    EXPECT_EQ(int{back[static_cast<size_t>(c)]}, c) << "value " << want[c];
  }
}

TEST_P(Float8, NarrowsFloat32AsPyTorchAndSaturates) {
  const DType dtype = GetParam();
  const std::string p = prefix(dtype);
  const std::vector<float> inputs = named(p + ".from_f32").to_vector();
  ASSERT_GT(inputs.size(), 20000u);
  const Tensor x = Tensor::from_vector(inputs, {static_cast<int64_t>(inputs.size())});
  expect_codes(bytes_of(x.to(dtype)), codes_named(p + ".from_f32.cast"), inputs, p + " cast");
  // One element at a time through the scalar conversion too (the bulk loop is the same code).
  std::vector<uint8_t> scalar;
  for (float v : inputs) {
    scalar.push_back(dtype == DType::kFloat8E4M3 ? ag::float_to_float8_e4m3(v).bits : ag::float_to_float8_e5m2(v).bits);
  }
  expect_codes(scalar, codes_named(p + ".from_f32.cast"), inputs, p + " scalar cast");
  // The saturating cast: clamp(-max, max) then cast, NaN kept.
  std::vector<uint8_t> saturated(inputs.size());
  if (dtype == DType::kFloat8E4M3) {
    ag::float_to_float8_saturated(inputs.data(), 1.0f, reinterpret_cast<ag::Float8E4M3*>(saturated.data()), inputs.size());
  } else {
    ag::float_to_float8_saturated(inputs.data(), 1.0f, reinterpret_cast<ag::Float8E5M2*>(saturated.data()), inputs.size());
  }
  expect_codes(saturated, codes_named(p + ".from_f32.saturate"), inputs, p + " saturate");
  // The FP8 linear's vectorised cast (its own branch-free code) gives the same codes, and the amax.
  Tensor q = Tensor::empty(x.shape(), dtype);
  const float amax = ag::kernels::cpu::quantize_float8(x, 1.0f, q).amax;
  expect_codes(bytes_of(q), codes_named(p + ".from_f32.saturate"), inputs, p + " linear's cast");
  EXPECT_TRUE(std::isnan(amax));  // the inputs hold NaN
}

TEST_P(Float8, NarrowsFloat64Float16AndBFloat16AsPyTorch) {
  const DType dtype = GetParam();
  const std::string p = prefix(dtype);
  const std::vector<double> inputs = named(p + ".from_f64").to_vector<double>();
  const Tensor x = Tensor::from_vector(inputs, {static_cast<int64_t>(inputs.size())});
  expect_codes(bytes_of(x.to(dtype)), codes_named(p + ".from_f64.cast"), inputs, p + " from float64");
  // Every 16-bit pattern, as float16 and as bfloat16.
  std::vector<uint16_t> patterns(65536);
  for (int i = 0; i < 65536; ++i) patterns[static_cast<size_t>(i)] = static_cast<uint16_t>(i);
  for (DType sixteen : {DType::kFloat16, DType::kBFloat16}) {
    Tensor t = Tensor::empty({65536}, sixteen);
    std::memcpy(t.data_ptr(), patterns.data(), 65536 * 2);
    const std::string name = p + (sixteen == DType::kFloat16 ? ".from_f16.cast" : ".from_bf16.cast");
    std::vector<double> widened = t.to_vector<double>();
    expect_codes(bytes_of(t.to(dtype)), codes_named(name), widened, name);
  }
}

TEST_P(Float8, TensorsCastViewCopyAndCarryGradientsThroughCasts) {
  const DType dtype = GetParam();
  const Tensor x = Tensor::from_vector(std::vector<float>{0.5f, -1.25f, 3.0f, 0.0f, 448.0f, -2.0f}, {2, 3});
  const Tensor q = x.to(dtype);
  EXPECT_EQ(q.dtype(), dtype);
  EXPECT_EQ(ag::element_size(dtype), 1u);
  EXPECT_EQ(q.to_vector(), x.to_vector());  // all exact in both formats
  // Views and copies move the bytes as they are.
  EXPECT_EQ(ag::ops::transpose(q, 0, 1).to(DType::kFloat32).to_vector(), ag::ops::transpose(x, 0, 1).to_vector());
  EXPECT_EQ(ag::ops::reshape(q, {3, 2}).to(DType::kFloat32).to_vector(), x.to_vector());
  EXPECT_EQ(ag::ops::narrow(q, 1, 1, 2).to(DType::kFloat32).to_vector(), ag::ops::narrow(x, 1, 1, 2).to_vector());
  EXPECT_EQ(ag::ops::cat({q, q}, 0).to(DType::kFloat32).to_vector(), ag::ops::cat({x, x}, 0).to_vector());
  EXPECT_EQ(ag::zeros({4}, dtype).to_vector(), std::vector<float>(4, 0.0f));
  EXPECT_EQ(q.to(DType::kBFloat16).to(dtype).to_vector(), x.to_vector());
  EXPECT_EQ(q.to(DType::kFloat8E4M3).to_vector(), x.to_vector());
  EXPECT_EQ(q.to(DType::kFloat8E5M2).to_vector(), x.to_vector());

  // The gradient of a cast is the opposite cast: through an 8-bit tensor used twice, the two
  // gradients accumulate in it (exactly here: 1 + 1).
  Tensor w = Tensor::from_vector(std::vector<float>{0.3f, -7.0f}, {2});
  w.set_requires_grad(true);
  const Tensor w8 = w.to(dtype);
  Tensor loss = ag::ops::sum(ag::ops::add(w8.to(DType::kFloat32), w8.to(DType::kFloat32)));
  loss.backward();
  EXPECT_EQ(w.grad().to_vector(), (std::vector<float>{2.0f, 2.0f}));
}

TEST_P(Float8, OpsThatComputeRefuseItWithAHint) {
  const DType dtype = GetParam();
  const Tensor q = ag::ones({2, 3}).to(dtype);
  const std::string name(ag::dtype_name(dtype));
  EXPECT_ERROR([&] { ag::ops::relu(q); }, "relu", name, "8-bit float", "hint", ".to(DType::kFloat32)");
  EXPECT_ERROR([&] { ag::ops::matmul(q, ag::ops::transpose(q, 0, 1)); }, "matmul", name, "8-bit float");
  EXPECT_ERROR([&] { ag::ops::sum(q); }, "sum", name);
  // Under autocast a lower-precision op casts its 8-bit inputs to the autocast dtype, as PyTorch's.
  {
    ag::amp::AutocastGuard autocast(ag::Device::kCPU, DType::kBFloat16);
    const Tensor y = ag::ops::matmul(q, ag::ops::transpose(q, 0, 1));
    EXPECT_EQ(y.dtype(), DType::kBFloat16);
    EXPECT_EQ(y.to_vector(), std::vector<float>(4, 3.0f));
  }
}

TEST_P(Float8, SafetensorsKeepsItAsItIs) {
  const DType dtype = GetParam();
  ag::test::ScratchDir scratch("float8_test");
  std::vector<uint8_t> every(256);
  for (int c = 0; c < 256; ++c) every[static_cast<size_t>(c)] = static_cast<uint8_t>(c);
  const std::string path = scratch.path("fp8.safetensors");
  ck::save_safetensors(path, {.tensors = {{"w", ag::ops::reshape(from_bytes(every, dtype), {16, 16})}}});
  const ck::NamedTensors read = ck::load_safetensors(path);
  ASSERT_EQ(read.tensors.size(), 1u);
  EXPECT_EQ(read.tensors[0].second.dtype(), dtype);
  EXPECT_EQ(read.tensors[0].second.shape(), (ag::Shape{16, 16}));
  EXPECT_TRUE(read.widened_from.empty());
  EXPECT_EQ(bytes_of(read.tensors[0].second), every);
  // The header names the format's own dtype, as PyTorch's safetensors writes it.
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(bytes.find(std::string("\"") + std::string(ag::dtype_info(dtype).safetensors_name) + "\""), std::string::npos);
  // A reader that knows only the format's text decodes it (tests/read_safetensors.py; PyTorch's
  // safetensors.torch.load_file reads this file as the same codes, checked by hand with 2.15).
  if (const char* keep = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR")) {
    std::filesystem::copy_file(path, std::filesystem::path(keep) / (prefix(dtype) + "_every_code.safetensors"),
                               std::filesystem::copy_options::overwrite_existing);
  }
  if (std::system("python3 -c 'import json, struct' > /dev/null 2>&1") != 0) GTEST_SKIP() << "no python3 here";
  const std::string small = scratch.path("small.safetensors");
  ck::save_safetensors(small, {.tensors = {{"x", Tensor::from_vector(std::vector<float>{-1.75f, 448.0f}, {2}).to(dtype)}}});
  FILE* pipe = ::popen(("python3 tests/read_safetensors.py " + small).c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buffer[256];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) out += buffer;
  ASSERT_EQ(::pclose(pipe), 0) << out;
  EXPECT_EQ(out, "x " + std::string(ag::dtype_info(dtype).safetensors_name) + " [2] -1.75\n");
}

INSTANTIATE_TEST_SUITE_P(Formats, Float8, ::testing::Values(DType::kFloat8E4M3, DType::kFloat8E5M2),
                         [](const ::testing::TestParamInfo<DType>& info) { return prefix(info.param); });

TEST(Float8Reference, WasMadeByPyTorch2) {
  const auto it = reference().metadata.find("torch");
  ASSERT_NE(it, reference().metadata.end());
  EXPECT_EQ(it->second.rfind("2.", 0), 0u) << it->second;
}

}  // namespace

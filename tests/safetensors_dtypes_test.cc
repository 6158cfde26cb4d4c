// Files as PyTorch and Hugging Face write them: every dtype of the safetensors format read (exactly,
// widened where ampgrad has no such dtype), and such files loaded into a model as PyTorch's
// load_state_dict does (floating dtypes converted, strict and non-strict key matching). The files
// are built byte by byte here, so no PyTorch is needed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/tensor.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "test_util.h"

namespace ag = ampgrad;
namespace ck = ampgrad::checkpoint;
namespace fs = std::filesystem;
using ag::DType;
using ag::Tensor;
using ag::test::throws_error;

namespace {

// Little-endian bytes of each value, as the format stores them.
template <typename T>
std::string bytes_of(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// A safetensors file assembled entry by entry, with contiguous data offsets.
class RawFile {
 public:
  RawFile& add(const std::string& name, const std::string& dtype, const std::string& shape, const std::string& data) {
    header_ += std::string(header_.size() > 1 ? "," : "") + "\"" + name + "\":{\"dtype\":\"" + dtype +
               "\",\"shape\":" + shape + ",\"data_offsets\":[" + std::to_string(data_.size()) + "," +
               std::to_string(data_.size() + data.size()) + "]}";
    data_ += data;
    return *this;
  }
  std::string bytes() const {
    const std::string header = header_ + "}";
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    return out + header + data_;
  }
  void write(const std::string& path) const { std::ofstream(path, std::ios::binary) << bytes(); }

 private:
  std::string header_ = "{";
  std::string data_;
};

const Tensor& tensor_named(const ck::NamedTensors& file, const std::string& name) {
  for (const auto& [n, t] : file.tensors) {
    if (n == name) return t;
  }
  throw std::runtime_error("no tensor " + name);
}

// Bit-exact float comparison (NaN equal to NaN with the same bits, -0 apart from +0).
void expect_float_bits(const Tensor& t, const std::vector<float>& expected, const std::string& name) {
  ASSERT_EQ(t.numel(), static_cast<int64_t>(expected.size())) << name;
  const std::vector<float> got = t.to_vector();
  for (size_t i = 0; i < expected.size(); ++i) {
    if (std::isnan(expected[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << name << "[" << i << "] = " << got[i];
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(expected[i]))
          << name << "[" << i << "] = " << got[i] << ", expected " << expected[i];
    }
  }
}

class SafetensorsDTypes : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return scratch_.path(name); }
  ag::test::ScratchDir scratch_{"safetensors_dtypes"};
};

TEST_F(SafetensorsDTypes, EveryDTypeOfTheFormatIsReadExactly) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  RawFile file;
  // bfloat16 is the top half of a float32: 1, -3, the smallest subnormal (2^-133), inf, NaN, 1 + 2^-7.
  file.add("bf16", "BF16", "[2,3]", bytes_of<uint16_t>({0x3F80, 0xC040, 0x0001, 0x7F80, 0x7FC0, 0x3F81}));
  file.add("f8_e4m3", "F8_E4M3", "[7]", bytes_of<uint8_t>({0x00, 0x38, 0x7E, 0xFE, 0x01, 0x7F, 0x80}));
  file.add("f8_e5m2", "F8_E5M2", "[6]", bytes_of<uint8_t>({0x3C, 0x7C, 0xFC, 0x7D, 0x01, 0x7B}));
  file.add("f8_e4m3fnuz", "F8_E4M3FNUZ", "[3]", bytes_of<uint8_t>({0x40, 0x7F, 0x80}));
  file.add("f8_e5m2fnuz", "F8_E5M2FNUZ", "[3]", bytes_of<uint8_t>({0x40, 0x7F, 0x80}));
  file.add("f8_e8m0", "F8_E8M0", "[4]", bytes_of<uint8_t>({127, 0, 254, 255}));
  file.add("bool", "BOOL", "[4]", bytes_of<uint8_t>({0, 1, 0, 2}));
  file.add("u8", "U8", "[2]", bytes_of<uint8_t>({0, 255}));
  file.add("i8", "I8", "[2]", bytes_of<int8_t>({-128, 127}));
  file.add("i16", "I16", "[2]", bytes_of<int16_t>({-32768, 32767}));
  file.add("u16", "U16", "[1]", bytes_of<uint16_t>({65535}));
  file.add("i32", "I32", "[1,2]", bytes_of<int32_t>({std::numeric_limits<int32_t>::min(), 2147483647}));
  file.add("u32", "U32", "[1]", bytes_of<uint32_t>({4294967295u}));
  file.add("u64", "U64", "[1]", bytes_of<uint64_t>({9223372036854775807u}));
  file.add("i64", "I64", "[1]", bytes_of<int64_t>({-5}));
  file.add("f16", "F16", "[1]", bytes_of<uint16_t>({0x3C00}));
  file.add("f32", "F32", "[]", bytes_of<float>({2.5f}));
  file.add("f64", "F64", "[1]", bytes_of<double>({0.1}));
  // Validated but not read: no ampgrad dtype holds them exactly.
  file.add("u64_big", "U64", "[1]", bytes_of<uint64_t>({18446744073709551615u}));
  file.add("c64", "C64", "[2]", std::string(16, '\0'));
  file.add("f4", "F4", "[4]", std::string(2, '\0'));
  file.add("f6", "F6_E2M3", "[4]", std::string(3, '\0'));
  file.add("f6b", "F6_E3M2", "[4]", std::string(3, '\0'));
  const ck::NamedTensors read = ck::parse_safetensors(file.bytes(), "mem");

  // BF16 is read as it is.
  const Tensor& bf16 = tensor_named(read, "bf16");
  EXPECT_EQ(bf16.dtype(), DType::kBFloat16);
  EXPECT_EQ(bf16.shape(), (ag::Shape{2, 3}));
  expect_float_bits(bf16, {1.0f, -3.0f, std::ldexp(1.0f, -133), inf, nan, 1.0f + 0x1p-7f}, "bf16");
  expect_float_bits(tensor_named(read, "f8_e4m3"), {0.0f, 1.0f, 448.0f, -448.0f, 0x1p-9f, nan, -0.0f}, "f8_e4m3");
  expect_float_bits(tensor_named(read, "f8_e5m2"), {1.0f, inf, -inf, nan, 0x1p-16f, 57344.0f}, "f8_e5m2");
  expect_float_bits(tensor_named(read, "f8_e4m3fnuz"), {1.0f, 240.0f, nan}, "f8_e4m3fnuz");
  expect_float_bits(tensor_named(read, "f8_e5m2fnuz"), {1.0f, 57344.0f, nan}, "f8_e5m2fnuz");
  expect_float_bits(tensor_named(read, "f8_e8m0"), {1.0f, std::ldexp(1.0f, -127), 0x1p127f, nan}, "f8_e8m0");
  // PyTorch's float8_e4m3fn and float8_e5m2 are ampgrad dtypes; the other 8-bit floats widen.
  EXPECT_EQ(tensor_named(read, "f8_e4m3").dtype(), DType::kFloat8E4M3);
  EXPECT_EQ(tensor_named(read, "f8_e5m2").dtype(), DType::kFloat8E5M2);
  for (const char* name : {"f8_e4m3fnuz", "f8_e5m2fnuz", "f8_e8m0"}) {
    EXPECT_EQ(tensor_named(read, name).dtype(), DType::kFloat32) << name;
  }

  // Integers and booleans into int64.
  const std::vector<std::pair<std::string, std::vector<int64_t>>> integers = {
      {"bool", {0, 1, 0, 1}}, {"u8", {0, 255}},           {"i8", {-128, 127}},
      {"i16", {-32768, 32767}}, {"u16", {65535}},         {"i32", {-2147483648LL, 2147483647}},
      {"u32", {4294967295LL}},  {"u64", {9223372036854775807LL}}, {"i64", {-5}}};
  for (const auto& [name, values] : integers) {
    const Tensor& t = tensor_named(read, name);
    EXPECT_EQ(t.dtype(), DType::kInt64) << name;
    EXPECT_EQ(t.to_vector<int64_t>(), values) << name;
  }
  EXPECT_EQ(tensor_named(read, "i32").shape(), (ag::Shape{1, 2}));

  // ampgrad's own dtypes are read as they are.
  EXPECT_EQ(tensor_named(read, "f16").dtype(), DType::kFloat16);
  EXPECT_EQ(tensor_named(read, "f16").item(), 1.0f);
  EXPECT_EQ(tensor_named(read, "f32").item(), 2.5f);
  EXPECT_EQ(tensor_named(read, "f64").dtype(), DType::kFloat64);
  EXPECT_EQ(tensor_named(read, "f64").to_double_vector(), std::vector<double>{0.1});

  // What was widened from what, and what was left unread, with why.
  EXPECT_EQ(read.widened_from.at("i32"), "I32");
  EXPECT_EQ(read.widened_from.at("bool"), "BOOL");
  EXPECT_EQ(read.widened_from.count("f16"), 0u);
  EXPECT_EQ(read.widened_from.count("bf16"), 0u);
  EXPECT_EQ(read.widened_from.count("i64"), 0u);
  EXPECT_EQ(read.widened_from.count("f8_e4m3"), 0u);
  EXPECT_EQ(read.widened_from.count("f8_e5m2"), 0u);
  EXPECT_EQ(read.tensors.size() + read.unread.size(), 23u);
  ASSERT_EQ(read.unread.size(), 5u);
  EXPECT_NE(read.unread.at("u64_big").find("18446744073709551615"), std::string::npos) << read.unread.at("u64_big");
  EXPECT_NE(read.unread.at("c64").find("C64"), std::string::npos);
  EXPECT_NE(read.unread.at("f4").find("F4"), std::string::npos);
  EXPECT_NE(read.unread.at("f6b").find("F6_E3M2"), std::string::npos);
}

TEST_F(SafetensorsDTypes, SubByteAndUnknownDTypesAreValidated) {
  // 3 F4 values are 12 bits: not a whole number of bytes.
  EXPECT_TRUE(throws_error([] { ck::parse_safetensors(RawFile().add("t", "F4", "[3]", "ab").bytes(), "mem"); },
                           {"mem", "'t'", "whole number of bytes"}));
  // A C64 entry must still hold exactly its bytes.
  EXPECT_TRUE(throws_error(
      [] { ck::parse_safetensors(RawFile().add("t", "C64", "[2]", std::string(12, '\0')).bytes(), "mem"); },
      {"mem", "'t'", "needs 16"}));
  EXPECT_TRUE(throws_error([] { ck::parse_safetensors(RawFile().add("t", "BF8", "[1]", "x").bytes(), "mem"); },
                           {"mem", "unsupported dtype", "BF8"}));
}

// weight [2, 3] and bias [2], as PyTorch's nn.Linear(3, 2) state_dict in the file's dtypes.
RawFile linear_file(const std::string& weight_dtype, const std::string& weight_bytes, const std::string& bias_dtype,
                    const std::string& bias_bytes) {
  RawFile file;
  file.add("weight", weight_dtype, "[2,3]", weight_bytes);
  file.add("bias", bias_dtype, "[2]", bias_bytes);
  return file;
}

TEST_F(SafetensorsDTypes, LoadModelConvertsFloatingDTypes) {
  // BF16 weight, F16 bias into an FP32 model: exact.
  linear_file("BF16", bytes_of<uint16_t>({0x3F80, 0xC040, 0x3F81, 0x0000, 0x8000, 0x4049}), "F16",
              bytes_of<uint16_t>({0x3C01, 0xBC00}))
      .write(path("bf16.safetensors"));
  ag::nn::Linear fp32(3, 2);
  ck::load_model(path("bf16.safetensors"), fp32);
  EXPECT_EQ(fp32.weight.dtype(), DType::kFloat32);
  expect_float_bits(fp32.weight, {1.0f, -3.0f, 1.0f + 0x1p-7f, 0.0f, -0.0f, 3.140625f}, "weight");
  expect_float_bits(fp32.bias, {1.0f + 0x1p-10f, -1.0f}, "bias");

  // F64 into an FP16 model: rounded once (1 + 2^-11 + 2^-40 is just above a tie: 1 + 2^-10).
  linear_file("F64", bytes_of<double>({1.0 + 0x1p-11 + 0x1p-40, 0.5, 0.25, 0.125, 65504.0, 4e-8}), "F32",
              bytes_of<float>({2.0f, -2.0f}))
      .write(path("f64.safetensors"));
  ag::nn::Linear fp16(3, 2);
  fp16.to(DType::kFloat16);
  ck::load_model(path("f64.safetensors"), fp16);
  EXPECT_EQ(fp16.weight.dtype(), DType::kFloat16);
  expect_float_bits(fp16.weight, {1.0f + 0x1p-10f, 0.5f, 0.25f, 0.125f, 65504.0f, 0x1p-24f}, "weight");
  expect_float_bits(fp16.bias, {2.0f, -2.0f}, "bias");

  // F64 into a BF16 model: rounded once too (1 + 2^-8 + 2^-40 through float would be the tie 1 + 2^-8,
  // which rounds to 1).
  linear_file("F64", bytes_of<double>({1.0 + 0x1p-8 + 0x1p-40, -0.5, 3.0, 0.0, 1e30, 0.1}), "F32",
              bytes_of<float>({2.0f, -2.0f}))
      .write(path("f64_bf16.safetensors"));
  ag::nn::Linear bf16(3, 2);
  bf16.to(DType::kBFloat16);
  ck::load_model(path("f64_bf16.safetensors"), bf16);
  EXPECT_EQ(bf16.weight.dtype(), DType::kBFloat16);
  const std::vector<float> w = bf16.weight.to_vector();
  EXPECT_EQ(w[0], 1.0f + 0x1p-7f);
  EXPECT_EQ(w[1], -0.5f);
  EXPECT_EQ(w[2], 3.0f);
  EXPECT_EQ(w[5], 0.10009765625f);  // 0.1 to 8 significant bits
}

TEST_F(SafetensorsDTypes, StrictLoadingReportsUnknownKeysAndNonStrictIgnoresThem) {
  // A PyTorch-style file with entries the model lacks: an I64 counter, I32 token ids, a BF16
  // tensor and a complex one ampgrad cannot read at all.
  RawFile file = linear_file("F32", bytes_of<float>({1, 2, 3, 4, 5, 6}), "F32", bytes_of<float>({7, 8}));
  file.add("num_batches_tracked", "I64", "[]", bytes_of<int64_t>({42}));
  file.add("tokens", "I32", "[3]", bytes_of<int32_t>({1, 2, 3}));
  file.add("extra.bf16", "BF16", "[1]", bytes_of<uint16_t>({0x3F80}));
  file.add("extra.c64", "C64", "[1]", std::string(8, '\0'));
  file.write(path("extra.safetensors"));

  ag::nn::Linear strict(3, 2);
  const std::vector<float> before = strict.weight.to_vector();
  EXPECT_TRUE(throws_error([&] { ck::load_model(path("extra.safetensors"), strict); },
                           {"extra.safetensors", "unexpected", "'extra.bf16'", "'extra.c64'", "'num_batches_tracked'",
                            "'tokens'", "KeyMatching::kNonStrict"}));
  EXPECT_EQ(strict.weight.to_vector(), before) << "a refused file changes nothing";

  ag::nn::Linear lenient(3, 2);
  const ck::LoadReport report = ck::load_model(path("extra.safetensors"), lenient, ck::KeyMatching::kNonStrict);
  EXPECT_EQ(report.unexpected_keys,
            (std::vector<std::string>{"extra.bf16", "extra.c64", "num_batches_tracked", "tokens"}));
  EXPECT_TRUE(report.missing_keys.empty());
  EXPECT_EQ(lenient.weight.to_vector(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(lenient.bias.to_vector(), (std::vector<float>{7, 8}));

  // A missing key: strict names it, non-strict loads the rest and reports it.
  RawFile weight_only;
  weight_only.add("weight", "F16", "[2,3]", bytes_of<uint16_t>({0x3C00, 0x3C00, 0x3C00, 0x3C00, 0x3C00, 0x3C00}));
  weight_only.write(path("weight_only.safetensors"));
  ag::nn::Linear partial(3, 2);
  const std::vector<float> bias_before = partial.bias.to_vector();
  EXPECT_TRUE(throws_error([&] { ck::load_model(path("weight_only.safetensors"), partial); },
                           {"weight_only.safetensors", "no tensor 'bias'"}));
  const ck::LoadReport missing = ck::load_model(path("weight_only.safetensors"), partial, ck::KeyMatching::kNonStrict);
  EXPECT_EQ(missing.missing_keys, std::vector<std::string>{"bias"});
  EXPECT_TRUE(missing.unexpected_keys.empty());
  EXPECT_EQ(partial.weight.to_vector(), std::vector<float>(6, 1.0f));
  EXPECT_EQ(partial.bias.to_vector(), bias_before);

  // A wrong shape or an unreadable tensor the model needs is an error either way.
  RawFile wrong_shape;
  wrong_shape.add("weight", "F32", "[3,2]", bytes_of<float>({1, 2, 3, 4, 5, 6}));
  wrong_shape.add("bias", "F32", "[2]", bytes_of<float>({7, 8}));
  wrong_shape.write(path("shape.safetensors"));
  ag::nn::Linear target(3, 2);
  EXPECT_TRUE(throws_error(
      [&] { ck::load_model(path("shape.safetensors"), target, ck::KeyMatching::kNonStrict); },
      {"'weight'", "[3, 2]", "[2, 3]"}));
  RawFile complex_weight;
  complex_weight.add("weight", "C64", "[2,3]", std::string(48, '\0'));
  complex_weight.add("bias", "F32", "[2]", bytes_of<float>({7, 8}));
  complex_weight.write(path("complex.safetensors"));
  EXPECT_TRUE(throws_error(
      [&] { ck::load_model(path("complex.safetensors"), target, ck::KeyMatching::kNonStrict); },
      {"'weight'", "C64", "cannot read"}));
}

// A module with an int64 buffer (token ids, a step counter) beside a float parameter.
struct WithIds : ag::nn::Module {
  WithIds()
      : scale(register_parameter("scale", ag::ones({2}))),
        ids(register_buffer("ids", Tensor::from_vector(std::vector<int64_t>{0, 0, 0}, {3}))) {}
  Tensor forward(const Tensor& x) override { return x; }
  Tensor& scale;
  Tensor& ids;
};

TEST_F(SafetensorsDTypes, IntegerTensorsLoadIntoInt64Tensors) {
  for (const auto& [dtype, data] : std::vector<std::pair<std::string, std::string>>{
           {"I32", bytes_of<int32_t>({-7, 0, 50000})},
           {"I16", bytes_of<int16_t>({-7, 0, 20000})},
           {"U8", bytes_of<uint8_t>({250, 0, 1})},
           {"I64", bytes_of<int64_t>({int64_t{1} << 40, -1, 3})}}) {
    RawFile file;
    file.add("scale", "BF16", "[2]", bytes_of<uint16_t>({0x4000, 0x4040}));
    file.add("ids", dtype, "[3]", data);
    file.write(path("ids.safetensors"));
    WithIds m;
    ck::load_model(path("ids.safetensors"), m);
    EXPECT_EQ(m.ids.dtype(), DType::kInt64) << dtype;
    EXPECT_EQ(m.scale.to_vector(), (std::vector<float>{2.0f, 3.0f})) << dtype;
    const ck::NamedTensors raw = ck::load_safetensors(path("ids.safetensors"));
    EXPECT_EQ(m.ids.to_vector<int64_t>(), tensor_named(raw, "ids").to_vector<int64_t>()) << dtype;
  }
  // Floating values for an int64 buffer (or integers for a float parameter) are refused.
  RawFile floats;
  floats.add("scale", "F32", "[2]", bytes_of<float>({1, 1}));
  floats.add("ids", "F32", "[3]", bytes_of<float>({1, 2, 3}));
  floats.write(path("float_ids.safetensors"));
  WithIds m;
  EXPECT_TRUE(throws_error([&] { ck::load_model(path("float_ids.safetensors"), m); }, {"'ids'", "float32", "int64"}));
  RawFile integers;
  integers.add("scale", "I32", "[2]", bytes_of<int32_t>({1, 1}));
  integers.add("ids", "I64", "[3]", bytes_of<int64_t>({1, 2, 3}));
  integers.write(path("int_scale.safetensors"));
  EXPECT_TRUE(throws_error([&] { ck::load_model(path("int_scale.safetensors"), m); }, {"'scale'", "I32 in the file"}));
}

}  // namespace

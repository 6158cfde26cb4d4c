// Protobuf wire format: encoder and a bounds-checked decoder (see proto_wire.h).
#include "utils/proto_wire.h"

#include <bit>
#include <cstring>

#include "framework/error.h"

namespace ampgrad::utils {

static_assert(std::endian::native == std::endian::little, "fixed-width protobuf values are little-endian");

void ProtoWriter::varint(uint64_t v) {
  while (v >= 0x80) {
    out_.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out_.push_back(static_cast<char>(v));
}

void ProtoWriter::fixed(uint64_t v, int nbytes) {
  for (int i = 0; i < nbytes; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void ProtoWriter::add_varint(uint32_t field, uint64_t value) {
  key(field, WireType::kVarint);
  varint(value);
}

void ProtoWriter::add_double(uint32_t field, double value) {
  key(field, WireType::kFixed64);
  fixed(std::bit_cast<uint64_t>(value), 8);
}

void ProtoWriter::add_float(uint32_t field, float value) {
  key(field, WireType::kFixed32);
  fixed(std::bit_cast<uint32_t>(value), 4);
}

void ProtoWriter::add_bytes(uint32_t field, std::string_view bytes) {
  key(field, WireType::kLengthDelimited);
  varint(bytes.size());
  out_.append(bytes);
}

void ProtoWriter::add_packed_doubles(uint32_t field, std::span<const double> values) {
  key(field, WireType::kLengthDelimited);
  varint(values.size() * 8);
  for (double v : values) fixed(std::bit_cast<uint64_t>(v), 8);
}

uint64_t ProtoReader::read_varint() {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    AG_CHECK(pos_ < data_.size(), where_, ": protobuf varint runs past the end of the message at byte ", pos_);
    const auto byte = static_cast<uint8_t>(data_[pos_++]);
    v |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return v;
  }
  AG_FAIL(where_, ": protobuf varint longer than 10 bytes at byte ", pos_);
}

bool ProtoReader::next(ProtoField& field) {
  if (pos_ == data_.size()) return false;
  const uint64_t key = read_varint();
  field.number = static_cast<uint32_t>(key >> 3);
  field.type = static_cast<WireType>(key & 7);
  AG_CHECK(field.number != 0, where_, ": protobuf field number 0 at byte ", pos_);
  auto take = [&](size_t n) {
    AG_CHECK(n <= data_.size() - pos_, where_, ": protobuf field ", field.number, " needs ", n, " bytes but ",
             data_.size() - pos_, " remain");
    const std::string_view out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  };
  auto little_endian = [](std::string_view b) {
    uint64_t v = 0;
    for (size_t i = 0; i < b.size(); ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(b[i])) << (8 * i);
    return v;
  };
  switch (field.type) {
    case WireType::kVarint: field.scalar = read_varint(); return true;
    case WireType::kFixed64: field.scalar = little_endian(take(8)); return true;
    case WireType::kFixed32: field.scalar = little_endian(take(4)); return true;
    case WireType::kLengthDelimited: field.bytes = take(read_varint()); return true;
  }
  AG_FAIL(where_, ": protobuf field ", field.number, " has unsupported wire type ", static_cast<uint32_t>(field.type));
}

void ProtoReader::expect(const ProtoField& field, WireType type) const {
  AG_CHECK(field.type == type, where_, ": protobuf field ", field.number, " has wire type ",
           static_cast<uint32_t>(field.type), ", expected ", static_cast<uint32_t>(type));
}

double ProtoReader::as_double(const ProtoField& field) const {
  expect(field, WireType::kFixed64);
  return std::bit_cast<double>(field.scalar);
}

float ProtoReader::as_float(const ProtoField& field) const {
  expect(field, WireType::kFixed32);
  return std::bit_cast<float>(static_cast<uint32_t>(field.scalar));
}

int64_t ProtoReader::as_int64(const ProtoField& field) const {
  expect(field, WireType::kVarint);
  return static_cast<int64_t>(field.scalar);
}

std::string_view ProtoReader::as_bytes(const ProtoField& field) const {
  expect(field, WireType::kLengthDelimited);
  return field.bytes;
}

void ProtoReader::append_doubles(const ProtoField& field, std::vector<double>& out) const {
  if (field.type == WireType::kFixed64) {
    out.push_back(std::bit_cast<double>(field.scalar));
    return;
  }
  const std::string_view packed = as_bytes(field);
  AG_CHECK(packed.size() % 8 == 0, where_, ": packed doubles in field ", field.number, " take ", packed.size(),
           " bytes, not a multiple of 8");
  for (size_t i = 0; i < packed.size(); i += 8) {
    uint64_t bits;
    std::memcpy(&bits, packed.data() + i, 8);
    out.push_back(std::bit_cast<double>(bits));
  }
}

}  // namespace ampgrad::utils

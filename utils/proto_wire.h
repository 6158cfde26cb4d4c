// The few pieces of the protobuf wire format that TensorBoard event files need, written and read by
// hand (varints, 64/32-bit fixed values, length-delimited fields, packed doubles).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ampgrad::utils {

/// Protobuf wire types (the low 3 bits of a field key).
enum class WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

/// Appends fields to a message, in the order called (what protobuf's own serializers do too).
class ProtoWriter {
 public:
  void add_varint(uint32_t field, uint64_t value);
  void add_int64(uint32_t field, int64_t value) { add_varint(field, static_cast<uint64_t>(value)); }
  void add_double(uint32_t field, double value);
  void add_float(uint32_t field, float value);
  void add_bytes(uint32_t field, std::string_view bytes);  // strings and nested messages
  void add_packed_doubles(uint32_t field, std::span<const double> values);
  const std::string& bytes() const { return out_; }

 private:
  void key(uint32_t field, WireType type) { varint(static_cast<uint64_t>(field) << 3 | static_cast<uint32_t>(type)); }
  void varint(uint64_t v);
  void fixed(uint64_t v, int nbytes);
  std::string out_;
};

/// One field as read: its number, wire type and raw value.
struct ProtoField {
  uint32_t number = 0;
  WireType type = WireType::kVarint;
  uint64_t scalar = 0;    // kVarint, kFixed64, kFixed32: the bits
  std::string_view bytes; // kLengthDelimited: the payload
};

/// Walks the fields of one message. Malformed input (a truncated varint or payload, an unknown wire
/// type) throws ampgrad::Error starting with `where` (e.g. "file: record at offset N").
class ProtoReader {
 public:
  ProtoReader(std::string_view data, std::string_view where) : data_(data), where_(where) {}
  /// Reads the next field into `field`; false at the end of the message.
  bool next(ProtoField& field);

  double as_double(const ProtoField& field) const;
  float as_float(const ProtoField& field) const;
  int64_t as_int64(const ProtoField& field) const;
  std::string_view as_bytes(const ProtoField& field) const;
  /// Appends a repeated double, packed (one length-delimited run) or not (one fixed64 per value).
  void append_doubles(const ProtoField& field, std::vector<double>& out) const;

 private:
  uint64_t read_varint();
  void expect(const ProtoField& field, WireType type) const;
  std::string_view data_;
  size_t pos_ = 0;
  std::string_view where_;
};

}  // namespace ampgrad::utils

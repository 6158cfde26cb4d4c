// Event protobuf encoding and decoding (see event.h).
#include "utils/event.h"

#include "utils/proto_wire.h"

namespace ampgrad::utils {

namespace {

// Field numbers, from tensorboard/compat/proto/*.proto.
namespace event_field {
constexpr uint32_t kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5;
}
namespace summary_field {
constexpr uint32_t kValue = 1;
}
namespace value_field {
constexpr uint32_t kTag = 1, kSimpleValue = 2, kHisto = 5;
}
namespace histo_field {
constexpr uint32_t kMin = 1, kMax = 2, kNum = 3, kSum = 4, kSumSquares = 5, kBucketLimit = 6, kBucket = 7;
}

std::string encode_histogram(const Histogram& h) {
  ProtoWriter w;
  w.add_double(histo_field::kMin, h.min);
  w.add_double(histo_field::kMax, h.max);
  w.add_double(histo_field::kNum, h.num);
  w.add_double(histo_field::kSum, h.sum);
  w.add_double(histo_field::kSumSquares, h.sum_squares);
  w.add_packed_doubles(histo_field::kBucketLimit, h.bucket_limit);
  w.add_packed_doubles(histo_field::kBucket, h.bucket);
  return w.bytes();
}

std::string encode_value(const SummaryValue& v) {
  ProtoWriter w;
  w.add_bytes(value_field::kTag, v.tag);
  if (v.simple_value) w.add_float(value_field::kSimpleValue, *v.simple_value);
  if (v.histo) w.add_bytes(value_field::kHisto, encode_histogram(*v.histo));
  return w.bytes();
}

Histogram decode_histogram(std::string_view bytes, std::string_view where) {
  Histogram h;
  ProtoReader r(bytes, where);
  for (ProtoField f; r.next(f);) {
    switch (f.number) {
      case histo_field::kMin: h.min = r.as_double(f); break;
      case histo_field::kMax: h.max = r.as_double(f); break;
      case histo_field::kNum: h.num = r.as_double(f); break;
      case histo_field::kSum: h.sum = r.as_double(f); break;
      case histo_field::kSumSquares: h.sum_squares = r.as_double(f); break;
      case histo_field::kBucketLimit: r.append_doubles(f, h.bucket_limit); break;
      case histo_field::kBucket: r.append_doubles(f, h.bucket); break;
      default: break;
    }
  }
  return h;
}

SummaryValue decode_value(std::string_view bytes, std::string_view where) {
  SummaryValue v;
  ProtoReader r(bytes, where);
  for (ProtoField f; r.next(f);) {
    switch (f.number) {
      case value_field::kTag: v.tag = r.as_bytes(f); break;
      case value_field::kSimpleValue: v.simple_value = r.as_float(f); break;
      case value_field::kHisto: v.histo = decode_histogram(r.as_bytes(f), where); break;
      default: break;  // metadata, images, tensors...: not ours to read
    }
  }
  return v;
}

}  // namespace

std::string encode_event(const Event& event) {
  ProtoWriter w;
  w.add_double(event_field::kWallTime, event.wall_time);
  w.add_int64(event_field::kStep, event.step);
  if (!event.file_version.empty()) w.add_bytes(event_field::kFileVersion, event.file_version);
  if (!event.values.empty()) {
    ProtoWriter summary;
    for (const SummaryValue& v : event.values) summary.add_bytes(summary_field::kValue, encode_value(v));
    w.add_bytes(event_field::kSummary, summary.bytes());
  }
  return w.bytes();
}

Event decode_event(std::string_view bytes, std::string_view where) {
  Event event;
  ProtoReader r(bytes, where);
  for (ProtoField f; r.next(f);) {
    switch (f.number) {
      case event_field::kWallTime: event.wall_time = r.as_double(f); break;
      case event_field::kStep: event.step = r.as_int64(f); break;
      case event_field::kFileVersion: event.file_version = r.as_bytes(f); break;
      case event_field::kSummary: {
        ProtoReader summary(r.as_bytes(f), where);
        for (ProtoField v; summary.next(v);)
          if (v.number == summary_field::kValue) event.values.push_back(decode_value(summary.as_bytes(v), where));
        break;
      }
      default: break;  // graphs, session logs...
    }
  }
  return event;
}

}  // namespace ampgrad::utils

// TensorBoard's Event / Summary / HistogramProto messages as plain structs, with the hand-written
// protobuf encoding (field numbers from tensorboard/compat/proto/{event,summary,histogram}.proto).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ampgrad::utils {

/// HistogramProto: bucket[i] counts the values between bucket_limit[i-1] and bucket_limit[i]
/// (bucket 0 starts at -DBL_MAX); min, max, num, sum and sum_squares describe all counted values.
struct Histogram {
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
  std::vector<double> bucket_limit{};
  std::vector<double> bucket{};
};

/// Summary.Value: a tag with a scalar (simple_value) or a histogram (histo).
struct SummaryValue {
  std::string tag{};
  std::optional<float> simple_value{};
  std::optional<Histogram> histo{};
};

/// Event: the first one in a file carries file_version; the others a Summary (its values).
struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version{};
  std::vector<SummaryValue> values{};
};

/// The Event's protobuf bytes (one TFRecord payload).
std::string encode_event(const Event& event);

/// Parses an Event's protobuf bytes; fields it does not know are skipped. Malformed bytes throw
/// ampgrad::Error starting with `where`.
Event decode_event(std::string_view bytes, std::string_view where);

}  // namespace ampgrad::utils

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
  double min = 0;                    ///< the smallest value counted
  double max = 0;                    ///< the largest value counted
  double num = 0;                    ///< how many values were counted
  double sum = 0;                    ///< their sum
  double sum_squares = 0;            ///< the sum of their squares
  std::vector<double> bucket_limit{};  ///< each bucket's upper edge, ascending
  std::vector<double> bucket{};        ///< each bucket's count
};

/// Summary.Value: a tag with a scalar (simple_value) or a histogram (histo).
struct SummaryValue {
  std::string tag{};                    ///< the series' name in TensorBoard ("loss", "grad/0.weight")
  std::optional<float> simple_value{};  ///< a scalar (add_scalar)
  std::optional<Histogram> histo{};     ///< or a histogram (add_histogram)
};

/// Event: the first one in a file carries file_version; the others a Summary (its values).
struct Event {
  double wall_time = 0;                ///< seconds since the Unix epoch
  int64_t step = 0;                    ///< the global step the values belong to
  std::string file_version{};          ///< "brain.Event:2" in a file's first event, else empty
  std::vector<SummaryValue> values{};  ///< the Summary's values
};

/// The Event's protobuf bytes (one TFRecord payload).
std::string encode_event(const Event& event);

/// Parses an Event's protobuf bytes; fields it does not know are skipped. Malformed bytes throw
/// ampgrad::Error starting with `where`.
Event decode_event(std::string_view bytes, std::string_view where);

}  // namespace ampgrad::utils

// The training examples' --plot charts: the loss over a run and, with AMP, the loss scale with
// the skipped steps (PNG through gnuplot, utils/plot.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace training_plots {

struct Curves {
  std::string title;                                 // the run, e.g. "char_gpt, FP16 AMP"
  int64_t first_step = 0;                            // the step of train_loss[0]
  std::vector<double> train_loss{};                  // one per step
  std::vector<std::pair<int64_t, double>> val_loss{};  // (step, loss), may be empty
  std::vector<double> scale{};                       // the loss scale after each step; empty without AMP
};

/// The steps where a dynamic scaler's scale fell (scale[i] < the scale before it): each is a
/// skipped step, since GradScaler lowers its scale only when it skips one.
std::vector<int64_t> scale_drops(const Curves& curves);

/// Writes DIR/loss.png (log scale) and, when curves.scale is not empty, DIR/scale.png; creates DIR.
/// Returns the paths written. Throws ampgrad::Error when gnuplot is missing.
std::vector<std::string> write(const Curves& curves, const std::string& dir);

}  // namespace training_plots

// SkipReport's text.
#include "amp/diagnostics/skip_report.h"

#include <sstream>

#include "amp/diagnostics/grad_stats.h"

namespace ampgrad::amp {

std::string_view origin_name(InfOrigin origin) {
  switch (origin) {
    case InfOrigin::kForwardActivation: return "forward activation";
    case InfOrigin::kForwardLoss: return "forward loss";
    case InfOrigin::kScaledLoss: return "scaled loss";
    case InfOrigin::kBackward: return "backward";
  }
  return "?";
}

std::string SkipReport::culprit() const { return grads.empty() ? std::string() : grads.front().name; }

std::string SkipReport::to_string() const {
  std::ostringstream out;
  out << "step skipped at iteration " << iteration << ", scale " << format_scale(scale) << ": ";
  switch (origin) {
    case InfOrigin::kForwardActivation:
      out << "the output of module '" << (module.empty() ? "(model)" : module)
          << "' was already inf/NaN in the forward";
      break;
    case InfOrigin::kForwardLoss: out << "the loss was already " << loss << " in the forward"; break;
    case InfOrigin::kScaledLoss:
      out << "the loss (" << loss << ") times the scale overflowed float32; the scale is too large for this loss";
      break;
    case InfOrigin::kBackward:
      out << "the forward was finite (loss " << loss << "); a gradient overflowed in the backward";
      break;
  }
  if (grads.empty()) {
    out << "; no gradient of this process held an inf/NaN";
  } else {
    out << "; first inf/NaN gradient: '" << grads.front().name << "'";
    out << " (" << grads.size() << " parameter" << (grads.size() == 1 ? "" : "s") << " affected, in backward order:";
    for (const NonfiniteGrad& g : grads) {
      out << " " << g.name << " [" << g.infs << " inf, " << g.nans << " NaN of " << g.numel << "]";
    }
    out << ")";
  }
  if (!float8.empty()) {
    out << "; FP8 casts that met an inf/NaN or saturated:";
    for (const Float8TensorStats& s : float8) out << " [" << s.to_string() << "]";
  }
  return out.str();
}

}  // namespace ampgrad::amp

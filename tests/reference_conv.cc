// Float64 references of the convolutional ops, index by index from their definitions.
#include <algorithm>
#include <cmath>
#include <limits>

#include "reference.h"

namespace ampgrad::test {

namespace {

size_t at(int64_t i) { return static_cast<size_t>(i); }

}  // namespace

Values conv2d_ref(const Values& x, const Shape& xs, const Values& w, const Shape& ws, const Values& b,
                  const WindowRef& g, int64_t groups) {
  const int64_t n = xs[0], c = xs[1], h = xs[2], wd = xs[3], o = ws[0], cg = ws[1];
  const int64_t oh = (h + 2 * g.ph - g.dh * (g.kh - 1) - 1) / g.sh + 1;
  const int64_t ow = (wd + 2 * g.pw - g.dw * (g.kw - 1) - 1) / g.sw + 1;
  const int64_t og = o / groups;
  Values out(at(n * o * oh * ow), 0.0);
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t oc = 0; oc < o; ++oc) {
      const int64_t group = oc / og;
      for (int64_t y = 0; y < oh; ++y) {
        for (int64_t xo = 0; xo < ow; ++xo) {
          double acc = b.empty() ? 0.0 : b[at(oc)];
          for (int64_t ci = 0; ci < cg; ++ci) {
            const int64_t ic = group * cg + ci;
            for (int64_t i = 0; i < g.kh; ++i) {
              for (int64_t j = 0; j < g.kw; ++j) {
                const int64_t iy = y * g.sh - g.ph + i * g.dh, ix = xo * g.sw - g.pw + j * g.dw;
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                acc += x[at(((s * c + ic) * h + iy) * wd + ix)] * w[at(((oc * cg + ci) * g.kh + i) * g.kw + j)];
              }
            }
          }
          out[at(((s * o + oc) * oh + y) * ow + xo)] = acc;
        }
      }
    }
  }
  return out;
}

Values max_pool2d_ref(const Values& x, const Shape& xs, const WindowRef& g, int64_t oh, int64_t ow) {
  const int64_t h = xs[xs.size() - 2], wd = xs.back(), planes = static_cast<int64_t>(x.size()) / (h * wd);
  Values out;
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t y = 0; y < oh; ++y) {
      for (int64_t xo = 0; xo < ow; ++xo) {
        double best = -std::numeric_limits<double>::infinity();
        for (int64_t i = 0; i < g.kh; ++i) {
          for (int64_t j = 0; j < g.kw; ++j) {
            const int64_t iy = y * g.sh - g.ph + i * g.dh, ix = xo * g.sw - g.pw + j * g.dw;
            if (iy >= 0 && iy < h && ix >= 0 && ix < wd) best = std::max(best, x[at((p * h + iy) * wd + ix)]);
          }
        }
        out.push_back(best);
      }
    }
  }
  return out;
}

Values avg_pool2d_ref(const Values& x, const Shape& xs, const WindowRef& g, int64_t oh, int64_t ow,
                      bool count_include_pad) {
  const int64_t h = xs[xs.size() - 2], wd = xs.back(), planes = static_cast<int64_t>(x.size()) / (h * wd);
  Values out;
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t y = 0; y < oh; ++y) {
      for (int64_t xo = 0; xo < ow; ++xo) {
        // The window within the padded input (a ceil_mode window may end past it), then the taps inside x.
        const int64_t y0 = y * g.sh - g.ph, y1 = std::min(y0 + g.kh, h + g.ph);
        const int64_t x0 = xo * g.sw - g.pw, x1 = std::min(x0 + g.kw, wd + g.pw);
        double sum = 0;
        int64_t inside = 0;
        for (int64_t iy = std::max<int64_t>(y0, 0); iy < std::min(y1, h); ++iy) {
          for (int64_t ix = std::max<int64_t>(x0, 0); ix < std::min(x1, wd); ++ix) {
            sum += x[at((p * h + iy) * wd + ix)];
            ++inside;
          }
        }
        out.push_back(sum / static_cast<double>(count_include_pad ? (y1 - y0) * (x1 - x0) : inside));
      }
    }
  }
  return out;
}

Values adaptive_avg_pool2d_ref(const Values& x, const Shape& xs, int64_t oh, int64_t ow) {
  const int64_t h = xs[xs.size() - 2], wd = xs.back(), planes = static_cast<int64_t>(x.size()) / (h * wd);
  Values out;
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t y = 0; y < oh; ++y) {
      const auto y0 = static_cast<int64_t>(std::floor(static_cast<double>(y * h) / static_cast<double>(oh)));
      const auto y1 = static_cast<int64_t>(std::ceil(static_cast<double>((y + 1) * h) / static_cast<double>(oh)));
      for (int64_t xo = 0; xo < ow; ++xo) {
        const auto x0 = static_cast<int64_t>(std::floor(static_cast<double>(xo * wd) / static_cast<double>(ow)));
        const auto x1 = static_cast<int64_t>(std::ceil(static_cast<double>((xo + 1) * wd) / static_cast<double>(ow)));
        double sum = 0;
        for (int64_t iy = y0; iy < y1; ++iy) {
          for (int64_t ix = x0; ix < x1; ++ix) sum += x[at((p * h + iy) * wd + ix)];
        }
        out.push_back(sum / static_cast<double>((y1 - y0) * (x1 - x0)));
      }
    }
  }
  return out;
}

Values batch_norm_ref(const Values& x, const Shape& xs, const Values& mean_in, const Values& var_in, const Values& w,
                      const Values& b, double eps) {
  const int64_t n = xs[0], c = xs[1], s = static_cast<int64_t>(x.size()) / (n * c);
  Values out(x.size());
  for (int64_t ch = 0; ch < c; ++ch) {
    double mean = 0, var = 0;
    if (mean_in.empty()) {
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t k = 0; k < s; ++k) mean += x[at((i * c + ch) * s + k)];
      }
      mean /= static_cast<double>(n * s);
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t k = 0; k < s; ++k) var += (x[at((i * c + ch) * s + k)] - mean) * (x[at((i * c + ch) * s + k)] - mean);
      }
      var /= static_cast<double>(n * s);
    } else {
      mean = mean_in[at(ch)];
      var = var_in[at(ch)];
    }
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t k = 0; k < s; ++k) {
        const size_t idx = at((i * c + ch) * s + k);
        out[idx] = (x[idx] - mean) / std::sqrt(var + eps) * (w.empty() ? 1.0 : w[at(ch)]) + (b.empty() ? 0.0 : b[at(ch)]);
      }
    }
  }
  return out;
}

}  // namespace ampgrad::test

// mt19937_64 (fully specified by the standard) with our own uniform and normal transforms.
#include "framework/random.h"

#include <cmath>
#include <mutex>
#include <numbers>
#include <random>
#include <sstream>

#include "framework/error.h"

namespace ampgrad {

namespace {

struct Generator {
  std::mutex mutex;
  std::mt19937_64 engine{0x5eed};
  bool has_spare_normal = false;  // Box-Muller makes normals in pairs
  double spare_normal = 0.0;
};

Generator& generator() {
  static Generator* g = new Generator();
  return *g;
}

double uniform_locked(Generator& g) { return static_cast<double>(g.engine() >> 11) * 0x1.0p-53; }

}  // namespace

void manual_seed(uint64_t seed) {
  Generator& g = generator();
  std::lock_guard lock(g.mutex);
  g.engine.seed(seed);
  g.has_spare_normal = false;
}

namespace random {

uint64_t next_u64() {
  Generator& g = generator();
  std::lock_guard<std::mutex> lock(g.mutex);
  return g.engine();
}

double next_uniform() {
  Generator& g = generator();
  std::lock_guard lock(g.mutex);
  return uniform_locked(g);
}

double next_normal() {
  Generator& g = generator();
  std::lock_guard lock(g.mutex);
  if (g.has_spare_normal) {
    g.has_spare_normal = false;
    return g.spare_normal;
  }
  const double u1 = 1.0 - uniform_locked(g);  // in (0, 1]: log is finite
  const double u2 = uniform_locked(g);
  const double radius = std::sqrt(-2.0 * std::log(u1));
  g.spare_normal = radius * std::sin(2.0 * std::numbers::pi * u2);
  g.has_spare_normal = true;
  return radius * std::cos(2.0 * std::numbers::pi * u2);
}

std::string get_state() {
  Generator& g = generator();
  std::lock_guard lock(g.mutex);
  std::ostringstream out;
  out << g.engine << ' ' << g.has_spare_normal << ' ' << std::hexfloat << g.spare_normal;
  return out.str();
}

void set_state(const std::string& state) {
  Generator& g = generator();
  std::lock_guard lock(g.mutex);
  std::istringstream in(state);
  std::mt19937_64 engine;
  bool has_spare = false;
  std::string spare_text;
  in >> engine >> has_spare >> spare_text;
  AG_CHECK(!in.fail(), "random::set_state: the state text is malformed (", state.size(), " characters)");
  g.engine = engine;
  g.has_spare_normal = has_spare;
  g.spare_normal = std::strtod(spare_text.c_str(), nullptr);
}

}  // namespace random
}  // namespace ampgrad

// The rows of the shared op-case table (see op_cases.h).
#include "op_cases.h"

#include <algorithm>

#include "reference.h"

namespace ampgrad::test {

std::vector<OpCase> op_cases() {
  std::vector<OpCase> cases;
  using In = const std::vector<Tensor>&;
  using Refs = const std::vector<Values>&;
  cases.push_back({"linear", {{5, 7}, {3, 7}, {3}}, [](In t) { return ops::linear(t[0], t[1], t[2]); },
                   [](Refs v) { return linear_ref(v[0], v[1], v[2], 5, 7, 3); }, {.k = 7, .magnitude = 4}});
  cases.push_back({"linear_no_bias", {{5, 7}, {3, 7}}, [](In t) { return ops::linear(t[0], t[1]); },
                   [](Refs v) { return linear_ref(v[0], v[1], {}, 5, 7, 3); }, {.k = 7, .magnitude = 4}});
  cases.push_back({"matmul", {{4, 6}, {6, 3}}, [](In t) { return ops::matmul(t[0], t[1]); },
                   [](Refs v) { return matmul_ref(v[0], v[1], 4, 6, 3); }, {.k = 6, .magnitude = 4}});

  // add / sub / mul with NumPy broadcasting on either side, ranks 0 to 4.
  struct Binary {
    const char* name;
    Tensor (*op)(const Tensor&, const Tensor&);
    double (*ref)(double, double);
  };
  const Binary binaries[] = {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }, [](double a, double b) { return a + b; }},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }, [](double a, double b) { return a - b; }},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }, [](double a, double b) { return a * b; }},
  };
  const std::pair<const char*, std::vector<Shape>> layouts[] = {
      {"same", {{3, 4}, {3, 4}}},          {"row_right", {{2, 3, 4}, {4}}},  {"row_left", {{4}, {3, 4}}},
      {"scalar_right", {{3, 4}, {}}},      {"scalar_left", {{}, {3, 4}}},    {"one_element", {{3, 4}, {1}}},
      {"column", {{2, 3}, {2, 1}}},        {"row_1", {{2, 3}, {1, 3}}},      {"outer", {{4, 1}, {4}}},
      {"rank4", {{2, 1, 3, 1}, {1, 4, 1, 2}}}, {"rank0", {{}, {}}},        {"middle", {{2, 3, 4}, {2, 1, 4}}},
  };
  for (const Binary& b : binaries) {
    for (const auto& [layout, shapes] : layouts) {
      cases.push_back({std::string(b.name) + "_" + layout, shapes, [op = b.op](In t) { return op(t[0], t[1]); },
                       [f = b.ref, sa = shapes[0], sb = shapes[1]](Refs v) { return broadcast_ref(v[0], sa, v[1], sb, f); },
                       {}});
    }
  }

  // The scalar forms and relu, on [3, 5].
  auto unary = [&](const char* name, std::function<Tensor(const Tensor&)> op, std::function<double(double)> ref) {
    cases.push_back({name, {{3, 5}}, [op](In t) { return op(t[0]); }, [ref](Refs v) { return map_ref(v[0], ref); }, {}});
  };
  unary("times_scalar", [](const Tensor& x) { return x * 2.0f; }, [](double x) { return 2 * x; });
  unary("scalar_times", [](const Tensor& x) { return -0.5f * x; }, [](double x) { return -0.5 * x; });
  unary("plus_scalar", [](const Tensor& x) { return x + 1.5f; }, [](double x) { return x + 1.5; });
  unary("minus_scalar", [](const Tensor& x) { return x - 0.75f; }, [](double x) { return x - 0.75; });
  unary("negate", [](const Tensor& x) { return -x; }, [](double x) { return -x; });
  unary("scale", [](const Tensor& x) { return ops::scale(x, 3.0); }, [](double x) { return 3 * x; });
  unary("relu", [](const Tensor& x) { return ops::relu(x); }, [](double x) { return x > 0 ? x : 0.0; });

  // Reductions and the loss: 0-dim results.
  cases.push_back({"sum", {{3, 5}}, [](In t) { return ops::sum(t[0]); },
                   [](Refs v) { return Values{sum_ref(v[0])}; }, {.k = 15, .magnitude = 2}});
  cases.push_back({"sum_rank0", {{}}, [](In t) { return ops::sum(t[0]); }, [](Refs v) { return v[0]; }, {}});
  cases.push_back({"mean", {{2, 3, 4}}, [](In t) { return ops::mean(t[0]); },
                   [](Refs v) { return Values{sum_ref(v[0]) / 24}; }, {.k = 24, .magnitude = 2}});
  cases.push_back({"mse_loss", {{6, 2}, {6, 2}}, [](In t) { return ops::mse_loss(t[0], t[1]); },
                   [](Refs v) { return Values{mse_ref(v[0], v[1])}; },
                   {.k = 12, .magnitude = 4}});
  // Ops composed: a small MLP layer and its loss.
  cases.push_back({"mlp", {{4, 3}, {5, 3}, {5}, {4, 5}},
                   [](In t) { return ops::mse_loss(ops::relu(ops::linear(t[0], t[1], t[2])), t[3]); },
                   [](Refs v) {
                     const Values h = map_ref(linear_ref(v[0], v[1], v[2], 4, 3, 5),
                                              [](double x) { return x > 0 ? x : 0.0; });
                     return Values{mse_ref(h, v[3])};
                   },
                   {.k = 20, .magnitude = 8}});

  // Larger rows for the backends' loop structure: vector tails (sizes that are not multiples of 4
  // or 8), several reduction blocks, long k.
  cases.push_back({"linear_wide", {{33, 64}, {9, 64}}, [](In t) { return ops::linear(t[0], t[1]); },
                   [](Refs v) { return linear_ref(v[0], v[1], {}, 33, 64, 9); }, {.k = 64, .magnitude = 4}});
  cases.push_back({"matmul_long_k", {{6, 40}, {40, 3}}, [](In t) { return ops::matmul(t[0], t[1]); },
                   [](Refs v) { return matmul_ref(v[0], v[1], 6, 40, 3); }, {.k = 40, .magnitude = 4}});
  cases.push_back({"add_vector_tail", {{4, 37}, {4, 37}}, [](In t) { return t[0] + t[1]; },
                   [](Refs v) { return zip_ref(v[0], v[1], [](double a, double b) { return a + b; }); }, {}});
  cases.push_back({"mul_long", {{1000}, {1000}}, [](In t) { return t[0] * t[1]; },
                   [](Refs v) { return zip_ref(v[0], v[1], [](double a, double b) { return a * b; }); }, {}});
  cases.push_back({"relu_tail", {{8, 33}}, [](In t) { return ops::relu(t[0]); },
                   [](Refs v) { return map_ref(v[0], [](double x) { return x > 0 ? x : 0.0; }); }, {}});
  cases.push_back({"sum_many", {{50, 41}}, [](In t) { return ops::sum(t[0]); },
                   [](Refs v) { return Values{sum_ref(v[0])}; }, {.k = 2050, .magnitude = 2}});
  cases.push_back({"mean_long", {{3, 1000}}, [](In t) { return ops::mean(t[0]); },
                   [](Refs v) { return Values{sum_ref(v[0]) / 3000}; }, {.k = 3000, .magnitude = 2}});
  cases.push_back({"mse_loss_tall", {{64, 9}, {64, 9}}, [](In t) { return ops::mse_loss(t[0], t[1]); },
                   [](Refs v) { return Values{mse_ref(v[0], v[1])}; },
                   {.k = 576, .magnitude = 4}});
  append_tensor_cases(cases);
  append_model_cases(cases);
  append_conv_cases(cases);
  return cases;
}

std::vector<Tensor> make_inputs(const OpCase& op, DType dtype, Device device) {
  std::vector<Tensor> inputs;
  uint64_t seed = 11;
  for (const Shape& shape : op.shapes) {
    Values v = random_values(static_cast<size_t>(shape_numel(shape)), -2.0, 2.0, seed++);
    for (double& x : v) x += x < 0 ? -0.1 : 0.1;
    inputs.push_back(Tensor::from_vector(v, shape, dtype, device));
  }
  return inputs;
}

}  // namespace ampgrad::test

// Op-case rows for tensors of any rank: shape ops, reductions along dimensions, linear over leading
// dimensions and batched, broadcast matmul.
#include "op_cases.h"
#include "ops/ops.h"

namespace ampgrad::test {

void append_tensor_cases(std::vector<OpCase>& cases) {
  using In = const std::vector<Tensor>&;
  using Refs = const std::vector<Values>&;
  const auto add = [&](std::string name, std::vector<Shape> shapes, TensorFn fn,
                       std::function<Values(const std::vector<Values>&)> ref, Tol tol = {}) {
    cases.push_back({std::move(name), std::move(shapes), std::move(fn), std::move(ref), tol});
  };

  // Shape ops: exact in every dtype.
  add("reshape", {{2, 3, 4}}, [](In t) { return ops::reshape(t[0], {4, -1}); }, [](Refs v) { return v[0]; });
  add("unsqueeze_squeeze", {{3, 4}}, [](In t) { return ops::squeeze(ops::unsqueeze(t[0], -1), 2); },
      [](Refs v) { return v[0]; });
  add("transpose", {{2, 3, 4}}, [](In t) { return ops::transpose(t[0], 0, -1); },
      [](Refs v) { return permute_ref(v[0], {2, 3, 4}, {2, 1, 0}); });
  add("permute", {{2, 3, 4, 5}}, [](In t) { return ops::permute(t[0], {2, 0, 3, 1}); },
      [](Refs v) { return permute_ref(v[0], {2, 3, 4, 5}, {2, 0, 3, 1}); });
  add("narrow", {{3, 5}}, [](In t) { return ops::narrow(t[0], 1, 1, 3); },
      [](Refs v) { return narrow_ref(v[0], {3, 5}, 1, 1, 3); });
  add("split", {{3, 5}},
      [](In t) {
        const std::vector<Tensor> p = ops::split(t[0], 2, -1);  // [3,2] [3,2] [3,1]; the middle one unused
        return ops::cat({p[2], p[0]}, 1);
      },
      [](Refs v) {
        return cat_ref({narrow_ref(v[0], {3, 5}, 1, 4, 1), narrow_ref(v[0], {3, 5}, 1, 0, 2)}, {{3, 1}, {3, 2}}, 1);
      });
  add("chunk", {{5, 3}}, [](In t) { return ops::chunk(t[0], 2, 0)[1]; },
      [](Refs v) { return narrow_ref(v[0], {5, 3}, 0, 3, 2); });
  add("cat_rows", {{2, 3}, {4, 3}}, [](In t) { return ops::cat({t[0], t[1]}, 0); },
      [](Refs v) { return cat_ref({v[0], v[1]}, {{2, 3}, {4, 3}}, 0); });
  add("cat_last", {{2, 1}, {2, 3}, {2, 2}}, [](In t) { return ops::cat({t[0], t[1], t[2]}, -1); },
      [](Refs v) { return cat_ref({v[0], v[1], v[2]}, {{2, 1}, {2, 3}, {2, 2}}, 1); });
  add("expand", {{3, 1}}, [](In t) { return ops::expand(t[0], {2, -1, 4}); },
      [](Refs v) { return broadcast_ref(v[0], {3, 1}, Values(24, 0.0), {2, 3, 4}, [](double a, double) { return a; }); });

  // More dimensions than merge: every kernel walks them all (9 and 10 here; a tensor may have 25).
  const Shape nine(9, 2);
  const std::vector<int64_t> reversed{8, 7, 6, 5, 4, 3, 2, 1, 0};
  add("permute_9d_reversed", {nine}, [reversed](In t) { return ops::permute(t[0], reversed); },
      [nine, reversed](Refs v) { return permute_ref(v[0], nine, reversed); });
  const Shape odd{2, 1, 2, 1, 2, 1, 2, 1, 2, 1}, even{1, 2, 1, 2, 1, 2, 1, 2, 1, 2};
  add("mul_broadcast_10d", {odd, even}, [](In t) { return t[0] * t[1]; },
      [odd, even](Refs v) { return broadcast_ref(v[0], odd, v[1], even, [](double a, double b) { return a * b; }); },
      {.k = 32, .magnitude = 4});  // each operand's gradient sums 32 products
  const std::vector<int64_t> alternate{0, 2, 4, 6, 8};
  add("sum_alternate_dims_9d", {nine}, [alternate](In t) { return ops::sum(t[0], alternate); },
      [nine, alternate](Refs v) { return sum_dims_ref(v[0], nine, alternate); }, {.k = 32, .magnitude = 2});

  // Reductions along dimensions (sums accumulate in double: k terms of size ~2).
  add("sum_dims", {{2, 3, 4}}, [](In t) { return ops::sum(t[0], {0, 2}); },
      [](Refs v) { return sum_dims_ref(v[0], {2, 3, 4}, {0, 2}); }, {.k = 8, .magnitude = 2});
  add("sum_keepdim", {{2, 3, 4}}, [](In t) { return ops::sum(t[0], {1}, true); },
      [](Refs v) { return sum_dims_ref(v[0], {2, 3, 4}, {1}); }, {.k = 3, .magnitude = 2});
  add("mean_last", {{2, 3, 4}}, [](In t) { return ops::mean(t[0], {-1}); },
      [](Refs v) { return map_ref(sum_dims_ref(v[0], {2, 3, 4}, {2}), [](double s) { return s / 4; }); },
      {.k = 4, .magnitude = 2});
  add("mean_all_keepdim", {{3, 4}}, [](In t) { return ops::mean(t[0], {}, true); },
      [](Refs v) { return Values{sum_ref(v[0]) / 12}; }, {.k = 12, .magnitude = 2});
  add("max_dim", {{3, 5}}, [](In t) { return ops::max(t[0], 1); }, [](Refs v) { return max_dim_ref(v[0], {3, 5}, 1); });
  add("max_keepdim", {{2, 3, 4}}, [](In t) { return ops::max(t[0], 0, true); },
      [](Refs v) { return max_dim_ref(v[0], {2, 3, 4}, 0); });

  // GEMMs of any rank.
  add("linear_3d", {{2, 3, 5}, {4, 5}, {4}}, [](In t) { return ops::linear(t[0], t[1], t[2]); },
      [](Refs v) { return linear_ref(v[0], v[1], v[2], 6, 5, 4); }, {.k = 5, .magnitude = 4});
  add("linear_1d", {{5}, {4, 5}}, [](In t) { return ops::linear(t[0], t[1]); },
      [](Refs v) { return linear_ref(v[0], v[1], {}, 1, 5, 4); }, {.k = 5, .magnitude = 4});
  const std::pair<const char*, std::pair<Shape, Shape>> matmuls[] = {
      {"matmul_batched", {{2, 3, 4}, {2, 4, 5}}},     {"matmul_broadcast", {{2, 1, 3, 4}, {3, 4, 2}}},
      {"matmul_shared_b", {{2, 3, 4}, {4, 5}}},       {"matmul_shared_a", {{3, 4}, {2, 4, 5}}},
      {"matmul_heads", {{2, 2, 3, 4}, {2, 2, 4, 3}}},
  };
  for (const auto& [name, shapes] : matmuls) {
    add(name, {shapes.first, shapes.second}, [](In t) { return ops::matmul(t[0], t[1]); },
        [sa = shapes.first, sb = shapes.second](Refs v) { return batched_matmul_ref(v[0], sa, v[1], sb); },
        {.k = 4, .magnitude = 4});
  }
  add("matmul_vector_matrix", {{4}, {4, 5}}, [](In t) { return ops::matmul(t[0], t[1]); },
      [](Refs v) { return matmul_ref(v[0], v[1], 1, 4, 5); }, {.k = 4, .magnitude = 4});
  add("matmul_matrix_vector", {{3, 4}, {4}}, [](In t) { return ops::matmul(t[0], t[1]); },
      [](Refs v) { return matmul_ref(v[0], v[1], 3, 4, 1); }, {.k = 4, .magnitude = 4});
  add("matmul_dot", {{4}, {4}}, [](In t) { return ops::matmul(t[0], t[1]); },
      [](Refs v) { return matmul_ref(v[0], v[1], 1, 4, 1); }, {.k = 4, .magnitude = 4});
}

}  // namespace ampgrad::test

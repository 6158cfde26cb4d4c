// ZeroRedundancyOptimizer: the buckets and their shards, the reduce-scatter driven by
// post-accumulate-grad hooks, the all-gather after each step, the sharded clip and the
// consolidated state.
#include "distributed/zero_redundancy_optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "distributed/buckets.h"
#include "framework/copy.h"
#include "framework/error.h"
#include "framework/storage_kernels.h"
#include "framework/tensor_impl.h"
#include "ops/reduce/reduce_kernels.h"

namespace ampgrad::distributed {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// Every parameter and every shard starts on a 64-byte boundary of its flat buffer, as a tensor of
// its own would (the allocators' alignment): vector kernels take their aligned paths on them.
constexpr int64_t kAlignBytes = 64;

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// dst[dst_offset ..) = src[src_offset ..), n elements of one dtype on one device.
void copy_elements(Tensor& dst, int64_t dst_offset, const Tensor& src, int64_t src_offset, int64_t n) {
  if (n <= 0) return;
  const size_t bytes = element_size(dst.dtype());
  storage::copy(static_cast<char*>(dst.data_ptr()) + static_cast<size_t>(dst_offset) * bytes, dst.dtype(),
                dst.device(), static_cast<const char*>(src.data_ptr()) + static_cast<size_t>(src_offset) * bytes,
                src.dtype(), src.device(), n);
}

}  // namespace

/// Parameters of one group, one dtype and device, laid end to end and padded to a multiple of the
/// group size: rank r owns elements [r * shard, (r + 1) * shard). The parameters live in flat_param
/// (each is an alias of its elements), and so does this rank's shard, so the optimizer's step
/// writes the parameters and the all-gather runs in place: no copy of either is kept.
struct ZeroRedundancyOptimizer::Bucket {
  std::vector<size_t> params;  // indices into params_, in layout order
  int64_t numel = 0;           // up to the last parameter's end (the gaps between them included)
  int64_t shard = 0;           // elements per rank
  DType dtype = DType::kFloat32;
  Device device = Device::kCPU;
  Tensor flat_param;           // the parameters end to end, then zeros
  Tensor shard_param;          // this rank's part of flat_param: a leaf the inner optimizer updates
  size_t pending = 0;          // parameters whose gradient has not arrived in this backward
  // Stage 1: the gradients end to end, all-reduced in place (the parameters' gradients alias into
  // it, and the shard's gradient is this rank's part); kept until zero_grad. Stage 2: in flight
  // only, every rank's gradients, reduce-scattered into `reduced`, this rank's averaged shard.
  Tensor flat_grad, reduced;
  std::shared_ptr<Work> work;
  std::vector<uint64_t> versions;  // each parameter's version when the shard last matched it
};

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(const std::vector<Tensor>& params, ShardOptimizerFactory make,
                                                 ZeroOptions options)
    : ZeroRedundancyOptimizer(std::vector<std::vector<Tensor>>{params}, std::move(make), default_group(), options) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(const std::vector<Tensor>& params, ShardOptimizerFactory make,
                                                 ProcessGroup& group, ZeroOptions options)
    : ZeroRedundancyOptimizer(std::vector<std::vector<Tensor>>{params}, std::move(make), group, options) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(const std::vector<std::vector<Tensor>>& param_groups,
                                                 ShardOptimizerFactory make, ProcessGroup& group, ZeroOptions options)
    : group_(group), options_(options), make_(make) {
  AG_CHECK(options.stage == 1 || options.stage == 2, "ZeroRedundancyOptimizer: stage must be 1 or 2, got ",
           options.stage);
  AG_CHECK(options.bucket_cap_mb > 0 && options.first_bucket_cap_mb > 0, "ZeroRedundancyOptimizer: bucket caps ",
           "must be > 0, got bucket_cap_mb ", options.bucket_cap_mb, ", first_bucket_cap_mb ",
           options.first_bucket_cap_mb);
  AG_CHECK(make, "ZeroRedundancyOptimizer: the shard optimizer factory is empty; hint: pass ",
           "shard_optimizer<optim::AdamW>({.lr = ...})");
  std::vector<std::vector<Tensor>> groups;
  std::ostringstream layout;
  for (size_t g = 0; g < param_groups.size(); ++g) {
    groups.emplace_back();
    for (const Tensor& p : param_groups[g]) {
      AG_CHECK(p.defined() && p.is_leaf(), "ZeroRedundancyOptimizer: parameter ", params_.size(), " of group ", g,
               " is ", p.defined() ? "not a leaf" : "undefined", "; hint: pass model.parameters()");
      if (!p.requires_grad()) continue;  // frozen: neither reduced nor updated
      AG_CHECK(is_floating(p.dtype()) && p.device() == group.device(), "ZeroRedundancyOptimizer: parameter ",
               params_.size(), " is ", p.to_string(), ", but this ", backend_name(group.backend()), " group shards ",
               "floating ", group.device(), " tensors; hint: move the model to the group's device before wrapping");
      for (const Tensor& q : params_) {
        AG_CHECK(!q.is_same(p), "ZeroRedundancyOptimizer: parameter ", p.to_string(), " is listed twice; hint: ",
                 "pass each (tied) parameter once");
      }
      params_.push_back(p);
      group_of_.push_back(g);
      groups.back().push_back(p);
      layout << g << ' ' << p.to_string() << '\n';
    }
  }
  AG_CHECK(!params_.empty(), "ZeroRedundancyOptimizer: no parameter requires grad; hint: does the model register ",
           "its parameters (model.parameters() is empty)?");
  // Every rank's layout, gathered, so that a difference is an error on every rank, not a hang.
  const std::vector<std::string> all = group.all_gather_bytes(layout.str());
  for (size_t r = 1; r < all.size(); ++r) {
    AG_CHECK(all[r] == all[0], "ZeroRedundancyOptimizer: rank ", r, "'s parameters differ from rank 0's (rank 0:\n",
             all[0], "rank ", r, ":\n", all[r], "); hint: build the same model, with the same dtypes, on every rank");
  }
  if (options.broadcast_parameters) {
    std::vector<std::shared_ptr<Work>> works;
    for (Tensor& p : params_) works.push_back(group.broadcast_async(p, 0, CheckAcrossRanks::kNo));
    for (auto& work : works) work->wait();
  }
  build_buckets(groups, make);
  for (size_t i = 0; i < params_.size(); ++i) {
    hook_ids_.push_back(params_[i].register_post_accumulate_grad_hook([this, i](const Tensor&) {
      on_gradient_ready(i);
    }));
  }
  pre_hook_ = optimizer_->register_step_pre_hook([this](optim::Optimizer&) { before_step(); });
  post_hook_ = optimizer_->register_step_post_hook([this](optim::Optimizer&) { gather_parameters(); });
  // Without an agreement (init_process_group installs one) each GradScaler would decide alone,
  // and a rank that skipped would leave the others waiting in the all-gather.
  amp::FoundInfSync current = amp::set_found_inf_sync({});
  if (current) {
    amp::set_found_inf_sync(std::move(current));
  } else {
    ProcessGroup* agreed = &group;
    replaced_found_inf_ = amp::set_found_inf_sync(
        [agreed](bool found_inf) { return agreed->all_reduce_int(found_inf ? 1 : 0, ReduceOp::kMax) != 0; });
  }
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() {
  for (size_t i = 0; i < params_.size(); ++i) params_[i].remove_post_accumulate_grad_hook(hook_ids_[i]);
  if (replaced_found_inf_) amp::set_found_inf_sync(std::move(*replaced_found_inf_));
}

void ZeroRedundancyOptimizer::build_buckets(const std::vector<std::vector<Tensor>>& groups,
                                            const ShardOptimizerFactory& make) {
  const int n = group_.size();
  bucket_of_.assign(params_.size(), 0);
  offset_of_.assign(params_.size(), 0);
  ready_.assign(params_.size(), false);
  std::vector<std::vector<Tensor>> shard_groups(groups.size());
  size_t first = 0;  // index in params_ of the group's first parameter
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<BucketParam> sizes;
    for (const Tensor& p : groups[g]) {
      sizes.push_back({.bytes = p.numel() * static_cast<int64_t>(element_size(p.dtype())), .dtype = p.dtype(),
                       .device = p.device()});
    }
    const auto assignment = assign_buckets(sizes, static_cast<int64_t>(options_.first_bucket_cap_mb * kMiB),
                                           static_cast<int64_t>(options_.bucket_cap_mb * kMiB));
    for (const std::vector<size_t>& members : assignment) {
      Bucket bucket;
      const Tensor& lead = params_[first + members[0]];
      bucket.dtype = lead.dtype();
      bucket.device = lead.device();
      const int64_t align = kAlignBytes / static_cast<int64_t>(element_size(bucket.dtype));  // elements
      for (size_t k : members) {
        const size_t i = first + k;
        bucket_of_[i] = buckets_.size();
        offset_of_[i] = round_up(bucket.numel, align);  // the gap is padding, zero as at the end
        bucket.params.push_back(i);
        bucket.numel = offset_of_[i] + params_[i].numel();
      }
      bucket.shard = round_up((bucket.numel + n - 1) / n, align);
      bucket.flat_param = zeros({bucket.shard * n}, bucket.dtype, bucket.device);  // the padding stays 0
      bucket.shard_param = alias_elements(bucket.flat_param, group_.rank() * bucket.shard, {bucket.shard});
      bucket.shard_param.set_requires_grad(true);
      bucket.versions.assign(bucket.params.size(), 0);  // filled by refresh_shards below
      bucket.pending = bucket.params.size();
      shard_groups[g].push_back(bucket.shard_param);
      stats_.shard_elements += bucket.shard;
      buckets_.push_back(std::move(bucket));
    }
    first += groups[g].size();
  }
  for (const Tensor& p : params_) {
    stats_.parameters += p.numel();
    shape_of_.push_back(p.shape());
  }
  stats_.buckets = static_cast<int64_t>(buckets_.size());
  refresh_shards(/*force=*/true);
  optimizer_ = make(shard_groups);
  AG_CHECK(optimizer_ != nullptr, "ZeroRedundancyOptimizer: the shard optimizer factory returned none");
  AG_CHECK(optimizer_->parameters().size() == buckets_.size(), "ZeroRedundancyOptimizer: the factory's optimizer ",
           "holds ", optimizer_->parameters().size(), " parameters, not the ", buckets_.size(), " shards it was given");
}

void ZeroRedundancyOptimizer::on_gradient_ready(size_t index) {
  // Before any state changes: a parameter of another shape would be copied past its slot of the
  // flat buffers (at either stage), and an error after the counts moved would stick.
  check_unchanged(buckets_[bucket_of_[index]], index);
  AG_CHECK(!ready_[index], "ZeroRedundancyOptimizer: parameter ", index, " (", params_[index].to_string(),
           ") got a second gradient before the first backward's were all reduced; hint: every backward must reach ",
           "every parameter");
  ready_[index] = true;
  ++ready_count_;
  Bucket& bucket = buckets_[bucket_of_[index]];
  if (options_.stage == 1) adopt_gradient(bucket, index);
  --bucket.pending;
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) launch(buckets_[next_launch_++]);
  if (ready_count_ == params_.size()) finish_reduction();
}

void ZeroRedundancyOptimizer::adopt_gradient(Bucket& bucket, size_t index) {
  Tensor& p = params_[index];
  if (!bucket.flat_grad.defined()) {
    bucket.flat_grad = zeros({bucket.shard * group_.size()}, bucket.dtype, bucket.device);  // the padding stays 0
  }
  if (is_alias_at(p.grad(), bucket.flat_grad, offset_of_[index])) return;  // accumulated in place
  copy_elements(bucket.flat_grad, offset_of_[index], p.grad(), 0, p.numel());
  p.set_grad(alias_elements(bucket.flat_grad, offset_of_[index], p.shape()));  // the fresh one is freed
}

void ZeroRedundancyOptimizer::launch(Bucket& bucket) {
  if (options_.stage == 1) {
    // As DistributedDataParallel's buckets: every rank ends with the averaged gradients, the
    // shard's among them, in the buffer the parameters' gradients alias.
    bucket.work = group_.all_reduce_async(bucket.flat_grad, ReduceOp::kAvg, CheckAcrossRanks::kNo);
    return;
  }
  const int n = group_.size();
  bucket.flat_grad = zeros({bucket.shard * n}, bucket.dtype, bucket.device);  // the padding stays 0
  for (size_t i : bucket.params) {
    Tensor& p = params_[i];
    copy_elements(bucket.flat_grad, offset_of_[i], p.grad(), 0, p.numel());
    p.set_grad(Tensor());  // only the averaged shard is kept
  }
  bucket.reduced = Tensor::empty({bucket.shard}, bucket.dtype, bucket.device);
  bucket.work =
      group_.reduce_scatter_async(bucket.reduced, bucket.flat_grad, ReduceOp::kAvg, CheckAcrossRanks::kNo);
}

void ZeroRedundancyOptimizer::finish_reduction() {
  for (Bucket& bucket : buckets_) {
    bucket.work->wait();
    bucket.work.reset();
    if (options_.stage == 1) {
      // The parameters' gradients (averaged) accumulate across backwards in flat_grad, and the
      // next reduction of the sum is the average of the sum again; the shard reads its part.
      if (!is_alias_at(bucket.shard_param.grad(), bucket.flat_grad, group_.rank() * bucket.shard)) {
        bucket.shard_param.set_grad(alias_elements(bucket.flat_grad, group_.rank() * bucket.shard, {bucket.shard}));
      }
    } else {
      // The parameters' gradients were released, so the shard accumulates the reductions.
      bucket.flat_grad = Tensor();
      Tensor grad = bucket.shard_param.grad();
      if (grad.defined()) {
        accumulate_(grad, bucket.reduced);
      } else {
        bucket.shard_param.set_grad(bucket.reduced);
      }
      bucket.reduced = Tensor();
    }
    bucket.pending = bucket.params.size();
    // The shard's gradient is as new as its parameters' latest: GradScaler refuses a step whose
    // gradients changed after unscale_ by this stamp.
    uint64_t pass = 0;
    for (size_t i : bucket.params) pass = std::max(pass, params_[i].impl()->grad_pass);
    bucket.shard_param.impl()->grad_pass = pass;
  }
  ready_.assign(params_.size(), false);
  ready_count_ = 0;
  next_launch_ = 0;
  ++stats_.syncs;
}

void ZeroRedundancyOptimizer::abandon_reduction() {
  // A backward that stopped part way (an exception in it, or in a hook): the buckets it launched
  // are waited for (every rank launched them, in the same order), and the counts start again.
  for (Bucket& bucket : buckets_) {
    if (bucket.work) bucket.work->wait();
    bucket.work.reset();
    bucket.reduced = Tensor();
    bucket.pending = bucket.params.size();
  }
  ready_.assign(params_.size(), false);
  ready_count_ = 0;
  next_launch_ = 0;
}

void ZeroRedundancyOptimizer::before_step() {
  check_reduced();
  // A parameter written outside the optimizer since the last gather (a checkpoint load, a manual
  // write): its shard takes the new values, and the bumped shard makes the optimizer remake its
  // master from them, as it does for a parameter of its own.
  refresh_shards(/*force=*/false);
}

void ZeroRedundancyOptimizer::copy_to_shard(const Bucket& bucket, size_t index, Tensor& shard,
                                            const Tensor& source) const {
  const int64_t begin = group_.rank() * bucket.shard, end = begin + bucket.shard;
  const int64_t first = offset_of_[index], last = first + params_[index].numel();
  const int64_t lo = std::max(begin, first), hi = std::min(end, last);
  copy_elements(shard, lo - begin, source, lo - first, hi - lo);
}

void ZeroRedundancyOptimizer::check_unchanged(const Bucket& bucket, size_t index) const {
  const Tensor& p = params_[index];
  AG_CHECK(p.dtype() == bucket.dtype && p.device() == bucket.device && p.shape() == shape_of_[index],
           "ZeroRedundancyOptimizer: parameter ", index, " is now ", p.to_string(), ", but it was ",
           dtype_name(bucket.dtype), " ", shape_to_string(shape_of_[index]), " on ", bucket.device, " when it was ",
           "sharded; hint: move or convert the model (model.to) before building the ZeroRedundancyOptimizer");
}

bool ZeroRedundancyOptimizer::place_in_bucket(Bucket& bucket, size_t index) {
  Tensor& p = params_[index];
  if (is_alias_at(p, bucket.flat_param, offset_of_[index])) return false;
  check_unchanged(bucket, index);
  copy_elements(bucket.flat_param, offset_of_[index], p, 0, p.numel());
  const Tensor grad = p.grad();  // set_data clears it
  p.set_data(alias_elements(bucket.flat_param, offset_of_[index], p.shape()));
  if (grad.defined()) p.set_grad(grad);
  return true;
}

void ZeroRedundancyOptimizer::refresh_shards(bool force) {
  for (Bucket& bucket : buckets_) {
    bool changed = force;
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const size_t i = bucket.params[k];
      // A parameter given new storage (set_data, or a load that replaces it) moves back into the bucket.
      changed |= place_in_bucket(bucket, i);
      changed |= params_[i].version() != bucket.versions[k];
    }
    if (!changed) continue;
    for (size_t k = 0; k < bucket.params.size(); ++k) bucket.versions[k] = params_[bucket.params[k]].version();
    bucket.shard_param.bump_version();  // the optimizer remakes the shard's master from its values
  }
}

void ZeroRedundancyOptimizer::check_reduced() const {
  if (ready_count_ == 0) return;
  std::ostringstream missing;
  for (size_t i = 0, listed = 0; i < params_.size() && listed < 5; ++i) {
    if (!ready_[i]) missing << (listed++ ? ", " : "") << "parameter " << i << " (" << params_[i].to_string() << ")";
  }
  AG_FAIL("ZeroRedundancyOptimizer: step() after a backward that gave no gradient to ",
          params_.size() - ready_count_, " of the ", params_.size(), " parameters (", missing.str(), "), so their ",
          "buckets were never reduced; hint: every parameter that requires grad must take part in the loss (or ",
          "freeze it before building the optimizer)");
}

void ZeroRedundancyOptimizer::gather_parameters() {
  std::vector<std::shared_ptr<Work>> works;
  for (Bucket& bucket : buckets_) {
    // In place: the shard is flat_param's own part (the step wrote it there), the rest arrives.
    works.push_back(group_.all_gather_async(bucket.flat_param, bucket.shard_param, CheckAcrossRanks::kNo));
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    works[b]->wait();
    Bucket& bucket = buckets_[b];
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      Tensor& p = params_[bucket.params[k]];
      p.bump_version();  // written through flat_param: saved tensors and caches must see it
      bucket.versions[k] = p.version();
    }
  }
  ++stats_.gathers;
}

void ZeroRedundancyOptimizer::zero_grad() {
  if (ready_count_ != 0) abandon_reduction();
  optimizer_->zero_grad();
  for (Tensor& p : params_) p.set_grad(Tensor());
  for (Bucket& bucket : buckets_) bucket.flat_grad = Tensor();
}

double ZeroRedundancyOptimizer::clip_grad_norm_(double max_norm, nn::utils::ClipGradNormOptions options) {
  const double p = options.norm_type;
  AG_CHECK(p > 0 && !std::isnan(p), "ZeroRedundancyOptimizer::clip_grad_norm_: norm_type must be > 0 or infinity, ",
           "got ", p);
  std::vector<Tensor> grads;
  for (const Tensor& shard : optimizer_->parameters()) {
    Tensor g = shard.step_grad();
    if (g.defined()) grads.push_back(g);
  }
  // This rank's part of the norm, reduced over the ranks in float64 so every rank gets the same bits.
  Tensor partial = zeros({1}, DType::kFloat64, group_.device());
  const bool inf_norm = std::isinf(p);
  if (p == 2.0) {
    if (!grads.empty()) kernels::sum_of_squares(grads, partial);
  } else {
    double acc = 0.0;
    for (const Tensor& g : grads) {
      for (double v : g.to_double_vector()) acc = inf_norm ? std::max(acc, std::abs(v)) : acc + std::pow(std::abs(v), p);
    }
    partial = Tensor::from_vector(std::vector<double>{acc}, {1}, DType::kFloat64, group_.device());
  }
  group_.all_reduce(partial, inf_norm ? ReduceOp::kMax : ReduceOp::kSum);
  const double total_p = partial.item<double>();
  const double norm = inf_norm ? total_p : std::pow(total_p, 1.0 / p);
  AG_CHECK(std::isfinite(norm) || !options.error_if_nonfinite, "ZeroRedundancyOptimizer::clip_grad_norm_: the ",
           "total norm of order ", p, " of the gradients is non-finite (", norm, "), so they cannot be clipped; ",
           "hint: with a GradScaler, clip after unscale_ (a skipped step is then expected), or set ",
           "error_if_nonfinite = false");
  if (!std::isfinite(norm)) return norm;  // as nn::utils::clip_grad_norm_: nothing is scaled
  if (max_norm / (norm + 1e-6) < 1.0 && !grads.empty()) {
    // Scaled in place by the kernel nn::utils::clip_grad_norm_ uses (so the bits are its bits),
    // given the square of the reduced norm.
    Tensor sum_sq = p == 2.0 ? partial
                             : Tensor::from_vector(std::vector<double>{norm * norm}, {1}, DType::kFloat64,
                                                   group_.device());
    Tensor unused = zeros({1}, DType::kFloat64, group_.device());
    kernels::clip_by_norm_(grads, sum_sq, max_norm, unused);
  }
  return norm;
}

std::vector<optim::ParamState> ZeroRedundancyOptimizer::consolidated_state() { return consolidate(std::nullopt); }

std::vector<optim::ParamState> ZeroRedundancyOptimizer::consolidated_state(int to) { return consolidate(to); }

std::vector<optim::ParamState> ZeroRedundancyOptimizer::consolidate(std::optional<int> to) {
  const int n = group_.size();
  if (to.has_value()) {
    // Agreed first, so that a bad `to` throws on every rank rather than leaving the others waiting.
    const std::vector<std::string> named = group_.all_gather_bytes(std::to_string(*to));
    std::string all;
    for (size_t r = 0; r < named.size(); ++r) all += ::ampgrad::detail::str_cat(r == 0 ? "" : ", ", named[r]);
    AG_CHECK(std::all_of(named.begin(), named.end(), [&](const std::string& v) { return v == named[0]; }),
             "ZeroRedundancyOptimizer::consolidated_state(to): the ranks passed different values of to (", all,
             ", by rank); hint: every rank passes the rank that keeps the state");
    AG_CHECK(*to >= 0 && *to < n, "ZeroRedundancyOptimizer::consolidated_state(to = ", *to, "): to must be a rank ",
             "of the group, in [0, ", n, ")");
  }
  const bool keep = !to.has_value() || *to == group_.rank();
  const std::vector<optim::ParamState> shards = optimizer_->state();
  // One buffer for every gather, allocated (and agreed on) before the first: a rank that could not
  // allocate one mid-way would leave the others waiting in a gather.
  int64_t largest = 0;
  for (const Bucket& bucket : buckets_) largest = std::max(largest, bucket.shard * n);
  Tensor gathered;
  std::string error;
  try {
    gathered = Tensor::empty({largest}, DType::kFloat32, buckets_.empty() ? group_.device() : buckets_[0].device);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_on_outcome(group_, error, "ZeroRedundancyOptimizer::consolidated_state",
                   "each rank needs one bucket's gathered state tensor: free memory, or use larger shards");
  std::vector<optim::ParamState> out(keep ? params_.size() : 0);
  // A keeping rank that fails to copy the state out (memory) goes on taking part in every gather,
  // and the ranks agree on the outcome at the end, so that no rank is left waiting in a gather.
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = buckets_[b];
    for (const auto& [key, shard] : shards[b].tensors) {
      // Every rank takes part in the all-gather (as PyTorch's consolidation broadcasts each shard
      // to every rank); only the keeping ones copy out of it.
      Tensor full = alias_elements(gathered, 0, {bucket.shard * n});
      group_.all_gather(full, shard);
      if (!keep || !error.empty()) continue;
      try {
        for (size_t i : bucket.params) {
          Tensor t = Tensor::empty(params_[i].shape(), DType::kFloat32, bucket.device);
          copy_elements(t, 0, full, offset_of_[i], params_[i].numel());
          out[i].tensors[key] = t;
        }
      } catch (const std::exception& e) {
        error = e.what();
        out.clear();
      }
    }
    if (keep && error.empty()) {
      for (size_t i : bucket.params) out[i].counters = shards[b].counters;
    }
  }
  agree_on_outcome(group_, error, "ZeroRedundancyOptimizer::consolidated_state",
                   "the keeping rank holds the whole optimizer state (12 bytes per parameter with Adam and "
                   "masters): free memory there, or consolidate into a rank that has it");
  return out;
}

void ZeroRedundancyOptimizer::load_consolidated_state(const std::vector<optim::ParamState>& state) {
  AG_CHECK(state.size() == params_.size(), "ZeroRedundancyOptimizer::load_consolidated_state: the state has ",
           state.size(), " parameters, the optimizer ", params_.size());
  std::vector<optim::ParamState> shards(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = buckets_[b];
    const optim::ParamState& lead = state[bucket.params[0]];
    for (const auto& [key, unused] : lead.tensors) {
      Tensor shard = zeros({bucket.shard}, DType::kFloat32, bucket.device);
      for (size_t i : bucket.params) {
        auto it = state[i].tensors.find(key);
        AG_CHECK(it != state[i].tensors.end() && it->second.defined() && it->second.dtype() == DType::kFloat32 &&
                     it->second.numel() == params_[i].numel(),
                 "ZeroRedundancyOptimizer::load_consolidated_state: parameter ", i, " (", params_[i].to_string(),
                 ") has no float32 '", key, "' of its size, though parameter ", bucket.params[0],
                 " of the same bucket has; hint: load a state saved from an optimizer over the same parameters");
        Tensor local = it->second;
        if (local.device() != bucket.device) local = local.to(bucket.device);
        copy_to_shard(bucket, i, shard, local);
      }
      shards[b].tensors[key] = shard;
    }
    for (size_t i : bucket.params) {
      AG_CHECK(state[i].counters == lead.counters, "ZeroRedundancyOptimizer::load_consolidated_state: parameter ", i,
               "'s counters (step) differ from those of parameter ", bucket.params[0],
               ", which shares its bucket and so its shard; hint: a shard steps all its parameters together");
    }
    shards[b].counters = lead.counters;
  }
  // The shards first take the parameters' current values, so the masters loaded next are kept as
  // they are (the optimizer sees its parameters already in sync with them).
  refresh_shards(/*force=*/true);
  optimizer_->load_state(shards);
}

std::unique_ptr<optim::Optimizer> ZeroRedundancyOptimizer::consolidated_optimizer() {
  return build_consolidated(consolidated_state(), true);
}

std::unique_ptr<optim::Optimizer> ZeroRedundancyOptimizer::consolidated_optimizer(int to) {
  return build_consolidated(consolidated_state(to), to == group_.rank());
}

std::unique_ptr<optim::Optimizer> ZeroRedundancyOptimizer::build_consolidated(
    const std::vector<optim::ParamState>& state, bool here) {
  // Built after the gathers and agreed on, so that a rank that fails here (its memory, the
  // factory) ends every rank's call alike.
  std::unique_ptr<optim::Optimizer> whole;
  std::string error;
  if (here) {
    try {
      whole = make_unsharded_optimizer();
      whole->load_state(state);
    } catch (const std::exception& e) {
      error = e.what();
      whole.reset();
    }
  }
  agree_on_outcome(group_, error, "ZeroRedundancyOptimizer::consolidated_optimizer",
                   "the keeping rank builds one optimizer over copies of every parameter");
  return whole;
}

std::unique_ptr<optim::Optimizer> ZeroRedundancyOptimizer::make_unsharded_optimizer() {
  std::vector<std::vector<Tensor>> groups(optimizer_->num_param_groups());
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor copy = Tensor::empty(params_[i].shape(), params_[i].dtype(), params_[i].device());
    copy_(copy, params_[i]);
    copy.set_requires_grad(true);
    groups[group_of_[i]].push_back(copy);
  }
  std::unique_ptr<optim::Optimizer> whole = make_(groups);
  // Under stochastic rounding the shards' seed, given before the mode: the mode would otherwise
  // draw one from the global generator, on the building rank alone.
  if (optimizer_->master_weights() == optim::MasterWeights::kStochasticRounding) {
    whole->set_rounding_seed(optimizer_->rounding_seed());
  }
  whole->set_master_weights(optimizer_->master_weights());
  std::vector<optim::GroupState> options = optimizer_->param_group_state();
  for (size_t g = 0; g < options.size(); ++g) options[g].num_params = groups[g].size();
  whole->load_param_group_state(options);
  return whole;
}

void ZeroRedundancyOptimizer::load_consolidated_optimizer(const optim::Optimizer& whole) {
  AG_CHECK(whole.name() == optimizer_->name(), "ZeroRedundancyOptimizer::load_consolidated_optimizer: the state is ",
           whole.name(), "'s, the shards are stepped by ", optimizer_->name());
  AG_CHECK(whole.num_param_groups() == optimizer_->num_param_groups(), "ZeroRedundancyOptimizer::",
           "load_consolidated_optimizer: the state has ", whole.num_param_groups(), " parameter groups, this ",
           "optimizer ", optimizer_->num_param_groups(), "; hint: build it with the same groups");
  std::vector<optim::GroupState> options = whole.param_group_state();
  for (size_t g = 0; g < options.size(); ++g) options[g].num_params = optimizer_->group_parameters(g).size();
  load_consolidated_state(whole.state());
  optimizer_->load_param_group_state(options);
}

}  // namespace ampgrad::distributed

// DistributedDataParallel: the replica check and broadcast at construction, the buckets, and the
// per-iteration reduction driven by post-accumulate-grad hooks.
#include "distributed/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <sstream>

#include "distributed/buckets.h"
#include "framework/autograd.h"
#include "framework/device.h"
#include "framework/error.h"
#include "framework/float8_scaling.h"
#include "framework/storage_kernels.h"
#include "framework/tensor_impl.h"

namespace ampgrad::distributed {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// dst[0..n) = src[0..n), elements of `dtype`, both on `device` (no conversion).
void copy_elements(void* dst, const void* src, int64_t n, DType dtype, Device device) {
  require_backend(device, "DistributedDataParallel");
  storage::copy(dst, dtype, device, src, dtype, device, n);
}

void* element_ptr(Tensor& t, int64_t offset) {
  return static_cast<char*>(t.data_ptr()) + static_cast<size_t>(offset) * element_size(t.dtype());
}

std::string describe(const std::string& name, const Tensor& p) {
  return name + ": " + p.to_string() + (p.requires_grad() ? "" : " (no grad)");
}

}  // namespace

/// Gradients of several parameters, laid end to end in one flat tensor that is all-reduced at once.
struct DistributedDataParallel::Bucket {
  std::vector<size_t> params;
  Tensor flat;
  size_t pending = 0;  // parameters whose gradient has not arrived this iteration
  std::shared_ptr<Work> work;
};

DistributedDataParallel::DistributedDataParallel(nn::Module& module, DataParallelOptions options)
    : DistributedDataParallel(module, default_group(), options) {}

DistributedDataParallel::DistributedDataParallel(nn::Module& module, ProcessGroup& group, DataParallelOptions options)
    : module_(module), group_(group), options_(options) {
  AG_CHECK(options.bucket_cap_mb > 0 && options.first_bucket_cap_mb > 0, "DistributedDataParallel: bucket caps ",
           "must be > 0, got bucket_cap_mb ", options.bucket_cap_mb, ", first_bucket_cap_mb ",
           options.first_bucket_cap_mb);
  // A child that does not own the module: the caller keeps it (and its own handles to it).
  register_module("module", std::shared_ptr<nn::Module>(&module, [](nn::Module*) {}));
  check_replicas();
  for (const auto& [name, p] : module.named_parameters()) {
    if (!p.requires_grad()) continue;  // frozen parameters are neither reduced nor waited for
    names_.push_back(name);
    params_.push_back(p);
    layouts_.push_back(p.to_string());
  }
  if (options.broadcast_parameters) {
    std::vector<std::shared_ptr<Work>> works;
    for (auto named : {module.named_parameters(), module.named_buffers()}) {
      for (auto& [name, t] : named) {
        works.push_back(group.broadcast_async(t, 0, CheckAcrossRanks::kNo));  // layouts checked above
      }
    }
    for (auto& work : works) work->wait();
  }
  build_buckets();
  for (size_t i = 0; i < params_.size(); ++i) {
    hook_ids_.push_back(params_[i].register_post_accumulate_grad_hook([this, i](const Tensor&) {
      on_gradient_ready(i);
    }));
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  // Buckets still in flight keep their buffers inside their Work, so nothing is waited for here.
  for (size_t i = 0; i < params_.size(); ++i) params_[i].remove_post_accumulate_grad_hook(hook_ids_[i]);
}

void DistributedDataParallel::check_replicas() {
  // Every rank's parameter and buffer list, gathered, so that a difference is an error on every
  // rank (a mismatch found by one rank alone would leave the others waiting in a collective).
  const nn::Named<Tensor> params = module_.named_parameters(), buffers = module_.named_buffers();
  std::ostringstream mine;
  for (const auto& [name, p] : params) mine << describe(name, p) << '\n';
  for (const auto& [name, b] : buffers) mine << "buffer " << describe(name, b) << '\n';
  const std::vector<std::string> all = group_.all_gather_bytes(mine.str());
  const auto lines = [](const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  };
  const std::vector<std::string> reference = lines(all[0]);
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    const std::vector<std::string> theirs = lines(all[r]);
    size_t k = 0;
    while (k < reference.size() && k < theirs.size() && reference[k] == theirs[k]) ++k;
    AG_FAIL("DistributedDataParallel: the ranks' models differ: rank 0 has '",
            k < reference.size() ? reference[k] : "(nothing)", "' where rank ", r, " has '",
            k < theirs.size() ? theirs[k] : "(nothing)", "' (entry ", k, "; rank 0 lists ", reference.size(),
            " parameters and buffers, rank ", r, " lists ", theirs.size(), "); hint: build the same model, with the ",
            "same dtypes and devices, on every rank before wrapping it");
  }
  for (const nn::Named<Tensor>* named : {&params, &buffers}) {
    for (const auto& [name, t] : *named) {
      AG_CHECK(t.device() == group_.device(), "DistributedDataParallel: ", named == &params ? "parameter " : "buffer ",
               describe(name, t), " is on ", t.device(), ", but this ", backend_name(group_.backend()),
               " process group reduces ", group_.device(), " tensors; hint: ",
               group_.device() == Device::kCPU ? "use Backend::kNCCL for a model on the GPU"
                                               : "use Backend::kMPI for a model on the CPU",
               ", or move the model with model.to(Device::k", group_.device() == Device::kCPU ? "CPU" : "CUDA", ")");
    }
  }
}

void DistributedDataParallel::build_buckets() {
  std::vector<BucketParam> sizes;
  for (const Tensor& p : params_) {
    sizes.push_back({.bytes = p.numel() * static_cast<int64_t>(element_size(p.dtype())), .dtype = p.dtype(),
                     .device = p.device()});
  }
  const auto assignment = assign_buckets(sizes, static_cast<int64_t>(options_.first_bucket_cap_mb * kMiB),
                                         static_cast<int64_t>(options_.bucket_cap_mb * kMiB));
  bucket_of_.assign(params_.size(), 0);
  offset_of_.assign(params_.size(), 0);
  ready_.assign(params_.size(), false);
  buckets_.resize(assignment.size());
  for (size_t b = 0; b < assignment.size(); ++b) {
    Bucket& bucket = buckets_[b];
    bucket.params = assignment[b];
    int64_t numel = 0;
    for (size_t i : bucket.params) {
      bucket_of_[i] = b;
      offset_of_[i] = numel;
      numel += params_[i].numel();
    }
    const Tensor& first = params_[bucket.params.front()];
    bucket.flat = Tensor::empty({numel}, first.dtype(), first.device());
    stats_.parameters += numel;
    stats_.bytes_per_sync += numel * static_cast<int64_t>(element_size(first.dtype()));
  }
  stats_.buckets = static_cast<int64_t>(buckets_.size());
}

void DistributedDataParallel::check_unchanged() const {
  for (size_t i = 0; i < params_.size(); ++i) {
    AG_CHECK(params_[i].to_string() == layouts_[i], "DistributedDataParallel: parameter ", names_[i], " was ",
             layouts_[i], " when wrapped and is now ", params_[i].to_string(), "; hint: convert the model (to()) ",
             "before wrapping it, and wrap it again after any change");
  }
}

void DistributedDataParallel::broadcast_buffers() {
  std::vector<std::shared_ptr<Work>> works;
  for (auto& [name, b] : module_.named_buffers()) works.push_back(group_.broadcast_async(b, 0, CheckAcrossRanks::kNo));
  for (auto& work : works) work->wait();
}

void DistributedDataParallel::check_usable() const {
  AG_CHECK(broken_.empty(), "DistributedDataParallel: a gradient reduction failed earlier, so the replicas may ",
           "differ; this wrapper can no longer be used (first error: ", broken_, ")");
}

std::string DistributedDataParallel::unready_parameters() const {
  std::string out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!ready_[i]) out += (out.empty() ? "" : ", ") + names_[i];
  }
  return out;
}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  check_usable();
  check_unchanged();
  if (armed_ && ready_count_ > 0) {
    // The previous backward reduced some buckets but not all: finish what is in flight (every rank
    // launched the same buckets), then report the parameters that got no gradient.
    for (size_t b = 0; b < next_launch_; ++b) buckets_[b].work->wait();
    const std::string missing = unready_parameters();
    armed_ = false;
    ready_count_ = 0;
    AG_FAIL("DistributedDataParallel: the previous backward() produced no gradient for ", missing, " (",
            params_.size() - std::count(ready_.begin(), ready_.end(), true), " of ", params_.size(),
            " parameters), so their gradients were not averaged across ranks; hint: every parameter that requires ",
            "grad must contribute to the loss (freeze the others with set_requires_grad(false) before wrapping)");
  }
  armed_ = sync_enabled_ && GradMode::is_enabled();
  reduced_ = false;
  if (armed_) {
    std::fill(ready_.begin(), ready_.end(), false);
    ready_count_ = 0;
    next_launch_ = 0;
    overlapped_ = 0;
    for (Bucket& bucket : buckets_) {
      bucket.pending = bucket.params.size();
      bucket.work.reset();
    }
  }
  if (options_.broadcast_buffers) broadcast_buffers();
  if (options_.reduce_float8_amax && GradMode::is_enabled()) reduce_float8_amaxes();
  return module_.forward(x);
}

// Only in a training forward (grad mode on), synchronised or under no_sync(): every rank runs
// those together (each micro-batch of an accumulation too, or the ranks' scales would part at
// the steps the micro-batches close), so a forward one rank alone runs (an evaluation under
// NoGradGuard) joins no collective. Every parameter's states count, frozen ones too (the list is
// the same on every rank). The slots of weights without FP8 states yet (the first step)
// are 0, which leaves the others' maxima as they are; a NaN goes as inf (MAX over NaN is not
// defined the same way by every MPI and NCCL), which keeps the scale just as a NaN does.
void DistributedDataParallel::reduce_float8_amaxes() {
  std::vector<Tensor> weights;
  for (const auto& [name, p] : module_.named_parameters()) weights.push_back(p);
  if (weights.empty()) return;
  const fp8::Region region = fp8::region(weights.front().device());
  if (!region.enabled || region.recipe.scaling != Float8Scaling::kDelayed) return;
  const size_t roles = kFloat8Roles.size();
  std::vector<float> amaxes(weights.size() * roles, 0.0f);
  for (size_t i = 0; i < weights.size(); ++i) {
    Float8LinearState* state = weights[i].impl()->float8.get();
    if (state == nullptr) continue;
    const std::lock_guard<std::mutex> lock(state->mutex);
    for (size_t r = 0; r < roles; ++r) {
      const float a = state->of(kFloat8Roles[r]).amax_history()[0];
      amaxes[i * roles + r] = std::isnan(a) ? INFINITY : a;
    }
  }
  Tensor reduced = Tensor::from_vector(amaxes, {static_cast<int64_t>(amaxes.size())}).to(weights.front().device());
  group_.all_reduce(reduced, ReduceOp::kMax);
  const std::vector<float> out = reduced.to_vector();
  for (size_t i = 0; i < weights.size(); ++i) {
    Float8LinearState* state = weights[i].impl()->float8.get();
    if (state == nullptr) continue;
    const std::lock_guard<std::mutex> lock(state->mutex);
    for (size_t r = 0; r < roles; ++r) state->of(kFloat8Roles[r]).set_step_amax(out[i * roles + r]);
  }
}

void DistributedDataParallel::on_gradient_ready(size_t index) {
  if (!armed_ && !(reduced_ && sync_enabled_)) return;  // under no_sync(), or before any forward
  try {
    check_usable();
    // PyTorch ignores such a gradient, leaving it un-averaged and the replicas silently apart.
    AG_CHECK(armed_ && !ready_[index], "DistributedDataParallel: parameter ", names_[index], " received a ",
             "gradient after this forward's gradients were already averaged across ranks (a second backward() ",
             "through the same forward, or a backward through the inner module); it would not be averaged and the ",
             "replicas would drift apart; hint: call the wrapper's forward before each backward, or run the extra ",
             "backward passes under no_sync()");
    ready_[index] = true;
    ++ready_count_;
    Bucket& bucket = buckets_[bucket_of_[index]];
    Tensor grad = params_[index].grad();
    copy_elements(element_ptr(bucket.flat, offset_of_[index]), grad.data_ptr(), grad.numel(), grad.dtype(),
                  grad.device());
    if (--bucket.pending == 0 && options_.overlap) launch_ready_buckets();
    if (ready_count_ == params_.size()) finish_reduction();
  } catch (const Error& e) {
    if (broken_.empty()) broken_ = e.what();
    throw;
  }
}

void DistributedDataParallel::launch_ready_buckets() {
  // In bucket order on every rank, whatever order the gradients arrived in: collectives must be
  // issued in the same order everywhere.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) launch(next_launch_++);
}

void DistributedDataParallel::launch(size_t b) {
  Bucket& bucket = buckets_[b];
  if (ready_count_ < params_.size()) ++overlapped_;
  // The layouts were checked across ranks at construction, so the per-call check is skipped.
  bucket.work = group_.all_reduce_async(bucket.flat, ReduceOp::kAvg, CheckAcrossRanks::kNo);
}

void DistributedDataParallel::finish_reduction() {
  const auto start = std::chrono::steady_clock::now();
  launch_ready_buckets();  // all of them, when overlap is off
  for (Bucket& bucket : buckets_) {
    bucket.work->wait();
    for (size_t i : bucket.params) {
      Tensor grad = params_[i].grad();
      copy_elements(grad.data_ptr(), element_ptr(bucket.flat, offset_of_[i]), grad.numel(), grad.dtype(),
                    grad.device());
      grad.bump_version();
    }
    bucket.work.reset();
  }
  armed_ = false;
  reduced_ = true;
  ready_count_ = 0;
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats_.last_wait_seconds = waited;
  stats_.last_overlapped_buckets = overlapped_;
  stats_.total_wait_seconds += waited;
  ++stats_.syncs;
}

}  // namespace ampgrad::distributed

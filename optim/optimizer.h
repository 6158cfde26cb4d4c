// Optimizer base: parameter groups, FP32 master weights for lower-precision parameters,
// zero_grad, the step skeleton and state export for checkpoints. Subclasses implement the update
// rule on FP32; OptimizerWithOptions holds each group's typed options (the one place lr lives).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "framework/error.h"
#include "framework/tensor.h"

namespace ampgrad::optim {

/// One parameter's optimizer state, by name: FP32 tensors ("master", "momentum_buffer",
/// "exp_avg", ...) and integer counters ("step"; under stochastic rounding "rounding_seed" and
/// "rounding_step").
struct ParamState {
  std::map<std::string, Tensor> tensors;  ///< FP32 state tensors by name ("master", "exp_avg", ...)
  std::map<std::string, int64_t> counters;  ///< integer state by name ("step")
};

/// A group's options by name, as checkpoints store them (a bool is 0 or 1).
using OptionValues = std::map<std::string, double>;

/// One parameter group as checkpoints store it: its size and its options.
struct GroupState {
  size_t num_params = 0;  ///< parameters in the group
  OptionValues options = {};  ///< the group's options by name
};

/// Parameters with their own options (PyTorch's param_groups); without options a group takes
/// the optimizer's defaults.
template <typename Options>
struct ParamGroup {
  std::vector<Tensor> params;  ///< the group's parameters (leaves, float32 or 16-bit)
  std::optional<Options> options = std::nullopt;  ///< its options; none: the optimizer's defaults
};

/// How lower-precision (16-bit) parameters are updated. The update itself is always computed in
/// FP32 from FP32 optimizer state; the modes differ in what the new weight is rounded from and how.
/// - kFp32 (the default): an FP32 master copy is kept between steps and updated; the parameter
///   holds its rounding to nearest. 4 extra bytes per parameter.
/// - kNone: no master; every step starts from the rounded parameter and rounds to nearest, so an
///   update below half the parameter's spacing (2^-9 just below 1 in bfloat16) is lost. There to
///   show why masters matter (examples/underflow_demo).
/// - kStochasticRounding: no master; the parameter is updated in FP32 and rounded stochastically
///   (up with probability equal to the distance from the value below over the spacing), so small
///   updates are kept on average. Its random bits are counter-based, keyed by the optimizer's
///   rounding seed, the parameter's index, its update count and the element's index, so a run is
///   reproducible, CPU and CUDA draw the same bits, and data-parallel replicas that share the seed
///   stay identical; the seed and the counts are saved in checkpoints. With a GradScaler (FP16
///   parameters) the unscaled FP32 gradients still ride on step-only FP32 copies (master_of).
enum class MasterWeights : uint8_t { kFp32, kNone, kStochasticRounding };

/// An optimizer over parameter groups with FP32 master weights for 16-bit parameters (or, per
/// MasterWeights, without them): step() updates each parameter's master from its FP32 gradient and
/// writes the rounded value back into the parameter.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// "SGD", "Adam", "AdamW": recorded in checkpoints so a state is never loaded into another kind.
  const std::string& name() const { return name_; }

  /// Sets every gradient to none (as PyTorch 2 does), including the masters' FP32 gradients.
  void zero_grad();
  /// One update of every parameter that has a gradient, from its FP32 gradient, with its group's options.
  void step();
  /// How many times step() has run (a step GradScaler skipped does not count).
  int64_t steps_taken() const { return steps_taken_; }

  /// A function step() calls on this optimizer before or after its update.
  using StepHook = std::function<void(Optimizer&)>;
  /// Runs `hook` at the start of every step(), before any parameter changes (PyTorch's
  /// register_step_pre_hook); a step GradScaler skips runs no hook. Returns the handle to remove it by.
  size_t register_step_pre_hook(StepHook hook);
  /// Runs `hook` at the end of every step(), once every parameter is updated (PyTorch's
  /// register_step_post_hook): ZeroRedundancyOptimizer gathers the updated shards there.
  size_t register_step_post_hook(StepHook hook);
  /// Removes a hook by the handle its register_ call returned (an unknown handle is ignored).
  void remove_step_hook(size_t handle);

  /// Every group's parameters, group after group: parameter `index` below indexes this.
  const std::vector<Tensor>& parameters() const { return params_; }
  /// The number of parameter groups.
  size_t num_param_groups() const { return group_begin_.size(); }
  /// The group parameter `index` belongs to.
  size_t param_group_of(size_t index) const;
  /// The parameters of group `group`.
  std::vector<Tensor> group_parameters(size_t group) const;

  /// The learning rate of group `group`: its options' lr, the only copy.
  double lr(size_t group = 0) const;
  /// Sets the learning rate of every group (finite, >= 0).
  void set_lr(double lr);
  /// Sets the learning rate of group `group` (finite, >= 0).
  void set_lr(size_t group, double lr);

  /// See MasterWeights. kNone and kStochasticRounding drop the masters kept so far (the
  /// constructor makes them: switch right after it). Switching to kStochasticRounding draws a
  /// rounding seed from the global generator (manual_seed, one draw) unless one was set or loaded. Float32
  /// parameters are their own masters in every mode.
  void set_master_weights(MasterWeights mode);
  /// How 16-bit parameters are updated (see set_master_weights).
  MasterWeights master_weights() const { return master_weights_; }
  /// The key of stochastic rounding's random bits (see MasterWeights::kStochasticRounding).
  uint64_t rounding_seed() const { return rounding_seed_; }
  /// Sets it: give every data-parallel rank the same seed (each may have drawn its own, seeded
  /// per rank), so that the replicas round alike and stay identical.
  void set_rounding_seed(uint64_t seed) {
    rounding_seed_ = seed;
    rounding_seed_given_ = true;
  }
  /// The FP32 tensor the update writes: the parameter itself if float32, else its master copy,
  /// first remade from the parameter if the parameter changed outside the optimizer (a
  /// model.to(), a checkpoint load or a manual write), so the master is never stale; without kept
  /// masters (kNone, kStochasticRounding), made from the parameter for this step only (GradScaler
  /// keeps the unscaled gradient on it).
  Tensor master_of(size_t index);
  /// The next step's gradient of parameter `index` in FP32 (undefined if none):
  /// Tensor::step_grad(), converted to FP32 when the parameter is lower precision. A copy made
  /// for the caller: step() itself reads a 16-bit gradient widened, without one.
  Tensor fp32_grad(size_t index);

  /// Every parameter's state, for checkpoints (the tensors are the live ones: copy to keep).
  std::vector<ParamState> state() const;
  /// Restores a state() taken from an optimizer of the same kind over parameters of the same
  /// shapes. Load the parameters' values first: the masters loaded here are then kept as they
  /// are (bit-exact), not remade from the rounded parameters. Set the master weights mode first
  /// (masters are loaded under kFp32 only); the stochastic rounding seed and counts loaded here are
  /// kept by any later switch.
  void load_state(const std::vector<ParamState>& state);
  /// Every group's size and options, for checkpoints.
  std::vector<GroupState> param_group_state() const;
  /// Restores the saved options of every group, lr included, as PyTorch's load_state_dict does
  /// (the options given at construction are replaced). The group sizes must match; the options
  /// are validated before any group changes.
  void load_param_group_state(const std::vector<GroupState>& groups);

 protected:
  /// An optimizer named `name` (for errors and checkpoints), with no parameters yet.
  explicit Optimizer(std::string name) : name_(std::move(name)) {}
  /// Appends a group's parameters (checked: defined float32 or lower-precision leaves, none
  /// already held). Under MasterWeights::kFp32 a lower-precision parameter gets an FP32 master
  /// copy (param.master()): the step updates the master in FP32 and writes the rounded value back
  /// into the parameter.
  void add_params(const std::vector<Tensor>& params);

  // Typed per-group options, implemented by OptimizerWithOptions.
  /// The learning rate of group `group`.
  virtual double group_lr(size_t group) const = 0;
  /// Sets it (checked by the caller).
  virtual void set_group_lr(size_t group, double lr) = 0;
  /// The options of group `group` by name.
  virtual OptionValues group_option_values(size_t group) const = 0;
  /// Throws unless `values` name every option of this kind, and only those, with valid values.
  virtual void check_option_values(const OptionValues& values) const = 0;
  /// Replaces the options of group `group` (checked by check_option_values first).
  virtual void set_group_option_values(size_t group, const OptionValues& values) = 0;

  /// One parameter of a step's update pass.
  struct ParamUpdate {
    size_t index = 0;  ///< the parameter's index
    Tensor master;     ///< what the update writes: FP32 (the parameter itself if float32), or a 16-bit parameter rounded stochastically
    Tensor grad;       ///< its gradient: the unscaled FP32 one, or a 16-bit parameter's own
    Tensor rounded;    ///< the 16-bit parameter to write rounded from the new master (undefined if none)
    uint64_t rounding_key = 0;  ///< 16-bit `master` (stochastic rounding): the key of its random bits
  };
  /// The update rule over every parameter of a step that has a gradient, all on one device: each
  /// master (FP32, or a 16-bit parameter rounded stochastically with rounding_key) -= f(grad,
  /// state), writing the rounded parameter in the same pass, as ONE
  /// multi-tensor pass (see optim/update_kernels.h). step() calls it once per device (and once
  /// per 16-bit parameter under MasterWeights::kNone). Changes no state if the pass throws.
  virtual void update(const std::vector<ParamUpdate>& params) = 0;
  /// Subclass state of parameter `index` (momentum, moments, step counts) for state()/load_state().
  virtual void save_param_state(size_t index, ParamState& out) const = 0;
  /// Restores the state save_param_state() wrote for parameter `index`.
  virtual void load_param_state(size_t index, const ParamState& in) = 0;
  /// Copies a loaded state tensor for parameter `index`, checking it is FP32 with the
  /// parameter's shape, onto the parameter's device.
  Tensor loaded_tensor(size_t index, const ParamState& in, const std::string& key) const;

 private:
  // Records that the master of parameter `index` matches the parameter's current contents.
  void mark_in_sync(size_t index);

  std::string name_;
  std::vector<Tensor> params_;
  std::vector<size_t> group_begin_;  // index in params_ of each group's first parameter
  int64_t steps_taken_ = 0;
  MasterWeights master_weights_ = MasterWeights::kFp32;
  uint64_t rounding_seed_ = 0;
  bool rounding_seed_given_ = false;  // set or loaded: switching modes keeps it
  std::vector<int64_t> rounding_steps_;  // stochastically rounded updates of each parameter so far
  std::map<size_t, StepHook> pre_step_hooks_, post_step_hooks_;  // by handle, so in registration order
  size_t next_hook_handle_ = 0;
  // What each parameter looked like when its master was last in sync with it: an alias of its
  // storage (held, so the address cannot be reused) and that storage's version.
  std::vector<Tensor> synced_storage_;
  std::vector<uint64_t> synced_version_;
};

/// Checks a learning rate (finite, >= 0); `who` names the caller in the error.
void check_lr(double lr, const std::string& who);
/// Checks that `values` names exactly the options in `expected` (for Options::from_values).
void check_option_names(const OptionValues& values, const OptionValues& expected, const std::string& who);

/// The typed group options of an optimizer whose options struct is `Options`. Options has a
/// `double lr`, `void validate(const std::string& who) const`, `OptionValues values() const` and
/// `static Options from_values(const OptionValues&, const std::string& who)`.
template <typename Options>
class OptimizerWithOptions : public Optimizer {
 public:
  /// Group `group`'s options; options().lr is always the lr in use (set_lr and schedulers write it).
  const Options& options(size_t group = 0) const {
    AG_CHECK(group < group_options_.size(), name(), ": no parameter group ", group, " (the optimizer has ",
             group_options_.size(), ")");
    return group_options_[group];
  }
  /// Replaces group `group`'s options (validated first).
  void set_options(size_t group, const Options& options) {
    this->options(group);  // checks the index
    options.validate(name());
    group_options_[group] = options;
  }
  /// Adds a group (PyTorch's add_param_group): its own options, or the defaults given at
  /// construction. Its parameters must not be in another group.
  void add_param_group(const ParamGroup<Options>& group) {
    const Options& options = group.options.has_value() ? *group.options : defaults_;
    options.validate(name());
    add_params(group.params);
    group_options_.push_back(options);
  }
  /// What a group added without options gets.
  const Options& defaults() const { return defaults_; }

 protected:
  /// An optimizer `name` over `groups`, each with its own options or `defaults` (validated).
  OptimizerWithOptions(std::string name, const std::vector<ParamGroup<Options>>& groups, const Options& defaults)
      : Optimizer(std::move(name)), defaults_(defaults) {
    defaults.validate(this->name());
    for (const ParamGroup<Options>& group : groups) add_param_group(group);
    // PyTorch raises too: an optimizer over nothing is almost always a model that registered nothing.
    AG_CHECK(!parameters().empty(), this->name(), ": got an empty parameter list; hint: does the model register ",
             "its parameters (model.parameters() is empty)?");
  }

 private:
  double group_lr(size_t group) const override { return options(group).lr; }
  void set_group_lr(size_t group, double lr) override {
    Options changed = options(group);
    changed.lr = lr;
    set_options(group, changed);
  }
  OptionValues group_option_values(size_t group) const override { return options(group).values(); }
  void check_option_values(const OptionValues& values) const override {
    Options::from_values(values, name()).validate(name());
  }
  void set_group_option_values(size_t group, const OptionValues& values) override {
    set_options(group, Options::from_values(values, name()));
  }

  Options defaults_;
  std::vector<Options> group_options_;
};

}  // namespace ampgrad::optim

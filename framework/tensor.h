// Tensor: a reference-counted handle to contiguous row-major storage plus the autograd metadata.
// Copying a Tensor shares its storage and its autograd identity, as in PyTorch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "framework/dtype.h"

namespace ampgrad {

/// A tensor's sizes, outermost dimension first ({} is a 0-D scalar).
using Shape = std::vector<int64_t>;
struct TensorImpl;
class Node;
class Tensor;

/// Whether backward() keeps the graph's saved tensors for another backward through it.
enum class RetainGraph : bool { kNo, kYes };

/// Runs after a backward pass has accumulated a leaf's gradient (see
/// Tensor::register_post_accumulate_grad_hook); receives the leaf, whose grad() is then final.
using PostAccumulateGradHook = std::function<void(const Tensor& leaf)>;

/// An N-D array with autograd identity: a handle, so copies share storage, grad and history. Contiguous,
/// row-major, on one device, of one dtype; at most kMaxDims dimensions.
class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false
  /// A handle to an existing tensor's state (what ops and the tape use).
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  /// Copies `values` into a new tensor of `shape` (its element count must match), stored as `dtype`.
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape,
                            DType dtype = DType::kFloat32, Device device = Device::kCPU);
  /// The same from doubles (float64 by default, exact).
  static Tensor from_vector(const std::vector<double>& values, const Shape& shape,
                            DType dtype = DType::kFloat64, Device device = Device::kCPU);
  /// Integers (labels, token ids) default to int64.
  static Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape,
                            DType dtype = DType::kInt64, Device device = Device::kCPU);
  /// Uninitialised storage (for kernels' outputs).
  static Tensor empty(const Shape& shape, DType dtype = DType::kFloat32, Device device = Device::kCPU);

  /// Whether this handle refers to a tensor (a default-constructed one does not).
  bool defined() const { return impl_ != nullptr; }
  /// The sizes of the dimensions, outermost first.
  const Shape& shape() const;
  /// The number of dimensions.
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t d) const;  ///< negative d counts from the end
  /// The number of elements (1 for a 0-D tensor).
  int64_t numel() const;
  /// The element type.
  DType dtype() const;
  /// Where the storage lives.
  Device device() const;

  /// A new tensor with this one's values in `dtype` (or on `device`); differentiable.
  /// Returns *this when nothing changes, as PyTorch does.
  Tensor to(DType dtype) const;
  /// See to(DType): the values on `device` (waiting for the copy).
  Tensor to(Device device) const;
  /// to(device), where NonBlocking::kYes lets a copy from pinned host memory (pin_memory()) to the
  /// GPU be queued without the host waiting: the result is usable by later GPU work at once, but
  /// the source must not be overwritten until the GPU has read it (a synchronize, or a later
  /// device-to-host read). From pageable memory, and towards the host, the copy waits as to(device).
  Tensor to(Device device, NonBlocking non_blocking) const;

  /// A copy of this CPU tensor in page-locked ("pinned") host memory, without autograd history,
  /// for input batches: copies from it to the GPU can be asynchronous (to(device, kYes)). Returns
  /// *this when already pinned. Needs a CUDA device. (PyTorch's pin_memory.)
  Tensor pin_memory() const;
  /// Whether this tensor's storage is pinned host memory.
  bool is_pinned() const;

  /// The values on the host as T (float, double or int64_t), converted from any dtype and device
  /// (to int64 as a cast does: truncated toward zero). to_vector() gives floats.
  template <typename T = float> std::vector<T> to_vector() const;
  std::vector<double> to_double_vector() const;  ///< exact for every floating dtype
  /// The one element of a one-element tensor, as T (float by default).
  template <typename T = float> T item() const;
  std::string to_string() const;                  ///< "Tensor[2, 3] float16 cpu"

  // Autograd.
  /// Whether a backward computes this leaf's grad() (PyTorch's requires_grad_).
  void set_requires_grad(bool requires_grad);
  /// Whether this tensor needs a gradient: a leaf so marked, or an op's result with one such input.
  bool requires_grad() const;
  bool is_leaf() const;                    ///< made by the user, not by an op that records
  Tensor grad() const;                     ///< undefined until a backward reaches this leaf
  void set_grad(const Tensor& grad);       ///< undefined clears it (what zero_grad does)
  /// The recorded op that produced this tensor (null for a leaf).
  const std::shared_ptr<Node>& grad_fn() const;
  Tensor detach() const;                   ///< same storage, no history, no grad
  /// Backpropagates from this tensor, accumulating (+=) into the grad() of the leaves it reaches.
  /// `grad` defaults to 1 for one-element tensors and is required otherwise.
  void backward(const Tensor& grad = Tensor(), RetainGraph retain = RetainGraph::kNo) const;
  /// For a leaf that requires grad: `hook` runs during each backward() that reaches this leaf,
  /// once, right after the last of that pass's contributions was accumulated into grad() (a leaf
  /// used twice in the forward gets one call), as PyTorch's register_post_accumulate_grad_hook.
  /// Hooks run on the thread running backward, in registration order; an exception thrown by one
  /// ends that backward(). A hook must not call backward() itself. Returns an id for removal.
  uint64_t register_post_accumulate_grad_hook(PostAccumulateGradHook hook);
  /// Removes a hook registered on this tensor (an unknown id is an error).
  void remove_post_accumulate_grad_hook(uint64_t id);

  /// FP32 master copy of a lower-precision parameter, set by the optimizer that owns it.
  /// Its grad() is the unscaled FP32 gradient between GradScaler::unscale_ and the step.
  Tensor master() const;
  /// Attaches the FP32 master (the optimizer does this for its 16-bit parameters).
  void set_master(const Tensor& master);
  /// The gradient the next optimizer step uses: the master's FP32 gradient when
  /// GradScaler::unscale_ wrote one, else grad() (undefined if neither). What clipping measures.
  Tensor step_grad() const;

  /// Replaces storage, shape, dtype and device in place, keeping this tensor's identity
  /// (what Module::to uses so that handles users hold stay valid). Clears grad.
  void set_data(const Tensor& other);

  // Raw access for kernels. Writers call bump_version() so caches can see the change.
  /// The first element's address (contiguous storage, dtype() elements).
  void* data_ptr();
  /// See data_ptr().
  const void* data_ptr() const;
  /// data_ptr() as T* (T must be the dtype's storage type).
  template <typename T> T* data() { return static_cast<T*>(data_ptr()); }
  /// See data().
  template <typename T> const T* data() const { return static_cast<const T*>(data_ptr()); }
  /// Increases with every write through bump_version(): what saved tensors and caches compare.
  uint64_t version() const;
  /// Marks the storage as written (kernels call it after writing).
  void bump_version();

  /// The shared state behind the handle (for the framework's own code).
  TensorImpl* impl() const { return impl_.get(); }
  /// See impl().
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  /// Whether both handles refer to the same tensor (identity, not values).
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

extern template std::vector<float> Tensor::to_vector<float>() const;
extern template std::vector<double> Tensor::to_vector<double>() const;
extern template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
extern template float Tensor::item<float>() const;
extern template double Tensor::item<double>() const;
extern template int64_t Tensor::item<int64_t>() const;

/// The most dimensions a tensor may have (PyTorch's CUDA kernels stop at 25 too). Every shape a
/// tensor takes is checked against it, and every kernel iterates any such shape, so no op (and no
/// checkpoint file ampgrad writes or reads) meets a rank it cannot handle.
inline constexpr int kMaxDims = 25;

/// Number of elements of a shape; throws when a dimension is negative, the count overflows or the
/// shape has more than kMaxDims dimensions.
int64_t shape_numel(const Shape& shape);
std::string shape_to_string(const Shape& shape);  ///< "[2, 3]"

// Factories (defaults: float32 on CPU, no grad).
/// All elements 0.
Tensor zeros(const Shape& shape, DType dtype = DType::kFloat32, Device device = Device::kCPU);
/// All elements 1.
Tensor ones(const Shape& shape, DType dtype = DType::kFloat32, Device device = Device::kCPU);
/// All elements `value`, converted to dtype as a cast does (rounded; truncated for int64).
Tensor full(const Shape& shape, double value, DType dtype = DType::kFloat32, Device device = Device::kCPU);
/// Standard normal samples from the global generator (see manual_seed).
Tensor randn(const Shape& shape, DType dtype = DType::kFloat32, Device device = Device::kCPU);
/// Uniform samples in [low, high) from the global generator.
Tensor uniform(const Shape& shape, double low, double high, DType dtype = DType::kFloat32,
               Device device = Device::kCPU);
/// uniform(shape, 0, 1, ...): samples in [0, 1) from the global generator.
Tensor rand(const Shape& shape, DType dtype = DType::kFloat32, Device device = Device::kCPU);

}  // namespace ampgrad

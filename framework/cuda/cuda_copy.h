// Device data movement for framework/copy.cc: copies (host<->device, device<->device) with dtype
// conversion, fill and accumulate. The Tensor-level hooks are inline and call raw-pointer
// functions, so the .cu side needs nothing from framework/ beyond headers.
#pragma once

#include <cstdint>

#include "framework/tensor.h"

namespace ampgrad::cuda {

/// dst[0..n) = src[0..n) converted from src_dtype to dst_dtype. At least one side is CUDA.
/// Conversion happens on the device; host<->device with a dtype change goes through a contiguous
/// device staging buffer in the host side's dtype. Device->host waits for the copy.
void copy_raw(void* dst, DType dst_dtype, Device dst_device, const void* src, DType src_dtype, Device src_device,
              int64_t n);
/// dst[0..n) = value, rounded to dtype as the CPU does (double -> compute type -> storage).
void fill_raw(void* dst, DType dtype, int64_t n, double value);
/// dst[i] += src[i] in the compute type, rounded once.
void accumulate_raw(void* dst, const void* src, DType dtype, int64_t n);

/// Waits for all queued device work.
void synchronize();
/// How many times the host has waited for the GPU: synchronize() calls and device-to-host copies.
int64_t host_sync_count();

/// The hooks framework/copy.cc calls (element counts, shapes and dtypes already checked there).
inline void copy(Tensor& dst, const Tensor& src) {
  copy_raw(dst.data_ptr(), dst.dtype(), dst.device(), src.data_ptr(), src.dtype(), src.device(), src.numel());
}
inline void fill(Tensor& dst, double value) { fill_raw(dst.data_ptr(), dst.dtype(), dst.numel(), value); }
inline void accumulate(Tensor& dst, const Tensor& src) {
  accumulate_raw(dst.data_ptr(), src.data_ptr(), dst.dtype(), dst.numel());
}

}  // namespace ampgrad::cuda

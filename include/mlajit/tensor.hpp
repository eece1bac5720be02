#pragma once
// TensorView: a non-owning view of device (or host) memory: pointer, dtype, shape, strides.
// Ops validate views against their params before launching.
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "mlajit/dtype.hpp"

namespace mlajit {

using Stream = void*;  // a CUstream; nullptr is the legacy default stream

struct TensorView {
  static constexpr int kMaxDims = 6;
  void* data = nullptr;
  DType dtype = DType::f32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // in elements

  TensorView() = default;
  // A contiguous row-major view.
  TensorView(void* ptr, DType t, std::initializer_list<int64_t> dims);
  TensorView(void* ptr, DType t, const int64_t* dims, int n);

  bool empty() const { return data == nullptr; }
  int64_t numel() const;
  int64_t size(int d) const { return shape[d < 0 ? d + ndim : d]; }
  bool is_contiguous() const;
  std::string describe() const;  // "bf16[4, 128] contiguous"
};

// Checks used by every op; `what` names the argument in the error message.
void expect_dtype(const TensorView& t, DType dt, const char* what);
void expect_ndim(const TensorView& t, int ndim, const char* what);
void expect_dim(const TensorView& t, int d, int64_t size, const char* what);
void expect_contiguous(const TensorView& t, const char* what);
void expect_nonnull(const TensorView& t, const char* what);
// The data pointer of a non-empty view is a multiple of `bytes` (vectorized access).
void expect_aligned(const TensorView& t, size_t bytes, const char* what);
// dtype, rank, every dim, contiguity and a non-null pointer when non-empty.
void expect_tensor(const TensorView& t, DType dt, std::initializer_list<int64_t> dims, const char* what);

}  // namespace mlajit

#include "mlajit/tensor.hpp"

#include "core/tensor_limits.hpp"
#include "mlajit/error.hpp"

namespace mlajit {

TensorView::TensorView(void* ptr, DType t, const int64_t* dims, int n) : data(ptr), dtype(t), ndim(n) {
  if (n < 0 || n > kMaxDims) throw_invalid("tensor rank", n, fmt::format("0..{}", kMaxDims));
  int64_t stride = 1;
  // The byte size must fit in int64 (numel(), strides and every byte offset are computed in it);
  // every nonzero dim counts, so that no product of dims formed later can wrap either.
  int64_t bytes = static_cast<int64_t>(dtype_size(t));
  for (int d = n - 1; d >= 0; --d) {
    if (dims[d] < 0) throw_invalid(fmt::format("tensor dim {}", d), dims[d], "a non-negative size");
    if (dims[d] != 0 && (__builtin_mul_overflow(bytes, dims[d], &bytes) || bytes > kMaxTensorBytes))
      throw_invalid(fmt::format("tensor dim {}", d), dims[d],
                    fmt::format("a size for which the tensor has at most 2^{} bytes (no address space holds more)",
                                kMaxTensorBytesLog2));
    shape[d] = dims[d];
    strides[d] = stride;
    stride *= dims[d];
  }
}

TensorView::TensorView(void* ptr, DType t, std::initializer_list<int64_t> dims)
    : TensorView(ptr, t, dims.begin(), static_cast<int>(dims.size())) {}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != stride) return false;
    stride *= shape[d];
  }
  return true;
}

std::string TensorView::describe() const {
  std::string s = fmt::format("{}[", dtype_name(dtype));
  for (int d = 0; d < ndim; ++d) s += fmt::format("{}{}", d ? ", " : "", shape[d]);
  s += "]";
  if (!is_contiguous()) s += " strided";
  return s;
}

namespace {
// A default-constructed view (no pointer, no dims) is an argument that was not given: say so
// rather than report its default dtype or rank as wrong.
void expect_given(const TensorView& t, const char* what) {
  if (t.data == nullptr && t.ndim == 0)
    throw Error(ErrorKind::InvalidArgument, fmt::format("{}: no tensor given (an empty view); this argument is required", what));
}
}  // namespace

void expect_dtype(const TensorView& t, DType dt, const char* what) {
  expect_given(t, what);
  if (t.dtype != dt) throw_invalid(fmt::format("{} dtype", what), dtype_name(t.dtype), dtype_name(dt));
}
void expect_ndim(const TensorView& t, int ndim, const char* what) {
  expect_given(t, what);
  if (t.ndim != ndim) throw_invalid(fmt::format("{} rank", what), t.describe(), fmt::format("{} dims", ndim));
}
void expect_dim(const TensorView& t, int d, int64_t size, const char* what) {
  if (d >= t.ndim || t.shape[d] != size)
    throw_invalid(fmt::format("{} dim {}", what, d), t.describe(), fmt::format("size {} in dim {}", size, d));
}
void expect_contiguous(const TensorView& t, const char* what) {
  if (!t.is_contiguous()) throw_invalid(fmt::format("{} layout", what), t.describe(), "a contiguous tensor");
}
void expect_nonnull(const TensorView& t, const char* what) {
  if (t.data == nullptr && t.numel() > 0) throw_invalid(what, "a null pointer", "a device pointer");
}

void expect_aligned(const TensorView& t, size_t bytes, const char* what) {
  if (!t.empty() && reinterpret_cast<uintptr_t>(t.data) % bytes != 0)
    throw_invalid(fmt::format("{} address", what), fmt::format("{}", t.data),
                  fmt::format("a multiple of {} bytes (vectorized access)", bytes));
}

void expect_tensor(const TensorView& t, DType dt, std::initializer_list<int64_t> dims, const char* what) {
  expect_dtype(t, dt, what);
  expect_ndim(t, static_cast<int>(dims.size()), what);
  int d = 0;
  for (int64_t size : dims) expect_dim(t, d++, size, what);
  expect_contiguous(t, what);
  expect_nonnull(t, what);
}

}  // namespace mlajit

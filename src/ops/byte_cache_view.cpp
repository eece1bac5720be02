// See byte_cache_view.hpp.
#include "ops/byte_cache_view.hpp"

#include <fmt/format.h>

#include "mlajit/dtype.hpp"
#include "mlajit/error.hpp"
#include "mlajit/tensor.hpp"

namespace mlajit::ops {

ByteCacheDims expect_byte_cache(const PagedCacheView& cache, const std::string& what, const std::string& scales_what,
                                int64_t num_layers, int page_size, int row_bytes, const std::string& layout,
                                const char* holds) {
  const TensorView& blocks = cache.blocks;
  const char* w = what.c_str();
  if (blocks.dtype != DType::u8 && blocks.dtype != DType::fp8_e4m3)
    throw_invalid(what + " dtype", dtype_name(blocks.dtype), "u8 (or fp8_e4m3: the same bytes) for " + layout);
  const bool one_layer_ok = num_layers <= 1;
  ByteCacheDims d;
  if (blocks.ndim == 5) {
    expect_dim(blocks, 1, 1, w);
    if (num_layers > 0) expect_dim(blocks, 2, num_layers, w);
    d.num_layers = blocks.shape[2];
    expect_dim(blocks, 3, page_size, w);
    expect_dim(blocks, 4, row_bytes, w);
  } else if (one_layer_ok && blocks.ndim == 3) {
    expect_dim(blocks, 1, page_size, w);
    expect_dim(blocks, 2, row_bytes, w);
    d.num_layers = 1;
  } else if (one_layer_ok && blocks.ndim == 4) {
    expect_dim(blocks, 1, page_size, w);
    expect_dim(blocks, 2, 1, w);
    expect_dim(blocks, 3, row_bytes, w);
    d.num_layers = 1;
  } else {
    throw_invalid(what + " rank", blocks.ndim,
                  one_layer_ok ? fmt::format("5 ([num_blocks, 1, num_layers, page_size, {0}]), 3 ([num_blocks, "
                                             "page_size, {0}]) or 4 ([num_blocks, page_size, 1, {0}]) for {1}",
                                             row_bytes, layout)
                               : fmt::format("5 ([num_blocks, 1, num_layers, page_size, {}]) for {}", row_bytes, layout));
  }
  expect_contiguous(blocks, w);
  expect_nonnull(blocks, w);
  expect_aligned(blocks, 16, w);
  if (!cache.scales.empty())
    throw_invalid(scales_what, cache.scales.describe(),
                  fmt::format("no scales (an empty view): {} keeps them in its {}", layout, holds));
  d.num_blocks = blocks.shape[0];
  return d;
}

}  // namespace mlajit::ops

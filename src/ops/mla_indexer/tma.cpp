// The persistent scorer's TMA descriptors for the K cache (see tma.hpp).
#include "ops/mla_indexer/tma.hpp"

#include <algorithm>

#include "mlajit/driver.hpp"
#include "mlajit/error.hpp"

namespace mlajit::indexer {

namespace {
constexpr int kDepth = mj::indexer::kDepth;               // bytes per K row (fp8 e4m3 x 128)
constexpr int kQuarterRows = mj::indexer::kQuarterKeys;  // keys of one warpgroup's quarter: the largest box
}  // namespace

TmaPlan plan_tma(uintptr_t k_blocks, uintptr_t k_scales, int64_t total_rows, int scale_row_stride, int page_size,
                 int64_t scale_words) {
  MLAJIT_EXPECT(page_size >= kTmaMinPage && (page_size & (page_size - 1)) == 0, "page_size", page_size,
                "a power of two >= 8 with the persistent scorer's TMA loads (smaller pages use its cp.async "
                "producer)");
  MLAJIT_EXPECT(k_blocks % 16 == 0, "k_cache.blocks address", k_blocks, "16-byte aligned (TMA)");
  MLAJIT_EXPECT(total_rows >= 1 && total_rows < (int64_t{1} << 31), "k_cache rows (num_blocks x num_layers x page_size)",
                total_rows,
                "in [1, 2^31) with the persistent scorer's TMA loads (page_size >= 8, params.block_kv 0 or "
                "256: 32-bit TMA row coordinates); params.block_kv 64 selects the tile scorer");
  TmaPlan p;
  p.box_rows = static_cast<uint32_t>(std::min(page_size, kQuarterRows));
  p.rows = total_rows;
  // Scale coordinates are 32-bit signed too (the kernel computes them from 32-bit rows).
  MLAJIT_EXPECT(scale_words >= 0 && scale_words < (int64_t{1} << 31), "k_cache scale words", scale_words,
                "in [0, 2^31) (32-bit TMA coordinates of the pages' scales)");
  p.scale_words = scale_words > 0 ? scale_words : total_rows;
  // A tensor copy writes to a 128-byte aligned shared address: box i of a quarter's scales lands at
  // i x box_rows x 4 bytes, so boxes of < 32 scales (pages 8 and 16) take the cp.async path (pages
  // 8 / 16 by TMA faulted with CUDA_ERROR_MISALIGNED_ADDRESS on the H100).
  p.scales_by_tma = k_scales % 16 == 0 && scale_row_stride == 1 && p.box_rows * 4 % 128 == 0;
  return p;
}

void encode_tma(const TmaPlan& plan, MlaIndexerScoresArgs& sa) {
  const uint64_t rows = static_cast<uint64_t>(plan.rows);
  {
    const uint64_t dims[2] = {kDepth, rows};
    const uint64_t strides[1] = {kDepth};
    const uint32_t box[2] = {kDepth, plan.box_rows};
    driver::encode_tma_tiled(&sa.k_map, driver::TmaDataType::u8, 2, sa.k_blocks, dims, strides, box,
                             driver::TmaSwizzle::bytes128);
  }
  sa.scales_by_tma = plan.scales_by_tma ? 1 : 0;
  if (plan.scales_by_tma) {
    const uint64_t dims[1] = {static_cast<uint64_t>(plan.scale_words)};
    const uint32_t box[1] = {plan.box_rows};
    driver::encode_tma_tiled(&sa.scale_map, driver::TmaDataType::u32, 1, sa.k_scales, dims, nullptr, box,
                             driver::TmaSwizzle::none);
  }
}

}  // namespace mlajit::indexer

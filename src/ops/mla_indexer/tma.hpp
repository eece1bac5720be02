#pragma once
// Host side of the persistent scorer's TMA loads (templates/mla_indexer/scores_sm90_persistent.cuh,
// produce_block_tma, produce_block_tma_pages): which of the K cache's tensors the TMA can address,
// and their descriptors.
//
// The TMA loads run where the sm90 scorer walks 256-key blocks (the persistent scorer,
// params.block_kv 0 / 256) at pages of >= 8 keys. At pages >= 64 a page holds whole 64-key
// quarters: one box of 64 rows per quarter. At pages 8..32 a quarter is 64 / page pages: one box of
// `page` rows per page, whose 1024-byte aligned destination (page x 128 B >= 1024 B) keeps the
// 128-byte swizzle the one the wgmma reads. Pages 2 and 4 (boxes not 1024-byte aligned) keep the
// scorer's cp.async producer. K rows
// always come by TMA: the kernel has no cp.async path for them, so a cache the TMA cannot address
// is an error (never met by a real cache: it needs >= 2^31 rows, 256 GiB of K). The scales come by
// TMA when their base is 16-byte aligned, one scale per row (scale_row_stride 1) and a box holds
// >= 32 scales (pages >= 32: each box's shared destination, box index x page x 4 bytes into the
// quarter's scales, must be 128-byte aligned, as every tensor copy's), else with cp.async (pages 8
// and 16; a scales view at a 4-byte offset is valid input).
#include <cstdint>

#include "mla_indexer/args.h"
#include "mla_indexer/layout.h"

namespace mlajit::indexer {

// Smallest page the TMA producer takes: its boxes must fill whole 1024-byte swizzle atoms.
inline constexpr int kTmaMinPage = 1 << mj::indexer::kTmaMinPageShift;

struct TmaPlan {
  bool scales_by_tma = false;
  uint32_t box_rows = 64;  // rows per TMA box: min(page_size, 64), the kernel's box (one page or quarter)
  int64_t rows = 0;        // the cache's rows (num_blocks x num_layers x page_size): the K map's row extent
  int64_t scale_words = 0; // the scale map's extent in 32-bit words (rows in the split layout)
};

// Validates what the TMA needs of the cache: page_size a power of two >= kTmaMinPage, k_blocks
// 16-byte aligned, 1 <= total_rows < 2^31 (row coordinates are 32-bit signed and the kernel computes
// rows in 32 bits). Box starts need no alignment (TMA coordinates are in rows). Throws
// Error(InvalidArgument) naming the field otherwise. Pure: no driver call.
// `scale_words` > 0: the scales live in the pages (layout fp8_page_scales: k_scales is the pages'
// start, total_rows counts their 128-byte rows, page + page / 32 per page, and the scale map spans
// scale_words words); 0: the split layout's scales tensor of total_rows words.
TmaPlan plan_tma(uintptr_t k_blocks, uintptr_t k_scales, int64_t total_rows, int scale_row_stride, int page_size,
                 int64_t scale_words = 0);

// Encodes sa.k_map (K as [plan.rows, 128] bytes, box plan.box_rows x 128, 128-byte swizzle) and,
// with plan.scales_by_tma, sa.scale_map ([plan.scale_words] 32-bit words, box plan.box_rows), and sets
// sa.scales_by_tma. Host-only (cuTensorMapEncodeTiled), cheap enough per launch.
void encode_tma(const TmaPlan& plan, MlaIndexerScoresArgs& sa);

}  // namespace mlajit::indexer

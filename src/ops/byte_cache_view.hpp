#pragma once
// The blocks of a paged cache whose layout stores raw bytes per token (SPEC §1): fp8_ds_mla's
// 656-byte records, fp8_page_scales's pages of 132 bytes per token. Shared by the kv_cache ops and
// the indexer, which read the same layouts.
#include <cstdint>
#include <string>

#include "mlajit/ops.hpp"

namespace mlajit::ops {

struct ByteCacheDims {
  int64_t num_blocks = 0;
  int64_t num_layers = 0;
};

// `cache.blocks` (named `what`, e.g. "cache.blocks") is u8 (or fp8_e4m3: the same bytes)
// [num_blocks, 1, num_layers, page_size, row_bytes]; with one layer also [num_blocks, page_size,
// row_bytes] (vLLM's shape) or [num_blocks, page_size, 1, row_bytes] (FlashMLA's / DeepGEMM's);
// contiguous, 16-byte aligned; `cache.scales` empty (`scales_what`). num_layers > 0 is checked;
// 0 takes it from the view (1 for the 3-d and 4-d shapes). `layout` names the layout in the
// errors ("layout fp8_ds_mla"), `holds` says where its scales are ("records", "pages").
ByteCacheDims expect_byte_cache(const PagedCacheView& cache, const std::string& what, const std::string& scales_what,
                                int64_t num_layers, int page_size, int row_bytes, const std::string& layout,
                                const char* holds);

}  // namespace mlajit::ops

#pragma once
// Indexer top-k stage: one CTA per query row of the chunk. Reads the row's visible scores from
// the workspace, selects the top min(k, visible) exactly (common/topk_sample.cuh: one pass over
// the row into a shared-memory candidate list, radix select common/topk_radix.cuh as the exact
// fallback) and writes logical positions, or encoded indices (SPEC §1 remap) for emit =
// physical, -1 past them.
#include "common/cluster.cuh"
#include "common/topk_sample.cuh"
#include "common/types.cuh"
#include "mla_indexer/args.h"
#include "mla_indexer/common.cuh"
#include "mla_indexer/layout.h"

namespace mj {
namespace indexer {

// Threads per CTA and CTAs per SM: layout.h (kTopkThreads, kTopkMinBlocks). The shared memory is
// the select's Smem (TopkLayout<TOP_K>::Smem, common/topk_layout.h), whose sizeof the host reads
// (layout.h, topk_smem_bytes).
template <int TOP_K>
using TopkSelect = topk::SampleTopK<kTopkThreads, TOP_K>;

// One row per CTA, or (decode shapes: few rows, long) one row per cluster of CTAs launched with
// a cluster shape of (ranks, 1, 1): grid.x = rows x ranks, the row's ranks splitting its pass
// (SampleTopK::run_cluster) and rank 0 writing the output.
template <int TOP_K, int PAGE_SHIFT, bool CAUSAL, bool PHYSICAL>
__device__ __forceinline__ void topk_rows(const MlaIndexerTopkArgs& a) {
  using Select = TopkSelect<TOP_K>;
  static_assert(sizeof(topk::Float4) == kScoreRowAlignFloats * sizeof(float), "score rows hold whole 16-byte loads");
  extern __shared__ __align__(16) u8 smem_raw[];
  typename Select::Smem& sm = *reinterpret_cast<typename Select::Smem*>(smem_raw);

  const u32 ranks = cluster::size(), rank = cluster::rank();
  const long long r = blockIdx.x / ranks;
  const long long t = a.chunk_row_begin + r;
  if (r >= a.chunk_rows || t >= a.num_tokens) return;  // uniform over a cluster (whole clusters per row)
  const TokenInfo ti = token_info(a.input_row_offsets, a.cache_lengths, a.batch, t, a.max_keys, CAUSAL);
  const u32 n = ti.valid ? static_cast<u32>(ti.visible) : 0u;
  u32 kk = 0;
  const u64* sel = Select::run_cluster(sm, a.scores + r * a.score_row_stride, n, TOP_K, kk, rank, ranks);
  if (sel == nullptr) return;  // a rank > 0 of the row's cluster
  // The row's outputs: table lookups of all of a thread's entries issued before any store (one
  // round trip instead of one per entry).
  constexpr int kPer = (TOP_K + kTopkThreads - 1) / kTopkThreads;
  int v[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int s = i * kTopkThreads + static_cast<int>(threadIdx.x);
    v[i] = -1;
    if (s < TOP_K && static_cast<u32>(s) < kk) {
      const u32 pos = topk::sort_entry_pos(sel[s]);
      v[i] = PHYSICAL ? encoded_index(a.lookup_table, a.pages_per_seq, a.num_blocks, PAGE_SHIFT, ti.seq, pos)
                      : static_cast<int>(pos);
    }
  }
  int* out = a.out + t * TOP_K;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int s = i * kTopkThreads + static_cast<int>(threadIdx.x);
    if (s < TOP_K) out[s] = v[i];
  }
}

}  // namespace indexer
}  // namespace mj

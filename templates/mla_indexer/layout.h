#pragma once
// Thread counts, ring sizes and shared-memory layouts of the mla_indexer kernels:
//   the tile scorer        mla_indexer/scores_sm90_tile.cuh        (sm_90a, 64-key tiles)
//   the persistent scorer  mla_indexer/scores_sm90_persistent.cuh  (sm_90a, 256-key blocks)
//   the portable scorer    mla_indexer/scores_portable.cuh         (every other target)
//   the top-k stage        mla_indexer/topk.cuh                    (common/topk_layout.h)
// The device templates take every size and offset from here and the host
// (src/ops/mla_indexer/plan.hpp) sizes the launches from the same functions: one constexpr
// definition compiled by both NVRTC and the host compiler, so the two sides cannot disagree.
// Plain C++17; its one include is plain too.
#include "common/topk_layout.h"

namespace mj {
namespace indexer {

constexpr int kDepth = 128;  // bytes per fp8 row (a query head or a key): the MMA's K

// ---- Hopper scorers (sm_90a) ----------------------------------------------------------------
// CTA = 4 consumer warpgroups (the MMAs, the head reduction and the stores) + 1 producer
// warpgroup (the K gathers). The producer is a whole warpgroup (ptxas sizes registers by
// warpgroups anyway: 544 threads would cap every thread at 96 registers, as 640 do) so that
// setmaxnreg can move its registers to the consumers. setmaxnreg moves registers inside the CTA's
// launch allocation (640 x 96), it does not take the SM's free ones: 128 x producer + 512 x
// consumer registers must fit in it, or the consumers' increase waits forever (40 / 112 hung).
// 32 / 112: neither side spills (ptxas report) with the consumers' 32 weight registers.
constexpr int kScorerWarpgroups = 4;                                // consumer warpgroups
constexpr int kScorerConsumerThreads = 128 * kScorerWarpgroups;
constexpr int kScorerThreads = kScorerConsumerThreads + 128;       // + the producer warpgroup
constexpr int kScorerProducerRegs = 32;
constexpr int kScorerConsumerRegs = 112;
static_assert(kScorerProducerRegs * 128 + kScorerConsumerRegs * kScorerConsumerThreads <= 96 * kScorerThreads,
              "setmaxnreg budget: the registers of a 640-thread CTA at 96 per thread");
constexpr int kMmaKeys = 64;            // M of the warpgroup MMA: keys per MMA
constexpr int kMmaColumns = 128;        // N of the warpgroup MMA: tokens x heads per MMA
constexpr unsigned kSmemAlign = 1024;   // the 128-byte swizzle's atom; the base is aligned up to it
constexpr unsigned kMaxSmemBytes = 227u * 1024u;  // dynamic shared memory of one CTA

// Tile scorer: every warpgroup owns 128/H query tokens (N = 128) and all four read the same
// 64-key K tile (M = 64); one ring stage per tile. One producer warp works.
constexpr int kTileKeys = kMmaKeys;
constexpr int kTileMinStages = 2, kTileMaxStages = 8, kTileDefaultStages = 6;

// Persistent scorer: the CTA's 128/H tokens (N = 128) form one Q tile that all four warpgroups
// read; a ring stage is a 256-key block and warpgroup w takes its quarter [64w, 64w + 64).
// Four producer warps, warp p copying quarter p of every block.
constexpr int kQuarterKeys = kMmaKeys;
constexpr int kBlockKeys = kScorerWarpgroups * kQuarterKeys;
constexpr int kProducerWarps = 4;
constexpr int kQBufs = 2;  // Q, weights and token slots of the current and the next work item
constexpr int kPersistentMinStages = 2, kPersistentMaxStages = 5, kPersistentDefaultStages = 4;
// Smallest page shift the persistent scorer builds (page 1: 64 pages per quarter would need two
// table entries per producer lane), and the smallest one whose quarters come by TMA (boxes of >= 8
// rows fill whole 1024-byte swizzle atoms; pages 2 and 4 are gathered with cp.async).
constexpr int kPersistentMinPageShift = 1;
constexpr int kTmaMinPageShift = 3;

struct ScorerLayout {
  int block_q;            // query tokens per CTA (per work item for the persistent scorer)
  int stage_keys;         // keys per ring stage
  int stages;             // ring depth
  int q_bufs;             // Q buffers (Q tile, weights)
  unsigned q_bytes;       // one Q buffer: block_q x H rows of kDepth bytes
  unsigned stage_bytes;   // K bytes of one stage
  int w_quad;             // floats per quad of a token slot's weights: H/4 + 4 (the pad puts the
                          // quads' 16-byte loads in different banks)
  int w_slot;             // floats per token slot's weights: 4 quads
  int w_floats;           // floats of one buffer's weights
  // Byte offsets from the 1024-byte aligned base: Q buffers, K ring, key scales (4 bytes per key
  // of a stage), weights, then the mbarriers: full[stages], empty[stages], q_full[q_bufs],
  // q_empty[q_bufs] (the last two only with two Q buffers).
  unsigned off_q, off_k, off_kscale, off_w, off_full_bar, off_empty_bar, off_q_full_bar, off_q_empty_bar;
  int barriers;
  unsigned bytes_used;
  unsigned smem_bytes;    // bytes_used + the slack to align the base
};

// Query tokens per CTA: N = 128 columns of tokens x heads per warpgroup MMA; the tile scorer's
// four warpgroups have their own tokens, the persistent scorer's share them.
constexpr int scorer_block_q(int heads, bool persistent) {
  return (persistent ? 1 : kScorerWarpgroups) * (kMmaColumns / heads);
}

constexpr ScorerLayout scorer_layout(int heads, int stages, bool persistent) {
  ScorerLayout l{};
  l.block_q = scorer_block_q(heads, persistent);
  l.stage_keys = persistent ? kBlockKeys : kTileKeys;
  l.stages = stages;
  l.q_bufs = persistent ? kQBufs : 1;
  l.q_bytes = static_cast<unsigned>(l.block_q * heads * kDepth);
  l.stage_bytes = static_cast<unsigned>(l.stage_keys * kDepth);
  l.w_quad = heads / 4 + 4;
  l.w_slot = 4 * l.w_quad;
  l.w_floats = l.block_q * l.w_slot;
  l.off_q = 0;
  l.off_k = l.q_bufs * l.q_bytes;
  l.off_kscale = l.off_k + stages * l.stage_bytes;
  l.off_w = l.off_kscale + static_cast<unsigned>(stages * l.stage_keys * 4);
  l.off_full_bar = l.off_w + static_cast<unsigned>(l.q_bufs * l.w_floats * 4);
  l.off_empty_bar = l.off_full_bar + static_cast<unsigned>(stages * 8);
  l.off_q_full_bar = l.off_empty_bar + static_cast<unsigned>(stages * 8);
  l.off_q_empty_bar = l.off_q_full_bar + static_cast<unsigned>(l.q_bufs * 8);
  l.barriers = 2 * stages + (persistent ? 2 * l.q_bufs : 0);
  l.bytes_used = l.off_full_bar + static_cast<unsigned>(l.barriers * 8);
  l.smem_bytes = l.bytes_used + kSmemAlign;
  return l;
}
constexpr ScorerLayout tile_scorer_layout(int heads, int stages) { return scorer_layout(heads, stages, false); }
constexpr ScorerLayout persistent_scorer_layout(int heads, int stages) { return scorer_layout(heads, stages, true); }

// ---- portable scorer ------------------------------------------------------------------------
// One CTA per (query row, key split); the row's q (H x kDepth floats) and weights (H floats) in
// shared memory as f32.
constexpr int kPortableThreads = 256;
constexpr int kPortableKeysPerSplit = 1024;
constexpr unsigned portable_smem_bytes(int heads) { return static_cast<unsigned>((heads * kDepth + heads) * 4); }

// ---- top-k stage ----------------------------------------------------------------------------
// 256 threads, 3 CTAs per SM (registers <= 85, shared memory 3 x ~64 KiB at k 2048): three rows
// in flight per SM hide each other's serial phases (sample, select, sort) better than two rows of
// 512 threads, and 8 entries per thread make more of the sort in-register.
constexpr int kTopkThreads = 256;
constexpr int kTopkMinBlocks = 3;
// Floats per score row of the workspace are a multiple of this: the top-k reads a row with
// 16-byte loads (and the workspace is 16-byte aligned).
constexpr int kScoreRowAlignFloats = 4;

template <int TOP_K>
using TopkLayout = topk::SampleLayout<kTopkThreads, TOP_K>;

// Candidate capacity of the top-k stage (SampleTopK::kCap).
constexpr int topk_candidates(int top_k) { return topk::sample_cap(topk::pow2_ceil(top_k)); }

// Shared memory of the top-k stage for a top_k known at run time (the host's): the layout depends
// on top_k only through its power-of-two ceiling. 0 past 4096 (params.top_k's bound). Host only:
// the device instantiates the layout of its own TOP_K (NVRTC would otherwise emit the constants of
// all thirteen layouts into every module).
#ifndef __CUDACC_RTC__
template <int SORT_CAP>
constexpr unsigned topk_smem_bytes_of() {
  return static_cast<unsigned>(sizeof(typename TopkLayout<SORT_CAP>::Smem));
}
constexpr unsigned topk_smem_bytes(int top_k) {
  switch (topk::pow2_ceil(top_k)) {
    case 1: return topk_smem_bytes_of<1>();
    case 2: return topk_smem_bytes_of<2>();
    case 4: return topk_smem_bytes_of<4>();
    case 8: return topk_smem_bytes_of<8>();
    case 16: return topk_smem_bytes_of<16>();
    case 32: return topk_smem_bytes_of<32>();
    case 64: return topk_smem_bytes_of<64>();
    case 128: return topk_smem_bytes_of<128>();
    case 256: return topk_smem_bytes_of<256>();
    case 512: return topk_smem_bytes_of<512>();
    case 1024: return topk_smem_bytes_of<1024>();
    case 2048: return topk_smem_bytes_of<2048>();
    case 4096: return topk_smem_bytes_of<4096>();
    default: return 0u;
  }
}
#endif  // __CUDACC_RTC__

}  // namespace indexer
}  // namespace mj

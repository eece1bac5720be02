#pragma once
// Indexer scores on Hopper (sm_90a), the persistent scorer: 256-key blocks split across the
// warpgroups, persistent CTAs walking work items, K by TMA at pages >= 8 (`params.block_kv` 256,
// or 0 = the heuristic's pick at page sizes >= 8; block_kv 64, page size 1 and the heuristic at
// pages 2 and 4 run the tile scorer, mla_indexer/scores_sm90_tile.cuh). Sizes and offsets:
// mla_indexer/layout.h.
//
// The function is the tile scorer's: score[i, j] = k_scale[j] * sum_h relu(q[i,h,:] . k[j,:]) *
// qs[i,h], with the same wgmma (m64 keys x n128 = 128/H tokens x H heads x k128, K tile = A, Q =
// B, both K-major with the 128-byte swizzle), the same per-thread head reduction and the same
// stores, so the scores are bit-identical to it. What differs is the split of the work:
//
//   tile scorer:       CTA = 4 x (128/H) tokens; every warpgroup has its own Q (B) and all four
//                      read the same 64-key K tile; one walk step per 64 keys.
//   persistent scorer: CTA = 128/H tokens (N = 128: one Q tile that all four warpgroups read); a
//                      ring stage is a 256-key block and warpgroup w takes keys [64w, 64w + 64)
//                      of it. One walk step per 256 keys; the visibility logic is one compare per
//                      step (blocks below the CTA's common visible prefix store without per-key
//                      checks), per-key checks only in boundary blocks.
//
// Same MMA work and shared-memory operand traffic per MAC as the tile scorer (each warpgroup MMA
// reads an 8 KiB K quarter and the 16 KiB Q tile); the K cache is streamed once per 128/H tokens
// instead of once per 4 x 128/H (4x the L2 -> SM bytes, the same as DeepGEMM's sm90 MQA logits,
// whose layout this is).
//
// Producers: 4 warps (layout.h, kProducerWarps), warp p filling quarter p of each block, by one of
// three copies:
//   produce_block_tma        pages >= 64: a page holds whole quarters; one TMA per quarter for its
//                            K rows (128-byte swizzle) and one for its scales;
//   produce_block_tma_pages  pages 8..32: one TMA box of `page` rows per page of the quarter, and
//                            one per page for its scales;
//   produce_block_cp_async   pages 2 and 4 (boxes of < 8 rows would not fill a 1024-byte swizzle
//                            atom): cp.async gathers, 4 whole 128-byte rows per warp instruction,
//                            per-page lane lookups of the table; every producer lane arrives on
//                            the block's full barrier with cp.async.mbarrier.arrive.noinc.
// The host encodes the tensor maps (ops/mla_indexer/tma.hpp; box rows min(page, 64)); scales that
// the TMA cannot address (not 16-byte aligned, or boxes landing off 128-byte boundaries at pages 8
// and 16) are copied with cp.async. With the TMA the full barrier completes on the bytes and the
// consumers need no async-proxy fence after their acquire of a block; with cp.async they fence
// after every acquire. Quarters that lie wholly past the segment's last visible key are not
// copied: their warpgroup still runs its MMA on whatever the slot holds (a wgmma under a
// data-dependent branch is serialized by ptxas, C7520) but stores nothing.
//
// Work items: (q block of 128/H tokens of the chunk, split of the key range: keys_per_split, a
// multiple of 256), numbered split-major (item = split * q_blocks + q block). The grid is 1-D and
// every CTA walks its own static list of items (ScoresSm90Persistent::work_item): persistent, grid
// = one CTA per SM (the default), or grid = items (one item per CTA). The host picks the grid and
// the split (src/ops/mla_indexer/plan.hpp, sm90_work). Tokens of one item that belong to different
// sequences are walked as separate segments over their own keys, as in the tile scorer.
//
// Q is double-buffered across items: the producer, which runs ahead over the K ring, loads the next
// item's token slots, Q tile and weights into the other buffer (by cp.async) before it gathers that
// item's first K block, and publishes them on the buffer's q_full barrier; the consumers release a
// buffer on its q_empty barrier after their last block of the item. So a consumer starts an item on
// a Q that is already there (a cold CTA would wait for the token slots' DRAM reads, the Q load and
// the first K block). With the TMA producers the consumers fence the async proxy once per item,
// after they acquired its Q buffer. The K ring's stage and phase run on across items, as in
// DeepGEMM's persistent MQA logits.
#include "common/types.cuh"
#include "mla_indexer/common.cuh"
#include "mla_indexer/layout.h"
#include "mla_indexer/scores_sm90_tile.cuh"
#include "mla_indexer/sm90_primitives.cuh"

namespace mj {
namespace indexer_sm90 {

template <int H, int PAGE_SHIFT, bool CAUSAL, int STAGES, bool PAGE_SCALES = false>
struct ScoresSm90Persistent {
  static_assert(H == 32 || H == 64 || H == 128, "heads");
  // K cache layout fp8_page_scales (mla_indexer/common.cuh, scale_index): the scales sit in the pages.
  static constexpr bool kPageScales = PAGE_SCALES;
  // Index of cache row `row`'s scale in k_scales (the split layout's row * stride, or in the pages).
  static MJ_DEVICE long long scale_index(const MlaIndexerScoresArgs& a, long long row) {
    return indexer::scale_index<PAGE_SCALES, PAGE_SHIFT>(row, a.scale_row_stride);
  }
  // The scale map's coordinate of a TMA box starting at cache row `row` (rows < 0: outside the
  // tensor, zero-filled, as the K box).
  static MJ_DEVICE int scale_coord(int row) {
    return row < 0 ? row : static_cast<int>(indexer::scale_index<PAGE_SCALES, PAGE_SHIFT>(row, 1));
  }
  // 2 x 16 KiB of Q + STAGES x 33 KiB must fit the 227 KiB of a CTA.
  static_assert(STAGES >= indexer::kPersistentMinStages && STAGES <= indexer::kPersistentMaxStages, "stages");
  // Page 1 (64 pages per quarter: two table entries per producer lane) is not built; the host runs
  // the tile scorer for it (plan.hpp).
  static_assert(PAGE_SHIFT >= indexer::kPersistentMinPageShift, "page size >= 2");
  static constexpr indexer::ScorerLayout kL = indexer::persistent_scorer_layout(H, STAGES);
  static constexpr int kDepth = indexer::kDepth;        // bytes per fp8 row (q head or key)
  static constexpr int kWgs = indexer::kScorerWarpgroups;
  static constexpr int kBlockQ = kL.block_q;            // tokens per CTA: N = 128
  static constexpr int kQuarterKeys = indexer::kQuarterKeys;  // M of the MMA: one warpgroup's keys of a block
  static constexpr int kBlockKeys = indexer::kBlockKeys;      // keys per ring stage
  static_assert(kBlockKeys == kL.stage_keys, "keys per ring stage");
  static constexpr int kConsumerThreads = indexer::kScorerConsumerThreads;
  // Producer warpgroup and setmaxnreg split: layout.h.
  static constexpr int kThreads = indexer::kScorerThreads;
  // Producer warps of the producer warpgroup (the others leave at once); warp p copies quarter p of
  // every block, one warp per SM sub-partition. A block moves 4x the tile scorer's K bytes per MMA:
  // one warp issuing all of it would load its scheduler with ~360 (cp.async) or ~160 (TMA: the
  // table reads, row math and TMA issues do not shrink 4x) producer instructions per block next to
  // its 4 x ~210 consumer ones; spread, each scheduler issues ~90 (cp.async) or ~77 (TMA, H 64,
  // page 64). They also load, per work item, the token slots, Q tile and weights (barrier counts
  // and the producer's named barrier use the count).
  static constexpr int kProducerWarps = indexer::kProducerWarps;
  static_assert(kWgs % kProducerWarps == 0, "whole quarters per producer warp");
  // The TMA producers (pages >= 8). kTmaPageShift: the page shift the TMA producers are
  // instantiated with (never called below 3).
  static constexpr bool kTmaBuilt = PAGE_SHIFT >= indexer::kTmaMinPageShift;
  static constexpr int kTmaPageShift = PAGE_SHIFT >= indexer::kTmaMinPageShift ? PAGE_SHIFT : 6;
  static constexpr int kProducerRegs = indexer::kScorerProducerRegs;
  static constexpr int kConsumerRegs = indexer::kScorerConsumerRegs;

  static constexpr int kQBufs = kL.q_bufs;  // Q (and weights, token slots) of the current and the next item
  static constexpr unsigned kQBytes = kL.q_bytes;                            // 16 KiB per buffer
  static constexpr unsigned kQuarterBytes = kQuarterKeys * kDepth;           // 8 KiB
  static constexpr unsigned kStageBytes = kL.stage_bytes;                    // 32 KiB
  static constexpr unsigned kOffK = kL.off_k;
  static constexpr unsigned kOffKScale = kL.off_kscale;
  static constexpr unsigned kOffW = kL.off_w;
  // Weights per token slot: 4 quads x (H/4 + 4) floats, the tile scorer's padded layout.
  static constexpr int kWQuad = kL.w_quad;
  static constexpr int kWSlot = kL.w_slot;
  static constexpr int kWFloats = kL.w_floats;  // one buffer's weights
  // Barriers: full[STAGES], empty[STAGES], q_full[kQBufs], q_empty[kQBufs].
  static constexpr unsigned kOffFullBar = kL.off_full_bar;
  static constexpr unsigned kOffEmptyBar = kL.off_empty_bar;
  static constexpr unsigned kOffQFullBar = kL.off_q_full_bar;
  static constexpr unsigned kOffQEmptyBar = kL.off_q_empty_bar;
  static constexpr unsigned kSmemBytes = kL.smem_bytes;
  static_assert(kSmemBytes <= indexer::kMaxSmemBytes, "shared memory of one CTA");
  // Stage s's K quarter w starts kOffK + s * kStageBytes + w * kQuarterBytes: 1024-byte aligned, as
  // the swizzled descriptor needs, and a descriptor moves by (bytes >> 4) in its address field.
  static_assert(kQBytes % 1024 == 0 && kStageBytes % 1024 == 0 && kQuarterBytes % 1024 == 0, "swizzle alignment");
  static_assert(kOffFullBar % 8 == 0, "barrier alignment");

  // The k-th work item (k = 0, 1, ...) of this CTA: false past its last one, else the item's first
  // row within the chunk and first key. Items are numbered split-major (item = split * q_blocks +
  // q block: the full-length splits first, the last split, shorter when the keys do not divide,
  // last) and dealt to the CTAs in rounds of gridDim.x, alternating direction (round k even: CTA c
  // takes item k G + c; odd: k G + G - 1 - c), so that work that grows or shrinks along the item
  // order (causal rows without a cache) evens out over pairs of rounds. With grid = items every
  // CTA has exactly item blockIdx.x. The host sizes the grid
  // and the split (plan.hpp, sm90_work) with the same counts.
  static MJ_DEVICE bool work_item(const MlaIndexerScoresArgs& a, u32 k, long long& row0, int& split_lo) {
    const long long q_blocks = (a.chunk_rows + kBlockQ - 1) / kBlockQ;
    const long long splits = (a.max_keys + a.keys_per_split - 1) / a.keys_per_split;
    const long long grid = gridDim.x;
    const long long pos = (k & 1u) ? grid - 1 - blockIdx.x : blockIdx.x;
    const long long item = static_cast<long long>(k) * grid + pos;
    if (item >= q_blocks * splits) return false;
    const long long split = item / q_blocks;
    row0 = (item - split * q_blocks) * kBlockQ;
    split_lo = static_cast<int>(split * a.keys_per_split);
    return true;
  }
};

MJ_DEVICE float lds_f32(u32 addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}

// The cp.async copy of one 256-key block (builds at every page size >= 2; runs at pages 2 and 4):
// producer warp pw gathers quarters pw, pw + kProducerWarps, ... into the stage at kdst_block (K)
// and sdst_block (scales), then every lane arrives on the stage's full barrier when its copies have
// landed. cp.async writes through the generic proxy: the consumers fence the async proxy after
// their acquire.
template <class C, int PAGE_SHIFT>
MJ_DEVICE void produce_block_cp_async(const MlaIndexerScoresArgs& a, int b, long long kv0, long long kv_hi,
                                      u32 kdst_block, u32 sdst_block, u32 full_bar, u32 empty_bar, u32 phase, int pw,
                                      int lane) {
  const int chunk = lane & 7, lr = lane >> 3;  // 16-byte chunk of a row, row of 4 (the tile scorer's copy pattern)
  mbar_wait(empty_bar, phase ^ 1u);
#pragma unroll 1
  for (int qtr = pw; qtr < C::kWgs; qtr += C::kProducerWarps) {
    const long long q0 = kv0 + qtr * C::kQuarterKeys;  // first key of the quarter
    // Quarters wholly past the segment's keys are not copied (their warpgroup stores nothing).
    if (q0 >= kv_hi) break;
    const int quarter_keys = static_cast<int>(kv_hi - q0 < C::kQuarterKeys ? kv_hi - q0 : C::kQuarterKeys);
    const u32 kdst = kdst_block + qtr * C::kQuarterBytes;
    const u32 sdst = sdst_block + qtr * (C::kQuarterKeys * 4);
    if constexpr (PAGE_SHIFT >= 6) {
      // One page holds the whole quarter (quarters start on multiples of 64 keys): one table
      // read (every lane reads the same entry) and 64 contiguous cache rows.
      const long long row0 = indexer::key_row(a.lookup_table, a.pages_per_seq, a.num_blocks,
                                              a.block_row_stride, a.layer_row_offset, PAGE_SHIFT, b, q0);
      const bool mapped = row0 >= 0;
      if (mapped && quarter_keys == C::kQuarterKeys) {
        // Steady state. Lane row lr copies rows 4 it + lr, whose swizzle phase (r & 7)
        // alternates between lr and lr + 4: two destination bases and immediate offsets
        // address all 16 copies. (The boundary loop, below, spends ~15 instructions per copy on
        // the per-row address, predicate and size, and this scorer moves 4x the tile scorer's K
        // bytes per MMA.)
        const u8* src = a.k_blocks + (row0 + lr) * C::kDepth + chunk * 16;
        const u32 d_even = kdst + lr * 128 + ((chunk ^ lr) << 4);
        const u32 d_odd = kdst + (lr + 4) * 128 + ((chunk ^ (lr + 4)) << 4);
#pragma unroll
        for (int it = 0; it < C::kQuarterKeys / 4; ++it)
          cp_async_16_full((it & 1 ? d_odd : d_even) + (it >> 1) * 1024, src + it * 4 * C::kDepth);
        cp_async_4_full(sdst + lane * 4, a.k_scales + C::scale_index(a, row0 + lane));
        cp_async_4_full(sdst + (lane + 32) * 4, a.k_scales + C::scale_index(a, row0 + lane + 32));
      } else {
        // Boundary quarter or unmapped page: rows past the segment's keys or unmapped are
        // zero-filled.
        const u8* src = a.k_blocks + (mapped ? row0 : 0) * C::kDepth + chunk * 16;
#pragma unroll 4
        for (int it = 0; it < C::kQuarterKeys / 4; ++it) {
          const int r = 4 * it + lr;
          const bool ok = mapped && r < quarter_keys;
          cp_async_16(kdst + r * 128 + ((chunk ^ (r & 7)) << 4), ok ? src + r * C::kDepth : a.k_blocks,
                      ok ? 16u : 0u);
        }
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const int r = lane + 32 * rr;
          const bool ok = mapped && r < quarter_keys;
          const float* ssrc = ok ? a.k_scales + C::scale_index(a, row0 + r) : a.k_scales;
          cp_async_4(sdst + r * 4, ssrc, ok ? 4u : 0u);
        }
      }
    } else {
      // Pages of 2..32 keys (the tile scorer's per-page lane lookups): lane l reads the table entry
      // of the quarter's page l once, and every row takes its page's block from that lane by a
      // shuffle (per-row table reads were 2.6x slower at page 16). 32-bit block ids, not
      // 64-bit rows: with rows the producer spilled at its 32 registers.
      constexpr int kPageShift = PAGE_SHIFT < 6 ? PAGE_SHIFT : 0;
      constexpr int kPagesPerQuarter = C::kQuarterKeys >> kPageShift;
      static_assert(kPagesPerQuarter <= 32, "one table entry per lane");
      constexpr u32 kNoBlock = 0xffffffffu;  // unmapped (a block id of 2^32 - 1 reads as unmapped)
      u32 blk = kNoBlock;
      {
        const long long page = (q0 >> kPageShift) + lane;  // q0 is a multiple of the page size
        if (lane < kPagesPerQuarter && (lane << kPageShift) < quarter_keys && page < a.pages_per_seq) {
          const u32 v = a.lookup_table[static_cast<long long>(b) * a.pages_per_seq + page];
          if (v < a.num_blocks) blk = v;
        }
      }
      // Every lane of the warp calls it (shuffle), with its own r.
      auto quarter_row = [&](int r) -> long long {
        const u32 v = __shfl_sync(0xffffffffu, blk, r >> kPageShift);
        const long long row = v == kNoBlock ? -1
                                            : v * a.block_row_stride + a.layer_row_offset +
                                                  (r & ((1 << kPageShift) - 1));
        return r < quarter_keys ? row : -1;
      };
      // Unrolled by 4 (as in the tile scorer) the loop's hoisted per-row shuffle lanes and offsets
      // spilled at 32
      // registers; by 2 page 2 still spilled 4 bytes.
      constexpr int kUnroll = PAGE_SHIFT <= 1 ? 1 : 2;
#pragma unroll kUnroll
      for (int it = 0; it < C::kQuarterKeys / 4; ++it) {
        const int r = 4 * it + lr;
        const long long row = quarter_row(r);
        const u8* src = row >= 0 ? a.k_blocks + row * C::kDepth + chunk * 16 : a.k_blocks;
        cp_async_16(kdst + r * 128 + ((chunk ^ (r & 7)) << 4), src, row >= 0 ? 16u : 0u);
      }
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int r = lane + 32 * rr;
        const long long row = quarter_row(r);
        const float* ssrc = row >= 0 ? a.k_scales + C::scale_index(a, row) : a.k_scales;
        cp_async_4(sdst + r * 4, ssrc, row >= 0 ? 4u : 0u);
      }
    }
  }
  // This warp's share of the block is published when its copies have landed (a warp with no
  // quarter to copy arrives at once); the block is complete when every producer lane arrived.
  // The consumers fence the async proxy after their acquire (the tile scorer's protocol).
  mbar_arrive_cp_async(full_bar);
}

// What both TMA producers need of a block: its first key, the quarters holding keys of the
// segment (all 4 of a whole block; quarters wholly past kv_hi are not copied), the table length and
// the block count clamped to 32 bits (keys and cache rows fit 31 bits: op.cpp checks both), and
// (copied) how many of those quarters producer warp pw issues (pw, pw + kProducerWarps, ...).
template <class C>
struct TmaBlockSpan {
  int key0, quarters, pages;
  u32 blocks;
  MJ_DEVICE TmaBlockSpan(const MlaIndexerScoresArgs& a, long long kv0, long long kv_hi) {
    key0 = static_cast<int>(kv0);
    const int keys_left = static_cast<int>(kv_hi - kv0);  // >= 1
    quarters = keys_left >= C::kBlockKeys ? C::kWgs : (keys_left + C::kQuarterKeys - 1) / C::kQuarterKeys;
    pages = a.pages_per_seq < 0x7fffffff ? static_cast<int>(a.pages_per_seq) : 0x7fffffff;
    blocks = a.num_blocks < 0xffffffffLL ? static_cast<u32>(a.num_blocks) : 0xffffffffu;
  }
  MJ_DEVICE int copied(int pw) const { return quarters > pw ? (quarters - pw + C::kProducerWarps - 1) / C::kProducerWarps : 0; }
};

// The TMA copy of one 256-key block at pages of 8, 16 or 32 keys: a quarter is 64 / page
// pages, each `page` consecutive cache rows, and each page is one TMA box (page rows x 128 B,
// 128-byte swizzle; the host encodes the maps with box rows = the page size, tma.hpp). Box i of
// quarter q lands at the quarter's base + i * page * 128: 1024-byte aligned for page >= 8, and the
// TMA's 128-byte swizzle is a function of the destination address within its 1024-byte atom (chunk
// bits [4, 7) XOR row bits [7, 10)), so box i's row r lands exactly where row i * page + r of one
// 64-row box would: the layout the wgmma descriptors read. Its scales are one 1-D box of page x 4
// bytes at the quarter's scale base + i * page * 4 when that is 128-byte aligned, as a tensor
// copy's shared destination must be (page 32; the host sets scales_by_tma), else (pages 8 and 16)
// the lanes copy them with cp.async.
//
// Lane l of warp pw owns box l % (64 / page) of the warp's quarter l / (64 / page) (kMine quarters
// x 64 / page boxes <= 32 lanes): it reads its page's table entry and issues its own boxes (any
// thread may issue a cp.async.bulk.tensor), so the warp issues one table read, one row computation
// and two TMAs per block, all lanes at once. One elected lane arrives with the bytes of all of the
// warp's boxes (the phase cannot complete before that arrival, so the boxes' transactions may land
// before or after it). An unmapped page (past the table, block id out of range) loads rows
// [-page, 0): zero-filled, bytes still counted, as at pages >= 64. The scale fallback (cp.async,
// scales not 16-byte aligned) takes each row's page row from its box's lane by a shuffle.
template <class C, int PAGE_SHIFT>
MJ_DEVICE void produce_block_tma_pages(const MlaIndexerScoresArgs& a, const unsigned* lut, const void* k_map,
                                       const void* scale_map, long long kv0, long long kv_hi, u32 kdst_block,
                                       u32 sdst_block, u32 full_bar, u32 empty_bar, u32 phase, int pw, int lane,
                                       bool scales_by_tma) {
  static_assert(PAGE_SHIFT >= 3 && PAGE_SHIFT < 6, "pages of 8..32 keys");
  constexpr int kMine = C::kWgs / C::kProducerWarps;  // quarters per warp
  constexpr int kPage = 1 << PAGE_SHIFT;
  constexpr int kBoxes = C::kQuarterKeys / kPage;  // boxes (pages) per quarter
  static_assert(kMine * kBoxes <= 32, "one box per lane");
  constexpr u32 kScaleBytes = C::kQuarterKeys * 4;
  constexpr u32 kBoxBytes = kPage * C::kDepth;
  const TmaBlockSpan<C> span(a, kv0, kv_hi);
  const int key0 = span.key0, quarters = span.quarters, pages = span.pages;
  const u32 blocks = span.blocks;
  // This lane's box: quarter qtr (the j-th of the warp), box i of it.
  const int j = lane / kBoxes, i = lane % kBoxes;
  const int qtr = pw + j * C::kProducerWarps;
  const bool mine = j < kMine && qtr < quarters;
  const int page = ((key0 + qtr * C::kQuarterKeys) >> PAGE_SHIFT) + i;
  // Read before the wait for the stage so that the latency overlaps it.
  constexpr u32 kNoBlock = 0xffffffffu;
  const u32 blk = mine && page < pages ? __ldg(lut + page) : kNoBlock;
  mbar_wait(empty_bar, phase ^ 1u);
  // The page's first cache row (pages start on page-size multiples of the key), or rows [-page, 0)
  // (outside the tensors: zero-filled) unmapped.
  const int row0 = blk < blocks ? static_cast<int>(blk * static_cast<u32>(a.block_row_stride) +
                                                   static_cast<u32>(a.layer_row_offset))
                                : -kPage;
  const int copied = span.copied(pw);  // this warp's quarters
  const bool leader = elect_one();
  if (leader) mbar_arrive_expect_tx(full_bar, copied * (C::kQuarterBytes + (scales_by_tma ? kScaleBytes : 0u)));
  // One lane issues every box, each page's row read back from its lane: a shuffle from a constant
  // lane is warp-uniform, so the TMA's operands go straight to uniform registers (issued by their
  // own lanes, the non-uniform operands made ptxas loop over the lanes, ~8 instructions per box).
#pragma unroll
  for (int jj = 0; jj < kMine; ++jj) {
    const int q = pw + jj * C::kProducerWarps;
    if (q < quarters) {
#pragma unroll
      for (int ii = 0; ii < kBoxes; ++ii) {
        const int box_row = __shfl_sync(0xffffffffu, row0, jj * kBoxes + ii);
        if (leader) {
          tma_load_2d(kdst_block + q * C::kQuarterBytes + ii * kBoxBytes, k_map, 0, box_row, full_bar);
          if (scales_by_tma)
            tma_load_1d(sdst_block + q * kScaleBytes + ii * (kPage * 4), scale_map, C::scale_coord(box_row), full_bar);
        }
      }
    }
  }
  if (!scales_by_tma) {
#pragma unroll
    for (int jj = 0; jj < kMine; ++jj) {
      const int q = pw + jj * C::kProducerWarps;
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int r = lane + 32 * rr;  // row of the quarter
        const int prow = __shfl_sync(0xffffffffu, row0, jj * kBoxes + (r >> PAGE_SHIFT));
        if (q < quarters) {
          const bool ok = prow >= 0;
          const float* src =
              ok ? a.k_scales + C::scale_index(a, static_cast<long long>(prow + (r & (kPage - 1)))) : a.k_scales;
          cp_async_4(sdst_block + q * kScaleBytes + r * 4, src, ok ? 4u : 0u);
        }
      }
    }
    mbar_arrive_cp_async(full_bar);
  }
}

// The TMA copy of one 256-key block at pages >= 64 (a page holds every 64-key quarter it starts,
// so a quarter is 64 consecutive cache rows). Producer warp pw takes quarters pw, pw + kProducerWarps, ...:
// one elected lane issues one TMA per quarter for its K rows (box 64 rows x 128 B, 128-byte
// swizzle: the 16-byte chunk c of row r lands at (c ^ (r & 7)) << 4 in the 1024-byte aligned
// quarter, the layout the wgmma descriptors read) and, with `scales_by_tma`, one for its 64 scales,
// and arrives on the stage's full barrier with the bytes it issued (count kProducerWarps). Without
// `scales_by_tma` (the scales are not 16-byte aligned) the warp's 32 lanes copy its quarters'
// scales with cp.async and arrive when they land (count kProducerWarps x 33).
//
// No consumer fence either way: the wgmma reads K, written by the TMA through the async proxy and
// published by the barrier's transactions; the scales are read with ld.shared (generic proxy),
// ordered after their writes (TMA or cp.async) by the barrier's completion.
//
// Quarters wholly past the segment's keys are not copied (as by the cp.async copy; their warpgroup stores
// nothing); boundary quarters are copied whole (the page holds the rows; keys past the segment are
// not stored). An unmapped quarter (page past the table, block id out of range) is loaded from
// rows [-64, 0), wholly outside both tensors: the TMA fills the box with zeros and still counts its
// bytes. `lut` is the segment's sequence's row of the lookup table; `k_map` and `scale_map` the
// generic addresses of a.k_map and a.scale_map.
template <class C, int PAGE_SHIFT>
MJ_DEVICE void produce_block_tma(const MlaIndexerScoresArgs& a, const unsigned* lut, const void* k_map,
                                 const void* scale_map, long long kv0, long long kv_hi, u32 kdst_block, u32 sdst_block,
                                 u32 full_bar, u32 empty_bar, u32 phase, int pw, int lane, bool scales_by_tma) {
  static_assert(PAGE_SHIFT >= 6, "a quarter within one page");
  constexpr int kMine = C::kWgs / C::kProducerWarps;  // quarters per warp
  constexpr u32 kScaleBytes = C::kQuarterKeys * 4;
  // Keys fit 31 bits (op.cpp), and so do cache rows (op.cpp checks the row count, tma.cpp): 32-bit
  // math (the uniform datapath's 64-bit multiplies and compares cost ~3x).
  const TmaBlockSpan<C> span(a, kv0, kv_hi);
  const int key0 = span.key0, quarters = span.quarters, pages = span.pages;
  const u32 blocks = span.blocks;
  // Table entries of this warp's quarters, read before the wait for the stage so that their latency
  // overlaps it; a page past the table reads as unmapped.
  constexpr u32 kNoBlock = 0xffffffffu;
  u32 blk[kMine];
#pragma unroll
  for (int j = 0; j < kMine; ++j) {
    const int qtr = pw + j * C::kProducerWarps;
    const int page = (key0 + qtr * C::kQuarterKeys) >> PAGE_SHIFT;
    blk[j] = qtr < quarters && page < pages ? __ldg(lut + page) : kNoBlock;
  }
  mbar_wait(empty_bar, phase ^ 1u);
  // First cache row of each quarter, or rows [-64, 0) (outside the tensors: zero-filled) unmapped.
  int row0[kMine];
#pragma unroll
  for (int j = 0; j < kMine; ++j) {
    const int qtr = pw + j * C::kProducerWarps;
    const u32 in_page = static_cast<u32>(key0 + qtr * C::kQuarterKeys) & ((1u << PAGE_SHIFT) - 1u);
    row0[j] = blk[j] < blocks ? static_cast<int>(blk[j] * static_cast<u32>(a.block_row_stride) +
                                                 static_cast<u32>(a.layer_row_offset) + in_page)
                              : -C::kQuarterKeys;
  }
  const int copied = span.copied(pw);  // this warp's quarters
  if (elect_one()) {
    mbar_arrive_expect_tx(full_bar, copied * (C::kQuarterBytes + (scales_by_tma ? kScaleBytes : 0u)));
#pragma unroll
    for (int j = 0; j < kMine; ++j) {
      const int qtr = pw + j * C::kProducerWarps;
      if (qtr < quarters) tma_load_2d(kdst_block + qtr * C::kQuarterBytes, k_map, 0, row0[j], full_bar);
    }
    if (scales_by_tma) {
#pragma unroll
      for (int j = 0; j < kMine; ++j) {
        const int qtr = pw + j * C::kProducerWarps;
        if (qtr < quarters) tma_load_1d(sdst_block + qtr * kScaleBytes, scale_map, C::scale_coord(row0[j]), full_bar);
      }
    }
  }
  if (!scales_by_tma) {
#pragma unroll
    for (int j = 0; j < kMine; ++j) {
      const int qtr = pw + j * C::kProducerWarps;
      if (qtr < quarters) {
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const int r = lane + 32 * rr;
          const bool ok = row0[j] >= 0;
          const float* src = ok ? a.k_scales + C::scale_index(a, static_cast<long long>(row0[j] + r)) : a.k_scales;
          cp_async_4(sdst_block + qtr * kScaleBytes + r * 4, src, ok ? 4u : 0u);
        }
      }
    }
    mbar_arrive_cp_async(full_bar);
  }
}

template <int H, int PAGE_SHIFT, bool CAUSAL, int STAGES, bool PAGE_SCALES = false>
__device__ __forceinline__ void scores_sm90_persistent(const MlaIndexerScoresArgs& a) {
  using C = ScoresSm90Persistent<H, PAGE_SHIFT, CAUSAL, STAGES, PAGE_SCALES>;
  extern __shared__ __align__(1024) u8 smem_raw[];
  // Per token slot of an item: sequence, visible keys and validity; one set per Q buffer (slot s of
  // buffer q at [q * kBlockQ + s]).
  __shared__ int s_seq[C::kQBufs * C::kBlockQ];
  __shared__ long long s_visible[C::kQBufs * C::kBlockQ];
  __shared__ int s_valid[C::kQBufs * C::kBlockQ];
  // Per Q buffer: the item's first row within the chunk and first key (work_item's outputs, written
  // by the producer; the consumers read them from here instead of keeping registers for them).
  __shared__ long long s_row0[C::kQBufs];
  __shared__ int s_split_lo[C::kQBufs];

  const u32 raw = smem_u32(smem_raw);
  const u32 base = (raw + 1023u) & ~1023u;
  u8* const sbase = smem_raw + (base - raw);
  const u32 q_s = base;
  const u32 k_s = base + C::kOffK;
  const u32 ks_s = base + C::kOffKScale;
  float* const w_sm = reinterpret_cast<float*>(sbase + C::kOffW);
  const u32 full_bar = base + C::kOffFullBar;
  const u32 empty_bar = base + C::kOffEmptyBar;
  const u32 q_full_bar = base + C::kOffQFullBar;
  const u32 q_empty_bar = base + C::kOffQEmptyBar;

  // The TMA producers when built for this page size (the host then always encodes the K map); the
  // scales come by TMA too when the host could encode their map.
  constexpr bool tma = C::kTmaBuilt;
  const bool scales_by_tma = a.scales_by_tma != 0;
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      // cp.async: every producer lane arrives after its copies landed; TMA: each producer warp's
      // elected lane arrives once and the bytes complete the phase (plus the warp's 32 lanes when
      // they copy the scales with cp.async).
      mbar_init(full_bar + 8 * s, !tma ? 32u * C::kProducerWarps : (scales_by_tma ? 1u : 33u) * C::kProducerWarps);
      mbar_init(empty_bar + 8 * s, C::kConsumerThreads);  // every consumer thread arrives
    }
    for (int q = 0; q < C::kQBufs; ++q) {
      // Every producer lane arrives twice: once when its Q copies landed (cp.async), once after its
      // stores of the weights and token slots (a release).
      mbar_init(q_full_bar + 8 * q, 2 * 32 * C::kProducerWarps);
      mbar_init(q_empty_bar + 8 * q, C::kConsumerThreads);  // every consumer thread arrives
    }
    mbar_init_fence();  // the cp.async arrivals and the TMA transactions come through the async unit
  }
  __syncthreads();
  // From here the producer loads the first item's token slots and Q, then gathers K; the consumers
  // meet it at the item's q_full barrier and the first full barrier.

  // The index k of this role's current work item; its Q buffer is k & 1.
  u32 cur = 0;
  // Segments: maximal runs of valid slots of one sequence; [split_lo, kv_hi) is a segment's key
  // range in the item's split. Every role walks the same list.
  auto next_segment = [&](int from, int& s0_out, int& s1_out, long long& kv_hi_out) -> bool {
    const int sb = static_cast<int>(cur & 1u) * C::kBlockQ;
    const int split_lo = s_split_lo[cur & 1u];
    for (int s0 = from; s0 < C::kBlockQ;) {
      if (!s_valid[sb + s0]) {
        ++s0;
        continue;
      }
      int s1 = s0 + 1;
      while (s1 < C::kBlockQ && s_valid[sb + s1] && s_seq[sb + s1] == s_seq[sb + s0]) ++s1;
      long long seg_vis = 0;
      for (int s = s0; s < s1; ++s) seg_vis = s_visible[sb + s] > seg_vis ? s_visible[sb + s] : seg_vis;
      const long long split_hi = static_cast<long long>(split_lo) + a.keys_per_split;
      const long long kv_hi = split_hi < seg_vis ? split_hi : seg_vis;
      if (split_lo < kv_hi) {
        s0_out = s0;
        s1_out = s1;
        kv_hi_out = kv_hi;
        return true;
      }
      s0 = s1;
    }
    return false;
  };

  const int warp = tid >> 5, lane = tid & 31;
  if (warp >= C::kConsumerThreads / 32) {
    // ---------------- producer warps: paged gathers of 256-key blocks ----------------
    sm90::setmaxnreg_dec<C::kProducerRegs>();
    // Producer warp pw copies quarters pw, pw + kProducerWarps, ... of each block. Read back from lane 0 so that the compiler knows it is warp-uniform: the
    // quarter's state then lives in uniform registers (computed per thread, it spilled ~100 bytes
    // at the producer's 32 registers).
    const int pw = __shfl_sync(0xffffffffu, warp - C::kConsumerThreads / 32, 0);
    if (pw >= C::kProducerWarps) return;
    // TMA: the tensor maps' generic addresses in parameter space; their descriptors prefetched.
    const void* const k_map = &a.k_map;
    const void* const scale_map = &a.scale_map;
    if (tma && lane == 0) {
      tma_prefetch_map(k_map);
      if (scales_by_tma) tma_prefetch_map(scale_map);
    }
    u32 stage = 0, phase = 0;
    int s0 = 0, s1 = 0;
    long long kv_hi = 0;
    // Prologue of item `item` (Q buffer item & 1): token slots, Q tile and weights, published on the
    // buffer's q_full barrier. Runs while the consumers still work on the blocks of the item before
    // (the ring holds up to STAGES of them). False past the CTA's last item.
    u32 item = ~0u;
    auto begin_item = [&]() -> bool {
      long long row0 = 0;
      int split_lo = 0;
      if (!C::work_item(a, item, row0, split_lo)) return false;
      const u32 buf = item & 1u;
      cur = item;
      // Every producer warp is past the previous item, so none still reads the token slots of item
      // - 2, which this buffer held.
      sm90::named_bar_sync(2, 32 * C::kProducerWarps);
      // The consumers are done with item - 2's Q tile, weights and slots.
      if (item >= 2) mbar_wait(q_empty_bar + 8 * buf, ((item >> 1) - 1) & 1u);
      const int sb = static_cast<int>(buf) * C::kBlockQ;
      if (pw == 0) {
        indexer::load_token_slots<C::kBlockQ, CAUSAL>(a, row0, lane, s_seq + sb, s_visible + sb, s_valid + sb);
        if (lane == 0) {
          s_row0[buf] = row0;
          s_split_lo[buf] = split_lo;
        }
      }
      load_q_and_weights<C::kBlockQ, H, C::kWQuad>(a, row0, q_s + buf * C::kQBytes, w_sm + buf * C::kWFloats,
                                                   tid - C::kConsumerThreads, 32 * C::kProducerWarps);
      mbar_arrive_cp_async(q_full_bar + 8 * buf);  // when this lane's Q copies landed
      mbar_arrive(q_full_bar + 8 * buf);           // releases its weight and slot stores
      // The slots are visible to every producer warp.
      sm90::named_bar_sync(2, 32 * C::kProducerWarps);
      return true;
    };
    // The next segment of the current item, else the first segment of the next item that has one
    // (an item without keys, e.g. rows past the batch, still publishes its Q buffer: the consumers
    // walk every item).
    auto next_work = [&](bool first) -> bool {
      if (!first && next_segment(s1, s0, s1, kv_hi)) return true;
      for (;;) {
        ++item;
        if (!begin_item()) return false;
        if (next_segment(0, s0, s1, kv_hi)) return true;
      }
    };
    for (bool have = next_work(true); have; have = next_work(false)) {
      const int b = s_seq[static_cast<int>(item & 1u) * C::kBlockQ + s0];
      const long long split_lo = s_split_lo[item & 1u];
      // The TMA producers' row of the lookup table (opaque: the per-quarter page offsets are then
      // one add each).
      const unsigned* const lut = opaque_ptr(a.lookup_table + static_cast<long long>(b) * a.pages_per_seq);
      for (long long kv0 = split_lo; kv0 < kv_hi; kv0 += C::kBlockKeys) {
        const u32 kdst_block = k_s + stage * C::kStageBytes;
        const u32 sdst_block = ks_s + stage * (C::kBlockKeys * 4);
        if constexpr (tma && C::kTmaPageShift < 6)
          produce_block_tma_pages<C, C::kTmaPageShift>(a, lut, k_map, scale_map, kv0, kv_hi, kdst_block, sdst_block,
                                                       full_bar + 8 * stage, empty_bar + 8 * stage, phase,
                                                       pw, lane, scales_by_tma);
        else if constexpr (tma)
          produce_block_tma<C, C::kTmaPageShift>(a, lut, k_map, scale_map, kv0, kv_hi, kdst_block, sdst_block,
                                                 full_bar + 8 * stage, empty_bar + 8 * stage, phase,
                                                 pw, lane, scales_by_tma);
        else
          produce_block_cp_async<C, PAGE_SHIFT>(a, b, kv0, kv_hi, kdst_block, sdst_block, full_bar + 8 * stage,
                                                empty_bar + 8 * stage, phase, pw, lane);
        if (++stage == STAGES) {
          stage = 0;
          phase ^= 1u;
        }
      }
    }
    // Leave with no copy in flight (the CTA's shared memory must outlive them).
    cp_async_commit();
    cp_async_wait<0>();
    return;
  }

  // ---------------- consumer warpgroups: per item MMA + head reduction + stores ----------------
  // Per block: wait for it, issue the warpgroup's N = 128 MMA on its quarter, wait, release the
  // stage, reduce and store. The overlap of one warpgroup's epilogue with MMAs comes from the other
  // three, as in the tile scorer.
  sm90::setmaxnreg_inc<C::kConsumerRegs>();
  // Read back from lane 0 so that the compiler knows it is warp-uniform: the descriptors and the
  // quarter's key offset then live in uniform registers, which the 112-register budget needs (with
  // wg per thread, the loop state spilled 20 bytes next to the 96 accumulator and weight registers).
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
  const int warp_in_wg = warp & 3;
  const int quad = lane & 3;
  const int odd = quad & 1;
  const int row_lo = warp_in_wg * 16 + (lane >> 2);  // key rows row_lo and row_lo + 8 of the quarter
  const int my_row = C::kQuarterKeys * wg + row_lo + 8 * odd;  // the block row this thread stores
  const u64 desc_b0 = sw128_kmajor_desc(q_s);  // Q buffer 0
  u64 desc_b = desc_b0;                          // the current item's Q buffer (set per item)
  const u64 desc_a0 = sw128_kmajor_desc(k_s + wg * C::kQuarterBytes);  // stage 0
  const u32 desc_a_lo = static_cast<u32>(desc_a0), desc_a_hi = static_cast<u32>(desc_a0 >> 32);
  float acc[64];
  // The weights of all the item's tokens (kBlockQ x H/4 = 32 floats for every H) in registers.
  Quad wq[C::kBlockQ][H / 16];
  const u32 ks_thr = ks_s + 4u * my_row;  // this thread's key scale in stage 0

  // Ring position in one register (the 96 accumulator and weight registers leave 16 for the rest;
  // separate stage and phase registers spilled): bits 0-15 = stage * 8 (the barrier offset),
  // bit 31 = the phase to wait for.
  u32 ring = 0;
  // Waits for the next block, runs the warpgroup's MMA on its quarter, releases the stage and
  // returns this thread's key scale. Called from two loops (steady state and boundary), always
  // outside any data-dependent branch (C7520).
  auto mma_block = [&]() -> float {
    const u32 off8 = ring & 0xffffu;
    mbar_wait(full_bar + off8, ring >> 31);
    // cp.async wrote the block (and the item's Q) through the generic proxy; the wgmma reads them
    // through the async one. The TMA wrote K through the async proxy (produce_block_tma*); the
    // TMA build fences for Q after the item's q_full acquire.
    if constexpr (!tma) fence_proxy_async_smem();
    const float ks = lds_f32(ks_thr + off8 * (C::kBlockKeys * 4 / 8));
    // The stage and k-step offsets only move the start address (bits 0-13, addresses < 256 KiB never
    // carry out of it): 32-bit adds on the low word, the high word is a constant (64-bit adds cost
    // ~10 more instructions per block).
    const u32 a_lo = desc_a_lo + off8 * (C::kStageBytes / 16 / 8);
    fence_operands(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_m64n128k32_e4m3(acc, (static_cast<u64>(desc_a_hi) << 32) | (a_lo + 2 * kk),
                            desc_b + 2 * kk, kk > 0 ? 1u : 0u);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(acc);
    // Every consumer thread releases the stage itself (racecheck: its own reads of the scales then
    // precede the producer's overwrite through one release/acquire pair).
    mbar_arrive(empty_bar + off8);
    ring += 8;
    if ((ring & 0xffffu) == 8u * STAGES) ring = (ring & 0x80000000u) ^ 0x80000000u;
    return ks;
  };

  for (u32 item = 0;; ++item) {
    {
      long long row0 = 0;
      int split_lo = 0;
      if (!C::work_item(a, item, row0, split_lo)) break;
    }
    cur = item;
    const u32 buf = item & 1u;
    // The item's token slots, Q tile and weights (the producer loaded them ahead).
    mbar_wait(q_full_bar + 8 * buf, (item >> 1) & 1u);
    // The producer wrote Q with cp.async (generic proxy); the wgmma reads it through the async one.
    // The cp.async build fences after every block's acquire (mma_block), which covers Q; the TMA
    // build's blocks need no fence, so Q gets its own here, once per item.
    if constexpr (tma) fence_proxy_async_smem();
    // The buffer offset only moves the start address (bits 0-13, no carry out of them).
    desc_b = desc_b0 + buf * (C::kQBytes / 16);
#pragma unroll
    for (int tt = 0; tt < C::kBlockQ; ++tt) {
      const Quad* w = reinterpret_cast<const Quad*>(w_sm + buf * C::kWFloats + tt * C::kWSlot + quad * C::kWQuad);
#pragma unroll
      for (int m = 0; m < H / 16; ++m) wq[tt][m] = w[m];
    }
    // The segment's slots [s0, s1) as one register, a mask of the slots: s1 (where the next
    // segment's search starts) is one past its highest bit. Registers for s0 / s1 spilled.
    u32 seg = 0;
    for (;;) {
      long long seg_hi = 0;
      {
        int s0 = 0, s1 = 0;
        if (!next_segment(32 - __clz(seg), s0, s1, seg_hi)) break;
        seg = ((1u << s1) - 1u) & ~((1u << s0) - 1u);
      }
      // Key positions fit 32 bits (max_keys < 2^31, checked by the host): int keeps the loop state in
      // fewer registers.
      const int kv_hi = static_cast<int>(seg_hi);
      // Keys below all_vis are visible to every token of the CTA (0 when one of them is not in the
      // segment). Blocks whose quarter of this warpgroup lies below it (kv0 <= fast_hi) store without
      // per-key checks; the rest of the segment's blocks check every key.
      int all_vis = kv_hi;
#pragma unroll
      for (int tt = 0; tt < C::kBlockQ; ++tt) {
        const int v = (seg >> tt) & 1u ? static_cast<int>(s_visible[buf * C::kBlockQ + tt]) : 0;
        all_vis = v < all_vis ? v : all_vis;
      }
      const int fast_hi = all_vis - C::kQuarterKeys * (wg + 1);
      int kv0 = s_split_lo[buf];
      // Steady state: every key of the quarter is visible to every token of the CTA. The loop bound is
      // also below kv_hi (all_vis <= kv_hi), so every block of this loop exists for every warpgroup.
      // The store address advances with kv0 (recomputed from the block's row it cost ~12 instructions).
      float* out = a.scores + s_row0[buf] * a.score_row_stride + my_row + kv0;
      for (; kv0 <= fast_hi; kv0 += C::kBlockKeys, out += C::kBlockKeys) {
        const float ks = mma_block();
#pragma unroll
        for (int tt = 0; tt < C::kBlockQ; ++tt) {
          const float mine = head_sum<H, C::kBlockQ>(acc, wq, tt, odd);
          if (quad < 2) out[tt * a.score_row_stride] = mine * ks;
        }
      }
      // Boundary blocks (other warpgroups may still be in the steady loop for the same block: the
      // loops differ per warpgroup only in where they switch, not in the blocks they consume). Store
      // the keys each token of the segment sees: no scorer writes a key at or past a token's
      // visible count. A quarter wholly past the segment's keys was not copied and stores nothing. The end of
      // the segment's keys (kv_hi, as next_segment computed it) is read again from shared memory
      // rather than kept through the steady loop: at H 32 (4 tokens) that register spilled.
      long long seg_vis = 0;
#pragma unroll
      for (int tt = 0; tt < C::kBlockQ; ++tt)
        if (((seg >> tt) & 1u) && s_visible[buf * C::kBlockQ + tt] > seg_vis) seg_vis = s_visible[buf * C::kBlockQ + tt];
      const long long split_hi = static_cast<long long>(s_split_lo[buf]) + a.keys_per_split;
      const int kv_end = static_cast<int>(split_hi < seg_vis ? split_hi : seg_vis);
      // `out` is at key kv0 on leaving the steady loop.
      for (; kv0 < kv_end; kv0 += C::kBlockKeys, out += C::kBlockKeys) {
        const float ks = mma_block();
        const int j = kv0 + my_row;
#pragma unroll
        for (int tt = 0; tt < C::kBlockQ; ++tt) {
          const float mine = head_sum<H, C::kBlockQ>(acc, wq, tt, odd);
          if (quad < 2 && ((seg >> tt) & 1u) && j < s_visible[buf * C::kBlockQ + tt]) out[tt * a.score_row_stride] = mine * ks;
        }
      }
    }
    // Done with the item's Q tile, weights and slots (its MMAs completed in mma_block): the producer
    // may load item + 2 into this buffer.
    mbar_arrive(q_empty_bar + 8 * buf);
  }
}

}  // namespace indexer_sm90
}  // namespace mj

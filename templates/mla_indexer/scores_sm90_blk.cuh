#pragma once
// Indexer scores on Hopper (sm_90a), v10 / v11: 256-key blocks split across the warpgroups
// (`params.block_kv` 0, the default, or 256; block_kv 64 and page size 1 run v8,
// mla_indexer/scores_sm90.cuh).
//
// The function is v8's: score[i, j] = k_scale[j] * sum_h relu(q[i,h,:] . k[j,:]) * qs[i,h], with
// the same wgmma (m64 keys x n128 = 128/H tokens x H heads x k128, K tile = A, Q = B, both
// K-major with the 128-byte swizzle), the same per-thread head reduction and the same stores, so
// the scores are bit-identical to v8's. What changes is the split of the work:
//
//   v8:  CTA = 4 x (128/H) tokens; every warpgroup has its own Q (B) and all four read the same
//        64-key K tile; one walk step per 64 keys, shared by 8 tokens (at H 64).
//   v10: CTA = 128/H tokens (N = 128: one Q tile that all four warpgroups read); a ring stage is
//        a 256-key block and warpgroup w takes keys [64w, 64w + 64) of it. One walk step per
//        256 keys; the visibility logic is one compare per step (blocks below the CTA's common
//        visible prefix store without per-key checks), per-key checks only in boundary blocks.
//
// Same MMA work and shared-memory operand traffic per MAC as v8 (each warpgroup MMA reads an
// 8 KiB K quarter and the 16 KiB Q tile); the K cache is streamed once per 128/H tokens instead of
// once per 4 x 128/H (4x the L2 -> SM bytes of v8, the same as DeepGEMM's sm90 MQA logits, whose
// layout this is).
//
// Producer: 4 warps (MJ_IDX10_PRODUCER_WARPS; 1 = one warp for the whole block), warp p gathers
// quarter p of each block with cp.async (v8's copy pattern: 4 whole 128-byte rows per warp
// instruction, 128-byte swizzle; one table read per quarter for pages >= 64, per-page lane lookups
// for pages 2..32; page 1 runs v8) and every producer lane arrives on the block's full barrier
// with cp.async.mbarrier.arrive.noinc (count 32 x producer warps), as v8 publishes a tile. Quarters that
// lie wholly past the segment's last visible key are not copied: their warpgroup still runs its
// MMA on whatever the slot holds (a wgmma under a data-dependent branch is serialized by ptxas,
// C7520) but stores nothing.
//
// v11 (pages >= 64, MJ_IDX11_TMA 1, the default there): the producer loads each 64-key quarter with
// one TMA (K rows, 128-byte swizzle) and its scales with another (produce_block_tma; op.cpp encodes
// the tensor maps, ops/mla_indexer/tma.hpp); the full barrier completes on the bytes, and the
// consumers need no async-proxy fence after their acquire. Same data in the same layout as v10, so
// the scores are bit-identical; pages 2..32 keep v10's producer (produce_block_cp_async).
//
// Grid: x = blocks of 128/H tokens of the chunk, y = splits of the key range (keys_per_split, a
// multiple of 256). Tokens of one CTA that belong to different sequences are walked as separate
// segments over their own keys, as in v8.
#include "common/types.cuh"
#include "mla_indexer/common.cuh"
#include "mla_indexer/scores_sm90.cuh"
#include "mla_indexer/sm90_primitives.cuh"

// Producer warps of v10 (ScoresSm90Blk::kProducerWarps): 4 (default) or 1 (or 2).
#ifndef MJ_IDX10_PRODUCER_WARPS
#define MJ_IDX10_PRODUCER_WARPS 4
#endif

// v11's TMA producer for pages >= 64: 1 (default) or 0 (v10's cp.async producer and consumer fence,
// for A/B through MLAJIT_NVRTC_EXTRA_OPTIONS="-DMJ_IDX11_TMA=0"). Pages below 64 always run v10's.
#ifndef MJ_IDX11_TMA
#define MJ_IDX11_TMA 1
#endif
// Producer warps of v11 (ScoresSm90Blk::kTmaWarps): 4 (default), 2 or 1.
#ifndef MJ_IDX11_TMA_WARPS
#define MJ_IDX11_TMA_WARPS 4
#endif

namespace mj {
namespace indexer_sm90 {

template <int H, int PAGE_SHIFT, bool CAUSAL, int STAGES>
struct ScoresSm90Blk {
  static_assert(H == 32 || H == 64 || H == 128, "heads");
  // 16 KiB of Q + STAGES x 33 KiB must fit the 227 KiB of a CTA.
  static_assert(STAGES >= 2 && STAGES <= 6, "stages");
  // Page 1 (64 pages per quarter: two table entries per producer lane) is not built; the host runs
  // v8 for it (plan.hpp).
  static_assert(PAGE_SHIFT >= 1, "page size >= 2");
  static constexpr int kDepth = 128;              // bytes per fp8 row (q head or key)
  static constexpr int kWgs = 4;                  // consumer warpgroups
  static constexpr int kBlockQ = 128 / H;         // tokens per CTA: N = 128
  static constexpr int kQuarterKeys = 64;         // M of the MMA: one warpgroup's keys of a block
  static constexpr int kBlockKeys = kWgs * kQuarterKeys;  // keys per ring stage
  static constexpr int kConsumerThreads = 128 * kWgs;
  // Producer warpgroup + setmaxnreg split: as v8 (ScoresSm90 says why).
  static constexpr int kThreads = kConsumerThreads + 128;
  // Producer warps of the producer warpgroup; warp p copies quarters p, p + kProducerWarps, ... of
  // every block. 4 (one quarter each, one warp per SM sub-partition): a block moves 4x v8's K bytes
  // per MMA, and one warp issuing all of it (~360 instructions per block even with the steady-state
  // copy path) would load its scheduler with 4 x 213 consumer + 360 instructions per 1024 tensor
  // cycles; spread, each scheduler issues ~4 x 213 + ~90. 1 = one warp copies the four quarters.
  static constexpr int kProducerWarps = MJ_IDX10_PRODUCER_WARPS;
  static_assert(kProducerWarps == 1 || kProducerWarps == 2 || kProducerWarps == 4, "producer warps");
  // v11: pages >= 64 load each quarter by TMA (64 consecutive cache rows); MJ_IDX11_TMA 0 builds
  // v10's cp.async producer (A/B). kTmaPageShift: the page shift produce_block_tma is instantiated
  // with (never called below 6).
  static constexpr bool kTmaBuilt = MJ_IDX11_TMA != 0 && PAGE_SHIFT >= 6;
  static constexpr int kTmaPageShift = PAGE_SHIFT >= 6 ? PAGE_SHIFT : 6;
  // v11's producer warps (MJ_IDX11_TMA_WARPS): warp p issues the TMAs of quarters p, p + kTmaWarps,
  // ... of every block from one elected lane. 4 (default) = one warp per quarter, one per SM
  // sub-partition: each scheduler issues ~77 producer instructions per block (SASS, H 64, page 64)
  // next to its 4 x ~203 consumer ones. 1 = one thread issues the whole block, as DeepGEMM: ~160
  // on one scheduler (the table reads, row math and 8 TMA issues do not shrink 4x), which would
  // leave that scheduler at v10's ~970 per block.
  static constexpr int kTmaWarps = MJ_IDX11_TMA_WARPS;
  static_assert(kTmaWarps == 1 || kTmaWarps == 2 || kTmaWarps == 4, "TMA producer warps");
  static constexpr int kProducerRegs = 32;
  static constexpr int kConsumerRegs = 112;
  static_assert(kProducerRegs * 128 + kConsumerRegs * kConsumerThreads <= 96 * kThreads,
                "setmaxnreg budget: the registers of a 640-thread CTA at 96 per thread");

  static constexpr unsigned kQBytes = kBlockQ * H * kDepth;                  // 16 KiB
  static constexpr unsigned kQuarterBytes = kQuarterKeys * kDepth;           // 8 KiB
  static constexpr unsigned kStageBytes = kBlockKeys * kDepth;               // 32 KiB
  static constexpr unsigned kOffK = kQBytes;
  static constexpr unsigned kOffKScale = kOffK + STAGES * kStageBytes;
  static constexpr unsigned kOffW = kOffKScale + STAGES * kBlockKeys * 4;
  // Weights per token slot: 4 quads x (H/4 + 4) floats, v8's padded layout.
  static constexpr int kWQuad = H / 4 + 4;
  static constexpr int kWSlot = 4 * kWQuad;
  static constexpr unsigned kOffBar = kOffW + kBlockQ * kWSlot * 4;
  static constexpr unsigned kBytesUsed = kOffBar + 2 * STAGES * 8;
  static constexpr unsigned kSmemBytes = kBytesUsed + 1024;  // slack to align the base to 1024
  static_assert(kSmemBytes <= 227u * 1024u, "shared memory of one CTA");
  // Stage s's K quarter w starts kOffK + s * kStageBytes + w * kQuarterBytes: 1024-byte aligned, as
  // the swizzled descriptor needs, and a descriptor moves by (bytes >> 4) in its address field.
  static_assert(kQBytes % 1024 == 0 && kStageBytes % 1024 == 0 && kQuarterBytes % 1024 == 0, "swizzle alignment");
};

MJ_DEVICE float lds_f32(u32 addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}

// v10's copy of one 256-key block (cp.async; every page size >= 2): producer warp pw gathers quarters
// pw, pw + kProducerWarps, ... into the stage at kdst_block (K) and sdst_block (scales), then every
// lane arrives on the stage's full barrier when its copies have landed. cp.async writes through
// the generic proxy: the consumers fence the async proxy after their acquire.
template <class C, int PAGE_SHIFT>
MJ_DEVICE void produce_block_cp_async(const MlaIndexerScoresArgs& a, int b, long long kv0, long long kv_hi,
                                      u32 kdst_block, u32 sdst_block, u32 full_bar, u32 empty_bar, u32 phase, int pw,
                                      int lane) {
  const int chunk = lane & 7, lr = lane >> 3;  // 16-byte chunk of a row, row of 4 (v8's copy pattern)
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
        // address all 16 copies. (v8's loop, below, spends ~15 instructions per copy on the
        // per-row address, predicate and size; v10 moves 4x v8's K bytes per MMA.)
        const u8* src = a.k_blocks + (row0 + lr) * C::kDepth + chunk * 16;
        const u32 d_even = kdst + lr * 128 + ((chunk ^ lr) << 4);
        const u32 d_odd = kdst + (lr + 4) * 128 + ((chunk ^ (lr + 4)) << 4);
#pragma unroll
        for (int it = 0; it < C::kQuarterKeys / 4; ++it)
          cp_async_16_full((it & 1 ? d_odd : d_even) + (it >> 1) * 1024, src + it * 4 * C::kDepth);
        const float* ssrc = a.k_scales + (row0 + lane) * a.scale_row_stride;
        cp_async_4_full(sdst + lane * 4, ssrc);
        cp_async_4_full(sdst + (lane + 32) * 4, ssrc + 32LL * a.scale_row_stride);
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
          const float* ssrc = ok ? a.k_scales + (row0 + r) * a.scale_row_stride : a.k_scales;
          cp_async_4(sdst + r * 4, ssrc, ok ? 4u : 0u);
        }
      }
    } else {
      // Pages of 2..32 keys (v8's per-page lane lookups): lane l reads the table entry of the
      // quarter's page l once, and every row takes its page's block from that lane by a
      // shuffle (per-row table reads were 2.6x slower at page 16 in v5). 32-bit block ids, not
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
      // Unrolled by 4 (v8) the loop's hoisted per-row shuffle lanes and offsets spilled at 32
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
        const float* ssrc = row >= 0 ? a.k_scales + row * a.scale_row_stride : a.k_scales;
        cp_async_4(sdst + r * 4, ssrc, row >= 0 ? 4u : 0u);
      }
    }
  }
  // This warp's share of the block is published when its copies have landed (a warp with no
  // quarter to copy arrives at once); the block is complete when every producer lane arrived.
  // The consumers fence the async proxy after their acquire (v8's protocol).
  // This warp's share of the block is published when its copies have landed (a warp with no
  // quarter to copy arrives at once); the block is complete when every producer lane arrived.
  mbar_arrive_cp_async(full_bar);
}

// v11's copy of one 256-key block (pages >= 64: a page holds every 64-key quarter it starts, so a
// quarter is 64 consecutive cache rows). Producer warp pw takes quarters pw, pw + kTmaWarps, ...:
// one elected lane issues one TMA per quarter for its K rows (box 64 rows x 128 B, 128-byte
// swizzle: the 16-byte chunk c of row r lands at (c ^ (r & 7)) << 4 in the 1024-byte aligned
// quarter, the layout the wgmma descriptors read) and, with `scales_by_tma`, one for its 64 scales,
// and arrives on the stage's full barrier with the bytes it issued (count kTmaWarps). Without
// `scales_by_tma` (the scales are not 16-byte aligned) the warp's 32 lanes copy its quarters'
// scales with cp.async and arrive when they land (count kTmaWarps x 33).
//
// No consumer fence either way: the wgmma reads K, written by the TMA through the async proxy and
// published by the barrier's transactions; the scales are read with ld.shared (generic proxy),
// ordered after their writes (TMA or cp.async) by the barrier's completion.
//
// Quarters wholly past the segment's keys are not copied (as in v10; their warpgroup stores
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
  constexpr int kMine = C::kWgs / C::kTmaWarps;  // quarters per warp
  constexpr u32 kScaleBytes = C::kQuarterKeys * 4;
  // Keys fit 31 bits (op.cpp), and so do cache rows (op.cpp checks the row count for v11): 32-bit
  // math (the uniform datapath's 64-bit multiplies and compares cost ~3x).
  const int key0 = static_cast<int>(kv0);
  const int keys_left = static_cast<int>(kv_hi - kv0);  // >= 1
  const int quarters = keys_left >= C::kBlockKeys ? C::kWgs : (keys_left + C::kQuarterKeys - 1) / C::kQuarterKeys;
  const int pages = a.pages_per_seq < 0x7fffffff ? static_cast<int>(a.pages_per_seq) : 0x7fffffff;
  const u32 blocks = a.num_blocks < 0xffffffffLL ? static_cast<u32>(a.num_blocks) : 0xffffffffu;
  // Table entries of this warp's quarters, read before the wait for the stage so that their latency
  // overlaps it; a page past the table reads as unmapped.
  constexpr u32 kNoBlock = 0xffffffffu;
  u32 blk[kMine];
#pragma unroll
  for (int j = 0; j < kMine; ++j) {
    const int qtr = pw + j * C::kTmaWarps;
    const int page = (key0 + qtr * C::kQuarterKeys) >> PAGE_SHIFT;
    blk[j] = qtr < quarters && page < pages ? __ldg(lut + page) : kNoBlock;
  }
  mbar_wait(empty_bar, phase ^ 1u);
  // First cache row of each quarter, or rows [-64, 0) (outside the tensors: zero-filled) unmapped.
  int row0[kMine];
#pragma unroll
  for (int j = 0; j < kMine; ++j) {
    const int qtr = pw + j * C::kTmaWarps;
    const u32 in_page = static_cast<u32>(key0 + qtr * C::kQuarterKeys) & ((1u << PAGE_SHIFT) - 1u);
    row0[j] = blk[j] < blocks ? static_cast<int>(blk[j] * static_cast<u32>(a.block_row_stride) +
                                                 static_cast<u32>(a.layer_row_offset) + in_page)
                              : -C::kQuarterKeys;
  }
  const int copied = quarters > pw ? (quarters - pw + C::kTmaWarps - 1) / C::kTmaWarps : 0;  // this warp's quarters
  if (elect_one()) {
    mbar_arrive_expect_tx(full_bar, copied * (C::kQuarterBytes + (scales_by_tma ? kScaleBytes : 0u)));
#pragma unroll
    for (int j = 0; j < kMine; ++j) {
      const int qtr = pw + j * C::kTmaWarps;
      if (qtr < quarters) tma_load_2d(kdst_block + qtr * C::kQuarterBytes, k_map, 0, row0[j], full_bar);
    }
    if (scales_by_tma) {
#pragma unroll
      for (int j = 0; j < kMine; ++j) {
        const int qtr = pw + j * C::kTmaWarps;
        if (qtr < quarters) tma_load_1d(sdst_block + qtr * kScaleBytes, scale_map, row0[j], full_bar);
      }
    }
  }
  if (!scales_by_tma) {
#pragma unroll
    for (int j = 0; j < kMine; ++j) {
      const int qtr = pw + j * C::kTmaWarps;
      if (qtr < quarters) {
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const int r = lane + 32 * rr;
          const bool ok = row0[j] >= 0;
          const float* src = ok ? a.k_scales + static_cast<long long>(row0[j] + r) * a.scale_row_stride : a.k_scales;
          cp_async_4(sdst_block + qtr * kScaleBytes + r * 4, src, ok ? 4u : 0u);
        }
      }
    }
    mbar_arrive_cp_async(full_bar);
  }
}

template <int H, int PAGE_SHIFT, bool CAUSAL, int STAGES>
__device__ __forceinline__ void scores_sm90_blk(const MlaIndexerScoresArgs& a) {
  using C = ScoresSm90Blk<H, PAGE_SHIFT, CAUSAL, STAGES>;
  extern __shared__ __align__(1024) u8 smem_raw[];
  // Per token slot of this CTA: sequence, visible keys and validity (computed once).
  __shared__ int s_seq[C::kBlockQ];
  __shared__ long long s_visible[C::kBlockQ];
  __shared__ int s_valid[C::kBlockQ];

  const u32 raw = smem_u32(smem_raw);
  const u32 base = (raw + 1023u) & ~1023u;
  u8* const sbase = smem_raw + (base - raw);
  const u32 q_s = base;
  const u32 k_s = base + C::kOffK;
  const u32 ks_s = base + C::kOffKScale;
  float* const w_sm = reinterpret_cast<float*>(sbase + C::kOffW);
  const u32 full_bar = base + C::kOffBar;
  const u32 empty_bar = full_bar + STAGES * 8;

  // v11 (TMA producer) when built for this page size (the host then always encodes the K map); its
  // scales come by TMA too when the host could encode their map.
  constexpr bool tma = C::kTmaBuilt;
  const bool scales_by_tma = a.scales_by_tma != 0;
  const int tid = threadIdx.x;
  const long long block_row0 = static_cast<long long>(blockIdx.x) * C::kBlockQ;  // within the chunk
  const long long split_lo = static_cast<long long>(blockIdx.y) * a.keys_per_split;

  indexer::load_token_slots<C::kBlockQ, CAUSAL>(a, block_row0, tid, s_seq, s_visible, s_valid);
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      // v10: every producer lane arrives after its copies landed; v11: each TMA warp's elected lane
      // arrives once and the bytes complete the phase (plus the warp's 32 lanes when they copy the
      // scales with cp.async).
      mbar_init(full_bar + 8 * s, !tma ? 32u * C::kProducerWarps : (scales_by_tma ? 1u : 33u) * C::kTmaWarps);
      mbar_init(empty_bar + 8 * s, C::kConsumerThreads);  // every consumer thread arrives
    }
    mbar_init_fence();  // the cp.async arrivals and the TMA transactions come through the async unit
  }
  __syncthreads();
  // From here the producer gathers K while the consumers load Q and the weights (they meet at the
  // first full barrier); v8 loaded Q with all 640 threads before the first K copy.

  // Segments: maximal runs of valid slots of one sequence; [split_lo, kv_hi) is a segment's key
  // range in this split. Every role walks the same list.
  auto next_segment = [&](int from, int& s0_out, int& s1_out, long long& kv_hi_out) -> bool {
    for (int s0 = from; s0 < C::kBlockQ;) {
      if (!s_valid[s0]) {
        ++s0;
        continue;
      }
      int s1 = s0 + 1;
      while (s1 < C::kBlockQ && s_valid[s1] && s_seq[s1] == s_seq[s0]) ++s1;
      long long seg_vis = 0;
      for (int s = s0; s < s1; ++s) seg_vis = s_visible[s] > seg_vis ? s_visible[s] : seg_vis;
      const long long kv_hi = split_lo + a.keys_per_split < seg_vis ? split_lo + a.keys_per_split : seg_vis;
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
    // Producer warp pw copies quarters pw, pw + P, ... of each block (P = kProducerWarps in v10,
    // kTmaWarps in v11). Read back from lane 0 so that the compiler knows it is warp-uniform: the
    // quarter's state then lives in uniform registers (computed per thread, it spilled ~100 bytes
    // at the producer's 32 registers).
    const int pw = __shfl_sync(0xffffffffu, warp - C::kConsumerThreads / 32, 0);
    if (pw >= (tma ? C::kTmaWarps : C::kProducerWarps)) return;
    // v11: the tensor maps' generic addresses in parameter space; their descriptors prefetched.
    const void* const k_map = &a.k_map;
    const void* const scale_map = &a.scale_map;
    if (tma && lane == 0) {
      tma_prefetch_map(k_map);
      if (scales_by_tma) tma_prefetch_map(scale_map);
    }
    u32 stage = 0, phase = 0;
    int s0 = 0, s1 = 0;
    long long kv_hi = 0;
    for (bool have = next_segment(0, s0, s1, kv_hi); have; have = next_segment(s1, s0, s1, kv_hi)) {
      const int b = s_seq[s0];
      // v11's row of the lookup table (opaque: the per-quarter page offsets are then one add each).
      const unsigned* const lut = opaque_ptr(a.lookup_table + static_cast<long long>(b) * a.pages_per_seq);
      for (long long kv0 = split_lo; kv0 < kv_hi; kv0 += C::kBlockKeys) {
        const u32 kdst_block = k_s + stage * C::kStageBytes;
        const u32 sdst_block = ks_s + stage * (C::kBlockKeys * 4);
        if (tma)
          produce_block_tma<C, C::kTmaPageShift>(a, lut, k_map, scale_map, kv0, kv_hi, kdst_block, sdst_block,
                                                 full_bar + 8 * stage, empty_bar + 8 * stage, phase,
                                                 C::kTmaWarps == 1 ? 0 : pw, lane, scales_by_tma);
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

  // ---------------- consumer warpgroups: Q load, then MMA + head reduction + stores ----------------
  // Q tile of the CTA (swizzled 128-byte rows; rows of invalid tokens are zero) and the head
  // weights, loaded by the consumers only (the producer is already gathering K).
  load_q_and_weights<C::kBlockQ, H, C::kWQuad>(a, block_row0, q_s, w_sm, tid, C::kConsumerThreads);
  cp_async_wait<0>();
  fence_proxy_async_smem();  // the wgmma reads Q through the async proxy
  sm90::named_bar_sync(1, C::kConsumerThreads);

  // Per block: wait for it, issue the warpgroup's N = 128 MMA on its quarter, wait, release the
  // stage, reduce and store. The overlap of one warpgroup's epilogue with MMAs comes from the other
  // three, as in v8.
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
  const u64 desc_b = sw128_kmajor_desc(q_s);
  const u64 desc_a0 = sw128_kmajor_desc(k_s + wg * C::kQuarterBytes);  // stage 0
  const u32 desc_a_lo = static_cast<u32>(desc_a0), desc_a_hi = static_cast<u32>(desc_a0 >> 32);
  float acc[64];
  // The weights of all the CTA's tokens (kBlockQ x H/4 = 32 floats for every H) in registers.
  Quad wq[C::kBlockQ][H / 16];
#pragma unroll
  for (int tt = 0; tt < C::kBlockQ; ++tt) {
    const Quad* w = reinterpret_cast<const Quad*>(w_sm + tt * C::kWSlot + quad * C::kWQuad);
#pragma unroll
    for (int m = 0; m < H / 16; ++m) wq[tt][m] = w[m];
  }
  float* const out_thr = a.scores + block_row0 * a.score_row_stride + my_row;
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
    // cp.async (v10) wrote the block through the generic proxy; the wgmma reads it through the async
    // one. The TMA (v11) wrote K through the async proxy (produce_block_tma).
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
      wgmma_m64n128k32_e4m3(acc, (static_cast<u64>(desc_a_hi) << 32) | (a_lo + 2 * kk), desc_b + 2 * kk,
                            kk > 0 ? 1u : 0u);
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
      const int v = (seg >> tt) & 1u ? static_cast<int>(s_visible[tt]) : 0;
      all_vis = v < all_vis ? v : all_vis;
    }
    const int fast_hi = all_vis - C::kQuarterKeys * (wg + 1);
    int kv0 = static_cast<int>(split_lo);
    // Steady state: every key of the quarter is visible to every token of the CTA. The loop bound is
    // also below kv_hi (all_vis <= kv_hi), so every block of this loop exists for every warpgroup.
    // The store address advances with kv0 (recomputed from the block's row it cost ~12 instructions).
    float* out = out_thr + kv0;
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
    // the keys each token of the segment sees: v8 never writes a key at or past a token's visible
    // count. A quarter wholly past the segment's keys was not copied and stores nothing. The end of
    // the segment's keys (kv_hi, as next_segment computed it) is read again from shared memory
    // rather than kept through the steady loop: at H 32 (4 tokens) that register spilled.
    long long seg_vis = 0;
#pragma unroll
    for (int tt = 0; tt < C::kBlockQ; ++tt)
      if (((seg >> tt) & 1u) && s_visible[tt] > seg_vis) seg_vis = s_visible[tt];
    const int kv_end = static_cast<int>(split_lo + a.keys_per_split < seg_vis ? split_lo + a.keys_per_split : seg_vis);
    for (; kv0 < kv_end; kv0 += C::kBlockKeys) {
      const float ks = mma_block();
      const int j = kv0 + my_row;
      float* const out = out_thr + kv0;
#pragma unroll
      for (int tt = 0; tt < C::kBlockQ; ++tt) {
        const float mine = head_sum<H, C::kBlockQ>(acc, wq, tt, odd);
        if (quad < 2 && ((seg >> tt) & 1u) && j < s_visible[tt]) out[tt * a.score_row_stride] = mine * ks;
      }
    }
  }
}

}  // namespace indexer_sm90
}  // namespace mj

#pragma once
// Indexer scores on Hopper (sm_90a), the tile scorer: fp8 wgmma over the paged K cache, 64-key
// tiles shared by four warpgroups of their own query tokens (params.block_kv 64; the heuristic's
// pick at page sizes 1, 2 and 4, where the persistent scorer, scores_sm90_persistent.cuh, has no
// TMA producer). Sizes and offsets: mla_indexer/layout.h.
//
// For one query token the scores are a GEMM over heads and keys followed by a reduction over
// heads: S[h, j] = q[h,:] . k[j,:], score[j] = k_scale[j] * sum_h relu(S[h, j]) * qs[h]. Keys
// are the M side of the MMA (64 rows, the A operand), query heads of several tokens the N side
// (the B operand, 128 = tokens_per_warpgroup * H columns), K = 128 = depth. The accumulator
// fragment gives each thread 2 key rows and, per token, H/4 head columns, so the head reduction
// is in-thread FMAs plus two shuffles inside a quad.
//
// CTA = 4 consumer warpgroups (each owns kTokPerWg query tokens; all four read the same K tile)
// and one producer warp that gathers 64-key tiles page by page with cp.async into a ring of
// STAGES swizzled buffers (mbarrier full/empty handshake). A warpgroup runs its N = 128 MMA, waits
// for it and reduces; while it reduces, the other three warpgroups' MMAs keep the tensor cores
// busy (the epilogue is ~1/2 of the MMA time, so it needs three MMAs in the shadow, which two
// warpgroups with N = 256 each could not give).
//
// Grid: x = query blocks of kBlockQ tokens of the chunk, y = splits of the key range
// (keys_per_split keys each). Tokens of one block that belong to different sequences (ragged
// batch, decode) are processed as separate segments over their own keys.
#include "common/types.cuh"
#include "mla_indexer/common.cuh"
#include "mla_indexer/layout.h"
#include "mla_indexer/sm90_primitives.cuh"

namespace mj {
namespace indexer_sm90 {

template <int H, int PAGE_SHIFT, bool CAUSAL, int STAGES, bool PAGE_SCALES = false>
struct ScoresSm90Tile {
  static_assert(H == 32 || H == 64 || H == 128, "heads");
  static_assert(STAGES >= indexer::kTileMinStages && STAGES <= indexer::kTileMaxStages, "stages");
  static constexpr indexer::ScorerLayout kL = indexer::tile_scorer_layout(H, STAGES);
  static constexpr int kDepth = indexer::kDepth;        // bytes per fp8 row (q head or key)
  static constexpr int kWgs = indexer::kScorerWarpgroups;
  static constexpr int kTokPerWg = indexer::kMmaColumns / H;  // N = 128 per consumer warpgroup
  static constexpr int kBlockQ = kL.block_q;            // tokens per CTA: kWgs x kTokPerWg
  static_assert(kBlockQ == kWgs * kTokPerWg, "tokens per CTA");
  static constexpr int kTileKeys = indexer::kTileKeys;  // M of the MMA
  static constexpr int kConsumerThreads = indexer::kScorerConsumerThreads;
  // Producer warpgroup and setmaxnreg split: layout.h. Only the producer's first warp works.
  static constexpr int kThreads = indexer::kScorerThreads;
  static constexpr int kProducerRegs = indexer::kScorerProducerRegs;
  static constexpr int kConsumerRegs = indexer::kScorerConsumerRegs;

  static constexpr unsigned kKTileBytes = kL.stage_bytes;  // 8 KiB
  static constexpr unsigned kOffK = kL.off_k;
  static constexpr unsigned kOffKScale = kL.off_kscale;
  static constexpr unsigned kOffW = kL.off_w;
  static constexpr int kWQuad = kL.w_quad;
  static constexpr int kWSlot = kL.w_slot;
  static constexpr unsigned kOffFullBar = kL.off_full_bar;
  static constexpr unsigned kOffEmptyBar = kL.off_empty_bar;
  static constexpr unsigned kSmemBytes = kL.smem_bytes;
};

// Four head weights of one thread, loaded with one 16-byte shared-memory access.
struct alignas(16) Quad {
  float x, y, z, w;
};

// One warpgroup's head reduction of token tt of its N = TOKENS x H columns: lanes of a quad hold
// the partial sums of key rows row_lo (lo) and row_lo + 8 (hi) over their H/4 heads (in-thread
// FFMA chains, heads in this order); the two-step reduce-scatter leaves lanes 0, 2 with row_lo's
// total and lanes 1, 3 with row_lo + 8's. The tile and the persistent scorer
// (scores_sm90_persistent.cuh) share it, so their scores are bit-identical.
template <int H, int TOKENS>
__device__ __forceinline__ float head_sum(const float (&acc)[64], const Quad (&wq)[TOKENS][H / 16], int tt, int odd) {
  float lo = 0.0f, hi = 0.0f;
#pragma unroll
  for (int m = 0; m < H / 16; ++m) {
    const Quad wv = wq[tt][m];
    const int i = tt * (H / 8) + 2 * m;
    lo = fmaf(fmaxf(acc[4 * i + 0], 0.0f), wv.x, lo);
    lo = fmaf(fmaxf(acc[4 * i + 1], 0.0f), wv.y, lo);
    hi = fmaf(fmaxf(acc[4 * i + 2], 0.0f), wv.x, hi);
    hi = fmaf(fmaxf(acc[4 * i + 3], 0.0f), wv.y, hi);
    lo = fmaf(fmaxf(acc[4 * i + 4], 0.0f), wv.z, lo);
    lo = fmaf(fmaxf(acc[4 * i + 5], 0.0f), wv.w, lo);
    hi = fmaf(fmaxf(acc[4 * i + 6], 0.0f), wv.z, hi);
    hi = fmaf(fmaxf(acc[4 * i + 7], 0.0f), wv.w, hi);
  }
  // Reduce-scatter over the quad: give away the row the partner keeps, keep the own one.
  float mine = odd ? hi : lo;
  mine += __shfl_xor_sync(0xffffffffu, odd ? lo : hi, 1);
  mine += __shfl_xor_sync(0xffffffffu, mine, 2);
  return mine;
}

template <int H, int PAGE_SHIFT, bool CAUSAL, int STAGES, bool PAGE_SCALES = false>
__device__ __forceinline__ void scores_sm90_tile(const MlaIndexerScoresArgs& a) {
  using C = ScoresSm90Tile<H, PAGE_SHIFT, CAUSAL, STAGES, PAGE_SCALES>;
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
  const float* const ks_sm = reinterpret_cast<const float*>(sbase + C::kOffKScale);
  const u32 full_bar = base + C::kOffFullBar;
  const u32 empty_bar = base + C::kOffEmptyBar;

  const int tid = threadIdx.x;
  const long long block_row0 = static_cast<long long>(blockIdx.x) * C::kBlockQ;  // within the chunk
  const long long split_lo = static_cast<long long>(blockIdx.y) * a.keys_per_split;

  indexer::load_token_slots<C::kBlockQ, CAUSAL>(a, block_row0, tid, s_seq, s_visible, s_valid);
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bar + 8 * s, 32);  // every producer lane arrives after its copies landed
      mbar_init(empty_bar + 8 * s, C::kConsumerThreads);  // every consumer thread arrives
    }
    mbar_init_fence();  // the cp.async arrivals come through the async unit
  }
  // Q tile of the block and the head weights (rows of invalid tokens are zero), by all threads.
  load_q_and_weights<C::kBlockQ, H, C::kWQuad>(a, block_row0, q_s, w_sm, tid, C::kThreads);
  cp_async_wait<0>();
  fence_proxy_async_smem();
  __syncthreads();

  // Segments: maximal runs of valid slots of one sequence. Every role walks the same list.
  const int warp = tid >> 5, lane = tid & 31;
  if (warp >= C::kConsumerThreads / 32) {
    // ---------------- producer warp: paged gathers of 64-key tiles ----------------
    sm90::setmaxnreg_dec<C::kProducerRegs>();
    if (warp != C::kConsumerThreads / 32) return;
    u32 issued = 0;
    for (int s0 = 0; s0 < C::kBlockQ;) {
      if (!s_valid[s0]) {
        ++s0;
        continue;
      }
      int s1 = s0 + 1;
      while (s1 < C::kBlockQ && s_valid[s1] && s_seq[s1] == s_seq[s0]) ++s1;
      const int b = s_seq[s0];
      long long seg_vis = 0;
      for (int s = s0; s < s1; ++s) seg_vis = s_visible[s] > seg_vis ? s_visible[s] : seg_vis;
      const long long kv_hi = split_lo + a.keys_per_split < seg_vis ? split_lo + a.keys_per_split : seg_vis;
      for (long long kv0 = split_lo; kv0 < kv_hi; kv0 += C::kTileKeys) {
        const u32 stage = issued % STAGES;
        mbar_wait(empty_bar + 8 * stage, ((issued / STAGES) & 1u) ^ 1u);
        const u32 kdst = k_s + stage * C::kKTileBytes;
        // Cache row of tile row r (-1: not visible or not mapped). Tiles start on multiples of 64
        // keys, so with pages of >= 64 keys a tile lies in one page: one table read per tile and
        // contiguous rows. The copy loops unroll by 4: fully unrolled they spilled 72 bytes at the
        // producer's register cap.
        const int tile_keys = static_cast<int>(kv_hi - kv0 < C::kTileKeys ? kv_hi - kv0 : C::kTileKeys);
        long long page_row = -1;
        if constexpr (PAGE_SHIFT >= 6) {
          page_row = indexer::key_row(a.lookup_table, a.pages_per_seq, a.num_blocks, a.block_row_stride,
                                      a.layer_row_offset, PAGE_SHIFT, b, kv0);
        }
        // Smaller pages: lane l reads the table entry of the tile's page l (and l + 32) once, and
        // every row takes its page's first row from that lane by a shuffle. Reading the table per
        // row (16 reads per lane per tile) made page 16 2.6x slower than page 64.
        constexpr int kPagesPerTile = PAGE_SHIFT >= 6 ? 1 : C::kTileKeys >> PAGE_SHIFT;
        long long prow0 = -1, prow1 = -1;
        if constexpr (PAGE_SHIFT < 6) {
          if (lane < kPagesPerTile && (lane << PAGE_SHIFT) < tile_keys)
            prow0 = indexer::key_row(a.lookup_table, a.pages_per_seq, a.num_blocks, a.block_row_stride,
                                     a.layer_row_offset, PAGE_SHIFT, b, kv0 + (lane << PAGE_SHIFT));
          if (kPagesPerTile > 32 && lane + 32 < kPagesPerTile && ((lane + 32) << PAGE_SHIFT) < tile_keys)
            prow1 = indexer::key_row(a.lookup_table, a.pages_per_seq, a.num_blocks, a.block_row_stride,
                                     a.layer_row_offset, PAGE_SHIFT, b, kv0 + ((lane + 32) << PAGE_SHIFT));
        }
        // Every lane of the warp calls it (shuffles), with its own r.
        auto tile_row = [&](int r) -> long long {
          long long row;
          if constexpr (PAGE_SHIFT >= 6) {
            row = page_row < 0 ? -1 : page_row + r;
          } else {
            const int pg = r >> PAGE_SHIFT;
            long long pr = __shfl_sync(0xffffffffu, prow0, pg & 31);
            if constexpr (kPagesPerTile > 32) {
              const long long pr1 = __shfl_sync(0xffffffffu, prow1, pg & 31);
              pr = pg >= 32 ? pr1 : pr;
            }
            row = pr < 0 ? -1 : pr + (r & ((1 << PAGE_SHIFT) - 1));
          }
          return r < tile_keys ? row : -1;
        };
        // Keys: lane = 8 x (row of 4) + 16-byte chunk, so one warp instruction copies 4 whole
        // 128-byte rows (4 coalesced lines). One row per lane and 8 chunks each would make every
        // instruction touch 32 lines 16 bytes at a time.
        const int chunk = lane & 7;
        if constexpr (PAGE_SHIFT >= 6) {
          const u8* tile_src = a.k_blocks + (page_row < 0 ? 0 : page_row) * C::kDepth + chunk * 16;
          const bool mapped = page_row >= 0;
#pragma unroll 4
          for (int it = 0; it < C::kTileKeys / 4; ++it) {
            const int r = 4 * it + (lane >> 3);
            const bool ok = mapped && r < tile_keys;
            cp_async_16(kdst + r * 128 + ((chunk ^ (r & 7)) << 4), ok ? tile_src + r * C::kDepth : a.k_blocks,
                        ok ? 16u : 0u);
          }
        } else {
#pragma unroll 4
          for (int it = 0; it < C::kTileKeys / 4; ++it) {
            const int r = 4 * it + (lane >> 3);
            const long long row = tile_row(r);
            const u8* src = row >= 0 ? a.k_blocks + row * C::kDepth + chunk * 16 : a.k_blocks;
            cp_async_16(kdst + r * 128 + ((chunk ^ (r & 7)) << 4), src, row >= 0 ? 16u : 0u);
          }
        }
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const int r = lane + 32 * rr;
          const long long row = tile_row(r);
          const float* ssrc =
              row >= 0 ? a.k_scales + indexer::scale_index<PAGE_SCALES, PAGE_SHIFT>(row, a.scale_row_stride)
                       : a.k_scales;
          cp_async_4(ks_s + stage * (C::kTileKeys * 4) + r * 4, ssrc, row >= 0 ? 4u : 0u);
        }
        // The tile's full barrier completes when the last lane's copies have landed: each lane's
        // arrival is triggered by the completion of its own cp.asyncs, so a tile is published as
        // soon as its data is in shared memory. (Publishing tile t after issuing tile
        // t + STAGES - 2 and a cp.async.wait_group, i.e. when the slowest warpgroup released tile
        // t - 2, would leave the consumers the same 2-tile lead at every ring depth.) The
        // async-proxy fence the wgmma reads need is on the consumers' side, after their acquire.
        mbar_arrive_cp_async(full_bar + 8 * stage);
        ++issued;
      }
      s0 = s1;
    }
    // Leave with no copy in flight (the CTA's shared memory must outlive them).
    cp_async_commit();
    cp_async_wait<0>();
    return;
  }

  // ---------------- consumer warpgroups: MMA + head reduction + stores ----------------
  // Per tile: issue the N = 128 MMA, wait for it, release the K tile, reduce and store. No software
  // pipelining inside a warpgroup (a second accumulator set would not fit 112 registers); the
  // overlap comes from the other three warpgroups.
  sm90::setmaxnreg_inc<C::kConsumerRegs>();
  const int wg = tid >> 7;
  const int warp_in_wg = warp & 3;
  const int quad = lane & 3;
  const int row_lo = warp_in_wg * 16 + (lane >> 2);  // key rows row_lo and row_lo + 8 of the tile
  const u64 desc_b = sw128_kmajor_desc(q_s + wg * (C::kTokPerWg * H * 128));
  float acc[64];
  // The head weights this thread needs (32 floats for every H: kTokPerWg tokens x H/4 heads) stay
  // in registers for the CTA's life. Read from shared memory per tile they were 64 KiB of LDS per
  // 64-key tile, 2/3 of the MMAs' own operand traffic, on the same shared-memory bandwidth.
  Quad wq[C::kTokPerWg][H / 16];
#pragma unroll
  for (int tt = 0; tt < C::kTokPerWg; ++tt) {
    const Quad* w = reinterpret_cast<const Quad*>(w_sm + (wg * C::kTokPerWg + tt) * C::kWSlot + quad * C::kWQuad);
#pragma unroll
    for (int m = 0; m < H / 16; ++m) wq[tt][m] = w[m];
  }

  // A tile of the walk: its segment [s0, s1) of token slots and its first key.
  struct Tile {
    int s0, s1;
    long long kv0, kv_hi;
    // Keys below this are visible to every token of this warpgroup (0 when one of them is not in
    // the segment): tiles below it store without per-token checks.
    long long wg_all_visible;
    u32 stage;
    float ks;  // scale of this thread's key row (row_lo or row_lo + 8, by quad parity)
  };
  // Next segment (starting at slot `from`) and its key range in this split; false when none is left.
  auto next_segment = [&](int from, Tile& t) -> bool {
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
        t.s0 = s0;
        t.s1 = s1;
        t.kv0 = split_lo;
        t.kv_hi = kv_hi;
        long long all_vis = kv_hi;
        for (int tt = 0; tt < C::kTokPerWg; ++tt) {
          const int slot = wg * C::kTokPerWg + tt;
          const long long v = slot >= s0 && slot < s1 ? s_visible[slot] : 0;
          all_vis = v < all_vis ? v : all_vis;
        }
        t.wg_all_visible = all_vis;
        return true;
      }
      s0 = s1;
    }
    return false;
  };
  // Reduces the warpgroup's N = 128 accumulators over heads and stores the scores of its tokens
  // that belong to the tile's segment. Lanes of a quad hold the partial sums of key rows row_lo
  // (lo) and row_lo + 8 (hi); a two-step reduce-scatter leaves lanes 0, 2 with row_lo's total and
  // lanes 1, 3 with row_lo + 8's, and lanes 0 and 1 store. Tiles below the warpgroup's common
  // visible prefix skip the per-token checks: the per-tile overhead (pointer math, visibility
  // checks, divergent stores) would be ~1/2 of the epilogue's instructions, and the kernel is
  // issue-bound.
  const int odd = quad & 1;
  float* const out_wg = a.scores + (block_row0 + wg * C::kTokPerWg) * a.score_row_stride + row_lo + 8 * odd;
  auto epilogue = [&](const Tile& tl) {
    float* const out_tile = out_wg + tl.kv0;
    const bool all_visible = tl.kv0 + C::kTileKeys <= tl.wg_all_visible;
#pragma unroll
    for (int tt = 0; tt < C::kTokPerWg; ++tt) {
      const float mine = head_sum<H, C::kTokPerWg>(acc, wq, tt, odd);
      bool store = quad < 2;
      if (!all_visible) {
        const int slot = wg * C::kTokPerWg + tt;
        const long long j = tl.kv0 + row_lo + 8 * odd;
        store = store && slot >= tl.s0 && slot < tl.s1 && j < s_visible[slot];
      }
      if (store) out_tile[tt * a.score_row_stride] = mine * tl.ks;
    }
  };

  Tile cur;
  bool have = next_segment(0, cur);
  u32 consumed = 0;
  while (have) {
    cur.stage = consumed % STAGES;
    mbar_wait(full_bar + 8 * cur.stage, (consumed / STAGES) & 1u);
    // cp.async wrote the tile through the generic proxy; the wgmma reads it through the async one.
    fence_proxy_async_smem();
    cur.ks = ks_sm[cur.stage * C::kTileKeys + row_lo + 8 * odd];
    const u64 desc_a = sw128_kmajor_desc(k_s + cur.stage * C::kKTileBytes);
    fence_operands(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_m64n128k32_e4m3(acc, desc_a + 2 * kk, desc_b + 2 * kk, kk > 0 ? 1u : 0u);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(acc);
    // Every consumer thread releases the slot itself (the barrier counts all of them): its own
    // reads of the tile's scales then precede the producer's overwrite through one
    // release/acquire pair (compute-sanitizer racecheck composes nothing else).
    mbar_arrive(empty_bar + 8 * cur.stage);
    epilogue(cur);
    ++consumed;
    if (cur.kv0 + C::kTileKeys < cur.kv_hi) {
      cur.kv0 += C::kTileKeys;
    } else {
      have = next_segment(cur.s1, cur);
    }
  }
}

}  // namespace indexer_sm90
}  // namespace mj

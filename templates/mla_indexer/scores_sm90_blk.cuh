#pragma once
// Indexer scores on Hopper (sm_90a), v10: 256-key blocks split across the warpgroups
// (`params.block_kv = 256`; block_kv 0 / 64 run v8, mla_indexer/scores_sm90.cuh).
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
// Producer: one warp gathers each block's four 64-key quarters with cp.async (v8's copy pattern:
// 4 whole 128-byte rows per warp instruction, 128-byte swizzle, one table read per page of
// >= 64 keys, per-page lane lookups for smaller pages) and publishes the block with
// cp.async.mbarrier.arrive.noinc (full barrier count 32), as v8 publishes a tile. Quarters that
// lie wholly past the segment's last visible key are not copied: their warpgroup still runs its
// MMA on whatever the slot holds (a wgmma under a data-dependent branch is serialized by ptxas,
// C7520) but stores nothing.
//
// Grid: x = blocks of 128/H tokens of the chunk, y = splits of the key range (keys_per_split, a
// multiple of 256). Tokens of one CTA that belong to different sequences are walked as separate
// segments over their own keys, as in v8.
#include "common/types.cuh"
#include "mla_indexer/common.cuh"
#include "mla_indexer/scores_sm90.cuh"
#include "mla_indexer/sm90_primitives.cuh"

namespace mj {
namespace indexer_sm90 {

template <int H, int PAGE_SHIFT, bool CAUSAL, int STAGES>
struct ScoresSm90Blk {
  static_assert(H == 32 || H == 64 || H == 128, "heads");
  // 16 KiB of Q + STAGES x 33 KiB must fit the 227 KiB of a CTA.
  static_assert(STAGES >= 2 && STAGES <= 6, "stages");
  // Page 1 (256 table entries per block, 8 per producer lane) spilled in the producer's 32
  // registers; the host runs v8 for it (plan.hpp).
  static_assert(PAGE_SHIFT >= 1, "page size >= 2");
  static constexpr int kDepth = 128;              // bytes per fp8 row (q head or key)
  static constexpr int kWgs = 4;                  // consumer warpgroups
  static constexpr int kBlockQ = 128 / H;         // tokens per CTA: N = 128
  static constexpr int kQuarterKeys = 64;         // M of the MMA: one warpgroup's keys of a block
  static constexpr int kBlockKeys = kWgs * kQuarterKeys;  // keys per ring stage
  static constexpr int kConsumerThreads = 128 * kWgs;
  // Producer warpgroup + setmaxnreg split: as v8 (ScoresSm90 says why).
  static constexpr int kThreads = kConsumerThreads + 128;
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

  const int tid = threadIdx.x;
  const long long block_row0 = static_cast<long long>(blockIdx.x) * C::kBlockQ;  // within the chunk
  const long long split_lo = static_cast<long long>(blockIdx.y) * a.keys_per_split;

  if (tid < C::kBlockQ) {
    const long long r = block_row0 + tid;
    indexer::TokenInfo ti;
    ti.valid = false;
    if (r < a.chunk_rows && a.chunk_row_begin + r < a.num_tokens)
      ti = indexer::token_info(a.input_row_offsets, a.cache_lengths, a.batch, a.chunk_row_begin + r, a.max_keys,
                               CAUSAL);
    s_valid[tid] = ti.valid ? 1 : 0;
    s_seq[tid] = ti.seq;
    s_visible[tid] = ti.visible;
  }
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bar + 8 * s, 32);                    // every producer lane arrives after its copies landed
      mbar_init(empty_bar + 8 * s, C::kConsumerThreads);  // every consumer thread arrives
    }
    mbar_init_fence();  // the cp.async arrivals come through the async unit
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
    // ---------------- producer warp: paged gathers of 256-key blocks ----------------
    sm90::setmaxnreg_dec<C::kProducerRegs>();
    if (warp != C::kConsumerThreads / 32) return;
    u32 stage = 0, phase = 0;
    int s0 = 0, s1 = 0;
    long long kv_hi = 0;
    for (bool have = next_segment(0, s0, s1, kv_hi); have; have = next_segment(s1, s0, s1, kv_hi)) {
      const int b = s_seq[s0];
      for (long long kv0 = split_lo; kv0 < kv_hi; kv0 += C::kBlockKeys) {
        mbar_wait(empty_bar + 8 * stage, phase ^ 1u);
        // Keys of the block this segment sees (rows past it are zero-filled or not copied).
        const int block_keys = static_cast<int>(kv_hi - kv0 < C::kBlockKeys ? kv_hi - kv0 : C::kBlockKeys);
        // Table reads first, all of the block's at once (one dependent latency per block, not per
        // quarter). Pages of >= 64 keys: lane q < 4 reads quarter q's page, and a quarter's rows are
        // contiguous. Smaller pages: lane l reads pages l + 32 e of the block, and every row takes its
        // page's block from that lane by a shuffle (per-row table reads were 2.6x slower at page 16
        // in v5).
        constexpr int kPagesPerBlock = PAGE_SHIFT >= 6 ? 4 : C::kBlockKeys >> PAGE_SHIFT;
        constexpr int kEntries = (kPagesPerBlock + 31) / 32;  // table entries per lane
        constexpr int kSmallShift = PAGE_SHIFT < 6 ? PAGE_SHIFT : 0;
        long long page_row = -1;  // pages >= 64: lane q < 4 holds quarter q's first cache row
        u32 blk[kEntries];        // pages < 64: lane l holds the block of page l + 32 e (kNoBlock: none)
        constexpr u32 kNoBlock = 0xffffffffu;
#pragma unroll
        for (int e = 0; e < kEntries; ++e) blk[e] = kNoBlock;
        if constexpr (PAGE_SHIFT >= 6) {
          if (lane < 4 && lane * C::kQuarterKeys < block_keys)
            page_row = indexer::key_row(a.lookup_table, a.pages_per_seq, a.num_blocks, a.block_row_stride,
                                        a.layer_row_offset, PAGE_SHIFT, b, kv0 + lane * C::kQuarterKeys);
        } else {
          // Block ids, not rows: 32-bit entries keep the producer within its 32 registers at page 1
          // (8 entries per lane; 64-bit rows spilled). A block id of 2^32 - 1 would read as unmapped.
#pragma unroll
          for (int e = 0; e < kEntries; ++e) {
            const int pg = lane + 32 * e;
            const long long page = (kv0 >> kSmallShift) + pg;  // kv0 is a multiple of the page size
            if (pg < kPagesPerBlock && (pg << kSmallShift) < block_keys && page < a.pages_per_seq) {
              const u32 v = a.lookup_table[static_cast<long long>(b) * a.pages_per_seq + page];
              if (v < a.num_blocks) blk[e] = v;
            }
          }
        }
        // Cache row of block row r for pages < 64 (< 0: not visible or not mapped); every lane calls
        // it (shuffles).
        auto small_page_row = [&](int r) -> long long {
          const int pg = r >> kSmallShift;
          u32 v = __shfl_sync(0xffffffffu, blk[0], pg & 31);
#pragma unroll
          for (int e = 1; e < kEntries; ++e) {
            const u32 ve = __shfl_sync(0xffffffffu, blk[e], pg & 31);
            v = (pg >> 5) == e ? ve : v;
          }
          const long long row =
              v == kNoBlock ? -1 : v * a.block_row_stride + a.layer_row_offset + (r & ((1 << kSmallShift) - 1));
          return r < block_keys ? row : -1;
        };
        const u32 kdst_block = k_s + stage * C::kStageBytes;
        const u32 sdst_block = ks_s + stage * (C::kBlockKeys * 4);
        const int chunk = lane & 7;
#pragma unroll 1
        for (int qtr = 0; qtr < C::kWgs; ++qtr) {
          const int r0 = qtr * C::kQuarterKeys;  // first block row of the quarter
          if (r0 >= block_keys) break;          // the rest of the block is past the segment's keys
          const u32 kdst = kdst_block + qtr * C::kQuarterBytes;
          // Keys: lane = 8 x (row of 4) + 16-byte chunk, so one warp instruction copies 4 whole
          // 128-byte rows (v8's pattern); the unroll by 4 keeps the producer within 32 registers.
          if constexpr (PAGE_SHIFT >= 6) {
            const long long row0 = __shfl_sync(0xffffffffu, page_row, qtr);
            const int quarter_keys = block_keys - r0;  // rows r < quarter_keys are visible
            const bool mapped = row0 >= 0;
            const u8* src = a.k_blocks + (mapped ? row0 : 0) * C::kDepth + chunk * 16;
#pragma unroll 4
            for (int it = 0; it < C::kQuarterKeys / 4; ++it) {
              const int r = 4 * it + (lane >> 3);
              const bool ok = mapped && r < quarter_keys;
              cp_async_16(kdst + r * 128 + ((chunk ^ (r & 7)) << 4), ok ? src + r * C::kDepth : a.k_blocks,
                          ok ? 16u : 0u);
            }
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
              const int r = lane + 32 * rr;
              const bool ok = mapped && r < quarter_keys;
              const float* ssrc = ok ? a.k_scales + (row0 + r) * a.scale_row_stride : a.k_scales;
              cp_async_4(sdst_block + (r0 + r) * 4, ssrc, ok ? 4u : 0u);
            }
          } else {
#pragma unroll 4
            for (int it = 0; it < C::kQuarterKeys / 4; ++it) {
              const int r = 4 * it + (lane >> 3);
              const long long row = small_page_row(r0 + r);
              const u8* src = row >= 0 ? a.k_blocks + row * C::kDepth + chunk * 16 : a.k_blocks;
              cp_async_16(kdst + r * 128 + ((chunk ^ (r & 7)) << 4), src, row >= 0 ? 16u : 0u);
            }
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
              const int r = r0 + lane + 32 * rr;
              const long long row = small_page_row(r);
              const float* ssrc = row >= 0 ? a.k_scales + row * a.scale_row_stride : a.k_scales;
              cp_async_4(sdst_block + r * 4, ssrc, row >= 0 ? 4u : 0u);
            }
          }
        }
        // Published when the last lane's copies have landed (v8's protocol); the consumers fence the
        // async proxy after their acquire.
        mbar_arrive_cp_async(full_bar + 8 * stage);
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
  for (int c = tid; c < C::kBlockQ * H * 8; c += C::kConsumerThreads) {
    const int row = c >> 3, chunk = c & 7;
    const long long t = a.chunk_row_begin + block_row0 + row / H;
    const bool ok = block_row0 + row / H < a.chunk_rows && t < a.num_tokens;
    const u8* src = ok ? a.q + (t * H + row % H) * C::kDepth + chunk * 16 : a.q;
    cp_async_16(q_s + row * 128 + ((chunk ^ (row & 7)) << 4), src, ok ? 16u : 0u);
  }
  cp_async_commit();
  // Weights per slot as [quad][ii][2]: the H/4 weights one thread of a quad needs (heads
  // 8 * ii + 2 * quad + {0, 1}) are contiguous, read with 16-byte loads.
  for (int n = tid; n < C::kBlockQ * H; n += C::kConsumerThreads) {
    const int slot = n / H, h = n % H;
    const long long t = a.chunk_row_begin + block_row0 + slot;
    const bool ok = block_row0 + slot < a.chunk_rows && t < a.num_tokens;
    const int ii = h >> 3, quad = (h >> 1) & 3, e = h & 1;
    w_sm[slot * C::kWSlot + quad * C::kWQuad + ii * 2 + e] = ok ? a.qs[t * H + h] : 0.0f;
  }
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
    // cp.async wrote the block through the generic proxy; the wgmma reads it through the async one.
    fence_proxy_async_smem();
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

  // The segment's slots [s0, s1) as one register: bits 0-7 = mask of the slots, bits 8-15 = s1
  // (where the next segment's search starts). Two registers for s0 / s1 spilled.
  u32 seg = 0;
  for (;;) {
    long long seg_hi = 0;
    {
      int s0 = 0, s1 = 0;
      if (!next_segment(static_cast<int>(seg >> 8), s0, s1, seg_hi)) break;
      seg = (static_cast<u32>(s1) << 8) | (((1u << s1) - 1u) & ~((1u << s0) - 1u));
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
    // count. A quarter wholly past the segment's keys was not copied and stores nothing.
    for (; kv0 < kv_hi; kv0 += C::kBlockKeys) {
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

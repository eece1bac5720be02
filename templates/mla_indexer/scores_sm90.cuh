#pragma once
// Indexer scores on Hopper (sm_90a): fp8 wgmma over the paged K cache.
//
// For one query token the scores are a GEMM over heads and keys followed by a reduction over
// heads: S[h, j] = q[h,:] . k[j,:], score[j] = k_scale[j] * sum_h relu(S[h, j]) * qs[h]. Keys
// are the M side of the MMA (64 rows, the A operand), query heads of several tokens the N side
// (the B operand, 256 = tokens_per_warpgroup * H columns), K = 128 = depth. The accumulator
// fragment gives each thread 2 key rows and, per token, H/4 head columns, so the head reduction
// is in-thread FMAs plus two shuffles inside a quad.
//
// CTA = 2 consumer warpgroups (each owns kTokPerWg query tokens; both read the same K tile) and
// one producer warp that gathers 64-key tiles page by page with cp.async into a ring of STAGES
// swizzled buffers (mbarrier full/empty handshake). Each warpgroup splits its N = 256 into two
// N = 128 MMAs so that the epilogue of the first half overlaps the second half's MMA.
//
// Grid: x = query blocks of kBlockQ tokens of the chunk, y = splits of the key range
// (keys_per_split keys each). Tokens of one block that belong to different sequences (ragged
// batch, decode) are processed as separate segments over their own keys.
#include "common/types.cuh"
#include "mla_indexer/common.cuh"
#include "mla_indexer/sm90_primitives.cuh"

namespace mj {
namespace indexer_sm90 {

template <int H, int PAGE_SHIFT, bool CAUSAL, int STAGES>
struct ScoresSm90 {
  static_assert(H == 32 || H == 64 || H == 128, "heads");
  static_assert(STAGES >= 2 && STAGES <= 8, "stages");
  static constexpr int kDepth = 128;                 // bytes per fp8 row (q head or key)
  static constexpr int kTokPerWg = 256 / H;          // N = 256 per consumer warpgroup
  static constexpr int kTokPerHalf = 128 / H;        // N = 128 per MMA
  static constexpr int kBlockQ = 2 * kTokPerWg;      // tokens per CTA
  static constexpr int kTileKeys = 64;               // M of the MMA
  static constexpr int kConsumerThreads = 256;
  static constexpr int kThreads = kConsumerThreads + 32;
  // Tiles the producer keeps in flight before it signals the oldest one (must be < STAGES).
  static constexpr int kLag = STAGES > 2 ? STAGES - 2 : 1;

  static constexpr unsigned kQBytes = kBlockQ * H * kDepth;          // 64 KiB
  static constexpr unsigned kKTileBytes = kTileKeys * kDepth;        // 8 KiB
  static constexpr unsigned kOffK = kQBytes;
  static constexpr unsigned kOffKScale = kOffK + STAGES * kKTileBytes;
  static constexpr unsigned kOffW = kOffKScale + STAGES * kTileKeys * 4;
  // Weights per slot: 4 quads x (H/4 + 4) floats; the 4-float pad puts the 4 quads' 16-byte
  // loads in different banks.
  static constexpr int kWQuad = H / 4 + 4;
  static constexpr int kWSlot = 4 * kWQuad;
  static constexpr unsigned kOffBar = kOffW + kBlockQ * kWSlot * 4;
  static constexpr unsigned kBytesUsed = kOffBar + 2 * STAGES * 8;
  static constexpr unsigned kSmemBytes = kBytesUsed + 1024;  // slack to align the base to 1024
};

// Four head weights of one thread, loaded with one 16-byte shared-memory access.
struct alignas(16) Quad {
  float x, y, z, w;
};

template <int H, int PAGE_SHIFT, bool CAUSAL, int STAGES>
__device__ __forceinline__ void scores_sm90(const MlaIndexerScoresArgs& a) {
  using C = ScoresSm90<H, PAGE_SHIFT, CAUSAL, STAGES>;
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
      mbar_init(full_bar + 8 * s, 32);  // every producer lane arrives after its copies landed
      mbar_init(empty_bar + 8 * s, C::kConsumerThreads);  // every consumer thread arrives
    }
  }
  // Q tile of the block (swizzled rows of 128 bytes; rows of invalid tokens are zero) and the
  // head weights.
  for (int c = tid; c < C::kBlockQ * H * 8; c += C::kThreads) {
    const int row = c >> 3, chunk = c & 7;
    const long long t = a.chunk_row_begin + block_row0 + row / H;
    const bool ok = block_row0 + row / H < a.chunk_rows && t < a.num_tokens;
    const u8* src = ok ? a.q + (t * H + row % H) * C::kDepth + chunk * 16 : a.q;
    cp_async_16(q_s + row * 128 + ((chunk ^ (row & 7)) << 4), src, ok ? 16u : 0u);
  }
  cp_async_commit();
  // Weights are stored per slot as [quad][ii][2]: the H/4 weights one thread of a quad needs
  // (heads 8 * ii + 2 * quad + {0, 1}) are contiguous, read with 16-byte loads in the epilogue.
  for (int n = tid; n < C::kBlockQ * H; n += C::kThreads) {
    const int slot = n / H, h = n % H;
    const long long t = a.chunk_row_begin + block_row0 + slot;
    const bool ok = block_row0 + slot < a.chunk_rows && t < a.num_tokens;
    const int ii = h >> 3, quad = (h >> 1) & 3, e = h & 1;
    w_sm[slot * C::kWSlot + quad * C::kWQuad + ii * 2 + e] = ok ? a.qs[t * H + h] : 0.0f;
  }
  cp_async_wait<0>();
  fence_proxy_async_smem();
  __syncthreads();

  // Segments: maximal runs of valid slots of one sequence. Every role walks the same list.
  const int warp = tid >> 5, lane = tid & 31;
  if (warp == C::kConsumerThreads / 32) {
    // ---------------- producer warp: paged gathers of 64-key tiles ----------------
    u32 issued = 0, signaled = 0;
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
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const int r = lane + 32 * rr;
          const long long j = kv0 + r;
          const long long row = j < kv_hi ? indexer::key_row(a.lookup_table, a.pages_per_seq, a.num_blocks,
                                                             a.block_row_stride, a.layer_row_offset, PAGE_SHIFT, b, j)
                                          : -1;
          const u8* src = row >= 0 ? a.k_blocks + row * C::kDepth : a.k_blocks;
          const u32 bytes = row >= 0 ? 16u : 0u;
#pragma unroll
          for (int c = 0; c < 8; ++c)
            cp_async_16(kdst + r * 128 + ((c ^ (r & 7)) << 4), src + (row >= 0 ? c * 16 : 0), bytes);
          const float* ssrc = row >= 0 ? a.k_scales + row * a.scale_row_stride : a.k_scales;
          cp_async_4(ks_s + stage * (C::kTileKeys * 4) + r * 4, ssrc, row >= 0 ? 4u : 0u);
        }
        cp_async_commit();
        ++issued;
        if (issued - signaled > static_cast<u32>(C::kLag)) {
          cp_async_wait<C::kLag>();
          fence_proxy_async_smem();
          mbar_arrive(full_bar + 8 * (signaled % STAGES));
          ++signaled;
        }
      }
      s0 = s1;
    }
    cp_async_wait<0>();
    fence_proxy_async_smem();
    while (signaled < issued) {
      mbar_arrive(full_bar + 8 * (signaled % STAGES));
      ++signaled;
    }
    return;
  }

  // ---------------- consumer warpgroups: MMA + head reduction + stores ----------------
  // Per tile: issue both N = 128 halves, reduce half 0 while half 1 runs, release the K tile,
  // reduce half 1 (the other warpgroup's MMAs fill the tensor cores meanwhile). Measured on H200:
  // a deeper software pipeline across tiles (next tile's half 0 issued before this tile's half 1
  // is reduced) was 17% slower.
  const int wg = tid >> 7;
  const int warp_in_wg = warp & 3;
  const int quad = lane & 3;
  const int row_lo = warp_in_wg * 16 + (lane >> 2);  // key rows row_lo and row_lo + 8 of the tile
  const u32 q_wg = q_s + wg * (C::kTokPerWg * H * 128);
  const u64 desc_b0 = sw128_kmajor_desc(q_wg);
  const u64 desc_b1 = sw128_kmajor_desc(q_wg + 128 * 128);
  float acc0[64], acc1[64];

  // A tile of the walk: its segment [s0, s1) of token slots and its first key.
  struct Tile {
    int s0, s1;
    long long kv0, kv_hi;
    u32 stage;
    float ks_lo, ks_hi;
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
        return true;
      }
      s0 = s1;
    }
    return false;
  };
  // Reduces one N = 128 half over heads and stores the scores of its tokens that belong to the
  // tile's segment.
  auto epilogue = [&](const float (&acc)[64], int half, const Tile& tl) {
#pragma unroll
    for (int tt = 0; tt < C::kTokPerHalf; ++tt) {
      const int slot = wg * C::kTokPerWg + half * C::kTokPerHalf + tt;
      const Quad* w = reinterpret_cast<const Quad*>(w_sm + slot * C::kWSlot + quad * C::kWQuad);
      // One 16-byte load brings the weights of two column pairs. (Measured: more FMA chains,
      // or 8-byte weight loads, change nothing; the MMA side is the bound.)
      float lo = 0.0f, hi = 0.0f;
#pragma unroll
      for (int m = 0; m < H / 16; ++m) {
        const Quad wv = w[m];
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
      lo += __shfl_xor_sync(0xffffffffu, lo, 1);
      hi += __shfl_xor_sync(0xffffffffu, hi, 1);
      lo += __shfl_xor_sync(0xffffffffu, lo, 2);
      hi += __shfl_xor_sync(0xffffffffu, hi, 2);
      if (slot >= tl.s0 && slot < tl.s1) {
        // Lanes of a quad hold equal sums; two of them store (which two rotates with tt).
        const int which = quad - ((2 * tt) & 3);
        if (which == 0 || which == 1) {
          const long long j = tl.kv0 + row_lo + 8 * which;
          if (j < s_visible[slot]) {
            const float v = which == 0 ? lo * tl.ks_lo : hi * tl.ks_hi;
            a.scores[(block_row0 + slot) * a.score_row_stride + j] = v;
          }
        }
      }
    }
  };

  Tile cur;
  bool have = next_segment(0, cur);
  u32 consumed = 0;
  while (have) {
    cur.stage = consumed % STAGES;
    mbar_wait(full_bar + 8 * cur.stage, (consumed / STAGES) & 1u);
    cur.ks_lo = ks_sm[cur.stage * C::kTileKeys + row_lo];
    cur.ks_hi = ks_sm[cur.stage * C::kTileKeys + row_lo + 8];
    const u64 desc_a = sw128_kmajor_desc(k_s + cur.stage * C::kKTileBytes);
    fence_operands(acc0);
    fence_operands(acc1);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_m64n128k32_e4m3(acc0, desc_a + 2 * kk, desc_b0 + 2 * kk, kk > 0 ? 1u : 0u);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_m64n128k32_e4m3(acc1, desc_a + 2 * kk, desc_b1 + 2 * kk, kk > 0 ? 1u : 0u);
    wgmma_commit();
    wgmma_wait<1>();
    fence_operands(acc0);
    epilogue(acc0, 0, cur);
    wgmma_wait<0>();
    fence_operands(acc1);
    // Every consumer thread releases the slot itself (the barrier counts all 256): its own reads
    // of the tile's scales then precede the producer's overwrite through one release/acquire
    // pair. The former "__syncwarp, lane 0 arrives" was ordered as well (bar.warp.sync orders
    // the lanes' reads before lane 0's release), but compute-sanitizer racecheck does not compose
    // the two and reported every ks_sm slot reuse as a WAR hazard; this form is clean under it at
    // the same speed (H100: 6.25 vs 6.26 ms scores, H 64, 61440 cached keys).
    mbar_arrive(empty_bar + 8 * cur.stage);
    epilogue(acc1, 1, cur);
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

#pragma once
// FP8-math variant of the Hopper sparse prefill (params qk_math fp8 -> Config<..., FP8_MATH = true>).
// Built on the 16-bit kernel's pieces (sm90_config.cuh: Config, Smem, Lane; sm90_producer.cuh: row
// resolution; sm90_consumer.cuh: the epilogue; sm90_persistent.cuh: the CTA's item); sm90.cuh's run()
// dispatches to run_fp8math for Config<..., FP8_MATH = true>.
//
// ---- What changes against the 16-bit kernel -------------------------------------------------------
// Numerics (opt-in, off by default; accuracy against the f64 reference in docs/SPEC.md):
//   - Q is quantised per (token, head) to e4m3 with scale sq = amax|q| / 448 (round to nearest,
//     saturating); K stays the cache's e4m3 bytes. S = sm_scale * sq * sk * (q8 . k8) in f32, sk the
//     key's per-row scale (1 for unit scales).
//   - P V on e4m3 too: the probabilities are encoded as 256 * exp2(S'' - m) in e4m3, where
//     S'' = S * log2(e) + log2(sk) folds the key's scale into P (so V stays its raw e4m3 bytes) and m
//     is the running max of S''. The row sum adds exp2(S'' - m) * 2^-log2(sk) = exp2(S log2 e - m),
//     so l, the sink and the lse keep their exact meaning. log2(sk) is clamped at -64 (zero scales).
//   - Accumulation in f32 throughout; the output is multiplied by 1/256 at the end.
//   Input range (what kv_cache_store writes satisfies it): key scales finite and either 0 or in
//   [2^-64, 2^64) (P carries log2(sk) clamped at -64; a smaller or negative scale would weight its
//   V wrongly; a zero scale with zero bytes, what the store writes for an all-zero row, is exact).
//   Query rows of any finite magnitude (tiny rows use a capped multiplier, see load_q_fp8).
//   Not checked on the device.
// Data movement:
//   - The producer copies raw e4m3 rows by cp.async (16 B, zero-fill for invalid slots) into
//     64-byte-swizzled tiles (9 tiles of 64 keys x 64 dims per block, 36 KB instead of 72 KB of
//     f16): no registers, no decode, the bf16 producer's schedule.
//   - e4m3 wgmma needs both operands K-major, so P V (K = keys) needs V^T. Each consumer warpgroup
//     transposes the V dims it multiplies (WG0 dims 0..255, WG1 256..511) of both blocks of a step
//     into its own V^T slots (ldmatrix.trans + 4 byte permutes + stmatrix per 16 keys x 32 dims),
//     overlapped with its wgmma. Inside each 16-dim group the even dims take rows 0-7 and the odd
//     dims rows 8-15 (conflict-free stmatrix); the epilogue undoes that column order. Keys inside
//     a 16-key group are stored in the order in which the accumulator fragment of S already holds
//     them as the e4m3 A fragment (see kKeyOrder below), so P goes from the score registers to the
//     P V operand without shuffles.
//   - A K stage half is released once its Q K^T and its transposition are done (not after P V), and
//     the per-key arrays are double-buffered by step parity so the producer may run ahead.
// Schedule: the 16-bit kernel's (WG0 even blocks, WG1 odd blocks, running max exchanged, each
// warpgroup P V over both blocks for its 256 output dims), except that WG1 issues its next Q K^T
// behind its last P V of a step, as WG0 does (+3-4% measured). Publishing each max before
// exponentiating (instead of after packing P) measured 2-4% slower, here and in the 16-bit kernel.
// Accumulation: Hopper's e4m3 wgmma keeps fewer than f32's bits in long accumulation chains (K 576
// here, no promotion to CUDA-core f32 as DeepGEMM does every 128), part of the mode's lse error.
// Shared memory (sparse_prefill/layout.h, hopper_layout(fp8_math = true)): misc | Q e4m3 (36 KB) | K stage 0 / 1 (36 KB each) | V^T WG0 / WG1
// (32 KB each: slot b holds 256 dims x 64 keys of stage b) | P0 | P1 (4 KB each). The epilogue stages
// the bf16 output in the V^T region (64 KB).
//
// kKeyOrder: byte position pc = 16 u + 4 t + i (u = 16-key group, t = 0..3, i = 0..3) of a V^T row
// or a P row holds key 16 u + 2 t + (i & 1) + 8 (i >> 1). The S accumulator gives lane tig the keys
// 8 j + 2 tig + {0, 1}; the e4m3 A fragment of k-slice kk wants positions 32 kk + 16 h + 4 tig + {0..3}
// in register (h, row): with u = 2 kk + h those are the keys 16 u + 2 tig + {0, 1, 8, 9}, i.e. score
// registers 8 u + {0, 1, 4, 5} (row r0) and 8 u + {2, 3, 6, 7} (row r1). ldmatrix.trans of two 8-key
// matrices yields exactly this order for V^T (transpose_v).

#include "sparse_prefill/sm90_config.cuh"
#include "sparse_prefill/sm90_producer.cuh"
#include "sparse_prefill/sm90_consumer.cuh"
#include "sparse_prefill/sm90_persistent.cuh"

namespace mj {
namespace sparse_prefill_sm90 {

using sparse_prefill_layout::kF8TileBytes;   // 64 rows x 64 e4m3, 64-byte swizzle
using sparse_prefill_layout::kF8BlockBytes;  // one 64-key block, also Q
using sparse_prefill_layout::kVtSlotBytes;   // V^T of one block, 256 dims x 64 keys
constexpr u32 kBarVt0 = 7;                                // WG0 internal: its V^T slot 0 written
constexpr float kPScale = 256.0f;                         // P is encoded as 256 P in e4m3 (max 448)
// transpose_v loads this many (tile, 32-dim half) pieces before storing any: the ldmatrix /
// stmatrix asm are ordered (memory clobbers), so one at a time exposed each load's latency. 2 is
// fastest (4 spills).
constexpr int kVtBatch = 2;

// The 16-bit kernel's Smem (barriers, per-key arrays, q / k / p1) plus what only FP8 math has.
struct SmemF8 : Smem {
  u32 vt[2];        // V^T of warpgroup w: slot b (64 keys of stage b) at vt[w] + b * kVtSlotBytes
  u32 p0;           // WG0's P (64x64 e4m3)
  float* invscale;  // [2][2][64]: 2^-log2(scale) per key
  float* qscale;    // [64]: per-head query scales
};

MJ_DEVICE SmemF8 carve_smem_fp8math(unsigned char* base, int misc_bytes) {
  SmemF8 s;
  static_cast<Smem&>(s) = carve_smem(base, misc_bytes);  // barrier addresses; tile addresses redone below
  const u32 tiles = s.q;
  s.q = tiles;
  s.k[0] = tiles + kF8BlockBytes;
  s.k[1] = tiles + 2 * kF8BlockBytes;
  s.vt[0] = tiles + 3 * kF8BlockBytes;
  s.vt[1] = s.vt[0] + 2 * kVtSlotBytes;
  s.p0 = s.vt[1] + 2 * kVtSlotBytes;
  s.p1 = s.p0 + kF8TileBytes;
  return s;
}

// Four f32 to four e4m3 (round to nearest even, saturating to +-448), x0 in byte 0.
MJ_DEVICE u32 f32x4_to_e4m3x4(float x0, float x1, float x2, float x3) {
  u32 r;
  asm("{\n.reg .b16 lo, hi;\n"
      "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
      "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      "mov.b32 %0, {lo, hi};\n}\n"
      : "=r"(r)
      : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
  return r;
}

// Index of a per-key array entry: [step parity][stage][key].
MJ_DEVICE int key_slot(u32 parity, int stage, int key) { return (static_cast<int>(parity) * 2 + stage) * 64 + key; }

// ---- producer: raw e4m3 rows by cp.async ------------------------------------------------------------
// Thread t of the warpgroup: g = t / 4 owns rows g and g + 32 of a block; lane c = t % 4 copies 16-byte
// chunk c of each 64-byte tile row. Per-row scales are loaded at the top of a step and published with
// each stage's last half (the consumers read them after both halves), which hides their latency.
template <class C>
MJ_DEVICE void produce_fp8_raw(const SparsePrefillArgs& a, const SmemF8& s, i64 token, int topk_len, int steps) {
  const int t = static_cast<int>(threadIdx.x) - 256;
  const int g = t >> 2, c = t & 3;
  const u32* token_indices = a.indices + token * a.indices_stride;
  const unsigned char* kv = static_cast<const unsigned char*>(a.kv_blocks);
  const u64 policy = sm90::l2_policy_evict_last();
  const u32 lane_dst[2] = {sm90::sw64_offset(static_cast<u32>(g), static_cast<u32>(c)),
                           sm90::sw64_offset(static_cast<u32>(g + 32), static_cast<u32>(c))};

  int next[2][2];
  auto load_step = [&](int step) {
#pragma unroll
    for (int b = 0; b < 2; ++b) {
#pragma unroll
      for (int k = 0; k < 2; ++k) next[b][k] = load_slot(token_indices, (2 * step + b) * kBlockKeys + g + 32 * k, topk_len);
    }
  };
  load_step(0);
  for (int step = 0; step < steps; ++step) {
    const u32 empty_parity = (static_cast<u32>(step) & 1u) ^ 1u;
    const u32 parity = static_cast<u32>(step) & 1u;
    u32 rows[2][2];
#pragma unroll
    for (int b = 0; b < 2; ++b) {
#pragma unroll
      for (int k = 0; k < 2; ++k) rows[b][k] = resolve_index<C>(a, next[b][k]);
    }
    float sc[2][2];
    if constexpr (C::kRowScale) {
#pragma unroll
      for (int b = 0; b < 2; ++b) {
#pragma unroll
        for (int k = 0; k < 2; ++k) sc[b][k] = (c == 0 && rows[b][k] != kNoRow) ? __ldg(a.kv_scales + rows[b][k]) : 0.0f;
      }
    }
    load_step(step + 1);  // past the last step every slot is >= topk_len: no load
    auto publish_keys = [&](int b) {
      if (c == 0) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const int i = key_slot(parity, b, g + 32 * k);
          const bool valid = rows[b][k] != kNoRow;
          if constexpr (C::kRowScale) {
            const float lsk = fmaxf(fast_log2(sc[b][k]), -64.0f);  // fast_log2(0) = -inf: zero scales clamp
            s.bias[i] = valid ? lsk : neg_inf();
            s.colscale[i] = sc[b][k];
            s.invscale[i] = valid ? fast_exp2(-lsk) : 0.0f;
          } else {
            s.bias[i] = valid ? 0.0f : neg_inf();
          }
        }
      }
    };
    auto copy_tiles = [&](int b, int t0, int t1) {
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const bool valid = rows[b][k] != kNoRow;
        const unsigned char* src = kv + (valid ? static_cast<u64>(rows[b][k]) * kQkDim : 0) + c * 16;
#pragma unroll
        for (int tile = 0; tile < kQkTiles; ++tile) {
          if (tile < t0 || tile >= t1) continue;
          sm90::cp_async_16_zfill(s.k[b] + tile * kF8TileBytes + lane_dst[k], src + tile * 64, valid, policy);
        }
      }
    };
    auto signal_full = [&](u32 bar) {
      sm90::mbar_arrive_cp_async(bar);  // lands with the data
      sm90::mbar_arrive(bar);           // releases the per-key arrays written above
    };
    // Same order as the 16-bit producer: WG0 scores stage 0 left-then-right, WG1 stage 1
    // right-then-left; the per-key arrays go with each stage's second half.
    sm90::mbar_wait(s.empty[0][0], empty_parity);
    copy_tiles(0, 0, kLeftTiles);
    signal_full(s.full[0][0]);

    sm90::mbar_wait(s.empty[1][1], empty_parity);
    copy_tiles(1, kLeftTiles, kQkTiles);
    signal_full(s.full[1][1]);

    sm90::mbar_wait(s.empty[0][1], empty_parity);
    publish_keys(0);
    copy_tiles(0, kLeftTiles, kQkTiles);
    signal_full(s.full[0][1]);

    sm90::mbar_wait(s.empty[1][0], empty_parity);
    publish_keys(1);
    copy_tiles(1, 0, kLeftTiles);
    signal_full(s.full[1][0]);
  }
  sm90::cp_async_wait_all();
}

// ---- consumers -----------------------------------------------------------------------------------
// Loads this CTA's query rows, quantises each head row to e4m3 (scale amax / 448) into the
// 64-byte-swizzled Q tiles and publishes the scales in s.qscale. Thread t: row t / 4, dims
// [144 (t % 4), 144 (t % 4) + 144) (18 chunks of 8 bf16).
template <class C>
MJ_DEVICE void load_q_fp8(const SparsePrefillArgs& a, const SmemF8& s, i64 token, int head0) {
  const int t = static_cast<int>(threadIdx.x);  // 0..255
  const int row = t >> 2, part = t & 3;
  constexpr int kChunks = kQkDim / 4 / 8;  // 18
  const bool valid = row < C::kHeadsPerCta;
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const unsigned char*>(a.q) +
                                                    ((token * C::kNumHeads + head0 + (valid ? row : 0)) * kQkDim + part * 144) * 2);
  uint4 w[kChunks];
#pragma unroll
  for (int i = 0; i < kChunks; ++i) w[i] = valid ? __ldg(src + i) : make_uint4(0u, 0u, 0u, 0u);
  u32 mx = 0;  // bf16 magnitudes as bit patterns (non-negative bf16 order like their values)
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    mx = __vmaxu2(mx, w[i].x & 0x7FFF7FFFu);
    mx = __vmaxu2(mx, w[i].y & 0x7FFF7FFFu);
    mx = __vmaxu2(mx, w[i].z & 0x7FFF7FFFu);
    mx = __vmaxu2(mx, w[i].w & 0x7FFF7FFFu);
  }
  mx = max(mx & 0xFFFFu, mx >> 16);
  mx = max(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
  mx = max(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
  const float amax = __uint_as_float(mx << 16);
  // amax 0: the row is zero (scale 0, codes 0). Non-finite amax: inv 0, the codes of inf / NaN
  // inputs stay NaN (0 * inf), the scale propagates inf: non-finite queries give non-finite output.
  // Below amax = 448 * 2^-126 the multiplier 448 / amax is capped at 2^126 (it would reach inf near
  // 2^-119): such a row's largest code is < 448 and its scale is exactly 2^-126, so sq * code is
  // still q rounded to e4m3 (f32 subnormal inputs may flush to zero: |q| < 2^-126).
  const bool finite_nonzero = amax > 0.0f && amax < pos_inf();
  constexpr float kMaxInv = 0x1p126f;
  const bool tiny = finite_nonzero && amax < 448.0f * 0x1p-126f;
  const float inv = !finite_nonzero ? 0.0f : tiny ? kMaxInv : 448.0f / amax;
  if (part == 0) s.qscale[row] = tiny ? 0x1p-126f : amax * (1.0f / 448.0f);
  auto bf = [](u32 x, bool high) { return __uint_as_float(high ? (x & 0xFFFF0000u) : (x << 16)); };
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int d = part * 144 + 8 * i;  // first dim of the chunk; 8 dims never straddle a 16-byte chunk
    const u32 lo = f32x4_to_e4m3x4(bf(w[i].x, false) * inv, bf(w[i].x, true) * inv, bf(w[i].y, false) * inv,
                                   bf(w[i].y, true) * inv);
    const u32 hi = f32x4_to_e4m3x4(bf(w[i].z, false) * inv, bf(w[i].z, true) * inv, bf(w[i].w, false) * inv,
                                   bf(w[i].w, true) * inv);
    const u32 addr = s.q + (d >> 6) * kF8TileBytes +
                     sm90::sw64_offset(static_cast<u32>(row), static_cast<u32>((d & 63) >> 4)) + (d & 8);
    sm90::sts64(addr, lo, hi);
  }
  sm90::fence_proxy_async_smem();
  sm90::named_bar_sync(kBarQReady, 256);
}

// V^T of one 64-key block for warpgroup `wg`: dims [256 wg, 256 wg + 256) (tiles 4 wg .. 4 wg + 3 of
// the raw stage) into `slot` (64 bytes of keys in kKeyOrder per row, 64-byte swizzle; dim 256 wg +
// 16 g + 2 a + e at row 16 g + 8 e + a, see dim_off).
// Warp w handles keys 16 w .. 16 w + 15: per (tile, 32-dim half) one ldmatrix.trans x4 reads the
// 16 keys x 32 dims as four 8x8 b16 matrices (b16 = a pair of dims), 4 byte permutes regroup them to
// 4 dims x 4 keys per lane, one stmatrix x4 writes 32 V^T row pieces of 16 bytes.
MJ_DEVICE void transpose_v(u32 raw, u32 slot, int wg, int w, int lane) {
  const u32 j = static_cast<u32>(lane) >> 3, i8 = static_cast<u32>(lane) & 7u;
  const u32 key = 16u * static_cast<u32>(w) + 8u * (j & 1u) + i8;               // ldmatrix row of this lane
  // stmatrix matrix j holds dims 2 i8 + (j & 1) + 16 (j >> 1) (rows i8); it goes to V^T rows
  // 8 j + i8, i.e. dim 16 g + 2 a + e at row 16 g + 8 e + a. Eight consecutive rows per matrix hit
  // eight distinct bank groups under the 64-byte swizzle; the natural order (row = dim) put rows r
  // and r + 8 of a matrix on one bank group (2-way conflicts on every stmatrix, ncu). P V's output
  // columns come out in the same order; finish<C, true> puts them back.
  const u32 dim_off = 8u * j + i8;                                              // stmatrix row - 32-dim base
  constexpr int kBatch = kVtBatch;
#pragma unroll
  for (int p0 = 0; p0 < 8; p0 += kBatch) {
    u32 r[kBatch][4];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int tile = (p0 + b) >> 1, hh = (p0 + b) & 1;
      // r0 / r1: keys 2 t', 2 t' + 1 (+ 8 for r1) x dims 2 q, 2 q + 1 (t' = lane % 4, q = lane / 4);
      // r2 / r3 the same 16 dims further.
      sm90::ldmatrix_x4_trans(raw + (4 * wg + tile) * kF8TileBytes + sm90::sw64_offset(key, 2u * hh + (j >> 1)), r[b][0],
                              r[b][1], r[b][2], r[b][3]);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int tile = (p0 + b) >> 1, hh = (p0 + b) & 1;
      const u32 ld = static_cast<u32>(64 * tile + 32 * hh) + dim_off;
      sm90::stmatrix_x4(slot + sm90::sw64_offset(ld, static_cast<u32>(w)), prmt(r[b][0], r[b][1], 0x6420u),
                        prmt(r[b][0], r[b][1], 0x7531u), prmt(r[b][2], r[b][3], 0x6420u), prmt(r[b][2], r[b][3], 0x7531u));
    }
  }
}

// Q K^T over tiles [T0, T1) of a raw stage, two k32 steps per 64-dim tile.
template <int T0, int T1>
MJ_DEVICE void issue_qk_e4m3(float (&p)[32], u64 dq, u64 dk, bool clear) {
#pragma unroll
  for (int tile = T0; tile < T1; ++tile) {
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      const u32 off = tile * kF8TileBytes + kk * 32;
      sm90::wgmma_m64n64k32_e4m3_ss(p, sm90::desc_advance(dq, off), sm90::desc_advance(dk, off),
                                    (clear && tile == T0 && kk == 0) ? 0u : 1u);
    }
  }
}
// O[:, half] += P (registers, e4m3 fragment) V (the warpgroup's V^T slot).
MJ_DEVICE void issue_pv_e4m3_rs(float (&o)[128], const u32 (&pk)[8], u64 dvt) {
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    const u32 a[4] = {pk[4 * kk], pk[4 * kk + 1], pk[4 * kk + 2], pk[4 * kk + 3]};
    sm90::wgmma_m64n256k32_e4m3_rs(o, a, sm90::desc_advance(dvt, kk * 32), 1u);
  }
}
// O[:, half] += P (shared memory, the other warpgroup's) V.
MJ_DEVICE void issue_pv_e4m3_ss(float (&o)[128], u64 dp, u64 dvt) {
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    sm90::wgmma_m64n256k32_e4m3_ss(o, sm90::desc_advance(dp, kk * 32), sm90::desc_advance(dvt, kk * 32), 1u);
  }
}

// p <- exp2(p - max); the row sums get exp2(p - max) / sk (the probabilities without the key scale).
template <class C>
MJ_DEVICE void exponentiate_f8(float (&p)[32], const SmemF8& s, u32 parity, int stage, const Lane& ln, float m0, float m1,
                               float& l0, float& l1) {
  float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    p[4 * j + 0] = fast_exp2(p[4 * j + 0] - m0);
    p[4 * j + 1] = fast_exp2(p[4 * j + 1] - m0);
    p[4 * j + 2] = fast_exp2(p[4 * j + 2] - m1);
    p[4 * j + 3] = fast_exp2(p[4 * j + 3] - m1);
    if constexpr (C::kRowScale) {
      const int i = key_slot(parity, stage, 8 * j + 2 * ln.tig);
      const float v0 = s.invscale[i], v1 = s.invscale[i + 1];
      sum0 = __fmaf_rn(p[4 * j + 0], v0, __fmaf_rn(p[4 * j + 1], v1, sum0));
      sum1 = __fmaf_rn(p[4 * j + 2], v0, __fmaf_rn(p[4 * j + 3], v1, sum1));
    } else {
      sum0 += p[4 * j + 0] + p[4 * j + 1];
      sum1 += p[4 * j + 2] + p[4 * j + 3];
    }
  }
  l0 += sum0;
  l1 += sum1;
  asm volatile("" : "+f"(l0), "+f"(l1));
}

// P (f32 scores after exponentiate) times f * 256 to the e4m3 A fragments of the two k32 slices:
// pk[2 u + r] = row r (r0 / r1) of 16-key group u, keys in kKeyOrder.
MJ_DEVICE void pack_p_e4m3(const float (&p)[32], u32 (&pk)[8], float f0, float f1) {
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    pk[2 * u + 0] = f32x4_to_e4m3x4(p[8 * u + 0] * f0, p[8 * u + 1] * f0, p[8 * u + 4] * f0, p[8 * u + 5] * f0);
    pk[2 * u + 1] = f32x4_to_e4m3x4(p[8 * u + 2] * f1, p[8 * u + 3] * f1, p[8 * u + 6] * f1, p[8 * u + 7] * f1);
  }
}
// The fragments to a 64x64 e4m3 P tile (K-major, 64-byte swizzle) for the other warpgroup.
MJ_DEVICE void store_p_e4m3(u32 tile, const u32 (&pk)[8], const Lane& ln) {
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    sm90::sts32(tile + sm90::sw64_offset(static_cast<u32>(ln.r0), static_cast<u32>(u)) + 4u * ln.tig, pk[2 * u + 0]);
    sm90::sts32(tile + sm90::sw64_offset(static_cast<u32>(ln.r1), static_cast<u32>(u)) + 4u * ln.tig, pk[2 * u + 1]);
  }
}

template <class C>
MJ_DEVICE Smem output_staging(const SmemF8& s) {
  Smem so = s;  // the 16-bit part
  so.q = s.vt[0];  // both V^T regions (64 KB, contiguous): free once both warpgroups' wgmma are done
  return so;
}

// WG0: scores stage 0 (even blocks), owns output columns 0..255.
template <class C>
MJ_DEVICE void consume_wg0_f8(const SparsePrefillArgs& a, const SmemF8& s, const Lane& ln, int lane, i64 token, int head0,
                              int steps) {
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float p[32];
  u32 pk[8];
  float m0 = kMaxInit, m1 = kMaxInit, l0 = 0.0f, l1 = 0.0f;
  const float rm0 = a.sm_scale_log2e * s.qscale[ln.r0], rm1 = a.sm_scale_log2e * s.qscale[ln.r1];
  const u64 dq = sm90::smem_desc_sw64(s.q, 16, 512);
  const u64 dk0 = sm90::smem_desc_sw64(s.k[0], 16, 512);
  const u32 vt_own = s.vt[0], vt_peer = s.vt[0] + kVtSlotBytes;  // V^T of stage 0 / stage 1, dims 0..255
  const u64 dvt_own = sm90::smem_desc_sw64(vt_own, 16, 512);
  const u64 dvt_peer = sm90::smem_desc_sw64(vt_peer, 16, 512);
  const u64 dp1 = sm90::smem_desc_sw64(s.p1, 16, 512);

  if (steps > 0) {
    wait_full<C>(s, 0, 0, 0);
    issue_qk_e4m3<0, kLeftTiles>(p, dq, dk0, true);
    wait_full<C>(s, 0, 1, 0);
    issue_qk_e4m3<kLeftTiles, kQkTiles>(p, dq, dk0, false);
    sm90::wgmma_commit();
    transpose_v(s.k[0], vt_own, 0, ln.w, lane);
    sm90::fence_proxy_async_smem();
    sm90::wgmma_wait<0>();
    sm90::fence_regs(p);
    sm90::mbar_arrive(s.empty[0][0]);  // stage 0 left: scored and transposed
    sm90::mbar_arrive(s.empty[0][1]);  // stage 0 right: scored (WG1 transposes it too)
  }
  for (int step = 0; step < steps; ++step) {
    const u32 parity = static_cast<u32>(step) & 1u;
    float mx0, mx1;
    // S'' = S log2(e) + log2(sk) (masked: -inf), in place.
    scale_mask_scores<C::kRowScale>(p, s.bias, s.colscale, key_slot(parity, 0, 0), ln, rm0, rm1, mx0, mx1);
    const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
    const float alpha0 = fast_exp2(m0 - n0), alpha1 = fast_exp2(m1 - n1);
    scale_rows(o, alpha0, alpha1);
    l0 *= alpha0;
    l1 *= alpha1;
    exponentiate_f8<C>(p, s, parity, 0, ln, n0, n1, l0, l1);
    pack_p_e4m3(p, pk, kPScale, kPScale);
    if (ln.tig == 0) {
      s.max[ln.r0] = n0;
      s.max[ln.r1] = n1;
    }
    m0 = n0;
    m1 = n1;
    sm90::named_bar_arrive(kBarWg0Max, 256);

    sm90::named_bar_sync(kBarVt0, 128);  // every WG0 warp's V^T of stage 0 written (and fenced)
    sm90::wgmma_fence();
    issue_pv_e4m3_rs(o, pk, dvt_own);
    sm90::wgmma_commit();
    wait_full<C>(s, 1, 0, parity);
    transpose_v(s.k[1], vt_peer, 0, ln.w, lane);
    sm90::fence_proxy_async_smem();
    sm90::mbar_arrive(s.empty[1][0]);  // stage 1 left: transposed (WG1 scores it)
    sm90::wgmma_wait<0>();
    sm90::fence_regs(o);

    sm90::mbar_wait(s.max1_ready, parity);
    const float f0 = fast_exp2(m0 - s.max[ln.r0]), f1 = fast_exp2(m1 - s.max[ln.r1]);
    m0 = s.max[ln.r0];
    m1 = s.max[ln.r1];
    pack_p_e4m3(p, pk, f0 * kPScale, f1 * kPScale);
    store_p_e4m3(s.p0, pk, ln);
    sm90::fence_proxy_async_smem();
    sm90::named_bar_arrive(kBarS0Ready, 256);
    scale_rows(o, f0, f1);
    l0 *= f0;
    l1 *= f1;

    sm90::named_bar_sync(kBarS1Ready, 256);  // P1 stored; also orders every WG0 warp's V^T of stage 1
    sm90::wgmma_fence();
    issue_pv_e4m3_ss(o, dp1, dvt_peer);
    sm90::wgmma_commit();
    if (step + 1 < steps) {
      wait_full<C>(s, 0, 0, parity ^ 1u);
      issue_qk_e4m3<0, kLeftTiles>(p, dq, dk0, true);
      wait_full<C>(s, 0, 1, parity ^ 1u);
      issue_qk_e4m3<kLeftTiles, kQkTiles>(p, dq, dk0, false);
      sm90::wgmma_commit();
      sm90::wgmma_wait<1>();  // P V of this step done: both V^T slots free
      transpose_v(s.k[0], vt_own, 0, ln.w, lane);
      sm90::fence_proxy_async_smem();
      sm90::wgmma_wait<0>();
      sm90::mbar_arrive(s.empty[0][0]);
      sm90::mbar_arrive(s.empty[0][1]);
    } else {
      sm90::wgmma_wait<0>();
    }
    sm90::fence_regs(o);
    sm90::fence_regs(p);
  }
  finish<C, true>(a, output_staging<C>(s), ln, lane, token, head0, o, m0, m1, l0, l1);
}

// WG1: scores stage 1 (odd blocks), owns output columns 256..511.
template <class C>
MJ_DEVICE void consume_wg1_f8(const SparsePrefillArgs& a, const SmemF8& s, const Lane& ln, int lane, i64 token, int head0,
                              int steps) {
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float p[32];
  u32 pk[8];
  float m0 = kMaxInit, m1 = kMaxInit, l0 = 0.0f, l1 = 0.0f;
  const float rm0 = a.sm_scale_log2e * s.qscale[ln.r0], rm1 = a.sm_scale_log2e * s.qscale[ln.r1];
  const u64 dq = sm90::smem_desc_sw64(s.q, 16, 512);
  const u64 dk1 = sm90::smem_desc_sw64(s.k[1], 16, 512);
  const u32 vt_own = s.vt[1] + kVtSlotBytes, vt_peer = s.vt[1];  // V^T of stage 1 / stage 0, dims 256..511
  const u64 dvt_own = sm90::smem_desc_sw64(vt_own, 16, 512);
  const u64 dvt_peer = sm90::smem_desc_sw64(vt_peer, 16, 512);
  const u64 dp0 = sm90::smem_desc_sw64(s.p0, 16, 512);

  // Scores block 2 i + 1 and transposes its V dims 256..511; for i > 0 this is issued behind the
  // previous step's last P V, so the tensor pipe runs them back to back.
  auto score_own = [&](u32 parity, bool pv_pending) {
    wait_full<C>(s, 1, 1, parity);
    issue_qk_e4m3<kLeftTiles, kQkTiles>(p, dq, dk1, true);
    wait_full<C>(s, 1, 0, parity);
    issue_qk_e4m3<0, kLeftTiles>(p, dq, dk1, false);
    sm90::wgmma_commit();
    if (pv_pending) sm90::wgmma_wait<1>();  // the previous step's P V done: both V^T slots free
    transpose_v(s.k[1], vt_own, 1, ln.w, lane);
    sm90::fence_proxy_async_smem();
    sm90::wgmma_wait<0>();
    sm90::fence_regs(p);
    sm90::mbar_arrive(s.empty[1][1]);  // stage 1 right: scored and transposed
    sm90::mbar_arrive(s.empty[1][0]);  // stage 1 left: scored (WG0 transposes it)
  };
  if (steps > 0) score_own(0u, false);
  for (int step = 0; step < steps; ++step) {
    const u32 parity = static_cast<u32>(step) & 1u;
    float mx0, mx1;
    // S'' = S log2(e) + log2(sk) (masked: -inf), in place.
    scale_mask_scores<C::kRowScale>(p, s.bias, s.colscale, key_slot(parity, 1, 0), ln, rm0, rm1, mx0, mx1);
    sm90::named_bar_sync(kBarWg0Max, 256);  // WG0's max; also orders every WG1 warp's V^T of stage 1
    const float n0 = fmaxf(s.max[ln.r0], mx0), n1 = fmaxf(s.max[ln.r1], mx1);
    const float alpha0 = fast_exp2(m0 - n0), alpha1 = fast_exp2(m1 - n1);
    scale_rows(o, alpha0, alpha1);
    l0 *= alpha0;
    l1 *= alpha1;
    exponentiate_f8<C>(p, s, parity, 1, ln, n0, n1, l0, l1);
    pack_p_e4m3(p, pk, kPScale, kPScale);
    __syncwarp();  // the quad's reads of s.max above before lane tig 0 overwrites it (see consume_wg1)
    if (ln.tig == 0) {
      s.max[ln.r0] = n0;
      s.max[ln.r1] = n1;
      sm90::mbar_arrive(s.max1_ready);
    }
    m0 = n0;
    m1 = n1;

    sm90::wgmma_fence();
    issue_pv_e4m3_rs(o, pk, dvt_own);
    sm90::wgmma_commit();
    store_p_e4m3(s.p1, pk, ln);
    sm90::fence_proxy_async_smem();
    sm90::named_bar_arrive(kBarS1Ready, 256);
    wait_full<C>(s, 0, 1, parity);
    transpose_v(s.k[0], vt_peer, 1, ln.w, lane);
    sm90::fence_proxy_async_smem();
    sm90::mbar_arrive(s.empty[0][1]);  // stage 0 right: transposed (WG0 scored it)
    sm90::named_bar_sync(kBarS0Ready, 256);  // P0 stored; also orders every WG1 warp's V^T of stage 0
    sm90::wgmma_fence();
    issue_pv_e4m3_ss(o, dp0, dvt_peer);
    sm90::wgmma_commit();
    if (step + 1 < steps) {
      score_own(parity ^ 1u, true);
    } else {
      sm90::wgmma_wait<0>();
    }
    sm90::fence_regs(o);
  }
  finish<C, true>(a, output_staging<C>(s), ln, lane, token, head0, o, m0, m1, l0, l1);
}

template <class C>
MJ_DEVICE void run_fp8math(const SparsePrefillArgs& args) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const SmemF8 s = [&] {
    SmemF8 r = carve_smem_fp8math(smem_raw, C::kMiscBytes);
    r.max = reinterpret_cast<float*>(smem_raw + C::kOffMax);
    r.rowsum = reinterpret_cast<float*>(smem_raw + C::kOffRowSum);
    r.bias = reinterpret_cast<float*>(smem_raw + C::kOffBiasF8);
    r.colscale = reinterpret_cast<float*>(smem_raw + C::kOffColScaleF8);
    r.invscale = reinterpret_cast<float*>(smem_raw + C::kOffInvScale);
    r.qscale = reinterpret_cast<float*>(smem_raw + C::kOffQScale);
    return r;
  }();
  const CtaWork work = cta_work<C>(args);
  const i64 token = work.token;
  const int head0 = work.head0, topk_len = work.topk_len, steps = work.steps;
  const int wg = static_cast<int>(threadIdx.x) / 128;

  if (threadIdx.x == 0) {
    // full: one cp.async arrival + one plain arrival per producer thread. empty: the warpgroups that
    // read a half (Q K^T and / or its V^T transposition): stage 0 left WG0; stage 0 right WG0 + WG1;
    // stage 1 right WG1; stage 1 left WG1 + WG0.
    init_barriers(s, 256u, 128u, 256u);
    sm90::mbar_init_fence();
  }
  __syncthreads();

  if (wg == 2) {
    sm90::setmaxnreg_dec<C::kProducerRegs>();
    produce_fp8_raw<C>(args, s, token, topk_len, steps);
  } else {
    sm90::setmaxnreg_inc<C::kConsumerRegs>();
    const int lane = static_cast<int>(threadIdx.x) & 31;
    Lane ln;
    set_lane(ln, wg, lane);
    load_q_fp8<C>(args, s, token, head0);
    if (wg == 0) {
      consume_wg0_f8<C>(args, s, ln, lane, token, head0, steps);
    } else {
      consume_wg1_f8<C>(args, s, ln, lane, token, head0, steps);
    }
  }
}

}  // namespace sparse_prefill_sm90
}  // namespace mj

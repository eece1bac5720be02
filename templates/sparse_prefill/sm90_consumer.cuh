#pragma once
// The Hopper sparse prefill's consumer warpgroups (WG0, WG1; sparse_prefill/sm90.cuh, Design): Q K^T
// of a stage, the online softmax with the running max shared between the two, P V over both blocks
// of a step for the warpgroup's 256 output dims, and the epilogue.
//
// consume_wg0 and consume_wg1 are the two roles of one ping-pong schedule, not mirror images: WG0
// publishes its max first and issues its next Q K^T behind its SS P V (the one-item kernels), WG1
// takes the shared max, releases the max hand-off through an mbarrier and the persistent kernel's
// rope tile early. The order of waits, arrivals and wgmma issues differs between them at every step.
#include "sparse_prefill/sm90_config.cuh"
#include "sparse_prefill/sm90_combine.cuh"

namespace mj {
namespace sparse_prefill_sm90 {

// Waits until a stage half is full and makes it readable by wgmma. The producer's writes (cp.async
// or st.shared) are generic-proxy writes, wgmma reads through the async proxy.
// - st.shared stages (fp8 decoded by the producer): the bidirectional proxy fence sits in the chain
//   producer store -> mbarrier release -> this acquire -> fence -> wgmma. It is issued here rather
//   than by the producer because a fence there would also wait for the producer's in-flight row
//   loads (MEMBAR.ALL.CTA), draining its prefetch window at every half. It is needed in practice:
//   with only the acquire form below these kernels read stale tiles (NaN outputs).
// - cp.async stages (bf16 rows, FP8 math's raw e4m3 rows), whose data land through the
//   cp.async.mbarrier.arrive completion: the acquire-form proxy fence, which emits no instruction on
//   sm_90a: the same ordering as CUTLASS's cp.async GMMA mainloop (no fence at all) and FlashMLA.
//   The bidirectional fence cost ~2 % of the bf16 kernel's time.
// `bar` is a stage part's full barrier: a half's, or the persistent kernel's stage 1 rope tile's.
template <class C>
MJ_DEVICE void wait_stage_bar(u32 bar, u32 parity) {
  sm90::mbar_wait(bar, parity);
  if constexpr (C::kStageByCpAsync) {
    sm90::fence_proxy_async_acquire_smem();
  } else {
    sm90::fence_proxy_async_smem();
  }
  sm90::wgmma_fence();
}
template <class C>
MJ_DEVICE void wait_full(const Smem& s, int stage, int half, u32 parity) {
  wait_stage_bar<C>(s.full[stage][half], parity);
}
// Releases a stage half (its empty barrier `bar`): the crossover's producers write each half in
// both CTAs of the cluster, so the peer's barrier takes this thread's arrival too (the reads it
// releases, wgmma's, completed at wgmma.wait_group before it).
template <class C>
MJ_DEVICE void release_half(const Smem& s, u32 bar) {
  sm90::mbar_arrive(bar);
  if constexpr (C::kCrossover) cluster::mbar_arrive_remote(bar + s.peer_delta);
}

// Q K^T over column tiles [T0, T1) of a stage; `clear` zeroes the accumulator on the first k-step.
template <int T0, int T1, bool F16>
MJ_DEVICE void issue_qk(float (&p)[32], u64 dq, u64 dk, bool clear) {
#pragma unroll
  for (int tile = T0; tile < T1; ++tile) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const u32 off = tile * kTileBytes + kk * 32;
      sm90::wgmma_m64n64k16_ss_kk<F16>(p, sm90::desc_advance(dq, off), sm90::desc_advance(dk, off),
                                  (clear && tile == T0 && kk == 0) ? 0u : 1u);
    }
  }
}

// O[:, half] += P (registers) V[keys of the stage, 256 dims starting at tile v_tile0].
template <bool F16>
MJ_DEVICE void issue_pv_rs(float (&o)[128], const u32 (&ps)[16], u64 dv) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const u32 a[4] = {ps[4 * kk], ps[4 * kk + 1], ps[4 * kk + 2], ps[4 * kk + 3]};
    sm90::wgmma_m64n256k16_rs_mn<F16>(o, a, sm90::desc_advance(dv, kk * 16 * 128), 1u);
  }
}
// O[:, half] += P (shared memory, the other warpgroup's) V[...].
template <bool F16>
MJ_DEVICE void issue_pv_ss(float (&o)[128], u64 dp, u64 dv) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    sm90::wgmma_m64n256k16_ss_kmn<F16>(o, sm90::desc_advance(dp, kk * 32), sm90::desc_advance(dv, kk * 16 * 128), 1u);
  }
}

// Scaled, masked scores in the exp2 domain; returns the thread's row maxima (quad-reduced). The
// block's 64 per-key entries are bias[key0 + k] / colscale[key0 + k]; mult0 / mult1: the score
// multipliers of rows r0 / r1 (one value in the 16-bit kernels, times the per-head query scale with
// FP8 math); COL_SCALE: each key's multiplier also takes its colscale entry. Shared by the 16-bit and
// the FP8-math kernels.
template <bool COL_SCALE>
MJ_DEVICE void scale_mask_scores(float (&p)[32], const float* bias, const float* colscale, int key0, const Lane& ln,
                                 float mult0, float mult1, float& mx0, float& mx1) {
  mx0 = neg_inf();
  mx1 = neg_inf();
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int i = key0 + 8 * j + 2 * ln.tig;
    const float b0 = bias[i], b1 = bias[i + 1];
    float k0 = 1.0f, k1 = 1.0f;
    if constexpr (COL_SCALE) {
      k0 = colscale[i];
      k1 = colscale[i + 1];
    }
    p[4 * j + 0] = __fmaf_rn(p[4 * j + 0], mult0 * k0, b0);
    p[4 * j + 1] = __fmaf_rn(p[4 * j + 1], mult0 * k1, b1);
    p[4 * j + 2] = __fmaf_rn(p[4 * j + 2], mult1 * k0, b0);
    p[4 * j + 3] = __fmaf_rn(p[4 * j + 3], mult1 * k1, b1);
    mx0 = fmaxf(mx0, fmaxf(p[4 * j + 0], p[4 * j + 1]));
    mx1 = fmaxf(mx1, fmaxf(p[4 * j + 2], p[4 * j + 3]));
  }
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xFFFFFFFFu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xFFFFFFFFu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xFFFFFFFFu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xFFFFFFFFu, mx1, 2));
}

// p <- exp2(p - max) per row, row sums added to l (thread-partial), P scaled by per-row fp8 scales.
template <class C>
MJ_DEVICE void exponentiate(float (&p)[32], const Smem& s, int stage, const Lane& ln, float m0, float m1, float& l0,
                            float& l1) {
  float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    p[4 * j + 0] = fast_exp2(p[4 * j + 0] - m0);
    p[4 * j + 1] = fast_exp2(p[4 * j + 1] - m0);
    p[4 * j + 2] = fast_exp2(p[4 * j + 2] - m1);
    p[4 * j + 3] = fast_exp2(p[4 * j + 3] - m1);
    sum0 += p[4 * j + 0] + p[4 * j + 1];
    sum1 += p[4 * j + 2] + p[4 * j + 3];
  }
  l0 += sum0;
  l1 += sum1;
  // Keeps the row sums here: deferring them past the P V issue costs the registers of the unscaled P.
  asm volatile("" : "+f"(l0), "+f"(l1));
  if constexpr (C::kColScale) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int col = 8 * j + 2 * ln.tig;
      const float c0 = s.colscale[stage * 64 + col], c1 = s.colscale[stage * 64 + col + 1];
      p[4 * j + 0] *= c0;
      p[4 * j + 1] *= c1;
      p[4 * j + 2] *= c0;
      p[4 * j + 3] *= c1;
    }
  }
}

// P as the tile type (bf16, or f16 for the f16 tiles).
template <bool F16>
MJ_DEVICE u32 pack_x2(float lo, float hi) {
  if constexpr (F16) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  } else {
    return pack_bf16x2(lo, hi);
  }
}
template <bool F16>
MJ_DEVICE void pack_p(const float (&p)[32], u32 (&ps)[16], float f0, float f1) {
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const float f = (i & 1) ? f1 : f0;  // word 2j -> row r0, word 2j+1 -> row r1
    ps[i] = pack_x2<F16>(p[2 * i] * f, p[2 * i + 1] * f);
  }
}
template <bool F16>
MJ_DEVICE void pack_p(const float (&p)[32], u32 (&ps)[16]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) ps[i] = pack_x2<F16>(p[2 * i], p[2 * i + 1]);
}

MJ_DEVICE void scale_rows(float (&o)[128], float f0, float f1) {
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    o[4 * j + 0] *= f0;
    o[4 * j + 1] *= f0;
    o[4 * j + 2] *= f1;
    o[4 * j + 3] *= f1;
  }
}

// P (bf16 fragment, 64x64) to a 128-byte-swizzled K-major tile with stmatrix: k-slice kk holds
// matrices (rows 0-7 | 8-15 of the warp) x (columns 16kk + 0..7 | 8..15).
MJ_DEVICE void store_p(u32 tile, const u32 (&ps)[16], const Lane& ln, int lane) {
  const int m = lane >> 3;
  const u32 row = static_cast<u32>(16 * ln.w + (m & 1) * 8 + (lane & 7));
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    sm90::stmatrix_x4(tile + sm90::sw128_offset(row, static_cast<u32>(2 * kk + (m >> 1))), ps[4 * kk], ps[4 * kk + 1],
                      ps[4 * kk + 2], ps[4 * kk + 3]);
  }
}

// The fp8 tile holds K * 2^-64 (sm90.cuh, Design); scores and output multiply it back.
template <class C>
MJ_DEVICE float tile_unscale() {
  return C::kFp8 && !C::kF16 ? kTwoPow64 : 1.0f;
}
// What the accumulated output must be multiplied by: the tile's unscale, or with FP8 math 1/256
// (P is encoded as 256 P in e4m3, see sm90_fp8math.cuh).
template <class C>
MJ_DEVICE float output_unscale() {
  return C::kFp8Math ? 1.0f / 256.0f : tile_unscale<C>();
}
// q_unscale: 2^-e of the f16 query tile (load_q), else 1.
template <class C>
MJ_DEVICE float score_multiplier(const SparsePrefillArgs& a, float q_unscale) {
  return a.sm_scale_log2e * tile_unscale<C>() * q_unscale;
}

// Loads this CTA's query rows (zero rows past kHeadsPerCta) into the swizzled Q tile. Returns the
// factor the scores must be multiplied by: 1, or for f16 tiles (C::kF16) 2^-e, where the tile was
// converted in place to f16 as q * 2^e with 2^e putting the tile's largest |q| in [2^14, 2^15):
// every bf16 value within 2^-28 of that maximum converts exactly (f16 has more mantissa bits), and
// nothing overflows whatever the query's magnitude.
template <class C>
MJ_DEVICE float load_q(const SparsePrefillArgs& a, const Smem& s, i64 token, int head0) {
  const int t = static_cast<int>(threadIdx.x);  // 0..255
  const unsigned char* q = static_cast<const unsigned char*>(a.q) +
                           (token * C::kNumHeads + head0) * static_cast<i64>(kQkDim * 2);
  constexpr int kChunksPerRow = kQkDim * 2 / 16;  // 72
  const u64 policy = sm90::l2_policy_evict_first();  // read once: keep L2 for the gathered rows
#pragma unroll
  for (int i = 0; i < kTileRows * kChunksPerRow / 256; ++i) {
    const int id = t + 256 * i;
    const int row = id / kChunksPerRow, rest = id % kChunksPerRow;
    const bool valid = row < C::kHeadsPerCta;
    const u32 dst = s.q + (rest >> 3) * kTileBytes + sm90::sw128_offset(static_cast<u32>(row), static_cast<u32>(rest & 7));
    sm90::cp_async_16_zfill(dst, valid ? q + static_cast<i64>(row) * (kQkDim * 2) + rest * 16 : q, valid, policy);
  }
  sm90::cp_async_wait_all();
  float q_unscale = 1.0f;
  if constexpr (C::kF16) {
    // Each thread converts the chunks it copied itself (visible to it after the wait); the tile
    // maximum goes through shared memory (s.rowsum[0], zeroed at start, unused until the epilogue).
    auto chunk_addr = [&](int i) {
      const int id = t + 256 * i;
      const int row = id / kChunksPerRow, rest = id % kChunksPerRow;
      return s.q + (rest >> 3) * kTileBytes + sm90::sw128_offset(static_cast<u32>(row), static_cast<u32>(rest & 7));
    };
    u32 mx = 0;  // two bf16 magnitudes: bit patterns of non-negative bf16 order like their values
#pragma unroll
    for (int i = 0; i < kTileRows * kChunksPerRow / 256; ++i) {
      u32 w[4];
      sm90::lds128(chunk_addr(i), w[0], w[1], w[2], w[3]);
#pragma unroll
      for (int j = 0; j < 4; ++j) mx = __vmaxu2(mx, w[j] & 0x7FFF7FFFu);
    }
    mx = __reduce_max_sync(0xFFFFFFFFu, (mx & 0xFFFFu) > (mx >> 16) ? (mx & 0xFFFFu) : (mx >> 16));
    u32* qmax = reinterpret_cast<u32*>(s.rowsum);
    if ((t & 31) == 0) atomicMax(qmax, mx);
    sm90::named_bar_sync(kBarQReady, 256);
    const u32 m = *qmax;
    int e = 0;
    if (m != 0u && m < 0x7F80u) {  // finite, non-zero (inf / NaN propagate through the scores anyway)
      const int E = m >= 0x0080u ? static_cast<int>(m >> 7) - 127 : -127;
      e = min(120, max(-120, 14 - E));
    }
    const float up = __uint_as_float(static_cast<u32>(127 + e) << 23);
    q_unscale = __uint_as_float(static_cast<u32>(127 - e) << 23);
#pragma unroll
    for (int i = 0; i < kTileRows * kChunksPerRow / 256; ++i) {
      u32 w[4];
      const u32 addr = chunk_addr(i);
      sm90::lds128(addr, w[0], w[1], w[2], w[3]);
#pragma unroll
      for (int j = 0; j < 4; ++j) w[j] = pack_x2<true>(__uint_as_float(w[j] << 16) * up, __uint_as_float(w[j] & 0xFFFF0000u) * up);
      sm90::sts128(addr, w[0], w[1], w[2], w[3]);
    }
  }
  sm90::fence_proxy_async_smem();
  sm90::named_bar_sync(kBarQReady, 256);
  return q_unscale;
}

// Epilogue shared by both consumer warpgroups: total row sums, normalisation, bf16 staging in the
// Q space, coalesced 16-byte stores; lse from WG0. Persistent kernels (item: the CTA's item count, for
// the barrier parities) store from registers instead: the Q space may already hold the next item's
// query tile. DIM_PAIRS_SPLIT: the accumulator's columns are
// permuted inside every 16-column group (column 8 e + a holds dim 2 a + e: the FP8-math kernel's
// V^T row order, see transpose_v), so a thread's o[8 kk + {0, 4, 1, 5}] are 4 consecutive dims of row
// r0 (o[8 kk + {2, 6, 3, 7}] of row r1) and go to the staging rows as one 8-byte store each.
template <class C, bool DIM_PAIRS_SPLIT = false>
MJ_DEVICE void finish(const SparsePrefillArgs& a, const Smem& s, const Lane& ln, int lane, i64 token, int head0,
                      float (&o)[128], float m0, float m1, float l0, float l1, u32 item = 0, int slot = -1) {
  l0 += __shfl_xor_sync(0xFFFFFFFFu, l0, 1);
  l0 += __shfl_xor_sync(0xFFFFFFFFu, l0, 2);
  l1 += __shfl_xor_sync(0xFFFFFFFFu, l1, 1);
  l1 += __shfl_xor_sync(0xFFFFFFFFu, l1, 2);
  // Persistent: the previous item's row sums were read by both warpgroups (an item without steps
  // reaches here with no other synchronisation between the two).
  if constexpr (C::kPersistent) sm90::mbar_wait(s.rowsum_read, (item & 1u) ^ 1u);
  if (ln.tig == 0) {
    s.rowsum[ln.wg * 64 + ln.r0] = l0;
    s.rowsum[ln.wg * 64 + ln.r1] = l1;
  }
  // Also: both warpgroups' wgmma are done, Q space is free (one item per CTA; the persistent
  // kernel does not stage in it). An mbarrier rather than a named
  // barrier: finish() is inlined into both consumer branches (an aligned bar.sync reached from two
  // static instructions is what synccheck calls divergent), and racecheck models mbarriers exactly.
  sm90::mbar_arrive(s.rowsum_ready);
  sm90::mbar_wait(s.rowsum_ready, item & 1u);
  const float L0 = s.rowsum[ln.r0] + s.rowsum[64 + ln.r0];
  const float L1 = s.rowsum[ln.r1] + s.rowsum[64 + ln.r1];
  if constexpr (C::kPersistent) sm90::mbar_arrive(s.rowsum_read);
  const float out_mult = output_unscale<C>();
  if constexpr (!C::kFp8Math) {
    if (slot >= 0) {  // a part of a split item: its raw state, for the combine entry
      store_partial<C>(a, ln, lane, slot, o, out_mult, m0, m1, L0, L1);
      return;
    }
  }
  auto row_factor = [&](int r, float L, float m) {
    if (L == 0.0f) return 0.0f;  // no valid slot: out = 0 whatever the sink
    float den = L;
    if constexpr (C::kSink) {
      if (r < C::kHeadsPerCta) den += fast_exp2(__ldg(a.attn_sink + head0 + r) * kLog2e - m);
    }
    return out_mult / den;
  };
  const float f0 = row_factor(ln.r0, L0, m0), f1 = row_factor(ln.r1, L1, m1);

  if constexpr (C::kEmitLse) {
    if (ln.wg == 0 && ln.tig == 0) {
      float* lse = a.lse + token * C::kNumHeads + head0;
      if (ln.r0 < C::kHeadsPerCta) lse[ln.r0] = L0 == 0.0f ? pos_inf() : (m0 + fast_log2(L0)) * kLn2;
      if (ln.r1 < C::kHeadsPerCta) lse[ln.r1] = L1 == 0.0f ? pos_inf() : (m1 + fast_log2(L1)) * kLn2;
    }
  }

  if constexpr (C::kPersistent) {
    static_assert(!DIM_PAIRS_SPLIT, "the persistent epilogue stores the wgmma accumulator layout");
    // Straight from registers, 8 bytes per lane: in 16-column group kk a quad holds words A_tig
    // (columns 2 tig, 2 tig + 1) and B_tig (8 + 2 tig, ...) of each of its rows; one exchange with
    // the partner lane gives even lanes A_tig A_tig+1 (columns 2 tig .. + 3) and odd lanes
    // B_tig-1 B_tig (8 + 2 tig - 2 .. + 3), so a quad's four stores cover the group's 32 bytes.
    unsigned char* out = static_cast<unsigned char*>(a.out) + (token * C::kNumHeads + head0) * static_cast<i64>(kVDim * 2);
    const bool odd = (ln.tig & 1) != 0;
    const int col = 256 * ln.wg + 8 * (ln.tig & 1) + 4 * (ln.tig >> 1);
    unsigned char* row0 = out + static_cast<i64>(ln.r0) * (kVDim * 2) + col * 2;
    unsigned char* row1 = out + static_cast<i64>(ln.r1) * (kVDim * 2) + col * 2;
    auto store_pair = [&](unsigned char* dst, bool row_valid, u32 a_word, u32 b_word) {
      const u32 got = __shfl_xor_sync(0xFFFFFFFFu, odd ? a_word : b_word, 1);
      // Streaming store (.cs, evict first): the output is not re-read; keep L2 for the gathered rows.
      if (row_valid) {
        asm volatile("st.global.cs.v2.b32 [%0], {%1, %2};\n" ::"l"(dst), "r"(odd ? got : a_word), "r"(odd ? b_word : got)
                     : "memory");
      }
    };
    const bool valid0 = ln.r0 < C::kHeadsPerCta, valid1 = ln.r1 < C::kHeadsPerCta;
#pragma unroll
    for (int kk = 0; kk < 16; ++kk) {
      store_pair(row0 + 32 * kk, valid0, pack_bf16x2(o[8 * kk + 0] * f0, o[8 * kk + 1] * f0),
                 pack_bf16x2(o[8 * kk + 4] * f0, o[8 * kk + 5] * f0));
      store_pair(row1 + 32 * kk, valid1, pack_bf16x2(o[8 * kk + 2] * f1, o[8 * kk + 3] * f1),
                 pack_bf16x2(o[8 * kk + 6] * f1, o[8 * kk + 7] * f1));
    }
    return;
  }
  // Stage: row r of the output at s.q + r * 1024, 16-byte chunk c (of 64) at (c ^ (r % 8)).
  if constexpr (DIM_PAIRS_SPLIT) {
    // Dims 16 kk + 4 tig .. + 3 of rows r0 / r1: byte 8 (tig & 1) of 16-byte chunk 2 kk + tig / 2.
    // A warp's store covers 8 rows x 32 bytes, two per bank group after the swizzle: 2 wavefronts.
    const u32 r0 = static_cast<u32>(ln.r0), r1 = static_cast<u32>(ln.r1);
    const u32 half = 8u * static_cast<u32>(ln.tig & 1);
#pragma unroll
    for (int kk = 0; kk < 16; ++kk) {
      const u32 chunk = static_cast<u32>(32 * ln.wg + 2 * kk + (ln.tig >> 1));
      sm90::sts64(s.q + r0 * 1024u + ((chunk ^ (r0 & 7u)) << 4) + half, pack_bf16x2(o[8 * kk + 0] * f0, o[8 * kk + 4] * f0),
                  pack_bf16x2(o[8 * kk + 1] * f0, o[8 * kk + 5] * f0));
      sm90::sts64(s.q + r1 * 1024u + ((chunk ^ (r1 & 7u)) << 4) + half, pack_bf16x2(o[8 * kk + 2] * f1, o[8 * kk + 6] * f1),
                  pack_bf16x2(o[8 * kk + 3] * f1, o[8 * kk + 7] * f1));
    }
  } else {
    const int m = lane >> 3;
    const u32 row = static_cast<u32>(16 * ln.w + (m & 1) * 8 + (lane & 7));
#pragma unroll
    for (int kk = 0; kk < 16; ++kk) {
      const u32 chunk = static_cast<u32>(32 * ln.wg + 2 * kk + (m >> 1));
      sm90::stmatrix_x4(s.q + row * 1024u + ((chunk ^ (row & 7u)) << 4), pack_bf16x2(o[8 * kk + 0] * f0, o[8 * kk + 1] * f0),
                        pack_bf16x2(o[8 * kk + 2] * f1, o[8 * kk + 3] * f1),
                        pack_bf16x2(o[8 * kk + 4] * f0, o[8 * kk + 5] * f0),
                        pack_bf16x2(o[8 * kk + 6] * f1, o[8 * kk + 7] * f1));
    }
  }
  sm90::named_bar_sync(ln.wg == 0 ? kBarOutWg0 : kBarOutWg1, 128);
  const int t = static_cast<int>(threadIdx.x) & 127;
  unsigned char* out = static_cast<unsigned char*>(a.out) + (token * C::kNumHeads + head0) * static_cast<i64>(kVDim * 2);
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    const int r = (t >> 5) + 4 * k;
    const u32 chunk = static_cast<u32>(32 * ln.wg + (t & 31));
    if (r < C::kHeadsPerCta) {
      u32 x, y, z, w;
      sm90::lds128(s.q + static_cast<u32>(r) * 1024u + ((chunk ^ (static_cast<u32>(r) & 7u)) << 4), x, y, z, w);
      // Streaming store (.cs, evict first): the output is not re-read; keep L2 for the gathered rows.
      asm volatile("st.global.cs.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(out + static_cast<i64>(r) * (kVDim * 2) + chunk * 16),
                   "r"(x), "r"(y), "r"(z), "r"(w)
                   : "memory");
    }
  }
}

// WG0: scores stage 0 (even blocks), owns output columns 0..255.
template <class C>
MJ_DEVICE void consume_wg0(const SparsePrefillArgs& a, const Smem& s, const Lane& ln, int lane, i64 token, int head0,
                           int steps, float q_unscale, u32 gs = 0, u32 item = 0, int slot = -1) {
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float p[32];
  u32 ps[16];
  float m0 = kMaxInit, m1 = kMaxInit, l0 = 0.0f, l1 = 0.0f;
  const float mult = score_multiplier<C>(a, q_unscale);
  const u64 dq = sm90::smem_desc_sw128(s.q, 16, 1024);
  const u64 dk0 = sm90::smem_desc_sw128(s.k[0], 16, 1024);
  const u64 dv0 = sm90::smem_desc_sw128(s.k[0], kTileBytes, 1024);  // V0 left: tiles 0..3
  const u64 dv1 = sm90::smem_desc_sw128(s.k[1], kTileBytes, 1024);  // V1 left
  const u32 p0_tile = s.k[0] + 8 * kTileBytes;                      // P0 in stage 0's rope tile
  const u64 dp1 = sm90::smem_desc_sw128(s.p1, 16, 1024);

  // Rotated (one item per CTA, the fp8 kernels): the next block's Q K^T is issued at the end of a
  // step, right behind the SS P V, the first one before the loop. The persistent kernel issues it at
  // the top of each step after waiting for the SS P V: rotated inside the item loop, ptxas rebuilt
  // both Q K^T descriptors around every wgmma (764 -> 860 instructions per step) and the steps ran
  // +2.6 %; not rotated, the step is 786 instructions and the kernel -2.1 % (32K) / -2.8 % (128K)
  // cycles against the rotated persistent one. (Not rotated with the SS P V left in
  // flight across the back edge, ptxas serialises the wgmma: C7514.)
  constexpr bool kRotated = !C::kPersistent;
  // S = Q K^T of the step's stage-0 block, waited for (the rotated loop's first one; every one of the
  // persistent kernel's).
  auto score_block = [&](u32 parity) {
    wait_full<C>(s, 0, 0, parity);
    issue_qk<0, kLeftTiles, C::kF16>(p, dq, dk0, true);
    wait_full<C>(s, 0, 1, parity);
    issue_qk<kLeftTiles, kQkTiles, C::kF16>(p, dq, dk0, false);
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::fence_regs(p);
  };
  if (kRotated && steps > 0) score_block(gs & 1u);
  for (int step = 0; step < steps; ++step) {
    const u32 parity = (gs + static_cast<u32>(step)) & 1u;
    if constexpr (!kRotated) score_block(parity);
    // Persistent: this item's Q K^T are all done (the last one was waited for above or at the end
    // of the previous step): the producer may load the next item's query tile.
    if constexpr (C::kPersistent) {
      if (step == steps - 1) sm90::mbar_arrive(s.q_free);
    }
    float mx0, mx1;
    scale_mask_scores<C::kColScale>(p, s.bias, s.colscale, 0 * 64, ln, mult, mult, mx0, mx1);
    const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
    const float alpha0 = fast_exp2(m0 - n0), alpha1 = fast_exp2(m1 - n1);
    scale_rows(o, alpha0, alpha1);
    l0 *= alpha0;
    l1 *= alpha1;
    exponentiate<C>(p, s, 0, ln, n0, n1, l0, l1);
    pack_p<C::kF16>(p, ps);
    if (ln.tig == 0) {
      s.max[ln.r0] = n0;
      s.max[ln.r1] = n1;
    }
    m0 = n0;
    m1 = n1;
    sm90::named_bar_arrive(kBarWg0Max, 256);

    sm90::wgmma_fence();
    issue_pv_rs<C::kF16>(o, ps, dv0);
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::fence_regs(o);
    release_half<C>(s, s.empty[0][0]);  // stage 0 left: scored and multiplied

    sm90::mbar_wait(s.max1_ready, parity);
    const float f0 = fast_exp2(m0 - s.max[ln.r0]), f1 = fast_exp2(m1 - s.max[ln.r1]);
    m0 = s.max[ln.r0];
    m1 = s.max[ln.r1];
    pack_p<C::kF16>(p, ps, f0, f1);
    store_p(p0_tile, ps, ln, lane);
    sm90::fence_proxy_async_smem();
    sm90::named_bar_arrive(kBarS0Ready, 256);
    scale_rows(o, f0, f1);
    l0 *= f0;
    l1 *= f1;

    sm90::named_bar_sync(kBarS1Ready, 256);
    sm90::wgmma_fence();
    issue_pv_ss<C::kF16>(o, dp1, dv1);
    sm90::wgmma_commit();
    if (kRotated && step + 1 < steps) {
      wait_full<C>(s, 0, 0, parity ^ 1u);
      issue_qk<0, kLeftTiles, C::kF16>(p, dq, dk0, true);
      sm90::wgmma_commit();
      sm90::wgmma_wait<1>();
      release_half<C>(s, s.empty[1][0]);  // stage 1 left: multiplied
      wait_full<C>(s, 0, 1, parity ^ 1u);
      issue_qk<kLeftTiles, kQkTiles, C::kF16>(p, dq, dk0, false);
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
    } else {
      sm90::wgmma_wait<0>();
      release_half<C>(s, s.empty[1][0]);
    }
    sm90::fence_regs(o);
    sm90::fence_regs(p);
  }
  finish<C>(a, s, ln, lane, token, head0, o, m0, m1, l0, l1, item, slot);
}

// WG1: scores stage 1 (odd blocks), owns output columns 256..511.
template <class C>
MJ_DEVICE void consume_wg1(const SparsePrefillArgs& a, const Smem& s, const Lane& ln, int lane, i64 token, int head0,
                           int steps, float q_unscale, u32 gs = 0, u32 item = 0, int slot = -1) {
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float p[32];
  u32 ps[16];
  float m0 = kMaxInit, m1 = kMaxInit, l0 = 0.0f, l1 = 0.0f;
  const float mult = score_multiplier<C>(a, q_unscale);
  const u64 dq = sm90::smem_desc_sw128(s.q, 16, 1024);
  const u64 dk1 = sm90::smem_desc_sw128(s.k[1], 16, 1024);
  const u64 dv1 = sm90::smem_desc_sw128(s.k[1] + kLeftTiles * kTileBytes, kTileBytes, 1024);  // V1 right: tiles 4..7
  const u64 dv0 = sm90::smem_desc_sw128(s.k[0] + kLeftTiles * kTileBytes, kTileBytes, 1024);  // V0 right
  const u64 dp0 = sm90::smem_desc_sw128(s.k[0] + 8 * kTileBytes, 16, 1024);

  for (int step = 0; step < steps; ++step) {
    const u32 parity = (gs + static_cast<u32>(step)) & 1u;
    if constexpr (C::kPersistent) {  // the rope tile first: it has its own, earlier refill
      wait_stage_bar<C>(s.rope1_full, parity);
      issue_qk<kQkTiles - 1, kQkTiles, C::kF16>(p, dq, dk1, true);
      wait_full<C>(s, 1, 1, parity);
      issue_qk<kLeftTiles, kQkTiles - 1, C::kF16>(p, dq, dk1, false);
    } else {
      wait_full<C>(s, 1, 1, parity);
      issue_qk<kLeftTiles, kQkTiles, C::kF16>(p, dq, dk1, true);
    }
    wait_full<C>(s, 1, 0, parity);
    issue_qk<0, kLeftTiles, C::kF16>(p, dq, dk1, false);
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::fence_regs(p);
    if constexpr (C::kPersistent) {
      sm90::mbar_arrive(s.rope1_empty);                    // stage 1's rope tile: scored
      if (step == steps - 1) sm90::mbar_arrive(s.q_free);  // the item's last Q K^T is done
    }

    float mx0, mx1;
    scale_mask_scores<C::kColScale>(p, s.bias, s.colscale, 1 * 64, ln, mult, mult, mx0, mx1);
    sm90::named_bar_sync(kBarWg0Max, 256);
    const float n0 = fmaxf(s.max[ln.r0], mx0), n1 = fmaxf(s.max[ln.r1], mx1);
    const float alpha0 = fast_exp2(m0 - n0), alpha1 = fast_exp2(m1 - n1);
    scale_rows(o, alpha0, alpha1);
    l0 *= alpha0;
    l1 *= alpha1;
    exponentiate<C>(p, s, 1, ln, n0, n1, l0, l1);
    pack_p<C::kF16>(p, ps);
    // Every lane of the quad read s.max[r] above; lane tig 0 overwrites it. No barrier lies between
    // (WG0's side is ordered by kBarS1Ready), so the warp syncs: lanes are not lockstep, and
    // racecheck reported the read / write pair as a warp-level WAR hazard.
    __syncwarp();
    if (ln.tig == 0) {
      s.max[ln.r0] = n0;
      s.max[ln.r1] = n1;
      sm90::mbar_arrive(s.max1_ready);  // each writer releases its own stores
    }
    m0 = n0;
    m1 = n1;

    sm90::wgmma_fence();
    issue_pv_rs<C::kF16>(o, ps, dv1);
    sm90::wgmma_commit();
    store_p(s.p1, ps, ln, lane);
    sm90::named_bar_sync(kBarS0Ready, 256);
    sm90::wgmma_fence();
    issue_pv_ss<C::kF16>(o, dp0, dv0);
    sm90::wgmma_commit();
    sm90::fence_proxy_async_smem();
    sm90::named_bar_arrive(kBarS1Ready, 256);
    sm90::wgmma_wait<1>();
    release_half<C>(s, s.empty[1][1]);  // stage 1 right (one-item kernels: and its rope tile): done
    sm90::wgmma_wait<0>();
    release_half<C>(s, s.empty[0][1]);  // stage 0 right (and P0 in its rope tile): done
    sm90::fence_regs(o);
  }
  finish<C>(a, s, ln, lane, token, head0, o, m0, m1, l0, l1, item, slot);
}

}  // namespace sparse_prefill_sm90
}  // namespace mj

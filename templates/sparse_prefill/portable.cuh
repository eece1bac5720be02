#pragma once
// sparse_prefill (SPEC §3), portable tensor-core path for sm_80 and newer: mma.sync m16n8k16 bf16
// with f32 accumulation, ldmatrix fragment loads, cp.async gathers of the selected latent rows by
// index, and an online softmax in the exp2 domain. It is also the kernel the generator picks on
// sm_90a for configurations where the Hopper kernel is not the better choice (plan.hpp).
//
// Work split. One CTA handles one query token and one tile of kHeadsPerCta = 16 * M_TILES heads
// (heads past num_heads are padding: zero Q rows, never stored). The CTA has 2 * M_TILES warps; a
// *pair* of warps (mi, kh) owns the 16 heads of row tile mi:
//   S = Q K^T : warp kh computes the 16 heads x (KEY_TILE / 2) keys of its key half over all 576
//               depths; the pair exchanges row maxima through shared memory (named barrier).
//   O += P V  : P (bf16, 16 x KEY_TILE) goes through shared memory; warp kh accumulates the 16 heads
//               x 256 value dims of its dim half, in registers (128 f32 per thread).
// Keys are processed KEY_TILE at a time; the gather of the next tile (cp.async, 16 B per thread and
// instruction) overlaps the tensor-core work of the current one:
//   bf16 KV: two K buffers in shared memory, ping-pong.
//   fp8 KV : one fp8 staging buffer (cp.async target) and one bf16 K buffer; at the top of each
//            step the staged tile is converted to bf16, then the next tile's gather is issued.
//
// FP8 scales (quantization granularity g = elements per scale, scales_per_token = 576 / g):
//   g == 0           unit scales: fp8 -> bf16 is exact.
//   g % 16 == 0      exact path: K is stored as the exact bf16 of the fp8 value; S is accumulated
//                    per scale group (g / 16 k-steps) and each group's partial dot is multiplied
//                    by the key's f32 scale; for V the P fragment is multiplied by the key's scale
//                    of the dim group (g == 576: folded into P once, in f32). Scores therefore
//                    carry f32 rounding only, as the reference on decoded inputs does.
//   otherwise        K = bf16(fp8 * scale) at conversion (one bf16 rounding per element); scores
//                    carry ~2^-9 relative noise per term. Scales are read from global memory.
//
// Validity (SPEC §3): slot j of token t is read iff j < min(topk_lengths[t], indices_stride),
// int(indices[t, j]) >= 0 and tma_row(indices[t, j]) < num_kv_rows. Other slots get zero-filled
// shared rows (cp.async with src-size 0 reads nothing) and a -inf score bias. A row with no valid
// slot writes out = 0 and lse = +inf. With a sink, out = sum_j e^(p_j - m) V_j / (l + e^(sink - m));
// lse = m + ln l never includes the sink.
#include "common/convert.cuh"
#include "common/fast_math.cuh"
#include "common/types.cuh"
#include "sparse_prefill/args.h"
#include "sparse_prefill/layout.h"

namespace mj {
namespace sparse_prefill_portable {

// ---- inline PTX primitives (no toolkit headers in generated code) -------------------------------

MJ_DEVICE u32 smem_u32(const void* p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

// 16-byte global -> shared copy; src_bytes 0 zero-fills the destination and reads nothing.
MJ_DEVICE void cp_async_16(u32 dst, const void* src, bool read) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(read ? 16 : 0)
               : "memory");
}
MJ_DEVICE void cp_async_4(u32 dst, const void* src, bool read) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(read ? 4 : 0)
               : "memory");
}
MJ_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
MJ_DEVICE void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

MJ_DEVICE void ldsm_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
MJ_DEVICE void ldsm_x4_trans(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// D += A(16x16 bf16, row) * B(16x8 bf16, col), f32 accumulators.
MJ_DEVICE void mma_bf16_16816(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Elementwise bf16x2 product (fma with -0 keeps the sign of zero products); sm_80 has bf16x2 fma.
MJ_DEVICE u32 mul_bf16x2(u32 a, u32 b) {
  u32 d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
}

// Barrier among the 64 threads of one warp pair (ids 1..4; 0 is __syncthreads).
MJ_DEVICE void pair_barrier(int id) { asm volatile("bar.sync %0, 64;\n" ::"r"(id) : "memory"); }

MJ_DEVICE void lds_128(u32 addr, u32 (&w)[4]) {
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "r"(addr));
}
MJ_DEVICE void sts_128(u32 addr, u32 w0, u32 w1, u32 w2, u32 w3) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(w0), "r"(w1), "r"(w2), "r"(w3) : "memory");
}
MJ_DEVICE float shfl_xor(float v, int mask) {
  float r;
  asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;\n" : "=f"(r) : "f"(v), "r"(mask));
  return r;
}


// ---- configuration -------------------------------------------------------------------------------

template <int NUM_HEADS, int M_TILES, int KEY_TILE, bool KV_FP8, int QUANT_GRANULARITY, bool ATTN_SINK, bool EMIT_LSE,
          int PAGE_SIZE>
struct Config {
  // Shared-memory regions and thread count: sparse_prefill/layout.h (the host plan reads the same).
  static constexpr sparse_prefill_layout::PortableLayout kLayout =
      sparse_prefill_layout::portable_layout(NUM_HEADS, M_TILES, KEY_TILE, KV_FP8, QUANT_GRANULARITY);
  static constexpr int kNumHeads = NUM_HEADS;
  static constexpr int kMTiles = M_TILES;  // 16-head MMA row tiles per CTA
  static constexpr int kHeadsPerCta = kLayout.heads_per_cta;
  static constexpr int kHeadTiles = kLayout.head_tiles;
  static constexpr int kWarps = 2 * M_TILES;
  static constexpr int kThreads = kLayout.threads;
  static constexpr int kKeys = KEY_TILE;  // keys per pipeline step
  static constexpr bool kFp8 = KV_FP8;
  static constexpr int kQuantGranularity = KV_FP8 ? QUANT_GRANULARITY : 0;
  static constexpr int kScalesPerToken = kQuantGranularity > 0 ? 576 / kQuantGranularity : 0;
  // 0: unit scales or bf16; 1: exact per-group scaling; 2: scale folded into the bf16 dequant.
  static constexpr int kScaleMode = kQuantGranularity == 0 ? 0 : (kQuantGranularity % 16 == 0 ? 1 : 2);
  static constexpr bool kSink = ATTN_SINK;
  static constexpr bool kLse = EMIT_LSE;
  static constexpr int kPageSize = PAGE_SIZE;

  static constexpr int kQkDepth = sparse_prefill_layout::kQkDim, kVDepth = sparse_prefill_layout::kVDim;
  static constexpr int kRowBytes = kQkDepth * 2;        // one bf16 row of Q or K in shared memory
  static constexpr int kRowChunks = kRowBytes / 16;     // 72 chunks of 16 B
  static constexpr int kFp8RowChunks = kQkDepth / 16;   // 36
  static constexpr int kThreadsPerRow = kThreads / kKeys;
  static constexpr int kPRowBytes = kLayout.p_row_bytes;

  static constexpr int kQBytes = kLayout.q_bytes;
  static constexpr int kKBytes = kLayout.k_bytes;
  static constexpr int kPBytes = kLayout.p_bytes;
  static constexpr int kOffQ = kLayout.off_q;
  static constexpr int kOffK = kLayout.off_k;
  static constexpr int kOffStage = kLayout.off_stage;
  static constexpr int kOffScaleStage = kLayout.off_scale_stage;
  static constexpr int kOffScale = kLayout.off_scale;
  static constexpr int kOffP = kLayout.off_p;
  static constexpr int kOffBias = kLayout.off_bias;
  static constexpr int kOffRed = kLayout.off_red;
  static constexpr int kSmemBytes = kLayout.smem_bytes;

  static_assert(NUM_HEADS >= 16 && NUM_HEADS <= 128 && NUM_HEADS % 16 == 0, "num_heads: multiple of 16 in [16, 128]");
  static_assert(M_TILES >= 1 && M_TILES <= sparse_prefill_layout::kPortableMaxMTiles,
                "1..4 row tiles per CTA (named barriers 1..4)");
  static_assert(KEY_TILE == 32 || KEY_TILE == 64, "key tile 32 or 64");
  static_assert(kThreads % kKeys == 0, "whole threads per gathered row");
  static_assert(kQuantGranularity == 0 || 576 % kQuantGranularity == 0, "quantization granularity divides 576");
  static_assert((PAGE_SIZE & (PAGE_SIZE - 1)) == 0, "page size is a power of two");
  static_assert(kQBytes % 128 == 0 && kKBytes % 128 == 0 && kPBytes % 16 == 0, "alignment");
};

// Byte offset of 16-byte chunk `c` of row `r` in a 1152-byte-row tile: the chunk index is XORed with
// r & 7 so that 8 consecutive rows at one chunk column hit 8 different bank groups (ldmatrix).
MJ_DEVICE u32 swz(int r, int c) { return static_cast<u32>(r * 1152 + ((c ^ (r & 7)) << 4)); }

// Offsets of the 4 chunks 2v + half (v = 0..3) of an 8-chunk group, XOR-swizzled with x = row & 7:
// chunk 8u + 2v + half lands at 128 u + off[v]. Hoists the swizzle out of unrolled k loops.
MJ_DEVICE void swizzle_offsets(int x, int half, u32 (&off)[4]) {
#pragma unroll
  for (int v = 0; v < 4; ++v) off[v] = static_cast<u32>((((2 * v) ^ (x & 6)) | (half ^ (x & 1))) << 4);
}

// The (flattened) gather state of one row of a key tile, computed by the threads that copy it.
struct RowSlot {
  long long row;  // absolute row (tma_row + layer_row_offset); valid only if `valid`
  bool valid;
};

template <class C>
MJ_DEVICE RowSlot resolve_slot(const SparsePrefillArgs& a, const unsigned* idx_row, int len, int j) {
  RowSlot s{0, false};
  if (j < len) {
    const unsigned e = idx_row[j];
    if (static_cast<int>(e) >= 0) {
      const long long tma_row = static_cast<long long>(e / C::kPageSize) * a.row_stride + (e % C::kPageSize);
      if (tma_row < a.num_kv_rows) {
        s.row = tma_row + a.layer_row_offset;
        s.valid = true;
      }
    }
  }
  return s;
}

// Issues the cp.async copies of this thread's part of key tile `tile` (row `row`, chunks
// sub, sub + kThreadsPerRow, ...) and writes the tile's score bias (0 or -inf) for the row.
template <class C>
MJ_DEVICE RowSlot issue_tile(const SparsePrefillArgs& a, const unsigned* idx_row, int len, int tile, int row, int sub,
                             u32 k_dst, u32 stage_dst, u32 scale_dst, float* bias) {
  const RowSlot s = resolve_slot<C>(a, idx_row, len, tile * C::kKeys + row);
  if (sub == 0) bias[row] = s.valid ? 0.f : neg_inf();
  if constexpr (!C::kFp8) {
    const unsigned char* src = static_cast<const unsigned char*>(a.kv_blocks) + (s.valid ? s.row * C::kRowBytes : 0);
#pragma unroll
    for (int c = sub; c < C::kRowChunks; c += C::kThreadsPerRow) cp_async_16(k_dst + swz(row, c), src + c * 16, s.valid);
  } else {
    const unsigned char* src = static_cast<const unsigned char*>(a.kv_blocks) + (s.valid ? s.row * C::kQkDepth : 0);
    const u32 dst = stage_dst + row * C::kQkDepth;
#pragma unroll
    for (int c = sub; c < C::kFp8RowChunks; c += C::kThreadsPerRow) cp_async_16(dst + c * 16, src + c * 16, s.valid);
    if constexpr (C::kScaleMode == 1) {
      const float* ssrc = a.kv_scales + (s.valid ? s.row * C::kScalesPerToken : 0);
      const u32 sdst = scale_dst + row * C::kScalesPerToken * 4;
#pragma unroll
      for (int i = sub; i < C::kScalesPerToken; i += C::kThreadsPerRow) cp_async_4(sdst + i * 4, ssrc + i, s.valid);
    }
  }
  return s;
}

// fp8 only: converts this thread's staged chunks of row `row` to bf16 in the K buffer (and copies
// the row's staged scales for the exact-scale path).
template <class C>
MJ_DEVICE void convert_tile(const SparsePrefillArgs& a, unsigned char* smem, int row, int sub, const RowSlot& slot) {
  const u32 stage = smem_u32(smem) + C::kOffStage + row * C::kQkDepth;
  const u32 k = smem_u32(smem) + C::kOffK;
  // Not unrolled: the 128 O accumulators are live here; a rolled loop keeps the conversion's
  // registers to one chunk's worth (it is a small part of a step's work).
#pragma unroll 1
  for (int c = sub; c < C::kFp8RowChunks; c += C::kThreadsPerRow) {
    u32 w[4];
    lds_128(stage + c * 16, w);
    u32 o[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const u16 pair = static_cast<u16>(w[i >> 1] >> ((i & 1) * 16));
      const u32 h2 = e4m3x2_to_f16x2(pair);
      float lo = f16_to_f32(static_cast<u16>(h2 & 0xFFFFu));
      float hi = f16_to_f32(static_cast<u16>(h2 >> 16));
      if constexpr (C::kScaleMode == 2) {
        if (slot.valid) {
          const float* srow = a.kv_scales + slot.row * C::kScalesPerToken;
          lo *= srow[(c * 16 + 2 * i) / C::kQuantGranularity];
          hi *= srow[(c * 16 + 2 * i + 1) / C::kQuantGranularity];
        }
      }
      o[i] = pack_bf16x2(lo, hi);
    }
    sts_128(k + swz(row, 2 * c), o[0], o[1], o[2], o[3]);
    sts_128(k + swz(row, 2 * c + 1), o[4], o[5], o[6], o[7]);
  }
  if constexpr (C::kScaleMode == 1) {
    const float* src = reinterpret_cast<const float*>(smem + C::kOffScaleStage) + row * C::kScalesPerToken;
    float* dst = reinterpret_cast<float*>(smem + C::kOffScale) + row * C::kScalesPerToken;
#pragma unroll
    for (int i = sub; i < C::kScalesPerToken; i += C::kThreadsPerRow) dst[i] = src[i];
  }
}

// ---- the kernel body -------------------------------------------------------------------------------

template <class C>
MJ_DEVICE void run(const SparsePrefillArgs& a) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int KT = C::kKeys;
  constexpr int NTS = KT / 16;  // 8-key n-tiles of S per warp (its key half)
  constexpr int HALF = KT / 2;

  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int mi = warp >> 1, kh = warp & 1;
  const int g = lane >> 2, t4 = lane & 3;

  const long long token = blockIdx.x / C::kHeadTiles;
  const int head0 = (blockIdx.x % C::kHeadTiles) * C::kHeadsPerCta;

  unsigned len = a.topk_lengths[token];
  if (len > static_cast<unsigned long long>(a.indices_stride)) len = static_cast<unsigned>(a.indices_stride);
  const int num_tiles = static_cast<int>((len + KT - 1) / KT);
  const unsigned* idx_row = a.indices + token * a.indices_stride;

  const u32 s_base = smem_u32(smem);
  const u32 q_s = s_base + C::kOffQ;
  const u32 k_s = s_base + C::kOffK;
  const u32 stage_s = s_base + C::kOffStage;
  const u32 scale_stage_s = s_base + C::kOffScaleStage;
  const u32 p_s = s_base + C::kOffP;
  float* bias_s = reinterpret_cast<float*>(smem + C::kOffBias);     // [2][KT]
  float* red_max = reinterpret_cast<float*>(smem + C::kOffRed);     // [2][kHeadsPerCta]
  float* red_sum = red_max + 2 * C::kHeadsPerCta;                   // [2][kHeadsPerCta]
  const float* scale_s = reinterpret_cast<const float*>(smem + C::kOffScale);

  // Gather role: every thread copies chunks of one row of each key tile.
  const int g_row = tid / C::kThreadsPerRow, g_sub = tid % C::kThreadsPerRow;

  // Prologue: Q tile (padding heads zero-filled) and key tile 0 in one cp.async group.
  RowSlot cur_slot{0, false};
  if (num_tiles > 0) {
    const unsigned char* q = static_cast<const unsigned char*>(a.q);
    for (int i = tid; i < C::kHeadsPerCta * C::kRowChunks; i += C::kThreads) {
      const int r = i / C::kRowChunks, c = i % C::kRowChunks;
      const bool real = head0 + r < C::kNumHeads;
      const long long off = real ? ((token * C::kNumHeads + head0 + r) * C::kRowBytes + c * 16) : 0;
      cp_async_16(q_s + swz(r, c), q + off, real);
    }
    cur_slot = issue_tile<C>(a, idx_row, static_cast<int>(len), 0, g_row, g_sub, k_s, stage_s, scale_stage_s, bias_s);
    cp_async_commit();
  }

  // Per-thread ldmatrix addressing. Rows of every operand tile start at multiples of 8, so the
  // swizzle XOR of a lane's row is lane & 7 throughout.
  u32 a_off[4], b_off[4], v_off[4];
  swizzle_offsets(lane & 7, lane >> 4, a_off);        // Q as A: rows lane & 15, chunk half lane >> 4
  swizzle_offsets(lane & 7, (lane >> 3) & 1, b_off);  // K as B: rows (lane & 7) + 8 (lane >> 4), half (lane >> 3) & 1
  swizzle_offsets(lane & 7, lane >> 4, v_off);        // V (trans): rows (lane & 7) + 8 ((lane >> 3) & 1), half lane >> 4
  const u32 q_row_addr = q_s + (16 * mi + (lane & 15)) * C::kRowBytes;
  const int k_row_in_half = (lane & 7) + ((lane >> 4) << 3);
  const int v_row_in_step = (lane & 7) + (((lane >> 3) & 1) << 3);
  const u32 p_row_addr = p_s + (16 * mi + (lane & 15)) * C::kPRowBytes + (lane >> 4) * 16;

  float o[32][4];
#pragma unroll
  for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_run[2] = {neg_inf(), neg_inf()};  // running max (exp2 domain) of rows g, g + 8
  float l_run[2] = {0.f, 0.f};              // this thread's partial row sums

  const float sl2e = a.sm_scale_log2e;

  for (int it = 0; it < num_tiles; ++it) {
    cp_async_wait_all();
    __syncthreads();  // tile `it` landed for everyone; step it-1 is finished by everyone
    u32 kbuf;
    const float* bias = bias_s + (it & 1) * KT;
    if constexpr (C::kFp8) {
      convert_tile<C>(a, smem, g_row, g_sub, cur_slot);
      __syncthreads();  // bf16 K tile complete; staging buffer free
      kbuf = k_s;
      if (it + 1 < num_tiles) {
        cur_slot = issue_tile<C>(a, idx_row, static_cast<int>(len), it + 1, g_row, g_sub, k_s, stage_s, scale_stage_s,
                                 bias_s + ((it + 1) & 1) * KT);
        cp_async_commit();
      }
    } else {
      kbuf = k_s + (it & 1) * C::kKBytes;
      if (it + 1 < num_tiles) {
        issue_tile<C>(a, idx_row, static_cast<int>(len), it + 1, g_row, g_sub, k_s + ((it + 1) & 1) * C::kKBytes, 0, 0,
                      bias_s + ((it + 1) & 1) * KT);
        cp_async_commit();
      }
    }

    // ---- S = Q K^T for this warp's 16 heads x HALF keys --------------------------------------
    float s[NTS][4];
#pragma unroll
    for (int j = 0; j < NTS; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
    const u32 k_row_addr = kbuf + (kh * HALF + k_row_in_half) * C::kRowBytes;

    constexpr int KB = C::kScaleMode == 1 ? C::kQuantGranularity / 16 : 36;  // k-steps per scale group
    constexpr int NB = 36 / KB;
    if constexpr (NB == 1) {
      // One accumulation over all 36 k-steps. ldmatrix is volatile (it must stay between the
      // barriers), so the next step's fragments are loaded explicitly before this step's MMAs:
      // with two warps per scheduler, nothing else hides the shared-memory latency.
      u32 fa[2][4], fb[2][NTS / 2][4];
#pragma unroll
      for (int ks = 0; ks < 37; ++ks) {
        if (ks < 36) {
          const int nb = ks & 1;
          ldsm_x4(q_row_addr + (ks >> 2) * 128 + a_off[ks & 3], fa[nb][0], fa[nb][1], fa[nb][2], fa[nb][3]);
#pragma unroll
          for (int np = 0; np < NTS / 2; ++np)
            ldsm_x4(k_row_addr + np * 16 * C::kRowBytes + (ks >> 2) * 128 + b_off[ks & 3], fb[nb][np][0],
                    fb[nb][np][1], fb[nb][np][2], fb[nb][np][3]);
        }
        if (ks > 0) {
          const int cb = (ks - 1) & 1;
#pragma unroll
          for (int np = 0; np < NTS / 2; ++np) {
            mma_bf16_16816(s[2 * np], fa[cb][0], fa[cb][1], fa[cb][2], fa[cb][3], fb[cb][np][0], fb[cb][np][1]);
            mma_bf16_16816(s[2 * np + 1], fa[cb][0], fa[cb][1], fa[cb][2], fa[cb][3], fb[cb][np][2], fb[cb][np][3]);
          }
        }
      }
    } else {
      // Several scale groups (exact fp8 scales): each group's partial dot is accumulated apart and
      // multiplied by the key's f32 scale. A rolled loop over the blocks: fully unrolled, the
      // compiler hoists fragment loads of later blocks and runs out of registers next to O.
#pragma unroll 1
      for (int b = 0; b < NB; ++b) {
        float tmp[NTS][4];
#pragma unroll
        for (int j = 0; j < NTS; ++j) tmp[j][0] = tmp[j][1] = tmp[j][2] = tmp[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KB; ++kk) {
          const int ks = b * KB + kk;
          // Swizzled chunk offsets: from the hoisted tables when ks & 3 is a compile-time constant
          // (KB % 4 == 0), computed otherwise (a run-time index would put the tables in local memory).
          constexpr bool kTable = KB % 4 == 0;
          const u32 qo =
              kTable ? (ks >> 2) * 128 + a_off[kk & 3] : static_cast<u32>(((2 * ks + (lane >> 4)) ^ (lane & 7)) << 4);
          const u32 ko = kTable ? (ks >> 2) * 128 + b_off[kk & 3]
                                : static_cast<u32>(((2 * ks + ((lane >> 3) & 1)) ^ (lane & 7)) << 4);
          u32 a0, a1, a2, a3;
          ldsm_x4(q_row_addr + qo, a0, a1, a2, a3);
#pragma unroll
          for (int np = 0; np < NTS / 2; ++np) {
            u32 b0, b1, b2, b3;
            ldsm_x4(k_row_addr + np * 16 * C::kRowBytes + ko, b0, b1, b2, b3);
            mma_bf16_16816(tmp[2 * np], a0, a1, a2, a3, b0, b1);
            mma_bf16_16816(tmp[2 * np + 1], a0, a1, a2, a3, b2, b3);
          }
        }
#pragma unroll
        for (int j = 0; j < NTS; ++j) {
          const int key = kh * HALF + 8 * j + 2 * t4;
          const float sc0 = scale_s[key * C::kScalesPerToken + b];
          const float sc1 = scale_s[(key + 1) * C::kScalesPerToken + b];
          s[j][0] += tmp[j][0] * sc0;
          s[j][1] += tmp[j][1] * sc1;
          s[j][2] += tmp[j][2] * sc0;
          s[j][3] += tmp[j][3] * sc1;
        }
      }
    }
    if constexpr (C::kScaleMode == 1 && NB == 1) {
#pragma unroll
      for (int j = 0; j < NTS; ++j) {
        const int key = kh * HALF + 8 * j + 2 * t4;
        const float sc0 = scale_s[key], sc1 = scale_s[key + 1];
        s[j][0] *= sc0;
        s[j][1] *= sc1;
        s[j][2] *= sc0;
        s[j][3] *= sc1;
      }
    }

    // ---- online softmax (exp2 domain) --------------------------------------------------------
    float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
    for (int j = 0; j < NTS; ++j) {
      const int key = kh * HALF + 8 * j + 2 * t4;
      const float b0 = bias[key], b1 = bias[key + 1];
      s[j][0] = s[j][0] * sl2e + b0;
      s[j][1] = s[j][1] * sl2e + b1;
      s[j][2] = s[j][2] * sl2e + b0;
      s[j][3] = s[j][3] * sl2e + b1;
      mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
      mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], shfl_xor(mx[r], 1));
      mx[r] = fmaxf(mx[r], shfl_xor(mx[r], 2));
    }
    if (t4 == 0) {
      red_max[kh * C::kHeadsPerCta + 16 * mi + g] = mx[0];
      red_max[kh * C::kHeadsPerCta + 16 * mi + g + 8] = mx[1];
    }
    pair_barrier(1 + mi);
    float alpha[2], base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int h = 16 * mi + g + 8 * r;
      const float m_new = fmaxf(m_run[r], fmaxf(red_max[h], red_max[C::kHeadsPerCta + h]));
      base[r] = m_new == neg_inf() ? 0.f : m_new;  // all-masked so far: every exponent is -inf
      alpha[r] = fast_exp2(m_run[r] - base[r]);
      m_run[r] = m_new;
    }
    float rs[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < NTS; ++j) {
      s[j][0] = fast_exp2(s[j][0] - base[0]);
      s[j][1] = fast_exp2(s[j][1] - base[0]);
      s[j][2] = fast_exp2(s[j][2] - base[1]);
      s[j][3] = fast_exp2(s[j][3] - base[1]);
      rs[0] += s[j][0] + s[j][1];
      rs[1] += s[j][2] + s[j][3];
    }
    l_run[0] = l_run[0] * alpha[0] + rs[0];
    l_run[1] = l_run[1] * alpha[1] + rs[1];
#pragma unroll
    for (int n = 0; n < 32; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    // P (bf16) to shared memory; with one scale per token (granularity 576) V's scale is folded in here.
    {
      unsigned char* prow = smem + C::kOffP + (16 * mi + g) * C::kPRowBytes;
#pragma unroll
      for (int j = 0; j < NTS; ++j) {
        const int key = kh * HALF + 8 * j + 2 * t4;
        float v0 = s[j][0], v1 = s[j][1], v2 = s[j][2], v3 = s[j][3];
        if constexpr (C::kScaleMode == 1 && C::kQuantGranularity == 576) {
          const float sc0 = scale_s[key], sc1 = scale_s[key + 1];
          v0 *= sc0;
          v1 *= sc1;
          v2 *= sc0;
          v3 *= sc1;
        }
        *reinterpret_cast<u32*>(prow + key * 2) = pack_bf16x2(v0, v1);
        *reinterpret_cast<u32*>(prow + 8 * C::kPRowBytes + key * 2) = pack_bf16x2(v2, v3);
      }
    }
    pair_barrier(1 + mi);

    // ---- O[16 x 256] += P[16 x KT] V[KT x 256] (this warp's dim half) -------------------------
    // Flattened over (k-step, dim pair) with the next V fragment (and, at a k-step boundary, the
    // next P fragment) loaded before the current MMAs, as in the S loop.
    {
      constexpr int NI = (KT / 16) * 16;
      u32 pa[2][4], vb[2][4];
      u32 qa0 = 0, qa1 = 0, qa2 = 0, qa3 = 0;  // P of the current k-step, scaled per key for the dim block
#pragma unroll
      for (int i = 0; i <= NI; ++i) {
        if (i < NI) {
          const int ks = i >> 4, dp = i & 15;
          if (dp == 0) ldsm_x4(p_row_addr + ks * 32, pa[ks & 1][0], pa[ks & 1][1], pa[ks & 1][2], pa[ks & 1][3]);
          const u32 v_row_addr = kbuf + (ks * 16 + v_row_in_step) * C::kRowBytes + kh * 512;
          ldsm_x4_trans(v_row_addr + (dp >> 2) * 128 + v_off[dp & 3], vb[i & 1][0], vb[i & 1][1], vb[i & 1][2],
                        vb[i & 1][3]);
        }
        if (i > 0) {
          const int c = i - 1, ks = c >> 4, dp = c & 15;
          const u32* p = pa[ks & 1];
          if (dp == 0) {
            qa0 = p[0];
            qa1 = p[1];
            qa2 = p[2];
            qa3 = p[3];
          }
          if constexpr (C::kScaleMode == 1 && C::kQuantGranularity != 576) {
            const int dim = kh * 256 + 16 * dp;
            if (dp == 0 || dim % C::kQuantGranularity == 0) {
              const int blk = dim / C::kQuantGranularity;
              const int key = ks * 16 + 2 * t4;
              const u32 sc01 = pack_bf16x2(scale_s[key * C::kScalesPerToken + blk],
                                           scale_s[(key + 1) * C::kScalesPerToken + blk]);
              const u32 sc89 = pack_bf16x2(scale_s[(key + 8) * C::kScalesPerToken + blk],
                                           scale_s[(key + 9) * C::kScalesPerToken + blk]);
              qa0 = mul_bf16x2(p[0], sc01);
              qa1 = mul_bf16x2(p[1], sc01);
              qa2 = mul_bf16x2(p[2], sc89);
              qa3 = mul_bf16x2(p[3], sc89);
            }
          }
          const u32* b = vb[c & 1];
          mma_bf16_16816(o[2 * dp], qa0, qa1, qa2, qa3, b[0], b[1]);
          mma_bf16_16816(o[2 * dp + 1], qa0, qa1, qa2, qa3, b[2], b[3]);
        }
      }
    }
  }

  // ---- epilogue: combine the pair's row sums, normalize, store --------------------------------
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += shfl_xor(l_run[r], 1);
    l_run[r] += shfl_xor(l_run[r], 2);
  }
  if (t4 == 0) {
    red_sum[kh * C::kHeadsPerCta + 16 * mi + g] = l_run[0];
    red_sum[kh * C::kHeadsPerCta + 16 * mi + g + 8] = l_run[1];
  }
  pair_barrier(1 + mi);
  constexpr float kLn2 = 0.693147180559945309f;
  constexpr float kLog2e = 1.442695040888963407f;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int hl = 16 * mi + g + 8 * r;
    const int head = head0 + hl;
    const float l = red_sum[hl] + red_sum[C::kHeadsPerCta + hl];
    float inv = 0.f;
    float lse = pos_inf();
    if (l > 0.f) {  // at least one valid key (the maximal one contributes exp2(0) = 1)
      float denom = l;
      if constexpr (C::kSink) {
        if (head < C::kNumHeads) denom += fast_exp2(a.attn_sink[head] * kLog2e - m_run[r]);
      }
      inv = 1.f / denom;  // sink +inf: denom inf, out 0
      lse = (m_run[r] + fast_log2(l)) * kLn2;
    }
    if (head < C::kNumHeads) {
      unsigned char* orow = static_cast<unsigned char*>(a.out) + ((token * C::kNumHeads + head) * C::kVDepth) * 2;
#pragma unroll
      for (int n = 0; n < 32; ++n) {
        const int col = kh * 256 + 8 * n + 2 * t4;
        *reinterpret_cast<u32*>(orow + col * 2) = pack_bf16x2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
      }
      if constexpr (C::kLse) {
        if (kh == 0 && t4 == 0) a.lse[token * C::kNumHeads + head] = lse;
      }
    }
  }
}

}  // namespace sparse_prefill_portable
}  // namespace mj

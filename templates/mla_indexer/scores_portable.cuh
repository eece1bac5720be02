#pragma once
// Indexer scores for targets without wgmma (sm_80, sm_86, sm_89, plain sm_90): plain f32 FMAs.
// Correctness over speed: one CTA per (query row, key split); the row's q is decoded once into
// shared memory as f32, each thread decodes one key at a time into registers and loops over heads.
// fp8 decodes are exact (hardware cvt on sm_89+, the software decoder of convert.cuh on sm_80).
#include "common/convert.cuh"
#include "common/types.cuh"
#include "mla_indexer/common.cuh"
#include "mla_indexer/layout.h"

namespace mj {
namespace indexer_portable {

// Eight fp8 values (one 8-byte word, lowest byte first) to f32, exactly.
MJ_DEVICE void decode8(u64 v, float* out) {
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const u16 pair = static_cast<u16>(v >> (16 * p));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    const u32 h2 = e4m3x2_to_f16x2(pair);
    out[2 * p] = f16_to_f32(static_cast<u16>(h2 & 0xFFFFu));
    out[2 * p + 1] = f16_to_f32(static_cast<u16>(h2 >> 16));
#else
    out[2 * p] = e4m3_to_f32(static_cast<u8>(pair & 0xFFu));
    out[2 * p + 1] = e4m3_to_f32(static_cast<u8>(pair >> 8));
#endif
  }
}

template <int H, int PAGE_SHIFT, bool CAUSAL, bool PAGE_SCALES = false>
__device__ __forceinline__ void scores_portable(const MlaIndexerScoresArgs& a) {
  constexpr int D = indexer::kDepth;
  constexpr int kThreads = indexer::kPortableThreads;
  // indexer::portable_smem_bytes(H) (layout.h): q as f32 [H][D], then the weights [H].
  extern __shared__ __align__(16) u8 smem_raw[];
  float* q_f = reinterpret_cast<float*>(smem_raw);  // [H][D]
  float* w_f = q_f + H * D;                         // [H]

  const long long r = blockIdx.x;  // row within the chunk
  const long long t = a.chunk_row_begin + r;
  if (r >= a.chunk_rows || t >= a.num_tokens) return;
  const indexer::TokenInfo ti =
      indexer::token_info(a.input_row_offsets, a.cache_lengths, a.batch, t, a.max_keys, CAUSAL);
  const long long split_lo = static_cast<long long>(blockIdx.y) * a.keys_per_split;
  if (!ti.valid || split_lo >= ti.visible) return;
  const long long split_hi = split_lo + a.keys_per_split < ti.visible ? split_lo + a.keys_per_split : ti.visible;

  const u64* q_words = reinterpret_cast<const u64*>(a.q + t * H * D);
  for (int w = threadIdx.x; w < H * D / 8; w += kThreads) decode8(q_words[w], q_f + 8 * w);
  for (int h = threadIdx.x; h < H; h += kThreads) w_f[h] = a.qs[t * H + h];
  __syncthreads();

  for (long long j = split_lo + threadIdx.x; j < split_hi; j += kThreads) {
    const long long row = indexer::key_row(a.lookup_table, a.pages_per_seq, a.num_blocks, a.block_row_stride,
                                           a.layer_row_offset, PAGE_SHIFT, ti.seq, j);
    float score = 0.0f;
    if (row >= 0) {
      float k[D];
      const u64* k_words = reinterpret_cast<const u64*>(a.k_blocks + row * D);
#pragma unroll
      for (int w = 0; w < D / 8; ++w) decode8(k_words[w], k + 8 * w);
      float sum = 0.0f;
      for (int h = 0; h < H; ++h) {
        const float* qh = q_f + h * D;
        float dot = 0.0f;
#pragma unroll
        for (int d = 0; d < D; ++d) dot = fmaf(qh[d], k[d], dot);
        sum = fmaf(fmaxf(dot, 0.0f), w_f[h], sum);
      }
      score = sum * a.k_scales[indexer::scale_index<PAGE_SCALES, PAGE_SHIFT>(row, a.scale_row_stride)];
    }
    a.scores[r * a.score_row_stride + j] = score;
  }
}

}  // namespace indexer_portable
}  // namespace mj

#pragma once
// fp8 -> bf16 staging for sparse_prefill with params kv_staging bf16 (SPEC §3 on an fp8 cache).
//
// Why: the fused fp8 kernels decode every gathered row inside the attention kernel, once per
// (token, head tile) that selects it, on a producer that cannot run ahead of a two-stage ring
// (measured at 0.56-0.73x of FlashMLA's bf16 kernel on an H100). A prefill's
// tokens select their keys out of the same few sequences, so each row is selected many times
// (64-1000 for 4096 tokens x top-2048 over 8K-128K keys); decoding it once per launch into a bf16
// copy costs one pass over the referenced rows (read 576 B + scales, write 1152 B each) and lets
// the bf16 kernel run at its own speed.
//
// The copy is indexed by the encoded index itself (SPEC §1: e = block * page_size + offset, one
// layer), so the attention kernel reads it with the caller's indices unchanged: a one-layer bf16
// cache of num_blocks blocks (row_stride = page_size). Only the pages holding rows some valid slot
// selects are written ("marked" mode: clear the page flags, mark, convert the flagged pages) or,
// where that costs more than it saves, every row of the layer ("all" mode: convert only); the
// attention kernel never reads a row no valid slot selects, so the others may hold anything.
//
// Each staged element is q * scale computed in f32 and rounded once to bf16 (round to nearest
// even): exact for unit and power-of-two (ue8m0) scales, within half a bf16 ulp for f32 scales.
#include "common/convert.cuh"
#include "common/types.cuh"
#include "sparse_prefill/args.h"
#include "sparse_prefill/layout.h"

namespace mj {
namespace sparse_prefill_stage {

constexpr int kRowElems = sparse_prefill_layout::kQkDim;
constexpr int kChunks = kRowElems / 16;  // 16-byte fp8 chunks per row
constexpr int kThreads = sparse_prefill_layout::kStageThreads;

template <int PAGE_SIZE, int QUANT_GRANULARITY>
struct Config {
  static constexpr int kPageSize = PAGE_SIZE;
  static constexpr int kQuantGranularity = QUANT_GRANULARITY;  // 0 = unit scales, else divides 576
  static constexpr int kScalesPerRow = QUANT_GRANULARITY > 0 ? kRowElems / QUANT_GRANULARITY : 0;
  static_assert(QUANT_GRANULARITY == 0 || kRowElems % QUANT_GRANULARITY == 0,
                "quantization granularity must divide 576");
};

// Zeroes the page flags (num_blocks bytes, rounded up to 16; 16-byte aligned): the workspace is
// the caller's memory and holds anything before the first launch.
MJ_DEVICE void clear_flags(const SparsePrefillStageArgs& a) {
  const i64 words = (a.num_blocks + 15) / 16;
  uint4* f = reinterpret_cast<uint4*>(a.page_flags);
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<i64>(gridDim.x) * blockDim.x)
    f[i] = make_uint4(0u, 0u, 0u, 0u);
}

// Pools of up to this many blocks are deduplicated in shared memory by the marking CTAs: a 16 KB
// bitmap, 2^17 pages (8M rows of 64-row pages).
constexpr int kSmemPageWords = 4096;
constexpr long long kSmemPages = 32LL * kSmemPageWords;

// Flags every page (physical block) that holds a row a valid slot selects (SPEC §3 validity: slot
// j < min(topk_lengths[t], indices_stride), int(e) >= 0, e < num_rows); slots past the length are
// not read. The convert pass then converts every row of a flagged page: a pool's pages belong to
// sequences, and a prefill's selections stay inside its own sequences' pages.
// Why pages and shared memory: a prefill selects each row 64-1000 times, and every slot checking a
// global flag costs an L2 round trip on a 32-byte sector (0.14-0.24 ms per 8M slots on an H100). A CTA walks many tokens and records their pages in a shared bitmap first (atomicOr:
// plain byte stores of the same value would be correct too, but compute-sanitizer's racecheck
// reports them), then sets each page it saw in global memory once (read first, stored only if
// clear: stores from every SM to one byte serialise in L2; plain byte stores of the same value
// need no atomics there). Pools above kSmemPages blocks check the global flags per slot instead.
template <class C>
MJ_DEVICE void mark_pages(const SparsePrefillStageArgs& a) {
  __shared__ u32 seen[kSmemPageWords];
  const bool local = a.num_blocks <= kSmemPages;
  const int words = static_cast<int>(local ? (a.num_blocks + 31) / 32 : 0);
  for (int i = threadIdx.x; i < words; i += blockDim.x) seen[i] = 0u;
  __syncthreads();
  for (i64 t = blockIdx.x; t < a.num_tokens; t += gridDim.x) {
    const u32 len = __ldg(a.topk_lengths + t);
    const i64 n = len < static_cast<u64>(a.indices_stride) ? static_cast<i64>(len) : a.indices_stride;
    const u32* row = a.indices + t * a.indices_stride;
    for (i64 j = threadIdx.x; j < n; j += blockDim.x) {
      const u32 e = __ldg(row + j);
      if (static_cast<i32>(e) < 0 || static_cast<i64>(e) >= a.num_rows) continue;
      const u32 page = e / C::kPageSize;
      if (local) {
        atomicOr(&seen[page >> 5], 1u << (page & 31));
      } else if (!__ldcg(a.page_flags + page)) {
        a.page_flags[page] = 1;
      }
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < words; i += blockDim.x) {
    for (u32 v = seen[i]; v; v &= v - 1) {
      const i64 page = 32LL * i + (__ffs(static_cast<int>(v)) - 1);
      if (!__ldcg(a.page_flags + page)) a.page_flags[page] = 1;
    }
  }
}

// Converts the rows of flagged pages (every row when page_flags is null) of the read layer into
// rows[e][0:576] bf16. A CTA converts kRowsPerCta rows at a time, one thread per 16-byte chunk:
// 36 consecutive threads cover a row, so the loads and stores of a warp are contiguous.
constexpr int kRowsPerCta = kThreads / kChunks;  // 7 (252 of 256 threads busy)

template <class C>
MJ_DEVICE void convert_rows(const SparsePrefillStageArgs& a) {
  const int r = static_cast<int>(threadIdx.x) / kChunks;
  const int c = static_cast<int>(threadIdx.x) - r * kChunks;
  if (r >= kRowsPerCta) return;
  const u8* src = static_cast<const u8*>(a.kv_blocks);
  uint4* dst = static_cast<uint4*>(a.rows);
  for (i64 e = static_cast<i64>(blockIdx.x) * kRowsPerCta + r; e < a.num_rows;
       e += static_cast<i64>(gridDim.x) * kRowsPerCta) {
    if (a.page_flags && !a.page_flags[e / C::kPageSize]) continue;
    // SPEC §1 tma_row of the encoded index, in the read layer.
    const i64 row = (e / C::kPageSize) * a.row_stride + (e % C::kPageSize) + a.layer_row_offset;
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(src + row * kRowElems) + c);
    const u32 w[4] = {raw.x, raw.y, raw.z, raw.w};
    float v[16];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      // e4m3 -> f16 is exact; f16 -> f32 too.
      const u32 lo = e4m3x2_to_f16x2(static_cast<u16>(w[k] & 0xFFFFu));
      const u32 hi = e4m3x2_to_f16x2(static_cast<u16>(w[k] >> 16));
      v[4 * k + 0] = f16_to_f32(static_cast<u16>(lo & 0xFFFFu));
      v[4 * k + 1] = f16_to_f32(static_cast<u16>(lo >> 16));
      v[4 * k + 2] = f16_to_f32(static_cast<u16>(hi & 0xFFFFu));
      v[4 * k + 3] = f16_to_f32(static_cast<u16>(hi >> 16));
    }
    if constexpr (C::kQuantGranularity > 0) {
      const float* sc = a.kv_scales + row * C::kScalesPerRow;
      if constexpr (C::kQuantGranularity % 16 == 0) {
        // The chunk lies inside one scale group.
        const float s = __ldg(sc + (c * 16) / C::kQuantGranularity);
#pragma unroll
        for (int k = 0; k < 16; ++k) v[k] *= s;
      } else {
#pragma unroll
        for (int k = 0; k < 16; ++k) v[k] *= __ldg(sc + (c * 16 + k) / C::kQuantGranularity);
      }
    }
    uint4 o0, o1;
    o0.x = pack_bf16x2(v[0], v[1]);
    o0.y = pack_bf16x2(v[2], v[3]);
    o0.z = pack_bf16x2(v[4], v[5]);
    o0.w = pack_bf16x2(v[6], v[7]);
    o1.x = pack_bf16x2(v[8], v[9]);
    o1.y = pack_bf16x2(v[10], v[11]);
    o1.z = pack_bf16x2(v[12], v[13]);
    o1.w = pack_bf16x2(v[14], v[15]);
    uint4* d = dst + e * (kRowElems * 2 / 16) + 2 * c;
    d[0] = o0;
    d[1] = o1;
  }
}

}  // namespace sparse_prefill_stage
}  // namespace mj

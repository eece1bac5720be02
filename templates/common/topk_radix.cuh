#pragma once
// Exact, deterministic block-wide top-k of one row of f32 scores (one CTA per row).
//
// Order: descending score; equal scores by ascending position; NaN below every number; -0 == +0.
// Scores become order-preserving u32 keys (NaN -> 0, below every number's key), and the k-th
// largest key is found by radix select over three digits (bits 31..20, 19..8, 7..0):
//   round: histogram of the digit over the elements that match the prefix found so far, then
//          one ordered pass over them: elements whose digit is above the threshold digit are
//          selected; those equal to it are either all selected (the bin holds exactly what is
//          still needed), or compacted in position order into a shared-memory candidate list
//          for the next round, or (last digit: exact ties) the first `need` of them in position
//          order are selected.
// A threshold bin larger than the candidate capacity is not stored: the next round reads the
// row again, filtering by the longer prefix, so nothing is ever dropped or duplicated.
// The selected k entries are then bitonic-sorted by (key desc, position asc).
#include "common/topk_layout.h"
#include "common/types.cuh"

namespace mj {
namespace topk {

// Larger score -> larger key; NaN -> 0 (lowest); -0 -> the key of +0.
MJ_DEVICE u32 order_key(float f) {
  u32 b = __float_as_uint(f);
  if (f != f) return 0u;
  if (b == 0x80000000u) b = 0u;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Sort entry: (key desc, position asc) is the descending order of this u64. Padding (0) sorts last.
MJ_DEVICE u64 sort_entry(u32 key, u32 pos) { return (static_cast<u64>(key) << 32) | (0xFFFFFFFFu - pos); }
MJ_DEVICE u32 sort_entry_pos(u64 e) { return 0xFFFFFFFFu - static_cast<u32>(e & 0xFFFFFFFFu); }

struct alignas(16) Float4 {
  float x, y, z, w;
};

template <int THREADS, int MAX_K, int CAP>
struct RadixTopK {
  static_assert(THREADS % 32 == 0 && THREADS / 32 <= 32, "threads");
  static constexpr int kWarps = THREADS / 32;
  static constexpr int kItems = 4;  // contiguous elements per thread per chunk (one float4)
  static constexpr int kChunk = THREADS * kItems;
  // Shared memory: common/topk_layout.h (the host sizes the launch from the same struct).
  using Layout = RadixLayout<THREADS, MAX_K, CAP>;
  static constexpr int kMaxBins = Layout::kMaxBins;
  static constexpr int kSortCap = Layout::kSortCap;
  using Smem = typename Layout::Smem;
  static constexpr unsigned kSmemBytes = sizeof(Smem);

  // Exclusive prefix of `v` over threads in index order; `total` gets the block sum.
  static MJ_DEVICE u32 exclusive_scan(Smem& sm, u32 v, u32& total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32 inc = v;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const u32 n = __shfl_up_sync(0xffffffffu, inc, off);
      if (lane >= off) inc += n;
    }
    if (lane == 31) sm.scan[warp] = inc;
    __syncthreads();
    if (warp == 0) {
      const u32 x = lane < kWarps ? sm.scan[lane] : 0u;
      u32 xi = x;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const u32 n = __shfl_up_sync(0xffffffffu, xi, off);
        if (lane >= off) xi += n;
      }
      if (lane < kWarps) sm.scan[lane] = xi - x;
      if (lane == kWarps - 1) sm.scan[kWarps] = xi;
    }
    __syncthreads();
    const u32 r = sm.scan[warp] + inc - v;
    total = sm.scan[kWarps];
    __syncthreads();
    return r;
  }

  // Threshold digit over hist[0, bins): the largest d with count(digit >= d) >= need; sets
  // sm.digit and sm.above = count(digit > d).
  static MJ_DEVICE void find_threshold(Smem& sm, int bins, u32 need) {
    const int per = bins / THREADS > 0 ? bins / THREADS : 1;
    const int t = threadIdx.x;
    // Thread t owns the bins [hi - per, hi), counted from the top so that lower threads own higher bins.
    const int hi = bins - t * per;
    u32 local = 0;
    if (hi > 0)
      for (int b = hi - 1; b >= hi - per; --b) local += sm.hist[b];
    u32 total;
    const u32 above_mine = exclusive_scan(sm, local, total);
    if (hi > 0 && above_mine < need && above_mine + local >= need) {
      u32 run = above_mine;
      for (int b = hi - 1; b >= hi - per; --b) {
        if (run + sm.hist[b] >= need) {
          sm.digit = static_cast<u32>(b);
          sm.above = run;
          break;
        }
        run += sm.hist[b];
      }
    }
    __syncthreads();
  }

  // Loads element e of the current source: from the row (global) or the candidate list.
  struct Source {
    const float* row;  // null when reading candidates
    const u64* cand;
    u32 count;
  };

  // Keys and positions of this thread's kItems elements of the chunk starting at e0.
  static MJ_DEVICE void load_chunk(const Source& src, u32 e0, u32 (&key)[kItems], u32 (&pos)[kItems],
                                   bool (&ok)[kItems]) {
    const u32 first = e0 + threadIdx.x * kItems;
    if (src.row) {
      float v[kItems] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (first < src.count) {
        // The row is 16-byte aligned and padded to a multiple of 4 floats.
        const Float4 x = *reinterpret_cast<const Float4*>(src.row + first);
        v[0] = x.x;
        v[1] = x.y;
        v[2] = x.z;
        v[3] = x.w;
      }
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        ok[i] = first + i < src.count;
        key[i] = order_key(v[i]);
        pos[i] = first + i;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        ok[i] = first + i < src.count;
        const u64 c = ok[i] ? src.cand[first + i] : 0ull;
        key[i] = static_cast<u32>(c >> 32);
        pos[i] = static_cast<u32>(c & 0xFFFFFFFFu);
      }
    }
  }

  static MJ_DEVICE void append(Smem& sm, u32 key, u32 pos) {
    const u32 slot = atomicAdd(&sm.sel_count, 1u);
    sm.sel[slot] = sort_entry(key, pos);
  }

  // Selects the top min(k, n) of row[0, n) into sm.sel[0, min(k, n)), sorted. Returns min(k, n).
  static MJ_DEVICE u32 run(Smem& sm, const float* row, u32 n, u32 k) {
    const int tid = threadIdx.x;
    if (tid == 0) sm.sel_count = 0;
    __syncthreads();
    const u32 kk = n < k ? n : k;
    if (n <= k) {
      for (u32 p = tid; p < n; p += THREADS) sm.sel[p] = sort_entry(order_key(row[p]), p);
    } else {
      u32 need = k, prefix = 0, pmask = 0;
      Source src{row, sm.cand, n};
      for (int round = 0; round < 3; ++round) {
        const int shift = round == 0 ? 20 : (round == 1 ? 8 : 0);
        const int bits = round == 2 ? 8 : 12;
        const int bins = 1 << bits;
        const u32 dmask = static_cast<u32>(bins - 1);
        for (int b = tid; b < bins; b += THREADS) sm.hist[b] = 0;
        __syncthreads();
        for (u32 e0 = 0; e0 < src.count; e0 += kChunk) {
          u32 key[kItems], pos[kItems];
          bool ok[kItems];
          load_chunk(src, e0, key, pos, ok);
#pragma unroll
          for (int i = 0; i < kItems; ++i)
            if (ok[i] && (key[i] & pmask) == prefix) atomicAdd(&sm.hist[(key[i] >> shift) & dmask], 1u);
        }
        __syncthreads();
        find_threshold(sm, bins, need);
        const u32 d = sm.digit;
        const u32 bin_count = sm.hist[d];
        const u32 need_eq = need - sm.above;  // still needed from the threshold bin, >= 1
        const bool take_all = bin_count == need_eq;
        const bool last = round == 2;
        const bool compact = !take_all && !last && bin_count <= static_cast<u32>(CAP);
        const bool ordered = !take_all && (last || compact);
        __syncthreads();  // everyone has read hist / digit before they change
        u32 eq_base = 0;
        for (u32 e0 = 0; e0 < src.count; e0 += kChunk) {
          u32 key[kItems], pos[kItems];
          bool ok[kItems];
          load_chunk(src, e0, key, pos, ok);
          bool eq[kItems];
          u32 n_eq = 0;
#pragma unroll
          for (int i = 0; i < kItems; ++i) {
            const bool match = ok[i] && (key[i] & pmask) == prefix;
            const u32 dig = (key[i] >> shift) & dmask;
            eq[i] = match && dig == d;
            if (match && dig > d) append(sm, key[i], pos[i]);
            if (eq[i] && take_all) append(sm, key[i], pos[i]);
            n_eq += eq[i] ? 1u : 0u;
          }
          if (ordered) {
            // Rank of each equal element in position order (threads own contiguous runs).
            u32 total;
            u32 rank = eq_base + exclusive_scan(sm, n_eq, total);
#pragma unroll
            for (int i = 0; i < kItems; ++i) {
              if (!eq[i]) continue;
              if (last) {
                if (rank < need_eq) append(sm, key[i], pos[i]);
              } else {
                // In place when the source is the candidate list: a chunk's writes land at or
                // before its own (already loaded) elements.
                sm.cand[rank] = (static_cast<u64>(key[i]) << 32) | pos[i];
              }
              ++rank;
            }
            eq_base += total;
          }
        }
        __syncthreads();
        prefix |= d << shift;
        pmask |= dmask << shift;
        need = need_eq;
        if (take_all || last) break;
        if (compact) src = Source{nullptr, sm.cand, bin_count};
      }
    }
    __syncthreads();
    // Bitonic sort of sel[0, p2) descending, padding with 0 (sorts last).
    u32 p2 = 1;
    while (p2 < kk) p2 <<= 1;
    for (u32 i = kk + tid; i < p2; i += THREADS) sm.sel[i] = 0ull;
    __syncthreads();
    for (u32 size = 2; size <= p2; size <<= 1) {
      for (u32 stride = size >> 1; stride > 0; stride >>= 1) {
        for (u32 i = tid; i < p2 / 2; i += THREADS) {
          const u32 lo = 2 * i - (i & (stride - 1));
          const u32 hi = lo + stride;
          const bool desc = (lo & size) == 0;
          const u64 x = sm.sel[lo], y = sm.sel[hi];
          if ((x < y) == desc) {
            sm.sel[lo] = y;
            sm.sel[hi] = x;
          }
        }
        __syncthreads();
      }
    }
    return kk;
  }
};

}  // namespace topk
}  // namespace mj

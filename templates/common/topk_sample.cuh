#pragma once
// Exact, deterministic block-wide top-k of one row of f32 scores that reads the row about once
// (one CTA per row). Same order and result as common/topk_radix.cuh (descending score, equal
// scores by ascending position, NaN below every number, -0 == +0), which it falls back to.
//
// Why: the radix select reads the row at least twice (histogram, then selection) and its first
// 12-bit histogram of float keys piles most elements onto a handful of bins (a float's top 12
// bits are sign, exponent and 3 mantissa bits), so its shared-memory atomics serialize. Here:
//   1. Threshold guess. Rows longer than the candidate capacity CAP are sampled (128 runs of 16
//      consecutive keys spread over the row, 2048 keys, 1/16 of a 32K row's bytes); the r-th
//      largest sampled key, r chosen so that about sqrt(k * CAP) keys of the row are expected at
//      or above it, becomes the lower bound t_lo. Shorter rows take t_lo = 0 (every key).
//   2. One pass over the row: every key >= t_lo is appended to a shared-memory candidate list as
//      its sort entry (key << 32 | ~position): eight float4 loads in flight per thread, one
//      shared atomic per warp and pass (warp-aggregated), nothing else per element.
//   3. If the list holds between k and CAP entries it contains every key >= the k-th largest
//      (which is >= t_lo), so the exact k-th largest ENTRY is found by a radix select over the
//      64-bit entries in shared memory, 12-bit digits placed just below the bits the remaining
//      entries share (entries are unique: positions differ, so ties are
//      broken by position exactly as the order demands). Entries >= it are the answer: exactly k.
//      Otherwise (the sample misled: fewer than k or more than CAP keys >= t_lo) the row is
//      handed to the radix select, which is exact on any input. Exactness therefore never
//      depends on the sample; only the speed does.
//   4. The k selected entries are bitonic-sorted descending (the order above), in registers and
//      warp shuffles except for the few stages whose partners are in other warps.
#include "common/topk_radix.cuh"
#include "common/types.cuh"

namespace mj {
namespace topk {

template <int THREADS, int MAX_K>
struct SampleTopK {
  static_assert(THREADS % 32 == 0 && THREADS / 32 <= 32, "threads");
  using Radix = RadixTopK<THREADS, MAX_K, 4096>;  // exact fallback
  static constexpr int kSortCap = Radix::kSortCap;
  // Candidate capacity: 2x k up to 8192 entries (64 KiB), at least 2048. At k 2048 the whole
  // shared-memory layout is ~64 KiB, so three CTAs fit on an SM.
  static constexpr int kCap = 2 * kSortCap < 2048 ? 2048 : (2 * kSortCap > 8192 ? 8192 : 2 * kSortCap);
  static constexpr int kRuns = 128, kRunLen = 16, kSamples = kRuns * kRunLen;
  static_assert(kSamples <= kCap, "the sample lives in the candidate buffer");
  // float4 loads in flight per thread: 8 x 16 B x 768 threads = 96 KiB per SM at 3 CTAs per SM.
  // 4 were too few for long rows (H100, H64 top-k 32K / 64K: 0.73 / 1.31 ms at 4, 0.69 / 1.19 at 8;
  // 72 registers either way).
  static constexpr int kUnroll = 8;
  static constexpr int kPass = THREADS * 4 * kUnroll;

  static constexpr int kBins = 4096;  // 12-bit digits
  static constexpr int kWarps = THREADS / 32;
  static_assert(kBins % THREADS == 0, "bins per thread");

  struct Fast {
    u64 sel[kSortCap];
    u64 cand[kCap];  // first the sample, then the candidates
    u32 hist[kBins];
    u64 all_and;
    u64 all_or;
    u32 scan[kWarps + 1];
    u32 count;
    u32 sel_count;
    u32 digit;
    u32 above;
  };
  union Smem {
    typename Radix::Smem radix;
    Fast fast;
  };
  static constexpr unsigned kSmemBytes = sizeof(Smem);

  static MJ_DEVICE u32 lane_id() { return threadIdx.x & 31; }

  // 16-byte read of scores that are read once (written by an earlier launch): no L1 allocation.
  static MJ_DEVICE Float4 load_stream(const float* p) {
    Float4 v;
    asm("ld.global.nc.L1::no_allocate.v4.f32 {%0, %1, %2, %3}, [%4];"
        : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
        : "l"(p));
    return v;
  }

  // Largest d in [0, kBins) with count(digit >= d) >= need over f.hist; sets f.digit and f.above
  // (count of digits > d). Thread t owns kBins / THREADS consecutive bins, the highest to t = 0.
  static MJ_DEVICE void find_threshold(Fast& f, u32 need) {
    constexpr int kPer = kBins / THREADS;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int hi = kBins - tid * kPer;
    u32 c[kPer], local = 0;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      c[i] = f.hist[hi - 1 - i];
      local += c[i];
    }
    u32 inc = local;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const u32 n = __shfl_up_sync(0xffffffffu, inc, off);
      if (lane >= off) inc += n;
    }
    if (lane == 31) f.scan[warp] = inc;
    __syncthreads();
    if (warp == 0) {
      const u32 x = lane < kWarps ? f.scan[lane] : 0u;
      u32 xi = x;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const u32 n = __shfl_up_sync(0xffffffffu, xi, off);
        if (lane >= off) xi += n;
      }
      if (lane < kWarps) f.scan[lane] = xi - x;
    }
    __syncthreads();
    u32 run = f.scan[warp] + inc - local;  // count in higher bins
    if (run < need && run + local >= need) {
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        if (run < need && run + c[i] >= need) {
          f.digit = static_cast<u32>(hi - 1 - i);
          f.above = run;
        }
        run += c[i];
      }
    }
    __syncthreads();
  }

  static MJ_DEVICE u64 shfl_xor_u64(u64 v, int m) {
    const u32 lo = __shfl_xor_sync(0xffffffffu, static_cast<u32>(v), m);
    const u32 hi = __shfl_xor_sync(0xffffffffu, static_cast<u32>(v >> 32), m);
    return (static_cast<u64>(hi) << 32) | lo;
  }

  // The r-th largest of the unique entries a[0, count) (1 <= r <= count), as a threshold T with
  // count(a >= T) == r exactly. Radix select with adaptive 12-bit digits: each round first finds
  // the bits that all still-matching entries share (AND / OR reduction) and takes its digit from
  // the 12 bits just below them, so no round is spent on common bits (a row's top keys share
  // sign, most of the exponent and often leading mantissa bits) and the histogram spreads over
  // many bins (plain shared atomics, little contention). Usually two rounds.
  static MJ_DEVICE u64 kth_largest(Fast& f, const u64* a, u32 count, u32 r) {
    const int tid = threadIdx.x;
    const u32 lane = lane_id();
    u64 prefix = 0, pmask = 0;
    u32 need = r;
    for (int round = 0; round < 8; ++round) {
      if (tid == 0) {
        f.all_and = ~0ull;
        f.all_or = 0ull;
      }
      for (int b = tid; b < kBins; b += THREADS) f.hist[b] = 0;
      __syncthreads();
      u64 x_and = ~0ull, x_or = 0ull;
      for (u32 i = tid; i < count; i += THREADS) {
        const u64 e = a[i];
        if ((e & pmask) == prefix) {
          x_and &= e;
          x_or |= e;
        }
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        x_and &= shfl_xor_u64(x_and, off);
        x_or |= shfl_xor_u64(x_or, off);
      }
      if (lane == 0) {
        atomicAnd(&f.all_and, x_and);
        atomicOr(&f.all_or, x_or);
      }
      __syncthreads();
      const u64 all_and = f.all_and, all_or = f.all_or, diff = all_and ^ all_or;
      if (diff == 0) {
        // One entry matches (entries are unique), so need == 1: it is the threshold.
        __syncthreads();
        return all_or;
      }
      const int top = 63 - __clzll(static_cast<long long>(diff));  // highest differing bit
      const int shift = top >= 11 ? top - 11 : 0;
      const u64 above_mask = top == 63 ? 0ull : ~((2ull << top) - 1ull);
      prefix = all_and & above_mask;  // shared by every matching entry
      pmask = above_mask;
      for (u32 i = tid; i < count; i += THREADS) {
        const u64 e = a[i];
        if ((e & pmask) == prefix) atomicAdd(&f.hist[static_cast<u32>(e >> shift) & (kBins - 1)], 1u);
      }
      __syncthreads();
      find_threshold(f, need);
      const u32 d = f.digit;
      const u32 bin = f.hist[d];
      const u32 need_eq = need - f.above;
      __syncthreads();  // everyone has read digit / above / hist before the next round resets them
      const u64 dmask = static_cast<u64>(kBins - 1) << shift;
      prefix = (prefix & ~dmask) | (static_cast<u64>(d) << shift);
      pmask |= dmask;
      // Bits below the digit are free: every entry of the bin is >= prefix.
      if (bin == need_eq) return prefix;
      need = need_eq;
    }
    return prefix;  // not reached: each round fixes at least one more differing bit
  }

  // Appends a[i] for i in [0, count) with a[i] >= T to f.sel (any order).
  static MJ_DEVICE void collect(Fast& f, const u64* a, u32 count, u64 T) {
    const int tid = threadIdx.x;
    const u32 lane = lane_id();
    for (u32 i0 = 0; i0 < count; i0 += THREADS) {
      const u32 i = i0 + tid;
      const u64 e = i < count ? a[i] : 0ull;
      const bool take = i < count && e >= T;
      const u32 b = __ballot_sync(0xffffffffu, take);
      if (b == 0) continue;
      u32 base = 0;
      if (lane == 0) base = atomicAdd(&f.sel_count, static_cast<u32>(__popc(b)));
      base = __shfl_sync(0xffffffffu, base, 0);
      if (take) f.sel[base + __popc(b & ((1u << lane) - 1u))] = e;
    }
  }

  // Bitonic sort of sel[0, pow2(kk)) descending; entries past kk are padding (0, sorts last).
  static MJ_DEVICE void sort_desc(u64* sel, u32 kk) {
    if (kSortCap >= THREADS) {
      for (u32 i = kk + threadIdx.x; i < static_cast<u32>(kSortCap); i += THREADS) sel[i] = 0ull;
      __syncthreads();
      sort_desc_registers(sel);
      return;
    }
    const int tid = threadIdx.x;
    u32 p2 = 1;
    while (p2 < kk) p2 <<= 1;
    for (u32 i = kk + tid; i < p2; i += THREADS) sel[i] = 0ull;
    __syncthreads();
    for (u32 size = 2; size <= p2; size <<= 1) {
      for (u32 stride = size >> 1; stride > 0; stride >>= 1) {
        for (u32 i = tid; i < p2 / 2; i += THREADS) {
          const u32 lo = 2 * i - (i & (stride - 1));
          const u32 hi = lo + stride;
          const bool desc = (lo & size) == 0;
          const u64 x = sel[lo], y = sel[hi];
          if ((x < y) == desc) {
            sel[lo] = y;
            sel[hi] = x;
          }
        }
        __syncthreads();
      }
    }
  }

  // The same network over all kSortCap entries held in registers, kItems consecutive entries per
  // thread (entry e = tid * kItems + i): strides below kItems inside a thread, below 32 * kItems
  // by warp shuffles, larger ones through shared memory (a few stages out of 66 at k 2048), so
  // nearly all of it runs without barriers or shared-memory traffic.
  static constexpr int kItems = kSortCap >= THREADS ? kSortCap / THREADS : 1;

  template <int J>
  static MJ_DEVICE void in_thread_stage(u64 (&v)[kItems], u32 size) {
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if ((i & J) == 0) {
        const u32 e = threadIdx.x * kItems + i;
        const bool desc = (e & size) == 0;
        const u64 x = v[i], y = v[i ^ J];
        if ((x < y) == desc) {
          v[i] = y;
          v[i ^ J] = x;
        }
      }
    }
  }

  static MJ_DEVICE void sort_desc_registers(u64* sel) {
    u64 v[kItems];
    const u32 tid = threadIdx.x;
    // Entry e = tid * kItems + i lives in shared memory at slot(e) = i * THREADS + tid, so that a
    // warp's accesses are consecutive (no bank conflicts). The input order is irrelevant.
#pragma unroll
    for (int i = 0; i < kItems; ++i) v[i] = sel[i * THREADS + tid];
    for (u32 size = 2; size <= static_cast<u32>(kSortCap); size <<= 1) {
      for (u32 j = size >> 1; j > 0; j >>= 1) {
        if (j < static_cast<u32>(kItems)) {
          if (j == 1) in_thread_stage<1>(v, size);
          if (kItems > 2 && j == 2) in_thread_stage<(kItems > 2 ? 2 : 1)>(v, size);
          if (kItems > 4 && j == 4) in_thread_stage<(kItems > 4 ? 4 : 1)>(v, size);
          if (kItems > 8 && j == 8) in_thread_stage<(kItems > 8 ? 8 : 1)>(v, size);
        } else if (j < 32u * kItems) {
          // j and size are >= kItems: the direction is the same for all of a thread's entries.
          const int m = static_cast<int>(j / kItems);
          const u32 e0 = tid * kItems;
          const bool keep_max = ((e0 & j) == 0) == ((e0 & size) == 0);
#pragma unroll
          for (int i = 0; i < kItems; ++i) {
            const u64 pv = shfl_xor_u64(v[i], m);
            v[i] = (v[i] > pv) == keep_max ? v[i] : pv;
          }
        } else {
          __syncthreads();  // earlier readers of sel are done
#pragma unroll
          for (int i = 0; i < kItems; ++i) sel[i * THREADS + tid] = v[i];
          __syncthreads();
          const u32 e0 = tid * kItems;
          const bool keep_max = ((e0 & j) == 0) == ((e0 & size) == 0);
          const u32 partner = tid ^ (j / kItems);  // j >= 32 * kItems: a thread of another warp
#pragma unroll
          for (int i = 0; i < kItems; ++i) {
            const u64 pv = sel[i * THREADS + partner];
            v[i] = (v[i] > pv) == keep_max ? v[i] : pv;
          }
        }
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kItems; ++i) sel[tid * kItems + i] = v[i];
    __syncthreads();
  }

  // Selects the top min(k, n) of row[0, n) (16-byte aligned, readable up to a multiple of 4
  // floats). Returns the sorted entries (sort_entry) and sets kk = min(k, n).
  static MJ_DEVICE const u64* run(Smem& sm, const float* row, u32 n, u32 k, u32& kk) {
    Fast& f = sm.fast;
    const int tid = threadIdx.x;
    const u32 lane = lane_id();
    kk = n < k ? n : k;
    if (n <= k) {
      for (u32 p = tid; p < n; p += THREADS) f.sel[p] = sort_entry(order_key(row[p]), p);
      __syncthreads();
      sort_desc(f.sel, kk);
      return f.sel;
    }
    if (tid == 0) {
      f.count = 0;
      f.sel_count = 0;
    }
    // 1. Threshold guess.
    u32 t_lo = 0;
    if (n > static_cast<u32>(kCap)) {
      for (int s = tid; s < kSamples; s += THREADS) {
        const u32 run_idx = static_cast<u32>(s / kRunLen), o = static_cast<u32>(s % kRunLen);
        const u32 start = static_cast<u32>((static_cast<u64>(run_idx) * (n - kRunLen)) / (kRuns - 1));
        f.cand[s] = sort_entry(order_key(row[start + o]), static_cast<u32>(s));
      }
      __syncthreads();
      // Expect ~sqrt(k * CAP) row keys >= t_lo: a factor sqrt(CAP / k) (1.41 at k 2048) of margin
      // on both sides: > 6 standard deviations of the sample count for 32K-key rows, ~2.4 for
      // 128K-key rows (about 1 row in 60 of that length takes the fallback).
      const float target = sqrtf(static_cast<float>(k) * static_cast<float>(kCap));
      u32 r = static_cast<u32>(ceilf(static_cast<float>(kSamples) * target / static_cast<float>(n)));
      r = r < 1u ? 1u : (r > static_cast<u32>(kSamples) ? static_cast<u32>(kSamples) : r);
      t_lo = static_cast<u32>(kth_largest(f, f.cand, kSamples, r) >> 32);
    }
    __syncthreads();  // the sample is dead; count is zero
    // 2. One pass: keys >= t_lo become candidates.
    for (u32 e0 = 0; e0 < n; e0 += kPass) {
      Float4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const u32 first = e0 + (static_cast<u32>(u * THREADS + tid) << 2);
        if (first < n) {
          v[u] = load_stream(row + first);
        } else {
          v[u] = Float4{0.f, 0.f, 0.f, 0.f};
        }
      }
      u32 hits = 0;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const u32 first = e0 + (static_cast<u32>(u * THREADS + tid) << 2);
        const float xs[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
        for (int i = 0; i < 4; ++i)
          if (first + i < n && order_key(xs[i]) >= t_lo) hits |= 1u << (4 * u + i);
      }
      const u32 c = static_cast<u32>(__popc(hits));
      u32 inc = c;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const u32 x = __shfl_up_sync(0xffffffffu, inc, off);
        if (lane >= static_cast<u32>(off)) inc += x;
      }
      const u32 total = __shfl_sync(0xffffffffu, inc, 31);
      if (total == 0) continue;
      u32 base = 0;
      if (lane == 31) base = atomicAdd(&f.count, total);
      u32 slot = __shfl_sync(0xffffffffu, base, 31) + inc - c;
      if (hits) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const u32 first = e0 + (static_cast<u32>(u * THREADS + tid) << 2);
          const float xs[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
          for (int i = 0; i < 4; ++i)
            if (hits & (1u << (4 * u + i))) {
              if (slot < static_cast<u32>(kCap)) f.cand[slot] = sort_entry(order_key(xs[i]), first + i);
              ++slot;
            }
        }
      }
    }
    __syncthreads();
    const u32 C = f.count;
    if (C < k || C > static_cast<u32>(kCap)) {
      // 3'. The sample misled (or t_lo fell inside a huge tie): the exact radix select.
      __syncthreads();
      const u32 got = Radix::run(sm.radix, row, n, k);
      (void)got;
      return sm.radix.sel;
    }
    // 3. Exact k-th largest entry among the candidates, then the k entries at or above it.
    const u64 T = kth_largest(f, f.cand, C, k);
    collect(f, f.cand, C, T);
    __syncthreads();
    // 4. Sort.
    sort_desc(f.sel, kk);
    return f.sel;
  }
};

}  // namespace topk
}  // namespace mj

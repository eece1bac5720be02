#pragma once
// Exact, deterministic block-wide top-k of one row of f32 scores that reads the row about once
// (one CTA per row, or a thread-block cluster per row for a decode step's few long rows:
// run_cluster). Same order and result as common/topk_radix.cuh (descending score, equal scores by
// ascending position, NaN below every number, -0 == +0), which it falls back to.
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
//      Otherwise (the sample misled: fewer than k or more than CAP keys >= t_lo) the threshold is
//      retried at the sample rank that scales the (exact) count to the target, up to
//      kThresholdTries passes; then the row is handed to the radix select, which is exact on any
//      input. Exactness therefore never depends on the sample; only the speed does.
//   4. The k selected entries are put in descending order (the order above): one 12-bit MSD
//      bucket pass (a monotone map of the entry onto 4096 buckets fitted to the entries' range,
//      shared-memory atomics), then each entry's rank inside its bucket by counting the bucket's
//      larger entries; a bitonic network (in registers and warp shuffles except for the few
//      stages whose partners are in other warps) when a bucket holds more than kMaxBucket
//      entries (huge ties).
//   3+4 fused: steps 3 and 4 for a candidate list of k..CAP entries as ONE bucket pass over the
//      candidates: the row pass also records the candidates' key range, the bucket map is fitted
//      to it, and the prefix sums of the bucket counts say which buckets hold the top k (those
//      starting below rank k); only their entries are scattered and ranked, ranks >= k dropped.
//      No k-th-largest rounds, no collect, no range pass. Exact by the same argument as step 4;
//      a bucket reaching into the top k with more than kMaxBucket entries takes steps 3 and 4 as
//      above.
#include "common/cluster.cuh"
#include "common/topk_layout.h"
#include "common/topk_radix.cuh"
#include "common/types.cuh"

namespace mj {
namespace topk {

template <int THREADS, int MAX_K>
struct SampleTopK {
  static_assert(THREADS % 32 == 0 && THREADS / 32 <= 32, "threads");
  using Radix = RadixTopK<THREADS, MAX_K, 4096>;  // exact fallback
  // Shared memory: common/topk_layout.h (the host sizes the launch from the same structs).
  using Layout = SampleLayout<THREADS, MAX_K>;
  static constexpr int kSortCap = Layout::kSortCap;
  // Candidate capacity (topk_layout.h, sample_cap).
  static constexpr int kCap = Layout::kCap;
  static constexpr u32 kRuns = 128, kRunLen = 16, kSamples = kRuns * kRunLen;
  static_assert(kSamples <= kCap, "the sample lives in the candidate buffer");
  // float4 loads in flight per thread: 8 x 16 B x 768 threads = 96 KiB per SM at 3 CTAs per SM.
  // 4 were too few for long rows (H100, H64 top-k 32K / 64K: 0.73 / 1.31 ms at 4, 0.69 / 1.19 at 8;
  // 72 registers either way).
  static constexpr int kUnroll = 8;
  static constexpr int kPass = THREADS * 4 * kUnroll;

  static constexpr int kBins = Layout::kBins;  // 12-bit digits
  static constexpr int kWarps = Layout::kWarps;
  static_assert(kBins % THREADS == 0, "bins per thread");

  // Largest bucket ranked by counting in the bucket sort (see there).
  static constexpr u32 kMaxBucket = Layout::kMaxBucket;
  // sel's slots past kSortCap (topk_layout.h).
  static constexpr int kSelPad = Layout::kSelPad;

  // The fast path's buffers, and the radix fallback's overlaid on them.
  using Fast = typename Layout::Fast;
  using Smem = typename Layout::Smem;

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

  // Sorts f.sel[0, kk) descending (kk <= kSortCap; the entries are unique). Ends with a barrier.
  static MJ_DEVICE void sort_desc(Fast& f, u32 kk) { sort_desc_buckets(f, kk); }

  // ---- Bucket sort ----
  // The k entries go to 4096 buckets by a map that is non-decreasing in the entry (so buckets
  // are ordered: every entry of a higher bucket is larger), fitted to the entries' range so that
  // they spread: at k 2048 most buckets hold 0-3 entries (host emulation on normal, lognormal,
  // uniform, indexer-like and the GPU tests' rows: largest bucket 5-17). Bucket b's entries are
  // scattered (arbitrary order) to cand[start(b), end(b)), starts in descending bucket order;
  // then each entry's final slot is start(b) + the number of larger entries in its bucket. Cost
  // per thread at k 2048 (sm_90a SASS, 256 threads): ~580 instructions + 25 per 4-entry step of
  // the rank loop (~10-13 steps: 8 items, each its warp's longest bucket), ~850 in all, against
  // ~4100 for the 66-stage network (30 of them 16 shuffles each). Exactness never depends on the
  // map's quality: a too-full bucket (ties of huge multiplicity) takes the network instead.
  static constexpr int kSortItems = kSortCap >= THREADS ? kSortCap / THREADS : 1;
  static constexpr int kBucketBits = 12, kBuckets = 1 << kBucketBits;
  static_assert(kBuckets == kBins, "the bucket counters live in hist");
  // kMaxBucket (above), the largest bucket ranked by counting, bounds the rank loop at
  // kSortItems x kMaxBucket iterations per thread (each warp runs its lanes' longest bucket).
  // The rank loop reads kRankUnroll entries per step and may run past its bucket: the slots
  // after a bucket hold smaller entries (lower buckets), then kRankUnroll - 1 zeros past kk
  // (entries are never 0: the position half of an entry is ~position != 0), none of which count.
  static constexpr int kRankUnroll = 4;
  // Per-warp partial results (4 x kWarps u32) live in cand past the scattered entries and the
  // zero padding.
  static constexpr int kPartOffset = kSortCap + 8;
  static_assert(kRankUnroll - 1 <= 8, "zero padding fits below the partials");
  static_assert(kCap >= kPartOffset + 2 * kWarps, "room for the per-warp partials in cand");

  // Monotone bucket map, uniform over the CTA: non-decreasing in the entry, onto [0, kBuckets).
  // Integer form (kValue false): (p - base) >> shift with p the key half of the entry (linear in
  // the key, i.e. logarithmic-ish in the score: right for tails spanning binades), or the
  // position half when all keys are equal (use_lo). Value form (kValue true), for scores of both
  // signs (finite): linear in the score; the key-linear map would spend most buckets on the
  // binades near zero.
  struct BucketMap {
    u32 base, shift;
    bool use_lo;
    float scale, offset;
  };

  // Rank of entry e within its bucket [begin, end) of arr (the buckets in descending order): begin
  // plus the number of larger entries in the bucket, read kRankUnroll at a time (running past the
  // bucket is harmless, see kRankUnroll). Used by the sort (arr = cand) and the fused select
  // (arr = sel).
  static MJ_DEVICE u32 rank_in_bucket(const u64* arr, u32 begin, u32 end, u64 e) {
    u32 rank = begin;
#pragma unroll 1
    for (u32 x = begin; x < end; x += kRankUnroll) {
#pragma unroll
      for (int u = 0; u < kRankUnroll; ++u) rank += arr[x + u] > e ? 1u : 0u;
    }
    return rank;
  }

  template <bool kValue>
  static MJ_DEVICE u32 bucket_of(const BucketMap& m, u64 e) {
    const u32 hi = static_cast<u32>(e >> 32);
    if (kValue) {
      // fma(v, scale, offset) is non-decreasing in v (exact product and sum, one monotone
      // rounding); cvt.rzi.u32 clamps below zero to 0.
      const u32 b = __float2uint_rz(fmaf(key_value(hi), m.scale, m.offset));
      return b < static_cast<u32>(kBuckets - 1) ? b : static_cast<u32>(kBuckets - 1);
    }
    return ((m.use_lo ? static_cast<u32>(e) : hi) - m.base) >> m.shift;
  }

  // The float of an order key (inverse of order_key for non-NaN keys).
  static MJ_DEVICE float key_value(u32 key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
  }

  // Four consecutive bucket counters hist[b, b + 4) (b % 4 == 0) as one access: hist starts
  // 16-byte aligned unless sel and cand hold an odd number of u64 in all (k = 1), then 8.
  static constexpr bool kHist16 = (kSortCap + kSelPad + kCap) % 2 == 0;
  static MJ_DEVICE uint4 load4(const u32* h) {
    if (kHist16) return *reinterpret_cast<const uint4*>(h);
    const uint2 a = reinterpret_cast<const uint2*>(h)[0], b = reinterpret_cast<const uint2*>(h)[1];
    return make_uint4(a.x, a.y, b.x, b.y);
  }
  static MJ_DEVICE void store4(u32* h, uint4 v) {
    if (kHist16) {
      *reinterpret_cast<uint4*>(h) = v;
    } else {
      reinterpret_cast<uint2*>(h)[0] = make_uint2(v.x, v.y);
      reinterpret_cast<uint2*>(h)[1] = make_uint2(v.z, v.w);
    }
  }

  // Shift that maps [0, range] onto [0, kBuckets).
  static MJ_DEVICE u32 range_shift(u32 range) {
    const int bits = 32 - __clz(range);
    return bits > kBucketBits ? static_cast<u32>(bits - kBucketBits) : 0u;
  }

  // The bucket map for entries whose key halves lie in [kmin, kmax] and position halves in
  // [lmin, lmax] (bounds may be loose: any enclosing range gives a valid, monotone map); value
  // selects the value form.
  static MJ_DEVICE BucketMap fit_map(u32 kmin, u32 kmax, u32 lmin, u32 lmax, bool& value) {
    BucketMap m;
    m.scale = 0.f;
    m.offset = 0.f;
    // All keys equal: the entries differ in the position half only (lmin < lmax unless kk <= 1).
    m.use_lo = kmin == kmax;
    m.base = m.use_lo ? lmin : kmin;
    m.shift = range_shift(m.use_lo ? lmax - lmin : kmax - kmin);
    value = false;
    if (!m.use_lo) {
      // NaN keys (0) decode to NaN and infinities are not finite: such rows keep the key map.
      const float vmin = key_value(kmin), vmax = key_value(kmax);
      if (vmin < 0.f && vmax > 0.f && isfinite(vmin) && isfinite(vmax)) {
        const float scale = static_cast<float>(kBuckets) / (vmax - vmin);
        if (isfinite(scale) && scale > 0.f) {
          value = true;
          m.scale = scale;
          m.offset = -vmin * scale;
        }
      }
    }
    return m;
  }

  static MJ_DEVICE void sort_desc_buckets(Fast& f, u32 kk) {
    const u32 tid = threadIdx.x, lane = lane_id(), warp = tid >> 5;
    u32* part = reinterpret_cast<u32*>(f.cand + kPartOffset);  // [4][kWarps]
    // 1. Range of keys (high halves) and of positions (low halves) of the entries; zero the
    //    bucket counters meanwhile (their last readers finished before the caller's barrier).
    u32 kmin = ~0u, kmax = 0u, lmin = ~0u, lmax = 0u;
#pragma unroll
    for (int i = 0; i < kSortItems; ++i) {
      const u32 idx = static_cast<u32>(i * THREADS) + tid;
      if (idx < kk) {
        const u64 e = f.sel[idx];
        const u32 hi = static_cast<u32>(e >> 32), lo = static_cast<u32>(e);
        kmin = min(kmin, hi);
        kmax = max(kmax, hi);
        lmin = min(lmin, lo);
        lmax = max(lmax, lo);
      }
    }
    static_assert(kBuckets % (4 * THREADS) == 0, "bucket counters per thread");
#pragma unroll
    for (int q = 0; q < kBuckets / (4 * THREADS); ++q)
      store4(&f.hist[4 * (q * THREADS + static_cast<int>(tid))], make_uint4(0u, 0u, 0u, 0u));
    kmin = __reduce_min_sync(0xffffffffu, kmin);
    kmax = __reduce_max_sync(0xffffffffu, kmax);
    lmin = __reduce_min_sync(0xffffffffu, lmin);
    lmax = __reduce_max_sync(0xffffffffu, lmax);
    if (lane == 0) {
      part[0 * kWarps + warp] = kmin;
      part[1 * kWarps + warp] = kmax;
      part[2 * kWarps + warp] = lmin;
      part[3 * kWarps + warp] = lmax;
    }
    __syncthreads();
    {
      const bool w = lane < static_cast<u32>(kWarps);
      kmin = __reduce_min_sync(0xffffffffu, w ? part[0 * kWarps + lane] : ~0u);
      kmax = __reduce_max_sync(0xffffffffu, w ? part[1 * kWarps + lane] : 0u);
      lmin = __reduce_min_sync(0xffffffffu, w ? part[2 * kWarps + lane] : ~0u);
      lmax = __reduce_max_sync(0xffffffffu, w ? part[3 * kWarps + lane] : 0u);
    }
    bool value = false;
    const BucketMap m = fit_map(kmin, kmax, lmin, lmax, value);
    const bool done = value ? bucket_passes<true>(f, kk, m) : bucket_passes<false>(f, kk, m);
    // Ties of huge multiplicity (few distinct scores, NaN-laden short rows): the network. sel is
    // untouched then.
    if (!done) sort_desc_bitonic(f.sel, kk);
  }

  // Steps 2-5 of the bucket sort with map m (after step 1's barrier). Returns false, having
  // changed nothing in sel, when a bucket holds more than kMaxBucket entries.
  template <bool kValue>
  static MJ_DEVICE bool bucket_passes(Fast& f, u32 kk, const BucketMap& m) {
    const u32 tid = threadIdx.x, lane = lane_id(), warp = tid >> 5;
    u32* part = reinterpret_cast<u32*>(f.cand + kPartOffset);
    // 2. Bucket counts.
#pragma unroll
    for (int i = 0; i < kSortItems; ++i) {
      const u32 idx = static_cast<u32>(i * THREADS) + tid;
      if (idx < kk) atomicAdd(&f.hist[bucket_of<kValue>(m, f.sel[idx])], 1u);
    }
    __syncthreads();
    // 3. Exclusive starts in descending bucket order (thread t owns kPer consecutive buckets,
    //    the highest to t = 0) and the largest bucket.
    constexpr int kPer = kBuckets / THREADS;
    static_assert(kPer % 4 == 0, "uint4 accesses of the counters");
    const int hi = kBuckets - static_cast<int>(tid) * kPer;
    // The counters are read twice (sum and maximum, then the starts) rather than held in
    // registers across the scan.
    u32 local = 0, cmax = 0;
#pragma unroll
    for (int q = 0; q < kPer / 4; ++q) {
      const uint4 x = load4(&f.hist[hi - kPer + 4 * q]);
      local += x.x + x.y + x.z + x.w;
      cmax = max(cmax, max(max(x.x, x.y), max(x.z, x.w)));
    }
    u32 inc = local;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const u32 n = __shfl_up_sync(0xffffffffu, inc, off);
      if (lane >= static_cast<u32>(off)) inc += n;
    }
    cmax = __reduce_max_sync(0xffffffffu, cmax);
    // part[] is free again: step 1's reads of it precede the barrier after step 2.
    if (lane == 31) part[warp] = inc;
    if (lane == 0) part[kWarps + warp] = cmax;
    __syncthreads();
    const bool w = lane < static_cast<u32>(kWarps);
    const u32 tot = w ? part[lane] : 0u;
    const u32 base = __reduce_add_sync(0xffffffffu, lane < warp ? tot : 0u);
    cmax = __reduce_max_sync(0xffffffffu, w ? part[kWarps + lane] : 0u);
    if (cmax > kMaxBucket) return false;  // uniform: every thread read the same maxima
    // Thread t's buckets in descending order: hi - 1 (highest) down to hi - kPer; each group of
    // four is stored ascending, so its starts are computed from its top bucket down.
    u32 run = base + inc - local;
#pragma unroll
    for (int q = kPer / 4 - 1; q >= 0; --q) {
      u32* h = &f.hist[hi - kPer + 4 * q];
      const uint4 x = load4(h);
      uint4 y;
      y.w = run;
      y.z = y.w + x.w;
      y.y = y.z + x.z;
      y.x = y.y + x.y;
      run = y.x + x.x;
      store4(h, y);
    }
    __syncthreads();
    // 4. Scatter into cand[0, kk), bucket by bucket, at slots handed out by a second round of
    //    atomics on the starts (nothing kept in registers across the scan); afterwards hist[b]
    //    is the end of bucket b, i.e. the start of bucket b - 1. Zeros after the entries for the
    //    rank loop (part[] was last read before the barrier above).
#pragma unroll
    for (int i = 0; i < kSortItems; ++i) {
      const u32 idx = static_cast<u32>(i * THREADS) + tid;
      if (idx < kk) {
        const u64 e = f.sel[idx];
        f.cand[atomicAdd(&f.hist[bucket_of<kValue>(m, e)], 1u)] = e;
      }
    }
    if (tid < static_cast<u32>(kRankUnroll - 1)) f.cand[kk + tid] = 0ull;
    __syncthreads();
    // 5. Final slot = bucket start + the bucket's larger entries. Consecutive slots per warp:
    //    its lanes mostly share buckets (similar loop lengths, broadcast reads).
#pragma unroll
    for (int i = 0; i < kSortItems; ++i) {
      const u32 j = static_cast<u32>(i * THREADS) + tid;
      if (j < kk) {
        const u64 e = f.cand[j];
        const u32 b = bucket_of<kValue>(m, e);
        const u32 begin = b < static_cast<u32>(kBuckets - 1) ? f.hist[b + 1] : 0u, end = f.hist[b];
        f.sel[rank_in_bucket(f.cand, begin, end, e)] = e;
      }
    }
    __syncthreads();
    return true;
  }

  // ---- Fused select + sort of the candidates ----
  // The top k of the C unique candidates cand[0, C) (k <= C <= kCap), sorted descending, into
  // cand[0, k); hist is zero and cand_key_min / cand_key_max bound the candidates' keys (both
  // set by the row pass before its closing barrier). Returns false, with cand unchanged, when a
  // bucket that reaches into the top k holds more than kMaxBucket entries (the caller then runs
  // the k-th largest select and the sort). Ends with a barrier.
  //   1. counts of the candidates' buckets (map fitted to the key range; all keys equal: to the
  //      position range [0, n) of the row);
  //   2. exclusive starts in descending bucket order; the boundary bucket b* is the one holding
  //      rank k - 1 (start < k <= end); buckets b >= b* (start < k) are the only ones needed;
  //   3. those buckets' entries are scattered to sel[0, E), E = end(b*) <= k - 1 + kMaxBucket;
  //   4. each scattered entry's rank = its bucket's start + the larger entries of its bucket (as
  //      in the sort); ranks < k go to cand[rank].
  // Counts at k 2048 and C ~ 2900 (32K rows), 256 threads: ~12 candidates per thread in steps 1
  // and 3 (one load, the map, one shared atomic each), 8-9 entries in step 4, 3 barriers plus the
  // one of step 2's scan; replaces 2-3 k-th-largest rounds over C (7 barriers and two passes
  // each), the collect pass and the sort's range pass.
  static MJ_DEVICE bool select_sorted(Fast& f, u32 C, u32 k, u32 n) {
    const u32 kmin = f.cand_key_min, kmax = f.cand_key_max;
    // Position halves are ~position, positions in [0, n): lo in [~(n - 1), ~0].
    const u32 lmin = 0xFFFFFFFFu - (n - 1u), lmax = 0xFFFFFFFFu;
    bool value = false;
    const BucketMap m = fit_map(kmin, kmax, lmin, lmax, value);
    return value ? select_passes<true>(f, C, k, m) : select_passes<false>(f, C, k, m);
  }

  template <bool kValue>
  static MJ_DEVICE bool select_passes(Fast& f, u32 C, u32 k, const BucketMap& m) {
    const u32 tid = threadIdx.x, lane = lane_id(), warp = tid >> 5;
    // 1. Counts.
    for (u32 i = tid; i < C; i += THREADS) atomicAdd(&f.hist[bucket_of<kValue>(m, f.cand[i])], 1u);
    if (tid == 0) f.overflow = 0;  // read after the second barrier below
    __syncthreads();
    // 2. Starts (thread t owns kPer consecutive buckets, the highest to t = 0), the boundary
    //    bucket and the largest bucket starting below k.
    constexpr int kPer = kBuckets / THREADS;
    static_assert(kPer % 4 == 0, "uint4 accesses of the counters");
    const int hi = kBuckets - static_cast<int>(tid) * kPer;
    u32 local = 0;
#pragma unroll
    for (int q = 0; q < kPer / 4; ++q) {
      const uint4 x = load4(&f.hist[hi - kPer + 4 * q]);
      local += x.x + x.y + x.z + x.w;
    }
    u32 inc = local;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const u32 v = __shfl_up_sync(0xffffffffu, inc, off);
      if (lane >= static_cast<u32>(off)) inc += v;
    }
    if (lane == 31) f.scan[warp] = inc;
    __syncthreads();
    const u32 tot = lane < static_cast<u32>(kWarps) ? f.scan[lane] : 0u;
    u32 run = __reduce_add_sync(0xffffffffu, lane < warp ? tot : 0u) + inc - local;
    bool too_full = false;
    // Nothing to do for a thread whose buckets all start at or after rank k.
    if (run < k) {
#pragma unroll
      for (int q = kPer / 4 - 1; q >= 0; --q) {
        u32* h = &f.hist[hi - kPer + 4 * q];
        const uint4 x = load4(h);
        const u32 cnt[4] = {x.w, x.z, x.y, x.x};  // descending bucket order
        u32 st[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          st[j] = run;
          if (run < k) {
            too_full |= cnt[j] > kMaxBucket;
            if (run + cnt[j] >= k) {
              // The boundary bucket (exactly one: C >= k). Zeros after the scattered entries for
              // the rank loop; E + kRankUnroll - 1 <= k + kMaxBucket + 2 fits sel when not too full.
              const u32 end = run + cnt[j];
              f.boundary = static_cast<u32>(hi - kPer + 4 * q + 3 - j);
              f.scattered = end;
              if (cnt[j] <= kMaxBucket)
                for (int z = 0; z < kRankUnroll - 1; ++z) f.sel[end + z] = 0ull;
            }
          }
          run += cnt[j];
        }
        store4(h, make_uint4(st[3], st[2], st[1], st[0]));
      }
    }
    if (too_full) f.overflow = 1;
    __syncthreads();
    if (f.overflow) return false;  // uniform; hist is reset by the caller's select
    // 3. Scatter the buckets b >= b* into sel[0, E); afterwards hist[b] is the end of bucket b,
    //    i.e. the start of bucket b - 1.
    const u32 boundary = f.boundary;
    for (u32 i = tid; i < C; i += THREADS) {
      const u64 e = f.cand[i];
      const u32 b = bucket_of<kValue>(m, e);
      if (b >= boundary) f.sel[atomicAdd(&f.hist[b], 1u)] = e;
    }
    __syncthreads();
    // 4. Ranks (cand is free: its last readers were before the barrier above).
    const u32 scattered = f.scattered;
    for (u32 j = tid; j < scattered; j += THREADS) {
      const u64 e = f.sel[j];
      const u32 b = bucket_of<kValue>(m, e);
      const u32 begin = b < static_cast<u32>(kBuckets - 1) ? f.hist[b + 1] : 0u, end = f.hist[b];
      const u32 rank = rank_in_bucket(f.sel, begin, end, e);
      if (rank < k) f.cand[rank] = e;
    }
    __syncthreads();
    return true;
  }

  // ---- Bitonic network (the fallback of the bucket sort) ----
  // Bitonic sort of sel[0, pow2(kk)) descending; entries past kk are padding (0, sorts last).
  static MJ_DEVICE void sort_desc_bitonic(u64* sel, u32 kk) {
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
        // e = tid * kItems + i: below kItems the direction bit is a bit of i (known after
        // unrolling), from kItems on a bit of tid * kItems. Written so because, as the bucket
        // sort's fallback at k 4096, the plain (e & size) == 0 made ptxas hoist 15 values of e and
        // spill.
        const bool desc = size < static_cast<u32>(kItems) ? (static_cast<u32>(i) & size) == 0
                                                         : ((threadIdx.x * kItems) & size) == 0;
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

  // Where the row pass appends its candidates: this CTA's own list (LocalSink), or in a cluster
  // the list of the cluster's rank-0 CTA through distributed shared memory (RemoteSink: generic
  // pointers from cluster::map_rank).
  struct LocalSink {
    Fast& f;
    MJ_DEVICE u32 reserve(u32 n) { return atomicAdd(&f.count, n); }
    MJ_DEVICE void put(u32 slot, u64 e) { f.cand[slot] = e; }
    MJ_DEVICE void range(u32 kmin, u32 kmax) {
      atomicMin(&f.cand_key_min, kmin);
      atomicMax(&f.cand_key_max, kmax);
    }
  };
  struct RemoteSink {
    u32* count;
    u64* cand;
    u32* key_min;
    u32* key_max;
    MJ_DEVICE u32 reserve(u32 n) { return atomicAdd(count, n); }
    MJ_DEVICE void put(u32 slot, u64 e) { cand[slot] = e; }
    MJ_DEVICE void range(u32 kmin, u32 kmax) {
      atomicMin(key_min, kmin);
      atomicMax(key_max, kmax);
    }
  };

  // 1. Threshold guess for a row of n > kCap keys from `runs` runs of kRunLen consecutive keys
  //    spread over the row (runs * kRunLen <= kCap: the sample lives in cand): the r-th largest
  //    sampled key. Every CTA that draws the same sample gets the same t_lo. Ends with a barrier
  //    (cand and hist are free again).
  //    The loads are all issued before the first store (one memory round trip, not one per
  //    sample of the thread: 8 or 16 of them).
  template <u32 RUNS>
  static MJ_DEVICE u32 sample_threshold(Fast& f, const float* row, u32 n, u32 r) {
    constexpr u32 kSamplesOf = RUNS * kRunLen;
    static_assert(kSamplesOf % THREADS == 0 && kSamplesOf <= static_cast<u32>(kCap), "whole samples per thread");
    constexpr int kPer = static_cast<int>(kSamplesOf / THREADS);
    // Batches of at most 8 loads in flight: 16 spilled at the top-k's 80-register budget.
    constexpr int kBatch = kPer < 8 ? kPer : 8;
    static_assert(kPer % kBatch == 0, "whole batches");
    const u32 tid = threadIdx.x;
#pragma unroll 1
    for (int b = 0; b < kPer; b += kBatch) {
      float v[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const u32 s = static_cast<u32>(b + i) * THREADS + tid;
        const u32 run_idx = s / kRunLen, o = s % kRunLen;
        const u32 start = static_cast<u32>((static_cast<u64>(run_idx) * (n - kRunLen)) / (RUNS - 1));
        v[i] = row[start + o];
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const u32 s = static_cast<u32>(b + i) * THREADS + tid;
        f.cand[s] = sort_entry(order_key(v[i]), s);
      }
    }
    __syncthreads();
    const u32 samples = kSamplesOf;
    const u32 t_lo = static_cast<u32>(kth_largest(f, f.cand, samples, r) >> 32);
    __syncthreads();
    return t_lo;
  }

  // The candidate count aimed at: ~sqrt(k * CAP) keys >= t_lo, a factor sqrt(CAP / k) (1.41 at k
  // 2048) of margin on both sides of [k, CAP].
  static MJ_DEVICE float target_count(u32 k) { return sqrtf(static_cast<float>(k) * static_cast<float>(kCap)); }
  // The sample rank expected to leave target_count(k) of the row's n keys at or above it: with
  // the 2048-key sample > 6 standard deviations of the sample count for 32K-key rows, ~2.4 for
  // 128K-key rows (about 1 row in 60 of that length misses [k, CAP] at the first try).
  static MJ_DEVICE u32 initial_rank(u32 samples, u32 n, u32 k) {
    const u32 r = static_cast<u32>(ceilf(static_cast<float>(samples) * target_count(k) / static_cast<float>(n)));
    return r < 1u ? 1u : (r > samples ? samples : r);
  }
  // After a try at sample rank r found C candidates outside [k, CAP]: the rank that scales C to
  // the target (the count is exact even past CAP, so one retry nearly always lands). Equal to r
  // when no other rank can help (r already at an end: a tie at the threshold, or a sample that
  // misses the row's top keys), which ends the retries.
  static MJ_DEVICE u32 retarget_rank(u32 r, u32 C, u32 samples, u32 k) {
    if (C == 0) return samples;
    const float x = ceilf(static_cast<float>(r) * target_count(k) / static_cast<float>(C));
    const u32 r2 = x < 1.f ? 1u : (x >= static_cast<float>(samples) ? samples : static_cast<u32>(x));
    return r2;
  }
  // Tries of the sample threshold before the exact radix select takes the row.
  static constexpr int kThresholdTries = 3;

  // 2. One pass over row[lo, hi) (lo a multiple of 4): keys >= t_lo are appended to the sink's
  //    candidate list as sort entries of their row position (past kCap only counted), and their
  //    key range is merged into the sink's (for the fused select).
  template <class Sink>
  static MJ_DEVICE void row_pass(Sink& sink, const float* row, u32 lo, u32 hi, u32 t_lo) {
    const int tid = threadIdx.x;
    const u32 lane = lane_id();
    u32 key_min = ~0u, key_max = 0u;
    for (u32 e0 = lo; e0 < hi; e0 += kPass) {
      Float4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const u32 first = e0 + (static_cast<u32>(u * THREADS + tid) << 2);
        if (first < hi) {
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
          if (first + i < hi && order_key(xs[i]) >= t_lo) hits |= 1u << (4 * u + i);
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
      if (lane == 31) base = sink.reserve(total);
      u32 slot = __shfl_sync(0xffffffffu, base, 31) + inc - c;
      if (hits) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const u32 first = e0 + (static_cast<u32>(u * THREADS + tid) << 2);
          const float xs[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
          for (int i = 0; i < 4; ++i)
            if (hits & (1u << (4 * u + i))) {
              const u32 key = order_key(xs[i]);
              if (slot < static_cast<u32>(kCap)) sink.put(slot, sort_entry(key, first + i));
              ++slot;
              key_min = min(key_min, key);
              key_max = max(key_max, key);
            }
        }
      }
    }
    key_min = __reduce_min_sync(0xffffffffu, key_min);
    key_max = __reduce_max_sync(0xffffffffu, key_max);
    if (lane == 0) sink.range(key_min, key_max);
  }

  // Resets the candidate list and the fused select's bucket counters (before the row pass).
  static MJ_DEVICE void reset_candidates(Fast& f) {
    if (threadIdx.x == 0) {
      f.count = 0;
      f.sel_count = 0;
      f.cand_key_min = ~0u;
      f.cand_key_max = 0u;
    }
    static_assert(kBins % (4 * THREADS) == 0, "bucket counters per thread");
#pragma unroll
    for (int q = 0; q < kBins / (4 * THREADS); ++q)
      store4(&f.hist[4 * (q * THREADS + static_cast<int>(threadIdx.x))], make_uint4(0u, 0u, 0u, 0u));
  }

  // 3 + 4 after the row pass's closing barrier: the top k (n > k) among the candidates, sorted.
  static MJ_DEVICE const u64* select_candidates(Smem& sm, const float* row, u32 n, u32 k) {
    Fast& f = sm.fast;
    const u32 C = f.count;
    if (C < k || C > static_cast<u32>(kCap)) {
      // 3'. The sample misled (or t_lo fell inside a huge tie): the exact radix select.
      __syncthreads();
      const u32 got = Radix::run(sm.radix, row, n, k);
      (void)got;
      return sm.radix.sel;
    }
    // 3 + 4 fused: one bucket pass over the candidates.
    if (select_sorted(f, C, k, n)) return f.cand;
    // 3. Exact k-th largest entry among the candidates, then the k entries at or above it.
    const u64 T = kth_largest(f, f.cand, C, k);
    collect(f, f.cand, C, T);
    __syncthreads();
    // 4. Sort (n > k here: kk == k).
    sort_desc(f, k);
    return f.sel;
  }

  // Steps 1 and 2 on one CTA for a row of n > k keys: the candidates in f (count, cand, key
  // range), ready for select_candidates. Rows of at most CAP keys take every key (always in
  // range); longer ones a sample threshold, retried at a rescaled sample rank when the count
  // falls outside [k, CAP].
  static MJ_DEVICE void collect_local(Fast& f, const float* row, u32 n, u32 k) {
    u32 r = n > static_cast<u32>(kCap) ? initial_rank(kSamples, n, k) : 0u;
    for (int attempt = 1;; ++attempt) {
      const u32 t_lo = r != 0 ? sample_threshold<kRuns>(f, row, n, r) : 0u;
      reset_candidates(f);
      __syncthreads();
      LocalSink sink{f};
      row_pass(sink, row, 0, n, t_lo);
      __syncthreads();
      const u32 C = f.count;
      if (r == 0 || (C >= k && C <= static_cast<u32>(kCap)) || attempt == kThresholdTries) return;
      const u32 r2 = retarget_rank(r, C, kSamples, k);
      if (r2 == r) return;
      r = r2;  // every thread read count before the next sample's barrier, and reset follows it
    }
  }

  // Rows of at most k keys: every key, sorted. Ends with a barrier.
  static MJ_DEVICE const u64* take_all(Fast& f, const float* row, u32 n) {
    for (u32 p = threadIdx.x; p < n; p += THREADS) f.sel[p] = sort_entry(order_key(row[p]), p);
    __syncthreads();
    sort_desc(f, n);
    return f.sel;
  }

  // Selects the top min(k, n) of row[0, n) (16-byte aligned, readable up to a multiple of 4
  // floats) on one CTA. Returns the sorted entries (sort_entry) and sets kk = min(k, n).
  static MJ_DEVICE const u64* run(Smem& sm, const float* row, u32 n, u32 k, u32& kk) {
    kk = n < k ? n : k;
    if (n <= k) return take_all(sm.fast, row, n);
    collect_local(sm.fast, row, n, k);
    return select_candidates(sm, row, n, k);
  }

  // Runs of the cluster variant's sample: the whole candidate buffer (twice run()'s sample at k
  // 2048), so that long rows rarely take the single-CTA fallback (128K keys: ~3.9 standard
  // deviations of margin instead of 2.4).
  static constexpr u32 kClusterRuns = kCap / kRunLen;
  static constexpr u32 kClusterSamples = kClusterRuns * kRunLen;

  // The same selection by the `ranks` CTAs of a cluster (this one `rank`), for the few long rows
  // of a decode step, where one CTA per row leaves most SMs idle and the row pass is the latency.
  // Every rank draws the same sample (so the same t_lo), passes over its quarter-aligned slice of
  // the row and appends its candidates to rank 0's list in distributed shared memory; rank 0 then
  // selects as run() does. Same result as run() (exact on any input; only the sample differs,
  // which never changes the answer). Returns the sorted entries on rank 0, nullptr on the others.
  // Rows of at most kCap keys (and clusters of one) take run()'s path on rank 0 alone. Every CTA
  // of the cluster must call it with the same row and n.
  static MJ_DEVICE const u64* run_cluster(Smem& sm, const float* row, u32 n, u32 k, u32& kk, u32 rank, u32 ranks) {
    Fast& f = sm.fast;
    kk = n < k ? n : k;
    if (ranks == 1 || n <= static_cast<u32>(kCap)) {
      // One CTA (rank 0) takes the row; uniform over the cluster: no cluster barrier on this path.
      if (rank != 0) return nullptr;
      if (n <= k) return take_all(f, row, n);
      collect_local(f, row, n, k);
    } else {
      collect_cluster(f, row, n, k, rank, ranks);
      if (rank != 0) return nullptr;
    }
    // One call site of the select (its code is most of the kernel's).
    return select_candidates(sm, row, n, k);
  }

  // Steps 1 and 2 by the cluster for a row of n > kCap keys (run_cluster): rank 0's f holds the
  // candidates afterwards; no CTA touches another's memory after it returns.
  static MJ_DEVICE void collect_cluster(Fast& f, const float* row, u32 n, u32 k, u32 rank, u32 ranks) {
    u32 r = initial_rank(kClusterSamples, n, k);
    const u32 per = ((n + ranks - 1) / ranks + 3u) & ~3u;
    const u32 lo = min(n, rank * per), hi = min(n, lo + per);
    RemoteSink sink{cluster::map_rank(&f.count, 0u), cluster::map_rank(&f.cand[0], 0u),
                    cluster::map_rank(&f.cand_key_min, 0u), cluster::map_rank(&f.cand_key_max, 0u)};
    for (int attempt = 1;; ++attempt) {
      const u32 t_lo = sample_threshold<kClusterRuns>(f, row, n, r);
      if (rank == 0) reset_candidates(f);
      // Rank 0's list is empty (its sample is dead) and every CTA has started (before any
      // distributed shared memory access).
      cluster::sync();
      row_pass(sink, row, lo, hi, t_lo);
      // Every append is visible to rank 0.
      cluster::sync();
      // The count is final here and stays so until rank 0 resets it or exits, both after the
      // barrier below: every rank reads the same C and takes the same decision.
      const u32 C = *sink.count;
      cluster::sync();
      if ((C >= k && C <= static_cast<u32>(kCap)) || attempt == kThresholdTries) return;
      const u32 r2 = retarget_rank(r, C, kClusterSamples, k);
      if (r2 == r) return;
      r = r2;
    }
  }
};

}  // namespace topk
}  // namespace mj

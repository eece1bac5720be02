#pragma once
// Shared-memory layout of the block-wide top-k (common/topk_radix.cuh: the radix select;
// common/topk_sample.cuh: the sampled one-pass select that falls back to it). The device templates
// take their buffers from these structs and the host sizes the launch from sizeof of the same
// structs (mla_indexer/layout.h), so the two sides cannot disagree. Plain C++17, no headers.

namespace mj {
namespace topk {

constexpr int pow2_ceil(int n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

// RadixTopK<THREADS, MAX_K, CAP>'s shared memory.
template <int THREADS, int MAX_K, int CAP>
struct RadixLayout {
  static constexpr int kWarps = THREADS / 32;
  static constexpr int kMaxBins = 4096;                // 12-bit digits
  static constexpr int kSortCap = pow2_ceil(MAX_K);    // the sort's power-of-two width
  struct Smem {
    unsigned hist[kMaxBins];
    unsigned long long sel[kSortCap];  // selected entries (sort_entry), later sorted in place
    unsigned long long cand[CAP];      // threshold-bin candidates in position order: key << 32 | position
    unsigned scan[kWarps + 1];
    unsigned sel_count;
    unsigned digit;
    unsigned above;
  };
};

// Candidate capacity of the sampled select for a sort width: 2x k up to 8192 entries (64 KiB), at
// least 2048 (the sample, 128 runs of 16 keys, lives in the candidate buffer). At k 2048 the whole
// layout is ~64 KiB, so three CTAs fit on an SM.
constexpr int sample_cap(int sort_cap) {
  return 2 * sort_cap < 2048 ? 2048 : (2 * sort_cap > 8192 ? 8192 : 2 * sort_cap);
}

// SampleTopK<THREADS, MAX_K>'s shared memory: the radix fallback's layout and the fast path's,
// overlaid.
template <int THREADS, int MAX_K>
struct SampleLayout {
  using Radix = RadixLayout<THREADS, MAX_K, 4096>;
  static constexpr int kSortCap = Radix::kSortCap;
  static constexpr int kCap = sample_cap(kSortCap);
  static constexpr int kBins = 4096;  // 12-bit digits
  static constexpr int kWarps = THREADS / 32;
  // Largest bucket ranked by counting in the bucket sort (topk_sample.cuh).
  static constexpr unsigned kMaxBucket = 32;
  // sel's slots past kSortCap: the fused select scatters the buckets that reach into the top k,
  // up to k - 1 + kMaxBucket entries, plus the rank loop's zero padding (kRankUnroll - 1 <= 8).
  static constexpr int kSelPad = static_cast<int>(kMaxBucket) + 8;

  struct Fast {
    unsigned long long sel[kSortCap + kSelPad];
    unsigned long long cand[kCap];  // first the sample, then the candidates
    unsigned hist[kBins];
    unsigned long long all_and;
    unsigned long long all_or;
    unsigned scan[kWarps + 1];
    unsigned count;
    unsigned sel_count;
    unsigned digit;
    unsigned above;
    // Fused select: the candidates' smallest and largest key (row pass), the lowest bucket
    // reaching into the top k, the number of entries scattered, a bucket too full.
    unsigned cand_key_min;
    unsigned cand_key_max;
    unsigned boundary;
    unsigned scattered;
    unsigned overflow;
  };
  union Smem {
    typename Radix::Smem radix;
    Fast fast;
  };
};

}  // namespace topk
}  // namespace mj

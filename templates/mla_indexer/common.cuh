#pragma once
// Pieces both indexer stages share: which sequence a token row belongs to, how many keys it sees,
// and where a key lives in the paged cache (SPEC §1, §2; see mla_indexer/args.h).
#include "common/types.cuh"
#include "mla_indexer/args.h"

namespace mj {
namespace indexer {

// A token row's place in the ragged batch. `valid` is false for rows outside
// [offsets[0], offsets[batch]) (a malformed offsets array): such rows see no key.
struct TokenInfo {
  bool valid;
  int seq;                 // b
  long long cache_len;     // L
  long long new_tokens;    // S
  long long index;         // i, 0-based within the sequence's new tokens
  long long visible;       // number of visible keys (a prefix [0, visible) of positions)
};

// Largest b in [0, batch) with offsets[b] <= t: with empty sequences (equal offsets) this is the
// one sequence that actually owns t.
MJ_DEVICE TokenInfo token_info(const unsigned* offsets, const unsigned* cache_lengths, int batch, long long t,
                               long long max_keys, bool causal) {
  TokenInfo r;
  r.valid = false;
  r.seq = 0;
  r.cache_len = r.new_tokens = r.index = r.visible = 0;
  if (batch <= 0 || t < static_cast<long long>(offsets[0]) || t >= static_cast<long long>(offsets[batch])) return r;
  int lo = 0, hi = batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (static_cast<long long>(offsets[mid]) <= t) lo = mid;
    else hi = mid - 1;
  }
  r.valid = true;
  r.seq = lo;
  r.cache_len = cache_lengths[lo];
  r.new_tokens = static_cast<long long>(offsets[lo + 1]) - static_cast<long long>(offsets[lo]);
  r.index = t - static_cast<long long>(offsets[lo]);
  long long vis = causal ? r.cache_len + r.index + 1 : r.cache_len + r.new_tokens;
  r.visible = vis < max_keys ? vis : max_keys;
  return r;
}

// Fills the per-CTA token slots of the Hopper scorers (tile and persistent): slot s = row
// block_row0 + s of the chunk, its sequence, visible key count and validity (rows past the chunk
// or the batch are invalid). Threads [0, BLOCK_Q) write; the caller's barrier publishes them.
template <int BLOCK_Q, bool CAUSAL>
MJ_DEVICE void load_token_slots(const MlaIndexerScoresArgs& a, long long block_row0, int tid, int* s_seq,
                                long long* s_visible, int* s_valid) {
  if (tid < BLOCK_Q) {
    const long long r = block_row0 + tid;
    TokenInfo ti;
    ti.valid = false;
    if (r < a.chunk_rows && a.chunk_row_begin + r < a.num_tokens)
      ti = token_info(a.input_row_offsets, a.cache_lengths, a.batch, a.chunk_row_begin + r, a.max_keys, CAUSAL);
    s_valid[tid] = ti.valid ? 1 : 0;
    s_seq[tid] = ti.seq;
    s_visible[tid] = ti.visible;
  }
}

// Cache row of key position j of sequence b, or -1 when its page is past the lookup table or its
// block id is out of range (such a key is never read).
MJ_DEVICE long long key_row(const unsigned* lut, long long pages_per_seq, long long num_blocks,
                            long long block_row_stride, long long layer_row_offset, int page_shift, int b,
                            long long j) {
  const long long page = j >> page_shift;
  if (page >= pages_per_seq) return -1;
  const long long blk = lut[static_cast<long long>(b) * pages_per_seq + page];
  if (blk >= num_blocks) return -1;
  return blk * block_row_stride + layer_row_offset + (j & ((1LL << page_shift) - 1));
}

// Index (in floats from k_scales) of the scale of K cache row `row`: row * scale_row_stride in the
// split layout. In fp8_page_scales (k_scales = the pages' start) rows count 128-byte units and a
// page of P tokens is P + P / 32 of them (its tokens' e4m3, then its f32 scales), so the scale of
// row page * (P + P / 32) + offset is float page * 33 P + 32 P + offset.
template <bool PAGE_SCALES, int PAGE_SHIFT>
MJ_DEVICE long long scale_index(long long row, int scale_row_stride) {
  if constexpr (PAGE_SCALES) {
    constexpr long long kP = 1LL << PAGE_SHIFT, kRows = kP + kP / 32;
    const long long page = row / kRows;
    return page * (33 * kP) + 32 * kP + (row - page * kRows);
  } else {
    return row * scale_row_stride;
  }
}

// Encoded index (SPEC §1 sparse_index_remap) of logical position j of sequence b, -1 if unmapped.
MJ_DEVICE int encoded_index(const unsigned* lut, long long pages_per_seq, long long num_blocks, int page_shift,
                            int b, long long j) {
  const long long page = j >> page_shift;
  if (page >= pages_per_seq) return -1;
  const long long blk = lut[static_cast<long long>(b) * pages_per_seq + page];
  if (blk >= num_blocks) return -1;
  return static_cast<int>((blk << page_shift) + (j & ((1LL << page_shift) - 1)));
}

}  // namespace indexer
}  // namespace mj

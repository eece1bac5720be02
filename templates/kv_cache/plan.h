#pragma once
// Work plan of kv_cache_store / kv_cache_gather: how a token row is cut into segments, chunks and
// lanes (see kv_cache/kv_cache.cuh for the picture). The device templates are specialized on it and the
// host (src/ops/kv_cache/op.cpp) sizes the grid from it; it is one constexpr definition compiled by
// both NVRTC and the host compiler, so the two sides cannot disagree. Plain C++17, no headers.

namespace mj {
namespace kv {

struct Plan {
  int ng;               // scales per head (fp8), else 1
  int segs_per_token;   // num_heads * ng (fp8), else 1 (the whole row is one segment)
  int row_elems;        // num_heads * head_size
  int vec;              // elements per chunk (one vector access of <= 16 bytes on the wider side)
  int chunks;           // chunks of a full segment
  int tail_chunks;      // chunks of the last group of a head (fp8 with head_size % g != 0)
  int lanes;            // lanes per team (power of two <= 32)
  int iters;            // chunks per lane of a full segment
  int hold;             // chunks per lane per segment held in registers at once
  bool two_pass;        // fp8 segment too long to hold: read once for amax, again to quantize
  int segs_per_thread;  // segments a thread works on together (bytes in flight)
  bool token_major;     // a thread's segments are consecutive segments of ONE token (one lookup)
  int teams;            // teams per block
  int segs_per_block;
};

constexpr int plan_max(int a, int b) { return a > b ? a : b; }
constexpr int plan_min(int a, int b) { return a < b ? a : b; }

// Largest power of two that divides n and is <= cap.
constexpr int pow2_divisor(long long n, int cap) {
  int v = 1;
  while (v * 2 <= cap && n % (v * 2) == 0) v *= 2;
  return v;
}

// Lanes per team for `chunks` chunks: the most lanes (a power of two <= 32) that leave at most
// 1/8 of the lane-iterations idle (ceil(chunks / lanes) * lanes - chunks); else the fewest idle.
// More lanes mean fewer serial iterations per lane; idle ones cost issue slots, not bandwidth.
constexpr int team_lanes(int chunks) {
  int best = 1, best_waste = 1 << 30;
  for (int lanes = 32; lanes >= 1; lanes /= 2) {
    const int waste = (chunks + lanes - 1) / lanes * lanes - chunks;
    if (8 * waste <= chunks) return lanes;
    if (waste < best_waste) {
      best_waste = waste;
      best = lanes;
    }
  }
  return best;
}

// src_bytes / dst_bytes: element sizes moved (store: input -> cache; gather: cache -> output).
// quant: the cache is fp8 (segments are scale groups of g elements).
constexpr Plan make_plan(int src_bytes, int dst_bytes, int num_heads, int head_size, bool quant, int g,
                         int threads) {
  Plan p{};
  const int widest = plan_max(src_bytes, dst_bytes);
  p.ng = quant ? (head_size + g - 1) / g : 1;
  p.segs_per_token = quant ? num_heads * p.ng : 1;
  p.row_elems = num_heads * head_size;
  const int seg_elems = quant ? g : p.row_elems;
  // Chunks never straddle a group, a head or a row: vec divides every segment boundary.
  p.vec = quant ? plan_min(pow2_divisor(head_size, 16 / widest), pow2_divisor(g, 16 / widest))
                : pow2_divisor(p.row_elems, 16 / widest);
  p.chunks = seg_elems / p.vec;
  p.tail_chunks = quant ? (head_size - (p.ng - 1) * g) / p.vec : p.chunks;
  p.lanes = team_lanes(p.chunks);
  p.iters = (p.chunks + p.lanes - 1) / p.lanes;
  p.hold = p.iters <= 16 ? p.iters : 8;
  p.two_pass = quant && p.iters > 16;
  // Several segments per token (fp8 groups / heads): a thread takes consecutive segments of one
  // token, as many as divide segs_per_token with <= 16 chunks held, so the token -> row lookup is
  // done once per thread. One segment per token: a thread takes segments of different tokens,
  // enough for >= 4 chunks in flight.
  if (p.segs_per_token > 1) {
    p.segs_per_thread = 1;
    for (int d = 1; d <= p.segs_per_token; ++d)
      if (p.segs_per_token % d == 0 && d * p.hold <= 16) p.segs_per_thread = d;
  } else {
    p.segs_per_thread = plan_max(1, 4 / p.hold);
  }
  p.token_major = p.segs_per_token % p.segs_per_thread == 0 && (p.segs_per_token > 1 || p.segs_per_thread == 1);
  p.teams = threads / p.lanes;
  p.segs_per_block = p.teams * p.segs_per_thread;
  return p;
}

// Layout fp8_ds_mla (SPEC §1): one warp per token record, so a block of `threads` threads covers
// threads / 32 tokens. Lane l moves dims [16 l, 16 l + 16) of the 512 quantized ones (8 lanes per
// 128-element tile) and lanes 0..7 the 64 rope dims, 8 each; every record access is 16 bytes.
constexpr int kDsMlaRecordBytes = 656;   // 512 e4m3 + 4 f32 scales + 64 bf16
constexpr int kDsMlaScalesOffset = 512;
constexpr int kDsMlaRopeOffset = 528;
constexpr int ds_mla_tokens_per_block(int threads) { return threads / 32; }

}  // namespace kv
}  // namespace mj

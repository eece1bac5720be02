#pragma once
// Layout of the sparse_prefill kernels: shared-memory offsets, barrier slots, thread counts and the
// tail split's slot size, defined once. The device templates (sparse_prefill/*.cuh) take their
// Config constants from here and the host (src/ops/sparse_prefill/plan.cpp) sizes launches and
// workspaces from here; it is one constexpr definition compiled by both NVRTC and the host compiler,
// so the two sides cannot disagree. Plain C++17, no headers.

namespace mj {
namespace sparse_prefill_layout {

// ---- shapes (SPEC §3) ------------------------------------------------------------------------------
constexpr int kQkDim = 576;  // elements of a query / latent row (Q K^T depth)
constexpr int kVDim = 512;   // elements of an output row (the first 512 of a latent row)
// params kv_layout fp8_ds_mla: one row is a 656-byte record, 512 e4m3 + 4 f32 scales + 64 bf16.
constexpr int kDsMlaRowBytes = 656;
constexpr int kDsMlaScaleOffset = 512;  // the 4 f32 scales (dims 128 g .. 128 g + 127)
constexpr int kDsMlaRopeOffset = 528;   // dims 512..575 as bf16

// ---- the Hopper kernel (sparse_prefill/sm90.cuh) ---------------------------------------------------
constexpr int kHopperThreads = 384;  // WG0, WG1 consumers; WG2 producer
constexpr int kHopperMaxHeadsPerCta = 64;  // the wgmma tile's rows
constexpr int kMaxDynamicSmem = 232448;    // sm_90's opt-in limit of dynamic shared memory per block
constexpr int kQkTiles = kQkDim / 64;      // 9 column tiles of 64 16-bit elements (128-byte rows)
constexpr int kTileRows = 64;              // rows of every tile (heads or keys)
constexpr int kTileBytes = kTileRows * 128;
constexpr int kStageBytes = kQkTiles * kTileBytes;  // 73728: one 64-key stage, also the Q tile
constexpr int kTileAlign = 1024;                    // the 128-byte swizzle's period: tiles start aligned
// FP8 math: e4m3 tiles of 64 rows x 64 bytes (64-byte swizzle), V^T slots of 256 dims x 64 keys.
constexpr int kF8TileBytes = 64 * 64;
constexpr int kF8BlockBytes = kQkTiles * kF8TileBytes;  // 36864: one 64-key block, also Q
constexpr int kVtSlotBytes = 256 * 64;                  // 16384

constexpr int hopper_ctas_per_token(int num_heads) {
  return (num_heads + kHopperMaxHeadsPerCta - 1) / kHopperMaxHeadsPerCta;
}

// The crossover (sparse_prefill/sm90.cuh, Design): where a token takes two CTAs (more than 64
// heads) and the producer decodes fp8 rows to bf16 tiles with one group scale per 16-element chunk,
// the token's two CTAs run as a cluster of 2 and each decodes half the rows of every block for
// both, writing the peer's copy into its shared memory (st.async). The decode is the fp8 kernels'
// bound at decode shapes, and without this each CTA decodes every row of the token. Not for unit /
// per-row scales and power-of-two groups of 192 (f16 tiles, cheap decode) nor for widths whose
// 16-element chunks span two groups (their shorter load window does not divide a half-row step).
// The host (plan.cpp) launches such a kernel with clusters of 2 and splits keys over tokens.
constexpr bool hopper_crossover(int num_heads, bool kv_fp8, int quant_granularity, bool fp8_math, bool pow2_scales,
                                bool ds_mla) {
  const bool group_scale = kv_fp8 && quant_granularity != 0 && quant_granularity != kQkDim;
  const bool f16_group = group_scale && pow2_scales && !fp8_math && quant_granularity % 64 == 0 &&
                         quant_granularity >= 128 && !ds_mla;
  return hopper_ctas_per_token(num_heads) == 2 && group_scale && !f16_group && !fp8_math &&
         quant_granularity % 16 == 0;
}

// Bookkeeping region (bytes from the start of dynamic shared memory), then the tiles from the first
// kTileAlign boundary past it.
//   mbarriers: full[stage][half] at kBarFull + 8 (2 stage + half), empty[stage][half] likewise at
//   kBarEmpty, then max1_ready and rowsum_ready; the persistent kernel's item barriers (q_full,
//   q_free, rowsum_read, rope1_full, rope1_empty) at off_item_bars + 8 i.
//   float arrays of 64 per key or row: running max, row sums [2], per-key bias and column scale
//   ([stage], FP8 math [step parity][stage]); FP8 math adds the per-key inverse scales and the
//   per-head query scales.
constexpr int kBarFull = 0;
constexpr int kBarEmpty = 32;
constexpr int kBarMax1Ready = 64;
constexpr int kBarRowsumReady = 72;
constexpr int kStageBarriers = 10;  // full[2][2], empty[2][2], max1_ready, rowsum_ready
constexpr int kItemBarriers = 5;    // persistent kernel: q_full, q_free, rowsum_read, rope1_full, rope1_empty
constexpr int kMbarBytes = 8;

struct HopperLayout {
  int off_max;         // float[64]: running max hand-off
  int off_rowsum;      // float[2][64]: row sums per warpgroup
  int off_bias;        // 16-bit kernels: float[2][64]: 0 (valid) / -inf per key
  int off_colscale;    // 16-bit kernels: float[2][64]: per-row fp8 scale (or power of two) per key
  int key_array_bytes; // FP8 math: float[2][2][64] per per-key array
  int off_bias_f8;     // FP8 math: the per-key arrays, double-buffered by step parity
  int off_colscale_f8;
  int off_invscale;    // FP8 math: 2^-log2(scale) per key
  int off_qscale;      // FP8 math: float[64] per-head query scales
  int off_item_bars;   // persistent kernel: its kItemBarriers mbarriers
  int misc_bytes;      // bookkeeping bytes
  int tile_region_bytes;
  int smem_bytes;      // dynamic shared memory: bookkeeping + kTileAlign slack + tiles
};

// fp8_math: params qk_math fp8 (the FP8-math kernel's tiles); persistent: the bf16 kernel that walks
// items (Config::kPersistent).
constexpr HopperLayout hopper_layout(bool fp8_math, bool persistent) {
  HopperLayout l{};
  l.off_max = kStageBarriers * kMbarBytes;
  l.off_rowsum = l.off_max + 64 * 4;
  l.off_bias = l.off_rowsum + 2 * 64 * 4;
  l.off_colscale = l.off_bias + 2 * 64 * 4;
  l.key_array_bytes = (fp8_math ? 4 : 2) * 64 * 4;
  l.off_bias_f8 = l.off_rowsum + 2 * 64 * 4;
  l.off_colscale_f8 = l.off_bias_f8 + l.key_array_bytes;
  l.off_invscale = l.off_colscale_f8 + l.key_array_bytes;
  l.off_qscale = l.off_invscale + l.key_array_bytes;
  l.off_item_bars = l.off_colscale + 2 * 64 * 4;
  l.misc_bytes = fp8_math ? l.off_qscale + 64 * 4 : l.off_item_bars + (persistent ? kItemBarriers * kMbarBytes : 0);
  // Tiles: Q, K stage 0, K stage 1, WG1's P (16-bit); FP8 math: Q, K stages 0 / 1 (e4m3), V^T of
  // WG0 / WG1 (two slots each), P0, P1 (e4m3).
  l.tile_region_bytes = fp8_math ? 3 * kF8BlockBytes + 2 * (2 * kVtSlotBytes) + 2 * kF8TileBytes
                                 : 3 * kStageBytes + kTileBytes;
  l.smem_bytes = l.misc_bytes + kTileAlign + l.tile_region_bytes;
  return l;
}
static_assert(hopper_layout(false, false).smem_bytes <= kMaxDynamicSmem &&
                  hopper_layout(false, true).smem_bytes <= kMaxDynamicSmem &&
                  hopper_layout(true, false).smem_bytes <= kMaxDynamicSmem,
              "sparse_prefill Hopper kernel: shared memory");

// The tail split (persistent kernel): a partial slot holds a part's o f32 [64 rows][512] in the
// accumulator's register order, then (m, l) f32 [64 rows][2] (sm90_combine.cuh).
constexpr long long kPartialSlotFloats = 64LL * (kVDim + 2);
constexpr long long kPartialSlotBytes = kPartialSlotFloats * 4;
constexpr int kCombineThreads = 128;  // the combine entry: 4 dims per thread of a 512-dim row

// ---- the kv_staging bf16 staging kernels (sparse_prefill/stage_bf16.cuh) ---------------------------
constexpr int kStageThreads = 256;

// ---- the portable kernel (sparse_prefill/portable.cuh) -----------------------------------------------
// One CTA per (token, head tile of 16 m_tiles heads), two warps per 16-head row tile.
constexpr int kPortableMaxMTiles = 4;  // named barriers 1..4, one per warp pair
constexpr int kPortableKeyTile = 64;   // keys per pipeline step
constexpr int portable_threads(int m_tiles) { return 64 * m_tiles; }

struct PortableLayout {
  int m_tiles, heads_per_cta, head_tiles, threads, key_tile;
  int q_bytes, k_bufs, k_bytes, stage_bytes, scale_tile_bytes, p_row_bytes, p_bytes, bias_bytes, red_bytes;
  int off_q, off_k, off_stage, off_scale_stage, off_scale, off_p, off_bias, off_red;
  int smem_bytes;
};

// As few CTAs per token as the 64-head limit of one CTA allows (each CTA re-gathers the token's
// keys), split evenly: 80 heads -> 2 x 48, 112 -> 2 x 64 (16 padding heads), 128 -> 2 x 64.
constexpr int portable_m_tiles(int num_heads) {
  const int row_tiles = num_heads / 16;
  const int head_tiles = (row_tiles + kPortableMaxMTiles - 1) / kPortableMaxMTiles;
  return (row_tiles + head_tiles - 1) / head_tiles;
}

// quant_granularity: fp8 elements per scale (0: unit scales; bf16: 0). Every region is 128-byte
// aligned; fp8 stages a tile of raw rows and, with granularities that are multiples of 16 (exact
// scaling), two scale tiles.
constexpr PortableLayout portable_layout(int num_heads, int m_tiles, int key_tile, bool fp8, int quant_granularity) {
  PortableLayout l{};
  const int qg = fp8 ? quant_granularity : 0;
  const int scales_per_row = qg > 0 ? kQkDim / qg : 0;
  const bool exact_scales = qg > 0 && qg % 16 == 0;
  l.m_tiles = m_tiles;
  l.heads_per_cta = 16 * m_tiles;
  l.head_tiles = (num_heads + l.heads_per_cta - 1) / l.heads_per_cta;
  l.threads = portable_threads(m_tiles);
  l.key_tile = key_tile;
  l.q_bytes = l.heads_per_cta * kQkDim * 2;
  l.k_bufs = fp8 ? 1 : 2;
  l.k_bytes = key_tile * kQkDim * 2;
  l.stage_bytes = fp8 ? key_tile * kQkDim : 0;
  l.scale_tile_bytes = exact_scales ? (key_tile * scales_per_row * 4 + 127) / 128 * 128 : 0;
  l.p_row_bytes = key_tile * 2 + 16;  // +16 B: conflict-free ldmatrix rows
  l.p_bytes = l.heads_per_cta * l.p_row_bytes;
  l.bias_bytes = 2 * key_tile * 4;
  l.red_bytes = 4 * l.heads_per_cta * 4;  // row max [2][H] and row sum [2][H]
  l.off_q = 0;
  l.off_k = l.off_q + l.q_bytes;
  l.off_stage = l.off_k + l.k_bufs * l.k_bytes;
  l.off_scale_stage = l.off_stage + l.stage_bytes;
  l.off_scale = l.off_scale_stage + l.scale_tile_bytes;
  l.off_p = l.off_scale + l.scale_tile_bytes;
  l.off_bias = l.off_p + l.p_bytes;
  l.off_red = l.off_bias + l.bias_bytes;
  l.smem_bytes = l.off_red + l.red_bytes;
  return l;
}

}  // namespace sparse_prefill_layout
}  // namespace mj

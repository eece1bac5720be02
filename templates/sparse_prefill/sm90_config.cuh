#pragma once
// The Hopper sparse prefill's configuration (sparse_prefill/sm90.cuh says what the kernel does): the
// Config a generated source instantiates, the per-CTA view of shared memory (its offsets come from
// sparse_prefill/layout.h, which the host plan reads too), the named barriers and the per-thread
// view of the 64-row tiles that every role shares.
#include "sparse_prefill/args.h"
#include "sparse_prefill/layout.h"
#include "common/cluster.cuh"
#include "common/convert.cuh"
#include "common/fast_math.cuh"
#include "common/mbarrier.cuh"
#include "common/row_gather.cuh"
#include "common/smem_swizzle.cuh"
#include "common/types.cuh"
#include "common/warpgroup.cuh"
#include "common/wgmma.cuh"

namespace mj {
namespace sparse_prefill_sm90 {

using sparse_prefill_layout::kQkDim;
using sparse_prefill_layout::kVDim;
using sparse_prefill_layout::kDsMlaRowBytes;
using sparse_prefill_layout::kDsMlaScaleOffset;
using sparse_prefill_layout::kDsMlaRopeOffset;
using sparse_prefill_layout::kQkTiles;    // 9 column tiles of 64 16-bit elements (128 bytes per row)
using sparse_prefill_layout::kTileRows;   // rows of every tile (heads or keys)
using sparse_prefill_layout::kTileBytes;
using sparse_prefill_layout::kStageBytes;  // one 64-key stage, also the Q tile
using sparse_prefill_layout::kMbarBytes;
constexpr int kLeftTiles = 4;          // dims 0..255: WG0's half of V
constexpr int kBlockKeys = 64;         // keys per stage (one consumer warpgroup's score tile)
constexpr float kMaxInit = -1e30f;  // running max start: finite, so exp2(max - max) never sees inf - inf
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Named barrier ids (0 is __syncthreads).
enum : u32 {
  kBarQReady = 1,   // consumers: query tile in shared memory
  kBarWg0Max = 2,   // WG0 -> WG1: WG0's block max in sM (WG1 -> WG0 and the row sums: mbarriers, see Smem)
  kBarS0Ready = 3,  // WG0 -> WG1: P0 in shared memory
  kBarS1Ready = 4,  // WG1 -> WG0: P1 in shared memory
  kBarOutWg0 = 5,   // WG0's output staged
  kBarOutWg1 = 6,   // WG1's output staged
};

template <int NUM_HEADS, bool KV_FP8, int QUANT_GRANULARITY, bool ATTN_SINK, bool EMIT_LSE, int PAGE_SIZE,
          bool FP8_MATH, bool POW2_SCALES, bool DS_MLA = false, bool CROSSOVER = false>
struct Config {
  static_assert(NUM_HEADS >= 16 && NUM_HEADS <= 128 && NUM_HEADS % 16 == 0,
                "sparse_prefill_sm90: NUM_HEADS must be a multiple of 16 in [16, 128]");
  static_assert(PAGE_SIZE >= 1, "sparse_prefill_sm90: PAGE_SIZE must be >= 1");
  static_assert(KV_FP8 || QUANT_GRANULARITY == 0, "sparse_prefill_sm90: QUANT_GRANULARITY must be 0 for a bf16 cache");
  static_assert(QUANT_GRANULARITY >= 0 && (QUANT_GRANULARITY == 0 || kQkDim % QUANT_GRANULARITY == 0 || DS_MLA),
                "sparse_prefill_sm90: QUANT_GRANULARITY must be 0 or divide 576 (fp8_ds_mla: 128, over its 512 latents)");
  static_assert(QUANT_GRANULARITY == 0 || QUANT_GRANULARITY >= 16,
                "sparse_prefill_sm90: QUANT_GRANULARITY must be 0 or >= 16 (a 16-element chunk spans <= 2 scale groups)");
  static_assert(!FP8_MATH || (KV_FP8 && (QUANT_GRANULARITY == 0 || QUANT_GRANULARITY == kQkDim)),
                "sparse_prefill_sm90: FP8_MATH needs an fp8 cache with unit or per-row scales (QUANT_GRANULARITY 0 or 576)");

  static_assert(!DS_MLA || (KV_FP8 && QUANT_GRANULARITY == 128 && !FP8_MATH),
                "sparse_prefill_sm90: DS_MLA (fp8_ds_mla records) needs an fp8 cache with QUANT_GRANULARITY 128 and 16-bit math");

  static constexpr int kNumHeads = NUM_HEADS;
  // fp8_ds_mla (params kv_layout): a row is FlashMLA's 656-byte record, 512 e4m3 latents (tiles
  // 0..7), their 4 f32 scales at byte 512 (one per 128 dims), the rope dims as 64 bf16 at byte 528
  // (tile 8). Decoded on bf16 tiles (Fp8Producer): the latents as any group-scaled row, the rope
  // dims moved as they are (times the tiles' 2^-64).
  static constexpr bool kDsMla = DS_MLA;
  static constexpr int kRowBytes = DS_MLA ? kDsMlaRowBytes : kQkDim;  // bytes of one fp8 row
  static constexpr bool kFp8 = KV_FP8;
  static constexpr int kQuantGranularity = QUANT_GRANULARITY;
  static constexpr int kScalesPerToken = QUANT_GRANULARITY == 0 ? 0 : kQkDim / QUANT_GRANULARITY;
  static constexpr bool kRowScale = KV_FP8 && QUANT_GRANULARITY == kQkDim;                   // folded into scores/P
  static constexpr bool kGroupScale = KV_FP8 && QUANT_GRANULARITY != 0 && QUANT_GRANULARITY != kQkDim;  // multiplied in tile
  static constexpr bool kPow2Scales = kGroupScale && POW2_SCALES;  // scale_fmt ue8m0: one exact multiply
  // Power-of-two group scales on f16 tiles: each row is decoded as e4m3 x 2^(e_g - R) with a
  // per-row power of two 2^R folded into the scores and P like a per-row scale;
  // exact while the row's group exponents fit f16's range around R (Fp8Producer::finish_row_scales).
  // Widths that are multiples of 64 keep a 64-dim tile inside one group (every lane of a row takes
  // the same multiplier per tile). Taken for 192 (3 scales per row): -7.9 % cycles at 32K against
  // the bf16 decode; not for 64 (9 per row: +0.7 / -0.8 / +4.7 % at 32K / 8K / 128K, the row
  // scales' registers and shuffles cost what the cheaper decode saves).
  static constexpr bool kF16Group =
      kPow2Scales && !FP8_MATH && QUANT_GRANULARITY % 64 == 0 && QUANT_GRANULARITY >= 128 && !DS_MLA;
  // fp8 with unit or per-row scales: the tiles hold f16 (e4m3 -> f16 is one exact cvt per pair, and
  // the f16 wgmma runs at the bf16 rate); Q and P are converted to f16 too (see load_q). Group
  // scales multiply in the tile and keep the bf16 decode with its 2^-64 bias (wider range).
  static constexpr bool kF16 = KV_FP8 && (!kGroupScale || kF16Group) && !FP8_MATH;
  // Scores and P multiplied by a per-key factor from s.colscale: the per-row scale, or the per-row
  // power of two of kF16Group.
  static constexpr bool kColScale = kRowScale || kF16Group;
  // FP8 math (params qk_math fp8, sparse_prefill/sm90_fp8math.cuh): Q quantised to e4m3 per head,
  // Q K^T and P V on e4m3 wgmma, K rows kept as e4m3 in shared memory.
  static constexpr bool kFp8Math = FP8_MATH;
  static constexpr bool kSink = ATTN_SINK;
  static constexpr bool kEmitLse = EMIT_LSE;
  static constexpr int kPageSize = PAGE_SIZE;
  // The producer fills the stages with cp.async only (no register path): bf16 rows, FP8 math.
  static constexpr bool kStageByCpAsync = !KV_FP8 || FP8_MATH;
  // Persistent (bf16 cache): a CTA walks items with the grid's stride (sm90.cuh, Design); the host
  // launches min(items, SMs) CTAs (plan.hpp: Sm90Plan::persistent); one CTA per item also works.
  static constexpr bool kPersistent = !KV_FP8;

  static constexpr int kCtasPerToken = sparse_prefill_layout::hopper_ctas_per_token(NUM_HEADS);
  static constexpr int kHeadsPerCta = NUM_HEADS / kCtasPerToken;
  static_assert(NUM_HEADS % kCtasPerToken == 0 && kHeadsPerCta <= 64, "head split");

  // The crossover (layout.h hopper_crossover): a cluster of the token's 2 CTAs, each decoding rows
  // g + 32 rank of every block into both CTAs' stages (Fp8Producer). A kernel that has it holds
  // both bodies: run() takes this Config's WithCrossover when the launch asks (args.crossover).
  static constexpr bool kCrossoverAvailable = sparse_prefill_layout::hopper_crossover(
      NUM_HEADS, KV_FP8, QUANT_GRANULARITY, FP8_MATH, POW2_SCALES, DS_MLA);
  static constexpr bool kCrossover = CROSSOVER && kCrossoverAvailable;
  using WithCrossover = Config<NUM_HEADS, KV_FP8, QUANT_GRANULARITY, ATTN_SINK, EMIT_LSE, PAGE_SIZE, FP8_MATH,
                               POW2_SCALES, DS_MLA, true>;
  static_assert(!kCrossover || (kGroupScale && !kF16Group && !kPersistent && kCtasPerToken == 2),
                "crossover: the bf16-tile group decode of a two-CTA token");

  // The block schedule (sparse_prefill/sm90_block.cuh): each 64-key block scored by WG0 alone, its
  // P V split between both warpgroups, a stage freed per block. For the one-item fp8 kernels whose
  // producer decodes chunk by chunk (Fp8Producer: group scales), where it is faster at decode and
  // no slower at prefill (docs/decisions/sparse_prefill.md); MJ_SP90_BLOCK_SCHEDULE 0 (an NVRTC
  // option, part of the cache key) builds the prefill schedule instead, for A/B measurements.
#ifndef MJ_SP90_BLOCK_SCHEDULE
#define MJ_SP90_BLOCK_SCHEDULE 1
#endif
  static constexpr bool kBlockSchedule =
      MJ_SP90_BLOCK_SCHEDULE && KV_FP8 && !FP8_MATH && !kPersistent && (!kF16 || kF16Group);

  // The crossover's releases of the peer's halves: one per consumer thread.
  static constexpr u32 kPeerReleasesPerWg = kCrossover ? 128u : 0u;

  static constexpr int kThreads = sparse_prefill_layout::kHopperThreads;  // WG0, WG1 consumers; WG2 producer
  // Register budgets after setmaxnreg: consumers hold a 64x256 f32 accumulator (128 regs), a 64x64
  // score tile (32) and its bf16 copy (16); the producer needs few.
  // The block schedule's register split, for a body without the crossover: WG1 holds only its
  // accumulator (160), so its registers can deepen the producer's window of loads (Fp8Producer::
  // kWindow, 12). MJ_SP90_BLOCK_REGS (an NVRTC option, part of the cache key): 2 = 128 / 216 / 160
  // (producer / WG0 / WG1), 1 = FlashMLA's 152 / 192 / 160, 0 = 72 / 216 / 216 as the prefill
  // schedule. Default: 2 in a kernel that has the crossover, whose other body runs only launches of
  // more than 512 tokens (prefill-sized: g 64 +5-15%, records +1% on an H100), 0 elsewhere (64-head
  // decode runs this body: 1 was slower there, 318 against 281 us on an H200). The crossover body
  // keeps 72 / 216 / 216: a deeper window (9 or 18, 128 producer registers) was 5-20% slower
  // (docs/decisions/sparse_prefill.md).
#ifndef MJ_SP90_BLOCK_REGS
  static constexpr int kBlockRegsChoice = kCrossoverAvailable ? 2 : 0;
#else
  static constexpr int kBlockRegsChoice = MJ_SP90_BLOCK_REGS;
#endif
  static constexpr bool kBlockRegs = kBlockSchedule && !kCrossover && kBlockRegsChoice != 0;
  static constexpr int kProducerRegs = !kBlockRegs ? 72 : kBlockRegsChoice == 1 ? 152 : 128;
  static constexpr int kConsumerRegs = kBlockRegs && kBlockRegsChoice == 1 ? 192 : 216;  // WG0, and WG1 outside the block split
  static constexpr int kWg1Regs = kBlockRegs ? 160 : kConsumerRegs;
  // setmaxnreg moves registers inside the CTA's launch allocation: kThreads x the entry cap
  // (65536 / 384 rounded down to a multiple of 8 = 168), i.e. 64512, not the SM's 65536. Asking
  // for more makes the consumers' allocation spin forever.
  static constexpr int kEntryRegs = (65536 / kThreads) / 8 * 8;
  static_assert(128 * (kProducerRegs + kConsumerRegs + kWg1Regs) <= kThreads * kEntryRegs,
                "setmaxnreg budgets exceed the CTA's register allocation");

  // Shared memory (sparse_prefill/layout.h): bookkeeping first, then the 1024-byte-aligned tiles.
  static constexpr sparse_prefill_layout::HopperLayout kLayout = sparse_prefill_layout::hopper_layout(FP8_MATH, kPersistent);
  static constexpr int kOffMax = kLayout.off_max;
  static constexpr int kOffRowSum = kLayout.off_rowsum;
  static constexpr int kOffBias = kLayout.off_bias;
  static constexpr int kOffColScale = kLayout.off_colscale;
  static constexpr int kOffBiasF8 = kLayout.off_bias_f8;
  static constexpr int kOffColScaleF8 = kLayout.off_colscale_f8;
  static constexpr int kOffInvScale = kLayout.off_invscale;
  static constexpr int kOffQScale = kLayout.off_qscale;
  static constexpr int kOffItemBars = kLayout.off_item_bars;
  static constexpr int kMiscBytes = kLayout.misc_bytes;
  static constexpr int kSmemBytes = kLayout.smem_bytes;
  static_assert(kSmemBytes <= sparse_prefill_layout::kMaxDynamicSmem, "shared memory");
};

// ---- per-CTA context -------------------------------------------------------------------------------
struct Smem {
  u32 full[2][2];   // [stage][half] barrier addresses: stage data landed (+ bias / scales published)
  u32 empty[2][2];  // [stage][half]: readers done
  // WG1 -> WG0 hand-offs of generic shared-memory data go through mbarriers, whose arrive / wait
  // compute-sanitizer racecheck models exactly; a named-barrier bar.arrive -> bar.sync hand-off of
  // the same data (PTX-ordered) was reported as a RAW hazard.
  u32 max1_ready;    // WG1's step max in `max`: one arrival per writing lane (32 per step)
  u32 rowsum_ready;  // both warpgroups' row sums in `rowsum`, their wgmma done, Q space free (256, once;
                     // persistent: once per item, and the Q space may already hold the next item)
  // Persistent kernels (Config::kPersistent) only:
  u32 q_full;        // the item's query tile landed (the producer's 128 cp.async arrivals)
  u32 q_free;        // both consumers' last Q K^T of the item done (256)
  u32 rowsum_read;   // both consumers read the item's row sums: `rowsum` may be overwritten (256)
  // Stage 1's rope tile (tile 8, read only by WG1's Q K^T) has barriers of its own, so that it is
  // refilled as soon as that Q K^T is done instead of with the rest of the right half after WG1's P V.
  u32 rope1_full;    // tile 8 of stage 1 landed (the producer's cp.async + plain arrivals, 256)
  u32 rope1_empty;   // WG1's Q K^T of stage 1 done (128)
  float* max;       // [64]
  float* rowsum;    // [2][64]
  float* bias;      // [2][64]
  float* colscale;  // [2][64]
  u32 q;            // query tile, later the bf16 output staging (64 rows x 1024 bytes)
  u32 k[2];         // K stages
  u32 p1;           // WG1's P (64x64 bf16); WG0's P lives in stage 0's tile 8 (rope dims, unused by P V)
  // Crossover kernels (Config::kCrossover): the peer CTA's shared::cluster address of a local one is
  // that address + peer_delta (mapa of the window's base); 0 otherwise.
  u32 peer_delta;
  // Block schedule (Config::kBlockSchedule, sm90_block.cuh): WG0 -> WG1 per block, P of the block in
  // its stage's rope tile, and in `xfer` the rows' rescale factors [2 stages][64], then their
  // running max after the block [2][64]. p_full[stage]: 128 arrivals (WG0) per block. Both live in
  // regions the block schedule leaves unused (the max hand-off array, WG1's P tile).
  u32 p_full[2];
  float* xfer;
};

MJ_DEVICE Smem carve_smem(unsigned char* base, int misc_bytes) {
  Smem s;
  const u32 b = sm90::smem_addr(base);
#pragma unroll
  for (int st = 0; st < 2; ++st) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      s.full[st][h] = b + sparse_prefill_layout::kBarFull + kMbarBytes * (2 * st + h);
      s.empty[st][h] = b + sparse_prefill_layout::kBarEmpty + kMbarBytes * (2 * st + h);
    }
  }
  s.max1_ready = b + sparse_prefill_layout::kBarMax1Ready;
  s.rowsum_ready = b + sparse_prefill_layout::kBarRowsumReady;
  constexpr u32 kAlign = sparse_prefill_layout::kTileAlign;
  const u32 tiles = (b + static_cast<u32>(misc_bytes) + kAlign - 1u) & ~(kAlign - 1u);
  s.q = tiles;
  s.k[0] = tiles + kStageBytes;
  s.k[1] = tiles + 2 * kStageBytes;
  s.p1 = tiles + 3 * kStageBytes;
  s.peer_delta = 0u;
  return s;
}

// Thread 0, before the CTA's first __syncthreads: the stage-half barriers (full: `full_count`
// arrivals; empty: `empty_own` for halves [s][s], `empty_cross` for [s][1-s]), WG1's max hand-off
// (its 4 warps' tig-0 lanes) and the row-sum exchange (both consumer warpgroups).
MJ_DEVICE void init_barriers(const Smem& s, u32 full_count, u32 empty_own, u32 empty_cross) {
#pragma unroll
  for (int st = 0; st < 2; ++st) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sm90::mbar_init(s.full[st][h], full_count);
      sm90::mbar_init(s.empty[st][h], st == h ? empty_own : empty_cross);
    }
  }
  sm90::mbar_init(s.max1_ready, 32u);
  sm90::mbar_init(s.rowsum_ready, 256u);
}

// ---- per-thread view of the tiles -----------------------------------------------------------------
// Per-thread view of the 64-row tiles: warp w of the warpgroup, lane = 4 gid + tig; rows
// r0 = 16 w + gid and r1 = r0 + 8; score register 4 j + {0,1} -> row r0, columns 8 j + 2 tig + {0,1};
// 4 j + {2,3} -> row r1, same columns (see common/wgmma.cuh).
struct Lane {
  int wg, w, gid, tig, r0, r1;
};
// Fills the caller's Lane in place. (The one-item kernels use this; make_lane's by-value Lane moves
// their scheduling, while the persistent kernel was measured with make_lane. Both are the same
// values.)
MJ_DEVICE void set_lane(Lane& ln, int wg, int lane) {
  ln.wg = wg;
  ln.w = (static_cast<int>(threadIdx.x) >> 5) & 3;
  ln.gid = lane >> 2;
  ln.tig = lane & 3;
  ln.r0 = 16 * ln.w + ln.gid;
  ln.r1 = ln.r0 + 8;
}
MJ_DEVICE Lane make_lane(int wg, int lane) {
  Lane ln;
  set_lane(ln, wg, lane);
  return ln;
}

// The fp8 bf16-decode tiles hold K * 2^-64 (sm90.cuh, Design): the producer multiplies by 2^56 (with
// e4m3 bits moved into a bf16 as value * 2^-120), the consumers multiply scores and output by 2^64.
constexpr float kTwoPow56 = 72057594037927936.0f;
constexpr float kTwoPow64 = 18446744073709551616.0f;

}  // namespace sparse_prefill_sm90
}  // namespace mj

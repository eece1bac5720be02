#pragma once
// Sparse MLA prefill (SPEC §3) for Hopper (sm_90a): wgmma tensor cores, warp-specialised.
//
// ---- Host interface (what the generator instantiates and the op launches) ----------------------
//   #include "sparse_prefill/sm90.cuh"
//   using Cfg = mj::sparse_prefill_sm90::Config<NUM_HEADS, B_TOPK, KV_FP8, SCALE_BLOCK, ATTN_SINK,
//                                                EMIT_LSE, PAGE_SIZE, NUM_STAGES[, FP8_MATH[, POW2_SCALES]]>;
//   extern "C" __global__ void __launch_bounds__(Cfg::kThreads, 1)
//   mlajit_sparse_prefill_sm90(const __grid_constant__ SparsePrefillArgs args) {
//     mj::sparse_prefill_sm90::run<Cfg>(args);
//   }
// Launch: grid  = (num_tokens * Cfg::kCtasPerToken, 1, 1) items
//               (= num_tokens * NUM_HEADS / Cfg::kHeadsPerCta; token-major: the CTAs of one token
//                are adjacent so they read its gathered rows from L2 together);
//               Cfg::kPersistent (bf16): any grid up to that, the op launches min(items, SMs);
//               with a tail split (args.split_shift > 0) the walk covers units instead, and
//               mlajit_sparse_prefill_sm90_combine (combine<Cfg>, kCombineThreads) runs after it
//               on grid (split items, kHeadsPerCta)
//         block = (Cfg::kThreads = 384, 1, 1)
//         dynamic shared memory = Cfg::kSmemBytes (232272 bytes, the persistent bf16 kernel 232312,
//         FP8_MATH 189520: needs the opt-in CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES; the sm_90
//         limit is 232448).
//         The `__launch_bounds__(kThreads, 1)` (with the 1) is required: setmaxnreg needs an entry
//         register cap.
// Template parameters and constraints (static_asserts name the violated one):
//   NUM_HEADS   16..128, multiple of 16. CTA c of a token handles heads
//               [c * kHeadsPerCta, (c + 1) * kHeadsPerCta); kHeadsPerCta = NUM_HEADS / kCtasPerToken
//               (64 for H = 64/128; 40/48/56 for H = 80/96/112; H itself for H < 64). The MMA tile
//               is always 64 rows: rows past kHeadsPerCta are zero and their results discarded, so
//               H < 64 costs the same as H = 64 per token.
//   B_TOPK      64 or 128. The kernel always streams 64-key blocks, two per loop step (one per
//               consumer warpgroup); it never reads an index at or past topk_lengths[t], so it does
//               not depend on indices_stride being a multiple of anything. A true 128-key stage
//               does not fit: two 128 x 576 bf16 stages (288 KiB) plus the 72 KiB query tile exceed
//               the 227 KiB of shared memory, and a 64 x 128 f32 score tile would push a consumer
//               past 255 registers. B_TOPK = 128 therefore runs the same schedule as 64.
//   KV_FP8      false: bf16 cache rows (1152 bytes); true: fp8 e4m3 rows (576 bytes) with scales.
//   SCALE_BLOCK fp8 only: 0 = unit scales (kv_scales not read), else elements per scale, dividing
//               576 and >= 16 (scales_per_token = 576 / SCALE_BLOCK floats per row); 576 = one
//               scale per row. Widths 18 and 36 (groups not a multiple of 8) are correct but slower
//               (their decode spills). Smaller widths: use the sm80 path. Must be 0 for bf16.
//   ATTN_SINK   reads args.attn_sink[H]; EMIT_LSE writes args.lse[T, H].
//   PAGE_SIZE   page size of the encoded indices (tma_row arithmetic), >= 1.
//   NUM_STAGES  must be 2: the K ring is two 64-key stages (one per consumer warpgroup), each
//               split into a left (dims 0..255) and right (dims 256..575) half with its own
//               full/empty barriers, so the producer refills a half as soon as its readers are done
//               (the persistent kernel: stage 1's rope tile has barriers of its own, see Smem).
//   FP8_MATH    (9th, defaulted false) params qk_math fp8: Q K^T and P V on e4m3 wgmma with Q quantised
//               per head; needs KV_FP8 and SCALE_BLOCK 0 or 576; 189520 bytes of shared memory.
//               The body is sparse_prefill/sm90_fp8math.cuh (its header says what differs).
//   POW2_SCALES (10th, defaulted false) params scale_fmt ue8m0: every group scale is a power of two,
//               so the group decode multiplies each pair once by scale * 2^56 (exact) instead of the
//               split hi + lo multiply that rounds arbitrary scales once (-3 to -5 % cycles, notes 37);
//               widths 192 decode to f16 tiles instead (kF16Group, see Precision).
//   TUNE        (11th, defaulted) development-only experiment bits; the generator leaves it 0.
// Args: every pointer of SparsePrefillArgs that the configuration uses must be valid; sm_scale must
// be finite and >= 0 (the running max is taken on scaled scores). Absolute row indices must fit in
// 32 bits (any cache that fits in device memory: 2^32 rows would be >= 2.4 TB).
// Precision: bf16 caches are used as is. fp8 with unit or per-row scales (SCALE_BLOCK 0 / 576) runs
// on f16 tiles: e4m3 -> f16 is exact, per-row scales are applied in f32 to scores and P, the query
// tile is converted to f16 after a power-of-two range scale (exact for every value within 2^-28 of
// the tile's largest |q|), P is rounded to f16 (3 more mantissa bits than bf16); the e4m3 NaN codes
// (0x7F/0xFF) stay NaN. With group scales (16 <= SCALE_BLOCK < 576) the bf16 tile holds
// K * scale rounded once to bf16, as a bf16-dequantised cache would (NaN codes decode to finite
// values there); when every scale is a power of two (params scale_fmt ue8m0) that product is exact
// (e4m3's 4 significant bits fit bf16's 8) for scales in [2^-53, 2^71] (a normal bf16 from 2^-53;
// above 2^71 the 2^56 multiplier overflows: NaN), so the tile holds the cache's values exactly and
// only f32 accumulation order differs from SPEC §3. Power-of-two groups of 192 (kF16Group) use f16
// tiles instead: e4m3 x 2^(e_g - R) with a per-row power of two 2^R folded into scores and P
// (P x 2^R rounded to f16, as P x scale is for per-row scales), exact in the tile while the row's
// group scales span <= 2^22; group scales >= 2^23 overflow P x 2^R (inf / NaN output), and only a
// scale's exponent is used (a scale that is not a power of two is truncated to one, its sign
// dropped). Range and choice of R: Fp8Producer::finish_row_scales.
//
// ---- Design ---------------------------------------------------------------------------------------
// One CTA = one token x one 64-row head tile; 3 warpgroups:
//   WG2 (producer, few registers): reads the token's indices, resolves rows (SPEC validity rule),
//     and gathers each 64-key block into a K stage (64 rows x 576 bf16, 128-byte swizzled tiles of
//     64 columns): bf16 rows by cp.async 16 B per thread (zero-fill, no read, for invalid slots),
//     fp8 rows by 16-byte register loads decoded on the way. Per stage it also publishes a
//     column bias (0 or -inf) and, for per-row fp8 scales, the row's scale (kF16Group: the row's
//     power of two 2^R).
//   WG0 / WG1 (consumers, many registers): block 2i goes to stage 0 (scored by WG0), block 2i+1 to
//     stage 1 (scored by WG1): S = Q K^T with m64n64k16 wgmma over 9 column tiles (Q resident in
//     shared memory). Online softmax in f32 in the exp2 domain, running max shared through shared
//     memory so both warpgroups use one max. The output is split by columns: WG0 accumulates
//     O[:, 0:256], WG1 O[:, 256:512], each with m64n256k16 wgmma over BOTH blocks: its own P from
//     registers (RS form) and the other warpgroup's P through shared memory (SS form).
//   Epilogue: row sums exchanged, O scaled (sink, empty-row rule), staged as bf16 in the query
//   tile's space, stored with 16-byte coalesced writes; lse by WG0.
// Persistent (bf16 cache, Config::kPersistent): each CTA walks items (token x head tile) it =
//   blockIdx.x, + gridDim.x, ... with one SM's worth of CTAs. The K ring and its barrier parities
//   run on across items; the producer loads each item's query tile itself (q_free -> cp.async ->
//   q_full) once both consumers' last Q K^T of the item before completed, and gathers the
//   next item's first stages while the consumers finish the last step and the epilogue; the
//   epilogue stores O from registers (8 bytes per lane, one shuffle per pair) because the query
//   space may already hold the next item. Per item this hides the CTA launch, the topk length ->
//   index -> first gather chain and the query load: 11.2K -> 8.2K cycles of fixed cost per item
//   (notes 38). Tail split (args.split_shift > 0, given partial slots by the host): the items of
//   the walk's last round run as parts (step ranges) on the CTAs that would otherwise idle, each
//   part writing its raw f32 state to a slot; the combine entry merges them (unit_item, combine).
// fp8 decode, unit / per-row scales and power-of-two groups of 192 (C::kF16): one
// cvt.rn.f16x2.e4m3x2 per pair into f16 tiles (kF16Group: times the group's 2^(e_g - R)); the
// consumers then run the f16 wgmma (same rate as bf16) with Q and P in f16 too.
// fp8 decode, group scales: e4m3 bits are moved into a bf16 (sign | magnitude << 4: exact, value * 2^-120) and
// multiplied by 2^56 (unit / per-row) or by group scale * 2^56 (split hi + lo, one rounding; one
// exact multiply when the scales are powers of two, POW2_SCALES), so the
// tile holds K * 2^-64: no overflow for scales up to 2^71, and P V products stay far from the f32
// subnormal range. The 2^64 is folded back into the score multiplier and the output. Per-row scales
// (SCALE_BLOCK 576) are folded into the score multiplier and P instead of the tile. The fp8
// producer streams 16-byte loads through a register window (9 deep for f16 tiles, 6 / 4 / 2 with
// group scales) across halves and steps; its encoded indices are loaded two steps ahead (the bf16
// producer's one step ahead), so no index load latency lands on the critical path of a step. With
// unit / per-row scales (f16 tiles) 8 lanes load one 128-byte L2 line of a row per instruction
// (Fp8LineProducer: ~5.5 L2 requests per 576-byte row instead of 9); MJ_SP90_FP8_LINE_GATHER=0
// selects the 4-lanes-per-row producer (Fp8Producer) that group scales always use.
// Proxy ordering: stage data are written through the generic proxy (cp.async, st.shared) and read
// by wgmma through the async proxy; each consumer fences after acquiring a full barrier (a
// producer-side fence would be a MEMBAR that waits for the producer's in-flight loads): the full
// fence after st.shared stages, the acquire form (no instruction on sm_90a) after cp.async ones
// (wait_full says why).
// L2: gathered rows evict-last (re-read by other tokens' CTAs), Q evict-first, output streaming.
#include "sparse_prefill/args.h"
#include "common/convert.cuh"
#include "common/mbarrier.cuh"
#include "common/row_gather.cuh"
#include "common/smem_swizzle.cuh"
#include "common/types.cuh"
#include "common/warpgroup.cuh"
#include "common/wgmma.cuh"


namespace mj {
namespace sparse_prefill_sm90 {

constexpr int kQkDim = 576;
constexpr int kVDim = 512;
constexpr int kQkTiles = kQkDim / 64;  // 9 column tiles of 64 bf16 (128 bytes per row)
constexpr int kLeftTiles = 4;          // dims 0..255: WG0's half of V
constexpr int kBlockKeys = 64;         // keys per stage (one consumer warpgroup's score tile)
constexpr int kTileRows = 64;          // rows of every tile (heads or keys)
constexpr int kTileBytes = kTileRows * 128;
constexpr int kStageBytes = kQkTiles * kTileBytes;  // 73728: one 64-key stage, also the Q tile
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

// TUNE: development-only experiment bits, 0 in production (the generator never sets it), kept to
// measure alternatives side by side (a template directory with another default):
//   2: (retired: the group-scale load window is MJ_SP90_GROUP_WINDOW, e.g. 9)
//   4: fp8: the producer fences its stores before arriving (drains its load window at every half)
//      instead of the consumers fencing after the wait
// Power-of-two group scales (scale_fmt ue8m0, widths that are multiples of 64 from
// MJ_SP90_UE8M0_F16_MIN_BLOCK: 192) decoded to f16 tiles (1) or to the bf16 tiles of the other group
// scales (0).
#ifndef MJ_SP90_UE8M0_F16
#define MJ_SP90_UE8M0_F16 1
#endif
#ifndef MJ_SP90_UE8M0_F16_MIN_BLOCK
#define MJ_SP90_UE8M0_F16_MIN_BLOCK 128
#endif
// Load window of the group-scale decode (one scale per chunk). 9 measured +4 % (notes 37).
#ifndef MJ_SP90_GROUP_WINDOW
#define MJ_SP90_GROUP_WINDOW 6
#endif
// The first step's index slots hinted into L2 at CTA start (cta_work): 1 on, 0 off, -1 (default) on
// for the 16-bit kernels (bf16 -0.5 % cycles at 32K, -0.3 % at 8K, 0.0 at 128K) and off for FP8
// math (+0.2 %), notes 37.
#ifndef MJ_SP90_INDEX_PREFETCH
#define MJ_SP90_INDEX_PREFETCH -1
#endif
// setmaxnreg split of the fp8 configs on f16 tiles (unit / per-row scales): 88 / 208 buys the
// producer a 12-deep load window (MJ_SP90_F16_WINDOW 12); the consumers do not spill more at 208
// (at 200 ptxas serialises their wgmma). Every other config keeps 72 / 216.
#ifndef MJ_SP90_F16_PRODUCER_REGS
#define MJ_SP90_F16_PRODUCER_REGS 72
#endif
#ifndef MJ_SP90_F16_CONSUMER_REGS
#define MJ_SP90_F16_CONSUMER_REGS 216
#endif
template <int NUM_HEADS, int B_TOPK, bool KV_FP8, int SCALE_BLOCK, bool ATTN_SINK, bool EMIT_LSE, int PAGE_SIZE,
          int NUM_STAGES, bool FP8_MATH = false, bool POW2_SCALES = false, int TUNE = 0>
struct Config {
  static_assert(NUM_HEADS >= 16 && NUM_HEADS <= 128 && NUM_HEADS % 16 == 0,
                "sparse_prefill_sm90: NUM_HEADS must be a multiple of 16 in [16, 128]");
  static_assert(B_TOPK == 64 || B_TOPK == 128, "sparse_prefill_sm90: B_TOPK must be 64 or 128");
  static_assert(NUM_STAGES == 2, "sparse_prefill_sm90: NUM_STAGES must be 2 (one K stage per consumer warpgroup)");
  static_assert(PAGE_SIZE >= 1, "sparse_prefill_sm90: PAGE_SIZE must be >= 1");
  static_assert(KV_FP8 || SCALE_BLOCK == 0, "sparse_prefill_sm90: SCALE_BLOCK must be 0 for a bf16 cache");
  static_assert(SCALE_BLOCK >= 0 && (SCALE_BLOCK == 0 || kQkDim % SCALE_BLOCK == 0),
                "sparse_prefill_sm90: SCALE_BLOCK must be 0 or divide 576");
  static_assert(SCALE_BLOCK == 0 || SCALE_BLOCK >= 16,
                "sparse_prefill_sm90: SCALE_BLOCK must be 0 or >= 16 (a 16-element chunk spans <= 2 scale groups)");
  static_assert(!FP8_MATH || (KV_FP8 && (SCALE_BLOCK == 0 || SCALE_BLOCK == kQkDim)),
                "sparse_prefill_sm90: FP8_MATH needs an fp8 cache with unit or per-row scales (SCALE_BLOCK 0 or 576)");

  static constexpr int kNumHeads = NUM_HEADS;
  static constexpr int kBTopk = B_TOPK;
  static constexpr bool kFp8 = KV_FP8;
  static constexpr int kScaleBlock = SCALE_BLOCK;
  static constexpr int kScalesPerToken = SCALE_BLOCK == 0 ? 0 : kQkDim / SCALE_BLOCK;
  static constexpr bool kRowScale = KV_FP8 && SCALE_BLOCK == kQkDim;                   // folded into scores/P
  static constexpr bool kGroupScale = KV_FP8 && SCALE_BLOCK != 0 && SCALE_BLOCK != kQkDim;  // multiplied in tile
  static constexpr bool kPow2Scales = kGroupScale && POW2_SCALES;  // scale_fmt ue8m0: one exact multiply
  // Power-of-two group scales on f16 tiles (MJ_SP90_UE8M0_F16): each row is decoded as e4m3 x
  // 2^(e_g - R) with a per-row power of two 2^R folded into the scores and P like a per-row scale;
  // exact while the row's group exponents fit f16's range around R (Fp8Producer::finish_row_scales).
  // Widths that are multiples of 64 keep a 64-dim tile inside one group (every lane of a row takes
  // the same multiplier per tile). Taken for 192 (3 scales per row): -7.9 % cycles at 32K against
  // the bf16 decode; not for 64 (9 per row: +0.7 / -0.8 / +4.7 % at 32K / 8K / 128K, the row
  // scales' registers and shuffles cost what the cheaper decode saves), notes 37.
  static constexpr bool kF16Group =
      MJ_SP90_UE8M0_F16 && kPow2Scales && !FP8_MATH && SCALE_BLOCK % 64 == 0 && SCALE_BLOCK >= MJ_SP90_UE8M0_F16_MIN_BLOCK;
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
  static constexpr bool kProducerFence = KV_FP8 && (TUNE & 4) != 0;
  static constexpr bool kConsumerFence = !kProducerFence;
  // The producer fills the stages with cp.async only (no register path): bf16 rows, FP8 math.
  static constexpr bool kStageByCpAsync = !KV_FP8 || FP8_MATH;
  // Persistent (bf16 cache): a CTA walks items with the grid's stride (header, Design); the host
  // launches min(items, SMs) CTAs (plan.hpp: Sm90Plan::persistent); one CTA per item also works.
  static constexpr bool kPersistent = !KV_FP8;

  static constexpr int kCtasPerToken = (NUM_HEADS + 63) / 64;
  static constexpr int kHeadsPerCta = NUM_HEADS / kCtasPerToken;
  static_assert(NUM_HEADS % kCtasPerToken == 0 && kHeadsPerCta <= 64, "head split");

  static constexpr int kThreads = 384;  // WG0, WG1 consumers; WG2 producer
  // Register budgets after setmaxnreg: consumers hold a 64x256 f32 accumulator (128 regs), a 64x64
  // score tile (32) and its bf16 copy (16); the producer needs few.
  static constexpr int kProducerRegs = kF16 ? MJ_SP90_F16_PRODUCER_REGS : 72;
  static constexpr int kConsumerRegs = kF16 ? MJ_SP90_F16_CONSUMER_REGS : 216;
  // setmaxnreg moves registers inside the CTA's launch allocation: kThreads x the entry cap
  // (65536 / 384 rounded down to a multiple of 8 = 168), i.e. 64512, not the SM's 65536. Asking
  // for more makes the consumers' allocation spin forever.
  static constexpr int kEntryRegs = (65536 / kThreads) / 8 * 8;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= kThreads * kEntryRegs,
                "setmaxnreg budgets exceed the CTA's register allocation");

  // Shared memory: bookkeeping first, then the 1024-byte-aligned tiles.
  static constexpr int kOffBars = 0;                       // 10 mbarriers: full[stage][half], empty[stage][half], max1_ready, rowsum_ready
  static constexpr int kOffMax = 80;                       // float[64]: running max hand-off
  static constexpr int kOffRowSum = kOffMax + 64 * 4;      // float[2][64]: row sums per warpgroup
  static constexpr int kOffBias = kOffRowSum + 2 * 64 * 4; // float[2][64]: 0 (valid) / -inf per key
  static constexpr int kOffColScale = kOffBias + 2 * 64 * 4;  // float[2][64]: per-row fp8 scale per key
  // FP8 math: bias / colscale / invscale are [step parity][stage][64] (a stage is released before its
  // softmax reads them), plus the per-head query scales.
  static constexpr int kKeyArrayBytes = (FP8_MATH ? 4 : 2) * 64 * 4;
  static constexpr int kOffBiasF8 = kOffRowSum + 2 * 64 * 4;
  static constexpr int kOffColScaleF8 = kOffBiasF8 + kKeyArrayBytes;
  static constexpr int kOffInvScale = kOffColScaleF8 + kKeyArrayBytes;  // FP8 math: 2^-log2(scale) per key
  static constexpr int kOffQScale = kOffInvScale + kKeyArrayBytes;      // FP8 math: float[64] query scales
  // Persistent: q_full, q_free, rowsum_read, rope1_full, rope1_empty mbarriers after the per-key arrays.
  static constexpr int kOffItemBars = kOffColScale + 2 * 64 * 4;
  static constexpr int kMiscBytes = FP8_MATH ? kOffQScale + 64 * 4 : kOffItemBars + (kPersistent ? 40 : 0);
  // Tiles: Q, K stage 0, K stage 1, P1 (bf16 / f16); FP8 math: Q, K stages 0 / 1 (e4m3, 64-byte
  // rows), V^T of WG0 / WG1 (two 64-key slots each), P0, P1 (e4m3).
  static constexpr int kTileRegionBytes =
      FP8_MATH ? 3 * (kQkTiles * 4096) + 2 * (2 * 256 * 64) + 2 * 4096 : 3 * kStageBytes + kTileBytes;
  static constexpr int kSmemBytes = kMiscBytes + 1024 + kTileRegionBytes;
  static_assert(kSmemBytes <= 232448, "shared memory");
};

// ---- per-CTA context -------------------------------------------------------------------------------
struct Smem {
  u32 full[2][2];   // [stage][half] barrier addresses: stage data landed (+ bias / scales published)
  u32 empty[2][2];  // [stage][half]: readers done
  // WG1 -> WG0 hand-offs of generic shared-memory data go through mbarriers, whose arrive / wait
  // compute-sanitizer racecheck models exactly; a named-barrier bar.arrive -> bar.sync hand-off of
  // the same data (PTX-ordered) was reported as a RAW hazard (docs/notes/sparse_prefill_sm90.md, 17).
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
};

MJ_DEVICE Smem carve_smem(unsigned char* base, int misc_bytes) {
  Smem s;
  const u32 b = sm90::smem_addr(base);
#pragma unroll
  for (int st = 0; st < 2; ++st) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      s.full[st][h] = b + 8u * (2 * st + h);
      s.empty[st][h] = b + 32u + 8u * (2 * st + h);
    }
  }
  s.max1_ready = b + 64u;
  s.rowsum_ready = b + 72u;
  const u32 tiles = (b + static_cast<u32>(misc_bytes) + 1023u) & ~1023u;
  s.q = tiles;
  s.k[0] = tiles + kStageBytes;
  s.k[1] = tiles + 2 * kStageBytes;
  s.p1 = tiles + 3 * kStageBytes;
  return s;
}

// ---- small numeric helpers ------------------------------------------------------------------------
MJ_DEVICE float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
MJ_DEVICE float lg2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
MJ_DEVICE float neg_inf() { return __uint_as_float(0xFF800000u); }
MJ_DEVICE float pos_inf() { return __uint_as_float(0x7F800000u); }
MJ_DEVICE u32 prmt(u32 a, u32 b, u32 sel) {
  u32 r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}
MJ_DEVICE u32 mul_f16x2(u32 a, u32 b) {
  u32 r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
MJ_DEVICE u32 mul_bf16x2(u32 a, u32 b) {
  u32 r;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
// Two e4m3 bytes (positioned by `sel` as bytes 1 and 3 of a word) to bf16x2 holding value * 2^-120,
// exactly (normals and subnormals): sign stays in the top bit, exponent|mantissa shift right by 4.
MJ_DEVICE u32 e4m3_pair_to_bf16x2_biased(u32 word, u32 sel) {
  const u32 t = prmt(word, 0u, sel);
  return (t & 0x80008000u) | ((t >> 4) & 0x07F007F0u);
}
// Two e4m3 values (the low / high byte of `pair`) to f16x2, exactly (f16 covers e4m3's range and
// precision; the NaN codes 0x7F / 0xFF become f16 NaN).
MJ_DEVICE u32 e4m3x2_to_f16x2(u32 word, bool high) {
  u32 r;
  if (high) {
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, hi;\n}\n" : "=r"(r) : "r"(word));
  } else {
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n}\n" : "=r"(r) : "r"(word));
  }
  return r;
}
constexpr float kTwoPow56 = 72057594037927936.0f;
constexpr float kTwoPow64 = 18446744073709551616.0f;

// A slot's row: SPEC validity rule. Returns the absolute row (layer offset added) of a valid slot,
// kNoRow otherwise. Rows are kept in 32 bits: a cache of 2^32 rows would be >= 2.4 TB (fp8).
constexpr u32 kNoRow = 0xFFFFFFFFu;
// The encoded index of a slot, or -1 (invalid) past topk_len: split from the row arithmetic so that
// a producer can issue the loads of a whole step early and resolve the rows when it needs them.
MJ_DEVICE int load_slot(const u32* token_indices, int slot, int topk_len) {
  return slot < topk_len ? static_cast<int>(__ldg(token_indices + slot)) : -1;
}
template <class C>
MJ_DEVICE u32 resolve_index(const SparsePrefillArgs& a, int e) {
  if (e < 0) return kNoRow;
  const i64 tma_row = static_cast<i64>(e / C::kPageSize) * a.row_stride + e % C::kPageSize;
  if (tma_row >= a.num_kv_rows) return kNoRow;
  return static_cast<u32>(tma_row + a.layer_row_offset);
}

// A value ptxas cannot rematerialise or split into uniform parts: each lane shuffles it from itself.
// (ptxas otherwise recomputes some loop-invariant addresses from the kernel arguments inside loops,
// or folds their uniform part into instruction forms it then encodes wrongly, see produce_bf16.)
MJ_DEVICE u32 opaque_u32(u32 v, int lane) { return __shfl_sync(0xFFFFFFFFu, v, lane); }
template <class T>
MJ_DEVICE const T* opaque_ptr(const T* p, int lane) {
  const u64 v = reinterpret_cast<u64>(p);
  return reinterpret_cast<const T*>(static_cast<u64>(opaque_u32(static_cast<u32>(v), lane)) |
                                    (static_cast<u64>(opaque_u32(static_cast<u32>(v >> 32), lane)) << 32));
}

// ---- producer: the persistent kernel's query tile ----------------------------------------------------
// The item's 64 query rows (72 KB, rows past kHeadsPerCta zero-filled) by cp.async, 16 bytes per lane
// and instruction (consecutive lanes: consecutive chunks of a row), once the consumers released the
// previous item's tile (q_free); completes on q_full with the lanes' cp.async arrivals.
template <class C>
MJ_DEVICE void load_q_async(const SparsePrefillArgs& a, const Smem& s, i64 token, int head0, u32 item, u64 policy) {
  const int t = static_cast<int>(threadIdx.x) - 256;  // 0..127
  const unsigned char* q = static_cast<const unsigned char*>(a.q) +
                           (token * C::kNumHeads + head0) * static_cast<i64>(kQkDim * 2);
  constexpr int kChunksPerRow = kQkDim * 2 / 16;  // 72
  sm90::mbar_wait(s.q_free, (item & 1u) ^ 1u);
#pragma unroll 1
  for (int i = 0; i < kTileRows * kChunksPerRow / 128; ++i) {
    const int id = t + 128 * i;
    const int row = id / kChunksPerRow, rest = id % kChunksPerRow;
    const bool valid = row < C::kHeadsPerCta;
    const u32 dst = s.q + (rest >> 3) * kTileBytes + sm90::sw128_offset(static_cast<u32>(row), static_cast<u32>(rest & 7));
    sm90::cp_async_16_zfill(dst, valid ? q + static_cast<i64>(row) * (kQkDim * 2) + rest * 16 : q, valid, policy);
  }
  sm90::mbar_arrive_cp_async(s.q_full);
}

// ---- producer: bf16 rows by cp.async ---------------------------------------------------------------
// Thread t of the warpgroup: group g = t / 8 owns rows g + 16 k (k < 4) of a block; lane c = t % 8 of
// the group copies 16-byte chunk c of each 128-byte tile row (8 lanes cover a tile row, coalesced).
// One item (persistent kernel): `gs` steps of earlier items ran through the K ring (barrier
// parities continue from there); the item's query tile is loaded once its first indices are in
// flight.
template <class C>
MJ_DEVICE void produce_bf16(const SparsePrefillArgs& a, const Smem& s, i64 token, int head0, int topk_len, int step0,
                            int steps, u32 gs, u32 item, u64 policy, u64 q_policy) {
  static_assert(C::kPersistent, "the bf16 producer serves the persistent kernel");
  const int t = static_cast<int>(threadIdx.x) - 256;
  const int g = t >> 3, c = t & 7;
  // The index row's address is kept in registers (a shuffled value is opaque to ptxas): recomputed
  // from the arguments at every index load, it costs two constant loads and a multiply per slot.
  const u32* token_indices = opaque_ptr(a.indices + token * a.indices_stride, t & 31);
  const unsigned char* kv = static_cast<const unsigned char*>(a.kv_blocks);
  const u32 lane_dst = static_cast<u32>(g) * 128u + ((static_cast<u32>(c) ^ (static_cast<u32>(g) & 7u)) << 4);
  // The lane's destination in each stage as one register that ptxas cannot split (a shuffle's result),
  // so that every cp.async addresses shared memory as [register + immediate]. Otherwise ptxas (CUDA
  // 13.0) addresses the stages of this producer as [R + UR + imm] and gives that form a wrong L2
  // cache-policy operand: the LDGSTS faults with an illegal instruction.
  const u32 stage_dst[2] = {opaque_u32(s.k[0] + lane_dst, t & 31), opaque_u32(s.k[1] + lane_dst, t & 31)};

  // The step's encoded indices are loaded one step ahead (their L2 / DRAM latency then overlaps the
  // previous step's copies instead of stalling the first copy of each step). Steps are the item's
  // (a tail-split part starts at step0).
  int next[2][4];
  auto load_step = [&](int step) {
#pragma unroll
    for (int b = 0; b < 2; ++b) {
#pragma unroll
      for (int k = 0; k < 4; ++k) next[b][k] = load_slot(token_indices, (2 * step + b) * kBlockKeys + g + 16 * k, topk_len);
    }
  };
  load_step(step0);
  load_q_async<C>(a, s, token, head0, item, q_policy);
  for (int step = 0; step < steps; ++step) {
    const u32 empty_parity = ((gs + static_cast<u32>(step)) & 1u) ^ 1u;
    u32 rows[2][4];
#pragma unroll
    for (int b = 0; b < 2; ++b) {
#pragma unroll
      for (int k = 0; k < 4; ++k) rows[b][k] = resolve_index<C>(a, next[b][k]);
    }
    load_step(step0 + step + 1);  // past the last step every slot is >= topk_len: no load
    auto publish_bias = [&](int b) {
      if (c == 0) {
#pragma unroll
        for (int k = 0; k < 4; ++k) s.bias[b * 64 + g + 16 * k] = rows[b][k] != kNoRow ? 0.0f : neg_inf();
      }
    };
    auto copy_tiles = [&](int b, int t0, int t1) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const bool valid = rows[b][k] != kNoRow;
        const unsigned char* src = kv + (valid ? static_cast<u64>(rows[b][k]) * (kQkDim * 2) : 0) + c * 16;
#pragma unroll
        for (int tile = 0; tile < kQkTiles; ++tile) {
          if (tile < t0 || tile >= t1) continue;
          sm90::cp_async_16_zfill(stage_dst[b] + tile * kTileBytes + 16 * k * 128, src + tile * 128, valid, policy);
        }
      }
    };
    auto signal_full = [&](u32 bar) {
      sm90::mbar_arrive_cp_async(bar);  // lands with the data
      sm90::mbar_arrive(bar);           // releases the bias written above
    };
    // Order matches the consumers' first needs: WG0 scores stage 0 left-then-right, WG1 stage 1
    // rope-right-left; each part is refilled as soon as its last reader released it. Stage 1's rope
    // tile goes first: WG1 releases it after its Q K^T, before any other part of the step is free, and
    // WG1 starts the next step on it while the rest of the right half (released after its P V, the
    // refill on the critical path) is still in flight: -1.4 to -2.3 % cycles (notes 41).
    sm90::mbar_wait(s.rope1_empty, empty_parity);
    copy_tiles(1, kQkTiles - 1, kQkTiles);
    signal_full(s.rope1_full);

    sm90::mbar_wait(s.empty[0][0], empty_parity);
    publish_bias(0);
    copy_tiles(0, 0, kLeftTiles);
    signal_full(s.full[0][0]);

    sm90::mbar_wait(s.empty[1][1], empty_parity);
    publish_bias(1);
    copy_tiles(1, kLeftTiles, kQkTiles - 1);
    signal_full(s.full[1][1]);

    sm90::mbar_wait(s.empty[0][1], empty_parity);
    copy_tiles(0, kLeftTiles, kQkTiles);
    signal_full(s.full[0][1]);

    sm90::mbar_wait(s.empty[1][0], empty_parity);
    copy_tiles(1, 0, kLeftTiles);
    signal_full(s.full[1][0]);
  }
}

// ---- producer: fp8 rows, decoded to bf16 on the way --------------------------------------------------
// Thread t: group g = t / 4 owns rows g and g + 32 of a block; lane c = t % 4 loads the 16-byte fp8
// chunks u = 4 q + c (16 dims each) and writes the two 16-byte bf16 chunks 2c, 2c+1 of tile u / 4.
// Per step a thread handles 36 chunks in a fixed order (the four stage halves in the order the
// consumers need them; in a half: row, then tile). Loads run kWindow chunks ahead of the decode in a
// register ring, across half and step boundaries (the next step's rows are resolved one step
// early), so L2 latency stays hidden while the thread decodes.
struct Fp8Plan {
  // Closed forms (no recursion), so that they fold to constants once the chunk loop is unrolled.
  static constexpr int kChunks = 36;
  // half h in consumer order: 0 = stage 0 left, 1 = stage 1 right, 2 = stage 0 right, 3 = stage 1 left
  __host__ __device__ static constexpr int stage(int h) { return h & 1; }
  __host__ __device__ static constexpr int side(int h) { return (h == 1 || h == 2) ? 1 : 0; }  // 1: tiles 4..8
  __host__ __device__ static constexpr int first_tile(int h) { return side(h) ? kLeftTiles : 0; }
  __host__ __device__ static constexpr int tiles(int h) { return side(h) ? kQkTiles - kLeftTiles : kLeftTiles; }
  __host__ __device__ static constexpr int first_chunk(int h) { return h == 0 ? 0 : h == 1 ? 8 : h == 2 ? 18 : 28; }
  __host__ __device__ static constexpr int half_of(int i) { return i < 8 ? 0 : i < 18 ? 1 : i < 28 ? 2 : 3; }
  __host__ __device__ static constexpr int row_of(int i) { return (i - first_chunk(half_of(i))) / tiles(half_of(i)); }
  __host__ __device__ static constexpr int tile_of(int i) {
    return first_tile(half_of(i)) + (i - first_chunk(half_of(i))) % tiles(half_of(i));
  }
};
static_assert(Fp8Plan::first_chunk(1) == Fp8Plan::first_chunk(0) + 2 * Fp8Plan::tiles(0) &&
                  Fp8Plan::first_chunk(2) == Fp8Plan::first_chunk(1) + 2 * Fp8Plan::tiles(1) &&
                  Fp8Plan::first_chunk(3) == Fp8Plan::first_chunk(2) + 2 * Fp8Plan::tiles(2) &&
                  Fp8Plan::kChunks == Fp8Plan::first_chunk(3) + 2 * Fp8Plan::tiles(3),
              "fp8 chunk plan: halves must tile the 36 chunks of a step");

// Scale floats prefetched with a chunk (group scales): the group of the chunk's first element and,
// when groups are not a multiple of 16 wide, the group of its element 8 (width multiple of 8) or of
// its last element (SCALE_BLOCK >= 16: a 16-element chunk spans at most two groups).
template <class C>
struct Fp8Scales {
  static constexpr int kPerChunk = !C::kGroupScale || C::kF16Group ? 0 : C::kScaleBlock % 16 == 0 ? 1 : 2;
  float v[kPerChunk > 0 ? kPerChunk : 1];
};

// bf16x2 multipliers (group scale * 2^56) for the 8 element pairs of chunk u of a row, split in a
// high and a low bf16 part (hi + lo = the f32 scale to ~2^-16), so that fma(t, hi, t * lo) rounds
// the product once instead of rounding the scale first (a systematic error per group).
constexpr u32 kBf16x2TwoPow56 = 0x5B805B80u;  // bf16 2^56 in both halves
MJ_DEVICE void split_scale(float sc, u32& hi, u32& lo) {
  const float x = sc * kTwoPow56;
  const u32 h = f32_to_bf16(x);
  const u32 l = f32_to_bf16(x - __uint_as_float(h << 16));
  hi = h | (h << 16);
  lo = l | (l << 16);
}
template <class C>
MJ_DEVICE void chunk_multipliers(const Fp8Scales<C>& sc, int u, u32 (&hi)[8], u32 (&lo)[8]) {
  if constexpr (Fp8Scales<C>::kPerChunk == 1) {
    u32 h, l;
    split_scale(sc.v[0], h, l);
#pragma unroll
    for (int i = 0; i < 8; ++i) hi[i] = h, lo[i] = l;
  } else if constexpr (C::kScaleBlock % 8 == 0) {  // v[0]: elements 0..7, v[1]: elements 8..15
    u32 h0, l0, h1, l1;
    split_scale(sc.v[0], h0, l0);
    split_scale(sc.v[1], h1, l1);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      hi[i] = h0, lo[i] = l0;
      hi[i + 4] = h1, lo[i + 4] = l1;
    }
  } else {  // one group boundary somewhere in the chunk: elements from `split` on use v[1]
    u32 h0, l0, h1, l1;
    split_scale(sc.v[0], h0, l0);
    split_scale(sc.v[1], h1, l1);
    const int split = ((16 * u) / C::kScaleBlock + 1) * C::kScaleBlock - 16 * u;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const u32 mlo = 2 * i >= split ? 0xFFFFu : 0u, mhi = 2 * i + 1 >= split ? 0xFFFF0000u : 0u;
      const u32 sel = mlo | mhi;  // halves taking v[1]
      hi[i] = (h1 & sel) | (h0 & ~sel);
      lo[i] = (l1 & sel) | (l0 & ~sel);
    }
  }
}
MJ_DEVICE u32 fma_bf16x2(u32 a, u32 b, u32 c) {
  u32 r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

// The end of chunk I shared by both fp8 producers (Fp8Producer, Fp8LineProducer): refill the
// chunk's ring slot with the chunk kWindow ahead (the next step's once past this one), publish the
// half after its last chunk (release; the consumers fence after acquiring, wait_full), go on with
// chunk I + 1.
template <class C, int I, class Producer>
MJ_DEVICE void end_fp8_chunk(Producer& pr, u32 empty_parity) {
  using Plan = Fp8Plan;
  constexpr int kWindow = Producer::kWindow, h = Plan::half_of(I);
  if constexpr (I + kWindow < Plan::kChunks) {
    pr.template load<I + kWindow>(pr.cur);
  } else {
    pr.template load<I + kWindow - Plan::kChunks>(pr.nxt);
  }
  if constexpr (I == Plan::first_chunk(h) + 2 * Plan::tiles(h) - 1) {
    if constexpr (C::kProducerFence) sm90::fence_proxy_async_smem();
    sm90::mbar_arrive(pr.s.full[Plan::stage(h)][Plan::side(h)]);
  }
  if constexpr (I + 1 < Plan::kChunks) pr.template chunk<I + 1>(empty_parity);
}

// The fp8 producer's per-thread state; chunk<I>() handles chunk I of a step with every index a
// compile-time constant (template recursion rather than a loop the compiler might not fold).
#ifndef MJ_SP90_F16_GROUP_WINDOW
#define MJ_SP90_F16_GROUP_WINDOW 6  // kF16Group: the row scales take registers of the ring
#endif
#ifndef MJ_SP90_F16_WINDOW
#define MJ_SP90_F16_WINDOW 9  // f16 tiles: no scale registers, so a deeper load window fits; 12 needs
                              // MJ_SP90_F16_PRODUCER_REGS 88 (and, line producer, PARITY_BITS 0)
#endif
template <class C>
struct Fp8Producer {
  using Plan = Fp8Plan;
  using Scales = Fp8Scales<C>;
  // Loads in flight per thread (divides 36, so ring slots repeat each step): 6 x 16 B x 128 threads
  // = 12 KB per SM in flight, enough for ~14 B/clk at ~800 clk L2 latency. Two scale floats per
  // chunk (and the group-boundary decode) leave registers for shorter windows only.
  static constexpr int kWindow = C::kF16Group ? MJ_SP90_F16_GROUP_WINDOW
                                 : C::kF16 ? MJ_SP90_F16_WINDOW
                                 : Scales::kPerChunk < 2 ? MJ_SP90_GROUP_WINDOW
                                 : C::kScaleBlock % 8 == 0 ? 4 : 2;
  static_assert(Plan::kChunks % kWindow == 0, "window must divide the chunks per step");

  const SparsePrefillArgs& a;
  const Smem& s;
  const unsigned char* kv;  // cache base + this lane's 16-byte column offset
  const float* scales;      // kv_scales
  u64 policy;
  int g, c;
  // `c` laundered through an empty asm once per step: per-chunk values derived from the lane (scale
  // group indices, group boundaries) are then recomputed each step instead of being hoisted out of
  // the step loop into 36 chunks' worth of live registers.
  int cv;
  u32 sw;
  u32 cur[2][2], nxt[2][2];  // [block of the step][k]: row g + 32 k, kNoRow when invalid
  u32 raw[kWindow][4];
  Scales sc[kWindow];
  // kF16Group: lane c owns row g + 32 (c & 1) of block c >> 1 of a step (one row per lane). It loads
  // that row's group scales one step ahead (gsc) and turns them, at the top of the step, into the
  // row's factor 2^R (colsc, 0 for an invalid row) and the f16 multipliers 2^(e_g - R) of its
  // groups, two per word (mulw); the lanes decoding the row's chunks take them by shfl.
  static constexpr int kRowScales = C::kF16Group ? C::kScalesPerToken : 1;
  float gsc[kRowScales];
  u32 mulw[(kRowScales + 1) / 2];
  float colsc;

  // The lane's own row among rows[b][k] (selects, not a run-time array index: that would put the
  // row arrays in local memory).
  MJ_DEVICE u32 own_row(const u32 (&rows)[2][2]) const {
    const u32 b0 = (c & 1) ? rows[0][1] : rows[0][0], b1 = (c & 1) ? rows[1][1] : rows[1][0];
    return (c >> 1) ? b1 : b0;
  }
  MJ_DEVICE void load_row_scales(u32 row) {
#pragma unroll
    for (int i = 0; i < kRowScales; ++i)
      gsc[i] = row != kNoRow ? sm90::ldg_f32_ordered(scales + static_cast<u64>(row) * kRowScales + i) : 0.0f;
  }
  // R (biased exponent) is the power of two nearest 1 that keeps every group's e4m3 x 2^(e_g - R)
  // exact in f16: e4m3 magnitudes lie in [2^-9, 448], so e_g - R in [-15, 7] (f16's smallest step
  // 2^-24, largest finite 65504); i.e. R = clamp(0, e_max - 7, e_min + 15). R = 0 (colsc 1, P at
  // full f16 precision) when all of the row's scales lie in [2^-15, 2^7]; a group below 2^-15
  // (amax < 448 * 2^-16, e.g. an all-zero group, stored at 2^-22) gives R < 0, which costs small
  // P values of that key some f16 precision (P x 2^R goes subnormal); scales from 2^8 give R > 0,
  // and from 2^23 P x 2^R overflows f16 (inf / NaN output). A row whose group exponents span more
  // than 22 takes R = e_max - 7 (no overflow); its groups below e_max - 22 then lose their lowest
  // bits (flushed below 2^-24 relative to 2^R). Zero scales (exponent field 0) give multiplier 0
  // and do not bound R; an inf / NaN scale counts as 2^128 and overflows P (non-finite output).
  MJ_DEVICE void finish_row_scales(bool valid) {
    int emax = 0, emin = 255;
#pragma unroll
    for (int i = 0; i < kRowScales; ++i) {
      const int e = static_cast<int>((__float_as_uint(gsc[i]) >> 23) & 0xFFu);
      emax = max(emax, e);
      emin = e != 0 ? min(emin, e) : emin;
    }
    int r = max(emax - 7, min(127, emin + 15));
    r = min(max(r, 1), 254);
    colsc = valid ? __uint_as_float(static_cast<u32>(r) << 23) : 0.0f;
#pragma unroll
    for (int i = 0; i < kRowScales; i += 2) {
      u32 w = 0;
#pragma unroll
      for (int h = 0; h < 2 && i + h < kRowScales; ++h) {
        const int e = static_cast<int>((__float_as_uint(gsc[i + h]) >> 23) & 0xFFu);
        const int d = e - r;  // f16 bits of 2^d: normal from 2^-14, subnormal down to 2^-24
        const u32 bits = e == 0 || d < -24 ? 0u : d >= -14 ? static_cast<u32>(d + 15) << 10 : 1u << (d + 24);
        w |= bits << (16 * h);
      }
      mulw[i / 2] = w;
    }
  }

  // Loads chunk J of a step (rows from `rows`) into ring slot J % kWindow.
  template <int J>
  MJ_DEVICE void load(const u32 (&rows)[2][2]) {
    constexpr int h = Plan::half_of(J), k = Plan::row_of(J), tile = Plan::tile_of(J), slot = J % kWindow;
    const u32 row = rows[Plan::stage(h)][k];
    if (row != kNoRow) {
      sm90::ldg128_policy<64 * tile>(kv + static_cast<u64>(row) * kQkDim, policy, raw[slot][0], raw[slot][1],
                                     raw[slot][2], raw[slot][3]);
      if constexpr (Scales::kPerChunk >= 1) {
        const float* rs = scales + static_cast<u64>(row) * C::kScalesPerToken;
        const int u = 4 * tile + cv;
        sc[slot].v[0] = sm90::ldg_f32_ordered(rs + (16 * u) / C::kScaleBlock);
        if constexpr (Scales::kPerChunk == 2)
          sc[slot].v[1] = sm90::ldg_f32_ordered(rs + (16 * u + (C::kScaleBlock % 8 == 0 ? 8 : 15)) / C::kScaleBlock);
      }
    } else {
      raw[slot][0] = raw[slot][1] = raw[slot][2] = raw[slot][3] = 0u;
      if constexpr (Scales::kPerChunk >= 1) sc[slot].v[0] = 0.0f;
      if constexpr (Scales::kPerChunk == 2) sc[slot].v[1] = 0.0f;
    }
  }

  template <int I>
  MJ_DEVICE void chunk(u32 empty_parity) {
    constexpr int h = Plan::half_of(I), k = Plan::row_of(I), tile = Plan::tile_of(I), slot = I % kWindow;
    constexpr int st = Plan::stage(h), side = Plan::side(h);
    if constexpr (I == Plan::first_chunk(h)) {
      sm90::mbar_wait(s.empty[st][side], empty_parity);
      if constexpr (side == st) {  // a stage's first half: publish its key bias / per-row scales
        if constexpr (C::kF16Group) {
          if ((c >> 1) == st) {  // the row's owner lane
            const int key = st * 64 + g + 32 * (c & 1);
            s.bias[key] = colsc != 0.0f ? 0.0f : neg_inf();  // colsc is 0 exactly for an invalid row
            s.colscale[key] = colsc;
          }
        } else if (c == 0) {
#pragma unroll
          for (int kk = 0; kk < 2; ++kk) {
            const u32 row = cur[st][kk];
            s.bias[st * 64 + g + 32 * kk] = row != kNoRow ? 0.0f : neg_inf();
            if constexpr (C::kRowScale) s.colscale[st * 64 + g + 32 * kk] = row != kNoRow ? __ldg(scales + row) : 0.0f;
          }
        }
      }
    }
    // Pin the slot here: otherwise the compiler hoists the decode of every prefetched chunk up to
    // its load, which holds far more registers than the ring itself.
#pragma unroll
    for (int w = 0; w < 4; ++w) asm volatile("" : "+r"(raw[slot][w]));
    if constexpr (Scales::kPerChunk >= 1) asm volatile("" : "+f"(sc[slot].v[0]));
    if constexpr (Scales::kPerChunk == 2) asm volatile("" : "+f"(sc[slot].v[1]));
    u32 out[8];
    if constexpr (C::kF16) {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        out[2 * w] = e4m3x2_to_f16x2(raw[slot][w], false);
        out[2 * w + 1] = e4m3x2_to_f16x2(raw[slot][w], true);
      }
    } else {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        out[2 * w] = e4m3_pair_to_bf16x2_biased(raw[slot][w], 0x1404u);
        out[2 * w + 1] = e4m3_pair_to_bf16x2_biased(raw[slot][w], 0x3424u);
      }
    }
    // Always scaled (by 2^56 at least): the bit-moved value K * 2^-120 would put P V products in
    // the f32 subnormal range, where the tensor cores may flush them.
    if constexpr (C::kF16Group) {
      // The row's multiplier for this chunk's group (tile), from its owner lane: exact products.
      constexpr int grp = (64 * tile) / C::kScaleBlock;
      const u32 pair = __shfl_sync(0xFFFFFFFFu, mulw[grp / 2], (static_cast<int>(threadIdx.x) & 28) | (2 * st + k));
      const u32 m = prmt(pair, 0u, (grp & 1) ? 0x3232u : 0x1010u);
#pragma unroll
      for (int w = 0; w < 8; ++w) out[w] = mul_f16x2(out[w], m);
    } else if constexpr (C::kF16) {
      // exact f16 values: no scaling
    } else if constexpr (C::kPow2Scales && Scales::kPerChunk == 1) {
      // Power-of-two scales (scale_fmt ue8m0): s * 2^56 is a bf16 exactly, so one multiply per pair
      // gives e * s * 2^-64 exactly (the split below would add a zero low part). A scale that is
      // not a power of two is rounded to bf16 here before the product is rounded.
      const u32 h = f32_to_bf16(sc[slot].v[0] * kTwoPow56), m = h | (h << 16);
#pragma unroll
      for (int w = 0; w < 8; ++w) out[w] = mul_bf16x2(out[w], m);
    } else if constexpr (C::kGroupScale) {
      u32 hi[8], lo[8];
      chunk_multipliers<C>(sc[slot], 4 * tile + cv, hi, lo);
#pragma unroll
      for (int w = 0; w < 8; ++w) out[w] = fma_bf16x2(out[w], hi[w], mul_bf16x2(out[w], lo[w]));
    } else {
#pragma unroll
      for (int w = 0; w < 8; ++w) out[w] = mul_bf16x2(out[w], kBf16x2TwoPow56);  // exact
    }
    const u32 dst = s.k[st] + tile * kTileBytes + static_cast<u32>(g + 32 * k) * 128u;
    sm90::sts128(dst + (((2u * c) ^ sw) << 4), out[0], out[1], out[2], out[3]);
    sm90::sts128(dst + (((2u * c + 1u) ^ sw) << 4), out[4], out[5], out[6], out[7]);
    end_fp8_chunk<C, I>(*this, empty_parity);
  }

  template <int I>
  MJ_DEVICE void prefetch() {
    load<I>(cur);
    if constexpr (I + 1 < kWindow) prefetch<I + 1>();
  }
};

// ---- producer: fp8 rows by 128-byte line loads (unit / per-row scales) ------------------------------
// The 4-lanes-per-row mapping above makes each warp load touch 8 rows x 64 bytes: 8 L2 requests of 2
// sectors each, 9 requests per 576-byte row, as many as the bf16 path issues for a row twice as
// long. With L2 throughput the limiter of the fp8 path (75% busy at DRAM 6%, hit rate 92-95%; notes
// item 14), this mapping lets 8 lanes load one 128-byte L2 line of a row: ~5.5 requests per row
// (same 18 sectors). Rows are 576 = 4.5 x 128 bytes, so every other row starts in the middle of a
// line; each row's lanes follow its parity p (bit 6 of its address), in 16-byte chunks q of the row:
//   left half (tiles 0..3, 2 loads j per row): q = (8 j + 4 tau + c + 4 p) & 15
//     p = 0: two full lines; p = 1: line [4, 12) and the two 64-byte pieces [12, 16) + [0, 4)
//   right half (tiles 4..8, 2.5 loads per row): q = 16 + 8 j + 4 tau + c + 4 p for j < 2, plus a
//     64-byte piece q = 16 + 16 (1 - p) + c, which lanes share with a second row (one load for two)
// i.e. tile = q / 4 and the lane's chunk c = q % 4 (its own lane & 3 in every case), so a lane still
// widens the 16 dims [64 tile + 16 c, +16) into f16 chunks 2c, 2c+1 of its tile row. Requests per row:
// 5 (p = 0) or 6 (p = 1: the line holding tiles 3 and 4 is read once by each half, whose refills wait
// on different barriers). The thread's chunk order, window and per-half arrivals are Fp8Plan's.
// Lane bits (consumer role): c = bits 0..1, rho0 = bit 2, tau = bit 3, rho1 = bit 4; warp w of the
// warpgroup loads rows 16 k + 4 w + rho (k = 0..3) of a block: a full load covers the 4 rows of one
// k (8 lanes each: tau, c), a piece load the 8 rows of k = 2m, 2m+1 (4 lanes each). Rows are
// resolved once per step, one per lane (owner role: lane = b | k1 << 1 | rho0 << 2 | k0 << 3 |
// rho1 << 4 for row 16 k + 4 w + rho of block b), and fetched with shfl.idx whose segment mask keeps
// the reader's own rho bits (and tau for pieces): the source lane is an immediate. Every quarter warp
// stores two rows of different parity (rho0), whose 128-byte swizzles (row & 7) differ in bit 0, so
// the 8 chunks 2c ^ sw of its 16-byte stores hit 8 different bank groups.
#ifndef MJ_SP90_FP8_LINE_GATHER
#define MJ_SP90_FP8_LINE_GATHER 1  // 0: the 4-lanes-per-row producer above for every fp8 config
#endif
#ifndef MJ_SP90_FP8_PARITY_BITS
#define MJ_SP90_FP8_PARITY_BITS 1  // 1: line parities of the window in a bit register; 0: re-fetched at the decode
#endif
struct Fp8LinePlan {
  using P = Fp8Plan;
  __host__ __device__ static constexpr int side(int j) { return P::side(P::half_of(j)); }
  __host__ __device__ static constexpr int index(int j) { return j - P::first_chunk(P::half_of(j)); }
  // A right half is two groups of 5 loads: quad 2m line 0, line 1, quad 2m+1 line 0, line 1, piece m.
  __host__ __device__ static constexpr bool piece(int j) { return side(j) == 1 && index(j) % 5 == 4; }
  __host__ __device__ static constexpr int pair(int j) { return index(j) / 5; }
  __host__ __device__ static constexpr int quad(int j) {
    return side(j) == 0 ? index(j) / 2 : 2 * pair(j) + (index(j) % 5) / 2;
  }
  __host__ __device__ static constexpr int line(int j) { return side(j) == 0 ? index(j) % 2 : (index(j) % 5) % 2; }
};
static_assert(Fp8Plan::tiles(0) * 2 == 8 && Fp8Plan::tiles(1) * 2 == 10 && Fp8LinePlan::piece(8 + 4) &&
                  Fp8LinePlan::piece(8 + 9) && Fp8LinePlan::quad(8 + 5) == 2 && Fp8LinePlan::quad(7) == 3,
              "fp8 line plan: a left half is 4 quads x 2 lines, a right half 2 x (2 quads x 2 lines + 1 piece)");

// shfl.idx within segments: the source lane keeps the reader's lane bits in SEGMASK and takes the
// others from SRC (both immediates; the clamp 31 never redirects to the reader's own value).
template <int SRC, int SEGMASK>
MJ_DEVICE u32 shfl_idx_seg(u32 v) {
  u32 r;
  asm volatile("shfl.sync.idx.b32 %0, %1, %2, %3, 0xffffffff;\n" : "=r"(r) : "r"(v), "n"(SRC), "n"((SEGMASK << 8) | 31));
  return r;
}

template <class C>
struct Fp8LineProducer {
  using Plan = Fp8Plan;
  using LP = Fp8LinePlan;
  static_assert(C::kF16, "the line-gather producer writes f16 tiles (unit / per-row scales)");
  static constexpr int kWindow = MJ_SP90_F16_WINDOW;
  static_assert(Plan::kChunks % kWindow == 0, "window must divide the loads per step");
  static_assert(kWindow <= 32, "line parities of the window are kept in one register");

  const SparsePrefillArgs& a;
  const Smem& s;
  // Addresses: a per-thread base + a compile-time offset (the instruction's immediate, Geo) + the
  // line parity p times a per-load multiplier (src_mul; 128 x that for the 8192-byte tiles). The
  // second 16-byte store of a chunk is 16 bytes apart in the swizzle: dst ^ 16.
  const unsigned char* kv_c;  // cache base + 16 c; full loads add tau64
  u64 policy;
  u32 par;        // bit 6 of the cache base: row r's first line is half used iff (r ^ par) & 1
  u32 tau64;      // 64 x lane bit 3: the 64-byte half of a line that the lane's full loads read
  u32 d_t;        // stage 0 + the lane's chunk 2c in row 4 w + rho of tile tau (full loads)
  int own;        // owner role: 64 x block + row of the block (16 k + 4 w + rho) of the owned row
  u32 cur, nxt;   // owned cache row this step / next step, kNoRow when invalid
  int idx;        // encoded index of the owned slot of the next step (loaded at the step's top)
  float scale;    // per-row scale of the owned row this step (kRowScale), 0 when invalid
  u32 pbits;      // bit `slot`: line parity of the row loaded into ring slot `slot`
  u32 raw[kWindow][4];

  // Compile-time geometry of load J: kSrcOff / kDstOff are the immediates of its load / stores.
  template <int J>
  struct Geo {
    static constexpr bool kPiece = LP::piece(J);
    static constexpr bool kWrap = !kPiece && LP::side(J) == 0 && LP::line(J) == 1;
    // tile at p = 0 (tau included in d_t / tau64 for full loads)
    static constexpr int kTile0 = kPiece ? 8 : LP::side(J) == 0 ? 2 * LP::line(J) : kLeftTiles + 2 * LP::line(J);
    static constexpr int kSrcOff = 64 * kTile0;
    static constexpr u32 kDstOff = static_cast<u32>(Plan::stage(Plan::half_of(J)) * kStageBytes + kTile0 * kTileBytes) +
                                   (kPiece ? static_cast<u32>(LP::pair(J)) * 2u * 16u * 128u
                                           : static_cast<u32>(LP::quad(J)) * 16u * 128u);
  };
  template <int J>
  MJ_DEVICE int src_mul() const {
    // left-half line 1: tile (2 + tau + p) & 3 = 2 + tau + p (1 - 4 tau)
    return Geo<J>::kPiece ? -4 * 64 : Geo<J>::kWrap ? 64 - 4 * static_cast<int>(tau64) : 64;
  }

  // The cache row that load J reads (and its decode writes), from the owner lanes' `owned` rows.
  template <int J>
  MJ_DEVICE u32 row_of(u32 owned) const {
    constexpr int b = Plan::stage(Plan::half_of(J));
    if constexpr (LP::piece(J)) {
      return shfl_idx_seg<(LP::pair(J) << 1) | b, 0x1C>(owned);  // quad 2m + tau (reader's bit 3)
    } else {
      constexpr int quad = LP::quad(J);
      return shfl_idx_seg<((quad & 1) << 3) | ((quad >> 1) << 1) | b, 0x14>(owned);
    }
  }

  // Loads load J of a step (rows owned in `owned`: cur, or nxt for the next step's) into ring slot
  // J % kWindow and records the row's line parity.
  template <int J>
  MJ_DEVICE void load(u32 owned) {
    constexpr int slot = J % kWindow;
    const u32 row = row_of<J>(owned);
    const u32 p = (row ^ par) & 1u;
#if MJ_SP90_FP8_PARITY_BITS
    pbits = (pbits & ~(1u << slot)) | (p << slot);
#endif
    if (row != kNoRow) {
      // (tau64 is folded into the 32-bit offset: one register fewer than a second 64-bit base)
      const int off = static_cast<int>(p) * src_mul<J>() + (Geo<J>::kPiece ? 0 : static_cast<int>(tau64));
      const unsigned char* src = kv_c + static_cast<u64>(row) * kQkDim + static_cast<i64>(off);
      sm90::ldg128_policy<Geo<J>::kSrcOff>(src, policy, raw[slot][0], raw[slot][1], raw[slot][2], raw[slot][3]);
    } else {
      raw[slot][0] = raw[slot][1] = raw[slot][2] = raw[slot][3] = 0u;
    }
  }

  template <int I>
  MJ_DEVICE void chunk(u32 empty_parity) {
    constexpr int h = Plan::half_of(I), slot = I % kWindow;
    constexpr int st = Plan::stage(h), side = Plan::side(h);
    if constexpr (I == Plan::first_chunk(h)) {
      sm90::mbar_wait(s.empty[st][side], empty_parity);
      if constexpr (side == st) {  // a stage's first half: publish its key bias / per-row scales
        if ((own >> 6) == st) {
          s.bias[own] = cur != kNoRow ? 0.0f : neg_inf();
          if constexpr (C::kRowScale) s.colscale[own] = scale;
        }
      }
    }
    // Pin the slot here (as in Fp8Producer: keeps the decode from being hoisted up to the load).
#pragma unroll
    for (int w = 0; w < 4; ++w) asm volatile("" : "+r"(raw[slot][w]));
    u32 out[8];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      out[2 * w] = e4m3x2_to_f16x2(raw[slot][w], false);
      out[2 * w + 1] = e4m3x2_to_f16x2(raw[slot][w], true);
    }
#if MJ_SP90_FP8_PARITY_BITS
    const u32 p = (pbits >> slot) & 1u;
#else
    // The slot's row is this step's owned row again (loads of step + 1 used nxt, which is cur now):
    // one more shfl per chunk instead of a parity register live from each load to its decode.
    const u32 p = (row_of<I>(cur) ^ par) & 1u;
#endif
    // pieces: row 16 tau + 4 w + rho of tile 0, instead of row 4 w + rho of tile tau
    const u32 base = Geo<I>::kPiece ? d_t - (tau64 >> 6) * static_cast<u32>(kTileBytes - 16 * 128) : d_t;
    // (p * (m * 128), not p * m * 128: the latter changed ptxas's allocation into 3 more spills)
    const u32 dst = base + static_cast<u32>(static_cast<int>(p) * (src_mul<I>() * (kTileBytes / 64)));
    sm90::sts128(dst + Geo<I>::kDstOff, out[0], out[1], out[2], out[3]);
    sm90::sts128((dst ^ 16u) + Geo<I>::kDstOff, out[4], out[5], out[6], out[7]);
    // The next step's row is resolved where its first load needs it: its index was loaded at the
    // step's top (2/3 of a step earlier), and neither it nor the row stays live across a whole step.
    if constexpr (I == Plan::kChunks - kWindow) nxt = resolve_index<C>(a, idx);
    end_fp8_chunk<C, I>(*this, empty_parity);
  }

  template <int I>
  MJ_DEVICE void prefetch() {
    load<I>(cur);
    if constexpr (I + 1 < kWindow) prefetch<I + 1>();
  }
};

template <class C>
MJ_DEVICE void produce_fp8_lines(const SparsePrefillArgs& a, const Smem& s, i64 token, int topk_len, int steps) {
  const int t = static_cast<int>(threadIdx.x) - 256;
  const u32 lane = static_cast<u32>(t) & 31u, w = static_cast<u32>(t) >> 5;
  const u32 c = lane & 3u, tau = (lane >> 3) & 1u, rho = 2u * ((lane >> 4) & 1u) + ((lane >> 2) & 1u);
  const u32 rib = 4u * w + rho, sw = rib & 7u;
  const u32 dst0 = rib * 128u + (((2u * c) ^ sw) << 4);  // chunk 2c; 2c + 1 is dst0 ^ 16
  Fp8LineProducer<C> p{a, s};
  p.kv_c = static_cast<const unsigned char*>(a.kv_blocks) + c * 16u;
  p.tau64 = tau * 64u;
  p.policy = sm90::l2_policy_evict_last();
  p.par = static_cast<u32>(reinterpret_cast<u64>(a.kv_blocks) >> 6) & 1u;
  p.d_t = s.k[0] + dst0 + tau * static_cast<u32>(kTileBytes);
  p.own = static_cast<int>(64u * (lane & 1u) + 16u * (2u * ((lane >> 1) & 1u) + ((lane >> 3) & 1u)) + rib);
  p.pbits = 0u;
  const u32* token_indices = a.indices + token * a.indices_stride;
  // The owned row's encoded index of step + 1 is loaded at the top of step (its DRAM latency then
  // overlaps 2/3 of the step) and resolved in chunk 36 - window, whose refill loads the first chunk of
  // step + 1 (see chunk()).
  auto load_idx = [&](int step) { return load_slot(token_indices, 2 * kBlockKeys * step + p.own, topk_len); };
  p.cur = resolve_index<C>(a, load_idx(0));
  p.template prefetch<0>();
  for (int step = 0; step < steps; ++step) {
    p.idx = load_idx(step + 1);  // past the last step every slot is >= topk_len: no load
    // The per-row scale is fetched here and published at the stage's first half (block 0: after
    // the empty wait of chunk 0, block 1: at chunk 8). Fetching it a step ahead instead keeps one
    // more register live across the step: with indices two steps ahead ptxas spilled the in-flight
    // index load (an STL right behind the LDG: a DRAM round trip per step); fetched beside the
    // resolution in chunk 36 - window it costs 4 more spill loads per step (window 9).
    if constexpr (C::kRowScale) p.scale = p.cur != kNoRow ? sm90::ldg_f32_ordered(a.kv_scales + p.cur) : 0.0f;
    p.template chunk<0>((static_cast<u32>(step) & 1u) ^ 1u);
    p.cur = p.nxt;
  }
}

template <class C>
MJ_DEVICE void produce_fp8(const SparsePrefillArgs& a, const Smem& s, i64 token, int topk_len, int steps) {
  const int t = static_cast<int>(threadIdx.x) - 256;
  Fp8Producer<C> p{a, s};
  p.g = t >> 2;
  p.c = t & 3;
  p.kv = static_cast<const unsigned char*>(a.kv_blocks) + p.c * 16;
  p.scales = a.kv_scales;
  p.policy = sm90::l2_policy_evict_last();
  p.sw = static_cast<u32>(p.g) & 7u;
  const u32* token_indices = a.indices + token * a.indices_stride;
  // Encoded indices are loaded two steps ahead of their use and resolved one step ahead: the row
  // loads of step s + 1 start inside step s (the window), so their rows must be known then, and
  // an index load issued right before its resolution would stall the decode loop on L2 / DRAM.
  int idx[2][2];
  auto load_step = [&](int step) {
#pragma unroll
    for (int b = 0; b < 2; ++b) {
#pragma unroll
      for (int k = 0; k < 2; ++k) idx[b][k] = load_slot(token_indices, (2 * step + b) * kBlockKeys + p.g + 32 * k, topk_len);
    }
  };
  auto resolve = [&](u32 (&rows)[2][2]) {
#pragma unroll
    for (int b = 0; b < 2; ++b) {
#pragma unroll
      for (int k = 0; k < 2; ++k) rows[b][k] = resolve_index<C>(a, idx[b][k]);
    }
  };
  load_step(0);
  resolve(p.cur);
  load_step(1);
  if constexpr (C::kF16Group) p.load_row_scales(p.own_row(p.cur));
  p.cv = p.c;
  p.template prefetch<0>();
  for (int step = 0; step < steps; ++step) {
    if constexpr (C::kF16Group) p.finish_row_scales(p.own_row(p.cur) != kNoRow);
    resolve(p.nxt);       // step + 1 (slots past topk_len resolve to kNoRow)
    load_step(step + 2);
    if constexpr (C::kF16Group) p.load_row_scales(p.own_row(p.nxt));
    asm volatile("" : "+r"(p.cv));
    p.template chunk<0>((static_cast<u32>(step) & 1u) ^ 1u);
#pragma unroll
    for (int b = 0; b < 2; ++b) {
#pragma unroll
      for (int k = 0; k < 2; ++k) p.cur[b][k] = p.nxt[b][k];
    }
  }
}

// ---- consumers ----------------------------------------------------------------------------------
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

// This CTA's item: one token x one head tile, its top-k length (clamped to the stride) and the
// number of 128-key steps (two 64-key blocks each). Persistent kernel with a tail split: a part of
// an item, steps [step0, step0 + steps) of it, whose result goes to partial slot `slot` (-1: the
// whole item, written to out / lse).
struct CtaWork {
  i64 token;
  int head0, topk_len, steps;
  int step0, slot;
};
// Tail split (persistent kernel; args.split_shift > 0, parts = 2^split_shift). The walk goes over
// units: unit u < split_first is item u, whole; the units after it are the parts of items
// split_first, ...: unit split_first + k is part k % parts of item split_first + k / parts, and
// writes partial slot k. (Powers of two: shifts instead of divisions in every role's walk; with
// divisions the kernel grew by ~800 SASS instructions and its cold compile by ~0.3 s.)
// Why: items = tokens x head tiles rarely divide by the grid (4096 tokens x 2 tiles on 132 SMs: 62
// rounds and 8 items left), so without a split the last round runs a few whole items on a few SMs
// while the others idle, ~1/63 of the kernel. Split into parts, the tail items spread over the
// whole grid; the combine entry merges the parts (notes 40).
template <class C>
MJ_DEVICE int unit_item(const SparsePrefillArgs& a, int u) {
  return u >= a.split_first ? a.split_first + ((u - a.split_first) >> a.split_shift) : u;
}
// Units of the walk (the host keeps this <= INT_MAX).
template <class C>
MJ_DEVICE int unit_count(const SparsePrefillArgs& a) {
  const int items = static_cast<int>(a.num_tokens) * C::kCtasPerToken;
  return a.split_first + ((items - a.split_first) << a.split_shift);
}
// Unit `u` (item unit_item(u): token item / kCtasPerToken, head tile item % kCtasPerToken) given its
// topk_lengths value. Item indices are 32-bit: the host keeps tokens * head tiles <= INT_MAX.
template <class C>
MJ_DEVICE CtaWork item_work(const SparsePrefillArgs& args, int u, u32 len) {
  const int it = unit_item<C>(args, u);
  CtaWork w;
  w.token = it / C::kCtasPerToken;
  w.head0 = (it % C::kCtasPerToken) * C::kHeadsPerCta;
  w.topk_len = static_cast<int>(static_cast<long long>(len) < args.indices_stride ? static_cast<long long>(len)
                                                                                   : args.indices_stride);
  w.steps = (w.topk_len + 2 * kBlockKeys - 1) / (2 * kBlockKeys);
  w.step0 = 0;
  w.slot = -1;
  if (args.split_shift > 0 && u >= args.split_first) {
    const int k = u - args.split_first, part = k & ((1 << args.split_shift) - 1);
    const int first = static_cast<int>((static_cast<i64>(part) * w.steps) >> args.split_shift);
    const int end = static_cast<int>((static_cast<i64>(part + 1) * w.steps) >> args.split_shift);
    w.step0 = first;
    w.steps = end - first;
    w.slot = k;
    // The part's slots end with its last step: the producer loads no index of the next part.
    w.topk_len = min(w.topk_len, end * 2 * kBlockKeys);
  }
  return w;
}
// topk_lengths of unit `u`'s item (the persistent roles load the next unit's one unit ahead).
template <class C>
MJ_DEVICE u32 item_len(const SparsePrefillArgs& args, int u) {
  return __ldg(args.topk_lengths + unit_item<C>(args, u) / C::kCtasPerToken);
}
// The producer's first index loads wait for topk_lengths[token] (SPEC §3: slots past the length are
// never read), so at CTA start two DRAM round trips run back to back. Five lanes of the producer
// hint the row's first 160 slots (the first step's 128) into L2 while the length is in flight: a
// prefetch moves no value into the program, and the row is allocated up to its stride.
// (The CTA's first item: blockIdx.x, or with a tail split the item of unit blockIdx.x.)
template <class C>
MJ_DEVICE void hint_first_indices(const SparsePrefillArgs& args, i64 first_token) {
  constexpr bool kIndexPrefetch = MJ_SP90_INDEX_PREFETCH == 1 || (MJ_SP90_INDEX_PREFETCH == -1 && !C::kFp8Math);
  if constexpr (kIndexPrefetch) {
    const u32 pt = threadIdx.x - 256u;
    if (pt < 5u && static_cast<i64>(32 * pt) < args.indices_stride) {
      const u32* row = args.indices + first_token * args.indices_stride;
      asm volatile("prefetch.global.L2 [%0];" ::"l"(row + 32 * pt));
    }
  }
}
// One CTA per item (the fp8 kernels): this CTA's item.
template <class C>
MJ_DEVICE CtaWork cta_work(const SparsePrefillArgs& args) {
  hint_first_indices<C>(args, static_cast<i64>(blockIdx.x) / C::kCtasPerToken);
  CtaWork w;
  w.token = static_cast<i64>(blockIdx.x) / C::kCtasPerToken;
  w.head0 = static_cast<int>(blockIdx.x % C::kCtasPerToken) * C::kHeadsPerCta;
  const long long len = static_cast<long long>(__ldg(args.topk_lengths + w.token));
  w.topk_len = static_cast<int>(len < args.indices_stride ? len : args.indices_stride);
  w.steps = (w.topk_len + 2 * kBlockKeys - 1) / (2 * kBlockKeys);
  return w;
}

// Waits until a stage half is full and makes it readable by wgmma. The producer's writes (cp.async
// or st.shared) are generic-proxy writes, wgmma reads through the async proxy.
// - st.shared stages (fp8 decoded by the producer): the bidirectional proxy fence sits in the chain
//   producer store -> mbarrier release -> this acquire -> fence -> wgmma. It is issued here rather
//   than by the producer because a fence there would also wait for the producer's in-flight row
//   loads (MEMBAR.ALL.CTA), draining its prefetch window at every half. It is needed in practice:
//   with only the acquire form below these kernels read stale tiles (NaN outputs, notes 35).
//   (TUNE 4 moves it to the producer.)
// - cp.async stages (bf16 rows, FP8 math's raw e4m3 rows), whose data land through the
//   cp.async.mbarrier.arrive completion: the acquire-form proxy fence, which emits no instruction on
//   sm_90a: the same ordering as CUTLASS's cp.async GMMA mainloop (no fence at all) and FlashMLA.
//   The bidirectional fence cost ~2 % of the bf16 kernel's time (notes 35).
// `bar` is a stage part's full barrier: a half's, or the persistent kernel's stage 1 rope tile's.
template <class C>
MJ_DEVICE void wait_stage_bar(u32 bar, u32 parity) {
  sm90::mbar_wait(bar, parity);
  if constexpr (C::kStageByCpAsync) {
    sm90::fence_proxy_async_acquire_smem();
  } else if constexpr (C::kConsumerFence) {
    sm90::fence_proxy_async_smem();
  }
  sm90::wgmma_fence();
}
template <class C>
MJ_DEVICE void wait_full(const Smem& s, int stage, int half, u32 parity) {
  wait_stage_bar<C>(s.full[stage][half], parity);
}

// Q K^T over column tiles [T0, T1) of a stage; `clear` zeroes the accumulator on the first k-step.
template <int T0, int T1, bool F16>
MJ_DEVICE void issue_qk(float (&p)[32], u64 dq, u64 dk, bool clear) {
#pragma unroll
  for (int tile = T0; tile < T1; ++tile) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const u32 off = tile * kTileBytes + kk * 32;
      sm90::wgmma_m64n64k16_ss_kk<F16>(p, sm90::desc_advance(dq, off), sm90::desc_advance(dk, off),
                                  (clear && tile == T0 && kk == 0) ? 0u : 1u);
    }
  }
}

// O[:, half] += P (registers) V[keys of the stage, 256 dims starting at tile v_tile0].
template <bool F16>
MJ_DEVICE void issue_pv_rs(float (&o)[128], const u32 (&ps)[16], u64 dv) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const u32 a[4] = {ps[4 * kk], ps[4 * kk + 1], ps[4 * kk + 2], ps[4 * kk + 3]};
    sm90::wgmma_m64n256k16_rs_mn<F16>(o, a, sm90::desc_advance(dv, kk * 16 * 128), 1u);
  }
}
// O[:, half] += P (shared memory, the other warpgroup's) V[...].
template <bool F16>
MJ_DEVICE void issue_pv_ss(float (&o)[128], u64 dp, u64 dv) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    sm90::wgmma_m64n256k16_ss_kmn<F16>(o, sm90::desc_advance(dp, kk * 32), sm90::desc_advance(dv, kk * 16 * 128), 1u);
  }
}

// Scaled, masked scores in the exp2 domain; returns the thread's row maxima (quad-reduced).
template <class C>
MJ_DEVICE void scale_mask_scores(float (&p)[32], const Smem& s, int stage, const Lane& ln, float mult, float& mx0,
                                 float& mx1) {
  mx0 = neg_inf();
  mx1 = neg_inf();
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int col = 8 * j + 2 * ln.tig;
    const float b0 = s.bias[stage * 64 + col], b1 = s.bias[stage * 64 + col + 1];
    float m0 = mult, m1 = mult;
    if constexpr (C::kColScale) {
      m0 *= s.colscale[stage * 64 + col];
      m1 *= s.colscale[stage * 64 + col + 1];
    }
    p[4 * j + 0] = __fmaf_rn(p[4 * j + 0], m0, b0);
    p[4 * j + 1] = __fmaf_rn(p[4 * j + 1], m1, b1);
    p[4 * j + 2] = __fmaf_rn(p[4 * j + 2], m0, b0);
    p[4 * j + 3] = __fmaf_rn(p[4 * j + 3], m1, b1);
    mx0 = fmaxf(mx0, fmaxf(p[4 * j + 0], p[4 * j + 1]));
    mx1 = fmaxf(mx1, fmaxf(p[4 * j + 2], p[4 * j + 3]));
  }
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xFFFFFFFFu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xFFFFFFFFu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xFFFFFFFFu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xFFFFFFFFu, mx1, 2));
}

// p <- exp2(p - max) per row, row sums added to l (thread-partial), P scaled by per-row fp8 scales.
template <class C>
MJ_DEVICE void exponentiate(float (&p)[32], const Smem& s, int stage, const Lane& ln, float m0, float m1, float& l0,
                            float& l1) {
  float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    p[4 * j + 0] = ex2(p[4 * j + 0] - m0);
    p[4 * j + 1] = ex2(p[4 * j + 1] - m0);
    p[4 * j + 2] = ex2(p[4 * j + 2] - m1);
    p[4 * j + 3] = ex2(p[4 * j + 3] - m1);
    sum0 += p[4 * j + 0] + p[4 * j + 1];
    sum1 += p[4 * j + 2] + p[4 * j + 3];
  }
  l0 += sum0;
  l1 += sum1;
  // Keeps the row sums here: deferring them past the P V issue costs the registers of the unscaled P.
  asm volatile("" : "+f"(l0), "+f"(l1));
  if constexpr (C::kColScale) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int col = 8 * j + 2 * ln.tig;
      const float c0 = s.colscale[stage * 64 + col], c1 = s.colscale[stage * 64 + col + 1];
      p[4 * j + 0] *= c0;
      p[4 * j + 1] *= c1;
      p[4 * j + 2] *= c0;
      p[4 * j + 3] *= c1;
    }
  }
}

// P as the tile type (bf16, or f16 for the f16 tiles).
template <bool F16>
MJ_DEVICE u32 pack_x2(float lo, float hi) {
  if constexpr (F16) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  } else {
    return pack_bf16x2(lo, hi);
  }
}
template <bool F16>
MJ_DEVICE void pack_p(const float (&p)[32], u32 (&ps)[16], float f0, float f1) {
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const float f = (i & 1) ? f1 : f0;  // word 2j -> row r0, word 2j+1 -> row r1
    ps[i] = pack_x2<F16>(p[2 * i] * f, p[2 * i + 1] * f);
  }
}
template <bool F16>
MJ_DEVICE void pack_p(const float (&p)[32], u32 (&ps)[16]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) ps[i] = pack_x2<F16>(p[2 * i], p[2 * i + 1]);
}

MJ_DEVICE void scale_rows(float (&o)[128], float f0, float f1) {
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    o[4 * j + 0] *= f0;
    o[4 * j + 1] *= f0;
    o[4 * j + 2] *= f1;
    o[4 * j + 3] *= f1;
  }
}

// P (bf16 fragment, 64x64) to a 128-byte-swizzled K-major tile with stmatrix: k-slice kk holds
// matrices (rows 0-7 | 8-15 of the warp) x (columns 16kk + 0..7 | 8..15).
MJ_DEVICE void store_p(u32 tile, const u32 (&ps)[16], const Lane& ln, int lane) {
  const int m = lane >> 3;
  const u32 row = static_cast<u32>(16 * ln.w + (m & 1) * 8 + (lane & 7));
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    sm90::stmatrix_x4(tile + sm90::sw128_offset(row, static_cast<u32>(2 * kk + (m >> 1))), ps[4 * kk], ps[4 * kk + 1],
                      ps[4 * kk + 2], ps[4 * kk + 3]);
  }
}

// The fp8 tile holds K * 2^-64 (see the header); scores and output multiply it back.
template <class C>
MJ_DEVICE float tile_unscale() {
  return C::kFp8 && !C::kF16 ? kTwoPow64 : 1.0f;
}
// What the accumulated output must be multiplied by: the tile's unscale, or with FP8 math 1/256
// (P is encoded as 256 P in e4m3, see sm90_fp8math.cuh).
template <class C>
MJ_DEVICE float output_unscale() {
  return C::kFp8Math ? 1.0f / 256.0f : tile_unscale<C>();
}
// q_unscale: 2^-e of the f16 query tile (load_q), else 1.
template <class C>
MJ_DEVICE float score_multiplier(const SparsePrefillArgs& a, float q_unscale) {
  return a.sm_scale_log2e * tile_unscale<C>() * q_unscale;
}

// Loads this CTA's query rows (zero rows past kHeadsPerCta) into the swizzled Q tile. Returns the
// factor the scores must be multiplied by: 1, or for f16 tiles (C::kF16) 2^-e, where the tile was
// converted in place to f16 as q * 2^e with 2^e putting the tile's largest |q| in [2^14, 2^15):
// every bf16 value within 2^-28 of that maximum converts exactly (f16 has more mantissa bits), and
// nothing overflows whatever the query's magnitude.
template <class C>
MJ_DEVICE float load_q(const SparsePrefillArgs& a, const Smem& s, i64 token, int head0) {
  const int t = static_cast<int>(threadIdx.x);  // 0..255
  const unsigned char* q = static_cast<const unsigned char*>(a.q) +
                           (token * C::kNumHeads + head0) * static_cast<i64>(kQkDim * 2);
  constexpr int kChunksPerRow = kQkDim * 2 / 16;  // 72
  const u64 policy = sm90::l2_policy_evict_first();  // read once: keep L2 for the gathered rows
#pragma unroll
  for (int i = 0; i < kTileRows * kChunksPerRow / 256; ++i) {
    const int id = t + 256 * i;
    const int row = id / kChunksPerRow, rest = id % kChunksPerRow;
    const bool valid = row < C::kHeadsPerCta;
    const u32 dst = s.q + (rest >> 3) * kTileBytes + sm90::sw128_offset(static_cast<u32>(row), static_cast<u32>(rest & 7));
    sm90::cp_async_16_zfill(dst, valid ? q + static_cast<i64>(row) * (kQkDim * 2) + rest * 16 : q, valid, policy);
  }
  sm90::cp_async_wait_all();
  float q_unscale = 1.0f;
  if constexpr (C::kF16) {
    // Each thread converts the chunks it copied itself (visible to it after the wait); the tile
    // maximum goes through shared memory (s.rowsum[0], zeroed at start, unused until the epilogue).
    auto chunk_addr = [&](int i) {
      const int id = t + 256 * i;
      const int row = id / kChunksPerRow, rest = id % kChunksPerRow;
      return s.q + (rest >> 3) * kTileBytes + sm90::sw128_offset(static_cast<u32>(row), static_cast<u32>(rest & 7));
    };
    u32 mx = 0;  // two bf16 magnitudes: bit patterns of non-negative bf16 order like their values
#pragma unroll
    for (int i = 0; i < kTileRows * kChunksPerRow / 256; ++i) {
      u32 w[4];
      sm90::lds128(chunk_addr(i), w[0], w[1], w[2], w[3]);
#pragma unroll
      for (int j = 0; j < 4; ++j) mx = __vmaxu2(mx, w[j] & 0x7FFF7FFFu);
    }
    mx = __reduce_max_sync(0xFFFFFFFFu, (mx & 0xFFFFu) > (mx >> 16) ? (mx & 0xFFFFu) : (mx >> 16));
    u32* qmax = reinterpret_cast<u32*>(s.rowsum);
    if ((t & 31) == 0) atomicMax(qmax, mx);
    sm90::named_bar_sync(kBarQReady, 256);
    const u32 m = *qmax;
    int e = 0;
    if (m != 0u && m < 0x7F80u) {  // finite, non-zero (inf / NaN propagate through the scores anyway)
      const int E = m >= 0x0080u ? static_cast<int>(m >> 7) - 127 : -127;
      e = min(120, max(-120, 14 - E));
    }
    const float up = __uint_as_float(static_cast<u32>(127 + e) << 23);
    q_unscale = __uint_as_float(static_cast<u32>(127 - e) << 23);
#pragma unroll
    for (int i = 0; i < kTileRows * kChunksPerRow / 256; ++i) {
      u32 w[4];
      const u32 addr = chunk_addr(i);
      sm90::lds128(addr, w[0], w[1], w[2], w[3]);
#pragma unroll
      for (int j = 0; j < 4; ++j) w[j] = pack_x2<true>(__uint_as_float(w[j] << 16) * up, __uint_as_float(w[j] & 0xFFFF0000u) * up);
      sm90::sts128(addr, w[0], w[1], w[2], w[3]);
    }
  }
  sm90::fence_proxy_async_smem();
  sm90::named_bar_sync(kBarQReady, 256);
  return q_unscale;
}

// ---- tail split: partial slots and their combine ----------------------------------------------------
// A slot: o f32 in the accumulator's register order, [wg 2][warp 4][kk 16][lane 32][8] (each thread's
// o[8 kk .. 8 kk + 7] as two 16-byte stores: no address arithmetic per element and no per-row
// predicates; in the natural [64][512] order the stores' code doubled NVVM's time on the kernel),
// then (m, l) f32 [64 rows][2]: the running max in the kernel's exp2 units (score x softmax scale x
// log2 e) and the row sum of both warpgroups. Rows past kHeadsPerCta are written too (the slot
// has 64) and never read. A part without a valid slot writes l = 0 (m = kMaxInit).
constexpr long long kPartialSlotFloats = 64LL * (kVDim + 2);
template <class C>
MJ_DEVICE void store_partial(const SparsePrefillArgs& a, const Lane& ln, int lane, int slot, const float (&o)[128],
                             float m0, float m1, float L0, float L1) {
  static_assert(C::kPersistent && !C::kFp8, "partials hold the bf16 kernel's unscaled accumulator");
  float* base = a.partials + static_cast<i64>(slot) * kPartialSlotFloats;
  float4* mine = reinterpret_cast<float4*>(base + (ln.wg * 4 + ln.w) * (16 * 32 * 8) + lane * 8);
#pragma unroll
  for (int kk = 0; kk < 16; ++kk) {
    mine[kk * 64] = make_float4(o[8 * kk + 0], o[8 * kk + 1], o[8 * kk + 2], o[8 * kk + 3]);
    mine[kk * 64 + 1] = make_float4(o[8 * kk + 4], o[8 * kk + 5], o[8 * kk + 6], o[8 * kk + 7]);
  }
  if (ln.wg == 0 && ln.tig == 0) {
    float* ml = base + 64 * kVDim;
    *reinterpret_cast<float2*>(ml + 2 * ln.r0) = make_float2(m0, L0);
    *reinterpret_cast<float2*>(ml + 2 * ln.r1) = make_float2(m1, L1);
  }
}
// Where dims d, d + 1 (d even) of row r sit in a slot's o: warpgroup d / 256, warp r / 16, kk = (d % 256)
// / 16, lane 4 (r % 8) + (d % 8) / 2, element 2 (r % 16 >= 8) + 4 (d % 16 >= 8) (and + 1).
MJ_DEVICE int partial_offset(int r, int d) {
  const int wg = d >> 8, w = r >> 4, kk = (d >> 4) & 15, lane = 4 * (r & 7) + ((d & 7) >> 1);
  const int e = 2 * ((r >> 3) & 1) + 4 * ((d >> 3) & 1);
  return (((wg * 4 + w) * 16 + kk) * 32 + lane) * 8 + e;
}

// The combine entry (launched after the attention kernel when it split its tail): CTA (x, y) merges
// the parts of split item split_first + x, head row y, 4 dims per thread (128 threads):
//   M = max m_j over the parts with l_j > 0,  w_j = exp2(m_j - M),  L = sum_j w_j l_j,
//   out = sum_j w_j o_j / (L + [sink] exp2(sink log2 e - M)),  lse = (M + log2 L) ln 2,
// the epilogue's formulas (finish) with the whole item's max and sums; L = 0: out 0, lse +inf.
constexpr int kCombineThreads = 128;
template <class C>
MJ_DEVICE void combine(const SparsePrefillArgs& a) {
  const int x = static_cast<int>(blockIdx.x), r = static_cast<int>(blockIdx.y);
  const int item = a.split_first + x, parts = 1 << a.split_shift;
  const i64 token = item / C::kCtasPerToken;
  const int head0 = (item % C::kCtasPerToken) * C::kHeadsPerCta;
  const float* slots = a.partials + static_cast<i64>(x) * parts * kPartialSlotFloats;
  const int d = 4 * static_cast<int>(threadIdx.x);
  float M = kMaxInit;
  for (int j = 0; j < parts; ++j) {
    const float2 ml = __ldg(reinterpret_cast<const float2*>(slots + j * kPartialSlotFloats + 64 * kVDim + 2 * r));
    if (ml.y > 0.0f) M = fmaxf(M, ml.x);
  }
  float L = 0.0f;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int j = 0; j < parts; ++j) {
    const float* slot = slots + j * kPartialSlotFloats;
    const float2 ml = __ldg(reinterpret_cast<const float2*>(slot + 64 * kVDim + 2 * r));
    if (ml.y > 0.0f) {
      const float w = ex2(ml.x - M);
      L += w * ml.y;
      const float2 v0 = __ldg(reinterpret_cast<const float2*>(slot + partial_offset(r, d)));
      const float2 v1 = __ldg(reinterpret_cast<const float2*>(slot + partial_offset(r, d + 2)));
      acc.x += w * v0.x;
      acc.y += w * v0.y;
      acc.z += w * v1.x;
      acc.w += w * v1.y;
    }
  }
  float f = 0.0f;  // no valid slot: out = 0 whatever the sink
  if (L != 0.0f) {
    float den = L;
    if constexpr (C::kSink) den += ex2(__ldg(a.attn_sink + head0 + r) * kLog2e - M);
    f = 1.0f / den;
  }
  unsigned char* out = static_cast<unsigned char*>(a.out) +
                       ((token * C::kNumHeads + head0 + r) * static_cast<i64>(kVDim) + d) * 2;
  asm volatile("st.global.cs.v2.b32 [%0], {%1, %2};\n" ::"l"(out), "r"(pack_bf16x2(acc.x * f, acc.y * f)),
               "r"(pack_bf16x2(acc.z * f, acc.w * f))
               : "memory");
  if constexpr (C::kEmitLse) {
    if (threadIdx.x == 0) a.lse[token * C::kNumHeads + head0 + r] = L == 0.0f ? pos_inf() : (M + lg2(L)) * kLn2;
  }
}

// Epilogue shared by both consumer warpgroups: total row sums, normalisation, bf16 staging in the
// Q space, coalesced 16-byte stores; lse from WG0. Persistent kernels (item: the CTA's item count, for
// the barrier parities) store from registers instead: the Q space may already hold the next item's
// query tile. DIM_PAIRS_SPLIT: the accumulator's columns are
// permuted inside every 16-column group (column 8 e + a holds dim 2 a + e: the FP8-math kernel's
// V^T row order, see transpose_v), so a thread's o[8 kk + {0, 4, 1, 5}] are 4 consecutive dims of row
// r0 (o[8 kk + {2, 6, 3, 7}] of row r1) and go to the staging rows as one 8-byte store each.
template <class C, bool DIM_PAIRS_SPLIT = false>
MJ_DEVICE void finish(const SparsePrefillArgs& a, const Smem& s, const Lane& ln, int lane, i64 token, int head0,
                      float (&o)[128], float m0, float m1, float l0, float l1, u32 item = 0, int slot = -1) {
  l0 += __shfl_xor_sync(0xFFFFFFFFu, l0, 1);
  l0 += __shfl_xor_sync(0xFFFFFFFFu, l0, 2);
  l1 += __shfl_xor_sync(0xFFFFFFFFu, l1, 1);
  l1 += __shfl_xor_sync(0xFFFFFFFFu, l1, 2);
  // Persistent: the previous item's row sums were read by both warpgroups (an item without steps
  // reaches here with no other synchronisation between the two).
  if constexpr (C::kPersistent) sm90::mbar_wait(s.rowsum_read, (item & 1u) ^ 1u);
  if (ln.tig == 0) {
    s.rowsum[ln.wg * 64 + ln.r0] = l0;
    s.rowsum[ln.wg * 64 + ln.r1] = l1;
  }
  // Also: both warpgroups' wgmma are done, Q space is free (one item per CTA; the persistent
  // kernel does not stage in it). An mbarrier rather than a named
  // barrier: finish() is inlined into both consumer branches (an aligned bar.sync reached from two
  // static instructions is what synccheck calls divergent), and racecheck models mbarriers exactly.
  sm90::mbar_arrive(s.rowsum_ready);
  sm90::mbar_wait(s.rowsum_ready, item & 1u);
  const float L0 = s.rowsum[ln.r0] + s.rowsum[64 + ln.r0];
  const float L1 = s.rowsum[ln.r1] + s.rowsum[64 + ln.r1];
  if constexpr (C::kPersistent) {
    sm90::mbar_arrive(s.rowsum_read);
    if (slot >= 0) {  // a tail-split part: its raw state, for the combine entry
      store_partial<C>(a, ln, lane, slot, o, m0, m1, L0, L1);
      return;
    }
  }
  const float out_mult = output_unscale<C>();
  auto row_factor = [&](int r, float L, float m) {
    if (L == 0.0f) return 0.0f;  // no valid slot: out = 0 whatever the sink
    float den = L;
    if constexpr (C::kSink) {
      if (r < C::kHeadsPerCta) den += ex2(__ldg(a.attn_sink + head0 + r) * kLog2e - m);
    }
    return out_mult / den;
  };
  const float f0 = row_factor(ln.r0, L0, m0), f1 = row_factor(ln.r1, L1, m1);

  if constexpr (C::kEmitLse) {
    if (ln.wg == 0 && ln.tig == 0) {
      float* lse = a.lse + token * C::kNumHeads + head0;
      if (ln.r0 < C::kHeadsPerCta) lse[ln.r0] = L0 == 0.0f ? pos_inf() : (m0 + lg2(L0)) * kLn2;
      if (ln.r1 < C::kHeadsPerCta) lse[ln.r1] = L1 == 0.0f ? pos_inf() : (m1 + lg2(L1)) * kLn2;
    }
  }

  if constexpr (C::kPersistent) {
    static_assert(!DIM_PAIRS_SPLIT, "the persistent epilogue stores the wgmma accumulator layout");
    // Straight from registers, 8 bytes per lane: in 16-column group kk a quad holds words A_tig
    // (columns 2 tig, 2 tig + 1) and B_tig (8 + 2 tig, ...) of each of its rows; one exchange with
    // the partner lane gives even lanes A_tig A_tig+1 (columns 2 tig .. + 3) and odd lanes
    // B_tig-1 B_tig (8 + 2 tig - 2 .. + 3), so a quad's four stores cover the group's 32 bytes.
    unsigned char* out = static_cast<unsigned char*>(a.out) + (token * C::kNumHeads + head0) * static_cast<i64>(kVDim * 2);
    const bool odd = (ln.tig & 1) != 0;
    const int col = 256 * ln.wg + 8 * (ln.tig & 1) + 4 * (ln.tig >> 1);
    unsigned char* row0 = out + static_cast<i64>(ln.r0) * (kVDim * 2) + col * 2;
    unsigned char* row1 = out + static_cast<i64>(ln.r1) * (kVDim * 2) + col * 2;
    auto store_pair = [&](unsigned char* dst, bool row_valid, u32 a_word, u32 b_word) {
      const u32 got = __shfl_xor_sync(0xFFFFFFFFu, odd ? a_word : b_word, 1);
      // Streaming store (.cs, evict first): the output is not re-read; keep L2 for the gathered rows.
      if (row_valid) {
        asm volatile("st.global.cs.v2.b32 [%0], {%1, %2};\n" ::"l"(dst), "r"(odd ? got : a_word), "r"(odd ? b_word : got)
                     : "memory");
      }
    };
    const bool valid0 = ln.r0 < C::kHeadsPerCta, valid1 = ln.r1 < C::kHeadsPerCta;
#pragma unroll
    for (int kk = 0; kk < 16; ++kk) {
      store_pair(row0 + 32 * kk, valid0, pack_bf16x2(o[8 * kk + 0] * f0, o[8 * kk + 1] * f0),
                 pack_bf16x2(o[8 * kk + 4] * f0, o[8 * kk + 5] * f0));
      store_pair(row1 + 32 * kk, valid1, pack_bf16x2(o[8 * kk + 2] * f1, o[8 * kk + 3] * f1),
                 pack_bf16x2(o[8 * kk + 6] * f1, o[8 * kk + 7] * f1));
    }
    return;
  }
  // Stage: row r of the output at s.q + r * 1024, 16-byte chunk c (of 64) at (c ^ (r % 8)).
  if constexpr (DIM_PAIRS_SPLIT) {
    // Dims 16 kk + 4 tig .. + 3 of rows r0 / r1: byte 8 (tig & 1) of 16-byte chunk 2 kk + tig / 2.
    // A warp's store covers 8 rows x 32 bytes, two per bank group after the swizzle: 2 wavefronts.
    const u32 r0 = static_cast<u32>(ln.r0), r1 = static_cast<u32>(ln.r1);
    const u32 half = 8u * static_cast<u32>(ln.tig & 1);
#pragma unroll
    for (int kk = 0; kk < 16; ++kk) {
      const u32 chunk = static_cast<u32>(32 * ln.wg + 2 * kk + (ln.tig >> 1));
      sm90::sts64(s.q + r0 * 1024u + ((chunk ^ (r0 & 7u)) << 4) + half, pack_bf16x2(o[8 * kk + 0] * f0, o[8 * kk + 4] * f0),
                  pack_bf16x2(o[8 * kk + 1] * f0, o[8 * kk + 5] * f0));
      sm90::sts64(s.q + r1 * 1024u + ((chunk ^ (r1 & 7u)) << 4) + half, pack_bf16x2(o[8 * kk + 2] * f1, o[8 * kk + 6] * f1),
                  pack_bf16x2(o[8 * kk + 3] * f1, o[8 * kk + 7] * f1));
    }
  } else {
    const int m = lane >> 3;
    const u32 row = static_cast<u32>(16 * ln.w + (m & 1) * 8 + (lane & 7));
#pragma unroll
    for (int kk = 0; kk < 16; ++kk) {
      const u32 chunk = static_cast<u32>(32 * ln.wg + 2 * kk + (m >> 1));
      sm90::stmatrix_x4(s.q + row * 1024u + ((chunk ^ (row & 7u)) << 4), pack_bf16x2(o[8 * kk + 0] * f0, o[8 * kk + 1] * f0),
                        pack_bf16x2(o[8 * kk + 2] * f1, o[8 * kk + 3] * f1),
                        pack_bf16x2(o[8 * kk + 4] * f0, o[8 * kk + 5] * f0),
                        pack_bf16x2(o[8 * kk + 6] * f1, o[8 * kk + 7] * f1));
    }
  }
  sm90::named_bar_sync(ln.wg == 0 ? kBarOutWg0 : kBarOutWg1, 128);
  const int t = static_cast<int>(threadIdx.x) & 127;
  unsigned char* out = static_cast<unsigned char*>(a.out) + (token * C::kNumHeads + head0) * static_cast<i64>(kVDim * 2);
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    const int r = (t >> 5) + 4 * k;
    const u32 chunk = static_cast<u32>(32 * ln.wg + (t & 31));
    if (r < C::kHeadsPerCta) {
      u32 x, y, z, w;
      sm90::lds128(s.q + static_cast<u32>(r) * 1024u + ((chunk ^ (static_cast<u32>(r) & 7u)) << 4), x, y, z, w);
      // Streaming store (.cs, evict first): the output is not re-read; keep L2 for the gathered rows.
      asm volatile("st.global.cs.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(out + static_cast<i64>(r) * (kVDim * 2) + chunk * 16),
                   "r"(x), "r"(y), "r"(z), "r"(w)
                   : "memory");
    }
  }
}

// WG0: scores stage 0 (even blocks), owns output columns 0..255.
template <class C>
MJ_DEVICE void consume_wg0(const SparsePrefillArgs& a, const Smem& s, const Lane& ln, int lane, i64 token, int head0,
                           int steps, float q_unscale, u32 gs = 0, u32 item = 0, int slot = -1) {
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float p[32];
  u32 ps[16];
  float m0 = kMaxInit, m1 = kMaxInit, l0 = 0.0f, l1 = 0.0f;
  const float mult = score_multiplier<C>(a, q_unscale);
  const u64 dq = sm90::smem_desc_sw128(s.q, 16, 1024);
  const u64 dk0 = sm90::smem_desc_sw128(s.k[0], 16, 1024);
  const u64 dv0 = sm90::smem_desc_sw128(s.k[0], kTileBytes, 1024);  // V0 left: tiles 0..3
  const u64 dv1 = sm90::smem_desc_sw128(s.k[1], kTileBytes, 1024);  // V1 left
  const u32 p0_tile = s.k[0] + 8 * kTileBytes;                      // P0 in stage 0's rope tile
  const u64 dp1 = sm90::smem_desc_sw128(s.p1, 16, 1024);

  // Rotated (one item per CTA, the fp8 kernels): the next block's Q K^T is issued at the end of a
  // step, right behind the SS P V, the first one before the loop. The persistent kernel issues it at
  // the top of each step after waiting for the SS P V: rotated inside the item loop, ptxas rebuilt
  // both Q K^T descriptors around every wgmma (764 -> 860 instructions per step) and the steps ran
  // +2.6 %; not rotated, the step is 786 instructions and the kernel -2.1 % (32K) / -2.8 % (128K)
  // cycles against the rotated persistent one (notes 38). (Not rotated with the SS P V left in
  // flight across the back edge, ptxas serialises the wgmma: C7514.)
  constexpr bool kRotated = !C::kPersistent;
  // S = Q K^T of the step's stage-0 block, waited for (the rotated loop's first one; every one of the
  // persistent kernel's).
  auto score_block = [&](u32 parity) {
    wait_full<C>(s, 0, 0, parity);
    issue_qk<0, kLeftTiles, C::kF16>(p, dq, dk0, true);
    wait_full<C>(s, 0, 1, parity);
    issue_qk<kLeftTiles, kQkTiles, C::kF16>(p, dq, dk0, false);
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::fence_regs(p);
  };
  if (kRotated && steps > 0) score_block(gs & 1u);
  for (int step = 0; step < steps; ++step) {
    const u32 parity = (gs + static_cast<u32>(step)) & 1u;
    if constexpr (!kRotated) score_block(parity);
    // Persistent: this item's Q K^T are all done (the last one was waited for above or at the end
    // of the previous step): the producer may load the next item's query tile.
    if constexpr (C::kPersistent) {
      if (step == steps - 1) sm90::mbar_arrive(s.q_free);
    }
    float mx0, mx1;
    scale_mask_scores<C>(p, s, 0, ln, mult, mx0, mx1);
    const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
    const float alpha0 = ex2(m0 - n0), alpha1 = ex2(m1 - n1);
    scale_rows(o, alpha0, alpha1);
    l0 *= alpha0;
    l1 *= alpha1;
    exponentiate<C>(p, s, 0, ln, n0, n1, l0, l1);
    pack_p<C::kF16>(p, ps);
    if (ln.tig == 0) {
      s.max[ln.r0] = n0;
      s.max[ln.r1] = n1;
    }
    m0 = n0;
    m1 = n1;
    sm90::named_bar_arrive(kBarWg0Max, 256);

    sm90::wgmma_fence();
    issue_pv_rs<C::kF16>(o, ps, dv0);
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::fence_regs(o);
    sm90::mbar_arrive(s.empty[0][0]);  // stage 0 left: scored and multiplied

    sm90::mbar_wait(s.max1_ready, parity);
    const float f0 = ex2(m0 - s.max[ln.r0]), f1 = ex2(m1 - s.max[ln.r1]);
    m0 = s.max[ln.r0];
    m1 = s.max[ln.r1];
    pack_p<C::kF16>(p, ps, f0, f1);
    store_p(p0_tile, ps, ln, lane);
    sm90::fence_proxy_async_smem();
    sm90::named_bar_arrive(kBarS0Ready, 256);
    scale_rows(o, f0, f1);
    l0 *= f0;
    l1 *= f1;

    sm90::named_bar_sync(kBarS1Ready, 256);
    sm90::wgmma_fence();
    issue_pv_ss<C::kF16>(o, dp1, dv1);
    sm90::wgmma_commit();
    if (kRotated && step + 1 < steps) {
      wait_full<C>(s, 0, 0, parity ^ 1u);
      issue_qk<0, kLeftTiles, C::kF16>(p, dq, dk0, true);
      sm90::wgmma_commit();
      sm90::wgmma_wait<1>();
      sm90::mbar_arrive(s.empty[1][0]);  // stage 1 left: multiplied
      wait_full<C>(s, 0, 1, parity ^ 1u);
      issue_qk<kLeftTiles, kQkTiles, C::kF16>(p, dq, dk0, false);
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
    } else {
      sm90::wgmma_wait<0>();
      sm90::mbar_arrive(s.empty[1][0]);
    }
    sm90::fence_regs(o);
    sm90::fence_regs(p);
  }
  finish<C>(a, s, ln, lane, token, head0, o, m0, m1, l0, l1, item, slot);
}

// WG1: scores stage 1 (odd blocks), owns output columns 256..511.
template <class C>
MJ_DEVICE void consume_wg1(const SparsePrefillArgs& a, const Smem& s, const Lane& ln, int lane, i64 token, int head0,
                           int steps, float q_unscale, u32 gs = 0, u32 item = 0, int slot = -1) {
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float p[32];
  u32 ps[16];
  float m0 = kMaxInit, m1 = kMaxInit, l0 = 0.0f, l1 = 0.0f;
  const float mult = score_multiplier<C>(a, q_unscale);
  const u64 dq = sm90::smem_desc_sw128(s.q, 16, 1024);
  const u64 dk1 = sm90::smem_desc_sw128(s.k[1], 16, 1024);
  const u64 dv1 = sm90::smem_desc_sw128(s.k[1] + kLeftTiles * kTileBytes, kTileBytes, 1024);  // V1 right: tiles 4..7
  const u64 dv0 = sm90::smem_desc_sw128(s.k[0] + kLeftTiles * kTileBytes, kTileBytes, 1024);  // V0 right
  const u64 dp0 = sm90::smem_desc_sw128(s.k[0] + 8 * kTileBytes, 16, 1024);

  for (int step = 0; step < steps; ++step) {
    const u32 parity = (gs + static_cast<u32>(step)) & 1u;
    if constexpr (C::kPersistent) {  // the rope tile first: it has its own, earlier refill
      wait_stage_bar<C>(s.rope1_full, parity);
      issue_qk<kQkTiles - 1, kQkTiles, C::kF16>(p, dq, dk1, true);
      wait_full<C>(s, 1, 1, parity);
      issue_qk<kLeftTiles, kQkTiles - 1, C::kF16>(p, dq, dk1, false);
    } else {
      wait_full<C>(s, 1, 1, parity);
      issue_qk<kLeftTiles, kQkTiles, C::kF16>(p, dq, dk1, true);
    }
    wait_full<C>(s, 1, 0, parity);
    issue_qk<0, kLeftTiles, C::kF16>(p, dq, dk1, false);
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::fence_regs(p);
    if constexpr (C::kPersistent) {
      sm90::mbar_arrive(s.rope1_empty);                    // stage 1's rope tile: scored
      if (step == steps - 1) sm90::mbar_arrive(s.q_free);  // the item's last Q K^T is done
    }

    float mx0, mx1;
    scale_mask_scores<C>(p, s, 1, ln, mult, mx0, mx1);
    sm90::named_bar_sync(kBarWg0Max, 256);
    const float n0 = fmaxf(s.max[ln.r0], mx0), n1 = fmaxf(s.max[ln.r1], mx1);
    const float alpha0 = ex2(m0 - n0), alpha1 = ex2(m1 - n1);
    scale_rows(o, alpha0, alpha1);
    l0 *= alpha0;
    l1 *= alpha1;
    exponentiate<C>(p, s, 1, ln, n0, n1, l0, l1);
    pack_p<C::kF16>(p, ps);
    // Every lane of the quad read s.max[r] above; lane tig 0 overwrites it. No barrier lies between
    // (WG0's side is ordered by kBarS1Ready), so the warp syncs: lanes are not lockstep, and
    // racecheck reported the read / write pair as a warp-level WAR hazard.
    __syncwarp();
    if (ln.tig == 0) {
      s.max[ln.r0] = n0;
      s.max[ln.r1] = n1;
      sm90::mbar_arrive(s.max1_ready);  // each writer releases its own stores
    }
    m0 = n0;
    m1 = n1;

    sm90::wgmma_fence();
    issue_pv_rs<C::kF16>(o, ps, dv1);
    sm90::wgmma_commit();
    store_p(s.p1, ps, ln, lane);
    sm90::named_bar_sync(kBarS0Ready, 256);
    sm90::wgmma_fence();
    issue_pv_ss<C::kF16>(o, dp0, dv0);
    sm90::wgmma_commit();
    sm90::fence_proxy_async_smem();
    sm90::named_bar_arrive(kBarS1Ready, 256);
    sm90::wgmma_wait<1>();
    sm90::mbar_arrive(s.empty[1][1]);  // stage 1 right (one-item kernels: and its rope tile): done
    sm90::wgmma_wait<0>();
    sm90::mbar_arrive(s.empty[0][1]);  // stage 0 right (and P0 in its rope tile): done
    sm90::fence_regs(o);
  }
  finish<C>(a, s, ln, lane, token, head0, o, m0, m1, l0, l1, item, slot);
}

// ---- persistent roles (Config::kPersistent) ----------------------------------------------------------
// Every role walks the same items: it = blockIdx.x, + gridDim.x, ... (a static stride: no counter to
// reset, so a launch can be replayed in a CUDA graph), with each item's topk length loaded one item
// ahead. `gs` counts the steps of the items before (the K ring's barrier parities run on), `n` the
// items (parities of q_full / q_free / rowsum_ready / rowsum_read).
template <class C>
MJ_DEVICE void produce_items(const SparsePrefillArgs& a, const Smem& s) {
  const int items = unit_count<C>(a), stride = static_cast<int>(gridDim.x);  // units (tail split)
  int it = static_cast<int>(blockIdx.x);
  if (it >= items) return;  // (the host launches at most one CTA per unit)
  hint_first_indices<C>(a, unit_item<C>(a, it) / C::kCtasPerToken);
  u32 len = item_len<C>(a, it);
  // L2 policies: gathered rows evict-last (re-read by other tokens' CTAs), the query evict-first
  // (read once). Created once, outside the item loop.
  const u64 policy = sm90::l2_policy_evict_last(), q_policy = sm90::l2_policy_evict_first();
  u32 gs = 0;  // steps of the items before (only its parity is used)
  for (u32 n = 0;; ++n) {
    const bool more = it < items - stride;  // (it + stride would overflow near INT_MAX)
    const u32 len_next = more ? item_len<C>(a, it + stride) : 0u;
    const CtaWork w = item_work<C>(a, it, len);
    produce_bf16<C>(a, s, w.token, w.head0, w.topk_len, w.step0, w.steps, gs, n, policy, q_policy);
    if (!more) break;
    gs += static_cast<u32>(w.steps);
    len = len_next;
    it += stride;
  }
  sm90::cp_async_wait_all();
}

template <class C, int WG>
MJ_DEVICE void consume_items(const SparsePrefillArgs& a, const Smem& s, const Lane& ln, int lane) {
  const int items = unit_count<C>(a), stride = static_cast<int>(gridDim.x);  // units (tail split)
  int it = static_cast<int>(blockIdx.x);
  if (it >= items) return;
  u32 len = item_len<C>(a, it);
  u32 gs = 0;
  for (u32 n = 0;; ++n) {
    const bool more = it < items - stride;
    const u32 len_next = more ? item_len<C>(a, it + stride) : 0u;
    const CtaWork w = item_work<C>(a, it, len);
    // The query tile landed by cp.async (the acquire-form proxy fence: no instruction, as wait_full).
    sm90::mbar_wait(s.q_full, n & 1u);
    sm90::fence_proxy_async_acquire_smem();
    if (w.steps == 0) sm90::mbar_arrive(s.q_free);  // else after the item's last Q K^T
    if constexpr (WG == 0) {
      consume_wg0<C>(a, s, ln, lane, w.token, w.head0, w.steps, 1.0f, gs, n, w.slot);
    } else {
      consume_wg1<C>(a, s, ln, lane, w.token, w.head0, w.steps, 1.0f, gs, n, w.slot);
    }
    if (!more) break;
    gs += static_cast<u32>(w.steps);
    len = len_next;
    it += stride;
  }
}

}  // namespace sparse_prefill_sm90
}  // namespace mj

#include "sparse_prefill/sm90_fp8math.cuh"

namespace mj {
namespace sparse_prefill_sm90 {

template <class C>
MJ_DEVICE void run(const SparsePrefillArgs& args) {
  if constexpr (C::kFp8Math) {
    run_fp8math<C>(args);
    return;
  }
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const Smem s = [&] {
    Smem r = carve_smem(smem_raw, C::kMiscBytes);
    r.max = reinterpret_cast<float*>(smem_raw + C::kOffMax);
    r.rowsum = reinterpret_cast<float*>(smem_raw + C::kOffRowSum);
    r.bias = reinterpret_cast<float*>(smem_raw + C::kOffBias);
    r.colscale = reinterpret_cast<float*>(smem_raw + C::kOffColScale);
    if constexpr (C::kPersistent) {
      const u32 bars = sm90::smem_addr(smem_raw + C::kOffItemBars);
      r.q_full = bars;
      r.q_free = bars + 8u;
      r.rowsum_read = bars + 16u;
      r.rope1_full = bars + 24u;
      r.rope1_empty = bars + 32u;
    }
    return r;
  }();
  // One item per CTA (the fp8 kernels): its topk length load is issued before the barrier set-up.
  CtaWork work{};
  if constexpr (!C::kPersistent) work = cta_work<C>(args);
  const int wg = static_cast<int>(threadIdx.x) / 128;

  if (threadIdx.x == 0) {
    // full: fp8 plain arrivals; bf16 + one cp.async arrival each. empty: one warpgroup per half.
    init_barriers(s, C::kFp8 ? 128u : 256u, 128u, 128u);
    if constexpr (C::kPersistent) {
      sm90::mbar_init(s.q_full, 128u);  // the producer's cp.async arrivals
      sm90::mbar_init(s.q_free, 256u);
      sm90::mbar_init(s.rowsum_read, 256u);
      sm90::mbar_init(s.rope1_full, 256u);
      sm90::mbar_init(s.rope1_empty, 128u);
    }
    if constexpr (C::kF16) *reinterpret_cast<u32*>(s.rowsum) = 0u;  // load_q's tile maximum
    sm90::mbar_init_fence();
  }
  __syncthreads();

  if constexpr (C::kPersistent) {
    if (wg == 2) {
      sm90::setmaxnreg_dec<C::kProducerRegs>();
      produce_items<C>(args, s);
    } else {
      sm90::setmaxnreg_inc<C::kConsumerRegs>();
      const int lane = static_cast<int>(threadIdx.x) & 31;
      const Lane ln = make_lane(wg, lane);
      if (wg == 0) {
        consume_items<C, 0>(args, s, ln, lane);
      } else {
        consume_items<C, 1>(args, s, ln, lane);
      }
    }
  } else {
    const i64 token = work.token;
    const int head0 = work.head0, topk_len = work.topk_len, steps = work.steps;
    if (wg == 2) {
      sm90::setmaxnreg_dec<C::kProducerRegs>();
      if constexpr (C::kF16 && !C::kF16Group && MJ_SP90_FP8_LINE_GATHER) {
        produce_fp8_lines<C>(args, s, token, topk_len, steps);
      } else {
        produce_fp8<C>(args, s, token, topk_len, steps);
      }
    } else {
      sm90::setmaxnreg_inc<C::kConsumerRegs>();
      const int lane = static_cast<int>(threadIdx.x) & 31;
      Lane ln;
      set_lane(ln, wg, lane);
      const float q_unscale = load_q<C>(args, s, token, head0);
      if (wg == 0) {
        consume_wg0<C>(args, s, ln, lane, token, head0, steps, q_unscale);
      } else {
        consume_wg1<C>(args, s, ln, lane, token, head0, steps, q_unscale);
      }
    }
  }
}

}  // namespace sparse_prefill_sm90
}  // namespace mj

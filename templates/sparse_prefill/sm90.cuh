#pragma once
// Sparse MLA prefill (SPEC §3) for Hopper (sm_90a): wgmma tensor cores, warp-specialised.
//
// ---- Host interface (what the generator instantiates and the op launches) ----------------------
//   #include "sparse_prefill/sm90.cuh"
//   using Cfg = mj::sparse_prefill_sm90::Config<NUM_HEADS, KV_FP8, QUANT_GRANULARITY, ATTN_SINK, EMIT_LSE,
//                                                PAGE_SIZE, FP8_MATH, POW2_SCALES>;
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
//         cluster = (2, 1, 1) when args.crossover = 1 (only where Cfg::kCrossoverAvailable): a token's
//               two CTAs, its split counting token units (sm90_persistent.cuh, cta_work_crossover);
//               else none
//         block = (Cfg::kThreads = 384, 1, 1)
//         dynamic shared memory = Cfg::kSmemBytes (sparse_prefill/layout.h hopper_layout; above 48 KB,
//         so it needs the opt-in CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES).
//         The `__launch_bounds__(kThreads, 1)` (with the 1) is required: setmaxnreg needs an entry
//         register cap.
// Template parameters and constraints (static_asserts name the violated one):
//   NUM_HEADS   16..128, multiple of 16. CTA c of a token handles heads
//               [c * kHeadsPerCta, (c + 1) * kHeadsPerCta); kHeadsPerCta = NUM_HEADS / kCtasPerToken
//               (64 for H = 64/128; 40/48/56 for H = 80/96/112; H itself for H < 64). The MMA tile
//               is always 64 rows: rows past kHeadsPerCta are zero and their results discarded, so
//               H < 64 costs the same as H = 64 per token.
//   KV_FP8      false: bf16 cache rows (1152 bytes); true: fp8 e4m3 rows (576 bytes) with scales.
//   QUANT_GRANULARITY fp8 only: 0 = unit scales (kv_scales not read), else elements per scale,
//               dividing 576 and >= 16 (scales_per_token = 576 / QUANT_GRANULARITY floats per row);
//               576 = one scale per row. Widths 18 and 36 (groups not a multiple of 8) are correct but
//               slower (their decode spills). Smaller widths: the portable kernel. Must be 0 for bf16.
//   ATTN_SINK   reads args.attn_sink[H]; EMIT_LSE writes args.lse[T, H].
//   PAGE_SIZE   page size of the encoded indices (tma_row arithmetic), >= 1.
// Keys per step (the host's b_topk, 64): the kernel streams 64-key blocks, two per loop step (one
//   per consumer warpgroup); it never reads an index at or past topk_lengths[t], so it does not
//   depend on indices_stride being a multiple of anything. A 128-key stage does not fit: two
//   128 x 576 bf16 stages (288 KiB) plus the 72 KiB query tile exceed the 227 KiB of shared memory,
//   and a 64 x 128 f32 score tile would push a consumer past 255 registers.
//   FP8_MATH    params qk_math fp8: Q K^T and P V on e4m3 wgmma with Q quantised
//               per head; needs KV_FP8 and QUANT_GRANULARITY 0 or 576; a shared-memory layout of its own.
//               The body is sparse_prefill/sm90_fp8math.cuh (its header says what differs).
//   POW2_SCALES params scale_fmt ue8m0: every group scale is a power of two,
//               so the group decode multiplies each pair once by scale * 2^56 (exact) instead of the
//               split hi + lo multiply that rounds arbitrary scales once (3-5 % fewer cycles);
//               widths 192 decode to f16 tiles instead (kF16Group, see Precision).
// Args: every pointer of SparsePrefillArgs that the configuration uses must be valid; sm_scale must
// be finite and >= 0 (the running max is taken on scaled scores). Absolute row indices must fit in
// 32 bits (any cache that fits in device memory: 2^32 rows would be >= 2.4 TB).
// Precision: bf16 caches are used as is. fp8 with unit or per-row scales (QUANT_GRANULARITY 0 / 576) runs
// on f16 tiles: e4m3 -> f16 is exact, per-row scales are applied in f32 to scores and P, the query
// tile is converted to f16 after a power-of-two range scale (exact for every value within 2^-28 of
// the tile's largest |q|), P is rounded to f16 (3 more mantissa bits than bf16); the e4m3 NaN codes
// (0x7F/0xFF) stay NaN. With group scales (16 <= QUANT_GRANULARITY < 576) the bf16 tile holds
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
//   index -> first gather chain and the query load: 11.2K -> 8.2K cycles of fixed cost per item. Tail split (args.split_shift > 0, given partial slots by the host): the items of
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
// (QUANT_GRANULARITY 576) are folded into the score multiplier and P instead of the tile. The fp8
// producer streams 16-byte loads through a register window (9 deep for f16 tiles, 6 / 4 / 2 with
// group scales) across halves and steps; its encoded indices are loaded two steps ahead (the bf16
// producer's one step ahead), so no index load latency lands on the critical path of a step. With
// unit / per-row scales (f16 tiles) 8 lanes load one 128-byte L2 line of a row per instruction
// (Fp8LineProducer: ~5.5 L2 requests per 576-byte row instead of 9); group scales use the
// 4-lanes-per-row producer (Fp8Producer).
// Crossover (Config::kCrossover, layout.h hopper_crossover: two CTAs per token and the bf16-tile
//   group decode): the token's two CTAs run as a cluster of 2 and share the decode. Each producer
//   decodes rows g + 32 rank of every block (half of them) and writes each 16-byte chunk to its own
//   stage (st.shared) and to the peer's (st.async, completing as transaction bytes on the peer's
//   full barrier of the half, whose first local arrival expects them). A half is refilled once both
//   CTAs' consumers released it: every consumer thread arrives on its own empty barrier and the
//   peer's (counts 256). The decode is these kernels' bound at decode shapes; without the
//   crossover each of the token's CTAs decoded every row. Keys are split over tokens (both CTAs of
//   a cluster take the same part); a cluster barrier after set-up and before exit keeps each CTA's
//   shared memory alive while the peer writes it. A kernel that has the crossover holds both bodies
//   and args.crossover picks one per launch (the host: decode-sized launches, launch.hpp
//   crossover_taken; at prefill, where tokens share rows through L2, the lockstep costs more).
// Block schedule (Config::kBlockSchedule; sparse_prefill/sm90_block.cuh): for the fp8 kernels
//   whose producer decodes chunk by chunk, each 64-key block is scored by WG0 alone and its P V
//   split between both warpgroups, P handed over in the stage's rope tile; a stage is freed per
//   block instead of after the step's last P V. In a kernel that has the crossover, the body
//   without it moves registers from WG1 to the producer for a deeper window (sm90_config.cuh,
//   MJ_SP90_BLOCK_REGS).
// Proxy ordering: stage data are written through the generic proxy (cp.async, st.shared) and read
// by wgmma through the async proxy; each consumer fences after acquiring a full barrier (a
// producer-side fence would be a MEMBAR that waits for the producer's in-flight loads): the full
// fence after st.shared stages, the acquire form (no instruction on sm_90a) after cp.async ones
// (sm90_consumer.cuh, wait_stage_bar says why).
// L2: gathered rows evict-last (re-read by other tokens' CTAs), Q evict-first, output streaming.
//
// ---- Files ----------------------------------------------------------------------------------------
//   sparse_prefill/layout.h            shared-memory layout, thread counts, slot sizes (host and device)
//   sparse_prefill/sm90_config.cuh     Config, the per-CTA shared-memory view (Smem), barriers, lanes
//   sparse_prefill/sm90_producer.cuh   the producer warpgroup: index resolution, bf16 and fp8 gathers
//   sparse_prefill/sm90_combine.cuh    the tail split's partial slots and the combine entry
//   sparse_prefill/sm90_consumer.cuh   the consumer warpgroups: Q K^T, softmax, P V, epilogue
//   sparse_prefill/sm90_block.cuh      their block schedule (Config::kBlockSchedule)
//   sparse_prefill/sm90_persistent.cuh which items a CTA works on: one per CTA, or the persistent walk
//   sparse_prefill/sm90_fp8math.cuh    the FP8-math kernel (params qk_math fp8)
//   sparse_prefill/sm90.cuh            this file: the entry run<Config>()
#include "sparse_prefill/sm90_config.cuh"
#include "sparse_prefill/sm90_producer.cuh"
#include "sparse_prefill/sm90_consumer.cuh"
#include "sparse_prefill/sm90_combine.cuh"
#include "sparse_prefill/sm90_persistent.cuh"
#include "sparse_prefill/sm90_fp8math.cuh"
#include "sparse_prefill/sm90_block.cuh"

namespace mj {
namespace sparse_prefill_sm90 {

template <class C>
MJ_DEVICE void run(const SparsePrefillArgs& args) {
  if constexpr (C::kFp8Math) {
    run_fp8math<C>(args);
    return;
  }
  // The crossover's body, where this kernel has one and the launch runs it (a uniform branch).
  if constexpr (C::kCrossoverAvailable && !C::kCrossover) {
    if (args.crossover != 0) {
      run<typename C::WithCrossover>(args);
      return;
    }
  }
  // The combine behind a split launch is launched programmatically: its CTAs may take the SMs
  // this grid leaves free once every CTA of it has started (a no-op without a dependent).
  grid_dependency::launch_dependents();
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const Smem s = [&] {
    Smem r = carve_smem(smem_raw, C::kMiscBytes);
    r.max = reinterpret_cast<float*>(smem_raw + C::kOffMax);
    r.rowsum = reinterpret_cast<float*>(smem_raw + C::kOffRowSum);
    r.bias = reinterpret_cast<float*>(smem_raw + C::kOffBias);
    r.colscale = reinterpret_cast<float*>(smem_raw + C::kOffColScale);
    if constexpr (C::kBlockSchedule) {
      const u32 base = sm90::smem_addr(smem_raw);
      r.p_full[0] = base + C::kOffMax;  // the max hand-off array: unused by the block schedule
      r.p_full[1] = base + C::kOffMax + kMbarBytes;
      r.xfer = reinterpret_cast<float*>(smem_raw + (r.p1 - base));  // WG1's P tile: likewise
    }
    if constexpr (C::kPersistent) {
      const u32 bars = sm90::smem_addr(smem_raw + C::kOffItemBars);
      r.q_full = bars;
      r.q_free = bars + 1u * kMbarBytes;
      r.rowsum_read = bars + 2u * kMbarBytes;
      r.rope1_full = bars + 3u * kMbarBytes;
      r.rope1_empty = bars + 4u * kMbarBytes;
    }
    if constexpr (C::kCrossover) {
      // One offset for the whole window: mapa maps a CTA's shared window linearly onto the peer's
      // (one mapa per address, as CUTLASS does, would give the same addresses).
      const u32 base = sm90::smem_addr(smem_raw);
      r.peer_delta = cluster::map_shared(base, cluster::rank() ^ 1u) - base;
    }
    return r;
  }();
  // One item per CTA (the fp8 kernels): its topk length load is issued before the barrier set-up.
  CtaWork work{};
  if constexpr (!C::kPersistent) work = cta_work<C>(args);
  const int wg = static_cast<int>(threadIdx.x) / 128;

  if (threadIdx.x == 0) {
    // full: fp8 plain arrivals; bf16 + one cp.async arrival each. empty: one warpgroup per half
    // (the crossover: that warpgroup of both CTAs).
    if constexpr (C::kBlockSchedule) {
      // empty: left halves WG0, right halves WG0 + WG1 (the crossover: of both CTAs).
#pragma unroll
      for (int st = 0; st < 2; ++st) {
        sm90::mbar_init(s.full[st][0], 128u);
        sm90::mbar_init(s.full[st][1], 128u);
        sm90::mbar_init(s.empty[st][0], 128u + C::kPeerReleasesPerWg);
        sm90::mbar_init(s.empty[st][1], 256u + 2u * C::kPeerReleasesPerWg);
        sm90::mbar_init(s.p_full[st], 128u);
      }
      sm90::mbar_init(s.max1_ready, 32u);
      sm90::mbar_init(s.rowsum_ready, 256u);
    } else {
      init_barriers(s, C::kFp8 ? 128u : 256u, 128u + C::kPeerReleasesPerWg, 128u + C::kPeerReleasesPerWg);
    }
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
  // The crossover: the peer writes into this CTA's stages and arrives on its barriers, so both
  // CTAs' barriers must be initialised before either producer or consumer starts.
  if constexpr (C::kCrossover) {
    cluster::sync();
  } else {
    __syncthreads();
  }

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
    const int head0 = work.head0, steps = work.steps;
    // A part (split) reads the slots from its first one on: the producers see them as a row of
    // their own.
    const int first_slot = work.first_slot, topk_len = work.topk_len - first_slot;
    if (wg == 2) {
      sm90::setmaxnreg_dec<C::kProducerRegs>();
      if constexpr (C::kF16 && !C::kF16Group) {
        produce_fp8_lines<C>(args, s, token, first_slot, topk_len, steps);
      } else {
        produce_fp8<C>(args, s, token, first_slot, topk_len, steps);
      }
    } else if constexpr (C::kBlockSchedule) {
      // The query tile first, at the entry budget (one static bar.sync of kBarQReady for both
      // warpgroups), then each warpgroup's whole path under its own budget: ptxas allocates code
      // that both reach after a join under the smaller one, so nothing is shared past setmaxnreg.
      const int lane = static_cast<int>(threadIdx.x) & 31;
      Lane ln;
      set_lane(ln, wg, lane);
      const float q_unscale = load_q<C>(args, s, token, head0);
      if (wg == 0) {
        sm90::setmaxnreg_inc<C::kConsumerRegs>();
        block_wg0<C>(args, s, ln, lane, token, head0, steps, topk_len, q_unscale, work.slot);
      } else {
        if constexpr (C::kWg1Regs < C::kEntryRegs) {  // (.inc below the entry count is illegal)
          sm90::setmaxnreg_dec<C::kWg1Regs>();
        } else {
          sm90::setmaxnreg_inc<C::kWg1Regs>();
        }
        block_wg1<C>(args, s, ln, lane, token, head0, steps, topk_len, work.slot);
      }
    } else {
      sm90::setmaxnreg_inc<C::kConsumerRegs>();
      const int lane = static_cast<int>(threadIdx.x) & 31;
      Lane ln;
      set_lane(ln, wg, lane);
      const float q_unscale = load_q<C>(args, s, token, head0);
      if (wg == 0) {
        consume_wg0<C>(args, s, ln, lane, token, head0, steps, q_unscale, 0u, 0u, work.slot);
      } else {
        consume_wg1<C>(args, s, ln, lane, token, head0, steps, q_unscale, 0u, 0u, work.slot);
      }
    }
    // The crossover: neither CTA exits while the other may still store into its shared memory or
    // arrive on its barriers (the last halves' releases).
    if constexpr (C::kCrossover) cluster::sync();
  }
}

}  // namespace sparse_prefill_sm90
}  // namespace mj

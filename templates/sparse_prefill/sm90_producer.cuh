#pragma once
// The Hopper sparse prefill's producer warpgroup (WG2; sparse_prefill/sm90.cuh, Design): it resolves
// the token's encoded indices to rows (SPEC validity rule) and fills the two-stage K ring: bf16 rows
// by cp.async, fp8 rows by 16-byte register loads decoded on the way to shared memory; the persistent
// kernel's producer also loads each item's query tile.
#include "sparse_prefill/sm90_config.cuh"

namespace mj {
namespace sparse_prefill_sm90 {

// ---- rows of the slots ------------------------------------------------------------------------------
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

// ---- decode helpers ---------------------------------------------------------------------------------
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
    // refill on the critical path) is still in flight: -1.4 to -2.3 % cycles.
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
// Thread t: group g = t / 4 owns rows g and g + 32 of a block (the crossover: row g + 32 rank only);
// lane c = t % 4 loads the 16-byte fp8 chunks u = 4 q + c (16 dims each) and writes the two 16-byte
// bf16 chunks 2c, 2c+1 of tile u / 4. Per step a thread handles 18 R chunks (R rows per block) in a
// fixed order (the four stage halves in the order the consumers need them; in a half: row, then
// tile). Loads run kWindow chunks ahead of the decode in a register ring, across half and step
// boundaries (the next step's rows are resolved one step early), so L2 latency stays hidden while
// the thread decodes.
// BLOCK: the halves in the block schedule's order (sm90_block.cuh: stage 0 left, stage 0 right,
// stage 1 left, stage 1 right, each block whole before the next); otherwise the prefill schedule's.
template <int R, bool BLOCK = false>
struct Fp8PlanRows {
  static_assert(R == 1 || R == 2, "rows per block and thread");
  static constexpr int kRows = R;
  // Closed forms (no recursion), so that they fold to constants once the chunk loop is unrolled.
  static constexpr int kChunks = 18 * R;
  // half h in consumer order: 0 = stage 0 left, 1 = stage 1 right, 2 = stage 0 right, 3 = stage 1 left
  // (BLOCK: 0 = stage 0 left, 1 = stage 0 right, 2 = stage 1 left, 3 = stage 1 right)
  __host__ __device__ static constexpr int stage(int h) { return BLOCK ? h >> 1 : h & 1; }
  __host__ __device__ static constexpr int side(int h) {  // 1: tiles 4..8
    return BLOCK ? h & 1 : (h == 1 || h == 2) ? 1 : 0;
  }
  // Whether half h is the first of its stage in this order (its stage's key bias is published there).
  __host__ __device__ static constexpr bool opens_stage(int h) { return BLOCK ? side(h) == 0 : side(h) == stage(h); }
  __host__ __device__ static constexpr int first_tile(int h) { return side(h) ? kLeftTiles : 0; }
  __host__ __device__ static constexpr int tiles(int h) { return side(h) ? kQkTiles - kLeftTiles : kLeftTiles; }
  __host__ __device__ static constexpr int first_chunk(int h) {
    return h == 0 ? 0 : h == 1 ? R * tiles(0) : h == 2 ? R * (tiles(0) + tiles(1)) : R * (tiles(0) + tiles(1) + tiles(2));
  }
  __host__ __device__ static constexpr int half_of(int i) {
    return i < first_chunk(1) ? 0 : i < first_chunk(2) ? 1 : i < first_chunk(3) ? 2 : 3;
  }
  __host__ __device__ static constexpr int row_of(int i) { return (i - first_chunk(half_of(i))) / tiles(half_of(i)); }
  __host__ __device__ static constexpr int tile_of(int i) {
    return first_tile(half_of(i)) + (i - first_chunk(half_of(i))) % tiles(half_of(i));
  }
};
template <int R, bool BLOCK>
constexpr bool fp8_plan_tiles_step() {
  using P = Fp8PlanRows<R, BLOCK>;
  // (first_chunk accumulates the halves' tiles; what can go wrong is their total.)
  return P::kChunks == P::first_chunk(3) + R * P::tiles(3);
}
static_assert(fp8_plan_tiles_step<1, false>() && fp8_plan_tiles_step<2, false>() && fp8_plan_tiles_step<1, true>() &&
                  fp8_plan_tiles_step<2, true>() && Fp8PlanRows<2>::first_chunk(3) == 28 &&
                  Fp8PlanRows<2, true>::first_chunk(3) == 26,
              "fp8 chunk plan: halves must tile the chunks of a step");
using Fp8Plan = Fp8PlanRows<2>;

// Scale floats prefetched with a chunk (group scales): the group of the chunk's first element and,
// when groups are not a multiple of 16 wide, the group of its element 8 (width multiple of 8) or of
// its last element (QUANT_GRANULARITY >= 16: a 16-element chunk spans at most two groups).
template <class C>
struct Fp8Scales {
  static constexpr int kPerChunk = !C::kGroupScale || C::kF16Group ? 0 : C::kQuantGranularity % 16 == 0 ? 1 : 2;
  float v[kPerChunk > 0 ? kPerChunk : 1];
};

// bf16x2 multipliers (group scale * 2^56) for the 8 element pairs of chunk u of a row, split in a
// high and a low bf16 part (hi + lo = the f32 scale to ~2^-16), so that fma(t, hi, t * lo) rounds
// the product once instead of rounding the scale first (a systematic error per group).
constexpr u32 kBf16x2TwoPow56 = 0x5B805B80u;  // bf16 2^56 in both halves
constexpr u32 kBf16x2TwoPowMinus64 = 0x1F801F80u;  // bf16 2^-64 in both halves
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
  } else if constexpr (C::kQuantGranularity % 8 == 0) {  // v[0]: elements 0..7, v[1]: elements 8..15
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
    const int split = ((16 * u) / C::kQuantGranularity + 1) * C::kQuantGranularity - 16 * u;
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
  using Plan = typename Producer::Plan;
  constexpr int kWindow = Producer::kWindow, h = Plan::half_of(I);
  if constexpr (I + kWindow < Plan::kChunks) {
    pr.template load<I + kWindow>(pr.cur);
  } else {
    pr.template load<I + kWindow - Plan::kChunks>(pr.nxt);
  }
  if constexpr (I == Plan::first_chunk(h) + Plan::kRows * Plan::tiles(h) - 1) {
    const u32 full = pr.s.full[Plan::stage(h)][Plan::side(h)];
    if constexpr (C::kCrossover) {
      // The peer's rows of this half land here by its st.async: one arrival expects their bytes.
      constexpr u32 kPeerBytes = 32u * Plan::tiles(h) * 128u;
      if (threadIdx.x == 256u) {
        sm90::mbar_arrive_expect_tx(full, kPeerBytes);
      } else {
        sm90::mbar_arrive(full);
      }
    } else {
      sm90::mbar_arrive(full);
    }
  }
  if constexpr (I + 1 < Plan::kChunks) pr.template chunk<I + 1>(empty_parity);
}

// The fp8 producer's per-thread state; chunk<I>() handles chunk I of a step with every index a
// compile-time constant (template recursion rather than a loop the compiler might not fold).
// Load windows (loads in flight per thread): f16 tiles have no scale registers, so a deeper window
// fits (9); power-of-two groups of 192 on f16 tiles keep the row scales in registers of the ring (6).
constexpr int kF16Window = 9;
constexpr int kF16GroupWindow = 6;
// The crossover's window: 6 of its 18 chunks per step (9 and 18, with registers moved from WG1 to
// the producer, measured 5-20% slower; MJ_SP90_CROSSOVER_WINDOW is an NVRTC option for A/B).
#ifndef MJ_SP90_CROSSOVER_WINDOW
#define MJ_SP90_CROSSOVER_WINDOW 6
#endif
template <class C>
struct Fp8Producer {
  using Plan = Fp8PlanRows<C::kCrossover ? 1 : 2, C::kBlockSchedule>;
  using Scales = Fp8Scales<C>;
  // Loads in flight per thread (divides the chunks of a step, so ring slots repeat each step):
  // 6 x 16 B x 128 threads = 12 KB per SM in flight, enough for ~14 B/clk at ~800 clk L2 latency.
  // Two scale floats per chunk (and the group-boundary decode) leave registers for shorter windows.
  static constexpr int kWindow = C::kBlockRegs ? 12
                                 : C::kCrossover ? MJ_SP90_CROSSOVER_WINDOW
                                 : C::kF16Group ? kF16GroupWindow
                                 : C::kF16 ? kF16Window
                                 : Scales::kPerChunk < 2 ? 6
                                 : C::kQuantGranularity % 8 == 0 ? 4 : 2;
  static_assert(Plan::kChunks % kWindow == 0, "window must divide the chunks per step");

  const SparsePrefillArgs& a;
  const Smem& s;
  const unsigned char* kv;  // cache base + this lane's 16-byte column offset
  const float* scales;      // kv_scales
  const unsigned char* rec; // kDsMla: the cache base (records hold their scales and rope dims)
  u64 policy;
  int g, c;
  // The crossover: this CTA's rank in the cluster (its rows of a block are g + 32 xr) and the byte
  // offset of the thread's row in a tile; otherwise xr = 0 and the row of chunk k is g + 32 k.
  u32 xr;
  u32 row_off;
  // `c` laundered through an empty asm once per step: per-chunk values derived from the lane (scale
  // group indices, group boundaries) are then recomputed each step instead of being hoisted out of
  // the step loop into 36 chunks' worth of live registers.
  int cv;
  u32 sw;
  u32 cur[2][2], nxt[2][2];  // [block of the step][k]: row g + 32 k, kNoRow when invalid
  u32 raw[kWindow][4];
  Scales sc[kWindow];
  // kDsMla: a rope chunk (tile 8) is 16 bf16 = 32 bytes, two loads: the second 16 bytes of the
  // chunk of row k. Two rope chunks in flight at once are of rows 0 and 1, or with one row per block
  // (the crossover) of the two right halves: rope_slot keeps them apart.
  u32 rope[C::kDsMla ? 2 : 1][4];
  template <int J>
  __host__ __device__ static constexpr int rope_slot() {
    return Plan::kRows == 2 ? (Plan::row_of(J) & 1) : (Plan::half_of(J) >= 2 ? 1 : 0);
  }
  // The row of chunk J's block among rows[b][k] (the crossover: a select on the rank, not a
  // run-time array index, which would put the row arrays in local memory).
  template <int J>
  MJ_DEVICE u32 chunk_row(const u32 (&rows)[2][2]) const {
    constexpr int b = Plan::stage(Plan::half_of(J));
    if constexpr (C::kCrossover) {
      return xr ? rows[b][1] : rows[b][0];
    } else {
      return rows[b][Plan::row_of(J)];
    }
  }
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
    constexpr int tile = Plan::tile_of(J), slot = J % kWindow, rs = rope_slot<J>();
    const u32 row = chunk_row<J>(rows);
    if constexpr (C::kDsMla && tile == kQkTiles - 1) {  // the rope dims: bf16 as they are, no scale
      if constexpr (Scales::kPerChunk >= 1) sc[slot].v[0] = 0.0f;  // (unused: defined for the pin)
      if (row != kNoRow) {
        const unsigned char* r = rec + static_cast<u64>(row) * C::kRowBytes + kDsMlaRopeOffset + 32 * cv;
        sm90::ldg128_policy<0>(r, policy, raw[slot][0], raw[slot][1], raw[slot][2], raw[slot][3]);
        sm90::ldg128_policy<16>(r, policy, rope[rs][0], rope[rs][1], rope[rs][2], rope[rs][3]);
      } else {
        raw[slot][0] = raw[slot][1] = raw[slot][2] = raw[slot][3] = 0u;
        rope[rs][0] = rope[rs][1] = rope[rs][2] = rope[rs][3] = 0u;
      }
      return;
    }
    if (row != kNoRow) {
      sm90::ldg128_policy<64 * tile>(kv + static_cast<u64>(row) * C::kRowBytes, policy, raw[slot][0], raw[slot][1],
                                     raw[slot][2], raw[slot][3]);
      if constexpr (Scales::kPerChunk >= 1) {
        const float* rs = C::kDsMla ? reinterpret_cast<const float*>(rec + static_cast<u64>(row) * C::kRowBytes +
                                                                     kDsMlaScaleOffset)
                                    : scales + static_cast<u64>(row) * C::kScalesPerToken;
        const int u = 4 * tile + cv;
        sc[slot].v[0] = sm90::ldg_f32_ordered(rs + (16 * u) / C::kQuantGranularity);
        if constexpr (Scales::kPerChunk == 2)
          sc[slot].v[1] = sm90::ldg_f32_ordered(rs + (16 * u + (C::kQuantGranularity % 8 == 0 ? 8 : 15)) / C::kQuantGranularity);
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
    constexpr int st = Plan::stage(h), side = Plan::side(h), rs = rope_slot<I>();
    if constexpr (I == Plan::first_chunk(h)) {
      // (The crossover: the half is free once both CTAs' consumers released it, since this thread
      // writes it in both; the empty barriers count both.)
      sm90::mbar_wait(s.empty[st][side], empty_parity);
      if constexpr (Plan::opens_stage(h)) {  // a stage's first half: publish its key bias / per-row scales
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
    if constexpr (C::kDsMla && tile == kQkTiles - 1) {
      // fp8_ds_mla rope dims: bf16 moved as they are, times 2^-64 like every tile of the bf16
      // decode (exact: a power of two; values below 2^-62 turn subnormal in bf16).
#pragma unroll
      for (int w = 0; w < 4; ++w) asm volatile("" : "+r"(rope[rs][w]));
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        out[w] = mul_bf16x2(raw[slot][w], kBf16x2TwoPowMinus64);
        out[4 + w] = mul_bf16x2(rope[rs][w], kBf16x2TwoPowMinus64);
      }
    } else if constexpr (C::kF16) {
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
    if constexpr (C::kDsMla && tile == kQkTiles - 1) {
      // scaled above
    } else if constexpr (C::kF16Group) {
      // The row's multiplier for this chunk's group (tile), from its owner lane: exact products.
      constexpr int grp = (64 * tile) / C::kQuantGranularity;
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
    const u32 dst = s.k[st] + tile * kTileBytes + row_off + static_cast<u32>(32 * k) * 128u;
    const u32 d0 = dst + (((2u * c) ^ sw) << 4), d1 = dst + (((2u * c + 1u) ^ sw) << 4);
    sm90::sts128(d0, out[0], out[1], out[2], out[3]);
    sm90::sts128(d1, out[4], out[5], out[6], out[7]);
    if constexpr (C::kCrossover) {  // the peer's copy, counted on its full barrier of the half
      const u32 bar = s.full[st][side] + s.peer_delta;
      cluster::st_async_128(d0 + s.peer_delta, out[0], out[1], out[2], out[3], bar);
      cluster::st_async_128(d1 + s.peer_delta, out[4], out[5], out[6], out[7], bar);
    }
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
// long. With L2 throughput the limiter of the fp8 path (75% busy at DRAM 6%, hit rate 92-95%, ncu on
// H100), this mapping lets 8 lanes load one 128-byte L2 line of a row: ~5.5 requests per row
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
  static constexpr int kWindow = kF16Window;
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
    pbits = (pbits & ~(1u << slot)) | (p << slot);
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
    const u32 p = (pbits >> slot) & 1u;
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
MJ_DEVICE void produce_fp8_lines(const SparsePrefillArgs& a, const Smem& s, i64 token, int first_slot, int topk_len,
                                 int steps) {
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
  const u32* token_indices = a.indices + token * a.indices_stride + first_slot;  // (a part: its first slot)
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
MJ_DEVICE void produce_fp8(const SparsePrefillArgs& a, const Smem& s, i64 token, int first_slot, int topk_len,
                           int steps) {
  const int t = static_cast<int>(threadIdx.x) - 256;
  Fp8Producer<C> p{a, s};
  p.g = t >> 2;
  p.c = t & 3;
  p.kv = static_cast<const unsigned char*>(a.kv_blocks) + p.c * 16;
  p.rec = static_cast<const unsigned char*>(a.kv_blocks);
  p.scales = a.kv_scales;
  p.policy = sm90::l2_policy_evict_last();
  p.sw = static_cast<u32>(p.g) & 7u;
  p.xr = C::kCrossover ? cluster::rank() : 0u;
  p.row_off = (static_cast<u32>(p.g) + 32u * p.xr) * 128u;
  const u32* token_indices = a.indices + token * a.indices_stride + first_slot;  // (a part: its first slot)
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

}  // namespace sparse_prefill_sm90
}  // namespace mj

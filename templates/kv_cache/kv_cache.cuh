#pragma once
// Paged KV cache kernels (SPEC §1): kv_cache_store, kv_cache_gather, sparse_index_remap.
//
// Store and gather are bandwidth-bound copies with a cast (and, for fp8, a per-group amax,
// scale and quantization), specialized at compile time on dtypes, heads, head size, page size,
// layers, kv_dim, granularity, scale format and block size.
//
// Work decomposition. A token's row of num_heads * head_size elements is cut into *segments*:
// for an fp8 cache one segment per (head, group of g elements) — the unit that shares one scale —
// otherwise the whole row. A segment is cut into *chunks* of kVec elements, each moved by one
// vector instruction of up to 16 bytes. A *team* of kLanes lanes (a power of two <= 32, chosen to
// leave the fewest lanes idle) owns a segment: lane l takes chunks l, l + kLanes, ..., so each
// load instruction of a team covers kLanes * 16 contiguous bytes. An fp8 segment's amax is a
// shuffle reduction inside its team. A thread keeps up to kHold chunks of each of kSegsPerThread
// segments in registers, loading all of them before using any, so that enough bytes are in flight
// per SM to saturate HBM.
//
// Store issues its input loads before the token -> sequence -> page -> block lookups (the loads
// do not depend on them) so that the lookup latency overlaps the data transfer.
#include "common/elem.cuh"
#include "common/types.cuh"
#include "common/vec.cuh"
#include "kv_cache/args.h"
#include "kv_cache/plan.h"

namespace mj {
namespace kv {

template <class A, class B>
struct same_type {
  static constexpr bool value = false;
};
template <class A>
struct same_type<A, A> {
  static constexpr bool value = true;
};

// ---- small device helpers ------------------------------------------------------------------------

MJ_DEVICE u32 load_ro(const unsigned* p) {
  u32 v;
  asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

MJ_DEVICE float load_ro(const float* p) {
  float v;
  asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

// IEEE round-to-nearest reciprocal (no flush of subnormals).
MJ_DEVICE float rcp_rn(float x) {
  float r;
  asm("rcp.rn.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// Max over the kLanes lanes of a team (aligned groups of consecutive lanes). Every lane of the
// warp must call it (full-mask shuffles); lanes outside live segments contribute their 0.
template <int LANES>
MJ_DEVICE float team_max(float v) {
#pragma unroll
  for (int o = LANES / 2; o >= 1; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The sequence b with off[b] <= t < off[b + 1], or -1 when t is outside [off[0], off[batch]).
// With empty sequences (equal offsets) the search lands on the non-empty one.
MJ_DEVICE int find_sequence(const unsigned* off, int batch, u64 t) {
  if (batch <= 0 || t < load_ro(off) || t >= load_ro(off + batch)) return -1;
  int lo = 0, hi = batch;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (load_ro(off + mid) <= t) lo = mid;
    else hi = mid;
  }
  return lo;
}

// Row arithmetic of the cache (SPEC §1), specialized on the layout constants. PAGE_SCALES (layout
// fp8_page_scales, one 128-byte e4m3 head and one f32 scale per token): a page of P tokens is
// P x 132 bytes, the tokens' bytes then their scales, i.e. P + P / 32 rows of 128 bytes of which the
// first P are the tokens'; rows are counted in those units so that a token's bytes stay at
// row x 128, and its scale lies at float page x 33 P + 32 P + offset from the blocks' start.
template <int P, int L, int KV, bool PAGE_SCALES = false>
struct CacheRows {
  static_assert(!PAGE_SCALES || (P % 32 == 0 && KV == 1), "fp8_page_scales: whole 128-byte rows per page, MLA");
  static constexpr int kRowsPerPage = PAGE_SCALES ? P + P / 32 : P;
  // Physical block and page offset of logical position `pos` of sequence `b`; false when the
  // page is past the lookup table or the block id is >= num_blocks (the slot does not exist).
  static MJ_DEVICE bool resolve(const unsigned* lut, int pages_per_seq, long long num_blocks, int b, u64 pos,
                                u32& blk, u32& off) {
    const u64 page = pos / P;
    if (page >= static_cast<u64>(pages_per_seq)) return false;
    blk = load_ro(lut + static_cast<u64>(b) * pages_per_seq + page);
    if (static_cast<long long>(blk) >= num_blocks) return false;
    off = static_cast<u32>(pos % P);
    return true;
  }
  static MJ_DEVICE u64 row(u32 blk, int kv_idx, int layer_idx, u32 off) {
    return ((static_cast<u64>(blk) * KV + kv_idx) * L + layer_idx) * kRowsPerPage + off;
  }
  // Index of row `row`'s first scale in `scales` (PER_ROW of them per row in the split layout; in
  // fp8_page_scales `scales` is the blocks' start).
  template <int PER_ROW>
  static MJ_DEVICE u64 scale_index(u64 row) {
    if constexpr (PAGE_SCALES) {
      const u64 page = row / kRowsPerPage;
      return page * (33ull * P) + 32ull * P + (row - page * kRowsPerPage);
    } else {
      return row * PER_ROW;
    }
  }
};

// ---- element vectors ---------------------------------------------------------------------------

// kV elements of type T (packed in a Vec) -> f32.
template <class T, int V>
MJ_DEVICE void unpack(const Vec<V * T::kBytes>& v, float (&f)[V]) {
  if constexpr (T::kBytes == 4) {
#pragma unroll
    for (int k = 0; k < V; ++k) f[k] = __uint_as_float(v.w[k]);
  } else if constexpr (V % 2 == 0) {
#pragma unroll
    for (int k = 0; k < V; k += 2) T::pair_to_f32(get_elem<2 * T::kBytes>(v, k / 2), f[k], f[k + 1]);
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) f[k] = T::to_f32(get_elem<T::kBytes>(v, k));
  }
}

// f32 -> kV elements of type T, round to nearest even (fp8: satfinite).
template <class T, int V>
MJ_DEVICE Vec<V * T::kBytes> pack(const float (&f)[V]) {
  Vec<V * T::kBytes> v;
  clear(v);
  if constexpr (T::kBytes == 4) {
#pragma unroll
    for (int k = 0; k < V; ++k) v.w[k] = __float_as_uint(f[k]);
  } else if constexpr (V % 2 == 0) {
#pragma unroll
    for (int k = 0; k < V; k += 2) or_elem<2 * T::kBytes>(v, k / 2, T::pair_from_f32(f[k], f[k + 1]));
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) or_elem<T::kBytes>(v, k, T::from_f32(f[k]));
  }
  return v;
}

// A Vec of kV elements of type T all set to T's NaN.
template <class T, int V>
MJ_DEVICE Vec<V * T::kBytes> nan_vec() {
  Vec<V * T::kBytes> v;
  clear(v);
#pragma unroll
  for (int k = 0; k < V; ++k) or_elem<T::kBytes>(v, k, T::kNaN);
  return v;
}

// ---- fp8 quantization ----------------------------------------------------------------------------

// Per-group scale s = max(amax, 1e-4f) / 448.0f, correctly rounded (IEEE f32 division) without a
// division: with r = RN(1/448), q0 = RN(a * r), rem = a - q0 * 448 (exact in one fma) and
// RN(q0 + rem * r) is RN(a / 448) for every f32 a >= 1e-4 (checked exhaustively; tests/unit
// samples it). amax = inf gives inf. ue8m0 then rounds s UP to a power of two by clearing the
// mantissa and carrying into the exponent (exact; inf stays inf).
template <bool UE8M0>
MJ_DEVICE float group_scale(float amax) {
  const float a = fmaxf(amax, 1e-4f);
  const float r448 = 2.23214285e-3f;  // RN(1/448) = 0x3B124925
  const float q0 = a * r448;
  const float rem = fmaf(-q0, 448.0f, a);
  float s = (q0 == __uint_as_float(0x7F800000u)) ? q0 : fmaf(rem, r448, q0);
  if constexpr (UE8M0) {
    u32 b = __float_as_uint(s);
    if (b & 0x007FFFFFu) b = (b & 0xFF800000u) + 0x00800000u;
    s = __uint_as_float(b);
  }
  return s;
}

// x -> x / s correctly rounded (IEEE f32 division), for the s of one group. ue8m0: s is a power of
// two, so x * (1/s) is exact (1/s from the exponent bits). fp32: one Markstein correction: with
// r = RN(1/s), q0 = RN(x * r) is within an ulp of x / s, rem = x - q0 * s is exact in one fma, and
// RN(q0 + rem * r) is the correctly rounded quotient (for every s >= 2^-23, which the scale formula
// guarantees; subnormal x may differ in the last f32 bit, far below the smallest e4m3 step;
// tests/unit checks the identity). The quotient takes x's sign bit, which keeps -0 / s = -0.
// s = inf (an infinite input in the group) uses r = 0 and s_fma = 0: x / inf = +-0, inf / inf = NaN.
template <bool UE8M0>
struct GroupQuantizer {
  float r;      // RN(1 / s), 0 for s = inf
  float s_fma;  // s, 0 for s = inf (keeps 0 * inf out of the remainder)

  static MJ_DEVICE GroupQuantizer make(float s) {
    GroupQuantizer g;
    const bool inf = __float_as_uint(s) == 0x7F800000u;
    if constexpr (UE8M0) {
      g.r = inf ? 0.0f : __uint_as_float(0x7F000000u - __float_as_uint(s));  // 2^-k for s = 2^k
      g.s_fma = 0.0f;
    } else {
      g.r = inf ? 0.0f : rcp_rn(s);
      g.s_fma = inf ? 0.0f : s;
    }
    return g;
  }
  MJ_DEVICE float operator()(float x) const {
    if constexpr (UE8M0) {
      return x * r;
    } else {
      const float q0 = x * r;
      const float rem = fmaf(-q0, s_fma, x);
      const float q = fmaf(rem, r, q0);
      return __uint_as_float((__float_as_uint(q) & 0x7FFFFFFFu) | (__float_as_uint(x) & 0x80000000u));
    }
  }
};

// ---- fp8 fast path: bf16 input, fp32 scales (see KvStore::kFastFp32) ---------------------------

// Packed max of two bf16x2 (bf16 orders like its f32 value). max.bf16x2: a NaN half loses (like
// fmaxf); max.NaN.bf16x2: a NaN half wins, so a non-finite input shows in the result.
MJ_DEVICE u32 max_bf16x2(u32 a, u32 b) {
  u32 r;
  asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
MJ_DEVICE u32 max_nan_bf16x2(u32 a, u32 b) {
  u32 r;
  asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// group_scale<false> for a finite amax: then q0 = amax * RN(1/448) is finite and the inf test of
// group_scale never fires (same bits, two instructions fewer per group).
MJ_DEVICE float group_scale_finite(float amax) {
  const float a = fmaxf(amax, 1e-4f);
  const float r448 = 2.23214285e-3f;  // RN(1/448) = 0x3B124925
  const float q0 = a * r448;
  const float rem = fmaf(q0, -448.0f, a);  // = fmaf(-q0, 448, a); this form keeps the negation in the constant
  return fmaf(rem, r448, q0);
}

// rcp.rn.f32 for an s whose biased exponent is in [1, 252]. ptxas expands rcp.rn.f32 into a range
// test on the exponent, a call to a slow path for exponents 0 and 253..255, and on every other
// input MUFU.RCP followed by one Newton step r + r * (1 - s * r) in two fmas (SASS: MUFU.RCP;
// FFMA e = r * s - 1; FADD.FTZ -e; FFMA r * -e + r). This is that sequence without the test and
// the branch, so the bits are the same on that range (e = s * r - 1 is 0 or of magnitude >=
// 2^-48, never subnormal, so the FTZ of the negation does not matter). The scales of a finite
// group lie in [RN(1e-4 / 448), RN(max bf16 / 448)] = [2^-22.1, 2^119.3]: exponents 105..246.
// Without the branch the compiler can interleave the groups' scale chains.
MJ_DEVICE float rcp_rn_normal(float s) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(s));
  const float e = fmaf(r, s, -1.0f);
  return fmaf(r, -e, r);
}

// GroupQuantizer<false>(x) for finite x and a finite scale s (r = RN(1/s)), without the sign
// fix-up: rem' = q0 * s - x is -rem exactly (the remainder is exact in one fma), so
// fma(-rem', r, q0) is the same rounding of the same value, except where rem is zero: there the
// signs of the zeros decide. x = -0: q0 = -0, rem' = -0 * s + +0 = +0, q = -0 * r + -0 = -0; x =
// +0: q = +0; x != 0 with rem = 0: q = q0 + +-0 = q0 (q0 != 0). Every other quotient has the
// sign of x already (x / s rounds to a value or a zero of x's sign). So q is bit-identical to
// GroupQuantizer's, one LOP3 pair per element fewer. (NaN would lose x's sign: the caller
// takes this path only when its warp has no inf or NaN input.)
MJ_DEVICE float quotient_finite(float x, float s, float r) {
  const float q0 = x * r;
  const float rem_neg = fmaf(q0, s, -x);
  return fmaf(-rem_neg, r, q0);
}

// c[idx] for idx < N (N a power of two) as a tree of selects on idx's bits (registers only; c is
// overwritten).
template <int N>
MJ_DEVICE float select_by_index(float (&c)[N], int idx) {
#pragma unroll
  for (int half = N / 2; half >= 1; half /= 2) {
    const bool upper = (idx & half) != 0;
#pragma unroll
    for (int k = 0; k < half; ++k) c[k] = upper ? c[k + half] : c[k];
  }
  return c[0];
}

__host__ __device__ constexpr int pow2_ceil(int n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

// max(acc, |elements of v|) for the amax of a group; NaN elements are ignored (like fmaxf).
// bf16 / f16 inputs stay packed: |.| by clearing the sign bits, then one packed max per pair
// (both formats order like their f32 values). The packed accumulator starts at 0.
template <class In, int N>
MJ_DEVICE void accumulate_absmax(u32& packed, float& scalar, const Vec<N>& v) {
  if constexpr (same_type<In, Bf16>::value || same_type<In, F16>::value) {
    if constexpr (N >= 4) {
#pragma unroll
      for (int w = 0; w < Vec<N>::kWords; ++w) {
        const u32 a = v.w[w] & 0x7FFF7FFFu;
        if constexpr (same_type<In, Bf16>::value) asm("max.bf16x2 %0, %0, %1;" : "+r"(packed) : "r"(a));
        else asm("max.f16x2 %0, %0, %1;" : "+r"(packed) : "r"(a));
      }
    } else {
      scalar = fmaxf(scalar, fabsf(In::to_f32(v.w[0] & 0xFFFFu)));
    }
  } else {
    constexpr int V = N / In::kBytes;
    float f[V];
    unpack<In, V>(v, f);
#pragma unroll
    for (int k = 0; k < V; ++k) scalar = fmaxf(scalar, fabsf(f[k]));
  }
}

// The amax of the two accumulators.
template <class In>
MJ_DEVICE float finish_absmax(u32 packed, float scalar) {
  if constexpr (same_type<In, Bf16>::value || same_type<In, F16>::value) {
    float lo, hi;
    In::pair_to_f32(packed, lo, hi);
    return fmaxf(scalar, fmaxf(lo, hi));
  } else {
    return scalar;
  }
}

// ---- compile-time plan shared by store and gather ---------------------------------------------

// The Plan (kv_cache/plan.h) as constants. `Src`/`Dst`: element types moved (store: input ->
// cache; gather: cache -> output).
template <class Src, class Dst, int H, int D, bool QUANT, int G, int THREADS>
struct PlanOf {
  static constexpr Plan kP = make_plan(Src::kBytes, Dst::kBytes, H, D, QUANT, G, THREADS);
  static constexpr int kNG = kP.ng;
  static constexpr int kSegsPerToken = kP.segs_per_token;
  static constexpr int kRowElems = kP.row_elems;
  static constexpr int kVec = kP.vec;
  static constexpr int kChunks = kP.chunks;
  static constexpr int kTailChunks = kP.tail_chunks;
  static constexpr int kLanes = kP.lanes;
  static constexpr int kIters = kP.iters;
  static constexpr int kHold = kP.hold;
  static constexpr bool kTwoPass = kP.two_pass;
  static constexpr int kSegsPerThread = kP.segs_per_thread;
  static constexpr bool kTokenMajor = kP.token_major;
  static constexpr int kTeams = kP.teams;
  static constexpr int kSegsPerBlock = kP.segs_per_block;
  static constexpr int kSrcChunkBytes = kVec * Src::kBytes;
  static constexpr int kDstChunkBytes = kVec * Dst::kBytes;
  static_assert(THREADS % 32 == 0, "threads must be a multiple of 32");
  static_assert(!QUANT || (D % kVec == 0 && G % kVec == 0), "chunks must tile scale groups");

  // First element of segment j within a token's row, and its number of chunks.
  static MJ_DEVICE int seg_elem(int j) { return QUANT ? (j / kNG) * D + (j % kNG) * G : 0; }
  static MJ_DEVICE int seg_chunks(int j) { return (QUANT && j % kNG == kNG - 1) ? kTailChunks : kChunks; }
};

// The segments one thread works on: token and segment index within the token of each, and
// whether it exists (the last block may run past the tokens). Token-major plans give a thread
// consecutive segments of one token; otherwise segment i of team t is i * teams + t.
// FROM_THREAD: token-major segments from the thread index's quotient (compile-time segment offsets
// when a thread owns a whole token); the stores take it. The gathers keep the earlier division of
// the first segment index: with the quotient, gather fp8 g64 went from 48 to 40 registers and ran
// ~1% slower (H100, same-harness copy 90.0-90.1% -> 88.5-89.2% in 4 runs each), so their cubins
// stay as before.
template <class Pl, bool FROM_THREAD = true>
struct ThreadSegments {
  static constexpr int kS = Pl::kSegsPerThread;
  u64 tok[kS];
  int j[kS];
  bool live[kS];

  MJ_DEVICE ThreadSegments(long long num_tokens, int team) {
    if constexpr (Pl::kTokenMajor && !FROM_THREAD) {
      const u64 first = (static_cast<u64>(blockIdx.x) * Pl::kTeams + team) * kS;
      const u64 t = first / Pl::kSegsPerToken;
      const int j0 = static_cast<int>(first % Pl::kSegsPerToken);
#pragma unroll
      for (int i = 0; i < kS; ++i) {
        tok[i] = t;
        j[i] = j0 + i;
        live[i] = t < static_cast<u64>(num_tokens);
      }
    } else if constexpr (Pl::kTokenMajor) {
      // Thread x = block * teams + team owns segments [x * kS, x * kS + kS), which lie in one token
      // (kS divides segs_per_token): token x / (segs_per_token / kS), first segment (x % that) * kS.
      // Written with the quotient so that a thread owning a whole token (kS == segs_per_token, e.g.
      // MLA g64: 9 of 9) gets j0 = 0 at compile time: every segment offset below is then a
      // constant and the kS addresses are one base plus immediates (no 64-bit division by kS).
      constexpr int kThreadsPerToken = Pl::kSegsPerToken / kS;
      const u64 x = static_cast<u64>(blockIdx.x) * Pl::kTeams + team;
      const u64 t = x / kThreadsPerToken;
      const int j0 = static_cast<int>(x % kThreadsPerToken) * kS;
#pragma unroll
      for (int i = 0; i < kS; ++i) {
        tok[i] = t;
        j[i] = j0 + i;
        live[i] = t < static_cast<u64>(num_tokens);
      }
    } else {
      const u64 total = static_cast<u64>(num_tokens) * Pl::kSegsPerToken;
      const u64 seg0 = static_cast<u64>(blockIdx.x) * Pl::kSegsPerBlock + team;
#pragma unroll
      for (int i = 0; i < kS; ++i) {
        const u64 seg = seg0 + static_cast<u64>(i) * Pl::kTeams;
        tok[i] = seg / Pl::kSegsPerToken;
        j[i] = static_cast<int>(seg % Pl::kSegsPerToken);
        live[i] = seg < total;
      }
    }
  }
  // Segments sharing one token lookup: all of them when token-major, else each its own.
  static constexpr int kLookups = Pl::kTokenMajor ? 1 : kS;
};

// ---- kv_cache_store ------------------------------------------------------------------------------

template <class In, class Cache, int H, int D, int P, int L, int KV, int G, bool UE8M0, int THREADS,
          bool PAGE_SCALES = false>
struct KvStore {
  static constexpr bool kQuant = same_type<Cache, E4m3>::value;
  using Pl = PlanOf<In, Cache, H, D, kQuant, G, THREADS>;
  using Rows = CacheRows<P, L, KV, PAGE_SCALES>;
  using SrcVec = Vec<Pl::kSrcChunkBytes>;
  static constexpr int kS = Pl::kSegsPerThread;
  static constexpr int kVec = Pl::kVec;

  // fp8 with fp32 scales from bf16, each lane holding one chunk of every group it works on (one
  // batch, no second pass) of ONE token (token-major): MLA 576 g64 (9 groups x 8 lanes x 16 B),
  // MHA 8 x 128 g128 (8 x 16 x 16 B). quantize_fast takes these when the warp's inputs are all
  // finite: the same bytes and scales as the general path with about half the instructions per
  // element and no branch between the groups (see there).
  static constexpr bool kFastFp32 = kQuant && !UE8M0 && same_type<In, Bf16>::value && Pl::kTokenMajor &&
                                    Pl::kIters == 1 && Pl::kHold == 1 && !Pl::kTwoPass && kVec >= 2;

  // The general path's amax -> scale -> quantize for kFastFp32 plans, restructured. When any lane
  // of the warp holds an inf or NaN input (vote), the warp takes the reference formulation instead
  // (quantize_nonfinite), which defines what those produce. Otherwise:
  //  - amax: per group, the lane's |x| max stays a bf16x2 pair (3 packed max for 8 elements); two
  //    groups' pairs fold into one word (lo halves | hi halves, 2 PRMT + 1 max), and the team
  //    reduction shuffles words: ceil(kS / 2) x log2(kLanes) shuffles (MLA g64: 15, was 27).
  //    Exact and NaN-free here, so equal to the general path's amax.
  //  - scales: group_scale_finite and rcp_rn_normal, no branch: the kS chains interleave.
  //  - scale stores: lane l writes group l (and l + kLanes, ...): ceil(kS / kLanes) coalesced
  //    stores instead of kS one-lane stores (MLA g64: 2 instead of 9).
  //  - quantize: quotient_finite, the unpack + 3 FP ops per element (was + 2 LOP3).
  // Same scales and fp8 bytes as the general path for every input.
  template <class Seg, class Buf>
  static MJ_DEVICE void quantize_fast(const KvCacheStoreArgs& a, const Seg& sg, const Buf& buf, const bool (&ok)[kS],
                                      const u64 (&row)[kS], int lane) {
    constexpr int kWords = Pl::kSrcChunkBytes / 4;
    u32 m[kS];
#pragma unroll
    for (int i = 0; i < kS; ++i) {
      m[i] = buf[i][0].w[0] & 0x7FFF7FFFu;  // cleared (absent) chunks are 0
#pragma unroll
      for (int w = 1; w < kWords; ++w) m[i] = max_nan_bf16x2(m[i], buf[i][0].w[w] & 0x7FFF7FFFu);
    }
    // An inf or NaN anywhere in the warp: a half of the NaN-propagating max has an all-ones
    // exponent (0x7F80..0x7FFF; the sign bits are clear).
    u32 all = m[0];
#pragma unroll
    for (int i = 1; i < kS; ++i) all = max_nan_bf16x2(all, m[i]);
    const bool nonfinite = (((all & 0x7F807F80u) + 0x00800080u) & 0x80008000u) != 0u;
    if (__any_sync(0xffffffffu, nonfinite)) {
      quantize_nonfinite(a, sg, buf, ok, row, lane);
      return;
    }

    constexpr int kPairs = kS / 2;
    constexpr int kPw = kPairs + kS % 2;
    u32 pw[kPw];  // word q: group 2q in the low half, 2q + 1 in the high; an odd last group keeps its pair
#pragma unroll
    for (int q = 0; q < kPairs; ++q)
      pw[q] = max_bf16x2(__byte_perm(m[2 * q], m[2 * q + 1], 0x5410), __byte_perm(m[2 * q], m[2 * q + 1], 0x7632));
    if constexpr (kS % 2 == 1) pw[kPairs] = m[kS - 1];
#pragma unroll
    for (int o = Pl::kLanes / 2; o >= 1; o /= 2)
#pragma unroll
      for (int q = 0; q < kPw; ++q) pw[q] = max_bf16x2(pw[q], __shfl_xor_sync(0xffffffffu, pw[q], o));

    float s[kS], r[kS];
#pragma unroll
    for (int i = 0; i < kS; ++i) {
      float lo, hi;
      Bf16::pair_to_f32(pw[i / 2], lo, hi);
      const float amax = i / 2 < kPairs ? (i % 2 == 0 ? lo : hi) : fmaxf(lo, hi);
      s[i] = group_scale_finite(amax);
      r[i] = rcp_rn_normal(s[i]);
    }
    store_scales(a, sg, s, ok, row, lane);
    store_quantized(a, sg, buf, ok, row, lane, [&](int i, float x) { return quotient_finite(x, s[i], r[i]); });
  }

  // Quantizes each live segment's chunk of this lane (q(i, x): element x of segment i) and stores
  // it into the cache row.
  template <class Seg, class Buf, class Q>
  static MJ_DEVICE void store_quantized(const KvCacheStoreArgs& a, const Seg& sg, const Buf& buf,
                                        const bool (&ok)[kS], const u64 (&row)[kS], int lane, Q q) {
    char* blocks = static_cast<char*>(a.blocks);
#pragma unroll
    for (int i = 0; i < kS; ++i) {
      if (ok[i] && sg.live[i] && lane < Pl::seg_chunks(sg.j[i])) {
        float f[kVec];
        unpack<In, kVec>(buf[i][0], f);
#pragma unroll
        for (int k = 0; k < kVec; ++k) f[k] = q(i, f[k]);
        store(blocks + (row[i] * Pl::kRowElems + Pl::seg_elem(sg.j[i]) + static_cast<u64>(lane) * kVec) * Cache::kBytes,
              pack<Cache, kVec>(f));
      }
    }
  }

  // Scales of one token row are consecutive floats: lane l of the team stores group i0 + l.
  template <class Seg>
  static MJ_DEVICE void store_scales(const KvCacheStoreArgs& a, const Seg& sg, const float (&s)[kS],
                                     const bool (&ok)[kS], const u64 (&row)[kS], int lane) {
#pragma unroll
    for (int i0 = 0; i0 < kS; i0 += Pl::kLanes) {
      // Only lanes < kS - i0 store: select among that many candidates (a power of two above).
      constexpr int kCand = pow2_ceil(Pl::kLanes < kS ? Pl::kLanes : kS);
      float c[kCand];
#pragma unroll
      for (int k = 0; k < kCand; ++k) c[k] = i0 + k < kS ? s[i0 + k] : 0.0f;
      const float v = kS - i0 == 1 ? s[i0] : select_by_index<kCand>(c, lane & (kCand - 1));
      if (ok[0] && i0 + lane < kS) a.scales[Rows::template scale_index<H * Pl::kNG>(row[0]) + sg.j[0] + i0 + lane] = v;
    }
  }

  // The general path's formulation for a warp with an inf or NaN input (rare): amax as an f32
  // fmaxf over |x| (the same value as the general path's packed max: NaN ignored, 0 for a group
  // of NaN), team_max, group_scale and GroupQuantizer (inf scales, x's sign on NaN quotients).
  // It reads only buf: nothing computed before the vote is reused here, so that the fast path's
  // intermediates need not stay live across the branch (registers).
  template <class Seg, class Buf>
  static MJ_DEVICE void quantize_nonfinite(const KvCacheStoreArgs& a, const Seg& sg, const Buf& buf,
                                           const bool (&ok)[kS], const u64 (&row)[kS], int lane) {
    float s[kS];
    GroupQuantizer<false> quant[kS];
#pragma unroll
    for (int i = 0; i < kS; ++i) {
      float f[kVec];
      unpack<In, kVec>(buf[i][0], f);
      float amax = 0.0f;
#pragma unroll
      for (int k = 0; k < kVec; ++k) amax = fmaxf(amax, fabsf(f[k]));
      s[i] = group_scale<false>(team_max<Pl::kLanes>(amax));
      quant[i] = GroupQuantizer<false>::make(s[i]);
    }
    store_scales(a, sg, s, ok, row, lane);
    store_quantized(a, sg, buf, ok, row, lane, [&](int i, float x) { return quant[i](x); });
  }

  static MJ_DEVICE void run(const KvCacheStoreArgs& a) {
    const int lane = static_cast<int>(threadIdx.x) % Pl::kLanes;
    const int team = static_cast<int>(threadIdx.x) / Pl::kLanes;
    const ThreadSegments<Pl> sg(a.num_tokens, team);
    const char* x = static_cast<const char*>(a.x);
    auto src_chunk = [&](int i, int c) {
      return x + (sg.tok[i] * Pl::kRowElems + Pl::seg_elem(sg.j[i]) + static_cast<u64>(c) * kVec) * In::kBytes;
    };
    auto chunk_exists = [&](int i, int it, int c) {
      return sg.live[i] && it < Pl::kIters && c < Pl::seg_chunks(sg.j[i]);
    };

    SrcVec buf[kS][Pl::kHold];
    auto load_batch = [&](int it0) {
#pragma unroll
      for (int i = 0; i < kS; ++i)
#pragma unroll
        for (int h = 0; h < Pl::kHold; ++h) {
          const int c = (it0 + h) * Pl::kLanes + lane;
          if (chunk_exists(i, it0 + h, c)) buf[i][h] = load_stream<Pl::kSrcChunkBytes>(src_chunk(i, c));
          else clear(buf[i][h]);
        }
    };

    // Issue the first batch of input loads, then look up the destination rows (the loads do not
    // depend on the lookups, so their latencies overlap).
    load_batch(0);
    bool ok[kS];
    u64 row[kS];
#pragma unroll
    for (int l = 0; l < ThreadSegments<Pl>::kLookups; ++l) {
      ok[l] = false;
      row[l] = 0;
      if (sg.live[l]) {
        const int b = find_sequence(a.input_row_offsets, a.batch, sg.tok[l]);
        if (b >= 0) {
          const u64 pos = static_cast<u64>(load_ro(a.cache_lengths + b)) + (sg.tok[l] - load_ro(a.input_row_offsets + b));
          u32 blk, off;
          if (Rows::resolve(a.lookup_table, a.pages_per_seq, a.num_blocks, b, pos, blk, off)) {
            ok[l] = true;
            row[l] = Rows::row(blk, a.kv_idx, a.layer_idx, off);
          }
        }
        // A token is counted once: by lane 0 of the team owning its first segment.
        if (!ok[l] && sg.j[l] == 0 && lane == 0 && a.dropped != nullptr) atomicAdd(a.dropped, 1u);
      }
    }
#pragma unroll
    for (int i = ThreadSegments<Pl>::kLookups; i < kS; ++i) {
      ok[i] = ok[0];
      row[i] = row[0];
    }
    char* blocks = static_cast<char*>(a.blocks);
    auto dst_chunk = [&](int i, int c) {
      return blocks + (row[i] * Pl::kRowElems + Pl::seg_elem(sg.j[i]) + static_cast<u64>(c) * kVec) * Cache::kBytes;
    };

    if constexpr (!kQuant) {
      // Plain cast, streamed in batches of kHold chunks per lane.
      auto store_batch = [&](int it0) {
#pragma unroll
        for (int i = 0; i < kS; ++i)
#pragma unroll
          for (int h = 0; h < Pl::kHold; ++h) {
            const int c = (it0 + h) * Pl::kLanes + lane;
            if (ok[i] && chunk_exists(i, it0 + h, c)) {
              if constexpr (same_type<In, Cache>::value) {
                store(dst_chunk(i, c), buf[i][h]);
              } else {
                float f[kVec];
                unpack<In, kVec>(buf[i][h], f);
                store(dst_chunk(i, c), pack<Cache, kVec>(f));
              }
            }
          }
      };
      store_batch(0);
#pragma unroll 1
      for (int it0 = Pl::kHold; it0 < Pl::kIters; it0 += Pl::kHold) {
        load_batch(it0);
        store_batch(it0);
      }
    } else if constexpr (kFastFp32) {
      quantize_fast(a, sg, buf, ok, row, lane);
    } else {
      // fp8: amax over the whole group (team reduction), then scale and quantize.
      u32 packed[kS];
      float amax[kS];
#pragma unroll
      for (int i = 0; i < kS; ++i) {
        packed[i] = 0u;
        amax[i] = 0.0f;
      }
      auto batch_amax = [&] {
#pragma unroll
        for (int i = 0; i < kS; ++i)
#pragma unroll
          for (int h = 0; h < Pl::kHold; ++h) accumulate_absmax<In>(packed[i], amax[i], buf[i][h]);  // cleared chunks are 0
      };
      batch_amax();
      if constexpr (Pl::kTwoPass) {
#pragma unroll 1
        for (int it0 = Pl::kHold; it0 < Pl::kIters; it0 += Pl::kHold) {
          load_batch(it0);
          batch_amax();
        }
      }
      GroupQuantizer<UE8M0> quant[kS];
#pragma unroll
      for (int i = 0; i < kS; ++i) {
        const float s = group_scale<UE8M0>(team_max<Pl::kLanes>(finish_absmax<In>(packed[i], amax[i])));
        quant[i] = GroupQuantizer<UE8M0>::make(s);
        // Spread the scale stores over the team's lanes.
        if (ok[i] && lane == i % Pl::kLanes) a.scales[Rows::template scale_index<H * Pl::kNG>(row[i]) + sg.j[i]] = s;
      }
      auto quantize_batch = [&](int it0) {
#pragma unroll
        for (int i = 0; i < kS; ++i)
#pragma unroll
          for (int h = 0; h < Pl::kHold; ++h) {
            const int c = (it0 + h) * Pl::kLanes + lane;
            if (ok[i] && chunk_exists(i, it0 + h, c)) {
              float f[kVec];
              unpack<In, kVec>(buf[i][h], f);
#pragma unroll
              for (int k = 0; k < kVec; ++k) f[k] = quant[i](f[k]);
              store(dst_chunk(i, c), pack<Cache, kVec>(f));
            }
          }
      };
      if constexpr (Pl::kTwoPass) {
#pragma unroll 1
        for (int it0 = 0; it0 < Pl::kIters; it0 += Pl::kHold) {
          load_batch(it0);
          quantize_batch(it0);
        }
      } else {
        quantize_batch(0);
      }
    }
  }
};

// ---- kv_cache_gather -----------------------------------------------------------------------------

template <class Cache, class Out, int H, int D, int P, int L, int KV, int G, int THREADS, bool PAGE_SCALES = false>
struct KvGather {
  static constexpr bool kQuant = same_type<Cache, E4m3>::value;
  using Pl = PlanOf<Cache, Out, H, D, kQuant, G, THREADS>;
  using Rows = CacheRows<P, L, KV, PAGE_SCALES>;
  static constexpr int kS = Pl::kSegsPerThread;
  static constexpr int kVec = Pl::kVec;

  static MJ_DEVICE void run(const KvCacheGatherArgs& a) {
    const int lane = static_cast<int>(threadIdx.x) % Pl::kLanes;
    const int team = static_cast<int>(threadIdx.x) / Pl::kLanes;
    const ThreadSegments<Pl, false> sg(a.num_tokens, team);

    u64 row[kS];
    bool ok[kS];
#pragma unroll
    for (int l = 0; l < ThreadSegments<Pl>::kLookups; ++l) {
      ok[l] = false;
      row[l] = 0;
      if (sg.live[l]) {
        const u32 b = load_ro(a.batch_ids + sg.tok[l]);
        u32 blk, off;
        if (b < static_cast<u32>(a.batch) &&
            Rows::resolve(a.lookup_table, a.pages_per_seq, a.num_blocks, static_cast<int>(b),
                          load_ro(a.positions + sg.tok[l]), blk, off)) {
          ok[l] = true;
          row[l] = Rows::row(blk, a.kv_idx, a.layer_idx, off);
        }
        if (!ok[l] && sg.j[l] == 0 && lane == 0 && a.dropped != nullptr) atomicAdd(a.dropped, 1u);
      }
    }
#pragma unroll
    for (int i = ThreadSegments<Pl>::kLookups; i < kS; ++i) {
      ok[i] = ok[0];
      row[i] = row[0];
    }
    float scale[kS];
#pragma unroll
    for (int i = 0; i < kS; ++i) {
      scale[i] = 1.0f;
      if constexpr (kQuant)
        if (ok[i]) scale[i] = load_ro(a.scales + Rows::template scale_index<H * Pl::kNG>(row[i]) + sg.j[i]);
    }
    const char* blocks = static_cast<const char*>(a.blocks);
    char* y = static_cast<char*>(a.y);
    auto src_chunk = [&](int i, int c) {
      return blocks + (row[i] * Pl::kRowElems + Pl::seg_elem(sg.j[i]) + static_cast<u64>(c) * kVec) * Cache::kBytes;
    };
    auto dst_chunk = [&](int i, int c) {
      return y + (sg.tok[i] * Pl::kRowElems + Pl::seg_elem(sg.j[i]) + static_cast<u64>(c) * kVec) * Out::kBytes;
    };
    auto chunk_exists = [&](int i, int it, int c) {
      return sg.live[i] && it < Pl::kIters && c < Pl::seg_chunks(sg.j[i]);
    };

#pragma unroll 1
    for (int it0 = 0; it0 < Pl::kIters; it0 += Pl::kHold) {
      Vec<Pl::kSrcChunkBytes> buf[kS][Pl::kHold];
#pragma unroll
      for (int i = 0; i < kS; ++i)
#pragma unroll
        for (int h = 0; h < Pl::kHold; ++h) {
          const int c = (it0 + h) * Pl::kLanes + lane;
          if (ok[i] && chunk_exists(i, it0 + h, c)) buf[i][h] = load_stream<Pl::kSrcChunkBytes>(src_chunk(i, c));
          else clear(buf[i][h]);
        }
#pragma unroll
      for (int i = 0; i < kS; ++i)
#pragma unroll
        for (int h = 0; h < Pl::kHold; ++h) {
          const int c = (it0 + h) * Pl::kLanes + lane;
          if (!chunk_exists(i, it0 + h, c)) continue;
          if (!ok[i]) {
            store(dst_chunk(i, c), nan_vec<Out, kVec>());  // poison: the row does not exist
          } else if constexpr (!kQuant && same_type<Cache, Out>::value) {
            store(dst_chunk(i, c), buf[i][h]);
          } else {
            float f[kVec];
            unpack<Cache, kVec>(buf[i][h], f);
            if constexpr (kQuant) {
#pragma unroll
              for (int k = 0; k < kVec; ++k) f[k] = f[k] * scale[i];
            }
            store(dst_chunk(i, c), pack<Out, kVec>(f));
          }
        }
    }
  }
};

// ---- layout fp8_ds_mla: FlashMLA's V3.2 fp8 latent record -----------------------------------------
//
// One 656-byte record per token (SPEC §1): bytes [0, 512) e4m3 dims 0..511 (four 128-element
// tiles), [512, 528) the four tiles' f32 scales, [528, 656) dims 512..575 as bf16. One warp per
// token: lane l owns dims [16 l, 16 l + 16) (tile l / 8, whose amax is a max over its 8 lanes) and
// lanes 0..7 own the rope dims [512 + 8 l, 512 + 8 l + 8). Every record access is one 16-byte
// vector (656 = 41 x 16), so a warp moves the 512 fp8 bytes in one instruction.

// Tile scale of the layout (FlashMLA's quantizer): s = RN(amax / 448) (IEEE f32 division), clamped
// below at 1e-4, rounded up to a power of two on the bits (2^ceil(log2 s) exactly: a power of two
// stays, anything else takes the next one; inf stays inf). Every finite result lies in [2^-13, 2^120].
MJ_DEVICE float ds_mla_tile_scale(float amax) {
  float s;
  asm("div.rn.f32 %0, %1, %2;" : "=f"(s) : "f"(amax), "f"(448.0f));
  s = fmaxf(s, 1e-4f);
  u32 b = __float_as_uint(s);
  if (b & 0x007FFFFFu) b = (b & 0xFF800000u) + 0x00800000u;
  return __uint_as_float(b);
}

template <class In, int P, int L, int THREADS>
struct KvStoreDsMla {
  static_assert(THREADS % 32 == 0, "threads must be a multiple of 32");
  using Rows = CacheRows<P, L, 1>;
  static constexpr int kPerVec = 16 / In::kBytes;  // input elements per 16-byte load
  static constexpr int kNopeLoads = 16 / kPerVec;  // a lane's 16 quantized dims
  static constexpr int kRopeLoads = 8 / kPerVec;   // a rope lane's 8 dims

  static MJ_DEVICE void run(const KvCacheStoreArgs& a) {
    const int lane = static_cast<int>(threadIdx.x) % 32;
    const u64 t = static_cast<u64>(blockIdx.x) * (THREADS / 32) + threadIdx.x / 32;
    if (t >= static_cast<u64>(a.num_tokens)) return;  // the whole warp: t is uniform in it
    const char* xr = static_cast<const char*>(a.x) + t * 576 * In::kBytes;
    Vec<16> v[kNopeLoads];
#pragma unroll
    for (int k = 0; k < kNopeLoads; ++k) v[k] = load_stream<16>(xr + (lane * 16 + k * kPerVec) * In::kBytes);
    Vec<16> rope[kRopeLoads];
#pragma unroll
    for (int k = 0; k < kRopeLoads; ++k) {
      if (lane < 8) rope[k] = load_stream<16>(xr + (512 + lane * 8 + k * kPerVec) * In::kBytes);
      else clear(rope[k]);
    }

    // The token's record (every lane computes the same lookup: the loads are broadcasts).
    bool ok = false;
    u64 row = 0;
    const int b = find_sequence(a.input_row_offsets, a.batch, t);
    if (b >= 0) {
      const u64 pos = static_cast<u64>(load_ro(a.cache_lengths + b)) + (t - load_ro(a.input_row_offsets + b));
      u32 blk, off;
      if (Rows::resolve(a.lookup_table, a.pages_per_seq, a.num_blocks, b, pos, blk, off)) {
        ok = true;
        row = Rows::row(blk, 0, a.layer_idx, off);
      }
    }
    if (!ok && lane == 0 && a.dropped != nullptr) atomicAdd(a.dropped, 1u);

    // amax of the tile (NaN ignored, like the split layout's store), its scale, the quotients.
    float f[16];
#pragma unroll
    for (int k = 0; k < kNopeLoads; ++k) {
      float g[kPerVec];
      unpack<In, kPerVec>(v[k], g);
#pragma unroll
      for (int e = 0; e < kPerVec; ++e) f[k * kPerVec + e] = g[e];
    }
    float amax = 0.0f;
#pragma unroll
    for (int e = 0; e < 16; ++e) amax = fmaxf(amax, fabsf(f[e]));
    const float s = ds_mla_tile_scale(team_max<8>(amax));
    const GroupQuantizer<true> quant = GroupQuantizer<true>::make(s);  // x / s exactly as x * 2^-k
#pragma unroll
    for (int e = 0; e < 16; ++e) f[e] = quant(f[e]);
    Vec<16> sc;
#pragma unroll
    for (int i = 0; i < 4; ++i) sc.w[i] = __float_as_uint(__shfl_sync(0xffffffffu, s, 8 * i));
    if (!ok) return;

    char* rec = static_cast<char*>(a.blocks) + row * kDsMlaRecordBytes;
    store(rec + lane * 16, pack<E4m3, 16>(f));
    if (lane == 0) store(rec + kDsMlaScalesOffset, sc);
    if (lane < 8) {
      if constexpr (same_type<In, Bf16>::value) {
        store(rec + kDsMlaRopeOffset + lane * 16, rope[0]);  // verbatim
      } else {
        float r[8];
#pragma unroll
        for (int k = 0; k < kRopeLoads; ++k) {
          float g[kPerVec];
          unpack<In, kPerVec>(rope[k], g);
#pragma unroll
          for (int e = 0; e < kPerVec; ++e) r[k * kPerVec + e] = g[e];
        }
        store(rec + kDsMlaRopeOffset + lane * 16, pack<Bf16, 8>(r));
      }
    }
  }
};

template <class Out, int P, int L, int THREADS>
struct KvGatherDsMla {
  static_assert(THREADS % 32 == 0, "threads must be a multiple of 32");
  using Rows = CacheRows<P, L, 1>;
  static constexpr int kPerVec = 16 / Out::kBytes;  // output elements per 16-byte store

  static MJ_DEVICE void run(const KvCacheGatherArgs& a) {
    const int lane = static_cast<int>(threadIdx.x) % 32;
    const u64 t = static_cast<u64>(blockIdx.x) * (THREADS / 32) + threadIdx.x / 32;
    if (t >= static_cast<u64>(a.num_tokens)) return;
    bool ok = false;
    u64 row = 0;
    const u32 b = load_ro(a.batch_ids + t);
    u32 blk, off;
    if (b < static_cast<u32>(a.batch) &&
        Rows::resolve(a.lookup_table, a.pages_per_seq, a.num_blocks, static_cast<int>(b), load_ro(a.positions + t),
                      blk, off)) {
      ok = true;
      row = Rows::row(blk, 0, a.layer_idx, off);
    }
    char* yr = static_cast<char*>(a.y) + t * 576 * Out::kBytes;
    if (!ok) {  // poison: the row does not exist
      if (lane == 0 && a.dropped != nullptr) atomicAdd(a.dropped, 1u);
#pragma unroll
      for (int k = 0; k < 16 / kPerVec; ++k) store(yr + (lane * 16 + k * kPerVec) * Out::kBytes, nan_vec<Out, kPerVec>());
      if (lane < 8)
#pragma unroll
        for (int k = 0; k < 8 / kPerVec; ++k)
          store(yr + (512 + lane * 8 + k * kPerVec) * Out::kBytes, nan_vec<Out, kPerVec>());
      return;
    }
    const char* rec = static_cast<const char*>(a.blocks) + row * kDsMlaRecordBytes;
    const Vec<16> q = load_stream<16>(rec + lane * 16);
    const float s = load_ro(reinterpret_cast<const float*>(rec + kDsMlaScalesOffset) + lane / 8);
    Vec<16> rope;
    if (lane < 8) rope = load_stream<16>(rec + kDsMlaRopeOffset + lane * 16);
    else clear(rope);
    float f[16];
    unpack<E4m3, 16>(q, f);
#pragma unroll
    for (int k = 0; k < 16 / kPerVec; ++k) {
      float g[kPerVec];
#pragma unroll
      for (int e = 0; e < kPerVec; ++e) g[e] = f[k * kPerVec + e] * s;  // one f32 product, one rounding
      store(yr + (lane * 16 + k * kPerVec) * Out::kBytes, pack<Out, kPerVec>(g));
    }
    if (lane < 8) {
      if constexpr (same_type<Out, Bf16>::value) {
        store(yr + (512 + lane * 8) * Out::kBytes, rope);
      } else {
        float r[8];
        unpack<Bf16, 8>(rope, r);
#pragma unroll
        for (int k = 0; k < 8 / kPerVec; ++k) {
          float g[kPerVec];
#pragma unroll
          for (int e = 0; e < kPerVec; ++e) g[e] = r[k * kPerVec + e];
          store(yr + (512 + lane * 8 + k * kPerVec) * Out::kBytes, pack<Out, kPerVec>(g));
        }
      }
    }
  }
};

// ---- sparse_index_remap --------------------------------------------------------------------------

// One thread block per token row of k logical positions.
template <int P, int THREADS>
struct SparseIndexRemap {
  static MJ_DEVICE void run(const SparseIndexRemapArgs& a) {
    const u64 t = blockIdx.x;
    if (t >= static_cast<u64>(a.num_tokens)) return;
    const int b = find_sequence(a.input_row_offsets, a.batch, t);
    const unsigned* lut = a.lookup_table + static_cast<u64>(b < 0 ? 0 : b) * a.pages_per_seq;
    const u32 pps = static_cast<u32>(a.pages_per_seq);
    const long long num_blocks = a.num_blocks;
    // -1 for a negative index, a token outside every sequence, a page past the table or a
    // block >= num_blocks; else block * page_size + offset (host checks it fits in i32).
    auto remap = [&](int idx) -> int {
      if (b < 0 || idx < 0) return -1;
      const u32 page = static_cast<u32>(idx) / P;
      if (page >= pps) return -1;
      const u32 blk = load_ro(lut + page);
      if (static_cast<long long>(blk) >= num_blocks) return -1;
      return static_cast<int>(blk * P + static_cast<u32>(idx) % P);
    };
    const int* in = a.indices + t * static_cast<u64>(a.k);
    int* out = a.out + t * static_cast<u64>(a.k);
    const bool vec4 = a.k % 4 == 0 && ((reinterpret_cast<unsigned long long>(a.indices) |
                                         reinterpret_cast<unsigned long long>(a.out)) & 15ull) == 0;
    if (vec4) {
      const long long n4 = a.k / 4;
#pragma unroll 2
      for (long long q = threadIdx.x; q < n4; q += THREADS) {
        Vec<16> v = load_stream<16>(in + q * 4);
#pragma unroll
        for (int e = 0; e < 4; ++e) v.w[e] = static_cast<u32>(remap(static_cast<int>(v.w[e])));
        store(out + q * 4, v);
      }
    } else {
      for (long long q = threadIdx.x; q < a.k; q += THREADS) {
        Vec<4> v = load_stream<4>(in + q);
        v.w[0] = static_cast<u32>(remap(static_cast<int>(v.w[0])));
        store(out + q, v);
      }
    }
  }
};

}  // namespace kv
}  // namespace mj

#pragma once
// Hopper (sm_90a) warpgroup matrix multiply: shared-memory matrix descriptors and the few
// bf16 -> f32 wgmma shapes the sparse prefill uses and the fp8 shape of the indexer. Inline PTX only (NVRTC-clean).
//
// A warpgroup is 4 consecutive warps starting at a warp index divisible by 4. Accumulator
// fragment of an m64nN tile (f32, N/2 registers per thread): warp w of the warpgroup owns rows
// 16w..16w+15; with lane = 4 * gid + tig, register 4g + {0,1} holds row 16w + gid, columns
// 8g + 2 tig + {0,1}, and register 4g + {2,3} holds row 16w + gid + 8, the same columns. The
// register A fragment of an m64nNk16 wgmma (4 x bf16x2 per thread) has the same shape as the
// accumulator of a 64x16 slice, so packing accumulator pairs (2i, 2i+1) into word i turns a
// 64x64 score tile into the A operand of four k16 steps with no data movement.
//
// Ordering rules (PTX ISA "asynchronous warpgroup level matrix multiply"): wgmma_fence() before
// the first wgmma that reads registers written by ordinary instructions; wgmma_commit() closes a
// group; wgmma_wait<N>() blocks until at most N groups are pending. Registers used by an
// in-flight wgmma (accumulators, register A) must not be touched until the wait that covers it.
#include "common/types.cuh"

namespace mj {
namespace sm90 {

// ---- shared memory matrix descriptors (128-byte swizzle) ----
// Layout assumed (the "SW128" canonical layout): 1024-byte atoms of 8 rows x 128 bytes, the 16-byte
// chunk c of row r stored at chunk c ^ (r % 8); atoms are 1024-byte aligned (the swizzle is applied
// to absolute shared addresses).
//  - K-major operand (K contiguous, 64 bf16 of K per 128-byte row): consecutive 8-row groups of
//    M/N at stride `sbo` bytes; a k16 step inside the 128-byte row is +32 bytes on the start address.
//  - MN-major operand (M/N contiguous, 64 bf16 of N per row, rows indexed by K): 8-row groups of K
//    at stride `sbo`, consecutive 64-wide N blocks at stride `lbo`.
MJ_DEVICE u64 smem_desc_sw128(u32 smem_addr, u32 lbo_bytes, u32 sbo_bytes) {
  return static_cast<u64>((smem_addr & 0x3FFFFu) >> 4) | (static_cast<u64>((lbo_bytes >> 4) & 0x3FFFu) << 16) |
         (static_cast<u64>((sbo_bytes >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}
// 64-byte swizzle ("SW64"): 512-byte atoms of 8 rows x 64 bytes, chunk c of row r at c ^ ((r / 2) % 4),
// atoms 512-byte aligned. Used K-major only (fp8: 64 e4m3 of K per row; a k32 step is +32 bytes).
MJ_DEVICE u64 smem_desc_sw64(u32 smem_addr, u32 lbo_bytes, u32 sbo_bytes) {
  return static_cast<u64>((smem_addr & 0x3FFFFu) >> 4) | (static_cast<u64>((lbo_bytes >> 4) & 0x3FFFu) << 16) |
         (static_cast<u64>((sbo_bytes >> 4) & 0x3FFFu) << 32) | (2ull << 62);
}
// Advances a descriptor's start address by `bytes` (multiple of 16, staying inside shared memory).
MJ_DEVICE u64 desc_advance(u64 desc, u32 bytes) { return desc + (bytes >> 4); }

// ---- synchronisation ----
MJ_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
MJ_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
MJ_DEVICE void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins registers at this program point so the compiler neither reads nor rewrites them across an
// asynchronous wgmma (the compiler does not know the hardware is still using them).
template <int N>
MJ_DEVICE void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
MJ_DEVICE void fence_regs(u32 (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// ---- accumulator operand lists ----
// The "{%0, ..., %N-1}" register list and the matching "+f"(d[i]) outputs of an m64nN wgmma with
// 32, 64 or 128 f32 accumulators (N = 64, 128, 256), written once for every shape below. Each
// longer list extends the shorter one, so inputs after it start at %32, %64 or %128.
#define MJ_WGMMA_D32_REGS \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define MJ_WGMMA_D64_REGS MJ_WGMMA_D32_REGS ", " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define MJ_WGMMA_D128_REGS MJ_WGMMA_D64_REGS ", " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define MJ_WGMMA_D32_OUTS \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define MJ_WGMMA_D64_OUTS MJ_WGMMA_D32_OUTS, \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define MJ_WGMMA_D128_OUTS MJ_WGMMA_D64_OUTS, \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// ---- bf16 x bf16 (or, with F16 = true, f16 x f16) -> f32 shapes ----
// D[64x64] (+)= A[64x16] * B[16x64]; A and B K-major in shared memory (descriptors).
// `accumulate` = 0 overwrites D (scale-d = false).
#define MJ_WGMMA_M64N64K16_SS_KK(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {" MJ_WGMMA_D32_REGS "}, %32, %33, p, 1, 1, 0, 0;\n}\n" \
               : MJ_WGMMA_D32_OUTS \
               : "l"(desc_a), "l"(desc_b), "r"(accumulate));
template <bool F16 = false>
MJ_DEVICE void wgmma_m64n64k16_ss_kk(float (&d)[32], u64 desc_a, u64 desc_b, u32 accumulate) {
  if constexpr (F16) {
    MJ_WGMMA_M64N64K16_SS_KK("f16");
  } else {
    MJ_WGMMA_M64N64K16_SS_KK("bf16");
  }
}

// D[64x256] (+)= A[64x16] * B[16x256]; A in registers (the bf16x2 fragment of a 64x16 slice),
// B N-major ("MN-major", transposed) in shared memory.
#define MJ_WGMMA_M64N256K16_RS_MN(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " {" MJ_WGMMA_D128_REGS "}, " \
               "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n" \
               : MJ_WGMMA_D128_OUTS \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
template <bool F16 = false>
MJ_DEVICE void wgmma_m64n256k16_rs_mn(float (&d)[128], const u32 (&a)[4], u64 desc_b, u32 accumulate) {
  if constexpr (F16) {
    MJ_WGMMA_M64N256K16_RS_MN("f16");
  } else {
    MJ_WGMMA_M64N256K16_RS_MN("bf16");
  }
}

// D[64x256] (+)= A[64x16] * B[16x256]; A K-major, B N-major, both in shared memory.
#define MJ_WGMMA_M64N256K16_SS_KMN(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " {" MJ_WGMMA_D128_REGS "}, " \
               "%128, %129, p, 1, 1, 0, 1;\n}\n" \
               : MJ_WGMMA_D128_OUTS \
               : "l"(desc_a), "l"(desc_b), "r"(accumulate));
template <bool F16 = false>
MJ_DEVICE void wgmma_m64n256k16_ss_kmn(float (&d)[128], u64 desc_a, u64 desc_b, u32 accumulate) {
  if constexpr (F16) {
    MJ_WGMMA_M64N256K16_SS_KMN("f16");
  } else {
    MJ_WGMMA_M64N256K16_SS_KMN("bf16");
  }
}

// ---- fp8 e4m3 x e4m3 -> f32 ----
// D[64 x 128] (+)= A[64 x 32] * B[128 x 32]^T, fp8 e4m3 operands from shared memory (K-major,
// 128-byte swizzle), f32 accumulators in the m64nNk32 fragment layout. `accumulate` = 0 overwrites D.
MJ_DEVICE void wgmma_m64n128k32_e4m3(float (&d)[64], u64 desc_a, u64 desc_b, u32 accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {" MJ_WGMMA_D64_REGS "}, %64, %65, p, 1, 1;\n}\n"
               : MJ_WGMMA_D64_OUTS
               : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// D[64 x 64] (+)= A[64 x 32] * B[64 x 32]^T, e4m3 operands K-major in shared memory.
MJ_DEVICE void wgmma_m64n64k32_e4m3_ss(float (&d)[32], u64 desc_a, u64 desc_b, u32 accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {" MJ_WGMMA_D32_REGS "}, %32, %33, p, 1, 1;\n}\n"
               : MJ_WGMMA_D32_OUTS
               : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
// D[64 x 256] (+)= A[64 x 32] * B[256 x 32]^T; A in registers: the e4m3 fragment of a 64 x 32 slice
// (register i: row 16 w + gid + 8 (i % 2), K columns 16 (i / 2) + 4 tig + {0..3}, byte 0 first),
// B K-major in shared memory.
MJ_DEVICE void wgmma_m64n256k32_e4m3_rs(float (&d)[128], const u32 (&a)[4], u64 desc_b, u32 accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 {" MJ_WGMMA_D128_REGS "}, "
               "{%128, %129, %130, %131}, %132, p, 1, 1;\n}\n"
               : MJ_WGMMA_D128_OUTS
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}
// D[64 x 256] (+)= A[64 x 32] * B[256 x 32]^T, both e4m3 K-major in shared memory.
MJ_DEVICE void wgmma_m64n256k32_e4m3_ss(float (&d)[128], u64 desc_a, u64 desc_b, u32 accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 {" MJ_WGMMA_D128_REGS "}, %128, %129, p, 1, 1;\n}\n"
               : MJ_WGMMA_D128_OUTS
               : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

}  // namespace sm90
}  // namespace mj

#pragma once
// Hopper (sm_90a) building blocks of the indexer's score kernel, as inline PTX so that the
// generated source needs no CUDA toolkit header: shared-memory addresses, cp.async gathers with
// zero fill, mbarrier waits/arrivals, the async-proxy fence, and the fp8 warpgroup MMA (wgmma,
// QGMMA in SASS) with its shared-memory matrix descriptor.
#include "common/types.cuh"

namespace mj {
namespace indexer_sm90 {

MJ_DEVICE u32 smem_u32(const void* p) {
  u32 r;
  asm("{\n.reg .u64 a;\ncvta.to.shared.u64 a, %1;\ncvt.u32.u64 %0, a;\n}\n" : "=r"(r) : "l"(p));
  return r;
}

// ---- cp.async: global -> shared, `src_bytes` = 0 fills the destination with zeros ----------------
MJ_DEVICE void cp_async_16(u32 dst, const void* src, u32 src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
MJ_DEVICE void cp_async_4(u32 dst, const void* src, u32 src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
MJ_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
MJ_DEVICE void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Data written through the generic proxy (cp.async, st.shared) must be fenced before the async
// proxy (wgmma) reads it.
MJ_DEVICE void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// ---- mbarrier --------------------------------------------------------------------------------------
MJ_DEVICE void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
MJ_DEVICE void mbar_arrive(u32 bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
// Blocks until the phase with parity `parity` has completed. A fresh barrier is in phase 0, so
// waiting on parity 1 returns at once (the "previous phase" counts as complete).
MJ_DEVICE void mbar_wait(u32 bar, u32 parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_AGAIN:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_AGAIN;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// ---- wgmma -------------------------------------------------------------------------------------
// Descriptor of a K-major operand tile whose rows are 128 bytes (128 fp8 values) laid out with
// the 128-byte swizzle: 16-byte chunk c of row r sits at chunk c ^ (r % 8). The tile starts on a
// 1024-byte boundary; 8-row groups are 1024 bytes apart (SBO); the leading offset is unused for
// swizzled K-major tiles. Advancing K by 32 fp8 values adds 32 bytes to the start address.
MJ_DEVICE u64 sw128_kmajor_desc(u32 smem_addr) {
  u64 d = static_cast<u64>((smem_addr & 0x3FFFFu) >> 4);
  d |= static_cast<u64>(1) << 16;
  d |= static_cast<u64>(1024 >> 4) << 32;
  d |= static_cast<u64>(1) << 62;
  return d;
}

MJ_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
MJ_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
MJ_DEVICE void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads/writes across the async MMA boundaries.
template <int N>
MJ_DEVICE void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D[64 x 128] (+)= A[64 x 32] * B[128 x 32]^T, fp8 e4m3 operands from shared memory (K-major,
// 128-byte swizzle), f32 accumulators in the m64nNk32 fragment layout. `accumulate` = 0 overwrites D.
MJ_DEVICE void wgmma_m64n128k32_e4m3(float (&d)[64], u64 desc_a, u64 desc_b, u32 accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

}  // namespace indexer_sm90
}  // namespace mj

#pragma once
// Row-gather copies for kernels that pull scattered rows (paged KV cache rows picked by an index
// list) into shared memory: cp.async (sm_80+) 16-byte copies that zero-fill instead of reading when
// the row is invalid, and 16-byte register loads for rows that are converted on the way (fp8 ->
// bf16). Both carry an L2 eviction-priority policy (rows are re-read by other CTAs) and an L2
// prefetch-size hint. Inline PTX only (NVRTC-clean).
#include "common/types.cuh"

namespace mj {
namespace sm90 {

// L2 policy: keep the lines (rows gathered by many CTAs: keys shared by many query tokens).
MJ_DEVICE u64 l2_policy_evict_last() {
  u64 p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}

// L2 policy: first to go (data read exactly once, e.g. a query tile).
MJ_DEVICE u64 l2_policy_evict_first() {
  u64 p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}

// Copies 16 bytes global -> shared when `valid`, else writes 16 zero bytes and reads nothing
// (src-size 0). `src` must still be a valid global address (any readable one): it is not read.
MJ_DEVICE void cp_async_16_zfill(u32 dst, const void* src, bool valid, u64 policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16u : 0u), "l"(policy)
               : "memory");
}
MJ_DEVICE void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// 16-byte read-only global load (no L1 allocation) with an L2 policy from `src + OFFSET` (16-aligned).
// Volatile: a prefetch ring keeps its loads where they were written. OFFSET is an immediate, so
// per-column offsets cost no registers.
template <int OFFSET>
MJ_DEVICE void ldg128_policy(const void* src, u64 policy, u32& a, u32& b, u32& c, u32& d) {
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4+%6], %5;\n"
               : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
               : "l"(src), "l"(policy), "n"(OFFSET));
}

// 4-byte read-only global load kept in program order (volatile), so a prefetch ring of such loads is
// not hoisted by the compiler into one register-hungry block.
MJ_DEVICE float ldg_f32_ordered(const float* src) {
  float v;
  asm volatile("ld.global.nc.f32 %0, [%1];\n" : "=f"(v) : "l"(src));
  return v;
}

}  // namespace sm90
}  // namespace mj

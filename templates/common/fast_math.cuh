#pragma once
// Fast f32 math of the attention kernels: the hardware's approximate exp2 / log2 (MUFU, flush-to-zero;
// relative error ~2^-22, ample for a softmax kept in the exp2 domain) and the infinities as bit
// patterns (no toolkit header in generated code).
#include "common/types.cuh"

namespace mj {

MJ_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
MJ_DEVICE float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
MJ_DEVICE float neg_inf() { return __uint_as_float(0xFF800000u); }
MJ_DEVICE float pos_inf() { return __uint_as_float(0x7F800000u); }

}  // namespace mj

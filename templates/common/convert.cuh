#pragma once
// Element conversions: bf16, f16 and OCP fp8 e4m3 (e4m3fn: max 448, no inf, NaN = 0x7F/0xFF).
// Hardware conversions where the target has them (cvt ... e4m3x2 needs sm_89), exact software
// versions elsewhere. All roundings are round-to-nearest-even; fp8 encodes saturate to +-448.
#include "common/types.cuh"

namespace mj {

// ---- bf16 (stored as u16 bits) ----
MJ_DEVICE float bf16_to_f32(u16 h) { return __uint_as_float(static_cast<u32>(h) << 16); }
MJ_DEVICE u16 f32_to_bf16(float f) {
  u16 r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
}
// Two floats to packed bf16x2: `lo` in the low half.
MJ_DEVICE u32 pack_bf16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// ---- f16 (stored as u16 bits) ----
MJ_DEVICE float f16_to_f32(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
MJ_DEVICE u16 f32_to_f16(float f) {
  u16 r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
}

// ---- fp8 e4m3 ----
// Exact decode: value bits (sign dropped) shifted into an f32 whose exponent bias is 127 instead of
// 7, then scaled by 2^120; exact for normals and subnormals (denormals are not flushed: no ftz).
MJ_DEVICE float e4m3_to_f32(u8 b) {
  const u32 mag = b & 0x7Fu;
  if (mag == 0x7Fu) return __uint_as_float(0x7FC00000u);  // NaN
  float v = __uint_as_float(mag << 20) * 1.329227995784916e36f;  // 2^120
  return (b & 0x80u) ? -v : v;
}

// Round-to-nearest-even, saturating encode (PTX cvt.rn.satfinite semantics).
MJ_DEVICE u8 f32_to_e4m3_soft(float x) {
  const u32 bits = __float_as_uint(x);
  const u8 sign = static_cast<u8>((bits >> 24) & 0x80u);
  const float a = fabsf(x);
  if (a != a) return static_cast<u8>(sign | 0x7F);
  if (a >= 448.0f) return static_cast<u8>(sign | 0x7E);
  if (a < 0.015625f) {  // below 2^-6: subnormal grid of 2^-9 (8 steps reach the smallest normal)
    const int m = __float2int_rn(a * 512.0f);
    return static_cast<u8>(sign | m);
  }
  int e = static_cast<int>((bits >> 23) & 0xFFu) - 127;               // in [-6, 8]
  int m = __float2int_rn(a * __uint_as_float(static_cast<u32>(130 - e) << 23));  // a * 2^(3-e) in [8, 16]
  if (m == 16) {
    m = 8;
    ++e;
  }
  return static_cast<u8>(sign | ((e + 7) << 3) | (m - 8));
}

MJ_DEVICE u8 f32_to_e4m3(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  u16 r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
  return static_cast<u8>(r & 0xFFu);
#else
  return f32_to_e4m3_soft(x);
#endif
}

// Two fp8 values (low byte first) to packed f16x2, exact (every e4m3 value is an f16 value).
MJ_DEVICE u32 e4m3x2_to_f16x2(u16 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  u32 r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(v));
  return r;
#else
  const u8 lo = static_cast<u8>(v & 0xFF), hi = static_cast<u8>(v >> 8);
  return static_cast<u32>(f32_to_f16(e4m3_to_f32(lo))) | (static_cast<u32>(f32_to_f16(e4m3_to_f32(hi))) << 16);
#endif
}
// The same conversion of the low (high = false) or high half of a 32-bit word: on sm_89+ the half is
// selected inside the instruction (a register half operand), where extracting it first costs an
// instruction per pair.
MJ_DEVICE u32 e4m3x2_to_f16x2(u32 word, bool high) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  u32 r;
  if (high) {
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, hi;\n}\n" : "=r"(r) : "r"(word));
  } else {
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n}\n" : "=r"(r) : "r"(word));
  }
  return r;
#else
  return e4m3x2_to_f16x2(static_cast<u16>(high ? word >> 16 : word & 0xFFFFu));
#endif
}

}  // namespace mj

#pragma once
// Element type tags for kernels templated on storage dtypes: size, conversion of one element or
// of an adjacent pair (bits <-> f32), and a NaN bit pattern for poisoning. Pair conversions use
// the packed hardware instructions (one cvt for two values) where they exist. All encodes round
// to nearest even; fp8 encodes saturate to +-448 (satfinite); decodes are exact.
#include "common/convert.cuh"
#include "common/types.cuh"

namespace mj {

struct F32 {
  static constexpr int kBytes = 4;
  static constexpr u32 kNaN = 0x7FC00000u;
  static MJ_DEVICE float to_f32(u32 bits) { return __uint_as_float(bits); }
  static MJ_DEVICE u32 from_f32(float f) { return __float_as_uint(f); }
};

struct Bf16 {
  static constexpr int kBytes = 2;
  static constexpr u32 kNaN = 0x7FC0u;
  static MJ_DEVICE float to_f32(u32 bits) { return bf16_to_f32(static_cast<u16>(bits)); }
  static MJ_DEVICE u32 from_f32(float f) { return f32_to_bf16(f); }
  // `pair`: element 0 in the low half.
  static MJ_DEVICE void pair_to_f32(u32 pair, float& lo, float& hi) {
    lo = __uint_as_float(pair << 16);
    hi = __uint_as_float(pair & 0xFFFF0000u);
  }
  static MJ_DEVICE u32 pair_from_f32(float lo, float hi) { return pack_bf16x2(lo, hi); }
};

struct F16 {
  static constexpr int kBytes = 2;
  static constexpr u32 kNaN = 0x7E00u;
  static MJ_DEVICE float to_f32(u32 bits) { return f16_to_f32(static_cast<u16>(bits)); }
  static MJ_DEVICE u32 from_f32(float f) { return f32_to_f16(f); }
  static MJ_DEVICE void pair_to_f32(u32 pair, float& lo, float& hi) {
    lo = f16_to_f32(static_cast<u16>(pair & 0xFFFFu));
    hi = f16_to_f32(static_cast<u16>(pair >> 16));
  }
  static MJ_DEVICE u32 pair_from_f32(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
};

struct E4m3 {
  static constexpr int kBytes = 1;
  static constexpr u32 kNaN = 0x7Fu;
  static MJ_DEVICE float to_f32(u32 bits) { return e4m3_to_f32(static_cast<u8>(bits)); }
  static MJ_DEVICE u32 from_f32(float f) { return f32_to_e4m3(f); }
  // `pair`: 16 bits, element 0 in the low byte. Every e4m3 value is an f16 value, so the packed
  // e4m3x2 -> f16x2 conversion followed by f16 -> f32 is exact.
  static MJ_DEVICE void pair_to_f32(u32 pair, float& lo, float& hi) {
    const u32 h2 = e4m3x2_to_f16x2(static_cast<u16>(pair));
    lo = f16_to_f32(static_cast<u16>(h2 & 0xFFFFu));
    hi = f16_to_f32(static_cast<u16>(h2 >> 16));
  }
  static MJ_DEVICE u32 pair_from_f32(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    u16 r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return static_cast<u32>(f32_to_e4m3_soft(lo)) | (static_cast<u32>(f32_to_e4m3_soft(hi)) << 8);
#endif
  }
};

}  // namespace mj

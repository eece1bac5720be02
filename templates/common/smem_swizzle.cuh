#pragma once
// Shared-memory tile helpers for 128-byte-swizzled tiles (the layout wgmma's SW128 descriptors
// read, see common/wgmma.cuh): address arithmetic, 16-byte shared loads/stores and stmatrix.
// Inline PTX only (NVRTC-clean).
#include "common/types.cuh"

namespace mj {
namespace sm90 {

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` inside a tile of 128-byte rows whose
// base is 1024-byte aligned.
MJ_DEVICE u32 sw128_offset(u32 row, u32 chunk) { return row * 128u + ((chunk ^ (row & 7u)) << 4); }
// The same for 64-byte-swizzled tiles (wgmma's SW64 layout: 512-byte atoms of 8 rows x 64 bytes,
// chunk c (0..3) of row r at chunk c ^ ((r / 2) % 4)); the base is 512-byte aligned.
MJ_DEVICE u32 sw64_offset(u32 row, u32 chunk) { return row * 64u + ((chunk ^ ((row >> 1) & 3u)) << 4); }

MJ_DEVICE void sts128(u32 addr, u32 a, u32 b, u32 c, u32 d) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
MJ_DEVICE void sts32(u32 addr, u32 a) { asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(a) : "memory"); }
MJ_DEVICE void sts64(u32 addr, u32 a, u32 b) {
  asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(addr), "r"(a), "r"(b) : "memory");
}
MJ_DEVICE void lds128(u32 addr, u32& a, u32& b, u32& c, u32& d) {
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "r"(addr) : "memory");
}

// Four 8x8 b16 matrices from registers to shared memory (warp-wide). Lane l supplies the address
// of row l % 8 of matrix l / 8; register j of every lane holds that lane's two elements (row
// lane / 4, columns 2 (lane % 4) + {0,1}) of matrix j.
MJ_DEVICE void stmatrix_x4(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// Four 8x8 b16 matrices from shared memory, transposed (warp-wide). Lane l supplies the address of
// row l % 8 of matrix l / 8; register j of every lane receives elements (row 2 (lane % 4) + {0,1},
// column lane / 4) of matrix j (low half: the even row).
MJ_DEVICE void ldmatrix_x4_trans(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}

}  // namespace sm90
}  // namespace mj

#pragma once
// Vector memory access: an aligned run of 1, 2, 4, 8 or 16 bytes moved by ONE load or store
// instruction, so that a warp whose lanes touch consecutive runs moves whole 128-byte lines
// (LDG.E.128 / STG.E.128 for 16-byte runs). Inline PTX keeps the width and the cache policy
// independent of how the compiler would otherwise split a struct copy.
//
// Callers guarantee alignment: the address of a Vec<N> access is a multiple of N.
#include "common/types.cuh"

namespace mj {

// N bytes in 32-bit words (the low bytes of w[0] for N < 4). Byte i of the run is byte i % 4 of
// word i / 4 (little endian), so element k of a packed array of s-byte elements starts at bit
// 8 * ((k * s) % 4) of word (k * s) / 4.
template <int N>
struct Vec {
  static_assert(N == 1 || N == 2 || N == 4 || N == 8 || N == 16, "Vec<N>: N must be 1, 2, 4, 8 or 16");
  static constexpr int kWords = N >= 4 ? N / 4 : 1;
  u32 w[kWords];
};

// Read-only, streaming load (non-coherent path, no L1 allocation): for inputs read exactly once.
template <int N>
MJ_DEVICE Vec<N> load_stream(const void* p) {
  Vec<N> v;
  if constexpr (N == 16) {
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
                 : "l"(p));
  } else if constexpr (N == 8) {
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.w[0]), "=r"(v.w[1]) : "l"(p));
  } else if constexpr (N == 4) {
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v.w[0]) : "l"(p));
  } else if constexpr (N == 2) {
    asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=r"(v.w[0]) : "l"(p));
  } else {
    asm volatile("ld.global.nc.L1::no_allocate.u8 %0, [%1];" : "=r"(v.w[0]) : "l"(p));
  }
  return v;
}

// Plain store (default write-back policy: the data is read again later, e.g. a cache row).
template <int N>
MJ_DEVICE void store(void* p, const Vec<N>& v) {
  if constexpr (N == 16) {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};"
                 :
                 : "l"(p), "r"(v.w[0]), "r"(v.w[1]), "r"(v.w[2]), "r"(v.w[3])
                 : "memory");
  } else if constexpr (N == 8) {
    asm volatile("st.global.v2.u32 [%0], {%1, %2};" : : "l"(p), "r"(v.w[0]), "r"(v.w[1]) : "memory");
  } else if constexpr (N == 4) {
    asm volatile("st.global.u32 [%0], %1;" : : "l"(p), "r"(v.w[0]) : "memory");
  } else if constexpr (N == 2) {
    asm volatile("st.global.u16 [%0], %1;" : : "l"(p), "h"(static_cast<u16>(v.w[0])) : "memory");
  } else {
    asm volatile("st.global.u8 [%0], %1;" : : "l"(p), "h"(static_cast<u16>(v.w[0] & 0xFFu)) : "memory");
  }
}

// Bits of the k-th S-byte element of a packed Vec (S = 1, 2 or 4), zero-extended.
template <int S, int N>
MJ_DEVICE u32 get_elem(const Vec<N>& v, int k) {
  const int byte = k * S;
  const u32 word = v.w[byte / 4];
  if constexpr (S == 4) return word;
  else return (word >> (8 * (byte % 4))) & ((1u << (8 * S)) - 1u);
}

// Writes the low S bytes of `bits` as the k-th S-byte element (the element's bits must be zero).
template <int S, int N>
MJ_DEVICE void or_elem(Vec<N>& v, int k, u32 bits) {
  const int byte = k * S;
  if constexpr (S == 4) v.w[byte / 4] = bits;
  else v.w[byte / 4] |= bits << (8 * (byte % 4));
}

template <int N>
MJ_DEVICE void clear(Vec<N>& v) {
#pragma unroll
  for (int i = 0; i < Vec<N>::kWords; ++i) v.w[i] = 0u;
}

}  // namespace mj

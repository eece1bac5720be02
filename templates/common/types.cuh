#pragma once
// Fixed-width types for generated kernels. Generated source includes no CUDA toolkit header, so a
// machine with only the driver and libnvrtc can compile it.
namespace mj {
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

#define MJ_DEVICE __device__ __forceinline__
}  // namespace mj

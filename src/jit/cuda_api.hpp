#pragma once
// The slice of the CUDA driver API mlajit uses, declared here (types and layouts as in cuda.h of
// CUDA 12/13) and resolved from libcuda.so.1 with dlopen/dlsym, so that mlajit needs no toolkit to
// build and starts on machines without a GPU. Symbol names are the versioned ones cuda.h maps the
// plain names to (cuMemAlloc -> cuMemAlloc_v2, ...), without the per-thread-stream variants.
#include <cstddef>
#include <string>

namespace mlajit::cuda {

using CUresult = int;  // 0 = CUDA_SUCCESS
using CUdevice = int;
using CUdeviceptr = unsigned long long;
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;
struct CUevent_st;
using CUcontext = CUctx_st*;
using CUmodule = CUmod_st*;
using CUfunction = CUfunc_st*;
using CUstream = CUstream_st*;
using CUevent = CUevent_st*;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr int CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
constexpr int CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr int CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97;
constexpr int CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;
constexpr unsigned CU_STREAM_NON_BLOCKING = 1;
constexpr unsigned CU_EVENT_DEFAULT = 0;

// cuda.h: CUtensorMap (TMA descriptor), 16 opaque words, 64-byte aligned; the enum values of
// cuTensorMapEncodeTiled's arguments that mlajit uses.
struct alignas(64) CUtensorMap {
  unsigned long long opaque[16];
};
constexpr int CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0;
constexpr int CU_TENSOR_MAP_DATA_TYPE_UINT32 = 2;
constexpr int CU_TENSOR_MAP_INTERLEAVE_NONE = 0;
constexpr int CU_TENSOR_MAP_SWIZZLE_NONE = 0;
constexpr int CU_TENSOR_MAP_SWIZZLE_128B = 3;
constexpr int CU_TENSOR_MAP_L2_PROMOTION_NONE = 0;
constexpr int CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3;
constexpr int CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0;  // out-of-bounds elements read as zeros

// cuda.h: CUlaunchAttribute is {id; pad to 8; 64-byte value union}. The attributes passed: the
// cluster shape (CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: value.clusterDim = {x, y, z}) and the
// programmatic stream serialization (value.programmaticStreamSerializationAllowed = 1).
constexpr int CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4;
constexpr int CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6;
struct CUlaunchAttribute {
  int id;
  char pad[4];
  union {
    char bytes[64];
    struct {
      unsigned x, y, z;
    } clusterDim;
    int programmaticStreamSerializationAllowed;
  } value;
};
static_assert(sizeof(CUlaunchAttribute) == 72, "CUlaunchAttribute layout must match cuda.h");
struct CUlaunchConfig {
  unsigned gridDimX, gridDimY, gridDimZ;
  unsigned blockDimX, blockDimY, blockDimZ;
  unsigned sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute* attrs;
  unsigned numAttrs;
};
static_assert(sizeof(CUlaunchConfig) == 56 && offsetof(CUlaunchConfig, hStream) == 32 &&
                  offsetof(CUlaunchConfig, numAttrs) == 48,
              "CUlaunchConfig layout must match cuda.h");

struct Api {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDeviceTotalMem)(size_t*, CUdevice);                  // _v2
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxGetDevice)(CUdevice*);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void**, void**);
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig*, CUfunction, void**, void**);
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);                     // _v2
  CUresult (*cuMemFree)(CUdeviceptr);                               // _v2
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);       // _v2
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);             // _v2
  CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);       // _v2
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);  // _v2
  CUresult (*cuStreamCreate)(CUstream*, unsigned);
  CUresult (*cuStreamDestroy)(CUstream);                            // _v2
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuStreamIsCapturing)(CUstream, int*);  // CUstreamCaptureStatus; optional (nullptr if absent)
  CUresult (*cuEventCreate)(CUevent*, unsigned);
  CUresult (*cuEventDestroy)(CUevent);                              // _v2
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent);         // _v2 where present
  // (tensorMap, dataType, rank, globalAddress, globalDim, globalStrides, boxDim, elementStrides,
  // interleave, swizzle, l2Promotion, oobFill); optional (nullptr if absent): only the TMA paths
  // need it, and they say so when it is missing.
  CUresult (*cuTensorMapEncodeTiled)(CUtensorMap*, int, unsigned, void*, const unsigned long long*,
                                     const unsigned long long*, const unsigned*, const unsigned*, int, int, int, int);
  // (numClusters, function, config: block, dynamic shared memory, cluster attribute); optional
  // (nullptr if absent, drivers before CUDA 12.0): callers fall back to their own estimate.
  CUresult (*cuOccupancyMaxActiveClusters)(int*, CUfunction, const CUlaunchConfig*);
};

// The loaded API after a successful cuInit, or nullptr with `why`.
const Api* load(std::string* why = nullptr);
// The loaded API; throws Error(Driver) with the reason when the driver is unusable.
const Api& api();
// Throws Error(Driver) "<call> failed: <CUDA_ERROR_NAME> (<description>)" unless r is CUDA_SUCCESS.
void check(CUresult r, const char* call);

}  // namespace mlajit::cuda

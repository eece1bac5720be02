#pragma once
// Benchmark of kv_cache_store / kv_cache_gather on the current GPU (`mlajit bench kv_cache_store`,
// `mlajit bench kv_cache_gather`): random normal data over a shuffled paged cache, the specialized
// kernel launched through ops::, CUDA-event timing with inputs rotated across enough copies that
// no repetition finds its data in L2. Bandwidth counts bytes read plus bytes written.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "mlajit/params.hpp"

namespace mlajit::bench {

struct KvCacheBenchShape {
  int64_t tokens = 65536;
  int num_heads = 1;
  int head_size = 576;
  DType cache_dtype = DType::fp8_e4m3;  // bf16 | f16 | f32 | fp8_e4m3
  DType io_dtype = DType::bf16;         // store: input dtype (bf16 | f16 | f32); gather: output (bf16 | f32)
  bool is_mla = true;
  int page_size = 64;
  int num_layers = 1;
  int quantization_granularity = 0;     // fp8 only; 0 = head_size
  ScaleFmt scale_fmt = ScaleFmt::fp32;
  int threads = 128;
  int reps = 50;
};

// The nominal copy bandwidth the results are compared with (H100, device-to-device copy); not
// measured under the bench's harness: see "same_harness_copy" below for the copy timed alike.
constexpr double kDeviceCopyGBps = 3000.0;

// op: "kv_cache_store" | "kv_cache_gather". Returns
//   {"op", "params", "shape", "device", "reps", "buffer_sets", "bytes_read", "bytes_written", "bytes",
//    "ms": {"median", "min", "max"}, "ms_back_to_back", "gbps", "gbps_back_to_back",
//    "pct_of_copy_bw", "copy_bw_gbps",
//    "same_harness_copy": {"bytes", "ms_median", "ms_min", "gbps", "pct"} or {"bytes", "error"} when
//    its two buffers do not fit beside the op's}
// where gbps = bytes / median time and pct_of_copy_bw = gbps / kDeviceCopyGBps. same_harness_copy
// times cuMemcpyDtoDAsync of bytes / 2 (so `bytes` read + written, like the op) in the same loop,
// interleaved with the op's launches (L2 flushed, events around the one call); its pct = the op's
// gbps / the copy's gbps. Throws Error(InvalidArgument) for a bad shape, Error(Driver) without a GPU.
nlohmann::json bench_kv_cache(const std::string& op, const KvCacheBenchShape& shape);

}  // namespace mlajit::bench

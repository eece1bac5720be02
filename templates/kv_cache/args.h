#pragma once
// Kernel argument structs of the paged KV cache family (SPEC §1), shared by the host
// (src/ops/kv_cache/op.cpp) and the device templates (kv_cache/kv_cache.cuh): plain C types only, one
// by-value struct per launch. Everything the generated kernel is specialized on (dtypes, heads,
// head size, page size, layers, kv_dim, granularity, scale format, threads) is a compile-time
// constant and is not repeated here; these are the per-call sizes and pointers.
//
// Cache addressing: the row of (physical block blk, kv index, layer, page offset o) is
//   ((blk * kv_dim + kv_idx) * num_layers + layer_idx) * page_size + o
// and holds num_heads * head_size elements in `blocks` and num_heads * head_dim_granularity
// f32 scales in `scales`.

// kv_cache_store: x[num_tokens, num_heads, head_size] -> each token's slot in the cache.
struct KvCacheStoreArgs {
  const void* x;                       // input_dtype [num_tokens, num_heads, head_size]
  const unsigned* input_row_offsets;   // u32 [batch + 1]
  const unsigned* cache_lengths;       // u32 [batch]
  const unsigned* lookup_table;        // u32 [batch, pages_per_seq]
  void* blocks;                        // cache dtype, see above
  float* scales;                       // f32; null unless the cache is fp8
  unsigned* dropped;                   // u32 [1] counter of tokens not written; may be null
  long long num_tokens;
  long long num_blocks;
  int batch;
  int pages_per_seq;
  int layer_idx;
  int kv_idx;
};

// kv_cache_gather: y[num_tokens, num_heads, head_size] of (batch_ids[i], positions[i]).
struct KvCacheGatherArgs {
  const void* blocks;
  const float* scales;                 // null unless the cache is fp8
  const unsigned* lookup_table;        // u32 [batch, pages_per_seq]
  const unsigned* batch_ids;           // u32 [num_tokens]
  const unsigned* positions;           // u32 [num_tokens] logical positions
  void* y;                             // output_dtype [num_tokens, num_heads, head_size]
  unsigned* dropped;                   // u32 [1] counter of rows not found; may be null
  long long num_tokens;
  long long num_blocks;
  int batch;
  int pages_per_seq;
  int layer_idx;
  int kv_idx;
};

// sparse_index_remap: logical positions -> encoded indices (block * page_size + offset).
// One thread block per token row; a row's sequence comes from input_row_offsets.
struct SparseIndexRemapArgs {
  const int* indices;                  // i32 [num_tokens, k]
  const unsigned* input_row_offsets;   // u32 [batch + 1]
  const unsigned* lookup_table;        // u32 [batch, pages_per_seq]
  int* out;                            // i32 [num_tokens, k]
  long long num_tokens;
  long long k;
  long long num_blocks;
  int batch;
  int pages_per_seq;
};

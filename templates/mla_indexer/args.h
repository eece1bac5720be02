#pragma once
// Kernel argument structs of mla_indexer (SPEC §2), shared by the host (src/ops/mla_indexer/op.cpp)
// and the device templates: plain C types only, one by-value struct per launch.
//
// The op runs in chunks of query rows: for each chunk of `chunk_rows` global token rows starting
// at `chunk_row_begin`, the scores entry writes
//   scores[(t - chunk_row_begin) * score_row_stride + j] = score(t, j)   for every visible key j
// and the top-k entry reads the visible prefix of each row and writes out[t, 0 .. top_k).
//
// Key addressing (SPEC §1, num_heads 1, head_size 128, kv_dim 1): key position j of sequence b
// lives in physical block blk = lookup_table[b * pages_per_seq + j / page_size] at row
//   row = blk * block_row_stride + layer_row_offset + j % page_size
// (block_row_stride = num_layers * page_size, layer_row_offset = layer_idx * page_size);
// its 128 fp8 values start at k_blocks + row * 128 and its scale is k_scales[row * scale_row_stride].
// A key whose page is past the table or whose block is >= num_blocks is never read (zero-filled).
//
// Visibility of key j for token i (0-based within sequence b, L = cache_lengths[b], S its new
// tokens): causal j <= L + i, none j < L + S, and always j < max_keys (the caller's bound on L+S,
// which sizes the score rows; keys past it are treated as not visible).

// A CUtensorMap (cuda.h: 16 opaque 64-bit words, 64-byte aligned), encoded on the host by
// cuTensorMapEncodeTiled and read by the TMA unit from the kernel's parameter space.
struct alignas(64) MlaIndexerTensorMap {
  unsigned long long opaque[16];
};

struct MlaIndexerScoresArgs {
  const unsigned char* q;                 // fp8 e4m3 [num_tokens, H, 128]
  const float* qs;                        // f32 [num_tokens, H]
  const unsigned* input_row_offsets;      // u32 [batch + 1]
  const unsigned char* k_blocks;          // fp8 e4m3 paged K cache
  const float* k_scales;                  // f32, one row of scale_row_stride floats per cache row
  const unsigned* lookup_table;           // u32 [batch, pages_per_seq]
  const unsigned* cache_lengths;          // u32 [batch]
  float* scores;                          // workspace [chunk_rows, score_row_stride]
  long long num_tokens;
  long long chunk_row_begin;
  long long chunk_rows;
  long long score_row_stride;             // floats per score row, a multiple of 4, >= max_keys
  long long max_keys;
  long long num_blocks;
  long long pages_per_seq;
  long long block_row_stride;
  long long layer_row_offset;
  int batch;
  int scale_row_stride;                   // head_dim_granularity of the K cache (1 when g >= 128)
  int keys_per_split;                     // keys of one key split (a multiple of the ring stage's keys)
  // The persistent Hopper scorer at pages >= 8 loads K by TMA through k_map (one box per 64-key
  // quarter, or per page below 64), and its scales through scale_map when scales_by_tma is 1 (0:
  // the scales are not 16-byte aligned, or their boxes would land off 128-byte boundaries, and are
  // copied with cp.async). Unused by the other scorers.
  int scales_by_tma;
  // K cache as [total_rows, 128] bytes, box min(page, 64) rows x 128 B, 128-byte swizzle (the
  // wgmma layout).
  MlaIndexerTensorMap k_map;
  // Scales as [total_rows] 32-bit words (scale_row_stride 1), box as K's (valid when scales_by_tma).
  MlaIndexerTensorMap scale_map;
};

struct MlaIndexerTopkArgs {
  const float* scores;                    // workspace [chunk_rows, score_row_stride]
  const unsigned* input_row_offsets;      // u32 [batch + 1]
  const unsigned* cache_lengths;          // u32 [batch]
  const unsigned* lookup_table;           // u32 [batch, pages_per_seq] (emit = physical)
  int* out;                               // i32 [num_tokens, top_k]
  long long num_tokens;
  long long chunk_row_begin;
  long long chunk_rows;
  long long score_row_stride;
  long long max_keys;
  long long num_blocks;
  long long pages_per_seq;
  int batch;
};

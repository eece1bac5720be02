#pragma once
// Kernel argument struct of sparse_prefill (SPEC §3), shared by the host (src/ops/sparse_prefill/op.cpp)
// and the device templates: plain C types only, one by-value struct per launch.
//
// Row addressing (SPEC §1): for an encoded index e,
//   tma_row(e) = (e / page_size) * row_stride + e % page_size
// and the row's data starts at kv_blocks + (tma_row(e) + layer_row_offset) * row_elems elements
// (row_elems = 576). A slot is valid iff int(e) >= 0 and tma_row(e) < num_kv_rows. For fp8 the
// scales row of e starts at kv_scales + (tma_row(e) + layer_row_offset) * scales_per_token.
struct SparsePrefillArgs {
  const void* q;                // bf16 [num_tokens, H, 576]
  const void* kv_blocks;        // bf16 | fp8_e4m3 paged latent cache (num_heads 1, head_size 576)
  const float* kv_scales;       // fp8 with quantization granularity > 0: f32 per row; else null
  const unsigned* indices;      // u32 [num_tokens, indices_stride] encoded indices
  const unsigned* topk_lengths; // u32 [num_tokens]
  const float* attn_sink;       // f32 [H] if attn_sink, else null
  void* out;                    // bf16 [num_tokens, H, 512]
  float* lse;                   // f32 [num_tokens, H] if emit_lse, else null
  long long num_tokens;
  long long indices_stride;     // multiple of b_topk
  long long num_kv_rows;        // (num_blocks - 1) * row_stride + page_size
  long long row_stride;         // kv_dim * num_layers * page_size rows between physical blocks
  long long layer_row_offset;   // layer_idx * page_size
  float sm_scale;               // softmax scale
  float sm_scale_log2e;         // sm_scale * log2(e), for the exp2-domain softmax
  // Tail split (the persistent Hopper kernel only; templates/sparse_prefill/sm90.cuh "Tail split").
  // Items (token x head tile) from split_first on run as parts = 2^split_shift parts each, part j
  // taking steps [j S / parts, (j + 1) S / parts) of the item's S; a part writes its f32
  // accumulator, running max and row sum to partial slot (item - split_first) * parts + j, and the
  // combine entry reduces the slots into out and lse. split_shift 0: no split (split_first unused).
  float* partials;              // f32 slots of 64 x 514: o [64 rows][512], then (m, l) [64 rows][2]; or null
  long long partial_slots;      // slots `partials` holds (host only: launch() picks the split within it)
  int split_first;              // first split item
  int split_shift;              // log2 of the parts per split item (0: none)
  // 1: the launch runs the crossover (clusters of a token's two CTAs; sm90.cuh, Design), which the
  // host takes only where the kernel has it (layout.h hopper_crossover); the split then counts
  // token units (sm90_persistent.cuh, cta_work_crossover). 0: one CTA per item.
  int crossover;
};

// Kernel argument struct of the fp8 -> bf16 staging kernels (params kv_staging bf16,
// templates/sparse_prefill/stage_bf16.cuh). The staged copy `rows` is indexed by the encoded index:
// rows + e * 576 bf16 elements, e < num_rows; the attention kernel then reads it as a one-layer bf16
// cache (row_stride = page_size, layer_row_offset 0) with the caller's indices unchanged.
struct SparsePrefillStageArgs {
  const unsigned* indices;      // u32 [num_tokens, indices_stride] encoded indices
  const unsigned* topk_lengths; // u32 [num_tokens]
  const void* kv_blocks;        // fp8_e4m3 paged latent cache
  const float* kv_scales;       // f32 per row (quantization granularity > 0), else null
  unsigned char* page_flags;    // u8 [num_blocks] (16-byte aligned): pages to convert; null = every row
  void* rows;                   // bf16 [num_rows, 576]: the staged copy
  long long num_tokens;
  long long indices_stride;
  long long num_blocks;         // physical blocks (pages) of the cache
  long long num_rows;           // num_blocks * page_size: every encoded index of the cache
  long long row_stride;         // as SparsePrefillArgs
  long long layer_row_offset;   // as SparsePrefillArgs
};

#pragma once
// Launch plan of sparse_prefill (SPEC §3): which kernel entries a spec's source holds, and the
// tiling / launch geometry of each. The generator (ops/sparse_prefill/generate.cpp) emits the entries from
// it and the op (ops/sparse_prefill/op.cpp) launches from it, so the two cannot drift apart; the
// shared-memory layouts, thread counts and slot sizes are templates/sparse_prefill/layout.h, the
// header the device templates take them from (the generated source static_asserts the pairing).
#include <cstddef>
#include <cstdint>
#include <string>

#include "mlajit/params.hpp"
#include "sparse_prefill/layout.h"

namespace mlajit::sparse_prefill {

// Entry indices in KernelSource::entries.
constexpr int kEntryPortable = 0;  // portable mma.sync path (always present; a trapping guard for qk_math fp8)
constexpr int kEntrySm90 = 1;  // Hopper wgmma path (present when sm90_supported(p))

// The persistent Hopper kernel's modules (Sm90Plan::persistent: a bf16 cache or kv_staging bf16):
constexpr int kEntrySm90Combine = 2;   // merges the parts of tail-split items (a guard in portable modules)
// kv_staging bf16 only (templates/sparse_prefill/stage_bf16.cuh), after the combine entry:
constexpr int kEntryStageClear = 3;    // zero the row flags
constexpr int kEntryStageMark = 4;     // flag the rows valid slots select
constexpr int kEntryStageConvert = 5;  // fp8 rows (flagged, or all) -> the bf16 copy

constexpr const char* kSymbolPortable = "mlajit_sparse_prefill_portable";
constexpr const char* kSymbolSm90 = "mlajit_sparse_prefill_sm90";
constexpr const char* kSymbolSm90Combine = "mlajit_sparse_prefill_sm90_combine";
constexpr int kCombineThreads = mj::sparse_prefill_layout::kCombineThreads;
constexpr const char* kSymbolStageClear = "mlajit_sparse_prefill_stage_clear";
constexpr const char* kSymbolStageMark = "mlajit_sparse_prefill_stage_mark";
constexpr const char* kSymbolStageConvert = "mlajit_sparse_prefill_stage_convert";
constexpr int kStageThreads = mj::sparse_prefill_layout::kStageThreads;

// The params of the attention kernel: p itself, or for kv_staging bf16 the bf16-cache kernel that
// reads the staged copy (kv_dtype bf16, no scales). Plans and path choices take these.
SparsePrefillParams attention_params(const SparsePrefillParams& p);

// kv_staging bf16: encoded indices are int32 (SPEC §3 validity), so a layer of more rows than this
// could not be addressed; its staged copy is refused (such a pool would hold over 1.2 TB anyway).
constexpr int64_t kMaxStagedRows = int64_t{1} << 31;
// The workspace of ops::sparse_prefill, in this order (each part 256-byte aligned):
// - kv_staging bf16: the bf16 copy (num_blocks * page_size rows of 576 elements, 1152 bytes each),
//   then one flag byte per page (block), rounded up to 16 bytes: staged_bytes(). Required.
// - the splitting Hopper kernels (split_kernel): kMaxSplitSlots partial slots of kPartialSlotBytes
//   for the parts of split items (launch() splits only within the slots the workspace holds; none:
//   no split). Optional.
// workspace_bytes = both. A pool beyond kMaxStagedRows is an Error naming `field`.
constexpr int64_t kPartialSlotBytes = mj::sparse_prefill_layout::kPartialSlotBytes;
constexpr int64_t kMaxSplitSlots = 256;                    // parts in flight <= the grid <= the SMs
size_t staged_bytes(const SparsePrefillParams& p, int64_t num_blocks, const char* field = "num_blocks");
size_t workspace_bytes(const SparsePrefillParams& p, int64_t num_blocks, const char* field = "num_blocks");
// Where the partial slots start in the workspace (staged_bytes rounded up to 256).
size_t partials_offset(const SparsePrefillParams& p, int64_t num_blocks);

// The portable kernel (templates/sparse_prefill/portable.cuh): one CTA per (token, head tile).
struct PortablePlan {
  int m_tiles = 0;        // 16-head row tiles per CTA (1..4)
  int heads_per_cta = 0;  // 16 * m_tiles; the last head tile may hold padding heads
  int head_tiles = 0;     // CTAs per token
  int key_tile = 0;       // keys per pipeline step (64)
  // The pipeline is fixed: bf16 two K buffers, ping-pong; fp8 one staging buffer converted at the
  // top of each step.
  int threads = 0;        // 64 * m_tiles (two warps per row tile)
  int smem_bytes = 0;     // dynamic shared memory (must equal Config::kSmemBytes)
};
PortablePlan portable_plan(const SparsePrefillParams& p);

// The Hopper kernel (templates/sparse_prefill/sm90.cuh), when the spec is one it covers.
struct Sm90Plan {
  int heads_per_cta = 0;
  int head_tiles = 0;
  int threads = 0;
  int smem_bytes = 0;
  // Whether a CTA walks several items (token x head tile: items = tokens * head_tiles), it, + grid,
  // ...: then the op launches min(items, SMs) CTAs (one per SM; the kernel's shared memory allows
  // no second), else one CTA per item. The bf16 kernel.
  bool persistent = false;
  // Whether the kernel holds the crossover body (layout.h hopper_crossover: the token's two CTAs
  // share the fp8 decode of its rows), which a launch runs in clusters of 2 split over tokens
  // (launch.hpp: crossover_taken says when).
  bool crossover = false;
};
bool sm90_supported(const SparsePrefillParams& p);
// Whether the portable kernel computes p: every spec except qk_math fp8, whose FP8 tensor-core math
// exists only in the Hopper kernel (FP8 wgmma is sm_90a-only), and kv_layout fp8_ds_mla, whose
// records only the Hopper kernel's producer decodes.
bool portable_supported(const SparsePrefillParams& p);
// Whether p's Hopper kernel is the persistent one (Sm90Plan::persistent: a bf16 cache, or
// kv_staging bf16): the kernel with the tail split, whose module holds the combine entry.
bool persistent_kernel(const SparsePrefillParams& p);
// Whether p's Hopper kernel splits items over keys (16-bit math: the persistent kernel's tail split,
// the one-item-per-CTA fp8 kernels' decode plan and tail; not qk_math fp8): its module holds the
// combine entry and its workspace the partial slots.
bool split_kernel(const SparsePrefillParams& p);
// Whether p's Hopper kernel holds the crossover body (Sm90Plan::crossover; launch.hpp
// crossover_taken says when a launch runs it).
bool crossover_kernel(const SparsePrefillParams& p);
// Where both kernels can run (sm_90a and sm90_supported), whether the automatic path takes the
// Hopper one. A measured policy: see the numbers next to the definition.
bool sm90_preferred(const SparsePrefillParams& p);
Sm90Plan sm90_plan(const SparsePrefillParams& p);

}  // namespace mlajit::sparse_prefill

#pragma once
// The layers under ops::sparse_prefill, exposed inside mlajit for the tests and the benchmark:
// argument validation (every view against the params, before any runtime or driver call), kernel
// argument construction, path choice, and the launch of one specific entry.
#include <memory>
#include <string>
#include <string_view>

#include "mlajit/ops.hpp"
#include "mlajit/runtime.hpp"
#include "sparse_prefill/args.h"

namespace mlajit::sparse_prefill {

// Which kernel runs. automatic: the Hopper kernel on sm_90a where it covers the spec and is the
// better choice (sm90_preferred), else the portable one. portable / sm90 force an entry (sm90 fails
// clearly where it is unavailable).
enum class Path { automatic, portable, sm90 };
const char* path_name(Path p);
Path parse_path(std::string_view name, const std::string& field = "path");

// Checks every view against `p` (errors name the argument, the value and what was expected) and
// returns the kernel arguments. topk_lengths values larger than indices_stride are clamped to it
// by the kernels (a row never reads past its own indices). kv.lookup_table and kv.cache_lengths
// are not used: the indices are already encoded (SPEC §1 sparse_index_remap).
SparsePrefillArgs make_args(const SparsePrefillParams& p, const TensorView& q, const ops::PagedCacheView& kv,
                            const TensorView& indices, const TensorView& topk_lengths, int layer_idx,
                            float softmax_scale, const TensorView& attn_sink, const TensorView& out,
                            const TensorView& lse);

// kv_staging bf16 (templates/sparse_prefill/stage_bf16.cuh). How the staging picks the rows it
// converts: all = every row of the read layer (num_blocks * page_size rows); marked = only the rows
// of the pages (blocks) some valid slot selects a row of (clear the page flags, mark, convert the
// flagged pages); automatic = stage_marks_rows().
enum class StageRows { automatic, all, marked };
const char* stage_rows_name(StageRows r);
StageRows parse_stage_rows(std::string_view name, const std::string& field);
// The automatic choice, by a byte model measured on an H100 (op.cpp): converting moves ~1.8 KB per
// row; marking costs ~16 bytes per slot plus the conversion of the pages it marks. Marks where
// converting every row would cost more than twice the marking: a large pool read by a short
// prefill. The benchmark's shapes (4096 x 2048 slots, s_kv up to 128K) convert every row.
bool stage_marks_rows(int64_t num_rows, int64_t num_tokens, int64_t indices_stride);
// Whether stage() marks for `sa` under `rows` (marked, or automatic and stage_marks_rows).
bool stage_marks(const SparsePrefillStageArgs& sa, StageRows rows);

// kv_staging bf16: checks `workspace` (16-byte aligned, at least staged_bytes(p, num_blocks)
// bytes; errors name it, its size and the size needed) and returns the staging kernels' arguments
// for `args` (from make_args, same views), which it redirects to the staged copy: a one-layer bf16
// cache (row_stride page_size, layer 0, no scales) read with the same indices. kv_staging none: the
// workspace is not used (any view, an empty one included) and `args` is left as it is.
SparsePrefillStageArgs make_stage_args(const SparsePrefillParams& p, const ops::PagedCacheView& kv,
                                       const TensorView& workspace, SparsePrefillArgs& args);
// The persistent Hopper kernel's partial slots (plan.hpp workspace_bytes): points args.partials at
// the workspace past partials_offset(p, num_blocks) and sets args.partial_slots to the slots it
// holds there (at most kMaxSplitSlots; 0 = no tail split). For these specs a non-empty workspace must
// be contiguous and 16-byte aligned (errors name it); other specs do not look at it (args unchanged).
void bind_partials(const SparsePrefillParams& p, const ops::PagedCacheView& kv, const TensorView& workspace,
                   SparsePrefillArgs& args);

// The tail split launch() gives the persistent kernel (args.split_first / split_shift; templates/
// sparse_prefill/sm90_persistent.cuh, item_work). With `grid` CTAs and items = tokens x head tiles, the last
// round holds r = items mod grid items (all of them when items < grid); each is split into
// parts = the largest power of two <= min(grid / r, slots / r, max_parts) (the kernel walks units
// with shifts), so that the last round's units fill the grid,
// where max_parts keeps at least two 128-key steps per part of a full-length item
// (indices_stride / 256; measured on an H200 against 2, 4 and 16). `max_parts` > 0
// replaces that rule (at most max_parts parts of one step at least: the benchmark's sweep).
// parts < 2: no split (first = items, parts 1). units = first + r * parts: the walk's length.
struct TailSplit {
  int64_t first = 0;
  int parts = 1;
  int64_t units = 0;
};
TailSplit tail_split(int64_t items, int64_t grid, int64_t slots, int64_t indices_stride, int max_parts = 0);

// The crossover (Sm90Plan::crossover: a kernel whose token's two CTAs share the fp8 decode as a
// cluster) pays where the producer's decode bounds the kernel and rows come from HBM: decode steps,
// whose sequences each read their own rows once (batch 1-128, next_n 1-2, 128 heads, H100:
// 1.10-1.23x). Prefill tokens share their rows through L2, and there the cluster's lockstep and the
// peer stores cost more than the halved decode saves (4096 tokens: 0.91-0.94x). So automatic takes
// it for launches of at most kCrossoverMaxTokens tokens (batch x next_n of a decode step).
enum class Crossover { automatic, on, off };
constexpr int64_t kCrossoverMaxTokens = 512;
// Whether a launch of `num_tokens` tokens of p on `path` runs the crossover: on / automatic where the
// kernel has it (automatic: num_tokens <= kCrossoverMaxTokens); on where it has none: Error.
bool crossover_taken(const SparsePrefillParams& p, Path path, int64_t num_tokens, Crossover crossover);
// The clusters of the crossover body the device holds at once (Kernel::max_active_clusters of the
// sm90 entry with p's block and shared memory, clusters of 2), which launch() sizes the crossover's
// split to; 0 where the driver cannot say. `kernel`: kernel_for(p, Path::sm90).
int64_t crossover_resident_clusters(const Kernel& kernel, const SparsePrefillParams& p);

// Launches the staging kernels of `kernel` (kernel_for(p, any path): every kv_staging bf16 module
// holds them) on `stream`: clear + mark + convert, or convert only (rows all).
void stage(const Kernel& kernel, const SparsePrefillStageArgs& sa, StageRows rows, Stream stream);

// Whether entry `path` (portable | sm90) exists for p and runs on a device of target `arch`; automatic:
// whether any kernel does (false only for qk_math fp8, which has the Hopper kernel alone, off sm_90a).
bool path_available(const SparsePrefillParams& p, const std::string& arch, Path path);
// The path that runs for `requested` on a device of target `arch` (e.g. "sm_90a"); automatic:
// sm90 where available and preferred (ops/sparse_prefill/plan.hpp: sm90_preferred), else portable.
// qk_math fp8 resolves to sm90 on sm_90a and is an Error (naming qk_math fp8 and the arch) for
// the portable path and for any other arch.
Path resolve_path(const SparsePrefillParams& p, const std::string& arch, Path requested);

// The module that holds the compiled kernel of `path` (portable | sm90, resolved) for `p` on the current
// device. Each module compiles one kernel body (ops/sparse_prefill/generate.cpp): the automatic
// choice comes from Runtime::get (what `mlajit build` prebuilds); the other path of an sm_90a
// device (forced, or the negative-scale fallback) from its own source, loaded once per process.
// `stream`: the launch's stream; a kernel not loaded yet while it is being captured is an error.
std::shared_ptr<const Kernel> kernel_for(const SparsePrefillParams& p, Path path, Stream stream = nullptr);

// Launches entry `path` (portable | sm90) of `kernel` (kernel_for(p, path)) over args.num_tokens tokens.
// kv_staging bf16: `args` must have passed through make_stage_args (the kernel reads bf16 rows) and
// stage() must have run on the stream before.
// grid_ctas: 0 = automatic (the persistent sm90 kernel, Sm90Plan::persistent: one CTA per SM, at most
// one per item; every other kernel: one CTA per item). > 0, persistent kernel only: that many CTAs
// (capped at the item count), for the tests (grids of 1, 3, 7 CTAs walk many items each) and the
// benchmark's A/B against one CTA per item; elsewhere an Error.
// The persistent kernel splits its tail (tail_split) where args.partial_slots > 0 (bind_partials),
// then launches the combine entry behind it on the same stream; max_split_parts caps the parts
// (0 = tail_split's own limit). Returns the split it ran.
// crossover: whether a kernel that holds the crossover body runs it (crossover_taken); on for a
// kernel without one is an Error.
TailSplit launch(const Kernel& kernel, const SparsePrefillParams& p, Path path, const SparsePrefillArgs& args,
                 Stream stream, int64_t grid_ctas = 0, int max_split_parts = 0,
                 Crossover crossover = Crossover::automatic);
// The grid launch() uses without a tail split (same rules and errors); 0 for no tokens. With a split
// it runs min(units, the SMs or grid_ctas) CTAs: more than this only where items < that budget
// (each item's parts then run side by side).
int64_t launch_ctas(const SparsePrefillParams& p, Path path, int64_t num_tokens, int64_t grid_ctas = 0);

// make_args + (kv_staging bf16: make_stage_args + stage) + bind_partials + resolve_path + Runtime::global().get +
// launch: ops::sparse_prefill with a path (and for the tests and the bench, a staging mode).
void run(const SparsePrefillParams& p, const TensorView& q, const ops::PagedCacheView& kv, const TensorView& indices,
         const TensorView& topk_lengths, int layer_idx, float softmax_scale, const TensorView& attn_sink,
         const TensorView& out, const TensorView& lse, const TensorView& workspace, Path path, Stream stream,
         StageRows stage_rows = StageRows::automatic);

}  // namespace mlajit::sparse_prefill

namespace mlajit {
// The source of `spec` compiling one path's kernel: Path::automatic = generate(spec) (the Hopper
// kernel on sm_90a targets where it is the automatic choice, else the portable one); portable / sm90:
// that kernel on any target it supports.
KernelSource generate_sparse_prefill_mode(const KernelSpec& spec, sparse_prefill::Path mode);
}  // namespace mlajit

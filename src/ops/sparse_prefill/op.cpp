// Host entry point of sparse_prefill (SPEC §3): validates the params and every tensor view BEFORE
// touching the runtime (bad arguments fail the same way with or without a GPU), builds the kernel
// argument struct (templates/sparse_prefill/args.h), picks the entry (Hopper wgmma kernel on
// sm_90a where it covers the spec, else the portable mma.sync kernel; qk_math fp8: the Hopper
// kernel or an error) and launches it with the geometry of ops/sparse_prefill/plan.hpp.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "mlajit/driver.hpp"
#include "mlajit/error.hpp"
#include "mlajit/ops.hpp"
#include "mlajit/runtime.hpp"
#include "ops/tuning.hpp"
#include "ops/sparse_prefill/launch.hpp"
#include "ops/sparse_prefill/plan.hpp"

namespace mlajit {

namespace sparse_prefill {

namespace {

constexpr int kQkDepth = 576;
constexpr int kVDepth = 512;

void expect_absent(const TensorView& t, const char* what, const char* why) {
  if (!t.empty()) throw_invalid(what, t.describe(), fmt::format("an empty view ({})", why));
}

// A workspace the op writes: contiguous, non-null, 16-byte aligned (errors name it).
void expect_workspace_view(const TensorView& workspace) {
  expect_contiguous(workspace, "workspace");
  expect_nonnull(workspace, "workspace");
  expect_aligned(workspace, 16, "workspace");
}

// CTAs of the persistent kernel: grid_ctas, or one per SM (its shared memory leaves room for no
// second). A CUDA graph replays the same grid (the SM count).
int64_t persistent_ctas_budget(int64_t grid_ctas) {
  return grid_ctas > 0 ? grid_ctas : static_cast<int64_t>(std::max(1, Runtime::global().sm_count()));
}

}  // namespace

const char* path_name(Path p) {
  switch (p) {
    case Path::automatic: return "auto";
    case Path::portable: return "portable";
    case Path::sm90: return "sm90";
  }
  return "?";
}

Path parse_path(std::string_view name, const std::string& field) {
  if (name == "auto") return Path::automatic;
  if (name == "portable") return Path::portable;
  if (name == "sm90") return Path::sm90;
  throw_invalid(field, fmt::format("\"{}\"", name), "auto | portable | sm90");
}

SparsePrefillArgs make_args(const SparsePrefillParams& p, const TensorView& q, const ops::PagedCacheView& kv,
                            const TensorView& indices, const TensorView& topk_lengths, int layer_idx,
                            float softmax_scale, const TensorView& attn_sink, const TensorView& out,
                            const TensorView& lse) {
  p.validate();
  const int64_t H = p.num_q_heads;

  // q bf16 [T, H, 576]: T comes from here.
  expect_dtype(q, DType::bf16, "q");
  expect_ndim(q, 3, "q");
  const int64_t T = q.shape[0];
  expect_dim(q, 1, H, "q");
  expect_dim(q, 2, kQkDepth, "q");
  expect_contiguous(q, "q");
  expect_nonnull(q, "q");
  expect_aligned(q, 16, "q");

  // The latent cache: blocks [num_blocks, 1, num_layers, page_size, 1, 576] of kv_dtype, or with
  // kv_layout fp8_ds_mla the records kv_cache_store writes: u8 [num_blocks, 1, num_layers,
  // page_size, 656] (also as fp8_e4m3 bytes, or with the head dim [..., page_size, 1, 656]).
  const bool ds_mla = p.kv_layout == CacheLayout::fp8_ds_mla;
  const TensorView& blocks = kv.blocks;
  if (ds_mla) {
    MLAJIT_EXPECT(blocks.dtype == DType::u8 || blocks.dtype == DType::fp8_e4m3, "kv.blocks dtype",
                  dtype_name(blocks.dtype), "u8 (or fp8_e4m3 bytes) with kv_layout fp8_ds_mla");
    MLAJIT_EXPECT(blocks.ndim == 5 || blocks.ndim == 6, "kv.blocks ndim", blocks.ndim,
                  "5 ([num_blocks, 1, num_layers, page_size, 656]) or 6 (with a head dim of 1 before the 656 "
                  "record bytes) with kv_layout fp8_ds_mla");
  } else {
    expect_dtype(blocks, p.kv_dtype, "kv.blocks");
    expect_ndim(blocks, 6, "kv.blocks");
  }
  const int64_t num_blocks = blocks.shape[0];
  MLAJIT_EXPECT(num_blocks >= 1, "kv.blocks dim 0 (num_blocks)", num_blocks, "at least 1 block");
  expect_dim(blocks, 1, 1, "kv.blocks");  // is_mla: kv_dim 1
  const int64_t num_layers = blocks.shape[2];
  MLAJIT_EXPECT(num_layers >= 1, "kv.blocks dim 2 (num_layers)", num_layers, "at least 1 layer");
  expect_dim(blocks, 3, p.page_size, "kv.blocks");
  if (blocks.ndim == 6) expect_dim(blocks, 4, 1, "kv.blocks");  // one latent head
  expect_dim(blocks, blocks.ndim - 1, ds_mla ? 656 : kQkDepth, "kv.blocks");
  expect_contiguous(blocks, "kv.blocks");
  expect_nonnull(blocks, "kv.blocks");
  expect_aligned(blocks, 16, "kv.blocks");

  const bool fp8 = p.kv_dtype == DType::fp8_e4m3;
  if (ds_mla) {
    expect_absent(kv.scales, "kv.scales", "kv_layout fp8_ds_mla records hold their scales");
  } else if (fp8 && p.quantization_granularity > 0) {
    expect_tensor(kv.scales, DType::f32, {num_blocks, 1, num_layers, p.page_size, 1, p.scales_per_token()},
                  "kv.scales");
    expect_aligned(kv.scales, 4, "kv.scales");
  } else {
    expect_absent(kv.scales, "kv.scales",
                  fp8 ? "quantization_granularity 0 means unit scales" : "a bf16 cache has no scales");
  }

  MLAJIT_EXPECT(layer_idx >= 0 && layer_idx < num_layers, "layer_idx", layer_idx,
                fmt::format("an integer in [0, num_layers={})", num_layers));
  MLAJIT_EXPECT(std::isfinite(softmax_scale), "softmax_scale", softmax_scale, "a finite number");
  // The Hopper kernel takes its running max from a finite floor over scaled scores, which needs a
  // scale >= 0; bf16 math falls back to the portable kernel for a negative one, FP8 math has none.
  MLAJIT_EXPECT(p.qk_math != QkMath::fp8 || softmax_scale >= 0.f, "softmax_scale", softmax_scale,
                ">= 0 with qk_math fp8 (its only kernel, the Hopper one, needs a non-negative scale; qk_math bf16 "
                "takes any)");

  // indices u32 [T, stride], stride a positive multiple of b_topk.
  expect_dtype(indices, DType::u32, "indices");
  expect_ndim(indices, 2, "indices");
  expect_dim(indices, 0, T, "indices");
  const int64_t stride = indices.shape[1];
  MLAJIT_EXPECT(stride > 0 && stride % p.b_topk == 0 && stride <= INT_MAX, "indices dim 1 (indices_stride)", stride,
                fmt::format("a positive multiple of b_topk={} (at most 2^31 - 1)", p.b_topk));
  expect_contiguous(indices, "indices");
  expect_nonnull(indices, "indices");
  expect_aligned(indices, 4, "indices");

  expect_tensor(topk_lengths, DType::u32, {T}, "topk_lengths");
  expect_aligned(topk_lengths, 4, "topk_lengths");

  if (p.attn_sink) {
    MLAJIT_EXPECT(attn_sink.ndim > 0, "attn_sink", "no tensor", fmt::format("f32[{}] (params.attn_sink is true)", H));
    expect_tensor(attn_sink, DType::f32, {H}, "attn_sink");
    expect_aligned(attn_sink, 4, "attn_sink");
  } else {
    expect_absent(attn_sink, "attn_sink", "params.attn_sink is false");
  }

  expect_tensor(out, DType::bf16, {T, H, kVDepth}, "out");
  expect_aligned(out, 16, "out");
  if (p.emit_lse) {
    MLAJIT_EXPECT(lse.ndim > 0, "lse", "no tensor", fmt::format("f32[{}, {}] (params.emit_lse is true)", T, H));
    expect_tensor(lse, DType::f32, {T, H}, "lse");
    expect_aligned(lse, 4, "lse");
  } else {
    expect_absent(lse, "lse", "params.emit_lse is false");
  }

  SparsePrefillArgs a{};
  a.q = q.data;
  a.kv_blocks = blocks.data;
  a.kv_scales = fp8 && p.quantization_granularity > 0 && !ds_mla ? static_cast<const float*>(kv.scales.data) : nullptr;
  a.indices = static_cast<const unsigned*>(indices.data);
  a.topk_lengths = static_cast<const unsigned*>(topk_lengths.data);
  a.attn_sink = p.attn_sink ? static_cast<const float*>(attn_sink.data) : nullptr;
  a.out = out.data;
  a.lse = p.emit_lse ? static_cast<float*>(lse.data) : nullptr;
  a.num_tokens = T;
  a.indices_stride = stride;
  a.row_stride = num_layers * p.page_size;  // kv_dim (1) * num_layers * page_size
  a.num_kv_rows = (num_blocks - 1) * a.row_stride + p.page_size;
  a.layer_row_offset = static_cast<long long>(layer_idx) * p.page_size;
  a.sm_scale = softmax_scale;
  a.sm_scale_log2e = static_cast<float>(static_cast<double>(softmax_scale) * 1.4426950408889634);
  a.partials = nullptr;  // bind_partials
  a.partial_slots = 0;
  a.split_first = 0;  // launch() sets the split; shift 0 = none (every unit is its own item)
  a.split_shift = 0;
  return a;
}

const char* stage_rows_name(StageRows r) {
  switch (r) {
    case StageRows::automatic: return "auto";
    case StageRows::all: return "all";
    case StageRows::marked: return "marked";
  }
  return "?";
}

StageRows parse_stage_rows(std::string_view name, const std::string& field) {
  if (name == "auto") return StageRows::automatic;
  if (name == "all") return StageRows::all;
  if (name == "marked") return StageRows::marked;
  throw_invalid(field, fmt::format("\"{}\"", name), "auto | all | marked");
}

bool stage_marks_rows(int64_t num_rows, int64_t num_tokens, int64_t indices_stride) {
  // Costs in bytes at copy bandwidth (measured on an H100): converting a row moves 1808 bytes (576 +
  // scales in, 1152 out); marking costs ~kMarkBytesPerSlot per slot (measured 6-8 ps per slot with
  // 64-row pages: the index load and a shared-memory atomic; each CTA then sets its pages' global
  // flags once), plus the conversion of the marked pages, which is unknown here (at most every
  // row). Marking is chosen where converting every row would cost more than twice the marking
  // itself, i.e. where it pays as soon as at most half the rows are selected.
  // Compared in double: the products may pass 2^63.
  constexpr double kConvertBytesPerRow = 1808.0, kMarkBytesPerSlot = 16.0;
  return static_cast<double>(num_rows) * kConvertBytesPerRow >
         2.0 * kMarkBytesPerSlot * static_cast<double>(num_tokens) * static_cast<double>(indices_stride);
}

bool stage_marks(const SparsePrefillStageArgs& sa, StageRows rows) {
  return rows == StageRows::marked ||
         (rows == StageRows::automatic && stage_marks_rows(sa.num_rows, sa.num_tokens, sa.indices_stride));
}

SparsePrefillStageArgs make_stage_args(const SparsePrefillParams& p, const ops::PagedCacheView& kv,
                                       const TensorView& workspace, SparsePrefillArgs& args) {
  SparsePrefillStageArgs sa{};
  if (p.kv_staging != KvStaging::bf16) return sa;
  const int64_t num_blocks = kv.blocks.shape[0];  // make_args checked the view
  const size_t need = staged_bytes(p, num_blocks, "kv.blocks dim 0 (num_blocks)");
  const size_t have = workspace.empty() ? 0 : static_cast<size_t>(workspace.numel()) * dtype_size(workspace.dtype);
  if (have < need)
    throw_invalid("workspace size (params.kv_staging bf16)", fmt::format("{} bytes", have),
                  fmt::format("at least {} bytes (a bf16 copy of the layer's {} rows and a flag byte per page; "
                              "sparse_prefill_workspace_bytes(params, num_blocks={}) = {} bytes adds the tail "
                              "split's partial slots)",
                              need, num_blocks * p.page_size, num_blocks, workspace_bytes(p, num_blocks)));
  expect_workspace_view(workspace);
  const int64_t num_rows = num_blocks * p.page_size;
  sa.indices = args.indices;
  sa.topk_lengths = args.topk_lengths;
  sa.kv_blocks = args.kv_blocks;
  sa.kv_scales = args.kv_scales;
  sa.rows = workspace.data;
  sa.page_flags = static_cast<unsigned char*>(workspace.data) + static_cast<size_t>(num_rows) * 1152;
  sa.num_blocks = num_blocks;
  sa.num_tokens = args.num_tokens;
  sa.indices_stride = args.indices_stride;
  sa.num_rows = num_rows;
  sa.row_stride = args.row_stride;
  sa.layer_row_offset = args.layer_row_offset;
  // The attention kernel reads the copy: one layer, row tma_row(e) = e, every encoded index of the
  // cache in range exactly as before (num_kv_rows = num_blocks * page_size).
  args.kv_blocks = workspace.data;
  args.kv_scales = nullptr;
  args.row_stride = p.page_size;
  args.layer_row_offset = 0;
  args.num_kv_rows = num_rows;
  return sa;
}

void bind_partials(const SparsePrefillParams& p, const ops::PagedCacheView& kv, const TensorView& workspace,
                   SparsePrefillArgs& args) {
  args.partials = nullptr;
  args.partial_slots = 0;
  // Specs without a splitting kernel do not look at the workspace (any view).
  if (workspace.empty() || !split_kernel(p)) return;
  expect_workspace_view(workspace);
  const size_t have = static_cast<size_t>(workspace.numel()) * dtype_size(workspace.dtype);
  const size_t offset = partials_offset(p, kv.blocks.shape[0]);  // make_args checked the view
  if (have <= offset) return;
  const auto slots = std::min<long long>(kMaxSplitSlots, static_cast<long long>((have - offset) / kPartialSlotBytes));
  if (slots == 0) return;
  args.partials = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace.data) + offset);
  args.partial_slots = slots;
}

TailSplit tail_split(int64_t items, int64_t grid, int64_t slots, int64_t indices_stride, int max_parts) {
  TailSplit sp;
  sp.first = items;
  sp.units = items;
  if (items <= 0 || grid <= 0) return sp;
  const int64_t r = items >= grid ? items % grid : items;
  if (r == 0) return sp;
  // Steps (128 keys) per part at least: in the tail of a launch of many items two (a part's fixed
  // cost, query tile, first gather, epilogue and its slot's 128 KB, is worth about one step, so
  // one-step parts would gain little over two-step ones and double the combine's reads); with fewer
  // items than the grid (decode: a batch of single tokens) one, since there the latency of an item
  // is the launch's. An explicit cap replaces that rule (one step per part at least). (Parts of one
  // 64-key block, which the one-item kernels can run, measured slower at batch 1 on an H100: 35.1
  // against 31.0 us, each CTA's fixed cost paid for half the keys and the combine reading twice the
  // slots.)
  const int64_t min_steps = items < grid ? 1 : 2;
  int64_t limit = std::min(grid / r, slots / r);
  limit = std::min<int64_t>(limit, max_parts > 0 ? std::min<int64_t>(max_parts, std::max<int64_t>(1, indices_stride / 128))
                                                 : std::max<int64_t>(1, indices_stride / (128 * min_steps)));
  // A power of two (the kernel walks units with shifts): the largest one within the limit.
  int64_t parts = 1;
  while (parts * 2 <= limit) parts *= 2;
  if (parts < 2) return sp;
  sp.first = items - r;
  sp.parts = static_cast<int>(parts);
  sp.units = sp.first + r * parts;
  return sp;
}

void stage(const Kernel& kernel, const SparsePrefillStageArgs& sa, StageRows rows, Stream stream) {
  if (sa.num_tokens == 0 || sa.num_rows == 0) return;
  const bool mark = stage_marks(sa, rows);
  // Grid-stride kernels: enough CTAs to fill the GPU several times over, never more than the work.
  const int64_t cap = 16 * static_cast<int64_t>(std::max(1, Runtime::global().sm_count()));
  auto dims = [&](int64_t ctas) {
    LaunchDims d;
    d.block[0] = static_cast<unsigned>(kStageThreads);
    d.grid[0] = static_cast<unsigned>(std::max<int64_t>(1, std::min(ctas, cap)));
    return d;
  };
  SparsePrefillStageArgs a = sa;
  if (mark) {
    const int64_t words = (sa.num_blocks + 15) / 16;
    kernel.launch(kEntryStageClear, dims((words + kStageThreads - 1) / kStageThreads), stream, a);
    // Few CTAs, each walking many tokens: the more tokens a CTA sees, the more of its slots its
    // shared-memory page set absorbs (stage_bf16.cuh mark_pages).
    LaunchDims md = dims(sa.num_tokens);
    md.grid[0] = static_cast<unsigned>(
        std::max<int64_t>(1, std::min<int64_t>(sa.num_tokens, 4 * static_cast<int64_t>(std::max(1, Runtime::global().sm_count())))));
    kernel.launch(kEntryStageMark, md, stream, a);
  } else {
    a.page_flags = nullptr;
  }
  constexpr int64_t kRowsPerCta = kStageThreads / 36;  // stage_bf16.cuh kRowsPerCta
  kernel.launch(kEntryStageConvert, dims((sa.num_rows + kRowsPerCta - 1) / kRowsPerCta), stream, a);
}

bool path_available(const SparsePrefillParams& p, const std::string& arch, Path path) {
  switch (path) {
    case Path::automatic: return portable_supported(p) || path_available(p, arch, Path::sm90);
    case Path::portable: return portable_supported(p);
    case Path::sm90: return arch == "sm_90a" && sm90_supported(p);
  }
  return false;
}

Path resolve_path(const SparsePrefillParams& p, const std::string& arch, Path requested) {
  if (!portable_supported(p)) {
    // qk_math fp8 and kv_layout fp8_ds_mla have one kernel, the Hopper one: anything else is
    // refused here, before a compile or a cache lookup, naming what it needs.
    if (p.qk_math == QkMath::fp8) {
      if (requested == Path::portable)
        throw_invalid("sparse_prefill path portable: params.qk_math", "fp8",
                      "bf16 (the portable kernel has no FP8 math; qk_math fp8 runs on the Hopper kernel only)");
      if (requested == Path::automatic && !path_available(p, arch, Path::sm90))
        throw_invalid("sparse_prefill with qk_math fp8: device arch", arch,
                      "sm_90a (FP8 tensor-core math runs on the Hopper kernel only; use qk_math bf16 on this device)");
    } else {
      if (requested == Path::portable)
        throw_invalid("sparse_prefill path portable: params.kv_layout", "fp8_ds_mla",
                      "split (fp8_ds_mla records are read by the Hopper kernel only)");
      if (requested == Path::automatic && !path_available(p, arch, Path::sm90))
        throw_invalid("sparse_prefill with kv_layout fp8_ds_mla: device arch", arch,
                      "sm_90a (fp8_ds_mla records are read by the Hopper kernel only; gather them to a split cache "
                      "with kv_cache_gather on this device)");
    }
  }
  switch (requested) {
    case Path::automatic:
      return path_available(p, arch, Path::sm90) && sm90_preferred(p) ? Path::sm90 : Path::portable;
    case Path::portable: return Path::portable;
    case Path::sm90:
      if (arch != "sm_90a") throw_invalid("sparse_prefill path sm90: device arch", arch, "sm_90a");
      if (!sm90_supported(p))
        throw_invalid("sparse_prefill path sm90: params", KernelSpec{p}.name(),
                      "quantization_granularity 0 or >= 16 for an fp8 cache (the sm90 kernel's scale tiles "
                      "need at least 16 elements per scale)");
      return Path::sm90;
  }
  return Path::portable;
}

namespace {

// Modules of the non-automatic path, per (device, spec, path): Runtime::get caches by spec only.
struct ForcedModules {
  std::mutex mu;
  std::map<std::tuple<int, std::string, int>, std::shared_ptr<const Kernel>> modules;
};

ForcedModules& forced_modules() {
  static ForcedModules* m = new ForcedModules;  // never destroyed: modules stay loaded until exit
  return *m;
}

}  // namespace

std::shared_ptr<const Kernel> kernel_for(const SparsePrefillParams& p, Path path, Stream stream) {
  if (path == Path::automatic) throw_error(ErrorKind::Internal, "sparse_prefill::kernel_for needs a resolved path");
  Runtime& rt = Runtime::global();
  const std::string arch = rt.arch();
  const KernelSpec spec{p};
  // What the automatic source compiles on this arch (generate.cpp: MLAJIT_SPARSE_PREFILL_HOPPER).
  const bool auto_is_sm90 = arch == "sm_90a" && sm90_supported(p) && sm90_preferred(p);
  if ((path == Path::sm90) == auto_is_sm90) return rt.get_for_launch(spec, stream);
  const int device = driver::ensure_context();
  auto& fm = forced_modules();
  const auto key = std::make_tuple(device, spec.canonical(), static_cast<int>(path));
  std::lock_guard<std::mutex> lk(fm.mu);
  auto it = fm.modules.find(key);
  if (it != fm.modules.end()) return it->second;
  if (driver::stream_capturing(stream))
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("sparse_prefill kernel {} ({} path) is not loaded and the launch stream is being captured "
                            "into a CUDA graph: precompile or load before capture (one launch before capturing)",
                            spec.canonical(), path == Path::sm90 ? "sm90" : "portable"));
  auto k = rt.load_source(generate_sparse_prefill_mode(spec, path));
  fm.modules.emplace(key, k);
  return k;
}

int64_t launch_ctas(const SparsePrefillParams& p, Path path, int64_t num_tokens, int64_t grid_ctas) {
  MLAJIT_EXPECT(grid_ctas >= 0, "grid_ctas", grid_ctas, ">= 0 (0 = automatic)");
  bool persistent = false;
  int head_tiles;
  if (path == Path::sm90) {
    const Sm90Plan plan = sm90_plan(p);
    persistent = plan.persistent;
    head_tiles = plan.head_tiles;
  } else {
    head_tiles = portable_plan(p).head_tiles;
  }
  if (grid_ctas > 0 && !persistent)
    throw_invalid("grid_ctas", grid_ctas, "0: only the persistent sm90 kernel (a bf16 cache) takes a grid size");
  const int64_t items = num_tokens * head_tiles;
  MLAJIT_EXPECT(items <= INT_MAX, "q dim 0 (tokens)", num_tokens, fmt::format("at most {} tokens per launch", INT_MAX / head_tiles));
  if (!persistent) return items;
  // Each CTA walks items with the grid's stride; never more CTAs than items.
  return std::min(items, persistent_ctas_budget(grid_ctas));
}

bool crossover_taken(const SparsePrefillParams& p, Path path, int64_t num_tokens, Crossover crossover) {
  const bool available = path == Path::sm90 && crossover_kernel(p);
  if (crossover == Crossover::on && !available)
    throw_invalid("sparse_prefill crossover", "on",
                  fmt::format("a spec whose Hopper kernel has it (fp8 group scales decoded to bf16 tiles, one scale "
                              "per 16-element chunk, 80-128 heads), on the sm90 path; params {}",
                              KernelSpec{p}.name()));
  if (!available || crossover == Crossover::off) return false;
  return crossover == Crossover::on || num_tokens <= kCrossoverMaxTokens;
}

int64_t crossover_resident_clusters(const Kernel& kernel, const SparsePrefillParams& p) {
  const Sm90Plan plan = sm90_plan(p);
  LaunchDims d;
  d.block[0] = static_cast<unsigned>(plan.threads);
  d.smem_bytes = static_cast<unsigned>(plan.smem_bytes);
  d.cluster[0] = 2u;
  return kernel.max_active_clusters(kEntrySm90, d);
}

TailSplit launch(const Kernel& kernel, const SparsePrefillParams& p, Path path, const SparsePrefillArgs& args,
                 Stream stream, int64_t grid_ctas, int max_split_parts, Crossover crossover) {
  int64_t ctas = launch_ctas(p, path, args.num_tokens, grid_ctas);
  const bool xo = crossover_taken(p, path, args.num_tokens, crossover);  // (refuses `on` without one)
  TailSplit split;
  if (args.num_tokens == 0) return split;
  LaunchDims d;
  int entry;
  int heads_per_cta = 0;  // the combine's grid rows
  SparsePrefillArgs a = args;
  a.split_first = 0;
  a.split_shift = 0;
  a.crossover = 0;
  if (path == Path::sm90) {
    const Sm90Plan plan = sm90_plan(p);
    entry = kEntrySm90;
    d.block[0] = static_cast<unsigned>(plan.threads);
    d.smem_bytes = static_cast<unsigned>(plan.smem_bytes);
    heads_per_cta = plan.heads_per_cta;
    const int64_t items = args.num_tokens * plan.head_tiles;
    split.first = split.units = items;
    a.crossover = xo ? 1 : 0;
    d.cluster[0] = xo ? 2u : 1u;
    if (split_kernel(p) && args.partials != nullptr && args.partial_slots > 0) {
      // The persistent kernel: its grid (one CTA per SM). One CTA per unit (fp8): the SMs that one
      // wave of it covers (its shared memory allows one CTA per SM), so that the last wave's items,
      // or all of them when there are fewer than SMs (decode), are split to fill it.
      const int64_t budget = plan.persistent ? persistent_ctas_budget(grid_ctas) : persistent_ctas_budget(0);
      if (xo) {
        // The crossover: a token's CTAs (one cluster) must take the same keys, so the split is one
        // of tokens over clusters; its units and slots come in pairs, a token part's two CTAs
        // adjacent (templates/sparse_prefill/sm90_persistent.cuh, cta_work).
        constexpr int64_t c = 2;  // CTAs per cluster: the token's two head tiles
        // The clusters one wave holds: the SMs' pairs where every GPC's usable SMs pair up, fewer
        // where some do not (a cluster's CTAs share a GPC), and a split sized to SMs / 2 would
        // leave its last clusters a second wave. (An H100 SXM holds all 66 of its pairs.)
        const int64_t resident = crossover_resident_clusters(kernel, p);
        const int64_t clusters = resident > 0 ? std::min(budget / c, resident) : budget / c;
        split = tail_split(args.num_tokens, clusters, args.partial_slots / c, args.indices_stride, max_split_parts);
        split.first *= c;
        split.units *= c;
      } else {
        split = tail_split(items, budget, args.partial_slots, args.indices_stride, max_split_parts);
      }
      if (split.parts > 1 && split.units > INT_MAX) split = TailSplit{items, 1, items};  // 32-bit units: unsplit
      if (split.parts > 1) {
        a.split_first = static_cast<int>(split.first);
        while ((1 << a.split_shift) < split.parts) ++a.split_shift;  // tail_split gives a power of two
        ctas = plan.persistent ? std::min(split.units, budget) : split.units;
      }
    }
  } else {
    const PortablePlan plan = portable_plan(p);
    entry = kEntryPortable;
    d.block[0] = static_cast<unsigned>(plan.threads);
    d.smem_bytes = static_cast<unsigned>(plan.smem_bytes);
  }
  d.grid[0] = static_cast<unsigned>(ctas);
  kernel.launch(entry, d, stream, a);
  if (split.parts > 1) {
    // One CTA per (split item, head row of the tile), 4 dims per thread.
    LaunchDims c;
    c.block[0] = static_cast<unsigned>(kCombineThreads);
    c.grid[0] = static_cast<unsigned>(split.units - split.first) / static_cast<unsigned>(split.parts);
    c.grid[1] = static_cast<unsigned>(heads_per_cta);
    // Programmatic: the combine's launch and its CTAs' start overlap the attention kernel's tail
    // (its CTAs signal at their start, and the combine waits for its completion before reading).
    c.programmatic = true;
    kernel.launch(kEntrySm90Combine, c, stream, a);
  }
  return split;
}

void run(const SparsePrefillParams& p, const TensorView& q, const ops::PagedCacheView& kv, const TensorView& indices,
         const TensorView& topk_lengths, int layer_idx, float softmax_scale, const TensorView& attn_sink,
         const TensorView& out, const TensorView& lse, const TensorView& workspace, Path path, Stream stream,
         StageRows stage_rows) {
  SparsePrefillArgs args = make_args(p, q, kv, indices, topk_lengths, layer_idx, softmax_scale, attn_sink, out, lse);
  const SparsePrefillStageArgs stage_args = make_stage_args(p, kv, workspace, args);
  bind_partials(p, kv, workspace, args);
  if (args.num_tokens == 0) return;  // nothing to compute: no compile, no launch
  Runtime& rt = Runtime::global();
  Path chosen = resolve_path(p, rt.arch(), path);
  // The wgmma kernel takes its running max over scaled scores starting from a finite floor, which
  // needs scale >= 0; a negative scale (legal in SPEC §3) runs on the portable kernel (qk_math fp8,
  // which has none, refused it in make_args).
  if (chosen == Path::sm90 && softmax_scale < 0.f) {
    if (path == Path::sm90)
      throw_invalid("softmax_scale (sm90 path)", softmax_scale, ">= 0 on the sm90 kernel (the portable path takes any)");
    chosen = Path::portable;
  }
  auto kernel = kernel_for(p, chosen, stream);
  if (p.kv_staging == KvStaging::bf16) stage(*kernel, stage_args, stage_rows, stream);
  launch(*kernel, p, chosen, args, stream);
}

}  // namespace sparse_prefill

namespace ops {

size_t sparse_prefill_workspace_bytes(const SparsePrefillParams& p, int64_t num_blocks) {
  p.validate();
  MLAJIT_EXPECT(num_blocks >= 1, "num_blocks", num_blocks, "at least 1 (kv.blocks dim 0)");
  return sparse_prefill::workspace_bytes(p, num_blocks, "num_blocks");
}

void sparse_prefill(const SparsePrefillParams& requested, const TensorView& q, const PagedCacheView& kv,
                    const TensorView& indices, const TensorView& topk_lengths, int layer_idx, float softmax_scale,
                    const TensorView& attn_sink, const TensorView& out, const TensorView& lse,
                    const TensorView& workspace, Stream stream) {
  requested.validate();
  const SparsePrefillParams p = tuned_or_heuristic(
      requested, autotune::bucket_sparse_prefill(dim_or_zero(q, 0), dim_or_zero(indices, 1)));
  sparse_prefill::run(p, q, kv, indices, topk_lengths, layer_idx, softmax_scale, attn_sink, out, lse, workspace,
                      sparse_prefill::Path::automatic, stream);
}

void sparse_prefill(const SparsePrefillParams& requested, const TensorView& q, const PagedCacheView& kv,
                    const TensorView& indices, const TensorView& topk_lengths, int layer_idx, float softmax_scale,
                    const TensorView& attn_sink, const TensorView& out, const TensorView& lse, Stream stream) {
  sparse_prefill(requested, q, kv, indices, topk_lengths, layer_idx, softmax_scale, attn_sink, out, lse, TensorView{},
                 stream);
}

}  // namespace ops

}  // namespace mlajit

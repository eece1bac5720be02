// The C API: converts C views to mlajit views, errors to status codes + a thread-local message.
#include "mlajit/c_api.h"

#include <cstddef>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/input.hpp"
#include "core/tensor_limits.hpp"
#include "mlajit/build.hpp"
#include "mlajit/cache.hpp"
#include "mlajit/config.hpp"
#include "mlajit/driver.hpp"
#include "mlajit/error.hpp"
#include "mlajit/info.hpp"
#include "mlajit/log_sink.hpp"
#include "mlajit/ops.hpp"
#include "mlajit/runtime.hpp"
#include "mlajit/version.hpp"

// A runtime of the host's own (mlajit_runtime_create_with_options). Shared with its ops, so that
// either may be destroyed first.
struct RuntimeHolder {
  std::shared_ptr<mlajit::DiskCache> disk_cache;  // nullptr: disabled
  std::unique_ptr<mlajit::Runtime> runtime;
};

struct mlajit_runtime_s {
  std::shared_ptr<RuntimeHolder> holder;
  std::string cache_dir;  // mlajit_runtime_cache_dir's string
};

struct mlajit_op_s {
  mlajit::KernelSpec spec;
  std::string description;
  std::shared_ptr<RuntimeHolder> runtime;  // nullptr: the process-wide runtime
};

namespace {

thread_local std::string g_last_error;

mlajit_status status_of(mlajit::ErrorKind k) { return static_cast<mlajit_status>(static_cast<int>(k)); }

// Runs `f`, mapping exceptions to a status and the thread's last-error string.
template <typename F>
mlajit_status guarded(F&& f) {
  try {
    f();
    g_last_error.clear();
    return MLAJIT_OK;
  } catch (const mlajit::Error& e) {
    g_last_error = e.what();
    return status_of(e.kind());
  } catch (const std::exception& e) {
    g_last_error = std::string("internal error: ") + e.what();
    return MLAJIT_ERROR_INTERNAL;
  }
}

// guarded(f) with the op's runtime as the thread's Runtime::global() (see Runtime::Scope).
template <typename F>
mlajit_status guarded_on(mlajit_op op, F&& f) {
  if (op == nullptr || !op->runtime) return guarded(std::forward<F>(f));
  mlajit::Runtime::Scope scope(op->runtime->runtime.get());
  return guarded(std::forward<F>(f));
}

mlajit::DType dtype_of(int32_t d, const char* what) {
  if (d < MLAJIT_F32 || d > MLAJIT_U8) mlajit::throw_invalid(std::string(what) + ".dtype", d, "an mlajit_dtype (0..6)");
  return static_cast<mlajit::DType>(d);
}

// The byte extent of a C tensor must fit in int64 (and so in size_t) and in an address space: its
// byte size, and with strides the byte offset one past its last element, at most
// kMaxTensorBytes, with data + extent not wrapping around. A product that wraps (a blocks
// tensor with dim 0 = 2^62, say) or an extent no memory can hold (dim 0 = 2^40 of a 61-layer cache)
// would otherwise pass every later shape check and reach the driver.
void check_extent(const mlajit_tensor* t, mlajit::DType dtype, bool strided, const char* what) {
  const int64_t esize = static_cast<int64_t>(mlajit::dtype_size(dtype));
  std::string shape;
  for (int d = 0; d < t->ndim; ++d) shape += fmt::format("{}{}", d ? ", " : "", t->shape[d]);
  for (int d = 0; d < t->ndim; ++d)
    if (t->shape[d] < 0) mlajit::throw_invalid(fmt::format("{}.shape[{}]", what, d), t->shape[d], "a non-negative size");
  auto overflow = [&](const char* which) {
    mlajit::throw_invalid(fmt::format("{}.{}", what, which),
                          fmt::format("shape [{}] of {} ({} bytes per element)", shape, mlajit::dtype_name(dtype), esize),
                          fmt::format("a tensor of at most 2^{} bytes (no address space holds more)",
                                      mlajit::kMaxTensorBytesLog2));
  };
  auto check = [&](int64_t extent, const char* which) {
    if (extent > mlajit::kMaxTensorBytes ||
        reinterpret_cast<uintptr_t>(t->data) > UINTPTR_MAX - static_cast<uintptr_t>(extent))
      overflow(which);
  };
  // Every nonzero dim counts (a zero dim makes the size 0, but products of the others are still
  // formed elsewhere).
  int64_t bytes = esize;
  for (int d = 0; d < t->ndim; ++d)
    if (t->shape[d] != 0 && __builtin_mul_overflow(bytes, t->shape[d], &bytes)) overflow("shape");
  check(bytes, "shape");
  if (!strided) return;
  int64_t last = 0;  // offset of the last element, in elements
  for (int d = 0; d < t->ndim; ++d) {
    if (t->shape[d] <= 1) continue;
    const int64_t stride = t->strides[d];
    if (stride == INT64_MIN) overflow("strides");
    int64_t step = 0;
    if (__builtin_mul_overflow(t->shape[d] - 1, stride < 0 ? -stride : stride, &step) ||
        __builtin_add_overflow(last, step, &last))
      overflow("strides");
  }
  int64_t extent = 0;
  if (__builtin_add_overflow(last, int64_t{1}, &extent) || __builtin_mul_overflow(extent, esize, &extent))
    overflow("strides");
  check(extent, "strides");
}

// A C tensor to a view; NULL gives an empty view (absent optional argument).
mlajit::TensorView view_of(const mlajit_tensor* t, const char* what) {
  mlajit::TensorView v;
  if (t == nullptr) return v;
  if (t->ndim < 0 || t->ndim > MLAJIT_MAX_DIMS)
    mlajit::throw_invalid(std::string(what) + ".ndim", t->ndim, "0..6");
  const mlajit::DType dtype = dtype_of(t->dtype, what);
  bool any_stride = false;
  for (int d = 0; d < t->ndim; ++d) any_stride |= t->strides[d] != 0;
  check_extent(t, dtype, any_stride, what);
  v = mlajit::TensorView(t->data, dtype, t->shape, t->ndim);
  if (any_stride)
    for (int d = 0; d < t->ndim; ++d) v.strides[d] = t->strides[d];
  return v;
}

// A required argument given as NULL is named as such, before any other check: an empty view would
// otherwise fail a later check with a misleading message (its default dtype, rank or size).
void need(const void* t, const std::string& what) {
  if (t == nullptr)
    throw mlajit::Error(mlajit::ErrorKind::InvalidArgument,
                        fmt::format("{}: no tensor given (NULL); this argument is required", what));
}

// The cache's required members: blocks always, scales for an fp8 cache of the split layout, lookup_table and
// cache_lengths when the op reads them.
void need_cache(const mlajit_paged_cache* c, const char* what, bool scales, bool table, bool lengths) {
  if (c == nullptr) mlajit::throw_invalid(what, "NULL", "a mlajit_paged_cache");
  need(c->blocks, std::string(what) + ".blocks");
  if (scales) need(c->scales, std::string(what) + ".scales");
  if (table) need(c->lookup_table, std::string(what) + ".lookup_table");
  if (lengths) need(c->cache_lengths, std::string(what) + ".cache_lengths");
}

mlajit::ops::PagedCacheView cache_of(const mlajit_paged_cache* c, const char* what) {
  if (c == nullptr) mlajit::throw_invalid(what, "NULL", "a mlajit_paged_cache");
  const std::string w(what);
  return {view_of(c->blocks, (w + ".blocks").c_str()), view_of(c->scales, (w + ".scales").c_str()),
          view_of(c->lookup_table, (w + ".lookup_table").c_str()),
          view_of(c->cache_lengths, (w + ".cache_lengths").c_str())};
}

template <typename P>
const P& params_of(mlajit_op op, const char* fn) {
  if (op == nullptr) mlajit::throw_invalid(std::string(fn) + ": op", "NULL", "an op from mlajit_op_create");
  const P* p = std::get_if<P>(&op->spec.params);
  if (p == nullptr)
    mlajit::throw_invalid(std::string(fn) + ": op", mlajit::op_name(op->spec.op()), "an op of the matching kind");
  return *p;
}

// Specs are parsed as every JSON input: at most 1 MiB of text (C strings have no other bound), the
// nesting limit and duplicate keys refused, bounded excerpts in messages.
constexpr size_t kMaxSpecJsonBytes = 1 << 20;

mlajit::KernelSpec spec_of(const char* json_text) {
  if (json_text == nullptr) mlajit::throw_invalid("spec_json", "NULL", "a JSON string");
  const size_t len = ::strnlen(json_text, kMaxSpecJsonBytes + 1);
  if (len > kMaxSpecJsonBytes)
    mlajit::throw_invalid("spec_json", fmt::format("more than {} bytes", kMaxSpecJsonBytes),
                          fmt::format("a spec of at most {} bytes", kMaxSpecJsonBytes));
  return mlajit::kernel_spec_from_json(mlajit::parse_json_input(std::string_view(json_text, len), "spec_json", "spec"),
                                       "spec");
}

}  // namespace

namespace {

// Both prefill entry points. `fn`: the caller's name for errors; `has_workspace`: whether it takes one.
mlajit_status sparse_prefill_call(const char* fn, bool has_workspace, mlajit_op op, const mlajit_tensor* q,
                                  const mlajit_paged_cache* kv, const mlajit_tensor* indices,
                                  const mlajit_tensor* topk_lengths, int layer_idx, float softmax_scale,
                                  const mlajit_tensor* attn_sink, const mlajit_tensor* out, const mlajit_tensor* lse,
                                  const mlajit_tensor* workspace, void* stream) {
  return guarded_on(op, [&] {
    const auto& p = params_of<mlajit::SparsePrefillParams>(op, fn);
    need(q, "q");
    need_cache(kv, "kv", p.scales_per_token() > 0, false, false);  // (fp8_ds_mla records hold their scales)
    need(indices, "indices");
    need(topk_lengths, "topk_lengths");
    if (p.attn_sink) need(attn_sink, "attn_sink");
    need(out, "out");
    if (p.emit_lse) need(lse, "lse");
    if (p.kv_staging == mlajit::KvStaging::bf16) {
      if (!has_workspace)
        mlajit::throw_invalid(std::string(fn) + " with params.kv_staging bf16", "no workspace argument",
                              "mlajit_sparse_prefill_ws with a workspace of mlajit_sparse_prefill_workspace_bytes() bytes");
      need(workspace, "workspace");
    }
    mlajit::ops::sparse_prefill(p, view_of(q, "q"),
                                cache_of(kv, "kv"), view_of(indices, "indices"), view_of(topk_lengths, "topk_lengths"),
                                layer_idx, softmax_scale, view_of(attn_sink, "attn_sink"), view_of(out, "out"),
                                view_of(lse, "lse"), view_of(workspace, "workspace"), stream);
  });
}

}  // namespace

extern "C" {

const char* mlajit_version(void) { return MLAJIT_VERSION_STRING; }
const char* mlajit_last_error(void) { return g_last_error.c_str(); }

const char* mlajit_info_json(void) {
  thread_local std::string text;
  try {
    text = mlajit::runtime_info().dump();
  } catch (const std::exception& e) {
    text = nlohmann::json{{"error", e.what()}}.dump();
  }
  return text.c_str();
}

mlajit_status mlajit_set_log_callback(mlajit_log_callback fn, void* user, int level) {
  return guarded([&] {
    if (level < -1 || level > 3) mlajit::throw_invalid("level", level, "-1 (keep) or 0..3 (error, warn, info, debug)");
    if (level >= 0) mlajit::log::set_level(static_cast<mlajit::log::Level>(level));
    struct Target {
      mlajit_log_callback fn;
      void* user;
    };
    // Leaked on replacement: a thread may still be inside the previous callback.
    static Target* current = nullptr;
    if (fn == nullptr) {
      mlajit::log::set_sink(nullptr, nullptr);
      return;
    }
    current = new Target{fn, user};
    mlajit::log::set_sink(
        [](mlajit::log::Level l, std::string_view msg, void* u) {
          auto* t = static_cast<Target*>(u);
          std::string text(msg);  // NUL-terminated for C
          t->fn(static_cast<int>(l), text.c_str(), t->user);
        },
        current);
  });
}

mlajit_status mlajit_set_device(int ordinal) {
  return guarded([&] { mlajit::driver::set_device(ordinal); });
}

mlajit_status mlajit_op_create(const char* spec_json, mlajit_op* out) { return mlajit_op_create_in(nullptr, spec_json, out); }

mlajit_status mlajit_op_create_in(mlajit_runtime rt, const char* spec_json, mlajit_op* out) {
  return guarded([&] {
    if (out == nullptr) mlajit::throw_invalid("out", "NULL", "a pointer to receive the op");
    auto op = std::make_unique<mlajit_op_s>();
    op->spec = spec_of(spec_json);
    op->description = mlajit::to_json(op->spec).dump();
    if (rt) op->runtime = rt->holder;
    *out = op.release();
  });
}

void mlajit_op_destroy(mlajit_op op) { delete op; }

mlajit_status mlajit_op_load(mlajit_op op) {
  return guarded_on(op, [&] {
    if (op == nullptr) mlajit::throw_invalid("op", "NULL", "an op from mlajit_op_create");
    (void)mlajit::Runtime::global().get(op->spec);
  });
}

const char* mlajit_op_describe(mlajit_op op) { return op ? op->description.c_str() : "null"; }

mlajit_status mlajit_precompile(const char* spec_json, const char* arch, int* cache_hit) {
  return guarded([&] {
    if (arch == nullptr) mlajit::throw_invalid("arch", "NULL", "an architecture like \"sm_90a\"");
    auto r = mlajit::build_kernel(spec_of(spec_json), arch);
    if (cache_hit) *cache_hit = r.cache_hit ? 1 : 0;
  });
}

mlajit_status mlajit_runtime_create_with_options(const mlajit_runtime_options* options, mlajit_runtime* out) {
  return guarded([&] {
    if (out == nullptr) mlajit::throw_invalid("out", "NULL", "a pointer to receive the runtime");
    // Fields past the caller's struct_size keep their defaults (an older host's smaller struct).
    mlajit_runtime_options o{};
    if (options) {
      if (options->struct_size < offsetof(mlajit_runtime_options, cache_path) + sizeof(o.cache_path) ||
          options->struct_size > sizeof(o))
        mlajit::throw_invalid("options->struct_size", options->struct_size,
                              fmt::format("sizeof(mlajit_runtime_options) ({}) of this or an earlier header", sizeof(o)));
      std::memcpy(&o, options, options->struct_size);
    }
    auto holder = std::make_shared<RuntimeHolder>();
    mlajit::RuntimeOptions ro;
    if (o.disable_disk_cache) {
      ro.disk_cache_enabled = false;
    } else {
      std::optional<uint64_t> cap = o.cache_max_bytes ? std::optional<uint64_t>(o.cache_max_bytes)
                                                      : mlajit::config::cache_max_bytes();
      std::vector<std::string> dirs;
      if (o.cache_path == nullptr) {
        dirs = mlajit::config::cache_path();
      } else {
        for (const char* p = o.cache_path; *p;) {
          const char* end = std::strchr(p, ':');
          std::string dir = end ? std::string(p, end) : std::string(p);
          if (!dir.empty()) dirs.push_back(dir);
          p = end ? end + 1 : p + std::strlen(p);
        }
        if (dirs.empty())
          mlajit::throw_invalid("options->cache_path", fmt::format("\"{}\"", o.cache_path), "directories separated by ':'");
      }
      holder->disk_cache = std::make_shared<mlajit::DiskCache>(dirs, cap);
      ro.disk_cache = holder->disk_cache;
    }
    holder->runtime = mlajit::Runtime::create(std::move(ro));
    auto rt = std::make_unique<mlajit_runtime_s>();
    if (holder->disk_cache && holder->disk_cache->writable()) rt->cache_dir = holder->disk_cache->dir();
    rt->holder = std::move(holder);
    *out = rt.release();
  });
}

void mlajit_runtime_destroy(mlajit_runtime rt) { delete rt; }

const char* mlajit_runtime_cache_dir(mlajit_runtime rt) { return rt ? rt->cache_dir.c_str() : ""; }

mlajit_status mlajit_runtime_precompile(mlajit_runtime rt, const char* spec_json, const char* arch, int* cache_hit) {
  return guarded([&] {
    if (rt == nullptr) mlajit::throw_invalid("rt", "NULL", "a runtime from mlajit_runtime_create_with_options");
    if (arch == nullptr) mlajit::throw_invalid("arch", "NULL", "an architecture like \"sm_90a\"");
    if (!rt->holder->disk_cache)
      throw mlajit::Error(mlajit::ErrorKind::Cache, "mlajit_runtime_precompile: the runtime's disk cache is disabled");
    auto r = mlajit::build_kernel(spec_of(spec_json), arch, rt->holder->disk_cache.get());
    if (cache_hit) *cache_hit = r.cache_hit ? 1 : 0;
  });
}

mlajit_status mlajit_kv_cache_store(mlajit_op op, const mlajit_tensor* x, const mlajit_tensor* input_row_offsets,
                                    const mlajit_paged_cache* cache, int layer_idx, int kv_idx,
                                    const mlajit_tensor* dropped, void* stream) {
  return guarded_on(op, [&] {
    const auto& p = params_of<mlajit::KvCacheStoreParams>(op, "mlajit_kv_cache_store");
    need(x, "x");
    need(input_row_offsets, "input_row_offsets");
    need_cache(cache, "cache", p.cache.split_scales(), /*table=*/true, /*lengths=*/true);
    mlajit::ops::kv_cache_store(p, view_of(x, "x"),
                                view_of(input_row_offsets, "input_row_offsets"), cache_of(cache, "cache"), layer_idx,
                                kv_idx, view_of(dropped, "dropped"), stream);
  });
}

mlajit_status mlajit_kv_cache_gather(mlajit_op op, const mlajit_paged_cache* cache, const mlajit_tensor* batch_ids,
                                     const mlajit_tensor* positions, int layer_idx, int kv_idx,
                                     const mlajit_tensor* y, const mlajit_tensor* dropped, void* stream) {
  return guarded_on(op, [&] {
    const auto& p = params_of<mlajit::KvCacheGatherParams>(op, "mlajit_kv_cache_gather");
    need_cache(cache, "cache", p.cache.split_scales(), /*table=*/true, /*lengths=*/false);
    need(batch_ids, "batch_ids");
    need(positions, "positions");
    need(y, "y");
    mlajit::ops::kv_cache_gather(p,
                                 cache_of(cache, "cache"), view_of(batch_ids, "batch_ids"),
                                 view_of(positions, "positions"), layer_idx, kv_idx, view_of(y, "y"),
                                 view_of(dropped, "dropped"), stream);
  });
}

mlajit_status mlajit_sparse_index_remap(mlajit_op op, const mlajit_tensor* indices,
                                        const mlajit_tensor* input_row_offsets, const mlajit_tensor* lookup_table,
                                        int64_t num_blocks, const mlajit_tensor* out, void* stream) {
  return guarded_on(op, [&] {
    const auto& p = params_of<mlajit::SparseIndexRemapParams>(op, "mlajit_sparse_index_remap");
    need(indices, "indices");
    need(input_row_offsets, "input_row_offsets");
    need(lookup_table, "lookup_table");
    need(out, "out");
    mlajit::ops::sparse_index_remap(p,
                                    view_of(indices, "indices"), view_of(input_row_offsets, "input_row_offsets"),
                                    view_of(lookup_table, "lookup_table"), num_blocks, view_of(out, "out"), stream);
  });
}

mlajit_status mlajit_mla_indexer_workspace_bytes(mlajit_op op, int64_t total_tokens, int64_t max_keys_per_seq,
                                                 size_t* bytes) {
  return guarded_on(op, [&] {
    if (bytes == nullptr) mlajit::throw_invalid("bytes", "NULL", "a pointer to receive the size");
    *bytes = mlajit::ops::mla_indexer_workspace_bytes(
        params_of<mlajit::MlaIndexerParams>(op, "mlajit_mla_indexer_workspace_bytes"), total_tokens,
        max_keys_per_seq);
  });
}

mlajit_status mlajit_mla_indexer(mlajit_op op, const mlajit_tensor* q, const mlajit_tensor* qs,
                                 const mlajit_tensor* input_row_offsets, const mlajit_paged_cache* k_cache,
                                 int layer_idx, int64_t max_keys_per_seq, const mlajit_tensor* out,
                                 const mlajit_tensor* workspace, void* stream) {
  return guarded_on(op, [&] {
    const auto& p = params_of<mlajit::MlaIndexerParams>(op, "mlajit_mla_indexer");
    need(q, "q");
    need(qs, "qs");
    need(input_row_offsets, "input_row_offsets");
    // k_layout fp8_page_scales: the pages hold the scales (no scales tensor).
    need_cache(k_cache, "k_cache", /*scales=*/p.k_layout != mlajit::CacheLayout::fp8_page_scales, /*table=*/true,
               /*lengths=*/true);
    need(out, "out");
    need(workspace, "workspace");
    mlajit::ops::mla_indexer(p, view_of(q, "q"),
                             view_of(qs, "qs"), view_of(input_row_offsets, "input_row_offsets"),
                             cache_of(k_cache, "k_cache"), layer_idx, max_keys_per_seq, view_of(out, "out"),
                             view_of(workspace, "workspace"), stream);
  });
}

mlajit_status mlajit_sparse_prefill_workspace_bytes(mlajit_op op, int64_t num_blocks, size_t* bytes) {
  return guarded_on(op, [&] {
    if (bytes == nullptr) mlajit::throw_invalid("bytes", "NULL", "a pointer to receive the size");
    *bytes = mlajit::ops::sparse_prefill_workspace_bytes(
        params_of<mlajit::SparsePrefillParams>(op, "mlajit_sparse_prefill_workspace_bytes"), num_blocks);
  });
}

mlajit_status mlajit_sparse_prefill(mlajit_op op, const mlajit_tensor* q, const mlajit_paged_cache* kv,
                                    const mlajit_tensor* indices, const mlajit_tensor* topk_lengths, int layer_idx,
                                    float softmax_scale, const mlajit_tensor* attn_sink, const mlajit_tensor* out,
                                    const mlajit_tensor* lse, void* stream) {
  return sparse_prefill_call("mlajit_sparse_prefill", false, op, q, kv, indices, topk_lengths, layer_idx,
                             softmax_scale, attn_sink, out, lse, nullptr, stream);
}

mlajit_status mlajit_sparse_prefill_ws(mlajit_op op, const mlajit_tensor* q, const mlajit_paged_cache* kv,
                                       const mlajit_tensor* indices, const mlajit_tensor* topk_lengths, int layer_idx,
                                       float softmax_scale, const mlajit_tensor* attn_sink, const mlajit_tensor* out,
                                       const mlajit_tensor* lse, const mlajit_tensor* workspace, void* stream) {
  return sparse_prefill_call("mlajit_sparse_prefill_ws", true, op, q, kv, indices, topk_lengths, layer_idx,
                             softmax_scale, attn_sink, out, lse, workspace, stream);
}

}  // extern "C"

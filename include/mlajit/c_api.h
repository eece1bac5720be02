/* mlajit C API: opaque handles, status codes and a thread-local last-error string, so that Python
 * (ctypes) or any serving process can specialize, compile and launch the ops with raw device
 * pointers. Every function returns an mlajit_status; on failure mlajit_last_error() says what was
 * wrong, the value and what was expected. Nothing here synchronizes the stream.
 *
 *   mlajit_op op;
 *   if (mlajit_op_create("{\"op\":\"kv_cache_store\",\"params\":{\"dtype\":\"fp8_e4m3\",...}}", &op))
 *     fprintf(stderr, "%s\n", mlajit_last_error());
 *   mlajit_tensor x = {x_ptr, MLAJIT_BF16, 3, {T, 1, 576}};
 *   mlajit_kv_cache_store(op, &x, &offsets, &cache, layer, 0, NULL, stream);
 */
#ifndef MLAJIT_C_API_H
#define MLAJIT_C_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mlajit_status {
  MLAJIT_OK = 0,
  MLAJIT_ERROR_INVALID_ARGUMENT = 1, /* bad params, JSON, shapes, dtypes */
  MLAJIT_ERROR_COMPILE = 2,          /* NVRTC rejected the generated source */
  MLAJIT_ERROR_DRIVER = 3,           /* no CUDA driver/device, or a driver call failed */
  MLAJIT_ERROR_CACHE = 4,            /* cache directory unusable or refused */
  MLAJIT_ERROR_IO = 5,
  MLAJIT_ERROR_INTERNAL = 6
} mlajit_status;

typedef enum mlajit_dtype {
  MLAJIT_F32 = 0,
  MLAJIT_F16 = 1,
  MLAJIT_BF16 = 2,
  MLAJIT_FP8_E4M3 = 3,
  MLAJIT_U32 = 4,
  MLAJIT_I32 = 5,
  MLAJIT_U8 = 6 /* raw bytes: the records of a layout "fp8_ds_mla" cache, the pages of "fp8_page_scales" */
} mlajit_dtype;

#define MLAJIT_MAX_DIMS 6

/* A tensor view. strides are in elements; all-zero strides mean contiguous row-major. A NULL
 * mlajit_tensor pointer is an absent optional argument. */
typedef struct mlajit_tensor {
  void* data;
  int32_t dtype; /* mlajit_dtype */
  int32_t ndim;
  int64_t shape[MLAJIT_MAX_DIMS];
  int64_t strides[MLAJIT_MAX_DIMS];
} mlajit_tensor;

/* The paged cache of SPEC §1. scales may be NULL when the cache is not fp8 (and must be NULL for
 * the layouts "fp8_ds_mla" and "fp8_page_scales", whose u8 blocks hold the scales: records
 * [num_blocks, 1, num_layers, page_size, 656], pages [num_blocks, 1, num_layers, page_size, 132]);
 * lookup_table and cache_lengths may be NULL for ops that do not read them (sparse_prefill). */
typedef struct mlajit_paged_cache {
  const mlajit_tensor* blocks;
  const mlajit_tensor* scales;
  const mlajit_tensor* lookup_table;
  const mlajit_tensor* cache_lengths;
} mlajit_paged_cache;

/* An op specialized on its params: {"op": "...", "params": {...}} (the JSON of a config entry,
 * without "sweep"). Creation validates; the kernel is compiled (or loaded from the disk cache) on
 * first launch, or eagerly with mlajit_op_load. */
typedef struct mlajit_op_s* mlajit_op;

const char* mlajit_version(void);
/* The last error of the calling thread ("" if none). Valid until the next failing call. */
const char* mlajit_last_error(void);

/* What this process would use, as JSON (the object of `mlajit info --json`): version, NVRTC, cache
 * directory, MLAJIT_* environment, devices. Thread-local string, valid until the next call. */
const char* mlajit_info_json(void);

/* Routes log lines (level 0 error, 1 warn, 2 info, 3 debug; message without prefix or newline) to
 * fn(level, message, user) instead of stderr; fn NULL restores stderr. level >= 0 also sets the
 * level (as MLAJIT_LOG does), -1 keeps it. fn may be called from any thread that logs. */
typedef void (*mlajit_log_callback)(int level, const char* message, void* user);
mlajit_status mlajit_set_log_callback(mlajit_log_callback fn, void* user, int level);

/* Makes device `ordinal` (its primary context, the one CUDA runtime users such as torch share)
 * current for the calling thread's launches; without it a thread uses the context already current
 * at its first call, else MLAJIT_DEVICE / device 0. */
mlajit_status mlajit_set_device(int ordinal);

/* spec_json: at most 1 MiB, nesting at most 64 arrays/objects, each key once per object; anything
 * else is MLAJIT_ERROR_INVALID_ARGUMENT with a bounded message. */
mlajit_status mlajit_op_create(const char* spec_json, mlajit_op* out);
void mlajit_op_destroy(mlajit_op op);
/* Compiles/loads the kernel for the current device now (cold-start control). */
mlajit_status mlajit_op_load(mlajit_op op);
/* The op as JSON {"op": ..., "params": {...}} (every param, canonical order); the string lives as
 * long as the op ("null" for a NULL op). */
const char* mlajit_op_describe(mlajit_op op);

/* Compiles a spec into the disk cache for `arch` (e.g. "sm_90a") without a GPU.
 * cache_hit (optional) tells whether it was already there. */
mlajit_status mlajit_precompile(const char* spec_json, const char* arch, int* cache_hit);

/* A runtime of its own: a memory cache and a disk cache chosen by the host rather than by the
 * environment (which the process-wide runtime of the functions above reads at its first use).
 * Ops made with mlajit_op_create_in compile, load and launch through it; everything else
 * (remote cache, tuning records, log, device) is process-wide as before. */
typedef struct mlajit_runtime_s* mlajit_runtime;

typedef struct mlajit_runtime_options {
  /* sizeof(mlajit_runtime_options): fields added later are read only when the caller's struct has
   * them, so a host built against this header keeps working with later libraries. */
  size_t struct_size;
  /* Cache directories, ':'-separated, in lookup order (MLAJIT_CACHE_PATH's syntax and rules: the
   * first one you can write takes misses, the others are read-only). NULL: the environment's. */
  const char* cache_path;
  /* Nonzero: no disk cache (every first use compiles); cache_path is then ignored. */
  int disable_disk_cache;
  /* LRU cap of the writable layer in bytes; 0: MLAJIT_CACHE_MAX_BYTES, else none. */
  uint64_t cache_max_bytes;
} mlajit_runtime_options;

/* options NULL: all defaults. Opens and checks the cache directories now: an unsafe directory is
 * MLAJIT_ERROR_CACHE here, not at the first launch. */
mlajit_status mlajit_runtime_create_with_options(const mlajit_runtime_options* options, mlajit_runtime* out);
/* Ops made in the runtime keep what they need alive; they may outlive this handle. */
void mlajit_runtime_destroy(mlajit_runtime rt);
/* The directory misses are written to ("" when the runtime has none: disk cache disabled or
 * every layer read-only). Lives as long as the runtime handle. */
const char* mlajit_runtime_cache_dir(mlajit_runtime rt);
/* mlajit_op_create for an op whose kernels come from `rt` (NULL rt: the process-wide runtime). */
mlajit_status mlajit_op_create_in(mlajit_runtime rt, const char* spec_json, mlajit_op* out);
/* mlajit_precompile into the runtime's disk cache (MLAJIT_ERROR_CACHE when it has none). */
mlajit_status mlajit_runtime_precompile(mlajit_runtime rt, const char* spec_json, const char* arch, int* cache_hit);

mlajit_status mlajit_kv_cache_store(mlajit_op op, const mlajit_tensor* x, const mlajit_tensor* input_row_offsets,
                                    const mlajit_paged_cache* cache, int layer_idx, int kv_idx,
                                    const mlajit_tensor* dropped, void* stream);
mlajit_status mlajit_kv_cache_gather(mlajit_op op, const mlajit_paged_cache* cache, const mlajit_tensor* batch_ids,
                                     const mlajit_tensor* positions, int layer_idx, int kv_idx,
                                     const mlajit_tensor* y, const mlajit_tensor* dropped, void* stream);
mlajit_status mlajit_sparse_index_remap(mlajit_op op, const mlajit_tensor* indices,
                                        const mlajit_tensor* input_row_offsets, const mlajit_tensor* lookup_table,
                                        int64_t num_blocks, const mlajit_tensor* out, void* stream);
mlajit_status mlajit_mla_indexer_workspace_bytes(mlajit_op op, int64_t total_tokens, int64_t max_keys_per_seq,
                                                 size_t* bytes);
mlajit_status mlajit_mla_indexer(mlajit_op op, const mlajit_tensor* q, const mlajit_tensor* qs,
                                 const mlajit_tensor* input_row_offsets, const mlajit_paged_cache* k_cache,
                                 int layer_idx, int64_t max_keys_per_seq, const mlajit_tensor* out,
                                 const mlajit_tensor* workspace, void* stream);
mlajit_status mlajit_sparse_prefill(mlajit_op op, const mlajit_tensor* q, const mlajit_paged_cache* kv,
                                    const mlajit_tensor* indices, const mlajit_tensor* topk_lengths, int layer_idx,
                                    float softmax_scale, const mlajit_tensor* attn_sink, const mlajit_tensor* out,
                                    const mlajit_tensor* lse, void* stream);
/* `workspace`: device memory, 16-byte aligned, of mlajit_sparse_prefill_workspace_bytes bytes for
 * the cache's num_blocks = kv->blocks dim 0 (ops.hpp sparse_prefill has the layout). params.kv_staging
 * "bf16" requires it: the op converts the fp8 rows its indices select into a bf16 copy there and runs
 * the bf16 kernel on it. The 16-bit sm_90a kernels (every op but FP8 math; the size is the same on
 * any device) also split items over keys in it: at decode (fewer tokens x head tiles than SMs)
 * every token's keys over the GPU, otherwise the last round of items; they run unsplit with NULL
 * or a workspace holding only the staged part. The split depends on shapes and the SM count only
 * (CUDA-graph safe). Launches that may overlap (other streams) must not share a workspace. The size
 * is 0 for FP8 math, which does not look at the workspace. kv_layout "fp8_ds_mla": kv->blocks is
 * the u8 records [num_blocks, 1, num_layers, page_size, 656], kv->scales NULL.
 * mlajit_sparse_prefill is this without a workspace: it refuses a kv_staging "bf16" op with
 * MLAJIT_ERROR_INVALID_ARGUMENT naming mlajit_sparse_prefill_ws. */
mlajit_status mlajit_sparse_prefill_workspace_bytes(mlajit_op op, int64_t num_blocks, size_t* bytes);
mlajit_status mlajit_sparse_prefill_ws(mlajit_op op, const mlajit_tensor* q, const mlajit_paged_cache* kv,
                                       const mlajit_tensor* indices, const mlajit_tensor* topk_lengths, int layer_idx,
                                       float softmax_scale, const mlajit_tensor* attn_sink, const mlajit_tensor* out,
                                       const mlajit_tensor* lse, const mlajit_tensor* workspace, void* stream);

#ifdef __cplusplus
}
#endif
#endif /* MLAJIT_C_API_H */

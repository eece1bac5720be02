#pragma once
// The per-family source generators that the op definitions (src/ops/<family>/definition.cpp)
// register. Each lives in src/ops/<family>/generate.cpp and returns a complete KernelSource
// (source_header(spec) first, then template includes, constexpr params and extern "C" entries).
#include "mlajit/codegen.hpp"

namespace mlajit {

// kv_cache_store, kv_cache_gather and sparse_index_remap.
KernelSource generate_kv_cache(const KernelSpec& spec);
// mla_indexer (FP8 scores fused with exact top-k).
KernelSource generate_mla_indexer(const KernelSpec& spec);
// sparse_prefill (portable and sm90 paths).
KernelSource generate_sparse_prefill(const KernelSpec& spec);

}  // namespace mlajit

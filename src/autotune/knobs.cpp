// Tuning knobs: which params fields an autotuner may change (speed only, never the result beyond
// float rounding), each op's default knob space, and the hash of everything that is *not* a knob
// (the problem identity of a tuning-database entry). The hash walks the struct fields directly so
// that the ops' per-call lookup does no JSON and no allocation; tests/unit/test_autotune.cpp checks
// that every field params_to_json writes is either a knob or changes the hash, so a field added to
// params.hpp later cannot silently share tuning entries.
#include <type_traits>

#include <nlohmann/json.hpp>

#include "mlajit/autotune.hpp"
#include "mlajit/error.hpp"

namespace mlajit::autotune {

using nlohmann::json;

namespace {

// A multiply-xorshift over whole 64-bit words (two dependent operations per field: this runs on
// every op call), finished with a splitmix64 mix so that nearby inputs spread. The hash is never
// stored (the database keeps the params; indexes rehash them at load), so it may change freely.
struct Hasher {
  uint64_t h = 1469598103934665603ull;
  void add(uint64_t v) {
    h = (h ^ v) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 32;
  }
  uint64_t done() const {
    uint64_t z = h + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

void hash_cache(Hasher& h, const PagedKVCacheParams& c) {
  h.add(static_cast<uint64_t>(c.dtype));
  h.add(static_cast<uint64_t>(c.num_heads));
  h.add(static_cast<uint64_t>(c.head_size));
  h.add(static_cast<uint64_t>(c.page_size));
  h.add(c.is_mla ? 1 : 0);
  h.add(static_cast<uint64_t>(c.num_layers));
  h.add(static_cast<uint64_t>(c.quantization_granularity));
  h.add(static_cast<uint64_t>(c.scale_fmt));
}

}  // namespace

const std::vector<std::string>& knob_names(Op op) {
  static const std::vector<std::string> kv{"threads"};
  static const std::vector<std::string> indexer{"block_kv", "block_q", "num_stages"};
  static const std::vector<std::string> prefill{"b_topk", "num_stages"};
  switch (op) {
    case Op::kv_cache_store:
    case Op::kv_cache_gather:
    case Op::sparse_index_remap: return kv;
    case Op::mla_indexer: return indexer;
    case Op::sparse_prefill: return prefill;
  }
  throw_error(ErrorKind::Internal, "knob_names: unknown op {}", static_cast<int>(op));
}

json default_knob_space(Op op) {
  switch (op) {
    case Op::kv_cache_store:
    case Op::kv_cache_gather:
    case Op::sparse_index_remap: return json{{"threads", {64, 128, 256, 512}}};
    // The indexer implements one tile shape (src/ops/mla_indexer/plan.hpp: block_q fixed by H,
    // block_kv 64), so its K-tile ring depth is the knob that moves time (heuristic: 6).
    case Op::mla_indexer: return json{{"num_stages", {2, 3, 4, 6, 8}}};
    case Op::sparse_prefill: return json{{"b_topk", {64, 128}}, {"num_stages", {2, 3}}};
  }
  throw_error(ErrorKind::Internal, "default_knob_space: unknown op {}", static_cast<int>(op));
}

json knobs_of(const OpParams& p) {
  const json all = params_to_json(p);
  json out = json::object();
  for (const auto& k : knob_names(static_cast<Op>(p.index())))
    if (all.contains(k)) out[k] = all[k];
  return out;
}

OpParams default_knobs(const OpParams& p) {
  return std::visit(
      [](const auto& x) -> OpParams {
        using P = std::decay_t<decltype(x)>;
        P out = x;
        const P defaults{};
        if constexpr (std::is_same_v<P, KvCacheStoreParams> || std::is_same_v<P, KvCacheGatherParams> ||
                      std::is_same_v<P, SparseIndexRemapParams>) {
          out.threads = defaults.threads;
        } else if constexpr (std::is_same_v<P, MlaIndexerParams>) {
          out.block_q = defaults.block_q;
          out.block_kv = defaults.block_kv;
          out.num_stages = defaults.num_stages;
        } else {
          out.b_topk = defaults.b_topk;
          out.num_stages = defaults.num_stages;
        }
        // Auto knobs as the ops would resolve them without a tuning record.
        return with_heuristic_knobs(out);
      },
      p);
}

// "auto" is 0 for the knobs that have an auto value; the others are never overridden, because a
// value there is the caller's explicit choice.
KvCacheStoreParams fill_auto_knobs(const KvCacheStoreParams& p, const KvCacheStoreParams& t) {
  KvCacheStoreParams out = p;
  if (out.threads == 0) out.threads = t.threads;
  return out;
}
KvCacheGatherParams fill_auto_knobs(const KvCacheGatherParams& p, const KvCacheGatherParams& t) {
  KvCacheGatherParams out = p;
  if (out.threads == 0) out.threads = t.threads;
  return out;
}
SparseIndexRemapParams fill_auto_knobs(const SparseIndexRemapParams& p, const SparseIndexRemapParams& t) {
  SparseIndexRemapParams out = p;
  if (out.threads == 0) out.threads = t.threads;
  return out;
}
MlaIndexerParams fill_auto_knobs(const MlaIndexerParams& p, const MlaIndexerParams& t) {
  MlaIndexerParams out = p;
  if (out.block_q == 0) out.block_q = t.block_q;
  if (out.block_kv == 0) out.block_kv = t.block_kv;
  if (out.num_stages == 0) out.num_stages = t.num_stages;
  return out;
}
SparsePrefillParams fill_auto_knobs(const SparsePrefillParams& p, const SparsePrefillParams& t) {
  SparsePrefillParams out = p;
  if (out.b_topk == 0) out.b_topk = t.b_topk;
  if (out.num_stages == 0) out.num_stages = t.num_stages;
  return out;
}

bool has_auto_knobs(const OpParams& params) {
  return std::visit(
      [](const auto& p) {
        using P = std::decay_t<decltype(p)>;
        if constexpr (std::is_same_v<P, MlaIndexerParams>) return p.block_q == 0 || p.block_kv == 0 || p.num_stages == 0;
        else if constexpr (std::is_same_v<P, SparsePrefillParams>) return p.b_topk == 0 || p.num_stages == 0;
        else return p.threads == 0;
      },
      params);
}

uint64_t problem_hash(const OpParams& params) {
  Hasher h;
  h.add(static_cast<uint64_t>(params.index()) + 0x100);
  std::visit(
      [&](const auto& p) {
        using P = std::decay_t<decltype(p)>;
        if constexpr (std::is_same_v<P, KvCacheStoreParams>) {
          hash_cache(h, p.cache);
          h.add(static_cast<uint64_t>(p.input_dtype));
        } else if constexpr (std::is_same_v<P, KvCacheGatherParams>) {
          hash_cache(h, p.cache);
          h.add(static_cast<uint64_t>(p.output_dtype));
        } else if constexpr (std::is_same_v<P, SparseIndexRemapParams>) {
          h.add(static_cast<uint64_t>(p.page_size));
        } else if constexpr (std::is_same_v<P, MlaIndexerParams>) {
          h.add(static_cast<uint64_t>(p.num_heads));
          h.add(static_cast<uint64_t>(p.depth));
          h.add(static_cast<uint64_t>(p.top_k));
          h.add(static_cast<uint64_t>(p.page_size));
          h.add(static_cast<uint64_t>(p.quantization_granularity));
          h.add(static_cast<uint64_t>(p.mask));
          h.add(static_cast<uint64_t>(p.emit));
        } else {
          static_assert(std::is_same_v<P, SparsePrefillParams>);
          h.add(static_cast<uint64_t>(p.qkv_dtype));
          h.add(static_cast<uint64_t>(p.kv_dtype));
          h.add(static_cast<uint64_t>(p.num_q_heads));
          h.add(static_cast<uint64_t>(p.qk_depth));
          h.add(static_cast<uint64_t>(p.v_depth));
          h.add(static_cast<uint64_t>(p.page_size));
          h.add(static_cast<uint64_t>(p.scale_block_size));
          h.add(p.attn_sink ? 1 : 0);
          h.add(p.emit_lse ? 1 : 0);
          h.add(static_cast<uint64_t>(p.output_dtype));
        }
      },
      params);
  return h.done();
}

}  // namespace mlajit::autotune

// mlajit bench OP [--shape k=v,k=v,...] [--reps R] [--json]: time an op on the GPU.
#include <cstdio>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "ops/kv_cache/bench.hpp"
#include "ops/mla_indexer/bench.hpp"
#include "ops/sparse_prefill/bench.hpp"
#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/shape_arg.hpp"
#include "core/param_checks.hpp"

namespace mlajit::cli {

namespace {

constexpr const char* kBenchHelp = R"(usage: mlajit bench OP [--shape k=v,...] [--reps R] [--json] [--anchor LIB.so]
ops and their shape keys (defaults in brackets; tokens / keys / top_k mean what they mean in
`mlajit tune --shape`; one spelling per key):
  kv_cache_store | kv_cache_gather
      tokens [65536] heads [1] head_size [576] dtype [fp8_e4m3] io_dtype [bf16] mla [1]
      page_size [64] layers [1] quantization_granularity [0 = head_size] scale_fmt [fp32]
      threads [128]
  mla_indexer
      heads [128] tokens [4096] keys [32768: cached + new] top_k [2048] page_size [64] mask [causal]
      stages [0 = heuristic: the scorer's K ring depth, params.num_stages]
      block_kv [0: params.block_kv; 256 = the persistent scorer (256-key blocks, 128/heads tokens
        per CTA, K by TMA at page_size >= 8), 64 = the tile scorer (64-key tiles);
        0 = persistent at page_size >= 8, else tile]
      persistent [1: the persistent scorer on one CTA per SM walking work items; 0: one work item per CTA]
      batch [0] next_n [1] context [32768]: decode shapes (batch > 0): batch sequences of context keys,
        the last next_n of them new, one query row each (replaces tokens and keys); --anchor then
        times LIB's anchor_paged_mqa_logits (DeepGEMM-style paged logits over the engines' pages)
      k_layout [split | fp8_page_scales]: decode shapes: the K cache mlajit reads (fp8_page_scales:
        the engines' pages, the same buffer the anchor reads)
      topk_ranks [0 = the plan's]: the top-k stage's CTAs per row (1, 2, 4, 8: a thread-block
        cluster when > 1, sm_90 and newer); the one-CTA-per-row time is printed beside it
      --anchor LIB.so: also time LIB's anchor_mqa_logits (C ABI in src/ops/mla_indexer/bench.hpp)
  sparse_prefill
      tokens [4096] heads [128] top_k [2048] keys [32768] kv_dtype [bf16] page_size [64]
      batch [0] next_n [1] context [32768]: decode shapes (batch > 0): batch sequences of context
        keys, next_n query tokens each choosing top_k of its own sequence's keys (replaces tokens
        and keys); --anchor then times LIB's anchor_sparse_decode_fp8_ds_mla when it exports it
      layers [2: the cache interleaves 2 layers page by page, the last is read; 1 = one layer]
      quantization_granularity [0 = unit scales] scale_fmt [fp32|ue8m0: power-of-two scales;
        group scales then run on the Hopper kernel] sink [0] lse [1] path [auto | portable | sm90]
      ctas [0 = automatic]: the persistent Hopper kernel's grid (bf16 cache; default one CTA per SM;
        a number >= tokens * heads / 64 gives one CTA per token x 64-head tile, as the fp8 kernels)
      split_parts [0 = automatic]: the persistent kernel's tail split (its last round of items run in
        parts over the whole GPU); 1 = off, N = at most N parts per item. When it splits, the same
        launch without the split is timed in the same reps and printed beside it
      crossover [auto | 0 | 1]: the 80-128-head fp8 kernels with group scales decoded to bf16 tiles
        run a token's two CTAs as a cluster sharing the decode (auto: launches of <= 512 tokens)
      qk_math [bf16|fp8]: fp8 = the opt-in FP8-math kernel (Hopper only; needs kv_dtype=fp8_e4m3 and
        quantization_granularity 0 or 576),
        e.g. --shape kv_dtype=fp8_e4m3,quantization_granularity=576,qk_math=fp8
      kv_staging [none|bf16]: bf16 = stage the selected fp8 rows as bf16 in a workspace, then run the
        bf16 kernel (fp8 cache, qk_math bf16); the time includes the staging, also printed alone
      kv_layout [split|fp8_ds_mla]: fp8_ds_mla = FlashMLA's 656-byte records (with kv_dtype=fp8_e4m3,
        quantization_granularity=128; scale_fmt ue8m0 for power-of-two scales)
      stage_rows [auto|all|marked]: with kv_staging bf16, convert every row of the layer or only the
        rows the indices select (auto: the cheaper by the op's byte model)
      --anchor LIB.so: also time LIB's anchor_sparse_prefill_bf16 on the same inputs, interleaved
      (C ABI in src/ops/sparse_prefill/bench.hpp); prints both TFLOP/s, the ratio and the output diff
      (an fp8 cache reaches the anchor dequantised to bf16, with either qk_math); the anchor runs
      twice per rep: without per-token lengths and given them (mlajit always reads topk_lengths);
      heads that are not a multiple of 64 run the anchor padded to the next one (it says so).
      Every run prints the rows the launch reads at least once, their bytes and bytes / time
)";

void print_summary(const std::string& op, const nlohmann::json& r) {
  if (op == "mla_indexer" && r.contains("decode")) {
    const auto& d = r["decode"];
    std::printf("mla_indexer H %d, decode batch %lld x next_n %lld over %lld keys, top-%d: scores %.3f ms, top-k %.3f ms "
                "(%d CTAs per row; one CTA: %.3f ms), total %.3f ms (K %.2f TB/s)\n",
                r["num_heads"].get<int>(), d["batch"].get<long long>(), d["next_n"].get<long long>(),
                d["context"].get<long long>(), r["top_k"].get<int>(), r["scores_ms"].get<double>(),
                r["topk_ms"].get<double>(), r["topk_ranks"].get<int>(), r["topk_one_cta_ms"].get<double>(),
                r["total_ms"].get<double>(), r["k_tbps"].get<double>());
    if (r.contains("anchor")) {
      const auto& an = r["anchor"];
      if (an.contains("error"))
        std::printf("  anchor: %s\n", an["error"].get<std::string>().c_str());
      else
        std::printf("  anchor paged logits %.3f ms (K %.2f TB/s): mlajit total / anchor = %.2f, scores / anchor = %.2f, "
                    "max rel diff %.1e\n",
                    an["logits_ms"].get<double>(), an["k_tbps"].get<double>(), an["total_over_anchor"].get<double>(),
                    an["scores_over_anchor"].get<double>(), an["max_rel_diff"].get<double>());
    }
  } else if (op == "mla_indexer") {
    std::printf("mla_indexer H %d, %lld new after %lld cached, top-%d: scores %.3f ms (%.0f TFLOP/s), top-k %.3f ms, total %.3f ms\n",
                r["num_heads"].get<int>(), r["new_tokens"].get<long long>(), r["cached_tokens"].get<long long>(),
                r["top_k"].get<int>(), r["scores_ms"].get<double>(), r["score_tflops"].get<double>(),
                r["topk_ms"].get<double>(), r["total_ms"].get<double>());
    if (r.contains("anchor")) {
      const auto& an = r["anchor"];
      if (an.contains("error"))
        std::printf("  anchor: %s\n", an["error"].get<std::string>().c_str());
      else
        std::printf("  anchor scores %.3f ms (%.0f TFLOP/s): mlajit scores / anchor = %.2f, max rel diff %.1e\n",
                    an["scores_ms"].get<double>(), an["score_tflops"].get<double>(),
                    an["mlajit_over_anchor"].get<double>(), an["max_rel_diff"].get<double>());
    }
  } else if (op == "sparse_prefill") {
    // Prefill shapes read each distinct row many times (from L2): their distinct bytes per time are
    // small, so they print in GB/s, not as 0.00 TB/s.
    const auto rate = [](double tbps) {
      return tbps >= 0.1 ? fmt::format("{:.2f} TB/s", tbps) : fmt::format("{:.1f} GB/s", tbps * 1e3);
    };
    const auto& p = r["params"];
    const bool fp8 = p["kv_dtype"] == "fp8_e4m3";
    const std::string variant = p["kv_dtype"].get<std::string>() +
                                (fp8 ? " quantization_granularity " +
                                           std::to_string(p["quantization_granularity"].get<int>())
                                     : std::string()) +
                                (p.value("scale_fmt", "fp32") == "ue8m0" ? " ue8m0" : "") +
                                (p["qk_math"] == "fp8" ? " qk_math fp8" : "") +
                                (p.value("kv_staging", "none") == "bf16" ? " staged bf16" : "");
    std::printf("sparse_prefill %s path %s: tokens %lld H %d top_k %d keys %lld: %.3f ms median (min %.3f), "
                "%.1f TFLOP/s, %lld distinct rows x %lld B = %.1f MB read at %s\n",
                variant.c_str(), r["path"].get<std::string>().c_str(), r["tokens"].get<long long>(),
                r["num_heads"].get<int>(), r["top_k"].get<int>(), r["keys"].get<long long>(),
                r["ms"]["median"].get<double>(), r["ms"]["min"].get<double>(), r["tflops"].get<double>(),
                r["distinct_rows"].get<long long>(), r["row_bytes"].get<long long>(), r["read_bytes"].get<double>() / 1e6,
                rate(r["read_tbps"].get<double>()).c_str());
    if (r.contains("stage"))
      std::printf("  of which staging (%s rows): %.3f ms median\n", r["stage"]["rows"].get<std::string>().c_str(),
                  r["stage"]["ms_median"].get<double>());
    if (r.contains("unsplit")) {
      const auto& u = r["unsplit"];
      std::printf("  tail split: items from %lld in %d parts (%lld units); without it %.3f ms, %.1f TFLOP/s (split %.3fx%s)\n",
                  r["split"]["first"].get<long long>(), r["split"]["parts"].get<int>(), r["split"]["units"].get<long long>(),
                  u["ms_median"].get<double>(), u["tflops"].get<double>(), u["speedup"].get<double>(),
                  u.contains("ratio") ? fmt::format("; unsplit / anchor {:.3f}x", u["ratio"].get<double>()).c_str() : "");
    }
    if (r.contains("anchor")) {
      const auto& an = r["anchor"];
      std::printf("  anchor: %.3f ms median, %.1f TFLOP/s, its rows at %s; mlajit / anchor speed %.3fx; out rel "
                  "err %.2e, lse max diff %.2e\n",
                  an["ms_median"].get<double>(), an["tflops"].get<double>(), rate(an["read_tbps"].get<double>()).c_str(),
                  an["ratio"].get<double>(),
                  an["compare"]["out_rel_frobenius"].get<double>(), an["compare"].value("lse_max_abs_diff", 0.0));
      if (an["heads_run"].get<int>() != r["num_heads"].get<int>())
        std::printf("  (the anchor ran %d heads, padded as engines run it; its time is for all of them)\n",
                    an["heads_run"].get<int>());
      if (an.contains("with_topk_length")) {
        const auto& wl = an["with_topk_length"];
        std::printf("  anchor given topk_length (as mlajit reads it): %.3f ms median, %.1f TFLOP/s; mlajit / anchor speed %.3fx\n",
                    wl["ms_median"].get<double>(), wl["tflops"].get<double>(), wl["ratio"].get<double>());
      }
    }
  } else {
    std::printf("%s: %.4f ms median (min %.4f, max %.4f), %.0f GB/s = %.1f%% of %.0f GB/s copy bandwidth; "
                "back to back %.0f GB/s\n",
                op.c_str(), r["ms"]["median"].get<double>(), r["ms"]["min"].get<double>(), r["ms"]["max"].get<double>(),
                r["gbps"].get<double>(), r["pct_of_copy_bw"].get<double>(), r["copy_bw_gbps"].get<double>(),
                r["gbps_back_to_back"].get<double>());
    const auto& cp = r["same_harness_copy"];
    if (cp.contains("error"))
      std::printf("  same harness, cuMemcpyDtoD of the same bytes: %s\n", cp["error"].get<std::string>().c_str());
    else
      std::printf("  same harness, cuMemcpyDtoD of the same bytes: %.4f ms, %.0f GB/s; op = %.1f%% of it\n",
                  cp["ms_median"].get<double>(), cp["gbps"].get<double>(), cp["pct"].get<double>());
  }
}

}  // namespace

int cmd_bench(const Argv& argv) {
  Args args(argv, {"json", "help"}, {"shape", "reps", "anchor"});
  args.at_most(1);
  if (args.flag("help") || args.positional().empty()) {
    std::fputs(kBenchHelp, args.flag("help") ? stdout : stderr);
    return args.flag("help") ? 0 : 2;
  }
  const std::string op = args.need(0, "OP");
  ShapeArg shape(args.get_or("shape", ""));
  const int reps = static_cast<int>(args.get_int("reps", 0, 1, 100000));
  if (op != "mla_indexer" && op != "sparse_prefill" && !args.get_or("anchor", "").empty())
    throw_invalid("--anchor", args.get_or("anchor", ""), "only with OP mla_indexer or sparse_prefill");
  nlohmann::json r;
  if (op == "kv_cache_store" || op == "kv_cache_gather") {
    bench::KvCacheBenchShape s;
    s.io_dtype = DType::bf16;
    shape.take_int("tokens", s.tokens);
    shape.take_int("heads", s.num_heads);
    shape.take_int("head_size", s.head_size);
    shape.take_dtype("dtype", s.cache_dtype);
    shape.take_dtype("io_dtype", s.io_dtype);
    shape.take_bool("mla", s.is_mla);
    shape.take_int("page_size", s.page_size);
    shape.take_int("layers", s.num_layers);
    shape.take_int("quantization_granularity", s.quantization_granularity);
    if (auto f = shape.take("scale_fmt")) s.scale_fmt = parse_scale_fmt(*f, "--shape scale_fmt");
    shape.take_int("threads", s.threads);
    shape.done(op);
    if (reps) s.reps = reps;
    r = bench::bench_kv_cache(op, s);
  } else if (op == "mla_indexer") {
    bench::MlaIndexerBenchArgs a;
    shape.take_int("heads", a.num_heads);
    // The tuner's vocabulary (`mlajit tune --shape`): tokens = new query tokens, keys = cached + new
    // keys of the sequence.
    shape.take_int("tokens", a.new_tokens);
    int64_t keys = -1;
    shape.take_int("keys", keys);
    if (keys >= 0) {
      if (keys < a.new_tokens)
        throw_invalid("--shape keys", keys, fmt::format(">= tokens ({}): keys count the new tokens too", a.new_tokens));
      a.cached_tokens = keys - a.new_tokens;
    }
    shape.take_int("top_k", a.top_k);
    shape.take_int("batch", a.batch);
    shape.take_int("next_n", a.next_n);
    if (a.next_n < 1 || a.next_n > 16) throw_invalid("--shape next_n", a.next_n, "in [1, 16]");
    shape.take_int("context", a.context);
    shape.take_int("topk_ranks", a.topk_ranks);
    if (auto k = shape.take("k_layout")) a.k_layout = parse_cache_layout(*k, "--shape k_layout");
    if (a.batch < 0) throw_invalid("--shape batch", a.batch, ">= 0 (0: prefill shapes from tokens and keys)");
    shape.take_int("page_size", a.page_size);
    shape.take_int("stages", a.num_stages);
    shape.take_int("block_kv", a.block_kv);
    int64_t persistent = 1;
    shape.take_int("persistent", persistent);
    if (persistent != 0 && persistent != 1) throw_invalid("--shape persistent", persistent, "0 | 1");
    a.persistent = persistent == 1;
    if (auto m = shape.take("mask")) {
      if (*m != "causal" && *m != "none") throw_invalid("--shape mask", *m, "causal | none");
      a.mask = *m == "causal" ? Mask::causal : Mask::none;
    }
    shape.done(op);
    if (reps) a.reps = reps;
    a.anchor = args.get_or("anchor", "");
    r = bench::bench_mla_indexer(a);
  } else if (op == "sparse_prefill") {
    bench::SparsePrefillBenchArgs a;
    // The tuner's vocabulary: tokens = query tokens, keys = keys in the cache.
    shape.take_int("tokens", a.tokens);
    shape.take_int("heads", a.num_heads);
    shape.take_int("top_k", a.top_k);
    shape.take_int("keys", a.keys);
    shape.take_int("batch", a.batch);
    shape.take_int("next_n", a.next_n);
    shape.take_int("context", a.context);
    shape.take_dtype("kv_dtype", a.kv_dtype);
    shape.take_int("page_size", a.page_size);
    shape.take_int("layers", a.layers);
    shape.take_int("ctas", a.ctas);
    int64_t split_parts = 0;
    shape.take_int("split_parts", split_parts);
    MLAJIT_EXPECT(split_parts >= 0 && split_parts <= 256, "--shape split_parts", split_parts,
                  "0 (automatic), 1 (no tail split) or a cap on the parts up to 256");
    a.split_parts = static_cast<int>(split_parts);
    if (auto x = shape.take("crossover")) {
      if (*x == "auto") {
        a.crossover = sparse_prefill::Crossover::automatic;
      } else if (*x == "1") {
        a.crossover = sparse_prefill::Crossover::on;
      } else if (*x == "0") {
        a.crossover = sparse_prefill::Crossover::off;
      } else {
        throw_invalid("--shape crossover", *x, "auto | 0 | 1");
      }
    }
    shape.take_int("quantization_granularity", a.quantization_granularity);
    if (auto f = shape.take("scale_fmt")) a.scale_fmt = parse_scale_fmt(*f, "--shape scale_fmt");
    shape.take_bool("sink", a.attn_sink);
    shape.take_bool("lse", a.emit_lse);
    if (auto m = shape.take("qk_math")) a.qk_math = parse_qk_math(*m, "--shape qk_math");
    if (auto k = shape.take("kv_staging")) a.kv_staging = parse_kv_staging(*k, "--shape kv_staging");
    if (auto k = shape.take("kv_layout")) a.kv_layout = parse_cache_layout(*k, "--shape kv_layout");
    if (auto r = shape.take("stage_rows")) a.stage_rows = *r;
    if (auto p = shape.take("path")) a.path = *p;
    a.anchor = args.get_or("anchor", "");
    shape.done(op);
    if (reps) a.reps = reps;
    r = bench::bench_sparse_prefill(a);
  } else {
    throw_invalid("bench OP", op, "kv_cache_store | kv_cache_gather | mla_indexer | sparse_prefill");
  }
  if (args.flag("json")) std::puts(r.dump(2).c_str());
  else print_summary(op, r);
  return 0;
}

}  // namespace mlajit::cli

// Benchmark driver of sparse_prefill; see ops/sparse_prefill/bench.hpp.
#include "ops/sparse_prefill/bench.hpp"


#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "autotune/device_data.hpp"
#include "mlajit/autotune.hpp"
#include "mlajit/driver.hpp"
#include "core/input.hpp"
#include "mlajit/error.hpp"
#include "mlajit/ops.hpp"
#include "mlajit/runtime.hpp"
#include "ops/anchor_library.hpp"
#include "ops/sparse_prefill/launch.hpp"
#include "ops/sparse_prefill/plan.hpp"
#include "reference/kv_cache_ref.hpp"
#include "reference/sparse_prefill_ref.hpp"

namespace mlajit::bench {

namespace {

constexpr int kWarmup = 3;
constexpr float kSoftmaxScale = 0.0416667f;
// Bytes written before every timed launch so that neither kernel starts with the other's (or its
// own previous) rows in L2: well above the 50 MB L2 of an H100 / H200.

// The external reference kernel (see bench.hpp: anchor ABI), resolved by dlopen.
using AnchorFn = int (*)(const void* q, const void* kv, long long s_kv, const int* indices, int s_q, int h_q,
                         int topk, float sm_scale, const float* attn_sink, const int* topk_length, void* out,
                         float* max_logits, float* lse, void* stream);
using AnchorInfoFn = const char* (*)();
using DecodeAnchorFn = int (*)(const void* q, const void* kv, const int* indices, const int* topk_lengths,
                               const float* attn_sink, void* out, float* lse, int b, int s_q, int h_q, int topk,
                               int num_blocks, int page_size, float sm_scale, void* workspace, size_t workspace_bytes,
                               int phase, void* stream);
using DecodeAnchorWsFn = size_t (*)(int b, int s_q, int h_q, int topk, int num_sms);

struct Anchor {
  AnchorLibrary lib;
  AnchorFn run = lib.symbol<AnchorFn>("anchor_sparse_prefill_bf16");
  AnchorInfoFn info = lib.symbol<AnchorInfoFn>("anchor_sparse_prefill_info");
  DecodeAnchorFn decode = nullptr;
  DecodeAnchorWsFn decode_ws = nullptr;
  Anchor(const std::string& path, bool decode_shapes) : lib(path) {
    if (decode_shapes) {
      decode = lib.symbol<DecodeAnchorFn>("anchor_sparse_decode_fp8_ds_mla");
      decode_ws = lib.symbol<DecodeAnchorWsFn>("anchor_sparse_decode_fp8_ds_mla_workspace");
      if (!decode || !decode_ws) decode = nullptr;
    }
    if (!run && !decode)
      throw_invalid("--anchor", path,
                    decode_shapes ? "a library exporting anchor_sparse_decode_fp8_ds_mla (+ _workspace) or "
                                    "anchor_sparse_prefill_bf16 (see `mlajit bench --help`)"
                                  : "a library exporting anchor_sparse_prefill_bf16 (see `mlajit bench --help`)");
  }
};


// Relative Frobenius error of bf16 tensor `x` against bf16 tensor `ref` (same size).
double rel_frobenius_bf16(const std::vector<uint16_t>& x, const std::vector<uint16_t>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double a = ref::bf16_to_float(x[i]), b = ref::bf16_to_float(ref[i]);
    num += (a - b) * (a - b);
    den += b * b;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// FlashMLA's fp8_ds_mla record of one bf16 row (its reference quantizer): 512 e4m3 in four
// 128-dim tiles with scale 2^ceil(log2(max(amax / 448, 1e-4))), 4 f32 scales, the 64 rope dims as bf16.
void ds_mla_record(const uint16_t* row, uint8_t* rec) {
  for (int t = 0; t < 4; ++t) {
    float amax = 0.f;
    for (int e = 0; e < 128; ++e) amax = std::max(amax, std::fabs(ref::bf16_to_float(row[128 * t + e])));
    const float s = std::exp2(std::ceil(std::log2(static_cast<double>(std::max(amax / 448.0f, 1e-4f)))));
    for (int e = 0; e < 128; ++e) rec[128 * t + e] = ref::float_to_e4m3(ref::bf16_to_float(row[128 * t + e]) / s);
    std::memcpy(rec + 512 + 4 * t, &s, 4);
  }
  std::memcpy(rec + 528, row + 512, 128);
}

}  // namespace

nlohmann::json bench_sparse_prefill(const SparsePrefillBenchArgs& args_in) {
  SparsePrefillBenchArgs a = args_in;
  const bool decode_shapes = a.batch > 0;
  if (decode_shapes) {
    MLAJIT_EXPECT(a.next_n >= 1 && a.next_n <= 64, "next_n", a.next_n, "1..64");
    MLAJIT_EXPECT(a.context >= a.top_k && a.context <= (int64_t{1} << 24), "context", a.context,
                  fmt::format("top_k ({})..2^24: each token chooses top_k distinct keys of its sequence", a.top_k));
    MLAJIT_EXPECT(a.batch <= 4096, "batch", a.batch, "1..4096");
    a.tokens = a.batch * a.next_n;
    a.keys = a.batch * a.context;
  }
  MLAJIT_EXPECT(a.tokens >= 1, "tokens", a.tokens, ">= 1");
  MLAJIT_EXPECT(a.top_k >= 1, "top_k", a.top_k, ">= 1");
  MLAJIT_EXPECT(a.keys >= a.top_k, "keys", a.keys, fmt::format(">= top_k ({}): indices are distinct", a.top_k));
  MLAJIT_EXPECT(a.keys <= (int64_t{1} << 30), "keys", a.keys, "<= 2^30");
  MLAJIT_EXPECT(a.reps >= 1, "reps", a.reps, ">= 1");
  MLAJIT_EXPECT(a.layers >= 1 && a.layers <= 64, "layers", a.layers, "1..64");
  SparsePrefillParams p;
  p.kv_dtype = a.kv_dtype;
  p.num_q_heads = a.num_heads;
  p.page_size = a.page_size;
  p.quantization_granularity = a.quantization_granularity;
  p.scale_fmt = a.scale_fmt;
  p.attn_sink = a.attn_sink;
  p.emit_lse = a.emit_lse;
  p.qk_math = a.qk_math;
  p.kv_staging = a.kv_staging;
  p.kv_layout = a.kv_layout;
  p.validate();
  const bool ds_mla = p.kv_layout == CacheLayout::fp8_ds_mla;
  const sparse_prefill::Path requested = sparse_prefill::parse_path(a.path, "path");
  const sparse_prefill::StageRows stage_rows = sparse_prefill::parse_stage_rows(a.stage_rows, "stage_rows");
  MLAJIT_EXPECT(stage_rows == sparse_prefill::StageRows::automatic || p.kv_staging == KvStaging::bf16, "stage_rows",
                a.stage_rows, "auto unless kv_staging is bf16 (it picks the rows the staging converts)");
  // A grid size is the persistent Hopper kernel's only (sparse_prefill::launch_ctas), checked here
  // under the shape key's name before any GPU use (the shape parser refuses negative ones).
  if (a.ctas != 0)
    MLAJIT_EXPECT(requested != sparse_prefill::Path::portable && sparse_prefill::sm90_supported(p) &&
                      sparse_prefill::sm90_plan(p).persistent,
                  "ctas", a.ctas, "0 unless the kernel is the persistent Hopper one (a bf16 cache, path auto or sm90)");
  // Forcing the crossover on: only a Hopper kernel that has it (checked here too, before any GPU use).
  if (a.crossover == sparse_prefill::Crossover::on)
    MLAJIT_EXPECT(requested != sparse_prefill::Path::portable && sparse_prefill::crossover_kernel(p), "crossover", 1,
                  "0 or auto unless the kernel has the crossover (fp8 group scales decoded to bf16 tiles, one scale per "
                  "16-element chunk, 80-128 heads; path auto or sm90)");
  const bool with_anchor = !a.anchor.empty();
  if (with_anchor) {
    // The anchor ABI's constraints (bench.hpp), checked before any allocation. Heads that are not a
    // multiple of 64 run padded (zero query heads past H), as engines run FlashMLA today.
    MLAJIT_EXPECT(a.top_k % 128 == 0, "top_k (with --anchor)", a.top_k, "a multiple of 128 (anchor ABI)");
  }
  std::unique_ptr<Anchor> anchor = with_anchor ? std::make_unique<Anchor>(a.anchor, decode_shapes) : nullptr;
  const bool decode_anchor = with_anchor && anchor->decode != nullptr;
  // The anchor's h_q: the decode anchor's 64 or 128, the prefill anchor's next multiple of 64.
  const int64_t anchor_heads = decode_anchor ? (a.num_heads <= 64 ? 64 : 128) : (a.num_heads + 63) / 64 * 64;

  const int dev = driver::ensure_context();
  Runtime& rt = Runtime::global();
  const sparse_prefill::Path path = sparse_prefill::resolve_path(p, rt.arch(), requested);

  const int64_t T = a.tokens, H = a.num_heads;
  // The cache interleaves `layers` layers page by page ([block, layer, page row]); the last is read.
  const int layers = a.layers, read_layer = a.layers - 1;
  const int64_t stride = (a.top_k + p.b_topk - 1) / p.b_topk * p.b_topk;
  const int64_t pages = (a.keys + p.page_size - 1) / p.page_size;
  const int64_t num_blocks = pages + 1;  // one block no sequence maps
  autotune::data::Rng rng(2024);

  driver::DeviceBuffer q(static_cast<size_t>(T * H * 576 * 2));
  autotune::data::fill_random(q, DType::bf16, rng);
  const size_t rows = static_cast<size_t>(num_blocks * layers * p.page_size);
  driver::DeviceBuffer blocks(rows * static_cast<size_t>(p.row_bytes()));
  if (ds_mla) {
    autotune::data::fill_random_ds_mla(blocks, p.scale_fmt == ScaleFmt::ue8m0, rng);
  } else {
    autotune::data::fill_random(blocks, p.kv_dtype, rng);
  }
  driver::DeviceBuffer scales;
  const int spt = p.kv_dtype == DType::fp8_e4m3 ? p.scales_per_token() : 0;
  std::vector<float> sc;
  if (spt > 0) {
    sc.resize(rows * spt);
    for (auto& x : sc) x = rng.uniform(0.25f, 1.0f);
    if (p.scale_fmt == ScaleFmt::ue8m0)  // rounded up to a power of two: 1/2 or 1 (1/4 at the edge)
      for (auto& x : sc) x = ref::ue8m0_round_up(x);
    scales = autotune::data::upload(sc);
  }

  // Distinct random positions per row (partial Fisher-Yates over the pool), encoded through the
  // shuffled lookup table. `positions` keeps the unencoded ones for the anchor.
  const auto lut = autotune::data::shuffled_lookup_table(1, num_blocks, rng);
  // Decode shapes: token t draws from its sequence's window [seq * context, + context).
  std::vector<uint32_t> pool(static_cast<size_t>(a.keys));
  std::iota(pool.begin(), pool.end(), 0u);
  std::vector<uint32_t> idx(static_cast<size_t>(T * stride), 0xFFFFFFFFu);
  std::vector<int32_t> positions(with_anchor ? static_cast<size_t>(T * a.top_k) : 0);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t base = decode_shapes ? (t / a.next_n) * a.context : 0;
    const int64_t window = decode_shapes ? a.context : a.keys;
    for (int64_t j = 0; j < a.top_k; ++j) {
      const size_t k = static_cast<size_t>(base + j) + rng.below(static_cast<uint32_t>(window - j));
      std::swap(pool[static_cast<size_t>(base + j)], pool[k]);
      const uint32_t pos = pool[static_cast<size_t>(base + j)];
      idx[static_cast<size_t>(t * stride + j)] = lut[pos / p.page_size] * p.page_size + pos % p.page_size;
      if (with_anchor) positions[static_cast<size_t>(t * a.top_k + j)] = static_cast<int32_t>(pos);
    }
  }
  // The rows the launch reads at least once (what DRAM must deliver when nothing is cached), and
  // the bytes each costs: the row, plus its scales in the split fp8 layout.
  int64_t distinct_rows = 0;
  {
    std::vector<uint8_t> seen(static_cast<size_t>(num_blocks * p.page_size), 0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < a.top_k; ++j) {
        uint8_t& s = seen[idx[static_cast<size_t>(t * stride + j)]];
        distinct_rows += s == 0;
        s = 1;
      }
  }
  const int64_t row_read_bytes = p.row_bytes() + (ds_mla ? 0 : 4 * int64_t{spt});
  driver::DeviceBuffer indices = autotune::data::upload(idx);
  driver::DeviceBuffer lengths =
      autotune::data::upload(std::vector<uint32_t>(static_cast<size_t>(T), static_cast<uint32_t>(a.top_k)));
  // One sink per head; the anchor's padded heads read zeros past H.
  std::vector<float> sink_h(static_cast<size_t>(std::max(H, anchor_heads)), 0.0f);
  for (int64_t h = 0; h < H; ++h) sink_h[static_cast<size_t>(h)] = rng.uniform(-1.f, 1.f);
  driver::DeviceBuffer sink = autotune::data::upload(sink_h);
  driver::DeviceBuffer out(static_cast<size_t>(T * H * 512 * 2));
  driver::DeviceBuffer lse(static_cast<size_t>(T * H * 4));

  ops::PagedCacheView kv;
  kv.blocks = TensorView(blocks.get(), p.kv_dtype, {num_blocks, 1, layers, p.page_size, 1, ds_mla ? 656 : 576});
  if (spt > 0) kv.scales = TensorView(scales.get(), DType::f32, {num_blocks, 1, layers, p.page_size, 1, spt});
  SparsePrefillArgs args = sparse_prefill::make_args(
      p, TensorView(q.get(), DType::bf16, {T, H, 576}), kv, TensorView(indices.get(), DType::u32, {T, stride}),
      TensorView(lengths.get(), DType::u32, {T}), read_layer, kSoftmaxScale,
      p.attn_sink ? TensorView(sink.get(), DType::f32, {H}) : TensorView(),
      TensorView(out.get(), DType::bf16, {T, H, 512}), p.emit_lse ? TensorView(lse.get(), DType::f32, {T, H}) : TensorView());
  // kv_staging bf16: the workspace the staged rows go to; args then read them there.
  const size_t ws_bytes = sparse_prefill::workspace_bytes(p, num_blocks);
  driver::DeviceBuffer workspace(std::max<size_t>(ws_bytes, 16));
  const TensorView ws_view(workspace.get(), DType::u32, {static_cast<int64_t>(ws_bytes / 4)});
  const SparsePrefillStageArgs stage_args = sparse_prefill::make_stage_args(p, kv, ws_view, args);
  const bool staged = p.kv_staging == KvStaging::bf16;
  const bool marks = sparse_prefill::stage_marks(stage_args, stage_rows);
  // The persistent kernel's tail split (split_parts 1: off) and, for the A/B inside this invocation,
  // the same launch without it.
  SparsePrefillArgs args_unsplit = args;
  if (a.split_parts != 1) sparse_prefill::bind_partials(p, kv, ws_view, args);
  auto kernel = sparse_prefill::kernel_for(p, path);  // compile / load outside the timed region

  // The anchor's inputs: the same q, the same key rows (position pos of the sequence = physical
  // row lut[pos / page] * page + pos % page of layer read_layer, as a contiguous bf16 [s_kv, 1, 576];
  // an fp8 cache is dequantised with its scales, e4m3 * scale rounded once to bf16) and the same
  // keys per query as plain int32 positions.
  driver::DeviceBuffer a_kv, a_idx, a_out, a_maxl, a_lse, a_q, a_ws;
  if (decode_anchor) {
    // The selected rows of the read layer as fp8_ds_mla records at the same encoded index (block *
    // page + offset of a one-layer cache with the same blocks); rows nobody selects stay zero.
    const size_t es = dtype_size(p.kv_dtype);
    std::vector<uint8_t> rec(static_cast<size_t>(num_blocks * p.page_size) * 656, 0);
    std::vector<uint8_t> done(static_cast<size_t>(num_blocks * p.page_size), 0);
    std::vector<uint8_t> all(blocks.size());
    blocks.download(all.data(), all.size());
    std::vector<uint16_t> row(576);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < a.top_k; ++j) {
        const uint32_t e = idx[static_cast<size_t>(t * stride + j)];
        if (done[e]) continue;
        done[e] = 1;
        const size_t r = static_cast<size_t>(e / p.page_size) * layers * p.page_size +
                         static_cast<size_t>(read_layer) * p.page_size + e % p.page_size;
        if (ds_mla) {
          std::memcpy(rec.data() + static_cast<size_t>(e) * 656, all.data() + r * 656, 656);
          continue;
        }
        const uint8_t* raw = all.data() + r * 576 * es;
        for (int d = 0; d < 576; ++d) {
          if (p.kv_dtype == DType::bf16) {
            std::memcpy(&row[d], raw + 2 * d, 2);
          } else {
            const float sc_d = spt > 0 ? sc[r * spt + d / p.quantization_granularity] : 1.0f;
            row[d] = ref::float_to_bf16(ref::e4m3_to_float(raw[d]) * sc_d);
          }
        }
        ds_mla_record(row.data(), rec.data() + static_cast<size_t>(e) * 656);
      }
    }
    a_kv = autotune::data::upload(rec);
    std::vector<int32_t> ai(static_cast<size_t>(T * a.top_k));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < a.top_k; ++j) ai[static_cast<size_t>(t * a.top_k + j)] = static_cast<int32_t>(idx[static_cast<size_t>(t * stride + j)]);
    a_idx = autotune::data::upload(ai);
    a_out = driver::DeviceBuffer(static_cast<size_t>(T * anchor_heads * 512 * 2));
    a_lse = driver::DeviceBuffer(static_cast<size_t>(T * anchor_heads * 4));
    const size_t wsb = anchor->decode_ws(static_cast<int>(a.batch), a.next_n, static_cast<int>(anchor_heads), a.top_k,
                                         std::max(1, rt.sm_count()));
    a_ws = driver::DeviceBuffer(std::max<size_t>(wsb, 16));
  } else if (with_anchor) {
    const size_t row_bytes = static_cast<size_t>(p.row_bytes());
    const size_t page_bytes = static_cast<size_t>(p.page_size) * row_bytes;
    std::vector<uint8_t> page(page_bytes);
    std::vector<uint16_t> kv_h(static_cast<size_t>(a.keys) * 576);
    for (int64_t pg = 0; pg < pages; ++pg) {
      const size_t row0 = static_cast<size_t>(lut[pg]) * layers * p.page_size + static_cast<size_t>(read_layer) * p.page_size;
      blocks.download(page.data(), page_bytes, row0 * row_bytes);
      for (int r = 0; r < p.page_size; ++r) {
        const int64_t pos = pg * p.page_size + r;
        if (pos >= a.keys) break;
        uint16_t* dst = kv_h.data() + pos * 576;
        if (ds_mla) {
          const uint8_t* rec = page.data() + static_cast<size_t>(r) * 656;
          float sc4[4];
          std::memcpy(sc4, rec + 512, 16);
          for (int e = 0; e < 512; ++e) dst[e] = ref::float_to_bf16(ref::e4m3_to_float(rec[e]) * sc4[e / 128]);
          std::memcpy(dst + 512, rec + 528, 128);
        } else if (p.kv_dtype == DType::bf16) {
          std::memcpy(dst, page.data() + static_cast<size_t>(r) * 1152, 1152);
        } else {
          for (int e = 0; e < 576; ++e) {
            const float s = spt > 0 ? sc[(row0 + r) * spt + e / p.quantization_granularity] : 1.0f;
            dst[e] = ref::float_to_bf16(ref::e4m3_to_float(page[static_cast<size_t>(r) * 576 + e]) * s);
          }
        }
      }
    }
    a_kv = autotune::data::upload(kv_h);
    a_idx = autotune::data::upload(positions);
    a_out = driver::DeviceBuffer(static_cast<size_t>(T * anchor_heads * 512 * 2));
    a_maxl = driver::DeviceBuffer(static_cast<size_t>(T * anchor_heads * 4));
    a_lse = driver::DeviceBuffer(static_cast<size_t>(T * anchor_heads * 4));
  }
  // q for the anchor: padded to its heads with zero heads past H (the same buffer when no padding).
  if (with_anchor && anchor_heads != H) {
    std::vector<uint16_t> qh(static_cast<size_t>(T * H * 576)), qa(static_cast<size_t>(T * anchor_heads * 576), 0);
    q.download(qh.data(), qh.size() * 2);
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(qa.data() + static_cast<size_t>(t * anchor_heads * 576), qh.data() + static_cast<size_t>(t * H * 576),
                  static_cast<size_t>(H * 576 * 2));
    a_q = autotune::data::upload(qa);
  }
  const void* anchor_q = anchor_heads != H ? a_q.get() : q.get();

  Stream stream = driver::create_stream();
  auto run_stage = [&] { sparse_prefill::stage(*kernel, stage_args, stage_rows, stream); };
  sparse_prefill::TailSplit split;
  auto run_mlajit = [&] {
    if (staged) run_stage();
    split = sparse_prefill::launch(*kernel, p, path, args, stream, a.ctas, a.split_parts, a.crossover);
  };
  auto run_unsplit = [&] {
    if (staged) run_stage();
    sparse_prefill::launch(*kernel, p, path, args_unsplit, stream, a.ctas, 0, a.crossover);
  };
  run_mlajit();  // the split it takes (the launches below are timed)
  const bool compare_unsplit = split.parts > 1;
  // The anchor twice: without per-token lengths (its default instantiation: every row has `top_k`
  // keys, no length load) and with them (its topk_length instantiation reads topk_length[t] first,
  // as mlajit always reads topk_lengths[t]: the same work). The lengths buffer holds `top_k` for
  // every token, so both compute the same output.
  auto run_decode_anchor = [&](int phase) {
    const int rc = anchor->decode(anchor_q, a_kv.get(), static_cast<const int*>(a_idx.get()), nullptr,
                                  p.attn_sink ? static_cast<const float*>(sink.get()) : nullptr, a_out.get(),
                                  static_cast<float*>(a_lse.get()), static_cast<int>(a.batch), a.next_n,
                                  static_cast<int>(anchor_heads), a.top_k, static_cast<int>(num_blocks), p.page_size,
                                  kSoftmaxScale, a_ws.get(), a_ws.size(), phase, stream);
    if (rc != 0) throw_error(ErrorKind::Driver, "anchor_sparse_decode_fp8_ds_mla ({}) returned {}", a.anchor, rc);
  };
  if (decode_anchor) run_decode_anchor(0);  // the scheduler metadata, once (a serving loop reuses it)
  auto run_anchor = [&](bool with_lengths) {
    if (decode_anchor) {
      run_decode_anchor(1);
      return;
    }
    const int rc = anchor->run(anchor_q, a_kv.get(), a.keys, static_cast<const int*>(a_idx.get()), static_cast<int>(T),
                               static_cast<int>(anchor_heads), a.top_k, kSoftmaxScale,
                               p.attn_sink ? static_cast<const float*>(sink.get()) : nullptr,
                               with_lengths ? static_cast<const int*>(lengths.get()) : nullptr, a_out.get(),
                               static_cast<float*>(a_maxl.get()), static_cast<float*>(a_lse.get()), stream);
    if (rc != 0) throw_error(ErrorKind::Driver, "anchor_sparse_prefill_bf16 ({}) returned {}", a.anchor, rc);
  };
  // Interleaved reps, each after an L2 flush (autotune::time_interleaved, the one timing loop):
  // mlajit and the anchor see the same machine state.
  std::vector<std::function<void(Stream)>> launches{[&](Stream) { run_mlajit(); }};
  if (with_anchor) {
    launches.push_back([&](Stream) { run_anchor(false); });
    launches.push_back([&](Stream) { run_anchor(true); });  // (decode anchor: the same launch again)
  }
  if (compare_unsplit) launches.push_back([&](Stream) { run_unsplit(); });
  // The staging alone, for attribution (its cost is inside the op's time above).
  if (staged) launches.push_back([&](Stream) { run_stage(); });
  const std::vector<autotune::Timing> timings = autotune::time_interleaved(launches, kWarmup, a.reps, stream);
  driver::stream_synchronize(stream);
  driver::destroy_stream(stream);
  const double median = timings[0].median_ms, best = timings[0].min_ms, worst = timings[0].max_ms;
  const double flops = 2.0 * static_cast<double>(T) * a.top_k * static_cast<double>(H) * (576 + 512);

  const auto info = driver::device_info(dev);
  nlohmann::json j;
  j["op"] = "sparse_prefill";
  j["params"] = params_to_json(OpParams{p});
  j["path"] = sparse_prefill::path_name(path);
  j["ctas"] = sparse_prefill::launch_ctas(p, path, T, a.ctas);
  j["arch"] = rt.arch();
  j["device"] = info.name;
  j["tokens"] = T;
  j["num_heads"] = H;
  j["top_k"] = a.top_k;
  j["keys"] = a.keys;
  if (decode_shapes) j["decode"] = {{"batch", a.batch}, {"next_n", a.next_n}, {"context", a.context}};
  j["reps"] = a.reps;
  j["flops"] = flops;
  j["ms"] = {{"median", median}, {"min", best}, {"max", worst}};
  j["tflops"] = flops / (median * 1e-3) / 1e12;
  j["tflops_best"] = flops / (best * 1e-3) / 1e12;
  const double read_bytes = static_cast<double>(distinct_rows) * static_cast<double>(row_read_bytes);
  j["distinct_rows"] = distinct_rows;
  j["row_bytes"] = row_read_bytes;
  j["read_bytes"] = read_bytes;
  j["read_tbps"] = read_bytes / (median * 1e-3) / 1e12;  // distinct rows' bytes / time
  if (staged)
    j["stage"] = {{"rows", marks ? "marked" : "all"}, {"ms_median", timings.back().median_ms}};
  j["split"] = {{"first", split.first}, {"parts", split.parts}, {"units", split.units}};
  j["crossover"] = sparse_prefill::crossover_taken(p, path, T, a.crossover);
  if (j["crossover"].get<bool>())  // the clusters its split was sized to (launch())
    j["split"]["resident_clusters"] = sparse_prefill::crossover_resident_clusters(*kernel, p);
  if (compare_unsplit) {
    const double um = timings[with_anchor ? 3 : 1].median_ms;
    j["unsplit"] = {{"ms_median", um}, {"tflops", flops / (um * 1e-3) / 1e12}, {"speedup", um / median}};
    if (with_anchor) j["unsplit"]["ratio"] = timings[1].median_ms / um;
  }
  if (with_anchor) {
    const double am = timings[1].median_ms, aml = timings[2].median_ms;
    // Same inputs: with 16-bit math the outputs agree to bf16 rounding (fp8 caches: the anchor
    // reads the bf16-dequantised rows, mlajit the fp8 ones with their scales); with qk_math fp8 the
    // difference is the FP8-math error (e4m3 Q and P) on top.
    const size_t n_out = static_cast<size_t>(T * H * 512), n_lse = static_cast<size_t>(T * H);
    std::vector<uint16_t> o1(n_out), o2(n_out);
    out.download(o1.data(), n_out * 2);
    {  // the anchor's first H of its anchor_heads heads
      std::vector<uint16_t> full(static_cast<size_t>(T * anchor_heads * 512));
      a_out.download(full.data(), full.size() * 2);
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(o2.data() + static_cast<size_t>(t * H * 512), full.data() + static_cast<size_t>(t * anchor_heads * 512),
                    static_cast<size_t>(H * 512 * 2));
    }
    nlohmann::json cmp;
    cmp["out_rel_frobenius"] = rel_frobenius_bf16(o1, o2);
    if (p.emit_lse) {
      std::vector<float> l1(n_lse), l2(n_lse);
      lse.download(l1.data(), n_lse * 4);
      {
        std::vector<float> full(static_cast<size_t>(T * anchor_heads));
        a_lse.download(full.data(), full.size() * 4);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t h = 0; h < H; ++h) l2[static_cast<size_t>(t * H + h)] = full[static_cast<size_t>(t * anchor_heads + h)];
      }
      double worst_lse = 0;
      for (size_t i = 0; i < n_lse; ++i) worst_lse = std::max(worst_lse, std::fabs(static_cast<double>(l1[i]) - l2[i]));
      cmp["lse_max_abs_diff"] = worst_lse;
    }
    j["anchor"] = {{"library", a.anchor},
                   {"kernel", decode_anchor ? "anchor_sparse_decode_fp8_ds_mla" : "anchor_sparse_prefill_bf16"},
                   {"heads_run", anchor_heads},  // > heads: run padded (zero query heads past H)
                   {"info", anchor->info ? anchor->info() : ""},
                   {"ms_median", am},
                   {"tflops", flops / (am * 1e-3) / 1e12},
                   // the same rows in the anchor's layout: records (656 bytes) or bf16 rows (1152)
                   {"read_tbps", static_cast<double>(distinct_rows) * (decode_anchor ? 656.0 : 1152.0) / (am * 1e-3) / 1e12},
                   {"ratio", am / median},  // mlajit speed / anchor speed (> 1: mlajit faster)
                   {"with_topk_length",
                    {{"ms_median", aml}, {"tflops", flops / (aml * 1e-3) / 1e12}, {"ratio", aml / median}}},
                   {"compare", cmp}};
  }
  return j;
}

}  // namespace mlajit::bench

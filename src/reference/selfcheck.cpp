// One-shot GPU-vs-reference checks of every op for `mlajit check`.
#include "reference/selfcheck.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_map>

#include <fmt/format.h>

#include "mlajit/driver.hpp"
#include "mlajit/ops.hpp"
#include "mlajit/runtime.hpp"
#include "reference/kv_cache_ref.hpp"
#include "reference/mla_indexer_ref.hpp"
#include "reference/sparse_prefill_ref.hpp"
#include "reference/test_data.hpp"

namespace mlajit::ref {

namespace {

using driver::DeviceBuffer;

template <typename T>
DeviceBuffer to_device(const std::vector<T>& v) {
  DeviceBuffer b(std::max<size_t>(v.size() * sizeof(T), 16));
  if (!v.empty()) b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

template <typename T>
std::vector<T> to_host(const DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  if (n) b.download(v.data(), n * sizeof(T));
  return v;
}

struct Timer {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double ms() const { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(); }
};

// A cache whose blocks/scales are the host cache's bytes on the device.
struct DeviceCache {
  DeviceBuffer blocks, scales, lut, lens;
  ops::PagedCacheView view;
  DeviceCache(const HostPagedCache& hc, const testdata::PageTable& pt, const testdata::RaggedBatch& batch) {
    const auto& c = hc.params;
    // fp8_page_scales: the host cache's rows and scales laid out as the pages the device holds.
    blocks = to_device(c.page_scales() ? hc.page_scales_bytes() : hc.blocks);
    scales = to_device(hc.scales);
    lut = to_device(pt.lut);
    lens = to_device(batch.cache_lengths);
    view.blocks = c.ds_mla() || c.page_scales()
                      ? TensorView(blocks.get(), DType::u8,
                                   {hc.num_blocks, 1, c.num_layers, c.page_size, static_cast<int64_t>(c.row_bytes())})
                      : TensorView(blocks.get(), c.dtype,
                                   {hc.num_blocks, c.kv_dim(), c.num_layers, c.page_size, c.num_heads, c.head_size});
    if (c.split_scales())
      view.scales = TensorView(scales.get(), DType::f32,
                               {hc.num_blocks, c.kv_dim(), c.num_layers, c.page_size, c.num_heads, c.head_dim_granularity()});
    view.lookup_table = TensorView(lut.get(), DType::u32, {pt.batch, pt.pages_per_seq});
    view.cache_lengths = TensorView(lens.get(), DType::u32, {batch.batch()});
  }
};

HostPagedCache poisoned_cache(const PagedKVCacheParams& c, int64_t num_blocks) {
  HostPagedCache hc(c, num_blocks);
  std::fill(hc.blocks.begin(), hc.blocks.end(), testdata::kPoisonByte);
  std::fill(hc.scales.begin(), hc.scales.end(), std::numeric_limits<float>::quiet_NaN());
  return hc;
}

bool same_bits(const void* a, const void* b, size_t n) { return std::memcmp(a, b, n) == 0; }

CheckResult check_op(const KvCacheStoreParams& p, uint64_t seed) {
  testdata::Rng rng(seed);
  auto batch = testdata::make_ragged_batch({5, 0, 77, 130}, {3, 64, 0, 200});
  auto pt = testdata::make_page_table(batch, p.cache.page_size, rng);
  pt.lut[1] = static_cast<uint32_t>(pt.num_blocks + 5);  // a page whose block id is out of range
  const int64_t T = batch.total_tokens();
  const int layer = p.cache.num_layers - 1, kv = p.cache.kv_dim() - 1;
  auto x = testdata::encode_all(p.input_dtype, testdata::random_normal(T * p.cache.num_heads * p.cache.head_size, rng));
  HostPagedCache want = poisoned_cache(p.cache, pt.num_blocks);
  DeviceCache dc(want, pt, batch);
  const int64_t want_dropped = kv_cache_store(p, x, T, batch.row_offsets, batch.cache_lengths, pt.lut,
                                              pt.pages_per_seq, layer, kv, want);
  DeviceBuffer dx = to_device(x), off = to_device(batch.row_offsets), dropped(16);
  dropped.fill_bytes(0);
  Timer t;
  ops::kv_cache_store(p, TensorView(dx.get(), p.input_dtype, {T, p.cache.num_heads, p.cache.head_size}),
                      TensorView(off.get(), DType::u32, {batch.batch() + 1}), dc.view, layer, kv,
                      TensorView(dropped.get(), DType::u32, {1}));
  driver::synchronize();
  CheckResult r;
  r.gpu_ms = t.ms();
  // fp8_page_scales: the pages hold the scales; compared as the pages built from the reference.
  const std::vector<uint8_t> want_blocks = p.cache.page_scales() ? want.page_scales_bytes() : want.blocks;
  auto blocks = to_host<uint8_t>(dc.blocks, want_blocks.size());
  auto nd = to_host<uint32_t>(dropped, 1)[0];
  const bool bytes_ok = same_bits(blocks.data(), want_blocks.data(), blocks.size());
  bool scales_ok = true;
  if (p.cache.split_scales()) {
    auto scales = to_host<float>(dc.scales, want.scales.size());
    scales_ok = same_bits(scales.data(), want.scales.data(), scales.size() * 4);
  }
  r.passed = bytes_ok && scales_ok && nd == want_dropped;
  r.metric = fmt::format("cache bytes {}, scales {}, dropped {}/{}", bytes_ok ? "exact" : "DIFFER",
                         scales_ok ? "exact" : "DIFFER", nd, want_dropped);
  return r;
}

CheckResult check_op(const KvCacheGatherParams& p, uint64_t seed) {
  testdata::Rng rng(seed);
  auto batch = testdata::make_ragged_batch({40, 1, 90}, {100, 7, 0});
  auto pt = testdata::make_page_table(batch, p.cache.page_size, rng);
  const int64_t T = batch.total_tokens();
  const int layer = p.cache.num_layers - 1, kv = p.cache.kv_dim() - 1;
  // Fill the cache through the reference store (every layer/kv slot random) so gathers read real data.
  KvCacheStoreParams sp;
  sp.cache = p.cache;
  sp.input_dtype = DType::f32;
  HostPagedCache hc = poisoned_cache(p.cache, pt.num_blocks);
  auto x = testdata::encode_all(DType::f32, testdata::random_normal(T * p.cache.num_heads * p.cache.head_size, rng));
  auto full = testdata::make_ragged_batch(batch.seq_lens, std::vector<uint32_t>(batch.batch(), 0));
  for (int b = 0; b < batch.batch(); ++b) full.seq_lens[b] += batch.cache_lengths[b];
  full = testdata::make_ragged_batch(full.seq_lens, std::vector<uint32_t>(batch.batch(), 0));
  auto xf = testdata::encode_all(DType::f32,
                                 testdata::random_normal(full.total_tokens() * p.cache.num_heads * p.cache.head_size, rng));
  kv_cache_store(sp, xf, full.total_tokens(), full.row_offsets, full.cache_lengths, pt.lut, pt.pages_per_seq, layer, kv, hc);
  // Pairs: every cached/new position of each sequence, plus a few that do not exist.
  std::vector<uint32_t> bids, pos;
  for (int b = 0; b < batch.batch(); ++b)
    for (uint32_t j = 0; j < full.seq_lens[b]; ++j) bids.push_back(b), pos.push_back(j);
  bids.push_back(0), pos.push_back(static_cast<uint32_t>(pt.pages_per_seq * p.cache.page_size + 3));
  bids.push_back(7), pos.push_back(0);
  std::vector<uint8_t> want;
  const int64_t want_dropped = kv_cache_gather(p, hc, pt.lut, batch.batch(), pt.pages_per_seq, bids, pos, layer, kv, want);
  DeviceCache dc(hc, pt, batch);
  const int64_t n = static_cast<int64_t>(bids.size());
  DeviceBuffer db = to_device(bids), dp = to_device(pos), dy(want.size() + 16), dropped(16);
  dy.fill_bytes(testdata::kPoisonByte);
  dropped.fill_bytes(0);
  Timer t;
  ops::kv_cache_gather(p, dc.view, TensorView(db.get(), DType::u32, {n}), TensorView(dp.get(), DType::u32, {n}), layer,
                       kv, TensorView(dy.get(), p.output_dtype, {n, p.cache.num_heads, p.cache.head_size}),
                       TensorView(dropped.get(), DType::u32, {1}));
  driver::synchronize();
  CheckResult r;
  r.gpu_ms = t.ms();
  auto y = to_host<uint8_t>(dy, want.size());
  const size_t es = dtype_size(p.output_dtype);
  size_t bad = 0;
  for (size_t i = 0; i < want.size() / es; ++i) {
    float a = testdata::decode(p.output_dtype, y.data() + i * es), b = testdata::decode(p.output_dtype, want.data() + i * es);
    if (!(std::isnan(a) && std::isnan(b)) && !same_bits(y.data() + i * es, want.data() + i * es, es)) ++bad;
  }
  auto nd = to_host<uint32_t>(dropped, 1)[0];
  r.passed = bad == 0 && nd == want_dropped;
  r.metric = fmt::format("{} rows, {} elements differ, dropped {}/{}", n, bad, nd, want_dropped);
  return r;
}

CheckResult check_op(const SparseIndexRemapParams& p, uint64_t seed) {
  testdata::Rng rng(seed);
  auto batch = testdata::make_ragged_batch({3, 17, 9}, {500, 0, 64});
  auto pt = testdata::make_page_table(batch, p.page_size, rng);
  pt.num_blocks -= 2;  // some mapped blocks are now out of range
  const int64_t T = batch.total_tokens(), k = 64;
  std::vector<int32_t> idx(static_cast<size_t>(T * k));
  const int64_t span = static_cast<int64_t>(pt.pages_per_seq) * p.page_size;
  for (auto& v : idx) v = static_cast<int32_t>(rng.uniform(-3, span + 70));
  auto want = sparse_index_remap(p.page_size, idx, T, k, batch.row_offsets, pt.lut, pt.pages_per_seq, pt.num_blocks);
  DeviceBuffer di = to_device(idx), off = to_device(batch.row_offsets), lut = to_device(pt.lut), out(want.size() * 4 + 16);
  out.fill_bytes(testdata::kPoisonByte);
  Timer t;
  ops::sparse_index_remap(p, TensorView(di.get(), DType::i32, {T, k}), TensorView(off.get(), DType::u32, {batch.batch() + 1}),
                          TensorView(lut.get(), DType::u32, {pt.batch, pt.pages_per_seq}), pt.num_blocks,
                          TensorView(out.get(), DType::i32, {T, k}));
  driver::synchronize();
  CheckResult r;
  r.gpu_ms = t.ms();
  auto got = to_host<int32_t>(out, want.size());
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += got[i] != want[i];
  r.passed = bad == 0;
  r.metric = fmt::format("{} indices, {} differ", got.size(), bad);
  return r;
}

CheckResult check_op(const MlaIndexerParams& p, uint64_t seed) {
  IndexerCase c;
  c.num_heads = p.num_heads;
  c.page_size = p.page_size;
  c.mask = p.mask;
  c.new_tokens = {64, 200, 32};
  c.cache_lens = {300, 500, 100};
  c.seed = seed;
  IndexerInputs in = make_indexer_inputs(c);
  const int64_t T = in.num_tokens();
  const int B = in.batch();
  DeviceBuffer q = to_device(in.q), qs = to_device(in.qs), off = to_device(in.row_offsets), cl = to_device(in.cache_lengths),
               lut = to_device(in.lookup_table), ks = to_device(in.k_scales);
  // k_layout fp8_page_scales: the keys as the engines' pages (each page's 128-byte keys, then
  // their f32 scales).
  const bool page_scales = p.k_layout == CacheLayout::fp8_page_scales;
  const std::vector<uint8_t> pages =
      page_scales ? page_scales_from_split(in.k_blocks.data(), in.k_scales.data(),
                                           static_cast<size_t>(in.num_blocks) * in.num_layers, in.page_size)
                  : std::vector<uint8_t>();
  DeviceBuffer kb = to_device(page_scales ? pages : in.k_blocks);
  ops::PagedCacheView kc;
  if (page_scales) {
    kc.blocks = TensorView(kb.get(), DType::u8, {in.num_blocks, 1, in.num_layers, in.page_size, 132});
  } else {
    kc.blocks = TensorView(kb.get(), DType::fp8_e4m3, {in.num_blocks, 1, in.num_layers, in.page_size, 1, 128});
    kc.scales = TensorView(ks.get(), DType::f32, {in.num_blocks, 1, in.num_layers, in.page_size, 1, in.scale_row_stride});
  }
  kc.lookup_table = TensorView(lut.get(), DType::u32, {B, in.pages_per_seq});
  kc.cache_lengths = TensorView(cl.get(), DType::u32, {B});
  DeviceBuffer ws(std::max<size_t>(ops::mla_indexer_workspace_bytes(p, T, in.max_keys), 16));
  DeviceBuffer out(static_cast<size_t>(T * p.top_k) * 4 + 16);
  out.fill_bytes(0x7F);
  Timer t;
  ops::mla_indexer(p, TensorView(q.get(), DType::fp8_e4m3, {T, p.num_heads, 128}),
                   TensorView(qs.get(), DType::f32, {T, p.num_heads}), TensorView(off.get(), DType::u32, {B + 1}), kc,
                   in.layer, in.max_keys, TensorView(out.get(), DType::i32, {T, p.top_k}),
                   TensorView(ws.get(), DType::f32, {static_cast<int64_t>(ws.size() / 4)}));
  driver::synchronize();
  CheckResult r;
  r.gpu_ms = t.ms();
  auto got = to_host<int32_t>(out, static_cast<size_t>(T * p.top_k));
  // Accept swaps among near-equal scores: the reference scores of the GPU's picks, slot by slot,
  // must equal the reference's sorted top-k scores within a window. f32 scores (portable path):
  // 1e-5 relative. Hopper's FP8 tensor cores do not accumulate in full f32 (errors up to ~4e-4 of
  // the row's largest |score| were measured), so there the window is 1e-3 of that maximum, as in
  // tests/gpu/test_mla_indexer.cpp.
  const bool fp8_mma = Runtime::global().arch() == "sm_90a";
  size_t bad_rows = 0;
  for (int64_t tok = 0; tok < T; ++tok) {
    auto s = indexer_scores_ref(in, tok);
    auto want = topk_ref(s, p.top_k);
    double maxabs = 0;
    for (double v : s)
      if (!std::isnan(v)) maxabs = std::max(maxabs, std::fabs(v));
    const int32_t* row = got.data() + tok * p.top_k;
    // emit = physical: map encoded indices back to positions through the sequence's table.
    std::unordered_map<int32_t, int32_t> logical_of;
    if (p.emit == IndexEmit::physical)
      for (int32_t j = 0; j < static_cast<int32_t>(s.size()); ++j) logical_of[encode_ref(in, ref_token(in, tok).seq, j)] = j;
    bool ok = true;
    std::vector<char> seen(s.size(), 0);
    for (int i = 0; i < p.top_k && ok; ++i) {
      int32_t g = row[i];
      const int32_t w = want[i];
      if (w < 0) {
        ok = g == -1;
        continue;
      }
      if (p.emit == IndexEmit::physical) {
        auto it = logical_of.find(g);
        g = it == logical_of.end() ? -1 : it->second;
      }
      if (g < 0 || g >= static_cast<int32_t>(s.size()) || seen[g]) {
        ok = false;
        continue;
      }
      seen[g] = 1;
      const double a = s[g], b = s[w];
      const double tol = fp8_mma ? 1e-3 * maxabs : 1e-5 * std::max(std::fabs(b), 1e-30);
      ok = (std::isnan(a) && std::isnan(b)) || a == b || std::fabs(a - b) <= tol;
    }
    bad_rows += !ok;
  }
  r.passed = bad_rows == 0;
  r.metric = fmt::format("{} rows, {} differ beyond near-ties", T, bad_rows);
  return r;
}

CheckResult check_op(const SparsePrefillParams& p, uint64_t seed) {
  SparsePrefillShape s;
  s.num_tokens = 62;
  s.indices_stride = 4 * p.b_topk;
  SparsePrefillProblem pb = make_random_problem(p, s, seed);
  // kv_staging bf16 computes the problem over its staged rows (e4m3 * scale rounded once to bf16):
  // held to the SPEC bounds against that problem's f64 result.
  const bool staged = p.kv_staging == KvStaging::bf16;
  SparsePrefillResult want = sparse_prefill_reference(staged ? staged_bf16_problem(pb) : pb);
  const int64_t T = pb.num_tokens, H = p.num_q_heads;
  DeviceBuffer q = to_device(pb.q), blocks = to_device(pb.blocks), scales = to_device(pb.scales),
               idx = to_device(pb.indices), len = to_device(pb.topk_lengths), sink = to_device(pb.attn_sink);
  DeviceBuffer out(static_cast<size_t>(T * H * 512 * 2) + 16), lse(static_cast<size_t>(T * H * 4) + 16);
  const size_t ws_bytes = ops::sparse_prefill_workspace_bytes(p, pb.num_blocks);
  DeviceBuffer workspace(std::max<size_t>(ws_bytes, 16));
  workspace.fill_bytes(testdata::kPoisonByte);
  out.fill_bytes(testdata::kPoisonByte);
  lse.fill_bytes(testdata::kPoisonByte);
  ops::PagedCacheView kv;
  if (p.kv_layout == CacheLayout::fp8_ds_mla) {  // the records kv_cache_store writes: u8 [.., page_size, 656]
    kv.blocks = TensorView(blocks.get(), DType::u8, {pb.num_blocks, 1, pb.num_layers, p.page_size, 656});
  } else {
    kv.blocks = TensorView(blocks.get(), p.kv_dtype, {pb.num_blocks, 1, pb.num_layers, p.page_size, 1, 576});
  }
  if (p.scales_per_token() > 0)
    kv.scales = TensorView(scales.get(), DType::f32, {pb.num_blocks, 1, pb.num_layers, p.page_size, 1, p.scales_per_token()});
  Timer t;
  ops::sparse_prefill(p, TensorView(q.get(), DType::bf16, {T, H, 576}), kv,
                      TensorView(idx.get(), DType::u32, {T, pb.indices_stride}), TensorView(len.get(), DType::u32, {T}),
                      pb.layer_idx, pb.softmax_scale,
                      p.attn_sink ? TensorView(sink.get(), DType::f32, {H}) : TensorView(),
                      TensorView(out.get(), DType::bf16, {T, H, 512}),
                      p.emit_lse ? TensorView(lse.get(), DType::f32, {T, H}) : TensorView(),
                      ws_bytes ? TensorView(workspace.get(), DType::u32, {static_cast<int64_t>(ws_bytes / 4)}) : TensorView());
  driver::synchronize();
  CheckResult r;
  r.gpu_ms = t.ms();
  auto o = to_host<uint16_t>(out, static_cast<size_t>(T * H * 512));
  auto l = to_host<float>(lse, static_cast<size_t>(T * H));
  double num = 0, den = 0, dot = 0, na = 0, lse_err = 0;
  size_t nans = 0;
  for (size_t i = 0; i < o.size(); ++i) {
    const double g = bf16_to_float(o[i]), w = want.out[i];
    if (std::isnan(g)) { ++nans; continue; }
    num += (g - w) * (g - w), den += w * w, dot += g * w, na += g * g;
  }
  if (p.emit_lse)
    for (size_t i = 0; i < l.size(); ++i) {
      if (std::isinf(want.lse[i]) && std::isinf(l[i])) continue;
      lse_err = std::isnan(l[i]) ? INFINITY : std::max(lse_err, std::fabs(l[i] - want.lse[i]));
    }
  const double rel = std::sqrt(num / std::max(den, 1e-300)), cos = dot / std::sqrt(std::max(na * den, 1e-300));
  // SPEC §3's bounds, or the FP8-math mode's own (sparse_prefill_ref.hpp).
  const Fp8MathBounds f8b = fp8_math_bounds(pb.softmax_scale);
  const bool within = p.qk_math == QkMath::fp8
                          ? rel <= f8b.max_rel_frobenius && cos >= f8b.min_cosine && lse_err <= f8b.max_lse_abs_err
                          : rel < 1e-2 && cos > 0.9999 && lse_err < 1e-4;
  r.passed = nans == 0 && within;
  r.metric = fmt::format("rel_frob {:.2e} cos {:.6f} lse_err {:.1e} nan {}", rel, cos, lse_err, nans);
  return r;
}

}  // namespace

// One check_op overload per op's params type: a new op that lacks one fails to compile here.
CheckResult check_spec(const KernelSpec& spec, uint64_t seed) {
  return std::visit([&](const auto& p) { return check_op(p, seed); }, spec.params);
}

}  // namespace mlajit::ref

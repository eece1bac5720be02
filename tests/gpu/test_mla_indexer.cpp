// ops::mla_indexer on the GPU against the CPU f64 reference (SPEC §2, §4 test data): ragged
// batches with cache, shuffled pages, 2 layers (layer 1), both masks, k >= visible (-1 tails),
// heavy exact ties, NaN scores, a 131072-key row, several workspace chunks, emit = physical.
//
// Index sets must equal the reference's except for swaps among scores inside a tie window around
// the k-th score; order is checked on the reference's scores. Where the workspace still holds
// every row's f32 scores (one chunk), the top-k is also checked EXACTLY (bit-for-bit order, no
// window) against the CPU top-k of the GPU's own scores, and the scores against the f64 reference.
//
// Windows. The portable (FMA) path accumulates in true f32: window 1e-5 relative to the k-th score
// (floored at 1e-3 of the row's largest |score|), scores within 1e-5 of the row's largest |score|.
// The sm_90a path uses fp8 wgmma (QGMMA), whose accumulator does not keep f32 precision (Hopper
// fp8 MMA aligns and truncates partial sums to roughly 13-14 mantissa bits; measured here: score
// errors up to ~4.3e-4 of the row's largest |score|). Its window and score tolerance are
// therefore 1e-3 of the row's largest |score|; heavy exact ties still have to match exactly. Rows
// of fewer than 64 keys may also err by 2^-11 of each key's |k_scale| * sum_h |w_h| sum_d |q k|:
// a row of one key whose heads' weighted terms cancel has a largest |score| far below what the
// accumulator rounds (H 32, one visible key: 2.4e-3 of the score, on both Hopper scorers
// alike).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "mlajit/driver.hpp"
#include "mlajit/ops.hpp"
#include "mlajit/runtime.hpp"
#include "ops/mla_indexer/plan.hpp"
#include "ops/mla_indexer/stages.hpp"
#include "reference/kv_cache_ref.hpp"
#include "reference/mla_indexer_ref.hpp"

using namespace mlajit;
using driver::DeviceBuffer;

namespace {

// Portable path: window relative to the k-th score (floored at 1e-3 of the row's largest |score|).
constexpr double kTieWindowF32 = 1e-5;
constexpr double kScoreTolF32 = 1e-5;
// fp8 tensor-core path: window and score tolerance relative to the row's largest |score|.
constexpr double kWindowFp8Mma = 1e-3;
// Rows with fewer visible keys than this also get a per-key allowance of kMagFp8Mma times the
// magnitude |k_scale| * sum_h |w_h| * sum_d |q_hd k_d| of the sums the MMA accumulates: 4x the
// ~2^-13 relative truncation of the fp8 accumulator.
constexpr size_t kFewKeys = 64;
constexpr double kMagFp8Mma = 1.0 / 2048;

template <typename T>
DeviceBuffer upload(const std::vector<T>& v) {
  DeviceBuffer b(std::max<size_t>(v.size() * sizeof(T), 16));
  if (!v.empty()) b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

// Byte offsets of the K cache's blocks and scales views inside their device buffers (a cache that
// starts mid-allocation; the persistent scorer's TMA descriptors start at the view).
struct CacheBase {
  size_t blocks = 0;
  size_t scales = 0;
};

struct GpuRun {
  std::vector<int32_t> out;   // [T, k]
  std::vector<float> scores;  // workspace contents after the run
  int64_t row_stride = 0;
  bool one_chunk = false;
};

template <typename T>
DeviceBuffer upload_at(const std::vector<T>& v, size_t offset) {
  DeviceBuffer b(v.size() * sizeof(T) + offset + 16);
  b.fill_bytes(0x5A);  // bytes before and after the view: read by no correct kernel
  b.upload(v.data(), v.size() * sizeof(T), offset);
  return b;
}

// The K cache in layout fp8_page_scales (the engines' pages), built by hand from the published
// layout: page (block, layer) = its page_size keys' 128 e4m3, then their page_size f32 scales.
std::vector<uint8_t> page_scales_bytes(const ref::IndexerInputs& in) {
  return ref::page_scales_from_split(in.k_blocks.data(), in.k_scales.data(),
                                     static_cast<size_t>(in.num_blocks) * in.num_layers, in.page_size);
}

// `launch` 0 runs ops::mla_indexer; else ops::detail::mla_indexer_run with the scores and top-k
// stages and these extra IndexerStage flags (kIndexerForcePortable, kIndexerOneItemPerCta, ...).
// p.k_layout fp8_page_scales: the same keys as the engines' pages (page_scales_bytes), no scales view.
GpuRun run_gpu(const ref::IndexerInputs& in, const MlaIndexerParams& p, size_t workspace_rows = 0,
               unsigned launch = 0, const CacheBase& base = {}) {
  const int64_t T = in.num_tokens();
  const int B = in.batch();
  const bool page_scales = p.k_layout == CacheLayout::fp8_page_scales;
  DeviceBuffer q = upload(in.q), qs = upload(in.qs), off = upload(in.row_offsets), cl = upload(in.cache_lengths),
               lut = upload(in.lookup_table),
               kb = page_scales ? upload_at(page_scales_bytes(in), base.blocks) : upload_at(in.k_blocks, base.blocks),
               ks = upload_at(in.k_scales, base.scales);
  ops::PagedCacheView kc;
  if (page_scales) {
    kc.blocks = TensorView(static_cast<char*>(kb.get()) + base.blocks, DType::u8,
                           {in.num_blocks, 1, in.num_layers, in.page_size, 132});
  } else {
    kc.blocks = TensorView(static_cast<char*>(kb.get()) + base.blocks, DType::fp8_e4m3,
                           {in.num_blocks, 1, in.num_layers, in.page_size, 1, 128});
    kc.scales = TensorView(static_cast<char*>(ks.get()) + base.scales, DType::f32,
                           {in.num_blocks, 1, in.num_layers, in.page_size, 1, 1});
  }
  kc.lookup_table = TensorView(lut.get(), DType::u32, {B, in.pages_per_seq});
  kc.cache_lengths = TensorView(cl.get(), DType::u32, {B});
  GpuRun r;
  r.row_stride = (std::max<int64_t>(in.max_keys, 1) + 3) / 4 * 4;
  size_t ws_bytes = ops::mla_indexer_workspace_bytes(p, T, in.max_keys);
  if (workspace_rows > 0) ws_bytes = workspace_rows * static_cast<size_t>(r.row_stride) * 4;
  r.one_chunk = ws_bytes >= static_cast<size_t>(T * r.row_stride * 4);
  DeviceBuffer ws(std::max<size_t>(ws_bytes, 16));
  ws.fill_bytes(0xFF);  // NaN
  DeviceBuffer out(static_cast<size_t>(T * p.top_k) * 4 + 16);
  out.fill_bytes(0x7F);  // 0x7F7F7F7F: neither a position of these tests nor -1
  const TensorView vq(q.get(), DType::fp8_e4m3, {T, p.num_heads, 128}), vqs(qs.get(), DType::f32, {T, p.num_heads}),
      voff(off.get(), DType::u32, {B + 1}), vout(out.get(), DType::i32, {T, p.top_k}),
      vws(ws.get(), DType::f32, {static_cast<int64_t>(ws_bytes / 4)});
  if (launch != 0)
    ops::detail::mla_indexer_run(p, vq, vqs, voff, kc, in.layer, in.max_keys, vout, vws, nullptr,
                                 ops::detail::kIndexerScores | ops::detail::kIndexerTopk | launch);
  else
    ops::mla_indexer(p, vq, vqs, voff, kc, in.layer, in.max_keys, vout, vws);
  driver::synchronize();
  r.out.resize(static_cast<size_t>(T * p.top_k));
  out.download(r.out.data(), r.out.size() * 4);
  if (r.one_chunk) {
    r.scores.resize(static_cast<size_t>(T * r.row_stride));
    ws.download(r.scores.data(), r.scores.size() * 4);
  }
  return r;
}

struct Report {
  int failures = 0;
  std::string first;
  double worst_score_err = 0;
  // Failures by kind: tail (-1 slots), invalid (position out of range or repeated), set, order,
  // exact (vs the reference list when exact ties are demanded), own (vs the top-k of the GPU's
  // own scores), score (score error).
  int tail = 0, invalid = 0, set = 0, order = 0, exact = 0, own = 0, score = 0;
  void fail(int& kind, const std::string& s) {
    ++kind;
    if (failures++ == 0) first = s;
  }
  std::string kinds() const {
    std::ostringstream o;
    o << "tail " << tail << ", invalid " << invalid << ", set " << set << ", order " << order << ", exact " << exact
      << ", own-scores " << own << ", score " << score;
    return o.str();
  }
};

// Compares one run with the reference; `exact` demands identical index lists.
Report compare(const ref::IndexerInputs& in, const MlaIndexerParams& p, const GpuRun& g, bool exact, bool fp8_mma) {
  Report rep;
  const int k = p.top_k;
  for (int64_t t = 0; t < in.num_tokens(); ++t) {
    const std::vector<double> s = ref::indexer_scores_ref(in, t);
    const std::vector<int32_t> want = ref::topk_ref(s, k);
    const int32_t* got = g.out.data() + t * k;
    const size_t n = s.size(), kk = std::min<size_t>(n, static_cast<size_t>(k));
    auto where = [&](size_t slot) {
      std::ostringstream o;
      o << "token " << t << " slot " << slot << " (visible " << n << ", k " << k << "): ";
      return o.str();
    };
    for (size_t x = kk; x < static_cast<size_t>(k); ++x)
      if (got[x] != -1) rep.fail(rep.tail, where(x) + "expected -1, got " + std::to_string(got[x]));
    std::set<int32_t> seen;
    bool valid = true;
    for (size_t x = 0; x < kk; ++x) {
      if (got[x] < 0 || static_cast<size_t>(got[x]) >= n || !seen.insert(got[x]).second) {
        rep.fail(rep.invalid, where(x) + "invalid or repeated position " + std::to_string(got[x]));
        valid = false;
      }
    }
    if (!valid) continue;
    if (exact || kk == n) {
      // Every visible key is selected (or ties are exact by construction): the whole list must match,
      // except that with kk == n and inexact mode the order may differ inside the tie window.
      if (exact) {
        for (size_t x = 0; x < kk; ++x)
          if (got[x] != want[x]) {
            rep.fail(rep.exact, where(x) + "expected " + std::to_string(want[x]) + ", got " + std::to_string(got[x]));
            break;
          }
        continue;
      }
    }
    double maxabs = 0;
    for (double v : s)
      if (!std::isnan(v)) maxabs = std::max(maxabs, std::fabs(v));
    const double kth = s[want[kk - 1]];
    // The window does not depend on whether the k-th score is NaN (rows with k >= visible end in
    // their NaN keys); NaN scores themselves are compared exactly.
    const double tol = fp8_mma ? kWindowFp8Mma * maxabs
                               : kTieWindowF32 * std::max(std::isnan(kth) ? 0.0 : std::fabs(kth), 1e-3 * maxabs);
    std::set<int32_t> want_set(want.begin(), want.begin() + kk);
    for (size_t x = 0; x < kk; ++x) {
      const int32_t j = got[x];
      if (!want_set.count(j)) {
        const double v = s[j];
        if (std::isnan(kth) ? !std::isnan(v) : !(std::fabs(v - kth) <= tol))
          rep.fail(rep.set, where(x) + "position " + std::to_string(j) + " (score " + std::to_string(v) +
                                ") is not in the reference set (k-th score " + std::to_string(kth) + ")");
      }
      if (x + 1 < kk) {
        const double a = s[got[x]], b = s[got[x + 1]];
        const bool ok = std::isnan(b) || (!std::isnan(a) && (a >= b - tol) && (a != b || got[x] < got[x + 1]));
        if (!ok)
          rep.fail(rep.order, where(x) + "order: score " + std::to_string(a) + " at " + std::to_string(got[x]) +
                                  " before " + std::to_string(b) + " at " + std::to_string(got[x + 1]));
      }
    }
    if (g.one_chunk) {
      // Exact top-k of the GPU's own f32 scores, and the scores themselves.
      const float* row = g.scores.data() + t * g.row_stride;
      const std::vector<float> gs(row, row + n);
      const std::vector<int32_t> exact_want = ref::topk_ref_f32(gs, k);
      for (size_t x = 0; x < kk; ++x)
        if (got[x] != exact_want[x]) {
          rep.fail(rep.own, where(x) + "top-k of the GPU's own scores: expected " + std::to_string(exact_want[x]) +
                                ", got " + std::to_string(got[x]));
          break;
        }
      // Rows of few keys on the fp8 tensor-core path: the largest |score| of the row is no measure
      // of the accumulator's error when the heads' terms cancel (a row of one key whose weighted
      // relu sum is small), so each key may also err by kMagFp8Mma of the magnitude of its sums.
      const std::vector<double> mag =
          fp8_mma && n < kFewKeys ? ref::indexer_score_magnitudes_ref(in, t) : std::vector<double>();
      double err = 0;
      bool beyond = false;
      for (size_t j = 0; j < n; ++j) {
        if (std::isnan(s[j]) != std::isnan(gs[j])) {
          err = 1e30;
          beyond = true;
        } else if (!std::isnan(s[j])) {
          const double e = std::fabs(gs[j] - s[j]);
          err = std::max(err, e);
          const double allowed = std::max((fp8_mma ? kWindowFp8Mma : kScoreTolF32) * maxabs,
                                          mag.empty() ? 0.0 : kMagFp8Mma * mag[j]);
          if (!(e <= allowed)) beyond = true;
        }
      }
      const double rel = maxabs > 0 ? err / maxabs : err;
      rep.worst_score_err = std::max(rep.worst_score_err, rel);
      if (beyond)
        rep.fail(rep.score, where(0) + "score error " + std::to_string(rel) + " relative to max |score|");
    }
  }
  return rep;
}

// One run of one scorer variant against the reference, and its emit = physical twin.
GpuRun run_and_check_one(const char* name, const ref::IndexerInputs& in, MlaIndexerParams p, bool exact,
                         size_t workspace_rows, bool portable, const CacheBase& base) {
  p.emit = IndexEmit::logical;
  const unsigned launch = portable ? ops::detail::kIndexerForcePortable : 0u;
  const GpuRun g = run_gpu(in, p, workspace_rows, launch, base);
  const bool fp8_mma = !portable && Runtime::global().arch() == "sm_90a";
  const Report rep = compare(in, p, g, exact, fp8_mma);
  std::printf("  mla_indexer %-30s H%-3d k%-5d p%-4d bkv%-3d %s %s: %d failures (%s), max score error %.2e%s\n", name,
              p.num_heads, p.top_k, p.page_size, p.block_kv, p.mask == Mask::causal ? "causal" : "none  ",
              fp8_mma ? "wgmma" : "fma  ", rep.failures, rep.kinds().c_str(), rep.worst_score_err,
              g.one_chunk ? "" : " (several chunks)");
  INFO(std::string(name) << " H" << p.num_heads << " block_kv " << p.block_kv << ": " << rep.first);
  CHECK(rep.failures == 0);

  // emit = physical: the same selection, remapped through the lookup table.
  p.emit = IndexEmit::physical;
  const GpuRun phys = run_gpu(in, p, workspace_rows, launch, base);
  int bad = 0;
  std::string first;
  for (int64_t t = 0; t < in.num_tokens(); ++t) {
    const int b = ref::ref_token(in, t).seq;
    for (int x = 0; x < p.top_k; ++x) {
      const int32_t want = ref::encode_ref(in, b, g.out[t * p.top_k + x]);
      if (phys.out[t * p.top_k + x] != want && bad++ == 0)
        first = "token " + std::to_string(t) + " slot " + std::to_string(x) + ": expected " + std::to_string(want) +
                ", got " + std::to_string(phys.out[t * p.top_k + x]);
    }
  }
  INFO(std::string(name) << " block_kv " << p.block_kv << " emit physical: " << first);
  CHECK(bad == 0);
  return g;
}

// Byte-for-byte comparison of two runs: top-k output, and the workspace when it held every row.
void check_identical(const GpuRun& want, const GpuRun& got, const std::string& what) {
  INFO(what);
  CHECK(got.out == want.out);
  if (want.one_chunk) {
    CHECK(got.scores.size() == want.scores.size());
    size_t first_diff = want.scores.size();
    for (size_t x = 0; x < want.scores.size() && x < got.scores.size() && first_diff == want.scores.size(); ++x)
      if (std::memcmp(&want.scores[x], &got.scores[x], 4) != 0) first_diff = x;
    INFO("first differing workspace float: " << first_diff << " (row "
                                             << first_diff / std::max<int64_t>(want.row_stride, 1) << ")");
    CHECK(first_diff == want.scores.size());
  }
}

// Runs the case on every scorer variant of the device: the portable path when asked, else (on
// sm_90a) the tile scorer (block_kv 64) and the persistent scorer (block_kv 256; what 0, the
// heuristic, runs at pages >= 8). The persistent scorer computes the same function with the same
// per-thread arithmetic and stores the same keys, so beyond the reference checks its workspace
// (scores of visible keys, and the NaN fill of the keys no token sees, which neither may write)
// and its top-k output must equal the tile scorer's byte for byte. It runs in its three launches:
// the persistent grid (the default, checked against the reference), one work item per CTA, and a
// persistent grid of a few CTAs (kIndexerSmallGrid: many items per CTA, in uneven numbers, across
// sequences and key splits); the last two are compared with the tile scorer byte for byte.
// Inputs prepared by the caller (p's heads, page size and mask already match them). At pages >= 8
// the persistent scorer's blocks come by TMA in all three launches.
void run_and_check_inputs(const char* name, const ref::IndexerInputs& in, MlaIndexerParams p, bool exact,
                          size_t workspace_rows = 0, bool portable = false, const CacheBase& base = {}) {
  const bool sm90 = !portable && Runtime::global().arch() == "sm_90a";
  p.block_kv = 64;
  const GpuRun tile = run_and_check_one(name, in, p, exact, workspace_rows, portable, base);
  if (!sm90) return;
  p.block_kv = 256;
  const GpuRun persistent = run_and_check_one(name, in, p, exact, workspace_rows, portable, base);
  const std::string tag = std::string(name) + " H" + std::to_string(p.num_heads) + ": block_kv 256";
  check_identical(tile, persistent, tag + " (persistent grid) vs 64");
  p.emit = IndexEmit::logical;
  check_identical(tile, run_gpu(in, p, workspace_rows, ops::detail::kIndexerOneItemPerCta, base),
                  tag + " (one work item per CTA) vs 64");
  check_identical(tile, run_gpu(in, p, workspace_rows, ops::detail::kIndexerSmallGrid, base),
                  tag + " (persistent grid of few CTAs) vs 64");
}

// `p` with the case's heads, page size and mask (the fields the case's inputs were built for).
MlaIndexerParams with_case(MlaIndexerParams p, const ref::IndexerCase& c) {
  p.num_heads = c.num_heads;
  p.page_size = c.page_size;
  p.mask = c.mask;
  return p;
}

void run_and_check(const char* name, const ref::IndexerCase& c, const MlaIndexerParams& p, bool exact,
                   size_t workspace_rows = 0, bool portable = false) {
  const ref::IndexerInputs in = ref::make_indexer_inputs(c);
  run_and_check_inputs(name, in, with_case(p, c), exact, workspace_rows, portable);
}

// Unmapped pages inside the visible keys: every `every`-th page of each sequence (from page 1)
// gets a block id past the cache, and the table loses its last `drop` columns, so the longest
// sequences' last visible pages lie past it. Both kinds are never read (their keys score 0).
ref::IndexerInputs with_unmapped_pages(ref::IndexerInputs in, int every, int drop) {
  const int B = in.batch();
  const int64_t pps = in.pages_per_seq, kept = std::max<int64_t>(1, pps - drop);
  std::vector<uint32_t> table(static_cast<size_t>(B * kept));
  for (int b = 0; b < B; ++b)
    for (int64_t pg = 0; pg < kept; ++pg) {
      uint32_t v = in.lookup_table[b * pps + pg];
      if (pg % every == 1) v = static_cast<uint32_t>(in.num_blocks + pg);  // out of range
      table[b * kept + pg] = v;
    }
  in.lookup_table = std::move(table);
  in.pages_per_seq = kept;
  return in;
}

}  // namespace

TEST_SUITE("gpu mla_indexer") {
  TEST_CASE("decode-like batch: seq [1,1,32,1], cache [100,50,0,200], k >= visible tails, NaN scores") {
    for (int H : {64, 128}) {
      ref::IndexerCase c;
      c.num_heads = H;
      c.new_tokens = {1, 1, 32, 1};
      c.cache_lens = {100, 50, 0, 200};
      c.seed = 11 + H;
      c.nan_every = 37;
      MlaIndexerParams p;
      p.top_k = 128;
      run_and_check("decode", c, p, false);
    }
  }

  TEST_CASE("prefill batch: seq [64,200,32], cache [300,500,100], both masks") {
    for (int H : {64, 128})
      for (Mask m : {Mask::causal, Mask::none}) {
        ref::IndexerCase c;
        c.num_heads = H;
        c.mask = m;
        c.new_tokens = {64, 200, 32};
        c.cache_lens = {300, 500, 100};
        c.seed = 21 + H + (m == Mask::none ? 1 : 0);
        MlaIndexerParams p;
        p.top_k = 256;
        run_and_check("prefill", c, p, false);
      }
  }

  TEST_CASE("prefill in several workspace chunks, page size 16, H 32") {
    ref::IndexerCase c;
    c.num_heads = 32;
    c.page_size = 16;
    c.new_tokens = {64, 200, 32};
    c.cache_lens = {300, 500, 100};
    c.seed = 5;
    MlaIndexerParams p;
    p.top_k = 64;
    run_and_check("prefill chunked (ws 100 rows)", c, p, false, 100);
  }

  TEST_CASE("page sizes 1, 4, 128, 256, H 32 / 64 / 128, 2 stages: pages inside and across the persistent scorer's 256-key blocks") {
    // The persistent scorer reads one table entry per 64-key quarter for pages >= 64 (a page of
    // 128 / 256 keys holds 2 / 4 quarters, at different offsets; by TMA) and one per page and
    // producer lane below 64 (16 per quarter at page 4, its cp.async producer); page 1 runs the
    // tile scorer under block_kv 256. The visible counts (1 + L + i, L + S)
    // land anywhere inside a block. The last case runs a 2-deep ring (every phase flips).
    const int pages[] = {4, 128, 256, 1, 64};
    const int heads[] = {32, 128, 64, 64, 64};
    const int stages[] = {0, 0, 0, 0, 2};
    for (int x = 0; x < 5; ++x) {
      ref::IndexerCase c;
      c.num_heads = heads[x];
      c.page_size = pages[x];
      c.new_tokens = {7, 130, 1, 45};
      c.cache_lens = {1000, 257, 3000, 0};
      c.seed = 91 + x;
      MlaIndexerParams p;
      p.top_k = 200;
      p.num_stages = stages[x];
      run_and_check("pages", c, p, false);
    }
  }

  TEST_CASE("persistent scorer's work items: more q blocks than SMs, one CTA walks items of several sequences") {
    // 360 tokens at H 128 (one token per q block) in 6 sequences: the persistent grid of one CTA per
    // SM deals 2-3 items to every CTA, consecutive items of different sequences; the small grid
    // (run_and_check) deals ~50 per CTA. Causal and not, ragged lengths; page 32 (the TMA producer,
    // one box per page) and page 128 (one box per quarter): each item's segments restart the table
    // row `lut`.
    for (int page : {32, 128})
      for (Mask m : {Mask::causal, Mask::none}) {
        ref::IndexerCase c;
        c.num_heads = 128;
        c.page_size = page;
        c.mask = m;
        c.new_tokens = {100, 3, 150, 1, 70, 36};
        c.cache_lens = {400, 900, 0, 1023, 60, 300};
        c.seed = 61 + (m == Mask::none ? 1 : 0) + (page == 128 ? 2 : 0);
        MlaIndexerParams p;
        p.top_k = 128;
        run_and_check(page == 128 ? "work items (TMA)" : "work items", c, p, false);
      }
  }

  TEST_CASE("persistent scorer's work items: few q blocks, many key splits, fewer tokens than SMs") {
    // 6 tokens at H 64 (3 q blocks) over 20000 keys: the persistent grid splits the keys into ~40
    // items of a few blocks (one per CTA); the small grid deals items of different splits and
    // q blocks to each CTA, the last split shorter.
    ref::IndexerCase c;
    c.num_heads = 64;
    c.new_tokens = {4, 2};
    c.cache_lens = {19996, 7000};
    c.seed = 71;
    MlaIndexerParams p;
    p.top_k = 512;
    run_and_check("few q blocks, many splits", c, p, false);
  }

  TEST_CASE("persistent scorer's TMA loads (pages >= 8): unmapped pages, pages past the table, layer 2 of 3, cache views mid-allocation") {
    // The TMA producer reads K quarters (pages >= 64) or pages (8..32: 64 / page boxes per quarter)
    // and their scales by TMA from descriptors over the whole cache view: unmapped quarters / pages
    // are boxes outside it (zero-filled; at pages 8..32 a quarter mixes mapped and unmapped boxes),
    // the layer moves every row, the blocks view starts 48 bytes into its buffer (16-byte aligned,
    // not 128). Scales 16 bytes in come by TMA; 4 bytes in (not 16-byte aligned) by cp.async, the
    // fallback. Each compares the persistent scorer (block_kv 256) with the tile scorer (block_kv
    // 64, cp.async) byte for byte and
    // with the CPU reference.
    const int pages[] = {64, 128, 256, 64, 8, 16, 32, 16, 8};
    const int heads[] = {64, 128, 32, 64, 64, 128, 32, 64, 32};
    const size_t scale_offsets[] = {16, 4, 16, 4, 16, 4, 16, 16, 4};
    const Mask masks[] = {Mask::causal, Mask::causal, Mask::none, Mask::none, Mask::causal,
                          Mask::causal, Mask::none, Mask::none, Mask::causal};
    const int num_stages[] = {0, 0, 0, 2, 0, 0, 0, 2, 0};
    for (int x = 0; x < 9; ++x) {
      ref::IndexerCase c;
      c.num_heads = heads[x];
      c.page_size = pages[x];
      c.mask = masks[x];
      c.new_tokens = {7, 130, 1, 45};
      c.cache_lens = {1000, 257, 3000, 0};
      c.num_layers = 3;
      c.layer = 2;
      c.seed = 131 + x;
      const ref::IndexerInputs in = with_unmapped_pages(ref::make_indexer_inputs(c), 3, 2);
      MlaIndexerParams p = with_case({}, c);
      p.top_k = 200;
      p.num_stages = num_stages[x];
      CacheBase base;
      base.blocks = 48;
      base.scales = scale_offsets[x];
      run_and_check_inputs(scale_offsets[x] % 16 == 0 ? "tma scales" : "cp.async scales", in, p, false, 0,
                           false, base);
    }
  }

  TEST_CASE("portable (sm_80/sm_89) scores path on the same prefill batch") {
    ref::IndexerCase c;
    c.num_heads = 64;
    c.new_tokens = {64, 200, 32};
    c.cache_lens = {300, 500, 100};
    c.seed = 77;
    c.nan_every = 101;
    MlaIndexerParams p;
    p.top_k = 256;
    run_and_check("prefill portable path", c, p, false, 0, true);
  }

  TEST_CASE("heavy exact ties: zero q and repeated keys, including a tie bin larger than the candidate buffer") {
    for (int H : {64, 128}) {
      ref::IndexerCase c;
      c.num_heads = H;
      c.new_tokens = {40, 24};
      c.cache_lens = {5000, 300};
      c.ties = true;
      c.seed = 31 + H;
      MlaIndexerParams p;
      p.top_k = 512;
      run_and_check("ties", c, p, true);
    }
  }

  TEST_CASE("decode steps: few long rows, each row's top-k by a cluster of CTAs (same output as one CTA per row)") {
    // next_n 2-4 (MTP: each new token sees the cache and the step's earlier tokens, causal) over
    // ragged contexts (1 to 40000 keys): rows of at most twice the candidate capacity take rank 0
    // alone inside their cluster, the long ones split their pass; heavy ties (a tie bin larger than
    // the candidate buffer: rank 0's radix fallback after a clustered pass) and NaN scores. The
    // plan must give these rows clusters on sm_90 and newer, so that the clustered path is what
    // runs; its output must equal the one-CTA-per-row launch's byte for byte.
    struct Shape {
      bool ties;
      int nan_every;
      int next_n;
    };
    for (const Shape sh : {Shape{false, 0, 2}, Shape{false, 41, 2}, Shape{true, 0, 2}, Shape{false, 0, 4},
                           Shape{false, 29, 3}}) {
      ref::IndexerCase c;
      c.num_heads = 64;
      const int n = sh.next_n;
      c.new_tokens = {n, n, n, n, n};
      c.cache_lens = {24000 - n, 9000 - n, 3000 - n, 40000 - n, 0};
      c.new_tokens.back() = 1;  // a sequence of one key
      c.ties = sh.ties;
      c.nan_every = sh.nan_every;
      c.num_layers = 1;
      c.layer = 0;
      c.seed = 53 + (sh.ties ? 1 : 0) + sh.nan_every + 100 * sh.next_n;
      const ref::IndexerInputs in = ref::make_indexer_inputs(c);
      MlaIndexerParams p = with_case({}, c);
      p.top_k = 2048;
      const std::string arch = Runtime::global().arch();
      const bool clusters = indexer::arch_has_clusters(arch);
      const int ranks = indexer::topk_ranks(indexer::layout(p), in.num_tokens(), in.max_keys,
                                            std::max(1, Runtime::global().sm_count()), clusters);
      INFO("arch " << arch << ": " << ranks << " CTAs per top-k row");
      if (clusters) REQUIRE(ranks > 1);
      const std::string name = std::string(sh.ties ? "decode ties" : sh.nan_every ? "decode NaN keys" : "decode") +
                               ", next_n " + std::to_string(n);
      p.emit = IndexEmit::logical;
      const GpuRun clustered = run_and_check_one(name.c_str(), in, p, sh.ties, 0, false, {});
      check_identical(clustered, run_gpu(in, p, 0, ops::detail::kIndexerTopkOneCta),
                      name + ": clustered top-k vs one CTA per row");
    }
  }

  TEST_CASE("the engines' K pages (k_layout fp8_page_scales): the same scores and selections as the split layout") {
    // Pages of 32 (TMA box per page), 64 (one box per page) and 128 keys (two quarters per page),
    // the tile scorer and the portable path, 2 layers (layer 1), shuffled and unmapped pages
    // (zero-filled boxes outside the tensor), a decode step and a prefill batch: outputs and every
    // score bit-identical to the split layout's run on the same keys, which the reference checks.
    struct Cfg {
      int page, heads, block_kv;
      bool portable, decode;
      Mask mask;
    };
    const Cfg cfgs[] = {{64, 64, 0, false, true, Mask::causal},   {64, 128, 0, false, false, Mask::causal},
                        {32, 64, 0, false, false, Mask::none},    {128, 32, 0, false, true, Mask::causal},
                        {64, 64, 64, false, false, Mask::causal}, {32, 64, 0, true, false, Mask::causal}};
    for (const Cfg& cf : cfgs) {
      ref::IndexerCase c;
      c.num_heads = cf.heads;
      c.page_size = cf.page;
      c.mask = cf.mask;
      if (cf.decode) {
        c.new_tokens = {1, 2, 1, 2};
        c.cache_lens = {3000, 9000, 0, 700};
      } else {
        c.new_tokens = {40, 100};
        c.cache_lens = {1500, 300};
      }
      c.seed = 71 + cf.page + cf.heads + cf.block_kv;
      const ref::IndexerInputs in = with_unmapped_pages(ref::make_indexer_inputs(c), 5, 1);
      MlaIndexerParams p = with_case({}, c);
      p.top_k = 512;
      p.block_kv = cf.block_kv;
      const unsigned launch = cf.portable ? ops::detail::kIndexerForcePortable : 0u;
      const std::string tag = "page " + std::to_string(cf.page) + " H" + std::to_string(cf.heads) + " block_kv " +
                              std::to_string(cf.block_kv) + (cf.portable ? " portable" : "") +
                              (cf.decode ? " decode" : " prefill");
      for (IndexEmit emit : {IndexEmit::logical, IndexEmit::physical}) {
        p.emit = emit;
        p.k_layout = CacheLayout::split;
        const GpuRun split = run_gpu(in, p, 0, launch);
        if (emit == IndexEmit::logical) {
          const bool fp8_mma = !cf.portable && Runtime::global().arch() == "sm_90a";
          const Report rep = compare(in, p, split, false, fp8_mma);
          INFO(tag << " (split layout vs the reference): " << rep.first);
          CHECK(rep.failures == 0);
        }
        p.k_layout = CacheLayout::fp8_page_scales;
        const GpuRun pages = run_gpu(in, p, 0, launch);
        check_identical(split, pages, tag + (emit == IndexEmit::logical ? "" : " physical") + ": fp8_page_scales vs split");
        const bool same = split.out == pages.out && split.scores.size() == pages.scores.size() &&
                          std::memcmp(split.scores.data(), pages.scores.data(), split.scores.size() * 4) == 0;
        std::printf("  mla_indexer fp8_page_scales %s%s: %s\n", tag.c_str(),
                    emit == IndexEmit::logical ? "" : " physical", same ? "bit-identical to the split layout" : "DIFFERENT");
      }
    }
  }

  TEST_CASE("a row of 131072 keys, top-2048") {
    ref::IndexerCase c;
    c.num_heads = 64;
    c.new_tokens = {2};
    c.cache_lens = {131070};
    c.seed = 41;
    MlaIndexerParams p;
    p.top_k = 2048;
    run_and_check("131072 keys", c, p, false);
  }
}

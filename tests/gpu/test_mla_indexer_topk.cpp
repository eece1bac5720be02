// The indexer's top-k stage alone (templates common/topk_sample.cuh + its radix fallback
// common/topk_radix.cuh) on crafted score rows written straight into the workspace: row lengths
// 0, 1, k-1, k, k+1, around the candidate capacity, 30000 and 131072; random, all-equal,
// NaN-laden, few distinct values (huge exact ties at the threshold), signed zeros and infinities,
// a row whose top keys hide between the sampled runs (the sample misleads: the fallback runs) and
// one whose sampled runs hold the largest keys; for the fused bucket select a
// tie of ~0.2k keys just below the k-th largest (a full bucket that must NOT stop the fused path),
// a tie straddling the k-th largest (a full bucket in the top k: the fused path hands over to the
// k-th largest select) and indexer-like sums of weighted ReLUs; and many rows at once (several
// waves per launch, two chunks). Every row must equal the CPU top-k of the same f32 row EXACTLY
// (positions and order), -1 past min(k, visible).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mlajit/driver.hpp"
#include "mlajit/ops.hpp"
#include "ops/mla_indexer/stages.hpp"
#include "reference/mla_indexer_ref.hpp"

using namespace mlajit;
using driver::DeviceBuffer;

namespace {

enum class Pattern { normal, equal, nan, few, zeros_infs, hidden, sampled_high, tie_below_k, tie_at_k, indexer };

const char* name(Pattern p) {
  switch (p) {
    case Pattern::normal: return "normal";
    case Pattern::equal: return "all-equal";
    case Pattern::nan: return "25% NaN";
    case Pattern::few: return "8 distinct values";
    case Pattern::zeros_infs: return "+-0, +-inf";
    case Pattern::hidden: return "top keys between samples";
    case Pattern::sampled_high: return "sampled runs highest";
    case Pattern::tie_below_k: return "tie at ranks 1.1k-1.3k";
    case Pattern::tie_at_k: return "tie at ranks k-10..k+100";
    case Pattern::indexer: return "indexer-like";
  }
  return "?";
}

// Start of sampled run b of a row of n keys, as in SampleTopK::run (128 runs of 16).
int64_t sample_run_start(int64_t b, int64_t n) { return b * (n - 16) / 127; }

// Sets the keys of descending ranks [lo, hi) (ties by position) to the key of rank lo.
void tie_ranks(std::vector<float>& r, int64_t lo, int64_t hi) {
  const int64_t n = static_cast<int64_t>(r.size());
  hi = std::min(hi, n);
  if (lo >= hi) return;
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) order[j] = j;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return r[a] > r[b]; });
  const float v = r[order[lo]];
  for (int64_t j = lo; j < hi; ++j) r[order[j]] = v;
}

std::vector<float> make_row(int64_t n, Pattern p, std::mt19937_64& rng, int k) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> r(static_cast<size_t>(n));
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    float v = normal(rng);
    switch (p) {
      case Pattern::normal: break;
      case Pattern::equal: v = 1.5f; break;
      case Pattern::nan: if (rng() % 4 == 0) v = nan; break;
      case Pattern::few: v = static_cast<float>(rng() % 8) - 2.0f; break;
      case Pattern::zeros_infs: {
        const uint64_t c = rng() % 8;
        v = c == 0 ? 0.0f : c == 1 ? -0.0f : c == 2 ? inf : c == 3 ? -inf : v;
        break;
      }
      case Pattern::hidden: v = -10.0f + 0.01f * v; break;
      case Pattern::sampled_high: break;
      case Pattern::tie_below_k: break;
      case Pattern::tie_at_k: break;
      case Pattern::indexer: {
        // sum over 8 heads of w_h relu(x_h), fixed signed weights: many small, a few large.
        static const float w[8] = {0.9f, -0.4f, 0.7f, 0.3f, -0.8f, 0.5f, 0.2f, -0.1f};
        v = 0.0f;
        for (int h = 0; h < 8; ++h) v += w[h] * std::max(normal(rng), 0.0f);
        break;
      }
    }
    r[static_cast<size_t>(j)] = v;
  }
  if (p == Pattern::hidden && n > 32) {
    // Large keys everywhere except in the sampled runs: the sample sees only small keys.
    std::vector<char> sampled(static_cast<size_t>(n), 0);
    for (int64_t b = 0; b < 128; ++b)
      for (int64_t o = 0; o < 16 && sample_run_start(b, n) + o < n; ++o) sampled[sample_run_start(b, n) + o] = 1;
    for (int64_t j = 0; j < n; ++j)
      if (!sampled[j] && rng() % 3 == 0) r[j] = 10.0f + normal(rng);
  }
  if (p == Pattern::tie_below_k) tie_ranks(r, k + k / 10, k + 3 * k / 10);
  if (p == Pattern::tie_at_k) tie_ranks(r, std::max(k - 10, 0), k + 100);
  if (p == Pattern::sampled_high && n > 32)
    for (int64_t b = 0; b < 128; ++b)
      for (int64_t o = 0; o < 16 && sample_run_start(b, n) + o < n; ++o)
        r[sample_run_start(b, n) + o] = 100.0f + normal(rng);
  return r;
}

template <typename T>
DeviceBuffer upload(const std::vector<T>& v) {
  DeviceBuffer b(std::max<size_t>(v.size() * sizeof(T), 16));
  if (!v.empty()) b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

// Runs only the top-k stage over `rows` (row b has rows[b].size() visible keys: one new token
// after size - 1 cached, mask none) and returns the output [B, k]. max_keys bounds the rows.
// `extra`: more IndexerStage flags (kIndexerTopkOneCta: one CTA per row where the plan would give
// the rows clusters).
std::vector<int32_t> run_topk(const std::vector<std::vector<float>>& rows, int k, int64_t max_keys, unsigned extra = 0) {
  const int B = static_cast<int>(rows.size());
  const int H = 64;
  MlaIndexerParams p;
  p.num_heads = H;
  p.top_k = k;
  p.page_size = 64;
  p.mask = Mask::none;
  p.emit = IndexEmit::logical;
  const int64_t stride = (std::max<int64_t>(max_keys, 1) + 3) / 4 * 4;
  std::vector<float> ws(static_cast<size_t>(B * stride), std::numeric_limits<float>::quiet_NaN());
  std::vector<uint32_t> off(static_cast<size_t>(B + 1)), cl(static_cast<size_t>(B)), lut(static_cast<size_t>(B), 0u);
  for (int b = 0; b < B; ++b) {
    off[b + 1] = static_cast<uint32_t>(b + 1);
    cl[b] = static_cast<uint32_t>(std::max<size_t>(rows[b].size(), 1) - 1);
    std::copy(rows[b].begin(), rows[b].end(), ws.begin() + b * stride);
  }
  std::vector<uint8_t> q(static_cast<size_t>(B * H * 128), 0x38), kb(64 * 128, 0x38);
  std::vector<float> qs(static_cast<size_t>(B * H), 1.0f), ks(64, 1.0f);
  DeviceBuffer dq = upload(q), dqs = upload(qs), doff = upload(off), dcl = upload(cl), dlut = upload(lut),
               dkb = upload(kb), dks = upload(ks), dws = upload(ws);
  DeviceBuffer out(static_cast<size_t>(B) * k * 4 + 16);
  out.fill_bytes(0x7F);
  ops::PagedCacheView kc;
  kc.blocks = TensorView(dkb.get(), DType::fp8_e4m3, {1, 1, 1, 64, 1, 128});
  kc.scales = TensorView(dks.get(), DType::f32, {1, 1, 1, 64, 1, 1});
  kc.lookup_table = TensorView(dlut.get(), DType::u32, {B, 1});
  kc.cache_lengths = TensorView(dcl.get(), DType::u32, {B});
  const TensorView vq(dq.get(), DType::fp8_e4m3, {B, H, 128}), vqs(dqs.get(), DType::f32, {B, H}),
      voff(doff.get(), DType::u32, {B + 1}), vout(out.get(), DType::i32, {B, k}),
      vws(dws.get(), DType::f32, {static_cast<int64_t>(ws.size())});
  ops::detail::mla_indexer_run(p, vq, vqs, voff, kc, 0, max_keys, vout, vws, nullptr, ops::detail::kIndexerTopk | extra);
  driver::synchronize();
  std::vector<int32_t> got(static_cast<size_t>(B) * k);
  out.download(got.data(), got.size() * 4);
  return got;
}

void check_sizes(int k, const std::vector<int64_t>& sizes, const std::vector<Pattern>& patterns, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<float>> rows;
  std::vector<std::string> what;
  int64_t max_keys = 1;
  for (int64_t n : sizes)
    for (Pattern p : patterns) {
      rows.push_back(make_row(n, p, rng, k));
      what.push_back(std::to_string(n) + " keys, " + name(p));
      max_keys = std::max(max_keys, n);
    }
  // The plan's launch (on sm_90 and newer, few long rows: a cluster of CTAs per row) and one CTA
  // per row: both must equal the reference exactly.
  for (const unsigned extra : {0u, static_cast<unsigned>(ops::detail::kIndexerTopkOneCta)}) {
    const std::vector<int32_t> got = run_topk(rows, k, max_keys, extra);
    int bad_rows = 0;
    for (size_t b = 0; b < rows.size(); ++b) {
      const std::vector<int32_t> want = ref::topk_ref_f32(rows[b], k);
      for (int x = 0; x < k; ++x)
        if (got[b * k + x] != want[x]) {
          ++bad_rows;
          INFO("k " << k << ", row " << what[b] << (extra ? " (one CTA per row)" : " (the plan's launch)") << ": slot "
                    << x << " expected " << want[x] << ", got " << got[b * k + x]);
          CHECK(got[b * k + x] == want[x]);
          break;
        }
    }
    std::printf("  top-k stage k %-4d %zu rows (%zu lengths x %zu patterns)%s: %d rows differ\n", k, rows.size(),
                sizes.size(), patterns.size(), extra ? ", one CTA per row" : "", bad_rows);
  }
}

const std::vector<Pattern> kAll = {Pattern::normal,       Pattern::equal,       Pattern::nan,
                                   Pattern::few,          Pattern::zeros_infs,  Pattern::hidden,
                                   Pattern::sampled_high, Pattern::tie_below_k, Pattern::tie_at_k,
                                   Pattern::indexer};

}  // namespace

TEST_SUITE("gpu mla_indexer") {
  TEST_CASE("top-k stage on crafted rows, k 2048: lengths 1, k-1, k, k+1, capacity edges, 30000, 131072") {
    check_sizes(2048, {1, 2047, 2048, 2049, 5000, 8192, 8193, 30000, 131072}, kAll, 7);
  }

  TEST_CASE("top-k stage on crafted rows, k 4096 and k 64") {
    check_sizes(4096, {4095, 4096, 4097, 8193, 40000}, kAll, 8);
    check_sizes(64, {1, 63, 64, 65, 2048, 2049, 20000}, kAll, 9);
  }

  TEST_CASE("top-k stage on a decode step's few long rows, k 2048: 8 CTAs per row on sm_90 and newer") {
    // 10 rows of 131072 keys (every pattern): 8 CTAs per row, slices of 16K keys; then 20 rows of
    // 9000 keys: 4 per row (slices of >= 2048 keys). Rows whose sample misleads retry their
    // threshold or fall back on rank 0.
    check_sizes(2048, {131072}, kAll, 12);
    check_sizes(2048, {9000, 9000}, kAll, 13);
  }

  TEST_CASE("top-k stage on 1299 rows of 24000 keys, k 2048: several waves in one launch") {
    // 1299 x 24000 floats = 125 MB of workspace, under the 128 MiB chunk cap (1392 rows of 24000
    // keys): one top-k launch of 1299 CTAs, 3.3 waves at 3 CTAs per SM on 132 SMs. (A top-k-only run
    // cannot span two chunks: each chunk reads its rows from the start of the workspace, which the
    // scores stage of a full run refills per chunk.)
    std::vector<int64_t> sizes(433, 24000);
    check_sizes(2048, sizes, {Pattern::normal, Pattern::indexer, Pattern::tie_below_k}, 10);
  }

  TEST_CASE("top-k stage on rows of 0 keys (max_keys 0): every slot -1") {
    const std::vector<int32_t> got = run_topk({{}, {}, {}}, 2048, 0);
    int bad = 0;
    for (int32_t v : got) bad += v != -1;
    CHECK(bad == 0);
  }
}

// CPU f64 reference of mla_indexer; see reference/mla_indexer_ref.hpp.
#include "reference/mla_indexer_ref.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace mlajit::ref {

double e4m3_to_double(uint8_t b) {
  const int mag = b & 0x7F;
  if (mag == 0x7F) return std::nan("");
  const int e = mag >> 3, m = mag & 7;
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (b & 0x80) ? -v : v;
}

RefToken ref_token(const IndexerInputs& in, int64_t t) {
  RefToken r;
  const int B = in.batch();
  if (B <= 0 || t < in.row_offsets[0] || t >= in.row_offsets[B]) return r;
  for (int b = B - 1; b >= 0; --b)
    if (in.row_offsets[b] <= t) {
      r.seq = b;
      break;
    }
  const int64_t L = in.cache_lengths[r.seq];
  const int64_t S = int64_t{in.row_offsets[r.seq + 1]} - in.row_offsets[r.seq];
  const int64_t i = t - in.row_offsets[r.seq];
  const int64_t vis = in.mask == Mask::causal ? L + i + 1 : L + S;
  r.visible = std::min(vis, in.max_keys);
  return r;
}

int64_t ref_key_row(const IndexerInputs& in, int b, int64_t j) {
  const int64_t page = j / in.page_size;
  if (page >= in.pages_per_seq) return -1;
  const int64_t blk = in.lookup_table[b * in.pages_per_seq + page];
  if (blk >= in.num_blocks) return -1;
  return blk * int64_t{in.num_layers} * in.page_size + int64_t{in.layer} * in.page_size + j % in.page_size;
}

std::vector<double> indexer_scores_ref(const IndexerInputs& in, int64_t t) {
  const RefToken tok = ref_token(in, t);
  std::vector<double> s(static_cast<size_t>(tok.visible), 0.0);
  const int H = in.num_heads;
  std::vector<double> qd(static_cast<size_t>(H) * 128);
  for (int x = 0; x < H * 128; ++x) qd[x] = e4m3_to_double(in.q[t * H * 128 + x]);
  for (int64_t j = 0; j < tok.visible; ++j) {
    const int64_t row = ref_key_row(in, tok.seq, j);
    if (row < 0) continue;
    double kd[128];
    for (int d = 0; d < 128; ++d) kd[d] = e4m3_to_double(in.k_blocks[row * 128 + d]);
    double sum = 0.0;
    for (int h = 0; h < H; ++h) {
      double dot = 0.0;
      for (int d = 0; d < 128; ++d) dot += qd[h * 128 + d] * kd[d];
      sum += std::max(0.0, dot) * in.qs[t * H + h];
    }
    s[j] = sum * in.k_scales[row * in.scale_row_stride];
  }
  return s;
}

std::vector<double> indexer_score_magnitudes_ref(const IndexerInputs& in, int64_t t) {
  const RefToken tok = ref_token(in, t);
  std::vector<double> m(static_cast<size_t>(tok.visible), 0.0);
  const int H = in.num_heads;
  std::vector<double> qd(static_cast<size_t>(H) * 128);
  for (int x = 0; x < H * 128; ++x) qd[x] = std::fabs(e4m3_to_double(in.q[t * H * 128 + x]));
  for (int64_t j = 0; j < tok.visible; ++j) {
    const int64_t row = ref_key_row(in, tok.seq, j);
    if (row < 0) continue;
    double kd[128];
    for (int d = 0; d < 128; ++d) kd[d] = std::fabs(e4m3_to_double(in.k_blocks[row * 128 + d]));
    double sum = 0.0;
    for (int h = 0; h < H; ++h) {
      double dot = 0.0;
      for (int d = 0; d < 128; ++d) dot += qd[h * 128 + d] * kd[d];
      sum += dot * std::fabs(in.qs[t * H + h]);
    }
    m[j] = sum * std::fabs(in.k_scales[row * in.scale_row_stride]);
  }
  return m;
}

std::vector<int32_t> topk_ref(const std::vector<double>& scores, int k) {
  std::vector<int32_t> idx(scores.size());
  std::iota(idx.begin(), idx.end(), 0);
  // Strict weak order: numbers descending, NaN last, ties by position.
  auto before = [&](int32_t a, int32_t b) {
    const double x = scores[a], y = scores[b];
    const bool xn = std::isnan(x), yn = std::isnan(y);
    if (xn != yn) return yn;
    if (!xn && x != y) return x > y;
    return a < b;
  };
  const size_t kk = std::min<size_t>(static_cast<size_t>(k), scores.size());
  std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(), before);
  std::vector<int32_t> out(static_cast<size_t>(k), -1);
  std::copy(idx.begin(), idx.begin() + kk, out.begin());
  return out;
}

std::vector<int32_t> topk_ref_f32(const std::vector<float>& scores, int k) {
  return topk_ref(std::vector<double>(scores.begin(), scores.end()), k);
}

int32_t encode_ref(const IndexerInputs& in, int b, int32_t pos) {
  if (pos < 0 || b < 0) return -1;
  const int64_t page = pos / in.page_size;
  if (page >= in.pages_per_seq) return -1;
  const int64_t blk = in.lookup_table[b * in.pages_per_seq + page];
  if (blk >= in.num_blocks) return -1;
  return static_cast<int32_t>(blk * in.page_size + pos % in.page_size);
}

uint8_t e4m3_from_double(double x) {
  // Finite codes 0x00..0x7E are increasing in magnitude: binary search the nearest.
  static const std::vector<double> mags = [] {
    std::vector<double> m(127);
    for (int c = 0; c < 127; ++c) m[c] = e4m3_to_double(static_cast<uint8_t>(c));
    return m;
  }();
  const double a = std::min(std::fabs(x), 448.0);
  auto it = std::lower_bound(mags.begin(), mags.end(), a);
  int c = static_cast<int>(it - mags.begin());
  if (c > 0 && (c == 127 || a - mags[c - 1] < mags[c] - a || (a - mags[c - 1] == mags[c] - a && (c - 1) % 2 == 0))) --c;
  if (c > 126) c = 126;
  return static_cast<uint8_t>((x < 0 && c != 0 ? 0x80 : 0) | c);
}

IndexerInputs make_indexer_inputs(const IndexerCase& c) {
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uni(0.5, 1.5);
  IndexerInputs in;
  in.num_heads = c.num_heads;
  in.page_size = c.page_size;
  in.mask = c.mask;
  in.num_layers = c.num_layers;
  in.layer = c.layer;
  in.scale_row_stride = 1;
  const int B = static_cast<int>(c.new_tokens.size());
  in.row_offsets.assign(1, 0);
  int64_t total_pages = 0, max_pages = 1;
  for (int b = 0; b < B; ++b) {
    in.row_offsets.push_back(in.row_offsets.back() + c.new_tokens[b]);
    in.cache_lengths.push_back(static_cast<uint32_t>(c.cache_lens[b]));
    const int64_t keys = int64_t{c.cache_lens[b]} + c.new_tokens[b];
    in.max_keys = std::max(in.max_keys, keys);
    const int64_t pages = (keys + c.page_size - 1) / c.page_size;
    total_pages += pages;
    max_pages = std::max(max_pages, pages);
  }
  in.pages_per_seq = max_pages + 1;  // one spare slot per sequence: never visible
  in.num_blocks = total_pages + c.spare_blocks;
  std::vector<uint32_t> perm(static_cast<size_t>(in.num_blocks));
  std::iota(perm.begin(), perm.end(), 0u);
  std::shuffle(perm.begin(), perm.end(), rng);
  in.lookup_table.assign(static_cast<size_t>(B * in.pages_per_seq), static_cast<uint32_t>(in.num_blocks + 7));
  size_t next = 0;
  for (int b = 0; b < B; ++b) {
    const int64_t keys = int64_t{c.cache_lens[b]} + c.new_tokens[b];
    for (int64_t pg = 0; pg < (keys + c.page_size - 1) / c.page_size; ++pg)
      in.lookup_table[b * in.pages_per_seq + pg] = perm[next++];
  }
  const int64_t T = in.row_offsets.back();
  const int H = c.num_heads;
  in.q.resize(static_cast<size_t>(T * H * 128));
  for (auto& v : in.q) v = e4m3_from_double(normal(rng) * 2.0);
  if (c.ties)
    for (int64_t t = 0; t < T; t += 3) std::fill(in.q.begin() + t * H * 128, in.q.begin() + (t + 1) * H * 128, 0);
  in.qs.resize(static_cast<size_t>(T * H));
  for (auto& v : in.qs) v = static_cast<float>(normal(rng) / std::sqrt(static_cast<double>(H)));
  const int64_t rows = in.num_blocks * c.num_layers * c.page_size;
  in.k_blocks.resize(static_cast<size_t>(rows * 128));
  in.k_scales.resize(static_cast<size_t>(rows));
  std::vector<std::vector<uint8_t>> pal_k(static_cast<size_t>(c.palette), std::vector<uint8_t>(128));
  std::vector<float> pal_s(static_cast<size_t>(c.palette));
  for (int i = 0; i < c.palette; ++i) {
    for (auto& v : pal_k[i]) v = e4m3_from_double(normal(rng) * 2.0);
    pal_s[i] = static_cast<float>(uni(rng));
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (c.ties) {
      const size_t pick = static_cast<size_t>(rng() % static_cast<uint64_t>(c.palette));
      std::copy(pal_k[pick].begin(), pal_k[pick].end(), in.k_blocks.begin() + r * 128);
      in.k_scales[r] = pal_s[pick];
    } else {
      for (int d = 0; d < 128; ++d) in.k_blocks[r * 128 + d] = e4m3_from_double(normal(rng) * 2.0);
      in.k_scales[r] = static_cast<float>(uni(rng) * 0.01);
    }
  }
  if (c.nan_every > 0)
    for (int b = 0; b < B; ++b)
      for (int64_t j = 0; j < int64_t{c.cache_lens[b]} + c.new_tokens[b]; j += c.nan_every) {
        const int64_t row = ref_key_row(in, b, j);
        if (row >= 0) in.k_scales[row] = std::nanf("");
      }
  return in;
}

}  // namespace mlajit::ref

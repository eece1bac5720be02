// Paged KV cache on the GPU against the CPU reference (tests/reference/kv_cache_ref): store into a
// poisoned cache for every layer and kv index, compare the WHOLE cache byte for byte (fp8 bytes
// and scales exactly, unwritten bytes still poison), count dropped tokens, then gather valid and
// invalid rows into poisoned outputs and compare exactly. Ragged batch with empty sequences and
// nonzero cache lengths, shuffled pages, a page table too short for the longest sequence and an
// entry pointing past num_blocks (SPEC §4).
#include <doctest/doctest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "mlajit/driver.hpp"
#include "mlajit/ops.hpp"
#include "reference/kv_cache_ref.hpp"
#include "reference/test_data.hpp"

using namespace mlajit;
namespace td = mlajit::testdata;

namespace {

template <typename T>
driver::DeviceBuffer to_device(const std::vector<T>& v) {
  driver::DeviceBuffer b(std::max<size_t>(v.size() * sizeof(T), 16));
  if (!v.empty()) b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

template <typename T>
std::vector<T> to_host(const driver::DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  if (n) b.download(v.data(), n * sizeof(T));
  return v;
}

uint32_t read_counter(const driver::DeviceBuffer& b) { return to_host<uint32_t>(b, 1)[0]; }

// Element e of a y buffer is NaN.
bool is_nan_elem(DType t, const uint8_t* p) { return std::isnan(td::decode(t, p)); }

struct StoreGatherCase {
  std::string name;
  PagedKVCacheParams cache;
  DType input_dtype;
  DType output_dtype;
  int threads = 128;
  // Some tiles of some tokens made special (fp8_ds_mla): all zero, tiny (the 1e-4 clamp), or with
  // an amax of exactly 448 * 2^-3 (a power-of-two scale).
  bool special_tiles = false;
};

// The special tiles of StoreGatherCase, on the f32 values of x[T, 576].
void make_special_tiles(std::vector<float>& x, int64_t T) {
  for (int64_t t = 0; t < T; ++t) {
    float* row = x.data() + t * 576;
    const int tile = static_cast<int>((t / 5) % 4);
    float* v = row + tile * 128;
    switch (t % 5) {
      case 0: std::fill(v, v + 128, 0.0f); break;
      case 1: for (int d = 0; d < 128; ++d) v[d] *= 1e-3f; break;
      case 2: v[t % 128] = (t % 2) ? 56.0f : -56.0f; break;
      default: break;
    }
  }
}

// The SPEC §4 batch: ragged, an empty sequence, nonzero cache lengths.
td::RaggedBatch test_batch() { return td::make_ragged_batch({5, 0, 77, 130}, {3, 64, 0, 200}); }

void run_store_gather(const StoreGatherCase& tc, uint64_t seed) {
  INFO("case: ", tc.name);
  const PagedKVCacheParams& c = tc.cache;
  td::Rng rng(seed);
  const td::RaggedBatch batch = test_batch();
  const int64_t T = batch.total_tokens();
  // Pages for positions < 320 only: sequence 3's last 10 tokens fall past the table.
  const int pages_per_seq = 320 / c.page_size;
  td::PageTable table = td::make_page_table(batch, c.page_size, rng, pages_per_seq);
  // Sequence 2's second page points past the cache: its tokens 64.. are dropped too.
  const uint32_t bad_block = static_cast<uint32_t>(table.num_blocks + 5);
  table.lut[static_cast<size_t>(2) * pages_per_seq + 1] = bad_block;

  ref::HostPagedCache host(c, table.num_blocks);
  td::poison(host.blocks);
  std::memset(host.scales.data(), td::kPoisonByte, host.scales.size() * sizeof(float));
  // fp8_page_scales: the pages hold the rows' bytes and their scales (host.page_scales_bytes()).
  const size_t device_block_bytes = c.page_scales() ? host.page_scales_bytes().size() : host.blocks.size();
  driver::DeviceBuffer d_blocks(device_block_bytes);
  d_blocks.fill_bytes(td::kPoisonByte);
  driver::DeviceBuffer d_scales(std::max<size_t>(host.scales.size() * sizeof(float), 16));
  d_scales.fill_bytes(td::kPoisonByte);
  auto d_lut = to_device(table.lut);
  auto d_cache_lengths = to_device(batch.cache_lengths);
  auto d_offsets = to_device(batch.row_offsets);
  driver::DeviceBuffer d_dropped(4);
  d_dropped.fill_bytes(0);

  ops::PagedCacheView view;
  // fp8_ds_mla: u8 records [num_blocks, 1, num_layers, page_size, 656], no scales.
  // fp8_page_scales: u8 pages [num_blocks, 1, num_layers, page_size, 132], no scales.
  view.blocks = c.ds_mla() || c.page_scales()
                    ? TensorView(d_blocks.get(), DType::u8,
                                 {table.num_blocks, 1, c.num_layers, c.page_size, static_cast<int64_t>(c.row_bytes())})
                    : TensorView(d_blocks.get(), c.dtype,
                                 {table.num_blocks, c.kv_dim(), c.num_layers, c.page_size, c.num_heads, c.head_size});
  if (c.split_scales())
    view.scales = TensorView(d_scales.get(), DType::f32,
                             {table.num_blocks, c.kv_dim(), c.num_layers, c.page_size, c.num_heads,
                              c.head_dim_granularity()});
  view.lookup_table = TensorView(d_lut.get(), DType::u32, {table.batch, table.pages_per_seq});
  view.cache_lengths = TensorView(d_cache_lengths.get(), DType::u32, {table.batch});

  // ---- store every (layer, kv) slice with its own random input -------------------------------
  KvCacheStoreParams sp{c, tc.input_dtype, tc.threads};
  int64_t want_dropped = 0;
  for (int layer = 0; layer < c.num_layers; ++layer) {
    for (int kv = 0; kv < c.kv_dim(); ++kv) {
      auto xf = td::random_normal(static_cast<size_t>(T) * c.num_heads * c.head_size, rng, 2.0f);
      if (tc.special_tiles) make_special_tiles(xf, T);
      const auto x = td::encode_all(tc.input_dtype, xf);
      want_dropped += ref::kv_cache_store(sp, x, T, batch.row_offsets, batch.cache_lengths, table.lut,
                                          pages_per_seq, layer, kv, host);
      auto d_x = to_device(x);
      ops::kv_cache_store(sp, TensorView(d_x.get(), tc.input_dtype, {T, c.num_heads, c.head_size}),
                          TensorView(d_offsets.get(), DType::u32, {table.batch + 1}), view, layer, kv,
                          TensorView(d_dropped.get(), DType::u32, {1}));
      driver::synchronize();
    }
  }
  // Per (layer, kv): sequence 3's positions 320..329 past the table, and sequence 2's tokens on
  // its bad page 1 (positions [page_size, 2 * page_size) of its 77).
  const int64_t dropped_per_slice = 10 + std::min(2 * c.page_size, 77) - c.page_size;
  CHECK(want_dropped == dropped_per_slice * c.num_layers * c.kv_dim());
  CHECK(read_counter(d_dropped) == want_dropped);

  const std::vector<uint8_t> want_blocks = c.page_scales() ? host.page_scales_bytes() : host.blocks;
  const auto got_blocks = to_host<uint8_t>(d_blocks, want_blocks.size());
  size_t block_mismatch = 0, first_bad = 0;
  for (size_t i = 0; i < got_blocks.size(); ++i)
    if (got_blocks[i] != want_blocks[i] && block_mismatch++ == 0) first_bad = i;
  CHECK_MESSAGE(block_mismatch == 0, block_mismatch, " cache bytes differ, first at byte ", first_bad, " (got ",
                int(got_blocks[first_bad]), ", want ", int(want_blocks[first_bad]), ")");
  if (c.split_scales()) {
    const auto got_scales = to_host<uint32_t>(d_scales, host.scales.size());
    size_t scale_mismatch = 0;
    for (size_t i = 0; i < got_scales.size(); ++i) {
      uint32_t want;
      std::memcpy(&want, &host.scales[i], 4);
      if (got_scales[i] != want && scale_mismatch++ == 0)
        FAIL_CHECK("scale ", i, ": got bits ", got_scales[i], ", want ", want);
    }
    CHECK(scale_mismatch == 0);
  }

  // ---- gather: every new token in shuffled order, plus rows that do not exist ------------------
  std::vector<int64_t> order(static_cast<size_t>(T));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  rng.shuffle(order);
  std::vector<uint32_t> ids, pos;
  for (int64_t t : order) {
    ids.push_back(static_cast<uint32_t>(batch.sequence_of(t)));
    pos.push_back(batch.position_of(t));
  }
  ids.push_back(4), pos.push_back(0);                                        // batch id past the batch
  ids.push_back(0), pos.push_back(static_cast<uint32_t>(pages_per_seq * c.page_size));  // page past the table
  ids.push_back(2), pos.push_back(static_cast<uint32_t>(c.page_size + 1));  // the bad block
  ids.push_back(0), pos.push_back(0xFFFFFFFFu);                              // absurd position
  const int64_t n = static_cast<int64_t>(ids.size());
  auto d_ids = to_device(ids);
  auto d_pos = to_device(pos);
  KvCacheGatherParams gp{c, tc.output_dtype, tc.threads};
  const size_t out_size = dtype_size(tc.output_dtype);
  const size_t row_elems = static_cast<size_t>(c.num_heads) * c.head_size;
  driver::DeviceBuffer d_y(static_cast<size_t>(n) * row_elems * out_size);
  for (int layer = 0; layer < c.num_layers; ++layer) {
    for (int kv = 0; kv < c.kv_dim(); ++kv) {
      std::vector<uint8_t> want;
      const int64_t want_missing = ref::kv_cache_gather(gp, host, table.lut, table.batch, pages_per_seq, ids, pos,
                                                        layer, kv, want);
      d_y.fill_bytes(td::kPoisonByte);
      d_dropped.fill_bytes(0);
      ops::kv_cache_gather(gp, view, TensorView(d_ids.get(), DType::u32, {n}),
                           TensorView(d_pos.get(), DType::u32, {n}), layer, kv,
                           TensorView(d_y.get(), tc.output_dtype, {n, c.num_heads, c.head_size}),
                           TensorView(d_dropped.get(), DType::u32, {1}));
      driver::synchronize();
      const auto got = to_host<uint8_t>(d_y, want.size());
      CHECK(want_missing == dropped_per_slice + 4);
      CHECK(read_counter(d_dropped) == want_missing);
      size_t mismatch = 0, unwritten = 0;
      for (int64_t r = 0; r < n; ++r) {
        const uint8_t* g = got.data() + static_cast<size_t>(r) * row_elems * out_size;
        const uint8_t* w = want.data() + static_cast<size_t>(r) * row_elems * out_size;
        const bool row_missing = is_nan_elem(tc.output_dtype, w);
        for (size_t e = 0; e < row_elems; ++e) {
          if (row_missing) {
            if (!is_nan_elem(tc.output_dtype, g + e * out_size)) ++mismatch;
          } else if (std::memcmp(g + e * out_size, w + e * out_size, out_size) != 0) {
            if (is_nan_elem(tc.output_dtype, g + e * out_size)) ++unwritten;
            else ++mismatch;
          }
        }
      }
      CHECK_MESSAGE(mismatch == 0, "layer ", layer, " kv ", kv, ": ", mismatch, " gathered elements differ");
      CHECK_MESSAGE(unwritten == 0, "layer ", layer, " kv ", kv, ": ", unwritten, " gathered elements left poisoned");
    }
  }
}

PagedKVCacheParams cache_params(DType dt, int heads, int head_size, int page_size, bool mla, int g, ScaleFmt fmt) {
  PagedKVCacheParams c;
  c.dtype = dt;
  c.num_heads = heads;
  c.head_size = head_size;
  c.page_size = page_size;
  c.is_mla = mla;
  c.num_layers = 3;
  c.quantization_granularity = g;
  c.scale_fmt = fmt;
  return c;
}

}  // namespace

TEST_SUITE("kv_cache gpu") {
  TEST_CASE("kv_cache store/gather fp8 MLA vs CPU reference (bytes and scales exact)") {
    using F = ScaleFmt;
    const DType e4 = DType::fp8_e4m3;
    const StoreGatherCase cases[] = {
        {"mla fp8 d576 g576 fp32", cache_params(e4, 1, 576, 64, true, 0, F::fp32), DType::bf16, DType::bf16},
        {"mla fp8 d576 g64 ue8m0", cache_params(e4, 1, 576, 64, true, 64, F::ue8m0), DType::bf16, DType::f32},
        {"mla fp8 d576 g128 (tail group) fp32, f32 in", cache_params(e4, 1, 576, 64, true, 128, F::fp32), DType::f32,
         DType::bf16},
        {"mla fp8 d576 g576 ue8m0, f16 in, 256 threads", cache_params(e4, 1, 576, 32, true, 576, F::ue8m0), DType::f16,
         DType::f32, 256},
        {"mla fp8 d4096 two-pass amax, f32 in", cache_params(e4, 1, 4096, 16, true, 0, F::fp32), DType::f32,
         DType::f32},
        {"mla fp8 d576 g64 fp32 (DeepSeek-V3.2 latent; store fast path)", cache_params(e4, 1, 576, 64, true, 64, F::fp32),
         DType::bf16, DType::bf16},
    };
    for (size_t i = 0; i < std::size(cases); ++i) run_store_gather(cases[i], 100 + i);
  }

  TEST_CASE("kv_cache store/gather fp8_ds_mla records vs CPU reference (bytes exact)") {
    // FlashMLA's V3.2 record layout: the whole cache compared byte for byte (e4m3, tile scales and
    // rope inside the 656-byte records; unwritten records still poison), gathers exact.
    auto ds = [](int page_size) {
      PagedKVCacheParams c = cache_params(DType::fp8_e4m3, 1, 576, page_size, true, 128, ScaleFmt::ue8m0);
      c.layout = CacheLayout::fp8_ds_mla;
      return c;
    };
    const StoreGatherCase cases[] = {
        {"fp8_ds_mla p64, bf16 in, bf16 out", ds(64), DType::bf16, DType::bf16, 128, true},
        {"fp8_ds_mla p16, f32 in, f32 out, 256 threads", ds(16), DType::f32, DType::f32, 256, true},
        {"fp8_ds_mla p32, f16 in, bf16 out, 64 threads", ds(32), DType::f16, DType::bf16, 64, true},
        {"fp8_ds_mla p64, bf16 in, f32 out, plain normal data", ds(64), DType::bf16, DType::f32, 128, false},
    };
    for (size_t i = 0; i < std::size(cases); ++i) run_store_gather(cases[i], 500 + i);
  }

  TEST_CASE("kv_cache store/gather fp8_page_scales pages (the engines' indexer K layout) vs CPU reference (bytes exact)") {
    // Pages built by hand from the published layout (ref::HostPagedCache::page_scales_bytes): each
    // page's tokens' 128 e4m3, then their f32 scales; 3 layers, shuffled pages, dropped tokens.
    auto ps = [](int page, ScaleFmt fmt) {
      PagedKVCacheParams c = cache_params(DType::fp8_e4m3, 1, 128, page, true, 128, fmt);
      c.layout = CacheLayout::fp8_page_scales;
      return c;
    };
    const StoreGatherCase cases[] = {
        {"fp8_page_scales p64 ue8m0, bf16 in, bf16 out", ps(64, ScaleFmt::ue8m0), DType::bf16, DType::bf16, 128},
        {"fp8_page_scales p64 fp32, f32 in, f32 out, 256 threads", ps(64, ScaleFmt::fp32), DType::f32, DType::f32, 256},
        {"fp8_page_scales p32 fp32, f16 in, bf16 out, 64 threads", ps(32, ScaleFmt::fp32), DType::f16, DType::bf16, 64},
        {"fp8_page_scales p32 ue8m0, bf16 in, f32 out", ps(32, ScaleFmt::ue8m0), DType::bf16, DType::f32, 128},
    };
    uint64_t seed = 900;
    for (const auto& tc : cases) run_store_gather(tc, seed++);
  }

  TEST_CASE("kv_cache store/gather fp8 MHA vs CPU reference (bytes and scales exact)") {
    using F = ScaleFmt;
    const DType e4 = DType::fp8_e4m3;
    const StoreGatherCase cases[] = {
        {"mha fp8 h8 d128 g128 fp32", cache_params(e4, 8, 128, 16, false, 0, F::fp32), DType::bf16, DType::bf16},
        {"mha fp8 h3 d128 g64 ue8m0, f16 in", cache_params(e4, 3, 128, 16, false, 64, F::ue8m0), DType::f16,
         DType::f32},
        {"mha fp8 h5 d100 g100 fp32 (4-wide chunks)", cache_params(e4, 5, 100, 64, false, 0, F::fp32), DType::bf16,
         DType::bf16, 64},
        {"mha fp8 h2 d64 g4 ue8m0, f32 in", cache_params(e4, 2, 64, 8, false, 4, F::ue8m0), DType::f32, DType::f32},
    };
    for (size_t i = 0; i < std::size(cases); ++i) run_store_gather(cases[i], 200 + i);
  }

  TEST_CASE("kv_cache store/gather plain casts (bf16, f16, f32 caches) vs CPU reference") {
    using F = ScaleFmt;
    const StoreGatherCase cases[] = {
        {"mla bf16 d576 copy", cache_params(DType::bf16, 1, 576, 64, true, 0, F::fp32), DType::bf16, DType::bf16},
        {"mla bf16 d576 from f32, gather f32", cache_params(DType::bf16, 1, 576, 64, true, 0, F::fp32), DType::f32,
         DType::f32},
        {"mha f16 h4 d64 from f32, gather bf16", cache_params(DType::f16, 4, 64, 16, false, 0, F::fp32), DType::f32,
         DType::bf16},
        {"mha f32 h2 d96 from bf16, gather bf16", cache_params(DType::f32, 2, 96, 16, false, 0, F::fp32), DType::bf16,
         DType::bf16},
        {"mha bf16 h3 d5 (scalar chunks) from f16", cache_params(DType::bf16, 3, 5, 16, false, 0, F::fp32),
         DType::f16, DType::f32, 64},
        {"mha bf16 h8 d576 (rows streamed in batches)", cache_params(DType::bf16, 8, 576, 16, false, 0, F::fp32),
         DType::bf16, DType::bf16},
    };
    for (size_t i = 0; i < std::size(cases); ++i) run_store_gather(cases[i], 300 + i);
  }

  TEST_CASE("kv_cache sparse_index_remap vs CPU reference") {
    td::Rng rng(400);
    const td::RaggedBatch batch = test_batch();
    for (int page_size : {16, 64}) {
      for (int64_t k : {64, 100}) {  // 16-byte vector path and scalar path
        INFO("page_size ", page_size, " k ", k);
        const int pages_per_seq = 320 / page_size;
        td::PageTable table = td::make_page_table(batch, page_size, rng, pages_per_seq);
        table.lut[static_cast<size_t>(2) * pages_per_seq + 1] = static_cast<uint32_t>(table.num_blocks + 5);
        // Rows past input_row_offsets[B] belong to no sequence: all -1.
        const int64_t T = batch.total_tokens() + 3;
        std::vector<int32_t> idx(static_cast<size_t>(T * k));
        for (auto& v : idx) v = static_cast<int32_t>(rng.uniform(-3, pages_per_seq * page_size + 20));
        idx[5] = INT32_MIN;
        const auto want = ref::sparse_index_remap(page_size, idx, T, k, batch.row_offsets, table.lut, pages_per_seq,
                                                  table.num_blocks);
        auto d_idx = to_device(idx);
        auto d_off = to_device(batch.row_offsets);
        auto d_lut = to_device(table.lut);
        driver::DeviceBuffer d_out(static_cast<size_t>(T * k) * 4);
        d_out.fill_bytes(td::kPoisonByte);
        SparseIndexRemapParams p;
        p.page_size = page_size;
        ops::sparse_index_remap(p, TensorView(d_idx.get(), DType::i32, {T, k}),
                                TensorView(d_off.get(), DType::u32, {table.batch + 1}),
                                TensorView(d_lut.get(), DType::u32, {table.batch, pages_per_seq}), table.num_blocks,
                                TensorView(d_out.get(), DType::i32, {T, k}));
        driver::synchronize();
        const auto got = to_host<int32_t>(d_out, want.size());
        size_t mismatch = 0;
        for (size_t i = 0; i < want.size(); ++i) mismatch += got[i] != want[i];
        CHECK(mismatch == 0);
        // The data exercises every branch.
        CHECK(std::count(want.begin(), want.end(), -1) > 0);
        CHECK(std::count_if(want.begin(), want.end(), [](int32_t v) { return v >= 0; }) > 0);
      }
    }
  }
}

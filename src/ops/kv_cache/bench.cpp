// `mlajit bench kv_cache_store|kv_cache_gather`: times the store / gather kernels on the GPU.
//
// Setup: `tokens` new tokens in sequences of 2048 (no cached prefix), each sequence's pages
// mapped through a shuffled lookup table onto a cache with exactly as many blocks as needed.
// Inputs are random normal values. Every buffer the op touches is replicated into enough sets
// that one repetition's data has been evicted from L2 by the time its set comes round again, so
// the timing is of HBM traffic, not of L2 hits. A device-to-device copy of the same bytes is
// timed interleaved with the op, in the same loop (the same-harness copy reference).
#include "ops/kv_cache/bench.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "mlajit/autotune.hpp"
#include "mlajit/driver.hpp"
#include "mlajit/error.hpp"
#include "mlajit/ops.hpp"

namespace mlajit::bench {

namespace {

constexpr int64_t kSeqLen = 2048;

uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);  // RNE (finite inputs)
}

uint16_t f16_bits(float f) {
  // Normal-range values only (|f| in [2^-14, 65504]) or zero: what N(0, 1) samples produce, with
  // smaller magnitudes flushed to a signed zero (benchmark data, not a reference encoder).
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const int exp = static_cast<int>((u >> 23) & 0xFF) - 127;
  if (exp < -14) return sign;
  uint32_t m = u & 0x7FFFFFu;
  uint32_t h = (static_cast<uint32_t>(exp + 15) << 10) | (m >> 13);
  const uint32_t rest = m & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | std::min<uint32_t>(h, 0x7BFFu));
}

// n random normal values encoded as `t` (bf16 | f16 | f32).
std::vector<uint8_t> random_input(DType t, size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t es = dtype_size(t);
  std::vector<uint8_t> out(n * es);
  for (size_t i = 0; i < n; ++i) {
    const float v = normal(gen);
    if (t == DType::f32) {
      std::memcpy(out.data() + i * 4, &v, 4);
    } else {
      const uint16_t h = t == DType::bf16 ? bf16_bits(v) : f16_bits(v);
      std::memcpy(out.data() + i * 2, &h, 2);
    }
  }
  return out;
}

struct Stats {
  double median, min, max;
};


// One copy of everything a launch touches.
struct BufferSet {
  driver::DeviceBuffer io;      // store: x; gather: y
  driver::DeviceBuffer blocks;
  driver::DeviceBuffer scales;
};

}  // namespace

nlohmann::json bench_kv_cache(const std::string& op_name_arg, const KvCacheBenchShape& s) {
  const Op op = parse_op(op_name_arg, "bench op");
  MLAJIT_EXPECT(op == Op::kv_cache_store || op == Op::kv_cache_gather, "bench op", op_name_arg,
                "kv_cache_store | kv_cache_gather");
  MLAJIT_EXPECT(s.tokens >= 1 && s.tokens <= (int64_t{1} << 24), "shape.tokens", s.tokens, "an integer in [1, 2^24]");
  MLAJIT_EXPECT(s.reps >= 1 && s.reps <= 100000, "shape.reps", s.reps, "an integer in [1, 100000]");

  PagedKVCacheParams c;
  c.dtype = s.cache_dtype;
  c.num_heads = s.num_heads;
  c.head_size = s.head_size;
  c.page_size = s.page_size;
  c.is_mla = s.is_mla;
  c.num_layers = s.num_layers;
  c.quantization_granularity = s.quantization_granularity;
  c.scale_fmt = s.scale_fmt;
  // The store that fills the cache (for gather, from bf16 input) and the gather itself.
  KvCacheStoreParams sp{c, op == Op::kv_cache_store ? s.io_dtype : DType::bf16, s.threads};
  KvCacheGatherParams gp{c, s.io_dtype, s.threads};
  sp.validate();
  if (op == Op::kv_cache_gather) gp.validate();

  const int ordinal = driver::ensure_context();
  const driver::DeviceInfo info = driver::device_info(ordinal);

  // ---- batch and shuffled pages (identical for every buffer set) -------------------------------
  const int64_t T = s.tokens;
  const int batch = static_cast<int>((T + kSeqLen - 1) / kSeqLen);
  const int pages_per_seq = static_cast<int>((kSeqLen + s.page_size - 1) / s.page_size);
  const int64_t num_blocks = int64_t{batch} * pages_per_seq;
  std::vector<uint32_t> offsets(batch + 1), cache_lengths(batch, 0), lut(static_cast<size_t>(num_blocks));
  for (int b = 0; b <= batch; ++b) offsets[b] = static_cast<uint32_t>(std::min<int64_t>(int64_t{b} * kSeqLen, T));
  std::iota(lut.begin(), lut.end(), 0u);
  std::mt19937_64 gen(7);
  std::shuffle(lut.begin(), lut.end(), gen);
  std::vector<uint32_t> batch_ids(static_cast<size_t>(T)), positions(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    batch_ids[t] = static_cast<uint32_t>(t / kSeqLen);
    positions[t] = static_cast<uint32_t>(t % kSeqLen);
  }
  auto upload = [](const auto& v) {
    driver::DeviceBuffer b(std::max<size_t>(v.size() * sizeof(v[0]), 16));
    b.upload(v.data(), v.size() * sizeof(v[0]));
    return b;
  };
  auto d_offsets = upload(offsets), d_cache_lengths = upload(cache_lengths), d_lut = upload(lut);
  auto d_batch_ids = upload(batch_ids), d_positions = upload(positions);
  driver::DeviceBuffer d_dropped(4);
  d_dropped.fill_bytes(0);

  // ---- bytes moved by one launch ------------------------------------------------------------------
  const int64_t elems = T * c.num_heads * c.head_size;
  const int64_t cache_bytes = T * static_cast<int64_t>(c.row_bytes());
  const int64_t scale_bytes = c.split_scales() ? T * c.num_heads * c.head_dim_granularity() * 4 : 0;
  const int64_t io_bytes = elems * static_cast<int64_t>(dtype_size(s.io_dtype));
  const int64_t bytes_read = op == Op::kv_cache_store ? io_bytes : cache_bytes + scale_bytes + T * 8;
  const int64_t bytes_written = op == Op::kv_cache_store ? cache_bytes + scale_bytes : io_bytes;
  const int64_t bytes = bytes_read + bytes_written;

  // Enough sets that the data of a set was pushed out of L2 (twice over) before its next use.
  const int64_t l2 = std::max<int64_t>(info.l2_bytes, 1);
  const int sets = static_cast<int>(std::min<int64_t>(1 + (2 * l2 + bytes - 1) / bytes, 16));

  const size_t rows = static_cast<size_t>(num_blocks) * c.kv_dim() * c.num_layers * c.page_size;
  const size_t blocks_bytes = rows * c.row_bytes();
  const size_t scales_bytes = c.split_scales() ? rows * c.num_heads * c.head_dim_granularity() * 4 : 0;
  const auto input = random_input(sp.input_dtype, static_cast<size_t>(elems), 11);
  std::vector<BufferSet> set(sets);
  for (auto& b : set) {
    b.blocks = driver::DeviceBuffer(blocks_bytes);
    b.blocks.fill_bytes(0xFF);
    if (scales_bytes) b.scales = driver::DeviceBuffer(scales_bytes);
    if (op == Op::kv_cache_store) {
      b.io = driver::DeviceBuffer(input.size());
      b.io.upload(input.data(), input.size());
    } else {
      b.io = driver::DeviceBuffer(static_cast<size_t>(io_bytes));
    }
  }

  auto view_of = [&](BufferSet& b) {
    ops::PagedCacheView v;
    v.blocks = c.ds_mla() ? TensorView(b.blocks.get(), DType::u8,
                                       {num_blocks, 1, c.num_layers, c.page_size, PagedKVCacheParams::kDsMlaRecordBytes})
                          : TensorView(b.blocks.get(), c.dtype,
                                       {num_blocks, c.kv_dim(), c.num_layers, c.page_size, c.num_heads, c.head_size});
    if (c.split_scales())
      v.scales = TensorView(b.scales.get(), DType::f32,
                            {num_blocks, c.kv_dim(), c.num_layers, c.page_size, c.num_heads, c.head_dim_granularity()});
    v.lookup_table = TensorView(d_lut.get(), DType::u32, {batch, pages_per_seq});
    v.cache_lengths = TensorView(d_cache_lengths.get(), DType::u32, {batch});
    return v;
  };
  const TensorView offsets_view(d_offsets.get(), DType::u32, {int64_t{batch} + 1});
  const TensorView dropped_view(d_dropped.get(), DType::u32, {1});
  const int layer = c.num_layers - 1, kv = c.kv_dim() - 1;  // the farthest slice: layer strides count
  auto launch = [&](BufferSet& b) {
    if (op == Op::kv_cache_store) {
      ops::kv_cache_store(sp, TensorView(b.io.get(), sp.input_dtype, {T, c.num_heads, c.head_size}), offsets_view,
                          view_of(b), layer, kv, dropped_view);
    } else {
      ops::kv_cache_gather(gp, view_of(b), TensorView(d_batch_ids.get(), DType::u32, {T}),
                           TensorView(d_positions.get(), DType::u32, {T}), layer, kv,
                           TensorView(b.io.get(), s.io_dtype, {T, c.num_heads, c.head_size}), dropped_view);
    }
  };

  if (op == Op::kv_cache_gather) {
    // Fill every set's cache slice once with the store (bf16 input).
    driver::DeviceBuffer x(input.size());
    x.upload(input.data(), input.size());
    for (auto& b : set)
      ops::kv_cache_store(sp, TensorView(x.get(), DType::bf16, {T, c.num_heads, c.head_size}), offsets_view,
                          view_of(b), layer, kv, dropped_view);
  }
  for (int i = 0; i < 3; ++i) launch(set[i % sets]);  // compile / load, warm the clocks
  driver::synchronize();
  uint32_t dropped = 0;
  d_dropped.download(&dropped, 4);
  if (dropped != 0)
    throw_error(ErrorKind::Internal, "bench_kv_cache: {} tokens reported dropped; the benchmark's page table is wrong",
                dropped);

  // The same-harness copy reference: cuMemcpyDtoDAsync of bytes / 2, i.e. as many bytes read plus
  // written as one launch of the op. What a launch can show under this harness (the 2 x L2 flush
  // memset right before the start event, whose dirty lines drain during the timed launch; the
  // event-timed ramp and drain of one 20-60 us launch) is not what kDeviceCopyGBps was measured
  // under; this copy is, so op / copy says how far the kernel is from a plain copy of its bytes.
  // Its two buffers add ~`bytes` of device memory to the buffer sets; a shape that fits without
  // them (up to 2^24 tokens) must still run, so an allocation failure only drops the reference.
  const size_t copy_bytes = static_cast<size_t>(bytes / 2);
  driver::DeviceBuffer copy_src, copy_dst;
  std::string copy_error;
  try {
    copy_src = driver::DeviceBuffer(copy_bytes);
    copy_dst = driver::DeviceBuffer(copy_bytes);
    copy_src.fill_bytes(0x3C);
  } catch (const Error& e) {
    copy_src = driver::DeviceBuffer();
    copy_dst = driver::DeviceBuffer();
    copy_error = fmt::format("not timed: {} bytes x 2 of copy buffers could not be allocated beside the op's ({})",
                             copy_bytes, e.what());
  }

  // The one timing loop (autotune::time_interleaved): L2 flushed before each timed launch, the op
  // and the copy alternating so that both see the same clocks and machine state; the buffer sets
  // still rotate, so consecutive launches never write the same cache blocks. The op's 2 warm-up
  // launches only advance the rotation (it was warmed above).
  int next_set = 0;
  std::vector<std::function<void(Stream)>> timed_fns = {[&](Stream) { launch(set[next_set++ % sets]); }};
  if (copy_error.empty()) timed_fns.push_back([&](Stream strm) { copy_dst.copy_from(copy_src, copy_bytes, strm); });
  const std::vector<autotune::Timing> timed = autotune::time_interleaved(timed_fns, 2, s.reps);
  const autotune::Timing& t = timed[0];
  driver::EventTimer timer;
  // Back to back: launch overhead and the ramp between kernels amortized over the repetitions.
  timer.start();
  for (int r = 0; r < s.reps; ++r) launch(set[r % sets]);
  timer.stop();
  const double back_to_back = timer.elapsed_ms() / s.reps;
  driver::synchronize();

  const Stats st{t.median_ms, t.min_ms, t.max_ms};
  const double gbps = static_cast<double>(bytes) / (st.median * 1e-3) / 1e9;
  const double gbps_b2b = static_cast<double>(bytes) / (back_to_back * 1e-3) / 1e9;
  nlohmann::json same_harness_copy = {{"bytes", 2 * copy_bytes}};
  if (copy_error.empty()) {
    const autotune::Timing& tc = timed[1];
    const double copy_gbps = static_cast<double>(2 * copy_bytes) / (tc.median_ms * 1e-3) / 1e9;
    same_harness_copy.update({{"ms_median", tc.median_ms},
                              {"ms_min", tc.min_ms},
                              {"gbps", copy_gbps},
                              {"pct", 100.0 * gbps / copy_gbps}});
  } else {
    same_harness_copy["error"] = copy_error;
  }
  nlohmann::json shape = {{"tokens", s.tokens},
                          {"num_heads", s.num_heads},
                          {"head_size", s.head_size},
                          {"cache_dtype", std::string(dtype_name(s.cache_dtype))},
                          {"io_dtype", std::string(dtype_name(s.io_dtype))},
                          {"is_mla", s.is_mla},
                          {"page_size", s.page_size},
                          {"num_layers", s.num_layers},
                          {"quantization_granularity", c.resolved_quantization_granularity()},
                          {"scale_fmt", s.scale_fmt == ScaleFmt::ue8m0 ? "ue8m0" : "fp32"},
                          {"threads", s.threads}};
  return {{"op", std::string(op_name(op))},
          {"params", params_to_json(op == Op::kv_cache_store ? OpParams{sp} : OpParams{gp})},
          {"shape", shape},
          {"device", info.name},
          {"reps", s.reps},
          {"buffer_sets", sets},
          {"bytes_read", bytes_read},
          {"bytes_written", bytes_written},
          {"bytes", bytes},
          {"ms", {{"median", st.median}, {"min", st.min}, {"max", st.max}}},
          {"ms_back_to_back", back_to_back},
          {"gbps", gbps},
          {"gbps_back_to_back", gbps_b2b},
          {"pct_of_copy_bw", 100.0 * gbps / kDeviceCopyGBps},
          {"copy_bw_gbps", kDeviceCopyGBps},
          {"same_harness_copy", same_harness_copy}};
}

}  // namespace mlajit::bench

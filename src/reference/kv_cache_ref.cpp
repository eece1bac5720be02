// CPU reference of kv_cache_store / kv_cache_gather / sparse_index_remap (SPEC §1).
#include "reference/kv_cache_ref.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "mlajit/error.hpp"
#include "reference/test_data.hpp"

namespace mlajit::ref {

using testdata::decode;
using testdata::encode;

HostPagedCache::HostPagedCache(const PagedKVCacheParams& p, int64_t nb) : params(p), num_blocks(nb) {
  const size_t rows = static_cast<size_t>(nb) * p.kv_dim() * p.num_layers * p.page_size;
  blocks.assign(rows * row_bytes(), 0);
  if (p.quantized() && !p.ds_mla()) scales.assign(rows * scales_per_row(), 0.0f);
}

int64_t HostPagedCache::row(uint32_t blk, int kv_idx, int layer_idx, uint32_t offset) const {
  return ((static_cast<int64_t>(blk) * params.kv_dim() + kv_idx) * params.num_layers + layer_idx) * params.page_size +
         offset;
}

size_t HostPagedCache::row_bytes() const {
  if (params.ds_mla()) return PagedKVCacheParams::kDsMlaRecordBytes;
  return static_cast<size_t>(params.num_heads) * params.head_size * dtype_size(params.dtype);
}

std::vector<uint8_t> page_scales_from_split(const uint8_t* rows, const float* scales, size_t pages, int page_size) {
  const size_t P = static_cast<size_t>(page_size), tok = PagedKVCacheParams::kPageScalesTokenBytes;
  std::vector<uint8_t> out(pages * P * tok);
  for (size_t pg = 0; pg < pages; ++pg) {
    uint8_t* dst = out.data() + pg * P * tok;
    std::memcpy(dst, rows + pg * P * 128, P * 128);
    std::memcpy(dst + P * 128, scales + pg * P, P * sizeof(float));
  }
  return out;
}

std::vector<uint8_t> HostPagedCache::page_scales_bytes() const {
  return page_scales_from_split(blocks.data(), scales.data(), static_cast<size_t>(num_blocks) * params.num_layers,
                                params.page_size);
}

int HostPagedCache::scales_per_row() const {
  return params.quantized() && !params.ds_mla() ? params.num_heads * params.head_dim_granularity() : 0;
}

float ue8m0_round_up(float s) {
  uint32_t b;
  std::memcpy(&b, &s, 4);
  if (b & 0x007FFFFFu) b = (b & 0xFF800000u) + 0x00800000u;
  std::memcpy(&s, &b, 4);
  return s;
}

float fp8_group_scale(float amax, ScaleFmt fmt) {
  // volatile keeps the division an f32 operation whatever the host compiler's excess precision.
  volatile float num = std::fmax(amax, 1e-4f);
  volatile float s = num / 448.0f;
  return fmt == ScaleFmt::ue8m0 ? ue8m0_round_up(s) : s;
}

float ds_mla_tile_scale(float amax) {
  volatile float s = amax / 448.0f;  // IEEE f32 division
  return ue8m0_round_up(std::fmax(s, 1e-4f));
}

bool resolve_slot(const std::vector<uint32_t>& lut, int pages_per_seq, int64_t num_blocks, int page_size, int b,
                  uint64_t pos, uint32_t* blk, uint32_t* offset) {
  const uint64_t page = pos / static_cast<uint64_t>(page_size);
  if (page >= static_cast<uint64_t>(pages_per_seq)) return false;
  const uint32_t block = lut[static_cast<size_t>(b) * pages_per_seq + page];
  if (static_cast<int64_t>(block) >= num_blocks) return false;
  *blk = block;
  *offset = static_cast<uint32_t>(pos % static_cast<uint64_t>(page_size));
  return true;
}

namespace {

// The sequence of token t, or -1 when t is outside [row_offsets[0], row_offsets[B]).
int sequence_of(const std::vector<uint32_t>& off, uint64_t t) {
  const int batch = static_cast<int>(off.size()) - 1;
  if (batch <= 0 || t < off[0] || t >= off[batch]) return -1;
  int b = 0;
  while (b + 1 < batch && off[b + 1] <= t) ++b;
  return b;
}

// One fp8_ds_mla record (656 bytes at dst) of a 576-element token row of input dtype `in`.
void store_ds_mla_record(DType in, const uint8_t* src, uint8_t* dst) {
  const size_t in_size = dtype_size(in);
  constexpr int kTile = PagedKVCacheParams::kDsMlaTile;
  for (int tile = 0; tile < PagedKVCacheParams::kDsMlaNopeDims / kTile; ++tile) {
    float amax = 0.0f;
    for (int d = tile * kTile; d < (tile + 1) * kTile; ++d) amax = std::fmax(amax, std::fabs(decode(in, src + d * in_size)));
    const float s = ds_mla_tile_scale(amax);
    std::memcpy(dst + PagedKVCacheParams::kDsMlaScalesOffset + 4 * tile, &s, 4);
    for (int d = tile * kTile; d < (tile + 1) * kTile; ++d) {
      volatile float v = decode(in, src + d * in_size);
      volatile float q = v / s;
      dst[d] = testdata::f32_to_e4m3(q);
    }
  }
  for (int i = 0; i < PagedKVCacheParams::kDsMlaRopeDims; ++i) {
    const uint8_t* e = src + (PagedKVCacheParams::kDsMlaNopeDims + i) * in_size;
    uint8_t* o = dst + PagedKVCacheParams::kDsMlaRopeOffset + 2 * i;
    if (in == DType::bf16) std::memcpy(o, e, 2);  // verbatim
    else encode(DType::bf16, decode(in, e), o);
  }
}

// Element d of the fp8_ds_mla record at rec, decoded: e4m3 * tile scale (one f32 product) for
// d < 512, the bf16 rope value otherwise.
float ds_mla_record_value(const uint8_t* rec, int d) {
  if (d >= PagedKVCacheParams::kDsMlaNopeDims)
    return decode(DType::bf16, rec + PagedKVCacheParams::kDsMlaRopeOffset + 2 * (d - PagedKVCacheParams::kDsMlaNopeDims));
  float s;
  std::memcpy(&s, rec + PagedKVCacheParams::kDsMlaScalesOffset + 4 * (d / PagedKVCacheParams::kDsMlaTile), 4);
  volatile float v = testdata::e4m3_to_f32(rec[d]);
  v = v * s;
  return v;
}

}  // namespace

int64_t kv_cache_store(const KvCacheStoreParams& p, const std::vector<uint8_t>& x, int64_t num_tokens,
                       const std::vector<uint32_t>& row_offsets, const std::vector<uint32_t>& cache_lengths,
                       const std::vector<uint32_t>& lut, int pages_per_seq, int layer_idx, int kv_idx,
                       HostPagedCache& cache) {
  const PagedKVCacheParams& c = p.cache;
  const int H = c.num_heads, D = c.head_size;
  const size_t in_size = dtype_size(p.input_dtype), out_size = dtype_size(c.dtype);
  if (x.size() != static_cast<size_t>(num_tokens) * H * D * in_size)
    throw_invalid("ref::kv_cache_store x bytes", x.size(), "num_tokens * num_heads * head_size * dtype size");
  int64_t dropped = 0;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int b = sequence_of(row_offsets, static_cast<uint64_t>(t));
    uint32_t blk = 0, off = 0;
    if (b < 0 || !resolve_slot(lut, pages_per_seq, cache.num_blocks, c.page_size, b,
                               uint64_t{cache_lengths[b]} + (t - row_offsets[b]), &blk, &off)) {
      ++dropped;
      continue;
    }
    const int64_t r = cache.row(blk, kv_idx, layer_idx, off);
    uint8_t* dst = cache.row_data(r);
    const uint8_t* src = x.data() + static_cast<size_t>(t) * H * D * in_size;
    if (c.ds_mla()) {
      store_ds_mla_record(p.input_dtype, src, dst);
      continue;
    }
    if (!c.quantized()) {
      for (int i = 0; i < H * D; ++i) encode(c.dtype, decode(p.input_dtype, src + i * in_size), dst + i * out_size);
      continue;
    }
    const int G = c.resolved_quantization_granularity(), NG = c.head_dim_granularity();
    for (int h = 0; h < H; ++h) {
      for (int k = 0; k < NG; ++k) {
        const int d0 = k * G, d1 = std::min(D, d0 + G);
        float amax = 0.0f;
        for (int d = d0; d < d1; ++d) amax = std::fmax(amax, std::fabs(decode(p.input_dtype, src + (h * D + d) * in_size)));
        const float s = fp8_group_scale(amax, c.scale_fmt);
        cache.row_scales(r)[h * NG + k] = s;
        for (int d = d0; d < d1; ++d) {
          volatile float v = decode(p.input_dtype, src + (h * D + d) * in_size);
          volatile float q = v / s;
          dst[h * D + d] = testdata::f32_to_e4m3(q);
        }
      }
    }
  }
  return dropped;
}

int64_t kv_cache_gather(const KvCacheGatherParams& p, const HostPagedCache& cache, const std::vector<uint32_t>& lut,
                        int batch, int pages_per_seq, const std::vector<uint32_t>& batch_ids,
                        const std::vector<uint32_t>& positions, int layer_idx, int kv_idx, std::vector<uint8_t>& y) {
  const PagedKVCacheParams& c = p.cache;
  const int H = c.num_heads, D = c.head_size;
  const size_t in_size = dtype_size(c.dtype), out_size = dtype_size(p.output_dtype);
  const size_t n = batch_ids.size();
  y.assign(n * H * D * out_size, 0);
  int64_t dropped = 0;
  for (size_t i = 0; i < n; ++i) {
    uint8_t* dst = y.data() + i * H * D * out_size;
    uint32_t blk = 0, off = 0;
    if (batch_ids[i] >= static_cast<uint32_t>(batch) ||
        !resolve_slot(lut, pages_per_seq, cache.num_blocks, c.page_size, static_cast<int>(batch_ids[i]),
                      positions[i], &blk, &off)) {
      ++dropped;
      for (int e = 0; e < H * D; ++e) encode(p.output_dtype, std::numeric_limits<float>::quiet_NaN(), dst + e * out_size);
      continue;
    }
    const int64_t r = cache.row(blk, kv_idx, layer_idx, off);
    const uint8_t* src = cache.row_data(r);
    if (c.ds_mla()) {
      for (int d = 0; d < D; ++d) encode(p.output_dtype, ds_mla_record_value(src, d), dst + d * out_size);
      continue;
    }
    for (int h = 0; h < H; ++h) {
      for (int d = 0; d < D; ++d) {
        const int e = h * D + d;
        volatile float v = decode(c.dtype, src + e * in_size);
        if (c.quantized()) {
          const float s = cache.row_scales(r)[h * c.head_dim_granularity() + d / c.resolved_quantization_granularity()];
          v = v * s;
        }
        encode(p.output_dtype, v, dst + e * out_size);
      }
    }
  }
  return dropped;
}

std::vector<int32_t> sparse_index_remap(int page_size, const std::vector<int32_t>& indices, int64_t num_tokens,
                                        int64_t k, const std::vector<uint32_t>& row_offsets,
                                        const std::vector<uint32_t>& lut, int pages_per_seq, int64_t num_blocks) {
  std::vector<int32_t> out(static_cast<size_t>(num_tokens * k), -1);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int b = sequence_of(row_offsets, static_cast<uint64_t>(t));
    for (int64_t j = 0; j < k; ++j) {
      const int32_t idx = indices[static_cast<size_t>(t * k + j)];
      uint32_t blk = 0, off = 0;
      if (b < 0 || idx < 0 ||
          !resolve_slot(lut, pages_per_seq, num_blocks, page_size, b, static_cast<uint64_t>(idx), &blk, &off))
        continue;
      out[static_cast<size_t>(t * k + j)] = static_cast<int32_t>(static_cast<int64_t>(blk) * page_size + off);
    }
  }
  return out;
}

}  // namespace mlajit::ref

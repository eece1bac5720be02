// sparse_prefill with params.kv_staging bf16, without a GPU: what the params admit, the workspace
// contract (size, alignment, errors that name it), the arguments the attention kernel then gets (a
// one-layer bf16 copy read with the same indices), the generated module (the bf16-cache kernel and
// the three staging kernels) and the host model of the staged rows.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "mlajit/codegen.hpp"
#include "mlajit/error.hpp"
#include "mlajit/ops.hpp"
#include "mlajit/params.hpp"
#include "ops/sparse_prefill/launch.hpp"
#include "ops/sparse_prefill/plan.hpp"
#include "reference/sparse_prefill_ref.hpp"
#include "invalid_message.hpp"

using namespace mlajit;

namespace {

SparsePrefillParams staged(int quant_granularity = 576) {
  SparsePrefillParams p;
  p.kv_dtype = DType::fp8_e4m3;
  p.quantization_granularity = quant_granularity;
  p.kv_staging = KvStaging::bf16;
  return p;
}

}  // namespace

TEST_CASE("sparse_prefill kv_staging: params, JSON and kernel name") {
  SparsePrefillParams p = staged();
  CHECK_NOTHROW(p.validate());
  const KernelSpec spec{p};
  CHECK(spec.name().find("_stagebf16") != std::string::npos);
  CHECK(KernelSpec{SparsePrefillParams{}}.name().find("stage") == std::string::npos);  // default names unchanged
  const auto j = to_json(spec);
  CHECK(j["params"]["kv_staging"] == "bf16");
  CHECK(kernel_spec_from_json(j, "k").canonical() == spec.canonical());

  SparsePrefillParams bf16_cache = p;
  bf16_cache.kv_dtype = DType::bf16;
  bf16_cache.quantization_granularity = 0;
  std::string e = invalid_message([&] { bf16_cache.validate(); });
  CHECK(e.find("params.kv_staging") != std::string::npos);
  CHECK(e.find("kv_dtype bf16") != std::string::npos);
  SparsePrefillParams fp8_math = p;
  fp8_math.qk_math = QkMath::fp8;
  e = invalid_message([&] { fp8_math.validate(); });
  CHECK(e.find("params.kv_staging") != std::string::npos);
  CHECK(e.find("qk_math fp8") != std::string::npos);
  e = invalid_message([&] {
    kernel_spec_from_json(nlohmann::json::parse(R"({"op": "sparse_prefill", "params": {"kv_dtype": "fp8_e4m3",
        "kv_staging": "fp16"}})"), "k");
  });
  CHECK(e.find("kv_staging") != std::string::npos);
  CHECK(e.find("none | bf16") != std::string::npos);
}

TEST_CASE("sparse_prefill kv_staging: the attention kernel is the bf16-cache one, whatever the scales") {
  for (int quant_granularity : {0, 8, 64, 576}) {
    for (ScaleFmt fmt : {ScaleFmt::fp32, ScaleFmt::ue8m0}) {
      if (quant_granularity == 0 && fmt == ScaleFmt::ue8m0) continue;
      SparsePrefillParams p = staged(quant_granularity);
      p.scale_fmt = fmt;
      CAPTURE(quant_granularity);
      const SparsePrefillParams a = sparse_prefill::attention_params(p);
      CHECK(a.kv_dtype == DType::bf16);
      CHECK(a.quantization_granularity == 0);
      CHECK(a.kv_staging == KvStaging::none);
      // Group scales of any f32 value, even 8-element ones, run on the Hopper kernel: the staging
      // already applied them (rounded once to bf16).
      CHECK(sparse_prefill::sm90_supported(p));
      CHECK(sparse_prefill::sm90_preferred(p));
      CHECK(sparse_prefill::sm90_plan(p).persistent);
      CHECK(sparse_prefill::portable_plan(p).smem_bytes == sparse_prefill::portable_plan(a).smem_bytes);
      CHECK(sparse_prefill::resolve_path(p, "sm_90a", sparse_prefill::Path::automatic) == sparse_prefill::Path::sm90);
      CHECK(sparse_prefill::resolve_path(p, "sm_89", sparse_prefill::Path::automatic) == sparse_prefill::Path::portable);

      const KernelSpec spec{p};
      const KernelSource src = generate(spec);
      REQUIRE(src.entries.size() == 6);
      CHECK(src.entries[sparse_prefill::kEntrySm90Combine].symbol == sparse_prefill::kSymbolSm90Combine);
      CHECK(src.entries[sparse_prefill::kEntryStageClear].symbol == sparse_prefill::kSymbolStageClear);
      CHECK(src.entries[sparse_prefill::kEntryStageMark].symbol == sparse_prefill::kSymbolStageMark);
      CHECK(src.entries[sparse_prefill::kEntryStageConvert].symbol == sparse_prefill::kSymbolStageConvert);
      CHECK(src.code.find("#include \"sparse_prefill/stage_bf16.cuh\"") != std::string::npos);
      CHECK(src.code.find(fmt::format("/*page_size*/ 64, /*quant_granularity*/ {}>", quant_granularity)) != std::string::npos);
      // The attention Config of both bodies is the bf16 cache's (kv_fp8 false, quantization granularity 0).
      CHECK(src.code.find("/*kv_fp8*/ true") == std::string::npos);
      CHECK(src.code.find("/*kv_fp8*/ false") != std::string::npos);
      CHECK(src.code.find("kPersistent == true") != std::string::npos);
      // Forced paths hold the staging kernels too.
      for (auto path : {sparse_prefill::Path::portable, sparse_prefill::Path::sm90})
        CHECK(generate_sparse_prefill_mode(spec, path).entries.size() == 6);
    }
  }
  // Without staging: the fused fp8 kernel, one item per CTA, with its split's combine entry.
  SparsePrefillParams plain = staged();
  plain.kv_staging = KvStaging::none;
  CHECK(generate(KernelSpec{plain}).entries.size() == 3);
}

TEST_CASE("sparse_prefill kv_staging: the workspace contract (no GPU needed)") {
  const SparsePrefillParams p = staged(64);
  const int64_t T = 3, NB = 5, L = 2, P = 64, S = 128;
  // The staged part (required), then the tail split's partial slots (optional) from a 256-byte boundary.
  const size_t need = sparse_prefill::staged_bytes(p, NB);
  CHECK(need == static_cast<size_t>(NB * P) * 1152 + 16);  // a flag byte per page, rounded up to 16
  CHECK(sparse_prefill::staged_bytes(p, 3) == 3 * 64 * 1152 + 16);
  CHECK(sparse_prefill::staged_bytes(p, 17) == 17 * 64 * 1152 + 32);
  constexpr size_t kSlots = sparse_prefill::kMaxSplitSlots * mj::sparse_prefill_layout::kPartialSlotBytes;
  CHECK(sparse_prefill::partials_offset(p, NB) == (need + 255) / 256 * 256);
  CHECK(ops::sparse_prefill_workspace_bytes(p, NB) == (need + 255) / 256 * 256 + kSlots);
  SparsePrefillParams odd = p;
  odd.page_size = 4;
  CHECK(sparse_prefill::staged_bytes(odd, 5) == 20 * 1152 + 16);
  CHECK(sparse_prefill::workspace_bytes(odd, 5) == (20 * 1152 + 16 + 255) / 256 * 256 + kSlots);
  SparsePrefillParams none = p;  // the fused fp8 kernel: the partial slots of its split alone
  none.kv_staging = KvStaging::none;
  CHECK(ops::sparse_prefill_workspace_bytes(none, NB) == kSlots);
  SparsePrefillParams bf16 = none;  // the persistent kernel without staging: the slots alone
  bf16.kv_dtype = DType::bf16;
  bf16.quantization_granularity = 0;
  CHECK(ops::sparse_prefill_workspace_bytes(bf16, NB) == kSlots);
  CHECK(invalid_message([&] { ops::sparse_prefill_workspace_bytes(p, 0); }).find("num_blocks") != std::string::npos);
  // More rows than an int32 encoded index reaches: refused, never a wrapped size.
  CHECK(ops::sparse_prefill_workspace_bytes(p, (int64_t{1} << 31) / 64) > 0);
  const std::string big = invalid_message([&] { ops::sparse_prefill_workspace_bytes(p, (int64_t{1} << 31) / 64 + 1); });
  CHECK(big.find("num_blocks") != std::string::npos);
  CHECK(big.find("2^31 / page_size = 33554432") != std::string::npos);

  alignas(16) static unsigned char fake[64];  // never dereferenced: validation fails or nothing launches
  void* ptr = fake;
  TensorView q(ptr, DType::bf16, {T, 128, 576});
  ops::PagedCacheView kv;
  kv.blocks = TensorView(ptr, DType::fp8_e4m3, {NB, 1, L, P, 1, 576});
  kv.scales = TensorView(ptr, DType::f32, {NB, 1, L, P, 1, 9});
  TensorView idx(ptr, DType::u32, {T, S}), len(ptr, DType::u32, {T});
  TensorView out(ptr, DType::bf16, {T, 128, 512}), lse(ptr, DType::f32, {T, 128});
  const auto ws_of = [&](size_t bytes, size_t offset = 0) {
    return TensorView(fake + offset, DType::u32, {static_cast<int64_t>(bytes / 4)});
  };

  // The good case: the attention kernel is pointed at the copy, a one-layer bf16 cache.
  SparsePrefillArgs a = sparse_prefill::make_args(p, q, kv, idx, len, 1, 0.05f, TensorView(), out, lse);
  const SparsePrefillStageArgs sa = sparse_prefill::make_stage_args(p, kv, ws_of(need), a);
  CHECK(sa.kv_blocks == ptr);
  CHECK(sa.kv_scales == ptr);
  CHECK(sa.row_stride == L * P);
  CHECK(sa.layer_row_offset == P);
  CHECK(sa.num_rows == NB * P);
  CHECK(sa.num_tokens == T);
  CHECK(sa.indices_stride == S);
  CHECK(sa.rows == ptr);
  CHECK(sa.page_flags == fake + NB * P * 1152);
  CHECK(sa.num_blocks == NB);
  CHECK(a.kv_blocks == ptr);
  CHECK(a.kv_scales == nullptr);
  CHECK(a.row_stride == P);
  CHECK(a.layer_row_offset == 0);
  CHECK(a.num_kv_rows == NB * P);  // the same encoded indices are valid: e < num_blocks * page_size

  // Errors name the workspace, its size and the size needed; nothing is launched (no GPU here).
  auto staged_error = [&](const TensorView& ws) {
    return invalid_message([&] { ops::sparse_prefill(p, q, kv, idx, len, 1, 0.05f, TensorView(), out, lse, ws); });
  };
  std::string e = staged_error(ws_of(need - 16));
  CHECK(e.find("workspace size") != std::string::npos);
  CHECK(e.find(fmt::format("{} bytes", need - 16)) != std::string::npos);
  CHECK(e.find(fmt::format("{} bytes", need)) != std::string::npos);
  e = staged_error(TensorView());
  CHECK(e.find("workspace size") != std::string::npos);
  CHECK(e.find("got 0 bytes") != std::string::npos);
  // The overload without a workspace is the same as an empty one.
  e = invalid_message([&] { ops::sparse_prefill(p, q, kv, idx, len, 1, 0.05f, TensorView(), out, lse); });
  CHECK(e.find("workspace size") != std::string::npos);
  e = staged_error(ws_of(need + 16, 4));
  CHECK(e.find("workspace address") != std::string::npos);
  // Without staging (the fused fp8 kernel) the workspace holds the split's partial slots alone, from
  // its start; a misaligned one is refused, a small one holds none (the kernel runs unsplit).
  SparsePrefillArgs b = sparse_prefill::make_args(none, q, kv, idx, len, 1, 0.05f, TensorView(), out, lse);
  const SparsePrefillArgs before = b;
  sparse_prefill::make_stage_args(none, kv, TensorView(), b);
  CHECK(b.kv_blocks == before.kv_blocks);
  CHECK(b.row_stride == before.row_stride);
  CHECK(invalid_message([&] { sparse_prefill::bind_partials(none, kv, ws_of(64, 4), b); }).find("workspace") !=
        std::string::npos);
  sparse_prefill::bind_partials(none, kv, ws_of(48), b);
  CHECK(b.partials == nullptr);
  CHECK(b.partial_slots == 0);
  sparse_prefill::bind_partials(none, kv, ws_of(2 * 64 * 514 * 4), b);
  CHECK(reinterpret_cast<unsigned char*>(b.partials) == fake);
  CHECK(b.partial_slots == 2);
  // The staged spec: the partial slots start at the 256-byte boundary after the staged part; a
  // workspace of the staged part alone holds none (the kernel runs unsplit), a full one 256.
  SparsePrefillArgs c = sparse_prefill::make_args(p, q, kv, idx, len, 1, 0.05f, TensorView(), out, lse);
  const size_t off = sparse_prefill::partials_offset(p, NB);
  sparse_prefill::bind_partials(p, kv, ws_of(need), c);
  CHECK(c.partials == nullptr);
  CHECK(c.partial_slots == 0);
  sparse_prefill::bind_partials(p, kv, ws_of(off + 3 * 64 * 514 * 4 + 8), c);
  CHECK(reinterpret_cast<unsigned char*>(c.partials) == fake + off);
  CHECK(c.partial_slots == 3);
  sparse_prefill::bind_partials(p, kv, ws_of(ops::sparse_prefill_workspace_bytes(p, NB)), c);
  CHECK(c.partial_slots == 256);
  CHECK(invalid_message([&] { sparse_prefill::bind_partials(p, kv, ws_of(need, 4), c); }).find("workspace") !=
        std::string::npos);
}

TEST_CASE("sparse_prefill kv_staging: every row or only the marked ones, by the byte model") {
  using sparse_prefill::stage_marks_rows;
  // The benchmark's shapes: 4096 tokens x 2048 slots, up to 128K rows: convert every row (measured
  // on an H100: ~0.11 ms at 128K rows; marking only adds to it there; docs/decisions/sparse_prefill.md).
  CHECK_FALSE(stage_marks_rows(32768 + 64, 4096, 2048));
  CHECK_FALSE(stage_marks_rows(131072 + 64, 4096, 2048));
  // A large pool read by a prefill: mark.
  CHECK(stage_marks_rows(int64_t{1} << 20, 4096, 2048));
  CHECK(stage_marks_rows(131072 + 64, 128, 2048));
  // No overflow at the extremes.
  CHECK(stage_marks_rows(int64_t{1} << 40, 1, 64));
  CHECK_FALSE(stage_marks_rows(1, int64_t{1} << 40, int64_t{1} << 30));
  CHECK(sparse_prefill::parse_stage_rows("marked", "f") == sparse_prefill::StageRows::marked);
  const std::string e = invalid_message([] { sparse_prefill::parse_stage_rows("some", "stage_rows"); });
  CHECK(e.find("stage_rows") != std::string::npos);
  CHECK(e.find("auto | all | marked") != std::string::npos);
}

TEST_CASE("sparse_prefill kv_staging: the host model of a staged row (e4m3 * scale in f32, one bf16 rounding)") {
  SparsePrefillParams p = staged(64);
  ref::SparsePrefillShape s;
  s.num_tokens = 2;
  s.indices_stride = 64;
  s.kv_tokens = 128;
  const auto pb = ref::make_random_problem(p, s, 11);
  const auto st = ref::staged_bf16_problem(pb);
  CHECK(st.p.kv_dtype == DType::bf16);
  CHECK(st.scales.empty());
  CHECK(st.blocks.size() == pb.blocks.size() * 2);
  std::vector<double> k8(576), k16(576);
  size_t inexact = 0;
  for (int64_t row = 0; row < pb.num_blocks * pb.row_stride(); ++row) {
    ref::decode_row(pb, row, k8.data());
    ref::decode_row(st, row, k16.data());
    for (int d = 0; d < 576; ++d) {
      if (std::isnan(k8[d])) {
        CHECK(std::isnan(k16[d]));
        continue;
      }
      // One rounding to bf16: within half an ulp (at most 2^-8 relative: 8 significant bits).
      CHECK(std::fabs(k16[d] - k8[d]) <= std::fabs(k8[d]) * 0x1p-8 + 1e-300);
      inexact += k16[d] != k8[d];
    }
  }
  CHECK(inexact > 0);  // f32 scales: some products need more than bf16's 8 bits
  // Power-of-two scales: every staged element is exact.
  p.scale_fmt = ScaleFmt::ue8m0;
  const auto pb2 = ref::make_random_problem(p, s, 12);
  const auto st2 = ref::staged_bf16_problem(pb2);
  for (int64_t row = 0; row < pb2.num_blocks * pb2.row_stride(); ++row) {
    ref::decode_row(pb2, row, k8.data());
    ref::decode_row(st2, row, k16.data());
    for (int d = 0; d < 576; ++d)
      if (!std::isnan(k8[d])) CHECK(k16[d] == k8[d]);
  }
}

TEST_CASE("sparse_prefill kv_staging: what the one bf16 rounding of f32-scaled rows costs against the f64 reference") {
  // The GPU tests hold the staged op to the staged problem's f64 result at SPEC §3's bounds and to
  // the fp8 problem's at the bf16-cache lse bound (1e-2) where f32 scales make the copy inexact;
  // this measures the gap between the two references themselves (printed) on the tests' data.
  for (int quant_granularity : {576, 64}) {
    SparsePrefillParams p = staged(quant_granularity);
    p.num_q_heads = 64;
    ref::SparsePrefillShape s;
    s.num_tokens = 24;
    s.indices_stride = 512;
    s.kv_tokens = 4096;
    s.softmax_scale = 0.0416667f;
    const auto pb = ref::make_random_problem(p, s, 31);
    const auto a = ref::sparse_prefill_reference(pb), b = ref::sparse_prefill_reference(ref::staged_bf16_problem(pb));
    double lse_err = 0, num = 0, den = 0;
    for (size_t i = 0; i < a.lse.size(); ++i)
      if (std::isfinite(a.lse[i])) lse_err = std::max(lse_err, std::fabs(a.lse[i] - b.lse[i]));
    for (size_t i = 0; i < a.out.size(); ++i) {
      num += (a.out[i] - b.out[i]) * (a.out[i] - b.out[i]);
      den += a.out[i] * a.out[i];
    }
    MESSAGE("quant_granularity ", quant_granularity, " f32 scales: staged vs fp8 reference: lse max diff ", lse_err, ", out rel Frobenius ",
            std::sqrt(num / den));
    CHECK(lse_err < 1e-2);
    CHECK(lse_err > 0);  // f32 scales do round
    CHECK(std::sqrt(num / den) < 1e-2);
  }
}

// The lse error of kv_staging bf16 with f32 (not power-of-two) scales, and its bound
// (docs: the staged fp8 bound). Each staged element k~ = bf16(f32(e4m3 * scale)) is k (the exact
// e4m3 * scale) times (1 + d), |d| <= u = 2^-8 + 2^-23 (one f32 rounding, then one to bf16's 8
// significant bits). A score s_j = sigma * sum_i q_i k_ji (sigma: the softmax scale) then moves by
//   |ds_j| <= e_j = u * sigma * sum_i |q_i k_ji|   (the key's absolute spread, times u),
// and lse = log sum_j exp(s_j), whose gradient is the softmax p, by
//   |dlse| <= exp(2 e_max) * sum_j p_j e_j <= exp(2 e_max) * e_max          (worst case).
// The worst case assumes every rounding error has the sign of its product. Round-to-nearest errors
// of unrelated products are independent and zero-mean, so dlse = sum_ji sigma p_j q_i k_ji d_ji is
// a sum of independent terms bounded by u |sigma p_j q_i k_ji|; by Hoeffding's inequality, with
// probability >= 1 - eta for all R rows (token, head) at once,
//   |dlse| <= kappa * u * sigma * sqrt(sum_j p_j^2 sum_i (q_i k_ji)^2),   kappa = sqrt(2 ln(2 R / eta))
// (kappa = 5.0 for R = 128, eta = 1e-3). Both grow linearly with sigma (for given q and k) and with
// the spread of the products q_i k_ji; the second also shrinks as the softmax spreads over more keys.
// Here: normal q and keys, 64-element groups with scale amax / 448,
// at two softmax scales. Checked: every row's error is within both bounds, and the statistical
// bound is within 10x of the largest measured error (the worst case is not: random signs cancel
// by about sqrt(576) within a score and by sqrt(effective keys) across the softmax).
TEST_CASE("sparse_prefill kv_staging: the lse error of f32 group scales is within its stated bound") {
  constexpr double u = 0x1p-8 + 0x1p-23;
  constexpr int kTokens = 8, kHeads = 16;
  const double kappa = std::sqrt(2 * std::log(2.0 * kTokens * kHeads / 1e-3));  // all 128 rows, eta = 1e-3
  for (float sigma : {0.0416667f, 0.2f}) {
    SparsePrefillParams p = staged(64);
    p.num_q_heads = kHeads;
    ref::SparsePrefillShape s;
    s.num_tokens = kTokens;
    s.indices_stride = 512;
    s.kv_tokens = 4096;
    s.softmax_scale = sigma;  // irregular (the default): some rows have few valid keys
    const auto pb = ref::make_random_problem(p, s, 41);
    const auto a = ref::sparse_prefill_reference(pb), b = ref::sparse_prefill_reference(ref::staged_bf16_problem(pb));
    const int H = p.num_q_heads;
    const int64_t page = p.page_size, layer_off = int64_t{pb.layer_idx} * page;
    double max_err = 0, max_worst = 0, max_stat = 0, max_spread = 0, max_score = 0;
    std::vector<double> q(576), keys, sc, eps, l2;
    for (int64_t t = 0; t < pb.num_tokens; ++t) {
      keys.clear();
      for (int64_t j = 0; j < pb.indices_stride; ++j) {
        if (!ref::slot_valid(pb, t, j)) continue;
        const uint32_t e = pb.indices[t * pb.indices_stride + j];
        keys.resize(keys.size() + 576);
        ref::decode_row(pb, static_cast<int64_t>(e / page) * pb.row_stride() + e % page + layer_off,
                        keys.data() + keys.size() - 576);
      }
      const size_t n = keys.size() / 576;
      if (n == 0) continue;  // no valid slot: lse +inf in both
      sc.resize(n);
      eps.resize(n);
      l2.resize(n);
      for (int h = 0; h < H; ++h) {
        for (int d = 0; d < 576; ++d) q[d] = ref::bf16_to_float(pb.q[(static_cast<size_t>(t) * H + h) * 576 + d]);
        double m = -INFINITY, e_max = 0;
        for (size_t j = 0; j < n; ++j) {
          double dot = 0, abs_dot = 0, sq = 0;
          for (int d = 0; d < 576; ++d) {
            const double x = q[d] * keys[j * 576 + d];
            dot += x;
            abs_dot += std::fabs(x);
            sq += x * x;
          }
          sc[j] = sigma * dot;
          eps[j] = u * sigma * abs_dot;
          l2[j] = sq;
          m = std::max(m, sc[j]);
          e_max = std::max(e_max, eps[j]);
          max_spread = std::max(max_spread, sigma * abs_dot);
          max_score = std::max(max_score, std::fabs(sc[j]));
        }
        double z = 0;
        for (size_t j = 0; j < n; ++j) z += std::exp(sc[j] - m);
        double weighted = 0, var = 0;
        for (size_t j = 0; j < n; ++j) {
          const double pj = std::exp(sc[j] - m) / z;
          weighted += pj * eps[j];
          var += pj * pj * l2[j];
        }
        const double worst = std::exp(2 * e_max) * weighted;
        const double stat = kappa * u * sigma * std::sqrt(var);
        const double err = std::fabs(a.lse[static_cast<size_t>(t) * H + h] - b.lse[static_cast<size_t>(t) * H + h]);
        CHECK(err <= worst);
        CHECK(err <= stat);
        max_err = std::max(max_err, err);
        max_worst = std::max(max_worst, worst);
        max_stat = std::max(max_stat, stat);
      }
    }
    MESSAGE("softmax scale ", sigma, ": lse error max ", max_err, "; statistical bound max ", max_stat,
            " (", max_stat / max_err, "x); worst-case bound max ", max_worst, " (", max_worst / max_err,
            "x); largest |score| ", max_score, ", largest absolute spread sigma*sum|q k| ", max_spread);
    CHECK(max_err > 0);
    CHECK(max_stat < 10 * max_err);  // the statistical bound is not vacuous
  }
}

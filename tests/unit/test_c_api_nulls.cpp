// The C API names a required tensor given as NULL ("q: no tensor given") in every op, before any
// other check (which would otherwise complain about the empty view's default dtype or rank).
#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "mlajit/c_api.h"

namespace {

mlajit_op make_op(const char* json) {
  mlajit_op op = nullptr;
  mlajit_status s = mlajit_op_create(json, &op);
  INFO(std::string(mlajit_last_error()));
  REQUIRE(s == MLAJIT_OK);
  return op;
}

// A placeholder that is never read: the NULL check fails first.
mlajit_tensor t{};

struct Case {
  std::string name;                           // the argument's name in the message
  std::function<mlajit_status(bool)> call;    // true: that argument is passed as NULL
};

void expect_named(const std::vector<Case>& cases) {
  for (auto& c : cases) {
    CAPTURE(c.name);
    CHECK(c.call(true) == MLAJIT_ERROR_INVALID_ARGUMENT);
    std::string msg = mlajit_last_error();
    CHECK(msg.rfind(c.name + ": no tensor given", 0) == 0);
  }
}

#define NUL(arg) (null == (arg) ? nullptr : &t)

}  // namespace

TEST_CASE("C API: a NULL required tensor is named as such, in every op") {
  mlajit_op store = make_op(R"({"op":"kv_cache_store","params":{"dtype":"fp8_e4m3","head_size":576}})");
  mlajit_op gather = make_op(R"({"op":"kv_cache_gather","params":{"dtype":"fp8_e4m3","head_size":576}})");
  mlajit_op remap = make_op(R"({"op":"sparse_index_remap","params":{}})");
  mlajit_op indexer = make_op(R"({"op":"mla_indexer","params":{}})");
  mlajit_op prefill = make_op(
      R"({"op":"sparse_prefill","params":{"kv_dtype":"fp8_e4m3","quantization_granularity":64,"attn_sink":true,"emit_lse":true}})");

  // Each case names one argument; `null == k` selects which one is NULL.
  enum { X, OFFS, BLOCKS, SCALES, TABLE, LENGTHS, BATCH_IDS, POSITIONS, Y, INDICES, OUT, Q, QS, WORKSPACE, TOPK, SINK, LSE };
  auto cache = [](int null) {
    static mlajit_paged_cache c;
    c = {NUL(BLOCKS), NUL(SCALES), NUL(TABLE), NUL(LENGTHS)};
    return &c;
  };
  std::vector<Case> cases;
  auto add = [&](const char* name, int which, std::function<mlajit_status(int)> f) {
    cases.push_back({name, [=](bool) { return f(which); }});
  };
  auto st = [&](int null) { return mlajit_kv_cache_store(store, NUL(X), NUL(OFFS), cache(null), 0, 0, nullptr, nullptr); };
  add("x", X, st);
  add("input_row_offsets", OFFS, st);
  add("cache.blocks", BLOCKS, st);
  add("cache.scales", SCALES, st);  // fp8 cache
  add("cache.lookup_table", TABLE, st);
  add("cache.cache_lengths", LENGTHS, st);
  auto ga = [&](int null) {
    return mlajit_kv_cache_gather(gather, cache(null), NUL(BATCH_IDS), NUL(POSITIONS), 0, 0, NUL(Y), nullptr, nullptr);
  };
  add("cache.blocks", BLOCKS, ga);
  add("cache.scales", SCALES, ga);
  add("cache.lookup_table", TABLE, ga);
  add("batch_ids", BATCH_IDS, ga);
  add("positions", POSITIONS, ga);
  add("y", Y, ga);
  auto re = [&](int null) {
    return mlajit_sparse_index_remap(remap, NUL(INDICES), NUL(OFFS), NUL(TABLE), 1, NUL(OUT), nullptr);
  };
  add("indices", INDICES, re);
  add("input_row_offsets", OFFS, re);
  add("lookup_table", TABLE, re);
  add("out", OUT, re);
  auto ix = [&](int null) {
    return mlajit_mla_indexer(indexer, NUL(Q), NUL(QS), NUL(OFFS), cache(null), 0, 1, NUL(OUT), NUL(WORKSPACE), nullptr);
  };
  add("q", Q, ix);
  add("qs", QS, ix);
  add("input_row_offsets", OFFS, ix);
  add("k_cache.blocks", BLOCKS, ix);
  add("k_cache.scales", SCALES, ix);
  add("k_cache.lookup_table", TABLE, ix);
  add("k_cache.cache_lengths", LENGTHS, ix);
  add("out", OUT, ix);
  add("workspace", WORKSPACE, ix);
  auto pf = [&](int null) {
    return mlajit_sparse_prefill(prefill, NUL(Q), cache(null), NUL(INDICES), NUL(TOPK), 0, 0.1f, NUL(SINK), NUL(OUT),
                                 NUL(LSE), nullptr);
  };
  add("q", Q, pf);
  add("kv.blocks", BLOCKS, pf);
  add("kv.scales", SCALES, pf);  // fp8 with group scales
  add("indices", INDICES, pf);
  add("topk_lengths", TOPK, pf);
  add("attn_sink", SINK, pf);  // params.attn_sink
  add("out", OUT, pf);
  add("lse", LSE, pf);  // params.emit_lse
  mlajit_op staged = make_op(
      R"({"op":"sparse_prefill","params":{"kv_dtype":"fp8_e4m3","quantization_granularity":64,"kv_staging":"bf16"}})");
  auto pw = [&](int null) {
    return mlajit_sparse_prefill_ws(staged, NUL(Q), cache(null), NUL(INDICES), NUL(TOPK), 0, 0.1f, nullptr, NUL(OUT),
                                    NUL(LSE), NUL(WORKSPACE), nullptr);
  };
  add("q", Q, pw);
  add("kv.scales", SCALES, pw);
  add("workspace", WORKSPACE, pw);  // params.kv_staging bf16
  expect_named(cases);
  // The entry point without a workspace refuses a staged op, pointing at the one with it.
  CHECK(mlajit_sparse_prefill(staged, &t, cache(-1), &t, &t, 0, 0.1f, nullptr, &t, &t, nullptr) ==
        MLAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(mlajit_last_error()).find("mlajit_sparse_prefill_ws") != std::string::npos);
  // The staged op's workspace size; NULL for the result is refused.
  size_t bytes = 0;
  CHECK(mlajit_sparse_prefill_workspace_bytes(staged, 3, &bytes) == MLAJIT_OK);
  constexpr size_t kSlots = 256 * 64 * 514 * 4;  // the tail split's partial slots after the staged part
  CHECK(bytes == (3 * 64 * 1152 + 16 + 255) / 256 * 256 + kSlots);
  CHECK(mlajit_sparse_prefill_workspace_bytes(prefill, 3, &bytes) == MLAJIT_OK);
  CHECK(bytes == kSlots);  // the fused fp8 kernel (one item per CTA): its split's partial slots
  CHECK(mlajit_sparse_prefill_workspace_bytes(staged, 3, nullptr) == MLAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(mlajit_last_error()).find("bytes") != std::string::npos);
  mlajit_op_destroy(staged);

  // Optional arguments may be NULL: the call then fails on the (placeholder) tensors, not on them.
  static float dummy;
  mlajit_tensor given{&dummy, MLAJIT_F32, 1, {1}, {0}};
  mlajit_paged_cache c{&given, &given, &given, &given};
  CHECK(mlajit_kv_cache_store(store, &given, &given, &c, 0, 0, /*dropped=*/nullptr, nullptr) != MLAJIT_OK);
  CHECK(std::string(mlajit_last_error()).find("no tensor given") == std::string::npos);
  // A zero-filled mlajit_tensor (no data, no dims) is reported the same way as NULL.
  CHECK(mlajit_kv_cache_store(store, &t, &given, &c, 0, 0, nullptr, nullptr) == MLAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(mlajit_last_error()).find("x: no tensor given") == 0);

  for (mlajit_op op : {store, gather, remap, indexer, prefill}) mlajit_op_destroy(op);
}

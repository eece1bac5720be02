// `mlajit bench --shape`: regression cases of the fuzzer (tests/fuzz/fuzz_shape.cpp).
#include <doctest/doctest.h>

#include <string>

#include "cli/shape_arg.hpp"
#include "mlajit/error.hpp"

using namespace mlajit;
using cli::ShapeArg;

namespace {
std::string refusal(const std::string& text, const char* key) {
  try {
    ShapeArg s(text);
    int v = 0;
    s.take_int(key, v);
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}
}  // namespace

TEST_CASE("--shape integers: digits only, no wrap-around into an int") {
  ShapeArg s("top_k=65536,heads=007,tokens=9000000000");
  int top_k = 0, heads = 0;
  int64_t tokens = 0;
  s.take_int("top_k", top_k);
  s.take_int("heads", heads);
  s.take_int("tokens", tokens);
  CHECK(top_k == 65536);
  CHECK(heads == 7);
  CHECK(tokens == 9000000000LL);
  s.done("op");
  // Each of these was accepted before (std::stoll + a cast to int): wrapped or not what was typed.
  for (const char* bad : {"heads=4294967295", "heads=2147483648", "heads= 5", "heads=+5", "heads=-0", "heads=",
                          "heads=1e3", "heads=99999999999999999999"}) {
    CAPTURE(bad);
    std::string why = refusal(bad, "heads");
    CHECK(why.find("--shape heads") != std::string::npos);
    CHECK(why.find("non-negative integer <= 2147483647") != std::string::npos);
  }
  CHECK(refusal("heads=2147483647", "heads").empty());
  // Found by fuzz_shape: 19 nines overflowed the digit loop itself (signed overflow, UBSan).
  ShapeArg wide("tokens=9999999999999999999,keys=9223372036854775807");
  int64_t q = 0, kv = 0;
  CHECK_THROWS_WITH_AS(wide.take_int("tokens", q), doctest::Contains("--shape tokens"), Error);
  wide.take_int("keys", kv);
  CHECK(kv == INT64_MAX);
}

TEST_CASE("--shape: repeated and leftover keys are refused") {
  CHECK_THROWS_WITH_AS(ShapeArg("heads=1,heads=2"), doctest::Contains("each key at most once"), Error);
  CHECK_THROWS_WITH_AS(ShapeArg("heads"), doctest::Contains("key=value"), Error);
  ShapeArg s("heads=1,typo=2");
  int h = 0;
  s.take_int("heads", h);
  CHECK_THROWS_WITH_AS(s.done("mla_indexer"), doctest::Contains("typo"), Error);
}

TEST_CASE("--shape: one spelling per key; a renamed key is refused with its new name") {
  for (const char* text : {"topk=2048", "s_q=4096", "s_kv=32768", "new_tokens=4096", "cached_tokens=100",
                           "granularity=64", "scale_block_size=64"}) {
    CAPTURE(text);
    ShapeArg s(text);
    int64_t v = 0;
    for (const char* key : {"tokens", "keys", "top_k", "quantization_granularity"}) s.take_int(key, v);
    try {
      s.done("sparse_prefill");
      FAIL("accepted ", text);
    } catch (const Error& e) {
      const std::string what = e.what();
      CHECK(what.find("--shape key for sparse_prefill: got ") == 0);
      CHECK(what.find(" is now \"") != std::string::npos);
    }
  }
  ShapeArg q("scale_block_size=576");
  CHECK_THROWS_WITH_AS(q.done("sparse_prefill"), doctest::Contains("\"scale_block_size\" is now \"quantization_granularity\""),
                       Error);
}

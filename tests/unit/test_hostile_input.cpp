// Hostile input to the library's readers: files that are not regular files or are too large,
// JSON nested beyond the limit, duplicate keys, out-of-range numbers, NUL bytes in strings, lock
// files left by writers that died, tensor views whose byte size overflows. Each must be refused
// quickly with a bounded message naming what was wrong (never a hang, a crash or a silent accept).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/input.hpp"
#include "invalid_message.hpp"
#include "jit/lock_files.hpp"
#include "mlajit/autotune.hpp"
#include "mlajit/c_api.h"
#include "mlajit/cache.hpp"
#include "mlajit/kernel_set.hpp"
#include "mlajit/params.hpp"
#include "mlajit/tensor.hpp"
#include "temp_dir.hpp"

namespace fs = std::filesystem;
using mlajit::testing::TempDir;
using nlohmann::json;

namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string write_file(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

// `{"op":"sparse_index_remap","params":{"page_size":[[[...1...]]]}}` with `depth` brackets.
std::string deep_spec(size_t depth) {
  return R"({"op":"sparse_index_remap","params":{"page_size":)" + std::string(depth, '[') + "1" +
         std::string(depth, ']') + "}}";
}

// The message of the error `f` throws ("" when none), any kind.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const mlajit::Error& e) {
    return e.what();
  }
  return "";
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("input files: regular files only, bounded, a FIFO or device refused without blocking") {
  TempDir dir("hostile_files");
  const std::string fifo = (dir.path / "fifo.json").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // No writer ever opens the FIFO: a blocking open would hang here (the suite's timeout fails it).
  auto t0 = std::chrono::steady_clock::now();
  std::string msg = invalid_message([&] { mlajit::load_kernel_set(fifo); });
  CHECK(seconds_since(t0) < 2.0);
  CHECK(has(msg, "config file " + fifo + ": got a FIFO (named pipe), expected a regular file"));
  msg = invalid_message([&] { mlajit::read_input_file(fifo, "cache archive", 1 << 20); });
  CHECK(has(msg, "FIFO"));
  // What is handed to another loader (a bench anchor to dlopen) is checked by stat alone.
  msg = invalid_message([&] { mlajit::require_regular_file(fifo, "--anchor"); });
  CHECK(has(msg, "--anchor " + fifo + ": got a FIFO (named pipe), expected a regular file"));
  msg = invalid_message([&] { mlajit::require_regular_file(dir.str(), "--anchor"); });
  CHECK(has(msg, "got a directory"));

  // A directory is named as one (it used to read as "unexpected end of input").
  msg = invalid_message([&] { mlajit::load_kernel_set(dir.str()); });
  CHECK(has(msg, "got a directory, expected a regular file"));

  // /dev/zero is read without limit by a plain stream; refused as a device, nothing read.
  msg = invalid_message([&] { mlajit::load_kernel_set("/dev/zero"); });
  CHECK(has(msg, "got a character device, expected a regular file"));

  // The size cap, with the size and the cap in the message.
  const std::string big = write_file(dir.path / "big.json", std::string(100, ' ') + "{}");
  msg = invalid_message([&] { mlajit::read_input_file(big, "config file", 64); });
  CHECK(has(msg, "got 102 bytes, expected at most 64 bytes"));
  CHECK(mlajit::read_input_file(big, "config file", 102).size() == 102);

  msg = invalid_message([&] { mlajit::load_kernel_set((dir.path / "missing.json").string()); });
  CHECK(has(msg, "cannot be opened (No such file or directory)"));

  // The tuning database: a FIFO at its path is a corrupt file (reported, ignored), not a hang.
  const std::string db_fifo = (dir.path / "tuning.json").string();
  REQUIRE(::mkfifo(db_fifo.c_str(), 0600) == 0);
  bool corrupt = false;
  t0 = std::chrono::steady_clock::now();
  CHECK(mlajit::autotune::TuningDb(db_fifo).load(&corrupt).empty());
  CHECK(corrupt);
  CHECK(seconds_since(t0) < 2.0);
}

TEST_CASE("JSON nesting: refused beyond the limit while parsing, with a bounded message (100,000 deep)") {
  // At the limit: accepted by the parser (the params check then refuses the array as a page size).
  CHECK_NOTHROW(mlajit::parse_json_input(std::string(mlajit::kMaxJsonDepth, '[') + std::string(mlajit::kMaxJsonDepth, ']'),
                                         "test", "v"));
  std::string msg = invalid_message([] {
    mlajit::parse_json_input(std::string(mlajit::kMaxJsonDepth + 1, '[') + std::string(mlajit::kMaxJsonDepth + 1, ']'),
                             "test", "v");
  });
  CHECK(has(msg, "more than 64 nested arrays/objects, expected at most 64 levels of nesting"));

  // Deep inside params: the value that used to be dumped recursively into the message (a stack
  // overflow at 70,000 levels, a 100 KB message at 50,000).
  for (size_t depth : {size_t{66}, size_t{50000}, size_t{100000}}) {
    CAPTURE(depth);
    msg = invalid_message([&] { mlajit::parse_json_input(deep_spec(depth), "spec_json", "spec"); });
    CHECK(has(msg, "spec_json at spec.params.page_size[0][0]"));
    CHECK(has(msg, "more than 64 nested"));
    CHECK(msg.size() < 600);
  }
  // A config file: the same, through load_kernel_set.
  TempDir dir("hostile_nesting");
  const std::string cfg = write_file(dir.path / "deep.json", R"({"arch":"sm_90a","kernels":[)" + deep_spec(100000) + "]}");
  msg = invalid_message([&] { mlajit::load_kernel_set(cfg); });
  CHECK(has(msg, "config.kernels[0].params.page_size"));
  CHECK(msg.size() < 600);

  // The C API: mlajit_op_create with the 100,000-deep spec.
  mlajit_op op = nullptr;
  CHECK(mlajit_op_create(deep_spec(100000).c_str(), &op) == MLAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(op == nullptr);
  msg = mlajit_last_error();
  CHECK(has(msg, "more than 64 nested"));
  CHECK(msg.size() < 600);
  // Within the limit, the offending value is quoted as a bounded excerpt (it was dumped whole).
  CHECK(mlajit_op_create(deep_spec(60).c_str(), &op) == MLAJIT_ERROR_INVALID_ARGUMENT);
  msg = mlajit_last_error();
  CHECK(has(msg, "spec.params.page_size: got [[[["));
  CHECK(msg.size() < 600);
  // A spec text over the C API's size cap.
  const std::string huge = R"({"op":"sparse_index_remap","params":{},"x":")" + std::string(2 << 20, 'a') + "\"}";
  CHECK(mlajit_op_create(huge.c_str(), &op) == MLAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(has(mlajit_last_error(), "spec_json: got more than 1048576 bytes"));

  // A value built in code (not parsed) that nests beyond the limit: refused before any recursive walk.
  json root = json::array();
  json* cur = &root;
  for (int i = 0; i < 100000; ++i) {
    cur->push_back(json::array());
    cur = &(*cur)[0];
  }
  json spec = {{"op", "sparse_index_remap"}, {"params", json::object()}};
  spec["params"]["page_size"] = std::move(root);
  msg = invalid_message([&] { mlajit::kernel_spec_from_json(spec, "spec"); });
  CHECK(has(msg, "more than 64 nested"));
  msg = invalid_message([&] { mlajit::kernel_set_from_json({{"arch", "sm_90a"}, {"kernels", {spec}}}); });
  CHECK(has(msg, "more than 64 nested"));
}

TEST_CASE("bounded excerpts: iterative, cut at about 200 characters, control characters escaped") {
  json deep = json::array();
  json* cur = &deep;
  for (int i = 0; i < 100000; ++i) {
    cur->push_back(json::array());
    cur = &(*cur)[0];
  }
  std::string e = mlajit::json_excerpt(deep);  // no recursion: 100,000 levels are safe
  CHECK(e.size() == mlajit::kMaxExcerptChars + 3);
  CHECK(e.substr(e.size() - 3) == "...");
  CHECK(mlajit::json_excerpt(json::parse(R"({"a":[1,"x",{"b":null}]})")) == R"({"a":[1,"x",{"b":null}]})");
  CHECK(mlajit::json_quoted(std::string("a\0b", 3)) == R"("a\u0000b")");
  CHECK(has(mlajit::json_quoted(std::string(1000, 'x')), "... (1000 bytes)"));
  CHECK(mlajit::json_quoted("\xff") == "\"\\ufffd\"");  // invalid UTF-8 replaced, not thrown
}

TEST_CASE("duplicate keys are errors naming the key and its JSON path (configs, specs, tuning files)") {
  std::string msg = invalid_message([] {
    mlajit::parse_json_input(R"({"op":"sparse_index_remap","params":{"page_size":64,"page_size":32}})", "spec_json",
                             "spec");
  });
  CHECK(has(msg, "spec_json at spec.params: got the key \"page_size\" twice, expected each key at most once"));

  TempDir dir("hostile_dup");
  const std::string cfg = write_file(
      dir.path / "dup.json",
      R"({"arch":"sm_90a","kernels":[{"op":"sparse_index_remap","params":{}},{"op":"sparse_index_remap","params":{"page_size":64,"page_size":32}}]})");
  msg = invalid_message([&] { mlajit::load_kernel_set(cfg); });
  CHECK(has(msg, "config.kernels[1].params: got the key \"page_size\" twice"));
  // Top level, and a key with characters that are not an identifier (quoted, escaped).
  msg = invalid_message([] { mlajit::parse_json_input(R"({"arch":"a","arch":"b"})", "config", "config"); });
  CHECK(has(msg, "config at config: got the key \"arch\" twice"));
  msg = invalid_message([] { mlajit::parse_json_input(R"({"a b":{"k\u0000":1,"k\u0000":2}})", "config", "config"); });
  CHECK(has(msg, "config at config[\"a b\"]: got the key \"k\\u0000\" twice"));
  // Same key in different objects is fine.
  CHECK_NOTHROW(mlajit::parse_json_input(R"([{"a":1},{"a":2},{"b":{"a":3}}])", "config", "config"));

  // The C API.
  mlajit_op op = nullptr;
  CHECK(mlajit_op_create(R"({"op":"sparse_index_remap","op":"kv_cache_store"})", &op) == MLAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(has(mlajit_last_error(), "got the key \"op\" twice"));

  // A tuning file with a duplicate key is corrupt (ignored, kept aside by the next merge), saying why.
  const std::string ok_db = write_file(dir.path / "ok.json", R"({"format":"mlajit-tuning","records":[]})");
  bool corrupt = true;
  CHECK(mlajit::autotune::TuningDb(ok_db).load(&corrupt).empty());
  CHECK_FALSE(corrupt);
  const std::string db =
      write_file(dir.path / "tuning.json", R"({"format":"mlajit-tuning","records":[],"records":[]})");
  CHECK(mlajit::autotune::TuningDb(db).load(&corrupt).empty());
  CHECK(corrupt);
}

TEST_CASE("numbers out of range are quoted as written, with the allowed range; NUL bytes do not cut messages") {
  std::string msg = invalid_message(
      [] { mlajit::kernel_spec_from_json(json::parse(R"({"op":"sparse_index_remap","params":{"page_size":9223372036854775808}})"), "spec"); });
  CHECK(has(msg, "spec.params.page_size: got 9223372036854775808, expected an integer in [-2147483648, 2147483647]"));
  CHECK_FALSE(has(msg, "-9223372036854775808"));
  msg = invalid_message(
      [] { mlajit::kernel_spec_from_json(json::parse(R"({"op":"sparse_index_remap","params":{"page_size":2147483648}})"), "spec"); });
  CHECK(has(msg, "got 2147483648, expected an integer in [-2147483648, 2147483647]"));
  msg = invalid_message(
      [] { mlajit::kernel_spec_from_json(json::parse(R"({"op":"sparse_index_remap","params":{"page_size":-2147483649}})"), "spec"); });
  CHECK(has(msg, "got -2147483649"));

  // A NUL inside a string: escaped, so the C API's message goes on after it.
  mlajit_op op = nullptr;
  CHECK(mlajit_op_create(R"({"op":"sparse\u0000index_remap"})", &op) == MLAJIT_ERROR_INVALID_ARGUMENT);
  msg = mlajit_last_error();
  CHECK(has(msg, R"(spec.op: got "sparse\u0000index_remap", expected )"));
  CHECK(mlajit_op_create(R"({"op":"sparse_index_remap","params":{"x\u0000y":1}})", &op) == MLAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(has(mlajit_last_error(), R"(unknown field "x\u0000y")"));
}

TEST_CASE("C API: tensor views whose byte size overflows (or exceeds any address space) are refused, named") {
  mlajit_op store = nullptr;
  REQUIRE(mlajit_op_create(R"({"op":"kv_cache_store","params":{"dtype":"bf16","head_size":576,"num_layers":61}})",
                           &store) == MLAJIT_OK);
  alignas(16) static char buf[64];
  mlajit_tensor x{buf, MLAJIT_BF16, 3, {1, 1, 576}, {}};
  mlajit_tensor offs{buf, MLAJIT_U32, 1, {2}, {}};
  mlajit_tensor lut{buf, MLAJIT_U32, 2, {1, 1}, {}};
  mlajit_tensor lens{buf, MLAJIT_U32, 1, {1}, {}};
  for (int64_t dim0 : {int64_t{1} << 62, int64_t{1} << 40}) {
    CAPTURE(dim0);
    mlajit_tensor blocks{buf, MLAJIT_BF16, 6, {dim0, 1, 61, 64, 1, 576}, {}};
    mlajit_paged_cache cache{&blocks, nullptr, &lut, &lens};
    CHECK(mlajit_kv_cache_store(store, &x, &offs, &cache, 0, 0, nullptr, nullptr) == MLAJIT_ERROR_INVALID_ARGUMENT);
    const std::string msg = mlajit_last_error();
    CHECK(has(msg, "cache.blocks.shape: got shape [" + std::to_string(dim0) + ", 1, 61, 64, 1, 576] of bf16"));
    CHECK(has(msg, "expected a tensor of at most 2^57 bytes"));
  }
  // Strides whose last element's offset wraps.
  mlajit_tensor strided{buf, MLAJIT_BF16, 3, {2, 1, 576}, {int64_t{1} << 62, 576, 1}};
  mlajit_tensor blocks{buf, MLAJIT_BF16, 6, {1, 1, 61, 64, 1, 576}, {}};
  mlajit_paged_cache cache{&blocks, nullptr, &lut, &lens};
  CHECK(mlajit_kv_cache_store(store, &strided, &offs, &cache, 0, 0, nullptr, nullptr) == MLAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(has(mlajit_last_error(), "x.strides: got shape [2, 1, 576]"));
  mlajit_op_destroy(store);

  // The C++ view: the same bound, naming the dim.
  std::string msg = invalid_message([] { mlajit::TensorView(nullptr, mlajit::DType::f32, {int64_t{1} << 62, 4}); });
  CHECK(has(msg, "tensor dim 0: got 4611686018427387904"));
  CHECK_NOTHROW(mlajit::TensorView(nullptr, mlajit::DType::f32, {int64_t{1} << 40, 4}));
}

TEST_CASE("orphaned lock files (entry missing, no holder): verify lists them, verify --remove and the next writer remove them") {
  TempDir dir("hostile_locks");
  const std::string k1(64, 'a'), k2(64, 'b'), k3(64, 'c'), k4(64, 'd');
  auto lock_path = [&](const std::string& k) { return (dir.path / (k + ".lock")).string(); };
  auto orphan = [&](const std::string& k) {
    write_file(lock_path(k), "");
    struct timespec old[2] = {{1000, 0}, {1000, 0}};  // older than the 2 s a live writer needs to flock
    REQUIRE(::utimensat(AT_FDCWD, lock_path(k).c_str(), old, 0) == 0);
  };
  mlajit::DiskCache cache(dir.str());
  orphan(k1);
  orphan(k2);
  write_file(lock_path(k3), "");  // fresh: a live writer may be between open and flock
  orphan(k4);
  const int held = ::open(lock_path(k4).c_str(), O_RDWR);  // k4's lock is held by a live writer
  REQUIRE(::flock(held, LOCK_EX | LOCK_NB) == 0);

  CHECK(mlajit::orphaned_lock_files(cache, /*remove=*/false).size() == 2);
  cache.verify(/*remove_corrupt=*/false);
  CHECK(fs::exists(lock_path(k1)));
  CHECK(mlajit::orphaned_lock_files(cache, /*remove=*/false).size() == 2);
  cache.verify(/*remove_corrupt=*/true);  // verify with removal removes them
  CHECK(mlajit::orphaned_lock_files(cache, /*remove=*/false).empty());
  CHECK_FALSE(fs::exists(lock_path(k1)));
  CHECK_FALSE(fs::exists(lock_path(k2)));
  CHECK(fs::exists(lock_path(k3)));  // too young
  CHECK(fs::exists(lock_path(k4)));  // held: never removed
  ::close(held);

  // The first writer of a process in the directory (here: a lock taken for another key) removes them.
  TempDir dir2("hostile_locks2");
  write_file(dir2.path / (k1 + ".lock"), "");
  struct timespec old[2] = {{1000, 0}, {1000, 0}};
  REQUIRE(::utimensat(AT_FDCWD, (dir2.path / (k1 + ".lock")).c_str(), old, 0) == 0);
  mlajit::DiskCache cache2(dir2.str());
  {
    mlajit::DiskCache::KeyLock lock(cache2, k2);
    CHECK(lock.locked());
  }
  CHECK_FALSE(fs::exists(dir2.path / (k1 + ".lock")));
  CHECK(fs::exists(dir2.path / (k2 + ".lock")));  // its own lock stays (as after every build)
}

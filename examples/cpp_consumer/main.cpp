// Uses the installed package from C++: the C API and the C++ spec parser, both without a GPU.
// Exits nonzero on any mismatch (run by scripts/test_install.sh).
#include <cstdio>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "mlajit/c_api.h"
#include "mlajit/error.hpp"
#include "mlajit/params.hpp"

int main() {
  const char* spec = R"({"op":"sparse_index_remap","params":{"page_size":64}})";
  mlajit_op op = nullptr;
  if (mlajit_op_create(spec, &op) != MLAJIT_OK) {
    std::fprintf(stderr, "create failed: %s\n", mlajit_last_error());
    return 1;
  }
  auto described = nlohmann::json::parse(mlajit_op_describe(op));
  mlajit_op_destroy(op);
  if (described["op"] != "sparse_index_remap") return 1;

  // The C++ API: a bad spec throws mlajit::Error naming the field.
  try {
    (void)mlajit::kernel_spec_from_json(nlohmann::json::parse(R"({"op":"sparse_index_remap","params":{"page_size":-1}})"));
    std::fprintf(stderr, "expected an error\n");
    return 1;
  } catch (const mlajit::Error& e) {
    if (std::strstr(e.what(), "page_size") == nullptr) return 1;
    std::printf("mlajit %s: described %s; error as expected: %s\n", mlajit_version(), described.dump().c_str(), e.what());
  }
  return 0;
}

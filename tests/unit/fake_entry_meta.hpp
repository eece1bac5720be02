#pragma once
// Metadata of a small fake cache entry (sparse_index_remap, one entry point, sm_90a, no shared
// memory) that the cache trust and cache layer tests store and read back.
#include <string>

#include "mlajit/cache.hpp"

namespace mlajit::testing {

inline CacheEntryMeta fake_entry_meta(const std::string& name) {
  CacheEntryMeta m;
  m.name = name;
  m.op = "sparse_index_remap";
  m.params_json = R"({"page_size":64,"threads":256})";
  m.entries = {{"mj_entry", 256, 0}};
  m.arch = "sm_90a";
  m.nvrtc_version = "13.0 (test)";
  return m;
}

}  // namespace mlajit::testing

#pragma once
// Checks and enum names shared by the ops' params validation (src/ops/<family>/definition.cpp).
#include <string>

#include "mlajit/params.hpp"

namespace mlajit {

bool is_pow2(int x);
// threads: 0 (auto) or a multiple of 32 in [32, 1024].
void check_threads(int threads, const std::string& field);
// page_size: a power of two in [1, 4096].
void check_page_size(int page_size, const std::string& field);

const char* scale_fmt_name(ScaleFmt f);
const char* cache_layout_name(CacheLayout l);
const char* mask_name(Mask m);
const char* emit_name(IndexEmit e);
// "bf16" | "fp8" (the JSON spelling); anything else is an Error naming `field` and the choices.
QkMath parse_qk_math(const std::string& name, const std::string& field);
KvStaging parse_kv_staging(const std::string& name, const std::string& field);
CacheLayout parse_cache_layout(const std::string& name, const std::string& field);
ScaleFmt parse_scale_fmt(const std::string& name, const std::string& field);

// A default-constructed params struct of `op` (the variant alternative of index `op`).
OpParams default_params(Op op);

}  // namespace mlajit

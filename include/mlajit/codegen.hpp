#pragma once
// Codegen: KernelSpec -> KernelSource. Fills a template from templates/ with the params as
// constexpr values / template arguments and emits a small translation unit with one
// `extern "C" __global__` entry per kernel. Deterministic: the same spec gives the same bytes.
// The source starts with a comment holding the op and its params.
//
// Kernel ABI: every entry takes exactly one argument, a by-value struct declared in a
// templates/*_args.h header that the host code includes too, so both sides share one layout.
#include <string>
#include <vector>

#include "mlajit/params.hpp"

namespace mlajit {

struct EntryPoint {
  std::string symbol;       // extern "C" name in the module
  unsigned threads = 0;     // threads per block the entry is compiled for (__launch_bounds__)
  unsigned smem_bytes = 0;  // dynamic shared memory it needs at launch (0 if none)
  int unit = 0;             // the compile unit holding it (KernelSource::compile_units)
};

struct KernelSource {
  KernelSpec spec;
  std::string name;                 // human-readable, from spec.name()
  std::string code;                 // the generated translation unit
  std::vector<EntryPoint> entries;  // in the order the op's host code indexes them
  std::string min_arch;             // lowest target it compiles for, e.g. "sm_80" or "sm_90a"
  std::string min_arch_why;         // why, when the spec itself demands it (e.g. "qk_math fp8 ..."): part
                                    // of the error a lower target gets; "" = the generic message
  // NVRTC options this kernel is compiled with on top of the compiler's fixed set (e.g. a ptxas
  // setting measured faster for it), placed before MLAJIT_NVRTC_EXTRA_OPTIONS so that the knob can
  // still override them. Part of the cache key; the generator also names them in the source header.
  std::vector<std::string> nvrtc_options;
  // NVRTC programs the source compiles as, in parallel (1: one). Unit u is `code` with MLAJIT_UNIT
  // defined to u; the generator guards each entry with `#if !defined(MLAJIT_UNIT) || MLAJIT_UNIT ==
  // u`, so a unit instantiates only its own entries' templates and compiles in its own kernels'
  // time. The units' cubins travel as one module image (src/jit/module_image.hpp): one cache entry
  // per kernel, loaded as one module per unit. Part of the cache key when > 1.
  int compile_units = 1;
};

// Validates the spec and generates its source. Throws Error(InvalidArgument) for a bad spec.
KernelSource generate(const KernelSpec& spec);

// Header comment every generated source starts with.
std::string source_header(const KernelSpec& spec);

// The kernel templates: embedded in the library at build time; MLAJIT_TEMPLATE_DIR (or
// set_template_dir) points at a source folder instead, for development.
struct TemplateFile {
  std::string path;     // relative, e.g. "kv_cache/kv_cache.cuh", "common/convert.cuh"
  std::string content;
};
const std::vector<TemplateFile>& templates();
// Switches the template source to the files under `dir` (*.cuh, *.h, recursively); an empty
// string switches back to the embedded copies. Earlier TemplateFile pointers stay valid.
void set_template_dir(const std::string& dir);
// The template at `path` (e.g. "common/convert.cuh"), or nullptr.
const TemplateFile* find_template(const std::string& path);
// The templates `code` includes (by `#include "..."`), transitively, sorted by path.
std::vector<const TemplateFile*> included_templates(const std::string& code);
// `code` with every template include expanded in place (a self-contained file for nvcc / dumps).
std::string expand_includes(const std::string& code);

}  // namespace mlajit

// The build pipeline after codegen: key -> disk cache -> remote cache -> NVRTC -> disk + remote
// (include/mlajit/build.hpp, jit/build_source.hpp).
#include "jit/build_source.hpp"
#include "mlajit/build.hpp"

#include <chrono>
#include <ctime>

#include <nlohmann/json.hpp>

#include "jit/remote_cache.hpp"
#include "mlajit/cache.hpp"
#include "mlajit/codegen.hpp"
#include "mlajit/compiler.hpp"
#include "mlajit/error.hpp"
#include "mlajit/log.hpp"
#include "mlajit/version.hpp"

namespace mlajit {

namespace {

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

BuiltKernel from_entry(CacheEntry&& e, const KernelSource& src, const std::string& arch) {
  BuiltKernel b;
  b.result.name = src.name;
  b.result.key = e.key;
  b.result.arch = arch;
  b.result.cache_hit = true;
  b.result.cubin_bytes = e.cubin.size();
  b.cubin = std::move(e.cubin);
  return b;
}

}  // namespace

BuiltKernel build_source(const KernelSource& src, const std::string& arch, DiskCache* cache, RemoteCache* remote) {
  auto t0 = std::chrono::steady_clock::now();
  Compiler& compiler = Compiler::global();
  auto options = compiler.options(arch);  // validates arch
  // Before any cache lookup: a kernel the target cannot run is never built, stored or loaded.
  if (!arch_satisfies(arch, src.min_arch))
    throw_invalid(fmt::format("target arch of {}", src.name), arch,
                  fmt::format("{} or compatible{}", src.min_arch, src.min_arch_why.empty() ? "" : " (" + src.min_arch_why + ")"));

  std::string nvrtc_why;
  if (!Compiler::available(&nvrtc_why)) {
    // No NVRTC: a warm cache still works, through the NVRTC-independent base key.
    if (cache) {
      if (auto e = cache->find_by_base_key(cache_base_key(src, arch, options))) {
        log::info("NVRTC unavailable; using cached {} built by NVRTC {}", src.name, e->meta.nvrtc_version);
        auto b = from_entry(std::move(*e), src, arch);
        b.result.seconds = since(t0);
        return b;
      }
    }
    throw_error(ErrorKind::Compile, "cannot build {} for {}: not in the disk cache{}, and {}", src.name, arch,
                cache ? " (" + cache->dir() + ")" : std::string(" (disabled)"), nvrtc_why);
  }

  std::string key = cache_key(src, arch, options, compiler.nvrtc_key_version());
  if (cache) {
    if (auto e = cache->get(key)) {
      auto b = from_entry(std::move(*e), src, arch);
      b.result.seconds = since(t0);
      log::debug("disk hit {} {} ({:.3f} ms)", src.name, key, b.result.seconds * 1e3);
      return b;
    }
  }

  std::optional<DiskCache::KeyLock> lock;
  if (cache) {
    lock.emplace(*cache, key);
    // Another process (or thread) may have compiled it while we waited for the lock.
    if (auto e = cache->get(key)) {
      auto b = from_entry(std::move(*e), src, arch);
      b.result.seconds = since(t0);
      return b;
    }
  }

  if (remote) {
    // The fleet's copy: verified (signature, then every disk check) before anything uses it.
    if (auto e = remote->get(key)) {
      if (cache) {
        try {
          cache->put(key, e->meta, e->cubin);
        } catch (const Error& err) {
          log::warn("could not store {} from the remote cache in the disk cache: {}", src.name, err.what());
        }
      }
      auto b = from_entry(std::move(*e), src, arch);
      b.result.remote_hit = true;
      b.result.seconds = since(t0);
      log::debug("remote hit {} {} ({:.3f} ms)", src.name, key, b.result.seconds * 1e3);
      return b;
    }
  }

  CompiledKernel ck = compiler.compile(src, arch);
  if (cache || remote) {
    CacheEntryMeta meta;
    meta.name = src.name;
    meta.base_key = cache_base_key(src, arch, options);
    meta.op = std::string(op_name(src.spec.op()));
    meta.params_json = params_to_json(src.spec.params).dump();
    meta.entries = src.entries;
    meta.arch = arch;
    meta.min_arch = src.min_arch;
    meta.nvrtc_version = ck.stats.nvrtc_version;
    meta.compile_seconds = ck.stats.seconds;
    meta.mlajit_version = MLAJIT_VERSION_STRING;
    meta.created = static_cast<int64_t>(std::time(nullptr));
    if (cache) {
      try {
        cache->put(key, meta, ck.cubin);
      } catch (const Error& e) {
        // The kernel is fine; only the next process pays for the compile again.
        log::warn("could not store {} in the disk cache: {}", src.name, e.what());
      }
    }
    if (remote) remote->put(key, meta, ck.cubin);  // never throws; a failure was warned about
  }
  BuiltKernel b;
  b.result.name = src.name;
  b.result.key = key;
  b.result.arch = arch;
  b.result.cache_hit = false;
  b.result.compile_seconds = ck.stats.seconds;
  b.result.cubin_bytes = ck.cubin.size();
  b.cubin = std::move(ck.cubin);
  b.result.seconds = since(t0);
  return b;
}

BuildResult build_kernel(const KernelSpec& spec, const std::string& arch, DiskCache* cache, RemoteCache* remote) {
  auto t0 = std::chrono::steady_clock::now();
  validate_arch(arch);
  KernelSource src = generate(spec);
  BuildResult r = build_source(src, arch, cache ? cache : DiskCache::default_cache(),
                               remote ? remote : RemoteCache::global()).result;
  r.seconds = since(t0);
  return r;
}

}  // namespace mlajit

// Runtime on the GPU: launching through the memory cache, disk hit vs cold compile, launch
// overhead of a memory hit over raw cuLaunchKernel, single flight, the >48 KB smem opt-in.
#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <random>
#include <thread>

#include "gpu/gpu_util.hpp"
#include "jit/module_image.hpp"
#include "jit/build_source.hpp"
#include "mlajit/build.hpp"
#include "mlajit/cache.hpp"
#include "mlajit/compiler.hpp"
#include "mlajit/error.hpp"
#include "mlajit/runtime.hpp"
#include "unit/handwritten_kernel.hpp"

using namespace mlajit;
using namespace mlajit_test;
namespace fs = std::filesystem;

namespace {

// A string no earlier run produced, so that sources built with it miss every cache.
std::string fresh_tag() {
  static std::atomic<int> n{0};
  return "// run " + std::to_string(::getpid()) + "." + std::to_string(std::time(nullptr)) + "." + std::to_string(n++) + "\n";
}

struct TempCache {
  fs::path dir;
  std::shared_ptr<DiskCache> cache;
  TempCache() {
    dir = fs::temp_directory_path() / ("mlajit_gpu_cache_" + std::to_string(::getpid()) + fresh_tag().substr(8, 6));
    fs::remove_all(dir);
    cache = std::make_shared<DiskCache>(dir.string());
  }
  ~TempCache() { fs::remove_all(dir); }
};

RuntimeOptions axpy_runtime(std::shared_ptr<DiskCache> cache, const std::string& tag) {
  RuntimeOptions o;
  o.codegen = [tag](const KernelSpec& s) { return axpy_source(s, tag); };
  o.disk_cache = std::move(cache);
  o.disk_cache_enabled = o.disk_cache != nullptr;
  return o;
}

LaunchDims dims_for(unsigned n) {
  LaunchDims d;
  d.grid[0] = (n + 255) / 256;
  d.block[0] = 256;
  return d;
}

}  // namespace

TEST_CASE("runtime launches a hand-written kernel and computes it exactly") {
  TempCache tc;
  auto rt = Runtime::create(axpy_runtime(tc.cache, fresh_tag()));
  MESSAGE("device arch " << rt->arch() << ", " << rt->sm_count() << " SMs");
  const unsigned n = (1u << 20) + 7, guard = 64;
  std::mt19937 gen(7);
  std::normal_distribution<float> nd;
  std::vector<float> x(n + guard), y(n + guard);
  for (auto& v : x) v = nd(gen);
  for (auto& v : y) v = nd(gen);
  auto dx = upload(x), dy = upload(y);
  const float a = 1.75f;
  auto k = rt->get(axpy_spec(4));
  CHECK(k->source().entries.at(0).symbol == "mj_test_axpy");
  AxpyArgs args{dptr<float>(dx), dptr<float>(dy), a, n};
  k->launch(0, dims_for(n), nullptr, args);
  driver::synchronize();
  auto out = download<float>(dy, n + guard);
  size_t bad = 0;
  for (unsigned i = 0; i < n; ++i) {
    float want = std::fma(a, x[i], y[i] / 5.0f);
    float alt = a * x[i] + y[i] / 5.0f;  // in case the compiler did not contract
    if (out[i] != want && out[i] != alt) ++bad;
  }
  CHECK(bad == 0);
  for (unsigned i = n; i < n + guard; ++i) CHECK(out[i] == y[i]);  // nothing written past n

  // The same spec is a memory hit: the same object.
  CHECK(rt->get(axpy_spec(4)).get() == k.get());
  CHECK(rt->get(axpy_spec(8)).get() != k.get());
  CHECK(rt->cached_kernels() == 2);

  // Launch argument checks.
  CHECK_THROWS_AS(k->launch(1, dims_for(n), nullptr, args), Error);
  LaunchDims big = dims_for(n);
  big.block[0] = 512;  // compiled for 256
  CHECK_THROWS_AS(k->launch(0, big, nullptr, args), Error);
}

TEST_CASE("disk hit vs cold compile: time to a launchable kernel") {
  TempCache tc;
  std::string tag = fresh_tag();
  auto src = axpy_source(axpy_spec(16), tag);
  auto rt = Runtime::create(axpy_runtime(tc.cache, tag));
  auto t0 = std::chrono::steady_clock::now();
  auto cold = rt->load_source(src);
  double cold_ms = seconds_since(t0) * 1e3;
  std::vector<double> hit_ms;
  for (int i = 0; i < 9; ++i) {
    auto t1 = std::chrono::steady_clock::now();
    auto warm = rt->load_source(src);  // disk hit + module load (no memory cache on this path)
    hit_ms.push_back(seconds_since(t1) * 1e3);
    CHECK(warm->cache_key() == cold->cache_key());
  }
  std::sort(hit_ms.begin(), hit_ms.end());
  double hit = hit_ms[hit_ms.size() / 2];
  std::printf("[runtime] hand-written kernel: cold (NVRTC + put + load) %.2f ms, disk hit to launchable %.3f ms "
              "(median of 9; target <= 2 ms)\n", cold_ms, hit);
  CHECK(hit < cold_ms);

  // A fresh runtime (as after a process restart) finds it on disk through get().
  auto rt2 = Runtime::create(axpy_runtime(tc.cache, tag));
  auto before = Compiler::compile_count();
  auto t2 = std::chrono::steady_clock::now();
  auto k = rt2->get(axpy_spec(16));
  double get_ms = seconds_since(t2) * 1e3;
  CHECK(Compiler::compile_count() == before);
  std::printf("[runtime] fresh runtime get() from disk: %.3f ms (codegen + key + read + verify + module load)\n", get_ms);
}

TEST_CASE("cold compile of the real kernels that exist (printed)") {
  const KernelSpec specs[] = {KernelSpec{KvCacheStoreParams{}}, KernelSpec{KvCacheGatherParams{}},
                              KernelSpec{SparseIndexRemapParams{}}, KernelSpec{MlaIndexerParams{}},
                              KernelSpec{SparsePrefillParams{}}};
  std::string arch = Runtime::global().arch();
  for (auto& spec : specs) {
    KernelSource src;
    try {
      src = generate(spec);
    } catch (const Error& e) {
      std::printf("[runtime] %s: not available (%s)\n", spec.name().c_str(), e.what());
      continue;
    }
    if (!arch_satisfies(arch, src.min_arch)) continue;
    try {
      auto t0 = std::chrono::steady_clock::now();
      auto b = build_source(src, arch, nullptr);  // no disk cache: always a cold compile
      double total = seconds_since(t0);
      for (std::string_view unit : unpack_module_image(b.cubin)) driver::Module m{std::string(unit)};
      std::printf("[runtime] cold compile %s for %s: NVRTC %.3f s, total %.3f s, cubin %zu bytes (target <= 1 s)\n",
                  src.name.c_str(), arch.c_str(), b.result.compile_seconds, total, b.cubin.size());
    } catch (const Error& e) {
      std::printf("[runtime] %s: compile/load failed: %s\n", src.name.c_str(), e.what());
    }
  }
}

TEST_CASE("launch overhead of a memory hit over raw cuLaunchKernel (printed)") {
  auto rt = Runtime::create(axpy_runtime(nullptr, fresh_tag()));
  KernelSpec spec = axpy_spec(2);
  auto k = rt->get(spec);
  auto x = poisoned<float>(256), y = poisoned<float>(256);
  AxpyArgs args{dptr<float>(x), dptr<float>(y), 1.0f, 0u};  // n = 0: the kernel does nothing
  LaunchDims d;
  d.block[0] = 32;
  Stream s = driver::create_stream();
  driver::Function f = k->function(0);

  const int batch = 400;  // well below the launch queue depth, so no launch waits for the GPU
  auto measure = [&](auto&& launch_one) {
    std::vector<double> r;
    for (int rep = 0; rep < 15; ++rep) {
      driver::stream_synchronize(s);
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < batch; ++i) launch_one();
      r.push_back(seconds_since(t0) * 1e9 / batch);
    }
    driver::stream_synchronize(s);
    std::sort(r.begin(), r.end());
    return r[r.size() / 2];
  };
  auto raw = [&] { driver::launch_raw(f, d.grid, d.block, 0, s, &args); };
  auto ex = [&] { driver::launch(f, d.grid, d.block, 0, s, &args); };
  auto kernel_launch = [&] { k->launch(0, d, s, args); };
  auto get_and_launch = [&] { rt->get(spec)->launch(0, d, s, args); };
  for (int warm = 0; warm < 3; ++warm) {
    measure(raw);
    measure(get_and_launch);
  }
  double t_raw = 0, t_ex = 0, t_k = 0, t_get = 0;
  for (int round = 0; round < 3; ++round) {  // interleaved to cancel drift
    t_raw += measure(raw) / 3;
    t_ex += measure(ex) / 3;
    t_k += measure(kernel_launch) / 3;
    t_get += measure(get_and_launch) / 3;
  }
  double get_only = ns_per_call([&] { (void)rt->get(spec); }, 100000);
  std::printf("[runtime] per launch: raw cuLaunchKernel %.0f ns, cuLaunchKernelEx %.0f ns, Kernel::launch %.0f ns, "
              "Runtime::get + launch %.0f ns; get() memory hit alone %.0f ns; overhead over raw %.0f ns "
              "(target <= 1000 ns)\n", t_raw, t_ex, t_k, t_get, get_only, t_get - t_raw);
  CHECK(t_get - t_raw < 1000);
  driver::destroy_stream(s);
}

TEST_CASE("8 threads asking one spec of a runtime compile it once") {
  auto rt = Runtime::create(axpy_runtime(nullptr, fresh_tag()));  // no disk cache: only single flight dedups
  auto before = Compiler::compile_count();
  std::vector<std::shared_ptr<const Kernel>> got(8);
  std::vector<std::thread> ts;
  for (int t = 0; t < 8; ++t) ts.emplace_back([&, t] { got[t] = rt->get(axpy_spec(32)); });
  for (auto& th : ts) th.join();
  CHECK(Compiler::compile_count() - before == 1);
  for (auto& g : got) CHECK(g.get() == got[0].get());
}

TEST_CASE("an entry needing more than 48 KB of dynamic shared memory launches (opt-in at load)") {
  const unsigned smem = 96 * 1024;
  KernelSource src;
  src.spec = axpy_spec(1);
  src.name = "test_big_smem";
  src.min_arch = "sm_80";
  src.entries = {{"mj_test_big_smem", 128, smem}};
  src.code = fresh_tag() +
             "struct SmemArgs { float* out; unsigned words; };\n"
             "extern \"C\" __global__ void __launch_bounds__(128) mj_test_big_smem(SmemArgs a) {\n"
             "  extern __shared__ float buf[];\n"
             "  for (unsigned i = threadIdx.x; i < a.words; i += blockDim.x) buf[i] = float(i);\n"
             "  __syncthreads();\n"
             "  float s = 0.f;\n"
             "  for (unsigned i = threadIdx.x; i < a.words; i += blockDim.x) s += buf[a.words - 1 - i];\n"
             "  a.out[threadIdx.x] = s;\n"
             "}\n";
  auto rt = Runtime::create(axpy_runtime(nullptr, ""));
  auto k = rt->load_source(src);
  auto out = poisoned<float>(128);
  struct SmemArgs {
    float* out;
    unsigned words;
  } args{dptr<float>(out), smem / 4};
  LaunchDims d;
  d.block[0] = 128;
  d.smem_bytes = smem;
  k->launch(0, d, nullptr, args);
  driver::synchronize();
  auto h = download<float>(out, 128);
  double total = 0;
  for (float v : h) total += v;
  double words = smem / 4;
  CHECK(total == doctest::Approx(words * (words - 1) / 2).epsilon(1e-6));
}

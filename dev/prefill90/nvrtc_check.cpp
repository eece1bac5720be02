// Compiles the sm_90a sparse-prefill template the way the library does (NVRTC, no CUDA toolkit
// include path, options of src/compiler.cpp) to prove the template is NVRTC-clean, and writes the
// CUBIN for disassembly. Usage: nvrtc_check <templates dir> <out.cubin> [config args...]
// Build: g++ -std=c++17 -O1 -I<cuda>/include nvrtc_check.cpp -o nvrtc_check -L<cuda>/lib64 -lnvrtc
#include <nvrtc.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <templates dir> <out.cubin> [\"H, BT, fp8, SB, sink, lse, page, stages\"]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const std::string cfg = argc > 3 ? argv[3] : "128, 64, false, 0, true, true, 64, 2";
  const std::vector<std::string> names = {"sparse_prefill_sm90.cuh", "sparse_prefill_args.h", "common/types.cuh",
                                          "common/convert.cuh", "common/mbarrier.cuh", "common/row_gather.cuh",
                                          "common/smem_swizzle.cuh", "common/warpgroup.cuh", "common/wgmma.cuh"};
  std::vector<std::string> bodies;
  for (const auto& n : names) bodies.push_back(slurp(dir + "/" + n));
  std::vector<const char*> hn, hb;
  for (size_t i = 0; i < names.size(); ++i) hn.push_back(names[i].c_str()), hb.push_back(bodies[i].c_str());
  const std::string src = "#include \"sparse_prefill_sm90.cuh\"\n"
                          "using Cfg = mj::sparse_prefill_sm90::Config<" + cfg + ">;\n"
                          "extern \"C\" __global__ void __launch_bounds__(Cfg::kThreads, 1)\n"
                          "mlajit_sparse_prefill_sm90(const __grid_constant__ SparsePrefillArgs args) {\n"
                          "  mj::sparse_prefill_sm90::run<Cfg>(args);\n}\n";
  nvrtcProgram prog;
  if (nvrtcCreateProgram(&prog, src.c_str(), "sparse_prefill_sm90_check.cu", static_cast<int>(names.size()), hb.data(),
                         hn.data()) != NVRTC_SUCCESS)
    return 3;
  const char* opts[] = {"-std=c++17", "--gpu-architecture=sm_90a", "-default-device", "-DNDEBUG", "-Xptxas=-v"};
  const auto t0 = std::chrono::steady_clock::now();
  const nvrtcResult rc = nvrtcCompileProgram(prog, 5, opts);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  size_t n = 0;
  nvrtcGetProgramLogSize(prog, &n);
  std::string log(n, '\0');
  nvrtcGetProgramLog(prog, &log[0]);
  std::printf("nvrtc %s in %.2f s\n%s\n", rc == NVRTC_SUCCESS ? "OK" : nvrtcGetErrorString(rc), s, log.c_str());
  if (rc != NVRTC_SUCCESS) return 1;
  size_t cn = 0;
  nvrtcGetCUBINSize(prog, &cn);
  std::string cubin(cn, '\0');
  nvrtcGetCUBIN(prog, &cubin[0]);
  std::ofstream(argv[2], std::ios::binary).write(cubin.data(), static_cast<std::streamsize>(cn));
  nvrtcDestroyProgram(&prog);
  return 0;
}

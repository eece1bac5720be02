#pragma once
// The slice of the NVRTC C API mlajit uses, resolved with dlopen/dlsym at first use so that the
// library neither links libnvrtc nor needs nvrtc.h to build. Prototypes follow nvrtc.h (CUDA 12/13).
#include <cstddef>
#include <string>

namespace mlajit::nvrtc {

using Result = int;  // nvrtcResult; 0 = NVRTC_SUCCESS
constexpr Result kSuccess = 0;
constexpr Result kErrorCompilation = 6;
struct ProgramImpl;
using Program = ProgramImpl*;  // nvrtcProgram

struct Api {
  const char* (*GetErrorString)(Result);
  Result (*Version)(int* major, int* minor);
  Result (*CreateProgram)(Program* prog, const char* src, const char* name, int num_headers,
                          const char* const* headers, const char* const* include_names);
  Result (*DestroyProgram)(Program* prog);
  Result (*CompileProgram)(Program prog, int num_options, const char* const* options);
  Result (*GetPTXSize)(Program prog, size_t* size);
  Result (*GetPTX)(Program prog, char* ptx);
  Result (*GetCUBINSize)(Program prog, size_t* size);
  Result (*GetCUBIN)(Program prog, char* cubin);
  Result (*GetProgramLogSize)(Program prog, size_t* size);
  Result (*GetProgramLog)(Program prog, char* log);
  // NVRTC 12.8+ precompiled headers; null on older libraries.
  Result (*GetPCHCreateStatus)(Program prog) = nullptr;

  int major = 0, minor = 0;
  std::string library;  // the file that was loaded (real path)
};

// The loaded API, or nullptr with `why` explaining every place that was tried.
const Api* load(std::string* why = nullptr);

}  // namespace mlajit::nvrtc

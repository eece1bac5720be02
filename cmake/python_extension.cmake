# The Python package's C extension mlajit._fastcall (python/src/_fastcall.c): the eager launch path
# of mlajit.ops. It needs Python.h and include/mlajit/c_api.h only (no torch headers) and is built
# against Python's stable ABI, so one binary serves every CPython >= 3.8 and every torch version.
# It calls libmlajit through addresses the package passes at import, so it does not link it.
# Without Python development headers the package still works, through ctypes (slower per call).
# In the package build it is installed into the package; in the main build it is the on-demand
# target mlajit_fastcall (build/_fastcall.abi3.so), which scripts/gpu_validate.sh puts beside the
# package sources it tests.
enable_language(C)
find_package(Python 3.8 COMPONENTS Interpreter Development.Module)
if(NOT Python_Development.Module_FOUND)
  message(WARNING "Python development headers not found: mlajit._fastcall is not built; the package's "
                  "ops launch through ctypes (several microseconds more per call)")
  return()
endif()
set(fastcall_source ${CMAKE_CURRENT_LIST_DIR}/../python/src/_fastcall.c)
if(MLAJIT_PYTHON_PACKAGE)
  add_library(mlajit_fastcall MODULE ${fastcall_source})
  install(TARGETS mlajit_fastcall LIBRARY DESTINATION mlajit)
else()
  add_library(mlajit_fastcall MODULE EXCLUDE_FROM_ALL ${fastcall_source})
endif()
target_include_directories(mlajit_fastcall PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../include)
target_link_libraries(mlajit_fastcall PRIVATE Python::Module)
set_target_properties(mlajit_fastcall PROPERTIES OUTPUT_NAME _fastcall PREFIX "" SUFFIX ".abi3.so" C_STANDARD 11)

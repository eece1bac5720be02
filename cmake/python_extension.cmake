# The Python package's C extension mlajit._fastcall (python/src/_fastcall.c): the eager launch path
# of mlajit.ops. It needs Python.h and include/mlajit/c_api.h only (no torch headers) and is built
# against Python's stable ABI, so one binary serves every CPython >= 3.8 and every torch version.
# It calls libmlajit through addresses the package passes at import, so it does not link it.
# Without Python development headers the package still works, through ctypes (slower per call).
enable_language(C)
find_package(Python 3.8 COMPONENTS Interpreter Development.Module)
if(NOT Python_Development.Module_FOUND)
  message(WARNING "Python development headers not found: mlajit._fastcall is not built; the package's "
                  "ops launch through ctypes (several microseconds more per call)")
  return()
endif()
add_library(mlajit_fastcall MODULE ${CMAKE_CURRENT_LIST_DIR}/../python/src/_fastcall.c)
target_include_directories(mlajit_fastcall PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../include)
target_link_libraries(mlajit_fastcall PRIVATE Python::Module)
set_target_properties(mlajit_fastcall PROPERTIES OUTPUT_NAME _fastcall PREFIX "" SUFFIX ".abi3.so" C_STANDARD 11
                                                 C_VISIBILITY_PRESET hidden)
install(TARGETS mlajit_fastcall LIBRARY DESTINATION mlajit)

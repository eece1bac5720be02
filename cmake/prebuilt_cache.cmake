# The packaged read-only cache layer: the cubins of MLAJIT_PREBUILT_CONFIG (the default kernel set,
# examples/deepseek_v32.json) for MLAJIT_PREBUILT_ARCHS, compiled with NVRTC when the package is
# built (target mlajit_prebuilt_cache, part of `all`) and installed beside the library, where the
# runtime searches it after the user's own layers (config::prebuilt_cache_dir):
#   cmake --install: <prefix>/share/mlajit/prebuilt-cache     the wheel: mlajit/prebuilt-cache
# Where NVRTC is missing at build time the package is built without it and the build says so.
# The staging folder is not named prebuilt-cache, so a build tree itself has no packaged layer (its
# tests compile what they test).
# Included with MLAJIT_PREBUILT_CACHE_DEST set (the install destination); needs mlajit_static.
option(MLAJIT_PREBUILT_CACHE "Build and install the packaged cache layer of the default kernel set" ON)
set(MLAJIT_PREBUILT_CONFIG ${CMAKE_CURRENT_LIST_DIR}/../examples/deepseek_v32.json
    CACHE FILEPATH "Kernel set of the packaged cache layer")
set(MLAJIT_PREBUILT_ARCHS "sm_90a,sm_100a" CACHE STRING "Targets of the packaged cache layer (comma-separated)")
if(NOT MLAJIT_PREBUILT_CACHE)
  return()
endif()

add_executable(mlajit_prebuild_cache ${CMAKE_CURRENT_LIST_DIR}/../src/prebuild/prebuild_cache.cpp)
target_link_libraries(mlajit_prebuild_cache PRIVATE mlajit_static)
target_include_directories(mlajit_prebuild_cache PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../src)  # core/parallel.hpp
target_link_options(mlajit_prebuild_cache PRIVATE -static-libstdc++ -static-libgcc)

set(MLAJIT_PREBUILT_STAGE ${PROJECT_BINARY_DIR}/prebuilt-cache-stage)
add_custom_command(
  OUTPUT ${MLAJIT_PREBUILT_STAGE}.stamp
  COMMAND ${CMAKE_COMMAND} -DTOOL=$<TARGET_FILE:mlajit_prebuild_cache> -DCONFIG=${MLAJIT_PREBUILT_CONFIG}
          -DARCHS=${MLAJIT_PREBUILT_ARCHS} -DSTAGE=${MLAJIT_PREBUILT_STAGE} -P
          ${CMAKE_CURRENT_LIST_DIR}/prebuild_cache_run.cmake
  COMMAND ${CMAKE_COMMAND} -E touch ${MLAJIT_PREBUILT_STAGE}.stamp
  DEPENDS mlajit_prebuild_cache ${MLAJIT_PREBUILT_CONFIG} ${CMAKE_CURRENT_LIST_DIR}/prebuild_cache_run.cmake
  COMMENT "Packaged cache layer: compiling ${MLAJIT_PREBUILT_CONFIG} for ${MLAJIT_PREBUILT_ARCHS}"
  VERBATIM)
add_custom_target(mlajit_prebuilt_cache ALL DEPENDS ${MLAJIT_PREBUILT_STAGE}.stamp)
# Read-only for everyone but the owner (the layer rules refuse group- or world-writable layers).
install(DIRECTORY ${MLAJIT_PREBUILT_STAGE}/ DESTINATION ${MLAJIT_PREBUILT_CACHE_DEST} OPTIONAL
        DIRECTORY_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE
        FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)

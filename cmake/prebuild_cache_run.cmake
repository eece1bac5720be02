# cmake -DTOOL= -DCONFIG= -DARCHS= -DSTAGE= -P prebuild_cache_run.cmake: brings the staging folder
# of the packaged cache layer up to date (the tool keeps what is current and removes the rest). A
# failure (no NVRTC on this machine, most often) leaves no folder, so the package installs without
# the layer; the message says so.
execute_process(COMMAND ${CMAKE_COMMAND} -E env MLAJIT_PREBUILT_CACHE=off ${TOOL} ${CONFIG} ${STAGE} ${ARCHS}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  # The writer's per-key lock files: a read-only layer is never locked.
  file(GLOB locks ${STAGE}/*.lock)
  if(locks)
    file(REMOVE ${locks})
  endif()
  string(STRIP "${out}" out)
  message(STATUS "${out}")
else()
  file(REMOVE_RECURSE ${STAGE})
  string(STRIP "${err}" err)
  message(WARNING "mlajit: the package is built WITHOUT its packaged cache layer (the default kernels will "
                  "compile on first use): ${err}")
endif()

# `cmake --install build [--prefix P]`: headers, libmlajit (shared with SONAME libmlajit.so.0, and
# static), the `mlajit` CLI, a CMake package (find_package(mlajit CONFIG) -> mlajit::mlajit,
# mlajit::mlajit_static) and mlajit.pc. Consumers: examples/cpp_consumer, scripts/test_install.sh.
include(CMakePackageConfigHelpers)
set(MLAJIT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/mlajit)

install(TARGETS mlajit_shared mlajit_static EXPORT mlajitTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS mlajit_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/mlajit DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_BINARY_DIR}/generated/mlajit/version.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/mlajit)
install(EXPORT mlajitTargets NAMESPACE mlajit:: DESTINATION ${MLAJIT_CMAKE_DIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/mlajitConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/mlajitConfig.cmake INSTALL_DESTINATION ${MLAJIT_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/mlajitConfigVersion.cmake COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/mlajitConfig.cmake ${PROJECT_BINARY_DIR}/mlajitConfigVersion.cmake
        DESTINATION ${MLAJIT_CMAKE_DIR})

configure_file(${PROJECT_SOURCE_DIR}/cmake/mlajit.pc.in ${PROJECT_BINARY_DIR}/mlajit.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/mlajit.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

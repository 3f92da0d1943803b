# The installed CMake package (Note [The deploy package holds no Python]):
#
#   cmake --install build/py --component deploy --prefix PREFIX
#
# installs PREFIX/lib/libgraphex_core.a, PREFIX/include/graphex/ (headers and the generated
# program reader), PREFIX/bin/graphex-run and PREFIX/lib/cmake/graphex/ (find_package(graphex),
# target graphex::graphex). Every rule is EXCLUDE_FROM_ALL so the Python wheel (which installs
# everything else) does not carry them.
#
# Note [The deploy package holds no Python]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# graphex_core links torch alone: no Python headers, no pybind11 (those are in graphex._C,
# csrc/python/, which is not part of this package). tests/python/test_cmake_package.py builds a
# consumer that links graphex::graphex and torch only, so a Python symbol would fail its link.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set_target_properties(graphex_core PROPERTIES EXPORT_NAME graphex)
install(TARGETS graphex_core EXPORT graphexTargets COMPONENT deploy EXCLUDE_FROM_ALL
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS graphex-run COMPONENT deploy EXCLUDE_FROM_ALL RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY csrc/program csrc/runtime csrc/plan csrc/deploy COMPONENT deploy EXCLUDE_FROM_ALL
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/graphex FILES_MATCHING PATTERN "*.h" PATTERN "graphex.h" EXCLUDE)
install(FILES ${GRAPHEX_GENERATED_DIR}/program_generated.h csrc/deploy/graphex.h COMPONENT deploy EXCLUDE_FROM_ALL
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/graphex)
install(EXPORT graphexTargets NAMESPACE graphex:: COMPONENT deploy EXCLUDE_FROM_ALL
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/graphex)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/graphexConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/graphexConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/graphex
  PATH_VARS CMAKE_INSTALL_BINDIR)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/graphexConfigVersion.cmake
  VERSION 0.1.0 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/graphexConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/graphexConfigVersion.cmake
        COMPONENT deploy EXCLUDE_FROM_ALL DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/graphex)

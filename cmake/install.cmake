# `cmake --install <build> [--prefix P]` installs:
#   include/dsopt.h
#   lib/libdsopt.so -> libdsopt.so.0 -> libdsopt.so.0.1.0
#   lib/libdsopt_mpi.so.0.1.0 (with MPI: the MPI communicator, loaded on demand)
#   lib/cmake/dsopt/  find_package(dsopt) config, version file, dsopt::dsopt target
#   lib/pkgconfig/dsopt.pc
# All of them are relocatable: they locate the prefix from their own path.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(DSOPT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/dsopt)
set(DSOPT_PKGCONFIG_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# Keep link directories outside the system ones (Open MPI's, say) in the
# installed library's RUNPATH, as in the build tree.
set_target_properties(dsopt PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
install(TARGETS dsopt EXPORT dsoptTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${PROJECT_SOURCE_DIR}/include/dsopt.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The MPI communicator, next to the library that loads it on demand.
if(TARGET dsopt_mpi)
  set_target_properties(dsopt_mpi PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
  install(TARGETS dsopt_mpi LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()

install(EXPORT dsoptTargets NAMESPACE dsopt:: DESTINATION ${DSOPT_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/dsoptConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/dsoptConfig.cmake
                              INSTALL_DESTINATION ${DSOPT_CMAKE_DIR})
# 0.x: the ABI follows the SONAME (libdsopt.so.MAJOR).
write_basic_package_version_file(${PROJECT_BINARY_DIR}/dsoptConfigVersion.cmake
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/dsoptConfig.cmake ${PROJECT_BINARY_DIR}/dsoptConfigVersion.cmake
        DESTINATION ${DSOPT_CMAKE_DIR})

# pkg-config: paths relative to the .pc file's own directory (${pcfiledir}),
# so that `cmake --install --prefix` and moving the tree both work.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(DSOPT_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  string(REGEX REPLACE "[^/]+" ".." _pc_to_prefix "${DSOPT_PKGCONFIG_DIR}")  # lib/pkgconfig -> ../..
  set(DSOPT_PC_PREFIX "\${pcfiledir}/${_pc_to_prefix}")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/dsopt.pc.in ${PROJECT_BINARY_DIR}/dsopt.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/dsopt.pc DESTINATION ${DSOPT_PKGCONFIG_DIR})

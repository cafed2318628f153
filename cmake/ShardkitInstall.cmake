# Installs the exported targets and a package config, so that `find_package(shardkit)` gives shardkit::core,
# shardkit::launch, shardkit::collectives, shardkit::sharding and shardkit::checkpoint.
include_guard(GLOBAL)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(SHARDKIT_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/shardkit")

install(FILES "${PROJECT_BINARY_DIR}/generated/shardkit/config.hpp" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/shardkit")
install(EXPORT shardkitTargets NAMESPACE shardkit:: DESTINATION "${SHARDKIT_INSTALL_CMAKEDIR}")

configure_package_config_file("${CMAKE_CURRENT_LIST_DIR}/shardkitConfig.cmake.in" "${PROJECT_BINARY_DIR}/shardkitConfig.cmake"
  INSTALL_DESTINATION "${SHARDKIT_INSTALL_CMAKEDIR}")
write_basic_package_version_file("${PROJECT_BINARY_DIR}/shardkitConfigVersion.cmake"
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/shardkitConfig.cmake" "${PROJECT_BINARY_DIR}/shardkitConfigVersion.cmake"
              "${CMAKE_CURRENT_SOURCE_DIR}/cmake/FindNCCL.cmake"
        DESTINATION "${SHARDKIT_INSTALL_CMAKEDIR}")

# shardkit_add_module(NAME <name> SOURCES ... [CUDA_SOURCES ...] [DEPENDS ...])
# Declares the static library shardkit_<name> with alias shardkit::<name>, its public include directory
# <name>/include, the generated config header, warnings and (when enabled) sanitizers, and its install rules.
include_guard(GLOBAL)

function(shardkit_add_module)
  cmake_parse_arguments(ARG "" "NAME" "SOURCES;CUDA_SOURCES;DEPENDS" ${ARGN})
  set(target shardkit_${ARG_NAME})
  set(srcs ${ARG_SOURCES})
  if(SHARDKIT_HAVE_CUDA)
    list(APPEND srcs ${ARG_CUDA_SOURCES})
  endif()
  add_library(${target} STATIC ${srcs})
  add_library(shardkit::${ARG_NAME} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${ARG_NAME} OUTPUT_NAME shardkit_${ARG_NAME})
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/generated>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_include_directories(${target} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_compile_features(${target} PUBLIC cxx_std_20)
  target_link_libraries(${target} PUBLIC ${ARG_DEPENDS} PRIVATE $<BUILD_INTERFACE:shardkit_warnings>)
  target_link_libraries(${target} PUBLIC $<BUILD_INTERFACE:shardkit_sanitize>)
  if(SHARDKIT_HAVE_CUDA)
    set_target_properties(${target} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
  endif()
  install(TARGETS ${target} EXPORT shardkitTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endfunction()

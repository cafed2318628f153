# libFuzzer targets (SHARDKIT_FUZZ=ON). Needs clang and its libFuzzer runtime (Debian: libclang-rt-14-dev);
# scripts/fuzz.sh configures such a build in build-fuzz/.
#
# The libraries are compiled with -fsanitize=fuzzer-no-link (coverage feedback without libFuzzer's main) on top of
# ASan and UBSan (shardkit_sanitize, see ShardkitWarnings.cmake); each fuzzer executable links -fsanitize=fuzzer.
#
# shardkit_add_fuzzer(NAME <name> SOURCES ... [LIBS ...])
#   Declares the fuzzer executable <name> (built by the `fuzzers` target).
include_guard(GLOBAL)

if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "SHARDKIT_FUZZ=ON needs clang (libFuzzer), not ${CMAKE_CXX_COMPILER_ID}: configure a separate "
                      "build with CC=clang CXX=clang++ (scripts/fuzz.sh does).")
endif()

include(CheckCXXSourceCompiles)
set(CMAKE_REQUIRED_FLAGS "-fsanitize=fuzzer,address,undefined")
set(CMAKE_REQUIRED_LINK_OPTIONS "-fsanitize=fuzzer,address,undefined")
check_cxx_source_compiles([[
#include <cstddef>
#include <cstdint>
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }
]] SHARDKIT_HAVE_LIBFUZZER)
unset(CMAKE_REQUIRED_FLAGS)
unset(CMAKE_REQUIRED_LINK_OPTIONS)
if(NOT SHARDKIT_HAVE_LIBFUZZER)
  message(FATAL_ERROR "SHARDKIT_FUZZ=ON: ${CMAKE_CXX_COMPILER} cannot link -fsanitize=fuzzer. Install clang's "
                      "runtime libraries (Debian: libclang-rt-14-dev; scripts/setup.sh does).")
endif()

target_compile_options(shardkit_sanitize INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)

add_custom_target(fuzzers)

function(shardkit_add_fuzzer)
  cmake_parse_arguments(ARG "" "NAME" "SOURCES;LIBS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_LIBS} shardkit_warnings shardkit_sanitize)
  target_link_options(${ARG_NAME} PRIVATE -fsanitize=fuzzer)
  add_dependencies(fuzzers ${ARG_NAME})
endfunction()

# Warnings and sanitizer flags through INTERFACE targets, never through global flags.
include_guard(GLOBAL)

add_library(shardkit_warnings INTERFACE)
target_compile_options(shardkit_warnings INTERFACE
  $<$<COMPILE_LANG_AND_ID:CXX,GNU,Clang>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wno-missing-field-initializers>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall>)

add_library(shardkit_sanitize INTERFACE)
# The fuzz build (SHARDKIT_FUZZ, cmake/ShardkitFuzzing.cmake) runs under the same sanitizers.
if(SHARDKIT_SANITIZE OR SHARDKIT_FUZZ)
  # _GLIBCXX_ASSERTIONS bounds-checks std::vector / std::span / std::string indexing, which ASan misses when the
  # index stays inside the allocation's capacity. It changes no ABI.
  target_compile_options(shardkit_sanitize INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined>)
  target_compile_definitions(shardkit_sanitize INTERFACE $<$<COMPILE_LANGUAGE:CXX>:_GLIBCXX_ASSERTIONS>)
  # GCC's -Wmaybe-uninitialized is known to misfire under the sanitizers' instrumentation (GCC 12 at -O1: inside
  # libstdc++'s <regex>); the unsanitized builds keep it.
  target_compile_options(shardkit_sanitize INTERFACE $<$<COMPILE_LANG_AND_ID:CXX,GNU>:-Wno-maybe-uninitialized>)
  target_link_options(shardkit_sanitize INTERFACE -fsanitize=address,undefined)
elseif(SHARDKIT_TSAN)
  # ThreadSanitizer (scripts/test.sh --tsan): the threads of ours (shm_poster.cpp, watchdog.cpp) against the callers'.
  target_compile_options(shardkit_sanitize INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=thread -fno-omit-frame-pointer>)
  target_compile_options(shardkit_sanitize INTERFACE $<$<COMPILE_LANG_AND_ID:CXX,GNU>:-Wno-tsan>)
  target_link_options(shardkit_sanitize INTERFACE -fsanitize=thread)
endif()
install(TARGETS shardkit_warnings shardkit_sanitize EXPORT shardkitTargets)

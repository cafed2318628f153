# Warnings and sanitizer flags through INTERFACE targets, never through global flags.
include_guard(GLOBAL)

add_library(shardkit_warnings INTERFACE)
target_compile_options(shardkit_warnings INTERFACE
  $<$<COMPILE_LANG_AND_ID:CXX,GNU,Clang>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wno-missing-field-initializers>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall>)

add_library(shardkit_sanitize INTERFACE)
if(SHARDKIT_SANITIZE)
  target_compile_options(shardkit_sanitize INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined>)
  target_link_options(shardkit_sanitize INTERFACE -fsanitize=address,undefined)
endif()
install(TARGETS shardkit_warnings shardkit_sanitize EXPORT shardkitTargets)

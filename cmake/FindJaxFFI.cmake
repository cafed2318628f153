# Finds jaxlib's XLA FFI headers (xla/ffi/api/ffi.h, from jax.ffi.include_dir()) and defines JaxFFI::headers (an
# imported target, so its include directory is a SYSTEM one). JAX is optional: where it is missing, JaxFFI_FOUND is
# false and nothing fails.

if(NOT Python_EXECUTABLE)
  find_package(Python COMPONENTS Interpreter QUIET)
endif()
unset(JaxFFI_INCLUDE_DIR)
if(Python_EXECUTABLE)
  execute_process(COMMAND "${Python_EXECUTABLE}" -c "import jax; print(jax.ffi.include_dir())"
                  OUTPUT_VARIABLE _jax_ffi_include OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _jax_rc
                  ERROR_QUIET)
  if(_jax_rc EQUAL 0 AND EXISTS "${_jax_ffi_include}/xla/ffi/api/ffi.h")
    set(JaxFFI_INCLUDE_DIR "${_jax_ffi_include}")
  endif()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(JaxFFI REQUIRED_VARS JaxFFI_INCLUDE_DIR)

if(JaxFFI_FOUND AND NOT TARGET JaxFFI::headers)
  add_library(JaxFFI::headers INTERFACE IMPORTED)
  set_target_properties(JaxFFI::headers PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${JaxFFI_INCLUDE_DIR}")
endif()

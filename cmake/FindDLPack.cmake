# Finds a DLPack 1.x header (dlpack/dlpack.h with DLManagedTensorVersioned) and defines DLPack::dlpack.
# Looks at DLPACK_INCLUDE_DIR, then the header shipped by the PyPI package apache-tvm-ffi (scripts/setup.sh installs
# it), then the system. Debian's libdlpack-dev is 0.6 (legacy only) and is skipped.

function(_shardkit_dlpack_version dir out)
  set(${out} "" PARENT_SCOPE)
  if(EXISTS "${dir}/dlpack/dlpack.h")
    file(STRINGS "${dir}/dlpack/dlpack.h" _v REGEX "^#define DLPACK_(MAJOR|MINOR)_VERSION ")
    string(REGEX MATCH "MAJOR_VERSION ([0-9]+)" _m "${_v}")
    set(_major "${CMAKE_MATCH_1}")
    string(REGEX MATCH "MINOR_VERSION ([0-9]+)" _m "${_v}")
    if(_major)
      set(${out} "${_major}.${CMAKE_MATCH_1}" PARENT_SCOPE)
    endif()
  endif()
endfunction()

set(_dlpack_candidates ${DLPACK_INCLUDE_DIR} $ENV{DLPACK_INCLUDE_DIR})
if(NOT Python_EXECUTABLE)
  find_package(Python COMPONENTS Interpreter QUIET)
endif()
if(Python_EXECUTABLE)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import importlib.util, os; s = importlib.util.find_spec('tvm_ffi'); print(os.path.join(os.path.dirname(s.origin), 'include') if s else '')"
    OUTPUT_VARIABLE _tvm_inc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  list(APPEND _dlpack_candidates ${_tvm_inc})
endif()
list(APPEND _dlpack_candidates /usr/local/include /usr/include)

unset(DLPack_INCLUDE_DIR)
foreach(dir IN LISTS _dlpack_candidates)
  _shardkit_dlpack_version("${dir}" _ver)
  if(_ver AND _ver VERSION_GREATER_EQUAL 1.0)
    set(DLPack_INCLUDE_DIR "${dir}")
    set(DLPack_VERSION "${_ver}")
    break()
  endif()
endforeach()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(DLPack
  REQUIRED_VARS DLPack_INCLUDE_DIR VERSION_VAR DLPack_VERSION
  FAIL_MESSAGE "No DLPack >= 1.0 header found. Run scripts/setup.sh (it installs apache-tvm-ffi, which ships one), or pass -DDLPACK_INCLUDE_DIR=<dir holding dlpack/dlpack.h>")

if(DLPack_FOUND AND NOT TARGET DLPack::dlpack)
  add_library(DLPack::dlpack INTERFACE IMPORTED)
  set_target_properties(DLPack::dlpack PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${DLPack_INCLUDE_DIR}")
endif()

# Finds NCCL in the CUDA toolkit, under NCCL_HOME / NCCL_ROOT, or in the Python wheel (nvidia-nccl-cu12/-cu13:
# site-packages/nvidia/nccl/{include,lib}, whose library is only libnccl.so.2), and defines the imported target
# NCCL::nccl. Sets NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY and NCCL_VERSION (from nccl.h).

set(_nccl_hints $ENV{NCCL_HOME} ${NCCL_HOME} $ENV{NCCL_ROOT} ${NCCL_ROOT})
if(CUDAToolkit_INCLUDE_DIRS)
  list(APPEND _nccl_hints ${CUDAToolkit_INCLUDE_DIRS}/.. ${CUDAToolkit_LIBRARY_ROOT})
endif()
# The wheel's folder, asked of the Python that would run the package (Python_EXECUTABLE, else python3 on PATH).
if(Python_EXECUTABLE)
  set(_nccl_python "${Python_EXECUTABLE}")
else()
  find_program(SHARDKIT_NCCL_PYTHON NAMES python3 python)
  set(_nccl_python "${SHARDKIT_NCCL_PYTHON}")
  mark_as_advanced(SHARDKIT_NCCL_PYTHON)
endif()
if(_nccl_python)
  execute_process(COMMAND "${_nccl_python}" -c "import nvidia.nccl as m; print(list(m.__path__)[0])"
                  OUTPUT_VARIABLE _nccl_wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _nccl_rc)
  if(_nccl_rc EQUAL 0 AND IS_DIRECTORY "${_nccl_wheel}")
    list(APPEND _nccl_hints "${_nccl_wheel}")
  endif()
endif()

find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
# A wheel ships libnccl.so.2 without the libnccl.so development link.
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${_nccl_hints} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_ver REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  foreach(part MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${part} ([0-9]+)" _m "${_nccl_ver}")
    set(NCCL_VERSION_${part} "${CMAKE_MATCH_1}")
  endforeach()
  set(NCCL_VERSION "${NCCL_VERSION_MAJOR}.${NCCL_VERSION_MINOR}.${NCCL_VERSION_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                                              INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)

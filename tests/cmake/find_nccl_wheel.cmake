# FindNCCL finds an NCCL that only a Python wheel provides (nvidia-nccl-cu13 layout: nvidia/nccl/include/nccl.h and
# nvidia/nccl/lib/libnccl.so.2, no libnccl.so), through the Python on PATH. Run with -DSOURCE_DIR=... -DWORK_DIR=...
set(site "${WORK_DIR}/site")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${site}/nvidia/nccl/include" "${site}/nvidia/nccl/lib" "${WORK_DIR}/project")
file(WRITE "${site}/nvidia/nccl/include/nccl.h" "#define NCCL_MAJOR 2\n#define NCCL_MINOR 99\n#define NCCL_PATCH 7\n")
file(WRITE "${site}/nvidia/nccl/lib/libnccl.so.2" "")
file(WRITE "${WORK_DIR}/project/CMakeLists.txt" "
cmake_minimum_required(VERSION 3.24)
project(find_nccl_wheel NONE)
list(APPEND CMAKE_MODULE_PATH \"${SOURCE_DIR}/cmake\")
find_package(NCCL REQUIRED)
message(STATUS \"found NCCL \${NCCL_VERSION} at \${NCCL_LIBRARY}\")
")
# No toolkit and no NCCL_HOME: the wheel (first among the hints) must be what is found.
execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=NCCL_HOME --unset=NCCL_ROOT --unset=CMAKE_PREFIX_PATH --unset=CPATH
                        --unset=LIBRARY_PATH "PYTHONPATH=${site}"
                        ${CMAKE_COMMAND} -S "${WORK_DIR}/project" -B "${WORK_DIR}/build"
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT out MATCHES "found NCCL 2.99.7 at ${site}/nvidia/nccl/lib/libnccl.so.2")
  message(FATAL_ERROR "FindNCCL did not find the wheel's NCCL (exit ${rc}):\n${out}\n${err}")
endif()
message(STATUS "FindNCCL found the wheel-only NCCL")

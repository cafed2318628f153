# Finds what shardkit builds against and decides which optional parts are built.
# Sets SHARDKIT_HAVE_CUDA and SHARDKIT_HAVE_NCCL (0/1) for the generated config.hpp.

include_guard(GLOBAL)

foreach(opt SHARDKIT_CUDA SHARDKIT_NCCL)
  string(TOUPPER "${${opt}}" _v)
  if(NOT _v MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "${opt} must be AUTO, ON or OFF (got '${${opt}}')")
  endif()
  set(${opt} "${_v}")
endforeach()

# --- MPI ---------------------------------------------------------------------------------------------------------
find_package(MPI REQUIRED COMPONENTS C)

# --- CUDA --------------------------------------------------------------------------------------------------------
set(SHARDKIT_HAVE_CUDA 0)
if(SHARDKIT_SIM_GPU)
  # The simulated GPU (sim/): shardkit's CUDA paths are compiled by the host compiler against the toolkit's headers
  # and linked against host implementations of the CUDA runtime, cuBLAS and NCCL calls. nvcc is not used.
  find_package(CUDAToolkit REQUIRED)
  set(SHARDKIT_HAVE_CUDA 1)
elseif(NOT SHARDKIT_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER)
    check_language(CUDA)
  endif()
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # No GPU is needed to build: name the architectures rather than asking the (absent) device.
      # sm_80 (A100) and sm_90 (H100/H200) machine code, plus PTX for what comes after.
      set(CMAKE_CUDA_ARCHITECTURES "80-real;90")
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 knows no CUDA 20 dialect for nvcc; kernels need only C++17
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(SHARDKIT_HAVE_CUDA 1)
  elseif(SHARDKIT_CUDA STREQUAL "ON")
    message(FATAL_ERROR "SHARDKIT_CUDA=ON but no CUDA compiler was found. Put nvcc on PATH, set "
                        "CMAKE_CUDA_COMPILER, or configure with -DSHARDKIT_CUDA=OFF.")
  endif()
endif()

# --- NCCL --------------------------------------------------------------------------------------------------------
set(SHARDKIT_HAVE_NCCL 0)
set(SHARDKIT_NCCL_VERSION "")
if(SHARDKIT_SIM_GPU)
  # Only nccl.h is needed: the calls are implemented over MPI by the simulation.
  find_path(SHARDKIT_SIM_NCCL_INCLUDE_DIR nccl.h HINTS $ENV{NCCL_HOME} ${NCCL_HOME} ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include REQUIRED)
  set(SHARDKIT_HAVE_NCCL 1)
  set(SHARDKIT_NCCL_VERSION "simulated")
elseif(NOT SHARDKIT_NCCL STREQUAL "OFF")
  if(SHARDKIT_HAVE_CUDA)
    find_package(NCCL)
  endif()
  if(NCCL_FOUND)
    set(SHARDKIT_HAVE_NCCL 1)
    set(SHARDKIT_NCCL_VERSION "${NCCL_VERSION}")
  elseif(SHARDKIT_NCCL STREQUAL "ON")
    message(FATAL_ERROR "SHARDKIT_NCCL=ON but NCCL was not found (it needs CUDA, and nccl.h / libnccl in the CUDA "
                        "toolkit or under NCCL_HOME). Set NCCL_HOME or configure with -DSHARDKIT_NCCL=OFF.")
  endif()
endif()

# --- BLAS (host GEMM) --------------------------------------------------------------------------------------------
if(NOT DEFINED BLA_VENDOR)
  set(BLA_VENDOR OpenBLAS)
endif()
find_package(BLAS REQUIRED)
find_path(SHARDKIT_CBLAS_INCLUDE_DIR cblas.h
          PATH_SUFFIXES openblas-pthread openblas x86_64-linux-gnu/openblas-pthread aarch64-linux-gnu/openblas-pthread
          DOC "Directory holding cblas.h")
if(NOT SHARDKIT_CBLAS_INCLUDE_DIR)
  message(FATAL_ERROR "cblas.h not found: install OpenBLAS (scripts/setup.sh does) or set SHARDKIT_CBLAS_INCLUDE_DIR.")
endif()

# --- DLPack 1.x header -------------------------------------------------------------------------------------------
find_package(DLPack REQUIRED)

# --- JSON reader of checkpoint metadata -------------------------------------------------------------------------
# nlohmann/json (Debian's nlohmann-json3-dev, header-only): the checkpoint module parses Zarr metadata with it.
find_package(nlohmann_json 3.10 REQUIRED)

# Test helpers.
#
# shardkit_add_mpi_test(NAME <name> TARGET <exe> [NP 1 2 3 4] [ARGS ...] [LABELS ...] [ENV VAR=VALUE ...]
#                       [TIMEOUT s] [COMMAND ...])
#   Registers <name>.np<N> for each N under ctest, launched through MPIEXEC_EXECUTABLE with
#   --oversubscribe (Open MPI) and the root-user settings when running as root. Tests run in checked mode with a
#   timeout (SHARDKIT_CHECK=1, SHARDKIT_TIMEOUT_S) so that a hang becomes an error. COMMAND replaces the target
#   (for Python: COMMAND ${Python_EXECUTABLE} -m pytest ...).
include_guard(GLOBAL)

# ctest slots (PROCESSORS) count half cores. A test that computes on n cores (one per rank, or per process) claims 2n,
# at most the machine's 2 x cores (SHARDKIT_HOST_CORES): shardkit_core_slots(<var> <n>). A test whose ranks spend it
# waiting rather than computing (on a rank that never arrives, until a timeout, or for a killed peer to end the job)
# claims SHARDKIT_WAITING_SLOTS, one: their waits spin briefly, then yield, then sleep (mpi_request.cpp, the shm
# WaitPolicy). scripts/test.sh runs ctest with -j 2 x cores + 1 (SHARDKIT_CTEST_JOBS, scripts/common.sh): the
# computing tests fill the cores, and a waiting one runs beside them. (A plain `ctest -jN` caps each test's claim at N.)
cmake_host_system_information(RESULT SHARDKIT_HOST_CORES QUERY NUMBER_OF_LOGICAL_CORES)
set(SHARDKIT_WAITING_SLOTS 1)
function(shardkit_core_slots out cores)
  if(cores GREATER SHARDKIT_HOST_CORES)
    set(cores ${SHARDKIT_HOST_CORES})
  endif()
  math(EXPR slots "2 * ${cores}")
  set(${out} ${slots} PARENT_SCOPE)
endfunction()

# Launcher flags, worked out once.
execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _mpiexec_version ERROR_QUIET)
set(SHARDKIT_MPIEXEC_FLAGS "")
set(SHARDKIT_MPIEXEC_ENV "")
if(_mpiexec_version MATCHES "Open MPI|OpenRTE")
  # More ranks than cores is the norm in CI; binding would pin oversubscribed ranks onto the same core.
  list(APPEND SHARDKIT_MPIEXEC_FLAGS --oversubscribe --bind-to none)
  execute_process(COMMAND id -u OUTPUT_VARIABLE _uid OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(_uid STREQUAL "0")
    list(APPEND SHARDKIT_MPIEXEC_ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
  endif()
endif()
# Flight-recorder dumps of the tests that fail on purpose go to the build tree, and the rank ending such a job waits
# briefly for the others' (tests that check the dumps set their own wait).
list(APPEND SHARDKIT_MPIEXEC_ENV SHARDKIT_DUMP_DIR=${PROJECT_BINARY_DIR}/test-dumps SHARDKIT_DUMP_WAIT_S=0.5)
set(SHARDKIT_TEST_TIMEOUT_S 60 CACHE STRING "SHARDKIT_TIMEOUT_S given to MPI tests")

# GPU tests (label gpu): 1-2 ranks on a real GPU machine; 1-4 on the simulated GPU, whose reductions run on host
# cores (hence a smaller "large" count there).
if(SHARDKIT_SIM_GPU)
  set(SHARDKIT_GPU_TEST_NP 1 2 3 4)
  set(SHARDKIT_GPU_TEST_ENV SHARDKIT_TEST_LARGE_COUNT=4099)
else()
  set(SHARDKIT_GPU_TEST_NP 1 2)
  set(SHARDKIT_GPU_TEST_ENV "")
endif()

function(shardkit_add_mpi_test)
  cmake_parse_arguments(ARG "" "NAME;TARGET;TIMEOUT" "NP;ARGS;LABELS;ENV;COMMAND" ${ARGN})
  if(NOT ARG_NP)
    set(ARG_NP 1 2 3 4)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  if(ARG_COMMAND)
    set(cmd ${ARG_COMMAND})
  else()
    set(cmd $<TARGET_FILE:${ARG_TARGET}>)
  endif()
  foreach(np IN LISTS ARG_NP)
    set(test_name ${ARG_NAME}.np${np})
    shardkit_core_slots(slots ${np})
    add_test(NAME ${test_name}
             COMMAND ${MPIEXEC_EXECUTABLE} ${SHARDKIT_MPIEXEC_FLAGS} ${MPIEXEC_NUMPROC_FLAG} ${np} ${MPIEXEC_PREFLAGS}
                     ${cmd} ${MPIEXEC_POSTFLAGS} ${ARG_ARGS})
    set_tests_properties(${test_name} PROPERTIES
      LABELS "mpi;${ARG_LABELS}"
      PROCESSORS ${slots}
      TIMEOUT ${ARG_TIMEOUT}
      ENVIRONMENT "${SHARDKIT_MPIEXEC_ENV};SHARDKIT_CHECK=1;SHARDKIT_TIMEOUT_S=${SHARDKIT_TEST_TIMEOUT_S};OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1;${ARG_ENV}")
    if("gpu" IN_LIST ARG_LABELS)
      # A GPU suite that finds no GPU runs nothing and exits 77 (tests/collectives/collective_test_util.hpp).
      set_tests_properties(${test_name} PROPERTIES SKIP_RETURN_CODE 77)
    endif()
  endforeach()
endfunction()

# shardkit_add_unit_test(NAME <name> SOURCES ... [LIBS ...] [LABELS ...])
#   A GoogleTest executable without MPI, registered as one ctest test.
function(shardkit_add_unit_test)
  cmake_parse_arguments(ARG "" "NAME" "SOURCES;LIBS;LABELS;ENV" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main shardkit_warnings)
  add_test(NAME ${ARG_NAME} COMMAND ${ARG_NAME})
  shardkit_core_slots(slots 1)
  set_tests_properties(${ARG_NAME} PROPERTIES LABELS "unit;${ARG_LABELS}" TIMEOUT 300 PROCESSORS ${slots}
                       ENVIRONMENT "${ARG_ENV}")
endfunction()

# Runs COMMAND (an mpirun of `timeout_main nccl-init` with NP ranks) and checks that every rank raised TimeoutError
# while creating the NCCL communicator and that the job ended rather than hung.
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
set(all "${out}\n${err}")
if(rc MATCHES "timeout")
  message(FATAL_ERROR "the job hung (killed after 60 s):\n${all}")
endif()
math(EXPR last "${NP} - 1")
foreach(r RANGE 0 ${last})
  if(NOT all MATCHES "rank ${r}: caught after [0-9.]+ s: TimeoutError: creating the NCCL communicator")
    message(FATAL_ERROR "rank ${r} did not report a TimeoutError creating the NCCL communicator:\n${all}")
  endif()
endforeach()
message(STATUS "NCCL creation timed out on every rank; job ended (exit ${rc})")

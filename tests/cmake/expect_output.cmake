# Runs COMMAND (a ;-list) and passes when its output matches MUST (a regular expression) and not MUST_NOT; the exit
# status is not judged (jobs that end through MPI_Abort exit non-zero, and mpirun itself has been seen to crash while
# tearing such a job down). A run longer than LIMIT seconds (default 90) fails as hung.
if(NOT LIMIT)
  set(LIMIT 90)
endif()
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT ${LIMIT})
set(all "${out}\n${err}")
if(rc MATCHES "timeout")
  message(FATAL_ERROR "hung (killed after ${LIMIT} s):\n${all}")
endif()
if(MUST_NOT AND all MATCHES "${MUST_NOT}")
  message(FATAL_ERROR "the output matches '${MUST_NOT}':\n${all}")
endif()
if(NOT all MATCHES "${MUST}")
  message(FATAL_ERROR "the output does not match '${MUST}' (exit ${rc}):\n${all}")
endif()
message(STATUS "found '${MUST}' (exit ${rc})")

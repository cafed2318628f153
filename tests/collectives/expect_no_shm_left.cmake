# Runs COMMAND (an mpirun of timeout_main shm-kill or shm-createkill), which prints "segment owner pid: <pid>" and then
# loses a rank to SIGKILL: the job must end (not hang) with a non-zero exit (judged by expect_output.cmake), and no shm
# segment of that pid may be left in /dev/shm.
set(EXPECT_OUTPUT "segment owner pid: ([0-9]+)")
set(EXIT nonzero)
set(LIMIT 60)
include(${CMAKE_CURRENT_LIST_DIR}/../support/expect_output.cmake)
file(GLOB left "/dev/shm/shardkit-${CMAKE_MATCH_1}-*")
if(left)
  message(FATAL_ERROR "left in /dev/shm after the kill: ${left}\n${all}")
endif()
message(STATUS "the job ended (exit ${rc}) and left nothing in /dev/shm")

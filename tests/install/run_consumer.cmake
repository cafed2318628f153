# Steps of the install tests (see CMakeLists.txt): install this build into a scratch prefix, build a consumer project
# against it, run it under mpirun, and count the lines that match EXPECT (one per rank).
#   BUILD_DIR, WORK_DIR, GENERATOR, LAUNCH (mpirun and its arguments, the rank count last), RANKS
#   CONSUMER_DIR: the project; or PREPARE: a command that writes it into ${WORK_DIR}/src
#   PROGRAM: the executable the project builds; EXPECT: the regular expression each rank prints
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

if(DEFINED PREPARE)
  set(CONSUMER_DIR "${WORK_DIR}/src")
  run(${PREPARE} "${CONSUMER_DIR}")
endif()
run(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
if(NOT EXISTS "${prefix}/lib/cmake/shardkit/shardkitConfig.cmake")
  message(FATAL_ERROR "install did not produce lib/cmake/shardkit/shardkitConfig.cmake")
endif()
run(${CMAKE_COMMAND} -S "${CONSUMER_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
    "-DCMAKE_PREFIX_PATH=${prefix}" -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run(${LAUNCH} ${RANKS} "${WORK_DIR}/build/${PROGRAM}")
string(REGEX MATCHALL "${EXPECT}" lines "${last_output}")
list(LENGTH lines n)
if(NOT n EQUAL RANKS)
  message(FATAL_ERROR "expected '${EXPECT}' from ${RANKS} ranks, got:\n${last_output}")
endif()
message(STATUS "${last_output}")

# The shm transport's sources (flat and hierarchical), added to shardkit_collectives (collectives/CMakeLists.txt
# includes every src/backends/*/sources.cmake).
target_sources(shardkit_collectives PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/hierarchy.cpp ${CMAKE_CURRENT_LIST_DIR}/shm_backend.cpp
  ${CMAKE_CURRENT_LIST_DIR}/shm_cma.cpp ${CMAKE_CURRENT_LIST_DIR}/shm_fold.cpp
  ${CMAKE_CURRENT_LIST_DIR}/shm_p2p.cpp ${CMAKE_CURRENT_LIST_DIR}/shm_p2p_recv.cpp
  ${CMAKE_CURRENT_LIST_DIR}/shm_poster.cpp ${CMAKE_CURRENT_LIST_DIR}/shm_segment.cpp
  ${CMAKE_CURRENT_LIST_DIR}/shm_single_copy.cpp ${CMAKE_CURRENT_LIST_DIR}/shm_steps.cpp
  ${CMAKE_CURRENT_LIST_DIR}/shm_transport.cpp)

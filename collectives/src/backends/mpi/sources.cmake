# The MPI transport's sources, added to shardkit_collectives (collectives/CMakeLists.txt includes every
# src/backends/*/sources.cmake).
target_sources(shardkit_collectives PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/mpi_backend.cpp ${CMAKE_CURRENT_LIST_DIR}/mpi_exchange.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mpi_p2p.cpp ${CMAKE_CURRENT_LIST_DIR}/mpi_request.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mpi_transport.cpp ${CMAKE_CURRENT_LIST_DIR}/mpi_types.cpp
  ${CMAKE_CURRENT_LIST_DIR}/staging.cpp)

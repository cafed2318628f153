# The NCCL transport's sources, added to shardkit_collectives (collectives/CMakeLists.txt includes every
# src/backends/*/sources.cmake). Its descriptor and reduction table are in every build; the backend where NCCL is
# (SHARDKIT_HAVE_NCCL), else a stub that makes none.
target_sources(shardkit_collectives PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/nccl_caps.cpp ${CMAKE_CURRENT_LIST_DIR}/nccl_transport.cpp)
if(SHARDKIT_HAVE_NCCL)
  target_sources(shardkit_collectives PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/nccl_backend.cpp ${CMAKE_CURRENT_LIST_DIR}/nccl_state.cpp)
  if(NOT SHARDKIT_SIM_GPU)  # the simulated GPU's library has NCCL's functions
    target_link_libraries(shardkit_collectives PUBLIC NCCL::nccl)
  endif()
else()
  target_sources(shardkit_collectives PRIVATE ${CMAKE_CURRENT_LIST_DIR}/nccl_stub.cpp)
endif()

# towerflow_bench_allreduce: the local CPU all-reduce between logical devices, nccl-tests style.
tw_add_bench(towerflow_bench_allreduce SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/bench_allreduce.cc
             LIBS towerflow_collectives CLI11::CLI11 nlohmann_json::nlohmann_json)
if(TW_HAVE_MPI)  # the comparison with MPI_Allreduce called directly, under mpirun
  target_link_libraries(towerflow_bench_allreduce PRIVATE MPI::MPI_CXX)
  target_compile_definitions(towerflow_bench_allreduce PRIVATE TOWERFLOW_HAVE_MPI=1)
endif()

# towerflow_bench_allreduce: the local CPU all-reduce between logical devices, nccl-tests style.
tw_add_bench(towerflow_bench_allreduce SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/bench_allreduce.cc
             LIBS towerflow_collectives CLI11::CLI11 nlohmann_json::nlohmann_json)

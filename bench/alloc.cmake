# towerflow_bench_alloc: the BFC allocator against malloc/free (pairs per second, pool overhead).
tw_add_bench(towerflow_bench_alloc SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/bench_alloc.cc
             LIBS towerflow_memory CLI11::CLI11 nlohmann_json::nlohmann_json)

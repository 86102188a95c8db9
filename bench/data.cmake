# towerflow_bench_data: images/s of the data loader (read/decode + augment + batch).
tw_add_bench(towerflow_bench_data SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/bench_data.cc
             LIBS towerflow_data CLI11::CLI11 nlohmann_json::nlohmann_json)

# Per-op CPU kernel benchmark (convolution, batch norm, pooling, GEMM at ResNet-20/tfcnn shapes).
tw_add_bench(towerflow_bench_ops
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/bench_ops.cc ${CMAKE_CURRENT_SOURCE_DIR}/peak.cc
  LIBS towerflow_cpu_kernels CLI11::CLI11 nlohmann_json::nlohmann_json)
# The peak loops carry their own target attributes (see kernels.cmake).
target_compile_options(towerflow_bench_ops PRIVATE -Wno-psabi)

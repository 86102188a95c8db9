# Per-op CPU kernel benchmark (convolution, batch norm, pooling, GEMM at ResNet-20/tfcnn shapes).
tw_add_bench(towerflow_bench_ops
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/bench_ops.cc ${CMAKE_CURRENT_SOURCE_DIR}/peak.cc
  LIBS towerflow_cpu_kernels CLI11::CLI11 nlohmann_json::nlohmann_json)
# The peak loops carry their own target attributes (see kernels.cmake).
target_compile_options(towerflow_bench_ops PRIVATE -Wno-psabi)
# The same benchmark over towerflow_cpu_kernels_bf16_timing (core/cpu/CMakeLists.txt): the
# emulated bf16 kernels with vdpbf16ps timed as one FMA and AMX without its tiles, wrong values, to
# time towerflow's own bf16 kernels on a CPU without those instructions (docs/precision.md). Built
# only on request: cmake --build build --target towerflow_bench_ops_bf16_timing.
if(TARGET towerflow_cpu_kernels_bf16_timing)
  tw_add_bench(towerflow_bench_ops_bf16_timing
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/bench_ops.cc ${CMAKE_CURRENT_SOURCE_DIR}/peak.cc
    LIBS towerflow_cpu_kernels_bf16_timing CLI11::CLI11 nlohmann_json::nlohmann_json)
  target_compile_options(towerflow_bench_ops_bf16_timing PRIVATE -Wno-psabi)
  set_target_properties(towerflow_bench_ops_bf16_timing PROPERTIES EXCLUDE_FROM_ALL TRUE)
endif()
# How AMX's tdpbf16ps rounds against the exact sum and the emulation's FMAs (Note [bf16 AMX
# kernels]); it runs on CPUs with AMX-BF16 only, and says so elsewhere.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  tw_add_bench(towerflow_bench_amx_rounding
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/amx_rounding.cc ${CMAKE_CURRENT_SOURCE_DIR}/peak.cc
    LIBS towerflow_cpu_kernels)
  target_compile_options(towerflow_bench_amx_rounding PRIVATE -Wno-psabi)
endif()

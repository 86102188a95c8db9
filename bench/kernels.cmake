# towerflow_bench_kernels: the machine's limits (FMA peak per instruction set, STREAM bandwidth)
# and the CPU kernels at ResNet-20 / tfcnn shapes, as Google Benchmark micro-benchmarks.
if(TW_HAVE_GBENCH)
  tw_add_bench(towerflow_bench_kernels SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/bench_kernels.cc
                                             ${CMAKE_CURRENT_SOURCE_DIR}/peak.cc
               LIBS towerflow_cpu_kernels benchmark::benchmark CLI11::CLI11)
  # The peak loops carry their own target attributes; -Wno-psabi: GCC's note on 512-bit vector
  # arguments of inlined helpers, which cross no ABI boundary here.
  target_compile_options(towerflow_bench_kernels PRIVATE -Wno-psabi)
endif()

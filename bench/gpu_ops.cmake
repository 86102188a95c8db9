# towerflow_bench_gpu_ops: the GPU kernels at ResNet-20 / tfcnn shapes, CUDA-event timing, each
# result checked against its CPU twin. Built in CUDA builds only (it needs a GPU to run).
if(TW_HAVE_CUDA)
  tw_add_bench(towerflow_bench_gpu_ops SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/bench_gpu_ops.cc
               LIBS towerflow_cuda towerflow_memory towerflow_cpu_kernels CLI11::CLI11
                    nlohmann_json::nlohmann_json)
  target_compile_options(towerflow_bench_gpu_ops PRIVATE -Werror)
endif()

# towerflow_bench_train: whole training steps (forward, loss, backward, reduction, SGD) of a model
# on one or more devices through the tower trainer, images/s and GFLOP/s; compare with
# bench/peers/torch_cifar_bench.py and torch_ddp_bench.py.
tw_add_bench(towerflow_bench_train SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/bench_train.cc ${CMAKE_CURRENT_SOURCE_DIR}/peak.cc
             LIBS towerflow_models towerflow_tower towerflow_optim towerflow_cuda
                  CLI11::CLI11 nlohmann_json::nlohmann_json)
# The peak loops carry their own target attributes (see kernels.cmake).
target_compile_options(towerflow_bench_train PRIVATE -Wno-psabi)

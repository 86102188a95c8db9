# towerflow_bench_train: whole training steps (forward, loss, backward, SGD) of a model on one
# CPU device, images/s and GFLOP/s; compare with /work/shared/peers/torch_cifar_bench.py.
tw_add_bench(towerflow_bench_train SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/bench_train.cc
             LIBS towerflow_models CLI11::CLI11 nlohmann_json::nlohmann_json Eigen3::Eigen)

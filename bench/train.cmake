# towerflow_bench_train: whole training steps (forward, loss, backward, reduction, SGD) of a model
# on one or more devices through the tower trainer, images/s and GFLOP/s; compare with
# bench/peers/torch_cifar_bench.py and torch_ddp_bench.py.
tw_add_bench(towerflow_bench_train SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/bench_train.cc
             LIBS towerflow_models towerflow_tower towerflow_optim towerflow_cuda
                  CLI11::CLI11 nlohmann_json::nlohmann_json)

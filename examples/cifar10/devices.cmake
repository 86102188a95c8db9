# towerflow_devices: lists physical and logical devices, or dry-runs options on a described machine.
add_executable(towerflow_devices ${CMAKE_CURRENT_LIST_DIR}/towerflow_devices.cc)
target_link_libraries(towerflow_devices PRIVATE tw_cifar10 towerflow_platform towerflow_cpu_kernels towerflow_collectives CLI11::CLI11 nlohmann_json::nlohmann_json
                      tw_build_flags)
install(TARGETS towerflow_devices RUNTIME DESTINATION bin)

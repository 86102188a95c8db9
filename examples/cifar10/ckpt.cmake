# towerflow_ckpt: verifies checkpoints (every tensor's checksum) and prints what one holds.
add_executable(towerflow_ckpt ${CMAKE_CURRENT_LIST_DIR}/towerflow_ckpt.cc)
target_link_libraries(towerflow_ckpt PRIVATE towerflow_train CLI11::CLI11 tw_build_flags)
install(TARGETS towerflow_ckpt RUNTIME DESTINATION bin)

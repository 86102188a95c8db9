# Installation: `cmake --install build --prefix PREFIX` gives
#   PREFIX/lib/libtowerflow_*.a                 the library, one archive per area
#   PREFIX/include/towerflow/<area>/*.h         the public headers (TW_PUBLIC_HEADERS below),
#                                               included as "tower/tower.h" etc.
#   PREFIX/lib/cmake/towerflow/                 the CMake package: find_package(towerflow)
#   PREFIX/bin/cifar10_train, cifar10_eval, cifar10_predict, towerflow_devices, towerflow_ckpt
# so that research code does
#   find_package(towerflow REQUIRED)
#   target_link_libraries(my_experiment PRIVATE towerflow::towerflow)
# (examples/embed is such a project; scripts/check_embed.sh builds it against an install).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Every target of this project that towerflow::towerflow reaches, found by walking the link
# graph: the per-area archives, helper archives they link (e.g. a fallback library) and the
# flags target their private links name. Static archives carry their private dependencies into
# the export set, so all of them must be exported.
function(_tw_collect_targets out)
  set(pending ${ARGN})
  set(seen "")
  while(pending)
    list(POP_FRONT pending t)
    if(NOT TARGET ${t} OR t IN_LIST seen)
      continue()
    endif()
    get_target_property(imported ${t} IMPORTED)
    get_target_property(aliased ${t} ALIASED_TARGET)
    if(imported OR aliased)
      continue()
    endif()
    list(APPEND seen ${t})
    get_target_property(type ${t} TYPE)
    set(links "")
    foreach(prop INTERFACE_LINK_LIBRARIES LINK_LIBRARIES)
      if(prop STREQUAL "LINK_LIBRARIES" AND type STREQUAL "INTERFACE_LIBRARY")
        continue()
      endif()
      get_target_property(l ${t} ${prop})
      if(l)
        list(APPEND links ${l})
      endif()
    endforeach()
    foreach(l IN LISTS links)
      string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" l "${l}")
      if(TARGET ${l})
        list(APPEND pending ${l})
      endif()
    endforeach()
  endwhile()
  set(${out} ${seen} PARENT_SCOPE)
endfunction()

_tw_collect_targets(_tw_export_targets towerflow)

install(TARGETS ${_tw_export_targets}
        EXPORT towerflowTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/towerflow)
install(EXPORT towerflowTargets
        NAMESPACE towerflow::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/towerflow)

# The public headers: the umbrella headers and everything they include, nothing else (the tensor
# backend, the CPU and CUDA kernels and the trainer's internals stay private).
# tests/scripts/check_public_headers.py keeps this list equal to that closure. Headers keep their
# place in the tree, so installed code includes them as the library does.
set(TW_PUBLIC_HEADERS
    core/collectives/collectives.h core/collectives/communicator.h core/collectives/context.h
    core/collectives/local_communicator.h core/collectives/nccl_communicator.h
    core/collectives/process_group.h core/core.h core/device.h core/error.h core/log.h
    core/memory/allocator.h core/memory/memory.h core/memory/stats.h core/memory/sub_allocators.h
    core/nn/init.h core/nn/layers.h core/nn/module.h core/nn/whitening.h core/platform/ini.h
    core/platform/logical.h
    core/platform/options.h core/platform/platform.h core/platform/registry.h core/queue_event.h
    core/tensor/batch_norm_sync.h core/tensor/device_ops.h core/tensor/dtype.h core/tensor/mac_counter.h core/tensor/ops.h
    core/tensor/optimizer_update.h core/tensor/precision.h
    core/tensor/tensor.h core/trace.h core/version.h core/kernel_choice.h data/augment.h data/batch.h data/builtin.h
    data/cifar.h data/data.h data/dataset.h data/image_codec.h data/image_folder.h data/loader.h
    data/open.h data/resized.h data/subset.h data/views.h io/atomic_file.h io/checkpoint_dir.h io/crc32c.h
    io/io.h io/model_state.h io/safetensors.h io/summary_writer.h io/train_dir_lock.h
    models/airbench.h models/models.h optim/adam.h optim/factory.h optim/optim.h optim/optimizer.h
    optim/parameter_group.h optim/parameters.h
    optim/schedule.h optim/sgd.h tower/balancer.h tower/batch_norm_sync.h tower/devices.h tower/loss_scale.h
    tower/reduction.h tower/split.h tower/tower.h tower/trainer.h tower/workers.h train/checkpoint.h
    train/fit.h train/hook.h train/lookahead.h train/metrics_file.h train/monitor.h train/records.h train/reporter.h
    train/startup.h train/step_window.h train/stop_on_signal.h train/tensorboard.h train/time_left.h
    train/trace.h train/train.h)
foreach(header IN LISTS TW_PUBLIC_HEADERS)
  get_filename_component(dir ${header} DIRECTORY)
  install(FILES ${PROJECT_SOURCE_DIR}/${header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/towerflow/${dir})
endforeach()

install(TARGETS cifar10_train cifar10_eval cifar10_predict towerflow_devices towerflow_ckpt
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# The package: its dependencies are found again on the user's side (the archives link them).
set(TW_CONFIG_HAVE_CUDA ${TW_HAVE_CUDA})
set(TW_CONFIG_HAVE_MPI ${TW_HAVE_MPI})
set(TW_CONFIG_HAVE_ONEDNN ${TW_HAVE_ONEDNN})
# The oneDNN the library was compiled against (its API differs between 2 and 3): the same one.
set(TW_CONFIG_DNNL_VERSION "${dnnl_VERSION}")
set(TW_CONFIG_DNNL_DIR "${dnnl_DIR}")
file(WRITE ${PROJECT_BINARY_DIR}/towerflowConfig.cmake.in [=[
# towerflow's CMake package. Usage:
#   find_package(towerflow REQUIRED)
#   target_link_libraries(app PRIVATE towerflow::towerflow)
# towerflow::towerflow brings every archive of the library, its include directory and its
# dependencies (found here again: Eigen, nlohmann-json, CLI11, libjpeg, libpng, protobuf, Boost's
# headers, threads, and the
# CUDA toolkit / MPI / oneDNN when the library was built with them).
@PACKAGE_INIT@

include(CMakeFindDependencyMacro)
find_dependency(Threads)
find_dependency(Eigen3 CONFIG)
find_dependency(nlohmann_json CONFIG)
find_dependency(CLI11 CONFIG)
find_dependency(JPEG)
find_dependency(PNG)
find_dependency(Protobuf)
find_dependency(Boost)
set(towerflow_HAVE_CUDA @TW_CONFIG_HAVE_CUDA@)
set(towerflow_HAVE_MPI @TW_CONFIG_HAVE_MPI@)
set(towerflow_HAVE_ONEDNN @TW_CONFIG_HAVE_ONEDNN@)
if(towerflow_HAVE_CUDA)
  find_dependency(CUDAToolkit)
endif()
if(towerflow_HAVE_MPI)
  find_dependency(MPI COMPONENTS CXX)
endif()
if(towerflow_HAVE_ONEDNN)
  find_dependency(dnnl @TW_CONFIG_DNNL_VERSION@ CONFIG HINTS "@TW_CONFIG_DNNL_DIR@")
  find_dependency(OpenMP COMPONENTS CXX)
endif()

include("${CMAKE_CURRENT_LIST_DIR}/towerflowTargets.cmake")
check_required_components(towerflow)
]=])
configure_package_config_file(${PROJECT_BINARY_DIR}/towerflowConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/towerflowConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/towerflow)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/towerflowConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/towerflowConfig.cmake ${PROJECT_BINARY_DIR}/towerflowConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/towerflow)

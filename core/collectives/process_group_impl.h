#pragma once
// Private to the collectives module: the MPI world, built by mpi_process_group.cc (or the stub in
// a build without MPI, which raises DeviceError saying how to rebuild).

#include <memory>

#include "core/collectives/process_group.h"

namespace towerflow::collectives::detail {

// MPI_Init_thread and MPI_COMM_WORLD. Called once, by world().
std::unique_ptr<ProcessGroup> make_mpi_world();

}  // namespace towerflow::collectives::detail

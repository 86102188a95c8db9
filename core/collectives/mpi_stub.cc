#include "core/collectives/process_group_impl.h"
#include "core/error.h"

namespace towerflow::collectives::detail {

std::unique_ptr<ProcessGroup> make_mpi_world() {
  raise<DeviceError>("this process was started by an MPI launcher (mpirun or srun), but this build of towerflow has "
                     "no MPI support; install Open MPI (sudo apt-get install libopenmpi-dev openmpi-bin) and "
                     "rebuild with -DTOWERFLOW_MPI=ON, or run the program without mpirun");
}

}  // namespace towerflow::collectives::detail

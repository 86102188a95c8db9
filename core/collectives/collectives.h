#pragma once
// Umbrella header of the collectives module.
#include "core/collectives/communicator.h"        // IWYU pragma: export
#include "core/collectives/context.h"             // IWYU pragma: export
#include "core/collectives/local_communicator.h"  // IWYU pragma: export
#include "core/collectives/nccl_communicator.h"   // IWYU pragma: export
#include "core/collectives/process_group.h"       // IWYU pragma: export

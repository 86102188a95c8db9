#pragma once
// Umbrella header of the tower module: replication, batch splitting, parallel towers, reduction.
#include "tower/batch_norm_sync.h"  // IWYU pragma: export
#include "tower/devices.h"  // IWYU pragma: export
#include "tower/loss_scale.h"  // IWYU pragma: export
#include "tower/reduction.h"  // IWYU pragma: export
#include "tower/split.h"      // IWYU pragma: export
#include "tower/trainer.h"    // IWYU pragma: export
#include "tower/workers.h"    // IWYU pragma: export

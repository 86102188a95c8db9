#pragma once
// Umbrella header of the optimizers module.
#include "optim/adam.h"        // IWYU pragma: export
#include "optim/factory.h"     // IWYU pragma: export
#include "optim/optimizer.h"   // IWYU pragma: export
#include "optim/parameter_group.h"  // IWYU pragma: export
#include "optim/parameters.h"  // IWYU pragma: export
#include "optim/schedule.h"    // IWYU pragma: export
#include "optim/sgd.h"         // IWYU pragma: export

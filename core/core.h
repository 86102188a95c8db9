#pragma once
// Umbrella header of towerflow's core: devices and the process options that make them, errors,
// logging, the CPU's kernel choice, tensors and their ops, modules and layers, allocators, process groups, traces and the
// version. The other areas have their own: tower/tower.h, optim/optim.h, data/data.h,
// models/models.h, io/io.h, train/train.h.
#include "core/collectives/context.h"        // IWYU pragma: export
#include "core/collectives/process_group.h"  // IWYU pragma: export
#include "core/device.h"                     // IWYU pragma: export
#include "core/error.h"                      // IWYU pragma: export
#include "core/kernel_choice.h"              // IWYU pragma: export
#include "core/log.h"                        // IWYU pragma: export
#include "core/memory/memory.h"              // IWYU pragma: export
#include "core/nn/init.h"                    // IWYU pragma: export
#include "core/nn/layers.h"                  // IWYU pragma: export
#include "core/nn/module.h"                  // IWYU pragma: export
#include "core/nn/whitening.h"               // IWYU pragma: export
#include "core/platform/options.h"           // IWYU pragma: export
#include "core/platform/registry.h"          // IWYU pragma: export
#include "core/tensor/device_ops.h"          // IWYU pragma: export
#include "core/tensor/mac_counter.h"         // IWYU pragma: export
#include "core/tensor/ops.h"                 // IWYU pragma: export
#include "core/tensor/tensor.h"              // IWYU pragma: export
#include "core/trace.h"                      // IWYU pragma: export
#include "core/version.h"                    // IWYU pragma: export

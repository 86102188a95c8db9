#pragma once
// The process-wide device registry: the one allowed singleton.
//
// Contract: devices are initialised once per process from ProcessOptions. A later call with a
// different configuration throws InvalidArgument naming the option that differs; the same
// configuration again is a no-op. Any accessor called before initialisation initialises with
// default options (every visible GPU, one CPU device). A physical device is touched (CUDA
// context, memory) only when a logical device on it is first used: allocators are created lazily.
// All functions are thread-safe. References returned stay valid until reset_devices_for_testing.
// Initialisation applies TOWERFLOW_FORCE_GPU_ALLOW_GROWTH (see options.h), resolves the logical
// devices on this machine (logical.h, which throws InvalidArgument for options that do not fit)
// and, with log_device_placement, logs the device mapping. A failed initialisation leaves the
// registry uninitialised.

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/memory/allocator.h"
#include "core/platform/logical.h"
#include "core/platform/options.h"
#include "core/platform/platform.h"

namespace towerflow {

// Initialises the registry (if not yet) and returns every logical device: the GPUs in
// TensorFlow's order (visible_device_list order, each GPU's virtual devices in turn), then the CPUs.
const std::vector<LogicalDevice>& initialise_devices(const ProcessOptions& opts);

// The devices a model should be replicated on by default: every logical GPU, or, with none,
// every logical CPU device.
std::vector<Device> logical_devices(const ProcessOptions& opts);
std::vector<Device> logical_devices();

const std::vector<LogicalDevice>& all_logical_devices();
const LogicalDevice& device_info(const Device& d);   // NotFound naming the devices that exist
Allocator& device_allocator(const Device& d);         // created on first use
const ProcessOptions& process_options();             // what the registry was initialised with

// Soft placement: returns d if it exists; otherwise, with allow_soft_placement, a device that
// does (the same kind's /x:0, else /cpu:0) and logs the fallback once; without, throws NotFound
// naming d, what exists, and the option.
Device place(const Device& d);

// Tests only: forgets the configuration and destroys the allocators (no tensor may be alive);
// the next initialisation uses this machine again.
void reset_devices_for_testing();
// Tests only: the next initialisation resolves devices on `platform` instead of this machine
// (call after reset_devices_for_testing). Allocators of described GPUs cannot be created.
void set_platform_for_testing(std::unique_ptr<Platform> platform);

}  // namespace towerflow

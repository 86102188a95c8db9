#pragma once
// ParameterSet: what an optimizer updates, independent of models and tensors.
//
// A model's parameters live in one contiguous float buffer (tensors are views into it), and so do
// its gradients. An optimizer steps one or several *copies* of that buffer: one per replica under
// an all-reduce (every replica applies the same update to the same reduced gradients, so they stay
// identical), or a single copy on the parameter device. The slots name the tensors inside the flat
// buffer, so that optimizer state can be saved and restored by name.
//
// Contract: the spans stay valid and keep their addresses for the optimizer's lifetime (the tower
// trainer allocates them once). for_each_copy(fn) calls fn(i) once for every copy, each on a
// thread bound to copies[i].device, and returns when all have finished, rethrowing the first
// exception; when empty, the optimizer runs the copies one after another on the caller's thread.
// skip_step (optional) is asked at every step, before anything else.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/device.h"

namespace towerflow::optim {

struct ParameterSlot {
  std::string name;            // "conv1.weight"
  std::size_t offset = 0;      // first element in the flat buffer
  std::size_t size = 0;        // elements
  std::vector<std::int64_t> shape;
};

struct ParameterCopy {
  Device device;
  std::span<float> params;       // the flat parameter buffer of this copy
  std::span<const float> grads;  // the flat gradient buffer the optimizer reads
};

struct ParameterSet {
  std::vector<ParameterSlot> slots;
  std::vector<ParameterCopy> copies;
  std::function<void(const std::function<void(int)>&)> for_each_copy;
  // When set and true, Optimizer::step() applies nothing, keeps its state and does not count the
  // step: the tower trainer sets it under fp16 for a step whose gradients overflowed.
  std::function<bool()> skip_step;

  std::size_t numel() const { return copies.empty() ? 0 : copies.front().params.size(); }

  // One copy over caller-owned host buffers, with a single slot "params" covering all of it
  // (or the given slots): for optimizers used outside the tower trainer and in tests.
  static ParameterSet single(std::span<float> params, std::span<const float> grads,
                             std::vector<ParameterSlot> slots = {});
};

}  // namespace towerflow::optim

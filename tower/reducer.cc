#include "tower/reducer.h"

#include <algorithm>
#include <set>

#include "core/collectives/communicator.h"
#include "core/collectives/process_group.h"
#include "core/log.h"
#include "core/platform/registry.h"
#include "core/tensor/device_ops.h"
#include "tower/workers.h"

namespace towerflow::tower {

double GradientReducer::exposed_seconds(std::span<const double> towers, double finish) const {
  return (towers.empty() ? 0.0 : *std::min_element(towers.begin(), towers.end())) + finish;
}

ReductionChoice choose_reduction(const Reduction& asked, const std::vector<Device>& devices,
                                 collectives::ProcessGroup& processes) {
  const auto* ar = std::get_if<AllReduce>(&asked);
  if (!ar) return {asked, nullptr};
  // NCCL cannot join logical devices sharing a physical GPU, and no communicator joins CPUs with
  // GPUs; both fall back to the parameter device.
  const bool all_cpu = std::all_of(devices.begin(), devices.end(), [](const Device& d) { return d.is_cpu(); });
  const bool all_gpu = std::all_of(devices.begin(), devices.end(), [](const Device& d) { return d.is_gpu(); });
  std::vector<int> ordinals;
  if (all_gpu)
    for (const Device& d : devices) ordinals.push_back(device_info(d).physical_index);
  if (!all_cpu && !(all_gpu && collectives::nccl_can_join(ordinals))) {
    const char* why = !all_gpu ? "the towers mix CPU and GPU devices"
                      : std::set<int>(ordinals.begin(), ordinals.end()).size() != ordinals.size()
                          ? "NCCL cannot all-reduce between virtual devices of one physical GPU"
                          : "this build has no NCCL";
    log_warning(str("all_reduce over ", device_list(devices), ": ", why,
                    "; reducing on the parameter device ", devices.front(), " instead"));
    return {ParameterDevice{devices.front()}, nullptr};
  }
  // GPUs: one NCCL communicator over every process's GPUs. CPUs: inside the process, then across
  // processes (Note [Hierarchical all-reduce] in core/collectives/process_group.cc).
  const bool across = processes.size() > 1;
  auto comm = collectives::make_communicator(devices, collectives::CommunicatorKind::Auto, ordinals,
                                             across ? &processes : nullptr);
  if (across && all_cpu) comm = collectives::make_hierarchical_communicator(std::move(comm), processes);
  return {asked, std::move(comm)};
}

// The strategies, one file each (reducer_*.cc).
std::unique_ptr<GradientReducer> make_parameter_device_reducer(Device device, const ReducerSetup& setup);
std::unique_ptr<GradientReducer> make_all_reduce_reducer(std::unique_ptr<collectives::Communicator> comm,
                                                         const ReducerSetup& setup);
std::unique_ptr<GradientReducer> make_bucketed_reducer(std::unique_ptr<collectives::Communicator> comm,
                                                       std::size_t bucket_bytes, const ReducerSetup& setup);

std::unique_ptr<GradientReducer> make_reducer(ReductionChoice choice, const ReducerSetup& setup) {
  if (const auto* pd = std::get_if<ParameterDevice>(&choice.reduction))
    return make_parameter_device_reducer(pd->device.value_or(Device::cpu(0)), setup);
  const auto& ar = std::get<AllReduce>(choice.reduction);
  if (ar.bucket_bytes > 0) return make_bucketed_reducer(std::move(choice.communicator), ar.bucket_bytes, setup);
  return make_all_reduce_reducer(std::move(choice.communicator), setup);
}

optim::ParameterSet replica_parameter_set(const ReducerSetup& setup) {
  optim::ParameterSet set;
  for (std::size_t i = 0; i < setup.devices.size(); ++i) {
    const nn::Module& m = *(*setup.replicas)[i];
    const Tensor p = m.flat_parameters(), g = m.flat_gradients();
    set.copies.push_back({.device = setup.devices[i],
                          .params = {p.data<float>(), static_cast<std::size_t>(p.numel())},
                          .grads = {g.data<float>(), static_cast<std::size_t>(g.numel())}});
  }
  set.for_each_copy = [workers = setup.workers](const std::function<void(int)>& fn) { workers->run(fn); };
  return set;
}

void scale_replica_gradients(const ReducerSetup& setup, float factor) {
  setup.workers->run([&](int i) {
    const Tensor g = (*setup.replicas)[static_cast<std::size_t>(i)]->flat_gradients();
    scale_(g, factor);
  });
}

}  // namespace towerflow::tower

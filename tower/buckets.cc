#include "tower/buckets.h"

#include <algorithm>
#include <limits>
#include <set>
#include <unordered_map>

#include "core/tensor/autograd.h"

// Note [Bucketed reduction during backward]
// The autograd engine runs the graph's nodes by decreasing creation number and accumulates each
// node's input gradients into the leaves before it moves to the next node (autograd.cc). So when
// the engine is about to run the node numbered s, every node numbered above s has finished, and a
// parameter's gradient is final once every node consuming the parameter has run: when the engine
// starts a node numbered below the smallest consumer number. Before backward, the trainer walks
// the graph from the loss, records for each bucket (a contiguous range of the flat gradient
// buffer, whole parameters, filled from the last parameter backwards, as backward produces them)
// the smallest number of a node consuming one of its parameters, and wraps every node's backward
// function with a check that marks the buckets whose parameters are all final. A communication
// thread per tower all-reduces the buckets in a fixed order as they become ready, while the tower
// thread carries on with backward. Every tower reduces the same buckets in the same order, so
// collectives match across towers.
// "Final" is the host's view: on a GPU, backward has only queued the kernels that write the
// bucket on the device's compute stream, and NCCL runs on a stream of its own. So when a bucket
// becomes ready the tower thread records an event on its backend's queue (Backend::record_event;
// null on the CPU, whose kernels are done when they return), and the all-reduce of the bucket is
// ordered after that event (Communicator::all_reduce_sum_after: the NCCL stream waits for it on
// the GPU). Without the event NCCL would sum partly written gradients and replicas would drift.

namespace towerflow::tower {

void BucketPlan::plan(const nn::Module& m, std::size_t bytes) {
  const auto params = m.named_parameters();
  const std::size_t cap = std::max<std::size_t>(1, bytes / sizeof(float));
  bucket_of_param.assign(params.size(), 0);
  std::vector<std::size_t> offsets(params.size() + 1, 0);
  for (std::size_t p = 0; p < params.size(); ++p)
    offsets[p + 1] = offsets[p] + static_cast<std::size_t>(params[p].second.numel());
  buckets.clear();
  std::size_t end = params.size();
  while (end > 0) {
    std::size_t begin = end;
    while (begin > 0 && (begin == end || offsets[end] - offsets[begin] < cap)) --begin;
    if (offsets[end] - offsets[begin] > cap && end - begin > 1) ++begin;  // keep under the cap
    for (std::size_t p = begin; p < end; ++p) bucket_of_param[p] = buckets.size();
    buckets.push_back({offsets[begin], offsets[end]});
    end = begin;
  }
}

void BucketPlan::install_hooks(const nn::Module& m, const Tensor& loss,
                             BucketTracker& tracker) const {
  std::unordered_map<const TensorImpl*, std::size_t> param_index;
  {
    std::size_t p = 0;
    for (auto& [name, t] : m.named_parameters()) param_index[t.impl()] = p++;
  }
  std::vector<std::uint64_t> min_seq(buckets.size(), std::numeric_limits<std::uint64_t>::max());
  std::vector<Node*> nodes;
  std::set<Node*> seen;
  if (loss.grad_fn()) {
    nodes.push_back(loss.grad_fn().get());
    seen.insert(nodes.back());
  }
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    Node* n = nodes[k];
    for (const Tensor& in : n->inputs) {
      if (!in.defined()) continue;
      if (auto it = param_index.find(in.impl()); it != param_index.end()) {
        auto& s = min_seq[bucket_of_param[it->second]];
        s = std::min(s, n->sequence);
      }
      Node* child = in.impl()->grad_fn.get();
      if (child && seen.insert(child).second) nodes.push_back(child);
    }
  }
  tracker.reset(std::move(min_seq));
  for (Node* n : nodes) {
    if (!n->backward) continue;
    n->backward = [inner = std::move(n->backward), seq = n->sequence,
                   t = &tracker](const Tensor& g) {
      t->before_node(seq);
      return inner(g);
    };
  }
}

}  // namespace towerflow::tower

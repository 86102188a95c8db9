#include "core/tensor/autograd.h"

#include <algorithm>
#include <atomic>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "core/tensor/backend_impl.h"
#include "core/tensor/ops.h"
#include "core/trace.h"

namespace towerflow {

// Note [Tape order]
// A node's sequence number is taken from one process-wide counter when the op runs. An op can
// only consume tensors that exist, so every consumer of a node's output has a larger number.
// Running the reachable nodes by decreasing number therefore visits each node after all of its
// consumers, when its output gradient is complete: the order a tape played backwards gives,
// without keeping a tape per thread (models on different threads never share nodes).

namespace {
std::atomic<std::uint64_t> g_sequence{0};

// Whether t is the only tensor referring to its buffer (the engine's sums are held by grads only).
bool exclusive(const Tensor& t) {
  return t.impl_ptr().use_count() == 1 && t.impl()->storage.use_count() == 1;
}

// dst += src (same shape), both on one device.
void accumulate_into(const Tensor& dst, const Tensor& src) {
  backend_for(dst.device())
      .axpy(dst.numel(), 1.0f, src.data<float>(), dst.data<float>());
}
}  // namespace

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor* t : inputs)
    if (t && t->defined() && t->requires_grad()) return true;
  return false;
}

// Note [Gradients written over the output's]
// Once a node has run, the engine drops its output gradient g. An op whose input gradient has
// g's shape, and whose kernel reads each element of g before it writes that element of the input
// gradient (ReLU's, GELU's, dropout's and scale's backward; batch norm's where the backend says
// so), writes the input gradient over g where gradient_reusable(g), and returns g. The engine's is
// then the only reference to g's buffer: no other node was handed the same tensor (add hands its
// g to both of its inputs, which gives the buffer two), and no view of it is alive. The writes land
// on lines the kernel has just read, which are still in the caches, where a fresh buffer would
// have each of its lines read from memory before the write (write-allocate), and the pass holds
// one buffer less. On a 2-core Zen 4 EPYC (`towerflow_bench_train --model resnet20 --precision
// bf16 --trace t.json`, eight alternating rounds with one kernel-choice cache), ResNet-20's
// batch-norm backward passes took 9.4-11.5 ms a step against 11.3-13.8, and the step ran
// 1.03-1.06x as fast (fp32: 0.99-1.05x, six rounds).

bool gradient_reusable(const Tensor& g) {
  return g.defined() && g.dtype() == DType::kFloat32 && g.is_contiguous() && exclusive(g);
}

namespace {
std::shared_ptr<Node> new_node(std::string name, std::vector<Tensor> inputs) {
  auto node = std::make_shared<Node>();
  node->name = std::move(name);
  node->scope = OpScope::current();
  node->sequence = g_sequence.fetch_add(1, std::memory_order_relaxed);
  node->inputs = std::move(inputs);
  return node;
}
}  // namespace

void record(Tensor& output, std::string name, std::vector<Tensor> inputs,
            std::function<std::vector<Tensor>(const Tensor&)> backward) {
  std::shared_ptr<Node> node = new_node(std::move(name), std::move(inputs));
  node->backward = [backward = std::move(backward)](const Tensor& g, const std::vector<Tensor>&) {
    return backward(g);
  };
  output.impl()->grad_fn = std::move(node);
}

void record_summing(Tensor& output, std::string name, std::vector<Tensor> inputs,
                    std::function<std::vector<Tensor>(const Tensor& grad_output,
                                                      const std::vector<Tensor>& partial)>
                        backward) {
  std::shared_ptr<Node> node = new_node(std::move(name), std::move(inputs));
  node->backward = std::move(backward);
  node->sums_in_place = true;
  output.impl()->grad_fn = std::move(node);
}

// Note [Gradients summed in place]
// A tensor read by several ops gets the sum of their gradients: the engine keeps the sum so far
// for the node that produced it, and adds each further consumer's gradient to it (axpy), a pass
// that reads both and writes the sum. An op recorded with record_summing is offered, for each
// input, the sum so far where the engine holds the only reference to its buffer; it may add its
// own gradient into that buffer as it computes it and return the buffer, leaving nothing to add.
// A ResNet block's input is read by the block's first convolution and by the shortcut: an
// identity shortcut's gradient comes first (tape order) and the convolution adds its input
// gradient to it as its kernel stores it, instead of writing it to a tensor of its own that the
// engine then adds; a projection shortcut, run before conv1, comes second and adds to conv1's.
// The bits are the same as the separate add's (one rounding of the same two values). In bf16 the
// kernels that add so are towerflow's pair, Winograd and AMX kernels and the emulated path;
// oneDNN's store, and the engine adds.

// Note [Final leaf gradients]
// A leaf's gradient is the sum of what every node consuming it gives. The engine counts, before
// it runs anything, the edges from the reachable nodes to each leaf; it takes one off each time a
// node that consumes the leaf has run (or was passed over because no gradient flowed to it), and
// the leaf is final when its count reaches zero. Tape order (Note [Tape order]) does not need to
// be known to the caller: a bucketed reduction starts reducing a parameter's gradient from this
// signal while the engine goes on with the nodes below.

void Tensor::backward() const { towerflow::backward(*this, {}); }

void backward(const Tensor& loss, const BackwardHooks& hooks) {
  if (!loss.defined())
    raise<InvalidArgument>("backward() on an undefined tensor (default-constructed or moved from)");
  if (loss.numel() != 1)
    raise<InvalidArgument>("backward() needs a scalar (one-element) tensor, got ", loss.describe());
  if (!loss.requires_grad())
    raise<InvalidArgument>("backward() on ", loss.describe(),
                           ", which does not require grad (no input of its ops requires grad, "
                           "or it was computed under no_grad)");
  NoGradGuard no_grad;  // gradient arithmetic records no history
  TensorImpl* const root = loss.impl();
  const Tensor seed = Tensor::full(loss.shape(), 1.0f, loss.device());
  if (!root->grad_fn) {  // a leaf scalar
    if (root->grad) accumulate_into(Tensor(root->grad), seed);
    else root->grad = seed.impl_ptr();
    if (hooks.on_leaf_final) hooks.on_leaf_final(loss);
    return;
  }

  // Everything reachable from the root. Held by shared_ptr: freeing a node's inputs below may
  // drop the last other owner of the nodes behind it.
  std::vector<std::shared_ptr<Node>> nodes;
  std::unordered_set<Node*> seen;
  std::vector<std::shared_ptr<Node>> stack{root->grad_fn};
  seen.insert(stack.back().get());
  while (!stack.empty()) {
    std::shared_ptr<Node> n = stack.back();
    stack.pop_back();
    nodes.push_back(n);
    if (!n->backward)
      raise<InvalidArgument>("backward() through op ", n->name,
                             " whose graph was already freed by an earlier backward()");
    for (const Tensor& in : n->inputs) {
      if (!in.defined()) continue;
      const std::shared_ptr<Node>& child = in.impl()->grad_fn;
      if (child && seen.insert(child.get()).second) stack.push_back(child);
    }
  }
  std::sort(nodes.begin(), nodes.end(),
            [](const auto& a, const auto& b) { return a->sequence > b->sequence; });

  // Note [Final leaf gradients]: consuming edges per leaf still to run.
  std::unordered_map<TensorImpl*, int> pending;
  if (hooks.on_leaf_final)
    for (const std::shared_ptr<Node>& n : nodes)
      for (const Tensor& in : n->inputs)
        if (in.defined() && !in.impl()->grad_fn && in.requires_grad()) ++pending[in.impl()];
  // Takes node n's edges off its leaves' counts, naming the leaves that became final. Holds the
  // inputs itself: the node's are cleared once it has run.
  auto leaves_done = [&](std::vector<Tensor> inputs) {
    if (!hooks.on_leaf_final) return;
    for (const Tensor& in : inputs) {
      if (!in.defined()) continue;
      auto it = pending.find(in.impl());
      if (it != pending.end() && --it->second == 0) hooks.on_leaf_final(in);
    }
  };

  std::unordered_map<Node*, Tensor> grads;
  grads[root->grad_fn.get()] = seed;
  for (const std::shared_ptr<Node>& node : nodes) {
    Node* n = node.get();
    auto it = grads.find(n);
    if (it == grads.end()) {  // nothing flowed here
      leaves_done(n->inputs);
      continue;
    }
    const Tensor g = std::move(it->second);
    grads.erase(it);
    std::vector<Tensor> partial;  // Note [Gradients summed in place]
    if (n->sums_in_place) {
      partial.resize(n->inputs.size());
      for (std::size_t i = 0; i < n->inputs.size(); ++i) {
        const Tensor& in = n->inputs[i];
        if (!in.defined() || !in.requires_grad() || !in.impl()->grad_fn) continue;
        const auto slot = grads.find(in.impl()->grad_fn.get());
        if (slot != grads.end() && exclusive(slot->second)) partial[i] = slot->second;
      }
    }
    std::vector<Tensor> input_grads;
    {
      const OpScope scope(n->scope, false);
      const trace::Span span("grad", n->name, n->scope);
      input_grads = n->backward(g, partial);
    }
    // The inputs whose gradient the op summed into the partial sum it was given.
    std::vector<bool> summed(n->inputs.size(), false);
    for (std::size_t i = 0; i < partial.size() && i < input_grads.size(); ++i)
      summed[i] = partial[i].defined() && input_grads[i].defined() &&
                  input_grads[i].impl() == partial[i].impl();
    partial.clear();
    TW_CHECK(input_grads.size() == n->inputs.size(), "op ", n->name, " returned ",
             input_grads.size(), " gradients for ", n->inputs.size(), " inputs");
    for (std::size_t i = 0; i < n->inputs.size(); ++i) {
      const Tensor& in = n->inputs[i];
      const Tensor& gi = input_grads[i];
      if (!in.defined() || !gi.defined() || !in.requires_grad()) continue;
      TW_CHECK(gi.shape() == in.shape(), "op ", n->name, " gave gradient ", gi.describe(),
               " for input ", in.describe());
      TensorImpl* in_impl = in.impl();
      if (in_impl->grad_fn) {
        auto [slot, inserted] = grads.try_emplace(in_impl->grad_fn.get(), gi);
        if (!inserted) {
          if (summed[i]) continue;  // the op added its part to the sum already
          Tensor& acc = slot->second;
          // Sum in place when this map holds the only reference to the buffer (the usual case:
          // a ResNet block's input gets a fresh gradient from each of its two consumers).
          // Otherwise it is shared (add passes g to both inputs): sum into a fresh buffer.
          if (!exclusive(acc)) acc = acc.clone();
          accumulate_into(acc, gi);
        }
      } else if (in_impl->grad) {
        accumulate_into(Tensor(in_impl->grad), gi);
      } else {
        in_impl->grad = gi.clone().impl_ptr();
      }
    }
    // Free the graph as we go: saved activations return to the pool before backward ends.
    n->backward = nullptr;
    leaves_done(std::move(n->inputs));
    n->inputs.clear();
  }
}

}  // namespace towerflow

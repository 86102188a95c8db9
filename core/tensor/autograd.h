#pragma once
// Autograd: the recorded graph behind Tensor::backward().
//
// Each differentiable op that sees an input requiring grad (while grad_enabled()) records a Node:
// its differentiable inputs and a closure that maps the gradient of its one output to the
// gradients of those inputs. Nodes are numbered in creation order, so the graph reachable from a
// loss, sorted by that number, descending, is the tape played backwards: every node runs after
// all the nodes that consume its output. See Note [Tape order] in autograd.cc.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor/tensor.h"

namespace towerflow {

struct Node {
  std::string name;          // the op's name, "Conv2D"
  std::string scope;         // OpScope::current() when recorded: its gradient runs in it too
  std::uint64_t sequence;    // creation order
  std::vector<Tensor> inputs;  // the inputs gradients flow to (undefined entries allowed)
  // Gradients for `inputs`, in order; an undefined entry means "no gradient". Where sums_in_place,
  // partial[i] is input i's gradient summed so far from its other consumers, given where the
  // engine holds the only reference to it (else undefined): the op may add its own gradient into
  // it and return it as entry i (Note [Gradients summed in place] in autograd.cc). Otherwise
  // partial is empty.
  std::function<std::vector<Tensor>(const Tensor& grad_output, const std::vector<Tensor>& partial)>
      backward;
  bool sums_in_place = false;
};

// Hooks a caller can give backward(loss, hooks).
struct BackwardHooks {
  // Called with each leaf that requires grad (a tensor without grad_fn: a parameter) as soon as
  // its gradient is final in this backward pass: every node of the graph that consumes it has run
  // and added its part (Note [Final leaf gradients] in autograd.cc). On the thread running
  // backward, once per leaf reached by the graph; a leaf the graph does not reach is not named.
  // The gradient's kernels may still be queued on the leaf's device (a GPU stream).
  std::function<void(const Tensor& leaf)> on_leaf_final;
};

// loss.backward(), running the hooks.
void backward(const Tensor& loss, const BackwardHooks& hooks);

// True when an op with these inputs must record history.
bool needs_grad(std::initializer_list<const Tensor*> inputs);

// For a backward closure, on the output gradient g it was given: true where the op may write an
// input's gradient of g's shape over g and return g as that gradient. g is then contiguous
// float32, and nothing but the engine refers to its buffer, so no other node and no caller sees
// the write (Note [Gradients written over the output's] in autograd.cc).
bool gradient_reusable(const Tensor& g);

// Makes `output` the result of a differentiable op: output.grad_fn = a new Node. Call only when
// needs_grad(...) was true.
void record(Tensor& output, std::string name, std::vector<Tensor> inputs,
            std::function<std::vector<Tensor>(const Tensor&)> backward);
// The same for an op whose backward may add its input gradients into the partial sums it is
// given (Node::backward, Node::sums_in_place).
void record_summing(Tensor& output, std::string name, std::vector<Tensor> inputs,
                    std::function<std::vector<Tensor>(const Tensor& grad_output,
                                                      const std::vector<Tensor>& partial)>
                        backward);

}  // namespace towerflow

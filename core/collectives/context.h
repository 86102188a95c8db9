#pragma once
// CollectiveContext: what a thread is doing when it enters a collective (the training step, and
// which data the collective carries), so that a stall report and the record of recent collectives
// can say "step 12, gradient bucket 3" rather than only "all-reduce #37".
//
//   collectives::ContextScope at_step({.step = step});            // around one training step
//   trainer.forward_backward(batch);                              // its towers inherit the step
//
// Contract:
// - Thread-local, like trace spans: a scope sets the calling thread's context and restores the
//   previous one when it ends; scopes nest. It is a diagnostic annotation only: no collective's
//   result or order depends on it.
// - A field left at its default keeps the enclosing scope's value, so a reducer can add "gradient
//   bucket 3" inside a step's scope without knowing the step.
// - tower::Trainer hands its caller's context to its towers' threads, and its reducers add what
//   they reduce; train::fit sets the step. A program with its own loop sets the step itself.

#include <cstdint>
#include <string>

namespace towerflow::collectives {

struct CollectiveContext {
  std::int64_t step = 0;          // the training step (from 1); 0: not known
  const char* purpose = nullptr;  // a string literal, "gradient bucket"; null: not known
  int index = -1;                 // which one of purpose (the bucket); -1: none
};

// This thread's context (all defaults outside any scope).
const CollectiveContext& current_context();

// "step 12, gradient bucket 3", "step 12", "gradients"; "" when nothing is known.
std::string describe(const CollectiveContext& context);

class ContextScope {
 public:
  explicit ContextScope(const CollectiveContext& context);
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  CollectiveContext saved_;
};

}  // namespace towerflow::collectives

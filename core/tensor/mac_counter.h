#pragma once
// Counts the multiply-adds of the convolutions and matrix products that CPU devices run on this
// thread while a counter lives, op by op, as torch.utils.flop_counter.FlopCounterMode does: what a
// step really computes, measured rather than worked out from the model's definition.
//
//   MacCounter count;
//   Tensor loss = cross_entropy(model.forward(x), labels);
//   backward(loss);
//   for (const auto& row : count.rows()) ...  // "conv1", "conv forward", "1x32x32x3 -> 64, 5x5 ...", macs
//
// Counters nest (the innermost counts); ops on other threads (towers) and on GPUs are not counted.

#include <cstdint>
#include <string>
#include <vector>

namespace towerflow {

class MacCounter {
 public:
  struct Row {
    std::string scope;  // the op scope of the call (ops.h's OpScope), "" outside any
    std::string op;     // "conv forward", "conv backward input", "conv backward weight", "matmul"
    std::string shape;  // "2x32x32x3 -> 64, 5x5, stride 1, pad 2" or "2x4096 * 4096x384 (b^T)"
    std::int64_t macs = 0;
  };

  MacCounter();
  ~MacCounter();
  MacCounter(const MacCounter&) = delete;
  MacCounter& operator=(const MacCounter&) = delete;

  const std::vector<Row>& rows() const { return rows_; }
  std::int64_t total() const;
  // The total of the rows whose op starts with `prefix` ("conv forward", "conv backward", ...).
  std::int64_t total(const std::string& prefix) const;

  // Called by the CPU backend for each product it runs (nothing where no counter lives).
  static void count(const char* op, const std::string& shape, std::int64_t macs);
  static bool active();

 private:
  MacCounter* outer_;
  std::vector<Row> rows_;
};

}  // namespace towerflow

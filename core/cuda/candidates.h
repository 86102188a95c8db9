#pragma once
// Candidates: a ranked list of ways to do one thing (cuDNN's algorithms for one convolution shape
// and precision), tried in rank order until one runs; the one that ran is remembered, so later
// calls start with it.
//
// Contract:
// - run(run_one, what) calls run_one(candidate) for the candidates from current() on, in rank
//   order. run_one returns std::nullopt when the candidate ran, or the name of the status it
//   could not run with (a failure that the next candidate may not share, such as cuDNN's
//   NOT_SUPPORTED); it throws for failures that another candidate would not cure, and run() lets
//   that exception through with current() unchanged.
// - The first candidate that runs becomes current() and is returned. Candidates before it are not
//   tried again by later calls.
// - When every candidate from current() on fails, run() throws DeviceError naming `what`, each
//   candidate tried with its status, in order, and `fix`; current() is unchanged, so the next call
//   tries them again. An empty list throws the same way, naming no candidate.
// - label(candidate) names a candidate in that message ("IMPLICIT_PRECOMP_GEMM").
// - Not thread-safe: one list belongs to one device context, used by one thread at a time.
// Includes no CUDA header, so that the order and the caching are tested on any machine.

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace towerflow::gpu {

template <typename Candidate>
class Candidates {
 public:
  Candidates() = default;
  explicit Candidates(std::vector<Candidate> ranked) : ranked_(std::move(ranked)) {}

  bool empty() const { return ranked_.empty(); }
  std::size_t size() const { return ranked_.size(); }
  const std::vector<Candidate>& ranked() const { return ranked_; }
  // The index later calls start from: the candidate that last ran, else 0.
  std::size_t current() const { return current_; }

  template <typename RunOne, typename Label>
  const Candidate& run(RunOne&& run_one, Label&& label, const std::string& what,
                       const std::string& fix) {
    std::string failures;
    for (std::size_t i = current_; i < ranked_.size(); ++i) {
      const std::optional<std::string> status = run_one(ranked_[i]);
      if (!status) {
        current_ = i;
        return ranked_[i];
      }
      failures += str(failures.empty() ? "" : ", ", label(ranked_[i]), " (", *status, ")");
    }
    if (failures.empty())
      raise<DeviceError>(what, ": no candidate is left to try; ", fix);
    raise<DeviceError>(what, " failed with every candidate, in rank order: ", failures, "; ", fix);
  }

 private:
  std::vector<Candidate> ranked_;
  std::size_t current_ = 0;
};

}  // namespace towerflow::gpu

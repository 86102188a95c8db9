// Candidates (core/cuda/candidates.h), with a fake runner in place of cuDNN: the order, the
// remembered candidate, and the error when every candidate fails.
#include <catch2/catch.hpp>

#include <optional>
#include <string>
#include <vector>

#include "core/cuda/candidates.h"
#include "core/error.h"

namespace tw = towerflow;
using Catch::Matchers::Contains;

namespace {

struct Algo {
  int id;
};

// Runs algorithms as a GPU would for one shape: those in `fails` answer with their status.
struct FakeRunner {
  std::vector<std::pair<int, std::string>> fails;
  std::vector<int> tried;
  std::optional<std::string> operator()(const Algo& a) {
    tried.push_back(a.id);
    for (const auto& [id, status] : fails)
      if (id == a.id) return status;
    return std::nullopt;
  }
};

std::string label(const Algo& a) { return "algo " + std::to_string(a.id); }

const std::string kWhat = "cuDNN forward convolution of n=8 h=32 w=32 c=16 -> 16 in bf16";
const std::string kFix = "try another batch size";

}  // namespace

TEST_CASE("candidates: the next one runs when the first is not supported, and is remembered",
          "[candidates]") {
  tw::gpu::Candidates<Algo> c({{1}, {6}, {0}});
  FakeRunner runner{{{1, "CUDNN_STATUS_NOT_SUPPORTED_SHAPE"}}};
  CHECK(c.run(runner, label, kWhat, kFix).id == 6);
  CHECK(runner.tried == std::vector<int>{1, 6});
  CHECK(c.current() == 1);
  // Later calls of that shape start with the one that ran: the first is not tried again.
  runner.tried.clear();
  CHECK(c.run(runner, label, kWhat, kFix).id == 6);
  CHECK(runner.tried == std::vector<int>{6});
}

TEST_CASE("candidates: the first that runs is kept without trying the rest", "[candidates]") {
  tw::gpu::Candidates<Algo> c({{1}, {6}});
  FakeRunner runner;
  CHECK(c.run(runner, label, kWhat, kFix).id == 1);
  CHECK(runner.tried == std::vector<int>{1});
  CHECK(c.current() == 0);
}

TEST_CASE("candidates: when all fail, the error names what ran, each candidate's status, and the "
          "fix", "[candidates]") {
  tw::gpu::Candidates<Algo> c({{1}, {6}, {0}});
  FakeRunner runner{{{1, "CUDNN_STATUS_NOT_SUPPORTED"},
                     {6, "CUDNN_STATUS_EXECUTION_FAILED_CUDART"},
                     {0, "CUDNN_STATUS_BAD_PARAM"}}};
  std::string message;
  try {
    c.run(runner, label, kWhat, kFix);
  } catch (const tw::DeviceError& e) {
    message = e.what();
  }
  CHECK_THAT(message, Contains(kWhat));
  CHECK_THAT(message, Contains("algo 1 (CUDNN_STATUS_NOT_SUPPORTED), algo 6 "
                               "(CUDNN_STATUS_EXECUTION_FAILED_CUDART), algo 0 "
                               "(CUDNN_STATUS_BAD_PARAM)"));
  CHECK_THAT(message, Contains(kFix));
  CHECK(c.current() == 0);  // nothing ran: the next call tries them all again
  runner.fails.pop_back();  // algo 0 runs now
  runner.tried.clear();
  CHECK(c.run(runner, label, kWhat, kFix).id == 0);
  CHECK(runner.tried == std::vector<int>{1, 6, 0});
}

TEST_CASE("candidates: a failure the runner raises passes through and changes nothing",
          "[candidates]") {
  tw::gpu::Candidates<Algo> c({{1}, {6}});
  int calls = 0;
  auto throwing = [&](const Algo&) -> std::optional<std::string> {
    ++calls;
    throw tw::DeviceError("cudnnConvolutionForward: CUDNN_STATUS_INTERNAL_ERROR");
  };
  CHECK_THROWS_AS(c.run(throwing, label, kWhat, kFix), tw::DeviceError);
  CHECK(calls == 1);
  CHECK(c.current() == 0);
  tw::gpu::Candidates<Algo> none;
  FakeRunner runner;
  CHECK_THROWS_WITH(none.run(runner, label, kWhat, kFix), Contains("no candidate"));
}

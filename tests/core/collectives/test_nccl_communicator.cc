// The NCCL communicator on real GPUs ([nccl]). Own main: without a usable GPU it prints
// "SKIPPED: no CUDA device (<reason>)" and exits 77 (CTest: Skipped). With --two-gpu it runs the
// two-rank cases and exits 77 with "SKIPPED: ... needs 2 GPUs" where fewer exist; without it, the
// cases one rank can run. tests/gpu/run_gpu_checks.sh runs both.

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "core/collectives/nccl_communicator.h"
#include "core/queue_event.h"
#include "core/cuda/status.h"

using namespace towerflow;
using namespace towerflow::collectives;

namespace {

// n floats of device memory on `ordinal`, filled with `value`.
struct DeviceFloats {
  int ordinal;
  std::size_t n;
  float* ptr = nullptr;
  DeviceFloats(int o, std::size_t count, float value) : ordinal(o), n(count) {
    REQUIRE(cudaSetDevice(o) == cudaSuccess);
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&ptr), n * sizeof(float)) == cudaSuccess);
    std::vector<float> v(n, value);
    REQUIRE(cudaMemcpy(ptr, v.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~DeviceFloats() {
    cudaSetDevice(ordinal);
    cudaFree(ptr);
  }
  std::vector<float> host() const {
    std::vector<float> v(n);
    cudaSetDevice(ordinal);
    REQUIRE(cudaMemcpy(v.data(), ptr, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    return v;
  }
  std::span<float> span() const { return {ptr, n}; }
};

std::vector<std::exception_ptr> run_participants(int n, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int p = 0; p < n; ++p)
    threads.emplace_back([&, p] {
      try {
        fn(p);
      } catch (...) {
        errors[p] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

template <typename E>
bool threw(const std::exception_ptr& e) {
  if (!e) return false;
  try {
    std::rethrow_exception(e);
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

TEST_CASE("one NCCL rank: all-reduce, broadcast, barrier, abort, reset, destroy", "[nccl1]") {
  {
    NcclCommunicator comm({Device::gpu(0)}, {0});
    DeviceFloats a(0, 1 << 20, 2.5f);
    comm.all_reduce_sum(0, a.span());
    const auto v = a.host();
    CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x == 2.5f; }));
    comm.broadcast(0, a.span(), 0);
    comm.barrier(0);
    comm.abort("test abort");
    CHECK_THROWS_AS(comm.all_reduce_sum(0, a.span()), CollectiveAborted);
    comm.reset();
    comm.all_reduce_sum(0, a.span());  // usable again on fresh NCCL communicators
    CHECK(a.host()[0] == 2.5f);
  }  // destroy: finalize in a group, then destroy, without hanging (CTest's timeout would say)
  SUCCEED("destroyed");
}

TEST_CASE("two NCCL ranks: all-reduce, count mismatch, abort mid-collective, reset, destroy",
          "[nccl2]") {
  NcclCommunicator comm({Device::gpu(0), Device::gpu(1)}, {0, 1});
  std::vector<std::unique_ptr<DeviceFloats>> bufs;
  for (int p = 0; p < 2; ++p) bufs.push_back(std::make_unique<DeviceFloats>(p, 1 << 20, p + 1.0f));
  auto errors = run_participants(2, [&](int p) { comm.all_reduce_sum(p, bufs[p]->span()); });
  for (auto& e : errors) REQUIRE(e == nullptr);
  for (int p = 0; p < 2; ++p) CHECK(bufs[p]->host()[12345] == 3.0f);

  // Counts that differ raise InvalidArgument on every participant, before NCCL is called.
  errors = run_participants(2, [&](int p) {
    comm.all_reduce_sum(p, bufs[p]->span().subspan(0, p == 0 ? 100 : 200));
  });
  CHECK(threw<InvalidArgument>(errors[0]));
  CHECK(threw<InvalidArgument>(errors[1]));

  // Participant 1 never joins; abort() from another thread releases participant 0.
  std::exception_ptr waiting;
  std::thread t([&] {
    try {
      comm.all_reduce_sum(0, bufs[0]->span());
    } catch (...) {
      waiting = std::current_exception();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  comm.abort("participant 1 failed (test)");
  t.join();
  CHECK(threw<CollectiveAborted>(waiting));

  comm.reset();
  errors = run_participants(2, [&](int p) { comm.all_reduce_sum(p, bufs[p]->span()); });
  for (auto& e : errors) REQUIRE(e == nullptr);
  CHECK(bufs[0]->host()[0] == 6.0f);  // 3 + 3
}

TEST_CASE("queued all-reduces of several buckets, then one wait", "[nccl1]") {
  NcclCommunicator comm({Device::gpu(0)}, {0});
  std::vector<std::unique_ptr<DeviceFloats>> buckets;
  for (std::size_t n : {1u << 10, 17u, 1u << 18, 1u})
    buckets.push_back(std::make_unique<DeviceFloats>(0, n, 1.5f));
  for (auto& b : buckets) comm.all_reduce_sum_queued(0, b->span(), nullptr);
  comm.wait_queued(0);
  for (auto& b : buckets) CHECK(b->host().back() == 1.5f);
  comm.wait_queued(0);  // nothing queued: returns at once
}

TEST_CASE("two NCCL ranks: queued buckets summed, then one wait each", "[nccl2]") {
  NcclCommunicator comm({Device::gpu(0), Device::gpu(1)}, {0, 1});
  std::vector<std::vector<std::unique_ptr<DeviceFloats>>> buckets(2);
  for (int p = 0; p < 2; ++p)
    for (std::size_t n : {1u << 10, 17u, 1u << 18, 1u})
      buckets[p].push_back(std::make_unique<DeviceFloats>(p, n, p + 1.0f));
  auto errors = run_participants(2, [&](int p) {
    for (auto& b : buckets[p]) comm.all_reduce_sum_queued(p, b->span(), nullptr);
    comm.wait_queued(p);
  });
  for (auto& e : errors) REQUIRE(e == nullptr);
  for (int p = 0; p < 2; ++p)
    for (auto& b : buckets[p]) CHECK(b->host().back() == 3.0f);
}

namespace {

// A CUDA event recorded on a stream of the test's, as a tensor backend's record_event() makes one.
class TestEvent final : public QueueEvent {
 public:
  explicit TestEvent(cudaStream_t stream) {
    REQUIRE(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming) == cudaSuccess);
    REQUIRE(cudaEventRecord(event_, stream) == cudaSuccess);
  }
  ~TestEvent() override { cudaEventDestroy(event_); }
  void synchronize() const override { cudaEventSynchronize(event_); }
  void make_stream_wait(void* stream) const override {
    REQUIRE(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), event_, 0) == cudaSuccess);
  }
  bool reached() const { return cudaEventQuery(event_) == cudaSuccess; }

 private:
  cudaEvent_t event_ = nullptr;
};

void CUDART_CB sleep_300ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }

// Pinned host floats: an asynchronous copy from them is queued without the host waiting for the
// stream (a copy from pageable memory may wait).
struct PinnedFloats {
  float* ptr = nullptr;
  PinnedFloats(std::size_t n, float value) {
    REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&ptr), n * sizeof(float)) == cudaSuccess);
    std::fill(ptr, ptr + n, value);
  }
  ~PinnedFloats() { cudaFreeHost(ptr); }
};

}  // namespace

// Note [Bucketed reduction during backward] in tower/reducer_bucketed.cc: the all-reduce of a
// bucket must not start before the compute stream has written the bucket. Here the "backward" is
// 300 ms of work queued on a compute stream, then the gradient written; all_reduce_sum_after must order
// NCCL's stream after it. A communicator that ignored the event would read the old values (the
// 2-GPU case sees them in the sum) and return before the compute stream got there (both cases).
TEST_CASE("an all-reduce after a ready event waits, on the GPU, for the work before the event", "[nccl1]") {
  NcclCommunicator comm({Device::gpu(0)}, {0});
  DeviceFloats a(0, 1 << 16, 1.0f);
  cudaStream_t compute = nullptr;
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaLaunchHostFunc(compute, sleep_300ms, nullptr) == cudaSuccess);
  PinnedFloats written(a.n, 4.0f);
  REQUIRE(cudaMemcpyAsync(a.ptr, written.ptr, a.n * sizeof(float), cudaMemcpyHostToDevice, compute) ==
          cudaSuccess);
  TestEvent ready(compute);
  const auto t0 = std::chrono::steady_clock::now();
  comm.all_reduce_sum_after(0, a.span(), &ready);
  CHECK(ready.reached());  // NCCL's stream waited for the compute stream
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(250));
  CHECK(a.host()[777] == 4.0f);
  REQUIRE(cudaStreamSynchronize(compute) == cudaSuccess);
  cudaStreamDestroy(compute);
}

TEST_CASE("two NCCL ranks: a bucket written late on one GPU's compute stream is summed as written", "[nccl2]") {
  NcclCommunicator comm({Device::gpu(0), Device::gpu(1)}, {0, 1});
  DeviceFloats a(0, 1 << 16, 1.0f), b(1, 1 << 16, 1.0f);
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  cudaStream_t compute = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaLaunchHostFunc(compute, sleep_300ms, nullptr) == cudaSuccess);
  PinnedFloats written(b.n, 5.0f);
  REQUIRE(cudaMemcpyAsync(b.ptr, written.ptr, b.n * sizeof(float), cudaMemcpyHostToDevice, compute) ==
          cudaSuccess);
  TestEvent ready(compute);
  auto errors = run_participants(2, [&](int p) {
    comm.all_reduce_sum_after(p, p == 0 ? a.span() : b.span(), p == 0 ? nullptr : &ready);
  });
  for (auto& e : errors) REQUIRE(e == nullptr);
  CHECK(a.host()[4321] == 6.0f);  // 1 + 5: participant 1's bucket as the compute stream wrote it
  CHECK(b.host()[4321] == 6.0f);
  cudaSetDevice(1);
  REQUIRE(cudaStreamSynchronize(compute) == cudaSuccess);
  cudaStreamDestroy(compute);
}

int main(int argc, char** argv) {
  const gpu::CudaAvailability a = gpu::cuda_availability();
  if (!a.usable()) {
    std::printf("SKIPPED: no CUDA device (%s)\n", a.reason.c_str());
    return 77;
  }
  bool two = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--two-gpu") == 0) {
      two = true;
      continue;
    }
    args.push_back(argv[i]);
  }
  if (two && a.device_count < 2) {
    std::printf("SKIPPED: the two-rank NCCL cases need 2 GPUs; %d found\n", a.device_count);
    return 77;
  }
  static char tag1[] = "[nccl1]", tag2[] = "[nccl2]";
  args.push_back(two ? tag2 : tag1);
  std::printf("[nccl] %s\n", gpu::describe(a).c_str());
  return Catch::Session().run(static_cast<int>(args.size()), args.data());
}

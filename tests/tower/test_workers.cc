#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>

#include "core/collectives/local_communicator.h"
#include "core/error.h"
#include "tower/workers.h"

using namespace towerflow;
using namespace towerflow::tower;

TEST_CASE("workers run one persistent thread per device, bound once", "[tower][workers]") {
  std::mutex mu;
  std::set<std::thread::id> bound_ids;
  std::vector<Device> bound;
  DeviceWorkers w({Device::cpu(0), Device::cpu(1), Device::cpu(2)}, [&](const Device& d) {
    std::lock_guard lock(mu);
    bound.push_back(d);
    bound_ids.insert(std::this_thread::get_id());
  });
  std::vector<std::thread::id> ids(3);
  std::atomic<int> moved{0};  // Catch2's assertions are for the test's thread
  for (int round = 0; round < 50; ++round) {
    std::vector<int> hit(3, 0);
    w.run([&](int i) {
      hit[i]++;
      if (round == 0) ids[i] = std::this_thread::get_id();
      else if (ids[i] != std::this_thread::get_id()) ++moved;  // the same thread every step
    });
    CHECK(hit == std::vector<int>{1, 1, 1});
  }
  CHECK(moved.load() == 0);
  CHECK(bound.size() == 3);
  CHECK(bound_ids.size() == 3);
  CHECK(bound_ids.count(std::this_thread::get_id()) == 0);
}

TEST_CASE("the first exception is rethrown after every worker stopped", "[tower][workers]") {
  DeviceWorkers w({Device::cpu(0), Device::cpu(1), Device::cpu(2)});
  std::atomic<int> finished{0};
  REQUIRE_THROWS_WITH(w.run([&](int i) {
    if (i == 1) throw OutOfMemory("out of memory on /cpu:1");
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    if (i == 2) throw DataError("later failure on /cpu:2");
    ++finished;
  }),
                      Catch::Contains("/cpu:1"));
  CHECK(finished == 1);  // worker 0 ran to the end before run() returned
  // Still usable afterwards.
  std::atomic<int> ok{0};
  w.run([&](int) { ++ok; });
  CHECK(ok == 3);
}

TEST_CASE("a failing worker releases the others from a collective, its error wins", "[tower][workers]") {
  const std::vector<Device> devs = {Device::cpu(0), Device::cpu(1), Device::cpu(2)};
  DeviceWorkers w(devs);
  collectives::LocalCommunicator comm(devs);
  std::vector<std::vector<float>> bufs(3, std::vector<float>(64, 1.f));
  auto on_error = [&](int i, std::exception_ptr) { comm.abort(str("tower ", i, " failed")); };
  for (int repeat = 0; repeat < 5; ++repeat) {
    REQUIRE_THROWS_AS(w.run([&](int i) {
      if (i == 2) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        throw OutOfMemory("out of memory on /cpu:2");
      }
      comm.all_reduce_sum(i, bufs[i]);
    }, on_error),
                      OutOfMemory);
    comm.reset();
  }
  CHECK(bufs[0][0] == 1.f);  // no reduction happened
  REQUIRE_THROWS_AS(DeviceWorkers({}), InvalidArgument);
}

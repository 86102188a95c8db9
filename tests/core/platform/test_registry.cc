#include <catch2/catch.hpp>

#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/platform/registry.h"
#include "platform_test_util.h"

namespace tw = towerflow;
using tw::Device;
using tw::ProcessOptions;
using Catch::Matchers::Contains;

namespace {

// Each test starts from an uninitialised registry and leaves one behind.
struct FreshRegistry {
  FreshRegistry() { tw::reset_devices_for_testing(); }
  ~FreshRegistry() { tw::reset_devices_for_testing(); }
};

// Captures log messages for the scope.
struct CapturedLog {
  std::vector<std::string> lines;
  tw::LogSink previous;
  CapturedLog() {
    previous = tw::set_log_sink([this](tw::LogLevel, std::string_view m) { lines.emplace_back(m); });
  }
  ~CapturedLog() { tw::set_log_sink(previous); }
};

}  // namespace

TEST_CASE("default registry on this machine: one CPU device with the host's memory and threads", "[platform][registry]") {
  FreshRegistry fresh;
  const auto& devices = tw::all_logical_devices();
  REQUIRE_FALSE(devices.empty());
  const auto& cpu = tw::device_info(Device::cpu(0));
  tw::HostDescription host = tw::query_host();
  CHECK(cpu.memory_limit_bytes == host.memory_bytes);
  CHECK(cpu.intra_op_threads == host.cores);
  CHECK(tw::process_options() == ProcessOptions{});
  // Without GPUs the default replicas are the CPU devices.
  if (tw::make_system_platform()->gpus().empty()) CHECK(tw::logical_devices() == std::vector<Device>{Device::cpu(0)});
}

TEST_CASE("device_count CPU=N gives N logical CPU devices and the same options again are a no-op", "[platform][registry]") {
  FreshRegistry fresh;
  tw::set_platform_for_testing(tw::testing::machine(0, 0, 8));
  ProcessOptions opts{.device_count = {{"CPU", 4}}};
  auto devices = tw::logical_devices(opts);
  CHECK(devices == std::vector<Device>{Device::cpu(0), Device::cpu(1), Device::cpu(2), Device::cpu(3)});
  CHECK(tw::device_info(Device::cpu(3)).intra_op_threads == 2);
  CHECK_NOTHROW(tw::initialise_devices(opts));
  // An explicit default is the same configuration.
  CHECK_NOTHROW(tw::initialise_devices({.allow_growth = false, .device_count = {{"CPU", 4}}}));
}

TEST_CASE("a different configuration after initialisation names the option", "[platform][registry]") {
  FreshRegistry fresh;
  tw::set_platform_for_testing(tw::testing::machine(2, 16));
  tw::initialise_devices({.visible_device_list = "1,0"});
  CHECK(tw::device_info(Device::gpu(0)).physical_index == 1);
  CHECK_THROWS_WITH(tw::initialise_devices({.visible_device_list = "0,1"}),
                    Contains("visible_device_list: \"1,0\" vs \"0,1\"") && Contains("already initialised"));
  CHECK_THROWS_WITH(tw::initialise_devices({.visible_device_list = "1,0", .allow_growth = true}),
                    Contains("allow_growth: false vs true"));
  CHECK(tw::logical_devices() == std::vector<Device>{Device::gpu(0), Device::gpu(1)});
}

TEST_CASE("an accessor before initialisation fixes the defaults", "[platform][registry]") {
  FreshRegistry fresh;
  tw::set_platform_for_testing(tw::testing::machine(0, 0));
  tw::device_info(Device::cpu(0));
  CHECK_THROWS_AS(tw::initialise_devices({.device_count = {{"CPU", 2}}}), tw::InvalidArgument);
}

TEST_CASE("a failed initialisation leaves the registry free to try again", "[platform][registry]") {
  FreshRegistry fresh;
  tw::set_platform_for_testing(tw::testing::machine(1, 16));
  CHECK_THROWS_WITH(tw::initialise_devices({.visible_device_list = "2"}),
                    Contains("listed an invalid GPU id '2' but visible device count is 1"));
  tw::set_platform_for_testing(tw::testing::machine(1, 16));
  CHECK(tw::initialise_devices({.visible_device_list = "0"}).size() == 2);
}

TEST_CASE("device_info and place: unknown devices, soft placement logged once", "[platform][registry]") {
  {
    FreshRegistry fresh;
    tw::set_platform_for_testing(tw::testing::machine(0, 0));
    tw::initialise_devices({.device_count = {{"CPU", 2}}});
    CHECK_THROWS_WITH(tw::device_info(Device::gpu(0)),
                      Contains("device /gpu:0 does not exist; the logical devices are /cpu:0, /cpu:1"));
    CHECK(tw::place(Device::cpu(1)) == Device::cpu(1));
    CHECK_THROWS_AS(tw::place(Device::gpu(0)), tw::NotFound);
    CHECK_THROWS_WITH(tw::place(Device::gpu(0)), Contains("allow_soft_placement=true"));
  }
  {
    FreshRegistry fresh;
    tw::set_platform_for_testing(tw::testing::machine(2, 16));
    tw::initialise_devices({.allow_soft_placement = true});
    CapturedLog log;
    CHECK(tw::place(Device::gpu(7)) == Device::gpu(0));  // same kind's device 0
    CHECK(tw::place(Device::gpu(7)) == Device::gpu(0));
    CHECK(tw::place(Device::cpu(3)) == Device::cpu(0));
    CHECK(tw::place(Device::gpu(1)) == Device::gpu(1));
    REQUIRE(log.lines.size() == 2);  // once per missing device
    CHECK_THAT(log.lines[0], Contains("/gpu:7 does not exist") && Contains("using /gpu:0"));
  }
  {
    FreshRegistry fresh;
    tw::set_platform_for_testing(tw::testing::machine(0, 0));
    tw::initialise_devices({.allow_soft_placement = true});
    CHECK(tw::place(Device::gpu(0)) == Device::cpu(0));  // no GPU at all: the CPU
  }
}

TEST_CASE("log_device_placement logs the device mapping at initialisation", "[platform][registry]") {
  FreshRegistry fresh;
  tw::set_platform_for_testing(tw::testing::machine(1, 16));
  CapturedLog log;
  tw::initialise_devices({.log_device_placement = true});
  REQUIRE(log.lines.size() == 1);
  CHECK_THAT(log.lines[0], Contains("/job:localhost/replica:0/task:0/device:GPU:0 -> physical GPU 0 (GPU model 0"));
  CHECK_THAT(log.lines[0], Contains("/job:localhost/replica:0/task:0/device:CPU:0 -> physical CPU 0"));
}

TEST_CASE("TOWERFLOW_FORCE_GPU_ALLOW_GROWTH overrides allow_growth with a warning", "[platform][registry]") {
  FreshRegistry fresh;
  tw::set_platform_for_testing(tw::testing::machine(2, 16));
  ::setenv("TOWERFLOW_FORCE_GPU_ALLOW_GROWTH", "true", 1);
  CapturedLog log;
  const auto& devices = tw::initialise_devices({.allow_growth = false});
  ::unsetenv("TOWERFLOW_FORCE_GPU_ALLOW_GROWTH");
  CHECK(devices[0].allow_growth);
  CHECK(devices[1].allow_growth);
  REQUIRE(log.lines.size() == 1);
  CHECK_THAT(log.lines[0], Contains("overriding allow_growth with true") && Contains("the options said false"));
}

TEST_CASE("CPU allocators are created on first use, once, and honour the limit", "[platform][registry]") {
  FreshRegistry fresh;
  tw::set_platform_for_testing(tw::testing::machine(0, 0));
  ProcessOptions opts;
  opts.virtual_devices.cpu_memory_limits_mb = std::vector<double>{64, 64};
  tw::initialise_devices(opts);
  std::vector<tw::Allocator*> seen(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&seen, t] { seen[t] = &tw::device_allocator(Device::cpu(t % 2)); });
  for (auto& t : threads) t.join();
  CHECK(seen[0] == seen[2]);
  CHECK(seen[1] == seen[3]);
  CHECK(seen[0] != seen[1]);
  tw::Allocator& a = *seen[0];
  CHECK(a.stats().bytes_limit == 64 * tw::testing::kMiB);
  void* p = a.allocate(1 << 20);
  CHECK(p != nullptr);
  CHECK(a.stats().bytes_in_use >= (1u << 20));
  a.deallocate(p);
  CHECK_THROWS_AS(a.allocate(65 * tw::testing::kMiB), tw::OutOfMemory);
}

TEST_CASE("concurrent first use initialises once and every thread sees the same devices", "[platform][registry]") {
  FreshRegistry fresh;
  tw::set_platform_for_testing(tw::testing::machine(2, 16));
  ProcessOptions opts{.device_count = {{"CPU", 2}}};
  std::vector<const std::vector<tw::LogicalDevice>*> seen(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] { seen[t] = &tw::initialise_devices(opts); });
  for (auto& t : threads) t.join();
  for (auto* s : seen) CHECK(s == seen[0]);
  CHECK(seen[0]->size() == 4);
}

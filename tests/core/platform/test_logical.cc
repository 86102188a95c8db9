#include <catch2/catch.hpp>

#include "core/error.h"
#include "core/platform/logical.h"
#include "platform_test_util.h"

namespace tw = towerflow;
using tw::Device;
using tw::ProcessOptions;
using tw::testing::kGiB;
using tw::testing::kMiB;
using tw::testing::machine;
using Catch::Matchers::Contains;

namespace {

std::vector<tw::LogicalDevice> resolve(const ProcessOptions& opts, const tw::Platform& p) {
  return tw::resolve_logical_devices(opts, p);
}

std::string message_of(const ProcessOptions& opts, const tw::Platform& p) {
  try {
    resolve(opts, p);
  } catch (const tw::InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("TensorFlow's documented virtual-device example", "[platform][logical]") {
  // From TensorFlow's GPUOptions.Experimental.virtual_devices documentation:
  //   visible_device_list = "1,0"; virtual_devices {memory_limit: 1GB, 2GB}; virtual_devices {}
  //   -> GPU:0 = visible GPU 1 with 1GB, GPU:1 = visible GPU 1 with 2GB, GPU:2 = visible GPU 0, all memory.
  auto p = tw::load_platform_json(tw::testing::platform_fixture("two_gpus.json"));
  ProcessOptions opts{.visible_device_list = "1,0"};
  opts.virtual_devices.gpu_memory_limits_mb = std::vector<std::vector<double>>{{1024, 2048}, {}};
  auto devices = resolve(opts, *p);
  REQUIRE(devices.size() == 4);  // three GPUs and the CPU
  CHECK(devices[0].device == Device::gpu(0));
  CHECK(devices[0].physical_index == 1);
  CHECK(devices[0].memory_limit_bytes == 1 * kGiB);
  CHECK(devices[1].device == Device::gpu(1));
  CHECK(devices[1].physical_index == 1);
  CHECK(devices[1].memory_limit_bytes == 2 * kGiB);
  CHECK(devices[2].device == Device::gpu(2));
  CHECK(devices[2].physical_index == 0);
  // "All available memory": the total less TensorFlow's reserve for compute capability 8.x.
  CHECK(devices[2].memory_limit_bytes == 40 * kGiB - 1536 * kMiB);
  CHECK(devices[3].device == Device::cpu(0));
  CHECK(devices[3].memory_limit_bytes == 64 * kGiB);
  CHECK(devices[3].intra_op_threads == 16);
  CHECK(devices[0].description.find("physical GPU 1 (NVIDIA A100-SXM4-40GB, pci bus id 0000:0f:00.0") == 0);
  CHECK_THAT(devices[0].description, Contains("memory limit 1.0 GiB, growth off"));
}

TEST_CASE("defaults: every visible GPU in order, one CPU with the host's memory and threads", "[platform][logical]") {
  auto p = machine(4, 16, 7, 40, 256);
  auto devices = resolve({}, *p);
  REQUIRE(devices.size() == 5);
  for (int i = 0; i < 4; ++i) {
    CHECK(devices[i].device == Device::gpu(i));
    CHECK(devices[i].physical_index == i);
    CHECK(devices[i].memory_limit_bytes == 16 * kGiB - 1050 * kMiB);  // reserve for 7.x
    CHECK_FALSE(devices[i].allow_growth);                             // TensorFlow's default
  }
  CHECK(devices[4].device == Device::cpu(0));
  CHECK(devices[4].memory_limit_bytes == 256 * kGiB);
  CHECK(devices[4].intra_op_threads == 40);
  CHECK(devices[4].allow_growth);
  CHECK(devices[4].description == "physical CPU 0, memory limit 256.0 GiB, growth on, 40 intra-op threads");
}

TEST_CASE("the system reserve follows TensorFlow's table", "[platform][logical]") {
  CHECK(tw::gpu_system_memory_reserve(kGiB, 8) == 225 * kMiB);        // under 2 GiB
  CHECK(tw::gpu_system_memory_reserve(4 * kGiB, 6) == 500 * kMiB);    // Pascal and older
  CHECK(tw::gpu_system_memory_reserve(16 * kGiB, 7) == 1050 * kMiB);  // Volta, Turing
  CHECK(tw::gpu_system_memory_reserve(80 * kGiB, 9) == 1536 * kMiB);  // Ampere and newer
  auto small = tw::load_platform_json(tw::testing::platform_fixture("one_small_gpu.json"));
  auto devices = resolve({}, *small);
  CHECK(devices[0].memory_limit_bytes == 2 * kGiB - 500 * kMiB);  // 2 GiB is not "under 2 GiB"
}

TEST_CASE("device_count caps GPUs and makes several CPU devices with split threads", "[platform][logical]") {
  auto p = machine(4, 16, 8, 10);
  auto devices = resolve({.device_count = {{"GPU", 2}, {"CPU", 3}}}, *p);
  REQUIRE(devices.size() == 5);
  CHECK(devices[0].physical_index == 0);
  CHECK(devices[1].physical_index == 1);
  for (int i = 0; i < 3; ++i) {
    CHECK(devices[2 + i].device == Device::cpu(i));
    CHECK(devices[2 + i].intra_op_threads == 3);  // 10 threads over 3 devices
  }
  auto none = resolve({.device_count = {{"GPU", 0}}}, *p);
  REQUIRE(none.size() == 1);
  CHECK(none[0].device.is_cpu());
  // More CPU devices than threads: one thread each, never zero.
  auto many = resolve({.device_count = {{"CPU", 16}}}, *machine(0, 0, 8, 4));
  REQUIRE(many.size() == 16);
  CHECK(many.back().intra_op_threads == 1);
  auto given = resolve({.device_count = {{"CPU", 2}}, .intra_op_threads = 5}, *p);
  CHECK(given[4].intra_op_threads == 5);
}

TEST_CASE("fraction, growth, per-device limits and CPU virtual devices", "[platform][logical]") {
  auto p = machine(2, 16);
  auto f = resolve({.per_process_gpu_memory_fraction = 0.25, .allow_growth = true}, *p);
  CHECK(f[0].memory_limit_bytes == 4 * kGiB);
  CHECK(f[1].memory_limit_bytes == 4 * kGiB);
  CHECK(f[0].allow_growth);
  ProcessOptions limits{.per_process_gpu_memory_fraction = 0.5,
                        .memory_limit_mb = {{Device::gpu(1), 3072}, {Device::cpu(1), 512}}};
  limits.virtual_devices.cpu_memory_limits_mb = std::vector<double>{1024, 2048};
  auto l = resolve(limits, *p);
  REQUIRE(l.size() == 4);
  CHECK(l[0].memory_limit_bytes == 8 * kGiB);     // the fraction
  CHECK(l[1].memory_limit_bytes == 3 * kGiB);     // memory_limit wins over the fraction
  CHECK(l[2].memory_limit_bytes == 1 * kGiB);     // CPU virtual device
  CHECK(l[3].memory_limit_bytes == 512 * kMiB);   // memory_limit wins over the virtual device
  CHECK(l[2].intra_op_threads == 4);              // 8 threads over 2 CPU devices
  auto same = resolve({.memory_growth = {{0, true}, {1, true}}}, *p);
  CHECK(same[0].allow_growth);
  CHECK(same[1].allow_growth);
}

TEST_CASE("visible_device_list errors use TensorFlow's wording and say what to do", "[platform][logical]") {
  auto one = machine(1, 16);
  auto msg = message_of({.visible_device_list = "2"}, *one);
  CHECK_THAT(msg, Contains("'visible_device_list' listed an invalid GPU id '2' but visible device count is 1"));
  CHECK_THAT(msg, Contains("list ids among them"));
  auto two = machine(2, 16);
  CHECK_THAT(message_of({.visible_device_list = "0,1,0"}, *two),
             Contains("visible_device_list contained a duplicate entry: 0,1,0"));
  CHECK_THAT(message_of({.visible_device_list = "0,x"}, *two),
             Contains("Could not parse entry in 'visible_device_list': 'x'"));
  CHECK_THAT(message_of({.visible_device_list = "-1"}, *two), Contains("invalid GPU id '-1'"));
  CHECK_THAT(message_of({.visible_device_list = "0"}, *machine(0, 0)),
             Contains("visible device count is 0"));
  CHECK(tw::parse_visible_device_list(" 1, 0 ", 2) == std::vector<int>{1, 0});
  CHECK(tw::parse_visible_device_list("", 3) == std::vector<int>{0, 1, 2});
}

TEST_CASE("memory option errors", "[platform][logical]") {
  auto p = machine(2, 16);
  for (double bad : {0.0, -0.5, 1.5})
    CHECK_THAT(message_of({.per_process_gpu_memory_fraction = bad}, *p), Contains("must be in (0, 1]"));
  CHECK_NOTHROW(resolve({.per_process_gpu_memory_fraction = 1.0}, *p));

  ProcessOptions both{.per_process_gpu_memory_fraction = 0.5};
  both.virtual_devices.gpu_memory_limits_mb = std::vector<std::vector<double>>{{1024}, {}};
  CHECK_THAT(message_of(both, *p),
             Contains("It's invalid to set per_process_gpu_memory_fraction when virtual_devices is set"));

  ProcessOptions mismatch{.visible_device_list = "1"};
  mismatch.virtual_devices.gpu_memory_limits_mb = std::vector<std::vector<double>>{{1024}, {}};
  auto m = message_of(mismatch, *p);
  CHECK_THAT(m, Contains("doesn't match the number of elements in the virtual_devices list"));
  CHECK_THAT(m, Contains("1 GPU in use"));
  CHECK_THAT(m, Contains("has 2 GPU entries"));

  ProcessOptions too_big;
  too_big.virtual_devices.gpu_memory_limits_mb = std::vector<std::vector<double>>{{8192, 10240}, {}};
  auto big = message_of(too_big, *p);
  CHECK_THAT(big, Contains("the memory limits on GPU 0 (GPU model 0) add up to more than its 16.0 GiB"));
  CHECK_THAT(big, Contains("/gpu:0 8.0 GiB + /gpu:1 10.0 GiB"));

  CHECK_THAT(message_of({.memory_limit_mb = {{Device::gpu(0), 20000}}}, *p),
             Contains("memory limit of /gpu:0 is 19.5 GiB but GPU 0 (GPU model 0) has 16.0 GiB; use a limit of at most 16384 MiB"));
  CHECK_THAT(message_of({.memory_limit_mb = {{Device::cpu(0), 100000}}}, *p),
             Contains("but the host has 64.0 GiB"));
  CHECK_THAT(message_of({.memory_limit_mb = {{Device::gpu(5), 1024}}}, *p),
             Contains("memory_limit names /gpu:5 but the logical devices are /gpu:0, /gpu:1, /cpu:0"));

  ProcessOptions cpu_sum;
  cpu_sum.virtual_devices.cpu_memory_limits_mb = std::vector<double>{40000, 40000};
  CHECK_THAT(message_of(cpu_sum, *p), Contains("the memory limits on the host add up to more than its 64.0 GiB"));
}

TEST_CASE("growth must agree between GPUs, counts must agree", "[platform][logical]") {
  auto p = machine(2, 16);
  auto msg = message_of({.allow_growth = false, .memory_growth = {{1, true}}}, *p);
  CHECK_THAT(msg, Contains("Memory growth cannot differ between GPU devices: GPU 0 has false, GPU 1 has true"));
  CHECK_THAT(message_of({.memory_growth = {{3, true}}}, *p), Contains("memory_growth names GPU 3"));
  ProcessOptions cpus{.device_count = {{"CPU", 3}}};
  cpus.virtual_devices.cpu_memory_limits_mb = std::vector<double>{512, 512};
  CHECK_THAT(message_of(cpus, *p), Contains("virtual_devices lists 2 CPU devices but device_count has CPU=3"));
  CHECK_THAT(message_of({.device_count = {{"CPU", 0}}}, *p), Contains("CPU=0 leaves the process without a CPU device"));
}

TEST_CASE("format_byte_size prints binary units with one decimal", "[platform][logical]") {
  CHECK(tw::format_byte_size(4 * kGiB) == "4.0 GiB");
  CHECK(tw::format_byte_size(1536 * kMiB) == "1.5 GiB");
  CHECK(tw::format_byte_size(512 * kMiB) == "512.0 MiB");
  CHECK(tw::format_byte_size(2048) == "2.0 KiB");
  CHECK(tw::format_byte_size(100) == "100 B");
}

TEST_CASE("the default GPU limit without growth is taken from free memory at first use",
          "[platform][logical]") {
  auto p = machine(2, 40, 8);
  auto devices = resolve({}, *p);
  REQUIRE(devices.size() == 3);
  for (int i = 0; i < 2; ++i) {
    CHECK(devices[i].limit_from_free_memory);
    CHECK(devices[i].memory_limit_bytes == 40 * kGiB - 1536 * kMiB);  // the bound until then
    CHECK_THAT(devices[i].description,
               Contains("memory limit at first use: free memory less the reserve (at most 38.5 GiB), growth off"));
  }
  CHECK_FALSE(devices[2].limit_from_free_memory);  // the CPU's limit is the host's memory
  // A fraction, growth, an explicit limit or a virtual device fix the limit when resolving.
  CHECK_FALSE(resolve({.per_process_gpu_memory_fraction = 0.5}, *p)[0].limit_from_free_memory);
  CHECK_FALSE(resolve({.allow_growth = true}, *p)[0].limit_from_free_memory);
  ProcessOptions limited;
  limited.memory_limit_mb[Device::gpu(1)] = 4096;
  auto l = resolve(limited, *p);
  CHECK(l[0].limit_from_free_memory);
  CHECK_FALSE(l[1].limit_from_free_memory);
  CHECK(l[1].memory_limit_bytes == 4 * kGiB);
  ProcessOptions split;
  split.virtual_devices.gpu_memory_limits_mb = std::vector<std::vector<double>>{{1024, 1024}, {}};
  auto v = resolve(split, *p);
  CHECK_FALSE(v[0].limit_from_free_memory);
  CHECK_FALSE(v[1].limit_from_free_memory);
  CHECK(v[2].limit_from_free_memory);  // GPU 1, whole
}

TEST_CASE("gpu_memory_limit_at_open: free memory less the reserve, or the fraction of the total",
          "[platform][logical]") {
  // 80 GiB card, 3 GiB already taken by NCCL, cuDNN and cuBLAS: the limit leaves them alone.
  CHECK(tw::gpu_memory_limit_at_open("/gpu:0", 77 * kGiB, 80 * kGiB, std::nullopt, 1536 * kMiB) ==
        77 * kGiB - 1536 * kMiB);
  // A fraction is of the total, whatever is free (TensorFlow's rule).
  CHECK(tw::gpu_memory_limit_at_open("/gpu:0", 10 * kGiB, 80 * kGiB, 0.5, 1536 * kMiB) ==
        40 * kGiB);
  CHECK(tw::gpu_memory_limit_at_open("/gpu:0", 1536 * kMiB + 256, 80 * kGiB, std::nullopt,
                                     1536 * kMiB) == 256);
}

TEST_CASE("gpu_memory_limit_at_open: less free than the reserve is an error naming the device, "
          "the memory and the fix", "[platform][logical]") {
  std::string message;
  try {
    tw::gpu_memory_limit_at_open("/gpu:1", 200 * kMiB, 16 * kGiB, std::nullopt, 225 * kMiB);
  } catch (const tw::OutOfMemory& e) {
    message = e.what();
  }
  CHECK_THAT(message, Contains("/gpu:1 has 200.0 MiB free of its 16.0 GiB"));
  CHECK_THAT(message, Contains("225.0 MiB"));
  CHECK_THAT(message, Contains("per_process_gpu_memory_fraction"));
  CHECK_THAT(message, Contains("memory_limit"));
  CHECK_THAT(message, Contains("allow_growth=true"));
  CHECK_THROWS_AS(tw::gpu_memory_limit_at_open("/gpu:0", kGiB, 16 * kGiB, std::nullopt, kGiB),
                  tw::OutOfMemory);
}

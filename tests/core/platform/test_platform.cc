#include <catch2/catch.hpp>

#include <unistd.h>

#include "core/error.h"
#include "core/platform/platform.h"
#include "platform_test_util.h"

namespace tw = towerflow;
using tw::testing::kGiB;
using tw::testing::platform_fixture;
using Catch::Matchers::Contains;

TEST_CASE("described machines load from JSON", "[platform]") {
  auto p = tw::load_platform_json(platform_fixture("four_v100.json"));
  CHECK(p->host() == tw::HostDescription{.cores = 40, .memory_bytes = 270582939648});
  auto gpus = p->gpus();
  REQUIRE(gpus.size() == 4);
  CHECK(gpus[1].name == "Tesla V100-SXM2-16GB");
  CHECK(gpus[1].memory_bytes == 16 * kGiB);
  CHECK(gpus[1].pci_bus_id == "0000:06:00.0");
  CHECK(gpus[1].compute_capability() == "7.0");
  CHECK_THAT(p->name(), Contains("4x Tesla V100"));
  auto small = tw::load_platform_json(platform_fixture("one_small_gpu.json"));  // a number works too
  CHECK(small->gpus()[0].compute_capability() == "6.1");
  CHECK(tw::load_platform_json(platform_fixture("cpu_only.json"))->gpus().empty());
}

TEST_CASE("malformed descriptions name the file and the field", "[platform]") {
  CHECK_THROWS_AS(tw::load_platform_json("/nonexistent.json"), tw::NotFound);
  CHECK_THROWS_AS(tw::load_platform_json(platform_fixture("bad_not_json.json")), tw::DataError);
  CHECK_THROWS_WITH(tw::load_platform_json(platform_fixture("bad_missing_memory.json")),
                    Contains("bad_missing_memory.json: the description lacks 'gpus[0].memory_bytes'"));
  CHECK_THROWS_WITH(tw::load_platform_json(platform_fixture("bad_compute_capability.json")),
                    Contains("gpus[0].compute_capability must be \"MAJOR.MINOR\""));
  CHECK_THROWS_WITH(tw::parse_platform_json(R"({"cpu": {"cores": 0, "memory_bytes": 1}})", "m.json"),
                    Contains("m.json: cpu.cores must be a whole number >= 1"));
  CHECK_THROWS_WITH(tw::parse_platform_json(R"({"cpu": {"cores": 1, "memory_bytes": 1}, "gpu": []})", "m.json"),
                    Contains("unknown field 'gpu'"));
  CHECK_THROWS_WITH(tw::parse_platform_json(R"({"gpus": []})", "m.json"), Contains("lacks 'cpu'"));
  // Found by fuzz/platform_json: a number too large for a double escaped as nlohmann's out_of_range.
  CHECK_THROWS_WITH(tw::parse_platform_json(R"({"cpu": {"cores": 1, "memory_bytes": 1717986E384}})", "m.json"),
                    Contains("m.json: not valid JSON") && Contains("number overflow"));
}

TEST_CASE("CUDA_DEVICE_ORDER and CUDA_VISIBLE_DEVICES act on a described machine as the driver does", "[platform]") {
  auto gpus = tw::load_platform_json(platform_fixture("four_v100.json"))->gpus();
  auto ids = [](const std::vector<tw::GpuDescription>& g) {
    std::vector<std::string> out;
    for (const auto& d : g) out.push_back(d.pci_bus_id);
    return out;
  };
  CHECK(ids(tw::apply_cuda_environment(gpus, nullptr, nullptr)) == ids(gpus));
  CHECK(ids(tw::apply_cuda_environment(gpus, nullptr, "PCI_BUS_ID")) ==
        std::vector<std::string>{"0000:06:00.0", "0000:07:00.0", "0000:86:00.0", "0000:89:00.0"});
  CHECK(ids(tw::apply_cuda_environment(gpus, "2,0", "PCI_BUS_ID")) ==
        std::vector<std::string>{"0000:86:00.0", "0000:06:00.0"});
  CHECK(ids(tw::apply_cuda_environment(gpus, "3,9,0", nullptr)) == std::vector<std::string>{"0000:07:00.0"});
  CHECK(tw::apply_cuda_environment(gpus, "", nullptr).empty());
  CHECK(tw::apply_cuda_environment(gpus, "-1", nullptr).empty());
}

TEST_CASE("this machine: the host as sysconf sees it, GPUs never throw", "[platform]") {
  auto p = tw::make_system_platform();
  tw::HostDescription host = p->host();
  CHECK(host.cores >= 1);
  CHECK(host.cores <= sysconf(_SC_NPROCESSORS_CONF));
  CHECK(host.memory_bytes > 0);
  CHECK(host.memory_bytes <= static_cast<std::size_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE));
  std::vector<tw::GpuDescription> gpus;
  CHECK_NOTHROW(gpus = p->gpus());
  for (const auto& g : gpus) {
    CHECK(g.memory_bytes > 0);
    CHECK(g.compute_major >= 3);
  }
  if (gpus.empty()) CHECK_THAT(p->name(), Contains("no GPU"));
}

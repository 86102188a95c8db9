// The towerflow_devices tool end to end: runs the built binary and reads its output.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "platform_test_util.h"

using Catch::Matchers::Contains;
using tw_json = nlohmann::json;
using towerflow::testing::kGiB;
using towerflow::testing::kMiB;
using towerflow::testing::platform_fixture;

namespace {

struct Run {
  int status = -1;
  std::string out, err;
};

// Runs `env ENV towerflow_devices ARGS` with stderr captured in a temporary file.
Run run_tool(const std::string& args, const std::string& env = "") {
  std::string err_file = std::tmpnam(nullptr);
  std::string cmd = "env -u CUDA_VISIBLE_DEVICES -u CUDA_DEVICE_ORDER -u TOWERFLOW_FORCE_GPU_ALLOW_GROWTH " + env +
                    " " TW_DEVICES_TOOL " " + args + " 2>" + err_file;
  Run r;
  FILE* pipe = popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::array<char, 4096> buf;
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), pipe)) r.out.append(buf.data(), n);
  int raw = pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  std::ifstream in(err_file);
  std::stringstream ss;
  ss << in.rdbuf();
  r.err = ss.str();
  std::remove(err_file.c_str());
  return r;
}

tw_json run_json(const std::string& args, const std::string& env = "") {
  Run r = run_tool(args + " --json", env);
  INFO("stderr: " << r.err);
  REQUIRE(r.status == 0);
  return tw_json::parse(r.out);
}

std::string on(const std::string& fixture) { return " --platform " + platform_fixture(fixture); }

// Every validation error exits with status 1 and says why on stderr, with nothing on stdout.
void expect_error(const std::string& args, const std::string& message, const std::string& env = "") {
  Run r = run_tool(args, env);
  INFO("towerflow_devices " << args);
  CHECK(r.status == 1);
  CHECK(r.out.empty());
  CHECK_THAT(r.err, Contains(message));
}

}  // namespace

TEST_CASE("towerflow_devices works on this machine, with or without a GPU", "[platform][tool]") {
  Run text = run_tool("");
  REQUIRE(text.status == 0);
  CHECK_THAT(text.out, Contains("/job:localhost/replica:0/task:0/device:CPU:0 -> physical CPU 0, memory limit"));
  tw_json j = run_json("--device_count CPU=4");
  int cpus = 0;
  for (const auto& d : j["logical"])
    if (d["kind"] == "CPU") {
      CHECK(d["index"] == cpus);
      CHECK(d["name"] == "/job:localhost/replica:0/task:0/device:CPU:" + std::to_string(cpus));
      CHECK(d["physical_index"] == 0);
      CHECK(d["allow_growth"] == true);
      ++cpus;
    }
  CHECK(cpus == 4);
  CHECK(j["physical"][0]["kind"] == "CPU");
}

TEST_CASE("towerflow_devices dry-runs TensorFlow's virtual-device example on a described machine", "[platform][tool]") {
  tw_json j = run_json(on("two_gpus.json") + " --visible_device_list 1,0 --virtual_devices '0:1024,2048;1:'");
  const auto& l = j["logical"];
  REQUIRE(l.size() == 4);
  CHECK(l[0]["name"] == "/job:localhost/replica:0/task:0/device:GPU:0");
  CHECK(l[0]["physical_index"] == 1);
  CHECK(l[0]["memory_limit_bytes"] == 1 * kGiB);
  CHECK(l[1]["physical_index"] == 1);
  CHECK(l[1]["memory_limit_bytes"] == 2 * kGiB);
  CHECK(l[2]["physical_index"] == 0);
  CHECK(l[2]["memory_limit_bytes"] == 40 * kGiB - 1536 * kMiB);
  CHECK(l[3]["kind"] == "CPU");
  REQUIRE(j["physical"].size() == 3);
  CHECK(j["physical"][2]["pci_bus_id"] == "0000:0f:00.0");
  Run text = run_tool(on("two_gpus.json") + " --visible_device_list 1,0 --virtual_devices '0:1024,2048;1:'");
  CHECK_THAT(text.out, Contains("/job:localhost/replica:0/task:0/device:GPU:1 -> physical GPU 1 (NVIDIA A100-SXM4-40GB, "
                                "pci bus id 0000:0f:00.0, compute capability 8.0), memory limit 2.0 GiB, growth off"));
}

TEST_CASE("towerflow_devices: the INI file, flags over it, and the CUDA environment", "[platform][tool]") {
  tw_json j = run_json("--config " + platform_fixture("tutorial.ini") + " --allow_growth=false" + on("two_gpus.json"));
  CHECK(j["logical"][0]["memory_limit_bytes"] == static_cast<std::size_t>(0.4 * 40 * kGiB));
  CHECK(j["logical"][0]["allow_growth"] == false);
  CHECK(j["options"]["allow_soft_placement"] == true);
  tw_json forced = run_json(on("two_gpus.json"), "TOWERFLOW_FORCE_GPU_ALLOW_GROWTH=true");
  CHECK(forced["logical"][0]["allow_growth"] == true);
  // The driver's view of the described machine: PCI order, then only GPUs 2 and 0 of it.
  tw_json v = run_json(on("four_v100.json") + " --visible_device_list 1", "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=2,0");
  REQUIRE(v["physical"].size() == 3);
  CHECK(v["physical"][1]["pci_bus_id"] == "0000:86:00.0");
  CHECK(v["physical"][2]["pci_bus_id"] == "0000:06:00.0");
  CHECK(v["logical"][0]["physical_index"] == 1);
  CHECK_THAT(v["logical"][0]["description"].get<std::string>(), Contains("0000:06:00.0"));
}

TEST_CASE("towerflow_devices reports every validation error on stderr with status 1", "[platform][tool]") {
  expect_error(on("one_small_gpu.json") + " --visible_device_list 2",
               "'visible_device_list' listed an invalid GPU id '2' but visible device count is 1");
  expect_error(on("two_gpus.json") + " --visible_device_list 0,0", "visible_device_list contained a duplicate entry: 0,0");
  expect_error(on("two_gpus.json") + " --per_process_gpu_memory_fraction 1.5", "must be in (0, 1]");
  expect_error(on("two_gpus.json") + " --per_process_gpu_memory_fraction 0", "must be in (0, 1]");
  expect_error(on("two_gpus.json") + " --per_process_gpu_memory_fraction 0.5 --virtual_devices '0:1024;1:'",
               "It's invalid to set per_process_gpu_memory_fraction when virtual_devices is set");
  expect_error(on("two_gpus.json") + " --virtual_devices '0:1024'",
               "doesn't match the number of elements in the virtual_devices list");
  expect_error(on("two_gpus.json") + " --virtual_devices '0:30000,20000;1:'", "add up to more than its 40.0 GiB");
  expect_error(on("two_gpus.json") + " --memory_limit gpu:1=50000", "memory limit of /gpu:1 is 48.8 GiB");
  expect_error(on("two_gpus.json") + " --memory_growth 0=true", "Memory growth cannot differ between GPU devices");
  expect_error(on("two_gpus.json") + " --device_count CPU=2 --virtual_devices cpu:100", "but device_count has CPU=2");
  expect_error("--device_count TPU=1", "unknown device kind 'TPU'");
  expect_error("--config " + platform_fixture("bad_key.ini"), "unknown process option 'allow_growht'");
  expect_error(on("bad_missing_memory.json"), "lacks 'gpus[0].memory_bytes'");
  expect_error(on("two_gpus.json"), "TOWERFLOW_FORCE_GPU_ALLOW_GROWTH='maybe' is not valid",
               "TOWERFLOW_FORCE_GPU_ALLOW_GROWTH=maybe");
  Run missing = run_tool("--config /nonexistent.ini");
  CHECK(missing.status != 0);
}

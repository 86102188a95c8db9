#include <catch2/catch.hpp>

#include <CLI/CLI.hpp>

#include "core/error.h"
#include "core/log.h"
#include "core/platform/options.h"
#include "platform_test_util.h"

namespace tw = towerflow;
using tw::Device;
using tw::ProcessOptions;
using Catch::Matchers::Contains;

namespace {

// Parses a command line with the process option flags.
ProcessOptions parse_flags(std::vector<std::string> args) {
  CLI::App app{"test"};
  ProcessOptions opts;
  tw::add_process_option_flags(app, opts);
  std::vector<const char*> argv{"prog"};
  for (const auto& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  return opts;
}

std::string flag_error(std::vector<std::string> args) {
  try {
    parse_flags(std::move(args));
  } catch (const CLI::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("option values parse in the documented syntax", "[platform][options]") {
  auto v = tw::parse_virtual_devices("0:1024,2048; 1: ;cpu:512,0.5GiB");
  REQUIRE(v.gpu_memory_limits_mb);
  CHECK(*v.gpu_memory_limits_mb == std::vector<std::vector<double>>{{1024, 2048}, {}});
  CHECK(*v.cpu_memory_limits_mb == std::vector<double>{512, 512});
  auto cpu_only = tw::parse_virtual_devices("cpu:100");
  CHECK_FALSE(cpu_only.gpu_memory_limits_mb);
  CHECK(tw::parse_memory_limits("gpu:0=4096, /cpu:1=2G") ==
        std::map<Device, double>{{Device::gpu(0), 4096}, {Device::cpu(1), 2048}});
  CHECK(tw::parse_device_count("cpu=2,GPU:1") == std::map<std::string, int>{{"CPU", 2}, {"GPU", 1}});
  CHECK(tw::parse_memory_growth("0=true,1=off") == std::map<int, bool>{{0, true}, {1, false}});
  CHECK(tw::parse_bool_option("x", " Yes "));
  CHECK_FALSE(tw::parse_bool_option("x", "0"));
}

TEST_CASE("malformed option values name the option, the value and the form", "[platform][options]") {
  CHECK_THROWS_WITH(tw::parse_virtual_devices("1024,2048"), Contains("has no 'N:' or 'cpu:' prefix"));
  CHECK_THROWS_WITH(tw::parse_virtual_devices("1:1024"), Contains("GPU position 0 is missing"));
  CHECK_THROWS_WITH(tw::parse_virtual_devices("0:1024;0:2048"), Contains("GPU position 0 is given twice"));
  CHECK_THROWS_WITH(tw::parse_virtual_devices("0:abc"), Contains("virtual_devices: 'abc' is not a number"));
  CHECK_THROWS_WITH(tw::parse_virtual_devices("0:-5"), Contains("must be positive"));
  CHECK_THROWS_WITH(tw::parse_virtual_devices("0:1e300"), Contains("larger than any device"));
  CHECK_THROWS_WITH(tw::parse_memory_limits("cpu:0=2000000GiB"), Contains("at most 1 PiB"));
  CHECK_THROWS_WITH(tw::parse_virtual_devices("cpu:"), Contains("'cpu:' lists no memory limit"));
  CHECK_THROWS_WITH(tw::parse_memory_limits("gpu:0"), Contains("is not DEVICE=MiB"));
  CHECK_THROWS_WITH(tw::parse_memory_limits("tpu:0=5"), Contains("invalid device name 'tpu:0'"));
  CHECK_THROWS_WITH(tw::parse_device_count("TPU=1"), Contains("unknown device kind 'TPU'"));
  CHECK_THROWS_WITH(tw::parse_device_count("CPU=0"), Contains("CPU=0 leaves the process without a CPU device"));
  CHECK_THROWS_WITH(tw::parse_device_count("GPU=-1"), Contains("negative"));
  CHECK_THROWS_WITH(tw::parse_bool_option("allow_growth", "maybe"), Contains("allow_growth: 'maybe' is not a boolean"));
  ProcessOptions o;
  CHECK_THROWS_WITH(tw::set_process_option(o, "allow_grow", "true"), Contains("unknown process option 'allow_grow'"));
  CHECK_THROWS_WITH(tw::set_process_option(o, "intra_op_threads", "-2"), Contains("negative"));
  CHECK_THROWS_AS(tw::set_process_option(o, "rate", "0.4x"), tw::InvalidArgument);
}

TEST_CASE("INI files: tutorial keys, our sections only, errors with file and line", "[platform][options]") {
  auto t = ProcessOptions::from_ini(tw::testing::platform_fixture("tutorial.ini"));
  CHECK(t == ProcessOptions{.per_process_gpu_memory_fraction = 0.4, .allow_growth = true, .allow_soft_placement = true});

  auto f = ProcessOptions::from_ini(tw::testing::platform_fixture("full.ini"));
  ProcessOptions expected{.visible_device_list = "1,0",
                          .memory_limit_mb = {{Device::gpu(2), 4096}},
                          .log_device_placement = true,
                          .intra_op_threads = 3};
  expected.virtual_devices.gpu_memory_limits_mb = std::vector<std::vector<double>>{{1024, 2048}, {}};
  expected.virtual_devices.cpu_memory_limits_mb = std::vector<double>{512, 512};
  CHECK(f == expected);

  std::string bad_key = tw::testing::platform_fixture("bad_key.ini");
  CHECK_THROWS_WITH(ProcessOptions::from_ini(bad_key), Contains(bad_key + ":2: unknown process option 'allow_growht'"));
  CHECK_THROWS_WITH(ProcessOptions::from_ini(tw::testing::platform_fixture("bad_twice.ini")),
                    Contains(":3: option per_process_gpu_memory_fraction is already set on line 2"));
  CHECK_THROWS_AS(ProcessOptions::from_ini("/nonexistent/train.ini"), tw::NotFound);
  CHECK_THROWS_WITH(ProcessOptions::parse_ini("[gpu\nrate=1", "x.ini"), Contains("x.ini:1: section header '[gpu'"));
  CHECK_THROWS_WITH(ProcessOptions::parse_ini("allow_growth", "x.ini"), Contains("x.ini:1: 'allow_growth' is not 'key = value'"));
  CHECK_THROWS_WITH(ProcessOptions::parse_ini("[cpu]\nintra_op_threads = many", "x.ini"),
                    Contains("x.ini:2: intra_op_threads: 'many' is not a whole number"));
}

TEST_CASE("flags set every option, and win over the file when merged", "[platform][options]") {
  auto flags = parse_flags({"--visible_device_list", "1,0", "--allow_growth", "--virtual_devices", "0:1024;1:",
                            "--memory_limit", "cpu:0=2048", "--device_count", "CPU=2,GPU=2",
                            "--allow_soft_placement=false", "--log_device_placement", "--intra_op_threads", "4",
                            "--memory_growth", "0=true,1=true"});
  ProcessOptions expected{.visible_device_list = "1,0",
                          .allow_growth = true,
                          .memory_growth = {{0, true}, {1, true}},
                          .memory_limit_mb = {{Device::cpu(0), 2048}},
                          .device_count = {{"CPU", 2}, {"GPU", 2}},
                          .allow_soft_placement = false,
                          .log_device_placement = true,
                          .intra_op_threads = 4};
  expected.virtual_devices.gpu_memory_limits_mb = std::vector<std::vector<double>>{{1024}, {}};
  CHECK(flags == expected);
  CHECK(parse_flags({"--per_process_gpu_memory_fraction", "0.3"}).per_process_gpu_memory_fraction == 0.3);
  CHECK(parse_flags({"--allow_growth=false"}).allow_growth == false);
  CHECK(parse_flags({}) == ProcessOptions{});

  auto file = ProcessOptions::from_ini(tw::testing::platform_fixture("tutorial.ini"));
  auto merged = file.merged_with(parse_flags({"--allow_growth=false", "--device_count", "CPU=2"}));
  CHECK(merged.allow_growth == false);                          // the flag wins
  CHECK(merged.per_process_gpu_memory_fraction == 0.4);         // the file's value stays
  CHECK(merged.allow_soft_placement == true);
  CHECK(merged.device_count == std::map<std::string, int>{{"CPU", 2}});

  CHECK_THAT(flag_error({"--device_count", "CPU=x"}), Contains("--device_count") && Contains("'x' is not a whole number"));
  CHECK_THAT(flag_error({"--allow_growth=perhaps"}), Contains("'perhaps' is not a boolean"));
}

TEST_CASE("option differences compare effective values", "[platform][options]") {
  CHECK(tw::option_differences({}, {.allow_growth = false, .device_count = {{"CPU", 1}}}).empty());
  CHECK(tw::option_differences({.visible_device_list = "0, 1"}, {.visible_device_list = "0,1"}).empty());
  auto d = tw::option_differences({.per_process_gpu_memory_fraction = 0.5}, {.intra_op_threads = 2});
  REQUIRE(d.size() == 2);
  CHECK(d[0] == "per_process_gpu_memory_fraction: 0.5 vs unset");
  CHECK(d[1] == "intra_op_threads: 0 vs 2");
  CHECK(tw::to_string(ProcessOptions{}) == "defaults");
  CHECK(tw::to_string({.allow_growth = true, .device_count = {{"CPU", 2}}}) == "allow_growth=true device_count=CPU=2");
}

TEST_CASE("TOWERFLOW_FORCE_GPU_ALLOW_GROWTH: true or false override, anything else is an error", "[platform][options]") {
  std::vector<std::string> lines;
  auto previous = tw::set_log_sink([&](tw::LogLevel, std::string_view m) { lines.emplace_back(m); });
  auto forced = tw::apply_force_gpu_allow_growth({.allow_growth = true, .memory_growth = {{0, true}}}, "false");
  tw::set_log_sink(previous);
  CHECK(forced.allow_growth == false);
  CHECK(forced.memory_growth.empty());
  REQUIRE(lines.size() == 1);
  CHECK_THAT(lines[0], Contains("TOWERFLOW_FORCE_GPU_ALLOW_GROWTH") && Contains("the options said true"));
  CHECK(tw::apply_force_gpu_allow_growth({.allow_growth = true}, nullptr).allow_growth == true);
  CHECK_THROWS_WITH(tw::apply_force_gpu_allow_growth({}, "yes please"),
                    Contains("TOWERFLOW_FORCE_GPU_ALLOW_GROWTH='yes please' is not valid"));
}

TEST_CASE("every option of the table is a flag, an INI key, merges, prints and differs",
          "[platform][options]") {
  // One value per option; an option added to the table without one here fails the test.
  const std::map<std::string, std::string> samples = {
      {"visible_device_list", "1,0"},      {"per_process_gpu_memory_fraction", "0.4"},
      {"allow_growth", "true"},            {"memory_growth", "0=true"},
      {"virtual_devices", "cpu:512,512"},  {"memory_limit", "cpu:0=2048"},
      {"device_count", "CPU=2"},           {"allow_soft_placement", "true"},
      {"log_device_placement", "true"},    {"intra_op_threads", "3"},
  };
  REQUIRE(tw::process_option_table().size() == samples.size());
  for (const tw::ProcessOptionInfo& info : tw::process_option_table()) {
    const std::string name(info.name);
    INFO(name);
    REQUIRE(samples.count(name) == 1);
    const std::string& value = samples.at(name);
    ProcessOptions o;
    tw::set_process_option(o, name, value);
    CHECK(o != ProcessOptions{});
    CHECK(tw::is_process_option(name));
    CHECK(parse_flags(info.value_form.empty() ? std::vector<std::string>{"--" + name}
                                              : std::vector<std::string>{"--" + name, value}) == o);
    CHECK(ProcessOptions::parse_ini(name + " = " + value) == o);
    if (!info.alias.empty()) {
      CHECK(tw::is_process_option(info.alias));
      CHECK(ProcessOptions::parse_ini(std::string(info.alias) + " = " + value) == o);
    }
    CHECK(ProcessOptions{}.merged_with(o) == o);
    CHECK(o.merged_with(ProcessOptions{}) == o);
    CHECK_THAT(tw::to_string(o), Catch::StartsWith(name + "="));
    const auto d = tw::option_differences(ProcessOptions{}, o);
    REQUIRE(d.size() == 1);
    CHECK_THAT(d[0], Catch::StartsWith(name + ": "));
    CHECK(!info.help.empty());
    CHECK(!info.default_text.empty());
  }
}

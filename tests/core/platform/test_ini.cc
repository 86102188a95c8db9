#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/platform/ini.h"
#include "core/platform/options.h"
#include "platform_test_util.h"

namespace tw = towerflow;
using Catch::Matchers::Contains;

namespace {

std::string ini_fixture_dir() {
  const char* root = std::getenv("TOWERFLOW_TEST_DATA");
  return std::string(root ? root : TW_FIXTURES_DIR) + "/ini";
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

using Sections = std::map<std::string, std::vector<std::pair<std::string, std::string>>>;

}  // namespace

// tests/fixtures/ini/expected.json is what Python's configparser read from each file there
// (make_expected.py writes it; the ctest ini_fixtures_match_configparser re-checks it where
// python3 exists). read_ini must read the same keys and values, and refuse the same files at
// the same line.
TEST_CASE("INI files read as Python's configparser reads them", "[platform][ini]") {
  auto expected = nlohmann::json::parse(slurp(ini_fixture_dir() + "/expected.json"));
  REQUIRE(expected.size() >= 10);
  for (const auto& [name, want] : expected.items()) {
    INFO("fixture " << name);
    std::string text = slurp(ini_fixture_dir() + "/" + name);
    if (want.contains("error")) {
      CHECK_THROWS_WITH(tw::read_ini(text, name), Contains(name + ":" + std::to_string(want["line"].get<int>()) + ":"));
      continue;
    }
    Sections want_sections, got_sections;
    for (const auto& section : want["sections"])
      for (const auto& kv : section[1]) want_sections[section[0]].emplace_back(kv[0], kv[1]);
    for (const auto& e : tw::read_ini(text, name).entries) got_sections[e.section].emplace_back(e.key, e.value);
    CHECK(got_sections == want_sections);
  }
}

TEST_CASE("INI reader: keys at the top, continuation lines, errors name the file and line", "[platform][ini]") {
  // The one extension: keys before any section (configparser: MissingSectionHeaderError).
  auto top = tw::read_ini("a = 1\n  more\n[s]\nb: 2\n", "t.ini");
  REQUIRE(top.entries.size() == 2);
  CHECK(top.entries[0].section == "");
  CHECK(top.entries[0].value == "1\nmore");
  CHECK(top.entries[0].line == 1);
  CHECK(top.entries[0].last_line == 2);
  CHECK(top.entries[1].section == "s");
  CHECK(top.entries[1].line == 4);
  CHECK(tw::read_ini("", "t.ini").entries.empty());
  CHECK(tw::read_ini("\n\n# only comments\n", "t.ini").entries.empty());

  CHECK_THROWS_WITH(tw::read_ini("[s]\nwords\n", "t.ini"),
                    Contains("t.ini:2: 'words' is not 'key = value' or 'key: value'"));
  CHECK_THROWS_WITH(tw::read_ini("[gpu\n", "t.ini"), Contains("t.ini:1: section header '[gpu' is not [name]"));
  CHECK_THROWS_WITH(tw::read_ini("[s]\n: x\n", "t.ini"), Contains("t.ini:2: ': x' has no key before ':'"));
  CHECK_THROWS_WITH(tw::read_ini("[s]\n[t]\n[s]\n", "t.ini"),
                    Contains("t.ini:3: section [s] is already given on line 1"));
  CHECK_THROWS_WITH(tw::read_ini("[s]\nA = 1\na: 2\n", "t.ini"),
                    Contains("t.ini:3: option a is already set on line 2 in [s]"));

  // towerflow's reading of a value: an inline " #" comment and one pair of quotes go.
  tw::IniEntry e{.value = "\"1,0\"   # logical GPU 0 is visible GPU 1"};
  CHECK(tw::ini_option_value(e) == "1,0");
  e.value = "0:1024;1:";
  CHECK(tw::ini_option_value(e) == "0:1024;1:");
}

TEST_CASE("process options from INI: 'key: value', names in any case, comments (the TensorFlow tutorial's forms)",
          "[platform][options][ini]") {
  // Refused before configparser's grammar: allow_growth: on.
  CHECK(tw::ProcessOptions::parse_ini("[gpu]\nallow_growth: on\n").allow_growth == true);
  auto o = tw::ProcessOptions::from_ini(ini_fixture_dir() + "/colon_and_case.ini");
  CHECK(o == tw::ProcessOptions{.per_process_gpu_memory_fraction = 0.4,
                                .allow_growth = true,
                                .allow_soft_placement = true,
                                .log_device_placement = true});
  // List values may continue on indented lines; their separators carry the meaning.
  auto c = tw::ProcessOptions::parse_ini(
      "[devices]\nvirtual_devices = 0:1024,2048;\n    1:;\n\n    cpu:512,512\nmemory_limit =\n  gpu:0=4096,\n  cpu:0=2048\n");
  CHECK(c.virtual_devices.cpu_memory_limits_mb == std::vector<double>{512, 512});
  CHECK(c.memory_limit_mb.size() == 2);
  auto l = tw::ProcessOptions::from_ini(ini_fixture_dir() + "/line_endings.ini");
  CHECK(l.allow_growth == true);
  CHECK(l.intra_op_threads == 2);
  CHECK(l.device_count.at("CPU") == 2);
  // [DEFAULT] lends its keys to every section, ours included; other keys belong to other programs.
  auto d = tw::ProcessOptions::parse_ini("[DEFAULT]\nallow_growth = yes\ndata_root = /data\n[gpu]\nrate = 0.5\n");
  CHECK(d == tw::ProcessOptions{.per_process_gpu_memory_fraction = 0.5, .allow_growth = true});

  // A scalar whose next line is indented: configparser joins the two, and the error says why.
  CHECK_THROWS_WITH(tw::ProcessOptions::parse_ini("[gpu]\nallow_growth = true\n  rate = 0.4\n", "t.ini"),
                    Contains("t.ini:2: allow_growth:") && Contains("continues to line 3"));
  // Another program's section must still be INI that configparser reads.
  CHECK_THROWS_WITH(tw::ProcessOptions::parse_ini("[other]\njust words\n", "t.ini"), Contains("t.ini:2:"));
  CHECK_THROWS_WITH(tw::ProcessOptions::parse_ini("[GPU]\nALLOW_GROWTH = maybe\n", "t.ini"),
                    Contains("t.ini:2: allow_growth: 'maybe' is not a boolean"));
}

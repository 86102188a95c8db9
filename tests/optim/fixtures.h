#pragma once
// The PyTorch-made reference values of tests/fixtures/optim (make_fixtures.py there).
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

inline const nlohmann::json& optim_reference() {
  static const nlohmann::json j = [] {
    const char* env = std::getenv("TOWERFLOW_TEST_DATA");
    const std::string dir = env ? env : TW_FIXTURES_DIR;
    std::ifstream in(dir + "/optim/reference.json");
    if (!in) throw std::runtime_error("cannot open " + dir + "/optim/reference.json");
    return nlohmann::json::parse(in);
  }();
  return j;
}

#pragma once
// Reader of the PyTorch reference fixtures made by tests/fixtures/make_compute_fixtures.py (the
// file format is described there), and comparison helpers shared by the compute tests.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/tensor/tensor.h"

namespace towerflow::testing {

struct FixtureArray {
  bool is_int = false;
  Shape shape;
  std::vector<float> f;
  std::vector<std::int32_t> i;
};

inline std::string fixture_dir() {
  const char* env = std::getenv("TOWERFLOW_TEST_DATA");
  return std::string(env ? env : TOWERFLOW_SOURCE_DIR "/tests/fixtures") + "/compute";
}

inline std::map<std::string, FixtureArray> load_fixture(const std::string& file) {
  const std::string path = fixture_dir() + "/" + file;
  std::ifstream in(path, std::ios::binary);
  if (!in) FAIL("cannot open fixture " << path);
  char magic[4];
  in.read(magic, 4);
  REQUIRE(std::string(magic, 4) == "TWFX");
  auto u32 = [&] {
    std::uint32_t v;
    in.read(reinterpret_cast<char*>(&v), 4);
    return v;
  };
  std::map<std::string, FixtureArray> out;
  const std::uint32_t count = u32();
  for (std::uint32_t r = 0; r < count; ++r) {
    std::string name(u32(), '\0');
    in.read(name.data(), static_cast<std::streamsize>(name.size()));
    std::uint8_t code;
    in.read(reinterpret_cast<char*>(&code), 1);
    const std::uint32_t ndim = u32();
    FixtureArray a;
    a.is_int = code == 1;
    for (std::uint32_t d = 0; d < ndim; ++d) {
      std::int64_t v;
      in.read(reinterpret_cast<char*>(&v), 8);
      a.shape.push_back(v);
    }
    const auto n = static_cast<std::size_t>(shape_numel(a.shape));
    if (a.is_int) {
      a.i.resize(n);
      in.read(reinterpret_cast<char*>(a.i.data()), static_cast<std::streamsize>(n * 4));
    } else {
      a.f.resize(n);
      in.read(reinterpret_cast<char*>(a.f.data()), static_cast<std::streamsize>(n * 4));
    }
    REQUIRE(in.good());
    out.emplace(name, std::move(a));
  }
  return out;
}

// Max |a - b| / (atol + rtol * |b|) over the elements: <= 1 passes. Prints the worst element.
inline void require_close(const std::vector<float>& actual, const std::vector<float>& expected,
                          double rtol, double atol, const std::string& what) {
  REQUIRE(actual.size() == expected.size());
  double worst = 0, worst_abs = 0;
  std::size_t at = 0;
  for (std::size_t k = 0; k < actual.size(); ++k) {
    const double diff = std::abs(static_cast<double>(actual[k]) - expected[k]);
    const double ratio = diff / (atol + rtol * std::abs(static_cast<double>(expected[k])));
    if (!(ratio <= worst)) {
      worst = ratio;
      worst_abs = diff;
      at = k;
    }
  }
  INFO(what << ": worst element " << at << " of " << actual.size() << ": got "
            << (actual.empty() ? 0 : actual[at]) << ", expected "
            << (expected.empty() ? 0 : expected[at]) << ", |diff| " << worst_abs
            << " (rtol " << rtol << ", atol " << atol << ")");
  REQUIRE(worst <= 1.0);
}

}  // namespace towerflow::testing

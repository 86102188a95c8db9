#include <catch2/catch.hpp>

#include "core/core.h"  // the umbrella header compiles on its own
#include "core/error.h"

namespace tw = towerflow;

TEST_CASE("TW_CHECK throws InternalError naming the condition, the place and the parts", "[error]") {
  int batch = 3;
  CHECK_NOTHROW([&] { TW_CHECK(batch == 3); }());
  try {
    TW_CHECK(batch == 4, "batch was ", batch);
    FAIL("no throw");
  } catch (const tw::InternalError& e) {
    std::string msg = e.what();
    CHECK(msg.find("batch == 4") != std::string::npos);
    CHECK(msg.find("test_error.cc") != std::string::npos);
    CHECK(msg.find("batch was 3") != std::string::npos);
  }
}

TEST_CASE("raise builds the message from its parts and keeps the type", "[error]") {
  CHECK_THROWS_AS(tw::raise<tw::DataError>("file ", "x.bin", " is short"), tw::DataError);
  CHECK_THROWS_WITH(tw::raise<tw::NotFound>("no ", 3), "no 3");
}

TEST_CASE("option mentions are found with their entry and value, and rendered in place",
          "[error][options]") {
  std::vector<std::string> seen;
  const std::string out = tw::render_options(
      "use a smaller FitOptions::batch, raise ProcessOptions::memory_limit_mb[/gpu:1] or set "
      "TrainerOptions::precision = Precision::Fp32. Keep std::vector and Precision::Bf16 as they are; "
      "UnknownOptions::field stays.",
      [&](const tw::OptionMention& m) -> std::optional<std::string> {
        seen.push_back(tw::str(m.field, "|", m.entry, "|", m.value));
        if (m.field == "UnknownOptions::field") return std::nullopt;
        return tw::str("<", m.field.substr(m.field.find("::") + 2), ">");
      });
  CHECK(seen == std::vector<std::string>{"FitOptions::batch||", "ProcessOptions::memory_limit_mb|/gpu:1|",
                                         "TrainerOptions::precision||Precision::Fp32",
                                         "UnknownOptions::field||"});
  CHECK(out == "use a smaller <batch>, raise <memory_limit_mb> or set <precision>. Keep std::vector and "
               "Precision::Bf16 as they are; UnknownOptions::field stays.");
  CHECK(tw::render_options("no options here", [](const tw::OptionMention&) { return std::string("x"); }) ==
        "no options here");
}

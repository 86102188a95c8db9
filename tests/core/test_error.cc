#include <catch2/catch.hpp>

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

#pragma once
// TW_SKIP(reason): ends a test case that cannot run here (no GPU, a build without CUDA) and
// reports it to CTest as skipped, not passed: tw_add_test (cmake/TowerflowHelpers.cmake) marks a
// test skipped when its output holds "TEST SKIPPED: ".
#include <catch2/catch.hpp>

#define TW_SKIP(reason)                  \
  do {                                   \
    WARN("TEST SKIPPED: " << reason);    \
    return;                              \
  } while (false)

#include <catch2/catch.hpp>

#include "core/device.h"
#include "core/error.h"

namespace tw = towerflow;

TEST_CASE("device names parse in every TensorFlow and PyTorch form", "[device]") {
  using tw::Device;
  CHECK(Device::parse("/cpu:0") == Device::cpu(0));
  CHECK(Device::parse("/gpu:1") == Device::gpu(1));
  CHECK(Device::parse("/GPU:3") == Device::gpu(3));
  CHECK(Device::parse("/device:GPU:1") == Device::gpu(1));
  CHECK(Device::parse("/device:cpu:2") == Device::cpu(2));
  CHECK(Device::parse("/job:localhost/replica:0/task:0/device:GPU:1") == Device::gpu(1));
  CHECK(Device::parse("/job:worker/replica:1/task:3/device:CPU:0") == Device::cpu(0));
  CHECK(Device::parse("cuda:1") == Device::gpu(1));
  CHECK(Device::parse("CUDA:0") == Device::gpu(0));
  CHECK(Device::parse("cuda") == Device::gpu(0));
  CHECK(Device::parse("cpu") == Device::cpu(0));
  CHECK(Device::parse("  /gpu:12 ") == Device::gpu(12));
}

TEST_CASE("device names print short and full forms that parse back", "[device]") {
  using tw::Device;
  for (Device d : {Device::cpu(0), Device::cpu(3), Device::gpu(0), Device::gpu(7)}) {
    CHECK(Device::parse(d.str()) == d);
    CHECK(Device::parse(d.full_name()) == d);
  }
  CHECK(Device::gpu(1).str() == "/gpu:1");
  CHECK(Device::cpu(2).full_name() == "/job:localhost/replica:0/task:0/device:CPU:2");
}

TEST_CASE("bad device names quote the string and show a valid example", "[device]") {
  using tw::Device;
  for (const char* bad : {"", "/tpu:0", "/gpu:x", "/gpu:-1", "gpu0", "/gpu", "tpu:1",
                          "/job:localhost//device:GPU:0", "/device:GPU:0/job:localhost",
                          "/gpu:0/cpu:1", "/job:localhost", "/replica:a/device:GPU:0"}) {
    INFO("input: '" << bad << "'");
    try {
      Device::parse(bad);
      FAIL("parsed without error");
    } catch (const tw::InvalidArgument& e) {
      std::string msg = e.what();
      CHECK(msg.find(std::string("'") + bad + "'") != std::string::npos);
      CHECK(msg.find("/gpu:0") != std::string::npos);
    }
  }
}

// Flag values the programs parse themselves (CLI11 only splits the command line). The first
// byte picks the parser, the rest is the value:
//   0 set_train_option (the second byte picks the option)   5 parse_virtual_devices
//   1 set_process_option (the second byte picks the option) 6 parse_memory_limits
//   2 tower::parse_split, then split_batch                  7 parse_device_count
//   3 tower::parse_reduction                                8 parse_memory_growth
//   4 optim::parse_schedule, then the rate at a few steps   9 parse_bool_option
#include <cmath>

#include "core/platform/options.h"
#include "examples/cifar10/train_options.h"
#include "fuzz/fuzz_util.h"
#include "optim/schedule.h"
#include "tower/reduction.h"
#include "tower/split.h"

namespace tw = towerflow;

namespace {


void parse(std::uint8_t which, std::uint8_t pick, std::string_view value) {
  switch (which % 10) {
    case 0: {
      static const auto docs = tw::cifar10::describe_train_options(tw::cifar10::TrainOptions{});
      tw::cifar10::TrainOptions o;
      tw::cifar10::set_train_option(o, docs[pick % docs.size()].name, value);
      (void)tw::cifar10::to_json(o);
      break;
    }
    case 1: {
      tw::ProcessOptions o;
      const auto& table = tw::process_option_table();
      const tw::ProcessOptionInfo& info = table[pick % table.size()];
      const bool alias = (pick / table.size()) % 2 == 1 && !info.alias.empty();
      tw::set_process_option(o, alias ? info.alias : info.name, value);
      (void)tw::to_string(o);
      break;
    }
    case 2: {
      tw::tower::SplitPolicy policy = tw::tower::parse_split(value);
      (void)tw::tower::to_string(policy);
      std::vector<tw::Device> devices(1 + pick % 4);
      for (std::size_t i = 0; i < devices.size(); ++i) devices[i] = tw::Device::cpu(static_cast<int>(i));
      for (int batch : {1, 7, 64}) {
        auto rows = tw::tower::split_batch(batch, devices, policy, tw::tower::Remainder::Spread);
        int sum = 0;
        for (int r : rows) {
          TW_CHECK(r >= 0, "a negative slice ", r, " for ", value);
          sum += r;
        }
        TW_CHECK(rows.size() == devices.size() && sum == batch, "rows do not sum to the batch for ", value);
      }
      break;
    }
    case 3:
      (void)tw::tower::to_string(tw::tower::parse_reduction(value));
      break;
    case 4: {
      const std::int64_t total = 1 + pick * 7;
      auto schedule = tw::optim::parse_schedule(value, 0.1, total);
      for (std::int64_t step : {std::int64_t{0}, std::int64_t{1}, total / 2, total - 1, total, total + 5}) {
        double lr = schedule(step);
        TW_CHECK(std::isfinite(lr) && lr >= 0, "schedule '", value, "' gives lr ", lr, " at step ", step);
      }
      break;
    }
    case 5:
      (void)tw::parse_virtual_devices(value);
      break;
    case 6:
      (void)tw::parse_memory_limits(value);
      break;
    case 7:
      (void)tw::parse_device_count(value);
      break;
    case 8:
      (void)tw::parse_memory_growth(value);
      break;
    case 9:
      (void)tw::parse_bool_option("fuzz", value);
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  tw::fuzz::expect_user_errors_only([&] { parse(data[0], data[1], tw::fuzz::text_of(data + 2, size - 2)); });
  return 0;
}

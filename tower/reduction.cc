#include "tower/reduction.h"

#include <algorithm>
#include <charconv>

#include "core/error.h"

namespace towerflow::tower {

Reduction parse_reduction(std::string_view spec) {
  if (spec == "parameter_device") return ParameterDevice{};
  if (spec.starts_with("parameter_device:")) {
    try {
      return ParameterDevice{Device::parse(spec.substr(17))};
    } catch (const InvalidArgument& e) {
      raise<InvalidArgument>("reduction '", spec, "' names no device (", e.what(),
                             "); use e.g. parameter_device:/cpu:0 or parameter_device:/gpu:0");
    }
  }
  if (spec == "all_reduce") return AllReduce{};
  if (spec == "bucketed") return AllReduce{.bucket_bytes = std::size_t{25} << 20};
  if (spec.starts_with("bucketed:")) {
    const std::string_view mb = spec.substr(9);
    double x = 0;
    auto [ptr, ec] = std::from_chars(mb.data(), mb.data() + mb.size(), x);
    // A bucket larger than every model is one bucket; the cap keeps the byte count representable.
    constexpr double kMaxMiB = 1 << 20;
    if (mb.empty() || ec != std::errc() || ptr != mb.data() + mb.size() || !(x > 0) || x > kMaxMiB)
      raise<InvalidArgument>("reduction '", spec, "' has a bad bucket size '", mb,
                             "'; give MiB as a positive number up to 1048576 (e.g. bucketed:4)");
    return AllReduce{.bucket_bytes = std::max<std::size_t>(1, static_cast<std::size_t>(x * (1 << 20)))};
  }
  raise<InvalidArgument>("reduction '", spec, "' is not a reduction strategy; use parameter_device, "
                         "parameter_device:DEVICE (e.g. parameter_device:/gpu:0), all_reduce or "
                         "bucketed[:MB] (e.g. bucketed:4)");
}

std::string to_string(const Reduction& r) {
  if (const auto* pd = std::get_if<ParameterDevice>(&r))
    return pd->device ? "parameter_device:" + pd->device->str() : "parameter_device";
  const auto& ar = std::get<AllReduce>(r);
  if (ar.bucket_bytes == 0) return "all_reduce";
  return str("bucketed:", static_cast<double>(ar.bucket_bytes) / (1 << 20));
}

}  // namespace towerflow::tower

#include "optim/parameter_group.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/error.h"

namespace towerflow::optim {

namespace {

// "conv.weight, norm.bias, ... (12 slots)": enough names to spot a typo, not a whole model.
std::string some_names(const std::vector<std::string>& names) {
  constexpr std::size_t kShown = 6;
  if (names.empty()) return "none";
  std::ostringstream os;
  for (std::size_t i = 0; i < names.size() && i < kShown; ++i) os << (i ? ", " : "") << names[i];
  if (names.size() > kShown) os << ", ... (" << names.size() << " slots)";
  return os.str();
}

// Finite in float too: the device updates take float hyper-parameters.
bool usable(double v) { return v >= 0 && std::isfinite(v) && std::isfinite(static_cast<float>(v)); }

}  // namespace

SlotPredicate slots_containing(std::string text) {
  return [text = std::move(text)](const ParameterSlot& s) {
    return s.name.find(text) != std::string::npos;
  };
}

SlotPredicate slots_named(std::vector<std::string> names) {
  return [names = std::move(names)](const ParameterSlot& s) {
    return std::find(names.begin(), names.end(), s.name) != names.end();
  };
}

void check_group_values(const ParameterGroup& g) {
  if (!usable(g.lr_scale))
    raise<InvalidArgument>("parameter group '", g.name, "': lr_scale ", g.lr_scale,
                           " is invalid; use a finite value >= 0 (1: the optimizer's lr; to leave "
                           "the group's parameters alone, set .frozen = true)");
  if (g.weight_decay && !usable(*g.weight_decay))
    raise<InvalidArgument>("parameter group '", g.name, "': weight_decay ", *g.weight_decay,
                           " is invalid; use a finite value >= 0 (e.g. 5e-4), or leave it unset "
                           "for the optimizer's");
}

std::vector<std::size_t> assign_groups(std::span<const ParameterSlot> slots,
                                       std::span<const ParameterGroup> groups) {
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const ParameterGroup& g = groups[i];
    if (g.name.empty())
      raise<InvalidArgument>("parameter group ", i + 1, " of ", groups.size(),
                             " has an empty name; name every group (e.g. \"norm\")");
    if (g.name == kDefaultGroup)
      raise<InvalidArgument>("parameter group name '", kDefaultGroup,
                             "' is reserved for the slots no group takes; choose another name");
    for (std::size_t j = 0; j < i; ++j)
      if (groups[j].name == g.name)
        raise<InvalidArgument>("parameter group name '", g.name, "' is used twice (groups ", j + 1,
                               " and ", i + 1, "); give each group its own name");
    if (!g.slots)
      raise<InvalidArgument>("parameter group '", g.name,
                             "' has no slot predicate; set .slots (e.g. slots_containing(\"norm\"))");
    check_group_values(g);
  }
  std::vector<std::size_t> of(slots.size(), groups.size());
  std::vector<std::vector<std::string>> matched(groups.size());  // every slot it matches
  std::vector<std::size_t> first_match(groups.size(), slots.size());
  std::vector<std::size_t> taken(groups.size(), 0);
  for (std::size_t s = 0; s < slots.size(); ++s)
    for (std::size_t i = 0; i < groups.size(); ++i) {
      if (!groups[i].slots(slots[s])) continue;
      matched[i].push_back(slots[s].name);
      if (first_match[i] == slots.size()) first_match[i] = s;
      if (of[s] == groups.size()) {
        of[s] = i;
        ++taken[i];
      }
    }
  for (std::size_t i = 0; i < groups.size(); ++i) {
    if (taken[i] > 0) continue;
    if (matched[i].empty()) {
      std::vector<std::string> names;
      for (const ParameterSlot& s : slots) names.push_back(s.name);
      raise<InvalidArgument>("parameter group '", groups[i].name, "' takes no slot (the slots are ",
                             some_names(names), "); fix its predicate or drop the group");
    }
    raise<InvalidArgument>("parameter group '", groups[i].name, "' takes no slot: every slot it matches (",
                           some_names(matched[i]), ") belongs to an earlier group (",
                           slots[first_match[i]].name, " to '", groups[of[first_match[i]]].name,
                           "'); put it before that group or drop it");
  }
  return of;
}

}  // namespace towerflow::optim

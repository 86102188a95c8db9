#pragma once
// The string helpers of option parsing, device names and file names, in one place. ASCII only
// and independent of the locale: options and names read the same on every machine.

#include <string>
#include <string_view>
#include <vector>

namespace towerflow {

// ' ', '\t', '\n', '\v', '\f', '\r' (std::isspace in the "C" locale).
constexpr bool is_ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// `s` without leading and trailing ASCII whitespace.
constexpr std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ascii_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ascii_space(s.back())) s.remove_suffix(1);
  return s;
}

// `s` with A-Z as a-z (lower) or a-z as A-Z (upper); other bytes as they are.
inline std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}
inline std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  return out;
}

// The parts of `s` between separators, empty parts included: split("a,,b", ',') is
// {"a", "", "b"}; split("", ',') is {""}. The parts view `s`.
inline std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  while (true) {
    const auto pos = s.find(sep);
    parts.push_back(s.substr(0, pos));
    if (pos == std::string_view::npos) break;
    s.remove_prefix(pos + 1);
  }
  return parts;
}

}  // namespace towerflow

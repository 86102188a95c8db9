#include "core/error.h"

#include <regex>

namespace towerflow::detail {

void check_failed(const char* condition, const std::string& message,
                  const std::source_location& where) {
  std::ostringstream os;
  os << "internal check failed: " << condition << " at " << where.file_name() << ":"
     << where.line() << " (" << where.function_name() << ")";
  if (!message.empty()) os << ": " << message;
  throw InternalError(os.str());
}

}  // namespace towerflow::detail

namespace towerflow {

std::string render_options(std::string_view message,
                           const std::function<std::optional<std::string>(const OptionMention&)>& render) {
  // Struct::field, an optional [entry], an optional " = value" (up to a space or , ; ( ) and
  // without a sentence's final full stop).
  static const std::regex kMention(
      R"(\b([A-Z][A-Za-z0-9]*Options::[a-z][a-z0-9_]*)(?:\[([^\]\s]+)\])?(?: = ([^\s,;()]+))?)");
  const std::string text(message);
  std::string out;
  auto pos = text.cbegin();
  for (std::sregex_iterator it(text.begin(), text.end(), kMention), end; it != end; ++it) {
    const std::smatch& m = *it;
    auto view = [](const std::ssub_match& g) {
      return g.matched ? std::string_view(&*g.first, static_cast<std::size_t>(g.length())) : std::string_view();
    };
    std::string_view value = view(m[3]);
    auto mention_end = m[0].second;
    while (!value.empty() && value.back() == '.') value.remove_suffix(1), --mention_end;
    const auto rendered = render({.field = view(m[1]), .entry = view(m[2]), .value = value});
    if (!rendered) continue;
    out.append(pos, m[0].first);
    out += *rendered;
    pos = mention_end;
  }
  out.append(pos, text.cend());
  return out;
}

}  // namespace towerflow

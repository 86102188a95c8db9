#include "core/platform/ini.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "core/error.h"
#include "core/strings.h"

namespace towerflow {
namespace {

// Note [INI as configparser reads it]
// This follows ConfigParser._read of CPython 3.11 line by line, with the default settings
// (delimiters '=' and ':', comment_prefixes '#' and ';', no inline comment prefixes,
// strict=True, empty_lines_in_values=True, optionxform=str.lower):
//   - a line is a comment when, stripped, it starts with '#' or ';';
//   - a blank line inside a value adds an empty line to it (dropped again if trailing);
//   - a non-blank line indented deeper than the last key or header line continues the current
//     value (indent counts characters, a tab is one);
//   - otherwise `\[(.+)\]` at the start is a header (the name runs to the last ']'), then
//     `(.*?)\s*(=|:)\s*(.*)$` is a key and value, and anything else is an error.
// tests/fixtures/ini holds files whose configparser reading is checked in (make_expected.py),
// and tests/core/platform/test_ini.cc compares read_ini with it.

// Python's str.strip() and \s on ASCII text: space, \t \n \v \f \r and \x1c-\x1f.
bool is_space(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f');
}

std::string_view strip(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string rstrip(std::string s) {
  while (!s.empty() && is_space(s.back())) s.pop_back();
  return s;
}

// Splits at "\n", "\r\n" and "\r" (Python's universal newlines).
std::vector<std::string_view> lines_of(std::string_view text) {
  std::vector<std::string_view> lines;
  std::size_t start = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\n' && text[i] != '\r') continue;
    lines.push_back(text.substr(start, i - start));
    if (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
    start = i + 1;
  }
  if (start < text.size()) lines.push_back(text.substr(start));
  return lines;
}

// Optimal string alignment distance: insertions, deletions, substitutions and swaps of two
// neighbouring characters ([trian] is one edit from [train]).
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

}  // namespace

IniFile read_ini(std::string_view text, std::string_view source) {
  IniFile out;
  std::map<std::string, int> sections;                        // header line of each section
  std::map<std::pair<std::string, std::string>, int> keys;    // (section, key) -> line
  std::string section;                                        // "" until the first header
  IniEntry* current = nullptr;  // the value a deeper-indented line continues: the last entry, or
                                // null before the first key and after a header
  std::size_t indent_level = 0;
  int line_no = 0;
  for (std::string_view line : lines_of(text)) {
    ++line_no;
    std::string_view stripped = strip(line);
    bool comment = !stripped.empty() && (stripped.front() == '#' || stripped.front() == ';');
    if (stripped.empty() || comment) {
      // configparser keeps a blank line inside a value, but not a comment line.
      if (!comment && current) current->value += '\n';
      continue;
    }
    std::size_t indent = 0;
    while (is_space(line[indent])) ++indent;  // a non-space exists: `stripped` is not empty
    if (current && indent > indent_level) {
      current->value += '\n';
      current->value += stripped;
      current->last_line = line_no;
      continue;
    }
    indent_level = indent;
    // A section header: '[', at least one character, and a later ']' (the last one).
    if (stripped.front() == '[') {
      std::size_t close = stripped.rfind(']');
      if (close != std::string_view::npos && close >= 2) {
        section = std::string(stripped.substr(1, close - 1));
        auto [it, fresh] = sections.emplace(section, line_no);
        if (!fresh && section != "DEFAULT")
          raise<InvalidArgument>(source, ":", line_no, ": section [", section, "] is already given on line ",
                                 it->second, "; merge the two (Python's configparser refuses it too)");
        if (fresh) out.sections.push_back({.name = section, .line = line_no});
        current = nullptr;
        continue;
      }
    }
    std::size_t delim = stripped.find_first_of("=:");
    if (delim == std::string_view::npos) {
      if (stripped.front() == '[')
        raise<InvalidArgument>(source, ":", line_no, ": section header '", stripped,
                               "' is not [name]; write e.g. [gpu]");
      raise<InvalidArgument>(source, ":", line_no, ": '", stripped,
                             "' is not 'key = value' or 'key: value' (nor a [section] or a # comment); "
                             "write e.g. allow_growth = true");
    }
    std::string key = lower(strip(stripped.substr(0, delim)));
    if (key.empty())
      raise<InvalidArgument>(source, ":", line_no, ": '", stripped, "' has no key before '", stripped[delim],
                             "'; write e.g. allow_growth = true");
    auto [it, fresh] = keys.emplace(std::pair{section, key}, line_no);
    if (!fresh)
      raise<InvalidArgument>(source, ":", line_no, ": option ", key, " is already set on line ", it->second,
                             section.empty() ? std::string() : str(" in [", section, "]"),
                             "; keep one of the two");
    out.entries.push_back({.section = section,
                           .key = std::move(key),
                           .value = std::string(strip(stripped.substr(delim + 1))),
                           .line = line_no,
                           .last_line = line_no});
    current = &out.entries.back();  // valid until the next push, which resets it
  }
  for (IniEntry& e : out.entries) e.value = rstrip(std::move(e.value));
  return out;
}

void check_ini_sections(const IniFile& ini, std::string_view source, std::string_view what,
                        const std::vector<std::string>& known) {
  std::set<std::string> ours;
  std::string listing;  // "[train], [gpu], ..."
  for (const std::string& k : known) {
    ours.insert(lower(k));
    listing += "[" + k + "], ";
  }
  listing += "[DEFAULT] and [towerflow]";
  // The sections of other programs that share the file, as [towerflow] ignore_sections names them.
  std::set<std::string> ignored;
  for (const IniEntry& e : ini.entries) {
    if (lower(e.section) != "towerflow") continue;
    if (e.key != "ignore_sections")
      raise<InvalidArgument>(source, ":", e.line, ": [", e.section, "] has no key ", e.key,
                             "; it takes ignore_sections = <section>, ... (the sections of other programs "
                             "that share this file, which are then skipped)");
    std::string_view list = ini_option_value(e);
    std::size_t start = 0;
    while (start <= list.size()) {
      std::size_t end = std::min(list.find_first_of(",\n", start), list.size());
      std::string_view name = strip(list.substr(start, end - start));
      if (name.size() >= 2 && name.front() == '[' && name.back() == ']') name = strip(name.substr(1, name.size() - 2));
      start = end + 1;
      if (name.empty()) continue;
      if (ours.count(lower(name)) || name == "DEFAULT" || lower(name) == "towerflow")
        raise<InvalidArgument>(source, ":", e.line, ": ignore_sections names [", name, "], a section of ", what,
                               "; remove it from the list");
      ignored.insert(lower(name));
    }
  }
  for (const IniSection& s : ini.sections) {
    const std::string name = lower(s.name);
    if (s.name.empty() || s.name == "DEFAULT" || name == "towerflow" || ours.count(name) || ignored.count(name))
      continue;
    // The nearest known section, when it is near enough to be the one meant.
    std::string nearest;
    std::size_t best = std::max<std::size_t>(2, name.size() / 3) + 1;
    for (const std::string& k : known)
      if (std::size_t d = edit_distance(name, lower(k)); d < best) best = d, nearest = k;
    if (nearest.empty() && edit_distance(name, "default") <= 2) nearest = "DEFAULT";
    raise<InvalidArgument>(source, ":", s.line, ": unknown section [", s.name, "]",
                           nearest.empty() ? std::string(".") : str("; did you mean [", nearest, "]?"),
                           " The sections of ", what, " are ", listing,
                           "; this one would be skipped with every key in it. ",
                           nearest.empty() ? std::string("Rename it") : str("Rename it to [", nearest, "]"),
                           ", or, if another program sharing this file reads it, declare it in a [towerflow] "
                           "section: ignore_sections = ", s.name);
  }
}

std::string_view ini_option_value(const IniEntry& e) {
  std::string_view value = e.value;
  if (auto hash = value.find(" #"); hash != std::string_view::npos) value = strip(value.substr(0, hash));
  if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') && value.back() == value.front())
    value = value.substr(1, value.size() - 2);
  return value;
}

void raise_ini_value_error(std::string_view source, const IniEntry& e, std::string_view what) {
  if (e.last_line == e.line) raise<InvalidArgument>(source, ":", e.line, ": ", what);
  raise<InvalidArgument>(source, ":", e.line, ": ", what, " (the value of ", e.key, " continues to line ",
                         e.last_line, ": a line indented deeper than the one above it continues its value, "
                         "as in Python's configparser; unindent it to make it a key of its own)");
}

}  // namespace towerflow

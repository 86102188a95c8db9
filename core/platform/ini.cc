#include "core/platform/ini.h"

#include <map>
#include <set>
#include <utility>

#include "core/error.h"

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

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
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

#pragma once
// INI files read as Python's configparser reads them (ConfigParser() with its defaults), so that
// a file the TensorFlow tutorials read with configparser reads the same here, and a file
// configparser refuses is refused here with the file and line.
//
//   IniFile ini = read_ini(text, "train.ini");
//   for (const IniEntry& e : ini.entries)      // in file order
//     use(e.section, e.key, ini_option_value(e));
//
// The grammar (configparser's, see Note [INI as configparser reads it] in ini.cc):
//   - `key = value` and `key: value`: the key ends at the first '=' or ':'; key and value are
//     stripped of whitespace and the key is lower-cased; an empty value is allowed.
//   - `[name]` starts a section; the name is kept as written (configparser's section names are
//     case-sensitive); text after the last ']' is ignored.
//   - a line whose first non-blank character is '#' or ';' is a comment; blank lines are skipped.
//   - a line indented deeper than the key line above it continues that key's value (the lines
//     are joined with '\n'; blank lines inside are kept, trailing ones dropped).
//   - lines end at "\n", "\r\n" or "\r".
// Errors, all InvalidArgument "SOURCE:LINE: ...": a line that is none of these (no '=' or ':'),
// an empty key, a section given twice ([DEFAULT] excepted) and a key given twice in one section.
//
// One extension: keys before the first section header are read, in section "" (configparser
// raises MissingSectionHeaderError; Python 3.13 reads them with allow_unnamed_section=True).
// Not done: interpolation ('%' is kept as written; no towerflow value uses it) and Unicode
// case-folding and whitespace beyond ASCII.

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace towerflow {

struct IniEntry {
  std::string section;  // as written; "" before the first section header
  std::string key;      // lower case
  std::string value;    // stripped; continuation lines joined with '\n'
  int line = 0;         // the key's line (1-based)
  int last_line = 0;    // the value's last line (== line unless the value continues)
};

struct IniSection {
  std::string name;  // as written
  int line = 0;      // its first header line (1-based)
};

struct IniFile {
  std::vector<IniEntry> entries;     // in file order
  std::vector<IniSection> sections;  // every header, once, in file order (empty ones too)
};

// Reads INI text. `source` names the file in error messages. Throws InvalidArgument.
IniFile read_ini(std::string_view text, std::string_view source);

// The value as towerflow's options read it: the entry's value less an inline comment (" #" and
// what follows) and less one pair of matching quotes around it. configparser keeps both; no
// towerflow value contains " #" or starts and ends with a quote, so these only accept more.
std::string_view ini_option_value(const IniEntry& e);

// Refuses a section that the program reading the file does not know, so that a typo such as
// [trian] is not skipped with every key in it. `known` are the program's sections (compared in
// any case); the keys before the first header, [DEFAULT] and [towerflow] are always known.
// A file shared with other programs declares their sections, which are then skipped:
//   [towerflow]
//   ignore_sections = pipeline, eval_server     # commas or lines between names
// Throws InvalidArgument "SOURCE:LINE: unknown section [trian]; did you mean [train]? ..." naming
// `what` (e.g. "a cifar10_train --config file"), its sections and the fix, for an unknown section;
// also for a key of [towerflow] other than ignore_sections and for ignore_sections naming one of
// the known sections.
void check_ini_sections(const IniFile& ini, std::string_view source, std::string_view what,
                        const std::vector<std::string>& known);

// Throws InvalidArgument "SOURCE:LINE: what" for a value the options refused; when the value
// continues on further lines, the message says so (an indented line is a continuation).
[[noreturn]] void raise_ini_value_error(std::string_view source, const IniEntry& e, std::string_view what);

}  // namespace towerflow

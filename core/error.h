#pragma once
// Errors: one exception hierarchy for the whole library, and CHECK for invariants.
//
// Contract: user mistakes (a flag, a path, a config value, a corrupt file) raise a subclass of
// towerflow::Error whose message names the thing, the value, and the fix. Broken invariants inside
// the library raise InternalError through TW_CHECK, with the source location. Nothing in the
// library calls exit() or abort() on a recoverable error.
//
// Options in messages: the library names an option as the C++ field an embedding program sets,
// optionally with an entry and the value to give it: "FitOptions::batch",
// "ProcessOptions::memory_limit_mb[/gpu:1]", "TrainerOptions::precision = Precision::Fp32". A
// program with flags shows them in its own spelling with render_options (each program keeps its
// own map from fields to flags).

#include <functional>
#include <optional>
#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace towerflow {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class InvalidArgument : public Error {  // a bad value from the user: flag, option, shape, name
 public:
  using Error::Error;
};
class NotFound : public Error {  // a device, file, model or tensor that does not exist
 public:
  using Error::Error;
};
class DataError : public Error {  // a corrupt, truncated or mismatched file
 public:
  using Error::Error;
};
class DeviceError : public Error {  // a device that fails, or a backend that is not built
 public:
  using Error::Error;
};
class OutOfMemory : public Error {  // an allocator that cannot satisfy a request
 public:
  using Error::Error;
};
class NumericalError : public Error {  // NaN or infinite values where finite ones are required
 public:
  using Error::Error;
};
class InternalError : public Error {  // a broken invariant: a bug in towerflow
 public:
  using Error::Error;
};

namespace detail {
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  ((os << parts), ...);
  return os.str();
}
[[noreturn]] void check_failed(const char* condition, const std::string& message,
                               const std::source_location& where);
}  // namespace detail

// Builds a message from streamable parts: str("batch ", b, " on ", device).
template <typename... Parts>
std::string str(const Parts&... parts) {
  return detail::concat(parts...);
}

// Throws the exception type E with a message built from the parts.
template <typename E, typename... Parts>
[[noreturn]] void raise(const Parts&... parts) {
  throw E(detail::concat(parts...));
}

// One option named in a message: "ProcessOptions::memory_limit_mb[/gpu:1] = 4096" has field
// "ProcessOptions::memory_limit_mb", entry "/gpu:1" and value "4096" (entry and value empty
// when absent).
struct OptionMention {
  std::string_view field;
  std::string_view entry;
  std::string_view value;
};
// `message` with each option mention that `render` gives text for replaced by that text (the
// whole mention: field, entry and value); mentions it returns nullopt for stay as written.
std::string render_options(std::string_view message,
                           const std::function<std::optional<std::string>(const OptionMention&)>& render);

}  // namespace towerflow

// TW_CHECK(cond, parts...): an invariant. On failure throws towerflow::InternalError naming the
// condition, the file and line, and the streamed parts.
#define TW_CHECK(cond, ...)                                                                   \
  do {                                                                                        \
    if (!(cond)) [[unlikely]]                                                                 \
      ::towerflow::detail::check_failed(#cond, ::towerflow::str(__VA_ARGS__),                 \
                                        std::source_location::current());                     \
  } while (0)

#include "core/error.h"

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

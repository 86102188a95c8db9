#include "examples/cifar10/main_util.h"

#include <cstdio>

#include "core/error.h"

namespace towerflow::cifar10 {

int run_main(const TrainCommandLine& cli, const std::function<int(const Resolved&, Reporter&)>& work) {
  Resolved resolved;
  try {
    resolved = cli.resolve();
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  Reporter reporter({.json = resolved.train.json});
  auto fail = [&](const std::exception& e, int code) {
    reporter.message(LogLevel::Error, e.what());
    return code;
  };
  try {
    return work(resolved, reporter);
  } catch (const NumericalError& e) {
    return fail(e, 3);
  } catch (const OutOfMemory& e) {
    return fail(e, 4);
  } catch (const InvalidArgument& e) {
    return fail(e, 2);
  } catch (const NotFound& e) {
    return fail(e, 2);
  } catch (const DataError& e) {
    return fail(e, 2);
  } catch (const std::exception& e) {
    return fail(e, 1);
  }
}

}  // namespace towerflow::cifar10

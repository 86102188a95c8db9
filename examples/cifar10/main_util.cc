#include "examples/cifar10/main_util.h"

#include <cstdio>
#include <cstdlib>

#include "core/collectives/process_group.h"
#include "core/error.h"
#include "core/log.h"

namespace towerflow::cifar10 {

std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints the message and the hint to --help
    return 2;
  }
}

namespace {

// --progress, or json with --json (its older spelling).
train::Progress progress_of(const TrainOptions& o) {
  const train::Progress progress = train::parse_progress(o.progress);
  if (!o.json) return progress;
  if (progress != train::Progress::Auto && progress != train::Progress::Json)
    raise<InvalidArgument>("--json and --progress ", o.progress, " disagree (--json is --progress json); give one of them");
  return train::Progress::Json;
}

}  // namespace

int run_main(const TrainCommandLine& cli, const std::function<int(const Resolved&, Reporter&)>& work) {
  Resolved resolved;
  train::Progress progress;
  try {
    resolved = cli.resolve();
    progress = progress_of(resolved.train);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  // Under mpirun: MPI starts here. Ranks other than 0 log errors only (rank 0 speaks for the
  // job), and a rank that fails tells the others, which stop too (Note [Collectives that cannot
  // hang] in core/collectives/mpi_process_group.cc).
  collectives::ProcessGroup* world = nullptr;
  try {
    world = &collectives::world();
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  if (world->rank() > 0 && std::getenv("TOWERFLOW_LOG_LEVEL") == nullptr) set_log_level(LogLevel::Error);
  Reporter reporter({.progress = progress});
  auto fail = [&](const std::exception& e, int code) {
    if (dynamic_cast<const collectives::PeerFailed*>(&e) == nullptr) world->announce_failure(e.what());
    reporter.message(LogLevel::Error, world->size() > 1 ? str("rank ", world->rank(), ": ", e.what()) : e.what());
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

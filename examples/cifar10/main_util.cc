#include "examples/cifar10/main_util.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/collectives/process_group.h"
#include "core/error.h"
#include "core/log.h"

namespace towerflow::cifar10 {

namespace {

// Levenshtein distance, for "did you mean".
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The app's long flag names, without dashes.
std::vector<std::string> flag_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : app.get_options())
    for (const std::string& n : opt->get_lnames()) names.push_back(n);
  return names;
}

// --batch-size for --batch_size: a long flag's dashes become underscores where only that spelling
// is a flag (GNU and absl users write either).
std::vector<std::string> with_underscores(const CLI::App& app, int argc, char** argv) {
  const std::vector<std::string> names = flag_names(app);
  std::vector<std::string> args(argv, argv + argc);
  for (std::size_t i = 1; i < args.size(); ++i) {
    std::string& a = args[i];
    if (a == "--") break;
    if (!a.starts_with("--")) continue;
    const std::size_t eq = a.find('=');
    std::string name = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    if (name.find('-') == std::string::npos || std::find(names.begin(), names.end(), name) != names.end()) continue;
    std::replace(name.begin(), name.end(), '-', '_');
    if (std::find(names.begin(), names.end(), name) != names.end())
      a = "--" + name + (eq == std::string::npos ? "" : a.substr(eq));
  }
  return args;
}

// What to say about arguments the parser did not expect: the nearest flag for a misspelled one,
// and the '=' form for a value given to a switch with a space (--resume false).
std::string explain_extras(const CLI::App& app, const std::vector<std::string>& args,
                           const std::vector<std::string>& extras) {
  const std::vector<std::string> names = flag_names(app);
  std::string out;
  for (const std::string& extra : extras) {
    if (extra.starts_with("-")) {
      const std::string name = extra.substr(extra.find_first_not_of('-'), extra.find('=') - extra.find_first_not_of('-'));
      std::string best;
      std::size_t best_d = std::max<std::size_t>(3, name.size() / 3) + 1;
      for (const std::string& n : names)
        if (const std::size_t d = edit_distance(name, n); d < best_d) best = n, best_d = d;
      out += str("\n  ", extra, ": no such flag", best.empty() ? str("; --help lists them") : str("; did you mean --", best, "?"));
      continue;
    }
    // A value after a switch: the switch takes none unless it is written --switch=value.
    for (std::size_t i = 1; i + 1 < args.size(); ++i) {
      if (args[i + 1] != extra || !args[i].starts_with("--") || args[i].find('=') != std::string::npos) continue;
      const CLI::Option* opt = nullptr;
      try {
        opt = app.get_option(args[i]);
      } catch (const CLI::OptionNotFound&) {
        continue;
      }
      if (opt->get_expected_min() == 0) {
        out += str("\n  ", extra, ": ", args[i], " is a switch and takes no value after a space; write ", args[i], "=",
                   extra);
        break;
      }
    }
  }
  return out;
}

}  // namespace

std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  std::vector<std::string> args = with_underscores(app, argc, argv);
  std::vector<char*> argv2;
  for (std::string& a : args) argv2.push_back(a.data());
  try {
    app.parse(static_cast<int>(argv2.size()), argv2.data());
    return std::nullopt;
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::ExtrasError& e) {
    app.exit(e);  // CLI11's message and the hint to --help
    const std::string more = explain_extras(app, args, app.remaining());
    if (!more.empty()) std::fprintf(stderr, "%s\n", more.substr(1).c_str());
    return 2;
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
    std::fprintf(stderr, "error: %s\n", as_flags(e.what()).c_str());
    return 2;
  }
  // Under mpirun: MPI starts here. Ranks other than 0 log errors only (rank 0 speaks for the
  // job), and a rank that fails tells the others, which stop too (Note [Collectives that cannot
  // hang] in core/collectives/mpi_process_group.cc).
  collectives::ProcessGroup* world = nullptr;
  try {
    world = &collectives::world();
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", as_flags(e.what()).c_str());
    return 2;
  }
  if (world->rank() > 0 && std::getenv("TOWERFLOW_LOG_LEVEL") == nullptr) set_log_level(LogLevel::Error);
  Reporter reporter({.progress = progress});
  auto fail = [&](const std::exception& e, int code) {
    if (dynamic_cast<const collectives::PeerFailed*>(&e) == nullptr) world->announce_failure(e.what());
    const std::string message = as_flags(e.what());
    reporter.message(LogLevel::Error, world->size() > 1 ? str("rank ", world->rank(), ": ", message) : message);
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

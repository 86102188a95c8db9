// towerflow_bench_data: how fast the loader turns a dataset into training batches.
//
//   towerflow_bench_data --dataset cifar10 --data_dir DIR --threads N --json
//   towerflow_bench_data --dataset builtin --threads 1,2
//   towerflow_bench_data --dataset folder --data_dir DIR --threads 2
//
// Each row runs the Loader with the CIFAR training recipe (pad-4 crop, flip, normalisation;
// --cutout adds cutout) over --images images after one warm-up batch, with a consumer that only
// takes the batches, and reports images/s and images/s per worker thread. threads = 0 produces on
// the consumer's thread (the cost of one thread without queueing). The check column compares the
// row's first batch with one made synchronously: it must be bit-identical whatever the threads.
// Opening the dataset (reading and validating files) is timed separately and not counted.
// img_per_cpu_s divides the images by the CPU time the whole process used meanwhile (workers and
// consumer): the per-thread cost, much less sensitive than wall time to other load on the machine.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/data.h"

namespace tw = towerflow;
namespace data = towerflow::data;
using Clock = std::chrono::steady_clock;

namespace {

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoi(item));
  return out;
}

bool same_batch(const data::Batch& a, const data::Batch& b) {
  return a.n == b.n && a.labels == b.labels &&
         std::equal(a.valid_images().begin(), a.valid_images().end(), b.valid_images().begin());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"towerflow_bench_data: loader throughput (decode + augment + batch)"};
  std::string dataset = "builtin", data_dir, threads_list = "1";
  int batch = 512, prefetch = 4, cutout = 0;
  std::int64_t images = 50000;
  bool json = false, no_validate = false;
  app.add_option("--dataset", dataset, "cifar10, cifar100, folder or builtin")->capture_default_str();
  app.add_option("--data_dir", data_dir, "the dataset's folder (not needed for builtin)");
  app.add_option("--threads", threads_list, "worker threads, or a comma-separated list of counts (one row each)")
      ->capture_default_str();
  app.add_option("--batch", batch, "global batch size")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--images", images, "images timed per row (whole batches; at least one epoch of the set is not needed)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--prefetch", prefetch, "batches prefetched")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--cutout", cutout, "cutout size (0: off)")->capture_default_str();
  app.add_flag("--no_validate", no_validate, "folder: do not decode every file when opening");
  app.add_flag("--json", json, "also print one JSON line per row");
  CLI11_PARSE(app, argc, argv);

  try {
    const auto kind = data::parse_dataset_kind(dataset);
    const std::vector<int> thread_counts = parse_list(threads_list);
    const auto t_open = Clock::now();
    auto set = data::open_dataset(kind, data_dir, data::Split::Train,
                                  {.folder = {.validate = !no_validate}, .builtin = {.train_size = 50000}});
    const double open_s = std::chrono::duration<double>(Clock::now() - t_open).count();
    std::printf("dataset: %s, opened in %.2f s; batch %d, recipe: crop pad 4 + flip + normalise%s\n",
                set->describe().c_str(), open_s, batch, cutout > 0 ? " + cutout" : "");
    std::printf("%-8s %7s %6s %9s %9s %12s %14s %14s %6s\n", "dataset", "threads", "batch", "images", "time_s",
                "img_per_s", "img_per_s/thr", "img_per_cpu_s", "check");

    // The reference for the check column: the first batch of epoch 0, made on this thread.
    const data::LoaderOptions base{.batch = batch, .augment = data::cifar_augment(cutout), .seed = 1,
                                   .drop_last = false, .prefetch = prefetch};
    data::LoaderOptions ref_options = base;
    ref_options.threads = 0;
    data::Loader reference(*set, ref_options);
    reference.start();
    const data::Batch& first = *reference.next();

    int failures = 0;
    for (int threads : thread_counts) {
      data::LoaderOptions options = base;
      options.threads = threads;
      data::Loader loader(*set, options);
      const std::int64_t steps_wanted = std::max<std::int64_t>(1, (images + batch - 1) / batch);
      // Whole epochs, then part of one; the first batch (warm-up) is not timed.
      std::int64_t steps = 0, counted = 0;
      bool check = true;
      Clock::time_point t0;
      double cpu0 = 0;
      while (steps < steps_wanted + 1) {
        for (const data::Batch& b : loader) {
          if (steps == 0) {
            check = same_batch(b, first);
            t0 = Clock::now();
            cpu0 = process_cpu_seconds();
          } else {
            counted += b.n;
          }
          if (++steps == steps_wanted + 1) break;
        }
      }
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      const double cpu_seconds = process_cpu_seconds() - cpu0;
      loader.stop();
      const double ips = counted / seconds;
      const double per_thread = ips / std::max(1, threads);
      const double per_cpu_s = counted / cpu_seconds;
      failures += !check;
      std::printf("%-8s %7d %6d %9lld %9.3f %12.0f %14.0f %14.0f %6s\n", dataset.c_str(), threads, batch,
                  static_cast<long long>(counted), seconds, ips, per_thread, per_cpu_s, check ? "ok" : "DIFF");
      if (json) {
        nlohmann::json row = {{"bench", "data"},          {"dataset", dataset},     {"threads", threads},
                              {"batch", batch},           {"images", counted},      {"seconds", seconds},
                              {"img_per_s", ips},         {"img_per_s_per_thread", per_thread},
                              {"img_per_cpu_s", per_cpu_s}, {"cpu_seconds", cpu_seconds},
                              {"cutout", cutout},         {"open_s", open_s},       {"check", check ? "ok" : "diff"}};
        std::printf("%s\n", row.dump().c_str());
      }
    }
    return failures == 0 ? 0 : 1;
  } catch (const tw::Error& e) {
    std::fprintf(stderr, "towerflow_bench_data: %s\n", e.what());
    return 2;
  }
}

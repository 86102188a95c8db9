// Training throughput of one model on one CPU device, on synthetic data.
//
//   towerflow_bench_train --model resnet20|tfcnn|... --batch 128 --threads N --steps S
//                         --warmup W [--json] [--devices 1]
//
// Each step is what torch_cifar_bench.py times (/work/shared/peers): zero the gradients,
// forward, softmax cross-entropy (batch mean), backward, SGD with momentum 0.9 and weight decay
// 5e-4 (PyTorch's formulation: v = m v + g + wd p; p -= lr v), applied to the flat parameter
// buffer on the device's threads. One batch (NHWC float32 normal, labels uniform in [0, 10)) is
// made up front and reused, so the figures are compute only. Reports the median over the timed
// steps: images/s, ms/step and GFLOP/s = images/s x forward multiply-adds x 2 x 3 (the peer's
// convention). The check column says whether every loss was finite and the last below the first.

#include <CLI/CLI.hpp>
#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/memory/allocator.h"
#include "core/platform/registry.h"
#include "core/tensor/cpu_backend.h"
#include "core/tensor/ops.h"
#include "models/models.h"

namespace tw = towerflow;

namespace {

double process_cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// In-place SGD with momentum and weight decay over flat buffers, parallel on the device's threads.
void sgd_step(const tw::cpu::CpuContext& ctx, float lr, float momentum, float weight_decay,
              float* p, const float* g, float* v, std::int64_t n) {
  ctx.parallel_for(n, 16 * 1024, [&](std::int64_t b, std::int64_t e) {
    using Map = Eigen::Map<Eigen::ArrayXf>;
    using CMap = Eigen::Map<const Eigen::ArrayXf>;
    Map pm(p + b, e - b), vm(v + b, e - b);
    vm = momentum * vm + CMap(g + b, e - b) + weight_decay * pm;
    pm -= lr * vm;
  });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"towerflow training throughput on one CPU device (synthetic data)"};
  std::string model_name = "resnet20";
  int batch = 128, threads = 0, steps = 20, warmup = 5, devices = 1, classes = 10;
  float lr = 0.01f;
  bool json = false;
  app.add_option("--model", model_name, "resnet20, resnet32, ..., tfcnn");
  app.add_option("--batch", batch, "images per step")->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "intra-op threads of the CPU device (0: all cores)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--steps", steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--devices", devices, "devices (1; more needs the tower trainer)");
  app.add_option("--lr", lr, "SGD learning rate");
  app.add_flag("--json", json, "print one JSON line per result");
  CLI11_PARSE(app, argc, argv);

  try {
    if (devices != 1)
      tw::raise<tw::InvalidArgument>(
          "--devices ", devices, ": this benchmark trains on one device; multi-device training "
          "needs the tower trainer (tower/), use --devices 1");
    tw::ProcessOptions opts;
    if (threads > 0) opts.intra_op_threads = threads;
    tw::initialise_devices(opts);
    const tw::Device dev = tw::Device::cpu(0);
    const int used_threads = tw::device_info(dev).intra_op_threads;
    auto model = tw::models::make_model(model_name, dev, {.num_classes = classes, .seed = 0});
    const std::int64_t macs = tw::models::forward_macs_per_image(model_name, classes);

    std::mt19937 gen(0);
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<int> label(0, classes - 1);
    std::vector<float> xs(static_cast<std::size_t>(batch) * 32 * 32 * 3);
    for (auto& v : xs) v = normal(gen);
    std::vector<std::int32_t> ys(static_cast<std::size_t>(batch));
    for (auto& v : ys) v = label(gen);
    tw::Tensor x = tw::Tensor::from_host(std::span<const float>(xs), {batch, 32, 32, 3}, dev);
    tw::Tensor y = tw::Tensor::from_host(std::span<const std::int32_t>(ys), {batch}, dev);

    tw::Tensor params = model->flat_parameters(), grads = model->flat_gradients();
    tw::Tensor velocity = tw::Tensor::zeros(params.shape(), dev);
    const auto& ctx = tw::cpu_context_for(dev);
    auto step = [&] {
      model->zero_grad();
      tw::Tensor loss = tw::softmax_cross_entropy(model->forward(x), y);
      loss.backward();
      sgd_step(ctx, lr, 0.9f, 5e-4f, params.data<float>(), grads.data<float>(),
               velocity.data<float>(), params.numel());
      return loss.item();
    };

    std::vector<float> losses;
    for (int i = 0; i < warmup; ++i) losses.push_back(step());
    const std::size_t regions_before = tw::device_allocator(dev).stats().num_regions;
    std::vector<double> ms;
    const double cpu0 = process_cpu_s();
    for (int i = 0; i < steps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      losses.push_back(step());
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    // CPU seconds per step (all threads): on a shared, loaded machine this is steadier than wall
    // time; batch / (cpu_s / threads) is the throughput the threads would give if not descheduled.
    const double cpu_s_per_step = (process_cpu_s() - cpu0) / steps;
    const auto stats = tw::device_allocator(dev).stats();
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted.size() % 2 ? sorted[sorted.size() / 2]
                                            : 0.5 * (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]);
    const double img_s = batch / (median / 1e3);
    const double gflops = img_s * static_cast<double>(macs) * 2 * 3 / 1e9;
    bool ok = losses.back() < losses.front();
    for (float l : losses) ok = ok && std::isfinite(l);

    std::printf("%-10s %6s %7s %7s %10s %10s %9s %9s %12s %s\n", "model", "batch", "threads",
                "devices", "img/s", "ms/step", "min ms", "GFLOP/s", "loss", "check");
    std::printf("%-10s %6d %7d %7d %10.1f %10.2f %9.2f %9.1f %5.3f->%5.3f %s\n",
                model_name.c_str(), batch, used_threads, devices, img_s, median, sorted.front(),
                gflops, losses.front(), losses.back(), ok ? "ok" : "FAIL");
    std::printf("# process CPU time: %.3f s per step (%.1f img per CPU-second x %d threads = %.1f "
                "img/s unloaded estimate)\n",
                cpu_s_per_step, batch / cpu_s_per_step, used_threads,
                batch / cpu_s_per_step * used_threads);
    std::printf("# pool: %.1f MiB in %zu regions (%zu before the timed steps), peak %.1f MiB\n",
                stats.pool_bytes / 1048576.0, stats.num_regions, regions_before,
                stats.peak_bytes_in_use / 1048576.0);
    if (json) {
      nlohmann::json j = {{"model", model_name},       {"batch", batch},
                          {"threads", used_threads},   {"devices", devices},
                          {"img_per_s", img_s},        {"ms_per_step", median},
                          {"ms_per_step_min", sorted.front()},
                          {"gflop_per_s", gflops},     {"fwd_macs_per_img", macs},
                          {"cpu_s_per_step", cpu_s_per_step},
                          {"steps", steps},            {"warmup", warmup},
                          {"loss_first", losses.front()}, {"loss_last", losses.back()},
                          {"pool_regions_new_in_timed_steps", stats.num_regions - regions_before},
                          {"check", ok ? "ok" : "FAIL"}};
      std::printf("%s\n", j.dump().c_str());
    }
    return ok ? 0 : 1;
  } catch (const tw::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}

// Training throughput of a model on one or more devices (towers), on synthetic data.
//
//   towerflow_bench_train --model resnet20|tfcnn|... --batch 128 --threads N --steps S
//                         --warmup W [--devices 1|N|LIST] [--reduction all_reduce|...]
//                         [--split even|weights:W,...|auto[:...]] [--split_remainder error|spread]
//                         [--json] [--trace FILE]
//
//   --devices 1            one CPU device (the default)
//   --devices 2            two logical CPU devices, /cpu:0 and /cpu:1 (--threads each)
//   --devices /gpu:0,/gpu:1  the listed devices (CPU or GPU names, as cifar10_train takes them)
//
// Each step is what torch_cifar_bench.py and torch_ddp_bench.py time (bench/peers/): zero
// the gradients, forward, softmax cross-entropy (global-batch mean), backward, reduction across
// the towers (tower::Trainer, --reduction), SGD with momentum 0.9 and weight decay 5e-4 (PyTorch's
// formulation) through optim::Sgd. The global batch (NHWC float32 normal, labels uniform in
// [0, 10)) is made up front and reused, so the figures are compute and reduction only.
//
// Reports the median over the timed steps: images/s, ms/step, GFLOP/s = images/s x forward
// multiply-adds x 2 x 3 (the peer's convention), and the share of the step spent in reduction
// that backward did not hide (Trainer::timings()). With GPU devices each step is also timed with
// CUDA events recorded on every GPU's stream, after synchronising; the images/s then come from
// the slowest GPU's event time. The check column says whether every loss was finite and the mean
// of the last quarter of the losses below that of the first quarter (one loss against one is
// noise where a short run barely learns, as tfcnn's 120 steps on the synthetic set: 2.297 to 2.254).
//
// Under mpirun (mpirun -np 2 towerflow_bench_train --threads 1 ...) the towers are those of every
// process (--devices per process), each process gives its towers' rows of the global batch, and
// rank 0 prints the figures: the same table, for the whole job.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/peak.h"
#include "core/collectives/process_group.h"
#include "core/cuda/context.h"
#include "core/error.h"
#include "core/kernel_choice.h"
#include "core/memory/allocator.h"
#include "core/platform/registry.h"
#include "core/tensor/mac_counter.h"
#include "core/trace.h"
#include "models/models.h"
#include "optim/sgd.h"
#include "tower/trainer.h"

namespace tw = towerflow;

namespace {

double process_cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// "--devices" as a count of logical CPU devices or a comma-separated list of device names.
std::vector<tw::Device> parse_devices(const std::string& spec) {
  std::vector<tw::Device> out;
  if (!spec.empty() && std::all_of(spec.begin(), spec.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    const int n = std::stoi(spec);
    if (n < 1 || n > 256)
      tw::raise<tw::InvalidArgument>("--devices ", spec, ": use a device count from 1 to 256, or a list such as /cpu:0,/cpu:1");
    for (int i = 0; i < n; ++i) out.push_back(tw::Device::cpu(i));
    return out;
  }
  std::stringstream ss(spec);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty()) continue;
    try {
      out.push_back(tw::Device::parse(item));
    } catch (const tw::Error& e) {
      tw::raise<tw::InvalidArgument>("--devices: ", e.what());
    }
  }
  if (out.empty())
    tw::raise<tw::InvalidArgument>("--devices \"", spec, "\" names no device; write a count such as 2 or a list such as /cpu:0,/cpu:1");
  return out;
}

// Timing events on every GPU of the towers, one pair per step.
class GpuStepTimer {
 public:
  explicit GpuStepTimer(const std::vector<tw::Device>& devices) {
    for (const auto& d : devices)
      if (d.is_gpu()) {
        const auto& ctx = tw::gpu::context_for(d);
        contexts_.push_back(&ctx);
        start_.push_back(std::make_unique<tw::gpu::GpuEvent>(ctx, /*timing=*/true));
        stop_.push_back(std::make_unique<tw::gpu::GpuEvent>(ctx, /*timing=*/true));
      }
  }
  bool active() const { return !contexts_.empty(); }
  void start() {
    for (auto* c : contexts_) c->synchronize();
    for (auto& e : start_) e->record();
  }
  // Milliseconds of the slowest GPU between start() and now, after synchronising every stream.
  double stop() {
    double ms = 0;
    for (std::size_t i = 0; i < stop_.size(); ++i) stop_[i]->record();
    for (std::size_t i = 0; i < stop_.size(); ++i) {
      stop_[i]->synchronize();
      ms = std::max(ms, static_cast<double>(stop_[i]->elapsed_ms_since(*start_[i])));
    }
    return ms;
  }

 private:
  std::vector<const tw::gpu::GpuContext*> contexts_;
  std::vector<std::unique_ptr<tw::gpu::GpuEvent>> start_, stop_;
};

// --describe: one image through the model on /cpu:0 in training mode, its loss and backward, with
// the multiply-adds counted as the CPU runs them.
int describe_step(const std::string& model_name, int classes, float lr) {
  const tw::Device cpu = tw::Device::cpu(0);
  auto model = tw::models::make_model(model_name, cpu, {.num_classes = classes, .seed = 0});
  model->train(true);
  std::vector<float> image(32 * 32 * 3, 0.5f);
  const std::vector<std::int32_t> label{1};
  nlohmann::json layers = nlohmann::json::array();
  std::int64_t forward = 0, backward = 0;
  std::size_t forward_rows = 0;
  {
    tw::MacCounter count;
    const tw::Tensor x = tw::Tensor::from_host(image, {1, 32, 32, 3}, cpu);
    const tw::Tensor y = tw::Tensor::from_host(std::span<const std::int32_t>(label), {1}, cpu);
    const tw::Tensor logits = model->forward(x);
    forward = count.total();
    forward_rows = count.rows().size();
    tw::softmax_cross_entropy(logits, y).backward();
    backward = count.total() - forward;
    for (std::size_t i = 0; i < count.rows().size(); ++i) {
      const auto& r = count.rows()[i];
      layers.push_back({{"scope", r.scope}, {"op", r.op}, {"shape", r.shape}, {"macs", r.macs},
                        {"pass", i < forward_rows ? "forward" : "backward"}});
    }
  }
  nlohmann::json params = nlohmann::json::array(), buffers = nlohmann::json::array();
  std::int64_t count = 0;
  for (const auto& [name, t] : model->named_parameters()) {
    params.push_back({{"name", name}, {"shape", t.shape()}, {"trainable", t.requires_grad()}});
    count += t.numel();
  }
  for (const auto& [name, t] : model->named_buffers())
    buffers.push_back({{"name", name}, {"shape", t.shape()}});
  const nlohmann::json j = {
      {"framework", "towerflow"},
      {"model", model_name},
      {"params", count},
      {"parameters", params},
      {"buffers", buffers},
      {"fwd_macs_per_img", forward},
      {"bwd_macs_per_img", backward},
      {"fwd_macs_per_img_analytic", tw::models::forward_macs_per_image(model_name, classes)},
      {"layers", layers},
      {"loss", "softmax cross-entropy, mean over the batch"},
      {"optimizer", "SGD momentum 0.9, coupled L2 weight decay 5e-4 on every parameter (torch.optim.SGD), lr " +
                        tw::str(lr)}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"towerflow training throughput on one or more devices (synthetic data)"};
  std::string model_name = "resnet20", devices_spec = "1", reduction_spec = "all_reduce", remainder = "error",
              precision = "fp32", split_spec = "even";
  int batch = 128, threads = 0, steps = 20, warmup = 5, classes = 10;
  float lr = 0.01f;
  bool json = false;
  app.add_option("--model", model_name, "resnet20, resnet32, ..., tfcnn")->capture_default_str();
  app.add_option("--batch", batch, "global images per step, split evenly over the devices")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--threads", threads, "intra-op threads of each CPU device (0: the cores split evenly)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--steps", steps, "timed steps")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--devices", devices_spec, "a count of logical CPU devices, or a list: /cpu:0,/cpu:1 or /gpu:0,/gpu:1")
      ->capture_default_str();
  app.add_option("--reduction", reduction_spec, "all_reduce | bucketed[:MB] | parameter_device[:DEVICE]")
      ->capture_default_str();
  app.add_option("--split", split_spec, "even | weights:W0,W1,... (one per tower of every process) | auto[:freeze_after=N,...]: "
                 "rows by each tower's measured speed")
      ->capture_default_str();
  app.add_option("--split_remainder", remainder, "error | spread: a batch the devices do not divide is an error, or spread by largest remainders")
      ->check(CLI::IsMember({"error", "spread"}))->capture_default_str();
  app.add_option("--lr", lr, "SGD learning rate")->capture_default_str();
  app.add_option("--precision", precision, "fp32 | bf16 | fp16: convolutions and matrix products on bf16 or fp16 operands, fp32 accumulation (fp16 with dynamic loss scaling)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))->capture_default_str();
  app.add_flag("--json", json, "print one JSON line per result");
  std::string kernel_choice = "auto";
  app.add_option("--kernel_choice", kernel_choice, "auto | fixed: each convolution and matrix product on the fastest "
                 "kernel of this CPU, measured at its first call and cached (core/kernel_choice.h), or on towerflow's fixed rule")
      ->check(CLI::IsMember({"auto", "fixed"}))->capture_default_str();
  bool describe = false;
  app.add_flag("--describe", describe, "print what one training step computes, as one JSON line, and exit: the layers' "
               "multiply-adds counted as they run on one image (forward and backward), every parameter and buffer "
               "with its shape, the loss and the optimizer (bench/peers/check_equivalence.py compares the peers with it)");
  std::string trace_path;
  app.add_option("--trace", trace_path, "record the timed steps as a Chrome-trace JSON file (Perfetto, chrome://tracing) "
                                        "and print the time per op, and each memory-bound kernel's time against "
                                        "the time its bytes need at STREAM's triad bandwidth (JSON: memory_bound_kernels)");
  CLI11_PARSE(app, argc, argv);

  try {
    if (describe) return describe_step(model_name, classes, lr);
    const std::vector<tw::Device> devices = parse_devices(devices_spec);
    tw::collectives::ProcessGroup& world = tw::collectives::world();
    tw::ProcessOptions opts;
    if (threads > 0) opts.intra_op_threads = threads;
    else if (world.local_size() > 1)  // processes sharing a host share its cores
      opts.intra_op_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                                              world.local_size() / static_cast<int>(devices.size()));
    int cpus = 0;
    for (const auto& d : devices)
      if (d.is_cpu()) cpus = std::max(cpus, d.index + 1);
    if (cpus > 1) opts.device_count["CPU"] = cpus;
    tw::initialise_devices(opts);
    for (const auto& d : devices) (void)tw::device_info(d);  // NotFound names the devices that exist
    tw::set_kernel_choice(tw::parse_kernel_choice(kernel_choice, "--kernel_choice"));

    tw::tower::TrainerOptions topts;
    topts.reduction = tw::tower::parse_reduction(reduction_spec);
    topts.remainder = remainder == "spread" ? tw::tower::Remainder::Spread : tw::tower::Remainder::Error;
    topts.split = tw::tower::parse_split(split_spec);
    topts.precision = tw::parse_precision(precision);
    tw::tower::Trainer trainer(tw::models::factory(model_name, {.num_classes = classes, .seed = 0}), devices, topts);
    std::vector<tw::Device> towers;  // of every process
    for (int r = 0; r < world.size(); ++r) towers.insert(towers.end(), devices.begin(), devices.end());
    (void)tw::tower::split_batch(batch, towers, topts.split, topts.remainder);  // names the nearest batch that splits
    tw::optim::Sgd sgd(trainer.parameters(), {.lr = lr, .momentum = 0.9, .weight_decay = 5e-4});
    const std::int64_t macs = tw::models::forward_macs_per_image(model_name, classes);
    int used_threads = 0;
    for (const auto& d : devices)
      if (d.is_cpu()) used_threads = tw::device_info(d).intra_op_threads;

    std::mt19937 gen(0);
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<int> label(0, classes - 1);
    std::vector<float> xs(static_cast<std::size_t>(batch) * 32 * 32 * 3);
    for (auto& v : xs) v = normal(gen);
    std::vector<std::int32_t> ys(static_cast<std::size_t>(batch));
    for (auto& v : ys) v = label(gen);
    // This process's rows of the global batch at each step (all of it in one process; an auto
    // split across processes moves them between steps).
    std::vector<float> my_xs;
    std::vector<std::int32_t> my_ys;
    std::int64_t step_number = 0;
    auto host_for = [&](std::int64_t s) {
      my_xs.clear();
      my_ys.clear();
      for (auto [b, e] : trainer.shard(batch, s)) {
        my_xs.insert(my_xs.end(), xs.begin() + static_cast<std::ptrdiff_t>(b) * 32 * 32 * 3,
                     xs.begin() + static_cast<std::ptrdiff_t>(e) * 32 * 32 * 3);
        my_ys.insert(my_ys.end(), ys.begin() + b, ys.begin() + e);
      }
      return tw::tower::HostBatch{.images = my_xs, .labels = my_ys, .n = static_cast<int>(my_ys.size()),
                                  .h = 32, .w = 32, .c = 3, .global_n = batch, .step = s};
    };

    GpuStepTimer gpu_timer(devices);
    auto step = [&] {
      const float loss = trainer.forward_backward(host_for(++step_number));
      sgd.step();
      return loss;
    };

    std::vector<float> losses;
    for (int i = 0; i < warmup; ++i) losses.push_back(step());
    trainer.reset_timings();
    std::vector<std::size_t> regions_before;
    for (const auto& d : devices) regions_before.push_back(tw::device_allocator(d).stats().num_regions);
    std::vector<double> ms, gpu_ms;
    const double cpu0 = process_cpu_s();
    std::vector<tw::trace::BandwidthRow> bandwidth;  // with --trace
    double bandwidth_bound = 0;
    if (!trace_path.empty()) {
      tw::trace::set_thread_name("benchmark loop");
      tw::trace::start();
    }
    for (int i = 0; i < steps; ++i) {
      if (gpu_timer.active()) gpu_timer.start();
      const auto t0 = std::chrono::steady_clock::now();
      losses.push_back(step());
      if (gpu_timer.active()) gpu_ms.push_back(gpu_timer.stop());
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    // CPU seconds per step (all threads): on a shared, loaded machine this is steadier than wall
    // time; batch / (cpu_s / threads) is the throughput the threads would give if not descheduled.
    const double cpu_s_per_step = (process_cpu_s() - cpu0) / steps;
    if (!trace_path.empty()) {
      tw::trace::stop();
      tw::trace::write_chrome_trace(trace_path);
      const std::vector<tw::trace::Event> events = tw::trace::collect();
      std::fprintf(stderr, "trace of the %d timed steps written to %s; time per op and kind of work, over every thread:\n%s",
                   steps, trace_path.c_str(), tw::trace::summary_table(events).c_str());
      // The memory-bound kernels against STREAM's triad on the threads the towers use together,
      // shared among the CPU towers that run the same kernels at once.
      int cpu_towers = 0, all_threads = 0;
      for (const auto& d : devices)
        if (d.is_cpu()) ++cpu_towers, all_threads += tw::device_info(d).intra_op_threads;
      if (cpu_towers > 0) {
        const double triad = tw::bench::measure_triad_bytes_per_s(all_threads, 128, 1.0);
        bandwidth = tw::trace::bandwidth_rows(events, triad / cpu_towers);
        std::fprintf(stderr, "memory-bound kernels against STREAM triad %.1f GB/s on %d threads (%.1f GB/s for each of %d "
                     "towers), the furthest from it first:\n%s",
                     triad / 1e9, all_threads, triad / 1e9 / cpu_towers, cpu_towers,
                     tw::trace::bandwidth_table(bandwidth).c_str());
        bandwidth_bound = triad / cpu_towers;
      }
    }
    if (world.rank() != 0) return 0;  // rank 0 reports for the job (the losses are the job's)
    const auto& t = trainer.timings();
    double wall_s = 0;
    for (double m : ms) wall_s += m / 1e3;
    const double reduction_share = wall_s > 0 ? t.reduction_seconds / wall_s : 0;
    const double optimizer_ms = 1e3 * t.optimizer_seconds / steps;
    const double reduction_ms = 1e3 * t.reduction_seconds / steps;

    const double med = median(ms);
    const double timed_ms = gpu_ms.empty() ? med : median(gpu_ms);
    const double img_s = batch / (timed_ms / 1e3);
    const double gflops = img_s * static_cast<double>(macs) * 2 * 3 / 1e9;
    const std::size_t quarter = std::max<std::size_t>(1, losses.size() / 4);
    const double first_mean = std::accumulate(losses.begin(), losses.begin() + quarter, 0.0) / quarter;
    const double last_mean = std::accumulate(losses.end() - quarter, losses.end(), 0.0) / quarter;
    bool ok = last_mean < first_mean;
    for (float l : losses) ok = ok && std::isfinite(l);
    std::size_t new_regions = 0, pool_bytes = 0, peak_bytes = 0;
    for (std::size_t i = 0; i < devices.size(); ++i) {
      const auto s = tw::device_allocator(devices[i]).stats();
      new_regions += s.num_regions - regions_before[i];
      pool_bytes += s.pool_bytes;
      peak_bytes = std::max<std::size_t>(peak_bytes, s.peak_bytes_in_use);
    }

    std::printf("# %s\n", trainer.describe().c_str());
    {
      std::string rows;
      for (int r : trainer.last_step().global_split) rows += (rows.empty() ? "" : "/") + std::to_string(r);
      std::printf("# rows per tower at the last step: %s\n", rows.c_str());
    }
    std::printf("%-10s %6s %7s %7s %10s %10s %9s %9s %9s %12s %s\n", "model", "batch", "threads",
                "devices", "img/s", "ms/step", "min ms", "GFLOP/s", "reduce %", "loss", "check");
    if (world.size() > 1)
      std::printf("# %s; devices and threads are per process, %zu towers in all\n", world.name().c_str(), towers.size());
    std::printf("%-10s %6d %7d %7zu %10.1f %10.2f %9.2f %9.1f %9.2f %5.3f->%5.3f %s\n",
                model_name.c_str(), batch, used_threads, devices.size(), img_s, timed_ms,
                *std::min_element(gpu_ms.empty() ? ms.begin() : gpu_ms.begin(), gpu_ms.empty() ? ms.end() : gpu_ms.end()),
                gflops, 100 * reduction_share, losses.front(), losses.back(), ok ? "ok" : "FAIL");
    if (gpu_ms.empty())
      std::printf("# process CPU time: %.3f s per step (%.1f img per CPU-second)\n", cpu_s_per_step,
                  batch / cpu_s_per_step);
    else
      std::printf("# CUDA-event time per step (slowest GPU): median %.3f ms; host wall time: median %.3f ms\n",
                  timed_ms, med);
    std::printf("# per step: reduction %.2f ms not hidden by backward, optimizer %.2f ms\n",
                reduction_ms, optimizer_ms);
    std::printf("# pools: %.1f MiB over %zu device(s), %zu regions added in the timed steps, peak %.1f MiB on one device\n",
                pool_bytes / 1048576.0, devices.size(), new_regions, peak_bytes / 1048576.0);
    const std::vector<tw::KernelChoiceRecord> choices = tw::kernel_choices();
    if (tw::kernel_choice() == tw::KernelChoice::kAuto) {
      const std::string cache = tw::kernel_choice_cache();
      std::printf("# kernel choice: auto, %zu problems chosen before the timed steps (cache: %s)\n",
                  choices.size(), cache.empty() ? "none" : cache.c_str());
      for (const auto& r : choices) std::printf("#   %s\n", tw::format_kernel_choice(r).c_str());
    } else {
      std::printf("# kernel choice: fixed\n");
    }
    if (json) {
      std::vector<std::string> names;
      for (const auto& d : devices) names.push_back(d.str());
      nlohmann::json j = {{"model", model_name},
                          {"batch", batch},
                          {"threads", used_threads},
                          {"devices", static_cast<int>(devices.size())},
                          {"device_names", names},
                          {"processes", world.size()},
                          {"precision", precision},
                          {"reduction", tw::tower::to_string(trainer.reduction())},
                          {"split", tw::tower::to_string(topts.split)},
                          {"last_split", trainer.last_step().global_split},
                          {"img_per_s", img_s},
                          {"ms_per_step", timed_ms},
                          {"ms_per_step_wall", med},
                          {"timing", gpu_ms.empty() ? "wall" : "cuda_events"},
                          {"gflop_per_s", gflops},
                          {"fwd_macs_per_img", macs},
                          {"reduction_ms_per_step", reduction_ms},
                          {"reduction_share", reduction_share},
                          {"optimizer_ms_per_step", optimizer_ms},
                          {"cpu_s_per_step", cpu_s_per_step},
                          {"steps", steps},
                          {"warmup", warmup},
                          {"loss_first", losses.front()},
                          {"loss_last", losses.back()},
                          {"pool_regions_new_in_timed_steps", new_regions},
                          {"kernel_choice", kernel_choice},
                          {"check", ok ? "ok" : "FAIL"}};
      nlohmann::json kc = nlohmann::json::array();
      for (const auto& r : choices) {
        nlohmann::json ms = nlohmann::json::object();
        for (const auto& [name, t] : r.ms) ms[name] = t;
        kc.push_back({{"layer", r.layer}, {"pass", r.pass}, {"problem", r.problem},
                      {"operands", r.operands}, {"threads", r.threads}, {"chosen", r.chosen},
                      {"cached", r.from_cache}, {"ms", ms}});
      }
      j["kernel_choices"] = kc;
      if (!bandwidth.empty()) {
        nlohmann::json bw = nlohmann::json::array();
        for (const auto& r : bandwidth)
          bw.push_back({{"kernel", r.name}, {"calls", r.calls}, {"bytes", r.bytes}, {"ms", r.ms},
                        {"bound_ms", r.bound_ms}, {"gb_per_s", r.gb_per_s}, {"over_bound", r.over_bound}, {"in_cache", r.in_cache}});
        j["bandwidth_bound_gb_per_s"] = bandwidth_bound / 1e9;
        j["memory_bound_kernels"] = bw;
      }
      std::printf("%s\n", j.dump().c_str());
    }
    return ok ? 0 : 1;
  } catch (const tw::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}

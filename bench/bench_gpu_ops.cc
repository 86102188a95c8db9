// GPU op benchmark: ResNet-20's convolutions and batch norms and tfcnn's pooling and largest GEMM
// at batch 128 on one GPU, plus the loss and an SGD update over ResNet-20's parameter count. The
// convolutions and the GEMM also run in bf16 and fp16 on tensor cores (rows *_bf16, *_fp16, where
// the GPU has them; their check column is against the fp32 CPU result, so it shows the 16-bit
// rounding).
//
//   towerflow_bench_gpu_ops [--device N] [--batch B] [--reps R] [--json] [--filter TEXT]
//
// Each op runs once to warm up (cuDNN plans, pool growth), then R times, each timed with CUDA
// events around the call on the context's stream after a synchronisation; the table shows the
// median and min ms, GFLOP/s (2 FLOPs per multiply-add) for convolutions and GEMM, GB/s of
// compulsory traffic for memory-bound ops, and a check column: the max relative error of the
// GPU result against the CPU twin (core/cpu kernels on all host threads) on the same inputs.
// With --json, one JSON line per row follows the table.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "core/cpu/batch_norm.h"
#include "core/cpu/context.h"
#include "core/cpu/conv.h"
#include "core/cpu/gemm.h"
#include "core/cpu/pool.h"
#include "core/cuda/context.h"
#include "core/cuda/copy.h"
#include "core/cuda/ops.h"
#include "core/cuda/optimizer_kernels.h"
#include "core/cuda/status.h"
#include "core/memory/memory.h"

namespace tw = towerflow;
namespace gpu = towerflow::gpu;
namespace cpu = towerflow::cpu;
using towerflow::Conv2dShape;
using towerflow::Pool2dShape;

namespace {

using towerflow::bench::random_vector;

struct Row {
  std::string op, shape;
  double median_ms = 0, min_ms = 0, gflops = 0, gbps = 0, max_rel_err = 0;
};

class Bench {
 public:
  Bench(int ordinal, int reps)
      : allocator_(tw::make_bfc_allocator(
            tw::make_cuda_sub_allocator(ordinal),
            tw::BfcOptions{.device_name = "/gpu:" + std::to_string(ordinal),
                           .limit_bytes = std::size_t{8} << 30})),
        ctx_(gpu::GpuContextOptions{.device = tw::Device::gpu(ordinal), .ordinal = ordinal,
                                    .allocator = allocator_.get()}),
        cpu_(static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))),
        reps_(reps) {}

  const gpu::GpuContext& ctx() const { return ctx_; }
  const cpu::CpuContext& cpu() const { return cpu_; }

  gpu::DeviceBuffer upload(const std::vector<float>& v) {
    gpu::DeviceBuffer b(ctx_, v.size() * sizeof(float));
    gpu::copy_to_device(ctx_, b.data(), v.data(), v.size() * sizeof(float));
    return b;
  }
  gpu::DeviceBuffer zeros(std::size_t n) {
    gpu::DeviceBuffer b(ctx_, std::max<std::size_t>(n, 1) * sizeof(float));
    gpu::memset_device(ctx_, b.data(), 0, n * sizeof(float));
    return b;
  }
  std::vector<float> download(const gpu::DeviceBuffer& b, std::size_t n) {
    std::vector<float> v(n);
    gpu::copy_to_host(ctx_, v.data(), b.data(), n * sizeof(float));
    return v;
  }

  // Median and min over reps_ event-timed calls after one warm-up call.
  std::pair<double, double> time(const std::function<void()>& fn) {
    fn();
    ctx_.synchronize();
    std::vector<double> ms;
    gpu::GpuEvent start(ctx_, true), stop(ctx_, true);
    for (int i = 0; i < reps_; ++i) {
      start.record();
      fn();
      stop.record();
      stop.synchronize();
      ms.push_back(stop.elapsed_ms_since(start));
    }
    std::sort(ms.begin(), ms.end());
    return {ms[ms.size() / 2], ms.front()};
  }

 private:
  std::unique_ptr<tw::Allocator> allocator_;
  gpu::GpuContext ctx_;
  cpu::CpuContext cpu_;
  int reps_;
};

double max_rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  double scale = 1e-30, err = 0;
  for (float r : ref) scale = std::max(scale, double(std::fabs(r)));
  for (std::size_t i = 0; i < ref.size(); ++i)
    err = std::max(err, std::fabs(double(got[i]) - ref[i]));
  return err / scale;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"towerflow GPU op benchmark"};
  int ordinal = 0, batch = 128, reps = 20;
  bool json = false;
  std::string filter;
  app.add_option("--device", ordinal, "CUDA ordinal");
  app.add_option("--batch", batch, "images per batch");
  app.add_option("--reps", reps, "timed repetitions per op");
  app.add_flag("--json", json, "one JSON line per row after the table");
  app.add_option("--filter", filter, "only ops whose name contains this");
  CLI11_PARSE(app, argc, argv);

  const gpu::CudaAvailability a = gpu::cuda_availability();
  if (!a.usable()) {
    std::printf("SKIPPED: no CUDA device (%s)\n", a.reason.c_str());
    return 77;
  }
  std::printf("# %s; batch %d, %d reps, CUDA-event timing\n", gpu::describe(a).c_str(), batch,
              reps);
  Bench b(ordinal, reps);
  std::vector<Row> rows;
  auto wanted = [&](const std::string& op) {
    return filter.empty() || op.find(filter) != std::string::npos;
  };

  // ---- ResNet-20 convolutions (forward, backward input, backward weight) --------------------
  const std::vector<Conv2dShape> convs = {
      {.n = batch, .h = 32, .w = 32, .c_in = 3, .c_out = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
      {.n = batch, .h = 32, .w = 32, .c_in = 16, .c_out = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
      {.n = batch, .h = 32, .w = 32, .c_in = 16, .c_out = 32, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
      {.n = batch, .h = 16, .w = 16, .c_in = 32, .c_out = 32, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
      {.n = batch, .h = 16, .w = 16, .c_in = 32, .c_out = 64, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
      {.n = batch, .h = 8, .w = 8, .c_in = 64, .c_out = 64, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
      {.n = batch, .h = 32, .w = 32, .c_in = 16, .c_out = 32, .kh = 1, .kw = 1, .stride_h = 2, .stride_w = 2},
  };
  for (const auto& s : convs) {
    const std::size_t nx = std::size_t(s.n) * s.h * s.w * s.c_in,
                      ny = std::size_t(s.n) * s.out_h() * s.out_w() * s.c_out,
                      nw = std::size_t(s.c_out) * s.c_in * s.kh * s.kw;
    const auto x = random_vector(nx, 1), w = random_vector(nw, 2), dy = random_vector(ny, 3);
    auto gx = b.upload(x), gw = b.upload(w), gdy = b.upload(dy);
    auto gy = b.zeros(ny), gdx = b.zeros(nx), gdw = b.zeros(nw);
    const double gflop = 2.0 * double(s.macs()) * 1e-9;
    struct Kind {
      const char* name;
      std::function<void()> gpu_call;
      std::function<std::vector<float>()> check;
    };
    // fp32, then bf16 and fp16 on tensor cores (conv2d_*_half), checked against the CPU's fp32.
    for (const char* type : {"", "_bf16", "_fp16"}) {
      const bool half = type[0] != '\0';
      const gpu::Half t = std::string(type) == "_fp16" ? gpu::Half::Fp16 : gpu::Half::Bf16;
      if (half && !gpu::half_products_supported(b.ctx(), t)) continue;
      const Kind kinds[] = {
          {"conv2d_forward",
           [&] {
             if (half)
               gpu::conv2d_forward_half(b.ctx(), t, s, gx.as<float>(), gw.as<float>(),
                                        gy.as<float>());
             else
               gpu::conv2d_forward(b.ctx(), s, gx.as<float>(), gw.as<float>(), gy.as<float>());
           },
           [&] {
             std::vector<float> ref(ny);
             cpu::conv2d_forward(b.cpu(), s, x.data(), w.data(), ref.data());
             return std::vector<float>{float(max_rel_err(b.download(gy, ny), ref))};
           }},
          {"conv2d_backward_input",
           [&] {
             if (half)
               gpu::conv2d_backward_input_half(b.ctx(), t, s, gdy.as<float>(), gw.as<float>(),
                                               gdx.as<float>());
             else
               gpu::conv2d_backward_input(b.ctx(), s, gdy.as<float>(), gw.as<float>(),
                                          gdx.as<float>());
           },
           [&] {
             std::vector<float> ref(nx);
             cpu::conv2d_backward_input(b.cpu(), s, dy.data(), w.data(), ref.data());
             return std::vector<float>{float(max_rel_err(b.download(gdx, nx), ref))};
           }},
          {"conv2d_backward_weight",
           [&] {
             if (half)
               gpu::conv2d_backward_weight_half(b.ctx(), t, s, gx.as<float>(), gdy.as<float>(),
                                                gdw.as<float>());
             else
               gpu::conv2d_backward_weight(b.ctx(), s, gx.as<float>(), gdy.as<float>(),
                                           gdw.as<float>());
           },
           [&] {
             std::vector<float> ref(nw);
             cpu::conv2d_backward_weight(b.cpu(), s, x.data(), dy.data(), ref.data());
             return std::vector<float>{float(max_rel_err(b.download(gdw, nw), ref))};
           }},
      };
      for (const auto& k : kinds) {
        const std::string op = std::string(k.name) + type;
        if (!wanted(op)) continue;
        Row r{.op = op, .shape = s.to_string()};
        std::tie(r.median_ms, r.min_ms) = b.time(k.gpu_call);
        r.gflops = gflop / (r.median_ms * 1e-3);
        r.max_rel_err = k.check()[0];
        rows.push_back(r);
      }
    }
  }

  // ---- batch norm at ResNet-20's three widths ------------------------------------------------
  for (auto [hw, c] : {std::pair{32, 16}, std::pair{16, 32}, std::pair{8, 64}}) {
    if (!wanted("batch_norm")) break;
    const std::int64_t r_ = std::int64_t(batch) * hw * hw;
    const std::size_t n = std::size_t(r_) * c;
    const auto x = random_vector(n, 4), dy = random_vector(n, 5);
    const std::vector<float> gamma(c, 1.0f), beta(c, 0.0f);
    auto gx = b.upload(x), gdy = b.upload(dy), gg = b.upload(gamma), gb = b.upload(beta);
    auto gy = b.zeros(n), gdx = b.zeros(n), gm = b.zeros(c), gi = b.zeros(c), gdg = b.zeros(c),
         gdb = b.zeros(c);
    const std::string shape = "rows=" + std::to_string(r_) + " c=" + std::to_string(c);
    Row f{.op = "batch_norm_forward_training", .shape = shape};
    std::tie(f.median_ms, f.min_ms) = b.time([&] {
      gpu::batch_norm_forward_training(b.ctx(), r_, c, gx.as<float>(), gg.as<float>(),
                                       gb.as<float>(), 1e-5f, gy.as<float>(), gm.as<float>(),
                                       gi.as<float>());
    });
    f.gbps = 2.0 * n * 4 / (f.median_ms * 1e-3) * 1e-9;
    std::vector<float> ref(n), mean(c), inv(c);
    cpu::batch_norm_forward_training(b.cpu(), r_, c, x.data(), gamma.data(), beta.data(), 1e-5f,
                                     ref.data(), mean.data(), inv.data());
    f.max_rel_err = max_rel_err(b.download(gy, n), ref);
    rows.push_back(f);
    Row bw{.op = "batch_norm_backward", .shape = shape};
    std::tie(bw.median_ms, bw.min_ms) = b.time([&] {
      gpu::batch_norm_backward(b.ctx(), r_, c, gx.as<float>(), gdy.as<float>(), gg.as<float>(),
                               gm.as<float>(), gi.as<float>(), 1e-5f, gdx.as<float>(), gdg.as<float>(),
                               gdb.as<float>());
    });
    bw.gbps = 3.0 * n * 4 / (bw.median_ms * 1e-3) * 1e-9;
    std::vector<float> dx(n), dg(c), db(c);
    cpu::batch_norm_backward(b.cpu(), r_, c, x.data(), dy.data(), gamma.data(), mean.data(),
                             inv.data(), dx.data(), dg.data(), db.data());
    bw.max_rel_err = max_rel_err(b.download(gdx, n), dx);
    rows.push_back(bw);
  }

  // ---- tfcnn: max pool 3/2 pad 1 on 32x32x64, fc1 GEMM ----------------------------------------
  if (wanted("max_pool")) {
    const Pool2dShape s{.n = batch, .h = 32, .w = 32, .c = 64, .kh = 3, .kw = 3,
                             .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1};
    const std::size_t nx = std::size_t(s.n) * s.h * s.w * s.c,
                      ny = std::size_t(s.n) * s.out_h() * s.out_w() * s.c;
    const auto x = random_vector(nx, 6);
    auto gx = b.upload(x), gy = b.zeros(ny);
    gpu::DeviceBuffer garg(b.ctx(), ny * sizeof(std::int32_t));
    Row r{.op = "max_pool_forward", .shape = s.to_string()};
    std::tie(r.median_ms, r.min_ms) = b.time([&] {
      gpu::max_pool_forward(b.ctx(), s, gx.as<float>(), gy.as<float>(),
                            garg.as<std::int32_t>());
    });
    r.gbps = double(nx + 2 * ny) * 4 / (r.median_ms * 1e-3) * 1e-9;
    std::vector<float> ref(ny);
    std::vector<std::int32_t> arg(ny);
    cpu::max_pool_forward(b.cpu(), s, x.data(), ref.data(), arg.data());
    r.max_rel_err = max_rel_err(b.download(gy, ny), ref);
    rows.push_back(r);
  }
  if (wanted("gemm")) {
    const int m = batch, n = 384, k = 8 * 8 * 64;
    const auto a = random_vector(std::size_t(m) * k, 7), w = random_vector(std::size_t(n) * k, 8);
    auto ga = b.upload(a), gw = b.upload(w), gc = b.zeros(std::size_t(m) * n);
    Row r{.op = "gemm (x * W^T)", .shape = "m=" + std::to_string(m) + " n=384 k=4096"};
    std::tie(r.median_ms, r.min_ms) = b.time([&] {
      gpu::gemm(b.ctx(), false, true, m, n, k, 1.0f, ga.as<float>(), k, gw.as<float>(), k, 0.0f,
                gc.as<float>(), n);
    });
    r.gflops = 2.0 * m * n * k * 1e-9 / (r.median_ms * 1e-3);
    std::vector<float> ref(std::size_t(m) * n);
    cpu::gemm(b.cpu(), false, true, m, n, k, 1.0f, a.data(), k, w.data(), k, 0.0f, ref.data(), n);
    r.max_rel_err = max_rel_err(b.download(gc, ref.size()), ref);
    rows.push_back(r);
    for (const gpu::Half t : {gpu::Half::Bf16, gpu::Half::Fp16}) {
      if (!gpu::half_products_supported(b.ctx(), t)) continue;
      Row h{.op = std::string("gemm_") + gpu::to_string(t) + " (x * W^T)", .shape = r.shape};
      std::tie(h.median_ms, h.min_ms) = b.time([&] {
        gpu::gemm_half(b.ctx(), t, false, true, m, n, k, ga.as<float>(), k, gw.as<float>(), k,
                       gc.as<float>(), n);
      });
      h.gflops = 2.0 * m * n * k * 1e-9 / (h.median_ms * 1e-3);
      h.max_rel_err = max_rel_err(b.download(gc, ref.size()), ref);
      rows.push_back(h);
    }
  }
  if (wanted("sgd_update")) {
    const std::size_t n = 272474;  // ResNet-20's parameter count (10 classes)
    auto gp = b.upload(random_vector(n, 9)), gg = b.upload(random_vector(n, 10)), gbuf = b.zeros(n);
    Row r{.op = "sgd_update (momentum, wd)", .shape = "n=" + std::to_string(n)};
    std::tie(r.median_ms, r.min_ms) = b.time([&] {
      gpu::sgd_update(b.ctx(), n, gp.as<float>(), gg.as<float>(), gbuf.as<float>(),
                      {.lr = 0.1f, .momentum = 0.9f, .weight_decay = 5e-4f});
    });
    r.gbps = 5.0 * n * 4 / (r.median_ms * 1e-3) * 1e-9;
    r.max_rel_err = NAN;  // checked against PyTorch's formulas by the parity suite
    rows.push_back(r);
  }

  std::printf("%-28s %-62s %10s %10s %9s %8s %11s\n", "op", "shape", "median ms", "min ms",
              "GFLOP/s", "GB/s", "max rel err");
  for (const Row& r : rows)
    std::printf("%-28s %-62s %10.4f %10.4f %9.1f %8.1f %11.2e\n", r.op.c_str(), r.shape.c_str(),
                r.median_ms, r.min_ms, r.gflops, r.gbps, r.max_rel_err);
  if (json)
    for (const Row& r : rows)
      std::printf("%s\n", nlohmann::json{{"bench", "gpu_ops"},
                                         {"op", r.op},
                                         {"shape", r.shape},
                                         {"median_ms", r.median_ms},
                                         {"min_ms", r.min_ms},
                                         {"gflops", r.gflops},
                                         {"gbps", r.gbps},
                                         {"max_rel_err", std::isnan(r.max_rel_err)
                                                             ? nlohmann::json(nullptr)
                                                             : nlohmann::json(r.max_rel_err)}}
                              .dump()
                              .c_str());
  return 0;
}

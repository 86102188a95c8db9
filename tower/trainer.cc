#include "tower/trainer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include "core/collectives/communicator.h"
#include "core/collectives/process_group.h"
#include "core/error.h"
#include "core/log.h"
#include "core/nn/layers.h"
#include "core/platform/registry.h"
#include "core/tensor/autograd.h"
#include "core/tensor/backend_impl.h"
#include "core/tensor/ops.h"
#include "core/trace.h"
#include "data/batch.h"
#include "tower/batch_norm_sync.h"
#include "tower/buckets.h"
#include "tower/workers.h"

namespace towerflow::tower {

// Note [Why towers scale loss by B]
// Tower i computes loss_i = sum(cross-entropy over its b_i rows) / B, with B the rows of the whole
// global batch (all towers, all micro-batches), not b_i. Its gradient is then sum over its rows of
// d(ce)/dw, divided by B, and the sum over towers that the all-reduce (or the parameter device)
// forms is exactly the gradient of the global-batch mean loss, however the batch was split: even,
// 3:1, or in micro-batches. Dividing by b_i and averaging over towers would only agree for equal
// slices; with a 3:1 split it would weight the small tower's rows three times too much. The
// same holds for the reported loss: the sum of the towers' loss_i is the sample-weighted mean.

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string device_list(const std::vector<Device>& devices) {
  std::string s;
  for (const Device& d : devices) s += (s.empty() ? "" : ", ") + d.str();
  return s;
}

std::span<float> host_span(const Tensor& t) {
  return {t.data<float>(), static_cast<std::size_t>(t.numel())};
}

}  // namespace

HostBatch HostBatch::of(const data::Batch& b) {
  return {.images = b.valid_images(),
          .labels = std::span<const std::int32_t>(b.labels.data(), static_cast<std::size_t>(b.n)),
          .n = b.n, .h = b.h, .w = b.w, .c = b.c, .global_n = b.global_n};
}

struct Trainer::Impl {
  // The job's processes; global tower g = rank * towers + i runs on global_devices[g].
  collectives::ProcessGroup* processes = nullptr;
  std::unique_ptr<collectives::ProcessGroup> bn_processes;  // the batch-norm exchange's own
  std::vector<Device> global_devices;
  int rank = 0, world = 1;

  std::vector<std::shared_ptr<nn::Module>> replicas;
  std::unique_ptr<DeviceWorkers> workers;
  std::unique_ptr<collectives::Communicator> comm;  // AllReduce only
  std::string comm_name;
  std::vector<optim::ParameterSlot> slots;
  std::size_t numel = 0;

  // ParameterDevice
  bool use_pd = false;
  Device pd;
  Tensor master_params, master_grads;
  std::vector<Tensor> staging;  // each tower's gradients, on the parameter device

  // Synchronised batch norm: the towers' exchange, whose member i every BatchNorm2d of replica
  // i holds. Null in per-tower mode.
  std::unique_ptr<BatchNormSyncGroup> bn_sync;
  int bn_layers = 0;  // BatchNorm2d layers per replica
  // The running averages are computed from global statistics, identically on every replica
  // (bn_sync and bn_layers > 0): nothing to average after a step.
  bool buffers_synced = false;

  // Buffers (batch-norm running averages): identical on every replica between steps.
  std::vector<float> buffer_snapshot;                 // those identical values
  std::vector<std::vector<float>> buffer_host;        // per tower, after its forward
  std::size_t buffer_numel = 0;

  // Bucketed reduction
  std::size_t bucket_bytes = 0;
  BucketPlan bucket_plan;
  std::vector<std::unique_ptr<BucketTracker>> trackers;

  // fp16 only: the dynamic loss scale.
  std::optional<LossScaler> scaler;

  // Per-step scratch, one entry per tower.
  std::vector<double> loss, compute_s, reduce_s, sync_s;
  std::vector<std::int64_t> correct;

  static std::vector<Tensor> buffers_of(const nn::Module& m) {
    std::vector<Tensor> out;
    for (auto& [name, t] : m.named_buffers())
      if (t.dtype() == DType::kFloat32) out.push_back(t);
    return out;
  }

  void read_buffers(const nn::Module& m, std::vector<float>& out) const {
    out.resize(buffer_numel);
    std::size_t off = 0;
    for (const Tensor& t : buffers_of(m)) {
      t.to_host(std::span<float>(out.data() + off, static_cast<std::size_t>(t.numel())));
      off += static_cast<std::size_t>(t.numel());
    }
  }

  void write_buffers(nn::Module& m, const std::vector<float>& in) const {
    std::size_t off = 0;
    for (Tensor& t : buffers_of(m)) {
      t.copy_from_host(std::span<const float>(in.data() + off, static_cast<std::size_t>(t.numel())));
      off += static_cast<std::size_t>(t.numel());
    }
  }
};

Trainer::Trainer(nn::ModelFactory factory, std::vector<Device> devices, TrainerOptions options)
    : devices_(std::move(devices)), options_(std::move(options)), reduction_(options_.reduction) {
  init(nullptr, std::move(factory));
}

Trainer::Trainer(const nn::Module& initial, nn::ModelFactory factory, std::vector<Device> devices,
                 TrainerOptions options)
    : devices_(std::move(devices)), options_(std::move(options)), reduction_(options_.reduction) {
  init(&initial, std::move(factory));
}

Trainer::~Trainer() = default;

void Trainer::init(const nn::Module* initial, nn::ModelFactory factory) {
  if (devices_.empty())
    raise<InvalidArgument>("the tower trainer needs at least one device; the device list is empty");
  {
    std::set<Device> seen;
    for (const Device& d : devices_)
      if (!seen.insert(d).second)
        raise<InvalidArgument>("device ", d, " appears twice in the tower devices (", device_list(devices_),
                               "); list each logical device once (use virtual devices for several "
                               "towers on one physical device)");
  }
  if (!factory) raise<InvalidArgument>("the tower trainer needs a model factory; got an empty one");
  if (options_.accumulation_steps < 1)
    raise<InvalidArgument>("accumulation_steps ", options_.accumulation_steps,
                           " is invalid; use 1 (no accumulation) or more micro-batches per step");
  if (options_.batch_norm == BatchNormMode::Synchronised) {
    // Not left to soft placement: every such tower would run its layers on /cpu:0 at once, and a
    // CPU device's context serves one thread at a time.
    for (const Device& d : devices_) {
      Backend& be = backend_for(d);
      if (!be.supports(OpKind::kBatchNormSync))
        raise<InvalidArgument>("synchronised batch norm (batch_norm = sync, op ",
                               to_string(OpKind::kBatchNormSync), ") has no kernel on ", d, " (",
                               be.name(), "); use per-tower batch norm (--batch_norm per_tower) "
                               "for towers on this device");
    }
  }
  impl_ = std::make_unique<Impl>();
  if (options_.precision == Precision::Fp16) impl_->scaler.emplace(options_.loss_scale);
  Impl& im = *impl_;
  const int n = towers();
  im.processes = options_.processes ? options_.processes : &collectives::world();
  im.rank = im.processes->rank();
  im.world = im.processes->size();
  for (int r = 0; r < im.world; ++r) im.global_devices.insert(im.global_devices.end(), devices_.begin(), devices_.end());
  if (const auto* w = std::get_if<WeightedSplit>(&options_.split); w && w->weights.size() != im.global_devices.size())
    raise<InvalidArgument>("split ", to_string(options_.split), " gives ", w->weights.size(), " weights for ",
                           im.world > 1 ? str(im.global_devices.size(), " towers (", im.world, " processes x ", n, " devices: ")
                                        : str(n, " devices ("),
                           device_list(devices_), "); give one weight per ", im.world > 1 ? "tower" : "device");

  // Reduction in effect: NCCL cannot join logical devices sharing a physical GPU, and no
  // communicator joins CPUs with GPUs; both fall back to the parameter device.
  if (auto* ar = std::get_if<AllReduce>(&reduction_)) {
    const bool all_cpu = std::all_of(devices_.begin(), devices_.end(), [](const Device& d) { return d.is_cpu(); });
    const bool all_gpu = std::all_of(devices_.begin(), devices_.end(), [](const Device& d) { return d.is_gpu(); });
    std::vector<int> ordinals;
    if (all_gpu)
      for (const Device& d : devices_) ordinals.push_back(device_info(d).physical_index);
    if (!all_cpu && !(all_gpu && collectives::nccl_can_join(ordinals))) {
      const char* why = !all_gpu ? "the towers mix CPU and GPU devices"
                        : std::set<int>(ordinals.begin(), ordinals.end()).size() != ordinals.size()
                            ? "NCCL cannot all-reduce between virtual devices of one physical GPU"
                            : "this build has no NCCL";
      log_warning(str("all_reduce over ", device_list(devices_), ": ", why,
                      "; reducing on the parameter device ", devices_.front(), " instead"));
      reduction_ = ParameterDevice{devices_.front()};
    } else {
      im.bucket_bytes = ar->bucket_bytes;
      // GPUs: one NCCL communicator over every process's GPUs. CPUs: inside the process, then
      // across processes (Note [Hierarchical all-reduce] in core/collectives/process_group.cc).
      im.comm = collectives::make_communicator(devices_, collectives::CommunicatorKind::Auto, ordinals,
                                               im.world > 1 ? im.processes : nullptr);
      if (im.world > 1 && all_cpu)
        im.comm = collectives::make_hierarchical_communicator(std::move(im.comm), *im.processes);
      im.comm_name = im.comm->name();
    }
  }
  if (const auto* pd = std::get_if<ParameterDevice>(&reduction_)) {
    im.use_pd = true;
    im.pd = pd->device.value_or(Device::cpu(0));
  }

  // Replicas: built on their own threads (each device's allocator and kernels), then made
  // identical by copying replica 0's (or `initial`'s) parameters and buffers into the others.
  im.workers = std::make_unique<DeviceWorkers>(devices_);
  im.replicas.resize(n);
  im.workers->run([&](int i) {
    auto m = factory(devices_[i]);
    if (!m) raise<InvalidArgument>("the model factory returned no model for ", devices_[i]);
    if (m->device() != devices_[i])
      raise<InvalidArgument>("the model factory built a model on ", m->device(), " when asked for ",
                             devices_[i], "; build every parameter on the device passed in");
    if (!m->is_flat()) m->flatten();
    m->train(true);
    im.replicas[i] = std::move(m);
  });
  im.workers->run([&](int i) {
    if (initial) im.replicas[i]->copy_state_from(*initial);
    else if (i > 0) im.replicas[i]->copy_state_from(*im.replicas[0]);
  });
  if (im.world > 1) {
    // One set-up on every rank (before any other collective: a rank set up otherwise could be
    // waiting in a different one).
    std::string shapes;
    std::size_t numel = 0, tensors = 0, buffer_numel = 0;
    for (auto& [name, t] : im.replicas[0]->named_parameters()) {
      shapes += str(name, ":", t.numel(), ";");
      numel += static_cast<std::size_t>(t.numel());
      ++tensors;
    }
    for (const Tensor& t : Impl::buffers_of(*im.replicas[0])) buffer_numel += static_cast<std::size_t>(t.numel());
    collectives::check_same_on_every_rank(
        *im.processes, "the trainer's set-up",
        str("'", n, " devices, ", numel, " parameters in ", tensors, " tensors (layout hash ",
            std::hash<std::string>{}(shapes), "), ", buffer_numel, " buffer values, reduction ",
            to_string(reduction_), ", split ", to_string(options_.split), ", ", options_.accumulation_steps,
            " micro-batches, batch norm ", options_.batch_norm == BatchNormMode::Synchronised ? "sync" : "per_tower",
            ", label smoothing ", options_.label_smoothing, ", precision ", to_string(options_.precision),
            options_.precision != Precision::Fp16
                ? std::string()
                : str(" (loss scale from ", options_.loss_scale.initial_scale, ", x",
                      options_.loss_scale.growth_factor, " every ", options_.loss_scale.growth_interval,
                      " good steps, x", options_.loss_scale.backoff_factor, " on overflow)"),
            "'"),
        "start every rank with the same model, options and number of devices");
  }
  if (options_.batch_norm == BatchNormMode::Synchronised) {
    if (im.world > 1) im.bn_processes = im.processes->duplicate();
    im.bn_sync = std::make_unique<BatchNormSyncGroup>(devices_, im.bn_processes.get());
    for (int i = 0; i < n; ++i) {
      int layers = 0;
      im.replicas[i]->apply([&](nn::Module& m) {
        if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(&m)) {
          bn->set_sync(&im.bn_sync->member(i));
          ++layers;
        }
      });
      im.bn_layers = layers;
    }
    im.buffers_synced = im.bn_layers > 0;
    if (im.bn_layers == 0)
      log_warning("batch_norm = sync: the model has no nn::BatchNorm2d layer, so there is nothing "
                  "to synchronise; towers train as with per-tower batch norm");
  }

  const nn::Module& r0 = *im.replicas[0];
  std::size_t off = 0;
  for (auto& [name, t] : r0.named_parameters()) {
    im.slots.push_back({.name = name, .offset = off, .size = static_cast<std::size_t>(t.numel()),
                        .shape = t.shape()});
    off += static_cast<std::size_t>(t.numel());
  }
  im.numel = off;
  TW_CHECK(im.numel == static_cast<std::size_t>(r0.flat_parameters().numel()), "flat buffer of ",
           r0.flat_parameters().numel(), " for parameters of ", im.numel);
  for (const Tensor& t : Impl::buffers_of(r0)) im.buffer_numel += static_cast<std::size_t>(t.numel());
  if (im.world > 1) broadcast_from_rank0();  // rank 0's initial state everywhere
  im.read_buffers(r0, im.buffer_snapshot);
  im.buffer_host.resize(n);

  if (im.use_pd) {
    im.master_params = r0.flat_parameters().to(im.pd);
    im.master_grads = Tensor::zeros({static_cast<std::int64_t>(im.numel)}, im.pd);
    for (int i = 0; i < n; ++i) im.staging.push_back(Tensor::zeros({static_cast<std::int64_t>(im.numel)}, im.pd));
  }
  if (im.bucket_bytes > 0) {
    im.bucket_plan.plan(r0, im.bucket_bytes);
    for (int i = 0; i < n; ++i)
      im.trackers.push_back(std::make_unique<BucketTracker>(backend_for(devices_[i])));
  }
  // Debug, not Info: applications print describe() in their own start-up output.
  log(LogLevel::Debug, describe());
}

std::string Trainer::describe() const {
  std::string s = str(towers(), towers() == 1 ? " tower on " : " towers on ", device_list(devices_));
  if (impl_->world > 1)
    s += str(" in each of ", impl_->world, " processes (", global_towers(), " towers; this is rank ", impl_->rank, ")");
  s += str("; split ", to_string(options_.split), "; ");
  if (impl_->use_pd) {
    s += str("gradients summed on the parameter device ", impl_->pd);
    if (impl_->world > 1) s += str(", then across processes over ", impl_->processes->name());
  } else {
    if (impl_->bucket_bytes > 0)
      s += str("bucketed all_reduce (", impl_->bucket_plan.buckets.size(), " buckets of at most ",
               impl_->bucket_bytes >= (1 << 20) ? str(impl_->bucket_bytes >> 20, " MiB")
                                                : str(impl_->bucket_bytes, " bytes"),
               " or one parameter) over ", impl_->comm_name);
    else
      s += str("all_reduce over ", impl_->comm_name);
  }
  if (options_.accumulation_steps > 1) s += str("; ", options_.accumulation_steps, " micro-batches per step");
  if (options_.precision != Precision::Fp32) {
    // What each kind of device runs them on (a mixed /gpu:0,/cpu:0 run names both).
    std::string how;
    std::vector<std::string> seen;
    for (const Device& d : devices_) {
      const std::string what = backend_for(d).describe_products(options_.precision);
      if (std::find(seen.begin(), seen.end(), what) != seen.end()) continue;
      seen.push_back(what);
      how += str(how.empty() ? "" : "; ", what);
    }
    s += "; " + to_string(options_.precision) + " convolutions and matrix products (fp32 accumulation; " +
         how + ")";
  }
  if (options_.precision == Precision::Fp16) s += "; " + impl_->scaler->describe();
  if (impl_->buffers_synced)
    s += str("; synchronised batch norm (", impl_->bn_layers, " layers, statistics over all towers)");
  else if (impl_->bn_sync)
    s += "; synchronised batch norm asked for, but the model has no nn::BatchNorm2d layer";
  return s;
}

nn::Module& Trainer::replica(int i) {
  if (i < 0 || i >= towers())
    raise<InvalidArgument>("replica ", i, " does not exist; the trainer has ", towers(), " (0..",
                           towers() - 1, ")");
  return *impl_->replicas[i];
}

nn::Module& Trainer::model() {
  sync();
  return *impl_->replicas[0];
}

void Trainer::sync() {
  Impl& im = *impl_;
  if (!im.use_pd) return;
  const auto t0 = Clock::now();
  im.workers->run([&](int i) { im.replicas[i]->flat_parameters().copy_(im.master_params); });
  timings_.sync_seconds += since(t0);
}

int Trainer::global_towers() const { return static_cast<int>(impl_->global_devices.size()); }

collectives::ProcessGroup& Trainer::processes() const { return *impl_->processes; }

void Trainer::broadcast_from_rank0() {
  Impl& im = *impl_;
  if (im.world == 1) return;
  nn::Module& r0 = *im.replicas[0];
  std::vector<float> params(im.numel), buffers;
  r0.flat_parameters().to_host(std::span<float>(params));
  im.read_buffers(r0, buffers);
  im.processes->broadcast(std::as_writable_bytes(std::span<float>(params)), 0);
  im.processes->broadcast(std::as_writable_bytes(std::span<float>(buffers)), 0);
  im.workers->run([&](int i) {
    im.replicas[i]->flat_parameters().copy_from_host(std::span<const float>(params));
    im.write_buffers(*im.replicas[i], buffers);
  });
  if (im.use_pd && im.master_params.defined()) im.master_params.copy_(im.replicas[0]->flat_parameters());
}

std::vector<std::vector<int>> Trainer::split_rows(int global_n) const {
  const int k = options_.accumulation_steps;
  const std::vector<int> micro =
      split_batch(global_n, std::vector<Device>(k, Device::cpu(0)), EvenSplit{}, Remainder::Spread);
  std::vector<std::vector<int>> rows;
  for (int m = 0; m < k; ++m) rows.push_back(split_batch(micro[m], impl_->global_devices, options_.split, options_.remainder));
  return rows;
}

std::vector<std::pair<int, int>> Trainer::shard(int global_n) const {
  if (global_n < 1) raise<InvalidArgument>("a global batch of ", global_n, " rows has no shard; give at least one row");
  const int n = towers();
  std::vector<std::pair<int, int>> ranges;
  int base = 0;
  for (const std::vector<int>& g : split_rows(global_n)) {
    int begin = base;
    for (int t = 0; t < impl_->rank * n; ++t) begin += g[static_cast<std::size_t>(t)];
    int end = begin;
    for (int i = 0; i < n; ++i) end += g[static_cast<std::size_t>(impl_->rank * n + i)];
    for (int v : g) base += v;
    if (end == begin) continue;
    if (!ranges.empty() && ranges.back().second == begin) ranges.back().second = end;
    else ranges.emplace_back(begin, end);
  }
  return ranges;
}

void Trainer::broadcast_from_replica0() {
  Impl& im = *impl_;
  im.workers->run([&](int i) {
    if (i > 0) im.replicas[i]->copy_state_from(*im.replicas[0]);
  });
  if (im.use_pd) im.master_params.copy_(im.replicas[0]->flat_parameters());
  broadcast_from_rank0();
  im.read_buffers(*im.replicas[0], im.buffer_snapshot);
}

optim::ParameterSet Trainer::parameters() {
  Impl& im = *impl_;
  optim::ParameterSet set;
  set.slots = im.slots;
  auto timed = [this](const std::function<void(const std::function<void(int)>&)>& run) {
    return [this, run](const std::function<void(int)>& fn) {
      const auto t0 = Clock::now();
      run(fn);
      timings_.optimizer_seconds += since(t0);
    };
  };
  if (im.use_pd) {
    set.copies.push_back({.device = im.pd, .params = host_span(im.master_params),
                          .grads = host_span(im.master_grads)});
    set.for_each_copy = timed([](const std::function<void(int)>& fn) { fn(0); });
  } else {
    for (int i = 0; i < towers(); ++i) {
      const nn::Module& m = *im.replicas[i];
      set.copies.push_back({.device = devices_[i], .params = host_span(m.flat_parameters()),
                            .grads = host_span(m.flat_gradients())});
    }
    set.for_each_copy = timed([&im](const std::function<void(int)>& fn) { im.workers->run(fn); });
  }
  if (im.scaler) set.skip_step = [&im] { return im.scaler->last_step_skipped(); };
  return set;
}

LossScaler* Trainer::loss_scaler() { return impl_->scaler ? &*impl_->scaler : nullptr; }

float Trainer::forward_backward(const data::Batch& batch) { return forward_backward(HostBatch::of(batch)); }
EvalResult Trainer::evaluate(const data::Batch& batch) { return evaluate(HostBatch::of(batch)); }

float Trainer::forward_backward(const HostBatch& batch) {
  Impl& im = *impl_;
  const auto step_start = Clock::now();
  const int n = towers();
  const int G = global_towers();
  const std::size_t row = static_cast<std::size_t>(batch.h) * batch.w * batch.c;
  if (batch.n < 0 || batch.images.size() < row * batch.n || batch.labels.size() < static_cast<std::size_t>(batch.n))
    raise<InvalidArgument>("batch of ", batch.n, " rows of ", batch.h, "x", batch.w, "x", batch.c, " has ",
                           batch.images.size(), " image floats and ", batch.labels.size(),
                           " labels; it needs ", row * batch.n, " and ", batch.n);
  // The global batch: given, or (one process) this batch, or the sum over the processes.
  int B = batch.global_n > 0 ? batch.global_n : batch.n;
  if (batch.global_n <= 0 && im.world > 1) {
    double rows_everywhere = batch.n;
    im.processes->all_reduce_sum(std::span<double>(&rows_everywhere, 1));
    B = static_cast<int>(rows_everywhere);
  }
  if (B < 1) raise<InvalidArgument>("forward_backward got an empty batch; give at least one row");
  const int k = options_.accumulation_steps;
  if (B < k)
    raise<InvalidArgument>("batch ", B, " cannot be cut into ", k,
                           " micro-batches (accumulation_steps); use a batch of at least ", k);

  // Rows and offsets (into this process's rows): micro-batch m, tower i. This process's rows are
  // its towers' rows of micro-batch 0, then of micro-batch 1, ... (shard()).
  const std::vector<std::vector<int>> global_rows = split_rows(B);
  std::vector<std::vector<int>> rows(k), offset(k);
  std::vector<int> total_rows(n, 0);
  int base = 0;
  for (int m = 0; m < k; ++m) {
    for (int i = 0; i < n; ++i) {
      rows[m].push_back(global_rows[m][static_cast<std::size_t>(im.rank * n + i)]);
      offset[m].push_back(base);
      base += rows[m][i];
      total_rows[i] += rows[m][i];
    }
  }
  if (base != batch.n)
    raise<InvalidArgument>(im.world > 1 ? str("process rank ", im.rank, " got ") : std::string("got "), batch.n,
                           " rows, but the split of the global batch of ", B, " over ", G,
                           " towers gives this process's towers ", base, "; ",
                           im.world > 1 ? "load each process's rows with Trainer::shard() (train::fit does)"
                                        : "give the whole batch");
  if (im.bn_sync) {  // a tower without rows could not take part in the layers' exchanges
    for (int m = 0; m < k; ++m)
      for (int g = 0; g < G; ++g)
        if (global_rows[m][static_cast<std::size_t>(g)] == 0)
          raise<InvalidArgument>(
              "batch ", B, (k > 1 ? str(" (micro-batch ", m, ")") : ""), " gives tower ", g, " (",
              im.global_devices[static_cast<std::size_t>(g)],
              im.world > 1 ? str(" of rank ", g / n) : std::string(), ") no rows; synchronised batch norm needs "
              "every tower in every ", k > 1 ? "micro-batch" : "step", ": use a batch of at least ",
              G * k, " (or per-tower batch norm)");
  }

  im.loss.assign(n, 0.0);
  im.correct.assign(n, 0);
  im.compute_s.assign(n, 0.0);
  im.reduce_s.assign(n, 0.0);
  im.sync_s.assign(n, 0.0);
  // Note [Why towers scale loss by B]; under fp16 the loss is multiplied by the loss scale too.
  const double loss_scale = im.scaler ? im.scaler->scale() : 1.0;
  const float scale = static_cast<float>(B / loss_scale);
  std::atomic<bool> stop{false};              // set by the first tower that fails

  auto tower = [&](int i) {
    const PrecisionScope precision(options_.precision);
    nn::Module& model = *im.replicas[i];
    const Device& dev = devices_[i];
    if (im.use_pd) {  // the parameter device's values are the truth
      const trace::Span span("copy", "parameters from the parameter device");
      const auto t0 = Clock::now();
      model.flat_parameters().copy_(im.master_params);
      im.sync_s[i] = since(t0);
    }
    const auto t0 = Clock::now();
    model.zero_grad();
    std::thread comm_thread;
    std::exception_ptr comm_error;
    BucketTracker* tracker = im.bucket_bytes > 0 ? im.trackers[i].get() : nullptr;
    const Tensor grads = model.flat_gradients();
    auto start_comm = [&] {
      comm_thread = std::thread([&, i] {
        if (trace::enabled()) trace::set_thread_name(str("tower ", i, " reduction"));
        try {
          for (std::size_t b = 0; b < im.bucket_plan.buckets.size(); ++b) {
            std::shared_ptr<const QueueEvent> ready;
            if (!tracker->wait(b, &ready)) return;
            const Bucket& bk = im.bucket_plan.buckets[b];
            const trace::Span span("reduction", trace::enabled() ? str("bucket ", b) : std::string());
            im.comm->all_reduce_sum_after(
                i, host_span(grads).subspan(bk.begin, bk.end - bk.begin), ready.get());
          }
        } catch (...) {
          comm_error = std::current_exception();
        }
      });
    };
    try {
      for (int m = 0; m < k; ++m) {
        if (stop.load(std::memory_order_acquire))  // another tower failed: the step is over
          raise<collectives::CollectiveAborted>("step stopped: another tower failed");
        const int r = rows[m][i];
        if (r == 0) continue;
        const std::size_t o = static_cast<std::size_t>(offset[m][i]);
        Tensor x, y, loss;
        {
          const trace::Span span("copy", "batch to device");
          x = Tensor::from_host(batch.images.subspan(o * row, r * row), {r, batch.h, batch.w, batch.c}, dev);
          y = Tensor::from_host(batch.labels.subspan(o, r), {r}, dev);
        }
        {
          const trace::Span span("phase", "forward");
          Tensor logits = model.forward(x);
          loss = softmax_cross_entropy(logits, y, {.scale = scale, .label_smoothing = options_.label_smoothing});
          im.correct[i] += top_k_correct(logits, y, 1);
        }
        if (tracker && m == k - 1) {
          im.bucket_plan.install_hooks(model, loss, *tracker);
          start_comm();
        }
        {
          const trace::Span span("phase", "backward");
          loss.backward();
        }
        im.loss[i] += loss.item();
      }
      if (tracker) {
        if (!comm_thread.joinable()) {
          tracker->reset(std::vector<std::uint64_t>(im.bucket_plan.buckets.size(), 0));
          start_comm();
        }
        tracker->mark_all();
      }
    } catch (...) {
      if (comm_thread.joinable()) {
        im.comm->abort(str("tower ", i, " (", dev, ") failed"));
        tracker->cancel();
        comm_thread.join();
      }
      throw;
    }
    im.compute_s[i] = since(t0);
    const auto t1 = Clock::now();
    if (tracker) {
      const trace::Span span("reduction", "wait for the last buckets");
      comm_thread.join();
      if (comm_error) std::rethrow_exception(comm_error);
    } else if (im.comm) {
      const trace::Span span("reduction", "all-reduce");
      if (!dev.is_cpu()) backend_for(dev).synchronize();
      im.comm->all_reduce_sum(i, host_span(grads));
    } else {
      const trace::Span span("reduction", "gradients to the parameter device");
      im.staging[i].copy_(grads);
    }
    im.reduce_s[i] = since(t1);
    if (im.buffer_numel > 0 && G > 1 && !im.buffers_synced) {
      const trace::Span span("sync", "read batch-norm statistics");
      const auto t2 = Clock::now();
      im.read_buffers(model, im.buffer_host[i]);
      im.sync_s[i] += since(t2);
    }
  };

  auto on_error = [&](int i, std::exception_ptr) {
    stop.store(true, std::memory_order_release);
    if (im.comm) im.comm->abort(str("tower ", i, " (", devices_[i], ") failed"));
    if (im.bn_sync) im.bn_sync->abort(str("tower ", i, " (", devices_[i], ") failed"));
  };

  if (im.bn_sync) im.bn_sync->open();
  try {
    im.workers->run(tower, on_error);
  } catch (...) {
    // Every tower has stopped. Make the communicator (and the batch-norm exchange) usable again
    // and put the buffers (which the towers that ran have updated) back as they were;
    // parameters were not touched.
    if (im.bn_sync) {
      im.bn_sync->close();
      im.bn_sync->reset();
    }
    if (im.comm) im.comm->reset();
    if (im.buffer_numel > 0) {
      try {
        im.workers->run([&](int i) { im.write_buffers(*im.replicas[i], im.buffer_snapshot); });
      } catch (...) {
        log_error("could not restore the replicas' buffers after a failed step");
      }
    }
    throw;
  }
  if (im.bn_sync) im.bn_sync->close();

  double reduction = 0;
  if (im.use_pd) {
    // The towers' gathers ran in parallel; the sum runs on the parameter device, in tower order
    // (the same order as the all-reduce's, so both strategies give the same bits).
    const trace::Span span("reduction", "sum on the parameter device");
    const auto t0 = Clock::now();
    im.master_grads.copy_(im.staging[0]);
    Backend& be = backend_for(im.pd);
    for (int i = 1; i < n; ++i)
      be.axpy(static_cast<std::int64_t>(im.numel), 1.0f, im.staging[i].data<float>(), im.master_grads.data<float>());
    be.synchronize();
    if (im.world > 1) {  // then across processes, through host memory
      const trace::Span cross("reduction", "across processes");
      if (im.pd.is_cpu()) {
        im.processes->all_reduce_sum(host_span(im.master_grads));
      } else {
        std::vector<float> host(im.numel);
        im.master_grads.to_host(std::span<float>(host));
        im.processes->all_reduce_sum(std::span<float>(host));
        im.master_grads.copy_from_host(std::span<const float>(host));
      }
    }
    reduction = *std::max_element(im.reduce_s.begin(), im.reduce_s.end()) + since(t0);
  } else {
    reduction = *std::min_element(im.reduce_s.begin(), im.reduce_s.end());
  }

  // fp16: skip a step whose reduced gradients overflowed, else take the loss scale back out. The
  // reduced gradients are the same on every tower and process, so all decide alike.
  bool skipped = false;
  if (im.scaler) {
    const trace::Span span("reduction", "loss scale: check and unscale");
    const Tensor reduced = im.use_pd ? im.master_grads : im.replicas[0]->flat_gradients();
    const bool finite = std::isfinite(sum(reduced).item());
    skipped = !im.scaler->update(finite);
    if (!skipped) {
      const float inverse = static_cast<float>(1.0 / loss_scale);
      if (im.use_pd) {
        backend_for(im.pd).scale(static_cast<std::int64_t>(im.numel), inverse, im.master_grads.data<float>(),
                                 im.master_grads.data<float>());
      } else {
        im.workers->run([&](int i) {
          const Tensor g = im.replicas[i]->flat_gradients();
          backend_for(devices_[i]).scale(g.numel(), inverse, g.data<float>(), g.data<float>());
        });
      }
    }
  }

  // Running averages: the sample-weighted mean over towers, identical on every replica. With
  // synchronised batch norm every replica computed the same values from the global statistics
  // already (Note [Synchronised batch norm] in core/tensor/ops.cc).
  double sync = *std::max_element(im.sync_s.begin(), im.sync_s.end());
  if (im.buffer_numel > 0 && G > 1 && !im.buffers_synced) {
    const trace::Span span("sync", "average batch-norm statistics");
    const auto t0 = Clock::now();
    std::vector<float>& avg = im.buffer_snapshot;
    std::fill(avg.begin(), avg.end(), 0.0f);
    for (int i = 0; i < n; ++i) {
      const float w = static_cast<float>(total_rows[i]) / static_cast<float>(B);
      const std::vector<float>& h = im.buffer_host[i];
      for (std::size_t j = 0; j < avg.size(); ++j) avg[j] += w * h[j];
    }
    im.processes->all_reduce_sum(std::span<float>(avg));  // every process's towers
    im.workers->run([&](int i) { im.write_buffers(*im.replicas[i], avg); });
    sync += since(t0);
  } else if (im.buffer_numel > 0) {
    im.read_buffers(*im.replicas[0], im.buffer_snapshot);
  }

  std::array<double, 2> sums{};  // loss (already divided by B) and correct rows
  for (int i = 0; i < n; ++i) {
    sums[0] += im.loss[i];
    sums[1] += static_cast<double>(im.correct[i]);
  }
  im.processes->all_reduce_sum(std::span<double>(sums));
  last_ = {.loss = static_cast<float>(sums[0] / loss_scale), .accuracy = sums[1] / B, .rows = B, .split = total_rows,
           .loss_scale = loss_scale, .skipped = skipped};
  if (im.bucket_bytes > 0) {
    std::int64_t early = 0;
    for (auto& t : im.trackers) early += t->ready_during_backward();
    timings_.buckets_reduced_during_backward = early;  // since construction, all towers
  }
  timings_.steps += 1;
  timings_.compute_seconds += *std::max_element(im.compute_s.begin(), im.compute_s.end());
  timings_.reduction_seconds += reduction;
  timings_.sync_seconds += sync;
  timings_.step_seconds += since(step_start);
  return last_.loss;
}

EvalResult Trainer::evaluate(const HostBatch& batch) {
  Impl& im = *impl_;
  const int n = towers();
  if (batch.n < 1 && im.world == 1) raise<InvalidArgument>("evaluate got an empty batch; give at least one row");
  const std::size_t row = static_cast<std::size_t>(batch.h) * batch.w * batch.c;
  if (batch.images.size() < row * batch.n || batch.labels.size() < static_cast<std::size_t>(batch.n))
    raise<InvalidArgument>("evaluation batch of ", batch.n, " rows has ", batch.images.size(),
                           " image floats and ", batch.labels.size(), " labels; it needs ",
                           row * batch.n, " and ", batch.n);
  sync();
  // Evaluation rows split over this process's towers: evenly, or by their weights.
  SplitPolicy policy = EvenSplit{};
  if (const auto* w = std::get_if<WeightedSplit>(&options_.split))
    policy = WeightedSplit{{w->weights.begin() + im.rank * n, w->weights.begin() + (im.rank + 1) * n}};
  const std::vector<int> rows =
      batch.n > 0 ? split_batch(batch.n, devices_, policy, Remainder::Spread) : std::vector<int>(n, 0);
  std::vector<double> loss(n, 0.0);
  std::vector<std::int64_t> correct(n, 0);
  im.workers->run([&](int i) {
    if (rows[i] == 0) return;
    int o = 0;
    for (int j = 0; j < i; ++j) o += rows[j];
    const PrecisionScope precision(options_.precision);
    nn::Module& model = *im.replicas[i];
    const bool was_training = model.is_training();
    model.eval();
    struct Restore {
      nn::Module& m;
      bool on;
      ~Restore() { m.train(on); }
    } restore{model, was_training};
    NoGradGuard no_grad;
    const int r = rows[i];
    Tensor x = Tensor::from_host(batch.images.subspan(o * row, r * row), {r, batch.h, batch.w, batch.c},
                                 devices_[i]);
    Tensor y = Tensor::from_host(batch.labels.subspan(o, r), {r}, devices_[i]);
    Tensor logits = model.forward(x);
    loss[i] = softmax_cross_entropy(logits, y, {.scale = 1.0f}).item();  // the sum over rows
    correct[i] = top_k_correct(logits, y, 1);
  });
  std::array<double, 3> sums{0, 0, static_cast<double>(batch.n)};  // loss sum, correct, rows
  for (int i = 0; i < n; ++i) {
    sums[0] += loss[i];
    sums[1] += static_cast<double>(correct[i]);
  }
  im.processes->all_reduce_sum(std::span<double>(sums));
  EvalResult out;
  out.rows = static_cast<std::int64_t>(sums[2]);
  out.correct = static_cast<std::int64_t>(sums[1]);
  if (out.rows == 0) raise<InvalidArgument>("evaluate got an empty batch on every process; give at least one row");
  out.loss = sums[0] / static_cast<double>(out.rows);
  out.accuracy = static_cast<double>(out.correct) / static_cast<double>(out.rows);
  return out;
}

}  // namespace towerflow::tower

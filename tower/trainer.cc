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
#include "core/collectives/context.h"
#include "core/collectives/process_group.h"
#include "core/error.h"
#include "core/log.h"
#include "core/nn/layers.h"
#include "core/platform/registry.h"
#include "core/tensor/autograd.h"
#include "core/tensor/device_ops.h"
#include "core/tensor/ops.h"
#include "core/trace.h"
#include "data/batch.h"
#include "tower/batch_norm_sync.h"
#include "tower/reducer.h"
#include "tower/replica_buffers.h"
#include "tower/row_plan.h"
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


}  // namespace

HostBatch HostBatch::of(const data::Batch& b) {
  return {.images = b.valid_images(),
          .labels = std::span<const std::int32_t>(b.labels.data(), static_cast<std::size_t>(b.n)),
          .n = b.n, .h = b.h, .w = b.w, .c = b.c, .global_n = b.global_n,
          .mix_labels = b.mix_labels.empty() ? std::span<const std::int32_t>()
                                             : std::span<const std::int32_t>(b.mix_labels.data(), static_cast<std::size_t>(b.n)),
          .mix = b.mix};
}

struct Trainer::Impl {
  // The job's processes; global tower g = rank * towers + i runs on global_devices[g].
  collectives::ProcessGroup* processes = nullptr;
  std::unique_ptr<collectives::ProcessGroup> bn_processes;  // the batch-norm exchange's own
  std::vector<Device> global_devices;
  int rank = 0, world = 1;

  std::vector<std::shared_ptr<nn::Module>> replicas;
  std::unique_ptr<DeviceWorkers> workers;
  std::unique_ptr<GradientReducer> reducer;
  std::unique_ptr<ReplicaBuffers> buffers;
  std::unique_ptr<RowPlan> rows;
  std::vector<optim::ParameterSlot> slots;
  std::size_t numel = 0;

  // Synchronised batch norm: the towers' exchange, whose member i every BatchNorm2d of replica
  // i holds. Null in per-tower mode.
  std::unique_ptr<BatchNormSyncGroup> bn_sync;
  int bn_layers = 0;  // BatchNorm2d layers per replica
  // The running averages are computed from global statistics, identically on every replica
  // (bn_sync and bn_layers > 0): nothing to average after a step.
  bool buffers_synced = false;

  // fp16 only: the dynamic loss scale.
  std::optional<LossScaler> scaler;

  // AutoSplit only: the balancer over every global tower, and when a new split applies.
  std::optional<Balancer> balancer;
  int split_delay = 1;
  std::int64_t steps = 0;  // the last step's number (HostBatch::step, or counted)
};

// What the towers of one step report, one entry per tower.
struct Trainer::TowerResults {
  std::vector<double> loss, compute_s, reduce_s, sync_s;
  std::vector<std::int64_t> correct;
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
  if (!(options_.clip_grad_norm >= 0) || !std::isfinite(options_.clip_grad_norm))
    raise<InvalidArgument>("clip_grad_norm ", options_.clip_grad_norm,
                           " is not a norm; use a positive number (the largest global L2 norm of the gradients) or 0 (off)");
  if (options_.accumulation_steps < 1)
    raise<InvalidArgument>("accumulation_steps ", options_.accumulation_steps,
                           " is invalid; use 1 (no accumulation) or more micro-batches per step");
  if (options_.batch_norm == BatchNormMode::Synchronised) {
    // Not left to soft placement: every such tower would run its layers on /cpu:0 at once, and a
    // CPU device's context serves one thread at a time.
    for (const Device& d : devices_) {
      if (!has_kernel(d, OpKind::kBatchNormSync))
        raise<InvalidArgument>("synchronised batch norm (batch_norm = sync, op ",
                               to_string(OpKind::kBatchNormSync), ") has no kernel on ", d, " (",
                               backend_name(d), "); use per-tower batch norm (TrainerOptions::batch_norm = BatchNormMode::PerTower) "
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
  if (im.world > 1) {
    // One set-up on every rank, before any other collective (a rank set up otherwise could be
    // waiting in a different one) and before NCCL joins the ranks' GPUs (ranks that disagree on
    // the device count would give NCCL inconsistent ranks).
    std::string kinds;
    for (const Device& d : devices_) kinds += (kinds.empty() ? "" : ",") + std::string(d.is_gpu() ? "gpu" : "cpu");
    collectives::check_same_on_every_rank(
        *im.processes, "the trainer's set-up",
        str("'", n, " devices (", kinds, "), reduction ", to_string(options_.reduction), ", split ",
            to_string(options_.split), ", ", options_.accumulation_steps, " micro-batches, batch norm ",
            options_.batch_norm == BatchNormMode::Synchronised ? "sync" : "per_tower", ", label smoothing ",
            options_.label_smoothing, ", clip_grad_norm ", options_.clip_grad_norm, ", precision ",
            to_string(options_.precision),
            options_.precision != Precision::Fp16
                ? std::string()
                : str(" (loss scale from ", options_.loss_scale.initial_scale, ", x",
                      options_.loss_scale.growth_factor, " every ", options_.loss_scale.growth_interval,
                      " good steps, x", options_.loss_scale.backoff_factor, " on overflow)"),
            "'"),
        "start every rank with the same model, options and number of devices");
  }

  // The reduction in effect, and its communicator: made before the replicas, so that NCCL has
  // connected before the devices' memory is reserved.
  ReductionChoice choice = choose_reduction(options_.reduction, devices_, *im.processes);
  reduction_ = choice.reduction;

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
    std::string shapes;
    std::size_t numel = 0, tensors = 0, buffer_numel = 0;
    for (auto& [name, t] : im.replicas[0]->named_parameters()) {
      shapes += str(name, ":", t.numel(), ";");
      numel += static_cast<std::size_t>(t.numel());
      ++tensors;
    }
    for (const Tensor& t : ReplicaBuffers::of(*im.replicas[0])) buffer_numel += static_cast<std::size_t>(t.numel());
    collectives::check_same_on_every_rank(
        *im.processes, "the trainer's model",
        str("'", numel, " parameters in ", tensors, " tensors (layout hash ", std::hash<std::string>{}(shapes), "), ",
            buffer_numel, " buffer values'"),
        "start every rank with the same model");
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
  im.buffers = std::make_unique<ReplicaBuffers>(im.replicas, *im.workers, *im.processes);
  broadcast_from_rank0();  // rank 0's initial state everywhere
  im.reducer = make_reducer(std::move(choice), {.devices = devices_, .replicas = &im.replicas,
                                                .workers = im.workers.get(), .processes = im.processes,
                                                .numel = im.numel});
  im.rows = std::make_unique<RowPlan>(im.global_devices, im.rank, n, options_.split, options_.remainder,
                                      options_.accumulation_steps, im.bn_sync != nullptr);
  if (const auto* a = std::get_if<AutoSplit>(&options_.split))
    im.balancer.emplace(static_cast<int>(im.global_devices.size()), *a);
  // Debug, not Info: applications print describe() in their own start-up output.
  log(LogLevel::Debug, describe());
}

std::string Trainer::describe() const {
  std::string s = str(towers(), towers() == 1 ? " tower on " : " towers on ", device_list(devices_));
  if (impl_->world > 1)
    s += str(" in each of ", impl_->world, " processes (", global_towers(), " towers; this is rank ", impl_->rank, ")");
  s += str("; split ", to_string(options_.split), "; ", impl_->reducer->describe());
  if (options_.accumulation_steps > 1) s += str("; ", options_.accumulation_steps, " micro-batches per step");
  if (options_.precision != Precision::Fp32) {
    // What each kind of device runs them on (a mixed /gpu:0,/cpu:0 run names both).
    std::string how;
    std::vector<std::string> seen;
    for (const Device& d : devices_) {
      const std::string what = describe_products(d, options_.precision);
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
  const auto t0 = Clock::now();
  impl_->reducer->sync();
  timings_.sync_seconds += since(t0);
}

int Trainer::global_towers() const { return static_cast<int>(impl_->global_devices.size()); }

collectives::ProcessGroup& Trainer::processes() const { return *impl_->processes; }

std::string Trainer::tower_collectives() const { return impl_->reducer->recent_collectives(); }

void Trainer::broadcast_from_rank0() {
  Impl& im = *impl_;
  if (im.world == 1) return;
  nn::Module& r0 = *im.replicas[0];
  std::vector<float> params(im.numel), buffers;
  r0.flat_parameters().to_host(std::span<float>(params));
  im.buffers->read(r0, buffers);
  im.processes->broadcast(std::as_writable_bytes(std::span<float>(params)), 0);
  im.processes->broadcast(std::as_writable_bytes(std::span<float>(buffers)), 0);
  im.workers->run([&](int i) {
    im.replicas[i]->flat_parameters().copy_from_host(std::span<const float>(params));
    im.buffers->write(*im.replicas[i], buffers);
  });
  im.buffers->take_snapshot();
}

void Trainer::check_batch(int global_n) const {
  check_batch_split(global_n, impl_->global_devices, options_.split, options_.remainder, options_.accumulation_steps);
}

std::vector<std::pair<int, int>> Trainer::shard(int global_n, std::int64_t step) const {
  return impl_->rows->shard(global_n, step);
}

std::vector<double> Trainer::split_shares(std::int64_t step) const {
  if (!impl_->balancer) return {};
  return impl_->rows->shares_at(step > 0 ? step : impl_->steps);
}

void Trainer::set_split_shares(std::vector<double> shares, std::int64_t from) {
  Impl& im = *impl_;
  if (!im.balancer) return;
  const std::size_t g = im.global_devices.size();
  if (shares.size() != g)
    raise<InvalidArgument>("an auto split of ", shares.size(), " towers' shares cannot apply to ", g,
                           " towers; give one share per tower of every process (or start the split afresh)");
  im.balancer.emplace(static_cast<int>(g), std::get<AutoSplit>(options_.split), shares);  // checks them
  im.rows->set_shares(from, im.balancer->shares());
}

void Trainer::set_split_delay(int steps) {
  if (steps < 1) raise<InvalidArgument>("a split delay of ", steps, " steps is invalid; use 1 or more");
  impl_->split_delay = steps;
}

void Trainer::broadcast_from_replica0() {
  Impl& im = *impl_;
  im.workers->run([&](int i) {
    if (i > 0) im.replicas[i]->copy_state_from(*im.replicas[0]);
  });
  broadcast_from_rank0();
  im.reducer->take_replica0();
  im.buffers->take_snapshot();
}

optim::ParameterSet Trainer::parameters() {
  Impl& im = *impl_;
  optim::ParameterSet set = im.reducer->parameters();
  set.slots = im.slots;
  set.for_each_copy = [this, run = std::move(set.for_each_copy)](const std::function<void(int)>& fn) {
    const auto t0 = Clock::now();
    run(fn);
    timings_.optimizer_seconds += since(t0);
  };
  if (im.scaler) set.skip_step = [&im] { return im.scaler->last_step_skipped(); };
  return set;
}

LossScaler* Trainer::loss_scaler() { return impl_->scaler ? &*impl_->scaler : nullptr; }

float Trainer::forward_backward(const data::Batch& batch) { return forward_backward(HostBatch::of(batch)); }
EvalResult Trainer::evaluate(const data::Batch& batch, const std::vector<data::TestView>& views) {
  return evaluate(HostBatch::of(batch), views);
}

float Trainer::forward_backward(const HostBatch& batch) {
  Impl& im = *impl_;
  const auto step_start = Clock::now();
  const std::int64_t step = batch.step > 0 ? batch.step : im.steps + 1;
  const StepRows plan = im.rows->step(global_rows(batch), batch.n, step);
  const double loss_scale = im.scaler ? im.scaler->scale() : 1.0;
  if (im.balancer && im.bn_sync)  // the waits of this step only (a failed step's are dropped)
    for (int i = 0; i < towers(); ++i) im.bn_sync->take_waited(i);

  const TowerResults ran = run_towers(batch, plan, loss_scale);

  const auto t0 = Clock::now();
  im.reducer->finish();
  const double reduction = im.reducer->exposed_seconds(ran.reduce_s, since(t0));
  const bool skipped = unscale_or_skip(loss_scale);
  const auto [grad_norm, clipped] = skipped ? std::pair{0.0, false} : clip_gradients();
  const double sync = *std::max_element(ran.sync_s.begin(), ran.sync_s.end()) + average_buffers(plan);

  std::array<double, 2> sums{};  // loss (already divided by B) and correct rows
  for (int i = 0; i < towers(); ++i) {
    sums[0] += ran.loss[i];
    sums[1] += static_cast<double>(ran.correct[i]);
  }
  {
    const collectives::ContextScope what({.purpose = "loss and accuracy"});
    im.processes->all_reduce_sum(std::span<double>(sums));
  }
  im.steps = step;
  if (im.balancer) balance(ran, plan.global_total, step);
  last_ = {.loss = static_cast<float>(sums[0] / loss_scale), .accuracy = sums[1] / plan.global_n,
           .rows = plan.global_n, .split = plan.total, .global_split = plan.global_total,
           .loss_scale = loss_scale, .skipped = skipped, .grad_norm = grad_norm, .clipped = clipped};
  timings_.buckets_reduced_during_backward = im.reducer->reduced_during_backward();
  timings_.steps += 1;
  timings_.compute_seconds += *std::max_element(ran.compute_s.begin(), ran.compute_s.end());
  timings_.reduction_seconds += reduction;
  timings_.sync_seconds += sync;
  timings_.step_seconds += since(step_start);
  return last_.loss;
}

int Trainer::global_rows(const HostBatch& batch) {
  const std::size_t row = static_cast<std::size_t>(batch.h) * batch.w * batch.c;
  if (batch.n < 0 || batch.images.size() < row * batch.n || batch.labels.size() < static_cast<std::size_t>(batch.n))
    raise<InvalidArgument>("batch of ", batch.n, " rows of ", batch.h, "x", batch.w, "x", batch.c, " has ",
                           batch.images.size(), " image floats and ", batch.labels.size(),
                           " labels; it needs ", row * batch.n, " and ", batch.n);
  if (!batch.mix_labels.empty() && (batch.mix_labels.size() < static_cast<std::size_t>(batch.n) || !(batch.mix >= 0 && batch.mix <= 1)))
    raise<InvalidArgument>("mixed batch of ", batch.n, " rows has ", batch.mix_labels.size(), " mix labels and mix ",
                           batch.mix, "; it needs ", batch.n, " and a mix in [0, 1]");
  // The global batch: given, or (one process) this batch, or the sum over the processes.
  if (batch.global_n > 0) return batch.global_n;
  if (impl_->world == 1) return batch.n;
  double rows_everywhere = batch.n;
  const collectives::ContextScope what({.purpose = "rows of the global batch"});
  impl_->processes->all_reduce_sum(std::span<double>(&rows_everywhere, 1));
  return static_cast<int>(rows_everywhere);
}

// Every tower's forward and backward passes and its part of the reduction, on its own worker.
// The first failure stops the step: the reducer and the batch-norm exchange release the towers
// waiting in them, and once every tower has stopped the buffers are put back and the failure
// rethrown (parameters are untouched).
Trainer::TowerResults Trainer::run_towers(const HostBatch& batch, const StepRows& plan, double loss_scale) {
  Impl& im = *impl_;
  const int n = towers(), k = options_.accumulation_steps;
  const std::size_t row = static_cast<std::size_t>(batch.h) * batch.w * batch.c;
  // Note [Why towers scale loss by B]; under fp16 the loss is multiplied by the loss scale too.
  const float scale = static_cast<float>(plan.global_n / loss_scale);
  TowerResults out{.loss = std::vector<double>(n, 0.0), .compute_s = std::vector<double>(n, 0.0),
                   .reduce_s = std::vector<double>(n, 0.0), .sync_s = std::vector<double>(n, 0.0),
                   .correct = std::vector<std::int64_t>(n, 0)};
  std::atomic<bool> stop{false};  // set by the first tower that fails
  const bool mixed = !batch.mix_labels.empty() && batch.mix > 0 && batch.mix < 1;
  const collectives::CollectiveContext context = collectives::current_context();  // the caller's step

  auto tower = [&](int i) {
    const PrecisionScope precision(options_.precision);
    const collectives::ContextScope in_step(context);
    nn::Module& model = *im.replicas[i];
    const Device& dev = devices_[i];
    auto t0 = Clock::now();
    im.reducer->before_forward(i);
    out.sync_s[i] = since(t0);
    t0 = Clock::now();
    model.zero_grad();
    for (int m = 0; m < k; ++m) {
      if (stop.load(std::memory_order_acquire))  // another tower failed: the step is over
        raise<collectives::CollectiveAborted>("step stopped: another tower failed");
      const int r = plan.rows[m][i];
      if (r == 0) continue;
      const std::size_t o = static_cast<std::size_t>(plan.offset[m][i]);
      Tensor x, y, loss;
      {
        const trace::Span span("copy", "batch to device");
        x = Tensor::from_host(batch.images.subspan(o * row, r * row), {r, batch.h, batch.w, batch.c}, dev);
        y = Tensor::from_host(batch.labels.subspan(o, r), {r}, dev);
      }
      {
        const trace::Span span("phase", "forward");
        Tensor logits = model.forward(x);
        if (mixed) {  // targets mix * onehot(y) + (1 - mix) * onehot(y2): the loss is linear in them
          const Tensor y2 = Tensor::from_host(batch.mix_labels.subspan(o, r), {r}, dev);
          loss = add(softmax_cross_entropy(logits, y, {.scale = scale / batch.mix, .label_smoothing = options_.label_smoothing}),
                     softmax_cross_entropy(logits, y2, {.scale = scale / (1.0f - batch.mix),
                                                        .label_smoothing = options_.label_smoothing}));
        } else {
          loss = softmax_cross_entropy(logits, y, {.scale = scale, .label_smoothing = options_.label_smoothing});
        }
        out.correct[i] += top_k_correct(logits, y, 1);
      }
      {
        const trace::Span span("phase", "backward");
        backward(loss, m == k - 1 ? im.reducer->backward_hooks(i) : BackwardHooks{});
      }
      out.loss[i] += loss.item();
    }
    out.compute_s[i] = since(t0);
    t0 = Clock::now();
    im.reducer->after_backward(i);
    out.reduce_s[i] = since(t0);
    if (global_towers() > 1 && !im.buffers_synced) {
      const trace::Span span("sync", "read batch-norm statistics");
      const collectives::ContextScope what({.purpose = "batch-norm statistics"});
      t0 = Clock::now();
      im.buffers->gather(i);
      out.sync_s[i] += since(t0);
    }
  };

  auto on_error = [&](int i, std::exception_ptr) {
    stop.store(true, std::memory_order_release);
    const std::string why = str("tower ", i, " (", devices_[i], ") failed");
    im.reducer->abort(why);
    if (im.bn_sync) im.bn_sync->abort(why);
  };

  if (im.bn_sync) im.bn_sync->open();
  try {
    im.workers->run(tower, on_error);
  } catch (...) {
    // Every tower has stopped: make the reducer and the batch-norm exchange usable again and put
    // the buffers (which the towers that ran have updated) back as they were.
    if (im.bn_sync) {
      im.bn_sync->close();
      im.bn_sync->reset();
    }
    im.reducer->reset();
    try {
      im.buffers->restore();
    } catch (...) {
      log_error("could not restore the replicas' buffers after a failed step");
    }
    throw;
  }
  if (im.bn_sync) im.bn_sync->close();
  return out;
}

// AutoSplit (Note [Auto-balanced towers] in balancer.cc): every tower's compute time of this step,
// its waits for synchronised batch norm left out, from every process; the same balancer on the
// same values on every rank, so every rank schedules the same split for the same step.
void Trainer::balance(const TowerResults& ran, const std::vector<int>& global_split, std::int64_t step) {
  Impl& im = *impl_;
  const int n = towers();
  std::vector<double> mine(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    mine[i] = std::max(0.0, ran.compute_s[i] - (im.bn_sync ? im.bn_sync->take_waited(i) : 0.0));
  std::vector<double> seconds = mine;
  if (im.world > 1) {
    const collectives::ContextScope what({.purpose = "towers' compute times"});
    seconds.assign(im.global_devices.size(), 0.0);
    im.processes->all_gather(std::as_bytes(std::span<const double>(mine)),
                             std::as_writable_bytes(std::span<double>(seconds)));
  }
  if (im.balancer->observe(seconds, global_split)) im.rows->set_shares(step + im.split_delay, im.balancer->shares());
  im.rows->forget_before(step);
}

// clip_grad_norm: PyTorch's clip_grad_norm_ over the reduced gradients (the same on every copy and
// process, so every rank scales alike). Returns the norm and whether it was clipped.
std::pair<double, bool> Trainer::clip_gradients() {
  if (options_.clip_grad_norm <= 0) return {0.0, false};
  const trace::Span span("reduction", "clip gradient norm");
  const Tensor g = impl_->reducer->reduced_gradients();
  const double norm = std::sqrt(static_cast<double>(sum(mul(g, g)).item()));
  const double factor = options_.clip_grad_norm / (norm + 1e-6);
  if (!(factor < 1.0)) return {norm, false};  // also a NaN norm: the step's own checks say so
  impl_->reducer->scale_gradients(static_cast<float>(factor));
  return {norm, true};
}

// fp16: skips a step whose reduced gradients overflowed, else takes the loss scale back out. The
// reduced gradients are the same on every tower and process, so all decide alike.
bool Trainer::unscale_or_skip(double loss_scale) {
  Impl& im = *impl_;
  if (!im.scaler) return false;
  const trace::Span span("reduction", "loss scale: check and unscale");
  const bool finite = std::isfinite(sum(im.reducer->reduced_gradients()).item());
  const bool skipped = !im.scaler->update(finite);
  if (!skipped) im.reducer->scale_gradients(static_cast<float>(1.0 / loss_scale));
  return skipped;
}

// Running averages: the sample-weighted mean over towers, identical on every replica; with
// synchronised batch norm every replica computed the same values from the global statistics
// already (Note [Synchronised batch norm] in core/tensor/ops.cc). Returns the seconds it took.
double Trainer::average_buffers(const StepRows& plan) {
  Impl& im = *impl_;
  if (im.buffers->numel() == 0) return 0;
  const auto t0 = Clock::now();
  if (global_towers() > 1 && !im.buffers_synced) {
    const trace::Span span("sync", "average batch-norm statistics");
    std::vector<float> weights;
    for (int r : plan.total) weights.push_back(static_cast<float>(r) / static_cast<float>(plan.global_n));
    im.buffers->average(weights);
  } else {
    im.buffers->take_snapshot();
  }
  return since(t0);
}

EvalResult Trainer::evaluate(const HostBatch& batch, const std::vector<data::TestView>& views) {
  Impl& im = *impl_;
  const int n = towers();
  if (batch.n < 1 && im.world == 1) raise<InvalidArgument>("evaluate got an empty batch; give at least one row");
  const std::size_t row = static_cast<std::size_t>(batch.h) * batch.w * batch.c;
  if (batch.images.size() < row * batch.n || batch.labels.size() < static_cast<std::size_t>(batch.n))
    raise<InvalidArgument>("evaluation batch of ", batch.n, " rows has ", batch.images.size(),
                           " image floats and ", batch.labels.size(), " labels; it needs ",
                           row * batch.n, " and ", batch.n);
  sync();
  // Evaluation rows split over this process's towers: evenly, or by their weights or auto shares.
  SplitPolicy policy = EvenSplit{};
  if (const auto* w = std::get_if<WeightedSplit>(&options_.split))
    policy = WeightedSplit{{w->weights.begin() + im.rank * n, w->weights.begin() + (im.rank + 1) * n}};
  if (im.balancer) {
    const std::vector<double> shares = split_shares();
    policy = WeightedSplit{{shares.begin() + im.rank * n, shares.begin() + (im.rank + 1) * n}};
  }
  const std::vector<int> rows =
      batch.n > 0 ? split_batch(batch.n, devices_, policy, Remainder::Spread) : std::vector<int>(n, 0);
  std::vector<double> loss(n, 0.0);
  std::vector<std::int64_t> correct(n, 0), correct5(n, 0);
  std::vector<std::vector<float>> logits_of(n);  // each tower's logits on the host, for the confusion
  int classes = 0;
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
    const Shape shape{r, batch.h, batch.w, batch.c};
    const std::span<const float> images = batch.images.subspan(o * row, r * row);
    Tensor y = Tensor::from_host(batch.labels.subspan(o, r), {r}, devices_[i]);
    Tensor logits;
    if (data::plain_views(views)) {
      logits = model.forward(Tensor::from_host(images, shape, devices_[i]));
    } else {
      std::vector<float> view(images.size());
      for (const data::TestView& v : views) {
        data::apply_view(v, {batch.h, batch.w, batch.c}, r, images.data(), view.data());
        Tensor z = scale(model.forward(Tensor::from_host(std::span<const float>(view), shape, devices_[i])),
                         static_cast<float>(v.weight));
        logits = logits.defined() ? add(logits, z) : z;
      }
    }
    loss[i] = softmax_cross_entropy(logits, y, {.scale = 1.0f}).item();  // the sum over rows
    correct[i] = top_k_correct(logits, y, 1);
    correct5[i] = top_k_correct(logits, y, static_cast<int>(std::min<std::int64_t>(5, logits.dim(1))));
    logits_of[i] = logits.to_host();
  });
  // The model's output width, the same on every tower (replicas of one model); processes agree
  // on it, since one given no rows here saw none.
  for (int i = 0; i < n; ++i)
    if (rows[i] > 0) classes = static_cast<int>(logits_of[i].size() / static_cast<std::size_t>(rows[i]));
  std::array<std::int64_t, 1> width{classes};
  im.processes->all_reduce_max(std::span<std::int64_t>(width));
  classes = static_cast<int>(width[0]);
  const std::size_t cc = static_cast<std::size_t>(classes) * static_cast<std::size_t>(classes);
  // loss sum, correct, rows, top-5 correct, then the confusion counts
  std::vector<double> sums(4 + cc, 0.0);
  sums[2] = static_cast<double>(batch.n);
  int offset = 0;
  for (int i = 0; i < n; ++i) {
    sums[0] += loss[i];
    sums[1] += static_cast<double>(correct[i]);
    sums[3] += static_cast<double>(correct5[i]);
    for (int r = 0; r < rows[i]; ++r) {
      const float* z = logits_of[i].data() + static_cast<std::size_t>(r) * classes;
      if (!std::all_of(z, z + classes, [](float v) { return std::isfinite(v); })) continue;
      const auto predicted = std::max_element(z, z + classes) - z;
      const std::int32_t label = batch.labels[static_cast<std::size_t>(offset + r)];
      if (label >= 0 && label < classes) sums[4 + static_cast<std::size_t>(label) * classes + predicted] += 1;
    }
    offset += rows[i];
  }
  im.processes->all_reduce_sum(std::span<double>(sums));
  EvalResult out;
  out.rows = static_cast<std::int64_t>(sums[2]);
  out.correct = static_cast<std::int64_t>(sums[1]);
  out.correct_top5 = static_cast<std::int64_t>(sums[3]);
  out.classes = classes;
  out.confusion.resize(cc);
  for (std::size_t k = 0; k < cc; ++k) out.confusion[k] = static_cast<std::int64_t>(sums[4 + k]);
  if (out.rows == 0) raise<InvalidArgument>("evaluate got an empty batch on every process; give at least one row");
  out.loss = sums[0] / static_cast<double>(out.rows);
  out.accuracy = static_cast<double>(out.correct) / static_cast<double>(out.rows);
  out.top5 = static_cast<double>(out.correct_top5) / static_cast<double>(out.rows);
  return out;
}

}  // namespace towerflow::tower

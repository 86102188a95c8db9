#pragma once
// Trainer: the tower builder. One replica of a model per device, every global batch split across
// the replicas ("towers"), the towers run in parallel, their gradients reduced into the
// global-batch mean gradient, an optimizer applies it.
//
//   tower::Trainer trainer{models::factory("resnet20"), devices, {.reduction = tower::AllReduce{}}};
//   optim::Sgd sgd{trainer.parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4}};
//   for (const auto& batch : loader) {
//     float loss = trainer.forward_backward(batch);   // split, run every tower, reduce
//     sgd.step();                                     // on every replica, or once on the parameter device
//   }
//
// Contract:
// - Replication: the factory builds replica 0 on devices[0], then one replica on each other
//   device, and every replica's parameters and buffers are copied from replica 0 (or from the
//   `initial` module given): all start identical whatever the factory's randomness.
// - forward_backward(batch): zeroes the gradients, splits the batch (TrainerOptions::split and
//   ::remainder; with accumulation_steps = k the batch is first cut into k micro-batches, each
//   split across the towers, and the gradients accumulate over all k before one reduction), runs
//   every tower on its own worker thread bound to its device, each tower's loss being
//   sum(cross-entropy over its rows) / B with B the whole global batch, then reduces. Afterwards
//   parameters().copies[i].grads hold the global-batch mean gradient (scaled down to norm
//   clip_grad_norm where that is set and the norm is larger). Returns the global-batch mean loss
//   (the sample-weighted mean over towers); last_step() has the top-1 accuracy and the gradient
//   norm too.
// - AutoSplit (TrainerOptions::split = AutoSplit{...}): after every step each tower's forward and
//   backward time (without its waits for synchronised batch norm) and rows go to a Balancer
//   (balancer.h); across processes every rank gathers every tower's (one all-gather of a few
//   doubles) and runs the same balancer on the same values, so all agree. A new split applies
//   from split_delay steps later (set_split_delay), by run step (HostBatch::step), and shard()
//   of a step gives each process that step's rows.
// - Reduction: see reduction.h. Under AllReduce the replicas stay bit-identical after every
//   optimizer step (identical reduced gradients, identical arithmetic). Under ParameterDevice
//   the master copy on that device is the truth; replicas receive it before every forward (and
//   on sync()).
// - Batch norm, PerTower (default): each tower normalises with its own slice's statistics. After
//   every step the running averages (every buffer) of all replicas are replaced by their
//   sample-weighted mean over the towers (rows_i / B), computed once and copied to every
//   replica, so replicas keep identical buffers.
// - Batch norm, Synchronised: every nn::BatchNorm2d of replica i holds member i of one
//   BatchNormSyncGroup (batch_norm_sync.h). In training, each layer normalises with the
//   statistics of the whole micro-batch over all towers (the towers exchange per-channel sums,
//   weighted by their row counts, forward and backward), so the parameters, gradients and
//   running averages are those of one tower over the global batch, to float rounding, however
//   the batch is split; with accumulation_steps = k, statistics are per micro-batch (as
//   PyTorch's SyncBatchNorm per forward). The running averages come out identical on every
//   replica (nothing is averaged after the step). Evaluation uses the running averages, as in
//   PerTower; outside forward_backward a replica's layers refuse a training-mode forward
//   (InvalidArgument: its towers are not there to exchange with). Every tower must get at least one row of every micro-batch (InvalidArgument
//   otherwise). A model without nn::BatchNorm2d layers trains as in PerTower (logged). Devices
//   whose backend has no synchronised batch-norm kernels (GPUs, for now) are refused at
//   construction (InvalidArgument naming the device and the option), soft placement or not.
// - Processes: with a ProcessGroup of P > 1 processes (TrainerOptions::processes; by default
//   collectives::world(), MPI's world under mpirun), every process builds a Trainer over its own
//   L devices and the job trains P x L towers, numbered rank * L + i ("global towers"). Each
//   global batch of B rows is split over all of them (EvenSplit, WeightedSplit with P * L
//   weights, or AutoSplit); every process is given only its towers' rows (shard(B): a data::Loader takes them
//   with LoaderOptions::shard), and HostBatch::global_n says B. The gradients are summed inside
//   each process and then across processes (collectives::make_hierarchical_communicator), the
//   loss is scaled by B, synchronised batch norm spans every process's towers, per-tower running
//   averages are averaged over all towers, and forward_backward returns the loss and accuracy
//   of the whole global batch on every rank. At construction rank 0's parameters and buffers
//   are copied to every process, and a set-up that differs between ranks (model, device count,
//   split, reduction, batch norm, accumulation) raises InvalidArgument on every rank. Between
//   calls the processes must make the same calls in the same order (they are collectives).
// - Precision (TrainerOptions::precision): every tower runs its convolutions and matrix products
//   in it (core/tensor/precision.h). Under fp16 the trainer scales the loss dynamically
//   (loss_scale.h): the towers' loss is multiplied by the scale, the reduced gradients are
//   divided by it, and a step whose reduced gradients are not finite is skipped -- the
//   optimizers over parameters() leave it out (ParameterSet::skip_step) -- and shrinks the scale.
//   last_step() says whether the step was skipped and the scale it used.
// - Failure: the first exception in any tower (e.g. OutOfMemory on one device) stops the step:
//   towers waiting in a collective (the gradient reduction, or a synchronised batch-norm
//   exchange) are released, every tower stops, and that exception is
//   rethrown on the caller's thread. Parameters, optimizer state and every replica's buffers are
//   left as before the step (gradients are undefined until the next successful step).
// - Thread-safety: one thread drives a Trainer. Replicas are used only by their worker threads
//   during a call, and by the caller between calls.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/nn/module.h"
#include "core/tensor/precision.h"
#include "data/views.h"
#include "optim/parameters.h"
#include "tower/loss_scale.h"
#include "tower/reduction.h"
#include "tower/split.h"

namespace towerflow::data {
struct Batch;
}

namespace towerflow::collectives {
class ProcessGroup;
}

namespace towerflow::tower {

struct StepRows;  // row_plan.h

enum class BatchNormMode {
  PerTower,      // each tower's own batch statistics; running averages averaged across towers
  Synchronised,  // statistics over the global batch (every tower's rows), forward and backward
};

struct TrainerOptions {
  Reduction reduction = AllReduce{};
  SplitPolicy split = EvenSplit{};
  Remainder remainder = Remainder::Error;
  int accumulation_steps = 1;  // micro-batches per forward_backward, reduced once
  BatchNormMode batch_norm = BatchNormMode::PerTower;
  float label_smoothing = 0.0f;
  // Convolutions and matrix products of every tower in bf16 or fp16 with fp32 accumulation, the
  // rest in fp32 (core/tensor/precision.h); evaluation too.
  Precision precision = Precision::Fp32;
  // Dynamic loss scaling, applied under fp16 only (loss_scale.h).
  LossScaleOptions loss_scale;
  // > 0: after the reduction (and fp16's unscaling), the reduced gradients are multiplied by
  // clip_grad_norm / (norm + 1e-6) when their global L2 norm is larger, as PyTorch's
  // torch.nn.utils.clip_grad_norm_ does; the same factor on every copy and process. 0: off.
  double clip_grad_norm = 0;
  // The job's processes; null: collectives::world() (a world of one unless started by mpirun).
  collectives::ProcessGroup* processes = nullptr;
};

// A view of a host batch: NHWC float32 images and int32 labels, n rows.
struct HostBatch {
  std::span<const float> images;  // n * h * w * c
  std::span<const std::int32_t> labels;
  int n = 0, h = 0, w = 0, c = 0;
  // Rows of the global batch over every process (0: the sum of every process's n).
  int global_n = 0;
  // Mixed images (data::Batch::mix): the loss is mix * CE(labels) + (1 - mix) * CE(mix_labels);
  // empty mix_labels: CE(labels). Accuracy counts against labels.
  std::span<const std::int32_t> mix_labels = {};
  float mix = 1;
  // The run's step this batch is for, from 1 (train::fit numbers its steps so); 0: the trainer
  // counts its forward_backward calls. An AutoSplit's schedule is kept by these numbers.
  std::int64_t step = 0;

  static HostBatch of(const data::Batch& batch);
};

struct StepMetrics {
  float loss = 0;          // global-batch mean
  double accuracy = 0;     // top-1 over the global batch, in training mode
  int rows = 0;            // the global batch, over every process
  std::vector<int> split;  // rows per tower of this process (over all micro-batches)
  std::vector<int> global_split;  // rows per tower of every process, global tower order
  double loss_scale = 1;   // the scale the step's loss was multiplied by (fp16; else 1)
  bool skipped = false;    // fp16: the reduced gradients were not finite; optimizers skip the step
  double grad_norm = 0;    // clip_grad_norm > 0: the reduced gradients' global L2 norm before clipping
  bool clipped = false;    // ... and whether it was above clip_grad_norm, so they were scaled down
};

struct EvalResult {
  double loss = 0;            // mean cross-entropy over the rows
  double accuracy = 0;        // top-1
  std::int64_t correct = 0;
  std::int64_t rows = 0;
  double top5 = 0;            // top-5 (top-k with k = the classes, where fewer than 5)
  std::int64_t correct_top5 = 0;
  // classes x classes counts, row-major: [true label][top-1 prediction] (the first largest
  // logit, as argmax picks it). A row with a non-finite logit predicts nothing and is not counted.
  int classes = 0;
  std::vector<std::int64_t> confusion;
};

// Cumulative wall-clock counters since construction or reset_timings().
struct TrainerTimings {
  std::int64_t steps = 0;
  double step_seconds = 0;       // inside forward_backward
  double compute_seconds = 0;    // forward + backward, the slowest tower
  double reduction_seconds = 0;  // reduction not hidden behind backward: the all-reduce (its
                                 // fastest participant, so waiting for a slower tower is not
                                 // counted) or the parameter device's gather and sum
  double optimizer_seconds = 0;  // optimizer steps through parameters()
  double sync_seconds = 0;       // buffer averaging and parameter-device broadcasts
  // Bucketed all-reduce: buckets whose reduction could start before their tower's backward
  // ended (summed over towers, since construction; reset_timings() does not clear it).
  std::int64_t buckets_reduced_during_backward = 0;
};

class Trainer {
 public:
  // Throws InvalidArgument for an empty or repeated device list, accumulation_steps < 1, a
  // weighted split whose length is not the number of devices, or synchronised batch norm on a
  // device without its kernels; whatever the factory throws.
  Trainer(nn::ModelFactory factory, std::vector<Device> devices, TrainerOptions options = {});
  // As above, with every replica starting from `initial`'s parameters and buffers.
  Trainer(const nn::Module& initial, nn::ModelFactory factory, std::vector<Device> devices,
          TrainerOptions options = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One training step's forward and backward passes and the reduction (see the contract).
  // InvalidArgument for an empty batch, a batch that does not split (under Synchronised batch
  // norm, one that leaves a tower without rows), or a size mismatch between images and labels.
  float forward_backward(const HostBatch& batch);
  float forward_backward(const data::Batch& batch);
  const StepMetrics& last_step() const { return last_; }

  // Loss and top-1 accuracy of replica weights on a batch, split across the towers (any size),
  // in evaluation mode and without autograd. Across processes each gives its own rows (any
  // number, 0 too) and gets the result over every process's rows. With views (test-time
  // augmentation, data/views.h), a row's logits are the weighted sum of the model's logits on each
  // view of its image; empty: the image itself.
  EvalResult evaluate(const HostBatch& batch, const std::vector<data::TestView>& views = {});
  EvalResult evaluate(const data::Batch& batch, const std::vector<data::TestView>& views = {});

  // What an optimizer steps: every replica's flat buffers (AllReduce) or the master copy
  // (ParameterDevice), the slots named as the model names its parameters, and the towers'
  // threads to run on. Valid for the trainer's lifetime.
  optim::ParameterSet parameters();

  // Replica 0, up to date (after sync()): for checkpoints (named_parameters / named_buffers),
  // and to load a checkpoint into (then call broadcast_from_replica0()).
  nn::Module& model();
  nn::Module& replica(int i);
  // Copies replica 0's parameters and buffers to every replica and the master copy (after a
  // checkpoint was loaded into model()).
  void broadcast_from_replica0();
  // ParameterDevice: copies the master parameters to every replica. AllReduce: nothing to do.
  void sync();

  int towers() const { return static_cast<int>(devices_.size()); }
  // Towers of every process, and the processes.
  int global_towers() const;
  collectives::ProcessGroup& processes() const;
  // AutoSplit (split.h, balancer.h): the shares of every global tower in force at `step` (the
  // last step's when 0); empty under other policies.
  std::vector<double> split_shares(std::int64_t step = 0) const;
  // AutoSplit: the shares to use from run step `from` on (a resumed run continues from the
  // checkpoint's); InvalidArgument for a wrong count or shares that are not positive. Under
  // other policies a no-op.
  void set_split_shares(std::vector<double> shares, std::int64_t from);
  // AutoSplit: a new split takes effect this many steps after the step that measured it, so that
  // batches a loader has already cut for later steps keep theirs (Trainer::shard names the rows
  // of a step). train::fit sets its loader's look-ahead; 1 by default.
  void set_split_delay(int steps);
  // The last collectives each of this process's towers entered, for a post-mortem (JSON, as
  // collectives::Communicator::recent_collectives; "[]" where the reduction keeps none).
  std::string tower_collectives() const;
  // The rows of a global batch of `global_n` rows that this process's towers take, as
  // [begin, end) ranges of the batch in the order forward_backward expects them: one range per
  // micro-batch (merged when contiguous). In one process: {{0, global_n}}. `step` is the run step
  // (HostBatch::step) the rows are for: an AutoSplit changes them between steps.
  std::vector<std::pair<int, int>> shard(int global_n, std::int64_t step = 0) const;
  // InvalidArgument, naming the options that fix it, unless a global batch of `global_n` rows
  // splits over every process's towers as the options split it, micro-batches included
  // (split.h's check_batch_split); fit() checks its batch so before the first step.
  void check_batch(int global_n) const;
  const std::vector<Device>& devices() const { return devices_; }
  const TrainerOptions& options() const { return options_; }
  // The reduction in effect (after any fallback), and a one-line description of the set-up:
  // "2 towers on /cpu:0, /cpu:1; split even; all_reduce over local shared-memory (2 CPU participants)".
  const Reduction& reduction() const { return reduction_; }
  std::string describe() const;

  const TrainerTimings& timings() const { return timings_; }
  void reset_timings() { timings_ = {}; }

  // fp16's loss scaler (null under fp32 and bf16): its state goes into checkpoints, and a resumed
  // run loads it back (train/fit.cc).
  LossScaler* loss_scaler();

 private:
  struct Impl;
  struct TowerResults;
  void init(const nn::Module* initial, nn::ModelFactory factory);
  void broadcast_from_rank0();  // every process's replicas <- rank 0's replica 0
  // The steps of forward_backward.
  int global_rows(const HostBatch& batch);
  TowerResults run_towers(const HostBatch& batch, const StepRows& plan, double loss_scale);
  bool unscale_or_skip(double loss_scale);
  std::pair<double, bool> clip_gradients();
  double average_buffers(const StepRows& plan);
  void balance(const TowerResults& ran, const std::vector<int>& global_split, std::int64_t step);

  std::vector<Device> devices_;
  TrainerOptions options_;
  Reduction reduction_;
  StepMetrics last_;
  TrainerTimings timings_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace towerflow::tower
